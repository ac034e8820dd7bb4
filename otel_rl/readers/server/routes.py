"""Every route of the server, in one table (:data:`ROUTES`), made into aiohttp's :class:`~aiohttp.web.RouteTableDef`.

A run's routes (``/api/v1/runs/{run_id}...``) have a twin that takes the run
id as a parameter (``/api/v1/run...?run_id=``): a run named ``.`` or ``..``
has no path of its own, since URLs drop dot segments. The package docstring
of :mod:`otel_rl.readers.server` lists them; a test holds it to this table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from otel_rl.formats.protocol import INGEST_PATH

RUN = "/api/v1/runs/{run_id}"
RUN_BY_PARAMETER = "/api/v1/run"


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    """The path; one starting with :data:`RUN` is also served under :data:`RUN_BY_PARAMETER`."""
    owner: str
    """Who answers it: ``handlers`` (:class:`~otel_rl.readers.server.app.Handlers`), ``files``
    (:class:`~otel_rl.readers.server.run_files.RunFiles`) or ``edits`` (:class:`~otel_rl.readers.server.run_edits.RunEdits`)."""
    handler: str
    """The method of the owner that answers it."""

    @property
    def paths(self) -> tuple[str, ...]:
        if self.path.startswith(RUN):
            return self.path, RUN_BY_PARAMETER + self.path[len(RUN) :]
        return (self.path,)


ROUTES: tuple[Route, ...] = (
    Route("POST", INGEST_PATH, "handlers", "ingest"),
    Route("GET", "/api/v1/runs", "handlers", "runs"),
    Route("GET", "/api/v1/facets", "handlers", "facets"),
    Route("GET", RUN, "handlers", "one_run"),
    Route("PATCH", RUN, "edits", "annotate"),
    Route("DELETE", RUN, "edits", "delete"),
    Route("GET", RUN + "/keys", "handlers", "keys"),
    Route("GET", RUN + "/scalars", "handlers", "scalars"),
    Route("GET", RUN + "/export", "handlers", "export"),
    Route("PUT", RUN + "/trace", "files", "put_trace"),
    Route("GET", RUN + "/trace", "files", "get_trace"),
    Route("PUT", RUN + "/diagnosis", "files", "put_diagnosis"),
    Route("GET", RUN + "/diagnosis", "files", "get_diagnosis"),
    Route("GET", RUN + "/media", "files", "list_media"),
    Route("PUT", RUN + "/media/{name}", "files", "put_media"),
    Route("GET", RUN + "/media/{name}", "files", "get_media"),
    Route("GET", "/api/v1/compare", "files", "compare"),
    Route("GET", "/api/v1/server", "handlers", "server_info"),
    Route("GET", "/healthz", "handlers", "healthz"),
    Route("GET", "/", "handlers", "page"),
    Route("GET", "/runs/{run_id}", "handlers", "page"),
    Route("GET", "/run", "handlers", "page"),
    Route("GET", "/compare", "handlers", "page"),
)
"""The server's routes (the page's files are served from ``/static`` besides)."""


def route_table(**owners: Any) -> web.RouteTableDef:
    """:data:`ROUTES` bound to their ``owners`` (``handlers=``, ``files=``, ``edits=``)."""
    table = web.RouteTableDef()
    for route in ROUTES:
        handler = getattr(owners[route.owner], route.handler)
        for path in route.paths:
            table.route(route.method, path)(handler)
    return table
