"""Several ``otel-rl serve`` processes on one PostgreSQL database serve the same runs, as a team deploys them.

Real server processes behind a round-robin load balancer, real client
processes streaming through it, one server killed mid-run: every record is
stored exactly once, every run ends ``finished``, and every server answers
the same listing, summaries included. A batch retried against another
server is a duplicate there; a run one server marks lost is found again by
records another stores.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
import requests
from ports import free_port
from round_robin import RoundRobin

CLIENT = textwrap.dedent("""
    import sys, time
    import otel_rl

    tel = otel_rl.init(run_dir=sys.argv[1], run_id=sys.argv[2], motrix_url=sys.argv[3], project="team", system_metrics_interval_s=0, quiet=True)
    with tel.run(config={"seed": int(sys.argv[4])}):
        for i in range(300):
            with tel.iteration(i, env_steps=10 * (i + 1)):
                tel.scalars({"Train/mean_reward": float(i), "Loss/value": 1.0 / (i + 1)}, step=i)
                time.sleep(0.02)
    tel.close()
""")


def serve(database: str, port: int, *flags: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    process = subprocess.Popen([sys.executable, "-m", "otel_rl.cli", "serve", "--port", str(port), "--db", database, *flags],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return process
        except requests.ConnectionError:
            time.sleep(0.1)
    process.kill()
    raise AssertionError(process.stderr.read().decode()[-2000:])


def listing(port: int) -> dict:
    answer = requests.get(f"http://127.0.0.1:{port}/api/v1/runs", params={"summary": ["Train/mean_reward", "Loss/value"], "limit": 100}, timeout=10)
    assert answer.status_code == 200, answer.text
    return {r["run_id"]: r for r in answer.json()["runs"]}


def stored(port: int, run_id: str) -> int:
    return requests.get(f"http://127.0.0.1:{port}/api/v1/runs/{run_id}/export", params={"key": "Train/mean_reward", "format": "json"},
                        timeout=10).json()["columns"]["Train/mean_reward"].__len__()  # fmt: skip


@pytest.fixture
def two_servers(postgres):
    database = postgres.database()
    ports = [free_port(), free_port()]
    servers = [serve(database, port) for port in ports]
    yield database, ports, servers
    for process in servers:
        if process.poll() is None:
            process.terminate()
            process.wait(10)


def test_clients_switching_servers_mid_run_store_every_record_once(two_servers, tmp_path):
    database, ports, servers = two_servers
    balancer = RoundRobin(ports).start()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    try:
        clients = [subprocess.Popen([sys.executable, str(script), str(tmp_path / f"run-{i}"), f"run-{i}", balancer.url, str(i)], env=env)
                   for i in range(4)]  # fmt: skip
        deadline = time.monotonic() + 60
        while not all(balancer.connections):  # the clients land on both servers
            assert time.monotonic() < deadline and all(c.poll() is None for c in clients), balancer.connections
            time.sleep(0.1)
        time.sleep(1)
        helpers = psutil.Process(servers[0].pid).children(recursive=True)  # its decoding processes and their forkserver
        assert helpers
        servers[0].send_signal(signal.SIGKILL)  # one server dies mid-run: its clients reconnect to the other
        gone, alive = psutil.wait_procs(helpers, timeout=20)
        assert not alive, alive  # a killed server leaves no process behind
        for client in clients:
            assert client.wait(120) == 0
        servers[0] = serve(database, ports[0])  # back, with nothing of its own to have gone stale
    finally:
        balancer.stop()
    for port in ports:
        runs = listing(port)
        assert sorted(runs) == [f"run-{i}" for i in range(4)]
        for i in range(4):
            run = runs[f"run-{i}"]
            assert run["status"] == "finished" and run["started"]["config"] == {"seed": i} and run["env_steps"] == 3000
            assert run["summary"]["Train/mean_reward"] == {"last": 299.0, "min": 0.0, "max": 299.0}
            assert run["summary"]["Loss/value"]["last"] == pytest.approx(1 / 300)
            in_file = sum(1 for line in open(tmp_path / f"run-{i}" / "metrics.jsonl") if '"Train/mean_reward"' in line)
            assert stored(port, f"run-{i}") == in_file == 300  # each point once, though some batches went to both servers


def post(port: int, records: list[dict]) -> dict:
    body = gzip.compress(json.dumps({"protocol": "motrix.metrics/v1", "records": records}).encode())
    answer = requests.post(f"http://127.0.0.1:{port}/api/v1/ingest", data=body, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}, timeout=30)
    assert answer.status_code == 200 and not answer.json().get("rejected"), answer.text
    return answer.json()


def record(seq: int, kind: str, **fields) -> dict:
    return {"run_id": "solo", "writer": "solo:1", "seq": seq, "ts": time.time(), "kind": kind, **fields}


def test_a_retried_batch_and_a_lost_run_are_the_same_on_every_server(postgres):
    database = postgres.database()
    ports = [free_port(), free_port()]
    servers = [serve(database, ports[0], "--lost-after", "1"), serve(database, ports[1])]
    try:
        batch = [record(1, "run", status="running", meta={}), *(record(2 + i, "scalars", step=i, axes={"env_steps": i}, values={"Loss/value": float(i)}) for i in range(10))]
        assert post(ports[0], batch)["accepted"] == 11
        again = post(ports[1], batch)  # the client timed out on the first server and sent it again to the second
        assert again["accepted"] == 0 and again["duplicates"] == 11
        deadline = time.monotonic() + 30
        while listing(ports[1])["solo"]["status"] != "lost":  # the first server's sweep, seen by the second
            assert time.monotonic() < deadline
            time.sleep(0.2)
        post(ports[1], [record(20, "scalars", step=10, axes={"env_steps": 10}, values={"Loss/value": 10.0})])  # records through the other server
        for port in ports:
            run = listing(port)["solo"]
            assert run["status"] == "running" and run["summary"]["Loss/value"] == {"last": 10.0, "min": 0.0, "max": 10.0}
    finally:
        for process in servers:
            process.terminate()
            process.wait(10)
