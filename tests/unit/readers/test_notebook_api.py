"""``otel_rl.read`` and ``otel-rl export``: real run folders and a real server (SQLite and PostgreSQL), point for point against metrics.jsonl."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import requests

import otel_rl
import otel_rl.read as read
from otel_rl.outputs.motrix.backfill import backfill
from otel_rl.readers.run_upload import upload
from otel_rl.readers.server import IngestServer

TOKEN = "notebook-token"
WEIRD = {"Train/huge": 2**62, "Train/nan": float("nan"), "Train/inf": float("inf"), "Train/" + "long" * 60: 1.5}


def a_run(runs_dir, name: str, project: str, lr: float, points: int = 40) -> str:
    """A run of known values: Train/mean_reward = 10 * i + lr, Loss/value = 1 / (i + 1), numpy and odd values at i = 3."""
    run_dir = runs_dir / name
    tel = otel_rl.init(run_dir=run_dir, run_id=name, project=project, system_metrics_interval_s=0, quiet=True)
    with tel.run(config={"lr": lr, "net": {"width": 64}}):
        for i in range(points):
            values = {"Train/mean_reward": np.float32(10 * i + lr), "Loss/value": 1 / (i + 1)}
            if i == 3:
                values.update(WEIRD)
            with tel.iteration(i, env_steps=8 * (i + 1)):
                tel.scalars(values, step=i)  # at the iteration's env steps
                with tel.phase("collector_wait"):
                    time.sleep(0.001)
                with tel.phase("learning"):
                    time.sleep(0.002)
    tel.close()
    return str(run_dir)


def jsonl_points(run_dir: str) -> dict[str, list]:
    """Each key's (step, value) pairs as metrics.jsonl holds them."""
    points: dict[str, list] = {}
    with open(f"{run_dir}/metrics.jsonl") as lines:
        for line in lines:
            record = json.loads(line)
            if record["kind"] == "scalars":
                for key, value in record["values"].items():
                    points.setdefault(key, []).append((record["step"], value))
    return points


def same(frame: pd.DataFrame, expected: dict[str, list]) -> None:
    """The frame's non-empty points are exactly the file's (a value that was not finite is NaN in both)."""
    for key, pairs in expected.items():
        column = frame.reset_index()[["step", key]].dropna(subset=[key]) if key in frame.columns else pd.DataFrame()
        stored = [(s, v) for s, v in pairs if v is not None and math.isfinite(v)]
        got = sorted((int(s), float(v)) for s, v in column.itertuples(index=False))
        assert got == sorted((int(s), float(v)) for s, v in stored), key


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    a_run(root, "sac-a", "pendulum", 0.5)
    a_run(root, "sac-b", "pendulum", 0.25)
    a_run(root, "ppo-c", "cartpole", 0.125)
    return root


def test_a_folder_of_runs_reads_as_runs_scalars_events_and_phases(runs_dir):
    runs = read.runs(runs_dir)
    assert sorted(runs["run_id"]) == ["ppo-c", "sac-a", "sac-b"] and set(runs["status"]) == {"finished"}
    row = runs.set_index("run_id").loc["sac-b"]
    assert row["config.lr"] == 0.25 and row["config.net.width"] == 64 and row["project"] == "pendulum"
    assert row["env_steps"] == 320 and row["Train/mean_reward"] == pytest.approx(390.25) and row["duration_s"] > 0
    assert list(read.runs(runs_dir, project="cartpole")["run_id"]) == ["ppo-c"]

    one = read.scalars(runs_dir / "sac-a")
    assert one.index.name == "env_steps" and one["Train/huge"].dropna().tolist() == [2**62]
    same(one, jsonl_points(str(runs_dir / "sac-a")))
    every = read.scalars(runs_dir, keys=["Train/mean_reward"], x="step")
    assert set(every["run_id"]) == {"sac-a", "sac-b", "ppo-c"} and list(every.columns) == ["run_id", "seq", "ts", "env_steps", "Train/mean_reward"]
    assert len(every.dropna(subset=["Train/mean_reward"])) == 120 and len(every) == 120  # only the records that carry the key

    events = read.events(runs_dir / "sac-a")
    assert list(events.columns) == ["ts", "name", "attributes"]
    phases = read.phases(runs_dir / "sac-a")
    learner = phases[phases["timeline"] == "learner"]
    assert len(learner) == 40 and (learner["learning_ms"] >= 2.0).all() and (learner["collector_wait_ms"] >= 1.0).all()
    parts = learner[["collector_wait_ms", "learning_ms", "other_ms"]].sum(axis=1)
    assert np.allclose(parts, learner["duration_ms"])  # the phases and Other make up each iteration


