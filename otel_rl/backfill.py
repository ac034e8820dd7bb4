"""``otel-rl backfill RUN_DIR --url URL``: replay ``metrics.jsonl`` into an ingest service.

Every line is sent as it was written, same ``(writer, seq)``, so records the
service already has are ignored there: a backfill after a live run that lost
its connection (or after a crash) fills the gaps and duplicates nothing.
"""

from __future__ import annotations

import gzip
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from otel_rl.exporters.jsonl import JSONL_FILE
from otel_rl.protocol import INGEST_PATH, batch

_logger = logging.getLogger(__name__)


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """Records of a JSONL file; a torn last line (a crash mid-write) is skipped with a warning."""
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                _logger.warning("otel-rl: %s line %d is not valid JSON (torn write?); skipped", path, number)


def backfill(run_dir: Path | str, url: str, token: str | None = None, batch_size: int = 500, timeout_s: float = 30.0) -> dict[str, int]:
    """Send every record of ``run_dir/metrics.jsonl``; returns counts of sent, accepted and duplicate records.

    Raises:
        FileNotFoundError: no ``metrics.jsonl`` in ``run_dir``.
        RuntimeError: the service refused a batch (its answer is in the message; the token never is).
    """
    import requests

    path = Path(run_dir)
    if path.is_dir():
        path = path / JSONL_FILE
    if not path.exists():
        raise FileNotFoundError(f"no {JSONL_FILE} at {path}")
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    totals = {"sent": 0, "accepted": 0, "duplicates": 0}
    endpoint = url.rstrip("/") + INGEST_PATH
    pending: list[dict[str, Any]] = []
    with requests.Session() as session:
        session.trust_env = False

        def send() -> None:
            body = gzip.compress(json.dumps(batch(pending)).encode("utf-8"))
            response = session.post(endpoint, data=body, headers=headers, timeout=timeout_s)
            if response.status_code != 200:
                raise RuntimeError(f"{endpoint} answered {response.status_code}: {response.text[:500]}")
            answer = response.json()
            totals["sent"] += len(pending)
            totals["accepted"] += answer.get("accepted", 0)
            totals["duplicates"] += answer.get("duplicates", 0)
            pending.clear()

        for rec in read_records(path):
            pending.append(rec)
            if len(pending) >= batch_size:
                send()
        if pending:
            send()
    return totals
