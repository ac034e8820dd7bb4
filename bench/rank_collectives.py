"""What a job of several ranks pays per log window: ``log_window`` against the bare reduction it always did.

Four ranks of a real gloo process group on loopback (each its own process,
its own agent), an iteration of two phases between windows. Per call, median
over the windows, on every rank: ``log_window`` (the reduction, each rank's
timings gathered, and on the first window and every 50th the clock
measurement), ``reduce_across_ranks`` alone (the reduction before each rank's
timings were gathered), and ``align_clocks`` alone. Run from the repository root:

    .venv/bin/python bench/rank_collectives.py [--windows 200] [--world 4]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import time

import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank: int, world: int, port: int, windows: int, folder: str, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import otel_rl
    from otel_rl.training.distributed import reduce_across_ranks

    tel = otel_rl.init(run_dir=folder, rank=rank, world_size=world, system_metrics_interval_s=0)
    timings = {"log_window": [], "reduce_across_ranks": [], "align_clocks": []}
    with tel.run():
        for i in range(windows):
            with tel.iteration(i, env_steps=i * 64):
                with tel.phase("learning"):
                    time.sleep(0.001)
                with tel.phase("gradient_sync"):
                    dist.barrier()
            t = time.perf_counter_ns()
            tel.log_window({"Perf/total_fps": 1000.0, "Loss/critic": 0.5}, group=dist.group.WORLD)
            timings["log_window"].append(time.perf_counter_ns() - t)
            t = time.perf_counter_ns()
            reduce_across_ranks({**tel.window_timings(), "Perf/total_fps": 1000.0, "Loss/critic": 0.5}, dist.group.WORLD)
            timings["reduce_across_ranks"].append(time.perf_counter_ns() - t)
            if i % 20 == 0:
                t = time.perf_counter_ns()
                tel.align_clocks(dist.group.WORLD)
                timings["align_clocks"].append(time.perf_counter_ns() - t)
    tel.close()
    dist.destroy_process_group()
    results.put((rank, {k: statistics.median(v) / 1e3 for k, v in timings.items()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=200)
    parser.add_argument("--world", type=int, default=4)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as folder:
        procs = [ctx.Process(target=rank_main, args=(r, args.world, port, args.windows, folder, results)) for r in range(args.world)]
        for p in procs:
            p.start()
        got = dict(results.get(timeout=600) for _ in procs)
        for p in procs:
            p.join(60)
    print(f"{args.world} ranks (gloo, loopback), {args.windows} windows; median us per call on each rank")
    print(f"{'rank':>4} {'log_window':>12} {'reduce only':>12} {'ratio':>6} {'align_clocks':>13}")
    for rank, t in sorted(got.items()):
        print(f"{rank:4d} {t['log_window']:12.0f} {t['reduce_across_ranks']:12.0f} {t['log_window'] / t['reduce_across_ranks']:6.2f} {t['align_clocks']:13.0f}")


if __name__ == "__main__":
    main()
