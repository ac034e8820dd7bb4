"""Build hook for the optional C extensions; all metadata lives in pyproject.toml.

Both are optional: without a compiler the pure-Python recorder and trace encoder are used.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("otel_rl.producer._hotpath", ["otel_rl/producer/_hotpath.c"], optional=True),
        Extension("otel_rl.perfetto._slices", ["otel_rl/perfetto/_slices.c"], optional=True),
    ]
)
