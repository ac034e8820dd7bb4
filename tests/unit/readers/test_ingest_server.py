"""The reference ingest server, the backfill, and the run lifecycle across real processes."""

from __future__ import annotations

import gzip
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import requests
from locations import FIXTURES as SUPPORT_FIXTURES
from locations import interruptible
from motrix_golden import golden_records
from ports import free_port

import otel_rl
from otel_rl.outputs.motrix.backfill import backfill
from otel_rl.readers.server import IngestServer

FIXTURES = SUPPORT_FIXTURES / "metrics_v1"
TOKEN = "server-t0ken"


@pytest.fixture
def server(database):
    with IngestServer(database, lost_after_s=0.4) as srv:
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
        ({"records": []}, "$.protocol"),
        ({"protocol": "motrix.metrics/v2", "records": []}, "$.protocol"),
        ({"protocol": "motrix.metrics/v1"}, "$.records"),
        ([1, 2], "$"),
    ],
)
def test_bodies_that_are_not_batches_get_400_naming_the_field(server, document, field):
    response = post(server.url, document)
    assert response.status_code == 400
    assert response.json()["field"] == field
    assert server.storage.count() == 0


@pytest.mark.parametrize(
    "change, field",
    [
        ({"seq": -1}, "$.records[1].seq"),
        ({"kind": "run", "status": "weird"}, "$.records[1].status"),
        ({"kind": "event", "attributes": {}}, "$.records[1]"),
    ],
)
def test_invalid_records_are_refused_alone_naming_the_field(server, change, field):
    good = golden_records()["scalars"]
    records = [good, {**good, "seq": good["seq"] + 1, **change}, {**good, "seq": good["seq"] + 2}]
    response = post(server.url, {"protocol": "motrix.metrics/v1", "records": records})
    assert response.status_code == 200
    answer = response.json()
    assert answer["accepted"] == 2 and [(r["index"], r["field"]) for r in answer["rejected"]] == [(1, field)]
    assert server.storage.count() == 2


def test_garbage_bodies(server):
    assert post(server.url, None, raw=b"not gzip at all").status_code == 400
    assert post(server.url, None, raw=b"{not json", gzipped=False).json()["field"] == "$"


def test_token_auth(database):
    with IngestServer(database, token=TOKEN) as srv:
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
    assert first == {"sent": len(lines), "accepted": len(lines), "duplicates": 0, "rejected": 0, "reasons": [], "media_sent": 0, "media_failed": 0}
    second = backfill(run_dir / "metrics.jsonl", server.url)
    assert second == {"sent": len(lines), "accepted": 0, "duplicates": len(lines), "rejected": 0, "reasons": [], "media_sent": 0, "media_failed": 0}
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


def _child(tmp_path, server, mode, agent="process"):
    run_dir = tmp_path / mode
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, mode, str(run_dir), server.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**env, "OTEL_RL_AGENT": agent},
        preexec_fn=interruptible,
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
    # In-process outputs: what was flushed before the SIGKILL is on disk, the rest is lost with the process.
    proc, run_dir = _child(tmp_path, server, "loop", agent="off")
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


def test_after_a_sigkill_the_agent_delivers_everything_and_backfill_finds_nothing_new(tmp_path, server):
    proc, run_dir = _child(tmp_path, server, "loop")
    time.sleep(3)
    proc.kill()
    proc.wait(10)
    deadline = time.monotonic() + 30
    while _status(server, run_dir)["status"] != "killed" and time.monotonic() < deadline:
        time.sleep(0.1)  # the agent reads the rest of the segment and ends the run
    info = _status(server, run_dir)
    assert info["status"] == "killed" and info["reason"].startswith(("killed by SIGKILL", "the process disappeared"))
    while (run_dir / "run_summary.json").exists() is False and time.monotonic() < deadline:
        time.sleep(0.1)
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert lines[-1]["kind"] == "run" and lines[-1]["status"] == "killed"  # the file holds the end too
    totals = backfill(run_dir, server.url)
    assert totals["sent"] == len(lines) and totals["accepted"] == 0  # the live stream already had every record
    assert server.storage.count() == len({(r["writer"], r["seq"]) for r in lines})


