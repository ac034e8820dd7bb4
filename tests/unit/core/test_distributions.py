"""``distribution()``: one host copy on the training thread; statistics, histograms and the OpenTelemetry histogram off it."""

from __future__ import annotations

import enum
import json
import math

import numpy as np
import pytest
import torch
from otlp_receivers import HttpReceiver

import otel_rl
from otel_rl.core.distributions import MAX_VALUES, summarize, to_host_array
from otel_rl.core.pipeline import Batch
from otel_rl.core.segment_source import SegmentSource
from otel_rl.formats import schema
from otel_rl.shm import segment as shm
from otel_rl.training.recorder import Recorder


def jsonl(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def stats_of(records: list[dict], key: str) -> list[dict]:
    return [
        {k.rsplit("/", 1)[1]: v for k, v in r["values"].items() if k.startswith(key + "/")}
        for r in records
        if r["kind"] == "scalars" and any(k.startswith(key + "/") for k in r["values"])
    ]


class Kind(enum.Enum):
    A = 1


@pytest.mark.parametrize(
    "values",
    [
        torch.arange(10.0).reshape(2, 5),
        torch.arange(10, dtype=torch.int64),
        torch.arange(10.0, dtype=torch.bfloat16),
        np.arange(10, dtype=np.float32).reshape(5, 2),
        np.arange(10, dtype=np.int16),
        list(range(10)),
        tuple(float(i) for i in range(10)),
    ],
    ids=["tensor-2d", "tensor-int", "tensor-bf16", "ndarray-2d", "ndarray-int16", "list", "tuple"],
)
def test_every_kind_of_array_gives_the_same_statistics(tmp_path, values):
    tel = otel_rl.init(run_dir=tmp_path, jsonl=True, system_metrics_interval_s=0)
    with tel.run():
        tel.distribution("Train/advantage", values, step=np.int64(5))
    tel.close()
    records = jsonl(tmp_path)
    (stats,) = stats_of(records, "Train/advantage")
    expected = np.arange(10.0)
    assert set(stats) == set(schema.DISTRIBUTION_STATS)
    assert stats["min"] == 0 and stats["max"] == 9 and stats["mean"] == 4.5
    assert stats["std"] == pytest.approx(expected.std())
    for name, q in schema.DISTRIBUTION_QUANTILES.items():
        assert stats[name] == pytest.approx(np.quantile(expected, q))
    (record,) = [r for r in records if r["kind"] == "scalars"]
    assert record["step"] == 5


def test_the_training_thread_copies_once_and_later_changes_do_not_leak(tmp_path):
    values = np.ones(100)
    tel = otel_rl.init(run_dir=tmp_path, jsonl=True, system_metrics_interval_s=0)
    with tel.run():
        tel.distribution("Train/advantage", values)
        values[:] = 100.0  # the caller reuses its buffer at once
    tel.close()
    (stats,) = stats_of(jsonl(tmp_path), "Train/advantage")
    assert stats["max"] == 1.0


def test_large_inputs_are_strided_evenly_before_the_copy():
    array = to_host_array(torch.arange(3 * MAX_VALUES, dtype=torch.float32), "k")
    assert array.size == MAX_VALUES and array[1] - array[0] == 3 and array.dtype == np.float64


def test_non_finite_values_are_left_out_and_reported_once(tmp_path):
    tel = otel_rl.init(run_dir=tmp_path, jsonl=True, system_metrics_interval_s=0)
    with tel.run():
        for _ in range(3):
            tel.distribution("Train/advantage", [1.0, math.nan, 3.0, math.inf])
        tel.distribution("Train/all_nan", [math.nan, math.nan])
    tel.close()
    records = jsonl(tmp_path)
    assert [s["mean"] for s in stats_of(records, "Train/advantage")] == [2.0, 2.0, 2.0]
    nonfinite = [r["attributes"] for r in records if r["kind"] == "event" and r["name"] == "nonfinite"]
    assert nonfinite == [{"key": "Train/advantage", "value": "2 of 4 values"}, {"key": "Train/all_nan", "value": "2 of 2 values"}]
    (all_nan,) = stats_of(records, "Train/all_nan")
    assert set(all_nan.values()) == {None}  # null: non-finite, as for scalars


@pytest.mark.parametrize(
    "bad",
    [["a", "b"], {"x": 1.0}, None, Kind.A, np.array([1 + 2j]), torch.tensor([1 + 2j]), [], torch.empty(0), object()],
    ids=["strings", "dict", "none", "enum", "complex-ndarray", "complex-tensor", "empty-list", "empty-tensor", "object"],
)
def test_bad_input_is_one_warning_and_loses_nothing_else(tmp_path, caplog, bad):
    tel = otel_rl.init(run_dir=tmp_path, jsonl=True, system_metrics_interval_s=0)
    with tel.run():
        for _ in range(2):
            tel.distribution("Train/bad", bad)
        tel.distribution("Train/good", [1.0, 2.0])
        tel.scalars({"Loss/critic": 1.0})
    tel.close()
    assert sum("distribution() 'Train/bad'" in r.getMessage() for r in caplog.records) == 1
    records = jsonl(tmp_path)
    assert not stats_of(records, "Train/bad") and stats_of(records, "Train/good")
    assert records[-1]["status"] == "finished"


def test_keys_follow_the_scalar_rules(tmp_path):
    tel = otel_rl.init(run_dir=tmp_path, jsonl=True, system_metrics_interval_s=0)
    with tel.run():
        tel.distribution("actions", [1.0])  # not namespaced
        tel.distribution("Policy/" + "a" * 400, [1.0])  # too long
        tel.distribution(("tuple", "key"), [1.0])  # not a string
    tel.close()
    keys = {k for r in jsonl(tmp_path) if r["kind"] == "scalars" for k in r["values"]}
    assert "custom/actions/mean" in keys
    long_keys = [k for k in keys if k.startswith("Policy/aaa")]
    assert len(long_keys) == len(schema.DISTRIBUTION_STATS) and max(map(len, long_keys)) <= 256
    assert not any("tuple" in k for k in keys)


def test_pending_distributions_are_bounded_by_their_ring_and_counted():
    segment = shm.Segment(None, b"", 64, data_bytes=1 << 20)
    recorder = Recorder(segment, 64)
    values = np.ones(40_000)  # 320 KB each: the data ring takes two (three quarters of it is theirs)
    for index in range(10):
        recorder.add_distribution((index, "Policy/action", values, None, None, None))
    batch = Batch()
    SegmentSource(shm.SegmentReader(segment.buffer)).take(batch)
    assert [raw[0] for raw in batch.distributions] == [0, 1] and recorder.dropped()["distributions"] == 8


def test_summaries_histogram_counts_every_finite_value():
    summary = summarize(np.array([0.0, 1.0, 1.0, 2.0, np.nan]))
    assert summary.nonfinite == 1 and summary.histogram.count == 4 and sum(summary.histogram.counts) == 4
    assert summary.histogram.sum_squares == 6.0 and summary.histogram.edges[0] == 0 and summary.histogram.edges[-1] == 2
    constant = summarize(np.full(5, 3.0))
    assert constant.histogram.counts == [5] and constant.stats["std"] == 0.0


def test_the_opentelemetry_histogram_accumulates_on_fixed_bounds(tmp_path, monkeypatch):
    receiver = HttpReceiver().start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    try:
        tel = otel_rl.init(run_dir=tmp_path, system_metrics_interval_s=0)
        with tel.run():
            tel.distribution("Policy/action", torch.tensor([-0.5, 0.0, 0.5, 2e7]))
            tel.distribution("Policy/action", np.array([0.5, np.nan]))
        tel.close()
        assert receiver.received.wait_for(lambda r: any(m.name == schema.METRIC_DISTRIBUTION for _, m in r.metric_list()))
    finally:
        receiver.stop()
    metric = [m for _, m in receiver.received.metric_list() if m.name == schema.METRIC_DISTRIBUTION][-1]
    (point,) = metric.histogram.data_points
    assert {a.key: a.value.string_value for a in point.attributes}[schema.ATTR_KEY] == "Policy/action"
    assert point.count == 5 and point.sum == pytest.approx(2e7 + 0.5) and point.min == -0.5 and point.max == 2e7
    bounds = list(point.explicit_bounds)
    assert bounds == list(schema.DISTRIBUTION_BOUNDS)
    counts = list(point.bucket_counts)
    assert counts[bounds.index(0.5)] == 2 and counts[bounds.index(0.0)] == 1 and counts[bounds.index(-0.5)] == 1
    assert counts[-1] == 1  # beyond the last bound
