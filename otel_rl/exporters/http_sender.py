"""Sends protocol records to a ``motrix.metrics/v1`` ingest service from its own thread.

Batches of up to ``batch_size`` records (or whatever waited ``interval_s``)
go out gzip-compressed to ``POST {url}/api/v1/ingest``. Network errors, 408,
429 and 5xx are retried with exponential backoff and full jitter (429 and 503
honour ``Retry-After``) for up to ``retry_window_s``; any other 4xx drops the
batch with one warning. While idle it sends heartbeats, so a long compile is
not taken for a dead run. The token travels only in the ``Authorization``
header: it is never logged, never put in a URL and never in an exception.
"""

from __future__ import annotations

import email.utils
import gzip
import json
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from otel_rl.exporters.record_queue import RecordQueue
from otel_rl.protocol import INGEST_PATH, batch
from otel_rl.recorder import warn_once

_logger = logging.getLogger(__name__)

RETRYABLE = frozenset({408, 429}) | frozenset(range(500, 600))
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 10.0
RETRY_AFTER_CAP_S = 60.0


def retry_after_s(value: str | None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (seconds or HTTP date), capped."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value).timestamp()
        except (TypeError, ValueError):
            return None
        seconds = when - time.time()
    return min(max(seconds, 0.0), RETRY_AFTER_CAP_S)


class HttpSender:
    """Delivers records in gzip batches, retrying transient failures.

    Args:
        url: base URL of the service (``/api/v1/ingest`` is appended).
        token: bearer token, or None for no ``Authorization`` header.
        heartbeat: builds a heartbeat record (with a fresh seq).
        drop_event: builds the event that reports drops once delivery recovers.
        capacity: records kept while the service is behind (default 10,000).
    """

    def __init__(
        self,
        url: str,
        token: str | None,
        heartbeat: Callable[[], dict[str, Any]],
        drop_event: Callable[[str, dict[str, int]], dict[str, Any]],
        capacity: int = 10_000,
        batch_size: int = 500,
        interval_s: float = 2.0,
        heartbeat_s: float = 10.0,
        request_timeout_s: float = 5.0,
        retry_window_s: float = 60.0,
    ) -> None:
        import requests

        self._endpoint = url.rstrip("/") + INGEST_PATH
        self._headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._session = requests.Session()
        self._session.trust_env = False  # no proxies or netrc credentials picked up implicitly
        self.queue = RecordQueue(capacity, "http")
        self._heartbeat = heartbeat
        self._drop_event = drop_event
        self._batch_size = batch_size
        self._interval_s = interval_s
        self._heartbeat_s = heartbeat_s
        self._request_timeout_s = request_timeout_s
        self._retry_window_s = retry_window_s
        self._closing = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self.sent = 0
        self.batches_dropped = 0
        self._last_sent = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="otel-rl-http", daemon=True)
        self._thread.start()

    def submit(self, record: dict[str, Any]) -> None:
        if self._idle.is_set():
            self._idle.clear()
        self.queue.put(record, wake_at=self._batch_size)

    def _run(self) -> None:
        while True:
            if not self._closing.is_set():
                self.queue.wait(self._interval_s, self._batch_size)
            records = self.queue.take(self._batch_size)
            if not records:
                self._idle.set()
                if self._closing.is_set():
                    break
                if time.monotonic() - self._last_sent >= self._heartbeat_s:
                    self._deliver([self._heartbeat()])
                continue
            self._deliver(records)
            report = self.queue.take_drop_report()
            if report:
                self.queue.put(self._drop_event("http", report))
        self._session.close()

    def _deliver(self, records: list[dict[str, Any]]) -> bool:
        body = gzip.compress(json.dumps(batch(records), separators=(",", ":"), allow_nan=False).encode("utf-8"))
        first_failure: float | None = None
        attempt = 0
        while True:
            status, wait_s = self._post(body)
            if status is not None and 200 <= status < 300:
                self.sent += len(records)
                self._last_sent = time.monotonic()
                return True
            if status is not None and status not in RETRYABLE:
                self.batches_dropped += 1
                warn_once(
                    f"http-status:{status}",
                    "otel-rl: ingest service answered %d; dropping a batch of %d records",
                    status,
                    len(records),
                )
                return False
            now = time.monotonic()
            first_failure = now if first_failure is None else first_failure
            if now - first_failure >= self._retry_window_s:
                self.batches_dropped += 1
                warn_once("http-giveup", "otel-rl: ingest service unavailable for %.0f s; dropping a batch", now - first_failure)
                return False
            backoff = random.uniform(0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**attempt))
            attempt += 1
            # A closing sender still retries (the exit hook bounds how long the process waits for it).
            time.sleep(max(backoff, wait_s or 0.0))

    def _post(self, body: bytes) -> tuple[int | None, float | None]:
        """Status code and Retry-After seconds; (None, None) on a network error."""
        import requests

        try:
            response = self._session.post(self._endpoint, data=body, headers=self._headers, timeout=self._request_timeout_s)
        except requests.RequestException as exc:
            # The exception names the URL only: the token lives in a header and is never formatted.
            warn_once(f"http-error:{type(exc).__name__}", "otel-rl: cannot reach ingest service (%s); retrying", type(exc).__name__)
            return None, None
        wait_s = retry_after_s(response.headers.get("Retry-After")) if response.status_code in (429, 503) else None
        response.close()
        return response.status_code, wait_s

    def flush(self, timeout_s: float) -> bool:
        """Wait until every queued record was delivered (or given up on); False on timeout."""
        self.queue.wake()
        return self._idle.wait(timeout_s)

    def close(self) -> None:
        """Stop after delivering what is queued; returns at once (see :meth:`join`)."""
        self._closing.set()
        self.queue.wake()

    def join(self, timeout_s: float) -> bool:
        self._thread.join(max(timeout_s, 0.0))
        return not self._thread.is_alive()
