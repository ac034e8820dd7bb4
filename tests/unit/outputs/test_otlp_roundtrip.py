"""A real round trip: otel-rl -> OTLP (gRPC and HTTP/protobuf) -> receivers on loopback."""

from __future__ import annotations

import logging
import random
import time

import pytest
from otlp_receivers import GrpcReceiver, HttpReceiver

import otel_rl
from otel_rl.core.sampling import SpanBudget
from otel_rl.outputs.otel import otlp

SLEEP_S = {"collector_wait": 0.004, "learning": 0.02, "inference_forward": 0.003}


@pytest.fixture(params=["grpc", "http/protobuf"])
def receiver(request, monkeypatch):
    receiver = (GrpcReceiver() if request.param == "grpc" else HttpReceiver()).start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", request.param)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-team=rl%20infra")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "roundtrip")
    yield receiver
    receiver.stop()


def _loop(tel, iterations=3):
    with tel.run():
        for i in range(iterations):
            with tel.iteration(i, env_steps=(i + 1) * 16):
                with tel.phase("collector_wait"):
                    time.sleep(SLEEP_S["collector_wait"])
                with tel.phase("inference"):
                    with tel.phase("inference_forward"):
                        time.sleep(SLEEP_S["inference_forward"])
                with tel.phase("learning"):
                    time.sleep(SLEEP_S["learning"])
            tel.scalars({"Loss/critic": 0.25 * i, "Perf/total_fps": 100.0})
        tel.event("checkpoint_saved", path="ckpt.pt")


