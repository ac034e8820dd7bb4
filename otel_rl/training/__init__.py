"""The training process's side: the hot path and what it records into.

``recorder`` (phase and iteration marks into per-thread lanes; C in
``_hotpath.c``, with a pure-Python twin), ``cuda_timing`` (GPU phases timed
with CUDA events, resolved here where the CUDA context lives), ``segment``
(the shared-memory segment an agent reads: layout, writer and reader) and
``shm_telemetry`` (the :class:`~otel_rl.telemetry.Telemetry` whose outputs run
in an agent).
"""
