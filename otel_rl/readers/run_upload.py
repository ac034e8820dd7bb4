"""A run folder's trace and diagnosis sent to a server (``otel-rl backfill``): every part as one trace, and what analyze says.

The server keeps them with the run (:mod:`otel_rl.readers.server.run_files`):
its page shows the verdict and the per-phase tables, and hands the trace to
ui.perfetto.dev, for runs whose folder is on another machine.
"""

from __future__ import annotations

import gzip
import json
import tempfile
import time
import http.client
import urllib.parse
from pathlib import Path
from typing import Any

from otel_rl.base.http_post import Poster, PostError
from otel_rl.readers.analysis import analyze, trace_files
from otel_rl.readers.analysis.merge import merge_parts
from otel_rl.run import files
from otel_rl.run.jsonl import read_records


class UploadError(RuntimeError):
    """The server refused the trace or the diagnosis (its answer), or could not be reached."""

    diagnosis_sent = False
    """The trace was not sent, but its diagnosis was, on its own (it is small: a server or proxy that refuses a large trace takes it)."""


def run_id_of(run_dir: Path) -> str | None:
    """The run id the folder's ``metrics.jsonl`` records carry."""
    try:
        return next((r["run_id"] for r in read_records(run_dir / files.JSONL_FILE) if isinstance(r.get("run_id"), str)), None)
    except OSError:
        return None


def upload(
    run_dir: Path, url: str, token: str | None, timeout_s: float = 300.0, retry_window_s: float = 60.0, diagnosis_sent: Any = None,
) -> tuple[int, str] | None:
    """Send the folder's trace (its parts merged) and its analysis; returns (trace bytes, bottleneck), None without a trace.

    A server that cannot take them now (unreachable, restarting: 5xx, 408, 429) is tried again, with growing
    pauses, for ``retry_window_s``; a refusal (a wrong token, a bad body) or an answer that is not the API's
    (a login page) is not. The diagnosis goes first: a trace that is not sent (refused, or failing past the
    window) does not cost it (the error then says ``diagnosis_sent``). ``diagnosis_sent(bottleneck, until)``: called
    once the diagnosis is in, before the trace (``until``: ``time.time()`` at which its tries end; ``verdict``: the
    trace's, :func:`trace_verdict`).

    Raises:
        UploadError: the server refused either, answered something else, or could not be reached in the window.
    """
    run_id = run_id_of(run_dir)
    try:
        parts = trace_files(run_dir)
    except FileNotFoundError:
        return None
    if run_id is None:
        return None
    report = analyze(run_dir, engine="python")
    with tempfile.TemporaryDirectory() as folder:
        merged = Path(folder) / "merged.perfetto-trace"
        if len(parts) > 1:
            merge_parts(parts, merged)
        trace = (merged if len(parts) > 1 else parts[0]).read_bytes()
    base = f"{url.rstrip('/')}/api/v1/run"
    trace_id = _trace_id_of(run_dir)  # the server refuses it for another run that holds the same run id
    query = urllib.parse.urlencode({"run_id": run_id, **({"trace_id": trace_id} if trace_id else {})})
    give_up = time.monotonic() + retry_window_s
    diagnosis = json.dumps(report.to_json()).encode()
    # The diagnosis first: small, and what the run's page and its verdict read; a trace the server keeps failing
    # (a 5xx that lasts the retry window) or refuses (413) then costs only itself.
    diagnosis_failed: UploadError | None = None
    try:
        _put(f"{base}/diagnosis?{query}", diagnosis, token, timeout_s, give_up)
    except UploadError as exc:
        diagnosis_failed = exc
    else:
        if diagnosis_sent is not None:
            diagnosis_sent(report.diagnosis.bottleneck if report.diagnosis else "", time.time() + max(give_up - time.monotonic(), 0.0), trace_verdict(report))
    try:
        _put(f"{base}/trace?{query}", trace, token, timeout_s, give_up)
    except UploadError as trace_failed:
        if diagnosis_failed is not None:
            raise trace_failed from None  # refused alike (a wrong token, another run's id): the trace's reason says it
        trace_failed.diagnosis_sent = True
        raise
    if diagnosis_failed is not None:
        raise diagnosis_failed
    return len(trace), report.diagnosis.bottleneck if report.diagnosis else ""


def trace_verdict(report: Any) -> dict[str, Any]:
    """The trace's verdict as the service keeps it (``text``, ``side``, ``phase``, ``rank``): what ``read.runs`` reads of the folder too."""
    diagnosis = report.diagnosis
    if diagnosis is None:
        return {}
    verdict = {"source": "trace", "text": diagnosis.bottleneck, "side": diagnosis.side, "phase": diagnosis.phase}
    if diagnosis.rank is not None:
        verdict["rank"] = diagnosis.rank
    return verdict


def _trace_id_of(run_dir: Path) -> str | None:
    """The run's trace id, from its ``run_config.json`` (None when it has none)."""
    try:
        trace_id = json.loads((run_dir / files.CONFIG_FILE).read_text()).get("trace_id")
    except (OSError, ValueError, AttributeError):
        return None
    return trace_id if isinstance(trace_id, str) and len(trace_id) == 32 else None


class _Again(UploadError):
    """The server could not take it now: worth another try."""


_AGAIN_STATUSES = frozenset((408, 429, 500, 502, 503, 504))


def _put(address: str, data: bytes, token: str | None, timeout_s: float, give_up: float) -> None:
    """PUT ``data`` (gzip'd) to ``address``, tried again until ``give_up`` (monotonic) while the server cannot take it now."""
    body = gzip.compress(data, 6)
    pause, began = 0.5, time.monotonic()
    while True:
        try:
            _put_once(address, body, token, timeout_s)
            return
        except _Again as exc:
            if time.monotonic() + pause > give_up:
                raise UploadError(f"{exc} (tried until the retry window closed)") from None
            time.sleep(pause)
            # Every few seconds while a restart is likely (the first minute), then every 30 s for the rest of the window.
            pause = min(pause * 2, 8.0 if time.monotonic() - began < 60 else 30.0)


def _put_once(address: str, body: bytes, token: str | None, timeout_s: float) -> None:
    """One PUT, its whole request (connecting, sending, the answer) within ``timeout_s``: a server that trickles its
    answer cannot hold the upload (:class:`otel_rl.base.http_post.Poster`)."""
    headers = {"Content-Encoding": "gzip", "Content-Type": "application/octet-stream"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    poster = Poster(address, headers)
    try:
        answer = poster.post(body, timeout_s, method="PUT")
    except PostError as exc:
        raise _Again(f"the server cannot be reached: {exc}") from None
    finally:
        poster.close()
    kind, text = answer.headers.get("content-type", ""), answer.body
    if answer.status >= 300:
        try:
            reason = json.loads(text).get("error")
        except (ValueError, AttributeError):
            reason = http.client.responses.get(answer.status, "")
        error = _Again if answer.status in _AGAIN_STATUSES else UploadError
        raise error(f"the server answered {answer.status}: {reason}")
    try:
        stored = json.loads(text)
    except ValueError:
        stored = None
    if not isinstance(stored, dict) or "bytes" not in stored:  # a proxy's login page answers 200 too
        start = text[:60].decode("utf-8", "replace").split("\n")[0].strip()
        raise UploadError(f"the server answered with {kind or 'no content type'} ({start!r}), not otel-rl's API (a login page or a proxy in the way?)")