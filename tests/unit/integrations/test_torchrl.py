"""TorchRL: a real PPO (ClipPPOLoss, GAE) on CartPole, collected by a TorchRL Collector and logged by TelemetryLogger."""

from __future__ import annotations

import pytest

import torch
from integration_checks import check_run, counts, framework, records
from tensordict.nn import TensorDictModule
from torchrl.collectors import Collector
from torchrl.envs import GymEnv, StepCounter, TransformedEnv
from torchrl.modules import MLP, OneHotCategorical, ProbabilisticActor, ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

import otel_rl
from otel_rl.integrations.torchrl import TelemetryLogger, iterate

pytestmark = pytest.mark.slow  # a real RL library, the demo, or a whole machine: pytest -m 'not slow' leaves it out

FRAMES_PER_BATCH, TOTAL_FRAMES = 256, 2048


def test_ppo_with_a_torchrl_collector_records_both_timelines_and_its_losses(tmp_path):
    torch.manual_seed(0)
    tel = otel_rl.init(run_dir=tmp_path)  # the fewest lines: no tel.run(), no output options
    env = TransformedEnv(GymEnv("CartPole-v1"), StepCounter())
    logits = TensorDictModule(MLP(in_features=4, out_features=2, num_cells=[32]), in_keys=["observation"], out_keys=["logits"])
    policy = ProbabilisticActor(logits, in_keys=["logits"], distribution_class=OneHotCategorical, return_log_prob=True, spec=env.action_spec)
    value = ValueOperator(MLP(in_features=4, out_features=1, num_cells=[32]), in_keys=["observation"])
    loss = ClipPPOLoss(policy, value, entropy_coeff=0.01)
    advantage = GAE(gamma=0.99, lmbda=0.95, value_network=value)
    optimizer = torch.optim.Adam(loss.parameters(), lr=3e-4)
    collector = Collector(env, policy, frames_per_batch=FRAMES_PER_BATCH, total_frames=TOTAL_FRAMES, auto_register_policy_transforms=False)
    logger = TelemetryLogger(tel)
    logger.log_hparams({"lr": 3e-4, "frames_per_batch": FRAMES_PER_BATCH})
    frames = 0
    for batch in iterate(collector, tel):
        frames += batch.numel()
        with torch.no_grad():
            advantage(batch)
        for _ in range(2):
            losses = loss(batch.reshape(-1))
            total = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
            optimizer.zero_grad()
            total.backward()
            optimizer.step()
        logger.log_metrics({k: v.detach() for k, v in losses.items() if k.startswith("loss_")}, step=frames)
        logger.log_scalar("reward", batch["next", "reward"].mean(), step=frames)
        logger.log_histogram("advantage", batch["advantage"], step=frames)
    collector.shutdown()
    tel.close()
    found = check_run(
        tmp_path,
        {"learner": {"Learning", "Policy Inference", "Env Step"}},
        {"Loss/policy", "Loss/value", "Loss/entropy", "Train/mean_step_reward", "torchrl/advantage/p50",
         "Perf/learning_time", "Perf/collector_env_step_ms"},
    )  # fmt: skip
    assert "custom/loss_objective" not in found["keys"]
    assert framework(tmp_path) == {"system": "torchrl", "environment": "CartPole-v1"}
    all_records = records(tmp_path)
    (hparams,) = [r["attributes"] for r in all_records if r["kind"] == "event" and r["name"] == "hparams"]
    assert hparams == {"lr": 3e-4, "frames_per_batch": FRAMES_PER_BATCH}
    steps = [r["step"] for r in all_records if r["kind"] == "scalars" and "Loss/policy" in r["values"]]
    assert steps == [FRAMES_PER_BATCH * (i + 1) for i in range(TOTAL_FRAMES // FRAMES_PER_BATCH)]
    (running,) = [r for r in all_records if r["kind"] == "run" and r["status"] == "running"]
    assert running["total_steps"] == TOTAL_FRAMES
    counted = counts(tmp_path)
    assert counted["collector"]["cycles"] == counted["learner"]["cycles"] == TOTAL_FRAMES // FRAMES_PER_BATCH
    assert counted["collector"]["env_step"] == TOTAL_FRAMES
    assert "rollout" not in vars(collector)  # the wrapping is undone when the loop ends
