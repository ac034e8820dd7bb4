"""The user's private otel-rl directory: agents' directories and segments, run-folder locks."""

from __future__ import annotations

import os
from pathlib import Path


def private_dir() -> Path:
    """``/dev/shm/otel-rl-<uid>`` (else under ``TMPDIR``), created 0700; refused when it is not private to this user."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(os.environ.get("TMPDIR", "/tmp"))
    path = base / f"otel-rl-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    if path.stat().st_uid != os.getuid() or path.stat().st_mode & 0o077:
        raise PermissionError(f"{path} is not private to this user")
    return path
