"""The team's database restarts while runs stream: nothing recorded is lost, however long the run outlives the outage.

A real PostgreSQL (crashed with ``pg_ctl -m immediate`` and started again
15 s later), a real ``otel-rl serve`` over it, and a real run streaming to
it that ends while the database is still down: its close does not wait
past its deadline, and what the live stream could not deliver reaches the
server once the database is back, each record once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import requests
from postgres_server import Postgres

from otel_rl.readers.server import IngestServer

pytestmark = pytest.mark.slow  # a database crashed and started again: pytest -m 'not slow' leaves it out

RECORDS = 6000
LOOP = textwrap.dedent(f"""
    import sys, time, otel_rl
    tel = otel_rl.init(run_dir=sys.argv[1], run_id="outage", motrix_url=sys.argv[2], system_metrics_interval_s=0, shutdown_timeout_s=3)
    with tel.run():
        for i in range({RECORDS}):
            with tel.iteration(i, env_steps=i):
                pass
            tel.scalars({{"Loss/value": float(i)}}, step=i)
            time.sleep(0.0015)
    began = time.monotonic()
    tel.close()
    print(time.monotonic() - began)
""")


def test_a_database_down_past_the_runs_end_loses_nothing_the_run_recorded(tmp_path):
    postgres = Postgres().start()
    try:
        with IngestServer(postgres.database()) as server:
            def outage() -> None:
                time.sleep(3)
                postgres.crash()
                time.sleep(15)
                postgres.resume()

            down = threading.Thread(target=outage)
            down.start()
            env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_"))}
            run = subprocess.run([sys.executable, "-c", LOOP, str(tmp_path / "run"), server.url], capture_output=True, text=True, timeout=120, env=env)
            assert run.returncode == 0, run.stderr
            assert float(run.stdout.strip().splitlines()[-1]) < 3 + 1  # the close kept its deadline
            assert "a backfill in the background sends them when the service is back" in run.stderr  # the run ended during the outage
            down.join()
            deadline = time.monotonic() + 90
            while True:
                points = requests.get(server.url + "/api/v1/runs/outage/scalars", params={"key": "Loss/value"}, timeout=30).json()["points"]
                if len(points) >= RECORDS or time.monotonic() > deadline:
                    break
                time.sleep(1)
            assert sorted(p["value"] for p in points) == [float(i) for i in range(RECORDS)]  # every record, once
            note = tmp_path / "run" / "trace_upload.json"  # written once the trace followed the records
            while not note.exists() and time.monotonic() < deadline:
                time.sleep(0.5)
            outcome = json.loads(note.read_text())
            assert outcome["sent"] is True and outcome["records"]["rejected"] == 0 and outcome["records"]["accepted"] > 0
            run_state = requests.get(server.url + "/api/v1/runs/outage", timeout=30).json()["run"]
            assert run_state["status"] == "finished"
    finally:
        postgres.stop()
