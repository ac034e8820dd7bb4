"""``otel-rl analyze`` on real runs of libraries that collect and learn in turn: the verdict follows the wall time.

Each library is run twice with the fewest lines a user writes: once with its
collection made slow (an environment wrapper that sleeps in ``step``), once
with its learning made slow (many epochs). The bottleneck must name the side
that took the time, both ways.
"""

from __future__ import annotations

import time

import gymnasium as gym
import pytest
import torch
from verdicts import finding

import otel_rl
from otel_rl.readers.analysis import analyze, read_trace, render_text
from otel_rl.readers.analysis.plot import timeline_rows

pytestmark = pytest.mark.slow  # a real RL library, the demo, or a whole machine: pytest -m 'not slow' leaves it out

SLEEP_S = 0.002


class SlowStep(gym.Wrapper):
    """An environment whose every step takes ``SLEEP_S`` more: collection made slow."""

    def step(self, action):
        time.sleep(SLEEP_S)
        return self.env.step(action)


def verdict(run_dir) -> str:
    report = analyze(run_dir, engine="python")
    assert report.turns is not None, render_text(report)  # recognised as taking turns
    return report.diagnosis.bottleneck


@pytest.mark.parametrize("slow", ["collection", "learning"])
def test_sb3_ppo(tmp_path, slow):
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    from otel_rl.integrations.sb3 import TelemetryCallback

    tel = otel_rl.init(run_dir=tmp_path)
    wrapper = SlowStep if slow == "collection" else None
    env = make_vec_env("CartPole-v1", n_envs=2, seed=0, wrapper_class=wrapper)
    epochs = 1 if slow == "collection" else 40
    model = PPO("MlpPolicy", env, n_steps=128, batch_size=32, n_epochs=epochs, device="cpu", seed=0)
    model.learn(768, callback=TelemetryCallback(tel))
    tel.close()
    assert verdict(tmp_path).startswith("collector" if slow == "collection" else "learner")
    # --plot: the one thread gets a row per timeline, each drawing its own slices.
    trace, _ = read_trace(tmp_path)
    rows = timeline_rows([s for s in trace.slices if s.category in ("learner", "collector") and not s.name.endswith(" iteration")])
    (learner,) = [own for (timeline, _, _), own in rows.items() if timeline == "learner"]
    (collector,) = [own for (timeline, _, _), own in rows.items() if timeline == "collector"]
    assert {s.name for s in learner} == {"Learning"} and {"Env Step", "Policy Inference"} <= {s.name for s in collector}
    assert {s.track for s in learner} == {s.track for s in collector}  # the same thread


