"""The files of a run's ``media`` records, sent to the live service beside the records (``PUT .../media/<name>``).

A writer of the live stream's exporter like :class:`HttpSender`: it sees
every record, keeps the ``media`` ones, and puts each record's file (in the
run folder) to the service on its own thread, so that a large video never
holds up the records. What waits is bounded (:data:`CAPACITY` files); a file
the service cannot take now (the run not known yet, 408, 429, 5xx, no
answer) is tried again with backoff within the retry window, then left to
``otel-rl backfill``, which sends every media file of ``metrics.jsonl``. A
file refused for good (401, 403, 413, 400) is said once and counted.
"""

from __future__ import annotations

import json
import random
import time
from collections import deque
from pathlib import Path
from urllib.parse import quote, urlencode

from otel_rl.base.drops import Drops
from otel_rl.base.log import logger, once
from otel_rl.base.loops import BackgroundLoop
from otel_rl.base.http_post import Poster, PostError
from otel_rl.outputs.motrix.record_queue import Item

CAPACITY = 64
RETRYABLE = frozenset({404, 408, 425, 429, 500, 502, 503, 504})
"""404 too: the run's first records may still be on their way when its first file is."""

_logger = logger(__name__)


def media_path(url: str, run_id: str, name: str) -> str:
    """The service's path of a run's media file (the run id as a parameter: any run id has one)."""
    return f"{url.rstrip('/')}/api/v1/run/media/{quote(name, safe='')}?{urlencode({'run_id': run_id})}"


def media_headers(token: str | None) -> dict[str, str]:
    return {"Content-Type": "application/octet-stream", **({"Authorization": f"Bearer {token}"} if token else {})}


def put_media(url: str, headers: dict[str, str], run_id: str, root: Path, path: str, timeout_s: float) -> tuple[bool | None, str]:
    """Put the file ``root/path`` of a ``media`` record: True (the service holds it), False (refused for good, or
    unreadable) or None (try again later), with what the service or the system said."""
    name = path.rsplit("/", 1)[-1]
    try:
        data = (root / path).read_bytes()
    except OSError as exc:
        return False, f"cannot be read ({exc})"
    poster = Poster(media_path(url, run_id, name), headers)
    try:
        answer = poster.post(data, timeout_s, method="PUT")
    except PostError as exc:
        return None, str(exc)
    finally:
        poster.close()
    said = f"{answer.status}: {answer.body[:200].decode('utf-8', 'replace')}"
    if 200 <= answer.status < 300:
        return True, said
    return (None if answer.status in RETRYABLE else False), said


class MediaUploader(BackgroundLoop):
    """Puts the files of ``media`` records (found under ``root``) to the service at ``url``."""

    def __init__(self, url: str, token: str | None, run_id: str, root: Path, drops: Drops,
                 request_timeout_s: float = 60.0, retry_window_s: float = 60.0) -> None:  # fmt: skip
        super().__init__("otel-rl-media-upload", 1.0)
        self._url, self._run_id, self._root = url, run_id, root
        self._headers = media_headers(token)
        self._drops = drops
        self._pending: deque[tuple[str, float]] = deque()  # (path in the run folder, first tried at)
        self._timeout_s, self._window_s = request_timeout_s, retry_window_s
        self.sent = 0
        self.start()

    def submit(self, items: list[Item]) -> None:
        for kind, line in items:
            if kind != "media":
                continue
            try:
                path = json.loads(line)["path"]
            except (ValueError, KeyError, TypeError):
                continue
            if len(self._pending) >= CAPACITY:
                self._drops.add("http_media", "media")
                _logger.warning("otel-rl: %d media files wait to be sent; %s is left to otel-rl backfill", CAPACITY, path, extra=once("media-upload-full"))
                continue
            self._pending.append((path, time.monotonic()))
            self.wake()

    def has_work(self) -> bool:
        return bool(self._pending)

    def run_once(self) -> None:
        backoff = 0.5
        while self._pending:
            path, since = self._pending[0]
            outcome = self._put(path)
            if outcome is None:  # not now: again after a while, within the window
                if time.monotonic() - since > self._window_s:
                    self._pending.popleft()
                    self._drops.add("http_media", "media")
                    _logger.warning("otel-rl: %s did not reach the service within %.0f s; otel-rl backfill sends it", path, self._window_s,
                                    extra=once("media-upload-window"))  # fmt: skip
                    continue
                if not self.sleep(backoff * random.uniform(0.5, 1.5)):
                    return
                backoff = min(backoff * 2, 8.0)
                continue
            self._pending.popleft()
            backoff = 0.5

    def _put(self, path: str) -> bool | None:
        """True: the service holds the file; False: refused for good (said); None: try again later."""
        outcome, said = put_media(self._url, self._headers, self._run_id, self._root, path, self._timeout_s)
        if outcome:
            self.sent += 1
        elif outcome is False:
            self._drops.add("http_media", "media")
            _logger.warning("otel-rl: %s did not reach the service (%s)", path, said, extra=once(f"media-upload-{said[:3]}"))
        return outcome

    def release(self) -> None:
        """What was not sent by the close deadline is left to ``otel-rl backfill`` (counted)."""
        if self._pending:
            self._drops.add("http_media", "media", len(self._pending))
            self._pending.clear()
