"""CUDA-event timing: the parts that run without a GPU (fallback, pool, bounds, calibration arithmetic).

The real GPU path is exercised by bench/gpu_check.py on a CUDA machine.
"""

from __future__ import annotations

import logging

import pytest
from otlp_receivers import HttpReceiver

import otel_rl
from otel_rl.formats.schema import phase_spec
from otel_rl.training.cuda_timing import (
    Anchor,
    EventPool,
    PendingPair,
    PendingPairs,
    cuda_unavailable_reason,
    drift_ns,
)


class HostEvent:
    """Stands in for a torch.cuda.Event: completes when told to."""

    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done


def test_anchor_places_events_on_the_host_timeline():
    anchor = Anchor(event=None, wall_ns=1_000_000_000)
    assert anchor.place(0.0) == 1_000_000_000
    assert anchor.place(2.5) == 1_002_500_000
    assert anchor.place(-0.001) == 999_999_000  # an event recorded just before the anchor


def test_drift_between_anchors():
    first = Anchor(None, 10_000_000_000)
    second = Anchor(None, 12_000_000_000)  # 2 s later on the host
    assert drift_ns(first, second, 2000.004) == 4_000  # the device clock ran 4 us fast
    assert drift_ns(first, second, 2000.0) == 0


def test_event_pool_reuses_events():
    pool = EventPool(HostEvent, limit=2)
    a, b = pool.acquire(), pool.acquire()
    pool.release(a, b)
    assert {id(pool.acquire()), id(pool.acquire())} == {id(a), id(b)}
    assert pool.created == 2
    pool.release(a, b, HostEvent())  # over the limit: the extra one is let go
    assert len(pool) == 2


def _pair(pool, n):
    return PendingPair(pool.acquire(), pool.acquire(), Anchor(None, 0), phase_spec("learner", "learning"), 0, 7, n)


def test_pending_pairs_resolve_in_order_and_drop_the_oldest_when_the_gpu_lags():
    pool = EventPool(HostEvent, limit=100)
    pending = PendingPairs(limit=3, pool=pool)
    pairs = [_pair(pool, n) for n in range(5)]
    for pair in pairs:
        pending.add(pair)
    assert len(pending) == 3 and pending.dropped == 2  # never waited for
    pairs[3].end.done = True
    assert [p.correlation for p in pending.take_completed()] == [3]
    assert [p.correlation for p in pending.take_completed()] == []
    pairs[2].end.done = pairs[4].end.done = True
    assert [p.correlation for p in pending.take_completed()] == [2, 4]
    assert len(pending) == 0


@pytest.mark.skipif(cuda_unavailable_reason() is None, reason="this machine has CUDA; the fallback is for machines without")
def test_without_cuda_the_phase_is_timed_on_the_host_and_says_so(tmp_path, monkeypatch, caplog):
    receiver = HttpReceiver().start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    try:
        with caplog.at_level(logging.WARNING):
            tel = otel_rl.init(run_dir=tmp_path, trace_enabled=True)
            for i in range(3):
                with tel.iteration(i):
                    with tel.phase("learning", cuda=True):
                        pass
            assert tel.phase("learning", cuda=True) is tel.phase("learning")
            tel.close()
    finally:
        receiver.stop()
    assert sum("timed on the host" in r.getMessage() for r in caplog.records) == 1
    spans = [s for _, s in receiver.received.spans() if s.name == "Learning"]
    assert len(spans) == 3
    attrs = {a.key: a.value.string_value for a in spans[0].attributes if a.value.HasField("string_value")}
    assert attrs["rl.clock"] == "host" and attrs["rl.cuda.fallback"] == cuda_unavailable_reason()