def test_spans_metrics_and_logs_arrive(receiver):
    tel = otel_rl.init(run_id="rt-1", algorithm="sac")
    _loop(tel)
    tel.close()
    got = receiver.received

    spans = got.spans()
    by_name: dict[str, list] = {}
    for _, span in spans:
        by_name.setdefault(span.name, []).append(span)
    assert len(by_name["rl.run"]) == 1
    assert len(by_name["rl.iteration"]) == 3
    assert len(by_name["Learning"]) == 3 and len(by_name["Forward"]) == 3

    run = by_name["rl.run"][0]
    assert run.parent_span_id == b""
    assert run.status.code == 1  # OK
    iteration_ids = {s.span_id for s in by_name["rl.iteration"]}
    assert all(s.parent_span_id == run.span_id for s in by_name["rl.iteration"])
    assert all(s.parent_span_id in iteration_ids for s in by_name["Learning"] + by_name["Collector Wait"])
    inference_ids = {s.span_id for s in by_name["Inference"]}
    assert all(s.parent_span_id in inference_ids for s in by_name["Forward"])
    assert len({s.trace_id for _, s in spans}) == 1

    for span in by_name["Learning"]:
        duration_s = (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9
        assert SLEEP_S["learning"] <= duration_s < SLEEP_S["learning"] + 0.2
        attrs = {a.key: a.value for a in span.attributes}
        assert attrs["rl.phase"].string_value == "learning"
        assert attrs["rl.timeline"].string_value == "learner"

    resource = {a.key: a.value for a in spans[0][0].attributes}
    assert resource["service.name"].string_value == "roundtrip"
    assert resource["rl.run.id"].string_value == "rt-1"
    assert resource["rl.algorithm"].string_value == "sac"
    assert (resource["rl.rank"].int_value, resource["rl.world_size"].int_value) == (0, 1)
    assert any(h.get("x-team") == "rl infra" for h in got.headers)

    metrics = {m.name: m for _, m in got.metric_list()}
    phase_hist = metrics["rl.phase.duration"]
    assert phase_hist.unit == "ms"
    points = {
        {a.key: a.value.string_value for a in p.attributes}["rl.phase"]: p for p in phase_hist.histogram.data_points
    }
    learning = points["learning"]
    point_attrs = {a.key: a.value for a in learning.attributes}
    assert (point_attrs["rl.rank"].int_value, point_attrs["rl.clock"].string_value) == (0, "host")
    assert learning.count == 3
    assert learning.sum >= 3 * SLEEP_S["learning"] * 1000
    assert sum(learning.bucket_counts) == 3
    learning_span_ids = {s.span_id for s in by_name["Learning"]}
    assert learning.exemplars and all(e.span_id in learning_span_ids for e in learning.exemplars)
    assert metrics["rl.iteration.duration"].histogram.data_points[0].count == 3
    assert metrics["rl.env_steps"].sum.data_points[0].as_int == 48
    assert metrics["rl.loss.critic"].gauge.data_points[0].as_double == 0.5

    logs = got.log_records()
    checkpoint = [r for r in logs if r.event_name == "checkpoint_saved"]
    assert checkpoint and checkpoint[0].span_id == run.span_id


def test_span_budget_samples_whole_iterations(receiver):
    tel = otel_rl.init(span_budget_per_s=10)  # room for about two iterations of four spans
    with tel.run():
        for i in range(50):
            with tel.iteration(i):
                with tel.phase("collector_wait"):
                    pass
                with tel.phase("learning"):
                    pass
                with tel.phase("weight_publish"):
                    pass
    tel.close()
    spans = [s for _, s in receiver.received.spans()]
    iterations = {s.span_id for s in spans if s.name == "rl.iteration"}
    phases = [s for s in spans if s.parent_span_id in iterations]
    assert 1 <= len(iterations) < 50
    assert len(phases) == 3 * len(iterations)  # never a partial iteration
    assert tel.stats()["spans_sampled_out"] > 0
    metrics = {m.name: m for _, m in receiver.received.metric_list()}
    points = metrics["rl.phase.duration"].histogram.data_points
    assert {p.count for p in points} == {50}  # histograms still see every phase


def test_a_budget_samples_a_run_as_it_samples_its_iterations_one_by_one():
    """``take_each`` at one time takes exactly what ``take`` of each count in turn takes, and counts the rest."""
    rng = random.Random(11)
    for rate in (0, 7, 40, 1000, float("inf")):
        alone, at_once = SpanBudget(rate), SpanBudget(rate)
        for now_s in (0.0, 0.05, 0.3, 0.31, 2.0):
            counts = [rng.choice([1, 3, 5, 5, 5]) for _ in range(rng.randrange(0, 30))]
            taken = [index for index, count in enumerate(counts) if alone.take(count, now_s)]
            assert at_once.take_each(counts, now_s) == taken
            assert at_once.sampled_out == alone.sampled_out


def test_collector_down_never_blocks_or_raises(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # nothing listens
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    tel = otel_rl.init()
    _loop(tel, iterations=2)
    started = time.monotonic()
    tel.close(timeout_s=2.0)
    assert time.monotonic() - started < 4.0


def test_no_endpoint_means_no_network_exporter():
    assert otlp.exporter_kinds("traces") == ()
    tel = otel_rl.init()
    assert tel.tracer_provider is None and tel.meter_provider is None
    tel.close()


def test_exporter_variables(monkeypatch, caplog):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    monkeypatch.setenv("OTEL_LOGS_EXPORTER", "otlp,bogus")
    with caplog.at_level(logging.WARNING):
        assert otlp.exporter_kinds("traces") == ("console",)
        assert otlp.exporter_kinds("metrics") == ()
        assert otlp.exporter_kinds("logs") == ("otlp",)
    assert [r for r in caplog.records if "OTEL_LOGS_EXPORTER" in r.getMessage()]


def test_protocol_and_endpoint_resolution(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://other:9999/custom")
    assert otlp.resolve("traces").endpoint == "http://collector:4318/v1/traces"
    assert otlp.resolve("metrics").endpoint == "http://other:9999/custom"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    assert otlp.resolve("traces").protocol == "grpc"
    assert otlp.resolve("traces").endpoint == "http://collector:4318/"


def test_invalid_variables_warn_once_and_use_defaults(monkeypatch, caplog):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "soon")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "zip")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "-5")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "maybe")
    with caplog.at_level(logging.WARNING):
        settings = otlp.resolve("traces")
        otlp.resolve("traces")
        tel = otel_rl.init()
        tel.close(timeout_s=1)
    assert (settings.protocol, settings.timeout_s, settings.compression) == ("grpc", 10.0, "none")
    messages = [r.getMessage() for r in caplog.records]
    for name in (
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
        "OTEL_EXPORTER_OTLP_COMPRESSION",
        "OTEL_METRIC_EXPORT_INTERVAL",
        "OTEL_SDK_DISABLED",
    ):
        assert sum(name + "=" in m for m in messages) == 1, name
    assert tel.enabled


