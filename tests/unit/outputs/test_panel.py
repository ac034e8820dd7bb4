"""The terminal panel: width tiers, window averages, shares that add up, the plain fallback."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from otel_rl.base.deadline import Deadline
from otel_rl.core.batches import ScalarBatch
from otel_rl.core.records import IterationRecord, PhaseRecord, ScalarsRecord
from otel_rl.core.totals import CycleTotals, PassTotals
from otel_rl.formats import schema
from otel_rl.outputs.panel import (
    PanelSink,
    PanelState,
    PanelView,
    round_to_total,
    timing_rows,
)

NOW = 1_000_000_000_000


def iteration(end_ns: int, phases_ms: dict[str, float], wall_ms: float, timeline: str = "learner") -> IterationRecord:
    t = end_ns - int(wall_ms * 1e6)
    records = []
    for name, ms in phases_ms.items():
        children = ()
        if name == "inference":
            children = (PhaseRecord(schema.phase_spec(timeline, "inference_forward"), t, t + int(ms * 0.8e6), 1, 1, "main"),)
        records.append(PhaseRecord(schema.phase_spec(timeline, name), t, t + int(ms * 1e6), 0, 1, "main", children=children))
        t += int(ms * 1e6)
    return IterationRecord(timeline, 0, 0, end_ns - int(wall_ms * 1e6), end_ns, 1, "main", tuple(records), sum(p.duration_ns for p in records))


def add_iteration(state: PanelState, iteration: IterationRecord) -> None:
    """One cycle, as the pipeline hands a pass holding it to the panel."""
    cycles = CycleTotals()
    top = {p.spec.name: p.duration_ns for p in iteration.phases}
    nested = {c.spec.name: c.duration_ns for p in iteration.phases for c in p.children}
    cycles.add_cycle(iteration.wall_ns, top, nested)
    state.add_pass(PassTotals(iteration.end_ns, {iteration.timeline: cycles}))


def state_with_data() -> PanelState:
    state = PanelState(clock=lambda: NOW)
    # Outside the 2 s window: must not count.
    add_iteration(state, iteration(NOW - 3_000_000_000, {"learning": 100.0}, 100.0))
    for k in range(4):
        add_iteration(state, iteration(NOW - k * 100_000_000, {"collector_wait": 1.0, "inference": 2.0, "learning": 6.0}, 10.0))
        add_iteration(state, iteration(NOW - k * 100_000_000, {"env_step": 3.0, "learner_action_wait": 5.0}, 8.0, "collector"))
    state.add_scalars(ScalarBatch.of([ScalarsRecord(NOW - 5_000_000_000, {"Train/mean_reward": -1000.0}, None, None, None)]))
    state.add_scalars(ScalarBatch.of([ScalarsRecord(NOW - 100, {"Train/mean_reward": -200.0, "Loss/critic": 1.0, "Perf/total_fps": 900.0}, None, None, None)]))
    state.add_scalars(ScalarBatch.of([ScalarsRecord(NOW - 50, {"Loss/critic": 3.0, "sys/process_cpu_percent": 150.0, "reward/upright": 0.5}, None, None, None)]))
    return state


def titles(text: str) -> set[str]:
    """Section titles: words at the start of a line, each followed by two or more spaces or the line end."""
    import re

    found = set()
    for line in text.splitlines():
        for part in re.split(r"\s{2,}", line.strip("│ ╭╮╰╯─")):
            found.add(part.strip())
    return found


def render(state: PanelState, width: int) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), force_terminal=True, color_system=None)
    console.print(PanelView(state, "run-7", num_envs=lambda: 8).render(width))
    return console.export_text()


def test_window_averages_on_known_inputs():
    state = state_with_data()
    learner = state.timing("learner")
    assert learner["n"] == 4 and learner["wall_ms"] == 10.0
    assert learner["top"] == {"collector_wait": 1.0, "inference": 2.0, "learning": 6.0}
    assert abs(learner["nested"]["inference_forward"] - 1.6) < 1e-9
    means = state.scalar_means()
    assert means["Train/mean_reward"] == -200.0  # the 5 s old value is outside the window
    assert means["Loss/critic"] == 2.0


def test_learner_shares_add_up_to_100():
    rows = timing_rows(state_with_data().timing("learner"), "learner")
    labels = [r[0] for r in rows]
    assert labels[0] == "Iter Wall" and labels[-1] == "Other"
    top = [float(r[2].rstrip("%")) for r in rows[1:] if not r[0].startswith("  ")]
    assert round(sum(top), 6) == 100.0
    assert "  Forward" in labels  # nested rows are shown but not counted


def test_round_to_total():
    assert round_to_total([1 / 3, 1 / 3, 1 / 3]) == [33.4, 33.3, 33.3]  # 1000 tenths in all
    assert round_to_total([0.5, 0.25, 0.25]) == [50.0, 25.0, 25.0]


def test_narrow_terminal_stacks_with_a_single_timing_column():
    text = render(state_with_data(), 80)
    assert {"Metrics", "Rewards", "Timing"} <= titles(text)
    assert not {"Learner", "System", "Learner (Iter Wall)", "Collector (own clock)"} & titles(text)
    assert "Avg 2s (n=4)" in text
    assert "Mean reward" in text  # short titles
    assert max(len(line) for line in text.splitlines()) <= 80


def test_medium_terminal_has_learner_and_collector_columns():
    text = render(state_with_data(), 100)
    assert {"Learner", "Collector"} <= titles(text) and not {"System", "Timing"} & titles(text)
    metrics_line = next(line for line in text.splitlines() if "Metrics" in line)
    assert "Rewards" in metrics_line  # side by side


def test_wide_terminal_has_three_timing_columns():
    text = render(state_with_data(), 140)
    header = next(line for line in text.splitlines() if "Learner (Iter Wall)" in line)
    assert "Collector (own clock)" in header and "System" in header
    assert "Envs" in text and "Iter Wall" in text and "Learner Action Wait" in text


def test_not_a_terminal_prints_plain_lines(monkeypatch):
    import otel_rl.outputs.panel as panel

    monkeypatch.setattr(panel, "PLAIN_EVERY_S", 0.05)
    out = io.StringIO()
    sink = PanelSink("run-7", console=Console(file=out, force_terminal=False, width=200))
    sink.state = state_with_data()
    sink.view.state = sink.state
    import time

    time.sleep(0.3)
    sink.shutdown(Deadline(2))
    lines = [line for line in out.getvalue().splitlines() if line]
    assert lines and all(line.startswith("otel-rl run-7") for line in lines)


def test_the_title_shows_elapsed_time_progress_and_eta():
    state = state_with_data()
    state.started_ns = NOW - 65_000_000_000
    state.total_steps = 100_000
    for k, steps in enumerate((10_000, 20_000)):  # 10,000 steps in 10 s: 1,000 steps/s
        cycles = CycleTotals()
        cycles.env_steps = steps
        state.add_pass(PassTotals(NOW - (1 - k) * 10_000_000_000, {"learner": cycles}))
    text = render(state, 140)
    assert "1m05s" in text and "20,000/100,000 steps (20%)" in text and "ETA 1m20s" in text


def test_before_the_first_iteration_the_panel_says_it_waits():
    text = render(PanelState(clock=lambda: NOW), 100)
    assert "waiting for the first iteration" in text and "(no data yet)" in text


def test_a_loop_without_env_steps_shows_its_latest_iteration():
    state = state_with_data()
    for index in (41, 1_234):
        cycles = CycleTotals()
        cycles.cycles, cycles.wall_ns, cycles.index = 1, 1_000_000, index
        state.add_pass(PassTotals(NOW, {"learner": cycles}))
    text = render(state, 140)
    assert "iteration 1,234" in text and "waiting for the first iteration" not in text


def test_a_distribution_takes_one_row():
    state = state_with_data()
    stats = {name: 0.5 for name in schema.distribution_keys("Policy/action").values()}
    stats["Policy/action/std"] = 0.25
    state.add_scalars(ScalarBatch.of([ScalarsRecord(NOW - 10, stats, None, None, None)]))
    text = render(state, 140)
    rows = [line for line in text.splitlines() if "Policy/action" in line]
    assert len(rows) == 1 and "0.5 ± 0.25" in rows[0], rows


def test_steps_per_second_are_derived_from_the_env_steps_when_the_loop_logs_none():
    state = PanelState(clock=lambda: NOW, derive_fps=True)
    for k in range(11):  # 800 env steps every 0.1 s, the last 2 s in the window: 8,000 steps/s
        cycles = CycleTotals()
        cycles.cycles, cycles.wall_ns, cycles.index, cycles.env_steps = 1, 100_000_000, k, 800 * k
        state.add_pass(PassTotals(NOW - (10 - k) * 100_000_000, {"learner": cycles}))
    assert state.steps_per_s() == pytest.approx(8000.0)
    text = render(state, 140)
    assert "Steps/s" in text and "8,000" in text and "Perf/total_fps" not in text
    assert "8000 steps/s" in PanelView(state, "run").plain_line()
    # A loop that logs its own wins; a job of several ranks (its Perf/total_fps is the job's sum) gets none derived.
    state.add_scalars(ScalarBatch.of([ScalarsRecord(NOW - 10, {"Perf/total_fps": 123.0}, None, None, None)]))
    assert "Steps/s (Perf/total_fps)" in render(state, 140) and "123" in render(state, 140)
    job = PanelState(clock=lambda: NOW, derive_fps=False)
    for k in range(3):
        cycles = CycleTotals()
        cycles.cycles, cycles.wall_ns, cycles.index, cycles.env_steps = 1, 100_000_000, k, 800 * k
        job.add_pass(PassTotals(NOW - (2 - k) * 100_000_000, {"learner": cycles}))
    assert "Steps/s" not in render(job, 140)


def with_values(values: dict, state: PanelState | None = None) -> PanelState:
    state = state or state_with_data()
    state.add_scalars(ScalarBatch.of([ScalarsRecord(NOW - 10, values, None, None, None)]))
    return state


def test_the_metrics_come_in_a_fixed_order_every_group_included():
    """Seeds 001 and 003: losses, policy, training diagnostics (indented), ingress gauges, then the loop's own groups."""
    state = with_values({
        "Policy/entropy": 0.3, "Loss/actor": 12.0, "Train/grad_norm": 1.5, "Train/ingress_backpressure": 0.2, "Train/ingress_depth": 12,
        "actor/update/loss/avg": 0.5, "custom/thing": 7.0, "Train/mean_episode_length": 200.0, "Episode/foo": 2.0,
    })  # fmt: skip
    lines = [line.strip("│ ") for line in render(state, 150).splitlines()]
    order = ["Loss/actor", "Loss/critic", "Policy/entropy", "Train/grad_norm", "Ingress Backpressure", "Ingress Depth", "actor", "update/loss/avg", "custom", "thing"]
    found = [next(i for i, line in enumerate(lines) if line.startswith(label)) for label in order]
    assert found == sorted(found), lines
    text = render(state, 150)
    assert "│   Train/grad_norm" in text and "│   update/loss/avg" in text  # diagnostics and group members indented
    assert "Episode length" in text and "Episode/foo" in text and "Peak reward" in text


