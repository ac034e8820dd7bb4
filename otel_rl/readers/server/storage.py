"""Storage of the reference ``motrix.metrics/v1`` ingest server: the interface, and the rules every backend keeps.

Records are de-duplicated on ``(writer, seq)`` and stored as their JSON text,
one row each (a 40-key scalars record is one insert, not forty); series are
read out of the stored records. A run's status is the status of its newest
run record, ordered by ``(ts, seq)`` where ``ts`` is bounded by the time the
server received the record: a client clock far in the future cannot pin a
status, and a late backfill of an old ``running`` record never overwrites a
terminal one. ``lost`` is set by the server when a pending or running run goes
silent, and cleared by its next record.

Backends: :class:`otel_rl.readers.server.sqlite.SqliteStorage` (embedded, the
default) and :class:`otel_rl.readers.server.postgres.PostgresStorage` (``--db
postgresql://...``), behind the same :class:`Storage` interface and the same
tests; :func:`otel_rl.readers.server.backends.open_storage` opens either.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from otel_rl.formats import lifecycle

RUN_FIELDS = (
    "run_id", "status", "lost", "project", "grp", "meta", "reason", "created", "last_seen", "started", "env_steps", "status_ts", "started_ts",
    "tags", "note", "bottleneck",
)  # fmt: skip
RUN_TABLES = ("records", "series_keys", "point_blocks", "run_summaries", "run_files", "refused_writers", "runs")
"""Every table that holds a run's rows: what deleting a run empties."""
TERMINAL = lifecycle.TERMINAL
FACETS = (
    "SELECT DISTINCT 'project', project FROM runs WHERE project IS NOT NULL"
    " UNION SELECT DISTINCT 'group', grp FROM runs WHERE grp IS NOT NULL"
    " UNION SELECT DISTINCT 'bottleneck', bottleneck_side FROM runs WHERE bottleneck_side IS NOT NULL AND bottleneck_side <> ''"
    " UNION SELECT DISTINCT 'bottleneck', bottleneck_side || '/' || bottleneck_phase FROM runs"
    " WHERE bottleneck_side IS NOT NULL AND bottleneck_side <> '' AND bottleneck_phase <> ''"
)
"""The distinct projects and groups of the runs (:meth:`Storage.facets`), as ``(kind, value)`` rows."""


def facets_of(rows: list[tuple]) -> dict[str, list[str]]:
    """:data:`FACETS`' rows as ``{"project": [...], "group": [...], "bottleneck": [...]}`` (a verdict's ``side`` and ``side/phase``), sorted."""
    return {name: sorted(value for kind, value in rows if kind == name) for name in ("project", "group", "bottleneck")}
MAX_PAGE = 1000
MAX_KNOWN_KEYS = 200_000
"""(run, key) pairs remembered to skip re-inserting known series keys; forgotten all at once past this."""


STATUSES = lifecycle.STATUSES
"""What ``/api/v1/runs?status=`` filters on: a run's reported status, or ``lost``."""