@pytest.mark.parametrize("slow", ["collection", "learning"])
def test_skrl_ppo(tmp_path, slow):
    from skrl.agents.torch.ppo import PPO, PPO_CFG
    from skrl.envs.wrappers.torch import wrap_env
    from skrl.memories.torch import RandomMemory
    from skrl.trainers.torch import SequentialTrainer
    from skrl_models import Policy, Value

    from otel_rl.integrations.skrl import instrument

    tel = otel_rl.init(run_dir=tmp_path)
    wrappers = [SlowStep] if slow == "collection" else None
    env = wrap_env(gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync", wrappers=wrappers))
    spaces = {"observation_space": env.observation_space, "action_space": env.action_space, "device": env.device}
    cfg = PPO_CFG(rollouts=128, learning_epochs=1 if slow == "collection" else 60, mini_batches=8,
                  experiment={"directory": str(tmp_path / "skrl"), "write_interval": 0, "checkpoint_interval": 0})  # fmt: skip
    agent = PPO(models={"policy": Policy(**spaces), "value": Value(**spaces)},
                memory=RandomMemory(memory_size=128, num_envs=2), cfg=cfg, **spaces)  # fmt: skip
    trainer = SequentialTrainer(env=env, agents=agent, cfg={"timesteps": 384, "headless": True, "disable_progressbar": True,
                                                         "close_environment_at_exit": False})  # fmt: skip
    instrument(trainer, tel).train()
    env.close()
    tel.close()
    assert verdict(tmp_path).startswith("collector" if slow == "collection" else "learner")


@pytest.mark.parametrize("slow", ["collection", "learning"])
def test_torchrl_ppo(tmp_path, slow):
    from tensordict.nn import TensorDictModule
    from torchrl.collectors import Collector
    from torchrl.envs import GymWrapper
    from torchrl.modules import (
        MLP,
        OneHotCategorical,
        ProbabilisticActor,
        ValueOperator,
    )
    from torchrl.objectives import ClipPPOLoss

    from otel_rl.integrations.torchrl import iterate

    torch.manual_seed(0)
    tel = otel_rl.init(run_dir=tmp_path)
    base = gym.make("CartPole-v1")
    env = GymWrapper(SlowStep(base) if slow == "collection" else base)
    logits = TensorDictModule(MLP(in_features=4, out_features=2, num_cells=[32]), in_keys=["observation"], out_keys=["logits"])
    policy = ProbabilisticActor(logits, in_keys=["logits"], distribution_class=OneHotCategorical, return_log_prob=True, spec=env.action_spec)
    value = ValueOperator(MLP(in_features=4, out_features=1, num_cells=[32]), in_keys=["observation"])
    loss = ClipPPOLoss(policy, value)
    optimizer = torch.optim.Adam(loss.parameters(), lr=3e-4)
    collector = Collector(env, policy, frames_per_batch=128, total_frames=640, auto_register_policy_transforms=False)
    epochs = 1 if slow == "collection" else 150
    for batch in iterate(collector, tel):
        batch["advantage"] = torch.zeros_like(batch["next", "reward"])
        batch["value_target"] = torch.zeros_like(batch["next", "reward"])
        for _ in range(epochs):
            losses = loss(batch.reshape(-1))
            optimizer.zero_grad()
            (losses["loss_objective"] + losses["loss_critic"]).backward()
            optimizer.step()
    collector.shutdown()
    tel.close()
    assert verdict(tmp_path).startswith("collector" if slow == "collection" else "learner")


def test_rllib_ppo_few_epochs_wait_for_the_env_runners_and_many_for_the_learner(tmp_path):
    """RLlib's driver waits for its env runner, then learns: the side that takes the wall time is named, both ways,
    the env runner's cycle is mostly in phases (connectors, inference, env step, bookkeeping), and two runs of
    three iterations are too few to compare."""
    import ray
    from ray.rllib.algorithms.ppo import PPOConfig

    from otel_rl.integrations.rllib import TelemetryCallbacks
    from otel_rl.readers.analysis.compare import compare_reports

    reports = {}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")  # loopback only
    try:
        # Learning against the env runner's 1,000 steps (about 1.3 s here): one update of 1,000 takes about 0.1 s (12x apart,
        # with the second core busy too), 60 epochs of 10 minibatches about 4.4 s (3.4x; 10x with the core busy).
        for epochs, minibatch in ((1, 1000), (60, 100)):
            run_dir = tmp_path / f"epochs-{epochs}"
            tel = otel_rl.init(run_dir=run_dir)
            config = (
                PPOConfig()
                .environment("CartPole-v1")
                .env_runners(num_env_runners=1)
                .training(train_batch_size_per_learner=1000, minibatch_size=minibatch, num_epochs=epochs)
                .callbacks(TelemetryCallbacks.for_run(tel, system_metrics_interval_s=0))
            )
            algo = config.build_algo()
            for _ in range(3):
                algo.train()
            algo.stop()
            tel.close()
            reports[epochs] = analyze(run_dir, engine="python")
    finally:
        ray.shutdown()
    few, many = reports[1], reports[60]
    assert few.turns is not None and many.turns is not None, render_text(few)
    assert few.diagnosis.bottleneck.startswith("collector ("), render_text(few)
    assert many.diagnosis.bottleneck.startswith("learner (learning"), render_text(many)
    runner = few.timelines["collector"]
    assert {"Env To Module", "Module To Env", "Policy Inference", "Env Step", "Episode Bookkeeping"} <= {s.title for s in runner.phases.values()}
    assert runner.other_share <= 0.20, render_text(few)
    assert compare_reports(many, few)["verdict"].startswith("too few cycles to tell (n=3")


def test_sb3_sac_more_gradient_steps_is_named_by_compare(tmp_path):
    """SAC gradient_steps 1 -> 2: learning doubles in a loop whose collector holds a few percent of the wall time."""
    from stable_baselines3 import SAC

    from otel_rl.integrations.sb3 import TelemetryCallback
    from otel_rl.readers.analysis.compare import compare_reports

    reports = []
    for steps in (1, 2):
        tel = otel_rl.init(run_dir=tmp_path / f"g{steps}", system_metrics_interval_s=0)
        model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=50, batch_size=64, gradient_steps=steps, device="cpu", seed=0)
        model.learn(300, callback=TelemetryCallback(tel))
        tel.close()
        reports.append(analyze(tmp_path / f"g{steps}", engine="python"))
    comparison = compare_reports(reports[1], reports[0])
    assert finding(comparison["verdict"]).startswith("Learning +"), comparison["verdict"]
    assert "the learner got slower" in comparison["verdict"] and comparison["env_steps_per_s"][2] < 0
    assert comparison["timelines"]["collector"]["weight"] < 0.3