def test_the_loss_above_10_and_a_collector_wait_above_1_ms_are_red():
    state = with_values({"Loss/actor": 12.0})
    metrics = dict(PanelView(state, "run").sections(short=False)["metrics"])
    assert metrics["Loss/actor"].style == "red" and metrics["Loss/critic"].style == "yellow"
    from otel_rl.outputs.panel import _alert_wait

    rows = {r[0]: r[1] for r in _alert_wait(timing_rows(state.timing("learner"), "learner"))}
    assert rows["Collector Wait"].style == "yellow"  # 1.0 ms: not above the line
    slow = PanelState(clock=lambda: NOW)
    add_iteration(slow, iteration(NOW, {"collector_wait": 3.0, "learning": 6.0}, 10.0))
    rows = {r[0]: r[1] for r in _alert_wait(timing_rows(slow.timing("learner"), "learner"))}
    assert rows["Collector Wait"].style == "red"


def test_the_system_column_shows_what_the_loop_reports():
    state = with_values({
        "Episode/timeout_rate": 0.1, "Episode/terminated_rate": 0.05, "Train/batch_size": 256, "Train/cuda_mps": 2,
        "Train/sync_collect_steps": 64, "Train/staging_pool_len": 4, "Train/staging_pool_max": 4, "Train/buffer_size": 5000,
    })  # fmt: skip
    system = dict(PanelView(state, "run").sections(short=False)["system"])
    assert system["Timeout Rate"] == "10.0%" and system["Terminated Rate"] == "5.0%" and system["Batch/rank"] == "256"
    assert system["CUDA MPS"] == "ambient" and system["Sync Collect"] == "✓ (64)" and system["Buffer"] == "5,000"
    assert str(system["Staging Pool"]) == "4/4" and system["Staging Pool"].style == "yellow"  # full
    bare = dict(PanelView(state_with_data(), "run").sections(short=False)["system"])
    assert "CUDA MPS" not in bare and "Sync Collect" not in bare  # only where the loop reports them


