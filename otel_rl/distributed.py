"""Rank-aware telemetry: one packed all-reduce per log window.

Per log window, the learner phase timings of every rank are averaged and
throughput is summed (``Perf/total_fps`` is the whole job's), with a single
``all_reduce`` however many keys there are. A key's schema aggregation says
which: ``sum`` keys are summed, everything else is averaged.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

from otel_rl import schema


class RankMismatchError(ValueError):
    """Ranks reduced different sets of keys in the same window."""


def _key_hash(keys: list[str]) -> float:
    # 20 bits: its square times the world size stays exact in float64.
    return float(zlib.crc32("\x00".join(keys).encode()) & 0xFFFFF)


def reduce_across_ranks(values: Mapping[str, float], group: Any = None) -> dict[str, float]:
    """Mean or sum of each key over the ranks of ``group``, with one all-reduce.

    Every rank must pass the same keys (None values count as missing on that
    rank: the mean is over the ranks that have the key).

    Raises:
        RankMismatchError: the ranks passed different keys (the message names one).
    """
    import torch
    import torch.distributed as dist

    keys = sorted(values)
    world = dist.get_world_size(group)
    digest = _key_hash(keys)
    present = [0.0 if values[k] is None else 1.0 for k in keys]
    numbers = [0.0 if values[k] is None else float(values[k]) for k in keys]
    packed = torch.tensor([digest, digest * digest, *numbers, *present], dtype=torch.float64)
    dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group)
    total, squares = packed[0].item(), packed[1].item()
    if squares * world != total * total:  # all equal iff the sum of squares matches (Cauchy-Schwarz)
        everyone: list[list[str]] = [None] * world  # type: ignore[list-item]
        dist.all_gather_object(everyone, keys, group=group)
        union = set().union(*everyone)
        odd = sorted(k for k in union if any(k not in rank_keys for rank_keys in everyone))
        raise RankMismatchError(f"ranks reduced different keys, e.g. {odd[:3]} is missing on some rank")
    n = len(keys)
    out: dict[str, float] = {}
    for i, key in enumerate(keys):
        count = packed[2 + n + i].item()
        if not count:
            continue
        total_i = packed[2 + i].item()
        out[key] = total_i if schema.metric_spec(key).aggregation == "sum" else total_i / count
    return out
