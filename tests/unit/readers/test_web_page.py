"""``otel-rl serve``'s web page in a real browser (headless Chromium), fed by real runs streaming to a real server.

Four runs reach the server: one finished, one failed, one killed by SIGKILL
and one still running. The tests read what a person would see: the rows and
their statuses, charts that drew points, a running run's page advancing,
two runs compared with their configuration difference, and the token prompt.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import requests
from browser import Browser
from locations import SUPPORT

from otel_rl.readers.server import IngestServer

TARGET = SUPPORT / "web_target.py"
TOKEN = "page-t0ken"


def start(url: str, run_id: str, mode: str, lr: float) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_", "WANDB_")) or k == "OTEL_RL_RUN_DIR"}
    env["MOTRIX_METRICS_TOKEN"] = TOKEN
    return subprocess.Popen([sys.executable, str(TARGET), url, run_id, mode, str(lr)], env=env)


def status_of(url: str, run_id: str) -> str | None:
    answer = requests.get(f"{url}/api/v1/runs/{run_id}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
    return answer.json()["run"]["status"] if answer.ok else None


def wait_status(url: str, run_id: str, wanted: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if status_of(url, run_id) == wanted:
            return
        time.sleep(0.2)
    raise TimeoutError(f"{run_id} is {status_of(url, run_id)}, not {wanted}")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A server holding four real runs, one of them still running; and a browser."""
    database = tmp_path_factory.mktemp("web") / "runs.sqlite3"
    with IngestServer(database, token=TOKEN) as server:
        finished = start(server.url, "sac-lr-3e-4", "finish", 3e-4)
        failed = start(server.url, "sac-lr-1e-2", "fail", 1e-2)
        killed = start(server.url, "sac-lr-1e-3", "forever", 1e-3)
        running = start(server.url, "sac-lr-5e-4", "forever", 5e-4)
        try:
            assert finished.wait(120) == 0 and failed.wait(120) == 1
            wait_status(server.url, "sac-lr-1e-3", "running")
            time.sleep(1.0)
            killed.send_signal(signal.SIGKILL)
            killed.wait(10)
            wait_status(server.url, "sac-lr-1e-3", "killed")  # the agent outlives its producer and ends the run
            wait_status(server.url, "sac-lr-5e-4", "running")
            browser = Browser()
            try:
                yield server, browser
            finally:
                browser.close()
        finally:
            running.kill()
            running.wait(10)
            wait_status(server.url, "sac-lr-5e-4", "killed")  # its agent delivered the end before the server stops


def signed_in(server: IngestServer, browser: Browser, path: str) -> None:
    browser.goto(f"{server.url}{path}#token={TOKEN}")


def test_the_runs_page_shows_every_run_with_its_status(site, tmp_path):
    server, browser = site
    signed_in(server, browser, "/")
    rows = browser.wait_for("document.querySelectorAll('#runs tbody tr[data-run-id]').length === 4 && "
                            "[...document.querySelectorAll('#runs tbody tr')].map(r => [r.dataset.runId, r.dataset.status])")  # fmt: skip
    assert dict(rows) == {"sac-lr-3e-4": "finished", "sac-lr-1e-2": "failed", "sac-lr-1e-3": "killed", "sac-lr-5e-4": "running"}
    assert browser.eval("location.hash") == ""  # the token left the address bar
    badges = browser.eval("[...document.querySelectorAll('#runs .status')].map(b => getComputedStyle(b).backgroundColor)")
    assert len(set(badges)) == 4  # each status visibly distinct
    failed_title = browser.eval("document.querySelector('tr[data-run-id=\"sac-lr-1e-2\"] .status').title")
    assert failed_title == "RuntimeError: CUDA error: out of memory"
    assert browser.screenshot(tmp_path / "runs.png").stat().st_size > 10_000
    # Two runs picked for comparison: the comparison page of exactly those.
    browser.eval("for (const id of ['sac-lr-3e-4', 'sac-lr-1e-2']) document.querySelector(`tr[data-run-id='${id}'] input`).click();"
                 "document.querySelector('#compare').click()")  # fmt: skip
    assert browser.wait_for("location.pathname === '/compare' && new URLSearchParams(location.search).get('runs')") == "sac-lr-3e-4,sac-lr-1e-2"
    # Filters are in the address: status, then text.
    browser.goto(f"{server.url}/?status=running,killed")
    shown = browser.wait_for("[...document.querySelectorAll('#runs tbody tr[data-run-id]')].map(r => r.dataset.runId).sort().join() || ''")
    assert shown == "sac-lr-1e-3,sac-lr-5e-4"
    browser.goto(f"{server.url}/?q=3e-4&cols=lr,batch_size")
    row = browser.wait_for("document.querySelector('#runs tbody tr[data-run-id]') && "
                           "[...document.querySelectorAll('#runs tbody tr[data-run-id] td')].map(c => c.textContent)")  # fmt: skip
    assert row[2] == "sac-lr-3e-4" and row[-2:] == ["0.0003", "256"]