def test_rows_per_second_come_from_the_batch_size_and_the_learners_rate():
    state = PanelState(clock=lambda: NOW, derive_fps=True)
    state.started_ns = NOW - 10_000_000_000
    for k in range(20):  # 10 learner iterations a second over the 2 s window
        add_iteration(state, iteration(NOW - k * 100_000_000, {"learning": 5.0}, 10.0))
    with_values({"Train/batch_size": 256}, state)
    metrics = dict(PanelView(state, "run").sections(short=False)["metrics"])
    assert metrics["Rows/s"] == "2,560"


def test_the_peak_reward_is_the_highest_mean_reward_so_far():
    state = with_values({"Train/mean_reward": 50.0})
    with_values({"Train/mean_reward": 10.0}, state)
    rewards = dict(PanelView(state, "run").sections(short=False)["rewards"])
    assert rewards["Peak reward"] == "50.000" and rewards["Train/mean_reward"] != "50.000"


def test_the_status_line():
    state = PanelState(clock=lambda: NOW)
    assert state.status_line() == "Warming up..."
    with_values({"Train/buffer_size": 2500, "Train/learning_starts": 10_000}, state)
    assert state.status_line() == "Buffer fill: 2,500/10,000 (25%)"
    with_values({"Train/buffer_size": 10_000}, state)
    add_iteration(state, iteration(NOW, {"learning": 5.0}, 10.0))
    assert state.status_line() is None
    sink = PanelSink("run", console=Console(file=io.StringIO(), force_terminal=False, width=200))
    from otel_rl.core.records import EventRecord

    sink.on_event(EventRecord(NOW, "status", {"text": "Evaluating"}))
    assert sink.state.status_line() == "Evaluating" and "Evaluating" in sink.view.plain_line()
    sink.on_event(EventRecord(NOW, "status", {"text": ""}))
    assert sink.state.status_line() == "Warming up..."
    sink.on_event(EventRecord(NOW, "warmup_done", {}))
    assert sink.state.status_line() is None
    sink.shutdown(Deadline(2))


