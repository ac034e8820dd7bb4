"""sys/* metrics on this machine: plausible values, GPU keys only with a GPU."""

from __future__ import annotations

import json
import threading
import time

import psutil

import otel_rl
from otel_rl.base.deadline import Deadline
from otel_rl.core.system_metrics import Nvml, SystemSampler


def test_sample_is_plausible():
    got = []
    sampler = SystemSampler(got.append, interval_s=60)
    sum(i * i for i in range(200_000))  # some CPU to measure
    values = sampler.sample()
    sampler.shutdown(Deadline(1))
    assert 0 <= values["sys/process_cpu_percent"] <= 100 * psutil.cpu_count()
    assert 10 * 2**20 < values["sys/process_rss_bytes"] < psutil.virtual_memory().total
    assert values["sys/process_threads"] >= 1
    assert 0 <= values["sys/cpu_percent"] <= 100 and 0 < values["sys/memory_percent"] < 100
    gpu_keys = [k for k in values if k.startswith("sys/gpu")]
    assert bool(gpu_keys) == bool(Nvml().handles)  # no GPU here: no GPU keys, and no error


def test_sampled_into_the_records(tmp_path):
    tel = otel_rl.init(run_dir=tmp_path, jsonl=True, system_metrics_interval_s=0.1)
    tel.flush(timeout_s=30)  # the agent, which samples this process, is up
    time.sleep(0.5)
    tel.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    sys_records = [r for r in records if r["kind"] == "scalars" and "sys/process_rss_bytes" in r["values"]]
    assert len(sys_records) >= 2


def test_off_when_interval_is_zero(tmp_path):
    before = {t.name for t in threading.enumerate()}
    tel = otel_rl.init(run_dir=tmp_path, jsonl=True, system_metrics_interval_s=0)
    assert "otel-rl-system" not in {t.name for t in threading.enumerate()} - before
    time.sleep(0.3)
    tel.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert not any(k.startswith("sys/") for r in records if r["kind"] == "scalars" for k in r["values"])


def test_a_sampler_of_a_process_already_gone_samples_the_host():
    # An agent samples its producer, which may die before the agent starts serving it.
    import subprocess
    import sys

    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout)
    samples: list[dict] = []
    sampler = SystemSampler(samples.append, 0.05, dead)
    time.sleep(0.3)
    sampler.shutdown(Deadline(1.0))
    assert samples and all("sys/cpu_percent" in s and "sys/process_rss_bytes" not in s for s in samples)
