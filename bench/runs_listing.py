"""A team's runs listing: a page of 100 runs among 10,000, with summary columns, on SQLite and PostgreSQL.

Stores ``--runs`` runs (a running record with a configuration, 20 scalars
records of 4 keys, a finished record each) straight into each backend, then
serves them (the real server, on loopback) and times, in one run of this
script, 50 requests each of: ``/healthz`` (the floor: an HTTP round trip),
the first page, a page deep in the listing (``after=``), a page filtered by
project, each with two summary columns (last, min, max of a key), and the
first page with ``summary=*`` (every key's last value, what ``otel_rl.read``
asks). Prints p50 and p95 in ms and each page's p50 over the floor's.

Usage: python bench/runs_listing.py [--runs 10000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).parent.parent / "tests" / "support"))

from otel_rl.readers.server import IngestServer  # noqa: E402
from otel_rl.readers.server.backends import open_storage  # noqa: E402
from otel_rl.readers.server.storage import Row  # noqa: E402

KEYS = ["Train/mean_reward", "Loss/value", "Loss/policy", "Perf/total_fps"]


def fill(location: str, runs: int) -> float:
    """Store the runs through the storage (as the server would, in batches of 100 runs); returns the seconds."""
    storage = open_storage(location)
    started = time.perf_counter()
    for first in range(0, runs, 100):
        rows = []
        for r in range(first, min(first + 100, runs)):
            run_id, writer, ts = f"run-{r:06d}", f"w{r}", 1.7e9 + r
            records = [{"run_id": run_id, "writer": writer, "seq": 0, "ts": ts, "kind": "run", "status": "running",
                        "project": f"project-{r % 10}", "group": None, "meta": {}, "config": {"lr": 1e-3 * (r % 7), "seed": r}}]  # fmt: skip
            records += [{"run_id": run_id, "writer": writer, "seq": 1 + i, "ts": ts + i, "kind": "scalars", "step": i,
                         "axes": {"env_steps": 1000 * i}, "values": {k: r + i + n for n, k in enumerate(KEYS)}} for i in range(20)]  # fmt: skip
            records.append({"run_id": run_id, "writer": writer, "seq": 21, "ts": ts + 21, "kind": "run", "status": "finished",
                            "project": f"project-{r % 10}", "group": None, "meta": {}})  # fmt: skip
            rows += [Row.of(record, json.dumps(record)) for record in records]
        storage.ingest(rows, now=2e9)
    storage.close()
    return time.perf_counter() - started


def timed(url: str, params: dict | None = None, repeat: int = 50) -> tuple[float, float]:
    """p50 and p95 in ms of ``repeat`` GETs (after one warm-up)."""
    session = requests.Session()
    session.get(url, params=params, timeout=60).raise_for_status()
    took = []
    for _ in range(repeat):
        started = time.perf_counter()
        session.get(url, params=params, timeout=60).raise_for_status()
        took.append((time.perf_counter() - started) * 1000)
    took.sort()
    return statistics.median(took), took[int(0.95 * len(took)) - 1]


def measure(location: str, runs: int, name: str) -> None:
    print(f"{name}: stored {runs:,} runs in {fill(location, runs):.1f} s")
    with IngestServer(location) as server:
        summary = {"summary": ["Train/mean_reward", "Loss/value"], "limit": 100}
        floor = timed(server.url + "/healthz")
        cases = {
            "first page": summary,
            "deep page (after=)": {**summary, "after": f"run-{runs * 3 // 4:06d}"},
            "project filter": {**summary, "project": "project-3"},
            "summary=* (every key's last)": {"summary": "*", "limit": 100},
        }
        print(f"  /healthz (floor): p50 {floor[0]:.1f} ms, p95 {floor[1]:.1f} ms")
        for case, params in cases.items():
            p50, p95 = timed(server.url + "/api/v1/runs", params)
            print(f"  {case}: p50 {p50:.1f} ms, p95 {p95:.1f} ms ({p50 / floor[0]:.1f}x the floor)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        measure(str(Path(folder) / "listing.sqlite3"), args.runs, "SQLite")
    from postgres_server import Postgres

    postgres = Postgres().start()
    try:
        measure(postgres.database(), args.runs, "PostgreSQL")
    finally:
        postgres.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
