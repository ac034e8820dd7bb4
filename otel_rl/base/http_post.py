"""HTTP POSTs (and PUTs) with a total deadline per request: the live stream's, the media files' and the trace upload's.

Socket timeouts bound each read, not a request: a service that trickles its
answer (a byte every few seconds) holds a request open forever. Here a
watchdog shuts the connection down when the request's deadline passes,
whatever it is doing (connecting, sending, reading headers or body). The
standard library's ``http.client`` keeps one connection alive between
requests; proxies and netrc credentials are never picked up implicitly.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_ANSWER_BYTES = 1024 * 1024


@dataclass(slots=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


class PostError(Exception):
    """The request failed: network error, deadline passed, or a malformed answer."""


class Poster:
    """POSTs to one URL over a kept-alive connection; not thread-safe (one sender thread uses it)."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http:// or https:// URL, got {url!r}")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._headers = headers
        self._connection: http.client.HTTPConnection | None = None

    def post(self, body: bytes, timeout_s: float, method: str = "POST") -> Answer:
        """Send ``body`` (``method``: POST, or PUT); the whole request, connection included, ends within ``timeout_s``.

        Raises:
            PostError: on any failure (the connection is then dropped).
        """
        timer: threading.Timer | None = None
        expired = threading.Event()
        started = time.monotonic()
        try:
            connection = self._connect(timeout_s)
            sock = connection.sock

            def abort() -> None:
                expired.set()
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)

            timer = threading.Timer(max(timeout_s - (time.monotonic() - started), 0.0), abort)
            timer.daemon = True
            timer.start()
            connection.request(method, self._path, body=body, headers=self._headers)
            response = connection.getresponse()
            data = response.read(MAX_ANSWER_BYTES + 1)
            if len(data) > MAX_ANSWER_BYTES or response.will_close:
                self.close()
            return Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, data[:MAX_ANSWER_BYTES])
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self.close()
            if expired.is_set():
                raise PostError(f"no complete answer within {timeout_s:.1f} s") from None
            raise PostError(type(exc).__name__) from None
        finally:
            if timer is not None:
                timer.cancel()

    def _connect(self, timeout_s: float) -> http.client.HTTPConnection:
        if self._connection is None:
            if self._https:
                self._connection = http.client.HTTPSConnection(
                    self._host, self._port, timeout=timeout_s, context=ssl.create_default_context()
                )
            else:
                self._connection = http.client.HTTPConnection(self._host, self._port, timeout=timeout_s)
            self._connection.connect()
        elif self._connection.sock is not None:
            self._connection.sock.settimeout(timeout_s)
        else:
            self._connection.timeout = timeout_s
            self._connection.connect()
        return self._connection

    def close(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(Exception):
                self._connection.close()
            self._connection = None
