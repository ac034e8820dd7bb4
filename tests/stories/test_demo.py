"""The demo end to end in short mode: outputs present and well formed, every phase in trace and JSONL."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from otlp_receivers import HttpReceiver

from otel_rl.formats.schema import check_schema_version
from otel_rl.readers.analysis import protobuf_engine, trace_files

pytestmark = pytest.mark.slow  # a real RL library, the demo, or a whole machine: pytest -m 'not slow' leaves it out

LEARNER_PHASES = {"Collector Wait", "Inference", "H2D", "Forward", "D2H", "Collector Release", "Replay Sample", "Learning"}
COLLECTOR_PHASES = {"Inference Request", "Learner Action Wait", "Env Step", "Replay Write"}


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    receiver = HttpReceiver().start()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_", "WANDB_")) or k == "OTEL_RL_RUN_DIR"}
    env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        OTEL_SERVICE_NAME="sac-pendulum",  # the standard variable beats the demo's own default, in both processes
        OTEL_RL_TENSORBOARD="1",
        OTEL_RL_WANDB="1",  # offline: no W&B key in the environment
    )
    try:
        result = subprocess.run(
            [
                sys.executable, "-m", "otel_rl.cli", "demo",
                "--iterations", "260", "--learning-starts", "400", "--seconds", "120",
                "--runs-dir", str(runs), "--no-panel", "--serve",
            ],
            capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip
    finally:
        receiver.stop()
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = list(runs.iterdir())
    return run_dir, result.stdout, receiver.received


def test_outputs_are_present_and_well_formed(demo_run):
    run_dir, stdout, _ = demo_run
    names = {p.name for p in run_dir.iterdir()}
    assert {"metrics.jsonl", "trace.perfetto-trace", "run_config.json", "run_summary.json", "checkpoint.pt", "tensorboard"} <= names
    assert not any(n.startswith("trace-") for n in names)  # the collector's fragment was merged
    summary = json.loads((run_dir / "run_summary.json").read_text())
    assert check_schema_version(summary) == 1 and summary["status"] == "finished"
    run_config = json.loads((run_dir / "run_config.json").read_text())
    config = run_config["config"]
    assert config["env"] == "Pendulum-v1" and config["sac"]["batch_size"] == 256
    assert run_config["run_id"] == run_dir.name and run_config["algorithm"] == "sac"
    assert " demo --iterations 260" in run_config["command"]
    assert run_config["versions"]["torch"] and run_config["host"]
    assert "bottleneck: " in stdout and "learner iterations" in stdout


def test_the_demo_records_a_video_of_the_trained_policy(demo_run):
    import imageio_ffmpeg

    run_dir, _, _ = demo_run
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    (video,) = [r for r in records if r["kind"] == "media"]
    assert (video["key"], video["type"], video["format"], video["width"], video["height"]) == ("Media/policy", "video", "mp4", 250, 250)
    assert video["frames"] == 201  # one episode of Pendulum: its first frame and 200 steps
    reader = imageio_ffmpeg.read_frames(str(run_dir / video["path"]))
    meta = next(reader)
    assert meta["size"] == (250, 250) and sum(1 for _ in reader) == 201
    assert list((run_dir / "wandb").glob("offline-run-*/files/media/videos/Media/policy_*.mp4"))


def test_tensorboard_has_reward_and_loss_curves(demo_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _, _ = demo_run
    accumulator = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    assert {"Train/mean_reward", "Loss/critic", "Loss/actor", "Perf/learning_time"} <= tags
    assert len(accumulator.Scalars("Loss/critic")) >= 2
    assert accumulator.Histograms("Policy/replay_action")


def test_wandb_has_reward_and_loss_curves(demo_run):
    from wandb_reader import history, run_dirs, summary

    run_dir, _, _ = demo_run
    (run,) = run_dirs(run_dir)
    rows = history(run)
    for key in ("Train/mean_reward", "Loss/critic", "Loss/actor", "Policy/replay_action/p50"):
        assert sum(key in row for row in rows) >= 2, key
    # Perf/* is one row per second of wall time: a fast machine learns for under two of them
    assert any("Perf/learning_time" in row for row in rows)
    steps = [row["env_steps"] for row in rows if "Loss/critic" in row]
    assert steps == sorted(steps) and steps[0] > 0
    state = summary(run)
    assert state["state"] == "finished" and state["config"]["sac"]["batch_size"] == 256


def test_every_phase_is_in_the_trace_with_the_collector_as_its_own_process(demo_run):
    run_dir, _, _ = demo_run
    model = protobuf_engine.read(trace_files(run_dir))
    by_process = {}
    for s in model.slices:
        by_process.setdefault(s.process, set()).add(s.name)
    assert LEARNER_PHASES <= by_process["learner"]
    assert COLLECTOR_PHASES <= by_process["collector 0"]
    flows = {f for s in model.slices for f in s.flows}
    assert len(flows) >= 200  # request -> inference -> action wait, per tick


def test_every_phase_and_the_lifecycle_are_in_metrics_jsonl(demo_run):
    run_dir, _, _ = demo_run
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    statuses = [r["status"] for r in records if r["kind"] == "run"]
    assert statuses == ["pending", "running", "finished"]
    events = {r["name"] for r in records if r["kind"] == "event"}
    assert {"run_started", "warmup_done", "checkpoint_saved"} <= events
    keys = set().union(*(r["values"] for r in records if r["kind"] == "scalars"))
    assert {"Loss/critic", "Loss/actor", "Perf/total_fps", "Train/mean_reward", "Train/mean_episode_length"} <= keys
    assert {
        "Perf/iteration_time",
        "Perf/learning_time",
        "Perf/learner_collector_wait_ms",
        "Perf/learner_inference_ms",
        "Perf/learner_inference_forward_ms",
        "Perf/learner_replay_sample_ms",
        "Perf/collector_env_step_ms",
        "Perf/collector_learner_action_wait_ms",
        "Perf/collector_replay_write_ms",
    } <= keys
    assert any(k.startswith("sys/") for k in keys)


def test_otlp_spans_of_both_processes_share_the_run_trace(demo_run):
    _, _, received = demo_run
    spans = received.spans()
    roles = {}
    services = set()
    for resource, span in spans:
        attributes = {a.key: a.value.string_value for a in resource.attributes}
        roles.setdefault(attributes.get("rl.role"), []).append(span)
        services.add(attributes.get("service.name"))
    assert services == {"sac-pendulum"}
    assert {"learner", "collector 0"} <= set(roles)
    (run,) = [s for s in roles["learner"] if s.name == "rl.run"]
    assert {s.trace_id for _, s in spans} == {run.trace_id}
    collector_cycles = [s for s in roles["collector 0"] if s.name == "rl.iteration"]
    assert collector_cycles and all(s.parent_span_id == run.span_id for s in collector_cycles)
