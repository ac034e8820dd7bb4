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

from otel_rl.demo.shared import ReplayRing, Slots

ENV_ID = "Pendulum-v1"


def make_envs(num_envs: int, seed: int):
    import gymnasium as gym

    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make(ENV_ID) for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    envs.reset(seed=seed)
    return envs


def run_collector(
    spec,
    slots: Slots,
    replay: ReplayRing,
    episodes: Any,
    stop: Any,
    num_envs: int,
    seed: int,
    learning_starts: int,
    shared_actor: Any = None,
    weights_lock: Any = None,
    ticks: Any = None,
) -> None:
    """Process entry point: runs until ``stop`` is set."""
    import torch

    from otel_rl.worker_processes import init_worker

    torch.set_num_threads(1)
    tel = init_worker(spec)
    envs = make_envs(num_envs, seed)
    obs, _ = envs.reset(seed=seed)
    rng = np.random.default_rng(seed)
    returns = np.zeros(num_envs)
    lengths = np.zeros(num_envs, dtype=np.int64)
    low, high = envs.single_action_space.low, envs.single_action_space.high
    request, wait, step, write = (
        tel.phase("inference_request", "collector"),
        tel.phase("learner_action_wait", "collector"),
        tel.phase("env_step", "collector"),
        tel.phase("replay_write", "collector"),
    )
    policy = tel.phase("policy_inference", "collector")
    tick = 0
    try:
        while not stop.is_set():
            with tel.iteration(tick, env_steps=tick * num_envs, timeline="collector"):
                if shared_actor is None:
                    with request:
                        slots.obs.copy_(torch.from_numpy(obs))
                        slots.tick[0] = tick
                        tel.flow(tick + 1)
                        slots.request.release()
                    with wait:
                        while not slots.response.acquire(timeout=0.5):
                            if stop.is_set():
                                return
                        tel.flow(tick + 1, end=True)
                        actions = slots.act.numpy().copy()
                else:
                    with policy:
                        if tick * num_envs < learning_starts:
                            actions = rng.uniform(low, high, size=(num_envs, *low.shape)).astype(np.float32)
                        else:
                            with weights_lock, torch.no_grad():
                                actions = shared_actor(torch.from_numpy(obs).float())[0].numpy()
                with step:
                    next_obs, rewards, terminated, truncated, infos = envs.step(actions)
                with write:
                    done = np.logical_or(terminated, truncated)
                    final = next_obs.copy()
                    if done.any() and "final_obs" in infos:
                        for i in np.flatnonzero(done):
                            final[i] = infos["final_obs"][i]
                    # Truncation (Pendulum's time limit) is not a terminal state: bootstrap through it.
                    replay.write(
                        torch.from_numpy(obs).float(),
                        torch.from_numpy(np.asarray(actions)).float(),
                        torch.from_numpy(rewards).float(),
                        torch.from_numpy(final).float(),
                        torch.from_numpy(terminated.astype(np.float32)),
                    )
                    returns += rewards
                    lengths += 1
                    for i in np.flatnonzero(done):
                        try:
                            episodes.put_nowait((float(returns[i]), int(lengths[i])))
                        except Exception:
                            pass  # the learner is behind on statistics; never block the collector
                        returns[i] = 0.0
                        lengths[i] = 0
                    obs = next_obs
                    if ticks is not None:
                        ticks.release()
            tick += 1
    finally:
        envs.close()
        tel.close()
        time.sleep(0)
