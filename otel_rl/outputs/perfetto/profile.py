"""A ``torch.profiler`` window on the run's timeline (see :mod:`otel_rl.training.profiling`).

The profiler's chrome trace is read back when its
:data:`otel_rl.formats.schema.EVENT_TORCH_PROFILE` event arrives. Its clock is mapped
onto ``perf_counter_ns`` through the timebase markers recorded inside it
(the tightest pair of readings at each end, linear in between), then onto the
run's epoch timebase. Then:

* CPU operators go on the thread tracks of the threads that ran them, nested
  in the iterations and phases recorded there: each is fitted inside the
  innermost phase holding its midpoint, so that a boundary the two clocks
  disagree on by a few microseconds never breaks the nesting;
* CUDA kernels, memcpys and memsets go on a track per device and stream
  (``stream N (kernels)`` in the ``GPU n`` process), each linked from the
  runtime call that launched it by a flow.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Any

import orjson

from otel_rl.core.batches import IterationBatch, Phases
from otel_rl.formats import schema
from otel_rl.formats.trace import GPU_CATEGORY, OPERATOR_CATEGORY
from otel_rl.formats.trace import PROFILE_MARKER as MARKER
from otel_rl.formats.trace import PROFILE_MARKERS as MARKERS

MAX_KEPT = 50_000
"""Iterations and loose phases kept for a window at most."""
LEAD_NS = 1_000_000_000
"""Before the window starts, records that ended longer ago than this before the latest are let go."""
_CPU_KINDS = frozenset({"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "python_function"})
_GPU_KINDS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"})


@dataclass
class Op:
    """One slice of the profile, on the run's epoch timebase."""

    start_ns: int
    end_ns: int
    name: str
    category: str
    flow: int | None = None  # the launch's correlation id: a flow from the runtime call to its kernel
    terminating: bool = False


@dataclass
class Profile:
    """What a profile holds, per thread and per GPU stream, mapped onto the run's timebase."""

    threads: dict[int, list[Op]] = field(default_factory=dict)
    streams: dict[tuple[int, int], list[Op]] = field(default_factory=dict)


def read_profile(path: Path, markers_ns: Sequence[Sequence[int]], pid: int, clock_offset_ns: int) -> Profile:
    """The operators of the chrome trace at ``path`` recorded by process ``pid``.

    ``markers_ns``: the ``perf_counter_ns`` readings around each timebase
    marker, in order (:data:`MARKERS` at the start, as many at the end).

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not a profiler trace, or its markers are missing.
    """
    document = orjson.loads(Path(path).read_bytes())
    events = document.get("traceEvents") if isinstance(document, dict) else None
    if not isinstance(events, list):
        raise ValueError("not a chrome trace (no traceEvents)")
    complete = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))]
    to_epoch = _clock(complete, markers_ns, clock_offset_ns)
    profile = Profile()
    for event in complete:
        kind, name = event.get("cat"), str(event.get("name", "?"))
        if name == MARKER:
            continue
        start = to_epoch(event["ts"])
        end = max(start, to_epoch(event["ts"] + float(event.get("dur") or 0)))
        args: dict[str, Any] = event["args"] if isinstance(event.get("args"), dict) else {}
        correlation = args.get("correlation")
        if kind in _GPU_KINDS:
            key = (int(args.get("device", event.get("pid", 0)) or 0), int(args.get("stream", event.get("tid", 0)) or 0))
            profile.streams.setdefault(key, []).append(Op(start, end, name, GPU_CATEGORY, correlation, True))
        elif kind in _CPU_KINDS and event.get("pid") == pid and isinstance(event.get("tid"), int):
            flow = correlation if kind == "cuda_runtime" and correlation else None
            profile.threads.setdefault(event["tid"], []).append(Op(start, end, name, OPERATOR_CATEGORY, flow))
    return profile


def _clock(events: list[dict[str, Any]], markers_ns: Sequence[Sequence[int]], clock_offset_ns: int):
    """The profiler's microseconds to epoch nanoseconds, measured on the timebase markers."""
    found = sorted((e for e in events if e.get("name") == MARKER), key=lambda e: e["ts"])
    if len(found) != len(markers_ns) or len(found) < MARKERS:
        raise ValueError(f"{len(found)} timebase markers in the profile, {len(markers_ns)} recorded")

    def tightest(pairs: Iterable[tuple[dict[str, Any], Sequence[int]]]) -> tuple[float, float]:
        # (profiler ns, perf_counter ns) at the midpoint of the marker measured most tightly
        event, (before, after) = min(pairs, key=lambda p: (p[1][1] - p[1][0]) - float(p[0].get("dur") or 0) * 1000)
        return (event["ts"] + float(event.get("dur") or 0) / 2) * 1000, (before + after) / 2

    pairs = list(zip(found, markers_ns))
    first = tightest(pairs[:MARKERS])
    last = tightest(pairs[-MARKERS:]) if len(pairs) >= 2 * MARKERS else first
    span = last[0] - first[0]
    rate = (last[1] - first[1]) / span if span > 0 else 1.0
    rate = rate if 0.999 < rate < 1.001 else 1.0  # a slope that far from 1 is a bad marker, not a clock

    def to_epoch(ts_us: float) -> int:
        return int(first[1] + (ts_us * 1000 - first[0]) * rate) + clock_offset_ns

    return to_epoch


