"""Training-thread cost of one phase, and the CPU otel-rl uses beside it at a given phase rate.

Part 1 interleaves, in one process, rounds of:
  (a) two ``perf_counter_ns()`` calls and a list append (the floor),
  (p) ``with tel.phase(...)`` on live telemetry (pipeline draining, spans exported),
  (i) ``with tel.iteration(i):`` (creating the iteration included),
  (b) ``tracer.start_as_current_span`` on the OpenTelemetry SDK used directly,
and reports the median per operation and the ratios p/a and b/p.

Part 2 drives 500 and 5,000 phases per second (4 phases per iteration) with
every OpenTelemetry signal exported over OTLP/HTTP to a receiver in another
process, and reports the CPU seconds per second used by every thread of the
training process except the training thread, and by the agent process.

Usage: python bench/phase_cost.py [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import threading
import time
from time import perf_counter_ns

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "support"))

import psutil  # noqa: E402

import otel_rl  # noqa: E402

N = 20_000


def floor_round(n: int) -> float:
    out: list = []
    start = perf_counter_ns()
    for _ in range(n):
        t0 = perf_counter_ns()
        t1 = perf_counter_ns()
        out.append((t0, t1))
    return (perf_counter_ns() - start) / n


def phase_round(tel, n: int) -> float:
    phase = tel.phase("learning")
    start = perf_counter_ns()
    for _ in range(n):
        with phase:
            pass
    elapsed = perf_counter_ns() - start
    tel.flush()  # drain between rounds: part 2 measures the pipeline's own CPU
    return elapsed / n


def iteration_round(tel, n: int) -> float:
    start = perf_counter_ns()
    for i in range(n):
        with tel.iteration(i):
            pass
    elapsed = perf_counter_ns() - start
    tel.flush()
    return elapsed / n


def sdk_round(tracer, n: int) -> float:
    start = perf_counter_ns()
    for _ in range(n):
        with tracer.start_as_current_span("learning"):
            pass
    return (perf_counter_ns() - start) / n


def part1(rounds: int) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Discard(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Discard()))
    tracer = provider.get_tracer("bench")
    # The pipeline drains only on flush() between rounds, so a round times the
    # training thread's own work; its background CPU is part 2's subject.
    tel = otel_rl.init(span_budget_per_s=1000, pipeline_interval_s=3600)
    results: dict[str, list[float]] = {"floor": [], "phase": [], "iteration": [], "sdk": []}
    for _ in range(rounds):
        results["floor"].append(floor_round(N))
        results["phase"].append(phase_round(tel, N))
        results["iteration"].append(iteration_round(tel, N))
        results["sdk"].append(sdk_round(tracer, N // 10))
    tel.close()
    provider.shutdown()
    med = {k: statistics.median(v) for k, v in results.items()}
    print("## Training-thread cost per phase (median of %d interleaved rounds)" % rounds)
    print()
    print("| what | ns per op |")
    print("|---|---|")
    print(f"| (a) 2x perf_counter_ns + list append | {med['floor']:.0f} |")
    print(f"| otel-rl `with tel.phase()` | {med['phase']:.0f} |")
    print(f"| otel-rl `with tel.iteration(i)` | {med['iteration']:.0f} |")
    print(f"| (b) SDK `start_as_current_span` | {med['sdk']:.0f} |")
    print()
    print(f"phase / (a) = {med['phase'] / med['floor']:.2f} (target <= 1.5)")
    print(f"phase / (b) = 1/{med['sdk'] / med['phase']:.0f} (target <= 1/25)")
    print()


def background_cpu(rate_per_s: int, budget: float, seconds: float, endpoint: str, receiver_pid: int) -> None:
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    os.environ["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/protobuf"
    os.environ["OTEL_METRIC_EXPORT_INTERVAL"] = "1000"
    tel = otel_rl.init(span_budget_per_s=budget)
    main_id = threading.get_native_id()
    proc = psutil.Process()
    agents = [child for child in proc.children() if child.pid != receiver_pid]  # the agent process otel-rl started

    def cpu_s() -> tuple[float, float]:
        """CPU seconds of this process's threads but the training thread, and of the agent process."""
        others = sum(t.user_time + t.system_time for t in proc.threads() if t.id != main_id)
        agent = 0.0
        for child in agents:
            with contextlib.suppress(psutil.Error):
                times = child.cpu_times()
                agent += times.user + times.system
        return others, agent

    phases = [tel.phase(n) for n in ("collector_wait", "inference", "replay_sample", "learning")]
    iterations_per_tick = rate_per_s / 4 / 100  # ticks every 10 ms
    time.sleep(3.0)  # the agent process has started (its imports are not what this measures)
    before, wall0 = cpu_s(), time.monotonic()
    i = 0
    due = 0.0
    next_tick = time.monotonic()
    while time.monotonic() - wall0 < seconds:
        due += iterations_per_tick
        while due >= 1:
            due -= 1
            with tel.iteration(i, env_steps=i):
                for p in phases:
                    with p:
                        pass
            i += 1
        next_tick += 0.01
        delay = next_tick - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    after, wall = cpu_s(), time.monotonic() - wall0
    tel.close()
    others, agent = ((a - b) / wall for a, b in zip(after, before))
    print(f"| {rate_per_s} | {budget:.0f} | {i * 4 / wall:.0f} | {others * 100:.1f}% | {agent * 100:.1f}% | {(others + agent) * 100:.1f}% |")


def part2(seconds: float) -> None:
    receiver = subprocess.Popen(
        [sys.executable, "-c", "import otlp_receivers, sys, time; r = otlp_receivers.HttpReceiver().start(); "
         "print(r.endpoint, flush=True); time.sleep(3600)"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.path.join(os.path.dirname(__file__), "..", "tests", "support")},
    )
    try:
        endpoint = receiver.stdout.readline().strip()
        print("## Background CPU, every signal exported over OTLP/HTTP to a receiver in another process")
        print()
        print("Share of one core used by otel-rl outside the training thread: the training process's other")
        print("threads, and the agent process that assembles and exports (spans, metrics, logs; metrics every 1 s).")
        print()
        print("| phases/s | span budget/s | achieved phases/s | training process, other threads | agent process | total |")
        print("|---|---|---|---|---|---|")
        for rate, budget in ((500, 1000), (5000, 1000), (5000, 0)):
            background_cpu(rate, budget, seconds, endpoint, receiver.pid)
        print()
    finally:
        receiver.kill()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer rounds, shorter runs")
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, otel-rl {otel_rl.__version__}")
    print()
    part1(rounds=3 if args.quick else 11)
    part2(seconds=3 if args.quick else 10)


if __name__ == "__main__":
    main()
