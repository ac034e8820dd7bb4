"""What the agent spends per training iteration, measured in one process without the machine's noise.

    python bench/agent_cost.py                 # 20,000 iterations: 4 phases and 40 scalars each
    python bench/agent_cost.py --profile       # the same under cProfile, the top functions printed
    python bench/agent_cost.py --parts         # the agent's time per part: reading the segment, each output's handlers
    python bench/agent_cost.py --hosts [--compare CHECKOUT ...]   # both hosts through the public API (and other checkouts')
    python bench/agent_cost.py --hosts --all-outputs [--compare ...]  # the same with every output a team switches on

The training side records into a shared-memory segment (the ``Recorder`` of
a training process); the agent's side reads it back with the code an agent
process runs (:class:`otel_rl.agent.producer.ProducerOutputs`: the pipeline
reading the segment, feeding the outputs built by ``otel_rl.outputs.factory``:
``metrics.jsonl``, the Perfetto trace, the summary, the panel, the
OpenTelemetry aggregates), pass after pass, each pass flushing the files and
committing as the agent does. Both sides are timed
with ``time.process_time`` in the same run, so the figure is a ratio: agent
CPU per iteration against the training thread's own recording cost. Expressed
per 1,000 iterations per second it is the share of a core an agent needs at
that rate (its writer threads, a few percent more, are not in it: the
``agent CPU`` column of ``bench/overhead.py`` counts the whole process). The
process collects cyclic garbage as the agent process does
(:data:`otel_rl.agent.service.GC_THRESHOLDS`), both sides alike.

``--hosts`` measures what a user pays instead, through the public API: a
fresh process per arm runs the same loop with ``agent="thread"`` and with
``agent="process"``, and reports per iteration the training thread's CPU,
the CPU of the process's other threads and the agent process's, up to a
``flush()`` that has everything written, with the default outputs and the
system metrics on, as a user has them (the loop's scalars on its own
``step=``, the system metrics on the env steps). ``--compare CHECKOUT``
(repeatable) adds the same arms run with another checkout's otel-rl; rounds
are interleaved and the medians printed, with each arm's agent CPU as a share
of a core per 1,000 iterations/s.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import cProfile
import gc
import json
import os
import pstats
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from time import perf_counter_ns

from rich.console import Console

from otel_rl.agent.producer import ProducerOutputs
from otel_rl.agent.service import GC_THRESHOLDS
from otel_rl.base.clock import Clock
from otel_rl.base.deadline import Deadline
from otel_rl.config import TelemetryConfig
from otel_rl.core.identity import RunIdentity
from otel_rl.core.segment_source import SegmentSource
from otel_rl.formats.schema import phase_spec
from otel_rl.outputs.panel import PanelSink
from otel_rl.shm import segment as shm
from otel_rl.training.recorder import Recorder

KEYS = [f"Loss/key_{i:02d}" for i in range(40)]
PHASES = ("collector_wait", "inference", "replay_sample", "learning")
PASS_ITERATIONS = 500  # about what one 100 ms pass reads at 5,000 iterations per second
SYSTEM_EVERY = 10_000  # iterations between system metrics samples: the default 2 s at 5,000 iterations per second
SYSTEM_VALUES = {f"sys/key_{i:02d}": float(i) for i in range(12)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=None, help="default 20,000; with --hosts 150,000 (several system metrics samples a run)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--parts", action="store_true", help="time each output's handlers and the segment's reading")
    parser.add_argument("--hosts", action="store_true", help="both hosts through the public API, a process per arm")
    parser.add_argument("--compare", metavar="CHECKOUT", action="append", default=[], help="with --hosts: the same arms with another checkout's otel-rl (repeatable)")
    parser.add_argument("--rounds", type=int, default=3, help="with --hosts: rounds of every arm, interleaved")
    parser.add_argument("--all-outputs", action="store_true", help="with --hosts: every output a team switches on besides the defaults "
                        "(TensorBoard, W&B offline, the live stream to a real otel-rl server, OTLP to a real receiver, served here)")
    args = parser.parse_args()
    if args.hosts:
        compare_hosts(args.iterations or 150_000, args.rounds, args.compare, args.all_outputs)
        return
    args.iterations = args.iterations or 20_000
    gc.set_threshold(*GC_THRESHOLDS)
    scratch = tempfile.mkdtemp(prefix="otel-rl-agent-cost-")
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)  # the run folder goes with the bench
    run_dir = Path(scratch) / "run"
    config = TelemetryConfig.from_options(run_dir, None, jsonl=True, trace_enabled=True, panel=False, system_metrics_interval_s=0)
    clock = Clock()
    identity = RunIdentity(config, 0x1234, None, os.getpid(), clock.now_ns(), clock.offset_ns)
    segment = shm.Segment(None, b"", 65_536, data_bytes=64 << 20)
    recorder = Recorder(segment, 65_536)
    phases = [recorder.new_phase(phase_spec("learner", name)) for name in PHASES]
    iteration = recorder.iteration_factory(None, False)
    source = SegmentSource(shm.SegmentReader(segment.buffer))
    panel = PanelSink(config.run_id, console=Console(file=open(os.devnull, "w"), force_terminal=True, width=140))  # noqa: SIM115
    producer = ProducerOutputs(identity, source, [panel])
    parts: dict[str, float] = {}
    if args.parts:
        timed_parts(producer.pipeline, source, parts)
    rng = random.Random(0)  # values that change every call, as losses do: a constant one would flatter the encoders
    pool = [{key: rng.random() * 10 ** rng.randint(-3, 3) for key in KEYS} for _ in range(997)]
    profile = cProfile.Profile()
    training_s = agent_s = 0.0
    for start in range(0, args.iterations, PASS_ITERATIONS):
        began = time.process_time()
        for i in range(start, start + PASS_ITERATIONS):
            with iteration("learner", i, i):
                for phase in phases:
                    with phase:
                        pass
            recorder.add_scalars((perf_counter_ns(), pool[i % len(pool)], i, i, i * 64))
        training_s += time.process_time() - began
        if start % SYSTEM_EVERY == 0:  # the system metrics, on the env-steps axis, beside the loop's own step
            producer._system_scalars(SYSTEM_VALUES)  # noqa: SLF001 - what the sampler thread calls
        began = time.process_time()
        if args.profile:
            profile.enable()
        producer.pipeline.drain()
        producer.outputs.flush_files(Deadline(5.0))
        source.commit()
        if args.profile:
            profile.disable()
        agent_s += time.process_time() - began
    producer.close(Deadline(10.0))
    n = args.iterations - args.iterations % PASS_ITERATIONS
    per_iteration_us = agent_s / n * 1e6
    print(f"iterations: {n} (4 phases and 40 scalars each), every local output on, system metrics every {SYSTEM_EVERY:,}")
    print(f"training thread, recording: {training_s / n * 1e6:.1f} us per iteration")
    print(f"agent, assembling and writing: {per_iteration_us:.1f} us per iteration "
          f"({agent_s / training_s:.1f}x the recording) = {per_iteration_us / 10:.2f}% of a core per 1,000 iterations/s")  # fmt: skip
    if args.profile:
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    if parts:
        print("part (each timed call adds about 0.1 us)      us per iteration")
        for name, seconds in sorted(parts.items(), key=lambda kv: -kv[1]):
            print(f"  {name:42s} {seconds / n * 1e6:8.2f}")
        print(f"  {'the pipeline itself and the flushes':42s} {per_iteration_us - sum(parts.values()) / n * 1e6:8.2f}")


class _Timed:
    """A pipeline handler that adds the seconds it takes to ``parts[name]`` (wall time: ``process_time`` is a system call)."""

    def __init__(self, handler, parts: dict[str, float], name: str) -> None:
        self.__self__ = handler.__self__  # the pipeline names a failing sink by it
        self._handler, self._parts, self._name = handler, parts, name

    def __call__(self, record) -> None:
        began = time.perf_counter()
        try:
            self._handler(record)
        finally:
            self._parts[self._name] = self._parts.get(self._name, 0.0) + time.perf_counter() - began


def timed_parts(pipeline, source: SegmentSource, parts: dict[str, float]) -> None:
    """Time every handler of ``pipeline`` and ``source``'s reading into ``parts`` (a diagnosis, not the figure above)."""
    handlers = pipeline._handlers  # noqa: SLF001 - the bench looks inside on purpose
    for method, bound in handlers.items():
        handlers[method] = [_Timed(h, parts, f"{type(h.__self__).__name__}.{method}") for h in bound]
    take = source.take

    def timed_take(batch) -> None:
        began = time.perf_counter()
        take(batch)
        parts["SegmentSource.take (reading, decoding)"] = parts.get("SegmentSource.take (reading, decoding)", 0.0) + time.perf_counter() - began

    source.take = timed_take  # type: ignore[method-assign]


