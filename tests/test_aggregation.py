"""Self-aggregated histograms: batched binning gives exactly what binning one value at a time gives."""

from __future__ import annotations

import random
from bisect import bisect_left

from otel_rl import schema
from otel_rl.outputs.otel import aggregation
from otel_rl.outputs.otel.aggregation import Aggregates
from otel_rl.core.records import PhaseRecord


def phase(name: str, duration_ns: int, end_ns: int, span_id: int = 0, children=None) -> PhaseRecord:
    record = PhaseRecord(schema.phase_spec("learner", name), end_ns - duration_ns, end_ns, 0, 1, "main", children=children)
    record.span_id = span_id
    return record


def test_batched_bins_match_one_at_a_time(monkeypatch):
    monkeypatch.setattr(aggregation, "FOLD_EVERY", 100)  # also fold inside a pass, as a long pass would
    rng = random.Random(7)
    aggregates = Aggregates(0, {}, trace_id=1)
    durations = [int(rng.lognormvariate(13, 1.5)) for _ in range(1000)]  # ~0.01 ms .. ~100 ms
    for i, ns in enumerate(durations):
        forward = phase("inference_forward", ns // 2, 10**9 + i * 10**6)
        aggregates.record_phases([phase("inference", ns, 10**9 + i * 10**6, span_id=i + 1 if i % 97 == 0 else 0, children=[forward])])
        if i % 300 == 0:
            aggregates.fold()  # a pipeline pass ends
    metric = next(m for m in aggregates.collect(2 * 10**9) if m.name == schema.METRIC_PHASE_DURATION)
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
