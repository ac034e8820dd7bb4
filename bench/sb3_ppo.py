"""Stable-Baselines3 PPO on CartPole: env steps per second with and without otel-rl's callback.

Arms, each a fresh process, interleaved round by round:

  plain        ``model.learn`` as SB3 ships it
  plain again  the same (the noise control)
  otel-rl      ``TelemetryCallback`` with metrics.jsonl and the Perfetto trace
  otel-rl+     the same with TensorBoard and W&B (offline) on

Every arm trains the same PPO (one thread for torch) for ``--steps`` env
steps; the rate is measured from the end of the first rollout (model and
process start-up excluded).

Usage: python bench/sb3_ppo.py [--rounds 5] [--steps 16384]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ARM = r"""
import json, sys, time, tempfile
import torch
torch.set_num_threads(1)
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback

mode, steps = sys.argv[1], int(sys.argv[2])

class Clock(BaseCallback):
    def __init__(self):
        super().__init__()
        self.start = None
    def _on_rollout_end(self):
        if self.start is None:
            self.start, self.steps = time.perf_counter(), self.model.num_timesteps
    def _on_step(self):
        return True

clock = Clock()
callbacks = [clock]
tel = None
if mode != "plain":
    import otel_rl
    from otel_rl.integrations.sb3 import TelemetryCallback
    more = {"tensorboard": True, "wandb": True} if mode == "otel-rl+" else {}
    tel = otel_rl.init(run_dir=tempfile.mkdtemp(), jsonl=True, trace_enabled=True, **more)
    callbacks.insert(0, TelemetryCallback(tel))
model = PPO("MlpPolicy", "CartPole-v1", n_steps=512, batch_size=64, n_epochs=4, device="cpu", seed=0)
if tel is not None:
    with tel.run():
        model.learn(steps, callback=callbacks)
else:
    model.learn(steps, callback=callbacks)
rate = (model.num_timesteps - clock.steps) / (time.perf_counter() - clock.start)
if tel is not None:
    tel.close()
print(json.dumps({"rate": rate}))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=16384)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "WANDB_"))}
    env["WANDB_MODE"] = "offline"
    arms = {"plain": "plain", "plain again": "plain", "otel-rl": "otel-rl", "otel-rl+": "otel-rl+"}
    rates: dict[str, list[float]] = {name: [] for name in arms}
    with tempfile.TemporaryDirectory() as cwd:
        for _ in range(args.rounds):
            for name, mode in arms.items():
                out = subprocess.run(
                    [sys.executable, "-c", ARM, mode, str(args.steps)], capture_output=True, text=True, env=env, cwd=cwd, check=True
                ).stdout
                rates[name].append(json.loads(out.strip().splitlines()[-1])["rate"])
    base = statistics.median(rates["plain"])
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores; PPO CartPole-v1, {args.steps} steps, {args.rounds} interleaved rounds")
    print()
    print("| arm | env steps/s (median) | min | max | vs plain |")
    print("|---|---|---|---|---|")
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.0f} | {min(values):.0f} | {max(values):.0f} | {median / base:.3f}x |")


if __name__ == "__main__":
    main()
