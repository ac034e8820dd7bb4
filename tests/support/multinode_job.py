"""One rank of a job of two machines under ``torchrun``: a gloo all-reduce per iteration, one rank slower.

``python multinode_job.py RUN_DIR ITERATIONS SLOW_RANK``; every other setting
comes from the environment (``torchrun``'s, ``OTEL_RL_AGENT``, ``MOTRIX_METRICS_URL``).
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist

import otel_rl

LEARNING_S = 0.02
STEPS_PER_ITERATION = 64


def main(run_dir: str, iterations: int, slow_rank: int) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tel = otel_rl.init(run_dir=run_dir, system_metrics_interval_s=0)
    gradients = torch.ones(1024)
    with tel.run():
        for i in range(iterations):
            with tel.iteration(i, env_steps=(i + 1) * STEPS_PER_ITERATION):
                with tel.phase("learning"):
                    time.sleep(LEARNING_S * (2 if rank == slow_rank else 1))
                with tel.phase("gradient_sync"):
                    dist.all_reduce(gradients)
            if i % 10 == 9:
                tel.log_window({"Perf/total_fps": 1000.0}, group=dist.group.WORLD)
    tel.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
