"""skrl: a real PPO and SAC trained by skrl's SequentialTrainer on Gymnasium environments, instrumented."""

from __future__ import annotations

import gymnasium as gym
import pytest
from integration_checks import check_run, counts, framework, records
from skrl.agents.torch.ppo import PPO, PPO_CFG
from skrl.agents.torch.sac import SAC, SAC_CFG
from skrl.envs.wrappers.torch import wrap_env
from skrl.memories.torch import RandomMemory
from skrl.trainers.torch import SequentialTrainer
from skrl_models import Actor, Critic, Policy, Value

import otel_rl
from otel_rl.integrations.skrl import instrument

pytestmark = pytest.mark.slow  # a real RL library, the demo, or a whole machine: pytest -m 'not slow' leaves it out


def make_agent(algorithm: str, env, run_dir):
    experiment = {"directory": str(run_dir / "skrl"), "write_interval": 200, "checkpoint_interval": 150 if algorithm == "sac" else 0}
    spaces = {"observation_space": env.observation_space, "action_space": env.action_space, "device": env.device}
    if algorithm == "ppo":
        models = {"policy": Policy(**spaces), "value": Value(**spaces)}
        cfg = PPO_CFG(rollouts=128, learning_epochs=2, mini_batches=4, experiment=experiment)
        return PPO(models=models, memory=RandomMemory(memory_size=128, num_envs=env.num_envs), cfg=cfg, **spaces)
    models = {"policy": Actor(**spaces), "critic_1": Critic(**spaces), "critic_2": Critic(**spaces),
              "target_critic_1": Critic(**spaces), "target_critic_2": Critic(**spaces)}  # fmt: skip
    cfg = SAC_CFG(batch_size=64, learning_starts=100, experiment=experiment)
    return SAC(models=models, memory=RandomMemory(memory_size=5000, num_envs=env.num_envs), cfg=cfg, **spaces)


@pytest.mark.parametrize(("algorithm", "env_id", "steps", "losses"), [
    ("ppo", "CartPole-v1", 2048, {"Loss/policy", "Loss/value"}),
    ("sac", "Pendulum-v1", 600, {"Loss/policy", "Loss/critic"}),
])  # fmt: skip
def test_skrl_agents_record_both_timelines_and_their_tracking_data(tmp_path, algorithm, env_id, steps, losses):
    env = wrap_env(gym.make_vec(env_id, num_envs=2, vectorization_mode="sync"))
    tel = otel_rl.init(run_dir=tmp_path)  # the fewest lines: no tel.run(), no output options
    agent = make_agent(algorithm, env, tmp_path)
    trainer = SequentialTrainer(env=env, agents=agent, cfg={"timesteps": steps // 2, "headless": True, "disable_progressbar": True,
                                                         "close_environment_at_exit": False})
    instrument(trainer, tel).train()
    env.close()
    tel.close()
    (running,) = [r for r in records(tmp_path) if r["kind"] == "run" and r["status"] == "running"]
    assert running["total_steps"] == steps and running["num_envs"] == 2 and running["config"]["agent"] == algorithm.upper()
    assert running["family"] == ("rl.onpolicy" if algorithm == "ppo" else "rl.offpolicy")
    assert framework(tmp_path) == {"system": "skrl", "environment": env_id, "algorithm": algorithm.upper()}
    found = check_run(
        tmp_path,
        {"learner": {"Learning", "Policy Inference", "Env Step", "Replay Write"}},
        {"Train/mean_reward", "Perf/learning_time", "Perf/collector_env_step_ms", *losses},
    )
    assert not any(" / " in k for k in found["keys"])  # every skrl key mapped or normalised
    steps_logged = [r["step"] for r in records(tmp_path) if r["kind"] == "scalars" and "Train/mean_reward" in r["values"]]
    assert steps_logged == sorted(steps_logged) and steps_logged[-1] <= steps
    assert counts(tmp_path)["collector"]["cycles"] == steps // 2  # one per trainer step
    # The values are the ones skrl wrote to its own TensorBoard, not a second reduction of its data.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = {p.parent for p in (tmp_path / "skrl").rglob("events.out.tfevents.*")}
    written = EventAccumulator(str(events), size_guidance={"scalars": 0})
    written.Reload()
    skrl_own = [(e.step * 2, e.value) for e in written.Scalars("Reward / Total reward (mean)")]
    ours = [(r["step"], r["values"]["Train/mean_reward"]) for r in records(tmp_path) if r["kind"] == "scalars" and "Train/mean_reward" in r["values"]]
    assert ours == [(step, pytest.approx(value, rel=1e-6)) for step, value in skrl_own] and ours
    events = [r for r in records(tmp_path) if r["kind"] == "event"]
    if algorithm == "sac":  # its checkpoints and the end of its warm-up, as events
        assert [e["attributes"]["timestep"] for e in events if e["name"] == "checkpoint_saved"] == [150, 300]
        assert len(list((tmp_path / "skrl").rglob("agent_150.pt"))) == 1
        (warm,) = [e for e in events if e["name"] == "warmup_done"]
        assert warm["attributes"]["learning_starts"] == 100 and warm["attributes"]["env_steps"] >= 100 * 2
    else:
        assert not [e for e in events if e["name"] in ("checkpoint_saved", "warmup_done")]


def test_a_trainer_of_several_agents_is_refused(tmp_path):
    class Trainer:
        agents = [object(), object()]
        env = None

    tel = otel_rl.init(system_metrics_interval_s=0)
    with pytest.raises(TypeError, match="one single-agent"):
        instrument(Trainer(), tel)
    tel.close()
