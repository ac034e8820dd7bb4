"""The recorder and pipeline: nesting, Other, contract warning, threads, overflow, misuse."""

from __future__ import annotations

import logging
import threading
import time

import pytest

import otel_rl
from otel_rl.config import TelemetryConfig
from otel_rl.telemetry import Telemetry


def make(capture, **options) -> Telemetry:
    return Telemetry(TelemetryConfig(**options), sinks=[capture])


def test_nested_phases_are_children_and_not_counted_twice(capture):
    tel = make(capture)
    with tel.iteration(7, env_steps=56):
        with tel.phase("collector_wait"):
            time.sleep(0.002)
        with tel.phase("inference"):
            with tel.phase("inference_h2d"):
                time.sleep(0.001)
            with tel.phase("inference_forward"):
                time.sleep(0.002)
        with tel.phase("learning"):
            time.sleep(0.005)
        time.sleep(0.003)  # unaccounted: Other
    tel.close()

    (it,) = capture.iterations
    assert (it.index, it.env_steps, it.timeline) == (7, 56, "learner")
    assert [p.spec.name for p in it.phases] == ["collector_wait", "inference", "learning"]
    inference = it.phases[1]
    assert [c.spec.name for c in inference.children] == ["inference_h2d", "inference_forward"]
    assert (inference.iteration, inference.env_steps) == (7, 56)  # nested phases share it
    assert it.accounted_ns == sum(p.duration_ns for p in it.phases)
    assert it.accounted_ns + it.other_ns == it.wall_ns
    assert it.other_ns >= 3_000_000
    assert inference.children[1].duration_ns >= 2_000_000


def test_contract_warning_when_accounted_exceeds_wall(capture, caplog):
    tel = make(capture)
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        with tel.iteration(0):
            began = time.perf_counter_ns()
            time.sleep(0.006)
            now = time.perf_counter_ns()
            # Two externally measured phases that overlap each other, each nearly the whole iteration (however long a
            # loaded host's sleep took): together about twice its wall.
            tel.record_phase("learning", began, now)
            tel.record_phase("replay_sample", began, now)
        tel.close()
    (it,) = capture.iterations
    assert it.accounted_ns > it.wall_ns
    assert it.other_ns == 0
    assert any("contract warning" in r.getMessage() for r in caplog.records)


def test_two_timelines_on_two_threads_concurrently(capture):
    tel = make(capture)
    stop = threading.Event()

    def collector():
        cycle = 0
        while not stop.is_set():
            with tel.iteration(cycle, timeline="collector"):
                with tel.phase("env_step", "collector"):
                    time.sleep(0.001)
                with tel.phase("replay_write", "collector"):
                    time.sleep(0.0005)
            cycle += 1

    thread = threading.Thread(target=collector, name="collector")
    thread.start()
    for i in range(10):
        with tel.iteration(i, env_steps=i):
            with tel.phase("collector_wait"):
                time.sleep(0.001)
            with tel.phase("learning"):
                time.sleep(0.002)
    stop.set()
    thread.join()
    tel.close()

    learner = [it for it in capture.iterations if it.timeline == "learner"]
    collector_its = [it for it in capture.iterations if it.timeline == "collector"]
    assert len(learner) == 10 and len(collector_its) >= 5
    assert {p.spec.name for it in collector_its for p in it.phases} == {"env_step", "replay_write"}
    assert {p.spec.name for it in learner for p in it.phases} == {"collector_wait", "learning"}
    assert learner[0].thread_id != collector_its[0].thread_id
    assert collector_its[0].thread_name == "collector"
    # The timelines really overlapped in time.
    overlap = [c for c in collector_its if c.start_ns < learner[-1].end_ns and c.end_ns > learner[0].start_ns]
    assert overlap


def test_loose_phases_outside_iterations(capture):
    tel = make(capture)
    with tel.phase("env_step", "collector"):
        pass
    tel.close()
    assert [p.spec.name for p in capture.phases] == ["env_step"]
    assert capture.iterations == []


def test_a_full_lane_refuses_new_records_and_counts_them(capture):
    tel = make(capture, lane_capacity=4096, pipeline_interval_s=60)
    phase = tel.phase("learning")
    for _ in range(5000):
        with phase:
            pass
    assert tel.stats()["dropped"]["phases"] == 5000 - 4096
    tel.close()
    assert len(capture.phases) == 4096
    # What the pipeline may be reading is never overwritten: the survivors are the first records, in order.
    ends = [p.end_ns for p in capture.phases]
    assert ends == sorted(ends)