def test_quiet_collector_rows_show_from_1_percent_of_the_cycle():
    state = PanelState(clock=lambda: NOW)
    add_iteration(state, iteration(NOW, {"inference_request": 0.05, "env_step": 9.0, "learner_action_wait": 0.9}, 10.0, "collector"))
    labels = [r[0] for r in timing_rows(state.timing("collector"), "collector")]
    assert "Inference Request" not in labels and "Learner Action Wait" in labels and "Env Step" in labels
    loud = PanelState(clock=lambda: NOW)
    add_iteration(loud, iteration(NOW, {"inference_request": 0.5, "env_step": 9.5}, 10.0, "collector"))
    assert "Inference Request" in [r[0] for r in timing_rows(loud.timing("collector"), "collector")]


def test_a_custom_nested_phase_is_shown_under_its_parent():
    """The parent is found in the recorded batch: a phase of the loop's own, nested in Learning."""
    from otel_rl.core.batches import IterationBatch

    t = NOW - 10_000_000
    child = PhaseRecord(schema.phase_spec("learner", "target_update"), t + 1_000_000, t + 3_000_000, 1, 1, "main")
    learning = PhaseRecord(schema.phase_spec("learner", "learning"), t, t + 6_000_000, 0, 1, "main", children=(child,))
    wait = PhaseRecord(schema.phase_spec("learner", "collector_wait"), t + 6_000_000, t + 7_000_000, 0, 1, "main")
    record = IterationRecord("learner", 0, 0, t, t + 10_000_000, 1, "main", (learning, wait), 7_000_000)
    cycles = CycleTotals()
    cycles.add_batch(IterationBatch.of([record]))
    assert cycles.parents == {"target_update": "learning"}
    state = PanelState(clock=lambda: NOW)
    state.add_pass(PassTotals(NOW, {"learner": cycles}))
    labels = [r[0] for r in timing_rows(state.timing("learner"), "learner", state.parents)]
    assert labels.index("  Target Update") == labels.index("Learning") + 1


