"""A distributed stats tracker: masked tensor statistics reduced across data-parallel ranks.

    from otel_rl import stats

    stats.denominator(valid_tokens=mask)                 # boolean masks first
    stats.stat(denominator="valid_tokens", advantages=adv)   # then tensors measured over them
    stats.scalar(lr=3e-4)                                 # plain numbers (weighted means)
    with stats.scope("actor"), stats.record_timing("update"):
        ...
    values = stats.export_all(reduce_group=dp_group)      # identical on every rank
    tel.scalars(stats.publishable(values))

Reduce types: ``AVG_MIN_MAX`` (default for ``stat``: ``key/avg``, ``key/min``,
``key/max``), ``AVG``, ``SUM``, ``MIN``, ``MAX`` and ``SCALAR`` (the mean of
``scalar()`` values plus ``key__count``, so results from several workers can be
merged by :func:`merge_worker_stats`). Means are the masked sum over the mask
count; minimum and maximum only look at masked positions.

Across ranks, :meth:`StatsTracker.export` first agrees on the union of keys
with their reduce type and denominator (a rank without a key still takes part
in every collective, with identity values; a disagreement is an error naming
the key), then reduces everything with three packed all-reduces (sum, min,
max), however many keys there are. A key whose mask selected nothing is left
out; a ``SCALAR`` with no values is left out, never NaN.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from enum import Enum
from typing import Any

COUNT_SUFFIX = "__count"
TIMING_PREFIX = "timeperf/"


class ReduceType(str, Enum):
    AVG_MIN_MAX = "avg_min_max"
    AVG = "avg"
    SUM = "sum"
    MIN = "min"
    MAX = "max"
    SCALAR = "scalar"


class StatsError(ValueError):
    """Bad input to the tracker, or ranks that disagree about a key; the message names the key."""


def _torch():
    import torch

    return torch


class StatsTracker:
    """Thread-safe collector of one component's statistics (see the module docstring)."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self._lock = threading.Lock()
        self._scopes = threading.local()
        self._denominators: dict[str, list] = {}
        self._stats: dict[str, tuple[ReduceType, str, list]] = {}
        self._scalars: dict[str, list[float]] = {}

    # -- recording --------------------------------------------------------

    def _stack(self) -> list[str]:
        stack = getattr(self._scopes, "stack", None)
        if stack is None:
            stack = self._scopes.stack = []
        return stack

    def _key(self, key: str) -> str:
        return "/".join([*self._stack(), key])

    @contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Prefix keys recorded inside with ``name/`` (scopes nest: ``a/b/key``)."""
        self._stack().append(name)
        try:
            yield
        finally:
            self._stack().pop()

    def scalar(self, **values: float) -> None:
        """Record plain numbers; each key exports its mean and ``key__count``."""
        with self._lock:
            for key, value in values.items():
                full = self._key(key)
                if full in self._stats:
                    raise StatsError(f"{full!r} is already a tensor stat; a key has one reduce type")
                self._scalars.setdefault(full, []).append(float(value))

    def denominator(self, **masks: Any) -> None:
        """Register boolean masks that ``stat()`` calls then refer to by name.

        Raises:
            StatsError: a mask that is not a non-empty boolean tensor.
        """
        torch = _torch()
        with self._lock:
            for key, mask in masks.items():
                full = self._key(key)
                if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
                    raise StatsError(f"denominator {full!r} must be a boolean tensor, got {_describe(mask)}")
                if mask.numel() == 0:
                    raise StatsError(f"denominator {full!r} is empty")
                self._denominators.setdefault(full, []).append(mask.detach().clone())

    def stat(self, denominator: str, reduce_type: ReduceType = ReduceType.AVG_MIN_MAX, **tensors: Any) -> None:
        """Record tensors measured over the latest mask of ``denominator`` (same shape).

        Raises:
            StatsError: an unregistered denominator, a non-float or empty
                tensor, a shape that differs from the mask, or ``SCALAR``.
        """
        torch = _torch()
        reduce_type = ReduceType(reduce_type)
        if reduce_type is ReduceType.SCALAR:
            raise StatsError("stat() cannot use SCALAR; record plain numbers with scalar()")
        with self._lock:
            denominator_key = self._key(denominator)
            masks = self._denominators.get(denominator_key)
            if not masks:
                raise StatsError(f"denominator {denominator_key!r} was not registered with denominator()")
            mask = masks[-1]
            for key, values in tensors.items():
                full = self._key(key)
                if not isinstance(values, torch.Tensor) or not values.is_floating_point():
                    raise StatsError(f"stat {full!r} must be a floating-point tensor, got {_describe(values)}")
                if values.numel() == 0:
                    raise StatsError(f"stat {full!r} is empty")
                if values.shape != mask.shape:
                    raise StatsError(
                        f"stat {full!r} has shape {tuple(values.shape)} but denominator {denominator_key!r} "
                        f"has shape {tuple(mask.shape)}"
                    )
                known = self._stats.get(full)
                if known is not None and (known[0], known[1]) != (reduce_type, denominator_key):
                    raise StatsError(f"stat {full!r} was recorded with {known[0].name} over {known[1]!r} before")
                if full in self._scalars:
                    raise StatsError(f"{full!r} is already a scalar; a key has one reduce type")
                entry = self._stats.setdefault(full, (reduce_type, denominator_key, []))
                entry[2].append((values.detach().clone(), mask))

    @contextmanager
    def record_timing(self, key: str) -> Iterator[None]:
        """Time the block; exported as the ``SCALAR`` ``timeperf/<key>`` (seconds)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            with self._lock:
                self._scalars.setdefault(TIMING_PREFIX + self._key(key), []).append(elapsed)

    # -- export -----------------------------------------------------------

    def _local(self) -> tuple[dict[str, tuple[str, str]], dict[str, list[float]]]:
        """Key metadata and local partials [sum, count, min, max] (float64, over masked positions)."""
        torch = _torch()
        meta: dict[str, tuple[str, str]] = {}
        partials: dict[str, list[float]] = {}
        for key, (reduce_type, denominator, records) in self._stats.items():
            meta[key] = (reduce_type.value, denominator)
            values = torch.cat([v.reshape(-1).double() for v, _ in records])
            mask = torch.cat([m.reshape(-1) for _, m in records])
            selected = values[mask]
            if selected.numel():
                partials[key] = [selected.sum().item(), float(selected.numel()), selected.min().item(), selected.max().item()]
            else:
                partials[key] = [0.0, 0.0, float("inf"), float("-inf")]
        for key, numbers in self._scalars.items():
            meta[key] = (ReduceType.SCALAR.value, "")
            partials[key] = [sum(numbers), float(len(numbers)), min(numbers), max(numbers)]
        return meta, partials

    def export(self, reduce_group: Any = None, key_sync_group: Any = None, reset: bool = True) -> dict[str, float]:
        """The statistics, reduced across ``reduce_group`` when given (identical on every rank).

        ``key_sync_group`` is the group in which ranks agree on keys (default:
        ``reduce_group``). Without a group (or without an initialised
        ``torch.distributed``) the export is local.

        Raises:
            StatsError: ranks disagree on a key's reduce type or denominator.
        """
        with self._lock:
            meta, partials = self._local()
            if reset:
                self._denominators.clear()
                self._stats.clear()
                self._scalars.clear()
        if _distributed(reduce_group):
            meta, partials = _all_reduce(meta, partials, reduce_group, key_sync_group or reduce_group)
        return _finish(meta, partials)