@dataclass(frozen=True)
class RunFilter:
    """Which runs a listing keeps: every field given must match (``search``: a part of the run id, project or group)."""

    project: str | None = None
    group: str | None = None
    statuses: tuple[str, ...] = ()
    search: str | None = None
    tag: str | None = None
    bottleneck: str | None = None
    """The verdict's side (``collector``), or side and phase (``collector/env_step``)."""
    newest_first: bool = False

    def where(self, mark: str, like: str) -> tuple[list[str], list[Any]]:
        """SQL conditions and their parameters, with ``mark`` as the placeholder and ``like`` the case-blind LIKE."""
        clauses: list[str] = []
        params: list[Any] = []
        for column, value in (("runs.project", self.project), ("runs.grp", self.group)):
            if value is not None:
                clauses.append(f"{column} = {mark}")
                params.append(value)
        if self.statuses:
            reported = [s for s in self.statuses if s != lifecycle.LOST]
            either = [f"(NOT runs.lost AND runs.status IN ({', '.join([mark] * len(reported))}))"] if reported else []
            clauses.append("(" + " OR ".join(either + (["runs.lost"] if lifecycle.LOST in self.statuses else [])) + ")")
            params += reported
        if self.bottleneck:
            side, _, phase = self.bottleneck.partition("/")
            clauses.append(f"runs.bottleneck_side = {mark}")
            params.append(side)
            if phase:
                clauses.append(f"runs.bottleneck_phase = {mark}")
                params.append(phase)
        if self.tag:
            # Tags are kept as a JSON list, '["a", "b"]': with its first '[' made ', ', each tag is ', "tag"' (the quotes
            # inside a tag escaped), so one exact, case-sensitive substring test finds a tag and no other.
            find = "instr" if mark == "?" else "strpos"  # SQLite's and PostgreSQL's
            clauses.append(f"{find}(', ' || substr(coalesce(runs.tags, ''), 2), {mark}) > 0")
            params.append(", " + json.dumps(self.tag))
        if self.search:
            pattern = "%" + self.search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            columns = ("runs.run_id", "runs.project", "runs.grp")
            clauses.append("(" + " OR ".join(f"coalesce({c}, '') {like} {mark} ESCAPE '\\'" for c in columns) + ")")
            params += [pattern] * 3
        return clauses, params

    def listing(self, mark: str, like: str, after: str | None, limit: int, keys: list[str] = ()) -> tuple[str, tuple]:
        """The one query of a page of runs this filter keeps (after run ``after``, at most ``limit``), with the
        summaries of ``keys`` (:mod:`otel_rl.readers.server.summaries`), and its parameters."""
        extra = "".join(f", s{i}.last, s{i}.min, s{i}.max" for i in range(len(keys)))
        joined = "".join(f" LEFT JOIN run_summaries s{i} ON s{i}.run_id = runs.run_id AND s{i}.key = {mark}" for i in range(len(keys)))
        clauses, params = self.where(mark, like)
        beyond, order = ("<", " DESC") if self.newest_first else (">", "")
        if after is not None:
            clauses.append(f"(runs.created, runs.run_id) {beyond} (SELECT r.created, r.run_id FROM runs r WHERE r.run_id = {mark})")
            params.append(after)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        fields = ", ".join(f"runs.{f}" for f in RUN_FIELDS)
        sql = f"SELECT {fields}{extra} FROM runs{joined}{where} ORDER BY runs.created{order}, runs.run_id{order} LIMIT {mark}"
        return sql, (*keys, *params, max(1, min(limit, MAX_PAGE)))


class StorageUnavailable(Exception):
    """The database cannot take writes now (read-only, full, unreachable); ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Row(NamedTuple):
    """One validated record, ready to store (a tuple: cheap to build and to pass between processes)."""

    writer: str
    seq: int
    run_id: str
    kind: str
    ts: float
    body: str
    status: str | None = None
    project: str | None = None
    group: str | None = None
    meta: str | None = None
    reason: str | None = None
    keys: tuple[str, ...] = ()
    numbers: tuple[float | None, ...] = ()
    """A scalars record's values, in the order of ``keys``."""
    axes: tuple[int | None, int | None] = (None, None)
    """A scalars record's step and env steps."""
    trace_id: str | None = None
    """A run record's trace id: which run of that id it belongs to (a resumed run keeps its trace id)."""

    @classmethod
    def of(cls, record: dict[str, Any], body: str) -> Row:
        kind = record["kind"]
        if kind == "run":
            meta = json.dumps(record["meta"]) if "meta" in record else None
            trace_id = record.get("trace_id") if isinstance(record.get("trace_id"), str) else None
            return cls(record["writer"], record["seq"], record["run_id"], kind, float(record["ts"]), body,
                       record["status"], record.get("project"), record.get("group"), meta, record.get("reason"), trace_id=trace_id)  # fmt: skip
        if kind != "scalars":
            return cls(record["writer"], record["seq"], record["run_id"], kind, float(record["ts"]), body)
        values = record["values"]
        axes = (record.get("step"), (record.get("axes") or {}).get("env_steps"))
        return cls(record["writer"], record["seq"], record["run_id"], kind, float(record["ts"]), body,
                   keys=tuple(values), numbers=tuple(values.values()), axes=axes)  # fmt: skip


BLOCK_COLUMNS = ("seq", "ts", "step", "env_steps", "value")
"""What a point block packs per point, as float64 columns (NaN: none); ``seq`` de-duplicates points at read."""


