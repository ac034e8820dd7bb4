"""A training process whose outputs run in an agent process: ``python agent_target.py RUN_DIR END [AGENT]``.

100 learner iterations, each with a ``learning`` phase, a scalar and (every
10th) an event; then it ends as END says:

- ``finish``: the run ends and telemetry closes normally;
- ``sigkill``: SIGKILL to itself after iteration 59, nothing flushed;
- ``sigterm_sigkill``: SIGTERM to itself after iteration 59 (the run ends as
  killed), then SIGKILL while telemetry would be shutting down;
- ``kill_agent``: SIGKILL to the agent process after iteration 29; training goes on to the end.
- ``restart_agent``: the same, then 6,000 scalars calls of 200 keys (more than the data ring
  holds) and 3 s more of training, long enough for a new agent; prints ``tel.stats()`` as JSON.

AGENT is ``process`` (default) or ``thread``. Outputs: JSONL, the trace, and
the live stream when ``MOTRIX_METRICS_URL`` is set.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import psutil

import otel_rl

ITERATIONS = 100
KILL_AT = 59


def agent_process() -> psutil.Process:
    """The agent process this one started (attached or still starting up)."""
    (agent,) = [child for child in psutil.Process().children() if "otel_rl.agent" in " ".join(child.cmdline())]
    return agent


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
                if i == 29 and end in ("kill_agent", "restart_agent"):
                    while end == "restart_agent" and not tel.stats()["agent_pid"]:
                        time.sleep(0.05)  # the first agent has started reading (and writing outputs)
                    if end == "restart_agent":
                        time.sleep(2.5)  # and has written what it read (JSONL is written every 2 s)
                    agent = agent_process()
                    agent.kill()
                    agent.wait()
                    if end == "restart_agent":
                        burst = {f"Burst/k{k:03d}": float(k) for k in range(200)}
                        for _ in range(6000):
                            tel.scalars(burst)
                if end == "restart_agent" and i >= 29:
                    time.sleep(0.045)
    finally:
        if end == "sigterm_sigkill":
            os.kill(os.getpid(), signal.SIGKILL)  # the second signal, before telemetry could flush anything
    if end == "restart_agent":
        print(json.dumps(tel.stats()), flush=True)
    tel.close()


if __name__ == "__main__":
    main()
