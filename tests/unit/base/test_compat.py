"""The reaches into other libraries' private names (``otel_rl.base.compat``), against the installed libraries."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import pytest

from otel_rl.base import compat


def _minor(text: str) -> tuple[int, int]:
    major, minor = text.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


@pytest.mark.parametrize("distribution", sorted(compat.WRITTEN_FOR))
def test_the_installed_libraries_are_those_the_reaches_were_written_for(distribution):
    try:
        installed = version(distribution)
    except PackageNotFoundError:
        pytest.fail(f"{distribution} is not installed: the test extra installs every library compat reaches into")
    oldest, newest = compat.WRITTEN_FOR[distribution]
    assert _minor(oldest) <= _minor(installed) <= _minor(newest), (
        f"{distribution} {installed} is outside {oldest}..{newest}: check every reach of otel_rl/base/compat.py against it, then widen the range"
    )


def test_the_logs_signal_and_its_exporters_are_where_compat_looks():
    logs = compat.otel_logs()
    provider = logs.LoggerProvider()
    provider.add_log_record_processor(logs.BatchLogRecordProcessor(logs.ConsoleLogRecordExporter()))
    record = logs.LogRecord(timestamp=1, body="x", attributes={"a": 1}, event_name="x")
    assert logs.ReadWriteLogRecord(record).log_record is record
    provider.shutdown()
    for grpc in (True, False):
        exporter = compat.otlp_log_exporter(grpc)(endpoint="http://127.0.0.1:1" if not grpc else "127.0.0.1:1")
        exporter.shutdown()


def test_a_metric_exporters_preferences_are_read():
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics import Counter, Histogram
    from opentelemetry.sdk.metrics.export import AggregationTemporality

    preferences = compat.exporter_preferences(OTLPMetricExporter(preferred_temporality={Counter: AggregationTemporality.DELTA}))
    assert preferences["preferred_temporality"][Counter] is AggregationTemporality.DELTA
    assert Histogram in preferences["preferred_aggregation"]


def test_the_span_exporters_send_what_the_encoder_made():
    encoded = []

    def encode(spans):
        encoded.append(list(spans))
        return b""  # an empty ExportTraceServiceRequest

    grpc_class, http_class = compat.otlp_span_exporters(encode)
    grpc = grpc_class(endpoint="127.0.0.1:1", insecure=True)
    assert grpc._translate_data(["span"]).SerializeToString() == b""  # the hook the SDK calls with each batch
    http = http_class(endpoint="http://127.0.0.1:1/v1/traces", timeout=0.2)
    assert getattr(http, "_client", None) is not None and not getattr(http, "_shutdown", True)  # the fast path is taken
    http.export(["span"])  # refused (nothing listens): a failure, after the encoder ran
    assert encoded == [["span"], ["span"]]
    grpc.shutdown()
    http.shutdown()


def test_a_running_torch_profiler_is_seen():
    torch = pytest.importorskip("torch")
    assert not compat.torch_profiler_running()
    with torch.profiler.profile():
        assert compat.torch_profiler_running()
    assert not compat.torch_profiler_running()


def test_an_sb3_models_kind_and_budget_are_read():
    sb3 = pytest.importorskip("stable_baselines3")
    ppo, sac = sb3.PPO("MlpPolicy", "Pendulum-v1", n_steps=64, batch_size=64), sb3.SAC("MlpPolicy", "Pendulum-v1")
    assert not compat.sb3_off_policy(ppo) and compat.sb3_off_policy(sac)
    ppo.learn(total_timesteps=64)
    assert compat.sb3_total_steps(ppo) == 64


def test_tensorboards_writer_takes_a_c_crc_of_the_same_value_and_its_files_read_back(tmp_path):
    import os

    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as python_crc
    from tensorboard.summary.writer import record_writer

    assert compat.fast_tensorboard_crc()  # google-crc32c comes with the tensorboard extra
    for size in (0, 1, 7, 8, 9, 1000, 70_000):
        data = os.urandom(size)
        assert record_writer.masked_crc32c(data) == python_crc(data)
    import otel_rl

    tel = otel_rl.init(run_dir=tmp_path / "run", tensorboard=True, agent="thread", quiet=True, panel=False, system_metrics_interval_s=0)
    with tel.run():
        for i in range(50):
            with tel.iteration(i, env_steps=i):
                pass
            tel.scalars({f"Loss/key_{k}": float(i + k) for k in range(40)})
    tel.close()
    (events,) = (tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*")
    read = [value for event in EventFileLoader(str(events)).Load() for value in event.summary.value if value.tag == "Loss/key_3"]
    assert len(read) == 50  # every record's checksum as TensorBoard's own reader checks it
