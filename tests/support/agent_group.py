"""Producers of one run served by one agent (targets for test_agent.py, importable by spawned children).

- :func:`rank`: a rank of a two-rank job (real gloo collectives); rank 0 starts a collector worker.
- :func:`learner_with_doomed_worker`: a learner whose collector SIGKILLs itself mid-run.
Each writes the pid of the agent that served it to ``OUT/<role>.agent``.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import otel_rl

LEARNER_ITERATIONS = 10
COLLECTOR_CYCLES = 30


def _note_agent(tel, out: str, role: str) -> None:
    deadline = time.monotonic() + 30
    while not tel.stats().get("agent_pid") and time.monotonic() < deadline:
        time.sleep(0.05)
    Path(out, f"{role}.agent").write_text(str(tel.stats().get("agent_pid")))


def collector(spec, out: str, kill_after: int | None = None) -> None:
    from otel_rl.worker_processes import init_worker

    tel = init_worker(spec, system_metrics_interval_s=0)
    if kill_after is None:
        _note_agent(tel, out, spec.role)
    for tick in range(COLLECTOR_CYCLES):
        with tel.iteration(tick, timeline="collector"):
            with tel.phase("env_step", "collector"):
                time.sleep(0.002)
        if tick + 1 == kill_after:
            _note_agent(tel, out, spec.role)
            os.kill(os.getpid(), signal.SIGKILL)  # nothing flushed, no close
    tel.close()


def rank(rank: int, world: int, port: int, run_dir: str, agent: str, out: str) -> None:
    import multiprocessing as mp

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    tel = otel_rl.init(
        run_dir=run_dir, rank=rank, world_size=world, jsonl=True, trace_enabled=True, agent=agent, system_metrics_interval_s=0
    )
    worker = None
    with tel.run():
        if rank == 0:
            context = mp.get_context("spawn")
            worker = context.Process(target=collector, args=(tel.worker_spec("collector 0", context), out))
            worker.start()
        for i in range(LEARNER_ITERATIONS):
            with tel.iteration(i, env_steps=8 * (i + 1)):
                with tel.phase("learning"):
                    time.sleep(0.003 * (rank + 1))  # rank 1 is the straggler
                total = torch.ones(1)
                dist.all_reduce(total)
            tel.scalars({"Loss/critic": float(total.item())})
        if worker is not None:
            worker.join(60)
            time.sleep(2.5)  # a perf window of the learner's live metrics closes with the collector's cycles in it
    _note_agent(tel, out, f"rank{rank}")
    tel.close()
    dist.destroy_process_group()


def learner_with_doomed_worker(run_dir: str, out: str) -> None:
    import multiprocessing as mp

    tel = otel_rl.init(run_dir=run_dir, jsonl=True, trace_enabled=True, agent="process", system_metrics_interval_s=0)
    context = mp.get_context("spawn")
    with tel.run():
        worker = context.Process(target=collector, args=(tel.worker_spec("collector 0", context), out, COLLECTOR_CYCLES // 2))
        worker.start()
        tel.watch_worker(worker, "collector 0")
        for i in range(LEARNER_ITERATIONS):
            with tel.iteration(i):
                with tel.phase("learning"):
                    time.sleep(0.01)
        worker.join(60)
        time.sleep(2.5)
    _note_agent(tel, out, "learner")
    tel.close()


def learner_with_panel(run_dir: str, out: str) -> None:
    """A learner with the panel on and a collector: the agent draws both timelines (on the inherited terminal)."""
    import multiprocessing as mp

    tel = otel_rl.init(run_dir=run_dir, panel=True, agent="process", system_metrics_interval_s=0)
    context = mp.get_context("spawn")
    with tel.run():
        worker = context.Process(target=collector, args=(tel.worker_spec("collector 0", context), out))
        worker.start()
        for i in range(LEARNER_ITERATIONS):
            with tel.iteration(i):
                with tel.phase("learning"):
                    time.sleep(0.01)
        worker.join(60)
        time.sleep(1.0)  # a pass with the collector's last cycles
    tel.close()
