"""The run page as W&B and TensorBoard users read it, in a real headless Chromium against a real server.

A run of known values (a loss, an advantage that crosses zero, the learner's
timings in seconds, one event) backfilled into ``otel-rl serve``; the page
is read as a person would: the step and values under the cursor on every
chart at once, a zoom dragged on one chart applied to all, a search over the
key names, the event drawn at one x on every chart, y labels that fit, the
unit of seconds, a log scale that says what it leaves out, and a server that
restarts while the page is open.
"""

from __future__ import annotations

import time

import pytest
from browser import Browser
from ports import held_port

import otel_rl
from otel_rl.outputs.motrix.backfill import backfill
from otel_rl.readers.server import IngestServer

STEPS = 60


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cursor") / "cursor"
    tel = otel_rl.init(run_dir=folder, run_id="cursor", system_metrics_interval_s=0, quiet=True)
    with tel.run():
        for i in range(STEPS):
            with tel.iteration(i, env_steps=100 * (i + 1)):
                with tel.phase("learning"):
                    time.sleep(0.004)
                tel.scalars({"Loss/critic": 1.0 + i, "Train/advantage": i - 20.0, "System/rss_bytes": 1.16e9 + i * 1e6, **{f"Loss/extra_{k}": float(k) for k in range(4)}})
            if i == 30:
                tel.event("checkpoint_saved", path="ckpt-30.pt")
    tel.close()
    return folder


def test_the_cursor_zoom_search_events_and_labels_act_across_the_page(run_dir, tmp_path):
    with held_port() as port:  # the server stops and comes back on it: no other process can take it meanwhile
        _cursor_zoom_search_events_and_labels(run_dir, tmp_path, port)


