"""One writer per run folder: the training process that owns a run's folder holds a lock on it.

Two processes started with the same ``run_dir`` (or the same run resumed
twice at once) would interleave their records in one ``metrics.jsonl``, one
trace and one summary. The first holds an exclusive ``flock`` on a lock file
named after the folder's real path, in the user's private otel-rl directory
(nothing is added to the run folder), until its ``close()`` returns; the
kernel drops it if the process dies, so a resume after a crash is never
refused. The second is refused at ``init()`` with an error naming the folder
and the holder. Processes on other machines sharing the folder over a network
file system are not seen.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

from otel_rl._logging import logger
from otel_rl.user_dir import private_dir

JSONL_FILE = "metrics.jsonl"
TRACE_FILE = "trace.perfetto-trace"
SUMMARY_FILE = "run_summary.json"
CONFIG_FILE = "run_config.json"
"""The files a run folder holds (the outputs that write them name them from here)."""

_logger = logger(__name__)


class RunFolderInUse(RuntimeError):
    """Another live process writes this run folder."""


def _lock_path(run_dir: Path) -> Path:
    locks = private_dir() / "run-folders"
    locks.mkdir(mode=0o700, exist_ok=True)
    digest = hashlib.blake2b(str(run_dir.resolve()).encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()
    return locks / f"{digest}.lock"


def claim(run_dir: Path) -> int | None:
    """Hold ``run_dir``'s lock: its descriptor, to pass to :func:`release` (None when no lock can be had here).

    Raises:
        RunFolderInUse: another process holds it.
    """
    try:
        fd = os.open(_lock_path(run_dir), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:  # no private directory: the run goes on unguarded, said once
        _logger.warning("otel-rl: cannot lock the run folder %s (%s); two writers would not be noticed", run_dir, exc)
        return None
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
