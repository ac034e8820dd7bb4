"""The ``motrix.metrics/v1`` outputs: the run folder's ``metrics.jsonl`` and the live stream to an ingest service.

``exporter`` (records to protocol documents; the record shapes are
:mod:`otel_rl.formats.protocol`), ``scalar_lines`` (scalars batches as JSON lines,
in C by ``_lines.c`` where it is built), ``jsonl`` (the local copy, which never
drops what the pipeline took), ``http_sender``/``delivery`` (the live stream,
with retries, over :mod:`otel_rl.base.http_post`), ``media_upload`` (the
files of its ``media`` records), ``record_queue`` (its bounded queue) and
``backfill`` (replaying a ``metrics.jsonl`` into the service). The ingest
service is :mod:`otel_rl.readers.server`.
"""
