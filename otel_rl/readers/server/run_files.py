"""A run's trace and diagnosis, kept with the run: ``PUT`` and ``GET /api/v1/runs/{run_id}/trace`` and ``/diagnosis``.

``trace``: the run's Perfetto trace (every part merged, as ``otel-rl analyze
--merged-trace`` writes it), at most the server's ``max_trace_bytes`` (256 MiB unless ``--max-trace-mb`` says) (gzip
``Content-Encoding`` accepted, inflated within the same bound), downloaded
as ``<run id>.perfetto-trace`` for ui.perfetto.dev. ``diagnosis``: what
``otel-rl analyze --json`` says of it (a JSON object with ``diagnosis`` and
``timelines``), at most :data:`MAX_DIAGNOSIS_BYTES`. Both are sent by
``otel-rl backfill``, need the token like every route of the API, belong to
a run the server knows (404 otherwise), and replace what was there; one sent
with a ``trace_id`` other than the run's (a second run that reused its run id)
is refused with 409.

``media/<name>``: a video or image of the run (``PUT`` and ``GET
/api/v1/runs/{run_id}/media/{name}``), at most the server's ``max_media_bytes``
(64 MiB unless ``--max-media-mb`` says), of a format the protocol's ``media``
record names and whose bytes are that format's; ``GET /api/v1/runs/{run_id}/media``
lists the run's ``media`` records, each with ``uploaded``.

``GET /api/v1/compare?runs=a,b,c`` puts each run's diagnosis beside the first
one's as ``otel-rl analyze --compare`` does (its verdict and tables): a run
without a diagnosis is named in ``missing``.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from typing import Any

from aiohttp import web

from otel_rl.formats.protowire import TRACE_PACKET, length_delimited, read_varint
from otel_rl.readers.analysis.compare import compare_reports
from otel_rl.formats.report import Regime, Report
from otel_rl.run.media import CONTENT_TYPES
from otel_rl.readers.server.answers import error, file_name, run_id_of
from otel_rl.readers.server.storage import other_run

MAX_DIAGNOSIS_BYTES = 8 * 1024 * 1024
TRACE = "trace.perfetto-trace"
DIAGNOSIS = "diagnosis.json"


class TooLarge(ValueError):
    """A body past its bound."""


async def read_bounded(request: web.Request, limit: int, timeout_s: float) -> bytes:
    """The request's body, inflated when gzip, refused past ``limit`` bytes either way (no more is read or inflated)."""
    gzip = request.headers.get("Content-Encoding", "identity").lower() == "gzip"
    inflate = zlib.decompressobj(wbits=31) if gzip else None
    parts, size = [], 0

    async def read() -> None:
        nonlocal size
        async for chunk in request.content.iter_chunked(1 << 20):
            if inflate is not None:
                chunk = inflate.decompress(chunk, limit + 1 - size)
            size += len(chunk)
            if size > limit:
                raise TooLarge(f"larger than {limit} bytes")
            parts.append(chunk)

    await asyncio.wait_for(read(), timeout_s)
    if inflate is not None and not inflate.eof:
        raise zlib.error("the gzip stream ends before its end (truncated)")
    return b"".join(parts)


