"""What every route of the server shares: the run a request names, its error answer, a download's file name."""

from __future__ import annotations

from typing import Any

from aiohttp import web


def run_id_of(request: web.Request) -> str:
    """The run a request names: in its path, else its ``run_id`` parameter (a run named "." or ".." has no path of its own)."""
    return request.match_info.get("run_id") or request.query.get("run_id", "")


def error(status: int, message: str, field: str | None = None, headers: dict[str, str] | None = None) -> web.Response:
    """``{"error": message, "field": field}`` with ``status``: what every refusal of the API looks like."""
    body: dict[str, Any] = {"error": message}
    if field is not None:
        body["field"] = field
    return web.json_response(body, status=status, headers=headers)


def file_name(run_id: str) -> str:
    """A run id as a download's file name (no path separators, quotes or control characters)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id)[:120].strip(".") or "run"
