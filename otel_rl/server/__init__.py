"""The reference ``motrix.metrics/v1`` ingest server (``otel-rl serve``).

An aiohttp application over SQLite. ``POST /api/v1/ingest`` takes gzip (or
plain) JSON batches: 401 without the configured bearer token, 413 past the
body or decompressed-size limits (gzip bombs), 400 with a JSON error naming
the bad field, otherwise 200 with the number of records accepted and of
duplicates ignored (``(writer, seq)`` already stored). A running run that
sends neither records nor heartbeats for ``lost_after_s`` is reported as
``lost``.

Query API (JSON): ``GET /api/v1/runs``, ``/api/v1/runs/{run_id}`` (status and
events), ``/api/v1/runs/{run_id}/keys`` and
``/api/v1/runs/{run_id}/scalars?key=K`` (one series). ``GET /healthz`` needs no token.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aiohttp import web

from otel_rl.protocol import INGEST_PATH, ProtocolError, validate_batch
from otel_rl.server.storage import Storage

_logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024

_STORAGE = web.AppKey("storage", Storage)
_EXECUTOR = web.AppKey("executor", ThreadPoolExecutor)


def _error(status: int, message: str, field: str | None = None) -> web.Response:
    body: dict[str, Any] = {"error": message}
    if field is not None:
        body["field"] = field
    return web.json_response(body, status=status)


def _decompress(body: bytes, limit: int) -> bytes:
    """Inflate a gzip body, refusing to produce more than ``limit`` bytes."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = inflater.decompress(body, limit)
    if inflater.unconsumed_tail or len(out) > limit:
        raise OverflowError
    out += inflater.flush()
    if len(out) > limit:
        raise OverflowError
    if not inflater.eof:
        raise zlib.error("truncated gzip stream")
    return out


def create_app(
    storage: Storage,
    token: str | None = None,
    lost_after_s: float = 60.0,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_decompressed_bytes: int = MAX_DECOMPRESSED_BYTES,
) -> web.Application:
    """The aiohttp application. Serve it with ``auto_decompress=False`` (see :class:`IngestServer`)."""
    expected = f"Bearer {token}".encode() if token else None

    @web.middleware
    async def authorize(request: web.Request, handler):
        if expected is not None and request.path != "/healthz":
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return _error(401, "missing or wrong bearer token")
        return await handler(request)

    app = web.Application(client_max_size=max_body_bytes, middlewares=[authorize])
    app[_STORAGE] = storage
    app[_EXECUTOR] = ThreadPoolExecutor(max_workers=1, thread_name_prefix="otel-rl-db")

    async def in_db(fn, *args):
        return await asyncio.get_running_loop().run_in_executor(app[_EXECUTOR], fn, *args)

    async def ingest(request: web.Request) -> web.Response:
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"body larger than {max_body_bytes} bytes")
        encoding = request.headers.get("Content-Encoding", "identity").lower()
        if encoding == "gzip":
            try:
                body = _decompress(body, max_decompressed_bytes)
            except OverflowError:
                return _error(413, f"decompressed body larger than {max_decompressed_bytes} bytes")
            except zlib.error:
                return _error(400, "body is not valid gzip", "$")
        elif encoding != "identity":
            return _error(400, f"unsupported Content-Encoding {encoding!r}", "Content-Encoding")
        try:
            document = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return _error(400, f"body is not valid JSON: {exc}", "$")
        try:
            records = validate_batch(document)
        except ProtocolError as exc:
            return _error(400, exc.message, exc.field)
        accepted, duplicates = await in_db(storage.ingest, records)
        return web.json_response({"accepted": accepted, "duplicates": duplicates})

    async def runs(request: web.Request) -> web.Response:
        return web.json_response({"runs": await in_db(storage.runs)})

    async def run(request: web.Request) -> web.Response:
        run_id = request.match_info["run_id"]
        info = await in_db(storage.run, run_id)
        if info is None:
            return _error(404, f"no run {run_id!r}")
        events = await in_db(storage.records, run_id, "event")
        return web.json_response({"run": info, "events": events})

    async def keys(request: web.Request) -> web.Response:
        return web.json_response({"keys": await in_db(storage.keys, request.match_info["run_id"])})

    async def scalars(request: web.Request) -> web.Response:
        key = request.query.get("key")
        if not key:
            return _error(400, "query parameter 'key' is required", "key")
        points = await in_db(storage.series, request.match_info["run_id"], key)
        return web.json_response({"key": key, "points": points})

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def watch_lost(app: web.Application):
        async def loop() -> None:
            while True:
                await asyncio.sleep(max(min(lost_after_s / 4, 5.0), 0.05))
                lost = await in_db(storage.mark_lost, lost_after_s)
                for run_id in lost:
                    _logger.warning("run %s sent nothing for %.0f s: marked lost", run_id, lost_after_s)

        task = asyncio.create_task(loop())
        yield
        task.cancel()
        app[_EXECUTOR].shutdown(wait=True)

    app.cleanup_ctx.append(watch_lost)
    app.router.add_post(INGEST_PATH, ingest)
    app.router.add_get("/api/v1/runs", runs)
    app.router.add_get("/api/v1/runs/{run_id}", run)
    app.router.add_get("/api/v1/runs/{run_id}/keys", keys)
    app.router.add_get("/api/v1/runs/{run_id}/scalars", scalars)
    app.router.add_get("/healthz", healthz)
    return app


class IngestServer:
    """Runs the ingest server on its own thread and event loop (tests, ``otel-rl demo --serve``).

    Args:
        db_path: SQLite file (created if missing).
        host: bind address; loopback by default.
        port: 0 picks a free port (see :attr:`url`).
    """

    def __init__(
        self,
        db_path: Path | str,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        lost_after_s: float = 60.0,
        **limits: int,
    ) -> None:
        self.storage = Storage(db_path)
        self._app = create_app(self.storage, token=token, lost_after_s=lost_after_s, **limits)
        self._host, self._port = host, port
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="otel-rl-ingest", daemon=True)
        self.url = ""

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._runner = web.AppRunner(self._app, auto_decompress=False, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, self._host, self._port)
        self._loop.run_until_complete(site.start())
        port = self._runner.addresses[0][1]  # the port the OS picked
        self.url = f"http://{self._host}:{port}"
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    def start(self) -> IngestServer:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("ingest server did not start within 10 s")
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout_s)
        self.storage.close()

    def __enter__(self) -> IngestServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_forever(db_path: Path | str, host: str, port: int, token: str | None, lost_after_s: float) -> None:
    """Foreground server for ``otel-rl serve``."""
    storage = Storage(db_path)
    app = create_app(storage, token=token, lost_after_s=lost_after_s)
    print(f"otel-rl ingest server on http://{host}:{port} (database {db_path})", flush=True)
    web.run_app(app, host=host, port=port, print=None, auto_decompress=False, access_log=None)
    storage.close()