def _cursor_zoom_search_events_and_labels(run_dir, tmp_path, port: int) -> None:
    database = str(tmp_path / "cursor.sqlite3")
    server = IngestServer(database, port=port, reuse_port=True).__enter__()
    browser = Browser(height=3200)  # every chart on screen: a chart is drawn when it scrolls into view
    try:
        assert backfill(run_dir, server.url)["rejected"] == 0
        browser.goto(f"{server.url}/runs/cursor")
        charts = ["Loss/critic", "Train/advantage", "Perf/iteration_time", "System/rss_bytes"]
        for key in charts:
            browser.wait_for(f"window.otelRl.charts[{key!r}] > 0")

        def plot(key: str) -> str:
            return f"document.querySelector('[data-key=\"{key}\"]')._plot"

        # The cursor over one chart: the same step on every chart, each with its value under it.
        over = browser.eval(f"(() => {{ const r = {plot('Loss/critic')}.over.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; }})()")
        x, y = over[0] + over[2] * 0.5, over[1] + over[3] * 0.5
        browser.send("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        index = browser.wait_for(f"{plot('Loss/critic')}.cursor.idx")
        assert browser.wait_for(f"{plot('Train/advantage')}.cursor.idx === {index}")
        legend = browser.eval(f"[...{plot('Loss/critic')}.root.querySelectorAll('.u-legend .u-value')].map(e => e.textContent)")
        step = browser.eval(f"{plot('Loss/critic')}.data[0][{index}]")
        assert legend[0] == f"{step:,.0f}" and browser.eval(f"{plot('Loss/critic')}.series[0].label") == "env steps"
        assert legend[1] == browser.eval(f"String(+({plot('Loss/critic')}.data[1][{index}]).toPrecision(3))"), legend
        # A zoom dragged on one chart zooms them all, and a refresh keeps it.
        browser.send("Input.dispatchMouseEvent", type="mousePressed", x=over[0] + over[2] * 0.25, y=y, button="left", clickCount=1)
        browser.send("Input.dispatchMouseEvent", type="mouseMoved", x=over[0] + over[2] * 0.6, y=y, button="left", buttons=1)
        browser.send("Input.dispatchMouseEvent", type="mouseReleased", x=over[0] + over[2] * 0.6, y=y, button="left", clickCount=1)
        zoom = browser.wait_for("window.otelRl.zoom")
        full = [browser.eval(f"{plot('Loss/critic')}.data[0][0]"), browser.eval(f"{plot('Loss/critic')}.data[0].at(-1)")]
        assert full[0] < zoom[0] < zoom[1] < full[1]
        for key in charts:
            assert browser.wait_for(f"(() => {{ const s = {plot(key)}.scales.x; return s.min === {zoom[0]} && s.max === {zoom[1]}; }})()"), key
        refreshes = browser.eval("window.otelRl.refreshes")
        browser.wait_for(f"window.otelRl.refreshes > {refreshes}", timeout_s=60)
        assert browser.eval(f"{plot('Train/advantage')}.scales.x.min") == zoom[0]
        browser.screenshot(tmp_path / "zoomed.png")
        browser.eval("document.querySelector('#reset-zoom').click()")
        assert browser.wait_for(f"{plot('Train/advantage')}.scales.x.min <= {full[0]}")
        # One event, one x on every chart.
        marks = {key: browser.eval(f"{plot(key)}._marks") for key in charts}
        assert len({tuple(m) for m in marks.values()}) == 1 and len(marks["Loss/critic"]) == 1, marks
        # Labels: seconds with their unit, bytes whole, the y axis as wide as its labels.
        ticks = browser.eval(f"{plot('Perf/iteration_time')}.axes[1]._values")
        assert ticks and all(t.endswith(("ms", " s", "µs")) for t in ticks), ticks  # never "13.5m" for 13.5 ms
        rss = browser.eval(f"{plot('System/rss_bytes')}.axes[1]._values")
        assert rss and all(t.endswith("GB") for t in rss), rss
        widths = browser.eval(f"""(() => {{ const u = {plot('System/rss_bytes')}; u.ctx.font = u.axes[1].font[0];
            return [u.axes[1]._size, Math.max(...u.axes[1]._values.map(v => u.ctx.measureText(v).width)) / devicePixelRatio]; }})()""")
        assert widths[0] >= widths[1] + 8, widths  # the widest label fits, with its ticks
        # A search over the key names.
        browser.eval("const s = document.querySelector('#key-search'); s.value = 'extra 3'; s.dispatchEvent(new Event('input'))")
        assert browser.eval("window.otelRl.shownCharts") == 1
        assert browser.eval("[...document.querySelectorAll('.chart[data-key]')].filter(c => !c.hidden).map(c => c.dataset.key)") == ["Loss/extra_3"]
        browser.eval("const t = document.querySelector('#key-search'); t.value = ''; t.dispatchEvent(new Event('input'))")
        # The log scale says what it leaves out.
        browser.goto(f"{server.url}/runs/cursor?log=1")
        note = browser.wait_for("document.querySelector('[data-key=\"Train/advantage\"] .log-note') && document.querySelector('[data-key=\"Train/advantage\"] .log-note').textContent")
        assert note == "21 values at or below 0 not shown on the log scale"
        assert browser.eval("document.querySelector('[data-key=\"Loss/critic\"] .log-note')") is None
        # The server restarts while the page is open: said, then mended, without a reload.
        server.__exit__(None, None, None)
        assert "Could not refresh" in browser.wait_for("document.querySelector('#refresh-status').textContent", timeout_s=60)
        server = IngestServer(database, port=port, reuse_port=True).__enter__()
        refreshes = browser.eval("window.otelRl.refreshes")
        browser.wait_for(f"window.otelRl.refreshes > {refreshes} && document.querySelector('#refresh-status').textContent === ''", timeout_s=60)
        assert browser.eval("window.otelRl.charts['Loss/critic']") > 0
        browser.screenshot(tmp_path / "recovered.png")
    finally:
        browser.close()
        server.__exit__(None, None, None)