def point_blocks(rows: list[Row]) -> list[tuple[str, str, str, float, bytes]]:
    """A batch's scalars as one block per (run, key, writer): ``(run_id, key, writer, first ts, packed columns)``.

    Curves are read from these blocks (a few per batch) instead of out of
    every stored record, so a key of a million points is one small scan.
    Records of the same keys (a loop logs the same keys every call) are
    packed together, column by column, by numpy.
    """
    import numpy as np

    groups: dict[tuple[str, str, tuple[str, ...]], list[Row]] = {}
    for row in rows:
        if row.keys:
            groups.setdefault((row.run_id, row.writer, row.keys), []).append(row)
    blocks = []
    for (run_id, writer, keys), members in groups.items():
        # None (a non-finite value, a missing axis) becomes NaN here.
        axes = np.array([(r.seq, r.ts, *r.axes) for r in members], dtype=np.float64).T
        values = np.array([r.numbers for r in members], dtype=np.float64).T
        first_ts = float(axes[1].min())
        for key, column in zip(keys, values):
            blocks.append((run_id, key, writer, first_ts, np.vstack([axes, column]).tobytes()))
    return blocks


def read_blocks(blocks: list[tuple[str, bytes]]) -> dict[str, Any]:
    """Point blocks of one series as columns (numpy arrays), each point once, in the order of ``(ts, seq)``."""
    import numpy as np

    if not blocks:
        return {name: np.empty(0) for name in BLOCK_COLUMNS}
    parts, writers, ids = [], [], {}
    for writer, data in blocks:
        columns = np.frombuffer(data, dtype=np.float64).reshape(len(BLOCK_COLUMNS), -1)
        parts.append(columns)
        writers.append(np.full(columns.shape[1], ids.setdefault(writer, len(ids)), dtype=np.float64))
    joined = np.concatenate(parts, axis=1)
    writer_ids = np.concatenate(writers)
    # A point sent twice (a retried or backfilled batch) is one point: de-duplicated on (writer, seq).
    _, first = np.unique(np.stack([writer_ids, joined[0]]), axis=1, return_index=True)
    joined = joined[:, first]
    order = np.lexsort((joined[0], joined[1]))
    return {name: joined[i, order] for i, name in enumerate(BLOCK_COLUMNS)}


class Storage(Protocol):
    """What the server needs from a database.

    Methods are called from up to ``threads`` database threads at once (a
    backend without the attribute: one at a time).
    """

    def ingest(self, rows: list[Row], now: float | None = None) -> tuple[int, int]:
        """Store rows in one transaction; returns (accepted, duplicates).

        Raises:
            StorageUnavailable: the database cannot take the writes.
        """
        ...

    def health(self) -> str | None:
        """None when writes work, else the reason they do not."""
        ...

    def mark_lost(self, silent_for_s: float, now: float | None = None) -> list[str]:
        """Mark pending or running runs silent for ``silent_for_s`` as lost; returns their ids."""
        ...

    def runs(self, limit: int = 100, after: str | None = None, only: RunFilter = RunFilter(), keys: list[str] = ()) -> list[dict[str, Any]]:
        """Runs in creation order that ``only`` keeps, at most ``limit``, those after run ``after``, in one query;
        each with ``summary``: the last value, minimum and maximum of each of ``keys``."""
        ...

    def last_values(self, run_ids: list[str]) -> dict[str, dict[str, float]]:
        """The last value of every key of each of ``run_ids`` (one query)."""
        ...

    def facets(self) -> dict[str, list[str]]:
        """The distinct projects and groups of every run (what the runs page filters by)."""
        ...

    def run(self, run_id: str) -> dict[str, Any] | None: ...

    def records(self, run_id: str, kind: str | None = None) -> list[dict[str, Any]]: ...

    def events(self, run_id: str, latest: int) -> tuple[list[dict[str, Any]], int]:
        """The run's newest ``latest`` events, oldest first, and how many it has."""
        ...

    def series(self, run_id: str, key: str) -> list[dict[str, Any]]: ...

    def curve(self, run_id: str, key: str) -> dict[str, Any]:
        """One key's points as columns (:data:`BLOCK_COLUMNS`, numpy arrays), from the point blocks (:func:`read_blocks`)."""
        ...

    def keys(self, run_id: str) -> list[str]: ...

    def annotate(self, run_id: str, tags: list[str] | None, note: str | None) -> bool:
        """Set the run's tags and/or note (None: leave it); False when there is no such run."""
        ...

    def delete(self, run_id: str) -> bool:
        """Remove the run and everything stored of it (:data:`RUN_TABLES`); False when there is no such run."""
        ...

    def put_file(self, run_id: str, name: str, data: bytes) -> bool:
        """Keep ``data`` as the run's file ``name`` (replacing it); False when there is no such run."""
        ...

    def set_bottleneck(self, run_id: str, verdict: dict[str, Any]) -> bool:
        """Make ``verdict`` the run's bottleneck for good (the trace's, which no later live verdict replaces); False when there is no such run."""
        ...

    def file(self, run_id: str, name: str) -> bytes | None:
        """The run's file ``name``, None when it has none."""
        ...

    def file_names(self, run_id: str, prefix: str) -> list[str]:
        """The names of the run's files that start with ``prefix`` (their bytes are not read)."""
        ...

    def trace_of(self, run_id: str) -> str | None:
        """The trace id of the run holding ``run_id`` (from its run records), None when unknown."""
        ...

    def count(self, run_id: str | None = None) -> int: ...

    def close(self) -> None: ...


