"""Build hook for the optional C extensions; all metadata lives in pyproject.toml.

All are optional: without a compiler the pure-Python recorder, trace encoder, ring reader and line encoder are used
(and a segment's file shrunk by another process is noticed but no longer kept from faulting the process).
The extensions that read or write a shared-memory segment compile against ``otel_rl/shm/layout.h``, written
here from ``otel_rl/shm/layout.py``: the format has one definition.
"""

import importlib.util
import sys
from pathlib import Path

from setuptools import Extension, setup

SHM = Path(__file__).resolve().parent / "otel_rl" / "shm"


def write_layout_header() -> None:
    """``layout.h`` from ``layout.py`` (which imports nothing but the standard library)."""
    spec = importlib.util.spec_from_file_location("_otel_rl_shm_layout", SHM / "layout.py")
    layout = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = layout
    spec.loader.exec_module(layout)
    header = SHM / "layout.h"
    text = layout.c_header()
    if not header.exists() or header.read_text() != text:
        header.write_text(text)


write_layout_header()
setup(
    ext_modules=[
        Extension("otel_rl.training._hotpath", ["otel_rl/training/_hotpath.c"], include_dirs=["otel_rl/shm"], depends=["otel_rl/shm/layout.h"], optional=True),
        Extension("otel_rl.outputs.perfetto._slices", ["otel_rl/outputs/perfetto/_slices.c"], optional=True),
        Extension("otel_rl.shm._frames", ["otel_rl/shm/_frames.c"], include_dirs=["otel_rl/shm"], depends=["otel_rl/shm/layout.h"], optional=True),
        Extension("otel_rl.shm._guard", ["otel_rl/shm/_guard.c"], optional=True),
        Extension("otel_rl.outputs.motrix._lines", ["otel_rl/outputs/motrix/_lines.c"], optional=True),
    ]
)
