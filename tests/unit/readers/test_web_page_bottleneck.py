"""The live verdict on ``otel-rl serve``'s pages, in headless Chromium: real runs streaming to a real server.

One run's learner slows midway (Learning 2 ms to 20 ms, its wait for the collector 20 ms to 2 ms): its page shows the
change from collector-bound to learner-bound, with the verdict it replaced, within 10 seconds of the change. Another
run collects and learns in turn and is collector-bound (its env step). The runs table filters on the verdict, the
compare page shows the two side by side, and the run's trace, sent once it ended, replaces the live verdict and says
how the two compare.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import requests
from browser import Browser
from locations import SUPPORT

import otel_rl.read
from otel_rl.readers.server import IngestServer

TARGET = SUPPORT / "bottleneck_target.py"
TOKEN = "verdict-t0ken"
CHANGE_AT_S = 6.0
AFTER_S = 10.0
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def start(url: str, run_id: str, mode: str, seconds: float, mark, run_dir=None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_", "WANDB_")) or k == "OTEL_RL_RUN_DIR"}
    env["MOTRIX_METRICS_TOKEN"] = TOKEN
    arguments = [url, run_id, mode, str(seconds), str(CHANGE_AT_S), str(mark)] + ([str(run_dir)] if run_dir else [])
    return subprocess.Popen([sys.executable, str(TARGET), *arguments], env=env)


def run_of(url: str, run_id: str) -> dict:
    answer = requests.get(f"{url}/api/v1/runs/{run_id}", headers=AUTH, timeout=5)
    return answer.json()["run"] if answer.ok else {}


def wait_until(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.2)
    raise TimeoutError(what)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bottleneck")
    with IngestServer(tmp / "runs.sqlite3", token=TOKEN) as server:
        changing = start(server.url, "slows", "learner", CHANGE_AT_S + AFTER_S, tmp / "slows.mark", tmp / "slows")
        turns = start(server.url, "turns", "turns", 600, tmp / "turns.mark")
        browser = Browser()
        try:
            yield server, browser, tmp, changing
        finally:
            browser.close()
            for process in (changing, turns):
                process.kill()
                process.wait(10)


def test_the_run_page_shows_the_change_of_bottleneck_within_10_seconds(site, tmp_path):
    server, browser, tmp, _ = site
    browser.goto(f"{server.url}/runs/slows#token={TOKEN}")
    first = browser.wait_for("document.querySelector('#verdict-now') && [document.querySelector('#verdict-now').dataset.side,"
                             " document.querySelector('#verdict-now').textContent]", 30)  # fmt: skip
    assert first[0] == "collector" and first[1].startswith("bottleneck now: collector (not instrumented)"), first
    seen_ms = browser.wait_for("document.querySelector('#verdict-now[data-phase=\"learning\"]') && Date.now()", CHANGE_AT_S + AFTER_S + 10)
    changed_s = float((tmp / "slows.mark").read_text())
    delay_s = seen_ms / 1000 - changed_s
    print(f"the change reached the page {delay_s:.1f} s after it happened")
    assert 0 < delay_s < 10, delay_s
    assert browser.eval("document.querySelector('#verdict-now').textContent").startswith("bottleneck now: learner (learning)")
    history = browser.wait_for("[...document.querySelectorAll('#verdict-history tr.verdict-change')].map(r => r.textContent)")
    assert "collector (not instrumented) → learner (learning)" in history[0] and "steps/s" in history[0], history
    assert browser.screenshot(tmp_path / "run.png").stat().st_size > 10_000


def test_the_runs_table_shows_and_filters_by_the_bottleneck(site, tmp_path):
    server, browser, _, _ = site
    wait_until(lambda: (run_of(server.url, "slows").get("bottleneck") or {}).get("phase") == "learning", 40, "slows is learner-bound")
    wait_until(lambda: (run_of(server.url, "turns").get("bottleneck") or {}).get("phase") == "env_step", 40, "turns is collector-bound")
    browser.goto(f"{server.url}/#token={TOKEN}")
    cells = browser.wait_for("document.querySelectorAll('#runs td.bottleneck[data-side]').length === 2 && "
                             "Object.fromEntries([...document.querySelectorAll('#runs tbody tr[data-run-id]')].map(r => "
                             "[r.dataset.runId, r.querySelector('td.bottleneck').textContent]))")  # fmt: skip
    assert cells["slows"] == "learner (learning)" and cells["turns"].startswith("collector (env step, "), cells
    options = browser.eval("[...document.querySelectorAll('#filter-bottleneck option')].map(o => o.value)")
    assert {"collector", "collector/env_step", "learner", "learner/learning"} <= set(options), options
    browser.goto(f"{server.url}/?bottleneck=collector")  # every collector-bound run of the sweep
    shown = browser.wait_for("[...document.querySelectorAll('#runs tbody tr[data-run-id]')].map(r => r.dataset.runId).join() || ''")
    assert shown == "turns"
    browser.goto(f"{server.url}/?bottleneck=learner/learning&group=sweep-1")
    shown = browser.wait_for("[...document.querySelectorAll('#runs tbody tr[data-run-id]')].map(r => r.dataset.runId).join() || ''")
    assert shown == "slows"
    browser.goto(f"{server.url}/?sort=bottleneck")  # by the verdict's text: "collector (...)" before "learner (...)"
    order = browser.wait_for("document.querySelectorAll('#runs tbody tr[data-run-id]').length === 2 && "
                             "[...document.querySelectorAll('#runs tbody tr[data-run-id]')].map(r => r.dataset.runId).join()")  # fmt: skip
    assert order == "turns,slows"
    listing = requests.get(f"{server.url}/api/v1/runs", params={"bottleneck": "collector/env_step"}, headers=AUTH, timeout=5).json()["runs"]
    assert [r["run_id"] for r in listing] == ["turns"] and listing[0]["bottleneck"]["source"] == "live"
    assert requests.get(f"{server.url}/api/v1/runs", params={"bottleneck": "/x"}, headers=AUTH, timeout=5).status_code == 400
    frame = otel_rl.read.runs(server.url, token=TOKEN).set_index("run_id")
    assert frame.loc["turns", "bottleneck_side"] == "collector" and frame.loc["slows", "bottleneck"] == "learner (learning)"
    browser.goto(f"{server.url}/compare?runs=slows,turns")
    side_by_side = browser.wait_for("document.querySelectorAll('#compare-bottlenecks tr[data-run-id]').length === 2 && "
                                    "[...document.querySelectorAll('#compare-bottlenecks tr[data-run-id] td.bottleneck')].map(c => c.dataset.side)")  # fmt: skip
    assert side_by_side == ["learner", "collector"]


def test_the_trace_verdict_replaces_the_live_one_and_says_whether_they_agree(site):
    server, browser, tmp, changing = site
    assert changing.wait(CHANGE_AT_S + AFTER_S + 60) == 0
    final = wait_until(lambda: (run_of(server.url, "slows").get("bottleneck") or {}).get("source") == "trace" and run_of(server.url, "slows")["bottleneck"],
                       90, "the trace's verdict reached the server")  # fmt: skip
    # The run changed regime (20 ms waits of 22, then 2 of 22): the trace's headline is its longest steady regime, the
    # learner-bound one after the change, which is what the live verdict said at the end: they agree, and it is said.
    assert final["text"] == "learner (learning)" and final["live"]["text"] == "learner (learning)"
    assert final["agrees"] is True and final["reconciled"] == "the trace agrees with the live verdict: learner (learning)"
    browser.goto(f"{server.url}/runs/slows")
    said = browser.wait_for("document.querySelector('#reconciled') && [document.querySelector('#verdict-now').textContent,"
                            " document.querySelector('#reconciled').textContent]")  # fmt: skip
    assert said[0] == "bottleneck (from the trace): learner (learning)" and said[1] == final["reconciled"]
