"""A throwaway PostgreSQL server on a loopback port, from Debian's postgresql-15 binaries."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ports import free_port

BIN = Path("/usr/lib/postgresql/15/bin")


def _as_postgres(args: list[str]) -> list[str]:
    # initdb and the server refuse to run as root.
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


class Postgres:
    """Started by :meth:`start`, stopped by :meth:`stop`; each test gets its own database (:meth:`database`)."""

    def __init__(self) -> None:
        self.data = Path(tempfile.mkdtemp(prefix="otel-rl-pg-"))
        self.port = free_port()
        self._count = 0

    def start(self) -> Postgres:
        if not (BIN / "initdb").exists():
            raise RuntimeError(f"no PostgreSQL 15 at {BIN}: the test command installs Debian's postgresql-15")
        if os.geteuid() == 0:
            shutil.chown(self.data, "postgres", "postgres")
        self._run([str(BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "otel", "--no-sync"])
        self.resume()
        return self

    def resume(self) -> None:
        """Start the server on its data folder again (after :meth:`crash`)."""
        options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        self._run([str(BIN / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.data / "log"), "-w", "start"])

    def crash(self) -> None:
        """Stop the server as a crash would (``-m immediate``), keeping its data for :meth:`resume`."""
        self._run([str(BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"])

    def _run(self, args: list[str]) -> None:
        result = subprocess.run(_as_postgres(args), capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"{args[0]} failed: {result.stdout}{result.stderr}")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://otel@127.0.0.1:{self.port}/{database}"

    def database(self) -> str:
        """A new, empty database; its URL."""
        import psycopg

        self._count += 1
        name = f"test_{os.getpid()}_{self._count}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def sql(self, statement: str, database: str = "postgres") -> None:
        import psycopg

        with psycopg.connect(self.url(database), autocommit=True) as conn:
            conn.execute(statement)

    def stop(self) -> None:
        subprocess.run(_as_postgres([str(BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"]),
                       capture_output=True, timeout=60)  # fmt: skip
        shutil.rmtree(self.data, ignore_errors=True)
