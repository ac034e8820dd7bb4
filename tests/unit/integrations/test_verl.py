"""verl's own ``Tracking``, handed the metrics of verl steps as ``metric_utils`` makes them: phases, a verdict, scalars."""

from __future__ import annotations

import json
import time

import pytest
import torch

import otel_rl
from otel_rl.formats import schema
from otel_rl.readers.analysis import analyze

pytest.importorskip("verl", reason="verl is installed by make test (without its tensordict pin: see the Makefile)")

from verl import DataProto  # noqa: E402
from verl.trainer.ppo.metric_utils import compute_throughout_metrics, compute_timing_metrics  # noqa: E402
from verl.utils.tracking import Tracking  # noqa: E402

from otel_rl.integrations.verl import instrument  # noqa: E402

TIMING = {"gen": 0.021, "reward": 0.002, "old_log_prob": 0.004, "ref": 0.0035, "adv": 0.0005, "update_actor": 0.008, "update_weights": 0.001}
STEP_S = sum(TIMING.values()) + 0.001  # 1 ms of bookkeeping in no timer


def step_metrics(step: int) -> dict:
    """One step's metrics as verl's trainer makes them: its own, then metric_utils' timing and throughput."""
    n, prompt, response = 8, 16, 32
    batch = DataProto.from_dict(tensors={"responses": torch.ones(n, response, dtype=torch.long),
                                         "attention_mask": torch.ones(n, prompt + response, dtype=torch.long)},
                                meta_info={"global_token_num": [prompt + response] * n})  # fmt: skip
    timing = {**TIMING, "step": STEP_S}
    own = {"actor/pg_loss": 0.1 / step, "actor/entropy": 2.0, "critic/score/mean": 0.5 + step / 100, "response_length/mean": 31.0}
    return {**own, **compute_timing_metrics(batch, timing), **compute_throughout_metrics(batch, timing, n_gpus=1)}


def test_a_verl_step_logged_through_its_tracking_is_a_rebuilt_step_of_canonical_phases(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "verl-tensorboard"))
    tel = otel_rl.init(run_dir=tmp_path / "run", system_metrics_interval_s=0, quiet=True)
    instrument(tel)
    undo = instrument(tel)  # set up twice: each step is still recorded once
    try:
        tracking = Tracking("otel-rl-test", "grpo", default_backend=["console", "tensorboard"])
        for step in range(1, 13):
            time.sleep(STEP_S)  # the step runs, then verl logs it
            tracking.log(step_metrics(step), step=step)
    finally:
        undo()
        tel.close()
    assert Tracking.log.__qualname__ == "Tracking.log"  # undone
    assert list((tmp_path / "verl-tensorboard").glob("events.out.tfevents.*"))  # verl's own backend wrote as usual
    report = analyze(tmp_path / "run")
    learner = report.timelines["learner"]
    assert learner.cycles == 12
    expected = {"generation": 21, "reward": 2, "old_log_prob": 4, "ref_log_prob": 3.5, "advantage": 0.5, "learning": 8, "weight_publish": 1}
    for name, ms in expected.items():
        assert learner.phases[name].mean_ms == pytest.approx(ms, abs=0.01), name  # laid out from the durations, to the nanosecond
    assert learner.other_share == pytest.approx(1 / 41, abs=1e-3)  # what no timer holds
    assert report.diagnosis.bottleneck == "learner (generation)" and report.diagnosis.phase == "generation"
    (finding,) = [f for f in report.diagnosis.findings if "Generation is" in f.evidence]
    assert "num_generations" in finding.check and "rollout.n" in finding.check  # the lever, in the trainers' own terms
    said = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rebuilt = [r for r in said if r["kind"] == "event" and r["name"] == "timeline_rebuilt"]
    assert len(rebuilt) == 1 and rebuilt[0]["attributes"]["source"] == "verl timing_s"  # the trace says it was rebuilt
    scalars = [r for r in said if r["kind"] == "scalars"]
    steps = lambda key: [r["step"] for r in scalars if key in r["values"]]  # noqa: E731
    assert steps(schema.TOKENS_PER_S) == list(range(1, 13)) and steps("Loss/policy") == list(range(1, 13))
    assert steps("verl/timing_per_token_ms/gen") == list(range(1, 13)) and steps("Train/mean_reward") == list(range(1, 13))
    assert not [r for r in scalars if any(k.startswith("verl/timing_s/") for k in r["values"])]  # the timings are phases, not scalars


