"""Overhead study: the same training loop with telemetry off, on, on with every output failing, and the alternatives.

    python bench/overhead.py            # the full study (about 45 minutes on 2 cores)
    python bench/overhead.py --quick    # fewer rounds and configurations
    python bench/overhead.py --markdown docs/overhead.md

Every measurement runs the loop in a fresh child process (one process tree),
and the arms are interleaved round by round in a shuffled order, so machine
drift hits every arm alike. Peers (OTLP receiver, ingest server, misbehaving
servers) run in their own processes.

Arms: off; off again (the noise control); otel-rl with every output on (OTLP
to a local receiver, live stream to a local ingest server, JSONL, Perfetto
trace, system metrics, the panel; ``otel-rl: no-live``, all but the live
stream); otel-rl with each fault (ingest hung,
ingest refusing, collector down, disk stalled, disk erroring, and all of them
at once); otel-rl with its outputs in an agent process (``agent="process"``,
healthy and with every fault); the OpenTelemetry SDK used directly (a span per phase through
``start_as_current_span`` and a histogram record); TensorBoard's
``SummaryWriter`` (a scalar per phase and per key).

Workloads: ``numpy`` (matrix products release the GIL) and ``python``
(a pure-Python loop holds it), at iterations of about 200 us, 2 ms and 20 ms
with 4 phases inside an iteration (each arm instruments the iteration too:
``tel.iteration``, a parent span, a TensorBoard timing); scalars (40 keys,
values that change every call) every iteration and every 50. Plus the real demo training loop.

Each child also reports the CPU time of its threads other than the training
thread while the loop ran: the time a GIL-holding loop has to give up.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUPPORT = HERE.parent / "tests" / "support"
PHASES = (("collector_wait", 0.1), ("inference", 0.2), ("replay_sample", 0.1), ("learning", 0.6))
KEYS = [f"Loss/key_{i:02d}" for i in range(40)]
SAMPLE_EVERY = 8  # time every 8th phase and scalars call (the timing itself costs)
COMPARE_SUFFIX = "@compare"
AGENT_PID: list[int] = []  # the child's agent process, in the agent arms  # the otel-rl arm run with another checkout of otel-rl (--compare)


# -- the child: one arm, one workload, one measurement ------------------------


def make_work(kind: str, units: int):
    if kind == "numpy":
        import numpy as np

        a = np.random.default_rng(0).standard_normal((units, units))

        def work(share: float) -> None:
            for _ in range(max(int(share * 10), 1)):
                a @ a
    else:

        def work(share: float) -> None:
            total = 0
            for i in range(max(int(share * units), 1)):
                total += i * i

    return work


def build_arm(arm: str, peers: dict, tmp: Path):
    """The instrumentation of an arm: (phase factory, iteration factory, scalars function, closer, delivered())."""
    import otel_rl

    run_dir = tmp / "run"
    if arm in ("off", "off-control"):
        tel = otel_rl.init(enabled=False)
        return tel.phase, tel.iteration, tel.scalars, tel.close, lambda: {}
    if arm == "otel-sdk":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=peers["otlp"] + "/v1/traces")))
        meter_provider = MeterProvider(
            metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=peers["otlp"] + "/v1/metrics"), 1000)]
        )
        tracer = tracer_provider.get_tracer("bench")
        meter = meter_provider.get_meter("bench")
        histogram = meter.create_histogram("rl.phase.duration", unit="ms")
        gauges = {k: meter.create_gauge(k) for k in KEYS}

        class SdkPhase:
            def __init__(self, name, histogram=histogram):
                self.name, self.attrs, self.histogram = name, {"rl.phase": name}, histogram

            def __enter__(self):
                self.cm = tracer.start_as_current_span(self.name)
                self.cm.__enter__()
                self.t = time.perf_counter_ns()

            def __exit__(self, *exc):
                self.histogram.record((time.perf_counter_ns() - self.t) / 1e6, self.attrs)
                self.cm.__exit__(*exc)

        iteration_histogram = meter.create_histogram("rl.iteration.duration", unit="ms")
        sdk_iteration = SdkPhase("iteration", iteration_histogram)

        def scalars(values, step=None):
            for key, value in values.items():
                gauges[key].set(value)

        def close():
            tracer_provider.shutdown()
            meter_provider.shutdown()

        return SdkPhase, lambda index: sdk_iteration, scalars, close, lambda: {}
    if arm == "tensorboard":
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(tmp / "tb"))
        steps = [0]

        class TbPhase:
            def __init__(self, name):
                self.tag = f"timing/{name}_ms"

            def __enter__(self):
                self.t = time.perf_counter_ns()

            def __exit__(self, *exc):
                writer.add_scalar(self.tag, (time.perf_counter_ns() - self.t) / 1e6, steps[0])

        def scalars(values, step=None):  # noqa: F811 - the TensorBoard arm's own step counter
            steps[0] += 1
            for key, value in values.items():
                writer.add_scalar(key, value, steps[0])

        tb_iteration = TbPhase("iteration")
        return TbPhase, lambda index: tb_iteration, scalars, writer.close, lambda: {}

    # otel-rl with every output on, pointed at healthy or failing peers; "agent": the outputs in an agent process;
    # "no-live": without the live stream (the others still on).
    faults = set(arm.removeprefix("otel-rl").removeprefix(COMPARE_SUFFIX).strip(": ").split("+")) - {""}
    agent = "process" if "agent" in faults else "off"
    live = "no-live" not in faults
    faults -= {"agent", "no-live"}
    if "all-faults" in faults:
        faults = {"ingest-hung", "ingest-refused", "collector-down", "disk-stalled", "disk-erroring"}
    run_dir.mkdir(parents=True, exist_ok=True)
    if "disk-stalled" in faults:
        os.mkfifo(run_dir / "metrics.jsonl")
    elif "disk-erroring" in faults:
        (run_dir / "metrics.jsonl").symlink_to("/dev/full")
    ingest = peers["ingest"] if live else None
    if "ingest-hung" in faults:
        ingest = peers["hung"]
    elif "ingest-refused" in faults:
        ingest = peers["refused"]
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = peers["refused"] if "collector-down" in faults else peers["otlp"]
    os.environ["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/protobuf"
    os.environ["OTEL_METRIC_EXPORT_INTERVAL"] = "5000"
    tel = otel_rl.init(
        run_dir=run_dir,
        motrix_url=ingest,
        jsonl=True,
        trace_enabled=True,
        system_metrics_interval_s=2.0,
        shutdown_timeout_s=1.0 if agent == "off" else 5.0,  # the agent's start-up (about 1 s here) is part of close()
        agent=agent,
        panel=agent != "off",  # the agent draws it on the inherited terminal (here: the result pipe, before the result line)
    )
    if agent == "off":
        from rich.console import Console

        try:
            from otel_rl.outputs.panel import PanelSink
        except ImportError:  # a --compare checkout from before otel_rl/outputs
            from otel_rl.panel import PanelSink

        tel.add_sink(PanelSink(tel.config.run_id, console=Console(file=open(os.devnull, "w"), force_terminal=True, width=140)))  # noqa: SIM115
    tel.run().__enter__()

    def delivered():
        """After close(): records in metrics.jsonl (a regular file only) and every queue's drops."""
        out = {f"{queue} dropped": n for queue, n in tel.stats()["dropped"].items() if n}
        jsonl = run_dir / "metrics.jsonl"
        if jsonl.is_file() and not jsonl.is_symlink():
            out["jsonl"] = len(jsonl.read_bytes().splitlines())
        return out

    close = lambda: tel.close(timeout_s=1.0 if agent == "off" else 10.0)  # noqa: E731
    if agent == "process":
        AGENT_PID.append(tel._host.process.pid)
    return tel.phase, tel.iteration, tel.scalars, close, delivered


