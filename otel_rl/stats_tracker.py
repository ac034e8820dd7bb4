"""A distributed stats tracker: masked tensor statistics reduced across data-parallel ranks.

    from otel_rl import stats_tracker as stats

    stats.denominator(n_valid_tokens=mask)                  # boolean masks first
    stats.stat(denominator="n_valid_tokens", advantages=adv)  # then tensors measured over them
    stats.scalar(lr=3e-4)                                   # plain numbers (weighted means)
    with stats.scope("actor"), stats.record_timing("update"):
        ...
    values = stats.export_all(reduce_group=dp_group)        # identical on every rank
    stats.commit(tel, values, epoch=epoch, epoch_step=step, global_step=global_step)  # or tel.scalars(stats.publishable(values))

Reduce types: ``AVG_MIN_MAX`` (default for ``stat``: ``key/avg``, ``key/min``,
``key/max``, and ``key/avg__count``), ``AVG`` (with ``key__count``), ``SUM``, ``MIN``, ``MAX`` and ``SCALAR`` (the mean of
``scalar()`` values plus ``key__count``, an int, so results from several
workers can be merged by :func:`merge_worker_stats`). Means are the masked sum
over the mask count; minimum and maximum only look at masked positions. Sums
are taken in float64.

Masks and records are paired by position: the i-th ``stat()`` record of a key
is measured over the i-th mask of its denominator, so masks may be recorded
per micro-batch before the stats (``denominator, denominator, stat, stat``);
records beyond the last mask use the last mask. Every denominator is exported
too, as the ``SUM`` of its masks: the count of selected elements
(``n_seqs``, ``n_valid_tokens``).

Keys: a named tracker prefixes its keys with its name (``rollout/reward``);
scopes nest (``actor/update/loss``); leading and trailing ``/`` of names are
stripped, so no key has ``//``. :meth:`StatsTracker.record_timing` writes
``timeperf/<key>`` outside any scope or name; :meth:`StatsTracker.disable_scope`
records at the tracker's root for a while.

Across ranks, :meth:`StatsTracker.export` first agrees on the union of keys
with their reduce type and denominator (a rank without a key still takes part
in every collective, with identity values; a disagreement is an error naming
the key), then reduces everything with three packed all-reduces (sum, min,
max) per process group, however many keys there are, on the group's device
(CUDA for NCCL groups). A key may name its own ``reduce_group``. A mean,
minimum or maximum over an all-false mask is left out, never NaN; a ``SUM``
over it is 0.0.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from enum import Enum
from typing import Any, TypeVar

from otel_rl.base.log import logger
from otel_rl.formats import schema

_logger = logger(__name__)
_F = TypeVar("_F", bound=Callable[..., Any])

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


def _clean(name: str) -> str:
    return str(name).strip("/")


class StatsTracker:
    """Thread-safe collector of one component's statistics (see the module docstring)."""

    def __init__(self, name: str = "") -> None:
        self.name = _clean(name)
        self._lock = threading.Lock()
        self._scopes = threading.local()
        self._denominators: dict[str, list] = {}
        self._stats: dict[str, tuple[ReduceType, str, list]] = {}
        self._scalars: dict[str, list[float]] = {}
        self._groups: dict[str, Any] = {}  # per-key reduce groups

    # -- keys -------------------------------------------------------------

    def _stack(self) -> list[str]:
        stack = getattr(self._scopes, "stack", None)
        if stack is None:
            stack = self._scopes.stack = []
        return stack

    def _key(self, key: str) -> str:
        parts = [self.name, *self._stack(), _clean(key)]
        return "/".join(p for p in parts if p)

    @contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Prefix keys recorded inside with ``name/`` (scopes nest: ``a/b/key``)."""
        self._stack().append(_clean(name))
        try:
            yield
        finally:
            self._stack().pop()

    def scope_func_wrapper(self, name: str) -> Callable[[_F], _F]:
        """Decorator: the function's records are made inside :meth:`scope` ``(name)``."""

        def decorator(fn: _F) -> _F:
            @functools.wraps(fn)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                with self.scope(name):
                    return fn(*args, **kwargs)

            return wrapper  # type: ignore[return-value]

        return decorator

    @contextmanager
    def disable_scope(self) -> Iterator[None]:
        """Record at the tracker's root (its name still applies) while inside."""
        saved = self._stack()
        self._scopes.stack = []
        try:
            yield
        finally:
            self._scopes.stack = saved

    # -- recording --------------------------------------------------------

    def _set_group(self, key: str, group: Any) -> None:
        if group is not None:
            self._groups[key] = group

    def scalar(self, reduce_group: Any = None, **values: float) -> None:
        """Record plain numbers; each key exports its mean and ``key__count``.

        Raises:
            StatsError: a value that is not a number, or a key that is already a
                tensor stat (nothing of the call is recorded then).
        """
        numbers: dict[str, float] = {}
        for key, value in values.items():
            full = self._key(key)
            try:
                numbers[full] = float(value)
            except (TypeError, ValueError) as exc:
                raise StatsError(f"scalar {full!r} must be a number, got {type(value).__name__}") from exc
        with self._lock:
            for full in numbers:
                if full in self._stats or full in self._denominators:
                    raise StatsError(f"{full!r} is already a tensor stat or a denominator; a key has one reduce type")
            for full, number in numbers.items():
                self._scalars.setdefault(full, []).append(number)
                self._set_group(full, reduce_group)

    def denominator(self, reduce_group: Any = None, **masks: Any) -> None:
        """Register boolean masks that ``stat()`` calls then refer to by name; each exports its count.

        Raises:
            StatsError: a mask that is not a non-empty boolean tensor.
        """
        torch = _torch()
        checked: dict[str, Any] = {}
        for key, mask in masks.items():
            full = self._key(key)
            if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
                raise StatsError(f"denominator {full!r} must be a boolean tensor, got {_describe(mask)}")
            if mask.numel() == 0:
                raise StatsError(f"denominator {full!r} is empty")
            checked[full] = mask.detach().clone()
        with self._lock:
            for full, mask in checked.items():
                if full in self._stats or full in self._scalars:
                    raise StatsError(f"{full!r} is already a stat or a scalar; it cannot be a denominator")
                self._denominators.setdefault(full, []).append(mask)
                self._set_group(full, reduce_group)

    def stat(
        self,
        denominator: str,
        reduce_type: ReduceType = ReduceType.AVG_MIN_MAX,
        reduce_group: Any = None,
        **tensors: Any,
    ) -> None:
        """Record tensors measured over a mask of ``denominator`` (the one at the same position; same shape).

        Raises:
            StatsError: an unregistered denominator, a non-float or empty
                tensor, a shape that differs from its mask, or ``SCALAR``.
        """
        torch = _torch()
        try:
            reduce_type = ReduceType(reduce_type)
        except ValueError as exc:
            raise StatsError(f"unknown reduce type {reduce_type!r}") from exc
        if reduce_type is ReduceType.SCALAR:
            raise StatsError("stat() cannot use SCALAR; record plain numbers with scalar()")
        with self._lock:
            denominator_key = self._key(denominator)
            masks = self._denominators.get(denominator_key)
            if not masks:
                raise StatsError(f"denominator {denominator_key!r} was not registered with denominator()")
            checked: list[tuple[str, Any]] = []
            for key, values in tensors.items():
                full = self._key(key)
                if not isinstance(values, torch.Tensor) or not values.is_floating_point():
                    raise StatsError(f"stat {full!r} must be a floating-point tensor, got {_describe(values)}")
                if values.numel() == 0:
                    raise StatsError(f"stat {full!r} is empty")
                known = self._stats.get(full)
                if known is not None and (known[0], known[1]) != (reduce_type, denominator_key):
                    raise StatsError(f"stat {full!r} was recorded with {known[0].name} over {known[1]!r} before")
                if full in self._scalars or full in self._denominators:
                    raise StatsError(f"{full!r} is already a scalar or a denominator; a key has one reduce type")
                mask = masks[min(len(known[2]) if known else 0, len(masks) - 1)]
                if values.shape != mask.shape:
                    raise StatsError(
                        f"stat {full!r} has shape {tuple(values.shape)} but its mask of {denominator_key!r} "
                        f"has shape {tuple(mask.shape)}"
                    )
                checked.append((full, values.detach().clone()))
            for full, values in checked:
                self._stats.setdefault(full, (reduce_type, denominator_key, []))[2].append(values)
                self._set_group(full, reduce_group)

    @contextmanager
    def record_timing(self, key: str) -> Iterator[None]:
        """Time the block; exported as the ``SCALAR`` ``timeperf/<key>`` (seconds), whatever the scope."""
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            with self._lock:
                self._scalars.setdefault(TIMING_PREFIX + _clean(key), []).append(elapsed)

    # -- export -----------------------------------------------------------

    def _local(self, only: str | None) -> tuple[dict[str, tuple[str, str]], dict[str, list[float]]]:
        """Key metadata and local partials [sum, count, min, max] (float64, over masked positions)."""
        torch = _torch()
        meta: dict[str, tuple[str, str]] = {}
        partials: dict[str, list[float]] = {}
        for key, masks in self._denominators.items():
            if only in (None, key):
                meta[key] = (ReduceType.SUM.value, "")
                count = float(sum(int(m.sum()) for m in masks))
                partials[key] = [count, count, float("inf"), float("-inf")]
        for key, (reduce_type, denominator, records) in self._stats.items():
            if only not in (None, key):
                continue
            masks = self._denominators[denominator]
            pairs = [(values, masks[min(i, len(masks) - 1)]) for i, values in enumerate(records)]
            for values, mask in pairs:
                if values.shape != mask.shape:
                    raise StatsError(f"stat {key!r}: a record of shape {tuple(values.shape)} meets a mask of shape {tuple(mask.shape)}")
            meta[key] = (reduce_type.value, denominator)
            flat = torch.cat([v.reshape(-1).double() for v, _ in pairs])
            selected = flat[torch.cat([m.reshape(-1) for _, m in pairs])]
            if selected.numel():
                partials[key] = [selected.sum().item(), float(selected.numel()), selected.min().item(), selected.max().item()]
            else:
                partials[key] = [0.0, 0.0, float("inf"), float("-inf")]
        for key, numbers in self._scalars.items():
            if only in (None, key):
                meta[key] = (ReduceType.SCALAR.value, "")
                partials[key] = [sum(numbers), float(len(numbers)), min(numbers), max(numbers)]
        return meta, partials

    def _reset(self, only: str | None) -> None:
        if only is None:
            self._denominators.clear()
            self._stats.clear()
            self._scalars.clear()
            self._groups.clear()
            return
        for store in (self._denominators, self._stats, self._scalars, self._groups):
            store.pop(only, None)

    def export(
        self, key: str | None = None, reduce_group: Any = None, key_sync_group: Any = None, reset: bool = True
    ) -> dict[str, float]:
        """The statistics (of ``key`` only, when given), reduced across ``reduce_group`` (identical on every rank).

        ``key`` is scoped like a recorded key. ``key_sync_group`` is the group
        in which ranks agree on keys (default: ``reduce_group``). Keys recorded
        with their own ``reduce_group`` are reduced there (by the ranks in
        it). Without a ``reduce_group`` (or without an initialised
        ``torch.distributed``) the whole export is local.

        Raises:
            StatsError: ranks disagree on a key's reduce type or denominator.
        """
        only = None if key is None else self._key(key)
        with self._lock:
            meta, partials = self._local(only)
            groups = dict(self._groups)
            if reset:
                self._reset(only)
        if _distributed(reduce_group):
            meta, partials = _all_reduce(meta, partials, reduce_group, key_sync_group or reduce_group, groups)
        return _finish(meta, partials)


