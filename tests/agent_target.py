"""A training process whose outputs run in an agent process: ``python agent_target.py RUN_DIR END [AGENT]``.

100 learner iterations, each with a ``learning`` phase, a scalar and (every
10th) an event; then it ends as END says:

- ``finish``: the run ends and telemetry closes normally;
- ``sigkill``: SIGKILL to itself after iteration 59, nothing flushed;
- ``sigterm_sigkill``: SIGTERM to itself after iteration 59 (the run ends as
  killed), then SIGKILL while telemetry would be shutting down;
- ``kill_agent``: SIGKILL to the agent process after iteration 29; training goes on to the end.

AGENT is ``process`` (default) or ``thread``. Outputs: JSONL, the trace, and
the live stream when ``MOTRIX_METRICS_URL`` is set.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import otel_rl

ITERATIONS = 100
KILL_AT = 59


def main() -> None:
    run_dir, end = sys.argv[1], sys.argv[2]
    agent = sys.argv[3] if len(sys.argv) > 3 else "process"
    tel = otel_rl.init(run_dir=run_dir, jsonl=True, trace_enabled=True, agent=agent, system_metrics_interval_s=0)
    learning = tel.phase("learning")
    try:
        with tel.run(config={"lr": 0.1}):
            for i in range(ITERATIONS):
                with tel.iteration(i, env_steps=10 * (i + 1)):
                    with learning:
                        time.sleep(0.001)
                tel.scalars({"Loss/critic": 1.0 / (i + 1)})
                if i % 10 == 0:
                    tel.event("checkpoint_saved", iteration=i)
                if i == KILL_AT and end == "sigkill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if i == KILL_AT and end == "sigterm_sigkill":
                    os.kill(os.getpid(), signal.SIGTERM)
                if i == 29 and end == "kill_agent":
                    os.kill(tel._host.process.pid, signal.SIGKILL)
                    tel._host.process.wait()
    finally:
        if end == "sigterm_sigkill":
            os.kill(os.getpid(), signal.SIGKILL)  # the second signal, before telemetry could flush anything
    tel.close()


if __name__ == "__main__":
    main()
