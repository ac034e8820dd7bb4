"""Across ranks with real torch.distributed collectives (gloo on CPU), 2 and 3 ranks."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
import torch
import torch.multiprocessing as mp
from dist_workers import rank_data
from otlp_receivers import HttpReceiver
from ports import free_port

from otel_rl.formats import schema, trace
from otel_rl.readers.analysis import read_trace
from otel_rl.stats_tracker import (
    ReduceType,
    StatsError,
    StatsTracker,
    merge_worker_stats,
    publishable,
)


def run_ranks(world: int, scenario: str, extra=None) -> dict[int, tuple[str, object]]:
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    from dist_workers import run

    processes = [
        context.Process(target=run, args=(rank, world, PORTS[world], scenario, results, extra))
        for rank in range(world)
    ]
    for p in processes:
        p.start()
    for p in processes:
        p.join(120)
        assert p.exitcode == 0, f"rank process exited with {p.exitcode}"
    out = {}
    while not results.empty():
        rank, status, value = results.get()
        out[rank] = (status, value)
    return out


PORTS: dict[int, int] = {}


@pytest.fixture(autouse=True)
def fresh_port():
    for world in (2, 3):
        PORTS[world] = free_port()


def reference(world: int) -> dict[str, float]:
    data = [rank_data(r) for r in range(world)]
    selected = torch.cat([d["values"][d["mask"]].double() for d in data])
    lrs = [lr for d in data for lr in d["lr"]]
    masked = float(sum(int(d["mask"].sum()) for d in data))
    out = {
        "valid": masked,  # every denominator exports its count
        "actor/valid": masked,
        "none": 0.0,  # a SUM over all-false masks is 0.0, not left out
        "actor/x_avg_min_max/avg": selected.mean().item(),
        "actor/x_avg_min_max/min": selected.min().item(),
        "actor/x_avg_min_max/max": selected.max().item(),
        "actor/x_avg_min_max/avg__count": len(selected),  # what each mean is over, for a controller's merge
        "actor/x_avg": selected.mean().item(),
        "actor/x_avg__count": len(selected),
        "actor/x_sum": selected.sum().item(),
        "actor/x_min": selected.min().item(),
        "actor/x_max": selected.max().item(),
        "lr": sum(lrs) / len(lrs),
        "lr__count": len(lrs),
        "only_rank0": 5.0,
        "only_rank0__count": 1,
    }
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_every_reduce_type_matches_a_reference_from_all_ranks(world):
    results = run_ranks(world, "reduce_types")
    expected = reference(world)
    for rank in range(world):
        status, value = results[rank]
        assert status == "ok", value
        stats = value["stats"]
        assert set(stats) == set(expected), set(stats) ^ set(expected)  # empty_mask dropped, no NaN anywhere
        for key, want in expected.items():
            assert math.isclose(stats[key], want, rel_tol=1e-9, abs_tol=1e-9), (rank, key, stats[key], want)
            assert type(stats[key]) is type(want), key  # counts are ints
        # One export is three packed all-reduces, for 12 keys or for 50.
        assert value["collectives_small"] == value["collectives_many"] == 3
    assert results[0][1]["stats"] == results[1][1]["stats"]  # every rank gets the same answer


@pytest.mark.parametrize("world", [2, 3])
def test_masks_pair_by_position_per_key_groups_and_names_across_ranks(world):
    results = run_ranks(world, "areal_parity")
    data = [rank_data(r) for r in range(world)]
    selected = torch.cat([d["values"][d["mask"]].double() for d in data])  # each half over its own mask
    for rank in range(world):
        status, value = results[rank]
        assert status == "ok", value
        out = value["stats"]
        assert math.isclose(out["actor/adv/avg"], selected.mean().item(), rel_tol=1e-12)
        assert out["actor/adv/min"] == selected.min().item() and out["actor/adv/max"] == selected.max().item()
        assert out["actor/n_valid_tokens"] == float(sum(int(d["mask"].sum()) for d in data))
        if rank in (0, 1):
            assert out["actor/pair_only"] == 1.5 and out["actor/pair_only__count"] == 2  # ranks 0 and 1 only
        else:
            assert "actor/pair_only" not in out  # not in that group: not reduced here
        assert value["all"]["rollout/reward"] == sum(range(world)) / world and "rollout//reward" not in value["all"]
        assert value["device"] == "cpu"  # gloo reduces on the CPU (NCCL groups on the current CUDA device)


@pytest.mark.parametrize("world", [2, 3])
def test_metadata_disagreement_is_a_clear_error_on_every_rank(world):
    results = run_ranks(world, "disagreement")
    for rank in range(world):
        status, message = results[rank]
        assert status == "error" and "StatsError" in message and "'loss'" in message


@pytest.mark.parametrize("world", [2, 3])
def test_rank_aware_telemetry(world, tmp_path):
    receiver = HttpReceiver().start()
    try:
        results = run_ranks(world, "telemetry", (str(tmp_path), receiver.endpoint))
    finally:
        receiver.stop()
    reduced = {rank: value for rank, (status, value) in results.items() if status == "ok"}
    assert len(reduced) == world, results
    # Throughput is the whole job's; timings are averaged across ranks.
    assert reduced[0]["Perf/total_fps"] == sum(100.0 * (r + 1) for r in range(world))
    assert reduced[0]["Loss/critic"] == sum(range(world)) / world
    mean_sleep_s = sum(0.02 * (r + 1) for r in range(world)) / world
    # The mean of the ranks, not the slowest rank's (10 ms more) nor their sum; sleep() may overshoot a little.
    assert mean_sleep_s <= reduced[0]["Perf/learning_time"] < mean_sleep_s + 0.008
    assert all(reduced[r] == reduced[0] for r in range(world))
    # Rank 0 owns the local outputs; every rank writes its part of the trace (each with its own agent here: a
    # fragment rank 0's trace took in if it was complete by then, else a file beside it).
    names = sorted(p.name for p in tmp_path.iterdir())
    assert [n for n in names if not n.startswith("trace-learner-rank")] == ["metrics.jsonl", "run_config.json", "run_summary.json", "trace.perfetto-trace"]
    learning = Counter(s.process for s in read_trace(tmp_path)[0].slices if s.name == "Learning")
    assert learning == {trace.process_name("learner", r): 5 for r in range(world)}
    # The job's window is recorded once, by rank 0, with each rank's own timings beside the mean.
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    windows = [r for r in records if r["kind"] == "scalars" and "Loss/critic" in r["values"]]
    assert len(windows) == 1 and windows[0]["values"]["Perf/total_fps"] == reduced[0]["Perf/total_fps"]
    for r in range(world):
        assert 0.02 * (r + 1) <= windows[0]["values"][schema.rank_key(r, "Perf/learning_time")] < 0.02 * (r + 1) + 0.008
    # The learner's timings under their own names have one writer, the outputs' one-second windows: one cadence per curve.
    assert not any(schema.is_learner_timing(key) for key in windows[0]["values"])
    # The job's env steps are every rank's (each at iteration 4 of 8 steps): the window's axis, and the run's in its summary.
    assert windows[0]["values"]["Perf/job_env_steps"] == 32.0 * world and windows[0]["axes"]["env_steps"] == 32 * world
    assert json.loads((tmp_path / "run_summary.json").read_text())["env_steps"] == 32 * world
    offsets = [r["attributes"]["offset_ms"] for r in records if r["kind"] == "event" and r["name"] == schema.EVENT_CLOCK_OFFSET]
    assert len(offsets) == 1 and abs(offsets[0]) < 1e-9  # rank 0's own clock, measured once (the first window)
    # A record of its own, for the trace and its readers: never a curve of the trackers.
    assert not any(trace.CLOCK_OFFSET_KEY in r.get("values", {}) for r in records)
    assert {r["writer"] for r in records} == {records[0]["writer"]}  # one writer: rank 0
    # Every rank exports OTLP, each span and data point carrying its rank.
    ranks = set()
    for resource, _ in receiver.received.spans():
        attrs = {a.key: a.value for a in resource.attributes}
        ranks.add((attrs["rl.rank"].int_value, attrs["rl.world_size"].int_value))
    assert ranks == {(r, world) for r in range(world)}


def test_bad_input_names_the_key():
    tracker = StatsTracker()
    with pytest.raises(StatsError, match="'valid'.*boolean"):
        tracker.denominator(valid=torch.ones(3))
    with pytest.raises(StatsError, match="'empty' is empty"):
        tracker.denominator(empty=torch.zeros(0, dtype=torch.bool))
    with pytest.raises(StatsError, match="'nope' was not registered"):
        tracker.stat("nope", loss=torch.ones(3))
    tracker.denominator(valid=torch.ones(3, dtype=torch.bool))
    with pytest.raises(StatsError, match="'loss' has shape"):
        tracker.stat("valid", loss=torch.ones(4))
    with pytest.raises(StatsError, match="'loss' is empty"):
        tracker.stat("valid", loss=torch.ones(0))
    with pytest.raises(StatsError, match="floating-point"):
        tracker.stat("valid", loss=torch.ones(3, dtype=torch.int64))
    with pytest.raises(StatsError, match="SCALAR"):
        tracker.stat("valid", ReduceType.SCALAR, loss=torch.ones(3))


def test_scopes_timing_and_local_export():
    tracker = StatsTracker()
    with tracker.scope("a"), tracker.scope("b"):
        tracker.denominator(m=torch.tensor([True, False, True]))
        tracker.stat("m", loss=torch.tensor([1.0, 100.0, 3.0]))
    with tracker.record_timing("update"):
        pass
    out = tracker.export()
    assert out["a/b/loss/avg"] == 2.0 and out["a/b/loss/min"] == 1.0 and out["a/b/loss/max"] == 3.0
    assert out["timeperf/update__count"] == 1.0 and out["timeperf/update"] >= 0
    assert tracker.export() == {}  # reset after export


def test_worker_merges_weight_by_count_and_keep_uncounted_keys():
    a = {"reward": 1.0, "reward__count": 3.0, "len/avg": 10.0, "len/min": 2.0, "len/max": 20.0}
    b = {"reward": 5.0, "reward__count": 1.0, "len/avg": 30.0, "len/min": 1.0, "len/max": 50.0, "only_b": 7.0}
    merged = merge_worker_stats([a, b])
    assert merged["reward"] == 2.0 and merged["reward__count"] == 4.0
    assert merged["len/avg"] == 20.0 and merged["len/min"] == 1.0 and merged["len/max"] == 50.0
    assert merged["only_b"] == 7.0  # no count: kept, not dropped
    assert "reward__count" not in publishable(merged)
    assert merge_worker_stats([a, b]) == merge_worker_stats([merge_worker_stats([a]), b])


def test_a_controller_merges_workers_as_areal_does():
    """Scalar means weighted by their counts, a distribution's mean weighted by its count with its extremes, counts and sums added."""
    a = {"reward": 1.0, "reward__count": 3, "len/avg": 10.0, "len/avg__count": 3, "len/min": 2.0, "len/max": 20.0, "prm/count": 4.0, "prm/sum": 2.5, "n_seqs": 3.0}
    b = {"reward": 5.0, "reward__count": 1, "len/avg": 30.0, "len/avg__count": 1, "len/min": 1.0, "len/max": 50.0, "prm/count": 6.0, "prm/sum": 1.5, "n_seqs": 1.0}
    merged = merge_worker_stats([a, b])
    assert merged["reward"] == 2.0 and merged["reward__count"] == 4  # (1*3 + 5*1) / 4
    assert merged["len/avg"] == 15.0 and merged["len/avg__count"] == 4  # (10*3 + 30*1) / 4, not 20
    assert (merged["len/min"], merged["len/max"]) == (1.0, 50.0)
    assert merged["prm/count"] == 10.0 and merged["prm/sum"] == 4.0 and merged["n_seqs"] == 4.0  # added, not averaged to 5.0
    assert merge_worker_stats([a, b]) == merge_worker_stats([merge_worker_stats([a]), b])  # merges compose
    assert set(publishable(merged)) == {"reward", "len/avg", "len/min", "len/max", "prm/count", "prm/sum", "n_seqs"}
    # The workers' own exports merge the same way: a distribution's mean is over its count.
    first, second = StatsTracker("rollout/"), StatsTracker("rollout/")
    first.denominator(m=torch.tensor([True, True, True]))
    first.stat("m", len=torch.tensor([10.0, 10.0, 10.0]))
    second.denominator(m=torch.tensor([True]))
    second.stat("m", len=torch.tensor([30.0]))
    assert merge_worker_stats([first.export(), second.export()])["rollout/len/avg"] == 15.0


