"""A thread's lane records, in order, assembled into batches of iterations and of phases outside them.

The recorder writes one fixed record per finished phase and per iteration
mark (:data:`otel_rl.shm.layout.LANE_RECORD`): a phase is written when it
ends, so the phases nested in it come before it, and a pass can begin or end
in the middle of an iteration. :class:`LaneAssembler` keeps what is open
between passes, per lane, and turns each pass's records into
:class:`~otel_rl.core.batches.IterationBatch` and
:class:`~otel_rl.core.batches.PhaseBatch` columns.

The steady state of a training loop (stretches of :data:`MIN_STRETCH` or more complete
iterations holding only top-level phases, nothing open around them) is found
with array operations and becomes a batch without a Python loop per record;
everything else (nesting, errors, flows, CUDA correlations, misuse) goes
record by record through :class:`_Lane`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from otel_rl.base.drops import Drops
from otel_rl.base.log import logger, once
from otel_rl.core.batches import IterationBatch, PhaseBatch, Phases
from otel_rl.core.sampling import SpanSampler
from otel_rl.formats import schema
from otel_rl.formats.schema import PhaseSpec
from otel_rl.shm import layout
from otel_rl.shm.layout import RecordKind

_logger = logger(__name__)

MIN_STRETCH = 8
"""Iterations a run needs to be found with array operations (fewer cost less record by record)."""
_FIELDS = ("start", "end", "a", "b", "name", "depth", "kind", "flags", "exc")


class SpecTable:
    """The phase specs and timelines a producer's string table names, by id (a phase is ``timeline<TAB>name``)."""

    def __init__(self) -> None:
        self.specs: list[PhaseSpec | None] = []
        """The spec of each string id that names a phase (None for other strings); only grows."""
        self._timelines = np.zeros(1, dtype=np.int64) - 1

    def update(self, names: Sequence[str]) -> None:
        """Take in the string table's new entries."""
        if len(self.specs) == len(names):
            return
        for text in names[len(self.specs) :]:
            self.specs.append(_spec(text))
        ids = {text: index for index, text in enumerate(names)}
        timelines = [ids.get(spec.timeline, -1) if spec is not None else -1 for spec in self.specs]
        self._timelines = np.array([*timelines, -1], dtype=np.int64)

    def timeline_ids(self, name_ids: np.ndarray) -> np.ndarray:
        """Per phase id, the string id of its timeline (-1 for an id that names no phase, or is out of range)."""
        known = len(self.specs)
        return self._timelines[np.where((name_ids >= 0) & (name_ids < known), name_ids, known)]


def _spec(text: str) -> PhaseSpec | None:
    if "\t" not in text:
        return None
    timeline, name = text.split("\t", 1)
    try:
        return schema.phase_spec(timeline, name)
    except schema.SchemaError:
        return None


@dataclass
class _Node:
    """A phase assembled record by record, with the phases nested in it (epoch ns; ``depth`` as its lane recorded it)."""

    spec_id: int
    start: int
    end: int
    depth: int
    error: str | None
    children: list[_Node]
    flows: tuple[tuple[int, bool], ...] = ()
    correlation: int = 0

    def flatten(self, out: list[tuple], level: int = 0) -> None:
        """This phase, then the phases nested in it, as rows ``(spec_id, start, end, level, error, flows, correlation)``."""
        out.append((self.spec_id, self.start, self.end, level, self.error, self.flows, self.correlation))
        for child in self.children:
            child.flatten(out, level + 1)

    def size(self) -> int:
        return 1 + sum(child.size() for child in self.children)


@dataclass
class _Open:
    """An iteration whose end mark has not come yet."""

    start: int
    index: int
    env_steps: int | None
    cpu: int | None
    depth: int
    phases: list[_Node] = field(default_factory=list)
    at: int = 0
    """Its start mark's position among the lane's records (counted from the first this assembler read)."""


@dataclass
class _Done:
    """A completed iteration assembled record by record, waiting to join its batch."""

    index: int
    env_steps: int | None
    start: int
    end: int
    cpu: int | None
    rows: list[tuple]


