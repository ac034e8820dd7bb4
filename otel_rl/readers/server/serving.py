"""Running the ingest server: on a thread of its own (:class:`IngestServer`) or in the foreground (``otel-rl serve``)."""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import threading
from pathlib import Path
from typing import Any

from aiohttp import web

from otel_rl.readers.server.app import NO_TOKEN_WARNING, create_app
from otel_rl.readers.server.backends import open_storage

_logger = logging.getLogger("otel_rl.readers.server")

HEADER_TIMEOUT_S = 10.0
"""How long a connection may take to send a whole request's headers, or stay idle between requests."""


def raise_open_files_limit() -> None:
    """Let the server hold as many connections as the system allows (stalled uploads must not exhaust it)."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = hard if hard != resource.RLIM_INFINITY else 1 << 20
        if soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        pass


class IngestServer:
    """Runs the ingest server on its own thread and event loop (tests, ``otel-rl demo --serve``).

    Args:
        db: a SQLite file (created if missing) or a ``postgresql://`` URL.
        host: bind address; loopback by default.
        port: 0 picks a free port (see :attr:`url`).
        reuse_port: bind with ``SO_REUSEPORT``: the port is shared with other sockets of this user that set it
            (several servers on one port, the kernel spreading connections among those listening).
        header_timeout_s: how long a connection may take to send a request's headers, or idle between requests.
        options: ``decode_processes`` and the limits of :class:`otel_rl.readers.server.app.Limits`.
    """

    def __init__(
        self,
        db: Path | str,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        lost_after_s: float = 60.0,
        header_timeout_s: float = HEADER_TIMEOUT_S,
        reuse_port: bool = False,
        **options: Any,
    ) -> None:
        self.storage = open_storage(db)
        self._app = create_app(self.storage, token=token, lost_after_s=lost_after_s, **options)
        self._host, self._port, self._reuse_port = host, port, reuse_port
        self._header_timeout_s = header_timeout_s
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="otel-rl-ingest", daemon=True)
        self.url = ""

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._runner = web.AppRunner(
            self._app, auto_decompress=False, access_log=None, keepalive_timeout=self._header_timeout_s
        )  # aiohttp's keep-alive timer runs from the connection's start: it is the header timeout too
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, self._host, self._port, reuse_port=self._reuse_port or None)
        self._loop.run_until_complete(site.start())
        port = self._runner.addresses[0][1]  # the port the OS picked
        self.url = f"http://{self._host}:{port}"
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    def start(self) -> IngestServer:
        raise_open_files_limit()
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("ingest server did not start within 10 s")
        return self

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop serving (within ``timeout_s``) and close the database."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout_s)
        self.storage.close()

    def __enter__(self) -> IngestServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


DECODE_PROCESSES = 2


def serve_forever(db: Path | str, host: str, port: int, token: str | None, lost_after_s: float, **limits: Any) -> None:
    """Foreground server for ``otel-rl serve`` (bodies decoded on :data:`DECODE_PROCESSES` worker processes); ``limits``: of
    :class:`otel_rl.readers.server.app.Limits`.

    Raises:
        OSError: the address cannot be listened on (a port in use, a host not of this machine), before anything is said.
    """
    raise_open_files_limit()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listening = socket.create_server((host, port), family=family, backlog=1024)  # first: a port in use is one error, said first
    storage = open_storage(db)
    app = create_app(storage, token=token, lost_after_s=lost_after_s, decode_processes=DECODE_PROCESSES, **limits)
    where = "PostgreSQL" if str(db).startswith(("postgresql://", "postgres://")) else f"database {db}"
    port = listening.getsockname()[1]
    print(f"otel-rl ingest server on http://{host}:{port} ({where}{', token required' if token else ''}); its runs at http://{host}:{port}/", flush=True)
    if not token:
        _logger.warning("otel-rl serve: %s", NO_TOKEN_WARNING)
    web.run_app(app, sock=listening, print=None, auto_decompress=False, access_log=None, keepalive_timeout=HEADER_TIMEOUT_S)
    storage.close()
