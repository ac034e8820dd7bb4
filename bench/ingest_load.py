"""The ingest server under load: records stored per second, and /healthz while a large request is ingested.

Every run starts the real server (``otel-rl serve``) in its own process, on
loopback, once per storage backend (SQLite, and PostgreSQL from Debian's
binaries), and measures:

1. server capacity: 500-record gzip batches of 40-key scalars records,
   already encoded, posted by 4 loader processes (what the server can take),
   with the CPU per 1,000 records of the server (its decoding processes
   included) and of PostgreSQL's processes;
2. end to end: 1 and 20 real otel-rl client processes each recording 1,000
   40-key ``scalars()`` calls (what a team's runs at once get), with a check
   that every record is stored exactly once and every run is ``finished``;
3. ``/healthz`` latency (p50, p99, max over requests every 10 ms) while one
   request of 100,000 two-key records is ingested, against the same with no
   load.

Usage: python bench/ingest_load.py [--quick]
"""

from __future__ import annotations

import argparse
import atexit
import gzip
import json
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).parent.parent / "tests" / "support"))

KEYS = [f"Loss/key_{i:02d}" for i in range(40)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(db: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_"))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_rl.cli", "serve", "--port", str(port), "--db", db],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    proc.stdout.readline()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/healthz", timeout=1).read()
            return proc, url
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("server did not start")


def post(url: str, body: bytes) -> dict:
    request = urllib.request.Request(
        url + "/api/v1/ingest", data=body, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"}
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


def batches(writer: str, count: int, size: int = 500) -> list[bytes]:
    now = time.time()
    out = []
    for start in range(0, count, size):
        records = [
            {"run_id": f"load-{writer}", "writer": f"{writer}:1", "seq": seq, "ts": now, "kind": "scalars", "step": seq,
             "axes": {"env_steps": seq, "iteration": seq}, "values": {k: seq + i * 0.5 for i, k in enumerate(KEYS)}}
            for seq in range(start, min(start + size, count))
        ]  # fmt: skip
        out.append(gzip.compress(json.dumps({"protocol": "motrix.metrics/v1", "records": records}).encode(), 5))
    return out


def loader(url: str, bodies: list[bytes], ready, go) -> None:
    ready.wait()
    go.wait()
    for body in bodies:
        post(url, body)


def cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            continue
    return total


def server_processes(pid: int) -> list[psutil.Process]:
    """The server and its decoding processes."""
    server = psutil.Process(pid)
    return [server, *server.children(recursive=True)]


def database_processes() -> list[psutil.Process]:
    """PostgreSQL's processes (none for SQLite, which runs inside the server)."""
    return [p for p in psutil.process_iter(["name"]) if p.info["name"] == "postgres"]


def capacity(url: str, records: int, server_pid: int, loaders: int = 4) -> tuple[float, float, float]:
    """Records/s stored from pre-encoded batches (the server's side only), and the CPU ms per 1,000 records of the server
    (with its decoding processes) and of the database's processes."""
    context = mp.get_context("fork")
    ready, go = context.Barrier(loaders + 1), context.Event()
    per = records // loaders
    bodies = [batches(f"loader{i}-{time.time_ns()}", per) for i in range(loaders)]
    procs = [context.Process(target=loader, args=(url, b, ready, go)) for b in bodies]
    for p in procs:
        p.start()
    ready.wait()
    server, database = server_processes(server_pid), database_processes()
    cpu = (cpu_seconds(server), cpu_seconds(database))
    start = time.perf_counter()
    go.set()
    for p in procs:
        p.join()
    elapsed = time.perf_counter() - start
    per_thousand = 1000 * 1000 / (per * loaders)
    return per * loaders / elapsed, (cpu_seconds(server) - cpu[0]) * per_thousand, (cpu_seconds(database) - cpu[1]) * per_thousand


CLIENT = textwrap.dedent(
    """
    import sys
    import otel_rl
    tel = otel_rl.init(run_dir=sys.argv[1], motrix_url=sys.argv[2], system_metrics_interval_s=0, shutdown_timeout_s=120, quiet=True)
    keys = [f"Loss/key_{i:02d}" for i in range(40)]
    with tel.run():
        for step in range(1000):
            tel.scalars({k: float(step + j) for j, k in enumerate(keys)}, step=step)
    tel.close()
    """
)


def clients(url: str, count: int, tmp: Path) -> tuple[float, str]:
    """(records/s stored end to end, check) for ``count`` real otel-rl processes at once."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_"))}
    dirs = [tmp / f"client-{count}-{i:02d}-{time.time_ns()}" for i in range(count)]
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", CLIENT, str(d), url], env=env) for d in dirs]
    for proc in procs:
        proc.wait()
    elapsed = time.perf_counter() - start
    stored = finished = 0
    exact = True
    for d in dirs:
        lines = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        run = json.loads(urllib.request.urlopen(f"{url}/api/v1/runs/{d.name}", timeout=60).read())
        events_and_status = run["run"]["status"]
        finished += events_and_status == "finished"
        series = json.loads(urllib.request.urlopen(f"{url}/api/v1/runs/{d.name}/scalars?key=Loss/key_00", timeout=60).read())
        stored += len(series["points"])
        exact &= len(series["points"]) == 1000 == sum(1 for r in lines if r["kind"] == "scalars" and "Loss/key_00" in r["values"])
    return stored / elapsed, f"{stored} of {count * 1000} stored once{'' if exact else ' (MISMATCH)'}, {finished}/{count} finished"


def health_latency(url: str, records: int) -> tuple[list[float], list[float], int]:
    """/healthz latencies (ms) idle, then during one request of ``records`` two-key records; and its body size."""

    def probe(seconds: float | None, stop: threading.Event | None = None) -> list[float]:
        out = []
        end = time.monotonic() + (seconds or 3600)
        while time.monotonic() < end and not (stop is not None and stop.is_set()):
            t0 = time.perf_counter()
            urllib.request.urlopen(url + "/healthz", timeout=60).read()
            out.append((time.perf_counter() - t0) * 1000)
            time.sleep(0.01)
        return out

    idle = probe(2.0)
    now = time.time()
    writer = f"big-{time.time_ns()}"
    big = [
        {"run_id": writer, "writer": f"{writer}:1", "seq": seq, "ts": now, "kind": "scalars", "step": seq, "axes": {},
         "values": {"Loss/critic": seq * 0.1, "Train/mean_reward": -seq * 0.01}}
        for seq in range(records)
    ]  # fmt: skip
    body = gzip.compress(json.dumps({"protocol": "motrix.metrics/v1", "records": big}).encode(), 6)
    done = threading.Event()
    answer: dict = {}

    def upload() -> None:
        answer.update(post(url, body))
        done.set()

    threading.Thread(target=upload, daemon=True).start()
    busy = probe(None, done)
    done.wait()
    assert answer.get("accepted") == records, answer
    return idle, busy, len(body)


def quantiles(values: list[float]) -> str:
    values = sorted(values)
    p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
    return f"{statistics.median(values):.1f} / {p99:.1f} / {values[-1]:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    records = 20_000 if args.quick else 60_000
    tmp = Path(tempfile.mkdtemp(prefix="otel-rl-ingest-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # the databases go with the bench
    from postgres_server import Postgres

    postgres = Postgres().start()
    backends = {"SQLite": str(tmp / "ingest.sqlite3"), "PostgreSQL": postgres.database()}
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores; 40-key scalars records unless said")
    print()
    print("| backend | capacity (4 loaders, 500-record batches) | 1 client | 20 clients | /healthz ms idle p50/p99/max | during 100,000-record request |")
    print("|---|---|---|---|---|---|")
    try:
        for name, db in backends.items():
            server, url = start_server(db)
            try:
                rate, server_ms, database_ms = capacity(url, records, server.pid)
                one, one_check = clients(url, 1, tmp)
                twenty, twenty_check = clients(url, 20, tmp)
                idle, busy, size = health_latency(url, 100_000)
            finally:
                server.terminate()
                server.wait(30)
            print(
                f"| {name} | {rate:,.0f} records/s (CPU per 1,000 records: server {server_ms:,.0f} ms, database {database_ms:,.0f} ms) | {one:,.0f} records/s ({one_check}) | {twenty:,.0f} records/s ({twenty_check})"
                f" | {quantiles(idle)} | {quantiles(busy)} ({len(busy)} probes, body {size / 1e6:.1f} MB gzip) |"
            )
    finally:
        postgres.stop()


if __name__ == "__main__":
    main()
