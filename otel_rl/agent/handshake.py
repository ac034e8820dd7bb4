"""The producer's side of the segment header's protocol: flush, close, hurry, and what the server last reported.

A training process asks the server of its segment (in an agent process, or
on a thread of its own) through the header: it raises ``flush_request`` and
waits for ``flush_done``; it sets ``deadline_ns`` and ``state`` to close; the
server publishes its :class:`~otel_rl.agent.producer.Counts` after every pass
(:meth:`otel_rl.agent.serve.SegmentServer.publish`).
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable

from otel_rl.agent.producer import Counts
from otel_rl.base.deadline import Deadline
from otel_rl.shm import segment as shm

POLL_S = 0.005


def wait(condition: Callable[[], bool], deadline: Deadline) -> bool:
    """Poll ``condition`` until it holds (True) or ``deadline`` passes (False)."""
    while not condition():
        if deadline.left() <= 0:
            return False
        time.sleep(POLL_S)
    return True


def set_deadline(segment: shm.Segment, deadline: Deadline) -> None:
    """The producer's deadline, on ``time.monotonic()`` (one clock for every process of the machine)."""
    segment.set("deadline_ns", max(int(deadline.at * 1e9), 1))


def flush(segment: shm.Segment, deadline: Deadline, serving: Callable[[], bool]) -> bool:
    """Ask for a pass and every output's flush; True when the server did it by ``deadline`` (``serving``: whether it still serves)."""
    set_deadline(segment, deadline)
    request = segment.get("flush_request") + 1
    segment.set("flush_request", request)
    return wait(lambda: segment.get("flush_done") >= request or not serving(), deadline) and serving()


def close(segment: shm.Segment, deadline: Deadline) -> None:
    """Tell the server the producer is closing, with ``deadline``: it serves the rest and closes every output."""
    set_deadline(segment, deadline)
    segment.set("state", shm.CLOSING)


def hurry(segment: shm.Segment, deadline: Deadline) -> None:
    """``deadline`` moved earlier: the server follows (see :class:`otel_rl.agent.watch.ProducerDeadline`)."""
    if segment.control is not None:
        set_deadline(segment, deadline)


def done(segment: shm.Segment) -> bool:
    """Whether the server closed every output."""
    return segment.get("agent_state") == shm.AGENT_DONE


def counts(segment: shm.Segment) -> Counts:
    """What the server published after its last pass (it trails the producer by one pass)."""
    payload = segment.totals()
    return pickle.loads(payload) if payload else Counts()