def test_a_run_page_draws_a_chart_per_key_and_advances_while_the_run_runs(site, tmp_path):
    server, browser = site
    signed_in(server, browser, "/runs/sac-lr-5e-4")
    first = browser.wait_for("window.otelRl.charts['Loss/critic'] > 0 && window.otelRl.charts['Loss/critic']")
    families = browser.eval("[...document.querySelectorAll('.family')].map(f => f.dataset.family)")
    assert {"Loss/", "Train/", "Perf/"} <= set(families)
    assert browser.eval("document.querySelector('[data-key=\"Loss/critic\"] canvas') !== null")
    assert browser.wait_for("window.otelRl.charts['stack:learner'] > 0")  # Perf/* phase timings, stacked
    later = browser.wait_for(f"window.otelRl.charts['Loss/critic'] > {first} && window.otelRl.charts['Loss/critic']", 20)
    assert later > first  # live: new points without a reload
    assert browser.eval("document.querySelector('#config').textContent").count("batch_size") == 1
    assert "command" in browser.eval("document.querySelector('#provenance').textContent")
    browser.screenshot(tmp_path / "run.png")


def test_a_failed_run_shows_its_reason_and_events(site):
    server, browser = site
    signed_in(server, browser, "/runs/sac-lr-1e-2?x=step&smooth=0.6")
    assert browser.wait_for("document.querySelector('#reason') && document.querySelector('#reason').textContent") == (
        "RuntimeError: CUDA error: out of memory"
    )
    events = browser.wait_for("document.querySelector('#events') && document.querySelector('#events').textContent")
    assert "checkpoint_saved" in events
    assert browser.eval("document.querySelector('#axis').value") == "step" and browser.eval("document.querySelector('#smoothing').value") == "0.6"


def test_two_runs_compared_overlay_their_curves_and_show_the_configuration_difference(site, tmp_path):
    server, browser = site
    signed_in(server, browser, "/compare?runs=sac-lr-3e-4,sac-lr-1e-2")
    assert browser.wait_for("window.otelRl.charts['Train/mean_reward'] > 0")
    series = browser.eval("document.querySelector('[data-key=\"Train/mean_reward\"]')._plot.series.length")
    assert series == 3  # x and one line per run
    differs = browser.wait_for("[...document.querySelectorAll('#config-diff tr.differs')].map(r => r.dataset.setting)")
    same = browser.eval("[...document.querySelectorAll('#config-diff tr.same')].map(r => r.dataset.setting)")
    assert differs == ["lr"] and {"batch_size", "env.id"} <= set(same)
    holder = "document.querySelector('[data-key=\"Train/mean_reward\"]')"
    assert browser.eval(f"{holder}.dataset.marks") == "2"  # each run's checkpoint event, on its own curve
    browser.screenshot(tmp_path / "compare.png")
    # The x axis and smoothing, as on a run's page (and in the address).
    signed_in(server, browser, "/compare?runs=sac-lr-3e-4,sac-lr-1e-2&x=ts&smooth=0.5")
    assert browser.wait_for(f"window.otelRl.charts['Train/mean_reward'] > 0 && {holder}._plot.scales.x.time")
    assert browser.eval("document.querySelector('#smoothing-value').textContent") == "0.5"