class RunFiles:
    """The routes of a run's files, over the server's handlers (their storage, database threads and limits)."""

    def __init__(self, handlers: Any) -> None:
        self.handlers = handlers

    async def _put(self, request: web.Request, name: str, limit: int, check: Any) -> web.Response:
        run_id = run_id_of(request)
        handlers = self.handlers
        if request.headers.get("Content-Encoding", "identity").lower() not in ("gzip", "identity"):
            return error(400, "Content-Encoding must be gzip or identity", "Content-Encoding")
        try:
            data = await read_bounded(request, limit, handlers.limits.read_timeout_s)
        except TooLarge as exc:
            response = error(413, f"{name} {exc}")
            response.force_close()  # the rest of the body is never read
            return response
        except zlib.error as exc:
            return error(400, f"the body is not complete gzip ({exc})", "Content-Encoding")
        except asyncio.TimeoutError:
            return error(408, f"the body did not arrive within {handlers.limits.read_timeout_s:.0f} s")
        problem = await asyncio.get_running_loop().run_in_executor(None, check, data)  # a large trace is walked off the loop
        if problem is not None:
            return error(400, problem, "body")
        sender = request.query.get("trace_id")
        if sender:  # a second run that reused the run id must not replace the first run's trace
            held = await handlers.off_loop(handlers.database, handlers.storage.trace_of, run_id)
            if held and held != sender:
                return error(409, other_run(run_id, held, sender), "trace_id")
        stored = await handlers.off_loop(handlers.database, handlers.storage.put_file, run_id, name, data)
        if not stored:
            return error(404, f"no run {run_id!r}")
        return web.json_response({"run_id": run_id, "file": name, "bytes": len(data)})

    async def _get(self, request: web.Request, name: str) -> bytes | web.Response:
        run_id = run_id_of(request)
        data = await self.handlers.off_loop(self.handlers.database, self.handlers.storage.file, run_id, name)
        return error(404, f"run {run_id!r} has no {name.split('.')[0]}") if data is None else data

    async def put_trace(self, request: web.Request) -> web.Response:
        return await self._put(request, TRACE, self.handlers.limits.max_trace_bytes, _trace_problem)

    async def get_trace(self, request: web.Request) -> web.StreamResponse:
        found = await self._get(request, TRACE)
        if isinstance(found, web.Response):
            return found
        run_id = run_id_of(request)
        return web.Response(body=found, content_type="application/octet-stream",
                            headers={"Content-Disposition": f'attachment; filename="{file_name(run_id)}.perfetto-trace"'})  # fmt: skip

    async def put_diagnosis(self, request: web.Request) -> web.Response:
        """The run's diagnosis from its trace; its verdict replaces the live one as the run's bottleneck, the two reconciled."""
        response = await self._put(request, DIAGNOSIS, MAX_DIAGNOSIS_BYTES, _diagnosis_problem)
        if response.status == 200:
            handlers, run_id = self.handlers, run_id_of(request)
            await handlers.off_loop(handlers.database, self._settle_verdict, run_id)
        return response

    def _settle_verdict(self, run_id: str) -> None:
        """The trace's verdict as the run's bottleneck (on a database thread), beside the last live one and whether they agree."""
        storage = self.handlers.storage
        data, run = storage.file(run_id, DIAGNOSIS), storage.run(run_id)
        if data is None or run is None:
            return
        storage.set_bottleneck(run_id, reconcile(Report.from_json(json.loads(data)), run.get("bottleneck")))

    async def get_diagnosis(self, request: web.Request) -> web.Response:
        found = await self._get(request, DIAGNOSIS)
        return found if isinstance(found, web.Response) else web.Response(body=found, content_type="application/json")


    async def list_media(self, request: web.Request) -> web.Response:
        run_id = run_id_of(request)
        handlers = self.handlers
        records, held = await asyncio.gather(handlers.off_loop(handlers.database, handlers.storage.records, run_id, "media"),
                                             handlers.off_loop(handlers.database, handlers.storage.file_names, run_id, MEDIA_PREFIX))  # fmt: skip
        held = set(held)
        media = [{**{k: v for k, v in r.items() if k not in ("run_id", "writer", "kind")}, "uploaded": r.get("path") in held} for r in records]
        return web.json_response({"run_id": run_id, "media": media})

    async def put_media(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        problem = _media_name_problem(name)
        if problem is not None:
            return error(400, problem, "name")
        return await self._put(request, MEDIA_PREFIX + name, self.handlers.limits.max_media_bytes, lambda data: _media_problem(name, data))

    async def get_media(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        problem = _media_name_problem(name)
        if problem is not None:
            return error(400, problem, "name")
        found = await self._get(request, MEDIA_PREFIX + name)
        if isinstance(found, web.Response):
            return found
        return web.Response(body=found, content_type=CONTENT_TYPES[name.rsplit(".", 1)[1].lower()],
                            headers={"Cache-Control": "private, max-age=3600"})  # fmt: skip

    async def compare(self, request: web.Request) -> web.Response:
        ids = list(dict.fromkeys(r for r in request.query.get("runs", "").split(",") if r))
        if not 2 <= len(ids) <= MAX_COMPARED:
            return error(400, f"runs must name 2 to {MAX_COMPARED} runs, comma-separated", "runs")
        handlers = self.handlers
        found = await handlers.off_loop(handlers.database, self.diagnoses, ids)
        missing = [run_id for run_id in ids if run_id not in found]
        baseline = ids[0]
        if baseline in missing:
            return web.json_response({"baseline": baseline, "comparisons": {}, "missing": missing})
        comparisons = {}
        for run_id in ids[1:]:
            if run_id in found:
                (report, started), (base, base_started) = found[run_id], found[baseline]
                comparisons[run_id] = compare_reports(report, base, same_settings=_same_settings(started, base_started))
        return web.json_response({"baseline": baseline, "comparisons": comparisons, "missing": missing})

    def diagnoses(self, ids: list[str]) -> dict[str, tuple[Report, dict[str, Any]]]:
        """Each run's diagnosis and what it started with (on a database thread), for those that have one."""
        storage, out = self.handlers.storage, {}
        for run_id in ids:
            data = storage.file(run_id, DIAGNOSIS)
            run = storage.run(run_id) if data is not None else None
            if run is not None:
                out[run_id] = (Report.from_json(json.loads(data)), run.get("started") or {})
        return out


MAX_COMPARED = 20
MEDIA_PREFIX = "media/"
_MAGIC = {
    "mp4": lambda d: d[4:8] == b"ftyp",
    "webm": lambda d: d[:4] == b"\x1a\x45\xdf\xa3",
    "gif": lambda d: d[:6] in (b"GIF87a", b"GIF89a"),
    "png": lambda d: d[:8] == b"\x89PNG\r\n\x1a\n",
    "jpg": lambda d: d[:3] == b"\xff\xd8\xff",
    "jpeg": lambda d: d[:3] == b"\xff\xd8\xff",
    "webp": lambda d: d[:4] == b"RIFF" and d[8:12] == b"WEBP",
}


def _media_name_problem(name: str) -> str | None:
    """Why ``name`` is not a media file's name (None: it is one): one path segment, with a format's extension."""
    if not 0 < len(name) <= 255 or name.startswith(".") or "/" in name or "\\" in name:
        return "a media file's name is one path segment of 1 to 255 characters"
    extension = name.rsplit(".", 1)[-1].lower() if "." in name else ""
    if extension not in CONTENT_TYPES:
        return f"a media file's name ends in one of {', '.join('.' + f for f in sorted(CONTENT_TYPES))}"
    return None


def _media_problem(name: str, data: bytes) -> str | None:
    """Why ``data`` is not the file its name says (None: it is)."""
    extension = name.rsplit(".", 1)[1].lower()
    return None if _MAGIC[extension](data) else f"the body is not a {extension.upper()} file"
_SETTINGS = ("family", "total_steps", "num_envs", "config", "command")


def _same_settings(started: dict[str, Any], other: dict[str, Any]) -> bool | None:
    """Whether two runs started with the same settings (and code commit); None when either did not say."""
    if not started or not other:
        return None
    commit = ((started.get("git") or {}).get("commit"), (other.get("git") or {}).get("commit"))
    return commit[0] == commit[1] and all(started.get(k) == other.get(k) for k in _SETTINGS)


def _trace_problem(data: bytes) -> str | None:
    """Why ``data`` is not a Perfetto trace (None: it is one): a ``Trace`` is packets (field 1, length-delimited), end to end.

    Only the framing is walked (no packet is decoded): a trace cut short, or bytes of another kind, are refused.
    """
    if not data:
        return "the trace is empty"
    position = 0
    for tag, start, _, end in length_delimited(data):
        if tag != TRACE_PACKET:
            return f"the body is not a Perfetto trace (byte {start:,} starts no packet)"
        position = end
    if position == len(data):
        return None
    if data[position] != TRACE_PACKET:
        return f"the body is not a Perfetto trace (byte {position:,} starts no packet)"
    try:
        length, body = read_varint(data, position + 1)
    except (IndexError, ValueError):
        return f"the trace is cut short at byte {len(data):,}"
    return f"the trace is cut short: its last packet needs {body + length - len(data):,} more bytes"


def reconcile(report: Report, live: dict[str, Any] | None) -> dict[str, Any]:
    """The trace's verdict as the run's bottleneck: its text, side and phase, the live verdict it replaces, and whether they agree.

    They agree when they name the same side and phase (and rank); a run whose bottleneck moved while it ran ends with
    the verdict of its whole trace, and says so.
    """
    diagnosis = report.diagnosis
    assert diagnosis is not None  # from_json refuses a report without one
    verdict: dict[str, Any] = {"source": "trace", "text": diagnosis.bottleneck, "side": diagnosis.side, "phase": diagnosis.phase}
    if diagnosis.rank is not None:
        verdict["rank"] = diagnosis.rank
    if live is not None and live.get("source") == "trace":
        live = live.get("live")  # a diagnosis sent again: reconciled with the same live verdict
    if live:
        verdict["live"] = {k: live[k] for k in ("text", "side", "phase", "rank", "confidence", "since") if k in live}
        said = (live.get("side") or None, live.get("phase") or None, live.get("rank"))
        same = said == (diagnosis.side, diagnosis.phase, diagnosis.rank)
        verdict["agrees"] = same
        head = next((r for r in report.regimes if r.headline), None)
        whole = f"its steady state ({_iterations(head)})" if head is not None else "the whole run"
        last = report.regimes[-1] if report.regimes else None
        if same:
            verdict["reconciled"] = f"the trace agrees with the live verdict: {diagnosis.bottleneck}"
        elif last is not None and last is not head and (last.side, last.phase) == said[:2]:
            verdict["reconciled"] = (
                f"the trace says {diagnosis.bottleneck} of {whole}; the live verdict at the end, {live.get('text')}, "
                f"is the trace's own of its last regime ({last.kind}, {_iterations(last)}): the bottleneck moved while the run went"
            )
        else:
            verdict["reconciled"] = (
                f"the trace says {diagnosis.bottleneck} of {whole}; the live verdict said {live.get('text')} at the end "
                "(its last seconds): the bottleneck moved while the run went, or the last window was not the run's steady state"
            )
    return verdict


def _iterations(regime: Regime) -> str:
    if regime.first_iteration == regime.last_iteration:
        return f"iteration {regime.first_iteration}"
    return f"iterations {regime.first_iteration}-{regime.last_iteration}"


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (write null)")


def _diagnosis_problem(data: bytes) -> str | None:
    """Why ``data`` is not an analysis report (None: it is one): the shape ``otel-rl analyze --json`` writes, and one that compares."""
    try:
        data = json.loads(data, parse_constant=_no_constant)  # NaN and Infinity: what a browser's JSON.parse refuses
    except RecursionError:
        return "the diagnosis is nested too deeply to be a report"
    except ValueError as exc:
        return f"the diagnosis is not JSON ({str(exc)[:120]})" if "NaN" in str(exc) or "Infinity" in str(exc) else "the diagnosis is not JSON"
    try:
        report = Report.from_json(data)
    except RecursionError:
        return "the diagnosis is nested too deeply to be a report"
    except ValueError as exc:
        return f"the diagnosis is not otel-rl analyze --json's report: {exc}"
    if not report.timelines:
        return "the diagnosis has no timeline: analyze found no iteration in the trace"
    try:  # what the run and compare pages do with it
        compare_reports(report, report, same_settings=None)
    except Exception as exc:  # a shape the comparison cannot read
        return f"the diagnosis does not compare ({type(exc).__name__}: {str(exc)[:200]}); send otel-rl analyze --json's report"
    return None
