"""The live verdict: analyze's rules over the pipeline's last seconds, said as ``bottleneck`` events when it changes."""

from __future__ import annotations

import json
import time

import otel_rl
import otel_rl.read
from otel_rl.core.batches import ScalarBatch
from otel_rl.core.live_verdict import CHANGE_CYCLES, HOLD, MIN_CYCLES, LiveVerdict
from otel_rl.core.records import ScalarsRecord
from otel_rl.core.totals import CycleTotals, PassTotals
from otel_rl.formats import schema

MS = 1_000_000
SECOND = 1_000_000_000


def feed(verdict: LiveVerdict, seconds: float, per_second: dict[str, CycleTotals], start_ns: int = 10 * SECOND) -> list[dict]:
    """``seconds`` of passes every 100 ms, each with a tenth of ``per_second``'s cycles; what the verdict said, with when."""
    said = []
    for tick in range(int(seconds * 10)):
        now = start_ns + tick * SECOND // 10
        totals = {}
        for timeline, whole in per_second.items():  # a tenth of each second's cycles, spread evenly over its passes

            def part(value: int) -> int:
                return value * (tick % 10 + 1) // 10 - value * (tick % 10) // 10

            totals[timeline] = CycleTotals(cycles=part(whole.cycles), wall_ns=part(whole.wall_ns), top={k: part(v) for k, v in whole.top.items()},
                                           env_steps=tick * 80 if timeline == schema.LEARNER else None)  # fmt: skip
        verdict.add(PassTotals(now, totals))
        if (out := verdict.take(now)) is not None:
            said.append({**out, "at_s": (now - start_ns) / SECOND})
    return said


def learner(cycles: int, wall_ms: float, **phases_ms: float) -> CycleTotals:
    return CycleTotals(cycles=cycles, wall_ns=int(cycles * wall_ms * MS), top={k: int(cycles * v * MS) for k, v in phases_ms.items()})


def test_a_learner_bound_loop_is_said_once_with_its_side_phase_and_throughput():
    verdict = LiveVerdict()
    verdict.start()
    said = feed(verdict, 5, {schema.LEARNER: learner(100, 10, collector_wait=1, learning=8.5)})
    assert len(said) == 1, said  # said once, and not again while it holds
    (first,) = said
    assert first["text"] == "learner (learning)" and (first["side"], first["phase"]) == ("learner", "learning")
    assert first["confidence"] == "high" and "previous" not in first
    assert first["env_steps_per_s"] == 800.0  # 80 env steps a pass, 10 passes a second
    assert first["at_s"] <= HOLD  # once it held for HOLD readings of a second each


def test_a_change_is_said_with_the_verdict_it_replaces_once_it_held():
    verdict = LiveVerdict()
    verdict.start()
    before = feed(verdict, 5, {schema.LEARNER: learner(100, 10, collector_wait=8, learning=1.5)})
    after = feed(verdict, 8, {schema.LEARNER: learner(40, 25, collector_wait=1, learning=23.5)}, start_ns=15 * SECOND)
    assert [s["text"] for s in before] == ["collector (not instrumented)"] and before[0]["side"] == "collector" and before[0]["phase"] == ""
    assert [s["text"] for s in after] == ["learner (learning)"]
    assert after[0]["previous"] == "collector (not instrumented)"
    assert after[0]["at_s"] <= 3.0  # the window (2 s: it holds enough cycles) turned, and the new verdict held


def test_collection_and_learning_in_turns_are_read_by_where_the_time_goes():
    """One thread collects, then learns (as SB3 does): each side's working time fits in the window's, so they take turns."""
    verdict = LiveVerdict()
    verdict.start()
    collector = CycleTotals(cycles=20, wall_ns=700 * MS, top={"env_step": 650 * MS})
    said = feed(verdict, 4, {schema.COLLECTOR: collector, schema.LEARNER: learner(20, 15, learning=14)})
    assert said[0]["text"] == "collector (env step, 93% of its cycle)" and (said[0]["side"], said[0]["phase"]) == ("collector", "env_step")


