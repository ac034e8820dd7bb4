"""``otel-rl backfill RUN_DIR --url URL``: replay ``metrics.jsonl`` into an ingest service.

Every line is sent as it was written, same ``(writer, seq)``, so records the
service already has are ignored there: a backfill after a live run that lost
its connection (or after a crash) fills the gaps and duplicates nothing.
Records the service refuses are skipped one by one and reported; the rest
go on (:func:`otel_rl.outputs.motrix.delivery.send`).
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from otel_rl.base.log import logger
from otel_rl.formats.protocol import INGEST_PATH
from otel_rl.outputs.motrix.delivery import send
from otel_rl.outputs.motrix.http_post import Poster
from otel_rl.run.files import JSONL_FILE
from otel_rl.run.jsonl import read_lines

_logger = logger(__name__)


def backfill(
    run_dir: Path | str,
    url: str,
    token: str | None = None,
    batch_size: int = 500,
    timeout_s: float = 30.0,
    retry_window_s: float = 60.0,
) -> dict[str, Any]:
    """Send every record of ``run_dir/metrics.jsonl``.

    Returns counts of ``sent``, ``accepted`` (new to the service),
    ``duplicates`` (already held) and ``rejected`` records, and the service's
    reasons for the rejected ones (``reasons``, at most 20).

    Raises:
        FileNotFoundError: no ``metrics.jsonl`` in ``run_dir``.
        RuntimeError: the service refused the requests (a wrong token, say) or
            stayed unavailable for ``retry_window_s`` (the token is never in the message).
    """
    path = Path(run_dir)
    if path.is_dir():
        path = path / JSONL_FILE
    if not path.exists():
        raise FileNotFoundError(f"no {JSONL_FILE} at {path}")
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    endpoint = url.rstrip("/") + INGEST_PATH
    poster = Poster(endpoint, headers)
    totals: dict[str, Any] = {"sent": 0, "accepted": 0, "duplicates": 0, "rejected": 0, "reasons": []}

    def deliver(items: list[tuple[str, str]]) -> None:
        first_failure = time.monotonic()
        attempt = 0
        while items:
            outcome = send(poster, items, timeout_s)
            totals["accepted"] += outcome.stored - outcome.duplicates
            totals["duplicates"] += outcome.duplicates
            for (kind, _), reason in outcome.rejected:
                totals["rejected"] += 1
                if len(totals["reasons"]) < 20:
                    totals["reasons"].append(f"{kind}: {reason}")
            if outcome.refused:
                raise RuntimeError(f"{endpoint} refused the backfill ({outcome.refused_reason})")
            if outcome.failed and time.monotonic() - first_failure > retry_window_s:
                raise RuntimeError(f"{endpoint} unavailable for {retry_window_s:.0f} s ({outcome.error})")
            if outcome.failed:
                if not attempt:  # said once: the retries can last the whole window
                    _logger.warning("otel-rl: %s unavailable (%s); retrying for up to %.0f s", endpoint, outcome.error, retry_window_s)
                time.sleep(max(random.uniform(0, min(10.0, 0.5 * 2**attempt)), outcome.retry_after_s or 0.0))
                attempt += 1
            items = outcome.failed

    try:
        pending: list[tuple[str, str]] = []
        for item in read_lines(path):
            pending.append(item)
            totals["sent"] += 1
            if len(pending) >= batch_size:
                deliver(pending)
                pending = []
        if pending:
            deliver(pending)
    finally:
        poster.close()
    if totals["rejected"]:
        _logger.warning("otel-rl: the service refused %d records of %s; the others were sent", totals["rejected"], path)
    return totals