@pytest.mark.parametrize("world", [3])
def test_a_key_sync_group_wider_than_the_reduce_group_keeps_the_default_keys_in_it(world):
    """AReaL's case: the ranks agree on keys across WORLD while the default keys are reduced within ranks 0 and 1 only."""
    results = run_ranks(world, "wider_key_sync_group")
    for rank in range(world):
        status, value = results[rank]
        assert status == "ok", value
        if rank in (0, 1):
            assert (value["default"], value["default__count"]) == (1.5, 2)  # its own group's ranks, not rank 2's value
        else:
            assert (value["default"], value["default__count"]) == (3.0, 1)
        assert (value["everywhere"], value["everywhere__count"]) == (1.0, 3)  # the key's own group: every rank


def test_windows_whose_keys_differ_across_ranks_are_reduced_over_the_union():
    # Reducing tensors of different sizes would abort every rank (gloo's enforce): the ranks agree on the keys first.
    results = run_ranks(3, "window_keys_differ")
    for rank in range(3):
        status, (first, second, same) = results[rank]
        assert status == "ok"
        assert first == {"Perf/learning_time": (2.0 + 6.0) / 2}  # the mean over the ranks that have it
        assert second == {"Perf/total_fps": 30.0, "Perf/learner_replay_sample_ms": 4.0}
        assert same == {"Perf/total_fps": 3.0}
