"""A real collector and a real Prometheus on free loopback ports, started and stopped by the tests."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import requests
import yaml
from ports import free_port

REPO = Path(__file__).resolve().parents[2]
COLLECTOR_CONFIG = REPO / "collector-config" / "otelcol.yaml"


def collector_binary() -> Path:
    """Build (or reuse) the collector of collector-config/builder-config.yaml."""
    out = subprocess.run(
        ["bash", str(REPO / "collector-config" / "build.sh")], capture_output=True, text=True, check=True, timeout=1800
    )
    return Path(out.stdout.strip().splitlines()[-1])


def stop_process(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()


def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{what} not ready within {timeout_s} s")


class Collector:
    """The shipped config, with the ports set through its environment variables and a file exporter added for traces."""

    def __init__(self, workdir: Path, overlays: tuple[Path, ...] = (), backend: str | None = None) -> None:
        """``overlays``: further shipped files merged over the config; ``backend``: the OTLP/gRPC address they name."""
        self.ports = {name: free_port() for name in ("grpc", "http", "prometheus", "health", "backend")}
        self.spans_file = workdir / "spans.jsonl"
        config = yaml.safe_load(COLLECTOR_CONFIG.read_text())
        config["exporters"]["file/spans"] = {"path": str(self.spans_file), "format": "json"}
        config["service"]["pipelines"]["traces"]["exporters"].append("file/spans")
        self.config_path = workdir / "otelcol-test.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.env = {
            **os.environ,
            "OTELCOL_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{self.ports['grpc']}",
            "OTELCOL_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{self.ports['http']}",
            "OTELCOL_PROMETHEUS_ENDPOINT": f"127.0.0.1:{self.ports['prometheus']}",
            "OTELCOL_HEALTH_ENDPOINT": f"127.0.0.1:{self.ports['health']}",
            "OTELCOL_TRACES_ENDPOINT": backend or f"127.0.0.1:{self.ports['backend']}",
        }
        self.log = workdir / "collector.log"
        self.process = subprocess.Popen(
            [str(collector_binary()), f"--config={self.config_path}", *(f"--config={path}" for path in overlays)],
            env=self.env,
            stdout=open(self.log, "w"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
        )
        wait_until(lambda: requests.get(f"http://127.0.0.1:{self.ports['health']}/", timeout=1).ok, 30, "collector")

    @property
    def otlp_grpc(self) -> str:
        return f"http://127.0.0.1:{self.ports['grpc']}"

    def stop(self) -> None:
        stop_process(self.process)


class Prometheus:
    """Debian's prometheus, scraping the collector's exporter every second."""

    def __init__(self, workdir: Path, target_port: int) -> None:
        self.port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "otelcol", "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}]}],
        }
        path = workdir / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={path}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=open(workdir / "prometheus.log", "w"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
        )
        wait_until(lambda: requests.get(self.url + "/-/ready", timeout=1).ok, 30, "prometheus")

    def query(self, expr: str) -> list[dict]:
        response = requests.get(self.url + "/api/v1/query", params={"query": expr}, timeout=10)
        response.raise_for_status()
        return response.json()["data"]["result"]

    def metric_names(self) -> set[str]:
        return set(requests.get(self.url + "/api/v1/label/__name__/values", timeout=10).json()["data"])

    def stop(self) -> None:
        stop_process(self.process)