def test_exception_in_phase_propagates_unchanged_and_marks_error(capture):
    tel = make(capture)
    error = RuntimeError("boom")
    with pytest.raises(RuntimeError) as raised:
        with tel.iteration(0):
            with tel.phase("learning"):
                raise error
    assert raised.value is error
    tel.close()
    assert capture.iterations[0].phases[0].error == "RuntimeError"


def test_phase_as_decorator(capture):
    tel = make(capture)

    @tel.phase("replay_sample")
    def sample(n):
        return n * 2

    with tel.iteration(0):
        assert sample(4) == 8
    tel.close()
    assert capture.iterations[0].phases[0].spec.name == "replay_sample"


def test_phase_exited_on_another_thread_warns_once(capture, caplog):
    tel = make(capture)
    phase = tel.phase("learning")
    phase.__enter__()
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        for _ in range(3):
            t = threading.Thread(target=phase.__exit__, args=(None, None, None))
            t.start()
            t.join()
    phase.__exit__(None, None, None)
    tel.close()
    messages = [r.getMessage() for r in caplog.records if "did not enter" in r.getMessage()]
    assert len(messages) == 1
    assert len(capture.phases) == 1  # the real exit on the owning thread still counts


def test_iteration_entered_twice_warns_and_keeps_outer(capture, caplog):
    tel = make(capture)
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        with tel.iteration(1):
            with tel.iteration(2):
                with tel.phase("learning"):
                    pass
    tel.close()
    assert [it.index for it in capture.iterations] == [1]
    assert any("entered while iteration" in r.getMessage() for r in caplog.records)


def test_calls_after_close_warn_and_do_not_raise(capture, caplog):
    tel = make(capture)
    tel.close()
    tel.close()  # idempotent
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        tel.scalars({"Loss/critic": 1.0})
        tel.event("late")
        with tel.iteration(0):
            with tel.phase("learning"):
                pass
    assert tel.flush() is True
    assert any("after close" in r.getMessage() for r in caplog.records)


def test_scalars_nonfinite_become_none_with_one_event(capture):
    tel = make(capture)
    with tel.iteration(3, env_steps=24):
        tel.scalars({"Loss/critic": float("nan"), "Train/mean_reward": 2})
    tel.scalars({"Loss/critic": float("inf")}, step=99)
    tel.close()
    first, second = capture.scalars
    assert first.values == {"Loss/critic": None, "Train/mean_reward": 2}
    assert (first.iteration, first.env_steps, first.step) == (3, 24, None)
    assert second.step == 99
    assert [e.name for e in capture.events] == ["nonfinite"]


def test_repeated_keys_keep_cleaning_every_value(capture):
    # Once keys are known, plain finite values take a fast path; anything else must still be cleaned.
    tel = make(capture)
    for values in (
        {"Loss/critic": 1.0, "Train/mean_reward": 2},
        {"Loss/critic": 1.5, "Train/mean_reward": 3},
        {"Loss/critic": float("nan"), "Train/mean_reward": 3},
        {"Loss/critic": True, "Train/mean_reward": 10**400},
        {"Loss/critic": 1e308, "Train/mean_reward": 1e308},
    ):
        tel.scalars(values)
    tel.close()
    assert [r.values for r in capture.scalars] == [
        {"Loss/critic": 1.0, "Train/mean_reward": 2},
        {"Loss/critic": 1.5, "Train/mean_reward": 3},
        {"Loss/critic": None, "Train/mean_reward": 3},
        {"Loss/critic": 1, "Train/mean_reward": None},  # an int beyond any float: as infinite as it gets
        {"Loss/critic": 1e308, "Train/mean_reward": 1e308},
    ]
    assert [(e.name, e.attributes["key"]) for e in capture.events] == [
        ("nonfinite", "Loss/critic"),
        ("nonfinite", "Train/mean_reward"),
    ]


def test_numpy_values_are_converted(capture):
    np = pytest.importorskip("numpy")
    tel = make(capture)
    tel.scalars({"Loss/actor": np.float32(1.5), "Train/mean_episode_length": np.int64(200)})
    tel.close()
    assert capture.scalars[0].values == {"Loss/actor": 1.5, "Train/mean_episode_length": 200}