def _distributed(group: Any) -> bool:
    if group is None:
        return False
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def reduce_device(group: Any):
    """Where a group's collectives run: the current CUDA device for NCCL groups, else the CPU."""
    torch = _torch()
    import torch.distributed as dist

    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _group_id(group: Any) -> tuple[int, ...]:
    import torch.distributed as dist

    return tuple(dist.get_process_group_ranks(group))


def _all_reduce(meta, partials, group, key_group, key_groups):
    """Agree on keys (and their groups), then three packed all-reduces per group: sums and counts, minima, maxima."""
    import torch.distributed as dist

    sync = key_group if key_group is not None else group
    local = {key: (*spec, _group_id(key_groups[key]) if key in key_groups else None) for key, spec in meta.items()}
    everyone: list[dict[str, tuple]] = [None] * dist.get_world_size(sync)  # type: ignore[list-item]
    dist.all_gather_object(everyone, local, group=sync)
    union: dict[str, tuple] = {}
    for rank, rank_meta in enumerate(everyone):
        for key, spec in rank_meta.items():
            known = union.setdefault(key, spec)
            if known[:2] != spec[:2]:
                raise StatsError(
                    f"ranks disagree about {key!r}: reduce type {known[0]} over {known[1]!r} on one rank, "
                    f"{spec[0]} over {spec[1]!r} on rank {rank}"
                )
    # Keys by the group they are reduced in; a rank reduces the groups it belongs to.
    by_group: dict[tuple[int, ...] | None, list[str]] = {}
    for key in sorted(union):
        by_group.setdefault(union[key][2], []).append(key)
    handles = {_group_id(g): g for g in key_groups.values()}
    me = dist.get_rank()
    reduced: dict[str, list[float]] = {}
    for ranks in sorted(by_group, key=lambda r: (r is not None, r or ())):
        if ranks is not None and me not in ranks:
            continue
        process_group = group if ranks is None else handles.get(ranks)
        if process_group is None:
            raise StatsError(f"keys {by_group[ranks][:3]} use a reduce group this rank did not record with")
        keys = by_group[ranks]
        reduced.update(_reduce_keys(keys, partials, process_group))
    return {k: union[k][:2] for k in reduced}, reduced


