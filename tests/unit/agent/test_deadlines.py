"""One deadline across the process boundary: the agent closes the outputs within the producer's deadline.

A live-metrics service that never answers holds the HTTP sender as long as it
is allowed to; the configured shutdown deadline is 60 s, so a run whose agent
is done within a few seconds shows that the shorter deadline of ``close()``
(or of a second SIGTERM) reached the agent.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from fault_servers import SilentServer

import otel_rl
from otel_rl.agent import directory as agents

CONFIGURED_S = 60.0


def segments_of(run_id: str) -> list[Path]:
    return list(agents.segment_dir().glob(f"*/{run_id}-*.seg"))


def wait_until_served(run_id: str, timeout_s: float) -> float:
    """Seconds until the agent removed the run's segment (it had closed every output)."""
    start = time.monotonic()
    while segments_of(run_id):
        assert time.monotonic() - start < timeout_s, "the agent is still closing the outputs"
        time.sleep(0.05)
    return time.monotonic() - start


def test_close_with_a_short_timeout_bounds_the_agents_flush(tmp_path):
    silent = SilentServer()
    try:
        tel = otel_rl.init(run_dir=tmp_path / "short-close", jsonl=True, motrix_url=silent.url,
                           shutdown_timeout_s=CONFIGURED_S, system_metrics_interval_s=0)  # fmt: skip
        with tel.run():
            for i in range(100):
                tel.scalars({"Loss/critic": float(i)})
        time.sleep(1.0)  # the agent is serving
        started = time.monotonic()
        tel.close(timeout_s=1.0)
        wait_until_served(tel.run_id, timeout_s=CONFIGURED_S / 4)
        assert time.monotonic() - started < CONFIGURED_S / 4
    finally:
        silent.stop()
    found = [json.loads(line) for line in (tmp_path / "short-close" / "metrics.jsonl").read_text().splitlines()]
    assert [r["status"] for r in found if r["kind"] == "run"] == ["pending", "running", "finished"]
    assert len([r for r in found if r["kind"] == "scalars" and "Loss/critic" in r["values"]]) == 100


def test_a_second_sigterm_hurries_the_agent_too(tmp_path):
    silent = SilentServer()
    run_dir = tmp_path / "hurried"
    script = textwrap.dedent(f'''
        import sys, time, otel_rl
        tel = otel_rl.init(run_dir={str(run_dir)!r}, jsonl=True, motrix_url={silent.url!r},
                           shutdown_timeout_s={CONFIGURED_S}, system_metrics_interval_s=0)
        try:
            with tel.run():
                tel.scalars({{"Loss/critic": 1.0}})
                print("ready", flush=True)
                time.sleep(120)
        except SystemExit:
            print("closing", flush=True)
            tel.close()
    ''')
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "ready"
        time.sleep(1.0)  # the agent is serving
        process.send_signal(signal.SIGTERM)  # ends the run as killed; close() then waits on the silent service
        assert process.stdout.readline().strip() == "closing"
        time.sleep(0.5)
        process.send_signal(signal.SIGTERM)  # hurries the shutdown, on both sides
        process.wait(timeout=CONFIGURED_S / 3)
        wait_until_served(run_dir.name, timeout_s=CONFIGURED_S / 3)
    finally:
        process.kill()
        silent.stop()
    found = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["status"] for r in found if r["kind"] == "run"][-1] == "killed"
