"""Build hook for the optional C hot path; all metadata lives in pyproject.toml.

The extension is optional: without a compiler the pure-Python recorder is used.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("otel_rl._hotpath", ["otel_rl/_hotpath.c"], optional=True)])