# -- bad input is a 400 or a refusal, never a 500 ------------------------------------------


def _batch(*records) -> dict:
    return {"protocol": "motrix.metrics/v1", "records": list(records)}


def _scalars(seq: int, run_id: str = "bad-input", **values) -> dict:
    return {"run_id": run_id, "writer": "h:1", "seq": seq, "ts": time.time(), "kind": "scalars",
            "step": 1, "axes": {}, "values": values or {"Loss/critic": 1.0}}  # fmt: skip


def _raw(document_text: str) -> bytes:
    return gzip.compress(document_text.encode("utf-8", "surrogatepass"))


@pytest.mark.parametrize(
    "bad_text, why",
    [
        ('{"run_id":"a\\ud800","writer":"h:1","seq":2,"ts":1,"kind":"heartbeat"}', "surrogate"),
        ('{"run_id":"r","writer":"h:1","seq":2,"ts":1,"kind":"scalars","step":1,"axes":{},"values":{"k\\udc00":1}}', "surrogate"),
        ('{"run_id":"r","writer":"h:1","seq":2,"ts":1,"kind":"event","name":"e","attributes":' + "[" * 990 + "]" * 990 + "}", "deep"),
        ('{"run_id":"r","writer":"h:1","seq":9223372036854775808,"ts":1,"kind":"heartbeat"}', "64-bit"),
        ('{"run_id":"r","writer":"h:1","seq":2,"ts":1,"kind":"scalars","step":18446744073709551616,"axes":{},"values":{}}', "step"),
        ('{"run_id":"r","writer":"h:1","seq":2,"ts":1,"kind":"scalars","step":1,"axes":{},"values":{"k":9223372036854775808}}', "64-bit"),
        ('{"run_id":"r","writer":"h:1","seq":2,"ts":1,"kind":"scalars","step":1,"axes":{},"values":{"k":1e400}}', "1e400"),
        ('{"run_id":"r","writer":"h:1","seq":2,"ts":1,"kind":"scalars","step":1,"axes":{},"values":{"k":NaN}}', "NaN"),
    ],
)
def test_malformed_records_are_refused_with_a_reason_and_the_rest_stored(server, bad_text, why):
    good = json.dumps(_scalars(1, run_id="r"))
    body = _raw('{"protocol":"motrix.metrics/v1","records":[' + good + "," + bad_text + "]}")
    response = post(server.url, None, raw=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["accepted"] == 1 and len(answer["rejected"]) == 1
    assert answer["rejected"][0]["index"] == 1 and answer["rejected"][0]["field"].startswith("$.records[1]")
    points = requests.get(server.url + "/api/v1/runs/r/scalars", params={"key": "Loss/critic"})
    assert points.status_code == 200 and json.loads(points.text)["points"][0]["value"] == 1.0  # strict JSON back


def test_a_body_deeply_nested_outside_the_records_is_a_400(server):
    response = post(server.url, None, raw=_raw('{"protocol":"motrix.metrics/v1","x":' + "[" * 5000 + "]" * 5000 + ',"records":[]}'))
    assert response.status_code in (200, 400)  # an unknown member may be ignored or refused, never a 500
    assert post(server.url, None, raw=_raw("[" * 100_000)).status_code == 400


def test_every_gzip_member_is_read(server):
    first = gzip.compress(json.dumps(_batch(_scalars(1), _scalars(2))).encode())
    second = gzip.compress(b"")  # a second member (here empty) appended, as `cat a.gz b.gz` makes
    assert post(server.url, None, raw=first + second).json()["accepted"] == 2
    # Two members that together make one document.
    text = json.dumps(_batch(_scalars(3), _scalars(4))).encode()
    split = gzip.compress(text[:20]) + gzip.compress(text[20:])
    assert post(server.url, None, raw=split).json()["accepted"] == 2
    assert server.storage.count("bad-input") == 4


def test_a_future_timestamp_cannot_pin_a_status(server):
    records = golden_records()
    ahead = {**records["run_running"], "run_id": "clock", "ts": time.time() + 10**7}
    post(server.url, _batch(ahead))
    finished = {**records["run_finished"], "run_id": "clock", "ts": time.time(), "seq": ahead["seq"] + 1}
    post(server.url, _batch(finished))
    assert requests.get(server.url + "/api/v1/runs/clock").json()["run"]["status"] == "finished"


def test_runs_are_paged(server):
    records = golden_records()
    post(server.url, _batch(*[{**records["run_pending"], "run_id": f"run-{i:03d}", "seq": i} for i in range(250)]))
    seen, after, pages = [], None, 0
    while True:
        params = {"limit": 100, **({"after": after} if after else {})}
        page = requests.get(server.url + "/api/v1/runs", params=params).json()
        seen += [r["run_id"] for r in page["runs"]]
        pages += 1
        after = page["next"]
        if after is None:
            break
    assert pages == 3 and seen == sorted(seen) and len(set(seen)) == 250
    assert requests.get(server.url + "/api/v1/runs", params={"limit": "many"}).status_code == 400


def test_lost_runs_are_logged_once_per_sweep(server, caplog):
    records = golden_records()
    with caplog.at_level(logging.WARNING, logger="otel_rl.readers.server"):
        post(server.url, _batch(*[{**records["run_running"], "run_id": f"quiet-{i}", "seq": i, "ts": time.time()} for i in range(30)]))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any("marked lost" in r.getMessage() for r in caplog.records):
            time.sleep(0.1)
    lines = [r.getMessage() for r in caplog.records if "marked lost" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("30 runs")


def test_a_read_only_sqlite_database_answers_503_and_is_unhealthy(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    assert subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)]).returncode == 0, "needs root, as CI has"
    try:
        with IngestServer(disk / "db.sqlite3") as srv:  # create it, with one run
            post(srv.url, _batch(_scalars(1)))
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        with IngestServer(disk / "db.sqlite3") as srv:
            response = post(srv.url, _batch(_scalars(2)))
            assert response.status_code == 503 and response.headers["Retry-After"]
            assert "database" in response.json()["error"]
            health = requests.get(srv.url + "/healthz")
            assert health.status_code == 503 and health.json()["ok"] is False
            read = requests.get(srv.url + "/api/v1/runs/bad-input")  # reads keep working while writes cannot
            assert read.status_code == 200 and read.json()["run"]["run_id"] == "bad-input"
            points = requests.get(srv.url + "/api/v1/runs/bad-input/scalars", params={"key": "Loss/critic"}).json()["points"]
            assert len(points) == 1 and requests.get(srv.url + "/api/v1/runs").status_code == 200
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_read_only_postgresql_database_answers_503_and_is_unhealthy(postgres):
    url = postgres.database()
    name = url.rsplit("/", 1)[1]
    with IngestServer(url) as srv:
        post(srv.url, _batch(_scalars(1)))
    postgres.sql(f"ALTER DATABASE {name} SET default_transaction_read_only = on")
    try:
        with IngestServer(url) as srv:
            response = post(srv.url, _batch(_scalars(2)))
            assert response.status_code == 503 and response.headers["Retry-After"]
            assert requests.get(srv.url + "/healthz").status_code == 503
    finally:
        postgres.sql(f"ALTER DATABASE {name} SET default_transaction_read_only = off")


