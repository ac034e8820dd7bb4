"""Reading W&B runs back with W&B's own reader (``wandb leet inspect``), as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def run_dirs(run_dir: Path) -> list[Path]:
    """The offline W&B runs written under ``run_dir``, oldest first."""
    return sorted((run_dir / "wandb").glob("offline-run-*"))


def _inspect(path: Path, *options: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}  # a test's own W&B variables are not the reader's
    result = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", *options, str(path)],
        capture_output=True, text=True, timeout=60, check=True, env=env,
    )  # fmt: skip
    return result.stdout


def records(path: Path) -> list[dict]:
    """Every record of one run's transaction log."""
    return [json.loads(line) for line in _inspect(path).splitlines() if line.startswith("{")]


def history(path: Path) -> list[dict]:
    """The rows logged to one run, in order."""
    return [r["history"]["item"] for r in records(path) if r["type"] == "history"]


def summary(path: Path) -> dict:
    """The run's state, exit code, config and summary."""
    return json.loads(_inspect(path, "--summary"))
