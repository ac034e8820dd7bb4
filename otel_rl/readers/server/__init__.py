"""The reference ``motrix.metrics/v1`` ingest server (``otel-rl serve``).

An aiohttp application over SQLite (embedded, the default) or PostgreSQL
(``--db postgresql://...``). ``POST /api/v1/ingest`` takes gzip (or plain)
JSON batches:

* 401 without the configured bearer token (compared in constant time);
* 413 past the body or decompressed-size limits (gzip bombs), 408 when the
  body does not arrive within ``read_timeout_s``, 503 with ``Retry-After``
  when ``max_uploads`` uploads are already being decoded and stored (a body
  still arriving takes no such slot, so slow clients cannot starve the
  others; at most ``max_reading`` bodies arrive at once) or the database
  cannot take writes (read-only, full, unreachable); a connection that has
  not sent a whole request within ``header_timeout_s`` is closed;
* 400 naming the field (a JSON path) when the body is not a batch at all;
* otherwise 200 with the number of records ``accepted``, of ``duplicates``
  ignored (``(writer, seq)`` already stored), and, when some records break
  the protocol, which were ``rejected`` and why: the valid ones are stored.

Inflating, decoding and checking (:mod:`otel_rl.readers.server.validation`, compiled
from the protocol's JSON Schema) never run on the event loop: on worker
processes for ``otel-rl serve`` (``decode_processes``, so they do not share
the GIL with the loop and the database writes), on worker threads in an
embedded server, where large bodies are decoded in chunks. Records are stored
in chunks of :data:`CHUNK_RECORDS`, each in one transaction, so ``/healthz``
and other requests are served meanwhile. 500 is left for the server's own faults.

Query API (JSON): ``GET /api/v1/runs?limit=&after=`` (paged; ``next`` is the
``after`` of the following page), ``/api/v1/runs/{run_id}`` (status and
events), ``/api/v1/runs/{run_id}/keys`` and
``/api/v1/runs/{run_id}/scalars?key=K`` (one series). ``GET /healthz`` needs no
token and answers 503 while the database cannot take writes. A pending or
running run that sends neither records nor heartbeats for ``lost_after_s``
is reported as ``lost`` (one log line per sweep).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import multiprocessing
import pickle
import resource
import threading
import time
import zlib
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from otel_rl.formats import schema
from otel_rl.formats.protocol import INGEST_PATH
from otel_rl.readers.server import queries
from otel_rl.readers.server.backends import open_storage
from otel_rl.readers.server.storage import Row, Storage, StorageUnavailable, started
from otel_rl.readers.server.validation import LARGE_BODY_BYTES, Decoded, Invalid, decode_batch, iter_large_batch, stored_text

_logger = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
"""The web page's files (uPlot vendored under ``vendor/``): served as they are, no build step."""
NO_TOKEN_WARNING = (
    "no token is configured: anyone who can reach this server can read and write its runs"
    " (set MOTRIX_METRICS_TOKEN and serve with --require-token)"
)
PHASE_KEYS = {
    spec.key: {"timeline": spec.timeline, "title": spec.title, "nested": spec.parent is not None,
               "to_ms": 1.0 / schema.phase_key_scale(spec.timeline, spec.name)}
    for spec in schema.PHASES.values()
}  # fmt: skip
"""The ``Perf/*`` key of each canonical phase: the page stacks the top-level ones, in milliseconds."""
MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024
CHUNK_RECORDS = 2000
READ_TIMEOUT_S = 30.0
MAX_UPLOADS = 64
MAX_READING = 1024
"""Bodies arriving at once (each at most ``max_body_bytes``); past it, 503."""
HEADER_TIMEOUT_S = 10.0
"""How long a connection may take to send a whole request's headers, or stay idle between requests."""
RETRY_AFTER_S = 5
HEALTH_PROBE_S = 5.0


def _run_id(request: web.Request) -> str:
    """The run a read request names: in its path, else its ``run_id`` parameter."""
    return request.match_info.get("run_id") or request.query.get("run_id", "")


def _error(status: int, message: str, field: str | None = None, headers: dict[str, str] | None = None) -> web.Response:
    body: dict[str, Any] = {"error": message}
    if field is not None:
        body["field"] = field
    return web.json_response(body, status=status, headers=headers)


def _unavailable(message: str) -> web.Response:
    return _error(503, message, headers={"Retry-After": str(RETRY_AFTER_S)})


def decompress(body: bytes, limit: int) -> bytes:
    """Inflate a gzip body (every member, as gzip allows), refusing to produce more than ``limit`` bytes.

    Raises:
        OverflowError: the inflated body would pass ``limit``.
        zlib.error: not valid gzip.
    """
    out = bytearray()
    data = body
    while data:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        out += inflater.decompress(data, limit - len(out) + 1)
        if inflater.unconsumed_tail or len(out) > limit:
            raise OverflowError
        out += inflater.flush()
        if len(out) > limit:
            raise OverflowError
        if not inflater.eof:
            raise zlib.error("truncated gzip stream")
        data = inflater.unused_data
        if data and not data.strip(b"\0"):
            break  # zero padding after the last member
    return bytes(out)


