"""Where agents and their producers meet: a private directory per agent, its lock, and what crashes leave.

Every agent serves one directory, ``/dev/shm/otel-rl-<uid>/<name>/`` (mode
0700, segments 0600), and holds an exclusive ``flock`` on its lock file while
it serves. Producers create their segments there; a directory whose agent and
producers are gone is removed by the next producer that starts.
"""

from __future__ import annotations

import fcntl
import os
import re
import struct
import time
from glob import escape as glob_escape
from pathlib import Path

from otel_rl.base.processes import pid_alive, pid_running
from otel_rl.base.user_dir import private_dir as segment_dir
from otel_rl.run.media import HANDOFF_MARK
from otel_rl.config import AGENT_NAME
from otel_rl.shm.segment import AGENT_DONE, laid_out_here, peek_header

AGENT_LOCK = "agent.lock"
"""In an agent's directory: the file its agent holds an exclusive ``flock`` on while it serves."""


def agent_dir(name: str) -> Path:
    """The directory of the agent called ``name`` (created 0700): its producers' segments and its lock."""
    if not AGENT_NAME.fullmatch(name) or name in (".", ".."):
        raise ValueError(f"an agent name is 1 to 64 of A-Z a-z 0-9 _ . -, got {name[:80]!r}")
    path = segment_dir() / name
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def agent_running(directory: Path) -> bool:
    """Whether an agent serves ``directory`` (holds its lock)."""
    try:
        fd = os.open(directory / AGENT_LOCK, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # granted only while no agent holds it exclusively
    except OSError:
        return True
    finally:
        os.close(fd)  # releases the probe's shared lock
    return False


def remove_if_empty(directory: Path) -> None:
    """Remove an agent's directory (and its lock) that holds no segment; quietly keep it otherwise.

    A producer arriving meanwhile makes the directory again (its first try
    finds it gone) and starts a new agent.
    """
    try:
        if not segments(directory):
            (directory / AGENT_LOCK).unlink(missing_ok=True)
            directory.rmdir()
    except OSError:
        pass


def lock_agent(directory: Path, wait_s: float = 1.0) -> int | None:
    """Become the agent of ``directory``: the lock's descriptor, or None when another agent holds it.

    Retried for ``wait_s``: a producer's :func:`agent_running` probe holds a shared lock for microseconds.
    """
    fd = os.open(directory / AGENT_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.01)


def segments(directory: Path, pattern: str = "*.seg", below: bool = False) -> list[Path]:
    """The segment files of ``directory`` (``below``: of each agent's directory in it) matching ``pattern``.

    An agent removes its directory when it ends, at any moment: a directory gone
    while it is read holds none (a glob over it would raise from inside the listing).
    """
    folders = [directory]
    if below:
        try:
            with os.scandir(directory) as entries:
                folders = [Path(entry.path) for entry in entries if entry.is_dir(follow_symlinks=False)]
        except (FileNotFoundError, NotADirectoryError):
            return []
    found: list[Path] = []
    for folder in folders:
        try:
            found.extend(folder.glob(pattern))
        except (FileNotFoundError, NotADirectoryError):
            continue
    return found


def run_prefix(run_id: str) -> str:
    """How the names of a run's segment files begin."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", run_id)[:80] + "-"


def wait_for_agents(run_id: str, timeout_s: float) -> bool:
    """Wait while an agent still finishes the outputs of ``run_id`` for a producer that died; True when none does.

    A run resumed right after a SIGKILL would otherwise write its folder while
    the dead producer's agent is still writing its end there, or before an agent
    that is still starting (or one started for the orphan) has written any of it.
    A segment that no agent may try any more (:data:`MAX_RECOVERIES`) is not waited for.
    """
    prefix = run_prefix(run_id)
    deadline = time.monotonic() + timeout_s
    while True:
        busy = False
        for path in segments(segment_dir(), f"{glob_escape(prefix)}*.seg", below=True):
            try:
                header = peek_header(path)
            except (OSError, struct.error):
                continue
            if header is not None and header["agent_state"] != AGENT_DONE and header["agents"] < MAX_RECOVERIES:
                busy = busy or not pid_alive(header["pid"])
        if not busy:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


STALE_AFTER_S = 60.0
"""A file this old that never became a segment (its producer died creating it) is removed by the next producer."""
MAX_RECOVERIES = 3
"""Agents that may try to finish an orphaned segment; past them (each died on it) it is removed."""


def tidy(directory: Path) -> tuple[list[Path], set[Path]]:
    """What producers and agents that both died left in ``directory`` and the agents' directories in it.

    Returns the segments removed (served to the end, or never initialised)
    and the agents' directories holding orphans: segments whose records may
    not all be written yet, for a new agent to serve (it reads them to their
    end and ends their runs as killed). An agent's directory with neither a
    segment nor an agent is removed.
    """
    removed, orphaned = [], set()
    for path in [*segments(directory), *segments(directory, below=True)]:
        try:
            header = peek_header(path)
            if header is None:  # never initialised: being created, or its producer died creating it
                if time.time() - path.stat().st_mtime >= STALE_AFTER_S:
                    path.unlink()
                    removed.append(path)
                continue
            if pid_running(header["pid"]) or pid_running(header["agent_pid"]):
                continue
            if not laid_out_here(path, header):  # another otel-rl version's: an agent of this one would refuse it again and again
                continue
            if header["agent_state"] == AGENT_DONE or header["agents"] >= MAX_RECOVERIES:
                path.unlink()
                removed.append(path)
            elif not agent_running(path.parent):
                orphaned.add(path.parent)
        except (OSError, struct.error):
            continue
    for agent in directory.iterdir():  # an agent's directory whose agent ended and producers left
        try:
            if not agent.is_dir() or time.time() - agent.stat().st_mtime < STALE_AFTER_S or agent_running(agent):
                continue
            remove_if_empty(agent)
        except OSError:
            continue
    removed.extend(_tidy_handoffs(directory))
    return removed, orphaned


def _tidy_handoffs(directory: Path) -> list[Path]:
    """Handoff files of videos and images whose producer died and whose segment is gone (no agent will write them)."""
    removed = []
    for path in segments(directory, f"*{HANDOFF_MARK}*", below=True):
        stem = path.name.split(HANDOFF_MARK, 1)[0]
        parts = stem.rsplit("-", 2)
        pid = int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None
        try:
            if (path.parent / f"{stem}.seg").exists() or pid_running(pid) or time.time() - path.stat().st_mtime < STALE_AFTER_S:
                continue
            path.unlink()
            removed.append(path)
        except OSError:
            continue
    return removed
