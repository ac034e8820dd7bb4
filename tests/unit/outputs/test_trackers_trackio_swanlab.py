"""The Trackio and SwanLab outputs, run in their local and offline modes and read back with their own readers."""

from __future__ import annotations

import contextlib
import logging
import time

import numpy as np
import psutil
import pytest
import torch
import trackio_reader
from swanlab_reader import config as swanlab_config
from swanlab_reader import finish, records, run_dirs, scalars

import otel_rl

TRACKER_VARIABLES = ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL", "OTEL_RL_TRACKIO_MODE", "SWANLAB_MODE", "SWANLAB_API_KEY", "WANDB_PROJECT")


@pytest.fixture(autouse=True)
def local(monkeypatch, tmp_path):
    for name in TRACKER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio-home"))  # Trackio's database, as its users move it


def train(tel, n=20, fail=None):
    with tel.run(config={"lr": 3e-4, "env": {"id": "Pendulum-v1"}, "api_key": "sk-123"}):
        for i in range(n):
            with tel.iteration(i, env_steps=8 * (i + 1)):
                with tel.phase("learning"):
                    time.sleep(0.002)
            tel.scalars({"Loss/critic": np.float32(1.0 / (i + 1)), "Train/mean_reward": torch.tensor(-100.0 + i)})
            if i == 10:
                tel.event("checkpoint_saved", path="ckpt.pt")
                tel.distribution("Policy/action", torch.linspace(-1, 1, 101))
        if fail is not None:
            raise fail
    agent = tel.stats().get("agent_pid") if tel.stats().get("agent") == "process" else None
    tel.close()
    if agent:  # past the close deadline the agent process goes on handing a slow SDK its records: read once it is done
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(agent).wait(timeout=150)


def test_scalars_axes_timings_histograms_events_and_config_reach_trackio(tmp_path):
    train(otel_rl.init(run_dir=tmp_path / "exp", trackio=True, perf_interval_s=0.05, system_metrics_interval_s=0, project="sweep", group="g1"))
    found = trackio_reader.read(tmp_path / "trackio-home", "sweep", "exp")
    logs, config = found["logs"], found["config"]
    assert found["runs"] == ["exp"]
    critic = [(row["step"], row["Loss/critic"]) for row in logs if "Loss/critic" in row]
    assert [s for s, _ in critic] == [8 * (i + 1) for i in range(20)] and critic[3][1] == pytest.approx(0.25)
    assert [(row["axis/iteration"], row["axis/env_steps_total"]) for row in logs if "Loss/critic" in row] == [(i, 8 * (i + 1)) for i in range(20)]
    assert any(row.get("Perf/learning_time", 0) >= 0.002 for row in logs)
    (histogram,) = [row["Policy/action"] for row in logs if "Policy/action" in row]
    assert histogram["_type"] == "trackio.histogram" and histogram["bins"][0] == -1 and histogram["bins"][-1] == 1
    assert [(row["step"], row["events/checkpoint_saved/count"]) for row in logs if "events/checkpoint_saved/count" in row] == [(88, 1)]
    assert config["lr"] == 3e-4 and config["env"] == {"id": "Pendulum-v1"} and config["api_key"] == "<redacted>"
    assert config["otel_rl"]["versions"]["otel_rl"] and config["_Group"] == "g1"


def test_scalars_axes_events_config_and_the_end_state_reach_swanlab(tmp_path):
    train(otel_rl.init(run_dir=tmp_path / "exp", swanlab=True, perf_interval_s=0.05, system_metrics_interval_s=0, project="sweep", group="g1"))
    (run,) = run_dirs(tmp_path / "exp" / "swanlab")  # offline: the run's file in the run folder, for swanlab sync
    points = scalars(run)
    assert [s for s, _ in points["Loss/critic"]] == [8 * (i + 1) for i in range(20)]
    assert points["Loss/critic"][3][1] == pytest.approx(0.25)
    assert points["axis/iteration"] == [(8 * (i + 1), float(i)) for i in range(20)]
    assert points["events/checkpoint_saved/count"] == [(88, 1.0)]
    assert points["Policy/action/p50"] == [(88, pytest.approx(0.0, abs=1e-6))]  # a distribution is its statistics here
    assert any(v >= 0.002 for _, v in points["Perf/learning_time"])
    start = next(r.start for r in records(run) if r.HasField("start"))
    assert (start.project, start.name, start.group) == ("sweep", "exp", "g1")
    assert finish(run) == ("RUN_STATE_FINISHED", "")
    saved = swanlab_config(run)
    assert saved["lr"] == 3e-4 and saved["api_key"] == "<redacted>" and saved["otel_rl"]["git"]


def test_a_failed_run_is_crashed_in_swanlab_with_its_reason(tmp_path):
    tel = otel_rl.init(run_dir=tmp_path, swanlab=True, system_metrics_interval_s=0)
    with pytest.raises(RuntimeError):
        train(tel, n=3, fail=RuntimeError("diverged"))
    tel.close()
    (run,) = run_dirs(tmp_path / "swanlab")
    state, error = finish(run)
    assert state == "RUN_STATE_CRASHED" and "diverged" in error


