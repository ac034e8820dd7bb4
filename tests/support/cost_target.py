"""A loop whose CPU is measured: ``python cost_target.py RUN_DIR ITERATIONS SYSTEM_INTERVAL_S [HOST [CHECKOUT [OUTPUTS]]]``.

Each iteration is 4 phases and 40 scalars logged on the loop's own ``step=``
(the system metrics step by the env steps). ``SYSTEM_INTERVAL_S``: seconds
between system metrics samples, or ``default``; ``HOST``: the agent host
(``process``, the default, or ``thread``); ``CHECKOUT``: the otel-rl to import
(another checkout's, for ``bench/agent_cost.py --compare``); ``OUTPUTS``: ``default``, or ``all``: every output
a team switches on besides (TensorBoard, W&B offline, the live stream to ``MOTRIX_METRICS_URL`` and OTLP to
``OTEL_EXPORTER_OTLP_ENDPOINT``, which the caller serves). Prints, per
iteration, the training thread's CPU, the process's other threads' and the
agent process's, in microseconds, from the agent's start to a flush that has
everything written, and the system metrics samples the run took, as one JSON line.
"""

from __future__ import annotations

import json
import random
import sys
import time

if len(sys.argv) > 5:
    sys.path.insert(0, sys.argv[5])

import psutil  # noqa: E402

import otel_rl  # noqa: E402

run_dir, iterations, interval = sys.argv[1], int(sys.argv[2]), sys.argv[3]
host = sys.argv[4] if len(sys.argv) > 4 else "process"
options = {} if interval == "default" else {"system_metrics_interval_s": float(interval)}
if len(sys.argv) > 6 and sys.argv[6] == "all":
    options.update(tensorboard=True, wandb=True, wandb_mode="offline")  # the live stream and OTLP: from the environment
tel = otel_rl.init(run_dir=run_dir, agent=host, quiet=True, panel=False, **options)
rng = random.Random(0)
pool = [{f"Loss/key_{k:02d}": rng.random() for k in range(40)} for _ in range(997)]
me = psutil.Process()


def cpu(process: psutil.Process) -> float:
    return sum(process.cpu_times()[:2])


with tel.run():
    assert tel.flush(timeout_s=60)  # the agent is up: its start-up is not what this measures
    agents = me.children()
    thread0, process0, agents0 = time.thread_time(), cpu(me), sum(map(cpu, agents))
    for i in range(iterations):
        with tel.iteration(i, env_steps=i * 64):
            for name in ("collector_wait", "inference", "replay_sample", "learning"):
                with tel.phase(name):
                    pass
        tel.scalars(pool[i % len(pool)], step=i)
    training = time.thread_time() - thread0
    assert tel.flush(timeout_s=120)
    process, agent = cpu(me) - process0, sum(map(cpu, agents)) - agents0
tel.close()
with open(f"{run_dir}/metrics.jsonl") as lines:
    samples = sum('"sys/process_rss_bytes"' in line for line in lines)  # one record a sample
print(json.dumps({"training": training / iterations * 1e6, "others": (process - training) / iterations * 1e6, "agent": agent / iterations * 1e6, "samples": samples}))
