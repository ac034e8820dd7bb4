"""Process targets for test_workers.py (importable by spawned children)."""

from __future__ import annotations

import sys
import time


def collector(spec) -> None:
    from otel_rl.worker_processes import init_worker

    tel = init_worker(spec, system_metrics_interval_s=0)
    for tick in range(5):
        with tel.iteration(tick, timeline="collector"):
            with tel.phase("env_step", "collector"):
                time.sleep(0.002)
    tel.close()


def crash(code: int) -> None:
    sys.exit(code)
