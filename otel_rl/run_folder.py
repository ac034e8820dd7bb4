"""One writer per run folder: the training process that owns a run's folder holds a lock on it.

Two processes started with the same ``run_dir`` (or the same run resumed
twice at once) would interleave their records in one ``metrics.jsonl``, one
trace and one summary. The first holds an exclusive ``flock`` on
``<run_dir>/.otel-rl.lock`` until its ``close()`` returns (the kernel drops it
if the process dies, so a resume after a crash is never refused); the second
is refused at ``init()`` with an error naming the folder and the holder.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_FILE = ".otel-rl.lock"


class RunFolderInUse(RuntimeError):
    """Another live process writes this run folder."""


def claim(run_dir: Path) -> int:
    """Hold ``run_dir``'s lock (creating the folder): its descriptor, to pass to :func:`release`.

    Raises:
        RunFolderInUse: another process holds it.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "another process"
        os.close(fd)
        raise RunFolderInUse(
            f"run_dir {str(run_dir)!r} is in use by process {holder} (a run writes there); "
            "give this run its own run_dir, or resume it once that process has ended"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def release(fd: int | None) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
