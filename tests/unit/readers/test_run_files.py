"""A run's trace and diagnosis on the server: sent by ``otel-rl backfill``, downloaded as they were, bad ones refused alone."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest
import requests
from verdicts import finding

import otel_rl
from otel_rl.readers.analysis import analyze
from otel_rl.readers.server import IngestServer

TOKEN = "files-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("runs") / "traced"
    tel = otel_rl.init(run_dir=run_dir, run_id="traced", system_metrics_interval_s=0, quiet=True)
    with tel.run():
        for i in range(30):
            with tel.iteration(i, env_steps=8 * (i + 1)):
                with tel.phase("collector_wait"):
                    time.sleep(0.001)
                with tel.phase("learning"):
                    time.sleep(0.02)  # twenty times the wait: learning-bound on a busy machine too (a sleep overshoots by ms there)
            tel.scalars({"Loss/value": 1.0 / (i + 1)})
    tel.close()
    return run_dir


def test_backfill_sends_the_trace_and_the_diagnosis(run_dir, database):
    with IngestServer(database, token=TOKEN) as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
        env["MOTRIX_METRICS_TOKEN"] = TOKEN
        result = subprocess.run([sys.executable, "-m", "otel_rl.cli", "backfill", str(run_dir), "--url", server.url],
                                capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert "sent the trace (" in result.stdout and "bottleneck: learner (learning" in result.stdout
        trace = requests.get(server.url + "/api/v1/runs/traced/trace", headers=AUTH, timeout=30)
        assert trace.status_code == 200 and trace.content == (run_dir / "trace.perfetto-trace").read_bytes()
        assert trace.headers["Content-Disposition"] == 'attachment; filename="traced.perfetto-trace"'
        diagnosis = requests.get(server.url + "/api/v1/runs/traced/diagnosis", headers=AUTH, timeout=30).json()
        local = analyze(run_dir, engine="python")
        assert diagnosis["diagnosis"]["bottleneck"] == local.diagnosis.bottleneck
        assert diagnosis["timelines"]["learner"]["cycles"] == 30
        assert requests.get(server.url + "/api/v1/runs/traced/trace", timeout=30).status_code == 401  # the token, as everywhere


def test_bad_uploads_cost_only_their_request(run_dir, tmp_path):
    with IngestServer(str(tmp_path / "files.sqlite3"), max_trace_bytes=1000) as server:
        subprocess.run([sys.executable, "-m", "otel_rl.cli", "backfill", str(run_dir), "--url", server.url], capture_output=True, timeout=120)
        url = server.url + "/api/v1/runs/traced"
        big = requests.put(url + "/trace", data=b"x" * 5000, timeout=30)
        assert big.status_code == 413
        bomb = requests.put(url + "/trace", data=gzip.compress(b"\0" * 100_000), headers={"Content-Encoding": "gzip"}, timeout=30)
        assert bomb.status_code == 413  # inflated within the same bound
        assert requests.put(url + "/trace", data=b"not gzip", headers={"Content-Encoding": "gzip"}, timeout=30).status_code == 400
        wrong = requests.put(url + "/diagnosis", data=json.dumps({"bottleneck": "x"}), timeout=30)
        assert wrong.status_code == 400 and wrong.json()["field"] == "body"
        kept = requests.get(url + "/diagnosis", timeout=30).content
        odd = {"diagnosis": {"bottleneck": "x", "findings": []}, "timelines": {"learner": 3}}
        empty = {"diagnosis": {"bottleneck": "x", "findings": []}, "timelines": {}}
        broken = {"diagnosis": {"bottleneck": "x", "findings": []}, "timelines": {"learner": {"cycles": 3, "cycle_ms": {}, "phases": {"x": 1}}}}
        wall = {"wall_s": 1.0}
        odd, empty, broken = ({**wall, **bad} for bad in (odd, empty, broken))
        untyped = {**odd, "timelines": {"learner": {"cycles": "3", "cycle_ms": None, "phases": {}}}}
        for bad, says in ((odd, "report.timelines['learner']: expected an object, got int"), (empty, "no timeline"),
                          (broken, "report.timelines['learner'].cycle_ms.count: missing"),
                          (untyped, "report.timelines['learner'].cycles: expected an integer, got a text"),
                          ({"bottleneck": "x"}, "report.wall_s: missing")):  # fmt: skip
            answer = requests.put(url + "/diagnosis", data=json.dumps(bad), timeout=30)
            assert answer.status_code == 400 and says in answer.json()["error"], answer.text
        deep = requests.put(url + "/diagnosis", data=b"[" * 100_000 + b"]" * 100_000, timeout=30)
        assert deep.status_code == 400 and "nested too deeply" in deep.json()["error"], deep.text
        nan = json.loads(kept)
        nan["wall_s"] = float("nan")  # json.dumps writes NaN: JSON no browser parses
        answer = requests.put(url + "/diagnosis", data=json.dumps(nan), timeout=30)
        assert answer.status_code == 400 and "NaN is not a JSON number" in answer.json()["error"], answer.text
        assert requests.get(url + "/diagnosis", timeout=30).content == kept  # a refused one replaces nothing
        compared = requests.get(server.url + "/api/v1/compare", params={"runs": "traced,traced"}, timeout=30)
        assert compared.status_code == 400  # one run twice is one run
        valid = b"\x0a\x03abc"  # a trace of one packet
        truncated = gzip.compress(valid * 50)[:-12]
        cut = requests.put(url + "/trace", data=truncated, headers={"Content-Encoding": "gzip"}, timeout=30)
        assert cut.status_code == 400 and "truncated" in cut.json()["error"]
        short = requests.put(url + "/trace", data=valid * 10 + b"\x0a\x7fabc", timeout=30)
        assert short.status_code == 400 and "cut short" in short.json()["error"]
        other = requests.put(url + "/trace", data=b"<html>login</html>", timeout=30)
        assert other.status_code == 400 and "not a Perfetto trace" in other.json()["error"]
        assert requests.put(server.url + "/api/v1/runs/nobody/trace", data=valid, timeout=30).status_code == 404
        assert requests.get(server.url + "/api/v1/runs/nobody/diagnosis", timeout=30).status_code == 404
        packet = b"\x0a\xf1\x03" + b"t" * 497  # one packet of 497 bytes
        small = requests.put(url + "/trace", data=packet, timeout=30)
        assert small.status_code == 200 and requests.get(url + "/trace", timeout=30).content == packet  # the server goes on
        assert requests.get(server.url + "/healthz", timeout=30).status_code == 200


@contextmanager
def backfilled_page(run_dir, database):
    """A server with the run backfilled (records, trace, diagnosis) and a browser; the page signed in later by #token=."""
    from browser import Browser

    with IngestServer(database, token=TOKEN) as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
        env["MOTRIX_METRICS_TOKEN"] = TOKEN
        subprocess.run([sys.executable, "-m", "otel_rl.cli", "backfill", str(run_dir), "--url", server.url], check=True, timeout=120, env=env)
        browser = Browser()
        try:
            yield server, browser
        finally:
            browser.close()