class LaneAssembler:
    """Assembles every lane of one producer (see the module docstring).

    Args:
        offset_ns: the producer's ``perf_counter_ns()`` to epoch offset.
        sampler: gives the records it keeps as spans their ids.
        drops: counts phases lost to misuse (a phase never exited).
    """

    def __init__(self, offset_ns: int, sampler: SpanSampler, drops: Drops) -> None:
        self.offset_ns = offset_ns
        self.specs = SpecTable()
        self.sampler = sampler
        self._drops = drops
        self._lanes: dict[object, _Lane] = {}

    def assemble(self, key: object, thread: tuple[int, str], records: np.ndarray, names: Sequence[str], now_s: float) -> list[IterationBatch | PhaseBatch]:
        """One pass's records of lane ``key`` (in order) as batches, in order."""
        self.specs.update(names)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane(self)
        lane.thread, lane.names, lane.now_s = thread, names, now_s
        base = lane.consumed
        done = 0
        for first, last in steady_stretches(records, self.specs):
            lane.records(records[done:first], base + done)
            if lane.idle():
                lane.emit(self._steady(records[first:last], thread, names, now_s))
                lane.emitted_upto = base + last
            else:  # a pass began inside an iteration: this run's records are that iteration's, record by record
                lane.records(records[first:last], base + first)
            done = last
        lane.records(records[done:], base + done)
        lane.consumed = base + len(records)
        return lane.take()

    def held(self, key: object) -> int:
        """Records of lane ``key`` read but kept back: those of an iteration still open (from its start mark), which a
        reader taking over must read again to assemble it whole; 0 where a record after its start was written out."""
        lane = self._lanes.get(key)
        if lane is None or not lane.open:
            return 0
        first = min(opened.at for opened in lane.open.values())
        return lane.consumed - first if lane.emitted_upto <= first else 0

    def under_way(self, key: object) -> list[tuple[str, int, int | None, int]]:
        """The iterations of lane ``key`` still open after its latest pass, as ``(timeline, index, env steps, start)``
        (epoch ns): what a long iteration (a rollout and its update) has done so far is its start."""
        lane = self._lanes.get(key)
        if lane is None:
            return []
        return [(timeline, opened.index, opened.env_steps, opened.start) for timeline, opened in lane.open.items()]

    # -- the steady state ---------------------------------------------------

    def _steady(self, region: np.ndarray, thread: tuple[int, str], names: Sequence[str], now_s: float) -> IterationBatch:
        """A steady run's records (each iteration's start, its phases, its end) as one batch, from their columns."""
        kinds, offset = region["kind"], self.offset_ns
        opens, closes = np.flatnonzero(kinds == RecordKind.ITERATION_START), np.flatnonzero(kinds == RecordKind.ITERATION_END)
        phase = kinds == RecordKind.PHASE
        counts = closes - opens - 1
        iteration_ids, phase_ids = self.sampler.iterations(counts, now_s)
        start_cpu, end_cpu = region["end"][opens], region["end"][closes]  # -1: not measured
        cpu = np.where((start_cpu >= 0) & (end_cpu >= 0), end_cpu - start_cpu, -1).tolist()
        env_steps = region["b"][opens].tolist()
        phases = Phases(
            self.specs.specs, region["name"][phase].astype(np.intp), region["start"][phase] + offset, region["end"][phase] + offset,
            np.zeros(int(phase.sum()), dtype=np.int16), phase_ids,
        )  # fmt: skip
        batch = IterationBatch(
            _timeline(int(region["name"][0]), names),
            thread,
            region["a"][opens].tolist(),
            [None if steps == layout.NO_STEPS else steps for steps in env_steps] if layout.NO_STEPS in env_steps else env_steps,
            region["start"][opens] + offset,
            region["start"][closes] + offset,
            [None if c < 0 else c for c in cpu] if -1 in cpu else cpu,
            iteration_ids,
            counts,
            phases,
        )
        self.check_overlap(batch)
        return batch

    # -- what a lane lost --------------------------------------------------

    def lost_to_misuse(self, timeline: str, index: int) -> None:
        """A phase of an ending iteration was never exited: it is lost, what ran inside it counts as the iteration's."""
        self._drops.add("phase_misuse", "unclosed phases")
        _logger.warning(
            "otel-rl: a phase of %s iteration %d was never exited; it is not recorded, the phases inside it count as the iteration's",
            timeline,
            index,
            extra=once(f"unclosed:{timeline}"),
        )

    def check_overlap(self, batch: IterationBatch) -> None:
        """One warning when an iteration's top-level phases account for more than its wall time."""
        position = batch.first_overlap()
        if position is None:
            return
        _logger.warning(
            "otel-rl: contract warning: %s iteration %d accounts %.3f ms of phases in %.3f ms of wall time "
            "(top-level phases overlap or run on other threads)",
            batch.timeline,
            batch.indices[position],
            batch.accounted[position] / 1e6,
            batch.walls()[position] / 1e6,
            extra=once(f"contract:{batch.timeline}"),
        )