@dataclass
class _State:
    """What the handlers share (all touched on the event loop only, except ``unhealthy``)."""

    uploads: int = 0
    reading: int = 0
    unhealthy: str | None = None
    stopping: bool = False


def _rows(decoded: Decoded) -> list[Row]:
    return [Row.of(record, stored_text(record)) for _, record in decoded.records]


def prepare(body: bytes, gzipped: bool, limit: int) -> tuple[list[bytes], list[tuple[int, str, str]]]:
    """Inflate, decode and check a whole body (in a decoding process): pickled batches of rows, and refusals.

    Rows come back pickled per batch of :data:`CHUNK_RECORDS`, so the server
    unpickles one batch at a time instead of holding its GIL for a whole
    100,000-record body.

    Raises:
        OverflowError, zlib.error: see :func:`decompress`.
        Invalid: the body is not a batch.
    """
    if gzipped:
        body = decompress(body, limit)
    chunks = [decode_batch(body)] if len(body) <= LARGE_BODY_BYTES else iter_large_batch(body, CHUNK_RECORDS)
    batches: list[bytes] = []
    rejected: list[tuple[int, str, str]] = []
    for chunk in chunks:
        rows = _rows(chunk)
        for start in range(0, len(rows), CHUNK_RECORDS):
            batches.append(pickle.dumps(rows[start : start + CHUNK_RECORDS], pickle.HIGHEST_PROTOCOL))
        rejected += chunk.rejected
    return batches, rejected