def test_the_run_page_shows_the_diagnosis_and_hands_over_the_trace(run_dir, tmp_path):
    with backfilled_page(run_dir, str(tmp_path / "page.sqlite3")) as (server, browser):
        browser.goto(f"{server.url}/runs/traced#token={TOKEN}")
        verdict = browser.wait_for("document.querySelector('#verdict') && document.querySelector('#verdict').textContent")
        assert verdict == "bottleneck: " + analyze(run_dir, engine="python").diagnosis.bottleneck
        phases = browser.eval("[...document.querySelectorAll('table.phases[data-timeline=\"learner\"] tr td:first-child')].map(c => c.textContent)")
        assert {"Learning", "Collector Wait", "Other"} <= set(phases)
        browser.eval("document.querySelector('#trace-download').click()")
        size = browser.wait_for("window.otelRl.traceBytes")
        assert size == (run_dir / "trace.perfetto-trace").stat().st_size
        assert browser.screenshot(tmp_path / "diagnosis.png").stat().st_size > 10_000


def a_loop(run_dir, run_id: str, learning_s: float) -> None:
    tel = otel_rl.init(run_dir=run_dir, run_id=run_id, system_metrics_interval_s=0, quiet=True)
    with tel.run(config={"learning_s": learning_s}):
        for i in range(60):
            with tel.iteration(i, env_steps=8 * (i + 1)):
                with tel.phase("collector_wait"):
                    time.sleep(0.001)
                with tel.phase("learning"):
                    time.sleep(learning_s)
            tel.distribution("Train/advantage", [float(i + k) for k in range(-5, 6)])
            if i == 30:
                tel.event("checkpoint_saved", path="ckpt.pt")
    tel.close()


