"""SQLite storage for the ingest server: the embedded default (``otel-rl serve --db metrics.sqlite3``)."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from otel_rl.readers.server import summaries
from otel_rl.readers.server.storage import (
    FACETS,
    RUN_FIELDS,
    RUN_TABLES,
    KnownKeys,
    OtherRun,
    Row,
    RunFilter,
    other_run,
    run_claims,
    StorageUnavailable,
    facets_of,
    point_blocks,
    read_blocks,
    run_dict,
    status_order,
    unique_rows,
)

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
CREATE INDEX IF NOT EXISTS runs_project ON runs (project, created, run_id);
CREATE INDEX IF NOT EXISTS runs_group ON runs (grp, created, run_id);
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
CREATE TABLE IF NOT EXISTS run_summaries (
    run_id TEXT NOT NULL,
    key TEXT NOT NULL,
    last REAL NOT NULL,
    last_ts REAL NOT NULL,
    last_seq REAL NOT NULL,
    min REAL NOT NULL,
    max REAL NOT NULL,
    PRIMARY KEY (run_id, key)
) WITHOUT ROWID;
"""
_RUN_FILES = """
CREATE TABLE IF NOT EXISTS refused_writers (
    writer TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    reason TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS run_files (
    run_id TEXT NOT NULL,
    name TEXT NOT NULL,
    stored REAL NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (run_id, name)
);
"""
_RUN_COLUMNS = {"started": "TEXT", "started_ts": "REAL", "started_seq": "INTEGER", "env_steps": "INTEGER", "steps_ts": "REAL", "tags": "TEXT", "note": "TEXT", "trace_id": "TEXT",
                "bottleneck": "TEXT", "bottleneck_side": "TEXT", "bottleneck_phase": "TEXT", "bottleneck_ts": "REAL"}
"""Columns of ``runs`` the listing reads (:mod:`otel_rl.readers.server.summaries`), added to a database made before them."""
_SET_STARTED = (
    "UPDATE runs SET started = ?, started_ts = ?, started_seq = ?"
    " WHERE run_id = ? AND (started_ts IS NULL OR started_ts < ? OR (started_ts = ? AND started_seq < ?))"
)
_SET_STEPS = "UPDATE runs SET env_steps = ?, steps_ts = ? WHERE run_id = ? AND (steps_ts IS NULL OR steps_ts <= ?)"
_SET_BOTTLENECK = (
    "UPDATE runs SET bottleneck = ?, bottleneck_side = ?, bottleneck_phase = ?, bottleneck_ts = ?"
    " WHERE run_id = ? AND (bottleneck_ts IS NULL OR bottleneck_ts <= ?)"
)
_SUMMARIZE = (
    "INSERT INTO run_summaries (run_id, key, last, last_ts, last_seq, min, max) VALUES (?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (run_id, key) DO UPDATE SET"
    " last = CASE WHEN (excluded.last_ts, excluded.last_seq) > (last_ts, last_seq) THEN excluded.last ELSE last END,"
    " last_seq = CASE WHEN (excluded.last_ts, excluded.last_seq) > (last_ts, last_seq) THEN excluded.last_seq ELSE last_seq END,"
    " last_ts = max(last_ts, excluded.last_ts), min = min(min, excluded.min), max = max(max, excluded.max)"
)

