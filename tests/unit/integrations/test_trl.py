"""TRL's GRPOTrainer on the CPU, instrumented: a tiny GPT-2 built from its configuration, a tokenizer built here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from locations import SUPPORT

from otel_rl.formats import schema
from otel_rl.readers.analysis import analyze

TARGET = SUPPORT / "trl_target.py"


def train(run_dir: Path, steps: int, mode: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_", "WANDB_")) or k == "OTEL_RL_RUN_DIR"}
    clean.update({"OTEL_RL_PANEL": "0", "PYTHONPATH": str(SUPPORT), **env})
    return subprocess.run([sys.executable, str(TARGET), str(run_dir), str(steps), mode], capture_output=True, text=True, timeout=600,
                          env=clean, cwd=run_dir.parent)  # fmt: skip


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def grpo(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("grpo") / "run"
    done = train(run_dir, 6, "plain")
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


def test_each_step_is_an_iteration_of_generation_reward_log_probs_and_learning(grpo):
    report = analyze(grpo)
    learner = report.timelines["learner"]
    assert learner.cycles == 6
    phases = learner.phases
    assert {"generation", "reward", "old_log_prob", "ref_log_prob", "learning"} <= set(phases), sorted(phases)
    assert not phases["generation"].nested and phases["reward_len"].nested and phases["optimizer"].nested  # each reward function inside reward
    assert phases["generation"].count + phases["generation"].stalls == 3  # num_iterations=2: a generation batch serves two steps
    learning = phases["learning"]  # once a step (no gradient accumulation), its backward pass and optimizer inside it
    assert learning.count + learning.stalls == 6 and phases["optimizer"].count + phases["optimizer"].stalls == 6
    assert learning.total_ms + learning.stall_ms >= phases["backward"].total_ms + phases["backward"].stall_ms + phases["optimizer"].total_ms
    assert learner.other_share < 0.2 and learner.accounted_share + learner.stall_share > 0.8, learner  # the phases account for the step
    assert report.diagnosis.side == "learner" and report.diagnosis.phase in phases, report.diagnosis
    assert report.diagnosis.bottleneck.startswith("learner (")


def test_trls_logs_are_scalars_at_its_steps_with_tokens(grpo):
    said = records(grpo)
    scalars = [r for r in said if r["kind"] == "scalars"]
    steps = lambda key: [r["step"] for r in scalars if key in r["values"]]  # noqa: E731
    for key in ("Loss/policy", "Policy/approx_kl", "Policy/entropy", "Train/grad_norm", "Train/learning_rate"):
        assert steps(key) == [1, 2, 3, 4, 5, 6], key  # TRL's global step, from its merged logs
    for key in ("Train/mean_reward", "Train/reward_std", "Train/mean_completion_length", "trl/rewards/reward_len/mean", "Train/completion_tokens"):
        assert steps(key) == [1, 3, 5], key  # what a generation measures, at the steps that generated
    tokens = [r["values"] for r in scalars if "Train/completion_tokens" in r["values"]]
    assert len(tokens) == 3 and all(t["Train/prompt_tokens"] == 8 * 4 and 0 < t["Train/completion_tokens"] <= 8 * 8 for t in tokens)  # 8 completions of 4-word prompts
    rates = [r["values"][schema.TOKENS_PER_S] for r in scalars if schema.TOKENS_PER_S in r["values"]]
    assert len(rates) == 3 and all(rate > 0 for rate in rates)
    runs = [r for r in said if r["kind"] == "run"]
    assert runs[-1]["status"] == "finished" and [r for r in runs if r["status"] == "running"][0]["config"]["num_generations"] == 4
    assert any(r["kind"] == "event" and r["name"] == "framework" and r["attributes"]["system"] == "trl" for r in said)


def test_a_reward_function_that_raises_ends_the_run_failed_with_its_reason(tmp_path):
    run_dir = tmp_path / "run"
    done = train(run_dir, 6, "raise")
    assert done.returncode != 0 and "unreachable" in done.stderr
    runs = [r for r in records(run_dir) if r["kind"] == "run"]
    assert runs[-1]["status"] == "failed" and "the reward judge at http://judge:8000 is unreachable" in runs[-1]["reason"], runs[-1]
    report = analyze(run_dir)
    assert report.timelines["learner"].phases["judge"].nested  # the failing function, timed up to its failure


def test_trls_own_wandb_run_goes_on_beside_otel_rl_and_one_run_when_both_ask(tmp_path):
    from wandb_reader import history, run_dirs

    beside = tmp_path / "beside"
    done = train(beside, 4, "trl-wandb", WANDB_MODE="offline", WANDB_DIR=str(tmp_path / "trl-wandb"))
    assert done.returncode == 0, done.stderr[-3000:]
    (trl_run,) = run_dirs(tmp_path / "trl-wandb")  # TRL's own, as configured
    assert any("train/loss" in row for row in history(trl_run))
    assert [r["step"] for r in records(beside) if r["kind"] == "scalars" and "Loss/policy" in r["values"]] == [1, 2, 3, 4]
    both = tmp_path / "both"
    done = train(both, 4, "both-wandb", WANDB_MODE="offline", WANDB_DIR=str(tmp_path / "both-wandb"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "TRL's W&B callback is left out" in done.stderr
    assert not (tmp_path / "both-wandb").exists() or not run_dirs(tmp_path / "both-wandb")  # TRL made none
    (ours,) = run_dirs(both)  # otel-rl's, in the run folder
    assert [row["Loss/policy"] for row in history(ours) if "Loss/policy" in row]


def test_two_processes_under_accelerate_launch_are_one_run_on_one_timeline(tmp_path):
    """``accelerate launch`` of two CPU processes (gloo): both ranks record into one run, one learner timeline per rank."""
    run_dir = tmp_path / "run"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_", "WANDB_")) or k == "OTEL_RL_RUN_DIR"}
    clean.update(OTEL_RL_PANEL="0", PYTHONPATH=str(SUPPORT))
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
              "--mixed_precision", "no", "--dynamo_backend", "no", str(TARGET), str(run_dir), "4", "plain"]  # fmt: skip
    done = subprocess.run(launch, capture_output=True, text=True, timeout=600, env=clean, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run_dir / "run_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["status"] == "finished"
    learner = analyze(run_dir).timelines["learner"]
    assert learner.cycles == 8 and [(r.rank, r.cycles) for r in learner.ranks] == [(0, 4), (1, 4)]
    assert all({"generation", "reward", "learning"} <= set(r.phases) for r in learner.ranks)


def test_rloo_shares_the_code_path_and_its_old_and_reference_passes_are_told_apart(tmp_path):
    run_dir = tmp_path / "run"
    done = train(run_dir, 4, "rloo")
    assert done.returncode == 0, done.stderr[-3000:]
    report = analyze(run_dir)
    phases = report.timelines["learner"].phases
    assert report.timelines["learner"].cycles == 4
    for name in ("generation", "reward", "old_log_prob", "ref_log_prob"):  # RLOO computes the old policy's log-probs on every generation
        assert phases[name].count + phases[name].stalls == 4, name
    assert [r["step"] for r in records(run_dir) if r["kind"] == "scalars" and "Loss/policy" in r["values"]] == [1, 2, 3, 4]


@pytest.mark.slow  # a real TRL training
def test_a_reward_that_collapsed_to_nan_is_said_not_left_out(tmp_path):
    run_dir = tmp_path / "run"
    done = train(run_dir, 2, "nan")
    assert done.returncode == 0, done.stderr[-3000:]
    said = records(run_dir)
    nonfinite = [r for r in said if r["kind"] == "event" and r["name"] == "nonfinite"]
    assert any("Train/mean_reward" in json.dumps(r["attributes"]) for r in nonfinite), nonfinite
    assert "Train/mean_reward" in done.stderr  # one warning names it


@pytest.mark.slow  # four real TRL trainings
def test_three_trainers_with_one_tel_are_said_once_and_each_is_freed(tmp_path):
    run_dir = tmp_path / "run"
    done = train(run_dir, 2, "three")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "alive: 0" in done.stdout  # instrument() keeps no trainer (nor its model) alive
    assert done.stderr.count("a run starts again in this Telemetry") == 1
    runs = [r["status"] for r in records(run_dir) if r["kind"] == "run"]
    assert runs.count("finished") == 3


def test_with_the_panel_on_transformers_progress_bar_is_left_out(tmp_path):
    """The panel draws: transformers' bar (and its printed logs) would land between its frames; left out, said once."""
    run_dir = tmp_path / "run"
    done = train(run_dir, 2, "plain", OTEL_RL_PANEL="1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("transformers' progress bar is left out") == 1, done.stderr[-3000:]
    training = done.stderr[done.stderr.index("progress bar is left out"):]  # the model's loading bars come before
    assert "/2 [" not in training and "{'loss'" not in done.stdout, training[-3000:]  # the trainer's bar: "1/2 [00:01<00:01, ...]"
    assert [r["step"] for r in records(run_dir) if r["kind"] == "scalars" and "Loss/policy" in r["values"]] == [1, 2]
