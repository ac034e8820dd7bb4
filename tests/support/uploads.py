"""The upload a run's agent starts detached when the run ends (``python -m otel_rl.agent.send_run ... --trace-only``), awaited by its outcome."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil


def _uploading(run_dir: Path) -> bool:
    """Whether a detached upload (or an ``otel-rl backfill``) of ``run_dir`` still runs."""
    folder = str(run_dir)
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if ("backfill" in cmdline or "otel_rl.agent.send_run" in cmdline) and folder in cmdline:
            return True
    return False


def upload_outcome(run_dir: Path, timeout_s: float = 600.0) -> dict:
    """``run_dir/trace_upload.json`` once the detached upload wrote it.

    It runs at a lower priority, so a busy machine makes it late, never
    wrong: the wait is long and ends as soon as the outcome is there. An
    upload that ended without writing one fails at once.
    """
    note = Path(run_dir) / "trace_upload.json"
    deadline = time.monotonic() + timeout_s
    gone_since: float | None = None
    while not note.exists():
        now = time.monotonic()
        assert now < deadline, f"no {note} after {timeout_s:.0f} s"
        if _uploading(run_dir):
            gone_since = None
        elif gone_since is None:
            gone_since = now
        elif now - gone_since > 30:  # nothing uploading for half a minute (the agent may not have started it yet before that)
            raise AssertionError(f"no upload of {run_dir} runs, and it left no {note.name}")
        time.sleep(0.2)
    time.sleep(0.1)  # written by write_text: let a write under way finish
    return json.loads(note.read_text())
