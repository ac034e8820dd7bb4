"""The protocol's scalars lines of a :class:`ScalarRun`, made from its columns.

``_lines.c`` splices the numbers orjson formats column by column (the times,
the values) between the record's fixed parts and its keys: no dictionary per
call. :func:`python_lines` is its pure-Python twin (a record dictionary per
call), used when the extension is not built; both give the bytes
``orjson.dumps`` gives for :func:`otel_rl.formats.protocol.scalars_record`.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import orjson

from otel_rl.base.environment_variables import OTEL_RL_PURE_PYTHON
from otel_rl.core.records import ScalarsRecord
from otel_rl.core.scalar_rows import ScalarRun
from otel_rl.formats.protocol import scalars_record

try:
    from otel_rl.outputs.motrix._lines import scalar_lines as _c_scalar_lines
except ImportError:  # no compiler at install time
    _c_scalar_lines = None

NATIVE = _c_scalar_lines is not None and os.environ.get(OTEL_RL_PURE_PYTHON, "").lower() not in ("1", "true")
"""Whether the lines are made in C (built, and ``OTEL_RL_PURE_PYTHON`` not set)."""


def run_lines(run_id: str, writer: str, run: ScalarRun, native: bool = NATIVE) -> list[tuple[str, str]]:
    """The ``("scalars", line)`` items of ``run``'s calls, in order (``native``: made in C).

    Raises:
        TypeError, OverflowError: a value orjson refuses (then encode record by record).
    """
    if not native:
        return python_lines(run_id, writer, run)
    ts = orjson.dumps(run.epoch_ns / 1e9, option=orjson.OPT_SERIALIZE_NUMPY)
    values = orjson.dumps(np.ascontiguousarray(run.values), option=orjson.OPT_SERIALIZE_NUMPY)
    return _c_scalar_lines("scalars", _head(run_id, writer), _keys(run.names), run.seqs, ts, run.steps, run.env_steps, run.iterations, values)


def python_lines(run_id: str, writer: str, run: ScalarRun) -> list[tuple[str, str]]:
    """:func:`run_lines` made record by record."""
    return [("scalars", orjson.dumps(record_fields(run_id, writer, rec)).decode()) for rec in run]


def record_fields(run_id: str, writer: str, rec: ScalarsRecord) -> dict:
    """One record's protocol fields (:func:`scalars_record`)."""
    axes = {"env_steps": rec.env_steps, "iteration": rec.iteration}
    return scalars_record(run_id, writer, rec.seq, rec.time_ns / 1e9, rec.axis_step, axes, rec.values)


@functools.lru_cache(maxsize=16)
def _head(run_id: str, writer: str) -> bytes:
    """A line up to its seq, as :func:`scalars_record` orders the fields."""
    return b'{"run_id":' + orjson.dumps(run_id) + b',"writer":' + orjson.dumps(writer) + b',"seq":'


@functools.lru_cache(maxsize=64)
def _keys(names: tuple[str, ...]) -> tuple[bytes, ...]:
    return tuple(orjson.dumps(name) + b":" for name in names)