def _reduce_keys(keys: list[str], partials: dict[str, list[float]], group: Any) -> dict[str, list[float]]:
    torch = _torch()
    import torch.distributed as dist

    device = reduce_device(group)
    identity = [0.0, 0.0, float("inf"), float("-inf")]
    local = [partials.get(key, identity) for key in keys]
    sums = torch.tensor([p[0] for p in local] + [p[1] for p in local], dtype=torch.float64, device=device)
    minima = torch.tensor([p[2] for p in local], dtype=torch.float64, device=device)
    maxima = torch.tensor([p[3] for p in local], dtype=torch.float64, device=device)
    dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=group)
    dist.all_reduce(minima, op=dist.ReduceOp.MIN, group=group)
    dist.all_reduce(maxima, op=dist.ReduceOp.MAX, group=group)
    n = len(keys)
    sums, minima, maxima = sums.cpu().tolist(), minima.cpu().tolist(), maxima.cpu().tolist()
    return {key: [sums[i], sums[n + i], minima[i], maxima[i]] for i, key in enumerate(keys)}


def _finish(meta: dict[str, tuple[str, str]], partials: dict[str, list[float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key in sorted(meta):
        total, count, minimum, maximum = partials[key]
        reduce_type = ReduceType(meta[key][0])
        if reduce_type is ReduceType.SUM:
            out[key] = total  # 0.0 over an all-false mask: the series does not vanish
            continue
        if count == 0:
            continue  # an all-false mask, or no scalar values: left out, never NaN
        if reduce_type is ReduceType.AVG_MIN_MAX:
            out[f"{key}/avg"], out[f"{key}/min"], out[f"{key}/max"] = total / count, minimum, maximum
            out[f"{key}/avg{COUNT_SUFFIX}"] = int(count)  # what the mean is over: workers' merge weights by it
        elif reduce_type is ReduceType.AVG:
            out[key] = total / count
            out[key + COUNT_SUFFIX] = int(count)
        elif reduce_type is ReduceType.MIN:
            out[key] = minimum
        elif reduce_type is ReduceType.MAX:
            out[key] = maximum
        else:
            out[key] = total / count
            out[key + COUNT_SUFFIX] = int(count)
    return out


def merge_worker_stats(exports: list[Mapping[str, float]]) -> dict[str, float]:
    """Merge the exports of several workers (a rollout controller's), as AReaL's controller does.

    - A key with a ``__count`` (a scalar's mean, a distribution's ``/avg``): the mean weighted by
      the counts, which are added, so merges compose.
    - ``/min`` and ``/max``: the extremes.
    - Count and sum keys (a last name of ``count`` or ``sum``, ending ``_count`` or ``_sum``,
      starting ``n_`` or ``num_``: a denominator's total): added.
    - Anything else without a count: the plain mean over the workers that have it.
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
        elif _is_total(key):
            out[key] = sum(values)
        else:
            out[key] = sum(values) / len(values)
    return out


def _is_total(key: str) -> bool:
    """A key that counts or sums (added across workers, never averaged)."""
    name = key.rsplit("/", 1)[-1]
    return name in ("count", "sum") or name.endswith(("_count", "_sum")) or name.startswith(("n_", "num_"))


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
    name = _clean(name)
    with _trackers_lock:
        tracker = _trackers.get(name)
        if tracker is None:
            tracker = _trackers[name] = StatsTracker(name)
        return tracker


def export_all(reduce_group: Any = None, key_sync_group: Any = None, reset: bool = True) -> dict[str, float]:
    """Export every named tracker (their keys carry their names); ranks first agree on the tracker names."""
    names = sorted(_trackers)
    if _distributed(reduce_group):
        import torch.distributed as dist

        group = key_sync_group or reduce_group
        everyone: list[list[str]] = [None] * dist.get_world_size(group)  # type: ignore[list-item]
        dist.all_gather_object(everyone, names, group=group)
        names = sorted(set().union(*everyone))
    out: dict[str, float] = {}
    for name in names:
        for key, value in get(name).export(reduce_group=reduce_group, key_sync_group=key_sync_group, reset=reset).items():
            if key in out:
                _logger.warning("otel-rl stats: %r exported by two trackers; keeping the last", key)
            out[key] = value
    return out


def scalar(reduce_group: Any = None, **values: float) -> None:
    get().scalar(reduce_group, **values)


def denominator(reduce_group: Any = None, **masks: Any) -> None:
    get().denominator(reduce_group, **masks)


def stat(denominator: str, reduce_type: ReduceType = ReduceType.AVG_MIN_MAX, reduce_group: Any = None, **tensors: Any) -> None:
    get().stat(denominator, reduce_type, reduce_group, **tensors)


def scope(name: str):
    return get().scope(name)


def scope_func_wrapper(name: str):
    return get().scope_func_wrapper(name)


def disable_scope():
    return get().disable_scope()


def record_timing(key: str):
    return get().record_timing(key)


def export(key: str | None = None, reduce_group: Any = None, key_sync_group: Any = None, reset: bool = True) -> dict[str, float]:
    return get().export(key, reduce_group, key_sync_group, reset)


def commit(tel: Any, stats: Mapping[str, float], *, epoch: int | None = None, epoch_step: int | None = None, global_step: int | None = None) -> None:
    """Send an exported set of stats to ``tel`` at ``global_step``, as AReaL's ``StatsLogger.commit`` does.

    Internal ``__count`` keys are left out (:func:`publishable`); the values reach every output at
    ``global_step`` (the backends' steps never go back after a resume). Where no panel shows them (a
    batch job's log), the run's agent prints them as a table headed by the epoch and steps (seed 002's
    ``tabulate_stats``), off the training thread. Call it on every rank: only rank 0's outputs keep it.
    """
    tel.scalars(publishable(stats), step=global_step)
    where = {name: value for name, value in (("epoch", epoch), ("epoch_step", epoch_step), ("global_step", global_step)) if value is not None}
    tel.event(schema.EVENT_COMMIT, **where)

