"""A producer's shared-memory segment as a pipeline's record source: the one input of every pipeline.

Both hosts read a producer through this (an agent process maps the segment's
file; the thread host reads the training process's own mapping). Lane
records are handed on as they are, one array per lane and pass
(:class:`otel_rl.core.pipeline.Lane`: the assembly reads their columns);
messages are decoded into the pass's :class:`otel_rl.core.pipeline.Batch` in
the producer's order: run starts and events first, then phases, scalars and
the rest, run ends last. Stretches of packed ``scalars()`` calls of one key set
become one :class:`~otel_rl.core.scalar_rows.ScalarRows` each. What is taken
stays the producer's to keep until :meth:`SegmentSource.commit`: the server
commits only once the outputs have written it, so an agent that dies leaves
nothing read-but-unwritten behind.
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
from otel_rl.core.pipeline import Batch, Lane
from otel_rl.core.records import RunEnd, RunStart
from otel_rl.core.scalar_rows import ScalarRows
from otel_rl.formats import schema
from otel_rl.shm import layout
from otel_rl.shm import segment as shm
from otel_rl.shm.layout import MessageKind, RecordKind, ValueTag

_logger = logger(__name__)

RECORDS_PER_PASS = 65_536
"""Lane records taken per lane and pass at most."""
MESSAGE_BYTES_PER_PASS = 4 << 20
"""Message bytes taken per ring and pass at most: at 64 bytes for the smallest ``scalars()`` frame, fewer
records than ``metrics.jsonl``'s queue holds (100,000), which its writer empties before the next pass."""


class SegmentSource:
    """Reads one producer's segment for the pipeline (see the module docstring)."""

    def __init__(self, reader: shm.SegmentReader, takeover: bool = False, commits: bool = False) -> None:
        """``takeover``: another agent read this segment before; the open run is learned from the segment.
        ``commits``: what is taken is committed at once (a segment of records made beside the outputs, which
        die with them: nothing to read again)."""
        self.reader = reader
        self._commits = commits
        self._lane_dropped: list[int] = []
        self._lane_keys: list[tuple] = []  # each lane's key in the pass's batch (the assembler's)
        self._decode_dropped = 0
        self._key_names: dict[tuple, tuple] = {}
        self._extra: list[RunEnd | tuple] = []
        self.run: RunStart | None = None
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
                self._lane_keys.append(())
            self._lane_dropped[index] = dropped
            self._lane_keys[index] = (id(self), index, thread_id)
            records = reader.take_lane(index, RECORDS_PER_PASS)
            behind |= len(records) == RECORDS_PER_PASS
            if len(records):
                self._note_time(records)
                # Keyed by its thread too: the producer gives a lane to another thread once its own ended.
                batch.lanes.append(Lane(self._lane_keys[index], thread_id, thread_name, records, names))
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
                if decoded[0] == MessageKind.RUN and isinstance(decoded[1], RunEnd):
                    ends.append(decoded[1])  # after the data written before it
                else:
                    self._route(batch, *decoded)
        self._take_scalars(batch, scalars)
        for record in ends:
            self._route(batch, MessageKind.RUN, record)
        batch.control.extend(self._extra)
        self._extra.clear()
        self.behind = behind
        if self._commits:
            reader.commit()

    def commit(self, held: Any = None) -> None:
        """The outputs wrote everything taken so far: the producer may reuse its room.

        ``held(key)``: how many of a lane's records taken are not written yet (an iteration still open, kept by the
        assembly: :meth:`otel_rl.core.assembly.LaneAssembler.held`); they stay uncommitted, so that a reader taking
        over reads the whole iteration again rather than its end alone.
        """
        self.reader.commit(self._held(held))

    def _held(self, held: Any) -> list[int] | None:
        return [held(key) if key else 0 for key in self._lane_keys] if held is not None else None

    def save_state(self, held: Any, payload: bytes) -> bool:
        """Keep the outputs' counts (``payload``) as they stand at the :meth:`commit` with ``held`` about to be made."""
        return self.reader.save_state(self.reader.mark_after(self._held(held)), payload)

    def saved_state(self) -> bytes | None:
        """The outputs' counts the previous reader saved at its last commit, where this one starts; None if none match."""
        return self.reader.saved_state()

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
        self._extra.append(RunEnd(status, start_ns, max(end_ns, start_ns), reason, detected_by="agent"))
        self.run = None

    def record_death(self, status: str, reason: str, pid: int) -> None:
        """A producer without an open run (a worker) died: a ``process_died`` event closes its timeline."""
        attributes = {"status": status, "reason": reason, "pid": pid, "detected_by": "agent"}
        self._extra.append((max(self.last_ns, perf_counter_ns()), schema.EVENT_PROCESS_DIED, attributes))

    # -- decoding ----------------------------------------------------------

    def _note_time(self, records: np.ndarray) -> None:
        """The latest time of these lane records: a phase's end, an iteration mark's time (an iteration end's ``end`` is its CPU time)."""
        kinds = records["kind"]
        marks = (kinds == RecordKind.ITERATION_START) | (kinds == RecordKind.ITERATION_END)
        stamps = np.where(kinds == RecordKind.PHASE, records["end"], np.where(marks, records["start"], 0))
        self.last_ns = max(self.last_ns, int(stamps.max()))

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
        """Scalars frames into ``batch``, in order: each stretch of packed records of one key set of floats as one :class:`ScalarRows`."""
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
            self.run = record if isinstance(record, RunStart) else None
            batch.control.append(record)
        elif kind == MessageKind.DISTRIBUTION:
            batch.distributions.append(record)
        elif kind == MessageKind.DEVICE_INTERVAL:
            batch.intervals.append(record)
        elif kind == MessageKind.REMOTE_CYCLE:
            batch.remote.append(record)
        elif kind == MessageKind.CUDA_FALLBACK:
            batch.cuda_fallbacks.append(record)
        elif kind == MessageKind.MEDIA:
            batch.media.append(record)
        elif kind == MessageKind.NOTICE:
            batch.notices.append(record)


_SCALARS_KINDS = frozenset((MessageKind.SCALARS, MessageKind.SCALARS_PACKED))
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

