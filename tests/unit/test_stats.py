"""The stats tracker on one process: the behaviour of AReaL's own tracker tests, and where otel-rl differs on purpose.

Across ranks (real gloo collectives) see test_distributed.py.
"""

from __future__ import annotations

import pytest
import torch

from otel_rl import stats_tracker as stats
from otel_rl.stats_tracker import ReduceType, StatsError, StatsTracker


@pytest.fixture
def tracker():
    return StatsTracker()


def test_masked_mean_min_max(tracker):
    tracker.denominator(mask=torch.tensor([True, False, True]))
    tracker.stat("mask", value=torch.tensor([1.0, 2.0, 3.0]))
    out = tracker.export()
    assert (out["value/avg"], out["value/min"], out["value/max"]) == (2.0, 1.0, 3.0)
    assert out["mask"] == 2.0  # the denominator's count is exported too


def test_scopes_nest_and_denominators_are_exported_within_them(tracker):
    with tracker.scope("parent"):
        tracker.denominator(parent_mask=torch.tensor([True]))
        tracker.stat("parent_mask", parent_value=torch.tensor([1.0]))
        with tracker.scope("child"):
            with pytest.raises(StatsError):
                tracker.stat("child_mask", value=torch.tensor([1.0]))  # not registered in this scope yet
            tracker.denominator(child_mask=torch.tensor([True]))
            tracker.stat("child_mask", value=torch.tensor([1.0]))
    out = tracker.export()
    assert {"parent/parent_mask", "parent/parent_value/avg", "parent/child/child_mask", "parent/child/value/avg"} <= set(out)


def test_reduce_types_over_a_mask(tracker):
    tracker.denominator(mask=torch.tensor([True, False, True]))
    values = torch.tensor([1.0, 2.0, 3.0])
    tracker.stat("mask", ReduceType.SUM, sum_val=values)
    tracker.stat("mask", ReduceType.MIN, min_val=values)
    tracker.stat("mask", ReduceType.MAX, max_val=values)
    tracker.stat("mask", ReduceType.AVG, avg_val=values)
    out = tracker.export()
    assert (out["sum_val"], out["min_val"], out["max_val"], out["avg_val"]) == (4.0, 1.0, 3.0, 2.0)


def test_masks_recorded_first_pair_with_stats_by_position(tracker):
    tracker.denominator(mask=torch.tensor([True, False]))
    tracker.denominator(mask=torch.tensor([False, True]))
    tracker.stat("mask", value=torch.tensor([1.0, 2.0]))  # over the first mask: 1
    tracker.stat("mask", value=torch.tensor([3.0, 4.0]))  # over the second: 4
    assert tracker.export()["value/avg"] == 2.5


def test_records_beyond_the_last_mask_use_the_last_mask(tracker):
    tracker.denominator(mask=torch.tensor([True, False, True]))
    for values in ([1.0, 100.0, 3.0], [5.0, 100.0, 7.0]):
        tracker.stat("mask", value=torch.tensor(values))
    out = tracker.export()
    assert out["value/avg"] == 4.0 and out["value/max"] == 7.0 and out["mask"] == 2.0


def test_all_false_mask_drops_means_but_keeps_sums(tracker):
    with pytest.raises(StatsError):
        tracker.denominator(mask=torch.tensor([], dtype=torch.bool))
    tracker.denominator(mask=torch.tensor([False, False]))
    tracker.stat("mask", value=torch.tensor([1.0, 2.0]))
    tracker.stat("mask", ReduceType.SUM, total=torch.tensor([1.0, 2.0]))
    out = tracker.export()
    assert not {"value/avg", "value/min", "value/max"} & set(out)
    assert out["total"] == 0.0 and out["mask"] == 0.0  # the series does not vanish


def test_export_of_one_key(tracker):
    tracker.denominator(mask1=torch.tensor([True]), mask2=torch.tensor([True]))
    tracker.stat("mask1", value1=torch.tensor([1.0]))
    tracker.stat("mask2", value2=torch.tensor([2.0]))
    assert tracker.export(key="value1") == {"value1/avg": 1.0, "value1/min": 1.0, "value1/max": 1.0, "value1/avg__count": 1}
    rest = tracker.export()
    assert "value1/avg" not in rest and rest["value2/avg"] == 2.0  # the exported key was reset alone
    tracker.scalar(foo=1.0)
    assert tracker.export(key="foo") == {"foo": 1.0, "foo__count": 1}


