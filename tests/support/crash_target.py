"""A training process killed at chosen moments: ``python crash_target.py RUN_DIR MODE PROGRESS``.

3,000 learner iterations, each a ``learning`` phase and a scalar, an event every
10th; PROGRESS gets a line as each step is made (``init``, the iteration's
index once its records were handed to telemetry, ``closing``, ``closed``),
so the test knows what was recorded when it killed the process. MODE:

- ``close``: the run ends, then ``tel.close()`` (the test kills the process meanwhile);
- ``init``: the test kills it at some moment after ``init``;
- ``agent-twice``: SIGKILL to the agent process after iterations 1,000 and 2,000, then to the end;
- ``both``: SIGKILL to the agent after iteration 1,000, then to itself.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import otel_rl

ITERATIONS = 3000


def main() -> None:
    run_dir, mode, progress_path = sys.argv[1:4]
    progress = os.open(progress_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    say = lambda line: os.write(progress, f"{line}\n".encode())  # noqa: E731 - unbuffered: survives SIGKILL
    tel = otel_rl.init(run_dir=run_dir, jsonl=True, trace_enabled=True, system_metrics_interval_s=0)
    say("init")
    learning = tel.phase("learning")
    with tel.run(config={"mode": mode}):
        for i in range(ITERATIONS):
            with tel.iteration(i, env_steps=i + 1):
                with learning:
                    pass
            tel.scalars({"Loss/critic": float(i)})
            if i % 10 == 0:
                tel.event("checkpoint_saved", iteration=i)
            say(i)
            if mode == "init":
                time.sleep(0.0005)
            if mode == "agent-twice" and i in (1000, 2000):
                kill_agent(tel, wait_for_the_next=True)
            if mode == "both" and i == 1000:
                kill_agent(tel, wait_for_the_next=False)
                os.kill(os.getpid(), signal.SIGKILL)
    say("closing")
    tel.close()
    say("closed")


def kill_agent(tel, wait_for_the_next: bool) -> None:
    """SIGKILL the agent serving this process once it has attached; then perhaps wait for the watcher's next one."""
    while not tel.stats()["agent_pid"]:
        time.sleep(0.01)
    first = tel.stats()["agent_pid"]
    os.kill(first, signal.SIGKILL)
    if not wait_for_the_next:
        return
    deadline = time.monotonic() + 10
    while tel.stats()["agent_pid"] == first and time.monotonic() < deadline:
        time.sleep(0.01)  # the watcher starts the next one, which attaches


if __name__ == "__main__":
    main()