def _distributed(group: Any) -> bool:
    if group is None:
        return False
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _all_reduce(meta, partials, group, key_group):
    """Agree on keys, then three packed all-reduces: sums and counts, minima, maxima."""
    import torch
    import torch.distributed as dist

    everyone: list[dict[str, tuple[str, str]]] = [None] * dist.get_world_size(key_group)  # type: ignore[list-item]
    dist.all_gather_object(everyone, meta, group=key_group)
    union: dict[str, tuple[str, str]] = {}
    for rank, rank_meta in enumerate(everyone):
        for key, spec in rank_meta.items():
            known = union.setdefault(key, spec)
            if known != spec:
                raise StatsError(
                    f"ranks disagree about {key!r}: reduce type {known[0]} over {known[1]!r} on one rank, "
                    f"{spec[0]} over {spec[1]!r} on rank {rank}"
                )
    keys = sorted(union)
    identity = [0.0, 0.0, float("inf"), float("-inf")]
    local = [partials.get(key, identity) for key in keys]
    sums = torch.tensor([p[0] for p in local] + [p[1] for p in local], dtype=torch.float64)
    minima = torch.tensor([p[2] for p in local], dtype=torch.float64)
    maxima = torch.tensor([p[3] for p in local], dtype=torch.float64)
    dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=group)
    dist.all_reduce(minima, op=dist.ReduceOp.MIN, group=group)
    dist.all_reduce(maxima, op=dist.ReduceOp.MAX, group=group)
    n = len(keys)
    reduced = {
        key: [sums[i].item(), sums[n + i].item(), minima[i].item(), maxima[i].item()] for i, key in enumerate(keys)
    }
    return union, reduced


