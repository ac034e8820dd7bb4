"""What a team writes on its runs: ``PATCH /api/v1/runs/{run_id}`` (tags and a note) and ``DELETE /api/v1/runs/{run_id}``.

A ``PATCH`` body is ``{"tags": ["baseline", ...], "note": "..."}`` (either
may be left out): at most :data:`MAX_TAGS` tags of 1 to :data:`MAX_TAG`
characters, a note of at most :data:`MAX_NOTE`. ``DELETE`` removes the run
and everything stored of it (records, points, summaries, trace, diagnosis);
a run still sending is found again by its next record. Both need the token
like every route of the API, and answer 404 for a run the server does not
know.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

from aiohttp import web

from otel_rl.readers.server.answers import error, run_id_of

MAX_TAGS = 32
MAX_TAG = 64
MAX_NOTE = 10_000
MAX_BODY = 64 * 1024


class RunEdits:
    """The routes that change a run, over the server's handlers (their storage and database threads)."""

    def __init__(self, handlers: Any) -> None:
        self.handlers = handlers

    async def annotate(self, request: web.Request) -> web.Response:
        run_id = run_id_of(request)
        body = await request.content.read(MAX_BODY + 1)
        if len(body) > MAX_BODY:
            return error(413, f"body larger than {MAX_BODY} bytes")
        try:
            tags, note = _edits(json.loads(body or b"{}"))
        except (ValueError, TypeError) as exc:
            return error(400, str(exc), "body")
        handlers = self.handlers
        if not await handlers.off_loop(handlers.database, handlers.storage.annotate, run_id, tags, note):
            return error(404, f"no run {run_id!r}")
        return web.json_response(await handlers.off_loop(handlers.database, handlers.storage.run, run_id))

    async def delete(self, request: web.Request) -> web.Response:
        run_id = run_id_of(request)
        handlers = self.handlers
        if not await handlers.off_loop(handlers.database, handlers.storage.delete, run_id):
            return error(404, f"no run {run_id!r}")
        return web.json_response({"deleted": run_id})


def _edits(body: Any) -> tuple[list[str] | None, str | None]:
    """The tags and note a PATCH body sets (None: left as they are).

    Raises:
        ValueError: a body that is not such an object, naming what is wrong.
    """
    if not isinstance(body, dict) or not set(body) <= {"tags", "note"}:
        raise ValueError('the body must be {"tags": [...], "note": "..."}')
    tags, note = body.get("tags"), body.get("note")
    if tags is not None:
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise ValueError("tags must be a list of strings")
        # One form of each accent (NFC): "été" typed as e and a combining accent is the same tag, and found by ?tag=été.
        tags = list(dict.fromkeys(unicodedata.normalize("NFC", t.strip()) for t in tags if t.strip()))
        if len(tags) > MAX_TAGS or any(len(t) > MAX_TAG for t in tags):
            raise ValueError(f"at most {MAX_TAGS} tags of at most {MAX_TAG} characters each")
    if note is not None and (not isinstance(note, str) or len(note) > MAX_NOTE):
        raise ValueError(f"note must be a string of at most {MAX_NOTE} characters")
    if "\x00" in (note or "") or any("\x00" in t for t in tags or ()):
        raise ValueError("tags and note must not hold a NUL character")
    return tags, note
