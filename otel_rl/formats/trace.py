"""How the Perfetto trace names what it shows: the contract between the trace writer and its readers.

The writer (:mod:`otel_rl.outputs.perfetto`) and ``otel-rl analyze``
(:mod:`otel_rl.readers.analysis`) both take the trace's names from here: a
slice's name is a phase's title, its category the phase's timeline; an
iteration is a slice named :func:`iteration_slice` around its phases.
"""

from __future__ import annotations

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


def iteration_slice(timeline: str) -> str:
    """The name of an iteration's slice on its thread's track (its category is the timeline)."""
    return timeline + ITERATION_SUFFIX


def is_iteration(name: str, category: str | None = None) -> bool:
    """Whether a slice is an iteration (of ``category``'s timeline, when given)."""
    return name == iteration_slice(category) if category is not None else name.endswith(ITERATION_SUFFIX)


def process_name(role: str, rank: int) -> str:
    """A producer's process in the trace: its role, and its rank when it is not 0."""
    return role if rank == 0 else f"{role} rank {rank}"


def gpu_process(device: int) -> str:
    return f"GPU {device}"


def stream_track(stream: int, kernels: bool = False) -> str:
    """A GPU stream's track: CUDA-timed phases, or (``kernels``) the profiled kernels."""
    return f"stream {stream} (kernels)" if kernels else f"stream {stream}"
