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

Inflating, decoding and checking (:mod:`otel_rl.readers.server.decoding`, with
:mod:`otel_rl.readers.server.validation` compiled from the protocol's JSON
Schema) never run on the event loop: on decoding processes for ``otel-rl
serve`` (``decode_processes``, so they do not share the GIL with the loop and
the database writes), on decoding threads in an embedded server, where large
bodies are decoded in chunks. Records are stored in chunks of
:data:`~otel_rl.readers.server.decoding.CHUNK_RECORDS`, each in one
transaction, so ``/healthz`` and other requests are served meanwhile. 500 is left for the server's own faults.

A pending or running run that sends neither records nor heartbeats for
``lost_after_s`` is reported as ``lost`` (one log line per sweep). Every
``/api/`` route needs the token; the page and ``/healthz`` (503 while the
database cannot take writes) do not.

Routes (:data:`otel_rl.readers.server.routes.ROUTES`; each ``/api/v1/runs/{run_id}...``
route is also ``/api/v1/run...?run_id=``, for a run named ``.`` or ``..``):

- ``POST /api/v1/ingest``: a batch of records, as above.
- ``GET /api/v1/runs``: the runs, a page at a time (``limit``, ``after``; ``next`` is the following page's ``after``),
  filtered by ``project``, ``group``, ``status``, ``tag``, ``bottleneck`` (a verdict's side, or ``side/phase``).
- ``GET /api/v1/facets``: the projects, groups and bottlenecks of the runs.
- ``GET /api/v1/runs/{run_id}``: a run: its status, what it started with, its ``bottleneck`` (the live verdict, the
  trace's once it was sent), its newest ``events``.
- ``PATCH /api/v1/runs/{run_id}``: its tags and note. ``DELETE /api/v1/runs/{run_id}``: the run and all it holds.
- ``GET /api/v1/runs/{run_id}/keys``: its scalar keys and their units.
- ``GET /api/v1/runs/{run_id}/scalars``: the series of ``key`` (several), against ``x``, at most ``max_points``.
- ``GET /api/v1/runs/{run_id}/export``: its scalars as CSV or Parquet.
- ``PUT /api/v1/runs/{run_id}/trace``, ``GET /api/v1/runs/{run_id}/trace``: its Perfetto trace.
- ``PUT /api/v1/runs/{run_id}/diagnosis``, ``GET /api/v1/runs/{run_id}/diagnosis``: what ``otel-rl analyze`` says of it.
- ``GET /api/v1/runs/{run_id}/media``: its ``media`` records; ``PUT /api/v1/runs/{run_id}/media/{name}``,
  ``GET /api/v1/runs/{run_id}/media/{name}``: a video or image file.
- ``GET /api/v1/compare``: the diagnoses of ``runs`` side by side.
- ``GET /api/v1/server``: whether the server needs a token.
- ``GET /healthz``: whether the database takes writes.
- ``GET /``, ``GET /runs/{run_id}``, ``GET /run``, ``GET /compare``: the web page (its files under ``/static``).

The routes are answered by :class:`otel_rl.readers.server.app.Handlers`; :class:`IngestServer`
runs them on a thread, :func:`serve_forever` in the foreground.
"""

from otel_rl.readers.server.app import create_app
from otel_rl.readers.server.serving import IngestServer, serve_forever

__all__ = ["IngestServer", "create_app", "serve_forever"]