def test_the_compare_page_says_what_changed(tmp_path):
    """Learning 2 -> 6 ms: the verdict of analyze --compare on the page, from the diagnoses on the server."""
    from browser import Browser

    a_loop(tmp_path / "fast", "fast", 0.002)
    a_loop(tmp_path / "slow", "slow", 0.006)
    with IngestServer(str(tmp_path / "compare.sqlite3")) as server:
        for name in ("fast", "slow"):
            subprocess.run([sys.executable, "-m", "otel_rl.cli", "backfill", str(tmp_path / name), "--url", server.url], check=True, timeout=120)
        answer = requests.get(server.url + "/api/v1/compare", params={"runs": "fast,slow,ghost"}, timeout=30).json()
        assert answer["missing"] == ["ghost"] and finding(answer["comparisons"]["slow"]["verdict"]).startswith("Learning +")
        assert requests.get(server.url + "/api/v1/compare", params={"runs": "fast"}, timeout=30).status_code == 400
        browser = Browser()
        try:
            browser.goto(f"{server.url}/compare?runs=fast,slow")
            line = browser.wait_for("document.querySelector('#compare-verdicts li') && document.querySelector('#compare-verdicts li').textContent")
            assert line.startswith("slow against fast: Learning +") and "the learner got slower" in line
            # Which run is the baseline, said where the runs are named.
            assert "the baseline, fast" in browser.eval("document.querySelector('#baseline').textContent")
            assert browser.wait_for("document.querySelector('#config-diff th.baseline') && document.querySelector('#config-diff th.baseline').textContent").startswith("fast (baseline)")
            # The per-phase table behind the verdict: Learning 2 -> 6 ms, the largest move of the wall time first.
            rows = browser.eval("[...document.querySelectorAll('details.phase-changes[data-run-id=\"slow\"] table[data-timeline=\"learner\"] tr[data-phase]')]"
                                ".map(r => [r.dataset.phase, ...[...r.cells].map(c => c.textContent)])")
            assert rows[0][0] == "learning" and rows[0][1] == "Learning", rows
            before, after = (float(v) for v in rows[0][2].split(" ms")[0].split(" -> "))
            # The page shows the server's comparison (as it rounds), whatever the sleeps took on this machine.
            expected = answer["comparisons"]["slow"]["timelines"]["learner"]["phases"]["learning"]["mean_ms"]
            assert before == pytest.approx(expected[0], rel=0.01, abs=0.01) and after == pytest.approx(expected[1], rel=0.01, abs=0.01), (rows[0], expected)
            assert before < after
            # A distribution is one chart of each run's mean, not a chart per statistic; each run's event in its own colour.
            assert browser.wait_for("window.otelRl.charts['dist:Train/advantage'] > 0")
            assert browser.eval("document.querySelectorAll('[data-key^=\"Train/advantage/\"]').length") == 0
            marks = browser.wait_for("(() => { const p = document.querySelector('[data-key=\"dist:Train/advantage\"]')._plot; return p._marks.length === 2 && p._marks; })()")
            assert len({m["color"] for m in marks}) == 2
            labels = browser.eval("document.querySelector('[data-key=\"dist:Train/advantage\"]')._plot.series.slice(1).map(s => s.label)")
            assert labels == ["fast (baseline)", "slow"]
            browser.screenshot(tmp_path / "compare.png")
        finally:
            browser.close()


