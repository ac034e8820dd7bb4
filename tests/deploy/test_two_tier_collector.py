"""The two-tier layout of a job on several machines: a collector per machine forwarding to one gateway.

Two real collector processes of the shipped configs (``otelcol-node.yaml``
as the machine's, ``otelcol.yaml`` as the gateway) and Debian's Prometheus
behind the gateway; two ranks of one job export to the machine's collector.
What reaches the gateway tells the ranks and their machine apart.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import requests
from pipeline_harness import COLLECTOR_CONFIG, Collector, Prometheus, collector_binary, stop_process, wait_until
from ports import free_port

NODE_CONFIG = COLLECTOR_CONFIG.with_name("otelcol-node.yaml")
RANK = textwrap.dedent(
    """
    import time, otel_rl
    tel = otel_rl.init(run_id="two-tier", system_metrics_interval_s=0)
    with tel.run():
        for i in range(30):
            with tel.iteration(i, env_steps=8 * i), tel.phase("learning"):
                time.sleep(0.002)
    tel.close()
    """
)


class NodeCollector:
    """The machine's collector, of the shipped otelcol-node.yaml, forwarding to ``gateway`` (OTLP/gRPC)."""

    def __init__(self, workdir, gateway: str) -> None:
        self.ports = {name: free_port() for name in ("grpc", "http", "health")}
        env = {
            **os.environ,
            "OTELCOL_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{self.ports['grpc']}",
            "OTELCOL_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{self.ports['http']}",
            "OTELCOL_HEALTH_ENDPOINT": f"127.0.0.1:{self.ports['health']}",
            "OTELCOL_GATEWAY_ENDPOINT": gateway,
        }
        self.log = workdir / "node-collector.log"
        self.process = subprocess.Popen([str(collector_binary()), f"--config={NODE_CONFIG}"], env=env, stdout=open(self.log, "w"), stderr=subprocess.STDOUT)  # noqa: SIM115
        wait_until(lambda: requests.get(f"http://127.0.0.1:{self.ports['health']}/", timeout=1).ok, 30, "node collector")


def test_the_node_config_validates():
    result = subprocess.run([str(collector_binary()), "validate", f"--config={NODE_CONFIG}"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_two_ranks_through_their_machines_collector_reach_the_gateway_told_apart(tmp_path):
    gateway = Collector(tmp_path)
    node = NodeCollector(tmp_path, f"127.0.0.1:{gateway.ports['grpc']}")
    prometheus = Prometheus(tmp_path, gateway.ports["prometheus"])
    try:
        ranks = []
        for rank in (0, 1):
            env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
            env.update(RANK=str(rank), WORLD_SIZE="2", OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{node.ports['grpc']}",
                       OTEL_EXPORTER_OTLP_PROTOCOL="grpc", OTEL_METRIC_EXPORT_INTERVAL="1000")  # fmt: skip
            ranks.append(subprocess.Popen([sys.executable, "-c", RANK], env=env))
        assert [r.wait(120) for r in ranks] == [0, 0]
        series = "rl_phase_duration_milliseconds_count"
        wait_until(lambda: len(prometheus.query(series)) >= 2, 60, "both ranks' phase histograms at the gateway")
        labels = [s["metric"] for s in prometheus.query(series)]
        assert {m.get("rl_rank") for m in labels} == {"0", "1"} and {m.get("rl_world_size") for m in labels} == {"2"}, labels
        wait_until(lambda: _span_resources(gateway) and len({r.get("rl.rank") for r in _span_resources(gateway)}) == 2, 30, "both ranks' spans")
    finally:
        prometheus.stop()
        stop_process(node.process)
        gateway.stop()
    resources = _span_resources(gateway)
    assert {r["rl.rank"] for r in resources} == {0, 1}
    assert {r["host.name"] for r in resources} == {socket.gethostname()}
    assert {r["rl.world_size"] for r in resources} == {2} and {r["rl.run.id"] for r in resources} == {"two-tier"}
    assert "error" not in node.log.read_text().lower(), node.log.read_text()[-2000:]


def _span_resources(collector: Collector) -> list[dict]:
    """The resource attributes of every span batch the gateway's file exporter wrote."""
    if not collector.spans_file.exists():
        return []
    out = []
    for line in collector.spans_file.read_text().splitlines():
        for resource_spans in json.loads(line).get("resourceSpans", []):
            attributes = resource_spans["resource"]["attributes"]
            out.append({a["key"]: _value(a["value"]) for a in attributes})
    return out


def _value(value: dict):
    if "intValue" in value:
        return int(value["intValue"])
    return next(iter(value.values()))
