"""Runs as pandas DataFrames, from run folders or from a server: what :mod:`otel_rl.read` returns.

A source is a run folder (it holds ``metrics.jsonl``), a folder of run
folders, or a server's base URL (``http://host:8080``; its token from
``token=`` or ``MOTRIX_METRICS_TOKEN``). A folder is read from its
``metrics.jsonl``; a server through its API: the runs listing, and each
run's scalars at full resolution from ``/export`` (columnar JSON, one
request per run).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import threading
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import pandas as pd

from otel_rl.base import environment_variables as env
from otel_rl.formats import lifecycle, schema
from otel_rl.base.log import logger
from otel_rl.run import files
from otel_rl.run.jsonl import read_records

_logger = logger(__name__)


def warn(text: str) -> None:
    """One warning of a reader (``otel-rl: ...``), for what it leaves out and goes on without."""
    _logger.warning("otel-rl: %s", text)

REQUEST_TIMEOUT_S = 60.0
"""The most one request to a server takes, all of it (a server that trickles its answer is given up on then)."""
MAX_ANSWER_BYTES = 1 << 30
"""The largest answer read into memory (a run's export; a trace goes to a file)."""
AXES = ("env_steps", "step", "ts")
"""What ``scalars(x=...)`` may index by: env steps, the logging step, or the time (Unix seconds)."""
PAGE = 1000
"""Runs per listing request (the server's largest page)."""


class SourceError(ValueError):
    """A source that is neither a run folder, a folder of them, nor a server that answers."""


def is_server(source: str | os.PathLike[str]) -> bool:
    return isinstance(source, str) and source.startswith(("http://", "https://"))


# -- run folders ---------------------------------------------------------------


def run_folders(source: str | os.PathLike[str]) -> list[Path]:
    """The run folders of ``source``: itself when it holds ``metrics.jsonl``, else its subfolders that do, and theirs
    (the default layout, ``runs/<algorithm>/<run id>``, read from ``runs``)."""
    path = Path(source)
    if (path / files.JSONL_FILE).is_file():
        return [path]
    if not path.is_dir():
        raise SourceError(f"{path} is not a run folder, a folder of run folders, or a server URL")
    found = []
    for child in sorted(p for p in path.iterdir() if p.is_dir()):
        if (child / files.JSONL_FILE).is_file():
            found.append(child)
        else:  # a folder of runs of one algorithm
            with contextlib.suppress(OSError):
                found.extend(sorted(p for p in child.iterdir() if (p / files.JSONL_FILE).is_file()))
    if not found:
        raise SourceError(f"no run folder (a folder with {files.JSONL_FILE}) in {path}")
    return found


def folders_by_run(folders: Sequence[Path]) -> dict[str, Path]:
    """Run folders by the run id their records name (the folder's name where they name none).

    Two folders holding one run id (a sweep whose runs share ``OTEL_RL_RUN_ID``) are two runs:
    each is then named ``<run id>@<folder name>``, said once, so neither hides the other.
    """
    ids = [(next((r["run_id"] for r in records(f)), f.name), f) for f in folders]
    counts: dict[str, int] = {}
    for rid, _ in ids:
        counts[rid] = counts.get(rid, 0) + 1
    shared = sorted(rid for rid, count in counts.items() if count > 1)
    if shared:
        _logger.warning("otel-rl: several run folders hold run %s; each is read as <run id>@<folder name>", ", ".join(map(repr, shared)))
    return {(f"{rid}@{folder.name}" if counts[rid] > 1 else rid): folder for rid, folder in ids}


def records(folder: Path) -> Iterator[dict[str, Any]]:
    """The records of a run folder's ``metrics.jsonl`` (a line cut short by a crash is skipped, with a warning)."""
    return read_records(folder / files.JSONL_FILE)


def folder_scalars(folder: Path) -> pd.DataFrame:
    """A run folder's scalars: a row per scalars record (``seq``, ``ts``, ``step``, ``env_steps``), a column per key."""
    rows = [
        {"seq": r.get("seq"), "ts": r.get("ts"), "step": r.get("step"), "env_steps": (r.get("axes") or {}).get("env_steps"), **r["values"]}
        for r in records(folder)
        if r.get("kind") == "scalars" and isinstance(r.get("values"), dict)
    ]  # fmt: skip
    frame = pd.DataFrame.from_records(rows, columns=None if rows else ["seq", "ts", "step", "env_steps"])
    return frame.sort_values(["ts", "seq"], kind="stable", ignore_index=True) if len(frame) else frame


def folder_run(folder: Path) -> dict[str, Any]:
    """A run folder's row of :func:`runs`, from its run records and its scalars."""
    statuses, verdict = [], None
    for record in records(folder):  # one pass, nothing kept but the run records and the newest verdict
        if record.get("kind") == "run":
            statuses.append(record)
        elif record.get("kind") == "event" and record.get("name") == schema.EVENT_BOTTLENECK and isinstance(record.get("attributes"), dict):
            verdict = record["attributes"]
    verdict = _sent_verdict(folder) or verdict  # the trace's, where it reached a service: what the service says of the run
    started = next((r for r in statuses if r.get("status") == lifecycle.RUNNING), statuses[0] if statuses else {})
    last = statuses[-1] if statuses else {}
    scalars = folder_scalars(folder)
    row = _identity(last.get("run_id", folder.name), last.get("status"), started.get("project"), started.get("group"), started)
    row["start"] = pd.to_datetime(statuses[0]["ts"], unit="s", utc=True) if statuses else pd.NaT
    end_ts = max([r["ts"] for r in statuses] + scalars["ts"].dropna().tolist()) if statuses else None
    row["duration_s"] = end_ts - statuses[0]["ts"] if statuses else None
    row["env_steps"] = scalars["env_steps"].dropna().max() if len(scalars) else None
    row.update(_bottleneck(verdict))
    for key in scalars.columns.drop(["seq", "ts", "step", "env_steps"], errors="ignore"):
        present = scalars[key].dropna()
        row[key] = present.iloc[-1] if len(present) else None
    return row


def _sent_verdict(folder: Path) -> dict[str, Any] | None:
    """The trace's verdict from the folder's upload note, where its diagnosis reached the service; else None."""
    try:
        note = orjson.loads((folder / files.TRACE_UPLOAD_FILE).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    verdict = note.get("verdict") if isinstance(note, dict) and note.get("diagnosis_sent") else None
    return verdict if isinstance(verdict, dict) and verdict.get("text") else None


def folder_events(folder: Path) -> pd.DataFrame:
    return events_frame([r for r in records(folder) if r.get("kind") == "event"])


# -- a server --------------------------------------------------------------------


class Server:
    """A server's read API, with its token.

    Every request is bounded as a whole (``timeout_s``: connecting, the answer's head and its body, however slowly
    they trickle in), and an answer that is not the API's JSON (a proxy's login page, another service) is one
    :class:`SourceError` naming what answered.
    """

    def __init__(self, url: str, token: str | None = None, timeout_s: float | None = None) -> None:
        self.url = url.rstrip("/")
        self.token = token if token is not None else os.environ.get(env.MOTRIX_METRICS_TOKEN) or None
        self.timeout_s = REQUEST_TIMEOUT_S if timeout_s is None else timeout_s

    def get(self, path: str, expect: str | None = None, **query: Any) -> Any:
        """The JSON answer of ``GET path?query`` (repeated parameters as lists); ``expect``: a field the answer must hold.

        Raises:
            SourceError: the server refused (its error message), could not be reached in time, or answered something else.
        """
        address = f"{path}?{urllib.parse.urlencode({k: v for k, v in query.items() if v is not None}, doseq=True)}"
        status, kind, body = self._fetch(address, path)
        if status != 200:
            raise SourceError(f"{self.url} answered {status} to {path}: {_message(body, kind)}")
        try:
            answer = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise SourceError(f"{self.url} answered {path} with {_what(body, kind)}, not otel-rl's API (a login page or a proxy in the way?)") from None
        if expect is not None and (not isinstance(answer, dict) or expect not in answer):
            raise SourceError(f"{self.url} answered {path} with JSON of another shape (no {expect!r}): is it an otel-rl server?")
        return answer

    def _fetch(self, address: str, path: str, into: Path | None = None) -> tuple[int, str, bytes]:
        """``(status, content type, body)`` of ``GET address`` (the body written to ``into`` instead, on 200), within ``timeout_s``."""
        parts = urllib.parse.urlsplit(self.url)
        connection_type = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        connection = connection_type(parts.hostname or "", parts.port, timeout=self.timeout_s)
        expired = threading.Event()

        def expire() -> None:  # a whole request's bound: the blocked read returns when its socket is shut
            expired.set()
            with contextlib.suppress(OSError, AttributeError):
                connection.sock.shutdown(socket.SHUT_RDWR)

        timer = threading.Timer(self.timeout_s, expire)
        timer.daemon = True
        timer.start()
        try:
            connection.request("GET", parts.path.rstrip("/") + address, headers={"Authorization": f"Bearer {self.token}"} if self.token else {})
            answer = connection.getresponse()
            kind = answer.getheader("Content-Type", "")
            if into is not None and answer.status == 200:
                with open(into, "wb") as out:
                    while chunk := answer.read(1 << 20):
                        out.write(chunk)
                return 200, kind, b""
            return answer.status, kind, answer.read(MAX_ANSWER_BYTES)
        except (OSError, http.client.HTTPException) as exc:
            if expired.is_set():
                raise SourceError(f"{self.url} did not answer {path} within {self.timeout_s:.0f} s") from None
            raise SourceError(f"{self.url} cannot be reached: {getattr(exc, 'reason', exc) or type(exc).__name__}") from None
        finally:
            timer.cancel()
            connection.close()

    def trace(self, run_id: str, path: Path, required: bool) -> Path | None:
        """The run's trace from ``GET /api/v1/runs/<id>/trace``, written to ``path``; None when the server has none (unless ``required``).

        Raises:
            SourceError: the server refused, or has no trace of a ``required`` run.
        """
        route = f"/api/v1/runs/{urllib.parse.quote(run_id, safe='')}/trace"
        status, kind, body = self._fetch(route, "/api/v1/runs/<id>/trace", into=path)
        if status == 200:
            return path
        if status == 404 and not required:
            return None
        if status == 404:
            raise SourceError(f"{self.url} has no trace of run {run_id!r} (it is sent when the run ends)")
        raise SourceError(f"{self.url} answered {status} to the trace of {run_id!r}: {_message(body, kind)}")

    def listing(self, **only: Any) -> Iterator[dict[str, Any]]:
        """Every run the server lists that ``only`` (project, group, status) keeps, page after page."""
        after = None
        while True:
            page = self.get("/api/v1/runs", expect="runs", limit=PAGE, after=after, summary="*", **only)
            if not isinstance(page["runs"], list):
                raise SourceError(f"{self.url} answered /api/v1/runs with JSON of another shape ('runs' is no list): is it an otel-rl server?")
            yield from page["runs"]
            after = page.get("next")
            if not after:
                return

    def scalars(self, run_id: str, keys: Sequence[str] | None = None) -> pd.DataFrame:
        columns = self.get("/api/v1/run/export", expect="columns", run_id=run_id, format="json", key=list(keys or []))["columns"]
        return pd.DataFrame(columns)

    def events(self, run_id: str) -> pd.DataFrame:
        return events_frame(self.get("/api/v1/run", expect="events", run_id=run_id)["events"])


def server_run(entry: dict[str, Any]) -> dict[str, Any]:
    """A server listing's entry (with ``summary=*``) as a row of :func:`runs`."""
    started = entry.get("started") or {}
    row = _identity(entry["run_id"], entry.get("status"), entry.get("project"), entry.get("group"), started)
    row["start"] = pd.to_datetime(entry.get("created"), unit="s", utc=True)
    row["duration_s"] = entry.get("duration_s")
    row["env_steps"] = entry.get("env_steps")
    row.update(_bottleneck(entry.get("bottleneck")))
    row.update(entry.get("last") or {})
    return row


# -- shared ------------------------------------------------------------------------


def _bottleneck(verdict: dict[str, Any] | None) -> dict[str, Any]:
    """A run's bottleneck columns: the verdict's line, side and phase (the live one, or the trace's once a server has it)."""
    verdict = verdict or {}
    return {"bottleneck": verdict.get("text"), "bottleneck_side": verdict.get("side") or None, "bottleneck_phase": verdict.get("phase") or None}


def _identity(run_id: str, status: str | None, project: str | None, group: str | None, started: dict[str, Any]) -> dict[str, Any]:
    row = {"run_id": run_id, "status": status, "project": project, "group": group}
    config = started.get("config")
    if isinstance(config, dict):
        row.update({f"config.{k}": v for k, v in _flat(config).items()})
    return row


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def events_frame(found: list[dict[str, Any]]) -> pd.DataFrame:
    """Events as a row each: ``ts`` (Unix seconds), ``name``, ``attributes`` (a dict), oldest first."""
    rows = [{"ts": e.get("ts"), "name": e.get("name"), "attributes": e.get("attributes") or {}} for e in found]
    return pd.DataFrame(rows, columns=["ts", "name", "attributes"]).sort_values("ts", kind="stable", ignore_index=True)


def _message(body: bytes, kind: str) -> str:
    """The API's error message in a refusal's body, else what the body is."""
    try:
        return str(orjson.loads(body).get("error"))
    except Exception:  # an answer that is not the API's JSON
        return _what(body, kind)


def _what(body: bytes, kind: str) -> str:
    """A few words on an answer that is not the API's JSON: its type and its start."""
    start = body[:60].decode("utf-8", "replace").split("\n")[0].strip()
    return f"{kind or 'no content type'} ({start!r})" if start else f"an empty {kind or 'answer'}"
