"""Rank-aware telemetry: two small all-reduces per log window.

Per log window, the learner phase timings of every rank are averaged and
throughput is summed (``Perf/total_fps`` is the whole job's), with one
packed ``all_reduce`` however many keys there are (after a fixed-size one
that checks every rank has the same keys). A key's schema aggregation says
which: ``sum`` keys are summed, everything else is averaged.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

from otel_rl.formats import schema


def _key_hash(keys: list[str]) -> float:
    # 20 bits: its square times the world size stays exact in float64.
    return float(zlib.crc32("\x00".join(keys).encode()) & 0xFFFFF)


def reduce_across_ranks(values: Mapping[str, float], group: Any = None) -> dict[str, float]:
    """Mean or sum of each key over the ranks of ``group``.

    A key a rank does not have (or has as None) counts as missing there: the
    mean is over the ranks that have it. Two all-reduces when every rank has
    the same keys (the usual window); when they differ (a rank whose window
    is still empty, a phase only some ranks run), the ranks first agree on the
    union of their keys: a collective of mismatched sizes would abort the job.
    """
    import torch
    import torch.distributed as dist

    keys = sorted(values)
    world = dist.get_world_size(group)
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
    packed = torch.tensor([*numbers, *present], dtype=torch.float64)
    dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group)
    n = len(keys)
    out: dict[str, float] = {}
    for i, key in enumerate(keys):
        count = packed[n + i].item()
        if not count:
            continue
        total_i = packed[i].item()
        out[key] = total_i if schema.metric_spec(key).aggregation == "sum" else total_i / count
    return out
