"""The user's private otel-rl directory: agents' directories and segments, run-folder locks, this machine's id."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

MACHINE_ID_FILE = "machine-id"


def private_dir() -> Path:
    """``/dev/shm/otel-rl-<uid>`` (else under ``TMPDIR``), created 0700; refused when it is not private to this user."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(os.environ.get("TMPDIR", "/tmp"))
    path = base / f"otel-rl-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    if path.stat().st_uid != os.getuid() or path.stat().st_mode & 0o077:
        raise PermissionError(f"{path} is not private to this user")
    return path


def machine_id() -> str:
    """A random id of this machine, the same for every process that shares its ``/dev/shm`` (its ranks, its agents).

    Made by the first process that asks and read by the others: two machines (or containers) with one host name
    and one boot id still differ. Empty where the private directory cannot be had.
    """
    try:
        folder = private_dir()
        path = folder / MACHINE_ID_FILE
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            pass
        made = folder / f".{MACHINE_ID_FILE}-{os.getpid()}-{secrets.token_hex(4)}"
        made.write_text(secrets.token_hex(16))
        try:
            os.link(made, path)  # the first one made is everyone's: a link never replaces what is there
        except FileExistsError:
            pass
        finally:
            made.unlink(missing_ok=True)
        return path.read_text().strip()
    except OSError:
        return ""