_INSERT_RECORD = "INSERT OR IGNORE INTO records (writer, seq, run_id, kind, ts, body) VALUES (?, ?, ?, ?, ?, ?)"
_TOUCH_RUN = (
    "INSERT INTO runs (run_id, status, status_ts, status_seq, created, last_seen) VALUES (?, 'running', 0, -1, ?, ?)"
    " ON CONFLICT (run_id) DO UPDATE SET last_seen = max(last_seen, excluded.last_seen), lost = 0 RETURNING created"
)
_SET_STATUS = (
    "UPDATE runs SET status = ?, status_ts = ?, status_seq = ?, project = coalesce(?, project),"
    " grp = coalesce(?, grp), meta = coalesce(?, meta), reason = ?"
    " WHERE run_id = ? AND (status_ts < ? OR (status_ts = ? AND status_seq < ?))"
)


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
                self._db.executescript(_SQLITE_SCHEMA + _RUN_FILES)
                self._add_run_columns()
            except sqlite3.OperationalError:
                pass  # a read-only database still serves reads; health() says why writes fail

    def _add_run_columns(self) -> None:
        """Give a database made before the listing's columns those columns, filled from its records (once)."""
        have = {row[1] for row in self._db.execute("PRAGMA table_info(runs)")}
        missing = [name for name in _RUN_COLUMNS if name not in have]
        if not missing:
            return
        self._db.execute("BEGIN IMMEDIATE")
        for name in missing:
            self._db.execute(f"ALTER TABLE runs ADD COLUMN {name} {_RUN_COLUMNS[name]}")
        for (run_id,) in self._db.execute("SELECT run_id FROM runs").fetchall():
            bodies = self._db.execute("SELECT body FROM records WHERE run_id = ? AND kind IN ('run', 'scalars', 'event') ORDER BY ts, seq", (run_id,))
            rows = [Row.of(json.loads(body), body) for (body,) in bodies]
            self._describe(self._db, rows, point_blocks(rows))
        self._db.execute("COMMIT")

    @staticmethod
    def _describe(db: sqlite3.Connection, rows: list[Row], blocks: list[tuple]) -> None:
        """Keep the runs' listing columns and key summaries up to date with new ``rows`` and their point blocks (in a transaction)."""
        db.executemany(_SET_STARTED, [(body, ts, seq, run_id, ts, ts, seq) for run_id, body, ts, seq in summaries.started(rows)])
        db.executemany(_SET_STEPS, [(steps, ts, run_id, ts) for run_id, steps, ts in summaries.newest_steps(rows)])
        db.executemany(_SET_BOTTLENECK, [(*found, run_id, found[-1]) for run_id, *found in summaries.newest_bottleneck(rows)])
        db.executemany(_SUMMARIZE, summaries.key_summaries(blocks))

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
                refused = self._other_run(db, rows)
                if refused is not None:
                    db.execute("COMMIT")  # the writer stays refused: its later batches carry no trace id to tell
                    raise OtherRun(refused)
                given, rows = len(rows), unique_rows(rows, _stored_pairs(db, rows))  # a duplicate changes nothing
                db.executemany(_INSERT_RECORD, [r[:6] for r in rows])
                accepted = len(rows)
                first_status = [r for r in rows if r.kind == "run"]
                made = set()
                for run_id in dict.fromkeys(r.run_id for r in rows):  # a run made by this batch holds no key yet
                    if db.execute(_TOUCH_RUN, (run_id, now, now)).fetchone()[0] == now:
                        made.add(run_id)
                self._known.forget(made)
                db.executemany("UPDATE runs SET trace_id = ? WHERE run_id = ? AND trace_id IS NULL",
                               [(trace_id, run_id) for run_id, trace_id, _ in run_claims(rows)])  # fmt: skip
                for r in first_status:
                    order = status_order(r, now)
                    db.execute(
                        _SET_STATUS,
                        (r.status, order, r.seq, r.project, r.group, r.meta, r.reason, r.run_id, order, order, r.seq),
                    )
                fresh = self._known.new(rows)
                if fresh:
                    db.executemany("INSERT OR IGNORE INTO series_keys (run_id, key) VALUES (?, ?)", fresh)
                blocks = point_blocks(rows)
                db.executemany("INSERT INTO point_blocks (run_id, key, writer, first_ts, points) VALUES (?, ?, ?, ?, ?)", blocks)
                self._describe(db, rows, blocks)
                db.execute("COMMIT")
            except sqlite3.Error as exc:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                if isinstance(exc, sqlite3.OperationalError):
                    raise StorageUnavailable(str(exc)) from exc
                raise
            self._known.remember(fresh)
        return accepted, given - accepted

    @staticmethod
    def _other_run(db: sqlite3.Connection, rows: list[Row]) -> str | None:
        """Why the batch is refused: a writer refused before, or a run record of another run than the one holding its id."""
        writers = list(dict.fromkeys(r.writer for r in rows))
        for start in range(0, len(writers), 500):
            part = writers[start : start + 500]
            found = db.execute(f"SELECT reason FROM refused_writers WHERE writer IN ({', '.join('?' * len(part))})", part).fetchone()
            if found:
                return found[0]
        for run_id, trace_id, writer in run_claims(rows):
            held = db.execute("SELECT trace_id FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if held and held[0] and held[0] != trace_id:
                reason = other_run(run_id, held[0], trace_id)
                db.execute("INSERT OR REPLACE INTO refused_writers (writer, run_id, reason) VALUES (?, ?, ?)", (writer, run_id, reason))
                return reason
        return None

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

    def runs(self, limit: int = 100, after: str | None = None, only: RunFilter = RunFilter(), keys: list[str] = ()) -> list[dict[str, Any]]:
        rows = self._read(*only.listing("?", "LIKE", after, limit, keys))  # SQLite's LIKE ignores ASCII case
        return [summaries.attach(run_dict(r), keys, r[len(RUN_FIELDS) :]) for r in rows]

    def facets(self) -> dict[str, list[str]]:
        return facets_of(self._read(FACETS))

    def last_values(self, run_ids: list[str]) -> dict[str, dict[str, float]]:
        found: dict[str, dict[str, float]] = {}
        for start in range(0, len(run_ids), 500):  # SQLite's bound on parameters
            part = run_ids[start : start + 500]
            marks = ", ".join("?" * len(part))
            for run_id, key, last in self._read(f"SELECT run_id, key, last FROM run_summaries WHERE run_id IN ({marks})", tuple(part)):
                found.setdefault(run_id, {})[key] = last
        return found

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

    def _write(self, statements: list[tuple[str, tuple]], run_id: str) -> bool:
        """Run ``statements`` in one transaction when the run exists; whether it did."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                known = self._db.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is not None
                if known:
                    for sql, params in statements:
                        self._db.execute(sql, params)
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise StorageUnavailable(str(exc)) from exc
        return known

    def annotate(self, run_id: str, tags: list[str] | None, note: str | None) -> bool:
        return self._write([("UPDATE runs SET tags = coalesce(?, tags), note = coalesce(?, note) WHERE run_id = ?",
                             (None if tags is None else json.dumps(tags), note, run_id))], run_id)  # fmt: skip

    def delete(self, run_id: str) -> bool:
        return self._write([(f"DELETE FROM {table} WHERE run_id = ?", (run_id,)) for table in RUN_TABLES], run_id)

    def put_file(self, run_id: str, name: str, data: bytes) -> bool:
        insert = "INSERT OR REPLACE INTO run_files (run_id, name, stored, data) VALUES (?, ?, ?, ?)"
        return self._write([(insert, (run_id, name, time.time(), data))], run_id)

    def set_bottleneck(self, run_id: str, verdict: dict[str, Any]) -> bool:
        return self._write([("UPDATE runs SET bottleneck = ?, bottleneck_side = ?, bottleneck_phase = ?, bottleneck_ts = ? WHERE run_id = ?",
                             (json.dumps(verdict), verdict.get("side") or "", verdict.get("phase") or "", summaries.TRACE_VERDICT_TS, run_id))], run_id)  # fmt: skip

    def file(self, run_id: str, name: str) -> bytes | None:
        rows = self._read("SELECT data FROM run_files WHERE run_id = ? AND name = ?", (run_id, name))
        return bytes(rows[0][0]) if rows else None

    def file_names(self, run_id: str, prefix: str) -> list[str]:
        rows = self._read("SELECT name FROM run_files WHERE run_id = ? AND substr(name, 1, ?) = ? ORDER BY name", (run_id, len(prefix), prefix))
        return [r[0] for r in rows]

    def trace_of(self, run_id: str) -> str | None:
        rows = self._read("SELECT trace_id FROM runs WHERE run_id = ?", (run_id,))
        return rows[0][0] if rows else None

    def count(self, run_id: str | None = None) -> int:
        if run_id is None:
            return self._read("SELECT count(*) FROM records")[0][0]
        return self._read("SELECT count(*) FROM records WHERE run_id = ?", (run_id,))[0][0]
