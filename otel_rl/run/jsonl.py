"""Reading a run folder's ``metrics.jsonl``: what the backfill sends and what ``otel_rl.read`` loads."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from otel_rl.base.log import logger

_logger = logger(__name__)


def read_lines(path: Path) -> Iterator[tuple[str, str]]:
    """``(kind, line)`` of each record of a JSONL file; a torn line (a crash mid-write) is skipped with a warning."""
    with open(path, encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, 1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                _logger.warning("otel-rl: %s line %d is not valid JSON (torn write?); skipped", path, number)
                continue
            if not isinstance(record, dict):
                _logger.warning("otel-rl: %s line %d is not a record; skipped", path, number)
                continue
            yield str(record.get("kind", "")), line


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """Records of a JSONL file (torn lines skipped, see :func:`read_lines`)."""
    for _, line in read_lines(path):
        yield json.loads(line)
