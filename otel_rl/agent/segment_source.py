"""A producer's shared-memory segment as a pipeline's record source.

Lane records and messages are decoded straight into the pass's
:class:`otel_rl.core.pipeline.Batch`, in the producer's order: run starts and
events first, then phases, scalars and the rest, run ends last. What is
taken stays the producer's to keep until :meth:`SegmentSource.commit`: the
agent commits only once its outputs have written it, so an agent that dies
leaves nothing read-but-unwritten behind.
"""

from __future__ import annotations

import functools
import itertools
import marshal
import pickle
import struct
from time import perf_counter_ns
from typing import Any

import numpy as np

from otel_rl.base.log import logger, once
from otel_rl.base.values import StandIn
from otel_rl.core.iteration_rows import ITERATION_ROWS, IterationRows
from otel_rl.core.pipeline import Batch
from otel_rl.core.records import RunRecord
from otel_rl.core.scalar_rows import ScalarRows
from otel_rl.formats import schema
from otel_rl.shm import layout
from otel_rl.shm import segment as shm
from otel_rl.shm.layout import MessageKind, RecordKind, ValueTag
from otel_rl.training.recorder import CORRELATE, FLOW, ITERATION_END, ITERATION_START

_logger = logger(__name__)

RECORDS_PER_PASS = 65_536
"""Lane records taken per lane and pass at most."""
MESSAGE_BYTES_PER_PASS = 4 << 20
"""Message bytes taken per ring and pass at most: at 64 bytes for the smallest ``scalars()`` frame, fewer
records than ``metrics.jsonl``'s queue holds (100,000), which its writer empties before the next pass."""
MIN_RUN = 8
"""Iterations a run needs to go through as columns (fewer cost less record by record)."""


class _Replayed:
    """Stands for a producer's phase in a raw lane record: the pipeline reads only ``spec``."""

    __slots__ = ("spec",)

    def __init__(self, spec: Any) -> None:
        self.spec = spec


