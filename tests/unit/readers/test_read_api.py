"""The read API behind the web page: listing filters, a run's start, several curves at once, down-sampled with extremes.

Each test runs on SQLite and PostgreSQL alike (the ``database`` fixture).
"""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest
import requests
from motrix_golden import golden_records

from otel_rl.readers.server import IngestServer
from otel_rl.readers.server.queries import curve, extremes


@pytest.fixture
def server(database):
    with IngestServer(database) as srv:
        yield srv


def post(url: str, records: list[dict]) -> None:
    body = gzip.compress(json.dumps({"protocol": "motrix.metrics/v1", "records": records}).encode())
    response = requests.post(url + "/api/v1/ingest", data=body, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}, timeout=30)
    assert response.status_code == 200 and not response.json().get("rejected"), response.text


def runs(url: str, **query) -> list[str]:
    answer = requests.get(url + "/api/v1/runs", params=query, timeout=10)
    assert answer.status_code == 200, answer.text
    return sorted(r["run_id"] for r in answer.json()["runs"])


def a_run(run_id: str, status: str, project: str, group: str, seq: int) -> list[dict]:
    golden = golden_records()
    running = {**golden["run_running"], "run_id": run_id, "project": project, "group": group, "seq": seq, "writer": run_id + ":1"}
    records = [running]
    if status != "running":
        records.append({**golden[f"run_{status}"], "run_id": run_id, "project": project, "group": group, "seq": seq + 1, "writer": run_id + ":1"})
    return records


def test_listings_filter_by_project_group_status_and_text(server):
    post(server.url, [
        *a_run("sac-lr-3e4", "finished", "pendulum", "lr-sweep", 10),
        *a_run("sac-lr-1e3", "failed", "pendulum", "lr-sweep", 20),
        *a_run("ppo-base", "running", "cartpole", "baselines", 30),
        *a_run("ppo_under_score", "killed", "cartpole", "baselines", 40),
    ])  # fmt: skip
    assert runs(server.url, project="pendulum") == ["sac-lr-1e3", "sac-lr-3e4"]
    assert runs(server.url, group="baselines", status="running") == ["ppo-base"]
    assert runs(server.url, status="failed,killed") == ["ppo_under_score", "sac-lr-1e3"]
    assert runs(server.url, q="LR-") == ["sac-lr-1e3", "sac-lr-3e4"]  # a part of the id, any case
    assert runs(server.url, q="under_") == ["ppo_under_score"]  # _ and % are matched as written
    assert runs(server.url, q="sweep") == ["sac-lr-1e3", "sac-lr-3e4"]  # the group matches too
    refused = requests.get(server.url + "/api/v1/runs", params={"status": "done"}, timeout=10)
    assert refused.status_code == 400 and refused.json()["field"] == "status"


def test_a_run_says_what_it_started_with(server):
    post(server.url, a_run("sac-1", "finished", "pendulum", "lr-sweep", 10))
    run = requests.get(server.url + "/api/v1/runs/sac-1", timeout=10).json()["run"]
    assert run["started"]["config"] == {"lr": 0.0003} and run["started"]["total_steps"] == 100_000
    assert run["started"]["git"]["commit"].startswith("4f1c2e9") and run["started"]["command"] == "python train.py --lr 3e-4"
    (listed,) = requests.get(server.url + "/api/v1/runs", timeout=10).json()["runs"]
    assert listed["started"]["num_envs"] == 8