def test_a_run_streaming_to_the_server_sends_its_trace_when_it_ends(tmp_path):
    """No backfill: the agent starts the upload once the run's outputs are closed, and training does not wait for it."""
    with IngestServer(str(tmp_path / "live.sqlite3"), token=TOKEN) as server:
        tel = otel_rl.init(run_dir=tmp_path / "live", run_id="live", motrix_url=server.url, motrix_token=TOKEN, system_metrics_interval_s=0, quiet=True)
        with tel.run():
            for i in range(20):
                with tel.iteration(i, env_steps=i + 1):
                    with tel.phase("learning"):
                        time.sleep(0.002)
        started = time.monotonic()
        tel.close()
        assert time.monotonic() - started < 10
        deadline = time.monotonic() + 60
        while (answer := requests.get(server.url + "/api/v1/runs/live/diagnosis", headers=AUTH, timeout=30)).status_code == 404:
            assert time.monotonic() < deadline, answer.text
            time.sleep(0.2)
        assert answer.json()["timelines"]["learner"]["cycles"] == 20
        trace = requests.get(server.url + "/api/v1/runs/live/trace", headers=AUTH, timeout=30).content
        assert trace == (tmp_path / "live" / "trace.perfetto-trace").read_bytes()


def test_a_run_is_tagged_noted_and_deleted_from_its_page(run_dir, tmp_path):
    with backfilled_page(run_dir, str(tmp_path / "edits.sqlite3")) as (server, browser):
        browser.goto(f"{server.url}/runs/traced#token={TOKEN}")
        browser.wait_for("document.querySelector('#tags') !== null")
        browser.eval("document.querySelector('#tags').value = 'baseline, pendulum'; document.querySelector('#note').value = 'the reference';"
                     "document.querySelector('#save-edits').click()")  # fmt: skip
        assert browser.wait_for("document.querySelector('#edit-status').textContent") == "saved"
        run = requests.get(server.url + "/api/v1/runs/traced", headers=AUTH, timeout=10).json()["run"]
        assert run["tags"] == ["baseline", "pendulum"] and run["note"] == "the reference"
        browser.goto(f"{server.url}/")
        tags = browser.wait_for("document.querySelector('#runs a.tag') && [...document.querySelectorAll('#runs a.tag')].map(a => a.textContent)")
        assert tags == ["baseline", "pendulum"]
        browser.goto(f"{server.url}/runs/traced")
        browser.wait_for("document.querySelector('#export-csv') !== null")
        browser.eval("document.querySelector('#export-csv').click()")
        got = browser.wait_for("window.otelRl.downloaded && window.otelRl.downloaded.name === 'traced.csv' && window.otelRl.downloaded.bytes")
        csv = requests.get(server.url + "/api/v1/runs/traced/export", params={"format": "csv"}, headers=AUTH, timeout=10).content
        assert got == len(csv) and csv.startswith(b"seq,ts,step,env_steps,")
        browser.eval("window.confirm = () => false; document.querySelector('#delete-run').click()")  # asked, and declined
        time.sleep(0.5)
        assert requests.get(server.url + "/api/v1/runs/traced", headers=AUTH, timeout=10).status_code == 200
        browser.eval("window.confirm = () => true; document.querySelector('#delete-run').click()")
        assert browser.wait_for("location.pathname === '/' && document.querySelector('#runs tbody td.muted') !== null")
        assert requests.get(server.url + "/api/v1/runs/traced", headers=AUTH, timeout=10).status_code == 404


