"""``sys/*`` resource metrics: process and host CPU and memory, the host's pressure, and per-GPU NVML readings.

A background worker samples every ``interval_s`` and records the values as
scalars (so they reach the JSONL file, the live service, the panel and the
``rl.sys.*`` gauges) and keeps the latest sample for the OpenTelemetry
observable gauges named after the semantic conventions (``process.cpu.utilization``...).
Nothing is sampled unless telemetry is enabled; GPU keys appear only where
NVML finds a GPU.

The host's pressure tells two runs on a busy and a quiet host apart
(``otel-rl analyze --compare`` reads it from the trace): ``sys/cpu_steal_percent``
(taken by the hypervisor), ``sys/load_per_cpu``
(the 1-minute load average per core) and ``sys/process_involuntary_switches_per_s``
(how often the training process was preempted).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

import psutil

from otel_rl.base.loops import BackgroundLoop


class Nvml:
    """NVML readings per GPU, or nothing when there is no NVML or no GPU."""

    def __init__(self) -> None:
        self.handles: list[Any] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception:  # no library, no driver, no GPU: no GPU keys
            self.handles = []

    def sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for index, handle in enumerate(self.handles):
            nvml = self._nvml
            readings = (
                ("util_percent", lambda h: nvml.nvmlDeviceGetUtilizationRates(h).gpu),
                ("memory_used_bytes", lambda h: nvml.nvmlDeviceGetMemoryInfo(h).used),
                ("power_watts", lambda h: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0),
                ("temperature_celsius", lambda h: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)),
            )
            for name, read in readings:
                try:
                    out[f"sys/gpu{index}_{name}"] = float(read(handle))
                except Exception:
                    continue  # a reading this GPU does not support
        return out


def sample_host(process: psutil.Process | None) -> dict[str, float]:
    """One sample of the process (None, or gone: the host only) and the host (CPU percentages since the previous sample)."""
    memory = psutil.virtual_memory()
    values: dict[str, float] = {}
    if process is not None:
        try:
            with process.oneshot():
                values = {
                    "sys/process_cpu_percent": process.cpu_percent(None),
                    "sys/process_rss_bytes": float(process.memory_info().rss),
                    "sys/process_threads": float(process.num_threads()),
                }
        except psutil.Error:  # it ended (an agent samples its producer, which may die first)
            values = {}
    values["sys/cpu_percent"] = psutil.cpu_percent(None)
    values["sys/cpu_steal_percent"] = float(getattr(psutil.cpu_times_percent(None), "steal", 0.0))
    values["sys/load_per_cpu"] = os.getloadavg()[0] / (os.cpu_count() or 1)
    values["sys/memory_percent"] = memory.percent
    values["sys/memory_used_bytes"] = float(memory.total - memory.available)
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                values["sys/torch_cuda_max_allocated_bytes"] = float(torch.cuda.max_memory_allocated())
        except Exception:
            pass
    return values


class SystemSampler(BackgroundLoop):
    """Samples ``sys/*`` every ``interval_s`` on a background worker and hands each sample to ``record``."""

    def __init__(self, record: Callable[[dict[str, float]], None], interval_s: float = 2.0, pid: int | None = None) -> None:
        """``pid``: the process whose CPU and memory are sampled (default: this one)."""
        super().__init__("otel-rl-system", interval_s)
        self._record = record
        try:
            self._process: psutil.Process | None = psutil.Process(pid)
            self._process.cpu_percent(None)  # the first reading only starts the measurement
        except psutil.Error:  # the producer an agent serves is already gone: the host is still sampled
            self._process = None
        psutil.cpu_percent(None)
        psutil.cpu_times_percent(None)
        self._switches = self._involuntary_switches()
        self._nvml = Nvml()
        self.latest: dict[str, float] = {}
        self.start()

    def _involuntary_switches(self) -> tuple[int, float] | None:
        try:
            return (self._process.num_ctx_switches().involuntary, time.monotonic()) if self._process is not None else None
        except psutil.Error:
            return None

    def sample(self) -> dict[str, float]:
        values = sample_host(self._process)
        switches, previous = self._involuntary_switches(), self._switches
        if switches is not None and previous is not None and switches[1] > previous[1]:
            values["sys/process_involuntary_switches_per_s"] = (switches[0] - previous[0]) / (switches[1] - previous[1])
        self._switches = switches
        values.update(self._nvml.sample())
        self.latest = values
        return values

    def run_once(self) -> None:
        if not self.stopping:
            self._record(self.sample())

    def register_gauges(self, meter) -> None:
        """Observable gauges under semantic-convention names, read from the latest sample."""
        from opentelemetry.metrics import Observation

        def gauge(name: str, key: str, unit: str, scale: float = 1.0) -> None:
            def callback(_options):
                value = self.latest.get(key)
                return [] if value is None else [Observation(value * scale)]

            meter.create_observable_gauge(name, [callback], unit=unit)

        gauge("process.cpu.utilization", "sys/process_cpu_percent", "1", 0.01)
        gauge("process.memory.usage", "sys/process_rss_bytes", "By")
        gauge("process.thread.count", "sys/process_threads", "{thread}")
        gauge("system.cpu.utilization", "sys/cpu_percent", "1", 0.01)
        gauge("system.memory.usage", "sys/memory_used_bytes", "By")

        def gpu_callback(key: str, scale: float):
            def callback(_options):
                return [
                    Observation(v * scale, {"gpu.index": int(k.split("_")[0].removeprefix("sys/gpu"))})
                    for k, v in self.latest.items()
                    if k.startswith("sys/gpu") and k.endswith(key)
                ]

            return callback

        meter.create_observable_gauge("gpu.utilization", [gpu_callback("_util_percent", 0.01)], unit="1")
        meter.create_observable_gauge("gpu.memory.usage", [gpu_callback("_memory_used_bytes", 1.0)], unit="By")
        meter.create_observable_gauge("gpu.power", [gpu_callback("_power_watts", 1.0)], unit="W")
        meter.create_observable_gauge("gpu.temperature", [gpu_callback("_temperature_celsius", 1.0)], unit="Cel")