def test_several_curves_in_one_request_down_sampled(server):
    golden = golden_records()["scalars"]
    records = [
        {**golden, "run_id": "long", "writer": "long:1", "seq": 1000 + i, "step": i, "axes": {"env_steps": 8 * i, "iteration": i},
         "values": {"Loss/critic": math.sin(i / 50) + (9.0 if i == 1234 else 0.0), "Train/mean_reward": float(i)}}
        for i in range(5000)
    ]  # fmt: skip
    post(server.url, records[:2500])
    post(server.url, records[2500:])
    post(server.url, records[1000:3000])  # sent again (a retry, a backfill): each point once
    answer = requests.get(
        server.url + "/api/v1/runs/long/scalars",
        params=[("key", "Loss/critic"), ("key", "Train/mean_reward"), ("max_points", "200")], timeout=30,
    ).json()
    critic, reward = answer["series"]["Loss/critic"], answer["series"]["Train/mean_reward"]
    assert answer["x"] == "env_steps" and critic["count"] == reward["count"] == 5000
    assert len(critic["x"]) <= 200 and critic["x"] == sorted(critic["x"])
    assert max(critic["y"]) == pytest.approx(9.0 + math.sin(1234 / 50)) and 8 * 1234 in critic["x"]  # the spike kept
    assert reward["x"][0] == 0 and reward["x"][-1] == 8 * 4999 and reward["y"][-1] == 4999.0
    by_step = requests.get(server.url + "/api/v1/runs/long/scalars", params={"key": "Train/mean_reward", "x": "step", "max_points": 50}, timeout=30).json()
    assert by_step["series"]["Train/mean_reward"]["x"][-1] == 4999
    assert requests.get(server.url + "/api/v1/runs/long/scalars", params={"key": "x", "x": "wall"}, timeout=10).status_code == 400


