"""How sure the diagnosis is: real loops with known sleeps, an injected stall, a side that holds little of the wall time, a busy host.

Each loop is instrumented with the public API and written by the real agent;
each test checks the verdict against what the loop is known to do.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import time

from verdicts import finding

import otel_rl
from otel_rl.readers.analysis import analyze, render_text
from otel_rl.readers.analysis.compare import compare_reports
from otel_rl.readers.analysis.significance import rank_sum_p


def turns(run_dir, cycles: int, learning_s: float, inference_s: float, env_s: float, stall_at: int | None = None, stall_s: float = 0.8) -> str:
    """A loop that collects (Policy Inference, Env Step) and learns in turn on one thread; one Policy Inference stalls for ``stall_s`` at ``stall_at``."""
    tel = otel_rl.init(run_dir=run_dir, system_metrics_interval_s=0, quiet=True)
    with tel.run():
        for i in range(cycles):
            with tel.iteration(i, timeline="collector"):
                with tel.phase("policy_inference", "collector"):
                    time.sleep(stall_s if i == stall_at else inference_s)
                with tel.phase("env_step", "collector"):
                    time.sleep(env_s)
            with tel.iteration(i, env_steps=8 * (i + 1)):
                with tel.phase("learning"):
                    time.sleep(learning_s)
    tel.close()
    return str(run_dir)


def test_one_stall_is_counted_as_a_stall_and_names_no_bottleneck(tmp_path):
    """Env Step 2 ms a cycle is the collector's cost; one 0.8 s Policy Inference (its median 0.2 ms) is a stall, not a bottleneck."""
    report = analyze(turns(tmp_path, 150, learning_s=0.0005, inference_s=0.0002, env_s=0.002, stall_at=70), engine="python")
    text = render_text(report)
    assert report.diagnosis.bottleneck.startswith("collector (env step"), text
    inference = report.timelines["collector"].phases["policy_inference"]
    assert inference.stalls == 1 and inference.stall_max_ms >= 800 and inference.count == 149
    assert inference.mean_ms < 5 and inference.p50_ms <= inference.trimmed_mean_ms * 1.5
    (stalls,) = [f for f in report.diagnosis.findings if f.finding.startswith("stalls hold")]
    assert "Policy Inference: 1 stall of up to" in stalls.evidence, text
    checks = [f.check for f in report.diagnosis.findings if f.finding.startswith("collection and learning take turns")]
    assert checks == ["env step cost and the number of environments"]  # the check follows the phase named
    assert "trimmed ms" in text and "stalls" in text


def test_a_stall_in_the_side_that_waits_does_not_make_it_the_bottleneck(tmp_path):
    """Learning 4 ms a cycle against a 0.7 ms collection, and one 1.5 s Policy Inference: the learner sets the pace, the stall is a stall."""
    report = analyze(turns(tmp_path, 150, learning_s=0.004, inference_s=0.0002, env_s=0.0005, stall_at=70, stall_s=1.5), engine="python")
    text = render_text(report)
    assert report.diagnosis.bottleneck.startswith("learner (learning"), text
    assert any(f.finding.startswith("stalls hold") for f in report.diagnosis.findings), text


def test_a_change_in_a_side_holding_little_wall_time_does_not_explain_the_run(tmp_path):
    """Policy Inference -65% in a collector holding ~8% of the wall time against Learning +25%: the learner is named.
    (At +10%, 0.8 ms a cycle, a loaded host's longer sleeps in the baseline could hide the learner's change.)"""
    baseline = analyze(turns(tmp_path / "a", 150, learning_s=0.008, inference_s=0.0006, env_s=0.0001), engine="python")
    run = analyze(turns(tmp_path / "b", 150, learning_s=0.010, inference_s=0.0002, env_s=0.0001), engine="python")
    comparison = compare_reports(run, baseline)
    assert finding(comparison["verdict"]).startswith("Learning +"), comparison["verdict"]
    assert "the learner got slower" in comparison["verdict"]
    inference = comparison["timelines"]["collector"]["phases"]["policy_inference"]
    # Faster per cycle (-65% as slept; a loaded host's 0.2 ms sleeps run longer, -24% was seen), little of the wall time.
    assert inference["per_cycle_ms"][2] < 0 and abs(inference["wall"]) < 0.06
    assert comparison["timelines"]["collector"]["weight"] < 0.15 and comparison["timelines"]["learner"]["weight"] > 0.85


def test_the_rank_sum_test_agrees_with_scipy():
    from scipy.stats import mannwhitneyu

    rng = random.Random(7)
    for _ in range(20):
        a = [round(rng.gauss(10, 2), 1) for _ in range(rng.randint(5, 60))]
        b = [round(rng.gauss(10.5, 2), 1) for _ in range(rng.randint(5, 60))]
        assert abs(rank_sum_p(a, b) - mannwhitneyu(a, b, alternative="two-sided", method="asymptotic").pvalue) < 1e-9


BUSY_LOOP = textwrap.dedent("""
    import sys, time
    import otel_rl

    def spin(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    tel = otel_rl.init(run_dir=sys.argv[1], system_metrics_interval_s=0.2, quiet=True)
    with tel.run():
        for i in range(300):
            with tel.iteration(i, env_steps=i + 1):
                with tel.phase("collector_wait"):
                    time.sleep(0.002)
                with tel.phase("learning"):
                    spin(0.008)
    tel.close()
""")


def test_a_repeat_on_a_busy_host_says_the_hosts_differed_before_naming_a_phase(tmp_path):
    """The same script and settings twice, the second beside CPU burners: the verdict says the host changed, not the job.

    Eight burners a CPU, running for 10 s before the second run: the load per CPU (a one-minute average, which lags a
    3 s run) rises by more than 1 whatever else the machine runs, beside both runs alike (another suite, a busy core).
    """
    script = tmp_path / "loop.py"
    script.write_text(BUSY_LOOP)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    runs = {}
    for name, burners in (("quiet", 0), ("busy", 8 * (os.cpu_count() or 1))):
        spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(burners)]
        if burners:
            time.sleep(10)
        try:
            (tmp_path / name).mkdir()
            subprocess.run([sys.executable, str(script), "run"], cwd=tmp_path / name, env=env, check=True, timeout=120)
        finally:
            for process in spinning:
                process.kill()
                process.wait()
        runs[name] = tmp_path / name / "run"
    result = subprocess.run([sys.executable, "-m", "otel_rl.cli", "analyze", str(runs["busy"]), "--compare", str(runs["quiet"])],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    verdict = result.stdout.splitlines()[0]
    assert verdict.startswith("verdict: the same settings, but the hosts differed (") and "load per CPU" in verdict, result.stdout
    assert "the change may be the host's, not the job's" in verdict
    assert "baseline host (median):" in result.stdout and "run host (median):" in result.stdout
