"""The training process's side: the hot path and what it records into.

``recorder`` (phase and iteration marks into per-thread lanes; C in
``_hotpath.c``, with a pure-Python twin; it is also the in-memory record
source of the pipeline), ``cuda_timing`` (GPU phases timed with CUDA events,
resolved here where the CUDA context lives) and ``segment_recorder`` (the
same records written into the shared-memory segment an agent reads).
"""
