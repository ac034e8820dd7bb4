"""Self-aggregated histograms: batched binning, and binning from columns, give exactly what binning one value at a time gives."""

from __future__ import annotations

import itertools
import random
import time
from bisect import bisect_left

import numpy as np

from otel_rl.base.clock import Clock
from otel_rl.core.batches import Phases
from otel_rl.core.pipeline import Pipeline, RecordSink
from otel_rl.core.sampling import SpanBudget, SpanSampler
from otel_rl.core.segment_source import SegmentSource
from otel_rl.formats import schema
from otel_rl.outputs import aggregates as aggregation
from otel_rl.outputs.aggregates import Aggregates, AggregatorSink
from otel_rl.outputs.otel.metrics import collect
from otel_rl.shm import segment as shm
from otel_rl.training.recorder import Recorder

SPECS = (schema.phase_spec("learner", "inference"), schema.phase_spec("learner", "inference_forward"))


def phases(duration_ns: int, end_ns: int, span_id: int) -> Phases:
    """A phase of ``duration_ns`` ending at ``end_ns``, and one nested in it of half that; both with ``span_id``."""
    return Phases(
        SPECS,
        np.array([0, 1]),
        np.array([end_ns - duration_ns, end_ns - duration_ns // 2], dtype=np.int64),
        np.array([end_ns, end_ns], dtype=np.int64),
        np.array([0, 1], dtype=np.int16),
        np.array([span_id, span_id], dtype=np.uint64),
    )


def test_batched_bins_match_one_at_a_time(monkeypatch):
    monkeypatch.setattr(aggregation, "FOLD_EVERY", 100)  # also fold inside a pass, as a long pass would
    rng = random.Random(7)
    aggregates = Aggregates(0, {})
    durations = [int(rng.lognormvariate(13, 1.5)) for _ in range(1000)]  # ~0.01 ms .. ~100 ms
    for i, ns in enumerate(durations):
        aggregates.record_phases(phases(ns, 10**9 + i * 10**6, i + 1 if i % 97 == 0 else 0))
        if i % 300 == 0:
            aggregates.fold()  # a pipeline pass ends
    metric = next(m for m in collect(aggregates.snapshot(2 * 10**9), 1) if m.name == schema.METRIC_PHASE_DURATION)
    points = {p.attributes[schema.ATTR_PHASE]: p for p in metric.data.data_points}
    for name, values in (("inference", [ns / 1e6 for ns in durations]), ("inference_forward", [(ns // 2) / 1e6 for ns in durations])):
        expected = [0] * (len(schema.PHASE_BUCKETS_MS) + 1)
        for value in values:
            expected[bisect_left(schema.PHASE_BUCKETS_MS, value)] += 1
        point = points[name]
        assert list(point.bucket_counts) == expected
        assert point.count == len(values)
        assert abs(point.sum - sum(values)) < 1e-6
        assert (point.min, point.max) == (min(values), max(values))
    exemplars = points["inference"].exemplars
    assert exemplars and all(e.span_id % 97 == 1 for e in exemplars)
    for exemplar in exemplars:  # each sits in the bucket of its own value
        assert durations[exemplar.span_id - 1] / 1e6 == exemplar.value
    summary = aggregates.phase_summary()["learner"]["phases"]["inference"]
    assert summary["count"] == 1000 and summary["max_ms"] == max(durations) / 1e6


class _Iterations(RecordSink):
    """Keeps the iterations a pipeline hands over, and how many batches they came in."""

    def __init__(self):
        self.batches, self.iterations = 0, []

    def on_iterations(self, batch):
        self.batches += 1
        self.iterations.extend(batch)


def test_iterations_read_as_columns_bin_as_their_records():
    """A segment's iterations reach the aggregates as columns: the same bins, counts and sums as their records,
    and an exemplar for phases the pipeline kept as spans."""
    segment = shm.Segment(None, b"", 4096)
    recorder = Recorder(segment, 4096)
    aggregates = Aggregates(0, {})
    spans = _Iterations()
    source = SegmentSource(shm.SegmentReader(segment.buffer))
    sampler = SpanSampler(SpanBudget(float("inf")))  # every iteration a span: each phase has a span id
    pipeline = Pipeline([source], [spans, AggregatorSink(aggregates, dict)], Clock(), itertools.count(1), sampler=sampler)
    phases = [recorder.new_phase(schema.phase_spec("learner", name)) for name in ("inference", "learning")]
    iteration = recorder.iteration_factory(None, False)
    rng = random.Random(3)
    for i in range(200):
        with iteration("learner", i, i * 4):
            for phase_ in phases:
                with phase_:
                    end = time.perf_counter_ns() + rng.randrange(1, 200_000)
                    while time.perf_counter_ns() < end:
                        pass
        if i % 70 == 69:
            pipeline.drain()
    pipeline.drain()
    assert spans.batches >= 2 and [it.index for it in spans.iterations] == list(range(200))
    metrics = {m.name: m for m in collect(aggregates.snapshot(time.time_ns()), 1)}
    points = {p.attributes[schema.ATTR_PHASE]: p for p in metrics[schema.METRIC_PHASE_DURATION].data.data_points}
    for name in ("inference", "learning"):
        values = [(p.end_ns - p.start_ns) / 1e6 for it in spans.iterations for p in it.phases if p.spec.name == name]
        expected = [0] * (len(schema.PHASE_BUCKETS_MS) + 1)
        for value in values:
            expected[bisect_left(schema.PHASE_BUCKETS_MS, value)] += 1
        point = points[name]
        assert list(point.bucket_counts) == expected and point.count == 200
        assert abs(point.sum - sum(values)) < 1e-6 and (point.min, point.max) == (min(values), max(values))
        assert point.exemplars
        by_span = {p.span_id: p for it in spans.iterations for p in it.phases}
        for exemplar in point.exemplars:  # each the value of the phase whose span it names
            phase_ = by_span[exemplar.span_id]
            assert phase_.spec.name == name and exemplar.value == (phase_.end_ns - phase_.start_ns) / 1e6
    (cycles,) = metrics[schema.METRIC_ITERATION_DURATION].data.data_points
    walls = [it.wall_ns / 1e6 for it in spans.iterations]
    assert cycles.count == 200 and abs(cycles.sum - sum(walls)) < 1e-6
    summary = aggregates.phase_summary()["learner"]
    accounted = sum(it.accounted_ns for it in spans.iterations) / 1e6
    assert abs(summary["accounted_share"] - accounted / sum(walls)) < 1e-9
    assert aggregates.env_steps() == 199 * 4