def test_hundreds_of_custom_keys_leave_the_panel_a_panel():
    state = with_values({f"group{g}/key{k}": float(k) for g in range(10) for k in range(30)})
    metrics = PanelView(state, "run").sections(short=False)["metrics"]
    assert len(metrics) < 40 and "300 more keys" not in str(metrics[-1][0]) and "more keys" in str(metrics[-1][0])


def test_a_run_with_nested_phases_of_its_own_loses_no_cycle(tmp_path):
    """Through the real pipeline: phases of the collector's and the learner's, nested ones of the loop's own among them."""
    import json

    import otel_rl

    tel = otel_rl.init(run_dir=tmp_path, system_metrics_interval_s=0)
    env_step = tel.phase("env_step", timeline="collector")
    with tel.run():
        for i in range(20):
            with env_step:
                pass
            with tel.iteration(i, env_steps=i + 1):
                with tel.phase("inference"):
                    with tel.phase("inference_forward"):
                        pass
                with tel.phase("learning"):
                    with tel.phase("target_update"):
                        pass
    tel.close()
    summary = json.loads((tmp_path / "run_summary.json").read_text())
    assert summary["timelines"]["learner"]["iterations"]["count"] == 20, summary["timelines"]
    assert summary["timelines"]["learner"]["phases"]["target_update"]["count"] == 20


COMMITS = """
import sys, otel_rl
from otel_rl import stats_tracker as stats
tel = otel_rl.init(run_dir=sys.argv[1], system_metrics_interval_s=0)
with tel.run():
    for step in range(3):
        with tel.iteration(step, env_steps=64 * (step + 1)):
            stats.scalar(lr=3e-4)
            stats.get("rollout").scalar(reward=0.5 + step)
        stats.commit(tel, stats.export_all(), epoch=1, epoch_step=step, global_step=step)
tel.close()
"""


def test_committed_stats_are_printed_as_tables_in_a_jobs_log(tmp_path):
    """Seed 002's tabulate_stats: off a terminal, each commit a table headed by its epoch and steps, counts left out."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    out = subprocess.run([sys.executable, "-c", COMMITS, str(tmp_path)], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    titles = [line.strip() for line in out.stdout.splitlines() if line.strip().startswith("otel-rl stats")]
    assert titles == [f"otel-rl stats · Epoch 1 · Epoch step {s} · Global step {s}" for s in range(3)], out.stdout
    last = out.stdout[out.stdout.rindex("Global step 2") :]
    assert "rollout/reward" in last and "2.5" in last and "lr" in last and "__count" not in out.stdout
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    committed = [r for r in rows if r["kind"] == "scalars" and "rollout/reward" in r["values"]]
    assert [r["step"] for r in committed] == [0, 1, 2] and not any("__count" in k for r in committed for k in r["values"])


def test_a_job_of_ranks_shows_the_ranks_average_and_the_jobs_gpus():
    """A job of ranks: the timing table and Avg 2s (n=...) are the job's (log_window's per-rank timings), GPUs the job's."""
    state = state_with_data()  # rank 0's own cycles: 10 ms iterations
    for k in range(2):  # what log_window records on rank 0, twice in the window: each rank's own timings
        for rank, learning_s in ((0, 0.006), (1, 0.010)):
            values = {schema.rank_key(rank, "Perf/iteration_time"): learning_s + 0.004, schema.rank_key(rank, "Perf/learning_time"): learning_s,
                      schema.rank_key(rank, "Perf/learner_collector_wait_ms"): 3.0, schema.rank_key(rank, "Perf/learner_inference_forward_ms"): 0.5}  # fmt: skip
            state.add_scalars(ScalarBatch.of([ScalarsRecord(NOW - 500_000_000 + 100_000_000 * k + 20_000_000 * rank, values, None, None, None)]))
    job = state.timing("learner")
    assert job["ranks"] == 2 and job["n"] == 4 and job["wall_ms"] == pytest.approx(12.0)
    assert job["top"] == {"learning": pytest.approx(8.0), "collector_wait": pytest.approx(3.0)} and job["nested"] == {"inference_forward": pytest.approx(0.5)}
    with_values({"sys/gpu0_util_percent": 50.0, "sys/gpu1_util_percent": 60.0}, state)
    console = Console(width=140, record=True, file=io.StringIO(), force_terminal=True, color_system=None)
    console.print(PanelView(state, "run-7", num_envs=lambda: 8, machines=3).render(140))
    text = console.export_text()
    assert "Avg 2s (n=4) · 2 ranks · GPUs 6" in text and "Learning" in text and "8.00" in text


