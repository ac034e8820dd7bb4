"""The server's aiohttp application: :class:`Handlers` answers the routes of :data:`otel_rl.readers.server.routes.ROUTES`
(with :class:`~otel_rl.readers.server.run_files.RunFiles` and :class:`~otel_rl.readers.server.run_edits.RunEdits`)."""

from __future__ import annotations

import asyncio
import hmac
import logging
import multiprocessing
import os
import time
import zlib
from collections.abc import AsyncIterator
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from otel_rl.formats import schema
from otel_rl.readers.server import export, queries, summaries
from otel_rl.readers.server.answers import error, file_name, run_id_of
from otel_rl.readers.server.decoding import decoded_rows, decompress, exit_with, prepare, refusals, unpickled
from otel_rl.readers.server.run_edits import RunEdits
from otel_rl.readers.server.routes import route_table
from otel_rl.readers.server.run_files import RunFiles
from otel_rl.readers.server.storage import OtherRun, Row, Storage, StorageUnavailable
from otel_rl.readers.server.validation import Invalid

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
RETRY_AFTER_S = 5
HEALTH_PROBE_S = 5.0


@dataclass(frozen=True)
class Limits:
    """What one request may cost the server."""

    max_body_bytes: int = 8 * 1024 * 1024
    max_decompressed_bytes: int = 64 * 1024 * 1024
    read_timeout_s: float = 30.0
    max_uploads: int = 64
    """Bodies being decoded and stored at once; past it, 503."""
    max_reading: int = 1024
    """Bodies arriving at once (each at most ``max_body_bytes``); past it, 503."""
    max_trace_bytes: int = 256 * 1024 * 1024
    """A run's trace, decompressed, at most (``otel-rl serve --max-trace-mb``); a larger one is refused with 413."""
    max_media_bytes: int = 64 * 1024 * 1024
    """One video or image at most (``otel-rl serve --max-media-mb``); a larger one is refused with 413."""


def _unit(key: str) -> str:
    try:
        unit = schema.metric_spec(key).unit
    except schema.SchemaError:  # a key outside the schema's namespaces: no unit to say
        return ""
    return "" if unit in ("1", "") else unit


def _unavailable(message: str) -> web.Response:
    return error(503, message, headers={"Retry-After": str(RETRY_AFTER_S)})


async def _each(batches: list[list[Row]] | AsyncIterator[list[Row]]) -> AsyncIterator[list[Row]]:
    """Iterate a list or an async generator of row batches alike."""
    if isinstance(batches, list):
        for rows in batches:
            yield rows
    else:
        async for rows in batches:
            yield rows


