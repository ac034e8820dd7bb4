"""Build hook for the optional C extensions; all metadata lives in pyproject.toml.

All are optional: without a compiler the pure-Python recorder, trace encoder, ring reader and line encoder are used
(and a segment's file shrunk by another process is noticed but no longer kept from faulting the process).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("otel_rl.training._hotpath", ["otel_rl/training/_hotpath.c"], optional=True),
        Extension("otel_rl.outputs.perfetto._slices", ["otel_rl/outputs/perfetto/_slices.c"], optional=True),
        Extension("otel_rl.shm._frames", ["otel_rl/shm/_frames.c"], optional=True),
        Extension("otel_rl.shm._guard", ["otel_rl/shm/_guard.c"], optional=True),
        Extension("otel_rl.outputs.motrix._lines", ["otel_rl/outputs/motrix/_lines.c"], optional=True),
    ]
)
