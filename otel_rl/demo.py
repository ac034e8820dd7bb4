"""The demo job: a learner and a collector thread doing simulated work, fully instrumented.

The learner serves the collector's inference requests, samples a replay batch
and runs an update (numpy matrix products stand in for the network); the
collector steps a batch of environments and writes transitions. Both
timelines run concurrently, as in a real off-policy job.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from pathlib import Path

import otel_rl

NUM_ENVS = 8


def run_demo(args) -> int:
    import numpy as np

    run_dir = Path(args.runs_dir) / time.strftime("%Y-%m-%d_%H-%M-%S")
    tel = otel_rl.init(run_dir=run_dir, service_name="otel-rl-demo", algorithm="demo")
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((256, 256))
    requests: queue.Queue = queue.Queue(maxsize=1)
    responses: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()
    replay: list = []
    replay_lock = threading.Lock()

    def collector() -> None:
        obs = rng.standard_normal((NUM_ENVS, 256))
        cycle = 0
        while not stop.is_set():
            with tel.iteration(cycle, timeline="collector"):
                with tel.phase("inference_request", "collector"):
                    requests.put(obs)
                with tel.phase("learner_action_wait", "collector"):
                    try:
                        action = responses.get(timeout=1.0)
                    except queue.Empty:
                        continue
                with tel.phase("env_step", "collector"):
                    obs = np.tanh(obs @ weights[:, :256] * 0.01 + action.mean())
                    time.sleep(0.002)
                with tel.phase("replay_write", "collector"):
                    with replay_lock:
                        replay.append(obs.copy())
                        del replay[:-1000]
            cycle += 1

    worker = threading.Thread(target=collector, name="collector", daemon=True)
    deadline = time.monotonic() + args.seconds
    env_steps = 0
    with tel.run():
        worker.start()
        i = 0
        while time.monotonic() < deadline and (args.iterations is None or i < args.iterations):
            with tel.iteration(i, env_steps=env_steps):
                with tel.phase("collector_wait"):
                    try:
                        obs = requests.get(timeout=1.0)
                    except queue.Empty:
                        continue
                with tel.phase("inference"):
                    with tel.phase("inference_forward"):
                        action = obs @ weights
                with tel.phase("collector_release"):
                    responses.put(action)
                with tel.phase("replay_sample"):
                    with replay_lock:
                        batch = np.stack(replay[-32:]) if replay else obs[None]
                with tel.phase("learning"):
                    for _ in range(4):
                        loss = float(np.square(batch @ weights).mean())
            env_steps += NUM_ENVS
            tel.scalars({"Loss/critic": loss, "Perf/total_fps": NUM_ENVS / max(time.monotonic() - deadline + args.seconds, 1e-9) * (i + 1)})
            i += 1
        stop.set()
        worker.join(2.0)
    tel.close()
    summary = json.loads((run_dir / "run_summary.json").read_text())
    print(f"run folder: {run_dir}")
    for timeline, entry in summary["timelines"].items():
        print(f"{timeline}:")
        for name, stat in entry["phases"].items():
            print(f"  {name:22s} n={stat['count']:6d}  mean={stat['mean_ms']:8.3f} ms  p95={stat.get('p95_ms', 0):8.3f} ms")
    return 0