def test_verls_own_timers_make_live_phases_and_the_logged_step_is_not_laid_out_again(tmp_path):
    """Where verl's trainer times its steps (marked_timer, imported by name as its trainers do), each timer is a phase as it runs."""
    import verl.utils.profiler

    tel = otel_rl.init(run_dir=tmp_path / "run", system_metrics_interval_s=0, quiet=True)
    undo = instrument(tel)
    try:
        from verl.utils.debug import marked_timer  # as ray_trainer imports it, once instrumented

        tracking = Tracking("otel-rl-test", "live", default_backend="console")
        for step in range(1, 6):
            timing_raw: dict[str, float] = {}
            with marked_timer("step", timing_raw):  # as RayPPOTrainer.fit() does
                for name, seconds in TIMING.items():
                    with marked_timer(name, timing_raw):
                        time.sleep(seconds)
            assert set(timing_raw) == {*TIMING, "step"}  # verl's own timing goes on
            tracking.log({f"timing_s/{k}": v for k, v in timing_raw.items()}, step=step)
    finally:
        undo()
        tel.close()
    assert verl.utils.profiler.marked_timer.__module__ != "otel_rl.integrations.verl"  # undone
    learner = analyze(tmp_path / "run").timelines["learner"]
    assert learner.cycles == 5 and learner.phases["generation"].mean_ms >= 21 and learner.phases["learning"].mean_ms >= 8
    said = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert not [r for r in said if r["kind"] == "event" and r["name"] == "timeline_rebuilt"]  # live, not rebuilt


def test_a_nan_timing_costs_only_itself_and_tensor_metrics_are_numbers(tmp_path, caplog):
    import logging

    tel = otel_rl.init(run_dir=tmp_path / "run", system_metrics_interval_s=0, quiet=True)
    undo = instrument(tel)
    try:
        tracking = Tracking("otel-rl-test", "nan", default_backend="console")
        with caplog.at_level(logging.WARNING, logger="otel_rl"):
            for step in range(1, 4):
                metrics = step_metrics(step)
                if step == 2:
                    metrics["timing_s/reward"] = float("nan")  # one timer that went wrong
                    metrics["timing_s/adv"] = float("inf")
                metrics["actor/kl_loss"] = torch.tensor(0.25 * step)  # 0-d, as a loss is before .item()
                metrics["actor/grad_norm"] = torch.tensor([1.5])  # one element
                metrics["actor/per_token"] = torch.ones(4)  # four: not one number
                tracking.log(metrics, step=step)
    finally:
        undo()
        tel.close()
    assert "Traceback" not in caplog.text and "could not be recorded" not in caplog.text
    assert sum("actor/per_token" in r.getMessage() and "holds 4 values" in r.getMessage() for r in caplog.records) == 1
    said = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    scalars = [r for r in said if r["kind"] == "scalars"]
    steps = lambda key: [r["step"] for r in scalars if r["values"].get(key) is not None]  # noqa: E731
    assert steps("Loss/policy") == [1, 2, 3] and steps("Train/mean_reward") == [1, 2, 3]  # step 2's loss and reward kept
    assert steps("verl/actor/kl_loss") == [1, 2, 3] and steps("Train/grad_norm") == [1, 2, 3]
    assert [r["values"]["verl/actor/kl_loss"] for r in scalars if "verl/actor/kl_loss" in r["values"]] == [0.25, 0.5, 0.75]
    nonfinite = {r["attributes"]["key"] for r in said if r["kind"] == "event" and r["name"] == "nonfinite"}
    assert {"verl/timing_s/reward", "verl/timing_s/adv"} <= nonfinite  # the bad timings are said
    assert analyze(tmp_path / "run").timelines["learner"].cycles == 3  # step 2 laid out from its other timings
