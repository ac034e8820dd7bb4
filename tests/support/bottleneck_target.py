"""A training loop streaming to an ingest server whose bottleneck is set by the test, and changes midway.

    python bottleneck_target.py URL RUN_ID MODE SECONDS CHANGE_AT_S MARK_FILE [RUN_DIR]

MODE ``learner``: the learner waits 20 ms for its collector and learns 2 ms (collector-bound), then from CHANGE_AT_S it
waits 2 ms and learns 20 ms (learner-bound). MODE ``turns``: one thread collects (Env Step 8 ms) then learns (2 ms), as
SB3 does (collector-bound, its env step). The wall-clock time of the change is written to MARK_FILE.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import otel_rl

url, run_id, mode, seconds, change_at, mark = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5]), Path(sys.argv[6])
run_dir = sys.argv[7] if len(sys.argv) > 7 else False
tel = otel_rl.init(run_id=run_id, motrix_url=url, run_dir=run_dir, project="bottlenecks", group="sweep-1", perf_interval_s=0.5,
                   system_metrics_interval_s=0, quiet=True)  # fmt: skip
with tel.run(total_steps=10**7, num_envs=8):
    start = time.monotonic()
    i = 0
    changed = False
    while time.monotonic() - start < seconds:
        late = time.monotonic() - start >= change_at
        if late and not changed:
            mark.write_text(repr(time.time()))
            changed = True
        if mode == "turns":
            with tel.iteration(i, env_steps=8 * i, timeline="collector"):
                with tel.phase("env_step", "collector"):
                    time.sleep(0.008)
            with tel.iteration(i, env_steps=8 * i):
                with tel.phase("learning"):
                    time.sleep(0.002)
        else:
            with tel.iteration(i, env_steps=8 * i):
                with tel.phase("collector_wait"):
                    time.sleep(0.002 if late else 0.02)
                with tel.phase("learning"):
                    time.sleep(0.02 if late else 0.002)
        i += 1
tel.close()
