"""The reference ingest server, the backfill, and the run lifecycle across real processes."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import requests

import otel_rl
from otel_rl.backfill import backfill
from otel_rl.server import IngestServer

from motrix_golden import golden_records

FIXTURES = Path(__file__).parent / "fixtures" / "metrics_v1"
TOKEN = "server-t0ken"


@pytest.fixture
def server(tmp_path):
    with IngestServer(tmp_path / "ingest.sqlite3", lost_after_s=0.4) as srv:
        yield srv


def post(url: str, document, token: str | None = None, gzipped: bool = True, raw: bytes | None = None):
    body = raw if raw is not None else json.dumps(document).encode()
    headers = {"Content-Type": "application/json"}
    if gzipped:
        body = gzip.compress(body) if raw is None else body
        headers["Content-Encoding"] = "gzip"
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return requests.post(url + "/api/v1/ingest", data=body, headers=headers, timeout=10)


def test_accepts_fixtures_and_deduplicates(server):
    batch = json.loads((FIXTURES / "batch.json").read_text())
    first = post(server.url, batch)
    assert first.status_code == 200 and first.json() == {"accepted": len(batch["records"]), "duplicates": 0}
    again = post(server.url, batch)
    assert again.json() == {"accepted": 0, "duplicates": len(batch["records"])}
    assert server.storage.count() == len(batch["records"])
    runs = {r["run_id"]: r for r in requests.get(server.url + "/api/v1/runs").json()["runs"]}
    assert runs["sac-pendulum-1"]["status"] == "finished"
    assert runs["sac-pendulum-2"]["status"] == "failed"
    assert runs["sac-pendulum-2"]["reason"] == "RuntimeError: CUDA error: out of memory"
    assert runs["sac-pendulum-3"]["status"] == "killed"
    one = requests.get(server.url + "/api/v1/runs/sac-pendulum-1").json()
    assert one["run"]["project"] == "pendulum" and [e["name"] for e in one["events"]] == ["checkpoint_saved"]
    series = requests.get(server.url + "/api/v1/runs/sac-pendulum-1/scalars", params={"key": "Loss/critic"}).json()
    assert series["points"][0]["value"] == 0.25 and series["points"][0]["env_steps"] == 96
    keys = requests.get(server.url + "/api/v1/runs/sac-pendulum-1/keys").json()["keys"]
    assert keys == ["Loss/critic", "Policy/entropy", "Train/mean_reward"]


def test_plain_json_is_accepted_too(server):
    response = post(server.url, {"protocol": "motrix.metrics/v1", "records": [golden_records()["heartbeat"]]}, gzipped=False)
    assert response.status_code == 200 and response.json()["accepted"] == 1


@pytest.mark.parametrize(
    "document, field",
    [
        ({"records": []}, "$"),
        ({"protocol": "motrix.metrics/v1", "records": [{**golden_records()["scalars"], "seq": -1}]}, "$.records[0].seq"),
        ({"protocol": "motrix.metrics/v1", "records": [{**golden_records()["run_running"], "status": "weird"}]}, "$.records[0].status"),
        ({"protocol": "motrix.metrics/v1", "records": [{k: v for k, v in golden_records()["event"].items() if k != "name"}]}, "$.records[0]"),
    ],
)
def test_invalid_batches_get_400_naming_the_field(server, document, field):
    response = post(server.url, document)
    assert response.status_code == 400
    assert response.json()["field"] == field
    assert server.storage.count() == 0


def test_garbage_bodies(server):
    assert post(server.url, None, raw=b"not gzip at all").status_code == 400
    assert post(server.url, None, raw=b"{not json", gzipped=False).json()["field"] == "$"


def test_token_auth(tmp_path):
    with IngestServer(tmp_path / "db.sqlite3", token=TOKEN) as srv:
        batch = {"protocol": "motrix.metrics/v1", "records": [golden_records()["heartbeat"]]}
        assert post(srv.url, batch).status_code == 401
        assert post(srv.url, batch, token="wrong").status_code == 401
        assert requests.get(srv.url + "/api/v1/runs").status_code == 401
        assert requests.get(srv.url + "/healthz").status_code == 200
        assert post(srv.url, batch, token=TOKEN).status_code == 200


def test_size_limits_stop_large_bodies_and_gzip_bombs(tmp_path):
    with IngestServer(tmp_path / "db.sqlite3", max_body_bytes=64 * 1024, max_decompressed_bytes=256 * 1024) as srv:
        big = os.urandom(100 * 1024)
        assert post(srv.url, None, raw=big, gzipped=False).status_code == 413
        bomb = gzip.compress(b"[" + b" " * (10 * 1024 * 1024) + b"]")  # 10 MiB of spaces in about 10 KiB
        assert len(bomb) < 64 * 1024
        response = post(srv.url, None, raw=bomb)
        assert response.status_code == 413 and "decompressed" in response.json()["error"]


def test_silent_runs_become_lost_and_recover(server):
    records = golden_records()
    running = {**records["run_running"], "run_id": "quiet", "ts": time.time()}
    post(server.url, {"protocol": "motrix.metrics/v1", "records": [running]})
    deadline = time.monotonic() + 10
    status = None
    while time.monotonic() < deadline:
        status = requests.get(server.url + "/api/v1/runs/quiet").json()["run"]["status"]
        if status == "lost":
            break
        time.sleep(0.1)
    assert status == "lost"
    heartbeat = {**records["heartbeat"], "run_id": "quiet", "seq": running["seq"] + 10}
    post(server.url, {"protocol": "motrix.metrics/v1", "records": [heartbeat]})
    assert requests.get(server.url + "/api/v1/runs/quiet").json()["run"]["status"] == "running"


def test_late_backfill_never_overwrites_a_terminal_status(server):
    records = golden_records()
    post(server.url, {"protocol": "motrix.metrics/v1", "records": [records["run_finished"]]})
    post(server.url, {"protocol": "motrix.metrics/v1", "records": [records["run_running"], records["run_pending"]]})
    assert requests.get(server.url + "/api/v1/runs/sac-pendulum-1").json()["run"]["status"] == "finished"


def test_backfill_fills_gaps_without_duplicates(tmp_path, server):
    run_dir = tmp_path / "run"
    tel = otel_rl.init(run_dir=run_dir, jsonl=True)  # no live streaming: the service saw nothing
    with tel.run():
        for i in range(10):
            tel.scalars({"Loss/critic": float(i)}, step=i)
    tel.close()
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    first = backfill(run_dir, server.url)
    assert first == {"sent": len(lines), "accepted": len(lines), "duplicates": 0, "rejected": 0, "reasons": []}
    second = backfill(run_dir / "metrics.jsonl", server.url)
    assert second == {"sent": len(lines), "accepted": 0, "duplicates": len(lines), "rejected": 0, "reasons": []}
    assert server.storage.count() == len(lines)


CHILD = textwrap.dedent(
    """
    import os, sys, time
    import otel_rl
    mode = sys.argv[1]
    tel = otel_rl.init(run_dir=sys.argv[2], motrix_url=sys.argv[3])
    with tel.run(family="rl.onpolicy"):
        i = 0
        while True:
            with tel.iteration(i, env_steps=i):
                with tel.phase("learning"):
                    time.sleep(0.005)
            tel.scalars({"Loss/critic": float(i)})
            if i == 5:
                print("ready", flush=True)
            if mode == "fail" and i == 10:
                raise RuntimeError("diverged: loss is " + "x" * 3000)
            if mode == "exit0" and i == 10:
                sys.exit(0)
            i += 1
    """
)


def _child(tmp_path, server, mode):
    run_dir = tmp_path / mode
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, mode, str(run_dir), server.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_"))},
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc, run_dir


def _status(server, run_dir: Path) -> dict:
    return requests.get(server.url + f"/api/v1/runs/{run_dir.name}").json()["run"]


@pytest.mark.parametrize("mode, status, code", [("fail", "failed", 1), ("exit0", "finished", 0), ("sigterm", "killed", 143), ("sigint", "killed", None)])
def test_lifecycle_in_a_real_process(tmp_path, server, mode, status, code):
    proc, run_dir = _child(tmp_path, server, mode)
    if mode == "sigterm":
        proc.send_signal(signal.SIGTERM)
    elif mode == "sigint":
        proc.send_signal(signal.SIGINT)
    proc.wait(30)
    if code is not None:
        assert proc.returncode == code
    info = _status(server, run_dir)
    assert info["status"] == status
    if mode == "fail":
        assert info["reason"].startswith("RuntimeError: diverged")
        assert len(info["reason"].encode()) <= 2048
    if status == "killed":
        assert info["reason"] in ("KeyboardInterrupt", "Terminated: SIGTERM")


def test_sigkill_then_backfill_holds_every_flushed_record_once(tmp_path, server):
    proc, run_dir = _child(tmp_path, server, "loop")
    time.sleep(3)  # at least one JSONL flush (every 2 s) and one live batch
    proc.kill()
    proc.wait(10)
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert lines, "the JSONL file was flushed before the kill"
    live_before = server.storage.count()
    totals = backfill(run_dir, server.url)
    assert totals["sent"] == len(lines)
    assert totals["duplicates"] <= live_before
    stored = {(r["writer"], r["seq"]) for r in server.storage.records(run_dir.name)}
    assert {(r["writer"], r["seq"]) for r in lines} <= stored
    assert server.storage.count() == len(stored)  # each exactly once
