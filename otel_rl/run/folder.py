"""One writer per run folder: the training process that owns a run's folder holds a lock on it.

Two processes started with the same ``run_dir`` (or the same run resumed
twice at once) would interleave their records in one ``metrics.jsonl``, one
trace and one summary. The first holds an exclusive ``flock`` on a lock file
named after the folder's real path, in the user's private otel-rl directory
(nothing is added to the run folder), until its ``close()`` returns; the
kernel drops it if the process dies, so a resume after a crash is never
refused. The second is refused at ``init()`` with an error naming the folder
and the holder. Processes on other machines sharing the folder over a network
file system are not seen. The holder removes the lock file when it is done, so
lock files do not pile up over a machine's runs (only a killed process leaves
one, which the folder's next run reuses and removes).

Two jobs of several ranks started at once under one id (one ``SLURM_JOB_ID``,
so one default folder) are told apart by their rendezvous
(``MASTER_ADDR:MASTER_PORT``, which every rank of a job shares and no two live
jobs can): rank 0 notes its job's rendezvous in the folder it holds
(:data:`JOB_NOTE`); a rank 0 that finds the folder held by another job's
takes the next free name, as one process does, and leaves a note of where it
went (:func:`note_moved`), which its other ranks follow (:func:`job_folder`).

A folder that holds an ended run is never written by another one unless it
resumes it: :func:`claim_fresh` gives the new run a sibling folder of its own
(``runs/exp`` -> ``runs/exp-2``), so a script run twice leaves two runs, never
one run with two starts. A job of several ranks keeps the folder its ranks
agreed on (they cannot all move to one new name at once): a job started twice
onto one ``run_dir`` writes into it again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import os
import time
from dataclasses import dataclass
from pathlib import Path

from otel_rl.base import environment_variables as env
from otel_rl.base.log import logger
from otel_rl.base.user_dir import private_dir
from otel_rl.run.files import CONFIG_FILE, JSONL_FILE, SUMMARY_FILE

_logger = logger(__name__)


JOB_NOTE = ".otel-rl-job"
"""In a folder a job of several ranks writes: the rendezvous of that job (its other ranks stay)."""
MOVED_NOTE = ".otel-rl-moved-"
"""In that folder: ``MOVED_NOTE + digest of a rendezvous`` names the folder another job with the same id moved to."""
FOLLOW_S = 20.0
"""How long a rank other than 0 waits, at ``init()``, for its rank 0 to say where its job went (only when another job holds the folder)."""


def job_key() -> str | None:
    """The rendezvous every rank of this job shares (``MASTER_ADDR:MASTER_PORT``, as every rank has it, on every
    machine), None where the launcher gives none."""
    addr, port = os.environ.get(env.MASTER_ADDR, "").strip(), os.environ.get(env.MASTER_PORT, "").strip()
    return f"{addr}:{port}" if addr and port else None


def _digest(key: str) -> str:
    return hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip()
    except (OSError, ValueError):
        return None


def _write(path: Path, text: str) -> None:
    """Write ``path`` whole (a reader sees the old text or the new, never half); a folder that takes none costs nothing."""
    part = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # the folder of a run that has not written yet
        part.write_text(text, encoding="utf-8")
        os.replace(part, path)
    except OSError:
        with contextlib.suppress(OSError):
            part.unlink()


def note_job(run_dir: Path, key: str) -> Path:
    """Rank 0 holds ``run_dir`` for the job of rendezvous ``key``: its other ranks stay there. Returns the note (removed at close)."""
    _write(run_dir / JOB_NOTE, key)
    return run_dir / JOB_NOTE


def note_moved(run_dir: Path, key: str, fresh: Path) -> Path:
    """Rank 0 of the job of rendezvous ``key`` found ``run_dir`` held by another job and moved to ``fresh``. Returns the note."""
    note = run_dir / (MOVED_NOTE + _digest(key))
    _write(note, fresh.name)
    return note


def forget(notes: list[Path]) -> None:
    """The job's notes, once its rank 0 closes (its ranks found their folder at their start): a folder keeps only its run."""
    for note in notes:
        with contextlib.suppress(OSError):
            note.unlink()
    notes.clear()


