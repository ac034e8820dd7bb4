"""The web page with runs of any shape: a thousand keys, keys named like an object's members, many events, a name of dots.

Real runs stream to a real server; headless Chromium reads what the page shows.
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

from otel_rl.readers.server import IngestServer

TARGET = SUPPORT / "wide_target.py"
TOKEN = "scale-t0ken"
RUNS = {"wide-1000": (1000, 20_000), "wide-120": (120, 0), "..": (10, 0)}
TRAPS = ["constructor", "toString", "__proto__", "hasOwnProperty"]
"""Keys another motrix.metrics/v1 client may send (otel-rl's own client namespaces them) that a plain JavaScript object already has."""


def post_traps(url: str) -> None:
    """A run from another client of the protocol, its keys and settings named like an object's own members."""
    base = {"run_id": "traps", "writer": "other-client:7"}
    records = [{**base, "seq": 1, "ts": time.time(), "kind": "run", "status": "running", "config": {"constructor": 1, "__proto__": {"x": 2}}}]
    for i in range(12):
        values = {key: float(i) for key in TRAPS}
        records.append({**base, "seq": 2 + i, "ts": time.time(), "kind": "scalars", "step": i, "axes": {"env_steps": 8 * i}, "values": values})
    records.append({**base, "seq": 20, "ts": time.time(), "kind": "run", "status": "finished"})
    answer = requests.post(f"{url}/api/v1/ingest", json={"protocol": "motrix.metrics/v1", "records": records},
                           headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)  # fmt: skip
    assert answer.json() == {"accepted": len(records), "duplicates": 0}


def stream(url: str, run_id: str, keys: int, events: int) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_", "WANDB_")) or k == "OTEL_RL_RUN_DIR"}
    env["MOTRIX_METRICS_TOKEN"] = TOKEN
    return subprocess.Popen([sys.executable, str(TARGET), url, run_id, str(keys), str(events)], env=env)


def finished(url: str, run_id: str) -> bool:
    answer = requests.get(f"{url}/api/v1/run", params={"run_id": run_id, "events": 0}, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
    return answer.ok and answer.json()["run"]["status"] == "finished"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    with IngestServer(tmp_path_factory.mktemp("scale") / "runs.sqlite3", token=TOKEN) as server:
        producers = [stream(server.url, run_id, keys, events) for run_id, (keys, events) in RUNS.items()]
        post_traps(server.url)
        assert [p.wait(300) for p in producers] == [0] * len(producers)
        deadline = time.monotonic() + 60
        while not all(finished(server.url, run_id) for run_id in RUNS) and time.monotonic() < deadline:
            time.sleep(0.2)
        browser = Browser()
        try:
            browser.goto(f"{server.url}/#token={TOKEN}")
            yield server, browser
        finally:
            browser.close()


def test_a_run_of_a_thousand_keys_opens_and_draws_its_charts_as_they_scroll_into_view(site, tmp_path):
    server, browser = site
    started = time.monotonic()
    browser.goto(f"{server.url}/runs/wide-1000")
    assert browser.wait_for("window.otelRl.charts['Metric/0000'] > 0 && document.querySelectorAll('.chart[data-key]').length", 20) >= 1000
    shown_s = time.monotonic() - started
    assert browser.eval("document.querySelector('.error')") is None
    drawn_first = browser.eval("Object.keys(window.otelRl.charts).length")
    assert 0 < drawn_first < 100  # only what is on screen was read and drawn
    browser.eval("document.querySelector('[data-key=\"Metric/0990\"]').scrollIntoView()")
    assert browser.wait_for("window.otelRl.charts['Metric/0990'] === 12", 20)
    events = browser.wait_for("document.querySelector('#events-section h2') && document.querySelector('#events-section h2').textContent")
    assert events == "Events (the newest 200 of 20,000)"
    assert browser.eval("document.querySelectorAll('#events tr').length") == 201
    browser.screenshot(tmp_path / "wide.png")
    print(f"1,000-key run page: first charts drawn {shown_s:.1f} s after it was opened, {drawn_first} charts read")


def test_keys_and_settings_named_like_an_objects_members_open(site):
    server, browser = site
    browser.goto(f"{server.url}/runs/traps")
    for trap in TRAPS:
        assert browser.wait_for(f"document.querySelector('[data-key=\"{trap}\"]') !== null", 20)  # the page draws its cards as it reads
        browser.eval(f"document.querySelector('[data-key=\"{trap}\"]').scrollIntoView()")
        assert browser.wait_for(f"window.otelRl.charts[{trap!r}] === 12", 20)
    assert browser.eval("document.querySelector('.error')") is None
    config = browser.eval("document.querySelector('#config').textContent")
    assert "constructor" in config and "__proto__.x" in config
    browser.goto(f"{server.url}/compare?runs=traps,wide-120")
    assert browser.wait_for("document.querySelector('[data-key=\"constructor\"]') !== null", 20)
    browser.eval("document.querySelector('[data-key=\"constructor\"]').scrollIntoView()")
    assert browser.wait_for("window.otelRl.charts['constructor'] > 0", 20)
    assert browser.eval("document.querySelector('.error')") is None


def test_a_run_of_more_than_fifty_keys_compares_with_another(site):
    server, browser = site
    browser.goto(f"{server.url}/compare?runs=wide-120,wide-1000,no-such-run")
    assert browser.wait_for("window.otelRl.charts['Metric/0000'] > 0 && document.querySelector('#missing-runs') !== null", 20)
    assert "no-such-run" in browser.eval("document.querySelector('#missing-runs').textContent")
    assert browser.eval("document.querySelector('[data-key=\"Metric/0000\"]')._plot.series.length") == 3
    assert browser.eval("document.querySelectorAll('#config-diff th .swatch').length") == 2


def test_a_run_named_dot_dot_opens_from_the_runs_page(site):
    server, browser = site
    browser.goto(f"{server.url}/")
    href = browser.wait_for("document.querySelector('tr[data-run-id=\"..\"] a') && document.querySelector('tr[data-run-id=\"..\"] a').getAttribute('href')")
    browser.goto(server.url + href)
    assert browser.wait_for("document.querySelector('#run-header h1') && document.querySelector('#run-header h1').textContent", 20).startswith("..")
    assert browser.wait_for("window.otelRl.charts['Metric/0000'] > 0", 20)


def test_a_token_link_pasted_into_an_open_tab_signs_it_in(site):
    server, browser = site
    browser.eval("sessionStorage.removeItem('otel-rl-token')")
    browser.goto(f"{server.url}/")
    assert browser.wait_for("document.querySelector('#token-form') !== null")
    browser.eval(f"location.hash = 'token={TOKEN}'")
    assert browser.wait_for("document.querySelectorAll('#runs tbody tr[data-run-id]').length", 20) == len(RUNS) + 1
    assert browser.eval("location.hash") == ""


def test_thousands_of_runs_are_read_a_page_at_a_time_newest_first(tmp_path):
    """2,500 runs: the page shows the newest 100 at once and pages back through the others; the API's listing is one query."""
    from otel_rl.readers.server.backends import open_storage
    from otel_rl.readers.server.storage import Row

    location = tmp_path / "many.sqlite3"
    storage = open_storage(location)
    rows = []
    for r in range(2500):
        record = {"run_id": f"run-{r:05d}", "writer": f"w{r}", "seq": 1, "ts": 1.7e9 + r, "kind": "run", "status": "finished",
                  "project": f"p{r % 3}", "group": None, "meta": {}}  # fmt: skip
        rows.append(Row.of(record, __import__("json").dumps(record)))
    for start in range(0, len(rows), 500):
        storage.ingest(rows[start : start + 500], now=1.7e9 + start)
    storage.close()
    with IngestServer(location) as server:
        browser = Browser()
        try:
            browser.goto(f"{server.url}/")
            first = browser.wait_for("document.querySelectorAll('#runs tbody tr[data-run-id]').length === 100 && "
                                     "[...document.querySelectorAll('#runs tbody tr[data-run-id]')].map(r => r.dataset.runId)")  # fmt: skip
            assert first[0] == "run-02499" and set(first) == {f"run-{r:05d}" for r in range(2400, 2500)}
            assert browser.eval("[...document.querySelectorAll('#filter-project option')].map(o => o.value)") == ["", "p0", "p1", "p2"]
            browser.eval("document.querySelector('#older').click()")
            second = browser.wait_for("new URLSearchParams(location.search).get('after') === 'run-02400' && "
                                      "document.querySelector('#runs tbody tr[data-run-id]').dataset.runId === 'run-02399' && "
                                      "[...document.querySelectorAll('#runs tbody tr[data-run-id]')].map(r => r.dataset.runId)")  # fmt: skip
            assert set(second) == {f"run-{r:05d}" for r in range(2300, 2400)}
            browser.eval("document.querySelector('#newest').click()")
            assert browser.wait_for("document.querySelector('#runs tbody tr[data-run-id]').dataset.runId === 'run-02499' && !location.search.includes('after')")
        finally:
            browser.close()


def test_a_distribution_is_one_band_chart(tmp_path):
    """tel.distribution() of a real run: one chart with min-max and p05-p95 bands around the mean, not nine line charts."""
    import numpy as np

    import otel_rl

    with IngestServer(tmp_path / "bands.sqlite3") as server:
        tel = otel_rl.init(run_id="bands", motrix_url=server.url, system_metrics_interval_s=0, quiet=True)
        rng = np.random.default_rng(0)
        with tel.run():
            for i in range(40):
                with tel.iteration(i, env_steps=8 * (i + 1)):
                    tel.distribution("Policy/action", rng.normal(i / 10, 1.0, 256))
        tel.close()
        browser = Browser()
        try:
            browser.goto(f"{server.url}/runs/bands")
            assert browser.wait_for("window.otelRl.charts['dist:Policy/action'] > 0")
            holder = "document.querySelector('[data-key=\"dist:Policy/action\"]')"
            assert browser.eval(f"{holder}.dataset.series") == "5" and browser.eval(f"{holder}._plot.bands.length") == 2
            assert browser.eval("[...document.querySelectorAll('[data-key^=\"Policy/action/\"]')].length") == 0
            means = browser.eval(f"{holder}._plot.data[3]")
            assert len(means) == 40 and means[-1] > means[0]  # the mean drifts up as the loop made it
        finally:
            browser.close()
