"""The training process's side: the hot path, what it records into, and what the public API delegates to.

``recorder`` (phases, iteration marks, scalars and events into a shared-memory
segment; the hot path in C, ``_hotpath.c``, with pure-Python twins in
``lanes``), ``cuda_timing`` (GPU phases timed with CUDA events, resolved where
the CUDA context lives), ``profiling`` (a ``torch.profiler`` window), and the
owners :class:`otel_rl.Telemetry` delegates to: ``run_scope`` (the run's
lifecycle), ``workers`` (worker processes), ``windows`` (log windows),
``distributed`` (a window reduced across ranks).
"""
