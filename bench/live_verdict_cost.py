"""What the live verdict costs per running run, at 1, 100 and 1,000 runs.

    python bench/live_verdict_cost.py [--runs 1 100 1000] [--seconds 30]

The verdict is computed in each run's agent (:mod:`otel_rl.core.live_verdict`):

* **agent**: ``N`` verdicts (one per run, as ``N`` agents would hold) fed what a
  pipeline hands them: a pass every 50 ms (the agent's pace) of a learner and a
  collector timeline, six phases between them, 100 iterations a second, rank 0's
  timings of 8 ranks every second, a reading each second over the last 3 s.
  The CPU (``time.process_time``) of ``--seconds`` of simulated time, per run, is
  the share of a core one run's agent spends on its verdict; it stays flat in
  ``N`` because each run is read alone. Beside it, the same agent's pipeline
  without a verdict would not pay it.
* **server**: what the verdict adds to a server holding ``N`` running runs: a
  real ``otel-rl serve`` (SQLite) takes, per run, a batch of one scalars record
  every second and, every 10 s, the run's ``bottleneck`` event (a change of
  verdict, often less); timed with and without the event, in one run, as the
  server process's CPU per run-second; then the runs listing filtered by
  verdict (``?bottleneck=collector``), p50 over 20 requests, against the
  unfiltered listing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import psutil
import requests

from otel_rl.core.batches import ScalarBatch
from otel_rl.core.live_verdict import LiveVerdict
from otel_rl.core.records import ScalarsRecord
from otel_rl.core.totals import CycleTotals, PassTotals
from otel_rl.formats import schema
from otel_rl.readers.server import IngestServer

MS = 1_000_000
PASS_NS = 50 * MS


def agent_cost(runs: int, seconds: float) -> float:
    """CPU seconds per run per second of training for ``runs`` verdicts fed a pipeline's passes."""
    verdicts = [LiveVerdict() for _ in range(runs)]
    for verdict in verdicts:
        verdict.start()
    ranks = {schema.rank_key(r, "Perf/learning_time"): 0.004 * (1 + r / 8) for r in range(8)}
    ranks.update({schema.rank_key(r, "Perf/learner_gradient_sync_ms"): 2.0 for r in range(8)})
    started = time.process_time()
    now = 10**18
    for tick in range(int(seconds * 1e9 / PASS_NS)):
        now += PASS_NS
        totals = PassTotals(now, {
            schema.LEARNER: CycleTotals(cycles=5, wall_ns=50 * MS, top={"collector_wait": 5 * MS, "inference": 10 * MS, "learning": 30 * MS},
                                        nested={"inference_forward": 8 * MS}, index=tick * 5, env_steps=tick * 40),
            schema.COLLECTOR: CycleTotals(cycles=5, wall_ns=50 * MS, top={"env_step": 35 * MS, "learner_action_wait": 10 * MS}),
        })  # fmt: skip
        batch = ScalarBatch.of([ScalarsRecord(now, ranks, None, None, None, tick)]) if tick % 20 == 0 else None
        for verdict in verdicts:
            verdict.add(totals)
            if batch is not None:
                verdict.note_scalars(batch)
            verdict.take(now)
    return (time.process_time() - started) / runs / seconds


def _batch(run: int, second: int, verdict: bool) -> list[dict]:
    """A run's records of one second: a scalars record, and with ``verdict`` its bottleneck event every 10 s (from the arm's first second)."""
    run_id, writer, ts = f"run-{run:05d}", f"bench:{run}", time.time()
    records = [{"run_id": run_id, "writer": writer, "seq": 2 * second + 1, "ts": ts, "kind": "scalars", "step": second,
                "axes": {"env_steps": 1000 * second}, "values": {"Perf/total_fps": 1000.0, "Loss/value": 1.0 / (second + 1)}}]  # fmt: skip
    if verdict and second % 10 == 1:
        side = "collector" if run % 2 else "learner"
        attributes = {"text": f"{side} (env step)", "side": side, "phase": "env_step" if run % 2 else "learning", "confidence": "high",
                      "cycles": 300, "window_s": 3.0, "env_steps_per_s": 1000.0}  # fmt: skip
        records.append({"run_id": run_id, "writer": writer, "seq": 2 * second + 2, "ts": ts, "kind": "event", "name": "bottleneck",
                        "attributes": attributes})  # fmt: skip
    return records


def server_cost(runs: int, seconds: int) -> dict[str, float]:
    """The server's CPU per run-second with and without the verdict's events, and the filtered listing's p50 (ms)."""
    out: dict[str, float] = {}
    me = psutil.Process()
    with tempfile.TemporaryDirectory() as folder, IngestServer(str(Path(folder) / "runs.sqlite3")) as server:
        session = requests.Session()
        url = server.url + "/api/v1/ingest"
        for r in range(runs):  # the runs, running
            start = {"run_id": f"run-{r:05d}", "writer": f"bench:{r}", "seq": 0, "ts": time.time(), "kind": "run", "status": "running",
                     "project": "bench", "group": f"sweep-{r % 10}", "meta": {}}  # fmt: skip
            session.post(url, data=json.dumps({"protocol": "motrix.metrics/v1", "records": [start]}), headers={"Content-Type": "application/json"}, timeout=60).raise_for_status()
        for arm, second0 in (("without", 2), ("with", 11 + 10 * (seconds // 10))):  # the arm with the verdict starts on a second 1 (mod 10)
            cpu = me.cpu_times()
            for second in range(second0, second0 + seconds):
                batch = [record for r in range(runs) for record in _batch(r, second, arm == "with")]
                for part in range(0, len(batch), 500):
                    answer = session.post(url, data=json.dumps({"protocol": "motrix.metrics/v1", "records": batch[part : part + 500]}), headers={"Content-Type": "application/json"}, timeout=60)
                    answer.raise_for_status()
                    assert not answer.json().get("rejected"), answer.text[:500]
            after = me.cpu_times()
            out[f"cpu_{arm}"] = (after.user + after.system - cpu.user - cpu.system) / runs / seconds
        for name, params in (("listing", {"limit": 100, "order": "newest"}), ("filtered", {"limit": 100, "order": "newest", "bottleneck": "collector"})):
            times = []
            for _ in range(20):
                begun = time.perf_counter()
                session.get(server.url + "/api/v1/runs", params=params, timeout=60).raise_for_status()
                times.append(time.perf_counter() - begun)
            out[f"{name}_ms"] = 1000 * statistics.median(times)
        found = session.get(server.url + "/api/v1/runs", params={"bottleneck": "collector", "limit": 1000}, timeout=60).json()["runs"]
        assert len(found) == runs // 2 and all(r["bottleneck"]["side"] == "collector" for r in found), len(found)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, nargs="+", default=[1, 100, 1000])
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    print(f"{'runs':>6} {'agent: % of a core per run':>28} {'server: CPU ms per run-second, without -> with':>48} {'listing p50 ms':>16} {'filtered p50 ms':>16}")
    for runs in args.runs:
        agent = agent_cost(runs, args.seconds)
        server = server_cost(runs, max(2, int(args.seconds // 3)))
        print(f"{runs:>6} {100 * agent:>27.4f}% {1000 * server['cpu_without']:>30.3f} -> {1000 * server['cpu_with']:.3f}"
              f"{server['listing_ms']:>17.1f} {server['filtered_ms']:>16.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