def test_the_users_own_spans_and_instruments_are_exported_with_an_agent_process(monkeypatch):
    receiver = HttpReceiver().start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    try:
        tel = otel_rl.init(agent="process", system_metrics_interval_s=0, service_name="user-sdk")
        with tel.run():
            with tel.tracer_provider.get_tracer("my.code").start_as_current_span("my_evaluation"):
                tel.meter_provider.get_meter("my.code").create_counter("my.evaluations").add(3)
            with tel.iteration(0):
                with tel.phase("learning"):
                    pass
        tel.close()
        assert receiver.received.wait_for(lambda r: {"my_evaluation", "rl.run"} <= {s.name for _, s in r.spans()})
        assert receiver.received.wait_for(lambda r: "my.evaluations" in {m.name for _, m in r.metric_list()})
    finally:
        receiver.stop()
    services = {
        a.value.string_value for resource, span in receiver.received.spans() for a in resource.attributes if a.key == "service.name"
    }
    assert services == {"user-sdk"}  # the user's spans and otel-rl's (from the agent) under one service


def _resources(got) -> dict[str, list[dict[str, str]]]:
    """The string attributes of every resource received, per signal."""

    def plain(resource) -> dict[str, str]:
        return {a.key: a.value.string_value for a in resource.attributes if a.value.HasField("string_value")}

    with got.lock:
        logs = [rl.resource for req in got.logs for rl in req.resource_logs]
    return {
        "spans": [plain(r) for r, _ in got.spans()],
        "metrics": [plain(r) for r, _ in got.metric_list()],
        "logs": [plain(r) for r in logs],
    }


def test_the_framework_and_environment_an_integration_names_are_on_every_signals_resource(receiver, tmp_path):
    """SB3's callback names ``rl.system`` and ``rl.environment.name`` (the proposed rl.* conventions) at training start."""
    from stable_baselines3 import PPO

    from otel_rl.integrations.sb3 import TelemetryCallback

    tel = otel_rl.init(run_dir=tmp_path / "run", quiet=True, metric_export_interval_ms=200)
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=128, batch_size=64, n_epochs=1, device="cpu", seed=0)
    model.learn(256, callback=TelemetryCallback(tel))
    time.sleep(0.5)  # a periodic metric export after training started
    tel.close()
    resources = _resources(receiver.received)
    for signal in ("spans", "metrics", "logs"):
        described = [r for r in resources[signal] if r.get("rl.system") == "stable_baselines3"]
        assert described, (signal, resources[signal][:2])
        assert all(r["rl.environment.name"] == "CartPole-v1" and r["rl.run.id"] == "run" for r in described)
    # Every span is of the run, which opened after the callback named them.
    assert all(r.get("rl.system") == "stable_baselines3" for r in resources["spans"])


def test_describe_system_in_a_loop_of_ones_own(receiver):
    tel = otel_rl.init(run_id="own-loop")
    tel.describe_system("my_trainer", environment="Pendulum-v1")
    tel.describe_system("my_trainer", environment=42)  # not a string: warned, the system kept
    _loop(tel)
    tel.close()
    resources = _resources(receiver.received)
    assert resources["spans"] and all(r["rl.system"] == "my_trainer" and r["rl.environment.name"] == "Pendulum-v1" for r in resources["spans"])
