"""The TensorBoard output, read back with TensorBoard's own event reader."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

import otel_rl


def read(log_dir) -> EventAccumulator:
    accumulator = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0, "histograms": 0})
    accumulator.Reload()
    return accumulator


def test_scalars_timings_events_and_hparams_are_in_tensorboard(tmp_path):
    tel = otel_rl.init(run_dir=tmp_path, tensorboard=True, perf_interval_s=0.05, system_metrics_interval_s=0)
    config = {"lr": 3e-4, "env": {"id": "Pendulum-v1"}, "use_per": True, "api_key": "sk-123"}
    with tel.run(config=config):
        for i in range(20):
            with tel.iteration(i, env_steps=8 * (i + 1)):
                with tel.phase("learning"):
                    time.sleep(0.002)
            tel.scalars({"Loss/critic": np.float32(1.0 / (i + 1)), "Train/mean_reward": -100.0 + i})
            if i == 10:
                tel.event("checkpoint_saved", path="ckpt.pt")
                tel.distribution("Policy/action", torch.linspace(-1, 1, 101, dtype=torch.bfloat16))
        tel.scalars({"Loss/actor": 0.5}, step=12345)
    tel.close()  # the files are complete when close() returns
    run = read(tmp_path / "tensorboard")
    critic = run.Scalars("Loss/critic")
    assert [e.step for e in critic] == [8 * (i + 1) for i in range(20)]  # env steps by default, as the JSONL
    assert critic[3].value == pytest.approx(0.25)
    assert [e.step for e in run.Scalars("Loss/actor")] == [12345]
    assert run.Scalars("Perf/learning_time") and all(e.value >= 0.002 for e in run.Scalars("Perf/learning_time"))
    (histogram,) = run.Histograms("Policy/action")
    assert histogram.step == 88 and histogram.histogram_value.num == 101
    assert histogram.histogram_value.min == -1 and histogram.histogram_value.max == 1
    assert sum(histogram.histogram_value.bucket) == 101 and histogram.histogram_value.bucket_limit[-1] == 1
    assert [e.value for e in run.Scalars("Policy/action/max")] == [1.0]
    (text,) = run.Tensors("events/checkpoint_saved")
    assert b"ckpt.pt" in text.tensor_proto.string_val[0]
    hparams = {
        tag: plugin_data_pb2.HParamsPluginData.FromString(content)
        for tag, content in run.PluginTagToContent(metadata.PLUGIN_NAME).items()
    }
    start = hparams[metadata.SESSION_START_INFO_TAG].session_start_info
    assert start.hparams["lr"].number_value == 3e-4 and start.hparams["env.id"].string_value == "Pendulum-v1"
    assert start.hparams["use_per"].bool_value is True and start.hparams["api_key"].string_value == "<redacted>"
    assert hparams[metadata.SESSION_END_INFO_TAG].session_end_info.status == api_pb2.STATUS_SUCCESS
    experiment = hparams[metadata.EXPERIMENT_TAG].experiment
    assert {m.name.tag for m in experiment.metric_infos} >= {"Loss/critic", "Train/mean_reward"}
    names = {h.name for h in experiment.hparam_infos}
    assert {"lr", "env.id", "use_per", "api_key"} <= names  # and the provenance, beside the configuration
    assert {name for name in names - {"lr", "env.id", "use_per", "api_key"}} <= {f"provenance/{key}" for key in ("git_commit", "git_branch", "git_dirty", "otel_rl_version", "host")}
    assert start.hparams["provenance/otel_rl_version"].string_value == otel_rl.__version__


@pytest.mark.parametrize("error", [RuntimeError("diverged"), KeyboardInterrupt()])
def test_a_failed_or_killed_run_ends_its_tensorboard_session_as_failed(tmp_path, error):
    tel = otel_rl.init(run_dir=tmp_path, tensorboard=True, system_metrics_interval_s=0)
    with pytest.raises(type(error)):
        with tel.run(config={"lr": 1.0}):
            raise error
    tel.close()
    run = read(tmp_path / "tensorboard")
    end = plugin_data_pb2.HParamsPluginData.FromString(run.PluginTagToContent(metadata.PLUGIN_NAME)[metadata.SESSION_END_INFO_TAG])
    assert end.session_end_info.status == api_pb2.STATUS_FAILURE


def test_an_unwritable_folder_costs_only_the_tensorboard_output(tmp_path, caplog):
    (tmp_path / "tensorboard").write_text("a file where the folder should be")
    tel = otel_rl.init(run_dir=tmp_path, tensorboard=True, jsonl=True, system_metrics_interval_s=0)
    with tel.run():
        tel.scalars({"Loss/critic": 1.0})
    tel.close()
    assert sum("tensorboard output failed" in r.getMessage() for r in caplog.records) == 1
    assert tel.stats()["dropped"]["tensorboard"] >= 1
    assert '"finished"' in (tmp_path / "metrics.jsonl").read_text()


def test_tensorboard_needs_a_run_folder():
    with pytest.raises(ValueError, match="tensorboard"):
        otel_rl.init(tensorboard=True)


def test_system_metrics_are_at_the_runs_latest_step_in_tensorboard_and_the_jsonl(tmp_path):
    tel = otel_rl.init(run_dir=tmp_path, tensorboard=True, system_metrics_interval_s=0.1)
    tel.flush(timeout_s=30)  # the agent, which samples, is up
    with tel.run():
        for i in range(40):
            with tel.iteration(i, env_steps=8 * (i + 1)):
                with tel.phase("learning"):
                    time.sleep(0.03)
            tel.scalars({"Loss/critic": 1.0})
    tel.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    system = [r for r in records if r["kind"] == "scalars" and "sys/process_rss_bytes" in r["values"]]
    later = system[1:]  # the first sample may come before the first iteration
    assert len(later) >= 3 and all(r["step"] == r["axes"]["env_steps"] for r in later)
    assert all(8 <= r["axes"]["env_steps"] <= 320 and r["axes"]["iteration"] is not None for r in later)
    steps = [r["axes"]["env_steps"] for r in later]
    assert steps == sorted(steps) and steps[-1] > steps[0]  # they move with the run, never backwards
    tensorboard = [e.step for e in read(tmp_path / "tensorboard").Scalars("sys/process_rss_bytes")]
    assert len(set(tensorboard)) >= 3 and tensorboard == sorted(tensorboard)  # not every point at step 0


def test_a_loop_without_steps_or_env_steps_plots_against_its_iterations(tmp_path):
    """Neither ``env_steps=`` nor ``step=``: every scalar, distribution and event at its iteration, never all at step 0."""
    tel = otel_rl.init(run_dir=tmp_path, tensorboard=True, perf_interval_s=0.05, system_metrics_interval_s=0)
    with tel.run():
        for i in range(5):
            with tel.iteration(i):
                with tel.phase("learning"):
                    time.sleep(0.01)
            tel.scalars({"Loss/critic": float(i + 1)})
            tel.distribution("Policy/action", np.arange(10.0) + i)
            if i == 3:
                tel.event("checkpoint_saved", path="ckpt.pt")
    tel.close()
    run = read(tmp_path / "tensorboard")
    assert [(e.step, e.value) for e in run.Scalars("Loss/critic")] == [(i, float(i + 1)) for i in range(5)]
    assert [e.step for e in run.Histograms("Policy/action")] == list(range(5))
    assert [e.step for e in run.Tensors("events/checkpoint_saved")] == [3]
    assert max(e.step for e in run.Scalars("Perf/iteration_time")) > 0
    # Both axes beside the scalars, once per iteration: a loop without env steps counts iterations.
    assert [(e.step, e.value) for e in run.Scalars("axis/iteration")] == [(i, float(i)) for i in range(5)]
    assert [(e.step, e.value) for e in run.Scalars("axis/env_steps_total")] == [(i, float(i)) for i in range(5)]


def test_the_iteration_and_env_steps_axes_are_written_beside_the_scalars(tmp_path):
    """Seed 003's ``axis/*`` scalars: at each step the iteration and the env steps, so a chart can be read against either."""
    tel = otel_rl.init(run_dir=tmp_path, tensorboard=True, system_metrics_interval_s=0)
    with tel.run():
        for i in range(6):
            with tel.iteration(i, env_steps=64 * (i + 1)):
                pass
            tel.scalars({"Loss/critic": 1.0})
            tel.scalars({"Loss/actor": 2.0})  # a second call of the same iteration: the axes once
        tel.scalars({"Loss/actor": 3.0}, step=1000)  # the loop's own step: the axes stay the iteration's
    tel.close()
    run = read(tmp_path / "tensorboard")
    assert [(e.step, e.value) for e in run.Scalars("axis/iteration")] == [(64 * (i + 1), float(i)) for i in range(6)]
    assert [(e.step, e.value) for e in run.Scalars("axis/env_steps_total")] == [(64 * (i + 1), 64.0 * (i + 1)) for i in range(6)]
    assert len(run.Scalars("Loss/actor")) == 7


