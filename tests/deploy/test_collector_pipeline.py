"""The real pipeline: otel-rl -> built collector (shipped config) -> Prometheus, and the dashboards on top.

Starts the collector of collector-config/ and Debian's prometheus on free
loopback ports, runs a short instrumented training loop with known phase
durations exporting OTLP to the collector, and checks every dashboard query
against Prometheus and the spans written by the collector's file exporter.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from pipeline_harness import (
    COLLECTOR_CONFIG,
    REPO,
    Collector,
    Prometheus,
    collector_binary,
    wait_until,
)

sys.path.insert(0, str(REPO / "dashboards"))
import generate as dashboards  # noqa: E402

from otel_rl.formats import schema  # noqa: E402

SLEEP_MS = {"collector_wait": 1.0, "learning": 12.0, "env_step": 7.0, "learner_action_wait": 1.5}
LOOP = textwrap.dedent(
    """
    import threading, time
    import otel_rl
    S = {sleeps!r}
    tel = otel_rl.init(run_id="e2e-run", system_metrics_interval_s=0.5)
    stop = threading.Event()
    def collector():
        tick = 0
        while not stop.is_set():
            # The collector reports the job's env steps too (its own count, ahead of the learner's).
            with tel.iteration(tick, env_steps=8 * tick, timeline="collector"):
                with tel.phase("learner_action_wait", "collector"):
                    time.sleep(S["learner_action_wait"] / 1000)
                with tel.phase("env_step", "collector"):
                    with tel.phase("backend_step", "collector"):
                        time.sleep(S["env_step"] / 1000)
            tick += 1
    thread = threading.Thread(target=collector, name="collector")
    with tel.run():
        thread.start()
        for i in range(200):
            with tel.iteration(i, env_steps=8 * i):
                with tel.phase("collector_wait"):
                    time.sleep(S["collector_wait"] / 1000)
                with tel.phase("inference"):
                    with tel.phase("inference_forward"):
                        pass
                with tel.phase("learning"):
                    time.sleep(S["learning"] / 1000)
            tel.scalars({{"Perf/total_fps": 500.0, "Train/mean_reward": -200.0 + i, "Train/mean_episode_length": 200,
                          "Loss/critic": 1.0 / (i + 1), "Loss/actor": 0.5}})
            if i % 50 == 0:
                tel.event("checkpoint_saved", iteration=i)
        stop.set()
        thread.join()
    tel.close()
    """
).format(sleeps=SLEEP_MS)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    work = tmp_path_factory.mktemp("pipeline")
    collector = Collector(work)
    prometheus = Prometheus(work, collector.ports["prometheus"])
    try:
        env = {k: v for k, v in collector.env.items() if not k.startswith(("OTEL_EXPORTER", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
        env.update(
            OTEL_EXPORTER_OTLP_ENDPOINT=collector.otlp_grpc,
            OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
            OTEL_METRIC_EXPORT_INTERVAL="1000",
            OTEL_SERVICE_NAME="e2e-service",
        )
        subprocess.run([sys.executable, "-c", LOOP], env=env, check=True, timeout=120)
        deadline = time.monotonic() + 60
        wanted = {"rl_phase_duration_milliseconds_bucket", "traces_span_metrics_calls_total", "rl_train_mean_reward"}
        while time.monotonic() < deadline and not wanted <= prometheus.metric_names():
            time.sleep(0.5)
        time.sleep(3)  # a few more scrapes, so rates have two points
        yield collector, prometheus
    finally:
        prometheus.stop()
        collector.stop()


BACKEND_CONFIG = COLLECTOR_CONFIG.with_name("otelcol-backend.yaml")
SHORT_RUN = textwrap.dedent(
    """
    import otel_rl
    tel = otel_rl.init(run_id="to-a-backend", system_metrics_interval_s=0)
    with tel.run():
        for i in range(20):
            with tel.iteration(i), tel.phase("learning"):
                pass
        tel.event("checkpoint_saved", iteration=19)
    tel.close()
    """
)


def test_shipped_configs_validate(tmp_path):
    binary = collector_binary()
    for configs in ((COLLECTOR_CONFIG,), (COLLECTOR_CONFIG, BACKEND_CONFIG)):
        result = subprocess.run([str(binary), "validate", *(f"--config={c}" for c in configs)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr


def _send_short_run(collector: Collector) -> None:
    env = {k: v for k, v in collector.env.items() if not k.startswith(("OTEL_EXPORTER", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    env.update(OTEL_EXPORTER_OTLP_ENDPOINT=collector.otlp_grpc, OTEL_EXPORTER_OTLP_PROTOCOL="grpc", OTEL_LOGS_EXPORTER="otlp")
    subprocess.run([sys.executable, "-c", SHORT_RUN], env=env, check=True, timeout=60)


def test_without_a_backend_nothing_is_sent_anywhere(tmp_path):
    """The default config ends spans in RED metrics and discards events: no exporter retries against nothing."""
    collector = Collector(tmp_path)
    try:
        _send_short_run(collector)
        wait_until(lambda: collector.spans_file.exists() and collector.spans_file.stat().st_size > 0, 20, "spans")
        time.sleep(2)  # a retrying exporter would have logged by now
    finally:
        collector.stop()
    log = collector.log.read_text()
    assert "otlp/backend" not in log and "connection refused" not in log.lower() and "Exporting failed" not in log, log


def test_the_backend_file_sends_traces_and_events_to_the_backend(tmp_path):
    from otlp_receivers import GrpcReceiver

    backend = GrpcReceiver().start()
    collector = Collector(tmp_path, overlays=(BACKEND_CONFIG,), backend=f"127.0.0.1:{backend.port}")
    try:
        _send_short_run(collector)
        assert backend.received.wait_for(lambda r: r.spans() and r.log_records(), timeout_s=20)
    finally:
        collector.stop()
        backend.stop()
    names = {span.name for _, span in backend.received.spans()}
    assert {"Learning", "rl.run"} <= names, names


def test_prometheus_names_follow_the_opentelemetry_translation(pipeline):
    _, prometheus = pipeline
    names = prometheus.metric_names()
    assert {
        "rl_phase_duration_milliseconds_bucket",
        "rl_iteration_duration_milliseconds_count",
        "rl_env_steps_total",
        "rl_train_mean_reward",
        "rl_loss_critic",
        "rl_perf_total_fps_per_second",
        "process_cpu_utilization_ratio",
        "rl_events_total",  # what the alert rules read
        "rl_telemetry_dropped_total",
    } <= names
    (saved,) = prometheus.query('rl_events_total{rl_event="checkpoint_saved"}')
    assert float(saved["value"][1]) == 4
    (series,) = prometheus.query('rl_phase_duration_milliseconds_count{rl_phase="learning"}')
    labels = series["metric"]
    assert labels["rl_timeline"] == "learner" and labels["rl_run_id"] == "e2e-run"
    assert labels["service_name"] == "e2e-service" and labels["rl_rank"] == "0"
    assert float(series["value"][1]) == 200
    # The live verdict, as a state: 1 for the side and phase that set the pace (the learner's Learning, 92% of its iteration; a wait of 20% to 30% is balanced).
    (verdict,) = prometheus.query('rl_bottleneck{rl_run_id="e2e-run"}')
    assert (verdict["metric"]["rl_timeline"], verdict["metric"]["rl_phase"], verdict["value"][1]) == ("learner", "learning", "1")
    (changes,) = prometheus.query('rl_events_total{rl_event="bottleneck"}')  # what the alert rule reads
    assert float(changes["value"][1]) >= 1


def _substitute(expr: str) -> str:
    return expr.replace("$__rate_interval", "1m").replace("$service", ".*").replace("$run_id", ".*")


def _panels():
    for name, build in dashboards.DASHBOARDS.items():
        document = json.loads(json.dumps(build().build(), cls=dashboards.JSONEncoder))
        for panel in document["panels"]:
            yield name, document, panel


FUNCTIONS = {
    "sum", "rate", "scalar", "histogram_quantile", "time", "max", "timestamp", "by", "increase", "le",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression reads (``__name__`` regexes included as regexes)."""
    without_labels = re.sub(r"\{[^}]*\}", "{}", expr)
    names = {m for m in re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?=\{|\[)", without_labels) if m not in FUNCTIONS}
    names |= {f"re:{m}" for m in re.findall(r'__name__=~"([^"]+)"', expr)}
    return names


def test_dashboards_lint(tmp_path):
    rules = {"groups": [{"name": "dashboards", "rules": []}]}
    for name, document, panel in _panels():
        where = f"{name}: {panel.get('title')!r}"
        assert panel.get("title"), where
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{where} has no unit"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        assert panel.get("description"), f"{where} does not say what it answers"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}" and target["refId"], where
            assert "[5m]" not in target["expr"] and ("rate(" not in target["expr"] or "$__rate_interval" in target["expr"])
            rules["groups"][0]["rules"].append({"record": f"lint:{len(rules['groups'][0]['rules'])}", "expr": _substitute(target["expr"])})
        variables = {v["name"] for v in document["templating"]["list"]}
        assert {"datasource", "service", "run_id"} <= variables
    import yaml

    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_committed_dashboard_json_is_current():
    result = subprocess.run([sys.executable, str(REPO / "dashboards" / "generate.py"), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_every_panel_reads_metrics_the_pipeline_produced_and_gets_data(pipeline):
    _, prometheus = pipeline
    produced = prometheus.metric_names()
    gpu_only = set(dashboards.GPU_METRICS)
    for name, _, panel in _panels():
        for target in panel["targets"]:
            expr = target["expr"]
            for metric in metric_names(expr):
                if metric.startswith("re:"):
                    assert any(re.fullmatch(metric[3:], m) for m in produced), (name, panel["title"], metric)
                elif metric not in gpu_only:
                    assert metric in produced, (name, panel["title"], metric)
            if metric_names(expr) & gpu_only:
                continue  # no GPU on this machine: these panels stay empty
            result = prometheus.query(_substitute(expr))
            if panel["title"] == "Seconds since the last report":
                assert not result, result  # the run finished: it is not late, and the panel says nothing
                continue
            assert result, f"{name}: {panel['title']!r} got no data for {expr}"


def test_a_finished_run_reads_as_ended_and_is_not_stalled(pipeline):
    _, prometheus = pipeline
    (state,) = prometheus.query('rl_run_active{rl_run_id="e2e-run"}')
    assert float(state["value"][1]) == 0
    (shown,) = [p for _, _, p in _panels() if p["title"] == "Run"]
    (value,) = prometheus.query(_substitute(shown["targets"][0]["expr"]))
    mapping = shown["fieldConfig"]["defaults"]["mappings"][0]["options"]
    assert mapping[str(int(float(value["value"][1])))]["text"] == "ended"
    import yaml

    rules = yaml.safe_load((REPO / "collector-config" / "alerts.yaml").read_text())["groups"][0]["rules"]
    (stalled,) = [r["expr"] for r in rules if r["alert"] == "RLRunStalled"]
    recent = stalled.replace("[10m]", "[5s]")  # the run's last seconds: its iterations stopped advancing
    without_state = recent.split(" and on ")[0]
    assert prometheus.query(without_state)  # would fire for the finished run...
    assert not prometheus.query(recent)  # ...but the run ended, so it does not


def test_gpu_panels_read_the_names_system_metrics_export():
    from otel_rl.core import system_metrics

    source = Path(system_metrics.__file__).read_text()
    exported = {"gpu_utilization_ratio": "gpu.utilization", "gpu_memory_usage_bytes": "gpu.memory.usage", "gpu_power_watts": "gpu.power", "gpu_temperature_celsius": "gpu.temperature"}
    assert set(exported) == set(dashboards.GPU_METRICS)
    for name in exported.values():
        assert f'"{name}"' in source


def test_env_steps_are_counted_once_per_run(pipeline):
    _, prometheus = pipeline
    by_side = {r["metric"]["rl_timeline"]: float(r["value"][1]) for r in prometheus.query("rl_env_steps_total")}
    assert set(by_side) == {"learner", "collector"}  # both sides report
    assert by_side["learner"] == 8 * 199
    (env_steps,) = [p for _, _, p in _panels() if p["title"] == "Env steps"]
    (shown,) = prometheus.query(_substitute(env_steps["targets"][0]["expr"]))
    assert float(shown["value"][1]) == max(by_side.values()) < sum(by_side.values())


def _value(prometheus, expr: str) -> dict[str, float]:
    return {r["metric"].get("rl_phase", ""): float(r["value"][1]) for r in prometheus.query(_substitute(expr))}


def test_phase_p50_is_near_the_known_durations(pipeline):
    _, prometheus = pipeline
    bounds = schema.PHASE_BUCKETS_MS
    p50 = _value(
        prometheus,
        'histogram_quantile(0.5, sum by (le, rl_phase) (rl_phase_duration_milliseconds_bucket{rl_clock="host"}))',
    )
    for phase, known in SLEEP_MS.items():
        # A sleep never undershoots; the estimate lies in the bucket that holds the true value.
        upper = next(b for b in bounds if b >= known * 1.05)
        assert known * 0.5 <= p50[phase] <= upper, (phase, p50[phase], known)


def test_spans_came_through_with_their_links(pipeline):
    collector, _ = pipeline
    deadline = time.monotonic() + 20
    spans = []
    while time.monotonic() < deadline:
        if collector.spans_file.exists():
            spans = [
                span
                for line in collector.spans_file.read_text().splitlines()
                if line
                for rs in json.loads(line)["resourceSpans"]
                for ss in rs["scopeSpans"]
                for span in ss["spans"]
            ]
            if any(s["name"] == "rl.run" for s in spans):
                break
        time.sleep(0.5)
    by_id = {s["spanId"]: s for s in spans}
    (run,) = [s for s in spans if s["name"] == "rl.run"]
    assert not run.get("parentSpanId")
    iterations = [s for s in spans if s["name"] == "rl.iteration"]
    assert iterations and all(s["parentSpanId"] == run["spanId"] for s in iterations)
    learning = [s for s in spans if s["name"] == "Learning"]
    assert learning and all(by_id[s["parentSpanId"]]["name"] == "rl.iteration" for s in learning)
    forward = [s for s in spans if s["name"] == "Forward"]
    assert forward and all(by_id[s["parentSpanId"]]["name"] == "Inference" for s in forward)
    backend = [s for s in spans if s["name"] == "Backend Step"]
    assert backend and all(by_id[s["parentSpanId"]]["name"] == "Env Step" for s in backend)
    assert len({s["traceId"] for s in spans}) == 1


def test_two_collector_builds_on_one_machine_take_turns(tmp_path):
    """build.sh holds its cache folder's lock: a second build waits for the first's binary instead of building into it too."""
    import fcntl

    cache = tmp_path / "otelcol"
    binary = cache / "otelcol-rl" / "otelcol-rl"
    with open(f"{cache}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a first build, under way
        second = subprocess.Popen(["bash", str(REPO / "collector-config" / "build.sh")], env={**os.environ, "OTEL_RL_COLLECTOR_CACHE": str(cache)},
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            with pytest.raises(subprocess.TimeoutExpired):
                second.wait(timeout=1.5)  # it waits on the lock, building nothing
            assert not cache.exists()
            binary.parent.mkdir(parents=True)  # the first build's binary arrives
            binary.write_text("#!/bin/sh\n")
            binary.chmod(0o755)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
        out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    assert out.strip() == str(binary)  # the second took the first's binary
