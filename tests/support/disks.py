"""Real small filesystems for the tests of a disk that fills: a tmpfs mounted for the test, unmounted after it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``256k``, ``1m``) at ``mount`` (made if missing), for the block."""
    mount.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True, text=True)
    assert result.returncode == 0, f"this test mounts a tmpfs (needs root, as CI has): {result.stderr}"
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
