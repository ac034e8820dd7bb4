"""Reading a run folder's ``metrics.jsonl``: what the backfill sends and what ``otel_rl.read`` loads."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from otel_rl.base.log import logger

_logger = logger(__name__)


def read_lines(path: Path) -> Iterator[tuple[str, str]]:
    """``(kind, line)`` of each record of a JSONL file; a torn line (a crash mid-write) is skipped with a warning."""
    for number, line, record, why in _lines(path):
        if record is None:
            _logger.warning("otel-rl: %s line %d %s; skipped", path, number, why)
            continue
        yield str(record.get("kind", "")), line


def _lines(path: Path) -> Iterator[tuple[int, str, dict[str, Any] | None, str]]:
    """``(line number, line, record, why)`` of each line of ``path`` but blank ones: ``record`` None, and ``why``, for a line that is no JSON object."""
    with open(path, encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, 1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                yield number, line, None, "is not valid JSON (torn write?)"
                continue
            if not isinstance(record, dict):
                yield number, line, None, "is not a record"
                continue
            yield number, line, record, ""


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """Records of a JSONL file a reader can use.

    A line that is not JSON (torn by a crash), not an object, or not a ``motrix.metrics/v1``
    record of the shape readers use (no time, a scalar that is not a number, ...) is skipped:
    counted, and said once per file when the reading ends, naming the first such line.
    """
    skipped, first = 0, None
    for number, _, record, why in _lines(path):
        why = why or odd_record(record)  # type: ignore[arg-type]
        if not why:
            yield record  # type: ignore[misc]
            continue
        skipped += 1
        first = first or (number, why)
    if skipped:
        _logger.warning("otel-rl: %s: %d line(s) that are no motrix.metrics/v1 record skipped (line %d %s)", path, skipped, *first)


_NUMBER = (int, float)


def odd_record(record: dict[str, Any]) -> str | None:
    """What makes ``record`` unusable to a reader, None for a record of the protocol's shape (the fields readers use)."""
    ts = record.get("ts")
    if type(ts) not in _NUMBER or not math.isfinite(ts):
        return "has no time (ts)"
    if not isinstance(record.get("run_id"), str):
        return "has no run id"
    kind = record.get("kind")
    if kind == "scalars":
        values = record.get("values")
        if not isinstance(values, dict) or not all(v is None or type(v) in _NUMBER for v in values.values()):
            return "has scalar values that are not numbers"
        if record.get("step") is not None and type(record.get("step")) is not int:
            return "has a step that is not an integer"
        if not isinstance(record.get("axes") or {}, dict):
            return "has axes that are not an object"
    elif kind == "run" and not isinstance(record.get("status"), str):
        return "is a run record without a status"
    elif kind == "event" and not isinstance(record.get("name"), str):
        return "is an event without a name"
    elif not isinstance(kind, str):
        return "has no kind"
    return None
