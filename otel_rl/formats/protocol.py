"""The ``motrix.metrics/v1`` live-metrics protocol: record shapes, shared by client and server.

A record is a JSON object with ``run_id``, ``writer`` (``<hostname>:<tag>:<pid>``),
``seq`` (unique and increasing per writer, starting at the wall clock in
microseconds), ``ts`` (unix seconds) and ``kind``: ``run``, ``scalars``,
``event`` or ``heartbeat`` (``eval`` and ``media`` are reserved). Batches are
``{"protocol": "motrix.metrics/v1", "records": [...]}``. The full contract is
``docs/protocol/motrix-metrics-v1.md``; the JSON Schema ships with the package.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import socket
import time
from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Any

import orjson

PROTOCOL = "motrix.metrics/v1"
INGEST_PATH = "/api/v1/ingest"
REASON_LIMIT_BYTES = 2048


def writer_id(run_id: str, pid: int, started_ns: int) -> str:
    """``<hostname>:<tag>:<pid>`` of the producer ``pid`` writing run ``run_id``, which it started at ``started_ns``.

    The tag (a hash of the run and the start) makes it unique per run and per
    process: two runs served by one agent, or a pid reused, never share a
    writer, so the service's (writer, seq) de-duplication never mistakes one
    run's records for another's. Every agent serving the producer derives the same id.
    """
    tag = hashlib.blake2b(f"{run_id}\0{pid}\0{started_ns}".encode("utf-8", "surrogatepass"), digest_size=4).hexdigest()
    return f"{socket.gethostname()}:{tag}:{pid}"  # the pid last, as the protocol's pattern has it


def seq_counter() -> itertools.count:
    """Sequence numbers for one writer, starting at the wall clock in microseconds.

    A restarted container may reuse hostname and pid; starting from the clock
    keeps its seqs above those of its predecessor, so the service does not take
    new records for duplicates. ``next()`` on it is atomic in CPython.
    """
    return itertools.count(time.time_ns() // 1000)


def record(run_id: str, writer: str, seq: int, ts: float, kind: str, **fields: Any) -> dict[str, Any]:
    """A record with the common fields first (key order is stable for readers and fixtures)."""
    return {"run_id": run_id, "writer": writer, "seq": seq, "ts": ts, "kind": kind, **fields}


def scalars_record(run_id: str, writer: str, seq: int, ts: float, step: int | None, axes: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """``record(..., "scalars", step=..., axes=..., values=...)`` without the keyword merge (a record per ``scalars()`` call)."""
    return {"run_id": run_id, "writer": writer, "seq": seq, "ts": ts, "kind": "scalars", "step": step, "axes": axes, "values": values}


MEDIA_FIELDS = ("key", "type", "path", "format", "bytes", "step", "fps", "frames", "width", "height", "caption")
"""The fields of a ``media`` record, in the order it is written (see the protocol's ``media`` section)."""


def media_fields(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """A ``media`` record's fields from a media event's attributes (those the protocol names; ``step`` always, maybe null)."""
    fields = {name: attributes[name] for name in MEDIA_FIELDS if name in attributes}
    fields.setdefault("step", None)
    return fields


def batch(records: list[Mapping[str, Any]]) -> dict[str, Any]:
    return {"protocol": PROTOCOL, "records": list(records)}


_BATCH_HEAD = f'{{"protocol":"{PROTOCOL}","records":['.encode()


def batch_body(lines: list[str]) -> bytes:
    """The JSON body of a batch made of already encoded records."""
    return _BATCH_HEAD + ",".join(lines).encode("utf-8") + b"]}"


def encode_record(rec: Mapping[str, Any]) -> str:
    """One record as compact JSON (no NaN: values are already null or finite).

    Raises:
        ProtocolError: naming the first field that cannot be encoded (records
            made by otel-rl are JSON-safe by construction: this is the last line of defence).
    """
    try:
        return orjson.dumps(rec).decode()
    except TypeError:  # an int past 64 bits, a key that is not a string...: the standard encoder says what
        pass
    try:
        return json.dumps(rec, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise ProtocolError(_unencodable(rec, "$") or "$", str(exc)[:200]) from None


def _unencodable(value: Any, path: str) -> str | None:
    """JSON path of the first value ``json.dumps`` refuses, or None."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                return f"{path}.{key!r}"
            found = _unencodable(item, f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = _unencodable(item, f"{path}[{index}]")
            if found:
                return found
        return None
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, OverflowError, RecursionError):
        return path
    return None


@cache
def json_schema() -> dict[str, Any]:
    """The JSON Schema of a v1 batch."""
    text = resources.files("otel_rl.formats").joinpath("motrix-metrics-v1.schema.json").read_text()
    return json.loads(text)


class ProtocolError(ValueError):
    """A batch or record that does not follow ``motrix.metrics/v1``; ``field`` names where."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def validate_batch(document: Any) -> list[dict[str, Any]]:
    """The records of a valid batch.

    Raises:
        ProtocolError: naming the first offending field as a JSON path, e.g. ``$.records[2].seq``.
    """
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import best_match

    validator = Draft202012Validator(json_schema())
    error = best_match(validator.iter_errors(document))
    if error is not None:
        raise ProtocolError(error.json_path, error.message)
    return document["records"]
