"""A run's regimes: its start-up, a warm-up before learning starts, and a change of pace midway, each with its own
verdict, and the headline the steady state's, never a blend (real loops with known sleeps, written by the real agent)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import otel_rl
from otel_rl.readers.analysis import analyze, render_text


def _warm_then_steady(run_dir, warm: int = 40, steady: int = 80) -> str:
    """Iteration 0 spends 1 s in no phase (an import); the learner then waits for its collector until ``learning_starts``
    (Collector Wait only), then learns (Learning 15 ms) with a short wait: learner-bound once learning starts."""
    tel = otel_rl.init(run_dir=run_dir, system_metrics_interval_s=0, quiet=True)
    with tel.run():
        for i in range(1 + warm + steady):
            with tel.iteration(i, env_steps=i + 1):
                if i == 0:
                    time.sleep(1.0)  # start-up: outside every phase
                    continue
                with tel.phase("collector_wait"):
                    time.sleep(0.004 if i <= warm else 0.0002)
                if i > warm:
                    with tel.phase("learning"):
                        time.sleep(0.015)  # wide of the 0.2 ms wait, however long a loaded host makes that
    tel.close()
    return str(run_dir)


def test_the_headline_is_the_steady_state_not_the_warm_up_or_the_start_up(tmp_path):
    report = analyze(_warm_then_steady(tmp_path / "run"), engine="python")
    text = render_text(report)
    assert [r.kind for r in report.regimes] == ["start-up", "warm-up", "steady"], text
    start, warm, steady = report.regimes
    assert (start.first_iteration, start.last_iteration) == (0, 0) and start.seconds >= 0.9
    assert start.bottleneck.startswith("start-up: 1.") and start.side is None
    assert (warm.first_iteration, warm.last_iteration) == (1, 40) and warm.side == "collector"
    assert (steady.first_iteration, steady.cycles) == (41, 80) and steady.headline and steady.side == "learner"
    # The headline and the tables are the steady state's: learning, and no time in no phase to blame.
    assert report.diagnosis.bottleneck.startswith("learner (learning"), text
    learner = report.timelines["learner"]
    assert learner.cycles == 80 and learner.other_share < 0.1, text
    assert not any("in no phase" in f.finding for f in report.diagnosis.findings), text
    assert "regimes (the tables below are the one marked *)" in text and " * steady" in text


def test_the_regimes_reach_analyze_json(tmp_path):
    run_dir = _warm_then_steady(tmp_path / "run")
    out = subprocess.run([sys.executable, "-m", "otel_rl.cli", "analyze", run_dir, "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [r["kind"] for r in data["regimes"]] == ["start-up", "warm-up", "steady"]
    assert [r["headline"] for r in data["regimes"]] == [False, False, True]
    assert data["diagnosis"]["side"] == "learner"


def test_a_change_of_pace_midway_is_a_regime_of_its_own(tmp_path):
    tel = otel_rl.init(run_dir=tmp_path / "run", system_metrics_interval_s=0, quiet=True)
    with tel.run():
        for i in range(100):
            with tel.iteration(i, env_steps=i + 1):
                with tel.phase("learning"):
                    time.sleep(0.002 if i < 40 else 0.012)  # 6x slower from iteration 40 on
    tel.close()
    report = analyze(str(tmp_path / "run"), engine="python")
    found = [r for r in report.regimes if r.kind != "start-up"]  # a loaded machine's first cycle may hold a one-off hiccup
    assert [r.kind for r in found] == ["steady", "changed"], render_text(report)
    steady, changed = found
    assert steady.last_iteration + 1 == changed.first_iteration
    assert abs(changed.first_iteration - 40) <= 2
    assert changed.cycle_p50_ms > 3 * steady.cycle_p50_ms
    assert changed.headline  # the longer of the two
    assert report.timelines["learner"].cycles == changed.cycles


def test_a_steady_loop_has_no_regimes(tmp_path):
    tel = otel_rl.init(run_dir=tmp_path / "run", system_metrics_interval_s=0, quiet=True)
    with tel.run():
        for i in range(80):
            with tel.iteration(i, env_steps=i + 1):
                with tel.phase("learning"):
                    time.sleep(0.010)
    tel.close()
    report = analyze(str(tmp_path / "run"), engine="python")
    assert [r.kind for r in report.regimes if r.kind != "start-up"] in ([], ["steady"]), render_text(report)
    assert report.timelines["learner"].cycles >= 77
