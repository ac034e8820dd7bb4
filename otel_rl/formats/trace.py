"""How the Perfetto trace names what it shows: the contract between the trace writer and its readers.

The writer (:mod:`otel_rl.outputs.perfetto`) and ``otel-rl analyze``
(:mod:`otel_rl.readers.analysis`) both take the trace's names from here: a
slice's name is a phase's title, its category the phase's timeline; an
iteration is a slice named :func:`iteration_slice` around its phases.
"""

from __future__ import annotations

import re

ITERATION_SUFFIX = " iteration"
OPERATOR_CATEGORY = "torch"
"""The category of the ``torch.profiler`` operators' slices (inside the phases that ran them)."""
GPU_CATEGORY = "torch.gpu"
"""The category of the profiled kernels' slices."""
DEVICE_CATEGORY = "gpu"
"""The category of a CUDA-timed phase's slice on its GPU stream's track."""
CRASH_MARK = "worker crashed: its trace ends here"
"""The instant that ends a crashed worker's timeline (the agent adds why, when it saw the death)."""
CPU_COUNTER_SUFFIX = " CPU"
"""A thread's CPU-share counter track (``trace_thread_time``): the thread's name, then this."""
PROFILE_MARKER = "otel_rl.timebase"
"""The ``record_function`` marking a ``torch.profiler`` window's timebase, read back to map its clock onto the run's."""
PROFILE_MARKERS = 8
"""How many markers a profile window records at each end."""
GPU_PID_BASE = 0x40000000
"""The synthetic pid of device ``n``'s ``GPU n`` process is this plus ``n`` (negative pids are reserved)."""
NODE_PID_STRIDE = 1 << 22
"""Above Linux's largest pid: machine ``k`` of a job shows process ``pid`` as ``pid + k * NODE_PID_STRIDE``,
so the parts of several machines (whose pids may repeat, in containers above all) merge without collisions."""
MAX_NODES = 255
"""Machines one timeline tells apart by pid (their pids stay below :data:`GPU_PID_BASE`); machine ``k`` past it
shares the pids of machine ``k % (MAX_NODES + 1)`` (its processes' names still say its host)."""
GPUS_PER_NODE = 256
"""Machine ``k``'s device ``n`` is the process ``GPU_PID_BASE + k * GPUS_PER_NODE + n``."""
CLOCK_OFFSET_KEY = "Perf/clock_offset_ms"
"""A rank's clock minus rank 0's, measured through ``torch.distributed`` (:meth:`otel_rl.Telemetry.align_clocks`):
a counter on the rank's process that readers subtract from its timestamps to put every machine on rank 0's clock."""


def iteration_slice(timeline: str) -> str:
    """The name of an iteration's slice on its thread's track (its category is the timeline)."""
    return timeline + ITERATION_SUFFIX


def is_iteration(name: str, category: str | None = None) -> bool:
    """Whether a slice is an iteration (of ``category``'s timeline, when given)."""
    return name == iteration_slice(category) if category is not None else name.endswith(ITERATION_SUFFIX)


def process_name(role: str, rank: int, host: str | None = None) -> str:
    """A producer's process in the trace: its role, its rank when it is not 0 (always with a host), and its host
    in a job of several machines (``learner rank 3 (node1)``)."""
    name = role if rank == 0 and not host else f"{role} rank {rank}"
    return f"{name} ({host})" if host else name


_PROCESS = re.compile(r"^(?P<role>.*?)(?: rank (?P<rank>\d+))?(?: \((?P<host>[^()]*)\))?$", re.S)


def parse_process(name: str) -> tuple[str, int, str | None]:
    """``(role, rank, host)`` of a name :func:`process_name` wrote (rank 0 and no host for any other name)."""
    match = _PROCESS.match(name)
    assert match is not None  # every part of the pattern is optional
    return match["role"], int(match["rank"] or 0), match["host"]


def node_pid(pid: int, node: int) -> int:
    """The pid machine ``node`` shows for its process ``pid`` (see :data:`NODE_PID_STRIDE`)."""
    return pid + node % (MAX_NODES + 1) * NODE_PID_STRIDE


def local_pid(shown: int) -> int:
    """The process id on its own machine of a process the trace shows as ``shown``."""
    return shown % NODE_PID_STRIDE


def gpu_process(device: int, host: str | None = None) -> str:
    return f"GPU {device} ({host})" if host else f"GPU {device}"


def stream_track(stream: int, kernels: bool = False) -> str:
    """A GPU stream's track: CUDA-timed phases, or (``kernels``) the profiled kernels."""
    return f"stream {stream} (kernels)" if kernels else f"stream {stream}"
