"""The team's database restarts while runs stream: nothing recorded is lost, however long the run outlives the outage.

A real PostgreSQL (crashed with ``pg_ctl -m immediate``), a real ``otel-rl
serve`` over it, and a real run streaming to it. The outage follows the
run's progress, not the clock: the database goes down once a quarter of the
records are out, the rest are recorded while it is down, and it comes back
only after the run has ended. The close keeps its deadline, and what the
live stream could not deliver reaches the server once the database is back,
each record once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
import requests
from postgres_server import Postgres
from uploads import upload_outcome

from otel_rl.readers.server import IngestServer

pytestmark = pytest.mark.slow  # a database crashed and started again: pytest -m 'not slow' leaves it out

RECORDS = 6000
LOOP = textwrap.dedent(f"""
    import os, sys, time, otel_rl
    run_dir, url, ready, down = sys.argv[1:5]
    tel = otel_rl.init(run_dir=run_dir, run_id="outage", motrix_url=url, system_metrics_interval_s=0, shutdown_timeout_s=3)
    with tel.run():
        for i in range({RECORDS}):
            if i == {RECORDS} // 4:
                open(ready, "w").close()  # the test crashes the database now
                while not os.path.exists(down):
                    time.sleep(0.05)
            with tel.iteration(i, env_steps=i):
                pass
            tel.scalars({{"Loss/value": float(i)}}, step=i)
            time.sleep(0.0015)
    began = time.monotonic()
    tel.close()
    print(time.monotonic() - began)
""")


def _wait_for(path, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert process.poll() is None, process.communicate()[1]
        assert time.monotonic() < deadline, f"the run did not reach {path.name} in {timeout_s:.0f} s"
        time.sleep(0.05)


def test_a_database_down_past_the_runs_end_loses_nothing_the_run_recorded(tmp_path):
    postgres = Postgres().start()
    try:
        with IngestServer(postgres.database()) as server:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
            ready, down = tmp_path / "ready", tmp_path / "down"
            run = subprocess.Popen([sys.executable, "-c", LOOP, str(tmp_path / "run"), server.url, str(ready), str(down)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
            try:
                _wait_for(ready, run, 300)
                postgres.crash()
                down.touch()
                stdout, stderr = run.communicate(timeout=600)
            finally:
                if run.poll() is None:
                    run.kill()
            postgres.resume()  # after the run ended: it ended during the outage, whatever the machine's speed
            assert run.returncode == 0, stderr
            # The close kept its 3 s deadline (one that waited for the service would still be waiting: it was down until now).
            assert float(stdout.strip().splitlines()[-1]) < 3 + 5
            assert "a backfill in the background sends them when the service is back" in stderr
            outcome = upload_outcome(tmp_path / "run")  # written once the backfill and the trace after it are done
            assert outcome["sent"] is True and outcome["records"]["rejected"] == 0 and outcome["records"]["accepted"] > 0
            points = requests.get(server.url + "/api/v1/runs/outage/scalars", params={"key": "Loss/value"}, timeout=30).json()["points"]
            assert sorted(p["value"] for p in points) == [float(i) for i in range(RECORDS)]  # every record, once
            run_state = requests.get(server.url + "/api/v1/runs/outage", timeout=30).json()["run"]
            assert run_state["status"] == "finished"
    finally:
        postgres.stop()
