"""Rank-aware telemetry: a few small collectives per log window.

Per log window, the learner phase timings of every rank are averaged and
throughput is summed (``Perf/total_fps`` is the whole job's), with one
packed ``all_reduce`` however many keys there are (after a fixed-size one
that checks every rank has the same keys). A key's schema aggregation says
which: ``sum`` keys are summed, everything else is averaged. Each rank's own
timings travel in the same all-reduce (rank 0 records them per rank), and the
ranks' clocks are compared through timed all-reduces (:func:`clock_offsets`).
"""

from __future__ import annotations

import statistics
import zlib
from collections.abc import Callable, Mapping
from typing import Any

from otel_rl.formats import schema


def _key_hash(keys: list[str]) -> float:
    # 20 bits: its square times the world size stays exact in float64.
    return float(zlib.crc32("\x00".join(keys).encode()) & 0xFFFFF)


def reduce_across_ranks(values: Mapping[str, float], group: Any = None) -> dict[str, float]:
    """Mean or sum of each key over the ranks of ``group`` (see :func:`reduce_and_gather`)."""
    return reduce_and_gather(values, lambda key: False, group)[0]


def reduce_and_gather(values: Mapping[str, float], gathered: Callable[[str], bool], group: Any = None) -> tuple[dict[str, float], list[dict[str, float]]]:
    """Mean or sum of each key over the ranks of ``group``, and each rank's own value of the keys ``gathered`` picks.

    A key a rank does not have (or has as None) counts as missing there: the
    mean is over the ranks that have it. Two all-reduces when every rank has
    the same keys (the usual window): the second carries a row per rank for
    the gathered keys, which only that rank fills. When the keys differ (a rank
    whose window is still empty, a phase only some ranks run), the ranks first
    agree on the union of their keys: a collective of mismatched sizes would
    abort the job. ``gathered`` must pick by name alone, the same on every rank.
    """
    import torch
    import torch.distributed as dist

    keys = sorted(values)
    world, me = dist.get_world_size(group), dist.get_rank(group)
    digest = _key_hash(keys)
    numbers = [0.0 if values[k] is None else float(values[k]) for k in keys]
    present = [0.0 if values[k] is None else 1.0 for k in keys]
    # Fixed-size part first, so that ranks with different keys never reduce tensors of different sizes.
    check = torch.tensor([digest, digest * digest, float(len(keys))], dtype=torch.float64)
    dist.all_reduce(check, op=dist.ReduceOp.SUM, group=group)
    total, squares = check[0].item(), check[1].item()
    if squares * world != total * total or check[2].item() != len(keys) * world:  # all equal iff (Cauchy-Schwarz)
        everyone: list[list[str]] = [None] * world  # type: ignore[list-item]
        dist.all_gather_object(everyone, keys, group=group)
        keys = sorted(set().union(*everyone))
        numbers = [0.0 if values.get(k) is None else float(values[k]) for k in keys]
        present = [0.0 if values.get(k) is None else 1.0 for k in keys]
    own = [i for i, key in enumerate(keys) if gathered(key)]
    rows = torch.zeros((2, world, len(own)), dtype=torch.float64)
    rows[0, me] = torch.tensor([numbers[i] for i in own], dtype=torch.float64)
    rows[1, me] = torch.tensor([present[i] for i in own], dtype=torch.float64)
    packed = torch.cat([torch.tensor([*numbers, *present], dtype=torch.float64), rows.flatten()])
    dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group)
    n = len(keys)
    out: dict[str, float] = {}
    for i, key in enumerate(keys):
        count = packed[n + i].item()
        if not count:
            continue
        total_i = packed[i].item()
        out[key] = total_i if schema.metric_spec(key).aggregation == "sum" else total_i / count
    rows = packed[2 * n :].reshape(2, world, len(own)).tolist()
    per_rank = [{keys[i]: rows[0][r][j] for j, i in enumerate(own) if rows[1][r][j]} for r in range(world)]
    return out, per_rank


ALIGN_ROUNDS = 8
"""Timed all-reduces per clock measurement (the median of their differences is kept)."""


def clock_offsets(now_ns: Callable[[], int], group: Any = None, rounds: int = ALIGN_ROUNDS) -> list[float]:
    """Every rank's clock minus the group's first rank's, in milliseconds (one entry per rank of ``group``).

    A small all-reduce ends on every rank within microseconds of the others:
    each rank reads its clock right after each of ``rounds`` of them (after one
    more that absorbs the ranks' arrival), the readings are gathered, and a
    rank's offset is the median of its differences to the first rank's. Every
    rank of ``group`` must call this at the same point, as any collective.
    """
    import torch
    import torch.distributed as dist

    token = torch.zeros(1)
    readings = []
    for _ in range(rounds + 1):
        dist.all_reduce(token, group=group)
        readings.append(now_ns())
    mine = torch.tensor(readings[1:], dtype=torch.int64)
    everyone = [torch.zeros_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(everyone, mine, group=group)
    first = everyone[0]
    return [statistics.median((theirs - first).tolist()) / 1e6 for theirs in everyone]