def thread_cpu_s() -> dict[str, float]:
    """CPU seconds (user + system) of each live thread of this process, by thread name (Linux)."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        name = names.get(int(tid), f"thread {tid}")
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def process_cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system) of another process so far; 0 without one."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child(spec: dict) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="otel-rl-overhead-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # the runs' folders go with the bench
    work = make_work(spec["workload"], spec["units"])
    make_phase, iteration, scalars, close, delivered = build_arm(spec["arm"], spec["peers"], tmp)
    phases = [(make_phase(name), share) for name, share in PHASES]
    # Values that change every call, as losses do (a constant dict would flatter every encoder and compressor).
    rng = random.Random(0)
    pool = [{k: rng.random() * 10 ** rng.randint(-3, 3) for k in KEYS} for _ in range(997)]
    phase_ns: list[int] = []
    scalars_ns: list[int] = []
    iterations = 0
    produced_scalars = 0
    perf = time.perf_counter_ns
    warmup_until = time.monotonic() + spec["warmup_s"]
    warm = 0
    while time.monotonic() < warmup_until:
        warm += 1
        with iteration(warm):
            for phase, share in phases:
                with phase:
                    work(share)
    start = time.monotonic()
    end = start + spec["duration_s"]
    cpu_before = thread_cpu_s()
    agent_pid = AGENT_PID[0] if AGENT_PID else None
    agent_before = process_cpu_s(agent_pid)
    while time.monotonic() < end:
        cycle = iteration(warm + iterations)
        cycle.__enter__()
        for phase, share in phases:
            if iterations % SAMPLE_EVERY == 0:
                t0 = perf()
                phase.__enter__()
                t1 = perf()
                work(share)
                t2 = perf()
                phase.__exit__(None, None, None)
                t3 = perf()
                phase_ns.append((t1 - t0) + (t3 - t2))
            else:
                with phase:
                    work(share)
        cycle.__exit__(None, None, None)
        if iterations % spec["scalars_every"] == 0:
            produced_scalars += 1
            t0 = perf()
            scalars(pool[iterations % len(pool)], step=iterations)
            scalars_ns.append(perf() - t0)
        iterations += 1
    elapsed = time.monotonic() - start
    cpu = {name: seconds - cpu_before.get(name, 0.0) for name, seconds in thread_cpu_s().items()}
    agent_cpu = process_cpu_s(agent_pid) - agent_before
    close()
    return {
        "iterations_per_s": iterations / elapsed,
        "phase_ns": phase_ns,
        "scalars_ns": scalars_ns,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "training_cpu": cpu.pop("MainThread", 0.0) / elapsed,
        "background_cpu": sum(cpu.values()) / elapsed,
        "agent_cpu": agent_cpu / elapsed,
        "produced": {"phases": iterations * len(PHASES), "scalars": produced_scalars},
        "delivered": delivered(),
    }


# -- the parent: peers, calibration, interleaved rounds, the table ---------


def start_peers(tmp: Path) -> tuple[dict, list]:
    from scalars_cost import start_server  # this folder is on sys.path when a bench script runs

    procs = []

    def spawn(code: str) -> str:
        proc = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(SUPPORT)}
        )
        procs.append(proc)
        return proc.stdout.readline().strip()

    otlp = spawn("import otlp_receivers, time; r = otlp_receivers.HttpReceiver().start(); print(r.endpoint, flush=True); time.sleep(86400)")
    hung = spawn("import fault_servers, time; s = fault_servers.SilentServer(); print(s.url, flush=True); time.sleep(86400)")
    server, ingest = start_server(tmp)
    procs.append(server)
    sys.path.insert(0, str(SUPPORT))
    from fault_servers import refused_url

    return {"otlp": otlp, "hung": hung, "ingest": ingest, "refused": refused_url()}, procs


def calibrate(kind: str, target_s: float) -> int:
    """Work units such that one iteration of the 4 phases takes about target_s."""
    units = 32 if kind == "numpy" else 1000
    while True:
        work = make_work(kind, units)
        start = time.perf_counter()
        for _ in range(5):
            for _, share in PHASES:
                work(share)
        took = (time.perf_counter() - start) / 5
        if took >= target_s * 0.8 or units > 10**8:
            return units
        units = int(units * min(max(target_s / max(took, 1e-7), 1.1), 4)) if kind == "python" else units + 16


def run_child(spec: dict, compare: str | None = None) -> dict:
    env = None
    if COMPARE_SUFFIX in spec["arm"]:  # "otel-rl@compare", "otel-rl@compare: agent"...
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [compare, os.environ.get("PYTHONPATH")]))}
    out = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True, timeout=300, env=env
    )
    if out.returncode != 0:
        raise RuntimeError(f"{spec['arm']} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # after the agent's panel lines


def demo_rate(disabled: bool, iterations: int) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_"))}
    if disabled:
        env["OTEL_SDK_DISABLED"] = "true"
    with tempfile.TemporaryDirectory() as runs:
        out = subprocess.run(
            [sys.executable, "-m", "otel_rl.cli", "demo", "--iterations", str(iterations), "--learning-starts", "800",
             "--no-panel", "--runs-dir", runs],
            capture_output=True, text=True, env=env, timeout=900,
        )  # fmt: skip
    line = next(line for line in out.stdout.splitlines() if "learner iterations (" in line)
    return float(line.split("(")[1].split("/s")[0])


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(int(q * len(values)), len(values) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--markdown", help="also write the report to this file")
    parser.add_argument("--workloads", help="comma-separated kind:length, e.g. numpy:200us,python:2ms")
    parser.add_argument("--duration", type=float, default=None, help="seconds measured per child")
    parser.add_argument("--arms", help="comma-separated arms to run (default: all)")
    parser.add_argument("--no-demo", action="store_true", help="skip the demo's training loop")
    parser.add_argument("--scalars-every", default="1,50", help="comma-separated: scalars() every N iterations (default: 1,50)")
    parser.add_argument(
        "--compare",
        metavar="CHECKOUT",
        help="also run otel-rl from another checkout (its C extensions built in place: "
        "python setup.py build_ext --inplace), as the arm 'otel-rl@compare'",
    )
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    quick = args.quick
    rounds = args.rounds or (3 if quick else 5)
    arms = [
        "off", "off-control", "otel-rl",
        "otel-rl: ingest-hung", "otel-rl: ingest-refused", "otel-rl: collector-down",
        "otel-rl: disk-stalled", "otel-rl: disk-erroring", "otel-rl: all-faults",
        "otel-rl: agent", "otel-rl: agent+all-faults",
        "otel-sdk", "tensorboard",
    ]  # fmt: skip
    if args.arms:
        arms = [arm.strip() for arm in args.arms.split(",")]
    if args.compare and not any(COMPARE_SUFFIX in arm for arm in arms):
        arms.insert(3, "otel-rl" + COMPARE_SUFFIX)
    lengths = {"200us": 200e-6, "2ms": 2e-3, "20ms": 20e-3}
    workloads = [("numpy", "200us"), ("python", "200us"), ("numpy", "2ms"), ("python", "2ms"), ("numpy", "20ms"), ("python", "20ms")]
    scalars_every = [int(every) for every in args.scalars_every.split(",")]
    if quick:
        workloads = [("numpy", "200us"), ("python", "200us"), ("python", "2ms")]
    if args.workloads:
        workloads = [tuple(item.split(":")) for item in args.workloads.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="otel-rl-overhead-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # the runs' folders go with the bench
    peers, procs = start_peers(tmp)
    units = {(kind, name): calibrate(kind, lengths[name]) for kind, name in workloads}
    results: dict[tuple, list[dict]] = {}
    try:
        for kind, name in workloads:
            for every in scalars_every:
                for _ in range(rounds):
                    order = arms[:]
                    random.shuffle(order)
                    for arm in order:
                        spec = {
                            "arm": arm, "workload": kind, "units": units[(kind, name)], "scalars_every": every,
                            "duration_s": args.duration or (1.5 if quick else 2.0), "warmup_s": 0.3, "peers": peers,
                        }  # fmt: skip
                        results.setdefault((kind, name, every, arm), []).append(run_child(spec, args.compare))
                print(f"done: {kind} {name} scalars every {every}", file=sys.stderr, flush=True)
        demo = {"off": [], "otel-rl": []}
        for _ in range(0 if args.no_demo else 2 if quick else 3):
            for arm in random.sample(list(demo), 2):
                demo[arm].append(demo_rate(arm == "off", 1200 if quick else 2500))
    finally:
        for proc in procs:
            proc.kill()
    report = render(results, demo, workloads, scalars_every, arms, rounds)
    print(report)
    if args.markdown:
        Path(args.markdown).write_text(report)


def render(results, demo, workloads, scalars_every, arms, rounds) -> str:
    lines = [
        "# Overhead study",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, {platform.system()} {platform.release()}. "
        f"{rounds} interleaved rounds per configuration, each arm in a fresh process.",
        "",
        "Throughput change is the median iterations per second of an arm against `off` "
        "(positive: slower). The control band is `off-control` against `off`, the noise of the machine. "
        "Background CPU is the CPU time of every thread but the training thread while the loop ran, "
        "in percent of one core (median over rounds): time a GIL-holding loop has to give up. "
        "Agent CPU is the agent process's CPU time over the same interval (it holds no GIL of the training process).",
        "",
    ]
    for kind, name in workloads:
        for every in scalars_every:
            base = statistics.median(r["iterations_per_s"] for r in results[(kind, name, every, "off")])
            lines += [
                f"## {kind} workload, {name} iterations, scalars every {every}",
                "",
                "| arm | slowdown vs off | phase p50 / p99 (us) | scalars() p50 / p99 (us) | background CPU | agent CPU | agent CPU per 1,000 it/s | peak RSS (MiB) | delivered |",
                "|---|---|---|---|---|---|---|---|---|",
            ]
            for arm in arms:
                runs = results[(kind, name, every, arm)]
                rate = statistics.median(r["iterations_per_s"] for r in runs)
                phase = [ns / 1000 for r in runs for ns in r["phase_ns"]]
                calls = [ns / 1000 for r in runs for ns in r["scalars_ns"]]
                rss = max(r["peak_rss_mib"] for r in runs)
                background = statistics.median(r["background_cpu"] for r in runs)
                agent_cpu = statistics.median(r.get("agent_cpu", 0.0) for r in runs)
                last = runs[-1]
                delivered = ", ".join(f"{k} {v}" for k, v in last["delivered"].items())
                if delivered:
                    delivered += f" (of {last['produced']['scalars']} scalars calls, {last['produced']['phases']} phases)"
                lines.append(
                    f"| {arm} | {100 * (base / rate - 1):+.2f}% | {percentile(phase, 0.5):.2f} / {percentile(phase, 0.99):.2f} "
                    f"| {percentile(calls, 0.5):.1f} / {percentile(calls, 0.99):.1f} | {100 * background:.1f}% | {100 * agent_cpu:.0f}% "
                    f"| {100 * agent_cpu / (rate / 1000):.1f}% | {rss:.0f} | {delivered} |"
                )
            lines.append("")
    if demo["off"]:
        off, on = statistics.median(demo["off"]), statistics.median(demo["otel-rl"])
        lines += [
            "## The demo's real training loop (SAC, Pendulum, collector process)",
            "",
            "| arm | learner iterations/s (median) | runs |",
            "|---|---|---|",
            f"| off (OTEL_SDK_DISABLED) | {off:.1f} | {', '.join(f'{x:.1f}' for x in demo['off'])} |",
            f"| otel-rl, every local output | {on:.1f} ({100 * (off / on - 1):+.2f}%) | {', '.join(f'{x:.1f}' for x in demo['otel-rl'])} |",
            "",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