class SegmentSource:
    """Reads one producer's segment for the pipeline (see the module docstring)."""

    def __init__(self, reader: shm.SegmentReader, takeover: bool = False) -> None:
        """``takeover``: another agent read this segment before; the open run is learned from the segment."""
        self.reader = reader
        self._phases: dict[int, _Replayed | None] = {}
        self._lane_dropped: list[int] = []
        self._decode_dropped = 0
        self._key_names: dict[tuple, tuple] = {}
        self._phase_timelines = np.zeros(0, dtype=np.int64)
        self._extra: list[RunRecord | tuple] = []
        self.run: RunRecord | None = None
        """The open run (its start record), None before it starts and after it ends."""
        self.behind = False
        """Whether the last :meth:`take` stopped at its per-pass limit: more is waiting."""
        self.last_ns = 0
        """The producer's latest timestamp read (``perf_counter_ns()``)."""
        published = reader.run() if takeover else None
        if published:
            self.run = pickle.loads(published)

    # -- the record source --------------------------------------------------

    def take(self, batch: Batch) -> None:
        """Move what the producer wrote since the last call (within the per-pass limits, see :attr:`behind`) into ``batch``."""
        reader = self.reader
        behind = False
        names = reader.update_names()
        for index, (thread_id, thread_name, dropped) in enumerate(reader.lanes()):
            if index == len(self._lane_dropped):
                self._lane_dropped.append(0)
            self._lane_dropped[index] = dropped
            records = reader.take_lane(index, RECORDS_PER_PASS)
            behind |= len(records) == RECORDS_PER_PASS
            if len(records):
                # Keyed by its thread too: the producer gives a lane to another thread once its own ended.
                batch.lanes.append(((id(self), index, thread_id), thread_id, thread_name, self._decode(records, names)))
        ends, scalars = [], []
        for ring in (reader.control, reader.data):
            frames = ring.take(MESSAGE_BYTES_PER_PASS)
            behind |= ring.behind
            for kind, payload in frames:
                if kind & ~layout.PICKLED in _SCALARS_KINDS:
                    scalars.append((kind, payload))  # scalars go to a list of their own: only their own order counts
                    continue
                decoded = self._decode_message(kind, payload)
                if decoded is None:
                    continue
                if decoded[0] == MessageKind.RUN and decoded[1].end_ns is not None:
                    ends.append(decoded[1])  # after the data written before it
                else:
                    self._route(batch, *decoded)
        self._take_scalars(batch, scalars)
        for record in ends:
            self._route(batch, MessageKind.RUN, record)
        batch.control.extend(self._extra)
        self._extra.clear()
        self.behind = behind

    def commit(self) -> None:
        """The outputs wrote everything taken so far: the producer may reuse its room."""
        self.reader.commit()

    def dropped(self) -> dict[str, int]:
        """The producer's drops (its lanes' and rings') and the records this agent could not read."""
        out = {"phases": sum(self._lane_dropped), "agent_decode": self._decode_dropped}
        if self.reader.control is not None:
            out["phases"] += self.reader.get("dropped_unlaned")
            out.update({queue: self.reader.get(field) for queue, field in shm.DROP_FIELDS.items()})
        return out

    def pending(self) -> dict[str, int]:
        reader = self.reader
        if reader.control is None:
            return {}
        return {"messages": reader.control.pending() + reader.data.pending()}

    # -- a producer that died ------------------------------------------------

    def end_run(self, status: str, reason: str, to_epoch_ns, pending_since_ns: int | None = None) -> None:
        """End the open run as the producer could not (it died): after everything it wrote.

        ``pending_since_ns``: the producer died before it started its run; the run it announced ends.
        """
        start_ns = self.run.start_ns if self.run is not None else pending_since_ns
        if start_ns is None:
            return
        end_ns = to_epoch_ns(self.last_ns) if self.last_ns else to_epoch_ns(perf_counter_ns())
        self._extra.append(RunRecord(status, start_ns, max(end_ns, start_ns), reason, {"detected_by": "agent"}))
        self.run = None

    def record_death(self, status: str, reason: str, pid: int) -> None:
        """A producer without an open run (a worker) died: a ``process_died`` event closes its timeline."""
        attributes = {"status": status, "reason": reason, "pid": pid, "detected_by": "agent"}
        self._extra.append((max(self.last_ns, perf_counter_ns()), schema.EVENT_PROCESS_DIED, attributes))

    # -- decoding ----------------------------------------------------------

    def _decode_message(self, kind: int, payload: bytes) -> tuple[int, Any] | None:
        """A message's record; None (one warning per kind, counted) when it cannot be read here."""
        try:
            if kind == MessageKind.SCALARS_PACKED:
                return MessageKind.SCALARS, _unpack_scalars(payload, self.reader, self._key_names)
            if kind & layout.PICKLED:
                return kind & ~layout.PICKLED, pickle.loads(payload)
            return kind, _restore(marshal.loads(payload))
        except Exception as exc:  # a pickled class this process cannot import, say
            self._decode_dropped += 1
            _logger.warning(
                "otel-rl: agent: a record of kind %d could not be read (%s); dropped",
                kind & ~layout.PICKLED,
                exc,
                extra=once(f"agent-decode:{kind}"),
            )
            return None

    def _take_scalars(self, batch: Batch, frames: list[tuple[int, bytes]]) -> None:
        """Scalars frames into ``batch``, in order: each run of packed records of one key set of floats as one :class:`ScalarRows`."""
        for (kind, _), run in itertools.groupby(frames, lambda frame: (frame[0], len(frame[1]))):
            run = list(run)
            rows = None
            if kind == MessageKind.SCALARS_PACKED:
                try:
                    rows = _scalar_rows([payload for _, payload in run], self.reader, self._key_names)
                except Exception:  # read record by record below, where a bad one is counted alone
                    pass
            if rows is None:
                for kind, payload in run:
                    decoded = self._decode_message(kind, payload)
                    if decoded is not None:
                        self._route(batch, *decoded)
                continue
            batch.scalars.append(rows)
            self.last_ns = max(self.last_ns, int(rows.times_ns[-1]))

    def _route(self, batch: Batch, kind: int, record: Any) -> None:
        if kind == MessageKind.SCALARS:
            batch.scalars.append(record)
            self.last_ns = max(self.last_ns, record[0])
        elif kind == MessageKind.EVENT:
            batch.control.append(record)
            self.last_ns = max(self.last_ns, record[0])
        elif kind == MessageKind.RUN:
            self.run = record if record.end_ns is None else None
            batch.control.append(record)
        elif kind == MessageKind.DISTRIBUTION:
            batch.distributions.append(record)
        elif kind == MessageKind.DEVICE_INTERVAL:
            batch.intervals.append(record)
        elif kind == MessageKind.REMOTE_CYCLE:
            batch.remote.append(record)
        elif kind == MessageKind.CUDA_FALLBACK:
            batch.cuda_fallbacks.append(record)

    def _decode(self, records: np.ndarray, names: list[str]) -> list[tuple]:
        """Lane records as the raw items the pipeline reads: runs of the steady state's complete iterations as
        :class:`IterationRows`, every other record as a raw tuple, in order."""
        kinds = records["kind"]
        # The latest time read: a phase's end, an iteration mark's time (an iteration end's ``end`` is its CPU time).
        stamps = np.where(kinds == RecordKind.PHASE, records["end"], np.where((kinds == RecordKind.ITERATION_START) | (kinds == RecordKind.ITERATION_END), records["start"], 0))
        self.last_ns = max(self.last_ns, int(stamps.max()))
        out: list[tuple] = []
        done = 0
        for first, last, rows in self._steady_runs(records, names):
            out += self._decode_records(records[done:first], names)
            out.append((ITERATION_ROWS, rows))
            done = last
        return out + self._decode_records(records[done:], names) if done else self._decode_records(records, names)

    def _steady_runs(self, records: np.ndarray, names: list[str]) -> list[tuple[int, int, IterationRows]]:
        """Runs of :data:`MIN_RUN` or more adjacent complete iterations of one timeline that hold only phases of it at
        their depth (no error, flow, correlation or nested phase), as ``(first, last, rows)``: ``records[first:last]``."""
        kinds = records["kind"]
        opens, closes = np.flatnonzero(kinds == RecordKind.ITERATION_START), np.flatnonzero(kinds == RecordKind.ITERATION_END)
        if len(opens) < MIN_RUN or len(closes) < MIN_RUN:
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
        timeline_ids = self._timeline_ids(names)
        phase_timeline = timeline_ids[np.where((name >= 0) & (name < len(names)), name, len(names))]
        plain = (kinds == RecordKind.PHASE) & (records["exc"] == -1) & (depth == depth[opens][owner])
        plain &= (start >= start[opens][owner]) & (phase_timeline == name[opens][owner])
        good = np.bincount(owner[inside & ~plain], minlength=len(opens)) == 0
        good &= (name[closes] == name[opens]) & (depth[closes] == depth[opens])
        # Adjacent good iterations of one timeline and depth join into a run.
        joins = good[:-1] & good[1:] & (closes[:-1] + 1 == opens[1:])
        joins &= (name[opens][:-1] == name[opens][1:]) & (depth[opens][:-1] == depth[opens][1:])
        firsts = np.flatnonzero(good & ~np.concatenate(([False], joins)))
        lasts = np.flatnonzero(good & ~np.concatenate((joins, [False]))) + 1
        return [
            self._rows(records, opens[first:last], closes[first:last], names)
            for first, last in zip(firsts.tolist(), lasts.tolist())
            if last - first >= MIN_RUN
        ]

    def _timeline_ids(self, names: list[str]) -> np.ndarray:
        """Per string id, the id of the timeline a phase name (``timeline\\tname``) names; -1 for other strings
        and for a timeline no mark can name (one more entry, -1, for ids out of range)."""
        if len(self._phase_timelines) != len(names) + 1:
            ids = {text: index for index, text in enumerate(names)}
            timelines = [ids.get(text.split("\t", 1)[0], -1) if "\t" in text else -1 for text in names]
            self._phase_timelines = np.array([*timelines, -1], dtype=np.int64)
        return self._phase_timelines

    def _rows(self, records: np.ndarray, opens: np.ndarray, closes: np.ndarray, names: list[str]) -> tuple[int, int, IterationRows]:
        """The run of iterations between ``opens`` and ``closes`` (their marks' positions) as ``(first, last, rows)``."""
        first, last = int(opens[0]), int(closes[-1]) + 1
        region = records[first:last]
        phase = region["kind"] == RecordKind.PHASE
        phase_ids = region["name"][phase]
        env_steps = records["b"][opens].tolist()
        start_cpu, end_cpu = records["end"][opens], records["end"][closes]  # -1: not measured
        measured = (start_cpu >= 0) & (end_cpu >= 0)
        cpu_ns = (end_cpu - start_cpu).tolist()
        rows = IterationRows(
            _timeline(int(records["name"][first]), names),
            int(records["depth"][first]),
            records["a"][opens].tolist(),
            [None if steps == layout.NO_STEPS else steps for steps in env_steps] if layout.NO_STEPS in env_steps else env_steps,
            records["start"][opens],
            records["start"][closes],
            cpu_ns if measured.all() else [cpu if known else None for cpu, known in zip(cpu_ns, measured.tolist())],
            closes - opens - 1,
            {phase_id: self._replayed(phase_id, names).spec for phase_id in np.flatnonzero(np.bincount(phase_ids)).tolist()},
            phase_ids,
            region["start"][phase],
            region["end"][phase],
            functools.partial(self._decode_records, region, names),
        )
        return first, last, rows

    def _replayed(self, name_id: int, names: list[str]) -> _Replayed | None:
        phases = self._phases
        phase = phases.get(name_id)
        if phase is None and name_id not in phases:
            phase = phases[name_id] = _phase(name_id, names)
        return phase

    def _decode_records(self, records: np.ndarray, names: list[str]) -> list[tuple]:
        """Lane records as the raw tuples the pipeline reads."""
        out: list[tuple] = []
        append, replayed, known = out.append, self._replayed, len(names)
        phase_kind, start_kind, end_kind = RecordKind.PHASE, RecordKind.ITERATION_START, RecordKind.ITERATION_END
        columns = [records[field].tolist() for field in _LANE_FIELDS]  # column by column: a third of the rows' tolist()
        for start, end, a, b, name, depth, kind, flags, exc in zip(*columns):
            if kind == phase_kind:
                phase = replayed(name, names)
                if phase is not None:
                    append((phase, start, end, depth, names[exc] if 0 <= exc < known else None))
            elif kind == start_kind or kind == end_kind:
                timeline = _timeline(name, names)
                tag = ITERATION_START if kind == start_kind else ITERATION_END
                append((tag, start, timeline, a, None if b == layout.NO_STEPS else b, None if end < 0 else end, depth))
            elif kind == RecordKind.FLOW:
                append((FLOW, start, a % 2**64, bool(flags), depth))
            elif kind == RecordKind.CORRELATE:
                append((CORRELATE, a, depth))
        return out