def steady_stretches(records: np.ndarray, specs: SpecTable) -> list[tuple[int, int]]:
    """Stretches of :data:`MIN_STRETCH` or more adjacent complete iterations of one timeline holding only phases of it at
    their depth (no error, flow, correlation or nested phase), as ``(first, last)``: ``records[first:last]``."""
    kinds = records["kind"]
    opens, closes = np.flatnonzero(kinds == RecordKind.ITERATION_START), np.flatnonzero(kinds == RecordKind.ITERATION_END)
    if len(opens) < MIN_STRETCH or len(closes) < MIN_STRETCH:
        return []
    after = np.searchsorted(closes, opens)  # each start's first end, kept if no other start comes before it
    opens, closes = opens[after < len(closes)], closes[after[after < len(closes)]]
    paired = closes < np.append(opens[1:], len(records))
    opens, closes = opens[paired], closes[paired]
    name, depth, start = records["name"], records["depth"], records["start"]
    # Each record's iteration, if it lies inside one; one that is not a plain phase of it spoils it.
    positions = np.arange(len(records))
    owner = np.maximum(np.searchsorted(opens, positions, side="right") - 1, 0)
    inside = (positions > opens[owner]) & (positions < closes[owner])
    plain = (kinds == RecordKind.PHASE) & (records["exc"] == -1) & (depth == depth[opens][owner])
    plain &= (start >= start[opens][owner]) & (specs.timeline_ids(name) == name[opens][owner])
    good = np.bincount(owner[inside & ~plain], minlength=len(opens)) == 0
    good &= (name[closes] == name[opens]) & (depth[closes] == depth[opens])
    # Adjacent good iterations of one timeline and depth join into a run.
    joins = good[:-1] & good[1:] & (closes[:-1] + 1 == opens[1:])
    joins &= (name[opens][:-1] == name[opens][1:]) & (depth[opens][:-1] == depth[opens][1:])
    firsts = np.flatnonzero(good & ~np.concatenate(([False], joins)))
    lasts = np.flatnonzero(good & ~np.concatenate((joins, [False]))) + 1
    return [(int(opens[a]), int(closes[b - 1]) + 1) for a, b in zip(firsts.tolist(), lasts.tolist()) if b - a >= MIN_STRETCH]


def _timeline(name_id: int, names: Sequence[str]) -> str:
    """The timeline an iteration mark names (the learner's when its id is unknown)."""
    return names[name_id] if 0 <= name_id < len(names) else schema.LEARNER


