"""Stable-Baselines3: real PPO, SAC and DQN on Gymnasium environments, with the callback added."""

from __future__ import annotations

import pytest
from integration_checks import check_run, counts, framework, records
from stable_baselines3 import DQN, PPO, SAC
from stable_baselines3.common.callbacks import CheckpointCallback

import otel_rl
from otel_rl.formats import schema
from otel_rl.integrations.sb3 import TelemetryCallback, TelemetryOutput

pytestmark = pytest.mark.slow  # a real RL library, the demo, or a whole machine: pytest -m 'not slow' leaves it out

BOTH_TIMELINES = {"learner": {"Learning", "Policy Inference", "Env Step"}}


def test_ppo_on_cartpole_records_both_timelines_and_sb3s_metrics(tmp_path, capfd):
    # The fewest lines: a run folder, the callback; no tel.run(), no output options.
    tel = otel_rl.init(run_dir=tmp_path)
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=256, batch_size=64, n_epochs=2, device="cpu", seed=0)
    model.learn(2048, callback=TelemetryCallback(tel))
    tel.close()
    said = capfd.readouterr().err
    assert f"records into {tmp_path} (metrics.jsonl, trace.perfetto-trace" in said
    assert f"run {tmp_path.name} finished after" in said and f"otel-rl analyze {tmp_path}" in said
    (running,) = [r for r in records(tmp_path) if r["kind"] == "run" and r["status"] == "running"]
    assert running["total_steps"] == 2048 and running["num_envs"] == 1 and running["family"] == "rl.onpolicy"
    assert running["config"]["algorithm"] == "PPO" and running["config"]["n_steps"] == 256
    assert framework(tmp_path) == {"system": "stable_baselines3", "environment": "CartPole-v1", "algorithm": "PPO"}
    found = check_run(
        tmp_path,
        BOTH_TIMELINES,
        {"Train/mean_reward", "Train/mean_episode_length", "Perf/total_fps", "Loss/value", "Loss/policy",
         "Loss/entropy", "Policy/approx_kl", "Perf/learning_time", "Perf/collector_env_step_ms",
         "Perf/collector_policy_inference_ms"},
    )  # fmt: skip
    assert not any(k.startswith(("train/", "rollout/", "time/")) for k in found["keys"])
    assert "sb3/time/iterations" in found["keys"]
    rates = [r["values"] for r in records(tmp_path) if r["kind"] == "scalars" and "Episode/terminated_rate" in r["values"]]
    assert rates and all(v["Episode/timeout_rate"] + v["Episode/terminated_rate"] == pytest.approx(1.0) for v in rates)
    assert rates[0]["Episode/terminated_rate"] == 1.0  # an untrained CartPole falls long before its time limit
    counted = counts(tmp_path)
    assert counted["collector"]["cycles"] == 2048 // 256  # one per rollout
    assert counted["learner"]["cycles"] == 2048 // 256  # one per train()
    assert counted["collector"]["env_step"] == counted["collector"]["policy_inference"] == 2048


@pytest.mark.parametrize("algorithm", ["sac", "dqn"])
def test_off_policy_algorithms_record_the_same_timelines(tmp_path, algorithm):
    tel = otel_rl.init(run_dir=tmp_path, jsonl=True, trace_enabled=True, algorithm=algorithm, system_metrics_interval_s=0)
    with tel.run(family="rl.offpolicy"):
        if algorithm == "sac":
            model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=100, batch_size=64, device="cpu", seed=0)
            checkpoints = CheckpointCallback(save_freq=250, save_path=str(tmp_path / "ckpt"), name_prefix="sac")
            model.learn(600, callback=[checkpoints, TelemetryCallback(tel)], log_interval=1)
            expected = {"Loss/actor", "Loss/critic", "Policy/alpha", "Loss/alpha"}
        else:
            model = DQN("MlpPolicy", "CartPole-v1", learning_starts=200, train_freq=4, device="cpu", seed=0)
            model.learn(2000, callback=TelemetryCallback(tel), log_interval=4)
            expected = {"Loss/total", "Policy/exploration_rate"}
    tel.close()
    check_run(tmp_path, BOTH_TIMELINES, {"Train/mean_reward", "Perf/learning_time", *expected})
    # The wrapping is undone after learn(): the model predicts as before, without phases.
    assert "predict" not in vars(model) and "train" not in vars(model) and "step" not in vars(model.get_env()) and "save" not in vars(model)
    events = [r for r in records(tmp_path) if r["kind"] == "event"]
    (warm,) = [e for e in events if e["name"] == "warmup_done"]  # the first update, after learning_starts
    assert warm["attributes"]["env_steps"] >= warm["attributes"]["learning_starts"] == model.learning_starts
    if algorithm == "sac":  # the library's own CheckpointCallback: each save is an event naming its file
        saved = [e["attributes"]["path"] for e in events if e["name"] == "checkpoint_saved"]
        assert [p.removesuffix(".zip") for p in saved] == [str(tmp_path / "ckpt" / f"sac_{n}_steps") for n in (250, 500)]
        restored = SAC.load(tmp_path / "ckpt" / "sac_500_steps.zip", device="cpu")  # a checkpoint as SB3 writes it: no wrapper in it
        rates = [(r["values"]["Episode/timeout_rate"], r["values"]["Episode/terminated_rate"]) for r in records(tmp_path)
                 if r["kind"] == "scalars" and "Episode/timeout_rate" in r["values"]]  # fmt: skip
        assert rates == [(1.0, 0.0)] * 3  # Pendulum's episodes only end at its 200-step limit: 3 of them in 600 steps
        assert not {"train", "predict", "save"} & set(vars(restored))


