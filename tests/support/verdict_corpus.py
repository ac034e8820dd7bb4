"""Loops whose bottleneck is known by construction (sleeps, and real libraries slowed where the truth says), and what
each surface of otel-rl says of them.

Each sleeping loop is a learner whose Collector Wait stands for the collector it waits on; ``truth`` is the side that
sets its pace in its steady state (``balanced`` where the wait sits at the line). SB3's PPO with its defaults (long
iterations, an environment made slow) and TRL's GRPO (a slow reward judge) are the libraries', as users train them. :func:`surfaces` runs one and reads
the live verdict's last word (``metrics.jsonl``: what the panel, the page, TensorBoard and W&B show), the
trace's headline (``otel-rl analyze``), and ``otel_rl.read.runs`` over the folder.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import otel_rl
import otel_rl.read
from otel_rl.formats import schema
from otel_rl.readers.analysis import analyze


@dataclass(frozen=True)
class Loop:
    name: str
    truth: str
    """The side that sets the pace of the loop's steady state (its end)."""
    seconds: float
    step: Callable[[int, float], tuple[float, float, float]]
    """(iteration, seconds since start) -> (seconds outside any phase, collector wait, learning: 0 for none)."""
    change_at: int | None = None
    """The iteration where the pace-setter changes (a regime change), if it does."""
    runner: Callable[[Path], None] | None = None
    """A real library's training into the folder given, in place of ``step``'s sleeps."""
    phase: str | None = None
    """The phase that sets the pace, where the loop's truth names one."""


def _steady(wait: float, learning: float) -> Callable[[int, float], tuple[float, float, float]]:
    return lambda i, t: (0.0, wait, learning)


def _warm_up(i: int, t: float) -> tuple[float, float, float]:
    return (0.0, 0.010, 0.0) if i < 100 else (0.0, 0.001, 0.015)  # the replay buffer fills, then learning starts


def _start_up(i: int, t: float) -> tuple[float, float, float]:
    return (2.0 if i == 0 else 0.0, 0.002, 0.015)  # iteration 0 imports for 2 s


CHANGE_AT = 120


def _change(i: int, t: float) -> tuple[float, float, float]:
    return (0.0, 0.015, 0.003) if i < CHANGE_AT else (0.0, 0.001, 0.015)  # collector-bound, then learner-bound




SLEEP_S = 0.002


def sb3_ppo_defaults(run_dir: Path) -> None:
    """SB3's PPO as its README trains it (defaults: 2,048-step rollouts, 10 epochs of 64) on a CartPole whose every
    step takes 2 ms more: each iteration is a rollout of 4 s or more and an update of under a second (a few on a
    loaded host)."""
    import gymnasium as gym
    from stable_baselines3 import PPO

    from otel_rl.integrations.sb3 import TelemetryCallback

    class SlowStep(gym.Wrapper):
        def step(self, action):
            time.sleep(SLEEP_S)
            return self.env.step(action)

    import torch

    torch.set_num_threads(1)  # two OpenMP threads on two cores, one of them busy, make an update tens of times slower
    tel = otel_rl.init(run_dir=run_dir, quiet=True)
    model = PPO("MlpPolicy", SlowStep(gym.make("CartPole-v1")), device="cpu", seed=0)
    model.learn(3 * 2048, callback=TelemetryCallback(tel))
    tel.close()


def trl_grpo_slow_reward(run_dir: Path) -> None:
    """TRL's GRPO on the tiny model of ``examples/trl_grpo.py``, its reward a judge that takes 0.4 s a call."""
    import subprocess
    import sys

    from locations import REPO

    done = subprocess.run([sys.executable, str(REPO / "tests/support/trl_target.py"), str(run_dir), "6", "slow-judge"],
                          capture_output=True, text=True, timeout=600, env=subprocess_env())  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


def subprocess_env() -> dict[str, str]:
    import os

    return {**os.environ, "OTEL_RL_QUIET": "1"}


LOOPS = (
    Loop("learner-bound", "learner", 5, _steady(0.001, 0.015)),
    Loop("collector-bound", "collector", 5, _steady(0.015, 0.003)),
    Loop("balanced", "balanced", 5, _steady(0.006, 0.018)),
    Loop("warm-up then steady", "learner", 6, _warm_up),
    Loop("one-off start-up", "learner", 6, _start_up),
    Loop("regime change", "learner", 8, _change, change_at=CHANGE_AT),
    Loop("SB3 PPO, defaults", "collector", 0, _steady(0, 0), runner=sb3_ppo_defaults, phase="env_step"),
    Loop("TRL GRPO", "learner", 0, _steady(0, 0), runner=trl_grpo_slow_reward, phase="reward"),
)


def run(loop: Loop, run_dir: Path, **options) -> None:
    if loop.runner is not None:
        loop.runner(run_dir)
        return
    tel = otel_rl.init(run_dir=run_dir, quiet=True, **options)
    with tel.run():
        start = time.monotonic()
        i = 0
        while time.monotonic() - start < loop.seconds:
            outside, wait, learning = loop.step(i, time.monotonic() - start)
            with tel.iteration(i, env_steps=8 * (i + 1)):
                if outside:
                    time.sleep(outside)
                with tel.phase("collector_wait"):
                    time.sleep(wait)
                if learning:
                    with tel.phase("learning"):
                        time.sleep(learning)
            i += 1
    tel.close()


def surfaces(loop: Loop, run_dir: Path) -> dict:
    """Run ``loop`` and read each surface: the sides they name, the live verdict's changes, and their iterations."""
    run(loop, run_dir)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    said = [r["attributes"] for r in records if r["kind"] == "event" and r["name"] == schema.EVENT_BOTTLENECK]
    report = analyze(run_dir)
    (row,) = otel_rl.read.runs(run_dir).to_dict("records")
    changes = [s for s in said if s.get("previous")]
    return {
        "loop": loop.name,
        "truth": loop.truth,
        "live": said[-1]["side"] if said else None,
        "trace": report.diagnosis.side,
        "read": row["bottleneck_side"],
        "phases": (said[-1].get("phase") if said else None, report.diagnosis.phase, row["bottleneck_phase"]),
        "said": [s["text"] for s in said],
        "changes": len(changes),
        "change_iterations": [s.get("iteration") for s in changes],
        "seconds": loop.seconds,
    }


def table(rows: list[dict]) -> str:
    """The agreement table: each surface's side against the truth."""
    lines = ["| loop | host | truth | live | trace | read.runs | live changes | said | changes at iteration |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        said = " → ".join(r["said"])
        at = ", ".join(str(i) for i in r["change_iterations"])
        lines.append(f"| {r['loop']} | {r['host']} | {r['truth']} | {r['live']} | {r['trace']} | {r['read']} | {r['changes']} | {said} | {at} |")
    return "\n".join(lines)
