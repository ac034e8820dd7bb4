"""A run's lifecycle: the statuses every writer says and every reader reads (the protocol's ``run`` record enum).

``pending`` (announced at ``init()``), ``running`` (``tel.run()`` opened it),
then one terminal status: ``finished``, ``failed`` (an exception, a non-zero
exit) or ``killed`` (a signal, a vanished process). ``lost`` is a reader's word,
never written in a record: a run whose end never came (the server's stale
runs, a resumed run's earlier part that a SIGKILL cut short).
"""

from __future__ import annotations

from enum import Enum


class RunStatus(str, Enum):
    """A status of the ``run`` record; each compares equal to its text (``RunStatus.FINISHED == "finished"``)."""

    PENDING = "pending"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    KILLED = "killed"

    def __str__(self) -> str:
        return self.value


PENDING, RUNNING, FINISHED, FAILED, KILLED = RunStatus.PENDING, RunStatus.RUNNING, RunStatus.FINISHED, RunStatus.FAILED, RunStatus.KILLED
TERMINAL = frozenset({FINISHED, FAILED, KILLED})
"""The statuses a run ends with."""
LOST = "lost"
"""A reader's status for a run whose end never came (not a record's)."""
STATUSES = (*(status.value for status in RunStatus), LOST)
"""Every status a reader may show, in lifecycle order."""