class KeptIntervals:
    """Where the iterations and phases a profile's operators will be fitted into ran, while its window may still come.

    Per thread, ``(start_ns, end_ns)`` of every iteration and phase (nested
    ones too). Before the window's first learner iteration, only the last
    :data:`LEAD_NS` are held (a collector's iteration that began before the
    window still holds operators of it); from there on every one, up to
    :data:`MAX_KEPT`.
    """

    def __init__(self, start: int, count: int) -> None:
        self._spans: deque[tuple[int, int, int]] = deque(maxlen=MAX_KEPT)
        self.names: dict[int, str] = {}
        """Each thread's name."""
        self._start, self._end = start, start + count
        self._inside = False

    @property
    def intervals(self) -> dict[int, list[tuple[int, int]]]:
        """Per thread, the intervals kept."""
        out: dict[int, list[tuple[int, int]]] = {}
        for thread, start, end in self._spans:
            out.setdefault(thread, []).append((start, end))
        return out

    def add_iterations(self, batch: IterationBatch) -> bool:
        """Keep ``batch``'s intervals; False once no window can come any more (a learner iteration past it: its profile failed)."""
        if batch.timeline == schema.LEARNER:
            if batch.indices[-1] >= self._end:
                return False
            self._inside = self._inside or batch.indices[-1] >= self._start
        thread = batch.thread_id
        self._spans.extend(zip(repeat(thread), batch.starts.tolist(), batch.ends.tolist()))
        self.add_phases(thread, batch.thread_name, batch.phases)
        return True

    def add_phases(self, thread: int, name: str, phases: Phases) -> None:
        self.names[thread] = name
        self._spans.extend(zip(repeat(thread), phases.starts.tolist(), phases.ends.tolist()))
        if not self._inside and self._spans:
            horizon = max(end for _, _, end in self._spans) - LEAD_NS
            while self._spans[0][2] < horizon:
                self._spans.popleft()


class _Node:
    __slots__ = ("start", "end", "children", "starts")

    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, end
        self.children: list[_Node] = []
        self.starts: list[float] = []


def fit(intervals: Sequence[tuple[int, int]], ops: list[Op]) -> list[Op]:
    """``ops`` made to nest with ``intervals`` (well nested themselves) and with each other, sorted for emission.

    Each op is fitted into the innermost interval holding its midpoint that it
    does not wrap whole; an interval inside that one which the op only partly
    covers moves the op's nearer end to its boundary. Ops left empty are
    dropped.
    """
    root = _tree(intervals)
    fitted = []
    for op in ops:
        start: float = op.start_ns  # ints, but the root's bounds are infinite
        end: float = op.end_ns
        middle = (start + end) / 2
        node = root
        while True:
            i = bisect.bisect_right(node.starts, middle) - 1
            if i < 0 or not middle < node.children[i].end:
                break
            child = node.children[i]
            if start <= child.start and child.end <= end:
                break  # the op wraps the phase (a record_function around it)
            node = child
        start, end = max(start, node.start), min(end, node.end)
        low = max(bisect.bisect_right(node.starts, start) - 1, 0)
        for child in node.children[low:bisect.bisect_left(node.starts, end)]:
            if child.end <= start or (start <= child.start and child.end <= end):
                continue  # apart, or wholly inside the op
            if child.end <= middle:
                start = max(start, child.end)
            else:
                end = min(end, child.start)
        if end > start:
            op.start_ns, op.end_ns = int(start), int(end)
            fitted.append(op)
    fitted.sort(key=lambda op: (op.start_ns, -op.end_ns))
    stack: list[Op] = []
    for op in fitted:  # one op ending after the op it starts in ends with it
        while stack and stack[-1].end_ns <= op.start_ns:
            stack.pop()
        if stack:
            op.end_ns = min(op.end_ns, stack[-1].end_ns)
        stack.append(op)
    return fitted


def _tree(intervals: Sequence[tuple[int, int]]) -> _Node:
    root = _Node(float("-inf"), float("inf"))
    stack = [root]
    for start, end in sorted(intervals, key=lambda span: (span[0], -span[1])):
        while len(stack) > 1 and stack[-1].end <= start:
            stack.pop()
        node = _Node(start, end)
        stack[-1].children.append(node)
        stack[-1].starts.append(start)
        stack.append(node)
    return root


def nested_order(ops: list[Op]) -> list[tuple[int, Op | None]]:
    """``(timestamp, op)`` for each BEGIN and ``(timestamp, None)`` for each END, in nesting order."""
    events: list[tuple[int, Op | None]] = []
    stack: list[Op] = []
    for op in ops:
        while stack and stack[-1].end_ns <= op.start_ns:
            events.append((stack.pop().end_ns, None))
        events.append((op.start_ns, op))
        stack.append(op)
    while stack:
        events.append((stack.pop().end_ns, None))
    return events