def test_the_token_in_the_environment_is_required(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    env["MOTRIX_METRICS_TOKEN"] = TOKEN
    batch = _batch(golden_records()["heartbeat"])
    for flags, open_without_token in (([], False), (["--insecure"], True)):
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "otel_rl.cli", "serve", "--port", str(port), "--db", str(tmp_path / f"{len(flags)}.db"), *flags],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        try:
            banner = proc.stdout.readline()
            url = f"http://127.0.0.1:{port}"
            _wait_healthy(url)
            assert (post(url, batch).status_code == 200) is open_without_token
            if not open_without_token:
                assert "token required" in banner and post(url, batch, token=TOKEN).status_code == 200
        finally:
            proc.terminate()
            _, stderr = proc.communicate(timeout=10)
        if open_without_token:
            assert "--insecure" in stderr


def _wait_healthy(url: str) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            if requests.get(url + "/healthz", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} never became healthy")


# -- load: stalled uploads, a large request, a team's runs at once ---------------------------


def test_stalled_uploads_cannot_starve_the_server(tmp_path):
    import socket

    with IngestServer(tmp_path / "db.sqlite3", read_timeout_s=2.0, max_reading=64) as srv:
        port = int(srv.url.rsplit(":", 1)[1])
        stalled = []
        try:
            for _ in range(1100):
                sock = socket.create_connection(("127.0.0.1", port))
                sock.sendall(b"POST /api/v1/ingest HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
                stalled.append(sock)
            health = requests.get(srv.url + "/healthz", timeout=10)
            assert health.status_code == 200
            assert post(srv.url, _batch(_scalars(1))).status_code in (200, 503)  # served, or told to come back
            answers = []
            for sock in stalled[:80]:
                sock.settimeout(10)
                answers.append(sock.recv(64).split(b" ")[1])  # the status code of "HTTP/1.1 503 ..."
            # Past the bound on bodies arriving at once: 503 at once; within it: 408 once the body did not come.
            assert set(answers) <= {b"503", b"408"} and b"503" in answers
        finally:
            for sock in stalled:
                sock.close()
        assert post(srv.url, _batch(_scalars(2))).status_code == 200


def test_health_is_served_while_a_large_request_is_ingested(tmp_path):
    import threading

    records = [_scalars(i, run_id="big", **{"Loss/a": float(i), "Loss/b": 1.0}) for i in range(1, 40_001)]
    body = gzip.compress(json.dumps(_batch(*records)).encode())
    with IngestServer(tmp_path / "db.sqlite3") as srv:
        done = threading.Event()
        answer = {}

        def upload():
            answer["big"] = post(srv.url, None, raw=body)
            done.set()

        threading.Thread(target=upload, daemon=True).start()
        while srv.storage.count("big") == 0 and not done.is_set():
            time.sleep(0.005)
        health = requests.get(srv.url + "/healthz", timeout=30)
        served_during = not done.is_set()
        done.wait(120)
    assert health.status_code == 200 and served_during  # answered while the big request was still going
    assert answer["big"].json() == {"accepted": 40_000, "duplicates": 0}


CLIENT = textwrap.dedent(
    """
    import sys
    import otel_rl
    tel = otel_rl.init(run_dir=sys.argv[1], motrix_url=sys.argv[2], system_metrics_interval_s=0, shutdown_timeout_s=60)
    keys = [f"Loss/key_{i:02d}" for i in range(40)]
    with tel.run():
        for step in range(1000):
            tel.scalars({k: float(step + j) for j, k in enumerate(keys)}, step=step)
    tel.close()
    """
)


def test_twenty_clients_at_once_store_every_record_once_and_finish(tmp_path, database):
    with IngestServer(database) as srv:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
        run_dirs = [tmp_path / f"client-{i:02d}" for i in range(20)]
        procs = [
            subprocess.Popen([sys.executable, "-c", CLIENT, str(d), srv.url], env=env, stderr=subprocess.PIPE, text=True)
            for d in run_dirs
        ]
        for proc in procs:
            assert proc.wait(240) == 0, proc.stderr.read()[-2000:]
        for run_dir in run_dirs:
            lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            stored = srv.storage.records(run_dir.name)
            assert sorted((r["writer"], r["seq"]) for r in stored) == sorted((r["writer"], r["seq"]) for r in lines)
            assert sum(1 for r in stored if r["kind"] == "scalars" and "Loss/key_00" in r["values"]) == 1000
            assert srv.storage.run(run_dir.name)["status"] == "finished"


def test_decoding_processes_give_the_same_answers(tmp_path):
    """``otel-rl serve`` decodes on worker processes: refusals, limits and large bodies behave the same."""
    with IngestServer(tmp_path / "db.sqlite3", decode_processes=2, max_decompressed_bytes=8 * 1024 * 1024) as srv:
        good = json.dumps(_scalars(1, run_id="proc"))
        bad = '{"run_id":"proc","writer":"h:1","seq":2,"ts":1,"kind":"scalars","step":1,"axes":{},"values":{"k":NaN}}'
        answer = post(srv.url, None, raw=_raw('{"protocol":"motrix.metrics/v1","records":[' + good + "," + bad + "]}")).json()
        assert answer["accepted"] == 1 and answer["rejected"][0]["index"] == 1
        assert post(srv.url, {"protocol": "x", "records": []}).json()["field"] == "$.protocol"
        assert post(srv.url, None, raw=gzip.compress(b" " * (9 * 1024 * 1024))).status_code == 413
        large = [_scalars(i, run_id="proc-large") for i in range(10, 20_010)]
        assert post(srv.url, _batch(*large)).json() == {"accepted": 20_000, "duplicates": 0}
        assert srv.storage.count("proc-large") == 20_000


def test_a_nul_character_costs_only_its_record_on_either_store(server):
    event = {"run_id": "bad-input", "writer": "h:1", "seq": 2, "ts": time.time(), "kind": "event",
             "name": "configured", "attributes": {"path": "a\u0000b"}}  # fmt: skip
    response = post(server.url, _batch(_scalars(1), event, _scalars(3)))
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["accepted"] == 2 and [r["index"] for r in answer["rejected"]] == [1]
    assert "NUL" in answer["rejected"][0]["error"]
    points = requests.get(server.url + "/api/v1/runs/bad-input/scalars", params={"key": "Loss/critic"}).json()["points"]
    assert len(points) == 2  # the two scalars records around it


def test_a_live_run_with_a_nul_in_its_values_streams_everything_to_postgresql(postgres, tmp_path):
    import otel_rl

    with IngestServer(postgres.database()) as srv:
        tel = otel_rl.init(run_dir=tmp_path, jsonl=True, motrix_url=srv.url, run_id="nul-run", system_metrics_interval_s=0)
        with tel.run(config={"note": "x\u0000y"}):
            tel.event("configured", path="a\u0000b")
            for i in range(300):
                tel.scalars({"Loss/critic": float(i)})
        tel.close(timeout_s=30)
        points = requests.get(srv.url + "/api/v1/runs/nul-run/scalars", params={"key": "Loss/critic"}).json()["points"]
        run = requests.get(srv.url + "/api/v1/runs/nul-run").json()
    assert len(points) == 300 and run["run"]["status"] == "finished"
    assert any(e["name"] == "configured" for e in run["events"])
    assert "\u0000" not in (tmp_path / "metrics.jsonl").read_text() and "a\ufffdb" in (tmp_path / "metrics.jsonl").read_text()


def test_slow_clients_are_closed_and_never_starve_legitimate_uploads(tmp_path):
    import socket

    with IngestServer(tmp_path / "slow.sqlite3", header_timeout_s=2.0, read_timeout_s=20.0, max_uploads=8) as srv:
        port = int(srv.url.rsplit(":", 1)[1])
        tricklers = []
        for _ in range(300):  # headers that never end
            conn = socket.create_connection(("127.0.0.1", port))
            conn.sendall(b"POST /api/v1/ingest HTTP/1.1\r\nHost: x\r\n")
            tricklers.append(conn)
        bodies = []
        for _ in range(100):  # bodies that never arrive: no upload slot is taken meanwhile
            conn = socket.create_connection(("127.0.0.1", port))
            conn.sendall(b"POST /api/v1/ingest HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{")
            bodies.append(conn)
        time.sleep(0.5)
        stored = [post(srv.url, _batch(_scalars(seq, run_id="legit"))).status_code for seq in range(1, 80)]
        assert stored == [200] * 79
        time.sleep(3.0)  # past the header timeout
        closed = 0
        for conn in tricklers:
            conn.settimeout(5.0)
            try:
                closed += conn.recv(1) == b""  # the server closed it (a timeout here would mean it did not)
            except ConnectionResetError:
                closed += 1
            conn.close()
        for conn in bodies:
            conn.close()
        assert closed == 300
        points = requests.get(srv.url + "/api/v1/runs/legit/scalars", params={"key": "Loss/critic"}).json()["points"]
        assert len(points) == 79


def test_a_duplicate_changes_nothing_on_the_server(server):
    base = {"writer": "host:1", "ts": time.time()}
    first = [{**base, "run_id": "a", "seq": 1, "kind": "run", "status": "running"},
             {**base, "run_id": "a", "seq": 2, "kind": "scalars", "step": 1, "axes": {"env_steps": 1}, "values": {"Loss/critic": 1.0}},
             {**base, "run_id": "a", "seq": 3, "kind": "run", "status": "finished", "ts": base["ts"] + 1}]  # fmt: skip
    assert post(server.url, {"protocol": "motrix.metrics/v1", "records": first}).json() == {"accepted": 3, "duplicates": 0}
    # The same (writer, seq) pairs with another run id, another status, other values: duplicates, and nothing more.
    reused = [{**base, "run_id": "phantom", "seq": 1, "kind": "run", "status": "running"},
              {**base, "run_id": "a", "seq": 2, "kind": "scalars", "step": 1, "axes": {"env_steps": 1}, "values": {"Loss/critic": 9.0}},
              {**base, "run_id": "a", "seq": 3, "kind": "run", "status": "failed", "ts": base["ts"] + 2, "reason": "no"}]  # fmt: skip
    assert post(server.url, {"protocol": "motrix.metrics/v1", "records": reused}).json() == {"accepted": 0, "duplicates": 3}
    runs = {r["run_id"]: r for r in requests.get(server.url + "/api/v1/runs").json()["runs"]}
    assert list(runs) == ["a"] and runs["a"]["status"] == "finished"
    curve = requests.get(server.url + "/api/v1/runs/a/scalars", params={"key": "Loss/critic", "x": "step"}).json()
    assert curve["series"]["Loss/critic"]["y"] == [1.0]
    # Within one batch too: the first of two records with one (writer, seq) is stored, the second changes nothing.
    twice = [{**base, "run_id": "b", "seq": 7, "kind": "run", "status": "running"}, {**base, "run_id": "c", "seq": 7, "kind": "run", "status": "failed"}]
    assert post(server.url, {"protocol": "motrix.metrics/v1", "records": twice}).json() == {"accepted": 1, "duplicates": 1}
    assert "c" not in {r["run_id"] for r in requests.get(server.url + "/api/v1/runs").json()["runs"]}


def test_two_runs_on_one_named_agent_keep_every_record_on_the_server(tmp_path, server):
    script = textwrap.dedent("""
        import sys, otel_rl
        tel = otel_rl.init(run_id=sys.argv[1], motrix_url=sys.argv[2], agent="shared-writer-test", quiet=True, system_metrics_interval_s=0)
        with tel.run():
            for i in range(1500):
                tel.scalars({"Loss/critic": float(i)}, step=i)
            for i in range(15):
                tel.event("note", n=i)
        tel.close()
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    runs = [subprocess.Popen([sys.executable, "-c", script, f"shared-{n}", server.url], env=env) for n in range(2)]
    assert [p.wait(120) for p in runs] == [0, 0]
    writers = []
    for n in range(2):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            one = requests.get(f"{server.url}/api/v1/runs/shared-{n}").json()
            if one.get("run", {}).get("status") == "finished":
                break
            time.sleep(0.2)
        curve = requests.get(f"{server.url}/api/v1/runs/shared-{n}/scalars", params={"key": "Loss/critic", "x": "step", "max_points": 20000}).json()
        assert curve["series"]["Loss/critic"]["count"] == 1500
        assert len([e for e in one["events"] if e["name"] == "note"]) == 15
        writers.append({e["writer"] for e in one["events"]})
    assert len(writers[0]) == len(writers[1]) == 1 and writers[0] != writers[1]  # one writer per run, though one agent wrote both


def test_the_package_docstring_lists_every_route_of_the_table_and_no_other():
    import re

    import otel_rl.readers.server as server
    from otel_rl.readers.server.routes import ROUTES

    listed = set(re.findall(r"``(GET|POST|PUT|PATCH|DELETE) (/[^`]*)``", server.__doc__))
    assert listed == {(route.method, route.path) for route in ROUTES}


def test_the_app_serves_the_tables_routes_each_with_its_twin(tmp_path):
    from otel_rl.readers.server.routes import ROUTES

    from otel_rl.readers.server import create_app
    from otel_rl.readers.server.backends import open_storage

    app = create_app(open_storage(str(tmp_path / "routes.sqlite3")))
    served = {(r.method, r.resource.canonical) for r in app.router.routes() if r.resource is not None}
    expected = {(route.method, path) for route in ROUTES for path in route.paths}
    assert expected <= served and {(m, p) for m, p in served if m != "HEAD" and not p.startswith("/static")} == expected