def test_too_few_cycles_or_a_busy_host_say_the_verdict_with_low_confidence():
    verdict = LiveVerdict()
    verdict.start()
    said = feed(verdict, 4, {schema.LEARNER: learner(2, 500, learning=490)})  # a cycle every half second: 10 s hold too few
    assert said[0]["confidence"] == "low" and said[0]["caveat"].startswith("too few cycles (") and " s; " in said[0]["caveat"] and str(MIN_CYCLES) in said[0]["caveat"]
    busy = LiveVerdict()
    busy.start()
    busy.note_scalars(ScalarBatch.of([ScalarsRecord(11 * SECOND, {"sys/load_per_cpu": 3.2}, None, None, None, 1)]))
    said = feed(busy, 4, {schema.LEARNER: learner(100, 10, learning=9)})
    assert said[0]["confidence"] == "low" and said[0]["caveat"] == "a busy host (load per CPU 3.2)"


def test_a_new_verdict_is_said_on_its_second_reading_not_its_first():
    """One reading past a threshold (a window's noise) says nothing; the same verdict on the next reading is said."""
    verdict = LiveVerdict(hold=HOLD)
    verdict.start()
    assert [s["text"] for s in feed(verdict, 4, {schema.LEARNER: learner(100, 10, learning=9)})] == ["learner (learning)"]
    readings = []
    for second in range(14, 18):  # one pass a second, each of a second's cycles, waiting most of the time
        now = second * SECOND
        verdict.add(PassTotals(now, {schema.LEARNER: learner(100, 10, collector_wait=9.5)}))
        readings.append(verdict.take(now))
    # 14 s: waiting crosses its threshold, read once, not said; 15 s: read again, said; then it holds, nothing more to say.
    assert [r and r["text"] for r in readings] == [None, "collector (not instrumented)", None, None]


def test_the_straggler_among_ranks_leads_the_verdict():
    """Rank 0's log windows carry each rank's timings (``Perf/rank_<r>/...``): the slow rank is named, as analyze names it."""
    verdict = LiveVerdict()
    verdict.start()
    values = {}
    for rank in range(4):
        slow = 2.0 if rank == 3 else 1.0
        values[schema.rank_key(rank, "Perf/learning_time")] = 0.020 * slow
        values[schema.rank_key(rank, "Perf/learner_gradient_sync_ms")] = 25.0 - 20.0 * slow + 5.0
    verdict.note_scalars(ScalarBatch.of([ScalarsRecord(10 * SECOND, values, None, None, None, 1)]))
    said = feed(verdict, 3, {schema.LEARNER: learner(30, 33, learning=24, gradient_sync=8)})
    assert said[0]["text"] == "learner rank 3 (learning, 2.0x the median rank): the straggler"
    assert (said[0]["side"], said[0]["phase"], said[0]["rank"]) == ("learner", "learning", 3)


def test_nothing_is_said_outside_a_run():
    verdict = LiveVerdict()
    assert feed(verdict, 4, {schema.LEARNER: learner(100, 10, learning=9)}) == []
    verdict.start()
    verdict.stop()
    assert feed(verdict, 4, {schema.LEARNER: learner(100, 10, learning=9)}, start_ns=20 * SECOND) == []


def test_a_real_loop_records_its_verdict_changes_in_its_run_folder(tmp_path):
    """Learning slows from 2 ms to 20 ms midway: metrics.jsonl holds the collector-bound verdict, then the learner-bound one."""
    tel = otel_rl.init(run_dir=tmp_path, quiet=True, system_metrics_interval_s=0, tensorboard=True)
    with tel.run():
        start = time.monotonic()
        i = 0
        while time.monotonic() - start < 8:
            late = time.monotonic() - start > 4
            with tel.iteration(i, env_steps=8 * i):
                with tel.phase("collector_wait"):
                    time.sleep(0.002 if late else 0.02)
                with tel.phase("learning"):
                    time.sleep(0.02 if late else 0.002)
            i += 1
    tel.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    changes = [r["attributes"] for r in records if r["kind"] == "event" and r["name"] == schema.EVENT_BOTTLENECK]
    assert [c["text"] for c in changes] == ["collector (not instrumented)", "learner (learning)"], changes
    assert changes[1]["previous"] == "collector (not instrumented)" and changes[1]["cycles"] > MIN_CYCLES
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    board.Reload()
    said = [t.tensor_proto.string_val[0].decode() for t in board.Tensors("events/bottleneck")]
    assert len(said) == 2 and "learner (learning)" in said[1], said  # TensorBoard shows each change as text
    (row,) = otel_rl.read.runs(tmp_path).to_dict("records")  # what a script reads of the run: its latest verdict
    assert (row["bottleneck"], row["bottleneck_side"], row["bottleneck_phase"]) == ("learner (learning)", "learner", "learning")


