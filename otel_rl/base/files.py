"""Helpers for the files otel-rl writes: streams kept open across writes, and small documents replaced whole."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import IO


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` at once: a reader sees the old document or the new one, never a part.

    Raises:
        OSError: the folder cannot be written (the temporary file is removed).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def close_quietly(file: IO | None) -> None:
    """Close a file whose disk may be failing: an error on close has nothing left to lose."""
    if file is not None:
        with contextlib.suppress(OSError):
            file.close()


def safe_name(text: str, fallback: str, limit: int = 100) -> str:
    """``text`` as one file or folder name: no separator or odd character, no leading or trailing dot, at most ``limit``
    characters; ``fallback`` when nothing is left (``Media/play`` -> ``Media_play``)."""
    return re.sub(r"[^\w.@+=-]+", "_", str(text)).strip("._")[:limit] or fallback
