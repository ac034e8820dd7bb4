"""Aggregates of a producer's records that several outputs read: phase and iteration histograms, gauges, counters.

One ``Histogram.record`` through the OpenTelemetry SDK costs about 10 us of
CPU under the GIL; at thousands of phases per second that would steal the
training loop's time. :class:`AggregatorSink` instead collects each phase's
duration on the pipeline thread (a list append) and bins them into explicit
buckets in bulk, once :data:`FOLD_EVERY` wait or a reader reads (numpy's
``searchsorted`` over the batch, counted by ``bincount``, summed by ``sum``: C
loops, not Python ones). The metric export reads a :meth:`Aggregates.snapshot`
(:mod:`otel_rl.outputs.otel.metrics`), the run summary the per-phase
statistics, the producer the totals behind ``window_timings()``. All points
are cumulative.
"""

from __future__ import annotations

import itertools
import math
import threading
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from otel_rl.base.log import logger
from otel_rl.core.batches import IterationBatch, PhaseBatch, Phases, ScalarBatch
from otel_rl.core.pipeline import RecordSink
from otel_rl.core.records import DeviceIntervalRecord, DistributionRecord, EventRecord
from otel_rl.formats import schema

MAX_EVENT_NAMES = 200
"""Distinct event names counted by ``rl.events``; further names are not counted."""
_logger = logger(__name__)

MAX_GAUGE_KEYS = 2000
"""Distinct scalar keys exported as gauges; more are dropped with one warning."""


FOLD_EVERY = 8192
"""Durations a series holds unbinned before they are binned in bulk (at the end of the call that reached it), or when a reader reads."""


QUANTILE_ACCURACY = 0.01
"""Relative error bound of the quantiles the run summary gives (those of ``otel-rl analyze`` are exact)."""
_GAMMA = (1 + QUANTILE_ACCURACY) / (1 - QUANTILE_ACCURACY)
_LOG_GAMMA = math.log(_GAMMA)


def bucket_counts(bounds: np.ndarray, values: np.ndarray) -> list[int]:
    """How many of ``values`` fall in each explicit bucket of ascending ``bounds`` (one more bucket than bounds).

    A value equal to a bound counts in that bound's bucket, as ``bisect_left``
    puts it (OpenTelemetry's buckets are closed above).
    """
    return np.bincount(np.searchsorted(bounds, values, side="left"), minlength=len(bounds) + 1).tolist()


_DISTRIBUTION_BOUNDS = np.asarray(schema.DISTRIBUTION_BOUNDS, dtype=np.float64)


class Bins:
    """Explicit-bucket histogram of one series, in milliseconds, with a quantile sketch beside it.

    Values are appended to ``pending`` and binned by :meth:`fold`; readers fold first.
    The sketch counts values in logarithmic buckets (DDSketch's mapping), so a
    quantile read from it is within :data:`QUANTILE_ACCURACY` of the value of
    that rank, whatever the explicit buckets are.
    """

    __slots__ = ("attributes", "counts", "total", "count", "minimum", "maximum", "exemplars", "pending", "sketch")

    def __init__(self, attributes: dict[str, Any], buckets: int) -> None:
        self.attributes = attributes
        self.counts = [0] * buckets
        self.total = 0.0
        self.count = 0
        self.minimum = float("inf")
        self.maximum = float("-inf")
        self.exemplars: dict[int, tuple[float, int, int]] = {}
        self.pending: list[float] = []
        self.sketch: Counter[int] = Counter()

    def fold(self, bounds: np.ndarray) -> None:
        """Bin the pending values on ``bounds`` (ascending, as an array: numpy would convert a tuple every call)."""
        values = self.pending
        if not values:
            return
        self.pending = []
        array = np.asarray(values, dtype=np.float64)
        self.counts = [a + b for a, b in zip(self.counts, bucket_counts(bounds, array))]
        self.total += sum(values)
        self.count += len(values)
        self.minimum = min(self.minimum, min(values))
        self.maximum = max(self.maximum, max(values))
        # Bucket i holds (gamma**(i-1), gamma**i]; zero and below share the lowest key.
        keys = np.ceil(np.log(np.maximum(array, 1e-12)) / _LOG_GAMMA).astype(np.int64)
        self.sketch.update(dict(zip(*(a.tolist() for a in np.unique(keys, return_counts=True)))))

    def quantile(self, q: float) -> float:
        """The value of rank ``ceil(q * count)`` (the nearest-rank quantile), within :data:`QUANTILE_ACCURACY`."""
        if not self.count:
            return 0.0
        rank = max(1, math.ceil(q * self.count - 1e-9))
        seen = 0
        for key in sorted(self.sketch):
            seen += self.sketch[key]
            if seen >= rank:
                estimate = 2 * _GAMMA**key / (_GAMMA + 1)
                return min(max(estimate, self.minimum), self.maximum)
        return self.maximum