def create_app(
    storage: Storage,
    token: str | None = None,
    lost_after_s: float = 60.0,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_decompressed_bytes: int = MAX_DECOMPRESSED_BYTES,
    read_timeout_s: float = READ_TIMEOUT_S,
    max_uploads: int = MAX_UPLOADS,
    max_reading: int = MAX_READING,
    decode_processes: int = 0,
) -> web.Application:
    """The aiohttp application. Serve it with ``auto_decompress=False`` (see :class:`IngestServer`).

    ``decode_processes`` > 0 decodes bodies on that many worker processes
    (started with ``forkserver``); 0 decodes on threads of this process.
    """
    expected = f"Bearer {token}".encode() if token else None
    state = _State()
    database = ThreadPoolExecutor(max_workers=1, thread_name_prefix="otel-rl-db")
    decoding = ThreadPoolExecutor(max_workers=2, thread_name_prefix="otel-rl-decode")
    processes = (
        ProcessPoolExecutor(max_workers=decode_processes, mp_context=multiprocessing.get_context("forkserver"))
        if decode_processes > 0
        else None
    )

    @web.middleware
    async def authorize(request: web.Request, handler):
        # The page and its files hold no run data: only the API needs the token (the page asks for it).
        if expected is not None and request.path.startswith("/api/"):
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return _error(401, "missing or wrong bearer token")
        try:
            return await handler(request)
        except StorageUnavailable as exc:  # a query the database cannot answer now
            state.unhealthy = exc.reason
            return _unavailable(f"the database cannot answer: {exc.reason}")

    app = web.Application(client_max_size=max_body_bytes, middlewares=[authorize])

    async def run(executor, fn, *args):
        if state.stopping:  # the executors are going away: come back later
            raise StorageUnavailable("the server is shutting down")
        return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)

    async def store(rows: list[Row]) -> tuple[int, int]:
        try:
            result = await run(database, storage.ingest, rows, time.time())
        except StorageUnavailable as exc:
            state.unhealthy = exc.reason
            raise
        state.unhealthy = None
        return result

    async def ingest(request: web.Request) -> web.Response:
        if state.unhealthy is not None:
            return _unavailable(f"the database cannot take writes: {state.unhealthy}")
        if state.reading >= max_reading:
            response = _unavailable(f"{max_reading} bodies arriving")
            response.force_close()  # the body is never read: the connection goes with the answer
            return response
        state.reading += 1
        try:
            body = await asyncio.wait_for(request.read(), read_timeout_s)
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"body larger than {max_body_bytes} bytes")
        except asyncio.TimeoutError:
            response = _error(408, f"the body did not arrive within {read_timeout_s:.0f} s")
            response.force_close()
            return response
        finally:
            state.reading -= 1
        if state.uploads >= max_uploads:  # a slot for decoding and storing, taken once the body is here
            return _unavailable(f"{max_uploads} uploads in progress")
        state.uploads += 1
        try:
            return await _ingest(request, body)
        finally:
            state.uploads -= 1

    async def _ingest(request: web.Request, body: bytes) -> web.Response:
        encoding = request.headers.get("Content-Encoding", "identity").lower()
        if encoding not in ("gzip", "identity"):
            return _error(400, f"unsupported Content-Encoding {encoding!r}", "Content-Encoding")
        gzipped = encoding == "gzip"
        accepted = duplicates = 0
        rejected: list[dict[str, Any]] = []
        try:
            if processes is not None:
                pickled, refused = await run(processes, prepare, body, gzipped, max_decompressed_bytes)
                rejected = [{"index": i, "field": f, "error": e} for i, f, e in refused]
                batches = _unpickled(pickled, decoding, run)
            else:
                if gzipped:
                    body = await run(decoding, decompress, body, max_decompressed_bytes)
                batches = _decoded_rows(body, decoding, run, rejected)
            async for rows in _each(batches):
                if rows:
                    stored = await store(rows)
                    accepted += stored[0]
                    duplicates += stored[1]
        except OverflowError:
            return _error(413, f"decompressed body larger than {max_decompressed_bytes} bytes")
        except zlib.error:
            return _error(400, "body is not valid gzip", "$")
        except Invalid as exc:
            return _error(400, exc.message, exc.shown())
        except StorageUnavailable as exc:
            return _unavailable(f"the database cannot take writes: {exc.reason}")
        answer: dict[str, Any] = {"accepted": accepted, "duplicates": duplicates}
        if rejected:
            answer["rejected"] = rejected
        return web.json_response(answer)

    def described(run_id: str) -> tuple[dict[str, Any] | None, int | None]:
        """What a run started with (configuration, provenance, plan) and its newest env steps (on the database thread)."""
        return started(storage.records(run_id, "run")), storage.env_steps(run_id)

    async def runs(request: web.Request) -> web.Response:
        try:
            limit = int(request.query.get("limit", "100"))
            only = queries.run_filter(request.query)
        except queries.BadQuery as exc:
            return _error(400, str(exc), exc.field)
        except ValueError:
            return _error(400, "limit must be an integer", "limit")
        after = request.query.get("after") or None
        page = await run(database, storage.runs, limit, after, only)
        for entry in page:
            entry["started"], entry["env_steps"] = await run(database, described, entry["run_id"])
        more = len(page) == max(1, min(limit, 1000))
        return web.json_response({"runs": page, "next": page[-1]["run_id"] if page and more else None})

    async def one_run(request: web.Request) -> web.Response:
        run_id = _run_id(request)
        try:
            latest = queries.events_limit(request.query)
        except queries.BadQuery as exc:
            return _error(400, str(exc), exc.field)
        info = await run(database, storage.run, run_id)
        if info is None:
            return _error(404, f"no run {run_id!r}")
        info["started"], info["env_steps"] = await run(database, described, run_id)
        if latest is None:
            events = await run(database, storage.records, run_id, "event")
            return web.json_response({"run": info, "events": events, "events_total": len(events)})
        events, total = await run(database, storage.events, run_id, latest)
        return web.json_response({"run": info, "events": events, "events_total": total})

    async def keys(request: web.Request) -> web.Response:
        return web.json_response({"keys": await run(database, storage.keys, _run_id(request))})

    async def scalars(request: web.Request) -> web.Response:
        run_id = _run_id(request)
        if "max_points" not in request.query and "x" not in request.query and len(request.query.getall("key", [])) == 1:
            key = request.query["key"]  # one key, as stored: every point with its axes
            return web.json_response({"key": key, "points": await run(database, storage.series, run_id, key)})
        try:
            keys, axis, max_points = queries.curve_request(request.query)
        except queries.BadQuery as exc:
            return _error(400, str(exc), exc.field)

        def curves() -> dict[str, Any]:
            out = {}
            for key in keys:
                columns = storage.curve(run_id, key)
                if not len(columns["seq"]):  # stored before point blocks existed: read out of the records
                    columns = queries.columns_of(storage.series(run_id, key))
                out[key] = queries.curve(columns, axis, max_points)
            return out

        return web.json_response({"x": axis, "max_points": max_points, "series": await run(database, curves)})

    async def server_info(request: web.Request) -> web.Response:
        return web.json_response(
            {"token_required": expected is not None, "warning": None if expected else NO_TOKEN_WARNING, "phases": PHASE_KEYS}
        )

    async def page(request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    async def healthz(request: web.Request) -> web.Response:
        if state.unhealthy is not None:
            return web.json_response({"ok": False, "error": state.unhealthy}, status=503)
        return web.json_response({"ok": True})

    async def background(app: web.Application):
        async def probe_and_sweep() -> None:
            last_probe = 0.0
            while True:
                await asyncio.sleep(max(min(lost_after_s / 4, HEALTH_PROBE_S), 0.05))
                try:
                    if time.monotonic() - last_probe >= HEALTH_PROBE_S or state.unhealthy is not None:
                        last_probe = time.monotonic()
                        state.unhealthy = await run(database, storage.health)
                    lost = await run(database, storage.mark_lost, lost_after_s)
                except StorageUnavailable as exc:
                    state.unhealthy = exc.reason
                    continue
                if lost:
                    shown = ", ".join(lost[:5]) + (" ..." if len(lost) > 5 else "")
                    _logger.warning("%d runs sent nothing for %.0f s: marked lost (%s)", len(lost), lost_after_s, shown)

        state.unhealthy = await run(database, storage.health)
        if state.unhealthy is not None:
            _logger.warning("the database cannot take writes (%s): ingest answers 503 until it can", state.unhealthy)
        task = asyncio.create_task(probe_and_sweep())
        yield
        task.cancel()
        state.stopping = True
        database.shutdown(wait=True)
        decoding.shutdown(wait=True)
        if processes is not None:
            processes.shutdown(wait=True, cancel_futures=True)

    app.cleanup_ctx.append(background)
    app.router.add_post(INGEST_PATH, ingest)
    app.router.add_get("/api/v1/runs", runs)
    app.router.add_get("/api/v1/runs/{run_id}", one_run)
    app.router.add_get("/api/v1/runs/{run_id}/keys", keys)
    app.router.add_get("/api/v1/runs/{run_id}/scalars", scalars)
    # The same with the run id as ?run_id=: a run named "." or ".." has no path of its own (URLs drop dot segments).
    app.router.add_get("/api/v1/run", one_run)
    app.router.add_get("/api/v1/run/keys", keys)
    app.router.add_get("/api/v1/run/scalars", scalars)
    app.router.add_get("/api/v1/server", server_info)
    app.router.add_get("/healthz", healthz)
    for path in ("/", "/runs/{run_id}", "/run", "/compare"):
        app.router.add_get(path, page)
    app.router.add_static("/static", STATIC)
    return app


async def _decoded_rows(body: bytes, executor: ThreadPoolExecutor, run, rejected: list[dict[str, Any]]):
    """Rows of a body decoded on ``executor`` threads: a large body chunk by chunk, so the loop is never held long."""
    if len(body) <= LARGE_BODY_BYTES:
        chunks: Any = iter([await run(executor, decode_batch, body)])
    else:
        chunks = iter_large_batch(body, CHUNK_RECORDS)
    done = object()
    while True:
        decoded = await run(executor, next, chunks, done)
        if decoded is done:
            return
        rejected += [{"index": i, "field": f, "error": e} for i, f, e in decoded.rejected]
        yield await run(executor, _rows, decoded)


async def _unpickled(pickled: list[bytes], executor: ThreadPoolExecutor, run):
    for data in pickled:
        yield await run(executor, pickle.loads, data)


async def _each(batches):
    """Iterate a list or an async generator of row batches alike."""
    if isinstance(batches, list):
        for rows in batches:
            yield rows
    else:
        async for rows in batches:
            yield rows


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
        header_timeout_s: how long a connection may take to send a request's headers, or idle between requests.
        options: limits and timeouts of :func:`create_app`.
    """

    def __init__(
        self,
        db: Path | str,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        lost_after_s: float = 60.0,
        header_timeout_s: float = HEADER_TIMEOUT_S,
        **options: Any,
    ) -> None:
        self.storage = open_storage(db)
        self._app = create_app(self.storage, token=token, lost_after_s=lost_after_s, **options)
        self._host, self._port = host, port
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
        site = web.TCPSite(self._runner, self._host, self._port)
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

    def stop(self, timeout_s: float = 5.0) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout_s)
        self.storage.close()

    def __enter__(self) -> IngestServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


DECODE_PROCESSES = 2


def serve_forever(db: Path | str, host: str, port: int, token: str | None, lost_after_s: float) -> None:
    """Foreground server for ``otel-rl serve`` (bodies decoded on :data:`DECODE_PROCESSES` worker processes)."""
    raise_open_files_limit()
    storage = open_storage(db)
    app = create_app(storage, token=token, lost_after_s=lost_after_s, decode_processes=DECODE_PROCESSES)
    where = "PostgreSQL" if str(db).startswith(("postgresql://", "postgres://")) else f"database {db}"
    print(f"otel-rl ingest server on http://{host}:{port} ({where}{', token required' if token else ''}); its runs at http://{host}:{port}/", flush=True)
    if not token:
        _logger.warning("otel-rl serve: %s", NO_TOKEN_WARNING)
    web.run_app(app, host=host, port=port, print=None, auto_decompress=False, access_log=None, keepalive_timeout=HEADER_TIMEOUT_S)
    storage.close()
