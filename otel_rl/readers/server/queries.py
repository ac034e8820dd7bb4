"""What the read API answers beyond the stored rows: listing filters, and curves down-sampled with their extremes.

A curve of a million points is cut to at most ``max_points``: the points are
split into equal buckets and each bucket keeps its lowest and highest point (in
their order), so a spike or a dip survives at any zoom, and the first and the
last point are always kept.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from typing import Any

import numpy as np

from otel_rl.readers.server.storage import STATUSES, RunFilter

DEFAULT_POINTS = 1000
MAX_POINTS = 20_000
MAX_KEYS = 50
"""Keys one curves request may ask for."""
AXES = ("env_steps", "step", "ts")
"""What a curve's x can be: env steps (else the record's step), the step, or the time."""


class BadQuery(ValueError):
    """A query parameter that cannot be used; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def run_filter(query: Mapping[str, str]) -> RunFilter:
    """``project``, ``group``, ``status`` (one or several, comma-separated), ``q``, ``tag``, ``bottleneck`` (a verdict's side,
    or ``side/phase``: ``collector``, ``learner/learning``) and ``order`` of a listing request."""
    statuses = tuple(s.strip() for s in query.get("status", "").split(",") if s.strip())
    unknown = [s for s in statuses if s not in STATUSES]
    if unknown:
        raise BadQuery("status", f"unknown status {unknown[0]!r}; one of {', '.join(STATUSES)}")
    order = query.get("order", "created")
    if order not in ("created", "newest"):
        raise BadQuery("order", "order must be created (oldest first, the default) or newest")
    tag = query.get("tag") or None  # as tags are kept: one form of each accent (NFC), however it was typed
    bottleneck = query.get("bottleneck") or None
    if bottleneck is not None and (len(bottleneck) > 200 or bottleneck.count("/") > 1 or bottleneck.startswith("/")):
        raise BadQuery("bottleneck", "bottleneck is a verdict's side (collector, learner) or side/phase (collector/env_step)")
    return RunFilter(query.get("project") or None, query.get("group") or None, statuses, query.get("q") or None,
                     None if tag is None else unicodedata.normalize("NFC", tag), bottleneck, newest_first=order == "newest")  # fmt: skip


def events_limit(query: Mapping[str, str]) -> int | None:
    """``events=N`` of a run request: its newest N events (None: all of them)."""
    raw = query.get("events")
    if raw is None:
        return None
    try:
        latest = int(raw)
    except ValueError:
        raise BadQuery("events", "events must be a number of events") from None
    if not 0 <= latest <= MAX_EVENTS_LIMIT:
        raise BadQuery("events", f"events must be a number of events, 0 to {MAX_EVENTS_LIMIT:,}")
    return latest


MAX_EVENTS_LIMIT = 2**31 - 1
"""The largest ``events=N`` (a database's integer; a run holds far fewer events)."""


def curve_request(query: Any) -> tuple[list[str], str, int]:
    """The keys, the x axis and the point bound of a curves request."""
    keys = list(dict.fromkeys(query.getall("key", [])))
    if not keys:
        raise BadQuery("key", "query parameter 'key' is required (repeat it for several keys)")
    if len(keys) > MAX_KEYS:
        raise BadQuery("key", f"at most {MAX_KEYS} keys per request")
    axis = query.get("x", "env_steps")
    if axis not in AXES:
        raise BadQuery("x", f"x must be one of {', '.join(AXES)}")
    try:
        points = int(query.get("max_points", DEFAULT_POINTS))
    except ValueError:
        raise BadQuery("max_points", "max_points must be an integer") from None
    return keys, axis, max(4, min(points, MAX_POINTS))


def curve(columns: Mapping[str, np.ndarray], axis: str, max_points: int) -> dict[str, Any]:
    """A key's points (:meth:`Storage.curve`'s columns) as ``{"x", "y", "t", "count"}``, at most ``max_points`` points, extremes kept.

    ``t`` is each point's time. Points without a value (non-finite) or
    without the axis are left out; for ``env_steps`` a record without env
    steps falls back to its step.
    """
    x = columns[axis]
    if axis == "env_steps":
        x = np.where(np.isnan(x), columns["step"], x)
    present = ~np.isnan(x) & ~np.isnan(columns["value"])
    xs, ys, ts = x[present], columns["value"][present], columns["ts"][present]
    keep = np.asarray(extremes(ys, max_points), dtype=np.int64)
    shown = xs[keep] if axis == "ts" else xs[keep].astype(np.int64)
    return {"x": shown.tolist(), "y": ys[keep].tolist(), "t": ts[keep].tolist(), "count": int(present.sum())}


def columns_of(points: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Points read out of the stored records (:meth:`Storage.series`) as curve columns: for data stored before point blocks."""
    def column(name: str) -> np.ndarray:
        return np.array([p[name] for p in points], dtype=np.float64)  # None becomes NaN

    return {"seq": np.arange(len(points), dtype=np.float64), **{name: column(name) for name in ("ts", "step", "env_steps", "value")}}


def extremes(values: np.ndarray, max_points: int) -> list[int]:
    """Indices of at most ``max_points`` values: per equal bucket, its minimum and maximum, and the first and last."""
    n = len(values)
    if n <= max_points:
        return list(range(n))
    buckets = max(1, (max_points - 2) // 2)
    edges = np.linspace(0, n, buckets + 1).astype(np.int64)
    starts = edges[:-1]
    lowest = np.minimum.reduceat(values, starts)
    highest = np.maximum.reduceat(values, starts)
    bucket_of = np.repeat(np.arange(buckets), np.diff(edges))
    # The first index of each bucket's minimum and maximum: positions where the value equals its bucket's extreme.
    is_low = values == lowest[bucket_of]
    is_high = values == highest[bucket_of]
    first_low = _first_per_bucket(is_low, bucket_of, buckets)
    first_high = _first_per_bucket(is_high, bucket_of, buckets)
    keep = np.unique(np.concatenate(([0, n - 1], first_low, first_high)))
    return keep.tolist()


def _first_per_bucket(mask: np.ndarray, bucket_of: np.ndarray, buckets: int) -> np.ndarray:
    """For each bucket, the first index where ``mask`` holds (every bucket has one: its extreme)."""
    hits = np.flatnonzero(mask)
    first = np.full(buckets, len(mask), dtype=np.int64)
    np.minimum.at(first, bucket_of[hits], hits)
    return first[first < len(mask)]
