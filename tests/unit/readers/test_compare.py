"""``otel-rl analyze RUN --compare BASELINE``: real runs compared, in a subprocess as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from verdicts import finding

import otel_rl


def analyze(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "otel_rl.cli", "analyze", *arguments], capture_output=True, text=True, timeout=120)


def demo(runs_dir, *options: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_", "WANDB_")) or k == "OTEL_RL_RUN_DIR"}
    result = subprocess.run(
        [sys.executable, "-m", "otel_rl.cli", "demo", "--iterations", "200", "--learning-starts", "256", "--seconds", "120",
         "--runs-dir", str(runs_dir), "--no-panel", *options],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    (run_dir,) = list(runs_dir.iterdir())
    return str(run_dir)


@pytest.mark.slow
def test_a_demo_whose_learning_is_slower_names_the_learner(tmp_path):
    baseline = demo(tmp_path / "baseline")
    slower = demo(tmp_path / "slower", "--updates-per-step", "4")
    result = analyze(slower, "--compare", baseline)
    assert result.returncode == 0, result.stderr
    verdict = result.stdout.splitlines()[0]
    assert verdict.startswith("verdict: ") and finding(verdict).startswith("Learning +") and "the learner got slower" in verdict, result.stdout
    comparison = json.loads(analyze(slower, "--compare", baseline, "--json").stdout)
    learning = comparison["timelines"]["learner"]["phases"]["learning"]
    assert learning["per_cycle_ms"][2] > 1.0  # four updates an iteration: more than twice the time
    assert comparison["env_steps_per_s"][2] < 0  # fewer env steps per second


def loop(run_dir, learning_s: float, extra_phase: bool = False, iterations: int = 120, wait_s: float = 0.002, every: int = 1) -> str:
    """``every``: learning in one iteration of that many (the 5th of each 10, say), the others only wait."""
    tel = otel_rl.init(run_dir=run_dir, system_metrics_interval_s=0, quiet=True)
    with tel.run():
        for i in range(iterations):
            with tel.iteration(i, env_steps=8 * i):
                with tel.phase("collector_wait"):
                    time.sleep(wait_s)
                if i % every == every // 2:
                    with tel.phase("learning"):
                        time.sleep(learning_s)
                if extra_phase:
                    with tel.phase("weight_publish"):
                        time.sleep(0.001)
    tel.close()
    return str(run_dir)


def side_by_side(first, second, learning_s: float) -> tuple[str, str]:
    """Two runs of the same loop, their iterations taking turns: whatever load the machine has, both see it."""
    runs = [otel_rl.init(run_dir=folder, system_metrics_interval_s=0, quiet=True) for folder in (first, second)]
    for tel in runs:
        tel.start_run()
    for i in range(120):
        for tel in runs:
            with tel.iteration(i, env_steps=8 * i):
                with tel.phase("collector_wait"):
                    time.sleep(0.002)
                with tel.phase("learning"):
                    time.sleep(learning_s)
    for tel in runs:
        tel.close()
    return str(first), str(second)


def test_identical_settings_change_no_phase(tmp_path):
    first, second = side_by_side(tmp_path / "a", tmp_path / "b", 0.004)
    result = analyze(second, "--compare", first)
    assert result.returncode == 0, result.stderr
    said = finding(result.stdout.splitlines()[0])
    # Nothing moved; or, on a machine whose stalls hit one run's cycles more, the slow cycles did: never a phase.
    assert said.startswith(("nothing changed beyond noise", "no phase changed")), result.stdout


def test_a_throughput_moved_by_the_slow_cycles_alone_is_not_put_down_to_a_phase():
    from otel_rl.readers.analysis.compare import verdict

    def timeline(p50: float, mean: float) -> dict:
        return {"changed": False, "cycles": (120, 120), "cycle_mean_ms": (6.7, 6.7 * (1 + mean), mean), "cycle_p50_ms": (6.0, 6.0 * (1 + p50), p50),
                "phases": {}, "other_share": (0.0, 0.0), "other_wall": 0.0}  # fmt: skip

    stalls = {"timelines": {"learner": timeline(-0.01, -0.07)}, "env_steps_per_s": (1194.0, 1263.0, 0.06), "host": {"differences": [], "busy_in_both": None}, "same_settings": True}
    assert verdict(stalls).startswith("no phase changed (every cycle's median within 1% of the baseline), but the slow cycles did")
    more_steps = {"timelines": {"learner": timeline(0.0, 0.01)}, "env_steps_per_s": (1000.0, 2000.0, 1.0), "host": {"differences": [], "busy_in_both": None}, "same_settings": True}
    assert verdict(more_steps) == "no phase changed (every cycle's median within 0% of the baseline): each cycle did more env steps; throughput +100%"


def test_runs_with_different_phases_are_compared_on_what_each_has(tmp_path):
    baseline, changed = loop(tmp_path / "a", 0.004), loop(tmp_path / "b", 0.004, extra_phase=True)
    comparison = json.loads(analyze(changed, "--compare", baseline, "--json").stdout)
    publish = comparison["timelines"]["learner"]["phases"]["weight_publish"]
    assert publish["in"] == "run" and publish["mean_ms"][0] is None and publish["mean_ms"][1] >= 1.0
    assert "Weight Publish new" in comparison["verdict"] and "the learner got slower" in comparison["verdict"]


@pytest.mark.parametrize("wrong", ["missing-folder", "not-a-trace"])
def test_a_baseline_that_is_not_a_trace_is_one_line_and_an_error(tmp_path, wrong):
    run = loop(tmp_path / "a", 0.001)
    baseline = tmp_path / wrong
    if wrong == "not-a-trace":
        baseline.write_bytes(b"\x0a\xff\xff\xff\x0fgarbage")
    result = analyze(run, "--compare", str(baseline))
    assert result.returncode != 0 and len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


@pytest.mark.parametrize("cycles", [4, 40])
def test_too_few_cycles_get_no_verdict_and_enough_get_one(tmp_path, cycles):
    """Learning 10 -> 15 ms: said with 40 cycles a side, left to the table with 4 (RLlib's few long iterations)."""
    from synthetic_trace import write_trace

    from otel_rl.readers.analysis import analyze as read
    from otel_rl.readers.analysis.compare import compare_reports

    before, after = (read(write_trace(tmp_path / f"{ms}.perfetto-trace", learner=[("learning", ms, [])], cycles=cycles)) for ms in (10.0, 15.0))
    verdict = compare_reports(after, before)["verdict"]
    if cycles < 10:
        assert verdict.startswith(f"too few cycles to tell (n={cycles}"), verdict
    else:
        assert verdict.startswith("Learning +50% per iteration (+50% of wall time), no other phase moved the wall time by more than 0%"), verdict
        assert "the learner got slower" in verdict


def test_a_phase_of_some_iterations_that_moved_is_named_though_no_median_did(tmp_path):
    """Learning runs every 10th iteration, 1 ms then 40 ms: the median iteration is the same, the wall time is not; the
    sentence names Learning as the table shows it, never "no phase changed" beside it."""
    baseline, slower = (loop(tmp_path / name, learning_s, iterations=200, wait_s=0.003, every=10) for name, learning_s in (("a", 0.001), ("b", 0.040)))
    comparison = json.loads(analyze(slower, "--compare", baseline, "--json").stdout)
    learning = comparison["timelines"]["learner"]["phases"]["learning"]
    assert learning["per_cycle_ms"][2] > 5.0, learning  # the table: many times the time per iteration
    said = comparison["verdict"]
    assert "no phase changed" not in said and "nothing changed" not in said, said
    assert "Learning +" in said and "the learner got slower" in said, said