def job_folder(run_dir: Path, key: str, wait_s: float = FOLLOW_S) -> Path | None:
    """The folder a rank other than 0 of the job of rendezvous ``key`` writes: ``run_dir``, or where its rank 0 moved.

    Only while another job holds ``run_dir`` does it wait (up to ``wait_s``) for its rank 0 to say where it went;
    None when it does not say (the rank then records into no folder).
    """
    moved = run_dir / (MOVED_NOTE + _digest(key))
    end = time.monotonic() + wait_s
    while True:
        name = _read(moved)
        if name and "/" not in name and name not in (".", ".."):
            return run_dir.with_name(name)
        owner = _read(run_dir / JOB_NOTE)
        if owner is None or owner == key:  # no job holds it yet (this rank is first), or this job does
            return run_dir
        if time.monotonic() >= end:
            return None
        time.sleep(0.05)


class RunFolderInUse(RuntimeError):
    """Another live process writes this run folder."""


def lock_path(run_dir: Path) -> Path:
    """Where the lock of ``run_dir`` lives: in the user's private directory, never in the run folder itself."""
    locks = private_dir() / "run-folders"
    locks.mkdir(mode=0o700, exist_ok=True)
    digest = hashlib.blake2b(str(run_dir.resolve()).encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()
    return locks / f"{digest}.lock"


@dataclass(frozen=True)
class Claim:
    """A held run-folder lock: the lock file's descriptor and path."""

    fd: int
    path: Path


def claim(run_dir: Path) -> Claim | None:
    """Hold ``run_dir``'s lock, to pass to :func:`release` (None when no lock can be had here).

    Raises:
        RunFolderInUse: another process holds it.
    """
    while True:
        try:
            path = lock_path(run_dir)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
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
        if _same_file(fd, path):
            break
        os.close(fd)  # the holder before us removed the file we opened: lock the one there now
    with contextlib.suppress(OSError):  # a full /dev/shm: the lock holds, a refusal just cannot name this process
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
    held = Claim(fd, path)
    _held.add(held)
    return held


_held: set[Claim] = set()
"""Locks this process holds: a forked child lets go of its copies (the lock stays its parent's alone)."""


def _after_fork_in_child() -> None:
    for held in list(_held):
        with contextlib.suppress(OSError):
            os.close(held.fd)
    _held.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _same_file(fd: int, path: Path) -> bool:
    try:
        held, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)


def release(held: Claim | None) -> None:
    """Remove the lock file, then let go of it (a process waiting on the removed file tries the path again)."""
    if held is not None and held in _held:
        _held.discard(held)
        with contextlib.suppress(OSError):
            os.unlink(held.path)
        with contextlib.suppress(OSError):
            os.close(held.fd)


def holds_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds the files a run's owner writes (its records, configuration or summary).

    Trace parts do not count: a worker or another rank of the run starting may have written its own already.
    """
    def written(path: Path) -> bool:  # a regular file with something in it (not a FIFO or a device put there)
        return path.is_file() and path.stat().st_size > 0

    try:
        return any(written(run_dir / name) for name in (JSONL_FILE, CONFIG_FILE, SUMMARY_FILE))
    except OSError:
        return False


def claim_fresh(run_dir: Path) -> tuple[Claim | None, Path]:
    """Make and hold the first of ``run_dir-2``, ``run_dir-3``, ... that can be made: the folder of a run whose
    ``run_dir`` holds another. Returns its claim (see :func:`claim`) and the folder.

    Each is made with one ``mkdir``, which fails where anything is (a folder, a file, a dangling symbolic
    link, one another process made an instant before): those are passed over. ``run_dir`` is named by its
    real path (``.`` has no name of its own).
    """
    base = Path(os.path.realpath(run_dir))
    for number in itertools.count(2):
        candidate = base.with_name(f"{base.name}-{number}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        except OSError as exc:  # the parent cannot take a folder: the run's outputs say so when they write
            _logger.warning("otel-rl: cannot make %s (%s)", candidate, exc)
        try:
            return claim(candidate), candidate
        except RunFolderInUse:  # a process that moved there an instant before: the next one
            continue
    raise AssertionError("unreachable")  # itertools.count never ends