def test_the_trace_upload_retries_a_restarting_server_and_says_what_failed_in_the_run_folder(run_dir, tmp_path):
    """The upload a run's agent starts detached: a server down for a few seconds gets it; a login page or a rotated token is a failure
    said by the exit status and in the run's trace_upload.json, never "sent"."""
    import threading

    from fault_servers import HtmlPage
    from ports import held_port

    def send(url: str, token: str | None = None) -> subprocess.CompletedProcess:
        # A retry window of 10 minutes, a run of 3 at most: an answer that is retried cannot pass for one that is not.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
        if token:
            env["MOTRIX_METRICS_TOKEN"] = token
        return subprocess.run([sys.executable, "-m", "otel_rl.cli", "backfill", str(run_dir), "--url", url, "--trace-only", "--retry-window", "600"],
                              capture_output=True, text=True, timeout=180, env=env)  # fmt: skip

    def outcome() -> dict:
        return json.loads((run_dir / "trace_upload.json").read_text())

    page = HtmlPage()
    try:
        result = send(page.url)
    finally:
        page.stop()
    assert result.returncode == 1 and "sent the trace" not in result.stdout and "login page" in result.stderr
    assert outcome()["sent"] is False and "login page" in outcome()["error"]

    with IngestServer(str(tmp_path / "rotated.sqlite3"), token=TOKEN) as server:
        subprocess.run([sys.executable, "-m", "otel_rl.cli", "backfill", str(run_dir), "--url", server.url], env={**os.environ, "MOTRIX_METRICS_TOKEN": TOKEN},
                       capture_output=True, timeout=120, check=True)  # fmt: skip  (the records, with the token of the time)
        rotated = send(server.url, "the-old-token")  # returns within the run's 3 minutes: refused, not retried
        assert rotated.returncode == 1 and "401" in rotated.stderr
        assert outcome()["sent"] is False and "401" in outcome()["error"]

    with held_port() as port:  # a port to come back on, refusing meanwhile, that no other process can take
        restarted: list[IngestServer] = []
        database = str(tmp_path / "restarted.sqlite3")
        with IngestServer(database, port=port, reuse_port=True) as first:  # the run is known to the server
            subprocess.run([sys.executable, "-m", "otel_rl.cli", "backfill", str(run_dir), "--url", first.url], capture_output=True, timeout=120, check=True)
        timer = threading.Timer(3.0, lambda: restarted.append(IngestServer(database, port=port, reuse_port=True).__enter__()))
        timer.start()
        try:
            result = send(f"http://127.0.0.1:{port}")
            assert result.returncode == 0, result.stderr
            assert "sent the trace" in result.stdout and outcome()["sent"] is True
            stored = requests.get(f"http://127.0.0.1:{port}/api/v1/runs/traced/trace", timeout=30).content
            assert stored == (run_dir / "trace.perfetto-trace").read_bytes()
        finally:
            timer.join()
            for server in restarted:
                server.__exit__(None, None, None)


def test_a_trace_the_server_refuses_does_not_cost_its_diagnosis(run_dir, tmp_path):
    """A trace over the server's limit (413): the diagnosis, which is small, is sent on its own, and both are said."""
    import shutil

    folder = tmp_path / "traced"
    shutil.copytree(run_dir, folder)
    with IngestServer(str(tmp_path / "limited.sqlite3"), max_trace_bytes=1000) as server:
        subprocess.run([sys.executable, "-m", "otel_rl.cli", "backfill", str(folder), "--url", server.url, "--retry-window", "0"],
                       capture_output=True, timeout=120)  # fmt: skip  (the records, and a first refusal)
        (folder / "trace_upload.json").unlink()
        result = subprocess.run([sys.executable, "-m", "otel_rl.cli", "backfill", str(folder), "--url", server.url, "--trace-only"],
                                capture_output=True, text=True, timeout=120)  # fmt: skip
        assert result.returncode == 1 and "the trace is not sent (its diagnosis is)" in result.stderr and "413" in result.stderr
        diagnosis = requests.get(server.url + "/api/v1/runs/traced/diagnosis", timeout=30)
        assert diagnosis.status_code == 200 and diagnosis.json()["timelines"]["learner"]["cycles"] == 30
        assert requests.get(server.url + "/api/v1/runs/traced/trace", timeout=30).status_code == 404
    outcome = json.loads((folder / "trace_upload.json").read_text())
    assert outcome["sent"] is False and outcome["diagnosis_sent"] is True and "413" in outcome["error"]


def test_an_upload_outcome_that_cannot_be_written_is_said_and_never_left_in_part(run_dir, small_disk):
    """A full disk: no trace_upload.json of 0 bytes (nor a temporary file); the outcome is said where the command runs."""
    import shutil

    folder = small_disk / "traced"
    folder.mkdir()
    for name in ("metrics.jsonl", "trace.perfetto-trace", "run_config.json"):
        shutil.copy(run_dir / name, folder / name)
    with open(small_disk / "filler", "wb", buffering=0) as fill:  # the disk fills up
        try:
            while True:
                fill.write(b"\0" * 4096)
        except OSError:
            pass
    with IngestServer(str(small_disk.parent / "full.sqlite3")) as server:  # the records, then the trace
        result = subprocess.run([sys.executable, "-m", "otel_rl.cli", "backfill", str(folder), "--url", server.url],
                                capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0 and "sent the trace" in result.stdout, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "trace_upload.json" in line]
    assert line == f"otel-rl backfill: could not write {folder / 'trace_upload.json'} (No space left on device); the outcome is only in this output"
    assert sorted(p.name for p in folder.iterdir()) == ["metrics.jsonl", "run_config.json", "trace.perfetto-trace"]


