"""The runs' live verdicts as each storage backend keeps them: the newest wins, the listing filters on them, the trace's replaces them."""

from __future__ import annotations

import json
import time

import requests
from synthetic_trace import write_trace

from otel_rl.readers.analysis import analyze
from otel_rl.readers.server import IngestServer

PROTOCOL = "motrix.metrics/v1"


def verdict(run_id: str, seq: int, ts: float, side: str, phase: str) -> dict:
    text = f"{side} ({phase.replace('_', ' ')})" if phase else f"{side} (not instrumented)"
    return {"run_id": run_id, "writer": f"{run_id}:1", "seq": seq, "ts": ts, "kind": "event", "name": "bottleneck",
            "attributes": {"text": text, "side": side, "phase": phase, "confidence": "high", "cycles": 40, "window_s": 2.0}}  # fmt: skip


def started(run_id: str, ts: float) -> dict:
    return {"run_id": run_id, "writer": f"{run_id}:1", "seq": 0, "ts": ts, "kind": "run", "status": "running", "project": "p",
            "group": "sweep", "meta": {}}  # fmt: skip


def send(url: str, records: list[dict]) -> None:
    answer = requests.post(url + "/api/v1/ingest", data=json.dumps({"protocol": PROTOCOL, "records": records}), timeout=30)
    assert answer.ok and not answer.json().get("rejected"), answer.text


def listed(url: str, **params: str) -> list[str]:
    return [r["run_id"] for r in requests.get(url + "/api/v1/runs", params=params, timeout=30).json()["runs"]]


def test_the_newest_verdict_is_the_runs_and_the_listing_filters_on_it(database, tmp_path):
    now = time.time()
    with IngestServer(database) as server:
        send(server.url, [started("a", now), started("b", now), started("c", now)])
        send(server.url, [verdict("a", 1, now + 1, "collector", ""), verdict("a", 2, now + 5, "learner", "learning")])
        send(server.url, [verdict("a", 3, now + 3, "collector", "env_step")])  # older, arriving late: it replaces nothing
        send(server.url, [verdict("b", 1, now + 2, "collector", "env_step")])
        run = requests.get(server.url + "/api/v1/runs/a", timeout=30).json()["run"]
        assert run["bottleneck"]["text"] == "learner (learning)" and run["bottleneck"]["source"] == "live"
        assert run["bottleneck"]["since"] == now + 5
        assert listed(server.url, bottleneck="collector") == ["b"]
        assert listed(server.url, bottleneck="learner/learning") == ["a"]
        assert listed(server.url, bottleneck="collector/learning") == []
        assert [r["bottleneck"] for r in requests.get(server.url + "/api/v1/runs", params={"q": "c"}, timeout=30).json()["runs"]] == [None]
        facets = requests.get(server.url + "/api/v1/facets", timeout=30).json()
        assert facets["bottleneck"] == ["collector", "collector/env_step", "learner", "learner/learning"]
        # The trace's verdict, sent with the diagnosis, replaces the live one for good, and the two are reconciled.
        report = analyze(write_trace(tmp_path / "t.perfetto-trace", learner=[("collector_wait", 6.0, []), ("learning", 2.0, [])]))
        assert report.diagnosis.bottleneck == "collector (not instrumented)"
        put = requests.put(server.url + "/api/v1/runs/a/diagnosis", data=json.dumps(report.to_json()), timeout=30)
        assert put.ok, put.text
        final = requests.get(server.url + "/api/v1/runs/a", timeout=30).json()["run"]["bottleneck"]
        assert final["source"] == "trace" and final["text"] == "collector (not instrumented)" and final["side"] == "collector"
        assert final["live"]["text"] == "learner (learning)" and final["agrees"] is False
        send(server.url, [verdict("a", 4, now + 9, "learner", "learning")])  # a late live verdict does not undo the trace's
        assert requests.get(server.url + "/api/v1/runs/a", timeout=30).json()["run"]["bottleneck"]["source"] == "trace"
        assert listed(server.url, bottleneck="collector") == ["a", "b"]
        requests.put(server.url + "/api/v1/runs/a/diagnosis", data=json.dumps(report.to_json()), timeout=30).raise_for_status()
        again = requests.get(server.url + "/api/v1/runs/a", timeout=30).json()["run"]["bottleneck"]
        assert again["live"]["text"] == "learner (learning)"  # sent twice: reconciled with the same live verdict
        bad = requests.get(server.url + "/api/v1/runs", params={"bottleneck": "a/b/c"}, timeout=30)
        assert bad.status_code == 400 and bad.json()["field"] == "bottleneck"