def run_dict(row: tuple) -> dict[str, Any]:
    """A ``runs`` row (:data:`RUN_FIELDS`) as the API shows a run."""
    run_id, status, lost, project, group, meta, reason, created, last_seen, started, env_steps, status_ts, started_ts, tags, note, bottleneck = row[
        : len(RUN_FIELDS)
    ]
    # From its running record to its end (its terminal record), or to now's last word: in the run's own clock where it can be.
    end = status_ts if status in TERMINAL else last_seen
    duration = max(0.0, end - started_ts) if started_ts is not None and end is not None else None
    return {
        "run_id": run_id,
        "status": lifecycle.LOST if lost else status,
        "reported_status": status,
        "project": project,
        "group": group,
        "meta": json.loads(meta) if isinstance(meta, str) and meta else (meta or {}),
        "reason": reason,
        "created": created,
        "last_seen": last_seen,
        "started": json.loads(started) if isinstance(started, str) and started else None,
        "env_steps": env_steps,
        "duration_s": duration,
        "tags": json.loads(tags) if isinstance(tags, str) and tags else [],
        "note": note or "",
        "bottleneck": json.loads(bottleneck) if isinstance(bottleneck, str) and bottleneck else None,
    }


class OtherRun(Exception):
    """A batch of a second run that took a run id another run has on this service (its trace id differs): refused whole (409)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def run_claims(rows: list[Row]) -> list[tuple[str, str, str]]:
    """``(run_id, trace_id, writer)`` of the batch's run records that name their trace."""
    return list(dict.fromkeys((r.run_id, r.trace_id, r.writer) for r in rows if r.kind == "run" and r.trace_id))


def other_run(run_id: str, theirs: str, ours: str) -> str:
    """Why a run that reuses the run id ``run_id`` (trace ``ours``) is refused, another (trace ``theirs``) holding it."""
    return (f"run id {run_id!r} belongs to another run on this service (trace {theirs[:8]}..., this one {ours[:8]}...):"
            " a second run with the same run id is refused, never merged; give each run its own run id")  # fmt: skip


class KnownKeys:
    """The (run, key) pairs already stored, so a scalars record inserts only its new keys."""

    def __init__(self) -> None:
        self._known: set[tuple[str, str]] = set()

    def new(self, rows: list[Row]) -> list[tuple[str, str]]:
        fresh: set[tuple[str, str]] = set()
        last: tuple[str, tuple[str, ...]] | None = None
        for row in rows:
            if not row.keys or (row.run_id, row.keys) == last:
                continue  # the same keys as the record before: the common case, one comparison
            last = (row.run_id, row.keys)
            fresh.update((row.run_id, key) for key in row.keys)
        fresh -= self._known
        if len(self._known) + len(fresh) > MAX_KNOWN_KEYS:
            self._known.clear()
        return sorted(fresh)

    def remember(self, pairs: list[tuple[str, str]]) -> None:
        self._known.update(pairs)

    def forget(self, run_ids: set[str]) -> None:
        """Runs the database made anew (deleted, on this server or another, and sent to again): their keys are stored again."""
        if run_ids:
            self._known = {pair for pair in self._known if pair[0] not in run_ids}


def unique_rows(rows: list[Row], stored: set[tuple[str, int]]) -> list[Row]:
    """The rows to store: each (writer, seq) once (its first row), none already ``stored``.

    Only these touch a run, its status, its keys and its points: a duplicate
    (a retried batch, or a record reusing a stored id) changes nothing.
    """
    kept, seen = [], set(stored)
    for row in rows:
        pair = (row.writer, row.seq)
        if pair not in seen:
            seen.add(pair)
            kept.append(row)
    return kept


def status_order(row: Row, now: float) -> float:
    """The time a run record counts at for ordering statuses: its own, but never later than its arrival."""
    return min(row.ts, now)
