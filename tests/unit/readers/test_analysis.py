"""otel-rl analyze: statistics and the bottleneck diagnosis on traces built for each class."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from synthetic_trace import write_trace

import otel_rl
from otel_rl.readers.analysis import Report, analyze, analyze_model, read_trace, render_text
from otel_rl.readers.analysis.sql_engine import TraceProcessorUnavailable

COLLECTOR_BOUND = dict(
    learner=[("collector_wait", 6.0, []), ("inference", 0.5, []), ("learning", 2.0, [])],
    collector=[("inference_request", 0.1, []), ("learner_action_wait", 0.8, []), ("env_step", 6.0, []), ("replay_write", 1.0, [])],
)
LEARNER_BOUND = dict(
    learner=[("collector_wait", 0.2, []), ("inference", 0.5, []), ("replay_sample", 0.5, []), ("learning", 8.0, [])],
    collector=[("inference_request", 0.1, []), ("learner_action_wait", 7.0, []), ("env_step", 1.0, []), ("replay_write", 0.5, [])],
)


def test_collector_bound(tmp_path):
    report = analyze(write_trace(tmp_path / "t.perfetto-trace", **COLLECTOR_BOUND))
    assert report.diagnosis.bottleneck == "collector (env step)"
    finding = report.diagnosis.findings[0]
    assert "Collector Wait is 70% of Iter Wall" in finding.evidence
    assert "Env Step is" in finding.evidence and "env step cost" in finding.check


def test_learner_bound(tmp_path):
    report = analyze(write_trace(tmp_path / "t.perfetto-trace", **LEARNER_BOUND))
    assert report.diagnosis.bottleneck == "learner (learning)"
    finding = report.diagnosis.findings[0]
    assert "Learner Action Wait" in finding.evidence and "Learning is" in finding.evidence
    assert "updates per step" in finding.check


def test_inference_points_at_its_largest_part(tmp_path):
    learner = [
        ("collector_wait", 0.2, []),
        ("inference", 5.0, [("inference_h2d", 0.5), ("inference_forward", 1.0), ("inference_d2h", 3.4)]),
        ("learning", 4.0, []),
    ]
    report = analyze(write_trace(tmp_path / "t.perfetto-trace", learner=learner))
    assert report.diagnosis.bottleneck == "learner (inference)"
    (inference,) = [f for f in report.diagnosis.findings if "action path" in f.finding]
    assert inference.check == "d2h first"
    assert "D2H 37%" in inference.evidence
    table = report.timelines["learner"].phases
    assert table["inference_d2h"].nested and not table["inference"].nested
    # Nested phases are never counted twice.
    assert abs(report.timelines["learner"].accounted_share - 9.2 / 9.3) < 0.01


def test_replay_batch_wait_means_prefetch_falls_behind(tmp_path):
    learner = [("collector_wait", 0.2, []), ("replay_batch_wait", 2.0, []), ("learning", 6.0, [])]
    report = analyze(write_trace(tmp_path / "t.perfetto-trace", learner=learner))
    assert any("prefetch falls behind" in f.finding for f in report.diagnosis.findings)


def test_replay_write_means_ingress_saturated(tmp_path):
    collector = [("learner_action_wait", 0.5, []), ("env_step", 1.0, []), ("replay_write", 3.0, [])]
    report = analyze(write_trace(tmp_path / "t.perfetto-trace", learner=COLLECTOR_BOUND["learner"], collector=collector))
    assert report.diagnosis.bottleneck == "collector (replay write)"
    assert any("ingress is saturated" in f.finding for f in report.diagnosis.findings)


def test_background_submit_is_not_a_bottleneck(tmp_path):
    learner = [("collector_wait", 0.2, []), ("learning", 5.0, [])]
    report = analyze(
        write_trace(tmp_path / "t.perfetto-trace", learner=learner, background=("replay_ingress_h2d_submit", 4.0))
    )
    assert report.diagnosis.bottleneck == "learner (learning)"
    (background,) = [f for f in report.diagnosis.findings if "background" in f.finding]
    assert "not a bottleneck" in background.finding
    submit = report.timelines["learner"].phases["replay_ingress_h2d_submit"]
    assert submit.background and abs(report.timelines["learner"].accounted_share - 5.2 / 5.3) < 0.01


def test_other_and_overlap(tmp_path):
    report = analyze(write_trace(tmp_path / "t.perfetto-trace", learner=[("learning", 2.0, [])], learner_other_ms=2.0))
    entry = report.timelines["learner"]
    assert abs(entry.other_share - 0.5) < 0.01 and abs(entry.accounted_share + entry.other_share - 1) < 1e-9
    assert any("in no phase" in f.finding for f in report.diagnosis.findings)
    overlapping = analyze(write_trace(tmp_path / "o.perfetto-trace", **LEARNER_BOUND))
    # Learner busy 9.0 of 9.3 ms per cycle, collector busy 1.6 of 8.6: both busy about 1.6 / 9.3 of the time.
    assert 0.1 < overlapping.overlap_share < 0.25


def test_host_timing_matches_known_sleeps(tmp_path):
    tel = otel_rl.init(run_dir=tmp_path, trace_enabled=True)
    for i in range(20):
        with tel.iteration(i):
            with tel.phase("learning"):
                time.sleep(0.005)
    tel.close()
    stat = analyze(tmp_path).timelines["learner"].phases["learning"]
    assert stat.count == 20
    assert 5.0 <= stat.p50_ms < 5.0 + 2.0  # sleep() may overshoot, never undershoot


def test_sql_engine_says_clearly_that_it_needs_a_binary(tmp_path):
    path = write_trace(tmp_path / "t.perfetto-trace", learner=[("learning", 1.0, [])], cycles=3)
    with pytest.raises(TraceProcessorUnavailable, match="trace_processor_shell"):
        read_trace(path, engine="sql")
    assert read_trace(path)[1] == "python"  # auto falls back


TRACE_PROCESSOR = os.environ.get("OTEL_RL_TRACE_PROCESSOR") or shutil.which("trace_processor_shell")


@pytest.mark.skipif(
    not TRACE_PROCESSOR,
    reason="no trace_processor_shell binary (set OTEL_RL_TRACE_PROCESSOR); the perfetto package cannot download one without internet",
)
def test_engines_agree(tmp_path):
    path = write_trace(tmp_path / "t.perfetto-trace", gpu=[(7, 0.5, 2.0)], **LEARNER_BOUND)
    python_model, _ = read_trace(path, "python")
    sql_model, _ = read_trace(path, "sql", TRACE_PROCESSOR)
    assert analyze_model(python_model) == analyze_model(sql_model)


def test_an_llm_rl_step_is_read_as_any_other_with_the_lever_in_the_trainers_terms(tmp_path):
    """Generation holding most of the step names it, with TRL's and verl's settings; log-prob passes that weigh, too."""
    generation_bound = [("generation", 7.0, []), ("reward", 0.5, [("reward_len", 0.4)]), ("old_log_prob", 0.5, []),
                        ("ref_log_prob", 0.5, []), ("learning", 1.4, [])]  # fmt: skip
    report = analyze(write_trace(tmp_path / "g.perfetto-trace", learner=generation_bound))
    assert report.diagnosis.bottleneck == "learner (generation)" and (report.diagnosis.side, report.diagnosis.phase) == ("learner", "generation")
    (pace,) = [f for f in report.diagnosis.findings if "Generation is" in f.evidence]
    assert "num_generations" in pace.check and "rollout.n" in pace.check and "max_completion_length" in pace.check
    assert report.timelines["learner"].phases["reward_len"].nested
    log_prob_bound = [("generation", 2.0, []), ("old_log_prob", 2.0, []), ("ref_log_prob", 2.5, []), ("learning", 3.0, [])]
    report = analyze(write_trace(tmp_path / "l.perfetto-trace", learner=log_prob_bound))
    (passes,) = [f for f in report.diagnosis.findings if f.finding == "the log-prob passes take much of the step"]
    assert "Old Log-Prob 21% and Ref Log-Prob 26%" in passes.evidence and "beta=0" in passes.check


def test_cli_text_json_and_plot(tmp_path):
    path = write_trace(tmp_path / "t.perfetto-trace", **COLLECTOR_BOUND)
    text = subprocess.run([sys.executable, "-m", "otel_rl.cli", "analyze", str(tmp_path)], capture_output=True, text=True, check=True)
    assert text.stdout.splitlines()[0] == "bottleneck: collector (env step)"
    png = tmp_path / "plot.png"
    out = subprocess.run(
        [sys.executable, "-m", "otel_rl.cli", "analyze", str(path), "--json", "--plot", str(png)],
        capture_output=True,
        text=True,
        check=True,
    )
    printed = json.loads(out.stdout)
    assert printed["engine"] == "python"
    read_back = Report.from_json(printed)  # the typed report, whole, from its JSON
    assert read_back == analyze(path) and render_text(read_back) == text.stdout.rstrip("\n")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    missing = subprocess.run([sys.executable, "-m", "otel_rl.cli", "analyze", str(tmp_path / "nope")], capture_output=True, text=True)
    assert missing.returncode == 2 and "no trace" in missing.stderr


def test_time_in_no_phase_is_named_unaccounted_not_blamed_on_a_phase(tmp_path):
    learner = [("collector_wait", 0.2, []), ("inference", 1.0, []), ("learning", 1.5, [])]
    report = analyze(write_trace(tmp_path / "t.perfetto-trace", learner=learner, learner_other_ms=6.0))
    assert report.diagnosis.bottleneck.startswith("learner (unaccounted: 69% of Iter Wall")
    (finding,) = [f for f in report.diagnosis.findings if "in no phase" in f.finding]
    assert "time the loop's remaining work" in finding.check


def test_the_run_summary_quantiles_agree_with_analyze(tmp_path):
    """One method, nearest rank: exact in analyze, within 1% in run_summary.json (a sketch of the stream)."""
    import random

    from otel_rl.outputs.aggregates import QUANTILE_ACCURACY

    rng = random.Random(7)
    tel = otel_rl.init(run_dir=tmp_path, system_metrics_interval_s=0)
    with tel.run():
        for i in range(300):
            with tel.iteration(i):
                with tel.phase("learning"):
                    end = time.perf_counter() + rng.lognormvariate(-7.5, 0.8)  # about 0.2 to 2 ms
                    while time.perf_counter() < end:
                        pass
    tel.close()
    from otel_rl.readers.analysis.measure import measure

    exact = measure(read_trace(tmp_path)[0]).timelines["learner"]  # the whole run, as the summary has it (analyze's tables are its steady state's)
    summary = json.loads((tmp_path / "run_summary.json").read_text())["timelines"]["learner"]
    for quantile in ("p50_ms", "p95_ms"):
        truth = getattr(exact.phases["learning"], quantile)
        assert abs(summary["phases"]["learning"][quantile] - truth) <= QUANTILE_ACCURACY * truth * 1.001 + 1e-6, quantile
        assert abs(summary["iterations"][quantile] - getattr(exact.cycle_ms, quantile)) <= QUANTILE_ACCURACY * getattr(exact.cycle_ms, quantile) * 1.001 + 1e-6


def test_the_collectors_time_in_no_phase_is_named_unaccounted_by_the_same_rule(tmp_path):
    """As the learner's: a collector cycle mostly in no phase (RLlib's env runner before its connectors were timed)."""
    collector = [("policy_inference", 1.0, []), ("env_step", 0.5, [])]
    report = analyze(write_trace(tmp_path / "t.perfetto-trace", learner=COLLECTOR_BOUND["learner"], collector=collector, collector_other_ms=5.0))
    assert report.diagnosis.bottleneck == "collector (unaccounted: 77% of its cycle is in no phase)"
    (waits, *_) = report.diagnosis.findings
    assert "the collector's cycle is 77% in no phase" in waits.evidence and "remaining work as phases" in waits.check
    (finding,) = [f for f in report.diagnosis.findings if f.finding == "much of the collector's cycle is in no phase"]
    assert "Other is 77% of its cycle" in finding.evidence


def test_the_plots_share_labels_never_overlap(tmp_path):
    """Narrow phases side by side (Collector Release beside Inference): a label that does not fit its bar is left to the legend."""
    pytest.importorskip("matplotlib")
    from otel_rl.readers.analysis.plot import figure

    learner = [("collector_wait", 3.0, []), ("collector_release", 0.4, []), ("inference", 0.5, []), ("replay_sample", 0.3, []), ("learning", 6.0, [])]
    model, _ = read_trace(write_trace(tmp_path / "t.perfetto-trace", learner=learner))
    fig = figure(model, analyze_model(model))
    renderer = fig.canvas.get_renderer()
    shares = fig.axes[1]
    boxes = [t.get_window_extent(renderer) for t in shares.texts]
    assert {t.get_text() for t in shares.texts} == {"Collector Wait", "Learning"}  # the narrow ones went to the legend
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])


def test_a_phase_inside_one_of_its_own_name_is_counted_once(tmp_path):
    """A library's wrapper and the loop both time ``learning``: analyze, Perf/* and the live verdict count the outer one."""
    tel = otel_rl.init(run_dir=tmp_path, quiet=True, system_metrics_interval_s=0)
    with tel.run():
        for i in range(40):
            with tel.iteration(i, env_steps=i):
                with tel.phase("collector_wait"):
                    time.sleep(0.002)
                with tel.phase("learning"):
                    with tel.phase("learning"):
                        time.sleep(0.020)
    tel.close()
    learner = analyze(tmp_path).timelines["learner"]
    learning = learner.phases["learning"]
    assert learning.count + learning.stalls == 40 and not learning.nested
    assert learner.accounted_share + learner.stall_share <= 1.0 and learner.other_share < 0.2
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    perf = [r["values"] for r in records if r["kind"] == "scalars" and "Perf/learning_time" in r["values"]]
    assert perf and all(v["Perf/learning_time"] <= v["Perf/iteration_time"] for v in perf), perf
