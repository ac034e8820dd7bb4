"""GPU check of CUDA-event timing: one prepared script for a CUDA machine, under 5 minutes.

1. Accuracy: phases wrapping kernels of known duration (``torch.cuda._sleep``)
   must come out within 5% or 5 us of the same kernels timed by a bare CUDA
   event pair.
2. No host synchronization: a loop of kernels with CUDA timing on runs as fast
   as with it off (within noise), and a loop that never synchronizes keeps
   running ahead of the GPU (the host finishes issuing long before the GPU
   finishes executing).
3. Agreement with torch.profiler: the trace's GPU slices match the same
   kernels in a Kineto trace (durations within 5% or 5 us).
4. The profiling window (``init(profile=...)``): the profiler's kernels are
   on per-device, per-stream tracks, each linked from its launch by a flow,
   and within the CUDA-timed phase that issued them.

Usage: python bench/gpu_check.py [--out DIR]. Prints a table; exit code 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import otel_rl
from otel_rl.readers.analysis import protobuf_engine, trace_files

DURATIONS_US = (20, 200, 1000, 5000)


def within(measured_us: float, expected_us: float) -> bool:
    return abs(measured_us - expected_us) <= max(0.05 * expected_us, 5.0)


def cycles_per_us(torch) -> float:
    """Calibrate torch.cuda._sleep: spin cycles per microsecond on this GPU."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)  # warm up
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return 10_000_000 / (start.elapsed_time(end) * 1000)