def test_the_folder_can_be_chosen_by_keyword_or_variable_and_choosing_it_switches_tensorboard_on(tmp_path, monkeypatch):
    chosen = tmp_path / "tb" / "sac-1"
    tel = otel_rl.init(run_dir=tmp_path / "run", tensorboard_dir=chosen, system_metrics_interval_s=0)
    assert tel.config.tensorboard is True
    with tel.run(config={"lr": 1e-3}):
        tel.scalars({"Loss/critic": 1.0}, step=1)
    tel.close()
    assert not (tmp_path / "run" / "tensorboard").exists()
    assert [e.step for e in read(chosen).Scalars("Loss/critic")] == [1]
    # A folder of its own, without a run folder, from the environment.
    monkeypatch.setenv("OTEL_RL_TENSORBOARD_DIR", str(tmp_path / "from-env"))
    tel = otel_rl.init(system_metrics_interval_s=0)
    with tel.run():
        tel.scalars({"Loss/critic": 2.0}, step=2)
    tel.close()
    assert [(e.step, e.value) for e in read(tmp_path / "from-env").Scalars("Loss/critic")] == [(2, 2.0)]
    with pytest.raises(ValueError, match="tensorboard_dir .* is a file"):
        (tmp_path / "a-file").write_text("x")
        otel_rl.init(run_dir=tmp_path / "r2", tensorboard_dir=tmp_path / "a-file")
