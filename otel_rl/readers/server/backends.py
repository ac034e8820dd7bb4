"""Opening the ingest server's storage by its location."""

from __future__ import annotations

from pathlib import Path

from otel_rl.readers.server.sqlite import SqliteStorage
from otel_rl.readers.server.storage import Storage


def open_storage(location: str | Path) -> Storage:
    """A ``postgresql://`` URL opens PostgreSQL; anything else is a SQLite file."""
    text = str(location)
    if text.startswith(("postgresql://", "postgres://")):
        from otel_rl.readers.server.postgres import PostgresStorage

        return PostgresStorage(text)
    return SqliteStorage(text)
