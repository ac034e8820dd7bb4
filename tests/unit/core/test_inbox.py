"""The agent's own records reach the pipeline as they are: bounded, every record past the bound counted."""

from __future__ import annotations

import itertools
import threading
from time import perf_counter_ns

from otel_rl.base.clock import Clock
from otel_rl.core.inbox import Inbox
from otel_rl.core.pipeline import Pipeline
from otel_rl.core.records import RemoteCycle


def test_records_from_several_threads_reach_the_sinks_once_each_and_past_the_bound_are_counted(capture):
    inbox, sink = Inbox(capacity=500), capture
    pipeline = Pipeline([inbox], [sink], Clock(), itertools.count(1))

    def sampler(n: int) -> None:
        for i in range(200):
            inbox.add_scalars((perf_counter_ns(), {f"sys/metric_{n}": float(i)}, None, None, None))
        inbox.add_event((perf_counter_ns(), "media", {"key": f"Media/{n}"}))

    threads = [threading.Thread(target=sampler, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    pipeline.drain()
    assert len(sink.scalars) == 500 and inbox.dropped() == {"scalars": 300, "relay": 0, "events": 0}
    assert sorted(e.attributes["key"] for e in sink.events if e.name == "media") == [f"Media/{n}" for n in range(4)]
    assert pipeline.dropped()["scalars"] == 300  # reported with the run's other drops
    inbox.add_scalars((perf_counter_ns(), {"sys/metric_0": 1.0}, None, None, None))
    pipeline.drain()
    assert len(sink.scalars) == 501 and inbox.pending() == {"messages": 0}
    inbox.close()
    inbox.add_scalars((perf_counter_ns(), {"sys/metric_0": 1.0}, None, None, None))
    assert inbox.pending() == {"messages": 0}  # a closing agent takes no more


def test_a_relayed_cycle_is_totalled_like_one_read_from_a_segment(capture):
    inbox, sink = Inbox(), capture
    pipeline = Pipeline([inbox], [sink], Clock(), itertools.count(1))
    inbox.add_remote(RemoteCycle("collector", "collector", perf_counter_ns(), 8_000_000, {"env_step": 5_000_000}, {}))
    pipeline.drain()
    collector = [t.timelines["collector"] for t in sink.cycles if "collector" in t.timelines]
    assert collector and collector[0].cycles == 1 and collector[0].top == {"env_step": 5_000_000}