def test_the_modes_as_their_users_give_them(tmp_path, monkeypatch, caplog):
    assert otel_rl.TelemetryConfig.from_options(tmp_path / "a", None, swanlab=True).swanlab_mode == "offline"  # never a login prompt
    assert otel_rl.TelemetryConfig.from_options(tmp_path / "a", None, swanlab=True, swanlab_mode="cloud").swanlab_mode == "online"
    assert otel_rl.TelemetryConfig.from_options(tmp_path / "a", None, trackio=True).trackio_mode == "local"
    off = otel_rl.TelemetryConfig.from_options(tmp_path / "a", None, swanlab=True, swanlab_mode="disabled", trackio=True, trackio_mode="disabled")
    assert not off.swanlab and not off.trackio  # the tracker's own "no run": nothing starts
    with pytest.raises(ValueError, match="swanlab_mode must be online, offline, local, disabled, got 'ofline'; did you mean 'offline'"):
        otel_rl.TelemetryConfig.from_options(tmp_path / "a", None, swanlab=True, swanlab_mode="ofline")
    with pytest.raises(ValueError, match="trackio_mode='online' needs a place to log to: set TRACKIO_SPACE_ID"):
        otel_rl.TelemetryConfig.from_options(tmp_path / "a", None, trackio=True, trackio_mode="online")
    monkeypatch.setenv("SWANLAB_API_KEY", "k")
    monkeypatch.setenv("TRACKIO_SPACE_ID", "me/space")
    both = otel_rl.TelemetryConfig.from_options(tmp_path / "a", None, swanlab=True, trackio=True)
    assert (both.swanlab_mode, both.trackio_mode) == ("online", "online")
    monkeypatch.setenv("SWANLAB_MODE", "sideways")
    with caplog.at_level(logging.WARNING):
        assert otel_rl.TelemetryConfig.from_options(tmp_path / "a", None, swanlab=True).swanlab_mode == "online"
    assert sum("SWANLAB_MODE" in r.getMessage() for r in caplog.records) == 1


def test_the_trackers_speak_for_rank_zero_only(tmp_path):
    config = otel_rl.TelemetryConfig.from_options(tmp_path, None, trackio=True, swanlab=True, rank=1, world_size=2)
    assert not config.trackio and not config.swanlab


def test_a_second_swanlab_run_in_one_process_costs_only_its_own_output(tmp_path, caplog):
    """SwanLab keeps one run per process: with the outputs in the training process, a second otel-rl run gets none, said once."""
    first = otel_rl.init(run_dir=tmp_path / "a", swanlab=True, agent="thread", system_metrics_interval_s=0)
    second = otel_rl.init(run_dir=tmp_path / "b", swanlab=True, agent="thread", system_metrics_interval_s=0)
    with caplog.at_level(logging.WARNING):
        with first.run(), second.run():
            for i in range(5):
                with first.iteration(i, env_steps=i + 1), second.iteration(i, env_steps=i + 1):
                    pass
                first.scalars({"Loss/critic": 1.0})
                second.scalars({"Loss/critic": 2.0})
            first.flush()  # the first run's SwanLab run is open ...
            second.flush()  # ... while the second one tries to open its own
        first.close()
        second.close()
    assert [v for _, v in scalars(run_dirs(tmp_path / "a" / "swanlab")[0])["Loss/critic"]] == [1.0] * 5
    assert sum("swanlab output failed" in r.getMessage() for r in caplog.records) == 1
    assert len((tmp_path / "b" / "metrics.jsonl").read_text().splitlines()) > 5  # the rest of the run is whole


def test_videos_and_images_reach_trackio_and_swanlab_as_their_own_media(tmp_path):
    frames = np.zeros((6, 16, 16, 3), np.uint8)
    frames[:, 4:12, 4:12] = 200
    tel = otel_rl.init(run_dir=tmp_path / "exp", trackio=True, swanlab=True, system_metrics_interval_s=0, project="media", panel=False)
    with tel.run():
        for i in range(3):
            with tel.iteration(i, env_steps=8 * (i + 1)):
                pass
        tel.video("Media/play", frames, fps=6)
        tel.image("Media/map", np.linspace(0, 1, 64).reshape(8, 8), caption="a map")
    tel.close()
    logs = trackio_reader.read(tmp_path / "trackio-home", "media", "exp")["logs"]
    (video,) = [row["Media/play"] for row in logs if "Media/play" in row]
    (image,) = [row["Media/map"] for row in logs if "Media/map" in row]
    assert video["_type"] == "trackio.video" and image["_type"] == "trackio.image" and image["caption"] == "a map"
    (run,) = run_dirs(tmp_path / "exp" / "swanlab")
    logged = [record for record in records(run) if record.HasField("media")]
    assert [record.media.key for record in logged] == ["Media/map"]  # SwanLab shows images (its videos are GIFs)
