"""Build hook for the optional C extensions; all metadata lives in pyproject.toml.

Both are optional: without a compiler the pure-Python recorder and trace encoder are used.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("otel_rl.training._hotpath", ["otel_rl/training/_hotpath.c"], optional=True),
        Extension("otel_rl.outputs.perfetto._slices", ["otel_rl/outputs/perfetto/_slices.c"], optional=True),
    ]
)
