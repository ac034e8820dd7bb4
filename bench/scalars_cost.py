"""Training-thread cost of one ``scalars()`` call with 40 keys, sinks off, on, and failing.

Every arm runs in this process, interleaved round by round so machine drift
hits all alike; peers (the ingest server, misbehaving servers) run in other
processes so they do not compete for this process's GIL. The references are
TensorBoard's ``SummaryWriter.add_scalar`` called 40 times and one
``wandb.log`` (offline) of the 40 keys.

Arms:
  off            telemetry on, no motrix outputs
  jsonl          metrics.jsonl only (the baseline of the tracker arms)
  jsonl+http     metrics.jsonl and a live ingest server (otel-rl serve)
  ingest hung    the server accepts connections and never answers
  ingest refused nothing listens
  ingest 500     every batch gets HTTP 500
  disk stalled   metrics.jsonl is a FIFO nobody reads (open() never returns)
  disk erroring  metrics.jsonl is /dev/full (every write fails)
  +tensorboard   metrics.jsonl and the TensorBoard output
  +wandb         metrics.jsonl and the W&B output (offline)
  +tb+wandb      metrics.jsonl, TensorBoard and W&B

Usage: python bench/scalars_cost.py [--quick]
"""

from __future__ import annotations

import argparse
import atexit
import itertools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "tests" / "support"))

import otel_rl  # noqa: E402

KEYS = [f"Loss/key_{i:02d}" for i in range(40)]
PEER = """
import sys, time
sys.path.insert(0, {tests!r})
import fault_servers
kind = sys.argv[1]
server = fault_servers.SilentServer() if kind == "hung" else fault_servers.ScriptedIngest(then=int(kind))
print(server.url, flush=True)
time.sleep(3600)
"""


def start_peer(kind: str) -> tuple[subprocess.Popen, str]:
    code = PEER.format(tests=str(Path(__file__).parent.parent / "tests" / "support"))
    proc = subprocess.Popen([sys.executable, "-c", code, kind], stdout=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline().strip()


def start_server(tmp: Path) -> tuple[subprocess.Popen, str]:
    port = 18000 + os.getpid() % 1000
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_rl.cli", "serve", "--port", str(port), "--db", str(tmp / "ingest.sqlite3")],
        stdout=subprocess.PIPE,
        text=True,
    )
    proc.stdout.readline()
    return proc, f"http://127.0.0.1:{port}"


def time_calls(call, n: int) -> list[float]:
    out = []
    for i in range(n):
        values = {k: float(i + j) for j, k in enumerate(KEYS)}
        start = time.perf_counter_ns()
        call(values, i)
        out.append((time.perf_counter_ns() - start) / 1000)
        time.sleep(0.0005)  # a training step between logging calls
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rounds, calls = (3, 200) if args.quick else (7, 500)
    tmp = Path(tempfile.mkdtemp(prefix="otel-rl-scalars-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # the arms' folders go with the bench
    peers = []
    server, server_url = start_server(tmp)
    peers.append(server)
    hung, hung_url = start_peer("hung")
    failing, failing_url = start_peer("500")
    peers += [hung, failing]
    from fault_servers import refused_url

    stalled = tmp / "stalled"
    stalled.mkdir()
    os.mkfifo(stalled / "metrics.jsonl")
    erroring = tmp / "erroring"
    erroring.mkdir()
    (erroring / "metrics.jsonl").symlink_to("/dev/full")

    common = dict(system_metrics_interval_s=0)
    arms = {
        "off": otel_rl.init(**common),
        "jsonl": otel_rl.init(run_dir=tmp / "jsonl", jsonl=True, **common),
        "jsonl+http": otel_rl.init(run_dir=tmp / "ok", motrix_url=server_url, **common),
        "ingest hung": otel_rl.init(run_dir=tmp / "hung", motrix_url=hung_url, **common),
        "ingest refused": otel_rl.init(run_dir=tmp / "refused", motrix_url=refused_url(), **common),
        "ingest 500": otel_rl.init(run_dir=tmp / "500", motrix_url=failing_url, **common),
        "disk stalled": otel_rl.init(run_dir=stalled, jsonl=True, **common),
        "disk erroring": otel_rl.init(run_dir=erroring, jsonl=True, **common),
        "+tensorboard": otel_rl.init(run_dir=tmp / "tb-arm", jsonl=True, tensorboard=True, **common),
        "+wandb": otel_rl.init(run_dir=tmp / "wandb-arm", jsonl=True, wandb=True, **common),
        "+tb+wandb": otel_rl.init(run_dir=tmp / "both-arm", jsonl=True, tensorboard=True, wandb=True, **common),
    }
    import wandb
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp / "tb"))
    wandb_run = wandb.init(mode="offline", dir=str(tmp), project="bench", settings=wandb.Settings(console="off", silent=True, x_disable_stats=True))

    def tensorboard(values, step):
        for key, value in values.items():
            writer.add_scalar(key, value, step)

    wandb_steps = itertools.count()  # W&B drops a step lower than its last one: every round needs new steps
    references = {
        "ref: TensorBoard add_scalar x40": tensorboard,
        "ref: wandb.log": lambda v, i: wandb_run.log(v, step=next(wandb_steps)),
    }
    samples: dict[str, list[float]] = {name: [] for name in [*arms, *references]}
    for _ in range(rounds):
        for name, tel in arms.items():
            samples[name] += time_calls(lambda v, i, tel=tel: tel.scalars(v, step=i), calls)
        for name, call in references.items():
            samples[name] += time_calls(call, calls)
    # Close every arm at once (each within its own deadline), then read what reached the file.
    dropped = {name: tel.stats().get("dropped", {}) for name, tel in arms.items()}
    closers = [threading.Thread(target=tel.close) for tel in arms.values()]
    for closer in closers:
        closer.start()
    for closer in closers:
        closer.join()
    delivered = {}
    for name in arms:
        folders = {"jsonl": "jsonl", "jsonl+http": "ok", "ingest hung": "hung", "ingest refused": "refused", "ingest 500": "500",
                   "+tensorboard": "tb-arm", "+wandb": "wandb-arm", "+tb+wandb": "both-arm"}  # fmt: skip
        jsonl = tmp / folders.get(name, "-") / "metrics.jsonl"
        lost = {queue: n for queue, n in dropped[name].items() if n}
        if jsonl.is_file():
            delivered[name] = f"jsonl {len(jsonl.read_text().splitlines())}" + (f", dropped {lost}" if lost else "")
    writer.close()
    wandb_run.finish()
    for proc in peers:
        proc.kill()

    tb = statistics.median(samples["ref: TensorBoard add_scalar x40"])
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores; {rounds} interleaved rounds of {calls} calls per arm")
    print()
    base = statistics.median(samples["jsonl"])
    print("| arm | p50 us | p99 us | p50 vs jsonl | p50 vs TensorBoard | delivered (records) |")
    print("|---|---|---|---|---|---|")
    for name, values in samples.items():
        p50 = statistics.median(values)
        p99 = statistics.quantiles(values, n=100)[98]
        print(f"| {name} | {p50:.1f} | {p99:.1f} | {p50 / base:.2f}x | {100 * p50 / tb:.2f}% | {delivered.get(name, '')} |")


if __name__ == "__main__":
    main()