_SCALARS_KINDS = frozenset((MessageKind.SCALARS, MessageKind.SCALARS_PACKED))
_LANE_FIELDS = ("start", "end", "a", "b", "name", "depth", "kind", "flags", "exc")


def _timeline(name_id: int, names: list[str]) -> str:
    """An iteration mark's timeline (the learner's when its name id is unknown, as for a record read alone)."""
    return names[name_id] if 0 <= name_id < len(names) else schema.LEARNER


def _phase(name_id: int, names: list[str]) -> _Replayed | None:
    if not 0 <= name_id < len(names) or "\t" not in names[name_id]:
        _logger.warning("otel-rl: agent: a phase record names no phase (id %d); skipped", name_id)
        return None
    timeline, name = names[name_id].split("\t", 1)
    return _Replayed(schema.phase_spec(timeline, name))


@functools.lru_cache(maxsize=256)
def _entries(count: int) -> struct.Struct:
    """``count`` :data:`segment.SCALAR_ENTRY` entries as one ``struct``: (key, tag, value) per entry."""
    return struct.Struct("<" + shm.SCALAR_ENTRY_STRUCT * count)


def _scalar_rows(payloads: list[bytes], reader: shm.SegmentReader, key_names: dict) -> ScalarRows | None:
    """Packed scalars records of one length as :class:`ScalarRows`, decoded at once; None unless all hold the same keys and only floats."""
    count = shm.SCALARS_HEADER.unpack_from(payloads[0])[4]
    table = np.frombuffer(b"".join(payloads), shm.scalars_table(count))
    entries = table["entries"]
    keys = entries["key"]
    if entries["tag"].any() or not (keys == keys[0]).all():
        return None
    values = np.ascontiguousarray(entries["value"])
    axes = [column.tolist() for column in (table["step"], table["iteration"], table["env_steps"])]
    return ScalarRows(
        table["time"].copy(),
        _key_names(tuple(keys[0].tolist()), reader, key_names),
        values,
        np.isfinite(values).all(axis=1).tolist(),
        *([None if v == layout.NO_STEPS else v for v in column] if layout.NO_STEPS in column else column for column in axes),
    )