def test_phases_from_a_folder_of_runs_carry_each_runs_id(runs_dir, tmp_path):
    every = read.phases(runs_dir)
    assert every.groupby("run_id").size().to_dict() == {"ppo-c": 40, "sac-a": 40, "sac-b": 40}
    assert list(every.columns[:2]) == ["run_id", "timeline"]
    assert len(read.phases(runs_dir, run_id="sac-b")) == 40
    with pytest.raises(read.SourceError, match="no run 'nope'"):
        read.phases(runs_dir, run_id="nope")
    (tmp_path / "no-trace").mkdir()
    (tmp_path / "no-trace" / "metrics.jsonl").write_text((runs_dir / "sac-a" / "metrics.jsonl").read_text())
    with pytest.raises(read.SourceError, match="no \\*.perfetto-trace file"):
        read.phases(tmp_path / "no-trace")


def test_a_damaged_trace_among_runs_is_left_out_and_named_once_and_alone_is_one_clear_error(runs_dir, tmp_path, caplog):
    import logging
    import shutil

    folder = tmp_path / "runs"
    shutil.copytree(runs_dir, folder)
    trace = folder / "sac-b" / "trace.perfetto-trace"
    data = trace.read_bytes()
    trace.write_bytes(data[: len(data) // 2] + b"\xff" * 64 + data[len(data) // 2 :])  # a damaged disk block
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        every = read.phases(folder)
    assert every.groupby("run_id").size().to_dict() == {"ppo-c": 40, "sac-a": 40}  # the others are read
    (said,) = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
    assert "sac-b" in said and "not a readable Perfetto trace" in said
    with pytest.raises(read.SourceError, match="run 'sac-b': .*not a readable Perfetto trace"):
        read.phases(folder, run_id="sac-b")


def test_an_odd_line_in_metrics_jsonl_is_skipped_counted_and_said_once(runs_dir, tmp_path, caplog):
    import shutil

    run = tmp_path / "runs" / "odd"
    shutil.copytree(runs_dir / "sac-a", run)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[3:3] = ['{"kind": "run", "run_id": "sac-a"}', '{"kind": "scalars", "run_id": "sac-a", "ts": 1.0, "values": {"Loss/value": "high"}}', "[1, 2]"]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with caplog.at_level("WARNING", logger="otel_rl"):
        runs = read.runs(run.parent)
        points = read.scalars(run.parent)
    assert list(runs["run_id"]) == ["sac-a"] and runs["status"].iloc[0] == "finished"
    same(points, jsonl_points(str(runs_dir / "sac-a")))  # every other record read, the odd ones left out
    said = [r.getMessage() for r in caplog.records if "no motrix.metrics/v1 record" in r.getMessage()]
    assert said == [f"otel-rl: {run / 'metrics.jsonl'}: 3 line(s) that are no motrix.metrics/v1 record skipped (line 4 has no time (ts))"]
    exported = subprocess.run([sys.executable, "-m", "otel_rl.cli", "export", str(run.parent), "--format", "csv", "--out", str(tmp_path / "out")],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    assert exported.returncode == 0 and "Traceback" not in exported.stderr


def test_runs_that_share_a_run_id_are_two_runs_told_apart_by_folder(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("OTEL_RL_RUN_ID", "sweep")  # a sweep's seeds, one run id
    for seed in (1, 2):
        tel = otel_rl.init(run_dir=tmp_path / f"seed{seed}", system_metrics_interval_s=0, quiet=True)
        with tel.run(config={"seed": seed}):
            for i in range(10):
                with tel.iteration(i, env_steps=i):
                    with tel.phase("learning"):
                        pass
                tel.scalars({"Loss/value": float(seed)})
        tel.close()
    with caplog.at_level("WARNING", logger="otel_rl"):
        runs = read.runs(tmp_path).set_index("run_id")
    assert runs["config.seed"].to_dict() == {"sweep@seed1": 1, "sweep@seed2": 2}
    points = read.scalars(tmp_path, keys=["Loss/value"])
    assert points.groupby("run_id")["Loss/value"].agg(["size", "max"]).to_dict("index") == {
        "sweep@seed1": {"size": 10, "max": 1.0}, "sweep@seed2": {"size": 10, "max": 2.0}}
    assert read.phases(tmp_path).groupby("run_id").size().to_dict() == {"sweep@seed1": 10, "sweep@seed2": 10}
    assert sum("several run folders hold run 'sweep'" in r.getMessage() for r in caplog.records) == 1


def test_a_login_page_a_stranger_or_a_trickling_server_is_one_clear_error_in_bounded_time(tmp_path, monkeypatch):
    from fault_servers import HtmlPage, TrickleServer

    from otel_rl.readers import frames

    page = HtmlPage()
    try:
        with pytest.raises(read.SourceError, match=r"answered /api/v1/runs with text/html; charset=utf-8 \('<html><body><form>Sign in.*a login page or a proxy"):
            read.runs(page.url)
        for call in (lambda: read.scalars(page.url, run_id="x"), lambda: read.events(page.url, run_id="x"), lambda: read.phases(page.url)):
            with pytest.raises(read.SourceError, match="not otel-rl's API"):
                call()
        exported = subprocess.run([sys.executable, "-m", "otel_rl.cli", "export", page.url, "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
        assert exported.returncode == 1 and len(exported.stderr.strip().splitlines()) == 1 and "login page" in exported.stderr
        page.page, page.content_type = b'{"hello": "world"}', "application/json"
        with pytest.raises(read.SourceError, match="JSON of another shape \\(no 'runs'\\): is it an otel-rl server"):
            read.runs(page.url)
        with pytest.raises(read.SourceError, match="no 'columns'"):
            read.scalars(page.url, run_id="x")
    finally:
        page.stop()
    monkeypatch.setattr(frames, "REQUEST_TIMEOUT_S", 2.0)
    trickle = TrickleServer(every_s=0.3)  # a byte every 0.3 s: no read ever times out, the answer never ends in time
    try:
        began = time.monotonic()
        with pytest.raises(read.SourceError, match="did not answer /api/v1/runs within 2 s"):
            read.runs(trickle.url)
        assert time.monotonic() - began < 6
    finally:
        trickle.stop()


def test_bad_sources_are_one_clear_error(runs_dir, tmp_path):
    with pytest.raises(read.SourceError, match="not a run folder"):
        read.runs(tmp_path / "missing")
    with pytest.raises(read.SourceError, match="x must be one of"):
        read.scalars(runs_dir, x="wall")
    with pytest.raises(read.SourceError, match="no run 'nope'"):
        read.scalars(runs_dir, run_id="nope")
    with pytest.raises(read.SourceError, match="cannot be reached"):
        read.runs("http://127.0.0.1:9")


def test_a_server_answers_the_same_points_as_the_folders(runs_dir, database):
    with IngestServer(database, token=TOKEN) as server:
        for name in ("sac-a", "sac-b", "ppo-c"):
            assert backfill(runs_dir / name, server.url, TOKEN)["rejected"] == 0
        assert read.phases(server.url, token=TOKEN).empty  # no trace sent yet: no rows
        with pytest.raises(read.SourceError, match="has no trace of run 'sac-a'"):
            read.phases(server.url, run_id="sac-a", token=TOKEN)
        for name in ("sac-a", "sac-b", "ppo-c"):
            assert upload(runs_dir / name, server.url, TOKEN) is not None
        with pytest.raises(read.SourceError, match="401"):
            read.runs(server.url)  # no token
        runs = read.runs(server.url, token=TOKEN)
        assert sorted(runs["run_id"]) == ["ppo-c", "sac-a", "sac-b"]
        row = runs.set_index("run_id").loc["sac-a"]
        assert row["config.lr"] == 0.5 and row["env_steps"] == 320 and row["status"] == "finished"
        assert row["Train/mean_reward"] == pytest.approx(390.5) and row["Loss/value"] == pytest.approx(1 / 40)
        assert list(read.runs(server.url, project="cartpole", token=TOKEN)["run_id"]) == ["ppo-c"]
        for name in ("sac-a", "ppo-c"):
            same(read.scalars(server.url, run_id=name, token=TOKEN), jsonl_points(str(runs_dir / name)))
        every = read.scalars(server.url, keys=["Loss/value"], token=TOKEN)
        assert sorted(set(every["run_id"])) == ["ppo-c", "sac-a", "sac-b"] and every["Loss/value"].notna().sum() == 120
        assert read.events(server.url, run_id="sac-a", token=TOKEN)["name"].tolist() == read.events(runs_dir / "sac-a")["name"].tolist()
        # Phases from the server's copy of each trace, as from the folders.
        served = read.phases(server.url, run_id="sac-a", token=TOKEN)
        local = read.phases(runs_dir / "sac-a")
        assert len(served) == 40 and np.allclose(served["learning_ms"], local["learning_ms"])
        every_phase = read.phases(server.url, token=TOKEN)
        assert every_phase.groupby("run_id").size().to_dict() == {"ppo-c": 40, "sac-a": 40, "sac-b": 40}
        with pytest.raises(read.SourceError, match="401"):
            read.phases(server.url, run_id="sac-a")  # no token

        headers = {"Authorization": f"Bearer {TOKEN}"}
        csv = requests.get(server.url + "/api/v1/runs/sac-a/export", params={"format": "csv"}, headers=headers, timeout=30)
        assert csv.status_code == 200 and csv.headers["Content-Disposition"] == 'attachment; filename="sac-a.csv"'
        records = sum(1 for line in open(runs_dir / "sac-a" / "metrics.jsonl") if '"kind":"scalars"' in line)
        assert csv.text.splitlines()[0].startswith("seq,ts,step,env_steps,") and len(csv.text.splitlines()) == 1 + records
        parquet = requests.get(server.url + "/api/v1/runs/sac-a/export", params={"format": "parquet", "key": "Loss/value"}, headers=headers, timeout=30)
        table = pd.read_parquet(__import__("io").BytesIO(parquet.content))
        assert list(table.columns) == ["seq", "ts", "step", "env_steps", "Loss/value"] and table["Loss/value"].tolist() == [1 / (i + 1) for i in range(40)]
        bad = requests.get(server.url + "/api/v1/runs/sac-a/export", params={"format": "xlsx"}, headers=headers, timeout=30)
        assert bad.status_code == 400 and bad.json()["field"] == "format"
        assert requests.get(server.url + "/api/v1/runs/nope/export", headers=headers, timeout=30).status_code == 404


@pytest.mark.parametrize("form", ["parquet", "csv"])
def test_export_writes_runs_and_scalars_files(runs_dir, tmp_path, form):
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "otel_rl.cli", "export", str(runs_dir), "--format", form, "--out", str(out)],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    load = pd.read_parquet if form == "parquet" else pd.read_csv
    runs, scalars = load(out / f"runs.{form}"), load(out / f"scalars.{form}")
    assert sorted(runs["run_id"]) == ["ppo-c", "sac-a", "sac-b"] and scalars["Train/mean_reward"].notna().sum() == 120
    same(scalars[scalars["run_id"] == "sac-b"].set_index("env_steps"), jsonl_points(str(runs_dir / "sac-b")))
    missing = subprocess.run([sys.executable, "-m", "otel_rl.cli", "export", str(tmp_path / "nothing")], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and len(missing.stderr.strip().splitlines()) == 1 and "Traceback" not in missing.stderr


def test_the_default_layout_reads_from_its_root(tmp_path):
    # runs/<algorithm>/<run id>, as a run given no folder makes it: read.runs("runs") reads them all, as the README says
    a_run(tmp_path / "runs" / "sac", "s1", "p", 0.5, points=5)
    a_run(tmp_path / "runs" / "sac", "s2", "p", 0.5, points=5)
    a_run(tmp_path / "runs" / "ppo", "p1", "p", 0.5, points=5)
    runs = read.runs(tmp_path / "runs")
    assert sorted(runs["run_id"]) == ["p1", "s1", "s2"] and set(runs["status"]) == {"finished"}
    assert sorted(read.runs(tmp_path / "runs" / "sac")["run_id"]) == ["s1", "s2"]
    assert set(read.scalars(tmp_path / "runs")["run_id"]) == {"p1", "s1", "s2"}
