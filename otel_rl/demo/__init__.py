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
import time
from dataclasses import asdict
from pathlib import Path

from otel_rl.base.environment_variables import OTEL_SERVICE_NAME


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
    parser.add_argument("--no-video", action="store_true", help="do not record a video of the trained policy at the end")
    parser.add_argument("--serve", action="store_true", help="start the local ingest server and stream to it")
    parser.add_argument("--no-panel", action="store_true", help="no live terminal panel")


def run_demo(args: argparse.Namespace) -> int:
    import gymnasium as gym
    import torch

    import otel_rl
    from otel_rl.demo.collector import ENV_ID
    from otel_rl.demo.sac import SAC, SACConfig
    from otel_rl.demo.shared import channels

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    run_dir = Path(args.runs_dir) / time.strftime("%Y-%m-%d_%H-%M-%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    server = _ingest_server(run_dir) if args.serve else None
    probe = gym.make(ENV_ID)
    obs_dim, act_dim = probe.observation_space.shape[0], probe.action_space.shape[0]
    action_scale = float(probe.action_space.high[0])
    probe.close()
    sac_config = SACConfig()
    tel = otel_rl.init(
        run_dir=run_dir,
        # The standard variable wins over the demo's own default.
        service_name=os.environ.get(OTEL_SERVICE_NAME) or "otel-rl-demo",
        algorithm="sac",
        jsonl=True,
        trace_enabled=True,
        panel=not args.no_panel,
        **({"motrix_url": server.url} if server is not None else {}),
    )
    context = mp.get_context("spawn")
    agent = SAC(obs_dim, act_dim, action_scale, sac_config)
    shared_actor = None
    if args.inference == "collector":
        shared_actor = SAC(obs_dim, act_dim, action_scale, sac_config).actor
        shared_actor.load_state_dict(agent.actor.state_dict())
    shared = channels(args.num_envs, obs_dim, act_dim, context, shared_actor)
    config = {"env": ENV_ID, "algorithm": "sac", **vars(args), "sac": asdict(sac_config)}
    with tel.run(family="rl.offpolicy", total_steps=args.total_steps, num_envs=args.num_envs, config=config):
        summary = _train(tel, args, agent, shared, context, run_dir)
        if not args.no_video:
            _record_policy(tel, agent, args.seed)
    tel.close()
    if server is not None:
        server.close()
    _report(run_dir, summary)
    return 0


def _record_policy(tel, agent, seed: int, steps: int = 200) -> None:
    """One episode of the trained policy (its mean action), rendered by Gymnasium and recorded as the run's video."""
    import gymnasium as gym
    import torch

    from otel_rl.demo.collector import ENV_ID

    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")  # pygame draws off screen, and plays no sound
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    try:
        env = gym.make(ENV_ID, render_mode="rgb_array")
        obs, _ = env.reset(seed=seed)
        frames = [env.render()[::2, ::2]]
    except (ImportError, gym.error.DependencyNotInstalled) as exc:
        print(f"no video of the policy: {ENV_ID} cannot render here ({exc})")
        return
    with torch.no_grad():
        for _ in range(steps):
            mean = agent.actor.net(torch.as_tensor(obs, dtype=torch.float32)).chunk(2, dim=-1)[0]
            obs, _, terminated, truncated, _ = env.step((torch.tanh(mean) * agent.actor.action_scale).numpy())
            frames.append(env.render()[::2, ::2])
            if terminated or truncated:
                break
    fps = env.metadata.get("render_fps", 30)
    env.close()
    tel.video("Media/policy", frames, fps=fps, caption=f"{ENV_ID}: the trained policy's mean action, one episode")


def _ingest_server(run_dir: Path):
    from otel_rl.readers.server import IngestServer

    server = IngestServer(run_dir / "ingest.sqlite3").start()
    print(f"ingest server: {server.url}/api/v1/runs")
    return server


def _train(tel, args: argparse.Namespace, agent, shared, context, run_dir: Path) -> dict:
    """The collector process and the learner's loop, inside the run; the collector ends with it."""
    from otel_rl.demo.collector import ENV_ID, run_collector
    from otel_rl.demo.learner import Learner

    spec = tel.worker_spec("collector 0", context)
    collector = context.Process(
        target=run_collector, args=(spec, shared, args.num_envs, args.seed, args.learning_starts), name="collector-0", daemon=True
    )
    collector.start()
    tel.watch_worker(collector, "collector 0")
    tel.event("run_started", env=ENV_ID, num_envs=args.num_envs, inference=args.inference)
    try:
        return Learner(tel, args, agent, shared, run_dir).run(collector)
    finally:
        shared.stop.set()
        shared.slots.response.release()
        collector.join(15)
        if collector.is_alive():
            collector.terminate()


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
