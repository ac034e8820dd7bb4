"""skrl PPO on CartPole with otel-rl: ``python examples/skrl_ppo.py``.

Needs ``pip install 'otel-rl[skrl]'``. Writes ``runs/skrl-ppo/``.
"""

import gymnasium as gym
import torch.nn as nn
from skrl.agents.torch.ppo import PPO, PPO_CFG
from skrl.envs.wrappers.torch import wrap_env
from skrl.memories.torch import RandomMemory
from skrl.models.torch import CategoricalMixin, DeterministicMixin, Model
from skrl.trainers.torch import SequentialTrainer

import otel_rl
from otel_rl.integrations.skrl import instrument


class Policy(CategoricalMixin, Model):
    def __init__(self, observation_space, action_space, device):
        Model.__init__(self, observation_space=observation_space, action_space=action_space, device=device)
        CategoricalMixin.__init__(self)
        self.net = nn.Sequential(nn.Linear(self.num_observations, 64), nn.Tanh(), nn.Linear(64, self.num_actions))

    def compute(self, inputs, role=""):
        return self.net(inputs["observations"]), {}


class Value(DeterministicMixin, Model):
    def __init__(self, observation_space, action_space, device):
        Model.__init__(self, observation_space=observation_space, action_space=action_space, device=device)
        DeterministicMixin.__init__(self)
        self.net = nn.Sequential(nn.Linear(self.num_observations, 64), nn.Tanh(), nn.Linear(64, 1))

    def compute(self, inputs, role=""):
        return self.net(inputs["observations"]), {}


env = wrap_env(gym.make_vec("CartPole-v1", num_envs=8, vectorization_mode="sync"))
spaces = {"observation_space": env.observation_space, "action_space": env.action_space, "device": env.device}
agent = PPO(
    models={"policy": Policy(**spaces), "value": Value(**spaces)},
    memory=RandomMemory(memory_size=128, num_envs=env.num_envs),
    cfg=PPO_CFG(rollouts=128, learning_epochs=4, mini_batches=4, experiment={"directory": "runs/skrl-ppo/skrl"}),
    **spaces,
)
tel = otel_rl.init(run_dir="runs/skrl-ppo", algorithm="ppo")
with tel.run(family="rl.onpolicy"):
    trainer = SequentialTrainer(env=env, agents=agent, cfg={"timesteps": 20_000, "headless": True})
    instrument(trainer, tel).train()
tel.close()