def test_without_the_token_the_page_asks_for_it_and_shows_no_run(site):
    server, browser = site
    browser.eval("sessionStorage.removeItem('otel-rl-token')")
    browser.goto(server.url + "/")
    assert browser.wait_for("document.querySelector('#token-form') !== null")
    assert browser.eval("document.querySelector('#runs')") is None and "sac-lr" not in browser.eval("document.body.textContent")
    browser.eval(f"document.querySelector('#token-input').value = '{TOKEN}'; document.querySelector('#token-form').requestSubmit()")
    assert browser.wait_for("document.querySelectorAll('#runs tbody tr[data-run-id]').length") == 4


def test_a_server_without_a_token_warns_on_the_page(tmp_path):
    with IngestServer(tmp_path / "open.sqlite3") as server:
        browser = Browser()
        try:
            browser.goto(server.url + "/")
            warning = browser.wait_for("document.querySelector('#no-token') && document.querySelector('#no-token').textContent")
            assert warning.startswith("no token is configured")
        finally:
            browser.close()


def test_the_runs_table_sorts_and_shows_summary_columns_and_durations(site):
    """Sorted by a summary column both ways, the finished run's last and minimum Loss/critic as the API has them."""
    server, browser = site
    signed_in(server, browser, "/?sum=Loss/critic,Loss/critic:min&sort=-sum:Loss/critic")
    order = browser.wait_for("document.querySelectorAll('#runs tbody tr[data-run-id]').length === 4 && "
                             "[...document.querySelectorAll('#runs tbody tr[data-run-id]')].map(r => r.dataset.runId)")  # fmt: skip
    listing = {r["run_id"]: r for r in requests.get(server.url + "/api/v1/runs", params={"summary": "Loss/critic"},
                                                     headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).json()["runs"]}  # fmt: skip
    # Runs change while the page reads them (two are running): the order is checked against the values it shows.
    shown = browser.eval("[...document.querySelectorAll('#runs tbody tr[data-run-id]')].map(r => [r.dataset.runId, "
                         "[...r.querySelectorAll('td.summary')].map(c => c.textContent)])")  # fmt: skip
    lasts = [float(cells[0]) for _, cells in shown]
    assert lasts == sorted(lasts, reverse=True) and [run for run, _ in shown] == order
    finished = dict(shown)["sac-lr-3e-4"]
    summary = listing["sac-lr-3e-4"]["summary"]["Loss/critic"]
    assert float(finished[0]) == pytest.approx(summary["last"], rel=1e-3) and float(finished[1]) == pytest.approx(summary["min"], rel=1e-3)
    headers = browser.eval("[...document.querySelectorAll('#runs thead th')].map(h => h.textContent)")
    assert "duration" in headers and "Loss/critic ▼" in headers and "Loss/critic (min)" in headers
    browser.eval("document.querySelector('th[data-sort=\"run_id\"]').click()")
    ids = browser.wait_for("document.querySelector('th[data-sort=\"run_id\"]').textContent === 'run ▲' && "
                           "[...document.querySelectorAll('#runs tbody tr[data-run-id]')].map(r => r.dataset.runId)")  # fmt: skip
    assert ids == sorted(ids)


def test_a_run_chart_has_a_log_scale_the_raw_curve_behind_the_smoothed_one_and_units(site):
    server, browser = site
    signed_in(server, browser, "/runs/sac-lr-3e-4?smooth=0.8&log=1")
    assert browser.wait_for("window.otelRl.charts['Loss/critic'] > 0")
    holder = "document.querySelector('[data-key=\"Loss/critic\"]')"
    assert browser.eval(f"{holder}.dataset.log") == "1" and browser.eval(f"{holder}._plot.scales.y.distr") == 3
    assert browser.eval(f"{holder}.dataset.series") == "2"  # the raw curve and the smoothed one
    assert browser.eval(f"{holder}._plot.series[1].stroke()") .endswith("40")  # the raw one faint
    assert browser.eval("document.querySelector('#smoothing-value').textContent") == "0.8"
    assert browser.wait_for("document.querySelector('[data-key=\"Perf/learner_collector_wait_ms\"] .unit') && "
                            "document.querySelector('[data-key=\"Perf/learner_collector_wait_ms\"] .unit').textContent") == " (ms)"  # fmt: skip
    width = browser.eval(f"{holder}._plot.width")
    assert width >= browser.eval(f"{holder}.clientWidth") - 20  # as wide as its card
