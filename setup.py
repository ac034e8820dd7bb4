"""Build hook for the optional C extensions; all metadata lives in pyproject.toml.

Both are optional: without a compiler the pure-Python recorder and trace encoder are used.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("otel_rl._hotpath", ["otel_rl/_hotpath.c"], optional=True),
        Extension("otel_rl.exporters._slices", ["otel_rl/exporters/_slices.c"], optional=True),
    ]
)
