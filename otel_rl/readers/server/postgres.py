"""PostgreSQL storage for the ingest server (``otel-rl serve --db postgresql://...``), for teams.

The same tables and rules as :class:`otel_rl.readers.server.sqlite.SqliteStorage`,
through psycopg 3: record bodies are ``json`` (kept as the checked text
they came as: cheaper to store than ``jsonb``, which a database made before
keeps); a batch is inserted with one
statement over arrays (``unnest``), de-duplicated by ``ON CONFLICT DO
NOTHING``, in one transaction with its run updates. A lost connection is
reopened on the next call; while the database is unreachable or read-only,
ingest raises :class:`StorageUnavailable` and the server answers 503.
"""

from __future__ import annotations

import json
import threading
import time
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

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    writer TEXT NOT NULL,
    seq BIGINT NOT NULL,
    run_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    ts DOUBLE PRECISION NOT NULL,
    body JSON NOT NULL,
    PRIMARY KEY (writer, seq)
);
CREATE INDEX IF NOT EXISTS records_run ON records (run_id, kind, ts);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    status_ts DOUBLE PRECISION NOT NULL,
    status_seq BIGINT NOT NULL,
    project TEXT,
    grp TEXT,
    meta TEXT,
    reason TEXT,
    created DOUBLE PRECISION NOT NULL,
    last_seen DOUBLE PRECISION NOT NULL,
    lost BOOLEAN NOT NULL DEFAULT FALSE
);
CREATE INDEX IF NOT EXISTS runs_created ON runs (created, run_id);
CREATE INDEX IF NOT EXISTS runs_project ON runs (project, created, run_id);
CREATE INDEX IF NOT EXISTS runs_group ON runs (grp, created, run_id);
CREATE TABLE IF NOT EXISTS series_keys (
    run_id TEXT NOT NULL,
    key TEXT NOT NULL,
    PRIMARY KEY (run_id, key)
);
CREATE TABLE IF NOT EXISTS point_blocks (
    run_id TEXT NOT NULL,
    key TEXT NOT NULL,
    writer TEXT NOT NULL,
    first_ts DOUBLE PRECISION NOT NULL,
    points BYTEA NOT NULL
);
CREATE INDEX IF NOT EXISTS point_blocks_series ON point_blocks (run_id, key, first_ts);
CREATE TABLE IF NOT EXISTS refused_writers (
    writer TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    reason TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS run_files (
    run_id TEXT NOT NULL,
    name TEXT NOT NULL,
    stored DOUBLE PRECISION NOT NULL,
    data BYTEA NOT NULL,
    PRIMARY KEY (run_id, name)
);
-- Packed float64 points gain little from compression and cost much CPU to compress: stored as they are.
ALTER TABLE point_blocks ALTER COLUMN points SET STORAGE EXTERNAL;
CREATE TABLE IF NOT EXISTS run_summaries (
    run_id TEXT NOT NULL,
    key TEXT NOT NULL,
    last DOUBLE PRECISION NOT NULL,
    last_ts DOUBLE PRECISION NOT NULL,
    last_seq DOUBLE PRECISION NOT NULL,
    min DOUBLE PRECISION NOT NULL,
    max DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (run_id, key)
);
ALTER TABLE runs ADD COLUMN IF NOT EXISTS started TEXT;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS started_ts DOUBLE PRECISION;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS started_seq BIGINT;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS env_steps BIGINT;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS steps_ts DOUBLE PRECISION;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS tags TEXT;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS note TEXT;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS trace_id TEXT;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS bottleneck TEXT;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS bottleneck_side TEXT;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS bottleneck_phase TEXT;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS bottleneck_ts DOUBLE PRECISION;
"""
_SET_STARTED = (
    "UPDATE runs SET started = s.body, started_ts = s.ts, started_seq = s.seq"
    " FROM unnest(%s::text[], %s::text[], %s::float8[], %s::bigint[]) AS s(run_id, body, ts, seq)"
    " WHERE runs.run_id = s.run_id AND (runs.started_ts IS NULL OR (runs.started_ts, runs.started_seq) < (s.ts, s.seq))"
)
_SET_STEPS = (
    "UPDATE runs SET env_steps = s.steps, steps_ts = s.ts FROM unnest(%s::text[], %s::bigint[], %s::float8[]) AS s(run_id, steps, ts)"
    " WHERE runs.run_id = s.run_id AND (runs.steps_ts IS NULL OR runs.steps_ts <= s.ts)"
)
_SET_BOTTLENECK = (
    "UPDATE runs SET bottleneck = s.body, bottleneck_side = s.side, bottleneck_phase = s.phase, bottleneck_ts = s.ts"
    " FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::float8[]) AS s(run_id, body, side, phase, ts)"
    " WHERE runs.run_id = s.run_id AND (runs.bottleneck_ts IS NULL OR runs.bottleneck_ts <= s.ts)"
)
_SUMMARIZE = (
    "INSERT INTO run_summaries AS r (run_id, key, last, last_ts, last_seq, min, max)"
    " SELECT * FROM unnest(%s::text[], %s::text[], %s::float8[], %s::float8[], %s::float8[], %s::float8[], %s::float8[])"
    " ON CONFLICT (run_id, key) DO UPDATE SET"
    " last = CASE WHEN (excluded.last_ts, excluded.last_seq) > (r.last_ts, r.last_seq) THEN excluded.last ELSE r.last END,"
    " last_seq = CASE WHEN (excluded.last_ts, excluded.last_seq) > (r.last_ts, r.last_seq) THEN excluded.last_seq ELSE r.last_seq END,"
    " last_ts = greatest(r.last_ts, excluded.last_ts), min = least(r.min, excluded.min), max = greatest(r.max, excluded.max)"
)
_BACKFILL_STEPS = (
    "UPDATE runs SET env_steps = s.steps, steps_ts = s.ts FROM ("
    " SELECT DISTINCT ON (run_id) run_id, coalesce(body->'axes'->>'env_steps', body->>'step')::bigint AS steps, ts FROM records"
    " WHERE kind = 'scalars' AND coalesce(body->'axes'->>'env_steps', body->>'step') IS NOT NULL ORDER BY run_id, ts DESC) AS s"
    " WHERE runs.run_id = s.run_id AND runs.steps_ts IS NULL"
)

_INSERT_RECORDS = (
    "INSERT INTO records (writer, seq, run_id, kind, ts, body)"
    " SELECT * FROM unnest(%b::text[], %b::bigint[], %b::text[], %b::text[], %b::float8[], %b::{body}[])"  # %b: arrays sent in binary, not escaped element by element
    " ON CONFLICT DO NOTHING RETURNING writer, seq"
)
_TOUCH_RUNS = (
    "INSERT INTO runs (run_id, status, status_ts, status_seq, created, last_seen)"
    " SELECT id, 'running', 0, -1, %s, %s FROM unnest(%s::text[]) AS id ORDER BY id"  # one lock order for every server
    " ON CONFLICT (run_id) DO UPDATE SET last_seen = greatest(runs.last_seen, excluded.last_seen), lost = FALSE"
    " RETURNING run_id, (xmax = 0)"  # inserted, not updated: the run is new to the database
)
_COPY_BLOCKS = "COPY point_blocks (run_id, key, writer, first_ts, points) FROM STDIN (FORMAT BINARY)"
_SET_STATUS = (
    "UPDATE runs SET status = %s, status_ts = %s, status_seq = %s, project = coalesce(%s, project),"
    " grp = coalesce(%s, grp), meta = coalesce(%s, meta), reason = %s"
    " WHERE run_id = %s AND (status_ts < %s OR (status_ts = %s AND status_seq < %s))"
)


class PostgresStorage:
    """A :class:`otel_rl.readers.server.storage.Storage` on PostgreSQL: a connection per database thread.

    Up to :attr:`threads` calls run at once, each on its own thread's
    connection, so batches from several clients are stored in parallel
    transactions (PostgreSQL orders their locks; a deadlock it breaks is a
    503 the client retries).
    """

    threads = 4
    """Database threads the server may call this storage from at once."""

    def __init__(self, url: str) -> None:
        import psycopg

        self._psycopg = psycopg
        self._url = url
        self._local = threading.local()
        self._opened: list[Any] = []
        self._lock = threading.Lock()
        """Guards the known keys and the list of opened connections."""
        self._known = KnownKeys()
        conn = self._connection()
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(7301)")  # servers starting together make the schema one at a time
                conn.execute(_SCHEMA)
                self._backfill(conn)
        except (psycopg.errors.ReadOnlySqlTransaction, psycopg.errors.InsufficientPrivilege):
            pass  # a read-only database still serves reads; health() says why writes fail
        # A database made before keeps its jsonb bodies: a batch is cast to what the column is.
        body = conn.execute("SELECT data_type FROM information_schema.columns WHERE table_name = 'records' AND column_name = 'body'").fetchone()
        self._insert_records = _INSERT_RECORDS.replace("{body}", body[0] if body and body[0] in ("json", "jsonb") else "json")

    @staticmethod
    def _backfill(conn: Any) -> None:
        """Fill the listing's columns of runs stored before them (once: later runs get them at ingest)."""
        missing = [r[0] for r in conn.execute("SELECT run_id FROM runs WHERE started_ts IS NULL AND steps_ts IS NULL").fetchall()]
        if not missing:
            return
        conn.execute(_BACKFILL_STEPS)
        rows = conn.execute("SELECT body::text FROM records WHERE kind = 'run' AND run_id = ANY(%s)", (missing,)).fetchall()
        found = summaries.started([Row.of(json.loads(body), body) for (body,) in rows])
        if found:
            conn.execute(_SET_STARTED, tuple(map(list, zip(*found, strict=True))))

    def _connection(self):
        """This thread's open connection (autocommit; writes group in explicit transactions), reopened after a failure."""
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            conn = self._local.conn = self._psycopg.connect(self._url, connect_timeout=5, autocommit=True)
            with self._lock:
                self._opened = [c for c in self._opened if not c.closed] + [conn]
        return conn

    def close(self) -> None:
        with self._lock:
            for conn in self._opened:
                conn.close()

    def _unavailable(self, exc: Exception) -> StorageUnavailable:
        conn = getattr(self._local, "conn", None)
        if conn is not None and conn.broken:
            self._local.conn = None
        return StorageUnavailable(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)

    def ingest(self, rows: list[Row], now: float | None = None) -> tuple[int, int]:
        now = time.time() if now is None else now
        psycopg = self._psycopg
        given = len(rows)
        try:
            conn = self._connection()
            with conn.transaction(), conn.cursor() as cursor:
                # One claim of each run id at a time, on every server of the database: the check of the trace that holds
                # it and the records' insert are one transaction under the id's lock, so two runs that start at one
                # instant with the same id never both pass the check (the second is refused, never merged).
                for run_id in sorted({run_id for run_id, _, _ in run_claims(rows)}):
                    cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (run_id,))
                refused = self._other_run(cursor, rows)
                if refused is None:
                    accepted, fresh = self._insert(cursor, rows, now)
            if refused is not None:  # committed above: the writer stays refused
                raise OtherRun(refused)
        except (psycopg.OperationalError, psycopg.errors.ReadOnlySqlTransaction, psycopg.errors.InsufficientPrivilege,
                psycopg.errors.DiskFull, psycopg.errors.AdminShutdown,
                psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure) as exc:  # fmt: skip
            raise self._unavailable(exc) from exc  # 503 and Retry-After: the client sends the batch again
        with self._lock:
            self._known.remember(fresh)
        return accepted, given - accepted

    def _insert(self, cursor: Any, rows: list[Row], now: float) -> tuple[int, list[tuple[str, str]]]:
        """Store a batch's new records and what they change (in the caller's transaction); returns (accepted, fresh keys)."""
        cursor.execute(
            self._insert_records,
            (
                [r.writer for r in rows],
                [r.seq for r in rows],
                [r.run_id for r in rows],
                [r.kind for r in rows],
                [r.ts for r in rows],
                [r.body for r in rows],
            ),
        )
        inserted = set(cursor.fetchall())
        rows = unique_rows([r for r in rows if (r.writer, r.seq) in inserted], set())  # a duplicate changes nothing
        accepted = len(rows)
        cursor.execute(_TOUCH_RUNS, (now, now, list(dict.fromkeys(r.run_id for r in rows))))
        made = {run_id for run_id, inserted in cursor.fetchall() if inserted}  # a run made by this batch holds no key yet
        claims = run_claims(rows)
        if claims:
            cursor.executemany("UPDATE runs SET trace_id = %s WHERE run_id = %s AND trace_id IS NULL",
                               [(trace_id, run_id) for run_id, trace_id, _ in claims])  # fmt: skip
        with self._lock:
            self._known.forget(made)
            fresh = self._known.new(rows)
        for r in rows:
            if r.kind == "run":
                order = status_order(r, now)
                cursor.execute(
                    _SET_STATUS,
                    (r.status, order, r.seq, r.project, r.group, r.meta, r.reason, r.run_id, order, order, r.seq),
                )
        if fresh:
            cursor.execute(
                "INSERT INTO series_keys (run_id, key) SELECT * FROM unnest(%s::text[], %s::text[])"
                " ON CONFLICT DO NOTHING",
                ([run for run, _ in fresh], [key for _, key in fresh]),
            )
        blocks = point_blocks(rows)
        if blocks:  # binary COPY: the packed points go as they are, not escaped as text
            with cursor.copy(_COPY_BLOCKS) as copy:
                copy.set_types(["text", "text", "text", "float8", "bytea"])
                for block in blocks:
                    copy.write_row(block)
        self._describe(cursor, rows, blocks)
        return accepted, fresh

    @staticmethod
    def _other_run(cursor: Any, rows: list[Row]) -> str | None:
        """Why the batch is refused: a writer refused before, or a run record of another run than the one holding its id."""
        cursor.execute("SELECT reason FROM refused_writers WHERE writer = ANY(%s) LIMIT 1", (list(dict.fromkeys(r.writer for r in rows)),))
        found = cursor.fetchone()
        if found:
            return found[0]
        for run_id, trace_id, writer in run_claims(rows):
            cursor.execute("SELECT trace_id FROM runs WHERE run_id = %s", (run_id,))
            held = cursor.fetchone()
            if held and held[0] and held[0] != trace_id:
                reason = other_run(run_id, held[0], trace_id)
                cursor.execute("INSERT INTO refused_writers (writer, run_id, reason) VALUES (%s, %s, %s) ON CONFLICT (writer) DO NOTHING",
                               (writer, run_id, reason))  # fmt: skip
                return reason
        return None

    @staticmethod
    def _describe(cursor: Any, rows: list[Row], blocks: list[tuple]) -> None:
        """Keep the runs' listing columns and key summaries up to date with new ``rows`` and their point blocks (in a transaction)."""
        for statement, found in ((_SET_STARTED, summaries.started(rows)), (_SET_STEPS, summaries.newest_steps(rows)),
                                 (_SET_BOTTLENECK, summaries.newest_bottleneck(rows)),
                                 (_SUMMARIZE, summaries.key_summaries(blocks))):  # fmt: skip
            if found:
                cursor.execute(statement, tuple(map(list, zip(*found, strict=True))))

    def health(self) -> str | None:
        try:
            conn = self._connection()
            with conn.transaction(force_rollback=True):  # a write that is rolled back: fails when read-only
                conn.execute("INSERT INTO series_keys (run_id, key) VALUES ('', '') ON CONFLICT DO NOTHING")
        except self._psycopg.Error as exc:
            return self._unavailable(exc).reason
        return None

    def _query(self, sql: str, params: tuple = ()) -> list[tuple]:
        errors = self._psycopg.errors
        try:
            return self._connection().execute(sql, params).fetchall()
        except (self._psycopg.OperationalError, errors.ReadOnlySqlTransaction, errors.InsufficientPrivilege, errors.DiskFull) as exc:
            raise self._unavailable(exc) from exc

    def mark_lost(self, silent_for_s: float, now: float | None = None) -> list[str]:
        now = time.time() if now is None else now
        rows = self._query(
            "UPDATE runs SET lost = TRUE WHERE NOT lost AND status IN ('pending', 'running') AND last_seen < %s RETURNING run_id",
            (now - silent_for_s,),
        )
        return [r[0] for r in rows]

    def runs(self, limit: int = 100, after: str | None = None, only: RunFilter = RunFilter(), keys: list[str] = ()) -> list[dict[str, Any]]:
        rows = self._query(*only.listing("%s", "ILIKE", after, limit, keys))
        return [summaries.attach(run_dict(r), keys, r[len(RUN_FIELDS) :]) for r in rows]

    def facets(self) -> dict[str, list[str]]:
        return facets_of(self._query(FACETS))

    def last_values(self, run_ids: list[str]) -> dict[str, dict[str, float]]:
        found: dict[str, dict[str, float]] = {}
        for run_id, key, last in self._query("SELECT run_id, key, last FROM run_summaries WHERE run_id = ANY(%s)", (run_ids,)):
            found.setdefault(run_id, {})[key] = last
        return found

    def run(self, run_id: str) -> dict[str, Any] | None:
        rows = self._query(f"SELECT {', '.join(RUN_FIELDS)} FROM runs WHERE run_id = %s", (run_id,))
        return run_dict(rows[0]) if rows else None

    def records(self, run_id: str, kind: str | None = None) -> list[dict[str, Any]]:
        query = "SELECT body FROM records WHERE run_id = %s" + (" AND kind = %s" if kind else "") + " ORDER BY ts, seq"
        return [r[0] for r in self._query(query, (run_id, kind) if kind else (run_id,))]

    def events(self, run_id: str, latest: int) -> tuple[list[dict[str, Any]], int]:
        rows = self._query(
            "SELECT body FROM (SELECT body, ts, seq FROM records WHERE run_id = %s AND kind = 'event'"
            " ORDER BY ts DESC, seq DESC LIMIT %s) AS newest ORDER BY ts, seq",
            (run_id, latest),
        )
        total = self._query("SELECT count(*) FROM records WHERE run_id = %s AND kind = 'event'", (run_id,))[0][0]
        return [r[0] for r in rows], total

    def series(self, run_id: str, key: str) -> list[dict[str, Any]]:
        rows = self._query(
            "SELECT (body->>'step')::bigint, (body->'axes'->>'env_steps')::bigint, (body->'axes'->>'iteration')::bigint,"
            " (body->'values'->>%s)::float8, ts FROM records"
            " WHERE run_id = %s AND kind = 'scalars' AND body->'values'->%s IS NOT NULL ORDER BY ts, seq",
            (key, run_id, key),
        )
        return [dict(zip(("step", "env_steps", "iteration", "value", "ts"), r, strict=True)) for r in rows]

    def curve(self, run_id: str, key: str) -> dict[str, Any]:
        rows = self._query("SELECT writer, points FROM point_blocks WHERE run_id = %s AND key = %s", (run_id, key))
        return read_blocks([(writer, bytes(points)) for writer, points in rows])

    def keys(self, run_id: str) -> list[str]:
        return [r[0] for r in self._query("SELECT key FROM series_keys WHERE run_id = %s ORDER BY key", (run_id,))]

    def annotate(self, run_id: str, tags: list[str] | None, note: str | None) -> bool:
        rows = self._query("UPDATE runs SET tags = coalesce(%s, tags), note = coalesce(%s, note) WHERE run_id = %s RETURNING run_id",
                           (None if tags is None else json.dumps(tags), note, run_id))  # fmt: skip
        return bool(rows)

    def delete(self, run_id: str) -> bool:
        errors = self._psycopg.errors
        try:
            conn = self._connection()
            with conn.transaction():
                for table in RUN_TABLES[:-1]:
                    conn.execute(f"DELETE FROM {table} WHERE run_id = %s", (run_id,))
                return conn.execute("DELETE FROM runs WHERE run_id = %s RETURNING run_id", (run_id,)).fetchone() is not None
        except (self._psycopg.OperationalError, errors.ReadOnlySqlTransaction, errors.InsufficientPrivilege, errors.DiskFull) as exc:
            raise self._unavailable(exc) from exc

    def put_file(self, run_id: str, name: str, data: bytes) -> bool:
        rows = self._query(
            "INSERT INTO run_files (run_id, name, stored, data) SELECT run_id, %s, %s, %s FROM runs WHERE run_id = %s"
            " ON CONFLICT (run_id, name) DO UPDATE SET stored = excluded.stored, data = excluded.data RETURNING run_id",
            (name, time.time(), data, run_id),
        )
        return bool(rows)

    def set_bottleneck(self, run_id: str, verdict: dict[str, Any]) -> bool:
        rows = self._query(
            "UPDATE runs SET bottleneck = %s, bottleneck_side = %s, bottleneck_phase = %s, bottleneck_ts = %s WHERE run_id = %s RETURNING run_id",
            (json.dumps(verdict), verdict.get("side") or "", verdict.get("phase") or "", summaries.TRACE_VERDICT_TS, run_id),
        )
        return bool(rows)

    def file(self, run_id: str, name: str) -> bytes | None:
        rows = self._query("SELECT data FROM run_files WHERE run_id = %s AND name = %s", (run_id, name))
        return bytes(rows[0][0]) if rows else None

    def file_names(self, run_id: str, prefix: str) -> list[str]:
        rows = self._query("SELECT name FROM run_files WHERE run_id = %s AND left(name, %s) = %s ORDER BY name", (run_id, len(prefix), prefix))
        return [r[0] for r in rows]

    def trace_of(self, run_id: str) -> str | None:
        rows = self._query("SELECT trace_id FROM runs WHERE run_id = %s", (run_id,))
        return rows[0][0] if rows else None

    def count(self, run_id: str | None = None) -> int:
        if run_id is None:
            return self._query("SELECT count(*) FROM records")[0][0]
        return self._query("SELECT count(*) FROM records WHERE run_id = %s", (run_id,))[0][0]