def test_the_logger_output_maps_keys_and_skips_what_is_not_a_number(tmp_path):
    import numpy as np
    import torch

    tel = otel_rl.init(run_dir=tmp_path, jsonl=True, system_metrics_interval_s=0)
    with tel.run():
        TelemetryOutput(tel).write(
            {"train/value_loss": np.float32(0.5), "rollout/ep_rew_mean": torch.tensor(10.0), "custom_stat": 3,
             "video": object(), "train/std": "n/a"},
            {}, step=42,
        )  # fmt: skip
    tel.close()
    (scalars,) = [r for r in records(tmp_path) if r["kind"] == "scalars"]
    assert scalars["step"] == 42
    assert scalars["values"] == {"Loss/value": 0.5, "Train/mean_reward": 10.0, "sb3/custom_stat": 3}
    assert schema.library_key("sb3", "time/fps") == "Perf/total_fps"
    assert schema.library_key("sb3", "train/policy_loss") == "Loss/policy"  # A2C's name for it
    # A tag without a canonical counterpart is SB3's own, never left beside the canonical families.
    assert schema.library_key("sb3", "time/iterations") == "sb3/time/iterations"
    assert schema.library_key("sb3", "train/n_updates") == "Train/n_updates"


def test_a_learn_that_raises_ends_the_run_as_failed_at_exit(tmp_path):
    """No tel.run(), no close(): the script dies of the environment's exception, and the run says so."""
    import json
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import gymnasium as gym, otel_rl
        from stable_baselines3 import PPO
        from otel_rl.integrations.sb3 import TelemetryCallback

        class Broken(gym.Wrapper):
            steps = 0
            def step(self, action):
                Broken.steps += 1
                if Broken.steps > 300:
                    raise RuntimeError("the simulator crashed")
                return self.env.step(action)

        tel = otel_rl.init(run_dir={str(tmp_path)!r}, system_metrics_interval_s=0)
        PPO("MlpPolicy", Broken(gym.make("CartPole-v1")), n_steps=128, device="cpu").learn(1024, callback=TelemetryCallback(tel))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "the simulator crashed" in result.stderr
    summary = json.loads((tmp_path / "run_summary.json").read_text())
    assert summary["status"] == "failed" and summary["reason"] == "RuntimeError: the simulator crashed"
    assert f"run {tmp_path.name} failed after" in result.stderr


def test_a_callback_reused_after_a_learn_that_raised_counts_each_call_once(tmp_path):
    import json

    import gymnasium as gym

    class Broken(gym.Wrapper):
        fail = True

        def step(self, action):
            if Broken.fail and Broken.steps_left <= 0:
                Broken.fail = False
                raise RuntimeError("the simulator crashed")
            Broken.steps_left -= 1
            return self.env.step(action)

    Broken.steps_left = 150
    tel = otel_rl.init(run_dir=tmp_path, system_metrics_interval_s=0)
    model = PPO("MlpPolicy", Broken(gym.make("CartPole-v1")), n_steps=64, n_epochs=1, device="cpu")
    callback = TelemetryCallback(tel)
    with pytest.raises(RuntimeError, match="the simulator crashed"):
        model.learn(256, callback=callback)
    model.learn(256, callback=callback, reset_num_timesteps=True)  # the same callback again
    tel.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    ends = [(r["status"], r.get("reason")) for r in records if r["kind"] == "run" and r["status"] not in ("pending", "running")]
    assert ends == [("failed", "RuntimeError: model.learn() raised before its training ended"), ("finished", None)]
    summary = json.loads((tmp_path / "run_summary.json").read_text())
    learner, collector = summary["timelines"]["learner"], summary["timelines"]["collector"]
    # 2 train() calls and 151 env steps (the last one raised) in the first learn(), 4 and 256 in the second: each timed once.
    assert learner["phases"]["learning"]["count"] == 2 + 4
    assert collector["phases"]["env_step"]["count"] == 151 + 256
    assert 0 < learner["accounted_share"] <= 1 and 0 < collector["accounted_share"] <= 1


def test_the_run_records_the_whole_configuration_and_the_algorithm(tmp_path):
    import json

    import gymnasium as gym
    import torch

    tel = otel_rl.init(run_dir=tmp_path, system_metrics_interval_s=0)
    kwargs = {"net_arch": [64, 64], "activation_fn": torch.nn.ReLU}
    model = SAC("MlpPolicy", gym.make("Pendulum-v1"), policy_kwargs=kwargs, train_freq=(2, "step"), seed=3, learning_starts=50, device="cpu")
    model.learn(120, callback=TelemetryCallback(tel))
    tel.close()
    run_config = json.loads((tmp_path / "run_config.json").read_text())
    config = run_config["config"]
    assert config["policy_kwargs"] == {"net_arch": [64, 64], "activation_fn": "torch.nn.modules.activation.ReLU", "use_sde": False}
    assert config["train_freq"] == {"frequency": 2, "unit": "STEP"} and config["seed"] == 3 and config["device"] == "cpu"
    assert "policy" not in config and "env" not in config and "replay_buffer" not in config  # objects, not settings
    assert run_config["algorithm"] == "SAC"
    assert json.loads((tmp_path / "run_summary.json").read_text())["algorithm"] == "SAC"
