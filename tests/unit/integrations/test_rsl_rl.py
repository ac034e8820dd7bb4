"""RSL-RL: a real OnPolicyRunner (PPO) on a small vectorised torch environment written for the test."""

from __future__ import annotations

import os

import pytest

import torch
from integration_checks import check_run, counts, framework, records
from rsl_rl.env import VecEnv
from rsl_rl.runners import OnPolicyRunner
from tensordict import TensorDict

import otel_rl
from otel_rl.formats import schema
from otel_rl.integrations.rsl_rl import instrument

pytestmark = pytest.mark.slow  # a real RL library, the demo, or a whole machine: pytest -m 'not slow' leaves it out


class PointMass(VecEnv):
    """Push a point on a line towards the origin: 2 observations, 1 action, episodes of 50 steps.

    Like Isaac Lab's Manager-Based environments, it reports in ``extras["log"]``
    each step's reward terms (``reward/<term>``: the mean over the envs of
    ``raw value * weight``), and for the envs that finished an episode the
    episode sums (``Episode_Reward/<term>``) and how many each termination
    term reset (``Episode_Termination/<term>``).
    """

    def __init__(self, num_envs: int = 64) -> None:
        self.num_envs, self.num_actions, self.max_episode_length = num_envs, 1, 50
        self.device, self.cfg = "cpu", {"name": "point-mass"}
        self.episode_length_buf = torch.zeros(num_envs, dtype=torch.long)
        self.position = torch.rand(num_envs) * 2 - 1
        self.velocity = torch.zeros(num_envs)
        self.terms = {"distance": torch.zeros(num_envs), "effort": torch.zeros(num_envs)}

    def get_observations(self) -> TensorDict:
        obs = torch.stack([self.position, self.velocity], dim=1)
        return TensorDict({"policy": obs}, batch_size=[self.num_envs])

    def step(self, actions: torch.Tensor):
        force = actions[:, 0].clamp(-1, 1)
        self.velocity = 0.9 * self.velocity + 0.1 * force
        self.position = (self.position + 0.1 * self.velocity).clamp(-2, 2)
        distance, effort = -self.position.abs(), -0.01 * force.pow(2)
        self.terms["distance"] += distance
        self.terms["effort"] += effort
        self.episode_length_buf += 1
        dones = self.episode_length_buf >= self.max_episode_length
        log = {"reward/distance": distance.mean(), "reward/effort": effort.mean(), "Metrics/position/error": self.position.abs().mean()}
        extras = {"time_outs": dones.clone(), "log": log}
        if dones.any():
            log.update({f"Episode_Reward/{k}": v[dones].mean() for k, v in self.terms.items()})
            log["Episode_Termination/time_out"] = dones.sum().float()
            for v in self.terms.values():
                v[dones] = 0
            self.position[dones] = torch.rand(int(dones.sum())) * 2 - 1
            self.velocity[dones] = 0
            self.episode_length_buf[dones] = 0
        return self.get_observations(), distance + effort, dones.long(), extras


TRAIN_CFG = {
    "num_steps_per_env": 24,
    "save_interval": 1000,
    "logger": "tensorboard",
    "obs_groups": {"actor": ["policy"], "critic": ["policy"]},
    "algorithm": {"class_name": "PPO", "num_learning_epochs": 2, "num_mini_batches": 2},
    "actor": {"class_name": "MLPModel", "hidden_dims": [32, 32], "distribution_cfg": {"class_name": "GaussianDistribution"}},
    "critic": {"class_name": "MLPModel", "hidden_dims": [32, 32]},
}


