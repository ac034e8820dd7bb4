"""Scenarios run on every rank of a real gloo process group (see test_distributed.py)."""

from __future__ import annotations

import os
import time
import traceback

import torch
import torch.distributed as dist


def run(rank: int, world: int, port: int, scenario: str, results, extra) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results.put((rank, "ok", globals()[scenario](rank, world, extra)))
    except Exception as exc:  # the test asserts on it
        results.put((rank, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        dist.destroy_process_group()


def rank_data(rank: int) -> dict:
    """Deterministic raw data of one rank, also rebuilt by the test for the reference."""
    g = torch.Generator().manual_seed(100 + rank)
    n = 6 + 3 * rank
    return {
        "values": torch.randn(n, generator=g, dtype=torch.float64).float(),
        "mask": torch.rand(n, generator=g) > 0.4,
        "lr": [0.1 * (rank + 1), 0.2 * (rank + 1)][: 1 + rank % 2],
    }


def reduce_types(rank: int, world: int, extra) -> dict:
    from otel_rl.stats_tracker import ReduceType, StatsTracker

    calls = []
    original = dist.all_reduce

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    dist.all_reduce = counting
    tracker = StatsTracker()
    data = rank_data(rank)
    tracker.denominator(valid=data["mask"])
    with tracker.scope("actor"):
        tracker.denominator(valid=data["mask"])
        for reduce_type in ReduceType:
            if reduce_type is not ReduceType.SCALAR:
                tracker.stat("valid", reduce_type, **{f"x_{reduce_type.value}": data["values"]})
    tracker.scalar(**{"lr": data["lr"][0]})
    if len(data["lr"]) > 1:
        tracker.scalar(lr=data["lr"][1])
    if rank == 0:
        tracker.scalar(only_rank0=5.0)  # other ranks lack this key but still join the collectives
    tracker.denominator(none=torch.zeros(4, dtype=torch.bool))
    tracker.stat("none", empty_mask=torch.ones(4))  # an all-false mask: dropped
    out = tracker.export(reduce_group=dist.group.WORLD)
    many = StatsTracker()
    for i in range(50):
        many.scalar(**{f"k{i}": float(i)})
    before = len(calls)
    many.export(reduce_group=dist.group.WORLD)
    dist.all_reduce = original
    return {"stats": out, "collectives_small": before, "collectives_many": len(calls) - before}


def disagreement(rank: int, world: int, extra) -> dict:
    from otel_rl.stats_tracker import ReduceType, StatsTracker

    tracker = StatsTracker()
    tracker.denominator(valid=torch.ones(3, dtype=torch.bool))
    tracker.stat("valid", ReduceType.AVG if rank == 0 else ReduceType.SUM, loss=torch.ones(3))
    return tracker.export(reduce_group=dist.group.WORLD)


def telemetry(rank: int, world: int, extra) -> dict:
    import otel_rl

    run_dir, endpoint = extra
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    os.environ["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/protobuf"
    tel = otel_rl.init(
        run_dir=run_dir, rank=rank, world_size=world, jsonl=True, trace_enabled=True, system_metrics_interval_s=0
    )
    with tel.run():
        for i in range(5):
            with tel.iteration(i, env_steps=i * 8):
                with tel.phase("learning"):
                    time.sleep(0.02 * (rank + 1))
        tel.flush(timeout_s=60)  # an exact window: the agent has read everything (its start-up competes with torch's)
        reduced = tel.log_window({"Perf/total_fps": 100.0 * (rank + 1), "Loss/critic": float(rank)}, group=dist.group.WORLD)
    tel.close()
    return reduced


def areal_parity(rank: int, world: int, extra) -> dict:
    """Per-micro-batch masks before their stats, a per-key group, and the group's device, on every rank."""
    from otel_rl import stats_tracker as stats
    from otel_rl.stats_tracker import StatsTracker, reduce_device

    tracker = StatsTracker("actor/")
    data = rank_data(rank)
    half = len(data["values"]) // 2
    # Masks of both micro-batches first, then their stats: paired by position.
    tracker.denominator(n_valid_tokens=data["mask"][:half])
    tracker.denominator(n_valid_tokens=data["mask"][half:])
    tracker.stat("n_valid_tokens", adv=data["values"][:half])
    tracker.stat("n_valid_tokens", adv=data["values"][half:])
    # A key reduced within a group of ranks 0 and 1 only.
    pair = dist.new_group([0, 1])
    if rank in (0, 1):
        tracker.scalar(reduce_group=pair, pair_only=float(rank + 1))
    out = tracker.export(reduce_group=dist.group.WORLD)
    stats.get("rollout/").scalar(reward=float(rank))
    everything = stats.export_all(reduce_group=dist.group.WORLD)
    return {"stats": out, "all": everything, "device": str(reduce_device(dist.group.WORLD))}


def window_keys_differ(rank: int, world: int, extra) -> list:
    """Log windows whose keys differ across ranks (an empty window on one rank, a phase only rank 0 runs)."""
    from otel_rl.training.distributed import reduce_across_ranks

    first = reduce_across_ranks({} if rank == 1 else {"Perf/learning_time": 2.0 * (rank + 1)}, dist.group.WORLD)
    second = reduce_across_ranks(
        {"Perf/total_fps": 10.0, **({"Perf/learner_replay_sample_ms": 4.0} if rank == 0 else {})}, dist.group.WORLD
    )
    same = reduce_across_ranks({"Perf/total_fps": 1.0}, dist.group.WORLD)  # and the ranks are still in step
    return [first, second, same]


def wider_key_sync_group(rank: int, world: int, extra) -> dict:
    """Default keys reduced within ranks 0 and 1, one key over every rank, keys agreed across WORLD (a wider key_sync_group)."""
    from otel_rl.stats_tracker import StatsTracker

    pair, alone = dist.new_group([0, 1]), dist.new_group([2])  # each rank's data-parallel group (every rank makes both)
    tracker = StatsTracker()
    tracker.scalar(default=float(rank + 1))  # 1 and 2 on the pair, 3 on rank 2
    tracker.scalar(reduce_group=dist.group.WORLD, everywhere=float(rank))
    return tracker.export(reduce_group=pair if rank in (0, 1) else alone, key_sync_group=dist.group.WORLD)
