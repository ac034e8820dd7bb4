from __future__ import annotations

import os
import subprocess

import pytest

from otel_rl.core.pipeline import RecordSink

# A run given no folder records into ./runs: the suite's runs name theirs (or none), module fixtures and subprocesses too.
os.environ["OTEL_RL_RUN_DIR"] = "off"

_OTEL_PREFIXES = ("OTEL_", "MOTRIX_", "TRACEPARENT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "SLURM_")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """Each test starts from an environment without OTEL_* or MOTRIX_* settings."""
    for name in list(os.environ):
        if name.startswith(_OTEL_PREFIXES):
            monkeypatch.delenv(name)
    # A test that wants a run folder names one: none of them fills the working directory's runs/.
    monkeypatch.setenv("OTEL_RL_RUN_DIR", "off")
    from otel_rl.base.log import DEDUP

    DEDUP.reset()
    yield


@pytest.fixture
def small_disk(tmp_path):
    """A real 256 KiB filesystem (tmpfs) that can be filled up and freed again."""
    mount = tmp_path / "disk"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True, text=True)
    assert result.returncode == 0, f"this test mounts a tmpfs (needs root, as CI has): {result.stderr}"
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


class CaptureSink(RecordSink):
    """A real sink that keeps every record it is given."""

    def __init__(self) -> None:
        self.iterations = []
        self.phases = []
        self.scalars = []
        self.events = []
        self.runs = []

    def on_iterations(self, batch):
        self.iterations.extend(batch)

    def on_phases(self, batch):
        self.phases.extend(batch)

    def on_scalars(self, batch):
        self.scalars.extend(batch)

    def on_event(self, event):
        self.events.append(event)

    def on_run_start(self, run):
        self.runs.append(run)

    def on_run_end(self, run):
        self.runs.append(run)


@pytest.fixture
def capture():
    return CaptureSink()


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL server for the session (see postgres_server.py)."""
    from postgres_server import Postgres

    server = Postgres().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request, tmp_path):
    """Where an ingest server keeps its records: each storage backend in turn."""
    if request.param == "sqlite":
        return str(tmp_path / "ingest.sqlite3")
    return request.getfixturevalue("postgres").database()
