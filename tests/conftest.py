from __future__ import annotations

import os

import pytest
from disks import tmpfs

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
    with tmpfs(tmp_path / "disk", "256k") as mount:
        yield mount


class CaptureSink(RecordSink):
    """A real sink that keeps every record it is given."""

    def __init__(self) -> None:
        self.iterations = []
        self.phases = []
        self.scalars = []
        self.events = []
        self.runs = []
        self.cycles = []

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

    def on_cycles(self, totals):
        self.cycles.append(totals)


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


# The quick loop (pytest -m "not slow", under 5 minutes on 2 cores) leaves out what takes seconds a test: the stories and
# the deployments (end to end, with real servers, collectors and several processes), and the unit tests below, each a
# browser, a real torch.distributed group, a real W&B, a torch.profiler window, or real servers waiting out a retry window.
# make test runs them all.
_SLOW_FOLDERS = ("tests/stories/", "tests/deploy/")
_SLOW_UNIT = (
    "tests/unit/agent/test_agent_cost.py",
    "tests/unit/agent/test_agent.py::test_a_new_agent_takes_over_while_training_runs",
    "tests/unit/agent/test_agent.py::test_two_ranks_and_a_collector_share_one_agent_and_one_trace",
    "tests/unit/agent/test_deadlines.py::test_a_second_sigterm_hurries_the_agent_too",
    "tests/unit/outputs/test_motrix.py::test_service_recovering_within_the_retry_window_loses_no_lifecycle_record",
    "tests/unit/outputs/test_motrix.py::test_drops_are_counted_and_reported_as_one_event_per_queue",
    "tests/unit/outputs/test_motrix.py::test_service_faults_never_reach_training",
    "tests/unit/outputs/test_perfetto_trace.py::test_worker_fragments_are_merged_into_the_learner_trace",
    "tests/unit/outputs/test_wandb.py",
    "tests/unit/readers/test_confidence.py::test_a_repeat_on_a_busy_host_says_the_hosts_differed_before_naming_a_phase",
    "tests/unit/readers/test_ingest_server.py::test_twenty_clients_at_once_store_every_record_once_and_finish",
    "tests/unit/readers/test_ingest_server.py::test_slow_clients_are_closed_and_never_starve_legitimate_uploads",
    "tests/unit/readers/test_ingest_server.py::test_stalled_uploads_cannot_starve_the_server",
    "tests/unit/readers/test_ingest_server.py::test_sigkill_then_backfill_holds_every_flushed_record_once",
    "tests/unit/readers/test_ingest_server.py::test_after_a_sigkill_the_agent_delivers_everything_and_backfill_finds_nothing_new",
    "tests/unit/readers/test_read_api.py::test_a_second_run_with_the_same_run_id_is_refused_in_one_line_never_merged",
    "tests/unit/readers/test_run_files.py::test_the_trace_upload_retries_a_restarting_server_and_says_what_failed_in_the_run_folder",
    "tests/unit/integrations/test_trl.py",
    "tests/unit/readers/test_web_page.py",
    "tests/unit/readers/test_web_page_bottleneck.py",
    "tests/unit/readers/test_web_page_cursor.py",
    "tests/unit/readers/test_web_page_scale.py",
    "tests/unit/training/test_distributed.py",
    "tests/unit/training/test_hotpath.py::test_records_written_while_the_reader_reads_are_all_seen_or_counted",
    "tests/unit/training/test_profile_window.py",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        node = item.nodeid
        if node.startswith(_SLOW_FOLDERS) or any(node == slow or node.startswith((slow + "::", slow + "[")) for slow in _SLOW_UNIT):
            item.add_marker(pytest.mark.slow)
