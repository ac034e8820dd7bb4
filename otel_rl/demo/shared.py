"""What the learner and the collector process share: observation and action slots, and the replay ring."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Slots:
    """The inference handshake: the collector publishes observations, the learner answers with actions."""

    obs: torch.Tensor  # [num_envs, obs_dim]
    act: torch.Tensor  # [num_envs, act_dim]
    tick: torch.Tensor  # [1] int64: the collector tick the observations belong to
    request: Any  # semaphore: observations are ready
    response: Any  # semaphore: actions are ready


class ReplayRing:
    """A fixed-size replay buffer in shared memory; the collector writes, the learner samples."""

    def __init__(self, capacity: int, obs_dim: int, act_dim: int, context: Any) -> None:
        self.capacity = capacity
        self.obs = torch.zeros(capacity, obs_dim).share_memory_()
        self.act = torch.zeros(capacity, act_dim).share_memory_()
        self.rew = torch.zeros(capacity, 1).share_memory_()
        self.next_obs = torch.zeros(capacity, obs_dim).share_memory_()
        self.done = torch.zeros(capacity, 1).share_memory_()
        self.written = context.Value("q", 0, lock=False)
        self.lock = context.Lock()

    def write(self, obs, act, rew, next_obs, done) -> None:
        n = obs.shape[0]
        with self.lock:
            start = self.written.value % self.capacity
            index = (torch.arange(n) + start) % self.capacity
            self.obs[index] = obs
            self.act[index] = act
            self.rew[index, 0] = rew
            self.next_obs[index] = next_obs
            self.done[index, 0] = done
            self.written.value += n

    def size(self) -> int:
        return min(self.written.value, self.capacity)

    def sample(self, batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        with self.lock:
            index = torch.randint(0, self.size(), (batch_size,), generator=generator)
            return self.obs[index], self.act[index], self.rew[index], self.next_obs[index], self.done[index]
