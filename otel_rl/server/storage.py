"""SQLite storage of the reference ``motrix.metrics/v1`` ingest server.

Records are de-duplicated on ``(writer, seq)``. A run's status is the status of
its newest run record (by ``ts``, then ``seq``), so a late backfill of an old
``running`` record never overwrites a terminal status. ``lost`` is set by the
server when a running run goes silent, and cleared by its next record.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

_SCHEMA = """
PRAGMA journal_mode = WAL;
CREATE TABLE IF NOT EXISTS records (
    writer TEXT NOT NULL,
    seq INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    ts REAL NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (writer, seq)
);
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
CREATE TABLE IF NOT EXISTS scalars (
    run_id TEXT NOT NULL,
    key TEXT NOT NULL,
    step INTEGER,
    env_steps INTEGER,
    iteration INTEGER,
    value REAL,
    ts REAL NOT NULL,
    writer TEXT NOT NULL,
    seq INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS scalars_series ON scalars (run_id, key, ts);
"""


class Storage:
    """A single SQLite connection guarded by a lock (the server calls it from a worker thread)."""

    def __init__(self, path: Path | str) -> None:
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def ingest(self, records: list[dict[str, Any]], now: float | None = None) -> tuple[int, int]:
        """Store a validated batch; returns (accepted, duplicates)."""
        now = time.time() if now is None else now
        accepted = 0
        with self._lock:
            db = self._db
            db.execute("BEGIN")
            try:
                for rec in records:
                    cursor = db.execute(
                        "INSERT OR IGNORE INTO records (writer, seq, run_id, kind, ts, body) VALUES (?, ?, ?, ?, ?, ?)",
                        (rec["writer"], rec["seq"], rec["run_id"], rec["kind"], rec["ts"], json.dumps(rec)),
                    )
                    if cursor.rowcount == 0:
                        continue  # (writer, seq) already stored
                    accepted += 1
                    self._touch_run(rec, now)
                    if rec["kind"] == "scalars":
                        axes = rec.get("axes") or {}
                        db.executemany(
                            "INSERT INTO scalars (run_id, key, step, env_steps, iteration, value, ts, writer, seq)"
                            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            [
                                (
                                    rec["run_id"],
                                    key,
                                    rec.get("step"),
                                    axes.get("env_steps"),
                                    axes.get("iteration"),
                                    value,
                                    rec["ts"],
                                    rec["writer"],
                                    rec["seq"],
                                )
                                for key, value in rec["values"].items()
                            ],
                        )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return accepted, len(records) - accepted

    def _touch_run(self, rec: dict[str, Any], now: float) -> None:
        db = self._db
        run_id = rec["run_id"]
        row = db.execute("SELECT status_ts, status_seq FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            status = rec["status"] if rec["kind"] == "run" else "running"
            db.execute(
                "INSERT INTO runs (run_id, status, status_ts, status_seq, project, grp, meta, reason, created, last_seen)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    status,
                    rec["ts"] if rec["kind"] == "run" else 0.0,
                    rec["seq"] if rec["kind"] == "run" else -1,
                    rec.get("project"),
                    rec.get("group"),
                    json.dumps(rec.get("meta") or {}),
                    rec.get("reason"),
                    now,
                    now,
                ),
            )
            return
        db.execute("UPDATE runs SET last_seen = max(last_seen, ?), lost = 0 WHERE run_id = ?", (now, run_id))
        if rec["kind"] == "run" and (rec["ts"], rec["seq"]) > (row[0], row[1]):
            db.execute(
                "UPDATE runs SET status = ?, status_ts = ?, status_seq = ?, project = coalesce(?, project),"
                " grp = coalesce(?, grp), meta = coalesce(?, meta), reason = ? WHERE run_id = ?",
                (
                    rec["status"],
                    rec["ts"],
                    rec["seq"],
                    rec.get("project"),
                    rec.get("group"),
                    json.dumps(rec["meta"]) if "meta" in rec else None,
                    rec.get("reason"),
                    run_id,
                ),
            )

    def mark_lost(self, silent_for_s: float, now: float | None = None) -> list[str]:
        """Mark pending or running runs silent for ``silent_for_s`` as lost; returns their ids."""
        now = time.time() if now is None else now
        with self._lock:
            rows = self._db.execute(
                "SELECT run_id FROM runs WHERE lost = 0 AND status IN ('pending', 'running') AND last_seen < ?",
                (now - silent_for_s,),
            ).fetchall()
            self._db.executemany("UPDATE runs SET lost = 1 WHERE run_id = ?", rows)
        return [r[0] for r in rows]

    # -- queries --------------------------------------------------------

    def runs(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT run_id, status, lost, project, grp, meta, reason, created, last_seen FROM runs ORDER BY created"
            ).fetchall()
        return [self._run_dict(r) for r in rows]

    def run(self, run_id: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute(
                "SELECT run_id, status, lost, project, grp, meta, reason, created, last_seen FROM runs WHERE run_id = ?",
                (run_id,),
            ).fetchone()
        return None if row is None else self._run_dict(row)

    @staticmethod
    def _run_dict(row: tuple) -> dict[str, Any]:
        run_id, status, lost, project, group, meta, reason, created, last_seen = row
        return {
            "run_id": run_id,
            "status": "lost" if lost else status,
            "reported_status": status,
            "project": project,
            "group": group,
            "meta": json.loads(meta) if meta else {},
            "reason": reason,
            "created": created,
            "last_seen": last_seen,
        }

    def records(self, run_id: str, kind: str | None = None) -> list[dict[str, Any]]:
        query = "SELECT body FROM records WHERE run_id = ?" + (" AND kind = ?" if kind else "") + " ORDER BY ts, seq"
        with self._lock:
            rows = self._db.execute(query, (run_id, kind) if kind else (run_id,)).fetchall()
        return [json.loads(r[0]) for r in rows]

    def series(self, run_id: str, key: str) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT step, env_steps, iteration, value, ts FROM scalars WHERE run_id = ? AND key = ? ORDER BY ts, seq",
                (run_id, key),
            ).fetchall()
        return [dict(zip(("step", "env_steps", "iteration", "value", "ts"), r, strict=True)) for r in rows]

    def keys(self, run_id: str) -> list[str]:
        with self._lock:
            rows = self._db.execute("SELECT DISTINCT key FROM scalars WHERE run_id = ? ORDER BY key", (run_id,)).fetchall()
        return [r[0] for r in rows]

    def count(self, run_id: str | None = None) -> int:
        with self._lock:
            if run_id is None:
                return self._db.execute("SELECT count(*) FROM records").fetchone()[0]
            return self._db.execute("SELECT count(*) FROM records WHERE run_id = ?", (run_id,)).fetchone()[0]