def test_run_lifecycle_statuses(capture):
    tel = make(capture)
    with tel.run():
        pass
    with pytest.raises(ValueError):
        with tel.run():
            raise ValueError("bad value")
    with pytest.raises(KeyboardInterrupt):
        with tel.run():
            raise KeyboardInterrupt
    with pytest.raises(SystemExit):
        with tel.run():
            raise SystemExit(0)
    tel.close()
    ends = [(r.status, r.reason) for r in capture.runs if r.status != "running"]
    assert ends == [
        ("finished", None),
        ("failed", "ValueError: bad value"),
        ("killed", "KeyboardInterrupt"),
        ("finished", None),
    ]


def test_disabled_is_a_true_noop(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    before = threading.active_count()
    tel = otel_rl.init(run_dir=tmp_path / "run")
    assert isinstance(tel, otel_rl.NoOpTelemetry)
    with tel.run():
        with tel.iteration(0):
            with tel.phase("learning"):
                pass
        tel.scalars({"Loss/critic": 1.0})
        tel.event("x")
    tel.close()
    assert threading.active_count() == before
    assert not (tmp_path / "run").exists()
    assert isinstance(otel_rl.init(enabled=False), otel_rl.NoOpTelemetry)


def test_unknown_option_and_bad_values_raise():
    with pytest.raises(TypeError, match="unknown option"):
        otel_rl.init(span_budget=3)
    with pytest.raises(ValueError, match="lane_capacity"):
        otel_rl.init(lane_capacity=0)
    with pytest.raises(otel_rl.SchemaError, match="unknown timeline"):
        otel_rl.init(enabled=False) and None or Telemetry(TelemetryConfig()).phase("x", "gpu")


def test_strict_mode_rejects_unknown_keys_and_phases():
    tel = otel_rl.init(strict=True)
    try:
        with pytest.raises(otel_rl.SchemaError, match="strict"):
            tel.scalars({"mine/thing": 1.0})
        with pytest.raises(otel_rl.SchemaError, match="strict"):
            tel.phase("my_phase")
        tel.scalars({"Loss/critic": 1.0, "Perf/total_fps": 10.0})
        tel.phase("learning")
    finally:
        tel.close()


def test_run_summary_is_written_and_versioned(tmp_path):
    import json

    tel = otel_rl.init(run_dir=tmp_path)
    with tel.run():
        with tel.iteration(0, env_steps=4):
            with tel.phase("learning"):
                time.sleep(0.001)
    tel.close()
    summary = json.loads((tmp_path / "run_summary.json").read_text())
    assert summary["metric_schema_version"] == 1
    assert summary["status"] == "finished"
    assert summary["timelines"]["learner"]["phases"]["learning"]["count"] == 1
    learner = summary["timelines"]["learner"]
    assert abs(learner["accounted_share"] + learner["other_share"] - 1.0) < 1e-9


def test_unnamespaced_and_bad_values_warn_and_keep_going(capture, caplog):
    tel = make(capture)
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        tel.scalars({"loss": 1.0, "Loss/critic": "not a number"})
        tel.scalars({"loss": 2.0})
    tel.close()
    # A value that is not a number is dropped (null means NaN or Inf in the protocol), with one warning naming it.
    assert [r.values for r in capture.scalars] == [
        {"custom/loss": 1.0},
        {"custom/loss": 2.0},
    ]
    assert sum("custom/loss" in r.getMessage() for r in caplog.records) == 1
    assert sum("'Loss/critic' is str, not a number" in r.getMessage() for r in caplog.records) == 1


def test_stats_weighting_counts_never_reach_a_backend(capture):
    tel = make(capture)
    tel.scalars({"reward": 1.0, "rollout/reward": 2.0, "rollout/reward__count": 4.0})
    tel.close()
    assert capture.scalars[0].values == {"custom/reward": 1.0, "rollout/reward": 2.0}


def test_noop_has_the_whole_api():
    noop_api = {n for n in dir(otel_rl.NoOpTelemetry) if not n.startswith("_")}
    real_api = {n for n in dir(Telemetry) if not n.startswith("_")}
    assert real_api - noop_api <= {"tracer_provider", "meter_provider", "enabled"}, real_api - noop_api
