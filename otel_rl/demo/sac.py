"""Soft Actor-Critic for continuous control, small enough to learn Pendulum on two CPU cores."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


def mlp(inputs: int, outputs: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, outputs))


class Actor(nn.Module):
    """Tanh-squashed Gaussian policy scaled to the action bounds."""

    def __init__(self, obs_dim: int, act_dim: int, action_scale: float, hidden: int) -> None:
        super().__init__()
        self.net = mlp(obs_dim, 2 * act_dim, hidden)
        self.register_buffer("action_scale", torch.tensor(action_scale, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.net(obs).chunk(2, dim=-1)
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(log_std) + 1)
        normal = torch.distributions.Normal(mean, log_std.exp())
        raw = normal.rsample()
        squashed = torch.tanh(raw)
        log_prob = normal.log_prob(raw) - torch.log(self.action_scale * (1 - squashed.pow(2)) + 1e-6)
        return squashed * self.action_scale, log_prob.sum(-1, keepdim=True)


class Critic(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int, hidden: int) -> None:
        super().__init__()
        self.q1 = mlp(obs_dim + act_dim, 1, hidden)
        self.q2 = mlp(obs_dim + act_dim, 1, hidden)

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([obs, act], dim=-1)
        return self.q1(x), self.q2(x)


@dataclass
class SACConfig:
    hidden: int = 64
    gamma: float = 0.99
    tau: float = 0.005
    actor_lr: float = 3e-4
    critic_lr: float = 1e-3
    alpha_lr: float = 1e-3
    batch_size: int = 256


class SAC:
    """The learner's networks and one gradient update."""

    def __init__(self, obs_dim: int, act_dim: int, action_scale: float, config: SACConfig) -> None:
        self.config = config
        self.actor = Actor(obs_dim, act_dim, action_scale, config.hidden)
        self.critic = Critic(obs_dim, act_dim, config.hidden)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.zeros(1, requires_grad=True)
        self.target_entropy = -float(act_dim)
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=config.actor_lr)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=config.critic_lr)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=config.alpha_lr)

    def update(self, obs, act, rew, next_obs, done) -> dict[str, torch.Tensor]:
        """One SAC update; returns detached loss tensors (converted by the telemetry in one transfer)."""
        c = self.config
        alpha = self.log_alpha.exp().detach()
        with torch.no_grad():
            next_act, next_log_prob = self.actor(next_obs)
            q1_next, q2_next = self.critic_target(next_obs, next_act)
            target = rew + c.gamma * (1 - done) * (torch.min(q1_next, q2_next) - alpha * next_log_prob)
        q1, q2 = self.critic(obs, act)
        critic_loss = F.mse_loss(q1, target) + F.mse_loss(q2, target)
        self.critic_opt.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_opt.step()

        new_act, log_prob = self.actor(obs)
        q_new = torch.min(*self.critic(obs, new_act))
        actor_loss = (alpha * log_prob - q_new).mean()
        self.actor_opt.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_opt.step()

        alpha_loss = -(self.log_alpha * (log_prob.detach() + self.target_entropy)).mean()
        self.alpha_opt.zero_grad(set_to_none=True)
        alpha_loss.backward()
        self.alpha_opt.step()

        with torch.no_grad():
            for param, target_param in zip(self.critic.parameters(), self.critic_target.parameters(), strict=True):
                target_param.lerp_(param, c.tau)
        return {
            "Loss/critic": critic_loss.detach(),
            "Loss/actor": actor_loss.detach(),
            "Loss/alpha": alpha_loss.detach(),
            "Policy/alpha": alpha,
            "Policy/entropy": -log_prob.detach().mean(),
            "Policy/q_mean": q1.detach().mean(),
        }
