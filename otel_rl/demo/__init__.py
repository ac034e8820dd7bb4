"""``otel-rl demo``: SAC learns Pendulum-v1 with a collector process, every phase instrumented.

The learner (this process) serves the collector's inference requests
(Collector Wait, Inference with its H2D / forward / D2H parts, Collector
Release), samples the replay ring (Replay Sample), updates the networks
(Learning) and, with collector-side inference, publishes weights (Weight
Publish). The collector process steps 8 environments on its own timeline
(Inference Request, Learner Action Wait, Env Step, Replay Write). Both run
concurrently; the Perfetto trace shows them side by side.

Outputs in ``runs/<timestamp>/``: ``metrics.jsonl``, ``trace.perfetto-trace``,
``run_config.json``, ``run_summary.json`` and ``checkpoint.pt``. At the end it
prints a summary and the bottleneck diagnosis.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import time
from collections import deque
from dataclasses import asdict
from pathlib import Path

CHECKPOINT = "checkpoint.pt"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=180.0, help="wall-clock budget of training")
    parser.add_argument("--iterations", type=int, default=None, help="stop after this many learner iterations")
    parser.add_argument("--total-steps", type=int, default=120_000, help="stop after this many env steps")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--learning-starts", type=int, default=2_000, help="env steps of random actions first")
    parser.add_argument("--inference", choices=("learner", "collector"), default="learner", help="who runs the actor")
    parser.add_argument("--updates-per-step", type=int, default=1, help="gradient updates per learner iteration (the update-to-data ratio)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--runs-dir", default="runs", help="parent folder of the run folder")
    parser.add_argument("--serve", action="store_true", help="start the local ingest server and stream to it")
    parser.add_argument("--no-panel", action="store_true", help="no live terminal panel")


def run_demo(args: argparse.Namespace) -> int:
    import gymnasium as gym
    import torch

    import otel_rl
    from otel_rl.demo.collector import ENV_ID, run_collector
    from otel_rl.demo.sac import SAC, SACConfig
    from otel_rl.demo.shared import ReplayRing, Slots

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    run_dir = Path(args.runs_dir) / time.strftime("%Y-%m-%d_%H-%M-%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    server = None
    options = {}
    if args.serve:
        from otel_rl.readers.server import IngestServer

        server = IngestServer(run_dir / "ingest.sqlite3").start()
        options["motrix_url"] = server.url
        print(f"ingest server: {server.url}/api/v1/runs")

    probe = gym.make(ENV_ID)
    obs_dim, act_dim = probe.observation_space.shape[0], probe.action_space.shape[0]
    action_scale = float(probe.action_space.high[0])
    probe.close()
    sac_config = SACConfig()
    config = {"env": ENV_ID, "algorithm": "sac", **vars(args), "sac": asdict(sac_config)}

    tel = otel_rl.init(
        run_dir=run_dir,
        # The standard variable wins over the demo's own default.
        service_name=os.environ.get("OTEL_SERVICE_NAME") or "otel-rl-demo",
        algorithm="sac",
        jsonl=True,
        trace_enabled=True,
        panel=not args.no_panel,
        **options,
    )
    context = mp.get_context("spawn")
    agent = SAC(obs_dim, act_dim, action_scale, sac_config)
    slots = Slots(
        torch.zeros(args.num_envs, obs_dim).share_memory_(),
        torch.zeros(args.num_envs, act_dim).share_memory_(),
        torch.zeros(1, dtype=torch.int64).share_memory_(),
        context.Semaphore(0),
        context.Semaphore(0),
    )
    replay = ReplayRing(200_000, obs_dim, act_dim, context)
    episodes = context.Queue(maxsize=10_000)
    stop = context.Event()
    collector_inference = args.inference == "collector"
    shared_actor = weights_lock = ticks = None
    if collector_inference:
        shared_actor = SAC(obs_dim, act_dim, action_scale, sac_config).actor.share_memory()
        shared_actor.load_state_dict(agent.actor.state_dict())
        weights_lock = context.Lock()
        ticks = context.Semaphore(0)

    summary: dict = {}
    with tel.run(family="rl.offpolicy", total_steps=args.total_steps, num_envs=args.num_envs, config=config):
        spec = tel.worker_spec("collector 0", context)
        collector = context.Process(
            target=run_collector,
            args=(spec, slots, replay, episodes, stop, args.num_envs, args.seed, args.learning_starts),
            kwargs={"shared_actor": shared_actor, "weights_lock": weights_lock, "ticks": ticks},
            name="collector-0",
            daemon=True,
        )
        collector.start()
        tel.watch_worker(collector, "collector 0")
        tel.event("run_started", env=ENV_ID, num_envs=args.num_envs, inference=args.inference)
        try:
            summary = _learn(tel, args, agent, slots, replay, episodes, collector, shared_actor, weights_lock, ticks, run_dir)
        finally:
            stop.set()
            slots.response.release()
            collector.join(15)
            if collector.is_alive():
                collector.terminate()
    tel.close()
    if server is not None:
        server.stop()
    _report(run_dir, summary)
    return 0


def _learn(tel, args, agent, slots, replay, episodes, collector, shared_actor, weights_lock, ticks, run_dir) -> dict:
    import torch

    generator = torch.Generator().manual_seed(args.seed)
    phases = {
        name: tel.phase(name)
        for name in (
            "collector_wait",
            "inference",
            "inference_h2d",
            "inference_forward",
            "inference_d2h",
            "collector_release",
            "replay_sample",
            "learning",
            "weight_publish",
        )
    }
    returns: deque[float] = deque(maxlen=100)
    lengths: deque[int] = deque(maxlen=100)
    first_rewards: list[float] = []
    losses: dict = {}
    env_steps = 0
    warm = False
    deadline = time.monotonic() + args.seconds
    steady = time.monotonic()
    window_start, window_steps = time.monotonic(), 0
    iteration = 0
    while time.monotonic() < deadline and env_steps < args.total_steps:
        if args.iterations is not None and iteration >= args.iterations:
            break
        if not collector.is_alive():
            raise RuntimeError(f"the collector process exited with code {collector.exitcode}")
        with tel.iteration(iteration, env_steps=env_steps):
            with phases["collector_wait"]:
                ready = (ticks if shared_actor is not None else slots.request).acquire(timeout=1.0)
            if not ready:
                continue
            if shared_actor is None:
                with phases["inference"]:
                    tel.flow(int(slots.tick[0]) + 1)
                    with phases["inference_h2d"]:
                        obs = slots.obs.clone()
                    with phases["inference_forward"]:
                        if env_steps < args.learning_starts:
                            action = (torch.rand(obs.shape[0], slots.act.shape[1], generator=generator) * 2 - 1) * agent.actor.action_scale
                        else:
                            with torch.no_grad():
                                action = agent.actor(obs)[0]
                    with phases["inference_d2h"]:
                        slots.act.copy_(action)
                with phases["collector_release"]:
                    slots.response.release()
            env_steps += args.num_envs
            window_steps += args.num_envs
            if env_steps >= args.learning_starts and replay.size() >= agent.config.batch_size:
                if not warm:
                    warm = True
                    tel.event("warmup_done", env_steps=env_steps)
                for _ in range(args.updates_per_step):
                    with phases["replay_sample"]:
                        batch = replay.sample(agent.config.batch_size, generator)
                    with phases["learning"]:
                        losses = agent.update(*batch)
                if shared_actor is not None and iteration % 10 == 0:
                    with phases["weight_publish"], weights_lock:
                        shared_actor.load_state_dict(agent.actor.state_dict())
        while True:
            try:
                episode_return, episode_length = episodes.get_nowait()
            except queue.Empty:
                break
            returns.append(episode_return)
            lengths.append(episode_length)
            if len(first_rewards) < 16:
                first_rewards.append(episode_return)
        if iteration % 20 == 0:
            now = time.monotonic()
            values = dict(losses)
            values["Perf/total_fps"] = window_steps / max(now - window_start, 1e-9)
            window_start, window_steps = now, 0
            values["Train/buffer_size"] = replay.size()
            if returns:
                values["Train/mean_reward"] = sum(returns) / len(returns)
                values["Train/mean_episode_length"] = sum(lengths) / len(lengths)
            tel.scalars(values)
            if warm:
                tel.distribution("Policy/replay_action", batch[1])  # what the critic learns from
        if iteration and iteration % 5000 == 0:
            _checkpoint(tel, agent, run_dir, env_steps)
        if iteration == 0:
            steady = time.monotonic()  # throughput excludes the collector's start-up
        iteration += 1
    elapsed = time.monotonic() - steady if iteration > 1 else 0.0
    _checkpoint(tel, agent, run_dir, env_steps)
    return {
        "iterations_per_s": (iteration - 1) / elapsed if elapsed else 0.0,
        "iterations": iteration,
        "env_steps": env_steps,
        "first_mean_reward": sum(first_rewards) / len(first_rewards) if first_rewards else None,
        "final_mean_reward": sum(returns) / len(returns) if returns else None,
        "episodes": len(returns),
    }


def _checkpoint(tel, agent, run_dir: Path, env_steps: int) -> None:
    import torch

    path = run_dir / CHECKPOINT
    torch.save({"actor": agent.actor.state_dict(), "critic": agent.critic.state_dict(), "env_steps": env_steps}, path)
    tel.event("checkpoint_saved", path=str(path), env_steps=env_steps)


def _report(run_dir: Path, summary: dict) -> None:
    from otel_rl.readers.analysis import analyze, render_text

    print()
    print(f"run folder: {run_dir}")
    for name in sorted(p.name for p in run_dir.iterdir()):
        print(f"  {name}")
    first, final = summary.get("first_mean_reward"), summary.get("final_mean_reward")
    print(
        f"{summary.get('iterations', 0)} learner iterations ({summary.get('iterations_per_s', 0):.1f}/s), "
        f"{summary.get('env_steps', 0)} env steps; "
        f"mean episode return {first if first is None else round(first, 1)} at the start, "
        f"{final if final is None else round(final, 1)} over the last {summary.get('episodes', 0)} episodes"
    )
    print()
    try:
        print(render_text(analyze(run_dir)))
    except FileNotFoundError:
        print("no trace to analyse (telemetry disabled)")
