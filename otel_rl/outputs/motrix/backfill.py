"""``otel-rl backfill RUN_DIR --url URL``: replay ``metrics.jsonl`` into an ingest service.

Every line is sent as it was written, same ``(writer, seq)``, so records the
service already has are ignored there: a backfill after a live run that lost
its connection (or after a crash) fills the gaps and duplicates nothing.
Records the service refuses are skipped one by one and reported; the rest
go on (:func:`otel_rl.outputs.motrix.delivery.send`). Then the files of the
run's ``media`` records (``media/`` in the run folder) are put to the service
(each replaces what it held of the same name: sending twice is harmless).
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

from otel_rl.base.log import logger
from otel_rl.formats.protocol import INGEST_PATH
from otel_rl.outputs.motrix.delivery import send
from otel_rl.base.http_post import Poster
from otel_rl.outputs.motrix.media_upload import media_headers, put_media
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
    reasons for the rejected ones (``reasons``, at most 20); ``media_sent``
    and ``media_failed``: the media files put to it and those it did not take.

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
    totals: dict[str, Any] = {"sent": 0, "accepted": 0, "duplicates": 0, "rejected": 0, "reasons": [], "media_sent": 0, "media_failed": 0}
    media: list[tuple[str, str]] = []  # (run id, path) of each media record

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
                cap = 10.0 if time.monotonic() - first_failure < 60 else 30.0  # often in the first minute, then every 30 s
                time.sleep(max(random.uniform(0, min(cap, 0.5 * 2**attempt)), outcome.retry_after_s or 0.0))
                attempt += 1
            items = outcome.failed

    try:
        pending: list[tuple[str, str]] = []
        for item in read_lines(path):
            if item[0] == "media":
                media.append(_media_of(item[1]))
            pending.append(item)
            totals["sent"] += 1
            if len(pending) >= batch_size:
                deliver(pending)
                pending = []
        if pending:
            deliver(pending)
    finally:
        poster.close()
    _put_media(url, token, path.parent, [m for m in media if m is not None], totals, timeout_s, retry_window_s)
    if totals["rejected"]:
        _logger.warning("otel-rl: the service refused %d records of %s; the others were sent", totals["rejected"], path)
    return totals


def _media_of(line: str) -> tuple[str, str] | None:
    try:
        found = json.loads(line)
        return str(found["run_id"]), str(found["path"])
    except (ValueError, KeyError, TypeError):
        return None


def _put_media(url: str, token: str | None, root: Path, media: list[tuple[str, str]], totals: dict[str, Any], timeout_s: float,
               retry_window_s: float) -> None:  # fmt: skip
    """Put each media file to the service, trying one it cannot take now again within ``retry_window_s``; said once when some fail."""
    headers = media_headers(token)
    failed: list[str] = []
    for run_id, path in dict.fromkeys(media):
        since, attempt = time.monotonic(), 0
        while True:
            outcome, said = put_media(url, headers, run_id, root, path, timeout_s)
            if outcome is not None or time.monotonic() - since > retry_window_s:
                break
            time.sleep(random.uniform(0, min(8.0, 0.5 * 2**attempt)))
            attempt += 1
        if outcome:
            totals["media_sent"] += 1
        else:
            totals["media_failed"] += 1
            failed.append(f"{path} ({said})")
    if failed:
        _logger.warning("otel-rl: %d media files did not reach the service: %s", len(failed), "; ".join(failed[:5]))
