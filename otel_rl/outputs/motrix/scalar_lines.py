"""The protocol's scalars lines of a :class:`~otel_rl.core.batches.ScalarBatch`, made from its columns.

``_lines.c`` splices the numbers orjson formats column by column (the times,
the values) between the record's fixed parts and its keys: no dictionary per
call. It takes batches of finite floats (the steady state); the others, and
every batch where the extension is not built, go record by record. Both give
the bytes ``orjson.dumps`` gives for :func:`otel_rl.formats.protocol.scalars_record`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from otel_rl.base.environment_variables import OTEL_RL_PURE_PYTHON
from otel_rl.core.batches import ScalarBatch
from otel_rl.core.records import ScalarsRecord
from otel_rl.formats.protocol import scalars_record
from otel_rl.outputs.motrix.record_queue import Item

try:
    from otel_rl.outputs.motrix._lines import scalar_lines as _c_scalar_lines
except ImportError:  # no compiler at install time
    _c_scalar_lines = None

NATIVE = _c_scalar_lines is not None and os.environ.get(OTEL_RL_PURE_PYTHON, "").lower() not in ("1", "true")
"""Whether the lines of batches of floats are made in C (built, and ``OTEL_RL_PURE_PYTHON`` not set)."""



def batch_lines(run_id: str, writer: str, batch: ScalarBatch, encode: Callable[[dict], Item | None], native: bool = NATIVE) -> list[Item]:
    """The ``("scalars", line)`` items of ``batch``'s calls, in order.

    ``encode(fields)`` makes the item of a record orjson refuses (it names
    what was wrong, or returns None: the record is dropped alone).
    """
    if native and batch.values.dtype == np.float64:
        try:
            return _spliced(run_id, writer, batch)
        except (TypeError, ValueError, OverflowError):  # columns the splicer cannot read: record by record
            pass
    items = []
    for rec in batch:
        fields = record_fields(run_id, writer, rec)
        try:
            items.append(("scalars", orjson.dumps(fields).decode()))
        except TypeError:  # a value orjson refuses
            item = encode(fields)
            if item is not None:
                items.append(item)
    return items


def _spliced(run_id: str, writer: str, batch: ScalarBatch) -> list[Item]:
    ts = orjson.dumps(batch.times_ns / 1e9, option=orjson.OPT_SERIALIZE_NUMPY)
    values = orjson.dumps(np.ascontiguousarray(batch.values), option=orjson.OPT_SERIALIZE_NUMPY)
    return _c_scalar_lines("scalars", _head(run_id, writer), _keys(batch.names), batch.seqs, ts, batch.steps, batch.env_steps, batch.iterations, values)


def record_fields(run_id: str, writer: str, rec: ScalarsRecord) -> dict[str, Any]:
    """One record's protocol fields (:func:`scalars_record`)."""
    axes = {"env_steps": rec.env_steps, "iteration": rec.iteration}
    return scalars_record(run_id, writer, rec.seq, rec.time_ns / 1e9, rec.axis_step, axes, dict(rec.values))


@functools.lru_cache(maxsize=16)
def _head(run_id: str, writer: str) -> bytes:
    """A line up to its seq, as :func:`scalars_record` orders the fields."""
    return b'{"run_id":' + orjson.dumps(run_id) + b',"writer":' + orjson.dumps(writer) + b',"seq":'


@functools.lru_cache(maxsize=64)
def _keys(names: tuple[str, ...]) -> tuple[bytes, ...]:
    return tuple(orjson.dumps(name) + b":" for name in names)
