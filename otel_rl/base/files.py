"""Helpers shared by the exporters that stream to a file kept open across writes."""

from __future__ import annotations

import contextlib
from typing import IO


def close_quietly(file: IO | None) -> None:
    """Close a file whose disk may be failing: an error on close has nothing left to lose."""
    if file is not None:
        with contextlib.suppress(OSError):
            file.close()
