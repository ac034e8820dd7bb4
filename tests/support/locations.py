"""Where the tests' helpers, fixtures and the repository are."""

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
"""This folder: the helper modules (importable by name, see ``pythonpath`` in pyproject.toml) and the target scripts."""
FIXTURES = SUPPORT / "fixtures"
REPO = SUPPORT.parents[1]


def interruptible() -> None:
    """``preexec_fn`` of a child a test interrupts: a suite started in the background ignores SIGINT, and so would the child's Python."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
