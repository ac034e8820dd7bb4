"""The collector process: steps a vector of gymnasium environments on its own timeline.

With learner-owned inference (the default) each tick publishes observations,
waits for the learner's actions (Learner Action Wait), steps the
environments and writes the transitions to the replay ring. With
collector-side inference it runs its own copy of the actor, refreshed by the
learner's Weight Publish.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from otel_rl.demo.shared import Channels

ENV_ID = "Pendulum-v1"


def make_envs(num_envs: int, seed: int):
    import gymnasium as gym

    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make(ENV_ID) for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    envs.reset(seed=seed)
    return envs


def run_collector(spec: Any, channels: Channels, num_envs: int, seed: int, learning_starts: int) -> None:
    """Process entry point: runs until ``channels.stop`` is set."""
    import torch

    from otel_rl.worker_processes import init_worker

    torch.set_num_threads(1)
    tel = init_worker(spec)
    envs = make_envs(num_envs, seed)
    try:
        Collector(tel, envs, channels, seed, learning_starts).run()
    finally:
        envs.close()
        tel.close()
        time.sleep(0)


class Collector:
    """One tick per iteration: actions (the learner's, or its own actor's), a step of every environment, the replay write."""

    def __init__(self, tel: Any, envs: Any, channels: Channels, seed: int, learning_starts: int) -> None:
        self.tel, self.envs, self.channels = tel, envs, channels
        self.num_envs = envs.num_envs
        self.obs, _ = envs.reset(seed=seed)
        self.rng = np.random.default_rng(seed)
        self.learning_starts = learning_starts
        self.returns = np.zeros(self.num_envs)
        self.lengths = np.zeros(self.num_envs, dtype=np.int64)
        self.phases = {
            name: tel.phase(name, "collector")
            for name in ("inference_request", "learner_action_wait", "policy_inference", "env_step", "replay_write")
        }

    def run(self) -> None:
        tick = 0
        while not self.channels.stop.is_set():
            with self.tel.iteration(tick, env_steps=tick * self.num_envs, timeline="collector"):
                actions = self.learner_actions(tick) if self.channels.shared_actor is None else self.own_actions(tick)
                if actions is None:  # stopped while waiting for the learner
                    return
                with self.phases["env_step"]:
                    next_obs, rewards, terminated, truncated, infos = self.envs.step(actions)
                with self.phases["replay_write"]:
                    self.write(actions, next_obs, rewards, terminated, truncated, infos)
            tick += 1

    def learner_actions(self, tick: int) -> np.ndarray | None:
        import torch

        slots = self.channels.slots
        with self.phases["inference_request"]:
            slots.obs.copy_(torch.from_numpy(self.obs))
            slots.tick[0] = tick
            self.tel.flow(tick + 1)
            slots.request.release()
        with self.phases["learner_action_wait"]:
            while not slots.response.acquire(timeout=0.5):
                if self.channels.stop.is_set():
                    return None
            self.tel.flow(tick + 1, end=True)
            return slots.act.numpy().copy()

    def own_actions(self, tick: int) -> np.ndarray:
        import torch

        space = self.envs.single_action_space
        with self.phases["policy_inference"]:
            if tick * self.num_envs < self.learning_starts:
                return self.rng.uniform(space.low, space.high, size=(self.num_envs, *space.low.shape)).astype(np.float32)
            with self.channels.weights_lock, torch.no_grad():
                return self.channels.shared_actor(torch.from_numpy(self.obs).float())[0].numpy()

    def write(self, actions: np.ndarray, next_obs: np.ndarray, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, infos: dict) -> None:
        import torch

        done = np.logical_or(terminated, truncated)
        final = next_obs.copy()
        if done.any() and "final_obs" in infos:
            for i in np.flatnonzero(done):
                final[i] = infos["final_obs"][i]
        # Truncation (Pendulum's time limit) is not a terminal state: bootstrap through it.
        self.channels.replay.write(
            torch.from_numpy(self.obs).float(),
            torch.from_numpy(np.asarray(actions)).float(),
            torch.from_numpy(rewards).float(),
            torch.from_numpy(final).float(),
            torch.from_numpy(terminated.astype(np.float32)),
        )
        self.returns += rewards
        self.lengths += 1
        for i in np.flatnonzero(done):
            try:
                self.channels.episodes.put_nowait((float(self.returns[i]), int(self.lengths[i])))
            except Exception:
                pass  # the learner is behind on statistics; never block the collector
            self.returns[i] = 0.0
            self.lengths[i] = 0
        self.obs = next_obs
        if self.channels.ticks is not None:
            self.channels.ticks.release()
