"""``Perf/*`` from the pipeline's passes: the learner's and collector's walls and seed 001's names."""

from __future__ import annotations

import pytest

from otel_rl.core.perf_windows import PerfWindows
from otel_rl.core.totals import CycleTotals, PassTotals


def test_the_collectors_rollout_wall_and_the_ranks_gradient_sync_have_seed_001s_names():
    windows = PerfWindows()
    learner, collector = CycleTotals(), CycleTotals()
    for _ in range(4):
        learner.add_cycle(10_000_000, {"learning": 6_000_000, "gradient_sync": 3_000_000}, {})
    for _ in range(2):
        collector.add_cycle(250_000_000, {"env_step": 200_000_000}, {})
    windows.add(PassTotals(1, {"learner": learner, "collector": collector}))
    values = windows.take()
    assert values["Perf/iteration_time"] == pytest.approx(0.010) and values["Perf/collection_time"] == pytest.approx(0.250)
    assert values["Perf/learner_gradient_sync_ms"] == pytest.approx(3.0) == values["Perf/dp_gradient_sync_ms_per_rank"]
    assert values["Perf/collector_env_step_ms"] == pytest.approx(200.0)
    assert values["Perf/window_iterations"] == 4  # what the learner's means are over
    assert windows.take() == {}  # a new window


def test_an_iteration_longer_than_the_window_is_its_own_record():
    """Seed 001: the backends keep each iteration's value, not a smoothed one, where iterations outlast the window."""
    windows = PerfWindows(interval_s=0.0)
    for wall_ms in (1500, 2500):
        learner = CycleTotals()
        learner.add_cycle(wall_ms * 1_000_000, {"learning": wall_ms * 900_000}, {})
        windows.add(PassTotals(1, {"learner": learner}))
        values = windows.take()
        assert values["Perf/window_iterations"] == 1 and values["Perf/iteration_time"] == pytest.approx(wall_ms / 1000)


def test_a_ranks_gradient_all_reduces_per_iteration_are_counted_under_seed_001s_name(tmp_path):
    """Two buckets, two all-reduces an iteration (a real gloo collective each), as a DDP learner records them."""
    import json
    import os

    import torch
    import torch.distributed as dist

    import otel_rl
    from ports import free_port

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        tel = otel_rl.init(run_dir=tmp_path / "run", panel=False, quiet=True, system_metrics_interval_s=0, perf_interval_s=0.05)
        with tel.run():
            for i in range(30):
                with tel.iteration(i, env_steps=i):
                    with tel.phase("learning"):
                        pass
                    for bucket in range(2):
                        with tel.phase("gradient_sync"):
                            dist.all_reduce(torch.ones(4))
        tel.close()
    finally:
        dist.destroy_process_group()
        for name in ("MASTER_ADDR", "MASTER_PORT"):
            os.environ.pop(name, None)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    calls = [r["values"]["Perf/dp_gradient_sync_calls_per_rank"] for r in records if r["kind"] == "scalars" and "Perf/dp_gradient_sync_calls_per_rank" in r["values"]]
    assert calls and set(calls) == {2.0}


def test_every_output_gets_the_same_perf_windows_and_a_key_the_loop_logs_stays_its_own(tmp_path):
    """metrics.jsonl and TensorBoard hold one set of Perf/* windows (made once, in the pipeline), at the same steps; the
    loop's own Perf/collection_time is never overwritten by a window's."""
    import json
    import time

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import otel_rl

    tel = otel_rl.init(run_dir=tmp_path, quiet=True, system_metrics_interval_s=0, tensorboard=True, perf_interval_s=0.2,
                       pipeline_interval_s=0.05)  # fmt: skip
    with tel.run():
        for i in range(300):  # 1.5 s at least: windows of 0.2 s, passes every 50 ms
            with tel.iteration(i, env_steps=8 * (i + 1)):
                with tel.phase("collector_wait"):
                    time.sleep(0.001)
                with tel.phase("learning"):
                    time.sleep(0.004)
            tel.scalars({"Perf/collection_time": 123.0}, env_steps=8 * (i + 1))
    tel.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    windows = [r for r in records if r["kind"] == "scalars" and "Perf/learning_time" in r["values"]]
    assert len(windows) >= 2
    assert all(r["values"].get("Perf/collection_time", 123.0) == 123.0 for r in records if r["kind"] == "scalars")
    board = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    board.Reload()
    written = [(e.step, e.value) for e in board.Scalars("Perf/learning_time")]
    assert [step for step, _ in written] == [r["step"] for r in windows]
    assert all(abs(value - r["values"]["Perf/learning_time"]) <= 1e-6 * r["values"]["Perf/learning_time"] for (_, value), r in zip(written, windows, strict=True))
    assert {e.value for e in board.Scalars("Perf/collection_time")} == {123.0}
