"""The learner's loop: it answers the collector's inference requests, samples the replay ring and updates SAC."""

from __future__ import annotations

import argparse
import queue
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch

from otel_rl.demo.sac import SAC
from otel_rl.demo.shared import Channels

CHECKPOINT = "checkpoint.pt"
PHASES = (
    "collector_wait", "inference", "inference_h2d", "inference_forward", "inference_d2h",
    "collector_release", "replay_sample", "learning", "weight_publish",
)  # fmt: skip


class Learner:
    """One learner iteration per collector tick; :meth:`run` until the budget of ``args`` is spent."""

    def __init__(self, tel: Any, args: argparse.Namespace, agent: SAC, channels: Channels, run_dir: Path) -> None:
        self.tel, self.args, self.agent, self.channels, self.run_dir = tel, args, agent, channels, run_dir
        self.generator = torch.Generator().manual_seed(args.seed)
        self.phases = {name: tel.phase(name) for name in PHASES}
        self.returns: deque[float] = deque(maxlen=100)
        self.lengths: deque[int] = deque(maxlen=100)
        self.first_rewards: list[float] = []
        self.losses: dict[str, float] = {}
        self.batch: tuple[torch.Tensor, ...] | None = None
        self.env_steps = 0
        self.window_start, self.window_steps = time.monotonic(), 0

    def run(self, collector: Any) -> dict[str, Any]:
        """Iterate while ``collector`` (its process) lives and the budget lasts; what the demo prints at the end."""
        args = self.args
        deadline = time.monotonic() + args.seconds
        steady = time.monotonic()
        iteration = 0
        while time.monotonic() < deadline and self.env_steps < args.total_steps:
            if args.iterations is not None and iteration >= args.iterations:
                break
            if not collector.is_alive():
                raise RuntimeError(f"the collector process exited with code {collector.exitcode}")
            if not self.iteration(iteration):
                continue  # no tick within a second: the same iteration again
            self.take_episodes()
            if iteration % 20 == 0:
                self.log()
            if iteration and iteration % 5000 == 0:
                self.checkpoint()
            if iteration == 0:
                steady = time.monotonic()  # throughput excludes the collector's start-up
            iteration += 1
        elapsed = time.monotonic() - steady if iteration > 1 else 0.0
        self.checkpoint()
        return {
            "iterations_per_s": (iteration - 1) / elapsed if elapsed else 0.0,
            "iterations": iteration,
            "env_steps": self.env_steps,
            "first_mean_reward": sum(self.first_rewards) / len(self.first_rewards) if self.first_rewards else None,
            "final_mean_reward": sum(self.returns) / len(self.returns) if self.returns else None,
            "episodes": len(self.returns),
        }

    def iteration(self, index: int) -> bool:
        """Wait for the collector's tick, answer it (learner-owned inference), then update once warm; False: no tick came."""
        channels, phases, agent = self.channels, self.phases, self.agent
        with self.tel.iteration(index, env_steps=self.env_steps):
            with phases["collector_wait"]:
                ready = (channels.ticks if channels.shared_actor is not None else channels.slots.request).acquire(timeout=1.0)
            if not ready:
                return False
            if channels.shared_actor is None:
                self.infer()
            self.env_steps += self.args.num_envs
            self.window_steps += self.args.num_envs
            if self.env_steps < self.args.learning_starts or channels.replay.size() < agent.config.batch_size:
                return True
            if self.batch is None:
                self.tel.event("warmup_done", env_steps=self.env_steps)
            for _ in range(self.args.updates_per_step):
                with phases["replay_sample"]:
                    self.batch = channels.replay.sample(agent.config.batch_size, self.generator)
                with phases["learning"]:
                    self.losses = agent.update(*self.batch)
            if channels.shared_actor is not None and index % 10 == 0:
                with phases["weight_publish"], channels.weights_lock:
                    channels.shared_actor.load_state_dict(agent.actor.state_dict())
        return True

    def infer(self) -> None:
        """The actions for the observations the collector published (random ones until learning starts)."""
        slots, phases, actor = self.channels.slots, self.phases, self.agent.actor
        with phases["inference"]:
            self.tel.flow(int(slots.tick[0]) + 1)
            with phases["inference_h2d"]:
                obs = slots.obs.clone()
            with phases["inference_forward"]:
                if self.env_steps < self.args.learning_starts:
                    action = (torch.rand(obs.shape[0], slots.act.shape[1], generator=self.generator) * 2 - 1) * actor.action_scale
                else:
                    with torch.no_grad():
                        action = actor(obs)[0]
            with phases["inference_d2h"]:
                slots.act.copy_(action)
        with phases["collector_release"]:
            slots.response.release()

    def take_episodes(self) -> None:
        while True:
            try:
                episode_return, episode_length = self.channels.episodes.get_nowait()
            except queue.Empty:
                return
            self.returns.append(episode_return)
            self.lengths.append(episode_length)
            if len(self.first_rewards) < 16:
                self.first_rewards.append(episode_return)

    def log(self) -> None:
        now = time.monotonic()
        values: dict[str, float] = dict(self.losses)
        values["Perf/total_fps"] = self.window_steps / max(now - self.window_start, 1e-9)
        self.window_start, self.window_steps = now, 0
        values["Train/buffer_size"] = self.channels.replay.size()
        if self.returns:
            values["Train/mean_reward"] = sum(self.returns) / len(self.returns)
            values["Train/mean_episode_length"] = sum(self.lengths) / len(self.lengths)
        self.tel.scalars(values)
        if self.batch is not None:
            self.tel.distribution("Policy/replay_action", self.batch[1])  # what the critic learns from

    def checkpoint(self) -> None:
        agent, path = self.agent, self.run_dir / CHECKPOINT
        torch.save({"actor": agent.actor.state_dict(), "critic": agent.critic.state_dict(), "env_steps": self.env_steps}, path)
        self.tel.event("checkpoint_saved", path=str(path), env_steps=self.env_steps)
