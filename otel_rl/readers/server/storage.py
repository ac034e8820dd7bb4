"""Storage of the reference ``motrix.metrics/v1`` ingest server: the interface and its SQLite backend.

Records are de-duplicated on ``(writer, seq)`` and stored as their JSON text,
one row each (a 40-key scalars record is one insert, not forty); series are
read out of the stored records. A run's status is the status of its newest
run record, ordered by ``(ts, seq)`` where ``ts`` is bounded by the time the
server received the record: a client clock far in the future cannot pin a
status, and a late backfill of an old ``running`` record never overwrites a
terminal one. ``lost`` is set by the server when a pending or running run goes
silent, and cleared by its next record.

Backends: :class:`SqliteStorage` (embedded, the default) and
:class:`otel_rl.readers.server.postgres.PostgresStorage` (``--db postgresql://...``),
behind the same :class:`Storage` interface and the same tests.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

RUN_FIELDS = ("run_id", "status", "lost", "project", "grp", "meta", "reason", "created", "last_seen")
MAX_PAGE = 1000
MAX_KNOWN_KEYS = 200_000
"""(run, key) pairs remembered to skip re-inserting known series keys; forgotten all at once past this."""


STATUSES = ("pending", "running", "finished", "failed", "killed", "lost")
"""What ``/api/v1/runs?status=`` filters on: a run's reported status, or ``lost``."""


@dataclass(frozen=True)
class RunFilter:
    """Which runs a listing keeps: every field given must match (``search``: a part of the run id, project or group)."""

    project: str | None = None
    group: str | None = None
    statuses: tuple[str, ...] = ()
    search: str | None = None

    def where(self, mark: str, like: str) -> tuple[list[str], list[Any]]:
        """SQL conditions and their parameters, with ``mark`` as the placeholder and ``like`` the case-blind LIKE."""
        clauses: list[str] = []
        params: list[Any] = []
        for column, value in (("project", self.project), ("grp", self.group)):
            if value is not None:
                clauses.append(f"{column} = {mark}")
                params.append(value)
        if self.statuses:
            reported = [s for s in self.statuses if s != "lost"]
            either = [f"(NOT lost AND status IN ({', '.join([mark] * len(reported))}))"] if reported else []
            clauses.append("(" + " OR ".join(either + (["lost"] if "lost" in self.statuses else [])) + ")")
            params += reported
        if self.search:
            pattern = "%" + self.search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            clauses.append("(" + " OR ".join(f"coalesce({c}, '') {like} {mark} ESCAPE '\\'" for c in ("run_id", "project", "grp")) + ")")
            params += [pattern] * 3
        return clauses, params

    def listing(self, mark: str, like: str, after: str | None, limit: int) -> tuple[str, tuple]:
        """The SQL of a page of runs this filter keeps (after run ``after``, at most ``limit``), and its parameters."""
        clauses, params = self.where(mark, like)
        if after is not None:
            clauses.append(f"(created, run_id) > (SELECT created, run_id FROM runs WHERE run_id = {mark})")
            params.append(after)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        sql = f"SELECT {', '.join(RUN_FIELDS)} FROM runs{where} ORDER BY created, run_id LIMIT {mark}"
        return sql, (*params, max(1, min(limit, MAX_PAGE)))


