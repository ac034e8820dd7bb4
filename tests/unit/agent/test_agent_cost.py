"""The agent's CPU, compared within one run: what the defaults cost must not drift unseen.

Ratios of CPU time (never wall time) from arms run side by side, each a fresh
process: the agent with the system metrics on against off (records made beside
the run must not take the training scalars off their block path), and the
agent's CPU per iteration against the training thread's own recording cost.
The bounds are generous (a shared 2-core machine is noisy); the regressions
they guard against cost several times more. The system metrics are sampled on
wall time, so a slower or busier machine takes more samples in the same loop:
each sample the arm took is allowed :data:`PER_SAMPLE_US` (several times what
one costs), so the bound follows the samples taken, not the machine.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

ITERATIONS = 30_000
ROUNDS = 3
PER_SAMPLE_US = 5_000.0
"""Agent CPU allowed per system metrics sample (about 1 ms is measured)."""
TARGET = Path(__file__).parents[2] / "support" / "cost_target.py"


def _arm(tmp_path: Path, name: str, interval_s: float) -> dict[str, float]:
    run_dir = tmp_path / name
    out = subprocess.run([sys.executable, str(TARGET), str(run_dir), str(ITERATIONS), str(interval_s)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_system_metrics_leave_the_agent_cost_where_it_was(tmp_path):
    results: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
    for round_ in range(ROUNDS):  # interleaved: drift hits both arms alike
        results["on"].append(_arm(tmp_path, f"on-{round_}", 0.1))
        results["off"].append(_arm(tmp_path, f"off-{round_}", 0))
    agent = {arm: statistics.median(r["agent"] for r in rs) for arm, rs in results.items()}
    training = statistics.median(r["training"] for rs in results.values() for r in rs)
    samples = statistics.median(r["samples"] for r in results["on"])
    sampling = samples * PER_SAMPLE_US / ITERATIONS  # per iteration
    figures = (f"agent us/iteration: system metrics on {agent['on']:.1f} ({samples:.0f} samples, {sampling:.2f} allowed for them), "
               f"off {agent['off']:.1f}; training thread {training:.1f}")  # fmt: skip
    assert samples >= 1  # the records beside the run were there in the measured arm
    assert agent["on"] - sampling <= 1.5 * agent["off"], figures  # 2-3x when system metrics sent the scalars call by call
    assert agent["on"] - sampling <= 3.5 * training, figures  # about 1.5x

