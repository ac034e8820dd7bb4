"""What the runs listing shows of each run, kept as columns at ingest so that a page of runs is one query.

Per run: what it said when it started (its newest ``running`` record's
configuration, provenance and plan, ``started``) and its newest env-step
count (``env_steps``) and its newest live verdict (``bottleneck``: a
``bottleneck`` event's text, side, phase and confidence, with the time it was
said; its side and phase also as columns the listing filters on), as columns
of ``runs``; per run and key, the last
value (by ``(ts, seq)``), the minimum and the maximum in ``run_summaries``.
Each batch updates them in its own transaction, whichever server stores it:
a newer value wins, older ones leave them as they are, so batches stored in
any order, by any number of servers, end in the same summary.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from otel_rl.formats import lifecycle, schema
from otel_rl.readers.server.storage import BLOCK_COLUMNS, Row

STARTED_FIELDS = ("family", "total_steps", "num_envs", "config", "versions", "command", "host", "git")
"""What a ``running`` record says of the run that the listing shows."""
MAX_SUMMARY_KEYS = 20
"""Keys a listing request may ask the summary of."""
STATS = ("last", "min", "max")


def started(rows: list[Row]) -> list[tuple[str, str, float, int]]:
    """``(run_id, started JSON, ts, seq)`` of each ``running`` record of the batch."""
    out = []
    for row in rows:
        if row.kind == "run" and row.status == lifecycle.RUNNING:
            record = json.loads(row.body)
            out.append((row.run_id, json.dumps({k: record[k] for k in STARTED_FIELDS if k in record}), row.ts, row.seq))
    return out


def newest_steps(rows: list[Row]) -> list[tuple[str, int, float]]:
    """``(run_id, env steps, ts)``: per run, its newest scalars record's env steps (else its step)."""
    newest: dict[str, tuple[float, int]] = {}
    for row in rows:
        if row.kind != "scalars":
            continue
        steps = row.axes[1] if row.axes[1] is not None else row.axes[0]
        if steps is not None and (row.run_id not in newest or row.ts >= newest[row.run_id][0]):
            newest[row.run_id] = (row.ts, int(steps))
    return [(run_id, steps, ts) for run_id, (ts, steps) in newest.items()]


BOTTLENECK_FIELDS = ("text", "side", "phase", "rank", "confidence", "caveat", "env_steps_per_s", "evidence", "previous")
"""What a ``bottleneck`` event says that the run keeps as its current verdict."""
TRACE_VERDICT_TS = 1e300
"""The time a trace's verdict is kept at: after every live one, so none replaces it."""


def newest_bottleneck(rows: list[Row]) -> list[tuple[str, str, str, str, float]]:
    """``(run_id, verdict JSON, side, phase, ts)``: per run, its newest ``bottleneck`` event of the batch."""
    newest: dict[str, tuple[float, dict[str, Any]]] = {}
    for row in rows:
        if row.kind != "event" or '"bottleneck"' not in row.body:
            continue
        record = json.loads(row.body)
        attributes = record.get("attributes")
        if record.get("name") != schema.EVENT_BOTTLENECK or not isinstance(attributes, dict):
            continue
        if row.run_id not in newest or row.ts >= newest[row.run_id][0]:
            newest[row.run_id] = (row.ts, attributes)
    out = []
    for run_id, (ts, attributes) in newest.items():
        verdict = {k: attributes[k] for k in BOTTLENECK_FIELDS if k in attributes}
        verdict.update(source="live", since=ts)
        out.append((run_id, json.dumps(verdict), str(attributes.get("side") or ""), str(attributes.get("phase") or ""), ts))
    return out


def key_summaries(blocks: list[tuple[str, str, str, float, bytes]]) -> list[tuple[str, str, float, float, float, float, float]]:
    """``(run_id, key, last, last ts, last seq, min, max)`` per run and key of a batch's point blocks (finite values only)."""
    found: dict[tuple[str, str], list[float]] = {}
    ts_row, seq_row, value_row = BLOCK_COLUMNS.index("ts"), BLOCK_COLUMNS.index("seq"), BLOCK_COLUMNS.index("value")
    for run_id, key, _writer, _first_ts, data in blocks:
        columns = np.frombuffer(data, dtype=np.float64).reshape(len(BLOCK_COLUMNS), -1)
        values = columns[value_row]
        finite = np.isfinite(values)
        if not finite.any():
            continue
        kept = columns[:, finite]
        newest = np.lexsort((kept[seq_row], kept[ts_row]))[-1]
        summary = [float(kept[value_row, newest]), float(kept[ts_row, newest]), float(kept[seq_row, newest]),
                   float(kept[value_row].min()), float(kept[value_row].max())]  # fmt: skip
        known = found.get((run_id, key))
        if known is None:
            found[(run_id, key)] = summary
        else:  # the same key from another writer in the batch
            if (summary[1], summary[2]) > (known[1], known[2]):
                known[:3] = summary[:3]
            known[3], known[4] = min(known[3], summary[3]), max(known[4], summary[4])
    return [(run_id, key, *summary) for (run_id, key), summary in sorted(found.items())]


def summary_keys(query: Any) -> list[str]:
    """The keys a listing request asks the summary of (``summary=K``, repeated), at most :data:`MAX_SUMMARY_KEYS`."""
    keys = list(dict.fromkeys(query.getall("summary", [])))
    if len(keys) > MAX_SUMMARY_KEYS:
        raise ValueError(f"at most {MAX_SUMMARY_KEYS} summary keys per request")
    return keys


def attach(entry: dict[str, Any], keys: list[str], cells: tuple) -> dict[str, Any]:
    """A listing row's summary cells as ``entry["summary"][key] = {"last", "min", "max"}`` (None where the key has none)."""
    entry["summary"] = {
        key: dict(zip(STATS, cells[3 * i : 3 * i + 3], strict=True)) if cells[3 * i] is not None else None for i, key in enumerate(keys)
    }
    return entry