class Handlers:
    """The routes of one server over ``storage``, and what they share (touched on the event loop only, but ``unhealthy``).

    ``decode_processes`` > 0 decodes bodies on that many worker processes
    (started with ``forkserver``); 0 decodes on threads of this process.
    """

    def __init__(self, storage: Storage, token: str | None, lost_after_s: float, limits: Limits, decode_processes: int) -> None:
        self.storage, self.limits, self.lost_after_s = storage, limits, lost_after_s
        self.expected = f"Bearer {token}".encode() if token else None
        self.uploads = self.reading = 0
        self.unhealthy: str | None = None
        """Why the database cannot take writes now (None: it can)."""
        self.stopping = False
        self.database = ThreadPoolExecutor(max_workers=getattr(storage, "threads", 1), thread_name_prefix="otel-rl-db")
        self.decoding = ThreadPoolExecutor(max_workers=2, thread_name_prefix="otel-rl-decode")
        self.processes = None
        if decode_processes > 0:
            self.processes = ProcessPoolExecutor(max_workers=decode_processes, mp_context=multiprocessing.get_context("forkserver"),
                                                 initializer=exit_with, initargs=(os.getpid(),))  # fmt: skip

    def application(self) -> web.Application:
        app = web.Application(client_max_size=self.limits.max_body_bytes, middlewares=[self.authorize])
        app.cleanup_ctx.append(self.background)
        app.add_routes(route_table(handlers=self, files=RunFiles(self), edits=RunEdits(self)))
        app.router.add_static("/static", STATIC)
        return app

    @web.middleware
    async def authorize(self, request: web.Request, handler: Any) -> web.StreamResponse:
        # The page and its files hold no run data: only the API needs the token (the page asks for it).
        if self.expected is not None and request.path.startswith("/api/"):
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, self.expected):
                return error(401, "missing or wrong bearer token")
        # A NUL in a parameter or the path: no database stores it (PostgreSQL refuses it mid-query).
        for name, value in (*request.match_info.items(), *request.query.items()):
            if "\x00" in value or "\x00" in name:
                return error(400, f"parameter {name.replace(chr(0), '')!r} holds a NUL character", field=name.replace("\x00", ""))
        try:
            return await handler(request)
        except StorageUnavailable as exc:  # a query the database cannot answer now
            self.unhealthy = exc.reason
            return _unavailable(f"the database cannot answer: {exc.reason}")

    async def off_loop(self, executor: Executor, fn: Any, *args: Any) -> Any:
        if self.stopping:  # the executors are going away: come back later
            raise StorageUnavailable("the server is shutting down")
        return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)

    async def store(self, rows: list[Row]) -> tuple[int, int]:
        try:
            result = await self.off_loop(self.database, self.storage.ingest, rows, time.time())
        except StorageUnavailable as exc:
            self.unhealthy = exc.reason
            raise
        self.unhealthy = None
        return result

    # -- ingest -----------------------------------------------------------

    async def ingest(self, request: web.Request) -> web.Response:
        limits = self.limits
        if self.unhealthy is not None:
            return _unavailable(f"the database cannot take writes: {self.unhealthy}")
        if self.reading >= limits.max_reading:
            response = _unavailable(f"{limits.max_reading} bodies arriving")
            response.force_close()  # the body is never read: the connection goes with the answer
            return response
        self.reading += 1
        try:
            body = await asyncio.wait_for(request.read(), limits.read_timeout_s)
        except web.HTTPRequestEntityTooLarge:
            return error(413, f"body larger than {limits.max_body_bytes} bytes")
        except asyncio.TimeoutError:
            response = error(408, f"the body did not arrive within {limits.read_timeout_s:.0f} s")
            response.force_close()
            return response
        finally:
            self.reading -= 1
        if self.uploads >= limits.max_uploads:  # a slot for decoding and storing, taken once the body is here
            return _unavailable(f"{limits.max_uploads} uploads in progress")
        self.uploads += 1
        try:
            return await self._ingest(request.headers.get("Content-Encoding", "identity").lower(), body)
        finally:
            self.uploads -= 1

    async def _ingest(self, encoding: str, body: bytes) -> web.Response:
        if encoding not in ("gzip", "identity"):
            return error(400, f"unsupported Content-Encoding {encoding!r}", "Content-Encoding")
        limit = self.limits.max_decompressed_bytes
        accepted = duplicates = 0
        rejected: list[dict[str, Any]] = []
        try:
            batches: Any
            if self.processes is not None:
                pickled, refused = await self.off_loop(self.processes, prepare, body, encoding == "gzip", limit)
                rejected = refusals(refused)
                batches = unpickled(pickled, self.decoding, self.off_loop)
            else:
                if encoding == "gzip":
                    body = await self.off_loop(self.decoding, decompress, body, limit)
                batches = decoded_rows(body, self.decoding, self.off_loop, rejected)
            async for rows in _each(batches):
                if rows:
                    stored = await self.store(rows)
                    accepted, duplicates = accepted + stored[0], duplicates + stored[1]
        except OverflowError:
            return error(413, f"decompressed body larger than {limit} bytes")
        except zlib.error:
            return error(400, "body is not valid gzip", "$")
        except Invalid as exc:
            return error(400, exc.message, exc.shown())
        except StorageUnavailable as exc:
            return _unavailable(f"the database cannot take writes: {exc.reason}")
        except OtherRun as exc:
            return error(409, exc.message, "run_id")
        answer: dict[str, Any] = {"accepted": accepted, "duplicates": duplicates}
        if rejected:
            answer["rejected"] = rejected
        return web.json_response(answer)

    # -- queries ----------------------------------------------------------

    async def runs(self, request: web.Request) -> web.Response:
        try:
            limit = int(request.query.get("limit", "100"))
            only = queries.run_filter(request.query)
        except queries.BadQuery as exc:
            return error(400, str(exc), exc.field)
        except ValueError:
            return error(400, "limit must be an integer", "limit")
        try:
            keys = summaries.summary_keys(request.query)
        except ValueError as exc:
            return error(400, str(exc), "summary")
        every = "*" in keys  # the last value of every key (for notebooks): a second query per page
        keys = [key for key in keys if key != "*"]
        after = request.query.get("after") or None
        page = await self.off_loop(self.database, self.storage.runs, limit, after, only, keys)
        if every and page:
            last = await self.off_loop(self.database, self.storage.last_values, [entry["run_id"] for entry in page])
            for entry in page:
                entry["last"] = last.get(entry["run_id"], {})
        more = len(page) == max(1, min(limit, 1000))
        return web.json_response({"runs": page, "next": page[-1]["run_id"] if page and more else None})

    async def facets(self, request: web.Request) -> web.Response:
        """The distinct projects and groups of the runs, for the page's filters."""
        return web.json_response(await self.off_loop(self.database, self.storage.facets))

    async def one_run(self, request: web.Request) -> web.Response:
        run_id = run_id_of(request)
        try:
            latest = queries.events_limit(request.query)
        except queries.BadQuery as exc:
            return error(400, str(exc), exc.field)
        info = await self.off_loop(self.database, self.storage.run, run_id)
        if info is None:
            return error(404, f"no run {run_id!r}")
        if latest is None:
            events = await self.off_loop(self.database, self.storage.records, run_id, "event")
            return web.json_response({"run": info, "events": events, "events_total": len(events)})
        events, total = await self.off_loop(self.database, self.storage.events, run_id, latest)
        return web.json_response({"run": info, "events": events, "events_total": total})

    async def keys(self, request: web.Request) -> web.Response:
        """The run's keys, and the unit the schema gives each (``ms``, ``s``, ``By``, ``%``...; none for a plain number)."""
        keys = await self.off_loop(self.database, self.storage.keys, run_id_of(request))
        return web.json_response({"keys": keys, "units": {key: unit for key in keys if (unit := _unit(key))}})

    async def scalars(self, request: web.Request) -> web.Response:
        run_id = run_id_of(request)
        if "max_points" not in request.query and "x" not in request.query and len(request.query.getall("key", [])) == 1:
            key = request.query["key"]  # one key, as stored: every point with its axes
            return web.json_response({"key": key, "points": await self.off_loop(self.database, self.storage.series, run_id, key)})
        try:
            keys, axis, max_points = queries.curve_request(request.query)
        except queries.BadQuery as exc:
            return error(400, str(exc), exc.field)
        series = await self.off_loop(self.database, self.curves, run_id, keys, axis, max_points)
        return web.json_response({"x": axis, "max_points": max_points, "series": series})

    async def export(self, request: web.Request) -> web.Response:
        """Every point of the run's keys (all, or those named by ``key``), one column per key (:mod:`.export`)."""
        run_id = run_id_of(request)
        try:
            name = export.check_format(request.query.get("format", "json"))
        except export.BadFormat as exc:
            return error(400, str(exc), "format")
        body = await self.off_loop(self.database, self.exported, run_id, request.query.getall("key", []), name)
        if body is None:
            return error(404, f"no run {run_id!r}")
        disposition = {} if name == "json" else {"Content-Disposition": f'attachment; filename="{file_name(run_id)}.{name}"'}
        return web.Response(body=body, content_type=export.FORMATS[name], headers=disposition)

    def exported(self, run_id: str, keys: list[str], name: str) -> bytes | None:
        """The run's table in format ``name`` (on the database thread), or None without such a run."""
        if self.storage.run(run_id) is None:
            return None
        series = {}
        for key in keys or self.storage.keys(run_id):
            columns = self.storage.curve(run_id, key)
            series[key] = columns if len(columns["seq"]) else queries.columns_of(self.storage.series(run_id, key))
        return export.encode(export.wide(series), name)

    def curves(self, run_id: str, keys: list[str], axis: str, max_points: int) -> dict[str, Any]:
        """Each key's curve against ``axis``, thinned to ``max_points`` (on the database thread)."""
        out = {}
        for key in keys:
            columns = self.storage.curve(run_id, key)
            if not len(columns["seq"]):  # stored before point blocks existed: read out of the records
                columns = queries.columns_of(self.storage.series(run_id, key))
            out[key] = queries.curve(columns, axis, max_points)
        return out

    async def server_info(self, request: web.Request) -> web.Response:
        token_required = self.expected is not None
        return web.json_response({"token_required": token_required, "warning": None if token_required else NO_TOKEN_WARNING, "phases": PHASE_KEYS})

    async def page(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    async def healthz(self, request: web.Request) -> web.Response:
        if self.unhealthy is not None:
            return web.json_response({"ok": False, "error": self.unhealthy}, status=503)
        return web.json_response({"ok": True})

    # -- the server's life ------------------------------------------------

    async def background(self, app: web.Application) -> AsyncIterator[None]:
        """Probe the database and mark silent runs lost while serving; then let the executors go."""
        self.unhealthy = await self.off_loop(self.database, self.storage.health)
        if self.unhealthy is not None:
            _logger.warning("the database cannot take writes (%s): ingest answers 503 until it can", self.unhealthy)
        task = asyncio.create_task(self.probe_and_sweep())
        yield
        task.cancel()
        self.stopping = True
        self.database.shutdown(wait=True)
        self.decoding.shutdown(wait=True)
        if self.processes is not None:
            self.processes.shutdown(wait=True, cancel_futures=True)

    async def probe_and_sweep(self) -> None:
        last_probe = 0.0
        while True:
            await asyncio.sleep(max(min(self.lost_after_s / 4, HEALTH_PROBE_S), 0.05))
            try:
                if time.monotonic() - last_probe >= HEALTH_PROBE_S or self.unhealthy is not None:
                    last_probe = time.monotonic()
                    self.unhealthy = await self.off_loop(self.database, self.storage.health)
                lost = await self.off_loop(self.database, self.storage.mark_lost, self.lost_after_s)
            except StorageUnavailable as exc:
                self.unhealthy = exc.reason
                continue
            if lost:
                shown = ", ".join(lost[:5]) + (" ..." if len(lost) > 5 else "")
                _logger.warning("%d runs sent nothing for %.0f s: marked lost (%s)", len(lost), self.lost_after_s, shown)


def create_app(storage: Storage, token: str | None = None, lost_after_s: float = 60.0, decode_processes: int = 0, **limits: Any) -> web.Application:
    """The aiohttp application over ``storage``. Serve it with ``auto_decompress=False`` (see :class:`otel_rl.readers.server.IngestServer`).

    ``limits``: the fields of :class:`Limits`; ``decode_processes``: see :class:`Handlers`.
    """
    return Handlers(storage, token, lost_after_s, Limits(**limits), decode_processes).application()
