"""A training process streaming to an ingest server, ending as the test asks: finish, fail, or run until killed.

    python web_target.py URL RUN_ID MODE LR      (MODE: finish, fail, forever)
"""

from __future__ import annotations

import math
import sys
import time

import otel_rl

url, run_id, mode, lr = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
tel = otel_rl.init(run_id=run_id, motrix_url=url, project="pendulum", group="lr-sweep", perf_interval_s=0.2,
                   system_metrics_interval_s=0, quiet=True)  # fmt: skip
with tel.run(total_steps=4000, num_envs=8, config={"lr": lr, "batch_size": 256, "env": {"id": "Pendulum-v1"}}):
    i = 0
    while mode == "forever" or i < 60:
        with tel.iteration(i, env_steps=8 * i):
            with tel.phase("collector_wait"):
                time.sleep(0.002)
            with tel.phase("learning"):
                time.sleep(0.004)
        tel.scalars({"Loss/critic": 1.0 / (1 + i * lr * 100), "Train/mean_reward": -1000 + 5 * i + 50 * math.sin(i / 5)})
        if i == 30:
            tel.event("checkpoint_saved", path=f"ckpt/{i}.pt")
        if mode == "fail" and i == 45:
            raise RuntimeError("CUDA error: out of memory")
        i += 1
        if mode == "forever":
            time.sleep(0.05)  # a slow run: the page sees it advance
tel.close()
