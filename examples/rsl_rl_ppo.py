"""RSL-RL's OnPolicyRunner with otel-rl: ``python examples/rsl_rl_ppo.py``.

Needs ``pip install 'otel-rl[rsl-rl]'``. The environment is a small
vectorised torch task (push a point to the origin) standing in for an Isaac
Lab one; with Isaac Lab, pass its environment and runner config instead.
Writes ``runs/rsl-rl-ppo/``.
"""

import torch
from rsl_rl.env import VecEnv
from rsl_rl.runners import OnPolicyRunner
from tensordict import TensorDict

import otel_rl
from otel_rl.integrations.rsl_rl import instrument


class PointMass(VecEnv):
    def __init__(self, num_envs: int = 256) -> None:
        self.num_envs, self.num_actions, self.max_episode_length = num_envs, 1, 100
        self.device, self.cfg = "cpu", {}
        self.episode_length_buf = torch.zeros(num_envs, dtype=torch.long)
        self.position, self.velocity = torch.rand(num_envs) * 2 - 1, torch.zeros(num_envs)
        self.returns = torch.zeros(num_envs)

    def get_observations(self) -> TensorDict:
        return TensorDict({"policy": torch.stack([self.position, self.velocity], 1)}, batch_size=[self.num_envs])

    def step(self, actions):
        self.velocity = 0.9 * self.velocity + 0.1 * actions[:, 0].clamp(-1, 1)
        self.position = (self.position + 0.1 * self.velocity).clamp(-2, 2)
        reward = -self.position.abs()
        self.returns += reward
        self.episode_length_buf += 1
        dones = self.episode_length_buf >= self.max_episode_length
        extras = {"time_outs": dones.clone()}
        if dones.any():
            extras["episode"] = {"Episode_Reward/distance": self.returns[dones].mean()}
            self.returns[dones], self.episode_length_buf[dones] = 0, 0
            self.position[dones], self.velocity[dones] = torch.rand(int(dones.sum())) * 2 - 1, 0
        return self.get_observations(), reward, dones.long(), extras


train_cfg = {
    "num_steps_per_env": 24,
    "save_interval": 100,
    "logger": "tensorboard",
    "obs_groups": {"actor": ["policy"], "critic": ["policy"]},
    "algorithm": {"class_name": "PPO"},
    "actor": {"class_name": "MLPModel", "hidden_dims": [64, 64], "distribution_cfg": {"class_name": "GaussianDistribution"}},
    "critic": {"class_name": "MLPModel", "hidden_dims": [64, 64]},
}
tel = otel_rl.init(run_dir="runs/rsl-rl-ppo", algorithm="ppo")
with tel.run(family="rl.onpolicy", config=train_cfg):
    runner = OnPolicyRunner(PointMass(), train_cfg, log_dir="runs/rsl-rl-ppo/rsl_rl", device="cpu")
    instrument(runner, tel).learn(num_learning_iterations=50)
tel.close()
