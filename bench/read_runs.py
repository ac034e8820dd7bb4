"""A team's runs into one DataFrame: ``otel_rl.read.scalars(URL)`` against reading the same runs a key at a time.

Starts the real server (in this process, on loopback, SQLite by default or
``--db postgresql://...``), stores ``--runs`` runs of ``--records`` scalars
records of ``--keys`` keys each (10,000 points a run by default: 1,000
records of 10 keys), then, in one run of this script:

1. ``read.scalars(url)``: every run, every point, one DataFrame (one
   ``/export`` request per run), in points per second;
2. the same points a key at a time through ``/scalars?key=K`` (what a
   notebook did before ``/export``), on a sample of the runs, scaled;

and prints the ratio. Usage: python bench/read_runs.py [--runs 1000] [--records 1000] [--keys 10] [--db URL]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
import time
from pathlib import Path

import requests

import otel_rl.read as read
from otel_rl.readers.server import IngestServer


def post_runs(url: str, runs: int, records: int, keys: list[str]) -> float:
    """Store the runs (a running record, the scalars, a finished record each); returns the seconds it took."""
    started = time.perf_counter()
    session = requests.Session()
    for r in range(runs):
        run_id, writer = f"run-{r:05d}", f"bench:{r}"
        batch = [{"run_id": run_id, "writer": writer, "seq": 0, "ts": 1.7e9, "kind": "run", "status": "running", "meta": {}}]
        for i in range(records):
            values = {key: r + i * 0.001 + k for k, key in enumerate(keys)}
            batch.append({"run_id": run_id, "writer": writer, "seq": i + 1, "ts": 1.7e9 + i, "kind": "scalars", "step": i,
                          "axes": {"env_steps": 8 * i}, "values": values})  # fmt: skip
        batch.append({"run_id": run_id, "writer": writer, "seq": records + 1, "ts": 1.7e9 + records, "kind": "run", "status": "finished", "meta": {}})
        body = gzip.compress(json.dumps({"protocol": "motrix.metrics/v1", "records": batch}).encode(), 1)
        answer = session.post(url + "/api/v1/ingest", data=body, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}, timeout=300)
        answer.raise_for_status()
    return time.perf_counter() - started


def key_at_a_time(url: str, run_ids: list[str], keys: list[str]) -> tuple[int, float]:
    """Points and seconds to read ``run_ids`` through ``/scalars?key=K``, one request per run and key."""
    session, points = requests.Session(), 0
    started = time.perf_counter()
    for run_id in run_ids:
        for key in keys:
            points += len(session.get(url + "/api/v1/run/scalars", params={"run_id": run_id, "key": key}, timeout=300).json()["points"])
    return points, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--keys", type=int, default=10)
    parser.add_argument("--db", help="postgresql://... (default: SQLite in a temporary folder)")
    args = parser.parse_args()
    keys = [f"Train/key_{k:02d}" for k in range(args.keys)]
    with tempfile.TemporaryDirectory() as folder, IngestServer(args.db or str(Path(folder) / "bench.sqlite3")) as server:
        stored_s = post_runs(server.url, args.runs, args.records, keys)
        print(f"stored {args.runs} runs x {args.records * args.keys:,} points in {stored_s:.1f} s")
        started = time.perf_counter()
        frame = read.scalars(server.url)
        read_s = time.perf_counter() - started
        points = int(frame[keys].notna().sum().sum())
        assert points == args.runs * args.records * args.keys, points
        print(f"read.scalars(url): {points:,} points of {args.runs} runs in {read_s:.2f} s ({points / read_s:,.0f} points/s), "
              f"frame {frame.shape[0]:,} x {frame.shape[1]}, {frame.memory_usage(deep=True).sum() / 1e6:,.0f} MB")  # fmt: skip
        sample = sorted(set(frame["run_id"]))[: max(1, args.runs // 20)]
        old_points, old_s = key_at_a_time(server.url, sample, keys)
        print(f"a key at a time (/scalars?key=K), {len(sample)} runs: {old_points:,} points in {old_s:.2f} s ({old_points / old_s:,.0f} points/s)")
        print(f"ratio: read.scalars is {(points / read_s) / (old_points / old_s):.1f}x the points per second")
    return 0


if __name__ == "__main__":
    sys.exit(main())