def _finish(meta: dict[str, tuple[str, str]], partials: dict[str, list[float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key in sorted(meta):
        total, count, minimum, maximum = partials[key]
        if count == 0:
            continue  # an all-false mask, or no scalar values: left out, never NaN
        reduce_type = ReduceType(meta[key][0])
        if reduce_type is ReduceType.AVG_MIN_MAX:
            out[f"{key}/avg"], out[f"{key}/min"], out[f"{key}/max"] = total / count, minimum, maximum
        elif reduce_type is ReduceType.AVG:
            out[key] = total / count
        elif reduce_type is ReduceType.SUM:
            out[key] = total
        elif reduce_type is ReduceType.MIN:
            out[key] = minimum
        elif reduce_type is ReduceType.MAX:
            out[key] = maximum
        else:
            out[key] = total / count
            out[key + COUNT_SUFFIX] = count
    return out


def merge_worker_stats(exports: list[Mapping[str, float]]) -> dict[str, float]:
    """Merge the exports of several workers: keys with a ``__count`` are weighted by it.

    Keys without a count (``/avg``, ``/min``, ``/max``, ``SUM``...) are kept:
    ``/min`` takes the minimum, ``/max`` the maximum, others the plain mean
    over the workers that have them. Counts are summed, so merges compose.
    """
    out: dict[str, float] = {}
    weighted: dict[str, tuple[float, float]] = {}
    plain: dict[str, list[float]] = {}
    for export in exports:
        for key, value in export.items():
            if key.endswith(COUNT_SUFFIX):
                continue
            count = export.get(key + COUNT_SUFFIX)
            if count is not None:
                total, n = weighted.get(key, (0.0, 0.0))
                weighted[key] = (total + value * count, n + count)
            else:
                plain.setdefault(key, []).append(value)
    for key, (total, n) in weighted.items():
        if n > 0:
            out[key] = total / n
            out[key + COUNT_SUFFIX] = n
    for key, values in plain.items():
        if key.endswith("/min"):
            out[key] = min(values)
        elif key.endswith("/max"):
            out[key] = max(values)
        else:
            out[key] = sum(values) / len(values)
    return out


def publishable(values: Mapping[str, float]) -> dict[str, float]:
    """The values a backend should see: internal ``__count`` keys removed."""
    return {k: v for k, v in values.items() if not k.endswith(COUNT_SUFFIX)}


def _describe(value: Any) -> str:
    dtype = getattr(value, "dtype", None)
    return f"{type(value).__name__}" + (f" of {dtype}" if dtype is not None else "")


_trackers: dict[str, StatsTracker] = {}
_trackers_lock = threading.Lock()
DEFAULT = ""


def get(name: str = DEFAULT) -> StatsTracker:
    """The named tracker (created on first use); the default tracker has the empty name."""
    with _trackers_lock:
        tracker = _trackers.get(name)
        if tracker is None:
            tracker = _trackers[name] = StatsTracker(name)
        return tracker


def export_all(reduce_group: Any = None, key_sync_group: Any = None, reset: bool = True) -> dict[str, float]:
    """Export every named tracker; ranks first agree on the set of tracker names."""
    names = sorted(_trackers)
    if _distributed(reduce_group):
        import torch.distributed as dist

        group = key_sync_group or reduce_group
        everyone: list[list[str]] = [None] * dist.get_world_size(group)  # type: ignore[list-item]
        dist.all_gather_object(everyone, names, group=group)
        names = sorted(set().union(*everyone))
    out: dict[str, float] = {}
    for name in names:
        for key, value in get(name).export(reduce_group, key_sync_group, reset).items():
            full = f"{name}/{key}" if name else key
            if full in out:
                import logging

                logging.getLogger(__name__).warning("otel-rl stats: %r exported by two trackers; keeping the last", full)
            out[full] = value
    return out


def scalar(**values: float) -> None:
    get().scalar(**values)


def denominator(**masks: Any) -> None:
    get().denominator(**masks)


def stat(denominator: str, reduce_type: ReduceType = ReduceType.AVG_MIN_MAX, **tensors: Any) -> None:
    get().stat(denominator, reduce_type, **tensors)


def scope(name: str):
    return get().scope(name)


def record_timing(key: str):
    return get().record_timing(key)


def export(reduce_group: Any = None, key_sync_group: Any = None, reset: bool = True) -> dict[str, float]:
    return get().export(reduce_group, key_sync_group, reset)
