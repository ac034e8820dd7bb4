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


@dataclass
class Channels:
    """Everything the learner hands the collector process (it pickles for ``spawn``)."""

    slots: Slots
    replay: ReplayRing
    episodes: Any  # queue of (return, length) of each finished episode
    stop: Any  # event: the collector ends
    shared_actor: torch.nn.Module | None = None  # collector-side inference: the actor the learner publishes to
    weights_lock: Any = None  # held while the shared actor is read or written
    ticks: Any = None  # collector-side inference: a semaphore released per collector tick


def channels(num_envs: int, obs_dim: int, act_dim: int, context: Any, shared_actor: torch.nn.Module | None) -> Channels:
    """The slots, the replay ring and the queues, in shared memory; with ``shared_actor``, collector-side inference's too."""
    slots = Slots(
        torch.zeros(num_envs, obs_dim).share_memory_(),
        torch.zeros(num_envs, act_dim).share_memory_(),
        torch.zeros(1, dtype=torch.int64).share_memory_(),
        context.Semaphore(0),
        context.Semaphore(0),
    )
    out = Channels(slots, ReplayRing(200_000, obs_dim, act_dim, context), context.Queue(maxsize=10_000), context.Event())
    if shared_actor is not None:
        out.shared_actor = shared_actor.share_memory()
        out.weights_lock, out.ticks = context.Lock(), context.Semaphore(0)
    return out
