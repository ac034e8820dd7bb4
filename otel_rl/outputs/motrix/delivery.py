"""Delivering encoded records to a ``motrix.metrics/v1`` ingest service, one bad record at a time.

:func:`send` posts a batch and sorts every record into an :class:`Outcome`:
accepted (or already held), rejected by the service, refused with the whole
request (401, 403, 404...), or still to deliver after a transient failure.
A 400 never costs its batch: the record it names (``$.records[N]...``) is
set aside and the rest sent again; an answer that names none is split in
halves until the offending records stand alone. A 413 is split the same
way. A 200 may list ``rejected`` records (per-record outcomes); the others
were stored. A 2xx whose body is not an ingest answer (an HTML page from a
proxy or a wrong URL) stores nothing: the request counts as refused. Shared by the live sender and ``otel-rl backfill``.
"""

from __future__ import annotations

import email.utils
import json
import re
import time
from collections import deque
from dataclasses import dataclass, field

try:  # ISA-L's gzip: a third of zlib's CPU for a body no larger, the same format
    from isal.igzip import compress
except ImportError:  # a platform without its wheel
    from gzip import compress

from otel_rl.formats.protocol import PROTOCOL, batch_body
from otel_rl.base.http_post import Poster, PostError
from otel_rl.outputs.motrix.record_queue import Item

RETRYABLE = frozenset({408, 429}) | frozenset(range(500, 600))
RETRY_AFTER_CAP_S = 60.0
_RECORD_INDEX = re.compile(r"^\$\.records\[(\d+)\]")


def retry_after_s(value: str | None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (seconds or HTTP date), capped."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value).timestamp()
        except (TypeError, ValueError):
            return None
        seconds = when - time.time()
    return min(max(seconds, 0.0), RETRY_AFTER_CAP_S)


@dataclass
class Outcome:
    """What became of each record of a batch."""

    stored: int = 0
    """Records the service took (new ones and duplicates it already held)."""
    duplicates: int = 0
    rejected: list[tuple[Item, str]] = field(default_factory=list)
    """Records the service refused as invalid, with its reason."""
    refused: list[Item] = field(default_factory=list)
    """Records refused with the whole request (a wrong token, say): ``refused_reason`` says why."""
    refused_reason: str = ""
    failed: list[Item] = field(default_factory=list)
    """Records still to deliver after a transient failure (``error`` says which)."""
    error: str = ""
    retry_after_s: float | None = None


def send(poster: Poster, items: list[Item], timeout_s: float) -> Outcome:
    """Deliver ``items`` (in order), isolating the records the service refuses."""
    outcome = Outcome()
    parts: deque[list[Item]] = deque([items])
    while parts:
        part = parts.popleft()
        # Level 1: a fraction of the CPU of the higher levels for a body a little larger (JSON records compress well at any level).
        body = compress(batch_body([line for _, line in part]), compresslevel=1)
        try:
            answer = poster.post(body, timeout_s)
        except PostError as exc:
            outcome.failed = [item for rest in (part, *parts) for item in rest]
            outcome.error = str(exc)
            return outcome
        status = answer.status
        if 200 <= status < 300 and not _is_answer(answer.body):
            # A proxy's login page, a wrong URL: nothing says the records were stored.
            outcome.refused = [item for rest in (part, *parts) for item in rest]
            outcome.refused_reason = f"HTTP {status} that is not a {PROTOCOL} answer ({_content(answer)})"
            return outcome
        if 200 <= status < 300:
            _stored(outcome, part, answer.body)
        elif status in (400, 413):
            reason, index = _refusal(answer.body, status)
            if len(part) == 1:
                outcome.rejected.append((part[0], reason))
            elif index is not None and index < len(part):
                outcome.rejected.append((part[index], reason))
                parts.appendleft(part[:index] + part[index + 1 :])
            else:
                half = len(part) // 2
                parts.extendleft((part[half:], part[:half]))
        elif status in RETRYABLE:
            outcome.failed = [item for rest in (part, *parts) for item in rest]
            outcome.error = f"HTTP {status}"
            if status in (429, 503):
                outcome.retry_after_s = retry_after_s(answer.headers.get("retry-after"))
            return outcome
        else:
            outcome.refused = [item for rest in (part, *parts) for item in rest]
            outcome.refused_reason = f"HTTP {status}: {_error_text(answer.body)}"
            return outcome
    return outcome


def _is_answer(body: bytes) -> bool:
    """Whether a 2xx body is an ingest answer: a JSON object counting the ``accepted`` records."""
    try:
        answer = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(answer, dict) and isinstance(answer.get("accepted"), int) and not isinstance(answer["accepted"], bool)


def _content(answer) -> str:
    kind = answer.headers.get("content-type", "no content type")
    return f"{kind[:60]}, {len(answer.body)} bytes"


def _stored(outcome: Outcome, part: list[Item], body: bytes) -> None:
    try:
        answer = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        answer = {}
    rejected = answer.get("rejected") if isinstance(answer, dict) else None
    refused_indexes: set[int] = set()
    if isinstance(rejected, list):
        for entry in rejected:
            if isinstance(entry, dict) and isinstance(entry.get("index"), int) and 0 <= entry["index"] < len(part):
                refused_indexes.add(entry["index"])
                outcome.rejected.append((part[entry["index"]], _reason(entry)))
    outcome.stored += len(part) - len(refused_indexes)
    if isinstance(answer, dict) and isinstance(answer.get("duplicates"), int):
        outcome.duplicates += answer["duplicates"]


def _refusal(body: bytes, status: int) -> tuple[str, int | None]:
    """(reason, index of the record the answer names, if any)."""
    try:
        answer = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return f"HTTP {status}", None
    if not isinstance(answer, dict):
        return f"HTTP {status}", None
    reason = _reason(answer) or f"HTTP {status}"
    found = _RECORD_INDEX.match(str(answer.get("field", "")))
    return reason, int(found.group(1)) if found else None


def _reason(answer: dict) -> str:
    error, where = str(answer.get("error", ""))[:300], str(answer.get("field", ""))[:200]
    return f"{where}: {error}" if where else error


def _error_text(body: bytes) -> str:
    try:
        answer = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body[:200].decode("utf-8", "replace")
    return _reason(answer) if isinstance(answer, dict) else str(answer)[:200]