def test_scalars_are_means_with_an_int_count(tracker):
    tracker.scalar(scalar1=1.0, scalar2=2.0)
    tracker.scalar(scalar1=3.0, scalar2=torch.tensor(4.0))
    out = tracker.export()
    assert out == {"scalar1": 2.0, "scalar1__count": 2, "scalar2": 3.0, "scalar2__count": 2}
    assert type(out["scalar1__count"]) is int


def test_reset_and_keep(tracker):
    tracker.denominator(mask=torch.tensor([True]))
    tracker.stat("mask", value=torch.tensor([1.0]))
    assert "value/avg" in tracker.export(reset=False)
    assert "value/avg" in tracker.export()
    assert tracker.export() == {}


def test_validation(tracker):
    with pytest.raises(StatsError):
        tracker.denominator(invalid=torch.tensor([1.0]))
    tracker.denominator(mask=torch.tensor([True]))
    with pytest.raises(StatsError):
        tracker.stat("nonexistent", value=torch.tensor([1.0]))
    with pytest.raises(StatsError):
        tracker.stat("mask", value=torch.tensor([1.0, 2.0]))  # shape mismatch
    with pytest.raises(StatsError):
        tracker.stat("mask", "invalid", value=torch.tensor([1.0]))
    with pytest.raises(StatsError):
        tracker.stat("mask", ReduceType.SCALAR, value=torch.tensor([1.0]))


def test_a_failed_scalar_leaves_nothing_behind(tracker):
    tracker.scalar(ok=1.0)
    with pytest.raises(StatsError, match="'bad' must be a number"):
        tracker.scalar(fine=2.0, bad="not a number")
    assert tracker.export() == {"ok": 1.0, "ok__count": 1}  # later exports still work; nothing of the failed call


def test_timing_is_timeperf_key_whatever_the_scope():
    named = StatsTracker("learner")
    with named.scope("ppo"), named.record_timing("update"):
        pass
    out = named.export()
    assert set(out) == {"timeperf/update", "timeperf/update__count"}


def test_named_trackers_prefix_their_own_export_and_never_double_slashes():
    rollout = StatsTracker("rollout/")
    with rollout.scope("c/"):
        rollout.scalar(reward=1.0)
    rollout.scalar(**{"/len": 3.0})
    assert set(rollout.export()) == {"rollout/c/reward", "rollout/c/reward__count", "rollout/len", "rollout/len__count"}


def test_scope_func_wrapper_and_disable_scope(tracker):
    @tracker.scope_func_wrapper("update")
    def update():
        tracker.scalar(loss=1.0)
        with tracker.disable_scope():
            tracker.scalar(lr=0.1)

    with tracker.scope("actor"):
        update()
    assert set(tracker.export()) == {"actor/update/loss", "actor/update/loss__count", "lr", "lr__count"}


def test_module_level_default_and_named_trackers():
    stats.denominator(mask=torch.tensor([True, False, True]))
    stats.stat("mask", value=torch.tensor([1.0, 2.0, 3.0]))
    stats.get("rollout").scalar(reward=2.0)
    out = stats.export_all()
    assert out["value/avg"] == 2.0 and out["rollout/reward"] == 2.0
    assert stats.export_all() == {}


def test_float64_and_bfloat16_are_accepted_and_summed_in_float64(tracker):
    tracker.denominator(mask=torch.ones(3, dtype=torch.bool))
    # 2**24 + 1 is not a float32: summed in float32 this mean would be 0.
    tracker.stat("mask", f=torch.tensor([2.0**24, 1.0, -(2.0**24)], dtype=torch.float32))
    tracker.stat("mask", d=torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64))
    tracker.stat("mask", b=torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16))
    out = tracker.export()
    assert out["f/avg"] == 1.0 / 3 and out["d/avg"] == (0.1 + 0.2 + 0.3) / 3 and out["b/avg"] == 2.0


def test_a_real_minus_infinity_minimum_is_kept(tracker):
    tracker.denominator(mask=torch.ones(2, dtype=torch.bool))
    tracker.stat("mask", ReduceType.MIN, low=torch.tensor([float("-inf"), 1.0]))
    assert tracker.export()["low"] == float("-inf")