class Aggregates:
    """Cumulative histograms, gauges and counters; written by the pipeline thread, read by the outputs.

    Args:
        start_time_ns: start of every cumulative series (telemetry start).
        base_attributes: attributes added to every data point (rank, world size).
        bounds_ms: explicit histogram bucket bounds in milliseconds.
    """

    def __init__(
        self,
        start_time_ns: int,
        base_attributes: Mapping[str, Any],
        bounds_ms: tuple[float, ...] = schema.PHASE_BUCKETS_MS,
    ) -> None:
        self._start_ns = start_time_ns
        self._base = dict(base_attributes)
        self.bounds = bounds_ms
        self._bounds = np.asarray(bounds_ms, dtype=np.float64)
        self._lock = threading.Lock()
        self._phases: dict[tuple[str, str, str], tuple[schema.PhaseSpec, Bins]] = {}
        # clock -> id(spec) -> bins: the per-phase lookup, by identity (specs are cached per phase)
        self._by_spec: dict[str, dict[int, Bins]] = {"host": {}}
        self._spec_refs: list[schema.PhaseSpec] = []  # keeps ids in _by_spec valid
        self._iterations: dict[str, Bins] = {}
        self._accounted_ms: dict[str, float] = {}
        self._gauges: dict[str, float | int] = {}
        self._gauge_times: dict[str, int] = {}
        self._env_steps: dict[str, int] = {}
        self._scalar_env_steps: int | None = None
        self._dropped: dict[str, int] = {}
        self._run_info: dict[str, str] | None = None
        self._bottleneck: dict[str, str] | None = None
        self._run_active: int | None = None
        self._events: dict[str, int] = {}
        self._distributions: dict[str, Bins] = {}

    def _phase_bins(self, spec: schema.PhaseSpec, clock: str = "host") -> Bins:
        by_id = self._by_spec.setdefault(clock, {})
        entry = by_id.get(id(spec))
        if entry is not None:
            return entry
        key = (spec.timeline, spec.name, clock)
        entry = self._phases.get(key)
        if entry is None:
            attributes = {
                **self._base,
                schema.ATTR_TIMELINE: spec.timeline,
                schema.ATTR_PHASE: spec.name,
                schema.ATTR_CLOCK: clock,
            }
            entry = self._phases[key] = (spec, Bins(attributes, len(self.bounds) + 1))
        # The name key merges specs that describe the same series (a CUDA phase's host fallback, say).
        by_id[id(spec)] = entry[1]
        self._spec_refs.append(spec)
        return entry[1]

    def _add(self, bins: Bins, value_ms: float, time_ns: int, span_id: int) -> None:
        bins.pending.append(value_ms)
        if span_id:
            self._exemplar(bins, value_ms, time_ns, span_id)
        if len(bins.pending) >= FOLD_EVERY:
            bins.fold(self._bounds)

    def _exemplar(self, bins: Bins, value_ms: float, time_ns: int, span_id: int) -> None:
        bins.exemplars[bisect_left(self.bounds, value_ms)] = (value_ms, time_ns, span_id)

    def fold(self) -> None:
        """Bin every pending value (readers do, before they read)."""
        with self._lock:
            self._fold()

    def _fold(self) -> None:
        bounds = self._bounds
        for _, bins in self._phases.values():
            bins.fold(bounds)
        for bins in self._iterations.values():
            bins.fold(bounds)

    def record_phases(self, phases: Phases) -> None:
        """Bin phases (nested ones included); a phase with a span id becomes its bucket's exemplar."""
        with self._lock:
            self._record_phases(phases)

    def _record_phases(self, phases: Phases) -> None:
        host = self._by_spec["host"]
        for spec, durations in phases.by_spec():
            (host.get(id(spec)) or self._phase_bins(spec)).pending += (durations / 1e6).tolist()
        spanned = np.flatnonzero(phases.span_ids)
        if len(spanned):
            for spec_id, start, end, span_id in zip(*(column[spanned].tolist() for column in (phases.spec_ids, phases.starts, phases.ends, phases.span_ids))):
                self._exemplar(host[id(phases.specs[spec_id])], (end - start) / 1e6, end, span_id)
        self._fold_full()

    def record_device_interval(self, interval: DeviceIntervalRecord) -> None:
        """A GPU interval: the same histogram, with ``rl.clock=gpu``."""
        with self._lock:
            self._add(self._phase_bins(interval.spec, "gpu"), interval.duration_ns / 1e6, interval.end_ns, interval.span_id)

    def record_iterations(self, batch: IterationBatch) -> None:
        """Bin cycles' wall times and their phases."""
        with self._lock:
            timeline = batch.timeline
            self._iteration_bins(timeline).pending += (batch.walls() / 1e6).tolist()
            self._accounted_ms[timeline] = self._accounted_ms.get(timeline, 0.0) + int(batch.accounted.sum()) / 1e6
            steps = max((s for s in batch.env_steps if s is not None), default=None)
            if steps is not None and steps > self._env_steps.get(timeline, -1):
                self._env_steps[timeline] = steps
            self._record_phases(batch.phases)

    def _fold_full(self) -> None:
        """Bin the series holding :data:`FOLD_EVERY` values or more: a series holds at most a pass more than that."""
        for bins in itertools.chain(self._iterations.values(), self._by_spec["host"].values()):
            if len(bins.pending) >= FOLD_EVERY:
                bins.fold(self._bounds)

    def _iteration_bins(self, timeline: str) -> Bins:
        bins = self._iterations.get(timeline)
        if bins is None:
            bins = self._iterations[timeline] = Bins({**self._base, schema.ATTR_TIMELINE: timeline}, len(self.bounds) + 1)
        return bins

    def set_gauges(self, values: Mapping[str, float | int | None], time_ns: int | Mapping[str, int]) -> None:
        """Latest value per scalar key, at ``time_ns`` (one time, or each key's); None (non-finite) keeps the last value."""
        times = time_ns if isinstance(time_ns, Mapping) else dict.fromkeys(values, time_ns)
        with self._lock:
            gauges = self._gauges
            if values.keys() <= gauges.keys() and None not in values.values():
                # The steady state: known keys, finite values; two C-level updates.
                gauges.update(values)
                self._gauge_times.update(times)
                return
            for key, value in values.items():
                if value is None:
                    continue
                if key not in gauges and len(gauges) >= MAX_GAUGE_KEYS:
                    _logger.warning("otel-rl: more than %d scalar keys; extra keys are not exported as gauges", MAX_GAUGE_KEYS)
                    continue
                gauges[key] = value
                self._gauge_times[key] = times[key]

    def record_distribution(self, key: str, values: Any) -> None:
        """Bin the finite values of one ``distribution()`` call (a numpy array) on :data:`schema.DISTRIBUTION_BOUNDS`."""
        if not values.size:
            return
        counts = bucket_counts(_DISTRIBUTION_BOUNDS, values)
        with self._lock:
            bins = self._distributions.get(key)
            if bins is None:
                if len(self._distributions) >= MAX_GAUGE_KEYS:
                    return
                bins = self._distributions[key] = Bins({**self._base, schema.ATTR_KEY: key}, len(counts))
            bins.counts = [a + b for a, b in zip(bins.counts, counts)]
            bins.total += float(values.sum())
            bins.count += int(values.size)
            bins.minimum = min(bins.minimum, float(values.min()))
            bins.maximum = max(bins.maximum, float(values.max()))

    def count_event(self, name: str) -> None:
        with self._lock:
            if name in self._events or len(self._events) < MAX_EVENT_NAMES:
                self._events[name] = self._events.get(name, 0) + 1

    def set_run_info(self, labels: Mapping[str, str]) -> None:
        """Labels of the ``rl.run.info`` gauge (value 1), exported from now on."""
        with self._lock:
            self._run_info = dict(labels)

    def set_bottleneck(self, side: str, phase: str) -> None:
        """The ``rl.bottleneck`` gauge (value 1) of the live verdict, labelled with its side and phase, from now on."""
        with self._lock:
            self._bottleneck = {schema.ATTR_TIMELINE: side or "none", schema.ATTR_PHASE: phase or "none"}

    def set_run_active(self, active: bool) -> None:
        """The ``rl.run.active`` gauge: 1 from the run's start, 0 once it ended (dashboards and alerts tell a finished run from a stuck one)."""
        with self._lock:
            self._run_active = int(active)

    def set_dropped(self, counts: Mapping[str, int]) -> None:
        with self._lock:
            self._dropped.update(counts)

    # -- readers --------------------------------------------------------

    def totals(self) -> tuple[dict[tuple[str, str], float], dict[str, tuple[int, float]]]:
        """Cumulative host milliseconds per (timeline, phase), and (cycles, wall ms) per timeline."""
        with self._lock:
            self._fold()
            phases = {(k[0], k[1]): b.total for k, (_, b) in self._phases.items() if k[2] == "host"}
            cycles = {t: (b.count, b.total) for t, b in self._iterations.items()}
        return phases, cycles

    def env_steps(self) -> int | None:
        """The latest env-steps count of the learner's iterations (of any timeline's without a learner), or of the scalars
        when theirs is higher (a loop that counts its steps once an iteration sampled them)."""
        with self._lock:
            steps = self._env_steps.get(schema.LEARNER)
            if steps is None and self._env_steps:
                steps = max(self._env_steps.values())
            if self._scalar_env_steps is not None and (steps is None or self._scalar_env_steps > steps):
                steps = self._scalar_env_steps
        return steps

    def note_env_steps(self, steps: int | None) -> None:
        """The env steps a scalars record carries (the newest of a batch)."""
        if steps is None:
            return
        with self._lock:  # read by the summary and the end line on other threads
            if self._scalar_env_steps is None or steps > self._scalar_env_steps:
                self._scalar_env_steps = steps

    def phase_summary(self) -> dict[str, dict[str, Any]]:
        """Per timeline: iteration stats, accounted and Other shares, per-phase count/mean/p50/p95 (ms).

        Percentiles are nearest-rank, within :data:`QUANTILE_ACCURACY` (see :class:`Bins`).
        """
        out: dict[str, dict[str, Any]] = {}
        with self._lock:
            self._fold()
            for (_, _, clock), (spec, bins) in self._phases.items():
                entry = out.setdefault(spec.timeline, {"phases": {}})
                entry["phases"][spec.name if clock == "host" else f"{spec.name}@{clock}"] = self._stats(bins)
            for timeline, bins in self._iterations.items():
                entry = out.setdefault(timeline, {"phases": {}})
                entry["iterations"] = self._stats(bins)
                accounted = self._accounted_ms.get(timeline, 0.0)
                entry["accounted_share"] = accounted / bins.total if bins.total else 0.0
                entry["other_share"] = max(bins.total - accounted, 0.0) / bins.total if bins.total else 0.0
        return out

    def _stats(self, bins: Bins) -> dict[str, Any]:
        return {
            "count": bins.count,
            "mean_ms": bins.total / bins.count if bins.count else 0.0,
            "p50_ms": bins.quantile(0.5),
            "p95_ms": bins.quantile(0.95),
            "max_ms": bins.maximum if bins.count else 0.0,
        }

    # -- an agent taking over ----------------------------------------------

    _STATE = ("_start_ns", "_phases", "_iterations", "_accounted_ms", "_gauges", "_gauge_times", "_env_steps", "_scalar_env_steps",
              "_run_info", "_bottleneck", "_run_active", "_events", "_distributions")  # fmt: skip

    def state(self) -> dict[str, Any]:
        """Everything counted so far, for an agent that takes over to go on from (:meth:`restore`); folded first."""
        with self._lock:
            self._fold()
            return {name: getattr(self, name) for name in self._STATE}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Go on from the counts of the agent that served the producer before (what it committed, of :meth:`state`)."""
        with self._lock:
            for name in self._STATE:
                if name in state:
                    setattr(self, name, state[name])
            self._by_spec = {}
            self._spec_refs = []
            for (_, _, clock), (spec, bins) in self._phases.items():  # the pipeline's own specs join these by name
                self._by_spec.setdefault(clock, {})[id(spec)] = bins
                self._spec_refs.append(spec)
            self._by_spec.setdefault("host", {})

    def snapshot(self, now_ns: int) -> Snapshot:
        """Every series as it stands, copied under the lock; exemplars are handed out once."""
        with self._lock:
            self._fold()
            return Snapshot(
                start_ns=self._start_ns,
                now_ns=now_ns,
                base=dict(self._base),
                bounds=self.bounds,
                phases=[_point(bins) for _, bins in self._phases.values()],
                iterations=[_point(bins) for bins in self._iterations.values()],
                distributions=[_point(bins) for bins in self._distributions.values()],
                gauges={key: (value, self._gauge_times[key]) for key, value in self._gauges.items()},
                run_active=self._run_active,
                run_info=None if self._run_info is None else dict(self._run_info),
                bottleneck=None if self._bottleneck is None else dict(self._bottleneck),
                env_steps=dict(self._env_steps),
                dropped=dict(self._dropped),
                events=dict(self._events),
            )


def _point(bins: Bins) -> HistogramPoint:
    exemplars, bins.exemplars = list(bins.exemplars.values()), {}
    return HistogramPoint(dict(bins.attributes), bins.count, bins.total, list(bins.counts), bins.minimum, bins.maximum, exemplars)


@dataclass(frozen=True)
class HistogramPoint:
    """One histogram series as of a :meth:`Aggregates.snapshot`; exemplars are ``(value_ms, time_ns, span_id)``."""

    attributes: dict[str, Any]
    count: int
    total: float
    counts: list[int]
    minimum: float
    maximum: float
    exemplars: list[tuple[float, int, int]]


@dataclass(frozen=True)
class Snapshot:
    """Every aggregate at ``now_ns`` (cumulative since ``start_ns``), for a metric export."""

    start_ns: int
    now_ns: int
    base: dict[str, Any]
    bounds: tuple[float, ...]
    phases: list[HistogramPoint]
    iterations: list[HistogramPoint]
    distributions: list[HistogramPoint]
    gauges: dict[str, tuple[float | int, int]]
    """Each scalar key's latest value and its time."""
    run_active: int | None
    run_info: dict[str, str] | None
    bottleneck: dict[str, str] | None
    """The live verdict's side and phase (``rl.timeline``, ``rl.phase``), None before one."""
    env_steps: dict[str, int]
    dropped: dict[str, int]
    events: dict[str, int]


