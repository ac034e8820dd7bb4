"""A shorter interpreter switch interval while outputs are served on a thread of the training process.

A thread that gives the GIL up for a moment (a numpy copy, a file write)
waits a whole switch interval (Python's default: 5 ms) to get it back from a
training thread that never gives it up by itself. The serving thread gives it
up a few hundred times a second, so at the default it spends most of its time
waiting, falls behind a busy loop and its lanes drop records. At 1 ms it keeps
up, and the training thread loses nothing measurable (``bench/overhead.py``,
the ``otel-rl`` arms). The interval is shortened only where the user left
Python's default, while at least one thread host serves, and put back after.
"""

from __future__ import annotations

import sys
import threading

SERVING_INTERVAL_S = 0.001
PYTHON_DEFAULT_S = 0.005

_lock = threading.Lock()
_holders = 0
_shortened = False


def hold() -> None:
    """A thread host starts serving: shorten the interval if the process runs with Python's default."""
    global _holders, _shortened
    with _lock:
        _holders += 1
        if _holders == 1 and sys.getswitchinterval() == PYTHON_DEFAULT_S:
            sys.setswitchinterval(SERVING_INTERVAL_S)
            _shortened = True


def release() -> None:
    """A thread host stopped: the last one puts the interval back (unless the user changed it meanwhile)."""
    global _holders, _shortened
    with _lock:
        _holders = max(0, _holders - 1)
        if _holders == 0 and _shortened:
            if sys.getswitchinterval() == SERVING_INTERVAL_S:
                sys.setswitchinterval(PYTHON_DEFAULT_S)
            _shortened = False
