"""Sends protocol records to a ``motrix.metrics/v1`` ingest service from its own thread.

Batches of up to ``batch_size`` records (or whatever waited ``interval_s``)
go out gzip-compressed to ``POST {url}/api/v1/ingest``; every request ends
within ``request_timeout_s``, answer included (a service that trickles its
answer cannot hold the sender). Network errors, 408, 429 and 5xx are retried
with exponential backoff and full jitter (429 and 503 honour
``Retry-After``). Records the service refuses as invalid are dropped one by
one (:func:`otel_rl.outputs.motrix.delivery.send`), never their batch.

After ``retry_window_s`` of failures the batch's ``scalars`` and heartbeats
are dropped (counted); ``run`` and ``event`` records go back to the front of
the queue and are retried until :meth:`close`'s deadline, so an outage longer
than the window still delivers the lifecycle once the service returns. While
nothing gets through for ``stall_warning_s`` the sender warns once. While
idle it sends heartbeats, so a long compile is not taken for a dead run. A
service that takes nothing from the first request on is said at once (and
again when it accepts records). The
token travels only in the ``Authorization`` header: it is never logged, never
put in a URL and never in an exception.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from otel_rl.base.deadline import Deadline
from otel_rl.base.drops import Drops
from otel_rl.base.log import EVERY_TIME, logger, once
from otel_rl.base.loops import BackgroundLoop
from otel_rl.formats.protocol import INGEST_PATH
from otel_rl.outputs.motrix.delivery import Outcome, send
from otel_rl.base.http_post import Poster
from otel_rl.outputs.motrix.record_queue import DROPPABLE, Item, RecordQueue

_logger = logger(__name__)

BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 10.0
FINISH_S = 0.2
"""How long before its close deadline the sender stops trying, to count what it did not deliver in time."""


class HttpSender(BackgroundLoop):
    """Delivers records in gzip batches on its own thread (see the module docstring).

    Args:
        url: base URL of the service (``/api/v1/ingest`` is appended).
        token: bearer token, or None for no ``Authorization`` header.
        heartbeat: makes an encoded heartbeat record (with a fresh seq).
        drops: where dropped records are counted (queue ``http``).
        capacity: records kept while the service is behind (default 10,000).
    """

    def __init__(
        self,
        url: str,
        token: str | None,
        heartbeat: Callable[[], Item],
        drops: Drops,
        capacity: int = 10_000,
        batch_size: int = 500,
        interval_s: float = 2.0,
        heartbeat_s: float = 10.0,
        request_timeout_s: float = 10.0,
        retry_window_s: float = 60.0,
        stall_warning_s: float = 30.0,
    ) -> None:
        super().__init__("otel-rl-http", interval_s)
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._poster = Poster(url.rstrip("/") + INGEST_PATH, headers)
        self._url = url.rstrip("/")
        self.queue = RecordQueue(capacity, "http", drops)
        self._drops = drops
        self._heartbeat = heartbeat
        self._batch_size = batch_size
        self._heartbeat_s = heartbeat_s
        self._request_timeout_s = request_timeout_s
        self._retry_window_s = retry_window_s
        self._stall_warning_s = stall_warning_s
        self.sent = 0
        self.rejected = 0
        self._submitted = 0  # records handed to this sender (heartbeats are its own, and not among them)
        self._settled = 0  # of those: stored by the service, or refused for good (a resend would be refused alike)
        self._last_sent = time.monotonic()
        self._stalled = False
        self.start()

    @property
    def undelivered(self) -> int:
        """Records handed to the sender that the service never took: still queued, in a request it never answered,
        or dropped after the retry window (``metrics.jsonl`` holds them all, for the backfill)."""
        return max(0, self._submitted - self._settled)

    def submit(self, items: list[Item]) -> None:
        self._submitted += len(items)
        self.queue.put_all(items)
        if len(self.queue) >= self._batch_size:
            self.wake()

    def has_work(self) -> bool:
        return len(self.queue) > 0

    def run_once(self) -> None:
        budget = len(self.queue)  # this round delivers what was queued when it began
        if not budget:
            if not self.stopping and time.monotonic() - self._last_sent >= self._heartbeat_s:
                self._deliver([self._heartbeat()], counted=False)
            return
        while budget > 0:
            items = self.queue.take(min(self._batch_size, budget))
            if not items:
                return
            budget -= len(items)
            if not self._deliver(items):
                return
            self._check_stall()

    def close(self, deadline: Deadline) -> None:
        """Deliver what is queued until :data:`FINISH_S` before ``deadline``: what is left is then counted within it."""
        super().close(Deadline(deadline.left() - FINISH_S))

    def release(self) -> None:
        """The close deadline passed, or the queue is empty: what is left was not delivered (counted as ``http`` drops)."""
        left = self.queue.take()
        for kind, _ in left:
            self._drops.add("http", kind)
        self._poster.close()

    # -- delivery --------------------------------------------------------------

    def _deliver(self, items: list[Item], counted: bool = True) -> bool:
        """Deliver ``items``; False when the service is unavailable (what is kept went back to the queue).

        ``counted``: the items were submitted (a heartbeat, made here, is not).
        """
        first_failure: float | None = None
        attempt = 0
        while items:
            left = self.time_left()
            timeout = self._request_timeout_s if left is None else min(self._request_timeout_s, left)
            if timeout <= 0:
                self.queue.put_back(items)
                return False
            outcome = send(self._poster, items, timeout)
            self._account(outcome, counted)
            items = outcome.failed
            if not items:
                return True
            now = time.monotonic()
            first_failure = now if first_failure is None else first_failure
            if not self.sent and not self._stalled and outcome.error:  # down from the start: said at once, not at the end
                self._stalled = True
                _logger.warning(
                    "otel-rl: ingest service %s cannot take records (%s); retrying, and metrics.jsonl keeps every record for `otel-rl backfill`",
                    self._url,
                    outcome.error,
                    extra=EVERY_TIME,
                )
            self._check_stall(len(items))
            if now - first_failure >= self._retry_window_s:
                kept = [item for item in items if item[0] not in DROPPABLE]
                for kind, _ in items:
                    if kind in DROPPABLE:
                        self._drops.add("http", kind)
                _logger.warning(
                    "otel-rl: ingest service unavailable for %.0f s (%s); dropped %d scalars, keeping %d lifecycle records",
                    now - first_failure,
                    outcome.error,
                    len(items) - len(kept),
                    len(kept),
                )
                self.queue.put_back(kept)
                return False
            backoff = random.uniform(0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**attempt))
            attempt += 1
            if not self.sleep(max(backoff, outcome.retry_after_s or 0.0)):
                self.queue.put_back(items)
                return False
        return True

    def _account(self, outcome: Outcome, counted: bool = True) -> None:
        delivered = outcome.stored
        if counted:
            self._settled += delivered + len(outcome.rejected) + len(outcome.refused)
        if delivered:
            self.sent += delivered
            self._last_sent = time.monotonic()
            if self._stalled:
                self._stalled = False
                _logger.warning("otel-rl: ingest service accepts records again", extra=EVERY_TIME)
        for (kind, _), reason in outcome.rejected:
            self.rejected += 1
            self._drops.add("http_rejected", kind)
            _logger.warning(
                "otel-rl: ingest service refused a %s record (%s); dropped it alone", kind, reason, extra=once(f"rejected:{reason}")
            )
        if outcome.refused:
            for kind, _ in outcome.refused:
                self._drops.add("http", kind)
            _logger.warning(
                "otel-rl: ingest service refused a request (%s); dropped its %d records",
                outcome.refused_reason,
                len(outcome.refused),
                extra=once(f"refused:{outcome.refused_reason}"),
            )

    def _check_stall(self, in_flight: int = 0) -> None:
        quiet = time.monotonic() - self._last_sent
        waiting = len(self.queue) + in_flight
        if not self._stalled and quiet >= self._stall_warning_s and waiting:
            self._stalled = True
            _logger.warning(
                "otel-rl: ingest service has accepted nothing for %.0f s; %d records waiting",
                quiet,
                waiting,
                extra=EVERY_TIME,
            )