class AggregatorSink(RecordSink):
    """Feeds :class:`Aggregates` from the pipeline."""

    def __init__(self, aggregates: Aggregates, dropped: Callable[[], Mapping[str, int]]) -> None:
        self.aggregates = aggregates
        self._dropped = dropped

    def on_iterations(self, batch: IterationBatch) -> None:
        self.aggregates.record_iterations(batch)

    def on_phases(self, batch: PhaseBatch) -> None:
        self.aggregates.record_phases(batch.phases)

    def on_device_interval(self, interval: DeviceIntervalRecord) -> None:
        self.aggregates.record_device_interval(interval)

    def on_scalars(self, batch: ScalarBatch) -> None:
        self.aggregates.note_env_steps(batch.env_steps[-1])  # a call's own count (RLlib's after its sampling), at most the newest
        latest = batch.latest()  # None keeps a gauge's last value
        self.aggregates.set_gauges({key: value for key, (value, _) in latest.items()}, {key: time_ns for key, (_, time_ns) in latest.items()})

    def on_distribution(self, record: DistributionRecord) -> None:
        self.aggregates.record_distribution(record.key, record.values)

    def on_event(self, event: EventRecord) -> None:
        self.aggregates.count_event(event.name)
        if event.name == schema.EVENT_BOTTLENECK:
            self.aggregates.set_bottleneck(str(event.attributes.get("side") or ""), str(event.attributes.get("phase") or ""))

    def on_drain(self, now_ns: int) -> None:
        self.aggregates.set_dropped(self._dropped())
