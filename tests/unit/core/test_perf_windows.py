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
    assert windows.take() == {}  # a new window
