"""Builds the golden records of tests/support/fixtures/metrics_v1 from the real MotrixSink."""

from __future__ import annotations

import itertools
import json

from otel_rl.base.drops import Drops
from otel_rl.core.batches import ScalarBatch
from otel_rl.core.records import EventRecord, RunEnd, RunStart, ScalarsRecord
from otel_rl.outputs.motrix.exporter import MotrixSink

FIXED_TS = 1_767_225_600.0  # 2026-01-01T00:00:00Z
FIXED_VERSIONS = {"python": "3.11.7", "otel_rl": "0.1.0"}


class ListOutput:
    def __init__(self) -> None:
        self.records: list[dict] = []

    def submit(self, items: list[tuple[str, str]]) -> None:
        self.records.extend(json.loads(line) for _, line in items)


def golden_records() -> dict[str, dict]:
    out = ListOutput()
    seq = itertools.count(1_767_225_600_000_000)  # shared with the sink, as in Telemetry
    sink = MotrixSink(
        "sac-pendulum-1",
        "trainer-0:4242",
        seq,
        Drops(),
        [out],
        project="pendulum",
        group="ablation-lr",
        meta={"owner": "rl-team"},
    )
    start_ns = int(FIXED_TS * 1e9)
    sink.pending()
    sink.on_run_start(
        RunStart(
            start_ns,
            span_id=1,
            family="rl.offpolicy",
            total_steps=100_000,
            num_envs=8,
            config={"lr": 0.0003},
            provenance={
                "versions": FIXED_VERSIONS,
                "git": {"commit": "4f1c2e9a7b3d5e6f8a9b0c1d2e3f4a5b6c7d8e9f", "dirty": False},
                "command": "python train.py --lr 3e-4",
                "host": "trainer-0",
            },
            seq=next(seq),
        )
    )
    scalars = ScalarsRecord(
        start_ns + 1_000_000_000,
        {"Loss/critic": 0.25, "Train/mean_reward": -812.5, "Policy/entropy": None},
        None,
        12,
        96,
        seq=next(seq),
    )
    sink.on_scalars(ScalarBatch.of([scalars]))
    sink.on_event(EventRecord(start_ns + 2_000_000_000, "checkpoint_saved", {"path": "ckpt/000096.pt", "env_steps": 96}, next(seq)))
    heartbeat = json.loads(sink.heartbeat()[1])
    sink.on_run_end(RunEnd("finished", start_ns, start_ns + 3_000_000_000, None, seq=next(seq)))
    failed_sink = MotrixSink("sac-pendulum-2", "trainer-0:4243", itertools.count(1_767_225_700_000_000), Drops(), [out])
    failed_sink.on_run_end(
        RunEnd(
            "failed",
            start_ns,
            start_ns + 5_000_000_000,
            "RuntimeError: CUDA error: out of memory",
            ("runs/sac-pendulum-2/errors/learner.log",),
            seq=1_767_225_700_000_009,
        )
    )
    killed = MotrixSink("sac-pendulum-3", "trainer-0:4244", itertools.count(1_767_225_800_000_000), Drops(), [out])
    killed.on_run_end(RunEnd("killed", start_ns, start_ns + 7_000_000_000, "KeyboardInterrupt", seq=1_767_225_800_000_004))
    pending, running, scalars, event, finished, failed, killed_rec = out.records
    for rec in (pending, heartbeat):
        rec["ts"] = FIXED_TS
    return {
        "run_pending": pending,
        "run_running": running,
        "scalars": scalars,
        "event": event,
        "heartbeat": heartbeat,
        "run_finished": finished,
        "run_failed": failed,
        "run_killed": killed_rec,
    }