def started(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What a run said when it started (its newest ``running`` record): configuration, provenance, plan."""
    running = [r for r in records if r.get("status") == "running"]
    if not running:
        return None
    latest = max(running, key=lambda r: (r["ts"], r["seq"]))
    fields = ("family", "total_steps", "num_envs", "config", "versions", "command", "host", "git")
    return {k: latest[k] for k in fields if k in latest}


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

    @classmethod
    def of(cls, record: dict[str, Any], body: str) -> Row:
        kind = record["kind"]
        if kind == "run":
            meta = json.dumps(record["meta"]) if "meta" in record else None
            return cls(record["writer"], record["seq"], record["run_id"], kind, float(record["ts"]), body,
                       record["status"], record.get("project"), record.get("group"), meta, record.get("reason"))  # fmt: skip
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
    """What the server needs from a database. Methods are called from one worker thread at a time."""

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

    def runs(self, limit: int = 100, after: str | None = None, only: RunFilter = RunFilter()) -> list[dict[str, Any]]:
        """Runs in creation order that ``only`` keeps, at most ``limit``, those after run ``after``."""
        ...

    def env_steps(self, run_id: str) -> int | None:
        """The newest env-step count the run's scalars carry."""
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

    def count(self, run_id: str | None = None) -> int: ...

    def close(self) -> None: ...


def open_storage(location: str | Path) -> Storage:
    """A ``postgresql://`` URL opens PostgreSQL; anything else is a SQLite file."""
    text = str(location)
    if text.startswith(("postgresql://", "postgres://")):
        from otel_rl.readers.server.postgres import PostgresStorage

        return PostgresStorage(text)
    return SqliteStorage(text)


def run_dict(row: tuple) -> dict[str, Any]:
    run_id, status, lost, project, group, meta, reason, created, last_seen = row
    return {
        "run_id": run_id,
        "status": "lost" if lost else status,
        "reported_status": status,
        "project": project,
        "group": group,
        "meta": json.loads(meta) if isinstance(meta, str) and meta else (meta or {}),
        "reason": reason,
        "created": created,
        "last_seen": last_seen,
    }


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


_SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    writer TEXT NOT NULL,
    seq INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    ts REAL NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (writer, seq)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS records_run ON records (run_id, kind, ts);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    status_ts REAL NOT NULL,
    status_seq INTEGER NOT NULL,
    project TEXT,
    grp TEXT,
    meta TEXT,
    reason TEXT,
    created REAL NOT NULL,
    last_seen REAL NOT NULL,
    lost INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS runs_created ON runs (created, run_id);
CREATE TABLE IF NOT EXISTS series_keys (
    run_id TEXT NOT NULL,
    key TEXT NOT NULL,
    PRIMARY KEY (run_id, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS point_blocks (
    run_id TEXT NOT NULL,
    key TEXT NOT NULL,
    writer TEXT NOT NULL,
    first_ts REAL NOT NULL,
    points BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS point_blocks_series ON point_blocks (run_id, key, first_ts);
"""

_INSERT_RECORD = "INSERT OR IGNORE INTO records (writer, seq, run_id, kind, ts, body) VALUES (?, ?, ?, ?, ?, ?)"
_TOUCH_RUN = (
    "INSERT INTO runs (run_id, status, status_ts, status_seq, created, last_seen) VALUES (?, 'running', 0, -1, ?, ?)"
    " ON CONFLICT (run_id) DO UPDATE SET last_seen = max(last_seen, excluded.last_seen), lost = 0"
)
_SET_STATUS = (
    "UPDATE runs SET status = ?, status_ts = ?, status_seq = ?, project = coalesce(?, project),"
    " grp = coalesce(?, grp), meta = coalesce(?, meta), reason = ?"
    " WHERE run_id = ? AND (status_ts < ? OR (status_ts = ? AND status_seq < ?))"
)


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


def _stored_pairs(db: sqlite3.Connection, rows: list[Row]) -> set[tuple[str, int]]:
    """The (writer, seq) pairs of ``rows`` already stored: one primary-key range read per writer."""
    ranges: dict[str, tuple[int, int]] = {}
    for row in rows:
        low, high = ranges.get(row.writer, (row.seq, row.seq))
        ranges[row.writer] = (min(low, row.seq), max(high, row.seq))
    wanted = {(row.writer, row.seq) for row in rows}
    stored = set()
    for writer, (low, high) in ranges.items():
        for (seq,) in db.execute("SELECT seq FROM records WHERE writer = ? AND seq BETWEEN ? AND ?", (writer, low, high)):
            if (writer, seq) in wanted:
                stored.add((writer, seq))
    return stored


def status_order(row: Row, now: float) -> float:
    """The time a run record counts at for ordering statuses: its own, but never later than its arrival."""
    return min(row.ts, now)


class SqliteStorage:
    """One SQLite connection (WAL, prepared statements through the module's cache), used by one thread at a time."""

    def __init__(self, path: Path | str) -> None:
        self._path = Path(path)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, cached_statements=64)
        self._reader: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._known = KnownKeys()
        with self._lock:
            try:
                self._db.execute("PRAGMA journal_mode = WAL")
                self._db.execute("PRAGMA synchronous = NORMAL")  # durable across a killed server; fsync per checkpoint
                self._db.execute("PRAGMA wal_autocheckpoint = 16384")  # checkpoint every 64 MB of WAL, not every 4 MB
                self._db.executescript(_SQLITE_SCHEMA)
            except sqlite3.OperationalError:
                pass  # a read-only database still serves reads; health() says why writes fail

    def close(self) -> None:
        with self._lock:
            self._db.close()
            if self._reader is not None:
                self._reader.close()

    def ingest(self, rows: list[Row], now: float | None = None) -> tuple[int, int]:
        now = time.time() if now is None else now
        with self._lock:
            db = self._db
            try:
                db.execute("BEGIN IMMEDIATE")
                given, rows = len(rows), unique_rows(rows, _stored_pairs(db, rows))  # a duplicate changes nothing
                db.executemany(_INSERT_RECORD, [r[:6] for r in rows])
                accepted = len(rows)
                first_status = [r for r in rows if r.kind == "run"]
                db.executemany(_TOUCH_RUN, [(run_id, now, now) for run_id in dict.fromkeys(r.run_id for r in rows)])
                for r in first_status:
                    order = status_order(r, now)
                    db.execute(
                        _SET_STATUS,
                        (r.status, order, r.seq, r.project, r.group, r.meta, r.reason, r.run_id, order, order, r.seq),
                    )
                fresh = self._known.new(rows)
                if fresh:
                    db.executemany("INSERT OR IGNORE INTO series_keys (run_id, key) VALUES (?, ?)", fresh)
                db.executemany("INSERT INTO point_blocks (run_id, key, writer, first_ts, points) VALUES (?, ?, ?, ?, ?)", point_blocks(rows))
                db.execute("COMMIT")
            except sqlite3.Error as exc:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                if isinstance(exc, sqlite3.OperationalError):
                    raise StorageUnavailable(str(exc)) from exc
                raise
            self._known.remember(fresh)
        return accepted, given - accepted

    def health(self) -> str | None:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")  # takes the write lock: fails on a read-only or broken file
                self._db.execute("ROLLBACK")
            except sqlite3.Error as exc:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                return str(exc)
        return None

    def _read(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self._lock:
            try:
                return (self._reader or self._db).execute(sql, params).fetchall()
            except sqlite3.OperationalError as exc:
                if self._reader is not None:
                    raise StorageUnavailable(str(exc)) from exc
                first = exc
            # A WAL database in a read-only folder cannot make its side files: reads go through a read-only view.
            try:
                self._reader = sqlite3.connect(
                    self._path.resolve().as_uri() + "?mode=ro&immutable=1", uri=True, check_same_thread=False
                )
                return self._reader.execute(sql, params).fetchall()
            except sqlite3.Error:
                self._reader = None
                raise StorageUnavailable(str(first)) from first

    def mark_lost(self, silent_for_s: float, now: float | None = None) -> list[str]:
        now = time.time() if now is None else now
        with self._lock:
            try:
                rows = self._db.execute(
                    "SELECT run_id FROM runs WHERE lost = 0 AND status IN ('pending', 'running') AND last_seen < ?",
                    (now - silent_for_s,),
                ).fetchall()
                if rows:
                    self._db.executemany("UPDATE runs SET lost = 1 WHERE run_id = ?", rows)
            except sqlite3.OperationalError as exc:
                raise StorageUnavailable(str(exc)) from exc
        return [r[0] for r in rows]

    def runs(self, limit: int = 100, after: str | None = None, only: RunFilter = RunFilter()) -> list[dict[str, Any]]:
        return [run_dict(r) for r in self._read(*only.listing("?", "LIKE", after, limit))]  # SQLite's LIKE ignores ASCII case

    def env_steps(self, run_id: str) -> int | None:
        rows = self._read(
            "SELECT coalesce(json_extract(body, '$.axes.env_steps'), json_extract(body, '$.step')) FROM records"
            " WHERE run_id = ? AND kind = 'scalars' ORDER BY ts DESC LIMIT 64",
            (run_id,),
        )
        return next((int(r[0]) for r in rows if r[0] is not None), None)

    def run(self, run_id: str) -> dict[str, Any] | None:
        rows = self._read(f"SELECT {', '.join(RUN_FIELDS)} FROM runs WHERE run_id = ?", (run_id,))
        return run_dict(rows[0]) if rows else None

    def records(self, run_id: str, kind: str | None = None) -> list[dict[str, Any]]:
        query = "SELECT body FROM records WHERE run_id = ?" + (" AND kind = ?" if kind else "") + " ORDER BY ts, seq"
        return [json.loads(r[0]) for r in self._read(query, (run_id, kind) if kind else (run_id,))]

    def events(self, run_id: str, latest: int) -> tuple[list[dict[str, Any]], int]:
        rows = self._read(
            "SELECT body FROM (SELECT body, ts, seq FROM records WHERE run_id = ? AND kind = 'event'"
            " ORDER BY ts DESC, seq DESC LIMIT ?) ORDER BY ts, seq",
            (run_id, latest),
        )
        total = self._read("SELECT count(*) FROM records WHERE run_id = ? AND kind = 'event'", (run_id,))[0][0]
        return [json.loads(r[0]) for r in rows], total

    def series(self, run_id: str, key: str) -> list[dict[str, Any]]:
        rows = self._read(
            "SELECT json_extract(r.body, '$.step'), json_extract(r.body, '$.axes.env_steps'),"
            " json_extract(r.body, '$.axes.iteration'), v.value, r.ts"
            " FROM records r, json_each(r.body, '$.values') v"
            " WHERE r.run_id = ? AND r.kind = 'scalars' AND v.key = ? ORDER BY r.ts, r.seq",
            (run_id, key),
        )
        return [dict(zip(("step", "env_steps", "iteration", "value", "ts"), r, strict=True)) for r in rows]

    def curve(self, run_id: str, key: str) -> dict[str, Any]:
        return read_blocks(self._read("SELECT writer, points FROM point_blocks WHERE run_id = ? AND key = ?", (run_id, key)))

    def keys(self, run_id: str) -> list[str]:
        return [r[0] for r in self._read("SELECT key FROM series_keys WHERE run_id = ? ORDER BY key", (run_id,))]

    def count(self, run_id: str | None = None) -> int:
        if run_id is None:
            return self._read("SELECT count(*) FROM records")[0][0]
        return self._read("SELECT count(*) FROM records WHERE run_id = ?", (run_id,))[0][0]
