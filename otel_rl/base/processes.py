"""Whether a process lives, by its pid (ours or another user's)."""

from __future__ import annotations

import os


def pid_alive(pid: int | None) -> bool:
    """Whether a process with this pid exists (a zombie counts; ours or another user's)."""
    if pid is None or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pid_running(pid: int | None) -> bool:
    """Whether a process with this pid exists and has not exited (a zombie waiting to be collected does not count)."""
    if not pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:  # no /proc here, or it exited just now
        return pid_alive(pid)
    return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] not in (b"Z", b"X")