class _Lane:
    """One lane's assembly: what is open between passes, and the batches of the pass being assembled."""

    def __init__(self, assembler: LaneAssembler) -> None:
        self.assembler = assembler
        self.thread: tuple[int, str] = (0, "")
        self.names: Sequence[str] = ()
        self.now_s = 0.0
        self.open: dict[str, _Open] = {}
        self.children: dict[int, list[_Node]] = {}
        """Phases waiting for the phase they are nested in (it is recorded when it ends, after them), by depth."""
        self.flows: dict[int, list[tuple[int, bool]]] = {}
        self.correlations: dict[int, int] = {}
        self._done: list[_Done] = []
        self._done_timeline: str | None = None
        self._loose: list[_Node] = []
        self._out: list[IterationBatch | PhaseBatch] = []
        self.consumed = 0
        """Records of the lane read so far."""
        self.emitted_upto = 0
        """The position after the latest record that made output (an iteration's end, a loose phase)."""
        self._at = 0

    def idle(self) -> bool:
        """Nothing open: no iteration, and no phase, flow or correlation waiting for its enclosing phase."""
        return not (self.open or self.children or self.flows or self.correlations)

    def emit(self, batch: IterationBatch | PhaseBatch) -> None:
        self._flush()
        self._out.append(batch)

    def take(self) -> list[IterationBatch | PhaseBatch]:
        """The pass's batches, in order."""
        self._flush()
        out, self._out = self._out, []
        return out

    def records(self, records: np.ndarray, at: int = 0) -> None:
        """Records in order, one at a time (``at``: the first one's position among the lane's records)."""
        if not len(records):
            return
        columns = [records[name].tolist() for name in _FIELDS]  # column by column: a third of the rows' tolist()
        offset = self.assembler.offset_ns
        for position, (start, end, a, b, name, depth, kind, flags, exc) in enumerate(zip(*columns), at):
            self._at = position
            if kind == RecordKind.PHASE:
                self._phase(name, start + offset, end + offset, depth, exc)
            elif kind == RecordKind.ITERATION_START:
                timeline = _timeline(name, self.names)
                self.open[timeline] = _Open(start + offset, a, None if b == layout.NO_STEPS else b, None if end < 0 else end, depth, at=position)
            elif kind == RecordKind.ITERATION_END:
                self._iteration_end(_timeline(name, self.names), start + offset, end)
            elif kind == RecordKind.FLOW:
                if depth:
                    self.flows.setdefault(depth - 1, []).append((a % 2**64, bool(flags)))
                else:
                    _logger.warning("otel-rl: flow() called outside any phase; ignored", extra=once("flow-outside"))
            elif kind == RecordKind.CORRELATE and depth:
                self.correlations[depth - 1] = a

    def _phase(self, name: int, start: int, end: int, depth: int, exc: int) -> None:
        specs = self.assembler.specs.specs
        spec = specs[name] if 0 <= name < len(specs) else None
        if spec is None:
            _logger.warning("otel-rl: a phase record names no phase (id %d); skipped", name, extra=once(f"no-phase:{name}"))
            return
        node = _Node(
            name,
            start,
            end,
            depth,
            self.names[exc] if 0 <= exc < len(self.names) else None,
            self.children.pop(depth + 1, []) if self.children else [],
            tuple(self.flows.pop(depth, ())) if self.flows else (),
            self.correlations.pop(depth, 0) if self.correlations else 0,
        )
        # A top-level phase (at the depth its iteration started at: a phase left open before it costs only
        # itself) belongs to the open iteration of its own timeline; otherwise it is a loose phase.
        opened = self.open.get(spec.timeline)
        if opened is None:
            if depth > 0:
                self.children.setdefault(depth, []).append(node)
                return
        elif depth == opened.depth and start >= opened.start:
            opened.phases.append(node)
            return
        elif depth > opened.depth:
            self.children.setdefault(depth, []).append(node)
            return
        if self._done:
            self._flush()
        self._loose.append(node)
        self.emitted_upto = self._at + 1

    def _iteration_end(self, timeline: str, end: int, cpu: int) -> None:
        opened = self.open.pop(timeline, None)
        if opened is None:  # its start was refused by a full lane
            return
        if self.children:
            self._adopt(opened, timeline)
        self.children.clear()
        rows: list[tuple] = []
        for node in opened.phases:
            node.flatten(rows)
        if self._loose or (self._done and self._done_timeline != timeline):
            self._flush()
        self._done_timeline = timeline
        self.emitted_upto = self._at + 1
        cpu_ns = None if cpu < 0 or opened.cpu is None else cpu - opened.cpu
        self._done.append(_Done(opened.index, opened.env_steps, opened.start, end, cpu_ns, rows))

    def _adopt(self, opened: _Open, timeline: str) -> None:
        """Phases of an ending iteration whose enclosing phase was never exited become the iteration's own."""
        specs = self.assembler.specs.specs
        adopted = [
            node for depth, level in self.children.items() if depth > opened.depth for node in level
            if specs[node.spec_id].timeline == timeline and node.start >= opened.start
        ]  # fmt: skip
        if adopted:
            opened.phases = sorted([*opened.phases, *adopted], key=lambda node: node.start)
            self.assembler.lost_to_misuse(timeline, opened.index)

    def _flush(self) -> None:
        """The iterations and loose phases assembled so far, as batches."""
        if self._done:
            done, self._done = self._done, []
            counts = np.array([len(it.rows) for it in done], dtype=np.int64)
            iteration_ids, phase_ids = self.assembler.sampler.iterations(counts, self.now_s)
            batch = IterationBatch(
                self._done_timeline,  # type: ignore[arg-type]
                self.thread,
                [it.index for it in done],
                [it.env_steps for it in done],
                np.array([it.start for it in done], dtype=np.int64),
                np.array([it.end for it in done], dtype=np.int64),
                [it.cpu for it in done],
                iteration_ids,
                counts,
                self._phases([row for it in done for row in it.rows], phase_ids),
            )
            self.assembler.check_overlap(batch)
            self._out.append(batch)
        if self._loose:
            loose, self._loose = self._loose, []
            rows: list[tuple] = []
            for node in loose:
                node.flatten(rows)
            ids = self.assembler.sampler.trees(np.array([node.size() for node in loose], dtype=np.int64), self.now_s)
            self._out.append(PhaseBatch(self.thread, self._phases(rows, ids)))

    def _phases(self, rows: list[tuple], span_ids: np.ndarray) -> Phases:
        spec_ids, starts, ends, depths, errors, flows, correlations = zip(*rows) if rows else ((),) * 7
        return Phases(
            self.assembler.specs.specs,
            np.array(spec_ids, dtype=np.intp),
            np.array(starts, dtype=np.int64),
            np.array(ends, dtype=np.int64),
            np.array(depths, dtype=np.int16),
            span_ids,
            {i: error for i, error in enumerate(errors) if error is not None},
            {i: flow for i, flow in enumerate(flows) if flow},
            {i: correlation for i, correlation in enumerate(correlations) if correlation},
        )
