"""The web page against a run of a million records: how long its curves take to come, and the page to draw them.

    python bench/web_page.py                    # 1,000,000 scalars records of 3 keys, SQLite
    python bench/web_page.py --records 200000   # a smaller run
    python bench/web_page.py --db postgresql://user@host/db

The records are stored the way the server stores what it receives
(:meth:`Storage.ingest`, in batches), then a real server answers: the
curves request of the run page (every key, down-sampled to 1,000 points a
key on the server) is timed, and a headless Chromium (Debian's
``chromium-headless-shell``) loads the run page until every chart has drawn.
The figures are medians of ``--repeat`` loads in this one run.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

from browser import Browser  # noqa: E402

from otel_rl.readers.server import IngestServer  # noqa: E402
from otel_rl.readers.server.backends import open_storage  # noqa: E402
from otel_rl.readers.server.storage import Row  # noqa: E402

KEYS = ("Loss/critic", "Train/mean_reward", "Policy/entropy")
BATCH = 20_000


def fill(location: str, records: int) -> float:
    """Store ``records`` scalars records of one run; returns the seconds it took."""
    storage = open_storage(location)
    began = time.perf_counter()
    run = {"run_id": "long", "writer": "bench:1", "seq": 0, "ts": 1.0, "kind": "run", "status": "running",
           "project": "bench", "group": None, "meta": {}, "total_steps": 8 * records, "config": {"lr": 3e-4}}  # fmt: skip
    storage.ingest([Row.of(run, json.dumps(run))])
    for start in range(0, records, BATCH):
        rows = []
        for i in range(start, min(start + BATCH, records)):
            record = {"run_id": "long", "writer": "bench:1", "seq": i + 1, "ts": 1.0 + i * 0.01, "kind": "scalars",
                      "step": i, "axes": {"env_steps": 8 * i, "iteration": i},
                      "values": {KEYS[0]: math.exp(-i / records), KEYS[1]: -1000 + i / records * 900, KEYS[2]: math.sin(i / 999)}}  # fmt: skip
            rows.append(Row.of(record, json.dumps(record, separators=(",", ":"))))
        storage.ingest(rows)
    storage.close()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--db", help="a postgresql:// URL (default: a SQLite file in a temporary folder)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    location = args.db or str(Path(tempfile.mkdtemp(prefix="otel-rl-web-")) / "runs.sqlite3")
    stored_s = fill(location, args.records)
    print(f"{args.records:,} records of {len(KEYS)} keys stored in {stored_s:.1f} s ({'PostgreSQL' if args.db else 'SQLite'})")
    with IngestServer(location) as server:
        query = [("key", k) for k in KEYS] + [("max_points", "1000")]
        api_s = []
        for _ in range(args.repeat):
            began = time.perf_counter()
            answer = requests.get(server.url + "/api/v1/runs/long/scalars", params=query, timeout=120).json()
            api_s.append(time.perf_counter() - began)
        points = {k: len(v["x"]) for k, v in answer["series"].items()}
        browser = Browser()
        try:
            page_s = []
            for _ in range(args.repeat):
                began = time.perf_counter()
                browser.goto(server.url + "/runs/long")
                browser.wait_for(" && ".join(f"window.otelRl.charts[{json.dumps(k)}] > 0" for k in KEYS), 120)
                page_s.append(time.perf_counter() - began)
        finally:
            browser.close()
    print(f"curves request (3 keys, down-sampled on the server): median {statistics.median(api_s):.2f} s, points per key {points}")
    print(f"run page until every chart drew: median {statistics.median(page_s):.2f} s (of {args.repeat} loads)")


if __name__ == "__main__":
    main()
