"""A run's scalars at full resolution, one column per key: ``GET /api/v1/runs/{run_id}/export?format=json|csv|parquet``.

Every point the run stored (nothing thinned, as :meth:`Storage.curve` reads
them out of the point blocks), a row per scalars record: ``seq``, ``ts``
(Unix seconds), ``step``, ``env_steps``, then one column per key (empty
where that record did not carry the key, or its value was not finite).
``json`` is columnar (``{"columns": {name: [values...]}}``, null for empty),
what :mod:`otel_rl.read` loads into a DataFrame; ``csv`` and ``parquet``
are downloads (``parquet`` needs pyarrow where the server runs).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

FORMATS = {"json": "application/json", "csv": "text/csv", "parquet": "application/vnd.apache.parquet"}
AXES = ("seq", "ts", "step", "env_steps")


class BadFormat(ValueError):
    """An export format this server cannot write."""


def check_format(name: str) -> str:
    """``name`` when the server can write it.

    Raises:
        BadFormat: an unknown format, or parquet without pyarrow.
    """
    if name not in FORMATS:
        raise BadFormat(f"format must be one of {', '.join(FORMATS)}")
    if name == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise BadFormat("format=parquet needs pyarrow where the server runs (pip install 'otel-rl[read]'); csv and json need nothing") from None
    return name


def wide(series: Mapping[str, Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Each key's columns (:data:`otel_rl.readers.server.storage.BLOCK_COLUMNS`) as one table: a row per record (``seq``), in time order."""
    seqs = np.unique(np.concatenate([c["seq"] for c in series.values()])) if series else np.empty(0)
    out = {axis: np.full(len(seqs), np.nan) for axis in AXES}
    out["seq"] = seqs
    for key, columns in series.items():
        rows = np.searchsorted(seqs, columns["seq"])
        for axis in AXES[1:]:
            out[axis][rows] = columns[axis]
        out[key] = np.full(len(seqs), np.nan)
        out[key][rows] = columns["value"]
    order = np.lexsort((out["seq"], out["ts"]))
    return {name: column[order] for name, column in out.items()}


def encode(table: dict[str, np.ndarray], name: str) -> bytes:
    """The table in format ``name`` (see the module docstring)."""
    if name == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        sink = io.BytesIO()
        pq.write_table(pa.table({k: pa.array(v, from_pandas=True) for k, v in _typed(table).items()}), sink)
        return sink.getvalue()
    if name == "csv":
        text = io.StringIO()
        writer = csv.writer(text, lineterminator="\n")
        writer.writerow(table)
        columns = [_cells(c) for c in _typed(table).values()]
        writer.writerows(zip(*columns))
        return text.getvalue().encode()
    import orjson

    return orjson.dumps({"columns": {k: _cells(v) for k, v in _typed(table).items()}})


def _typed(table: dict[str, np.ndarray]) -> dict[str, Any]:
    """Integer axes (seq, step, env_steps) as integers where every row has one; the rest as floats."""
    out: dict[str, Any] = {}
    for name, column in table.items():
        if name in ("seq", "step", "env_steps") and len(column) and not np.isnan(column).any():
            out[name] = column.astype(np.int64)
        else:
            out[name] = column
    return out


def _cells(column: np.ndarray) -> list[Any]:
    """Python values, None for NaN (empty in CSV, null in JSON and Parquet)."""
    values = column.tolist()
    if column.dtype.kind == "f":
        return [None if math.isnan(v) else v for v in values]
    return values