HOST_LOOP = Path(__file__).resolve().parents[1] / "tests" / "support" / "cost_target.py"
"""The measured loop, shared with the suite's cost test: 4 phases and 40 scalars an iteration, the loop's own ``step=``."""


def compare_hosts(iterations: int, rounds: int, compare: list[str], all_outputs: bool = False) -> None:
    """Print, per checkout and host, the medians of :data:`HOST_LOOP`'s CPU per iteration (``all_outputs``: with every
    output a team switches on, the live stream and OTLP served by this process, whose CPU is not counted)."""
    if all_outputs:
        with _services() as environment:
            _compare_hosts(iterations, rounds, compare, environment, "all")
        return
    _compare_hosts(iterations, rounds, compare, {}, "default")


@contextlib.contextmanager
def _services():
    """A real ingest server and a real OTLP receiver on loopback, as the environment that points a run at them."""
    sys.path.insert(0, str(HOST_LOOP.parent))
    from otlp_receivers import HttpReceiver

    from otel_rl.readers.server import IngestServer

    with tempfile.TemporaryDirectory(prefix="otel-rl-services-") as scratch:
        receiver = HttpReceiver().start()
        try:
            with IngestServer(str(Path(scratch) / "bench.sqlite3")) as server:
                yield {"MOTRIX_METRICS_URL": server.url, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                       "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "WANDB_MODE": "offline", "WANDB_SILENT": "true"}  # fmt: skip
        finally:
            receiver.stop()


def _compare_hosts(iterations: int, rounds: int, compare: list[str], services: dict[str, str], outputs: str) -> None:
    checkouts = {"this checkout": str(Path(__file__).resolve().parents[1])}
    for other in compare:
        checkouts[Path(other).resolve().name[:15]] = str(Path(other).resolve())
    arms = [(name, host) for name in checkouts for host in ("thread", "process")]
    results: dict[tuple[str, str], list[dict[str, float]]] = {arm: [] for arm in arms}
    failed: dict[tuple[str, str], str] = {}
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_"))}, **services}
    for _ in range(rounds):
        for name, host in arms:
            with tempfile.TemporaryDirectory(prefix="otel-rl-hosts-", ignore_cleanup_errors=True) as scratch:  # each arm's run folder is gone when it has been measured
                command = [sys.executable, str(HOST_LOOP), str(Path(scratch) / "run"), str(iterations), "default", host, checkouts[name], outputs]  # system metrics as a user has them
                out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
            if out.returncode != 0:  # an older checkout's host may not keep up (its flush() times out): said, and the rest go on
                failed[name, host] = (out.stderr.strip().splitlines() or ["no output"])[-1]
                continue
            results[name, host].append(json.loads(out.stdout.strip().splitlines()[-1]))
    which = "every output a team switches on (TensorBoard, W&B offline, live stream, OTLP)" if outputs == "all" else "default outputs"
    print(f"{iterations} iterations of 4 phases and 40 scalars, {which} (system metrics on); us of CPU per iteration, median of {rounds}")
    print(f"{'checkout':15s} {'agent=':8s} {'training thread':>16s} {'other threads':>14s} {'agent process':>14s} {'total':>8s} {'outputs, % of a core per 1k it/s':>34s}")
    for name, host in arms:
        if not results[name, host]:
            print(f"{name:15s} {host:8s} failed: {failed[name, host]}")
            continue
        medians = {part: statistics.median(r[part] for r in results[name, host]) for part in ("training", "others", "agent")}
        total = sum(medians.values())
        outputs = medians["agent"] + medians["others"]  # the thread host's outputs run on the process's other threads
        print(f"{name:15s} {host:8s} {medians['training']:16.1f} {medians['others']:14.1f} {medians['agent']:14.1f} {total:8.1f} {outputs / 10:33.2f}%")


if __name__ == "__main__":
    main()
