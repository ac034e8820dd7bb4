"""The ``motrix.metrics/v1`` protocol and its writers.

``protocol`` (the record shapes; the JSON Schema next to it is the one
definition), ``exporter`` (records to protocol documents), ``jsonl`` (the
local copy), ``http_sender``/``http_post``/``delivery`` (the live stream, with
retries), ``record_queue`` (their bounded queues) and ``backfill`` (replaying
a JSONL file into the service). The ingest service is :mod:`otel_rl.readers.server`.
"""
