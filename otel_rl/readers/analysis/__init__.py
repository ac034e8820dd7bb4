"""``otel-rl analyze``: read a Perfetto trace and say where the time goes.

Two engines read the trace into the same model: ``python`` (the protobuf
reader, always available) and ``sql`` (Perfetto's trace processor, when a
``trace_processor_shell`` binary is configured). :func:`analyze` picks ``sql``
when it can, else ``python``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from otel_rl.base.environment_variables import OTEL_RL_TRACE_PROCESSOR
from otel_rl.readers.analysis.measure import analyze_model
from otel_rl.readers.analysis.printer import render_text
from otel_rl.formats.report import Report
from otel_rl.readers.analysis.trace_model import TraceModel
from otel_rl.run.files import TRACE_GLOB

__all__ = ["Report", "analyze", "analyze_model", "trace_files", "read_trace", "render_text"]

_logger = logging.getLogger(__name__)


def trace_files(paths: Path | str | Sequence[Path | str]) -> list[Path]:
    """The trace files of run folders (every process's and machine's parts, rotated ones included) or single files.

    Several folders are one job whose machines kept their parts on their own disks: they are read as one trace.
    """
    found: dict[Path, None] = {}
    for path in [paths] if isinstance(paths, (str, Path)) else paths:
        for file in _trace_files(Path(path)):
            found.setdefault(file.resolve(), None)
    return list(found)


def _trace_files(path: Path) -> list[Path]:
    if path.is_dir():
        named = sorted(path.glob(TRACE_GLOB))
        files = [file for file in named if file.is_file()]  # a FIFO or a device named like a trace would be read forever
        if not files:
            odd = f" ({', '.join(file.name for file in named)}: not regular files)" if named else ""
            if not named and next(path.rglob("events.out.tfevents.*"), None) is not None:  # an earlier logger's run: its scalars only
                odd = "; it holds TensorBoard event files: otel_rl.read.legacy_scalars() reads a run from before the metric schema"
            raise FileNotFoundError(f"no *.perfetto-trace file in {path}{odd}")
        return files
    if not path.exists():
        raise FileNotFoundError(f"no trace at {path}")
    if not path.is_file():  # a FIFO or a device would be read forever
        raise ValueError(f"{path} is not a trace file or a run folder")
    return [path]


def read_trace(path: Path | str | Sequence[Path | str], engine: str = "auto", bin_path: str | None = None) -> tuple[TraceModel, str]:
    """Read a trace (one or several files or run folders, as one trace) into the model; returns it and the engine used.

    ``auto`` uses the SQL engine when a trace processor binary is configured
    (``bin_path`` or ``OTEL_RL_TRACE_PROCESSOR``), else the Python engine.

    Raises:
        ValueError: an unknown engine, or ``sql`` without a binary.
    """
    files = trace_files(path)
    bin_path = bin_path or os.environ.get(OTEL_RL_TRACE_PROCESSOR) or None
    if engine == "auto":
        engine = "sql" if bin_path else "python"
    if engine == "python":
        from otel_rl.readers.analysis import protobuf_engine

        return protobuf_engine.read(files), "python"
    if engine == "sql":
        from otel_rl.readers.analysis import sql_engine

        return sql_engine.read(files, bin_path), "sql"
    raise ValueError(f"unknown engine {engine!r}; expected auto, python or sql")


def analyze(path: Path | str | Sequence[Path | str], engine: str = "auto", bin_path: str | None = None) -> Report:
    """The analysis report of a trace file or run folder (:class:`Report`; its ``to_json()`` is ``otel-rl analyze --json``)."""
    model, used = read_trace(path, engine, bin_path)
    return dataclasses.replace(analyze_model(model), engine=used)