def _key_names(keys: tuple[int, ...], reader: shm.SegmentReader, key_names: dict) -> tuple[str, ...]:
    """The names of key ids ``keys``; ``key_names`` remembers key-id tuples seen before (a loop logs the same keys every call)."""
    names = key_names.get(keys)
    if names is None:
        table = reader.names if max(keys, default=-1) < len(reader.names) else reader.update_names()
        names = tuple(map(table.__getitem__, keys))
        if len(key_names) < 1024:
            key_names[keys] = names
    return names


def _unpack_scalars(payload: bytes, reader: shm.SegmentReader, key_names: dict) -> tuple:
    """A packed scalars record (:data:`segment.SCALARS_HEADER`, then its entries) as a raw tuple.

    ``key_names``: the names of key-id tuples seen before (a loop logs the same keys every call).
    """
    time_ns, step, iteration, env_steps, count = shm.SCALARS_HEADER.unpack_from(payload)
    fields = _entries(count).unpack_from(payload, shm.SCALARS_HEADER.size)
    keys, tags, numbers = fields[0::3], fields[1::3], fields[2::3]
    names = _key_names(keys, reader, key_names)
    if not any(tags):  # the common case, in C: every value a float (ValueTag.FLOAT is 0)
        values: dict[str, Any] = dict(zip(names, numbers))
    else:
        values = {}
        for index, (name, tag, number) in enumerate(zip(names, tags, numbers)):
            if tag == ValueTag.FLOAT:
                values[name] = number
            elif tag == ValueTag.NONE:
                values[name] = None
            else:  # the same 8 bytes as a signed integer
                integer = _INT64.unpack_from(payload, shm.SCALARS_HEADER.size + index * shm.SCALAR_ENTRY.itemsize + 8)[0]
                values[name] = bool(integer) if tag == ValueTag.BOOL else integer
    axes = [None if v == layout.NO_STEPS else v for v in (step, iteration, env_steps)]
    return (time_ns, values, *axes)


_INT64 = struct.Struct("<q")


_STAND_INS: dict[str, type] = {}


def _restore(item: Any) -> Any:
    """Stand-ins of odd keys and values (see :data:`segment.FOREIGN`) as objects with their type's name and repr.

    The pipeline's checks then word their warnings as they would for the original.
    """
    kind = type(item)
    if kind is dict:
        return {_restore(k): _restore(v) for k, v in item.items()} if any(type(k) is tuple or type(v) is tuple for k, v in item.items()) else item
    if kind is tuple:
        if len(item) == 3 and item[0] == shm.FOREIGN:
            stand_in = _STAND_INS.get(item[1])
            if stand_in is None:
                stand_in = _STAND_INS[item[1]] = type(item[1], (StandIn,), {})
            return stand_in(item[2])
        return tuple(_restore(v) for v in item)
    return item