def reference_us(torch, cycles: int, repeats: int = 20) -> float:
    """The kernel's duration by a bare event pair (median)."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return statistics.median(times)


def check_accuracy(torch, rate: float, out: Path) -> list[tuple[str, str, bool]]:
    rows = []
    run_dir = out / "accuracy"
    tel = otel_rl.init(run_dir=run_dir, trace_enabled=True)
    phases = {us: tel.phase(f"sleep_{us}us", cuda=True) for us in DURATIONS_US}
    references = {us: reference_us(torch, int(us * rate)) for us in DURATIONS_US}
    for i in range(20):
        with tel.iteration(i):
            for us, phase in phases.items():
                with phase:
                    torch.cuda._sleep(int(us * rate))
    torch.cuda.synchronize()  # the check itself may wait; training never does
    time.sleep(0.5)
    tel.close()
    model = protobuf_engine.read(trace_files(run_dir))
    for us in DURATIONS_US:
        gpu = [s.duration_ns / 1000 for s in model.slices if s.category == "gpu" and s.name == f"Sleep {us}Us"]
        measured = statistics.median(gpu) if gpu else float("nan")
        ok = bool(gpu) and within(measured, references[us])
        rows.append((f"accuracy {us} us kernel", f"{measured:.1f} us vs {references[us]:.1f} us ({len(gpu)} slices)", ok))
    return rows


def loop(torch, tel, rate: float, n: int, timed: bool) -> tuple[float, float]:
    phase = tel.phase("learning", cuda=True) if timed else None
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        if phase is None:
            torch.cuda._sleep(int(50 * rate))
        else:
            with phase:
                torch.cuda._sleep(int(50 * rate))
    issued = time.perf_counter() - start
    torch.cuda.synchronize()
    return issued, time.perf_counter() - start


def check_no_sync(torch, rate: float, out: Path) -> list[tuple[str, str, bool]]:
    tel = otel_rl.init(run_dir=out / "nosync")
    off, on = [], []
    for _ in range(5):
        off.append(loop(torch, tel, rate, 2000, timed=False)[1])
        on.append(loop(torch, tel, rate, 2000, timed=True)[1])
    issued, total = loop(torch, tel, rate, 2000, timed=True)
    tel.close()
    change = statistics.median(on) / statistics.median(off) - 1
    band = (max(off) - min(off)) / statistics.median(off)
    return [
        ("throughput, timing on vs off", f"{100 * change:+.2f}% (off-vs-off spread {100 * band:.2f}%)", change <= max(band, 0.01)),
        ("host runs ahead of the GPU", f"issued in {issued * 1000:.1f} ms, GPU done after {total * 1000:.1f} ms", issued < 0.5 * total),
    ]


def check_profiler(torch, rate: float, out: Path) -> list[tuple[str, str, bool]]:
    run_dir = out / "profiler"
    tel = otel_rl.init(run_dir=run_dir, trace_enabled=True)
    phase = tel.phase("learning", cuda=True)
    chrome = out / "kineto.json"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(20):
            with tel.iteration(i):
                with phase:
                    torch.cuda._sleep(int(500 * rate))
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(chrome))
    time.sleep(0.5)
    tel.close()
    kernels = [
        e["dur"] for e in json.loads(chrome.read_text())["traceEvents"] if e.get("cat") == "kernel" and "sleep" in e.get("name", "").lower()
    ]
    model = protobuf_engine.read(trace_files(run_dir))
    ours = [s.duration_ns / 1000 for s in model.slices if s.category == "gpu"]
    if not kernels or not ours:
        return [("torch.profiler agreement", f"kernels {len(kernels)}, our slices {len(ours)}", False)]
    k, o = statistics.median(kernels), statistics.median(ours)
    return [("torch.profiler agreement", f"ours {o:.1f} us vs Kineto {k:.1f} us ({len(ours)}/{len(kernels)})", within(o, k))]


def check_profile_window(torch, rate: float, out: Path) -> list[tuple[str, str, bool]]:
    run_dir = out / "window"
    tel = otel_rl.init(run_dir=run_dir, profile=(2, 5), quiet=True)
    model = torch.nn.Linear(256, 256).cuda()
    phase = tel.phase("learning", cuda=True)
    for i in range(10):
        with tel.iteration(i), phase:
            model(torch.randn(64, 256, device="cuda")).sum().backward()
            torch.cuda._sleep(int(200 * rate))
    torch.cuda.synchronize()
    tel.close()
    slices = protobuf_engine.read(trace_files(run_dir)).slices
    kernels = [s for s in slices if s.category == "torch.gpu"]
    launched = {f for s in slices if s.category == "torch" and s.flows for f in s.flows}
    linked = sum(1 for k in kernels if set(k.flows) & launched)
    phases = [(s.start_ns, s.end_ns) for s in slices if s.category == "gpu"]
    inside = sum(1 for k in kernels if any(a - 50_000 <= k.start_ns and k.end_ns <= b + 50_000 for a, b in phases))
    tracks = {k.track for k in kernels}
    return [
        ("profile window: kernel tracks", f"{len(kernels)} kernels on {len(tracks)} stream track(s)", bool(kernels)),
        ("profile window: launch flows", f"{linked}/{len(kernels)} kernels linked from their launch", bool(kernels) and linked >= 0.9 * len(kernels)),
        ("profile window: inside CUDA phases", f"{inside}/{len(kernels)} within 50 us of a GPU phase", bool(kernels) and inside >= 0.9 * len(kernels)),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=None, help="folder for the traces (default: a temporary one)")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: CUDA is not available on this machine", file=sys.stderr)
        return 2
    out = Path(args.out or tempfile.mkdtemp(prefix="otel-rl-gpu-check-"))
    rate = cycles_per_us(torch)
    print(f"{torch.cuda.get_device_name()}: torch {torch.__version__}, {rate:.0f} sleep cycles per us, traces in {out}")
    rows = check_accuracy(torch, rate, out) + check_no_sync(torch, rate, out) + check_profiler(torch, rate, out)
    rows += check_profile_window(torch, rate, out)
    width = max(len(r[0]) for r in rows)
    print()
    print(f"| {'check':{width}s} | result | pass |")
    print(f"|{'-' * (width + 2)}|---|---|")
    for name, result, ok in rows:
        print(f"| {name:{width}s} | {result} | {'yes' if ok else 'NO'} |")
    return 0 if all(ok for *_, ok in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
