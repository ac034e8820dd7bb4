"""A training process for the resume tests: iterations ``start``..``stop``, then it ends as told.

``python resume_target.py RUN_DIR START STOP END [RESUME]``: END is ``finish``,
``sigterm`` (SIGTERM to itself: the run ends as killed) or ``sigkill``
(everything flushed, then SIGKILL: no terminal record). Outputs: JSONL,
TensorBoard, W&B (offline), the trace, and the live stream when
``MOTRIX_METRICS_URL`` is set.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import otel_rl


def main() -> None:
    run_dir, start, stop, end = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    resume = len(sys.argv) > 5 and sys.argv[5] == "resume"
    tel = otel_rl.init(run_dir=run_dir, resume=resume, jsonl=True, tensorboard=True, wandb=True, trace_enabled=True,
                       system_metrics_interval_s=0, perf_interval_s=0.05)  # fmt: skip
    with tel.run(config={"lr": 0.1}):
        for i in range(start, stop):
            with tel.iteration(i, env_steps=10 * (i + 1)):
                with tel.phase("learning"):
                    time.sleep(0.002)
            tel.scalars({"Loss/critic": 1.0 / (i + 1)})
        if end == "sigkill":
            tel.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        if end == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
    tel.close()


if __name__ == "__main__":
    main()
