"""Reading a Trackio project back with Trackio's own storage reader, in a process of its own (Trackio reads ``TRACKIO_DIR`` once, at import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

_READ = """
import json, sys
from trackio.sqlite_storage import SQLiteStorage
project, run = sys.argv[1:3]
print(json.dumps({"runs": SQLiteStorage.get_runs(project), "logs": SQLiteStorage.get_logs(project, run), "config": SQLiteStorage.get_run_config(project, run)}, default=str))
"""


def read(home: Path, project: str, run: str) -> dict:
    """``runs`` (the project's run names), ``logs`` (the run's rows, each with its ``step``) and ``config`` of a run under ``home``."""
    env = {**os.environ, "TRACKIO_DIR": str(home)}
    out = subprocess.run([sys.executable, "-c", _READ, project, run], capture_output=True, text=True, env=env, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])