def test_the_runner_records_both_timelines_and_its_logs_under_canonical_keys(tmp_path):
    tel = otel_rl.init(run_dir=tmp_path / "run")  # the fewest lines: no tel.run(), no output options
    runner = OnPolicyRunner(PointMass(), dict(TRAIN_CFG), log_dir=str(tmp_path / "rsl_rl"), device="cpu")
    instrument(runner, tel).learn(num_learning_iterations=4)  # 4 x 24 steps x 64 envs
    tel.close()
    (running,) = [r for r in records(tmp_path / "run") if r["kind"] == "run" and r["status"] == "running"]
    assert running["total_steps"] == 4 * 24 * 64 and running["num_envs"] == 64
    assert running["config"]["num_steps_per_env"] == 24
    assert framework(tmp_path / "run") == {"system": "rsl_rl", "algorithm": "PPO"}  # an environment of its own: no name to give
    found = check_run(
        tmp_path / "run",
        {"learner": {"Learning", "Policy Inference", "Env Step", "Replay Write"}},
        {"Train/mean_reward", "Train/mean_episode_length", "Loss/value", "Loss/policy", "Perf/total_fps",
         "Perf/learning_time", "Policy/mean_std", "reward/distance", "reward/effort",
         "Episode_Reward/distance", "Episode_Reward/effort", "Episode_Termination/time_out"},
    )  # fmt: skip
    assert not any(k.endswith("/time") for k in found["keys"])
    assert "rslrl/Metrics/position/error" in found["keys"] and not any(k.startswith("rsl_rl/") for k in found["keys"])  # unmapped: seed 000's namespace
    steps = sorted({r["step"] for r in records(tmp_path / "run") if r["kind"] == "scalars" and "Loss/value" in r["values"]})
    assert steps == [24 * 64 * (i + 1) for i in range(4)]  # env steps, not iteration numbers
    counted = counts(tmp_path / "run")
    assert counted["collector"]["cycles"] == 4 and counted["learner"]["cycles"] == 4
    assert counted["collector"]["env_step"] == 4 * 24
    assert list((tmp_path / "rsl_rl").glob("events.out.tfevents.*"))  # the configured writer still writes
    rates = [(r["step"], r["values"]["Episode/timeout_rate"], r["values"]["Episode/terminated_rate"]) for r in records(tmp_path / "run")
             if r["kind"] == "scalars" and "Episode/timeout_rate" in r["values"]]  # fmt: skip
    assert [step for step, _, _ in rates] == [24 * 64 * (i + 1) for i in range(4)]  # one per rollout
    assert [(t, d) for _, t, d in rates if t is not None] == [(1.0, 0.0)]  # its episodes end only at the time limit: in the third rollout
    assert [t for _, t, _ in rates].count(None) == 3  # before an episode ended, and after: nothing ended, no rate
    saved = [r["attributes"]["path"] for r in records(tmp_path / "run") if r["kind"] == "event" and r["name"] == "checkpoint_saved"]
    assert saved and all(os.path.exists(path) for path in saved)  # the runner's own saves, each an event naming its file
    assert saved[-1] == str(tmp_path / "rsl_rl" / "model_3.pt")  # the last one, after the last iteration (RSL-RL counts from 0)


def test_reward_terms_and_episode_sums_stay_apart():
    assert schema.library_key("rsl_rl", "Episode_Reward/track_lin_vel") == "Episode_Reward/track_lin_vel"
    assert schema.library_key("rsl_rl", "Episode/rew_feet_air_time") == "Episode/rew_feet_air_time"  # legacy Isaac Gym's sums too
    assert schema.library_key("rsl_rl", "Loss/value_function") == "Loss/value"


def test_a_runner_instrumented_twice_times_each_call_once(tmp_path):
    import json

    tel = otel_rl.init(run_dir=tmp_path / "run", system_metrics_interval_s=0)
    runner = OnPolicyRunner(PointMass(num_envs=8), dict(TRAIN_CFG), log_dir=str(tmp_path / "rsl_rl"), device="cpu")
    instrument(runner, tel)
    instrument(runner, tel).learn(num_learning_iterations=2)  # set up again: the wrappers are replaced, not stacked
    tel.close()
    summary = json.loads((tmp_path / "run" / "run_summary.json").read_text())
    collector = summary["timelines"]["collector"]
    assert summary["timelines"]["learner"]["phases"]["learning"]["count"] == 2
    assert collector["phases"]["env_step"]["count"] == 2 * 24
    assert collector["accounted_share"] <= 1


def test_with_otel_rls_wandb_on_the_runner_makes_one_wandb_run_and_its_videos_are_recorded(tmp_path, monkeypatch):
    """RSL-RL configured with its W&B writer, otel-rl's W&B on: one W&B run (otel-rl's), RSL-RL's TensorBoard files, the videos."""
    import json

    import imageio_ffmpeg
    import numpy as np
    from wandb_reader import history, run_dirs

    monkeypatch.chdir(tmp_path)  # where RSL-RL's own W&B writer would have put its run
    monkeypatch.setenv("WANDB_SILENT", "true")
    log_dir = tmp_path / "rsl_rl"
    (log_dir / "videos" / "train").mkdir(parents=True)
    clip = log_dir / "videos" / "train" / "rl-video-step-0.mp4"  # as gymnasium's RecordVideo names them
    writer = imageio_ffmpeg.write_frames(str(clip), (16, 16), fps=10)
    writer.send(None)
    for t in range(8):
        writer.send(np.full((16, 16, 3), t * 30, np.uint8))
    writer.close()
    tel = otel_rl.init(run_dir=tmp_path / "run", wandb=True, wandb_mode="offline", panel=False)
    cfg = {**TRAIN_CFG, "logger": {"class_name": "WandbLogWriter", "project_name": "rsl"}}
    runner = OnPolicyRunner(PointMass(), cfg, log_dir=str(log_dir), device="cpu")
    instrument(runner, tel).learn(num_learning_iterations=2)
    tel.close()
    assert not (tmp_path / "wandb").exists()  # RSL-RL started no W&B run of its own
    (wandb_run,) = run_dirs(tmp_path / "run")
    rows = history(wandb_run)
    assert any("Loss/value" in row for row in rows) and any(row.get("video._type") == "video-file" for row in rows)
    assert list(log_dir.glob("events.out.tfevents.*"))  # RSL-RL's own TensorBoard files, as its W&B writer also writes
    media = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if '"kind":"media"' in line]
    assert [(m["key"], m["caption"]) for m in media] == [("video", "rl-video-step-0.mp4")]  # once, though the runner logged twice
    assert cfg["logger"] == {"class_name": "WandbLogWriter", "project_name": "rsl"}  # the configuration as the user gave it