def test_a_server_that_trickles_its_answer_cannot_hold_the_trace_upload(run_dir):
    """A byte every 0.3 s is never a read timeout: the upload's requests are bounded whole, and retried within the window."""
    from fault_servers import TrickleServer

    from otel_rl.readers.run_upload import UploadError, upload

    server = TrickleServer(every_s=0.3)
    began = time.monotonic()
    try:
        with pytest.raises(UploadError, match="within 2.0 s"):
            upload(run_dir, server.url, None, timeout_s=2.0, retry_window_s=3.0)
    finally:
        server.stop()
    assert time.monotonic() - began < 30  # each request 2 s at most, tried again within the 3 s window (a trickle took 27 s a request)
    assert server.requests >= 2


def test_a_server_that_keeps_failing_the_trace_still_gets_the_diagnosis_and_the_folder_says_so(run_dir, tmp_path):
    """A 500 on every trace upload, past the retry window (a proxy before a real server): the diagnosis is sent, and said."""
    import http.server
    import shutil
    import threading

    folder = tmp_path / "traced"
    shutil.copytree(run_dir, folder)
    with IngestServer(str(tmp_path / "behind.sqlite3")) as server:

        class Failing(http.server.BaseHTTPRequestHandler):
            def do_PUT(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if "/trace" in self.path:
                    self.send_response(500)
                    self.end_headers()
                    self.wfile.write(b"Internal Server Error")
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                answer = requests.put(server.url + self.path, data=body, headers=headers, timeout=30)
                self.send_response(answer.status_code)
                self.send_header("Content-Type", answer.headers.get("Content-Type", "application/json"))
                self.end_headers()
                self.wfile.write(answer.content)

            do_POST = do_PUT

            def log_message(self, *args):
                pass

        proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Failing)
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        try:
            url = f"http://127.0.0.1:{proxy.server_address[1]}"
            subprocess.run([sys.executable, "-m", "otel_rl.cli", "backfill", str(folder), "--url", server.url, "--retry-window", "0"],
                           capture_output=True, timeout=120)  # fmt: skip  (the records, straight to the server)
            (folder / "trace_upload.json").unlink(missing_ok=True)
            # A window of 60 s: the diagnosis is in, and the folder says so, long before the trace's tries end.
            trying = subprocess.Popen([sys.executable, "-m", "otel_rl.cli", "backfill", str(folder), "--url", url, "--trace-only",
                                       "--retry-window", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
            deadline = time.monotonic() + 40
            while requests.get(server.url + "/api/v1/runs/traced/diagnosis", timeout=30).status_code != 200:
                assert time.monotonic() < deadline and trying.poll() is None, "the diagnosis waited for the trace"
                time.sleep(0.2)
            while not (folder / "trace_upload.json").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            interim = json.loads((folder / "trace_upload.json").read_text())
            assert trying.poll() is None and interim["diagnosis_sent"] is True and "being sent" in interim["trace"]
            trying.kill()
            trying.wait()
            result = subprocess.run([sys.executable, "-m", "otel_rl.cli", "backfill", str(folder), "--url", url, "--trace-only",
                                     "--retry-window", "2"], capture_output=True, text=True, timeout=120)  # fmt: skip
        finally:
            proxy.shutdown()
        assert result.returncode == 1 and "the trace is not sent (its diagnosis is)" in result.stderr and "500" in result.stderr, result.stderr
        diagnosis = requests.get(server.url + "/api/v1/runs/traced/diagnosis", timeout=30)
        assert diagnosis.status_code == 200 and diagnosis.json()["timelines"]["learner"]["cycles"] == 30
    outcome = json.loads((folder / "trace_upload.json").read_text())
    assert outcome["sent"] is False and outcome["diagnosis_sent"] is True and "500" in outcome["error"]
