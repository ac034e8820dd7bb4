"""The terminal panel: width tiers, window averages, shares that add up, the plain fallback."""

from __future__ import annotations

import io

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