def test_a_million_points_keep_the_bound_and_every_extreme():
    rng = np.random.default_rng(0)
    values = rng.normal(size=1_000_000)
    values[[17, 500_000, 999_990]] = [40.0, -40.0, 41.0]
    kept = extremes(values, 2000)
    assert len(kept) <= 2000 and kept == sorted(kept) and kept[0] == 0 and kept[-1] == 999_999
    assert {17, 500_000, 999_990} <= set(kept)
    # Every equal run's own minimum and maximum survive, so no zoom level loses a spike.
    edges = np.linspace(0, values.size, (2000 - 2) // 2 + 1).astype(int)
    kept_set = set(kept)
    for start, end in zip(edges[:-1], edges[1:]):
        assert start + int(np.argmax(values[start:end])) in kept_set and start + int(np.argmin(values[start:end])) in kept_set
    nan = float("nan")
    columns = {"seq": np.arange(12.0), "ts": np.arange(12.0), "step": np.array([*range(10), nan, 11.0]),
               "env_steps": np.array([*range(10), nan, nan]), "value": np.array([*values[:10], 1.0, nan])}  # fmt: skip
    shown = curve(columns, "env_steps", 100)
    assert shown["count"] == 10 and shown["x"] == list(range(10))  # no axis, or no value: left out


def test_curves_of_data_stored_before_point_blocks_are_read_out_of_the_records(tmp_path):
    import sqlite3

    database = tmp_path / "older.sqlite3"
    golden = golden_records()["scalars"]
    with IngestServer(database) as server:
        post(server.url, [{**golden, "run_id": "old", "writer": "old:1", "seq": 10 + i, "step": i, "axes": {"env_steps": 8 * i, "iteration": i},
                           "values": {"Loss/critic": 1.0 / (i + 1)}} for i in range(50)])  # fmt: skip
    with sqlite3.connect(database) as db:
        db.execute("DELETE FROM point_blocks")  # as a database written before them
    with IngestServer(database) as server:
        answer = requests.get(server.url + "/api/v1/runs/old/scalars", params={"key": "Loss/critic", "max_points": 20}, timeout=10).json()
    shown = answer["series"]["Loss/critic"]
    assert shown["count"] == 50 and len(shown["x"]) <= 20 and shown["x"][0] == 0 and shown["y"][0] == 1.0


def test_the_listing_is_one_query_with_each_runs_start_steps_and_chosen_summaries(database):
    """Summaries kept at ingest: last by (ts, seq) whatever order the batches come in, min and max; a bad request is a 400."""
    from otel_rl.readers.server.backends import open_storage

    with IngestServer(database) as server:
        records = a_run("sweep-1", "running", "pendulum", "lr", 10)
        scalars = [{"run_id": "sweep-1", "writer": "sweep-1:1", "seq": 100 + i, "ts": 1_800_000_000.0 + i, "kind": "scalars",
                    "step": i, "axes": {"env_steps": 100 * i}, "values": {"Train/mean_reward": value, "Loss/value": -value}}
                   for i, value in enumerate([3.0, -7.5, 12.0, 4.0])]  # fmt: skip
        post(server.url, records)
        post(server.url, scalars[2:])  # the newer points first
        post(server.url, scalars[:2])
        answer = requests.get(server.url + "/api/v1/runs", params={"summary": ["Train/mean_reward", "Loss/absent"]}, timeout=10).json()
        (run,) = answer["runs"]
        assert run["summary"] == {"Train/mean_reward": {"last": 4.0, "min": -7.5, "max": 12.0}, "Loss/absent": None}
        assert run["env_steps"] == 300 and run["started"] is not None and run["project"] == "pendulum"
        every = requests.get(server.url + "/api/v1/runs", params={"summary": "*"}, timeout=10).json()["runs"][0]
        assert every["last"] == {"Train/mean_reward": 4.0, "Loss/value": -4.0}
        too_many = requests.get(server.url + "/api/v1/runs", params={"summary": [f"k{i}" for i in range(21)]}, timeout=10)
        assert too_many.status_code == 400 and too_many.json()["field"] == "summary"
    # A database made before these columns gets them, filled from its records, when a server opens it.
    if database.startswith("postgresql"):
        import psycopg

        with psycopg.connect(database, autocommit=True) as conn:
            conn.execute("ALTER TABLE runs DROP COLUMN started, DROP COLUMN started_ts, DROP COLUMN started_seq, DROP COLUMN env_steps, DROP COLUMN steps_ts")
    else:
        import sqlite3

        with sqlite3.connect(database) as conn:
            for column in ("started", "started_ts", "started_seq", "env_steps", "steps_ts"):
                conn.execute(f"ALTER TABLE runs DROP COLUMN {column}")
    storage = open_storage(database)
    try:
        (run,) = storage.runs()
        assert run["env_steps"] == 300 and run["started"] is not None
    finally:
        storage.close()


def test_runs_are_tagged_noted_and_deleted_with_everything_stored_of_them(database, tmp_path):
    from otel_rl.readers.server.backends import open_storage

    with IngestServer(database) as server:
        post(server.url, a_run("keep", "finished", "p", "g", 10))
        post(server.url, a_run("drop", "finished", "p", "g", 20))
        post(server.url, [{"run_id": "drop", "writer": "drop:1", "seq": 30, "ts": 1.8e9, "kind": "scalars", "step": 1, "axes": {"env_steps": 8},
                           "values": {"Loss/value": 1.0}}])  # fmt: skip
        assert requests.put(server.url + "/api/v1/runs/drop/trace", data=b"\x0a\x05trace", timeout=10).status_code == 200
        edited = requests.patch(server.url + "/api/v1/runs/keep", json={"tags": ["baseline", " sweep ", "baseline"], "note": "the reference"}, timeout=10)
        assert edited.status_code == 200 and edited.json()["tags"] == ["baseline", "sweep"] and edited.json()["note"] == "the reference"
        assert requests.patch(server.url + "/api/v1/runs/keep", json={"note": "kept"}, timeout=10).json()["tags"] == ["baseline", "sweep"]
        assert runs(server.url, tag="baseline") == ["keep"] and runs(server.url, tag="base") == []
        post(server.url, a_run("quoted", "finished", "p", "g", 15))
        assert requests.patch(server.url + "/api/v1/runs/quoted", json={"tags": ['a"b', "Sweep", "x, \"b\""]}, timeout=10).status_code == 200
        assert runs(server.url, tag="b") == [] and runs(server.url, tag="sweep") == ["keep"]  # exact, and case-sensitive
        assert runs(server.url, tag='a"b') == ["quoted"] and runs(server.url, tag="Sweep") == ["quoted"] and runs(server.url, tag='x, "b"') == ["quoted"]
        assert requests.delete(server.url + "/api/v1/runs/quoted", timeout=10).status_code == 200
        # Accents, however they were typed: "été" as one character each or as e and a combining accent is one tag.
        post(server.url, a_run("summer", "finished", "p", "g", 16))
        accented = requests.patch(server.url + "/api/v1/runs/summer", json={"tags": ["e\u0301te\u0301", "\u00e9t\u00e9", "日本"]}, timeout=10)
        assert accented.status_code == 200 and accented.json()["tags"] == ["\u00e9t\u00e9", "日本"]
        assert runs(server.url, tag="\u00e9t\u00e9") == ["summer"] and runs(server.url, tag="e\u0301te\u0301") == ["summer"]
        assert runs(server.url, tag="日本") == ["summer"] and runs(server.url, tag="ete") == []
        assert requests.delete(server.url + "/api/v1/runs/summer", timeout=10).status_code == 200
        # A NUL in any parameter, and an events limit past any integer a database holds: 400, naming the parameter.
        for path, params, field in (("/api/v1/runs", {"tag": "a\x00b"}, "tag"), ("/api/v1/runs", {"q": "\x00"}, "q"),
                                    ("/api/v1/runs/keep/scalars", {"key": "Loss/\x00"}, "key"), ("/api/v1/run", {"run_id": "k\x00"}, "run_id"),
                                    ("/api/v1/runs/keep", {"events": str(2**64)}, "events"), ("/api/v1/runs/keep", {"events": "-1"}, "events")):  # fmt: skip
            answer = requests.get(server.url + path, params=params, timeout=10)
            assert answer.status_code == 400 and answer.json()["field"] == field, (path, params, answer.text)
        answer = requests.get(server.url + "/api/v1/runs/ke%00ep/keys", timeout=10)
        assert answer.status_code == 400 and answer.json()["field"] == "run_id"
        for bad in ({"tags": "baseline"}, {"tags": ["x" * 65]}, {"note": 3}, {"owner": "me"}, [1], {"note": "a\x00b"}, {"tags": ["\x00"]}):
            answer = requests.patch(server.url + "/api/v1/runs/keep", json=bad, timeout=10)
            assert answer.status_code == 400 and answer.json()["field"] == "body", bad
        assert requests.patch(server.url + "/api/v1/runs/ghost", json={"note": "x"}, timeout=10).status_code == 404
        assert requests.delete(server.url + "/api/v1/runs/drop", timeout=10).json() == {"deleted": "drop"}
        assert requests.delete(server.url + "/api/v1/runs/drop", timeout=10).status_code == 404
        assert runs(server.url) == ["keep"]
    storage = open_storage(database)
    try:  # nothing of the deleted run is left in any table
        assert storage.count("drop") == 0 and storage.keys("drop") == [] and storage.file("drop", "trace.perfetto-trace") is None
        assert storage.curve("drop", "Loss/value")["seq"].size == 0 and storage.last_values(["drop"]) == {}
    finally:
        storage.close()


def test_a_postgresql_database_made_with_jsonb_bodies_keeps_them(postgres):
    """New databases keep bodies as json (cheaper to store); one made before, with jsonb, is written and read as it is."""
    import psycopg

    url = postgres.database()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE records (writer TEXT NOT NULL, seq BIGINT NOT NULL, run_id TEXT NOT NULL, kind TEXT NOT NULL,"
                     " ts DOUBLE PRECISION NOT NULL, body JSONB NOT NULL, PRIMARY KEY (writer, seq))")  # fmt: skip
    with IngestServer(url) as server:
        post(server.url, a_run("old", "running", "p", "g", 1))
        post(server.url, [{"run_id": "old", "writer": "old:1", "seq": 10 + i, "ts": 1.8e9 + i, "kind": "scalars", "step": i,
                           "axes": {"env_steps": i}, "values": {"Loss/value": float(i)}} for i in range(5)])  # fmt: skip
        points = requests.get(server.url + "/api/v1/runs/old/scalars", params={"key": "Loss/value"}, timeout=10).json()["points"]
        assert [p["value"] for p in points] == [0.0, 1.0, 2.0, 3.0, 4.0]
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT data_type FROM information_schema.columns WHERE table_name = 'records' AND column_name = 'body'").fetchone() == ("jsonb",)


def test_a_run_deleted_while_it_streams_comes_back_whole_on_every_server(database, tmp_path):
    """Records sent after a delete make the run again with its keys (charts, export), whichever server took the delete."""
    def scalars(seq: int, step: int) -> dict:
        return {"run_id": "phoenix", "writer": "phoenix:1", "seq": seq, "ts": 1.8e9 + step, "kind": "scalars", "step": step,
                "axes": {"env_steps": 8 * step}, "values": {"Loss/value": float(step), "Train/mean_reward": -float(step)}}  # fmt: skip

    with IngestServer(database) as first, IngestServer(database) as second:  # one database, two servers' caches
        post(first.url, a_run("phoenix", "running", "p", "g", 1))
        post(first.url, [scalars(10 + i, i) for i in range(5)])
        assert requests.get(first.url + "/api/v1/runs/phoenix/keys", timeout=10).json()["keys"] == ["Loss/value", "Train/mean_reward"]
        post(second.url, [scalars(20, 5)])  # the second server knows the keys too
        assert requests.delete(first.url + "/api/v1/runs/phoenix", timeout=10).json() == {"deleted": "phoenix"}
        for server, seq, step in ((first, 30, 6), (second, 31, 7)):
            post(server.url, [scalars(seq, step)])  # the run still streams, to either server
        for server in (first, second):
            keys = requests.get(server.url + "/api/v1/runs/phoenix/keys", timeout=10).json()["keys"]
            assert keys == ["Loss/value", "Train/mean_reward"]
            points = requests.get(server.url + "/api/v1/runs/phoenix/scalars", params={"key": "Loss/value"}, timeout=10).json()["points"]
            assert [p["value"] for p in points] == [6.0, 7.0]
            exported = requests.get(server.url + "/api/v1/runs/phoenix/export", params={"format": "json"}, timeout=10).json()["columns"]
            assert exported["Loss/value"] == [6.0, 7.0] and exported["Train/mean_reward"] == [-6.0, -7.0]


SWEEP_SEED = """
import sys, otel_rl
tel = otel_rl.init(run_dir=sys.argv[1], motrix_url=sys.argv[2], system_metrics_interval_s=0, shutdown_timeout_s=5)
with tel.run(config={"seed": int(sys.argv[3])}):
    for i in range(30):
        with tel.iteration(i, env_steps=8 * (i + 1)):
            with tel.phase("learning"):
                pass
        tel.scalars({"Loss/value": float(sys.argv[3])})
tel.close()
"""


def test_a_second_run_with_the_same_run_id_is_refused_in_one_line_never_merged(database, tmp_path):
    """A sweep whose seeds share OTEL_RL_RUN_ID: the first run keeps the id; the second is refused whole, said once."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    env["OTEL_RL_RUN_ID"] = "sweep"
    with IngestServer(database) as server:
        outcomes = [subprocess.run([sys.executable, "-c", SWEEP_SEED, str(tmp_path / f"seed{seed}"), server.url, str(seed)],
                                   capture_output=True, text=True, timeout=120, env=env) for seed in (1, 2)]  # fmt: skip
        assert [o.returncode for o in outcomes] == [0, 0], outcomes[1].stderr  # training is never the one refused
        said = [line for line in outcomes[1].stderr.splitlines() if "belongs to another run" in line]
        assert len(said) == 1 and "give each run its own run id" in said[0], outcomes[1].stderr
        assert "belongs to another run" not in outcomes[0].stderr
        run = requests.get(server.url + "/api/v1/runs/sweep", timeout=10).json()["run"]
        assert run["status"] == "finished" and run["started"]["config"] == {"seed": 1}
        points = requests.get(server.url + "/api/v1/runs/sweep/scalars", params={"key": "Loss/value"}, timeout=10).json()["points"]
        assert [p["value"] for p in points] == [1.0] * 30  # the second run's values are not in the first's curve
        # The trace each run's agent sends when it ends: the first run's is kept, the second's refused (said in its folder).
        from uploads import upload_outcome

        first, second = (upload_outcome(tmp_path / f"seed{seed}") for seed in (1, 2))
        assert first["sent"] is True and second["sent"] is False and "409" in second["error"] and "another run" in second["error"]
        stored = requests.get(server.url + "/api/v1/runs/sweep/trace", timeout=10).content
        assert stored == (tmp_path / "seed1" / "trace.perfetto-trace").read_bytes()
        # Its own files keep everything, and its backfill is refused the same way.
        backfilled = subprocess.run([sys.executable, "-m", "otel_rl.cli", "backfill", str(tmp_path / "seed2"), "--url", server.url],
                                    capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
        assert backfilled.returncode != 0 or "refused" in backfilled.stdout + backfilled.stderr
        assert requests.get(server.url + "/api/v1/runs/sweep/scalars", params={"key": "Loss/value"}, timeout=10).json()["points"] == points


def test_two_runs_claiming_one_id_at_one_instant_are_never_merged(database):
    """Their first batches meet at the same instant, through two servers of one database, 20 times: each time one run
    keeps the id and the other is refused (409) whole; the id's curve holds one run's values only."""
    import threading

    def first_batch(run_id: str, trace: str, writer: str, value: float) -> bytes:
        pending = {"run_id": run_id, "writer": writer, "seq": 1, "ts": 1.8e9, "kind": "run", "status": "pending", "trace_id": trace}
        scalars = [{"run_id": run_id, "writer": writer, "seq": 2 + i, "ts": 1.8e9 + i, "kind": "scalars", "step": i,
                    "axes": {"env_steps": i}, "values": {"Loss/value": value}} for i in range(50)]  # fmt: skip
        return gzip.compress(json.dumps({"protocol": "motrix.metrics/v1", "records": [pending, *scalars]}).encode())

    with IngestServer(database) as one, IngestServer(database) as other:
        for n in range(20):
            run_id, answers = f"race-{n}", {}
            bodies = {name: first_batch(run_id, trace * 16, f"{name}-{n}:1", value)
                      for name, trace, value in (("a", "aa", 1.0), ("b", "bb", 2.0))}  # fmt: skip
            barrier = threading.Barrier(2)

            def send(name: str, url: str) -> None:
                barrier.wait()
                answers[name] = requests.post(url + "/api/v1/ingest", data=bodies[name], timeout=30,
                                              headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})  # fmt: skip

            threads = [threading.Thread(target=send, args=args) for args in (("a", one.url), ("b", other.url))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            statuses = {name: answer.status_code for name, answer in answers.items()}
            assert sorted(statuses.values()) == [200, 409], (n, statuses, {k: a.text[:200] for k, a in answers.items()})
            winner = next(name for name, status in statuses.items() if status == 200)
            points = requests.get(one.url + f"/api/v1/runs/{run_id}/scalars", params={"key": "Loss/value"}, timeout=10).json()["points"]
            assert [p["value"] for p in points] == [1.0 if winner == "a" else 2.0] * 50, (n, winner)