def test_the_same_verdict_more_sure_is_said_again_without_being_a_change():
    """Too few cycles, then many: one verdict said twice, low then high, and the second names no previous verdict."""
    verdict = LiveVerdict()
    verdict.start()
    said = feed(verdict, 3, {schema.LEARNER: learner(3, 300, learning=290)})
    said += feed(verdict, 4, {schema.LEARNER: learner(100, 10, learning=9.5)}, start_ns=13 * SECOND)
    assert [(s["text"], s["confidence"]) for s in said] == [("learner (learning)", "low"), ("learner (learning)", "high")]
    assert "previous" not in said[1]


def test_a_change_holds_over_its_cycles_before_it_is_said():
    """A slow loop (5 cycles a second) turns collector-bound: said only once CHANGE_CYCLES of its cycles held the new verdict."""
    verdict = LiveVerdict()
    verdict.start()
    feed(verdict, 12, {schema.LEARNER: learner(5, 200, collector_wait=5, learning=190)})
    after = feed(verdict, 12, {schema.LEARNER: learner(5, 200, collector_wait=150, learning=45)}, start_ns=22 * SECOND)
    assert [s["text"] for s in after] == ["collector (not instrumented)"]
    assert after[0]["at_s"] * 5 >= CHANGE_CYCLES  # not on its first readings, 2 s and 10 cycles in


def test_a_loop_near_the_line_is_balanced_and_said_once_after_its_start_up(tmp_path):
    """Iteration 0 spends 2 s outside any phase (an import); then Collector Wait is a quarter of each iteration, at the
    line between collector- and learner-bound: one verdict, balanced, said once, and analyze says the same of the trace."""
    from otel_rl.readers.analysis import analyze

    tel = otel_rl.init(run_dir=tmp_path, quiet=True, system_metrics_interval_s=0)
    with tel.run():
        start = time.monotonic()
        i = 0
        while time.monotonic() - start < 8:
            with tel.iteration(i, env_steps=8 * i):
                if i == 0:
                    time.sleep(2.0)
                with tel.phase("collector_wait"):
                    time.sleep(0.010)
                with tel.phase("learning"):
                    time.sleep(0.030)
            i += 1
    tel.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    said = [r["attributes"] for r in records if r["kind"] == "event" and r["name"] == schema.EVENT_BOTTLENECK]
    assert [(s["side"], s["text"].split(":")[0]) for s in said] == [("balanced", "balanced")], said
    assert "learner learning" in said[0]["text"] and "collector wait" in said[0]["text"]
    report = analyze(tmp_path)
    assert report.diagnosis.side == "balanced", report.diagnosis.bottleneck
    assert report.regimes and report.regimes[0].kind == "start-up"
    (row,) = otel_rl.read.runs(tmp_path).to_dict("records")
    assert row["bottleneck_side"] == "balanced"


def test_iterations_longer_than_the_longest_window_are_read_from_the_last_ones():
    """A 14 s iteration (a long rollout and its update): 14 s after it ended the window still reads it, with low confidence."""
    verdict = LiveVerdict()
    verdict.start()
    said = []
    for tick in range(60):  # a pass every half second; the first iteration (its start-up) ends at 1 s, the second at 15 s
        now = 10 * SECOND + tick * SECOND // 2
        totals = {schema.LEARNER: learner(1, 14_000, collector_wait=500, learning=13_000)} if tick in (2, 30) else {}
        verdict.add(PassTotals(now, totals))
        if (out := verdict.take(now)) is not None:
            said.append(out)
    report = verdict.report(10 * SECOND + 59 * SECOND // 2)
    assert report is not None and report.timelines[schema.LEARNER].cycles == 1
    assert [s["text"] for s in said] == ["learner (learning)"] and said[0]["confidence"] == "low", said