def test_a_collector_reporting_its_own_averages_is_shown_in_ms_without_shares():
    """Seed 001's APPO collector: per-step EMAs of MLP Infer and Env Step, and the rollout's wall; no share of a cycle."""
    state = PanelState(clock=lambda: NOW)
    add_iteration(state, iteration(NOW, {"collector_wait": 1.0, "learning": 6.0}, 10.0))
    state.add_scalars(ScalarBatch.of([ScalarsRecord(NOW - 100, {"Perf/collector_mlp_infer_ms": 0.42, "Perf/collector_env_step_ms": 1.5,
                                                                "Perf/collection_time": 0.25}, None, None, None)]))  # fmt: skip
    text = render(state, 140)
    assert "Collector (EMA)" in text
    rows = {" ".join(re.split(r"\s+", m.group(0).strip())) for m in re.finditer(r"(Env Step|MLP Infer|Rollout Wall)\s+[\d.]+(\s+EMA)?", text)}
    assert rows == {"Env Step 1.50 EMA", "MLP Infer 0.42 EMA", "Rollout Wall 250.00"}  # ms only: no share of a cycle
    from otel_rl.outputs.panel import ema_rows

    assert ema_rows(state.scalar_means()) == [("Env Step", "1.50", "EMA"), ("MLP Infer", "0.42", "EMA"), ("Rollout Wall", "250.00", "")]
    assert "Perf/collector_mlp_infer_ms" not in dict(PanelView(state, "run").sections(short=False)["metrics"])  # not a metric row too
    recorded = state_with_data()  # a collector that records phases keeps its shares
    assert "Collector (EMA)" not in render(recorded, 140)


def test_iterations_longer_than_the_window_show_the_last_ones_and_when_they_ended():
    """SB3 PPO's defaults: a 2,048-step rollout and an update per iteration, longer than the window: the table is the
    last iteration's, and the title says it is, never "(n=0)" and "(no data yet)"."""
    now = [NOW]
    state = PanelState(clock=lambda: now[0])
    add_iteration(state, iteration(NOW, {"collector_wait": 4000.0, "learning": 3000.0}, 7500.0))
    now[0] = NOW + 5_000_000_000  # 5 s on, the next iteration under way
    learner = state.timing("learner")
    assert learner["n"] == 1 and learner["wall_ms"] == 7500.0 and learner["ago_s"] == 5.0
    assert learner["top"] == {"collector_wait": 4000.0, "learning": 3000.0}
    text = render(state, 120)
    assert "Last 1 iteration (5s ago)" in text and "(no data yet)" not in text.split("Collector")[0] and "n=0" not in text, text
    # The pipeline says the next one opened 5 s ago, after 4,096 env steps: progress counts it.
    state.add_pass(PassTotals(now[0], {"learner": CycleTotals(under_way=(1, 4096, NOW))}))
    assert state.progress()["env_steps"] == 4096 and state.iteration_under_way() == (1, 5.0)
    assert "4,096 steps · Last 1 iteration (5s ago; iteration 1 under way for 5s)" in render(state, 140)
    ended = CycleTotals()
    ended.add_cycle(5_000_000_000, {"learning": 5_000_000_000}, {})
    ended.index = 1
    state.add_pass(PassTotals(now[0], {"learner": ended}))
    assert state.iteration_under_way() is None  # it ended, and none opened after it


def test_an_llm_rl_step_shows_its_tokens_per_second_and_a_trainers_many_keys_in_a_few_rows():
    """TRL logs two dozen trl/* keys and Perf/tokens_per_s: the panel shows Tokens/s, and eight trl rows and a count."""
    state = state_with_data()
    values = {f"trl/rewards/func_{k}/mean": float(k) for k in range(24)}
    values[schema.TOKENS_PER_S] = 1234.0
    state.add_scalars(ScalarBatch.of([ScalarsRecord(NOW - 10, values, None, None, None)]))
    text = render(state, 140)
    assert re.search(r"Tokens/s\s+1,?234", text), text
    assert "... 16 more trl keys" in text and text.count("rewards/func_") == 8, text
