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

Query API (JSON): ``GET /api/v1/runs?limit=&after=`` (paged; ``next`` is the
``after`` of the following page), ``/api/v1/runs/{run_id}`` (status and
events), ``/api/v1/runs/{run_id}/keys`` and
``/api/v1/runs/{run_id}/scalars?key=K`` (one series). ``GET /healthz`` needs no
token and answers 503 while the database cannot take writes. A pending or
running run that sends neither records nor heartbeats for ``lost_after_s``
is reported as ``lost`` (one log line per sweep).

The routes are :class:`otel_rl.readers.server.app.Handlers`; :class:`IngestServer`
runs them on a thread, :func:`serve_forever` in the foreground.
"""

from otel_rl.readers.server.app import create_app
from otel_rl.readers.server.serving import IngestServer, serve_forever

__all__ = ["IngestServer", "create_app", "serve_forever"]
