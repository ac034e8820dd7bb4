"""The shared-memory segment one producer process records into, and its reader.

A producer (a training process: learner, collector, rank) owns one segment: a
file in a directory private to the user (mode 0700, files 0600) under
``/dev/shm``, or anonymous memory when the reader is a thread of the same
process. The agent maps the same file. Layout (all offsets 8-byte aligned,
integers little-endian)::

    header       4 KiB   magic, pid, clock offset, states, counts, region offsets
    names        1 MiB   the string table: [u16 length][utf-8] entries, ids in order
    config       1 MiB   what the agent needs to build the outputs (pickled, written once)
    totals      64 KiB   the agent's cumulative phase and cycle totals, for window_timings() (a slot)
    run         64 KiB   the open run's start record, for an agent taking over mid-run (a slot)
    log ring   256 KiB   the agent's warnings, for the producer to log (written by the agent)
    control ring         run records and events: scalars never take their room
    data ring            scalars, distributions, GPU intervals, relayed cycles
    lanes                one ring of fixed 48-byte records per recording thread
    states   2 x 128 KiB   the agent's cumulative aggregates at its last two commits, each with the mark it
                           matches, for an agent taking over (written by the agent, two slots in turn)

Every ring has one writer and one reader and moves two counters: the writer
publishes ``write`` after the bytes it covers, the reader publishes ``read``
after it has copied them. A writer that finds its ring full drops the new
record and counts it (it can never take back what the reader may be
copying). Lanes are written by ``otel_rl.training._hotpath`` (or
:class:`PyShmLane`) with the layout of :data:`RECORD`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import mmap
import os
import struct
import threading
import weakref
from pathlib import Path

import numpy as np

from otel_rl.base.log import logger, once
from otel_rl.shm import layout
from otel_rl.shm.layout import MessageKind

try:
    from otel_rl.shm._frames import take_frames as _c_take_frames
except ImportError:  # not built (no compiler): Ring.take_in_python
    _c_take_frames = None
_logger = logger(__name__)

try:
    from otel_rl.shm import _guard
except ImportError:  # not built: a segment shrunk by another process is still noticed, but a write past its end faults
    _guard = None


MAGIC = b"OTELRL\x00\x01"
HEADER_BYTES = 4096
NAMES_BYTES = 1 << 20
CONFIG_BYTES = 1 << 20
SLOT_BYTES = 64 << 10
STATE_BYTES = 128 << 10
_MARK = struct.Struct("<QQQ")
LOG_BYTES = 256 << 10
MAX_LANES = 8
"""Recording threads per process with a lane; the records of further threads are dropped (one warning)."""
MAX_LANE_CAPACITY = 65_536
"""Records per lane at most (3 MiB, several seconds of phases: what waits while the agent starts up);
the segment's memory (about 42 MiB at full size) is reserved up front."""
CONTROL_BYTES = 2 << 20
DATA_BYTES = 16 << 20
"""The message rings' sizes at full size."""
SHARE_OF_FREE = 1 / 8
"""The most of the shared-memory filesystem's free space a segment takes: the rest is the machine's
(a DataLoader's workers pass their batches through the same /dev/shm, 64 MiB in a container by default)."""
MIN_LANE_CAPACITY, MIN_CONTROL_BYTES, MIN_DATA_BYTES = 4096, 256 << 10, 1 << 20
"""The smallest segment (about 3 MiB): below it the outputs run on a thread of the producer instead."""


def fitted_sizes(lane_capacity: int, free_bytes: int) -> tuple[int, int, int]:
    """``(lane_capacity, control_bytes, data_bytes)`` of a segment that takes at most :data:`SHARE_OF_FREE` of ``free_bytes``.

    Full size when it fits; else lanes and rings shrink in proportion, down to the minimum.

    Raises:
        OSError: (ENOSPC) not even the smallest segment fits.
    """
    lane_capacity = min(lane_capacity, MAX_LANE_CAPACITY)
    budget = free_bytes * SHARE_OF_FREE
    full = _Regions(lane_capacity, CONTROL_BYTES, DATA_BYTES)
    if full.total <= budget:
        return lane_capacity, CONTROL_BYTES, DATA_BYTES
    def scaled(scale: float) -> tuple[int, int, int]:
        return (
            min(lane_capacity, max(MIN_LANE_CAPACITY, int(lane_capacity * scale))),
            max(MIN_CONTROL_BYTES, int(CONTROL_BYTES * scale) & ~4095),
            max(MIN_DATA_BYTES, int(DATA_BYTES * scale) & ~4095),
        )

    if _Regions(*scaled(0.0)).total > budget:
        raise OSError(errno.ENOSPC, f"{free_bytes >> 20} MiB free in the shared-memory filesystem: too little for a segment")
    low, high = 0.0, 1.0  # the largest scale that fits (a part held at its minimum leaves the others less room)
    for _ in range(30):
        middle = (low + high) / 2
        low, high = (middle, high) if _Regions(*scaled(middle)).total <= budget else (low, middle)
    return scaled(low)

RECORD = np.dtype(layout.LANE_RECORD.numpy())
""":data:`otel_rl.shm.layout.LANE_RECORD`, a lane's record, as a ``numpy`` dtype."""
LANE_HEADER_BYTES = layout.LANE_HEADER.itemsize
_LANE_WRITE, _LANE_READ, _LANE_DROPPED, _LANE_CAPACITY, _LANE_THREAD = map(
    layout.LANE_HEADER.offset, ("write", "read", "dropped", "capacity", "thread_id")
)
_LANE_IDENTITY = struct.Struct("<q24s")
"""The thread id and name of a lane's header."""

CONTROL_KINDS = frozenset({MessageKind.RUN, MessageKind.EVENT, MessageKind.CUDA_FALLBACK, MessageKind.MEDIA, MessageKind.NOTICE})
"""Messages of the control ring (the data ring takes the rest): scalars never take their room."""
FOREIGN = "\x00otel-rl foreign"
"""First item of the stand-in ``(FOREIGN, type name, repr)`` sent for a key or value of a marshalled
record that is not plain data (an enum, a path, a bytes object...): the agent's checks word it alike."""

SCALARS_HEADER = layout.SCALARS_HEADER.struct()
SCALAR_ENTRY = np.dtype(layout.SCALAR_ENTRY.numpy())
SCALAR_ENTRY_STRUCT = layout.SCALAR_ENTRY.struct().format.lstrip("<")
"""One :data:`SCALAR_ENTRY` as ``struct`` codes (the reader unpacks a record's entries in one call)."""


@functools.lru_cache(maxsize=64)
def scalars_table(count: int) -> np.dtype:
    """Packed scalars records of ``count`` entries each as one row apiece (:data:`SCALARS_HEADER`, then the entries)."""
    header = layout.SCALARS_HEADER.numpy()
    return np.dtype([*zip(header["names"], header["formats"]), ("entries", SCALAR_ENTRY, (count,))])

# Producer states.
RUNNING, CLOSING = 0, 1
NO_DEADLINE = 0
"""``deadline_ns`` before the producer sets one: its close or flush deadline on ``time.monotonic_ns()``,
one clock for every process of the machine, so the agent honours the producer's deadline."""
# Agent states.
AGENT_NONE, AGENT_ATTACHED, AGENT_DONE = 0, 1, 2

# Header fields: name -> byte offset (each 8 bytes).
_FIELDS = {
    "pid": 16,
    "clock_offset_ns": 24,
    "state": 32,
    "agent_state": 40,
    "agent_pid": 48,
    "lane_count": 56,
    "names_count": 64,
    "names_end": 72,
    "flush_request": 80,
    "flush_done": 88,
    "config_bytes": 96,
    "lane_capacity": 104,
    "control_bytes": 112,
    "data_bytes": 120,
    "agents": 128,
    "deadline_ns": 136,
    # What the producer's rings refused, per record kind (counted by the producer, reported by the agent).
    "dropped_scalars": 144,
    "dropped_events": 152,
    "dropped_distributions": 160,
    "dropped_device_intervals": 168,
    "dropped_relay": 176,
    # The files' lengths when the agent last committed (what a replacement cuts them back to before it re-reads).
    "committed_jsonl_bytes": 184,
    "committed_trace_bytes": 192,
    "commits": 200,
    "dropped_phase_misuse": 208,
    "dropped_unlaned": 216,  # phases of threads beyond the lanes (counted by the producer, reported by the agent)
    "states_saved": 224,  # how many states the agent saved (SegmentReader.save_state): the next goes to slot states_saved % 2
}
DROP_FIELDS = {"scalars": "dropped_scalars", "events": "dropped_events", "distributions": "dropped_distributions",
               "device_intervals": "dropped_device_intervals", "relay": "dropped_relay",
               "phase_misuse": "dropped_phase_misuse"}  # fmt: skip
"""Queue name -> the header field counting what the producer's rings refused."""
_RING_WRITE, _RING_READ, _RING_DROPPED, _RING_CAPACITY = map(layout.RING_HEADER.offset, ("write", "read", "dropped", "capacity"))
RING_HEADER_BYTES = layout.RING_HEADER.itemsize
_FRAME = layout.FRAME_HEADER.struct()


def laid_out_here(path: Path, header: dict[str, int]) -> bool:
    """Whether this otel-rl's reader can read the segment at ``path`` (its file as long as its header's layout here):
    another version's is left to an agent of that version."""
    return path.stat().st_size >= _Regions(header["lane_capacity"], header["control_bytes"], header["data_bytes"]).total


def peek_header(path: Path) -> dict[str, int] | None:
    """The header fields of a segment file (None when it is not one, or not yet)."""
    with open(path, "rb") as f:
        header = f.read(HEADER_BYTES)
    if header[: len(MAGIC)] != MAGIC:
        return None
    return {name: struct.unpack_from("<q", header, offset)[0] for name, offset in _FIELDS.items()}


def _u64(buffer: mmap.mmap, offset: int) -> ctypes.c_uint64:
    # One aligned 8-byte load or store: the other process never sees half a counter.
    return ctypes.c_uint64.from_buffer(buffer, offset)


def _i64(buffer: mmap.mmap, offset: int) -> ctypes.c_int64:
    return ctypes.c_int64.from_buffer(buffer, offset)


def _write_slot(buffer: mmap.mmap, offset: int, payload: bytes, size: int = SLOT_BYTES) -> bool:
    """Replace a slot's payload (one writer): its version is odd while it is written (a seqlock)."""
    if len(payload) > size - 16:
        return False
    version = _u64(buffer, offset)
    version.value += 1
    struct.pack_into("<Q", buffer, offset + 8, len(payload))
    buffer[offset + 16 : offset + 16 + len(payload)] = payload
    version.value += 1
    return True


def _read_slot(buffer: mmap.mmap, offset: int, size: int = SLOT_BYTES) -> bytes | None:
    """A slot's payload as one whole version; None before the first write (or if it kept changing)."""
    version = _u64(buffer, offset)
    for _ in range(100):
        before = version.value
        if before % 2:  # being written
            continue
        (length,) = struct.unpack_from("<Q", buffer, offset + 8)
        payload = bytes(buffer[offset + 16 : offset + 16 + min(length, size - 16)])
        if version.value == before:
            return payload if before else None
    return None


class _Regions:
    """Offsets of the regions, from the header's sizes."""

    def __init__(self, lane_capacity: int, control_bytes: int, data_bytes: int) -> None:
        self.lane_capacity = lane_capacity
        self.names = HEADER_BYTES
        self.config = self.names + NAMES_BYTES
        self.totals = self.config + CONFIG_BYTES
        self.run = self.totals + SLOT_BYTES
        self.logs = self.run + SLOT_BYTES
        self.control = self.logs + RING_HEADER_BYTES + LOG_BYTES
        self.control_bytes = control_bytes
        self.data = self.control + RING_HEADER_BYTES + control_bytes
        self.data_bytes = data_bytes
        self.lanes = self.data + RING_HEADER_BYTES + data_bytes
        self.lane_bytes = LANE_HEADER_BYTES + lane_capacity * RECORD.itemsize
        self.states = self.lanes + MAX_LANES * self.lane_bytes
        self.total = self.states + 2 * STATE_BYTES

    def lane(self, index: int) -> int:
        return self.lanes + index * self.lane_bytes


class FileMapping:
    """A shared mapping of a segment's file, which the file being shrunk by another process cannot fault.

    Another process of the user may truncate the file; an access past its new
    end would be a SIGBUS, the death of training or of its agent. ``_guard.c``
    gives the file its length back on such a fault (what was cut reads as
    zeros) and counts it; :meth:`shrunk` tells the owner, which then stops
    trusting what the segment holds. The mapping keeps ``fd``.
    """

    def __init__(self, fd: int, length: int) -> None:
        self.buffer = mmap.mmap(fd, length)
        self.length = length
        self._fd = fd
        self._address = None
        if _guard is not None:
            try:
                _guard.protect(self.buffer, fd)
            except RuntimeError as exc:  # its table is full: this mapping goes unguarded, as without the extension
                _logger.warning("otel-rl: a segment's mapping is not guarded against truncation (%s)", exc, extra=once("guard-full"))
                return
            self._address = _guard.address(self.buffer)
            # Released with the mapping, also when a C lane holding it outlives close() (see close()).
            self._release = weakref.finalize(self.buffer, _release_guard, self._address, fd)

    @property
    def guarded(self) -> bool:
        """The mapping is guarded against the file being shrunk (False without the ``_guard`` extension, or past its table)."""
        return self._address is not None

    def shrunk(self) -> bool:
        """Whether the file was made shorter than the mapping since it was mapped (by what either end of it sees).

        The end that noticed it first (a fault here, or the file's length)
        clears the segment's magic, which tells the other end.
        """
        try:
            shrunk = bool(self._address is not None and _guard.faults(self._address)) or os.fstat(self._fd).st_size < self.length
        except OSError:
            return False
        if shrunk:
            self.buffer[: len(MAGIC)] = bytes(len(MAGIC))  # guarded: a store past the end is given its page back
        return shrunk or self.buffer[: len(MAGIC)] != MAGIC

    def close(self) -> None:
        """Unmap and let the file go; a mapping a C lane still holds stays (and stays guarded) until the lane goes."""
        try:
            self.buffer.close()
        except BufferError:
            return
        if self._address is not None:
            self._release()  # the guard and the descriptor
        else:
            with contextlib.suppress(OSError):
                os.close(self._fd)


def _release_guard(address: int, fd: int) -> None:
    """A guarded mapping is gone: its guard's slot is free and its file's descriptor closed."""
    with contextlib.suppress(KeyError):
        _guard.release(address)
    with contextlib.suppress(OSError):
        os.close(fd)


class Ring:
    """A byte ring of length-prefixed frames; either end (writer or reader) of it."""

    def __init__(self, buffer: mmap.mmap, offset: int, capacity: int) -> None:
        self.buffer = buffer
        self.offset = offset
        self.data = offset + RING_HEADER_BYTES
        self.capacity = capacity
        self.write = _u64(buffer, offset + _RING_WRITE)
        self.read = _u64(buffer, offset + _RING_READ)
        self.dropped = _u64(buffer, offset + _RING_DROPPED)
        self.taken: int | None = None
        """The reader's position past the frames it took and has not committed yet."""
        self.behind = False
        """Whether the last :meth:`take` stopped at its budget before the frames written when it began."""

    def put(self, kind: int, payload: bytes, limit: int) -> bool:
        """Append one frame (caller holds the writer's lock); False when it would pass ``limit`` bytes in use.

        ``_hotpath.put_frame`` is the same in C (and needs no lock: it holds the GIL throughout).
        """
        size = _FRAME.size + len(payload)
        size += -size % 8
        write, read = self.write.value, self.read.value
        position = write % self.capacity
        skip = self.capacity - position if position + size > self.capacity else 0
        if write + skip + size - read > min(limit, self.capacity):
            self.dropped.value += 1
            return False
        if skip:
            if skip >= _FRAME.size:
                _FRAME.pack_into(self.buffer, self.data + position, 0, MessageKind.SKIP)
            write += skip
            position = 0
        start = self.data + position
        _FRAME.pack_into(self.buffer, start, len(payload), kind)
        self.buffer[start + _FRAME.size : start + _FRAME.size + len(payload)] = payload
        self.write.value = write + size  # published after the bytes
        return True

    def take(self, budget: int) -> list[tuple[int, bytes]]:
        """Frames written since the last call (about ``budget`` bytes at most), oldest first, as copies.

        The writer may reuse their bytes only once :meth:`commit` publishes the new position.
        """
        read = self.read.value if self.taken is None else self.taken
        take = _c_take_frames or self.take_in_python
        frames, self.taken, self.behind = take(self.buffer, self.offset, self.capacity, read, budget)
        return frames

    def take_in_python(self, buffer: mmap.mmap, offset: int, capacity: int, read: int, budget: int) -> tuple[list, int, bool]:
        """``otel_rl.shm._frames.take_frames``, the pure-Python twin: (frames past ``read``, the position past them, behind)."""
        frames = []
        data, write = offset + RING_HEADER_BYTES, self.write.value
        taken = 0
        while read < write and taken < budget:
            position = read % capacity
            if capacity - position < _FRAME.size:
                read += capacity - position
                continue
            length, kind = _FRAME.unpack_from(buffer, data + position)
            if kind == MessageKind.SKIP:
                read += capacity - position
                continue
            start = data + position + _FRAME.size
            frames.append((kind, bytes(buffer[start : start + length])))
            size = _FRAME.size + length
            size += -size % 8
            read += size
            taken += size
        return frames, read, read < write

    def commit(self) -> None:
        """Publish the position past everything taken: the writer may reuse those bytes now."""
        if self.taken is not None:
            self.read.value = self.taken

    def pending(self) -> int:
        return self.write.value - self.read.value


class Segment:
    """The producer's end: lanes, the string table, the message rings and the header.

    Args:
        path: the file to create (``None``: anonymous memory, for a reader in this process).
        config: the pickled outputs' configuration the agent starts from.
    """

    def __init__(
        self,
        path: Path | None,
        config: bytes,
        lane_capacity: int,
        control_bytes: int = CONTROL_BYTES,
        data_bytes: int = DATA_BYTES,
    ) -> None:
        if len(config) > CONFIG_BYTES:
            raise ValueError(f"the outputs' configuration is {len(config)} bytes; at most {CONFIG_BYTES} fit")
        self.path = path
        lane_capacity = min(lane_capacity, MAX_LANE_CAPACITY)
        self.lane_capacity = lane_capacity
        self.regions = regions = _Regions(lane_capacity, control_bytes, data_bytes)
        self._mapping: FileMapping | None = None
        if path is None:
            self.buffer = mmap.mmap(-1, regions.total)
        else:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                # Reserve the memory now: touching a page the tmpfs cannot back later would be a SIGBUS.
                os.posix_fallocate(fd, 0, regions.total)
                self._mapping = FileMapping(fd, regions.total)
            except BaseException:
                os.close(fd)
                path.unlink(missing_ok=True)
                raise
            self.buffer = self._mapping.buffer
        buffer = self.buffer
        header = {name: _i64(buffer, offset) for name, offset in _FIELDS.items()}
        header["pid"].value = os.getpid()
        header["lane_capacity"].value = lane_capacity
        header["control_bytes"].value = control_bytes
        header["data_bytes"].value = data_bytes
        buffer[regions.config : regions.config + len(config)] = config
        header["config_bytes"].value = len(config)
        _u64(buffer, regions.control + _RING_CAPACITY).value = control_bytes
        _u64(buffer, regions.data + _RING_CAPACITY).value = data_bytes
        _u64(buffer, regions.logs + _RING_CAPACITY).value = LOG_BYTES
        buffer[: len(MAGIC)] = MAGIC  # last: a reader trusts nothing before it
        self.header = header
        self.control = Ring(buffer, regions.control, control_bytes)
        self.data = Ring(buffer, regions.data, data_bytes)
        self.logs = Ring(buffer, regions.logs, LOG_BYTES)
        self._lock = threading.Lock()
        self._final_totals: bytes | None = None
        self.interned: dict[str, int] = {}
        """Names already in the string table, by id (what the C scalars writer looks keys up in)."""
        self._exceptions: dict[type, int] = {}

    # -- the string table ------------------------------------------------

    def intern(self, item: object) -> int:
        """The id of a name (a timeline, ``timeline\\tphase``) or an exception type; -1 when the table is full."""
        if isinstance(item, type):
            found = self._exceptions.get(item)
            if found is None:
                found = self._exceptions[item] = self.intern(item.__name__)
            return found
        text = str(item)
        found = self.interned.get(text)
        if found is not None:
            return found
        with self._lock:
            found = self.interned.get(text)
            if found is not None or not self.header:  # known, or the segment is closed: nothing is written
                return -1 if found is None else found
            encoded = text.encode("utf-8", "replace")[:4096]
            header = self.header
            end = header["names_end"].value
            if end + 2 + len(encoded) > NAMES_BYTES:
                return -1
            start = self.regions.names + end
            struct.pack_into("<H", self.buffer, start, len(encoded))
            self.buffer[start + 2 : start + 2 + len(encoded)] = encoded
            header["names_end"].value = end + 2 + len(encoded)
            found = header["names_count"].value
            header["names_count"].value = found + 1  # published after the entry
            self.interned[text] = found
            return found

    # -- lanes and messages ----------------------------------------------

    def new_lane(self) -> int | None:
        """The offset of a fresh lane, or None when all :data:`MAX_LANES` are taken."""
        with self._lock:
            if not self.header:  # closed
                return None
            count = self.header["lane_count"].value
            if count >= MAX_LANES:
                return None
            self.header["lane_count"].value = count + 1  # the lane initialises its header before its first record
            return self.regions.lane(count)

    def ring_for(self, kind: int) -> tuple[Ring, int]:
        """The ring a message of ``kind`` goes to, and the bytes in use it may fill.

        Events (and the other control records) may fill three quarters of the
        control ring; the rest is kept for run records, so a lifecycle change
        always finds room.
        """
        base = kind & ~layout.PICKLED
        ring = self.control if base in CONTROL_KINDS else self.data
        return ring, ring.capacity if base == MessageKind.RUN else ring.capacity * 3 // 4

    def put(self, kind: int, payload: bytes) -> bool:
        """One message (``kind``, with :data:`otel_rl.shm.layout.PICKLED` when it is); False (counted in the ring) when its ring is full.

        The pure-Python writer (``_hotpath.put_frame`` writes the same frame in C).
        """
        ring, limit = self.ring_for(kind)
        with self._lock:
            return ring.put(kind, payload, limit)

    def set(self, field: str, value: int) -> None:
        self.header[field].value = value

    def get(self, field: str) -> int:
        return self.header[field].value

    def totals(self) -> bytes | None:
        """What the agent last published with :meth:`SegmentReader.publish_totals` (None before that; kept after close)."""
        if self.control is None:
            return self._final_totals
        return _read_slot(self.buffer, self.regions.totals)

    def publish_run(self, payload: bytes) -> bool:
        """The open run's start record (empty: no run open), for an agent that takes over mid-run."""
        return _write_slot(self.buffer, self.regions.run, payload)

    def close(self) -> None:
        """Forget the mapping (the reader unlinks the file)."""
        if self.control is not None:
            self._final_totals = _read_slot(self.buffer, self.regions.totals)
        self.header.clear()
        self.control = self.data = self.logs = None  # type: ignore[assignment]
        if self._mapping is not None:
            self._mapping.close()
            return
        try:
            self.buffer.close()
        except BufferError:  # a C lane still holds it; freed with the lane
            pass

    def damaged(self) -> bool:
        """Whether another process shrank the segment's file: what it held is no longer to be trusted."""
        return self._mapping is not None and self._mapping.shrunk()


class SegmentReader:
    """The agent's end of a :class:`Segment` (the file, or the producer's own mapping)."""

    def __init__(self, source: Path | mmap.mmap) -> None:
        self._mapping: FileMapping | None = None
        if isinstance(source, mmap.mmap):
            self.path = None
            buffer = source
        else:
            self.path = Path(source)
            fd = os.open(self.path, os.O_RDWR)
            try:
                self._mapping = FileMapping(fd, os.fstat(fd).st_size)
            except BaseException:
                os.close(fd)
                raise
            buffer = self._mapping.buffer
        if len(buffer) < HEADER_BYTES or bytes(buffer[: len(MAGIC)]) != MAGIC:
            if self._mapping is not None:
                self._mapping.close()
            raise ValueError(f"{source} is not an otel-rl segment (or not initialised yet)")
        self.buffer = buffer
        self.header = {name: _i64(buffer, offset) for name, offset in _FIELDS.items()}
        self.regions = regions = _Regions(
            self.header["lane_capacity"].value, self.header["control_bytes"].value, self.header["data_bytes"].value
        )
        if len(buffer) < regions.total:  # laid out by another otel-rl version (or cut short): none of it is read
            length = len(buffer)
            self.header.clear()
            if self._mapping is not None:
                self._mapping.close()
            raise ValueError(f"{source} holds {length} bytes where its header says {regions.total}: a segment of another otel-rl version, or cut short")
        self.control = Ring(buffer, regions.control, regions.control_bytes)
        self.data = Ring(buffer, regions.data, regions.data_bytes)
        self.logs = Ring(buffer, regions.logs, LOG_BYTES)
        self.names: list[str] = []
        self.interned_at = 0
        self._claim: int | None = None
        self._lanes: list[tuple[ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64, int, np.ndarray]] = []
        self._lanes_taken: list[int] = []

    def get(self, field: str) -> int:
        return self.header[field].value

    def set(self, field: str, value: int) -> None:
        self.header[field].value = value

    def config(self) -> bytes:
        start = self.regions.config
        return bytes(self.buffer[start : start + self.get("config_bytes")])

    def publish_totals(self, payload: bytes) -> bool:
        """Publish the outputs' totals for the producer; False if too large."""
        return _write_slot(self.buffer, self.regions.totals, payload)

    def run(self) -> bytes | None:
        """The open run's start record as the producer published it, or None."""
        return _read_slot(self.buffer, self.regions.run) or None

    def run_started(self) -> bool:
        """Whether the producer ever started a run (its slot was written, by the start or the end)."""
        return _read_slot(self.buffer, self.regions.run) is not None

    def update_names(self) -> list[str]:
        """Read the string table's new entries; returns the whole table."""
        count = self.get("names_count")
        offset = self.interned_at
        while len(self.names) < count:
            start = self.regions.names + offset
            (length,) = struct.unpack_from("<H", self.buffer, start)
            self.names.append(bytes(self.buffer[start + 2 : start + 2 + length]).decode("utf-8", "replace"))
            offset += 2 + length
        self.interned_at = offset
        return self.names

    def lanes(self) -> list[tuple[int, str, int]]:
        """``(thread_id, thread_name, dropped)`` per lane, new lanes included."""
        count = min(self.get("lane_count"), MAX_LANES)
        capacity = self.regions.lane_capacity
        while len(self._lanes) < count:
            offset = self.regions.lane(len(self._lanes))
            records = np.frombuffer(self.buffer, RECORD, capacity, offset + LANE_HEADER_BYTES)
            read = _u64(self.buffer, offset + _LANE_READ)
            self._lanes.append(
                (_u64(self.buffer, offset + _LANE_WRITE), read, _u64(self.buffer, offset + _LANE_DROPPED), offset, records)
            )
            self._lanes_taken.append(read.value)
        out = []
        for _, _, dropped, offset, _ in self._lanes:
            thread_id, name = _LANE_IDENTITY.unpack_from(self.buffer, offset + _LANE_THREAD)
            out.append((thread_id, name.split(b"\0", 1)[0].decode("utf-8", "replace"), dropped.value))
        return out

    def take_lane(self, index: int, budget: int) -> np.ndarray:
        """Records of lane ``index`` written since the last call (at most ``budget``), as a copy.

        The writer may reuse their slots only once :meth:`commit` publishes the new position.
        """
        write, _, _, _, records = self._lanes[index]
        start = self._lanes_taken[index]
        end = min(write.value, start + budget)
        if end <= start:
            return records[:0].copy()
        capacity = len(records)
        first, last = start % capacity, end % capacity
        out = records[first:last].copy() if first < last else np.concatenate((records[first:], records[:last]))
        self._lanes_taken[index] = end
        return out

    def commit(self, held: list[int] | None = None) -> None:
        """Publish what was taken from every lane and ring: the outputs have written it (see the agent's server).

        A reader that dies before committing leaves those records to the next one, which reads them again.
        ``held``: per lane, how many of the records taken last are kept back (read again by a next reader); at most a
        quarter of the lane, so that the writer always has room.
        """
        for read, value in self._lane_targets(held):
            read.value = value
        self.control.commit()
        self.data.commit()

    def _lane_targets(self, held: list[int] | None) -> list[tuple[ctypes.c_uint64, int]]:
        out = []
        for lane, ((_, read, _, _, records), taken) in enumerate(zip(self._lanes, self._lanes_taken)):
            back = held[lane] if held is not None and lane < len(held) else 0
            out.append((read, max(read.value, taken - min(back, len(records) // 4))))
        return out

    def _unseen_lanes_read(self) -> int:
        """The read positions of the lanes registered that this reader has not looked at yet (it moves none of them)."""
        count = min(self.get("lane_count"), MAX_LANES)
        return sum(_u64(self.buffer, self.regions.lane(i) + _LANE_READ).value for i in range(len(self._lanes), count))

    def mark_after(self, held: list[int] | None = None) -> tuple[int, int, int]:
        """The mark :meth:`commit` with ``held`` will publish: the rings' read positions and the lanes' summed (each only
        moves forward, so equal marks are the same commit)."""
        rings = tuple(ring.read.value if ring.taken is None else ring.taken for ring in (self.control, self.data))
        return (*rings, sum(value for _, value in self._lane_targets(held)) + self._unseen_lanes_read())  # type: ignore[return-value]

    def committed_mark(self) -> tuple[int, int, int]:
        """The mark of the last commit (any reader's): where a reader taking over starts."""
        lanes = sum(read.value for _, read, _, _, _ in self._lanes) + self._unseen_lanes_read()
        return (self.control.read.value, self.data.read.value, lanes)

    def save_state(self, mark: tuple[int, int, int], payload: bytes) -> bool:
        """Keep the outputs' cumulative state as it stands at ``mark`` (a commit about to be published), in the slot the
        previous commit's state is not in; False if it is too large."""
        slot = self.regions.states + (self.get("states_saved") % 2) * STATE_BYTES
        if not _write_slot(self.buffer, slot, _MARK.pack(*mark) + payload, STATE_BYTES):
            return False
        self.set("states_saved", self.get("states_saved") + 1)
        return True

    def saved_state(self) -> bytes | None:
        """The outputs' state saved at the last commit (None: none saved that matches it, as after a death between
        saving a state and committing, when the other slot's does)."""
        mark = self.committed_mark()
        for index in (0, 1):
            payload = _read_slot(self.buffer, self.regions.states + index * STATE_BYTES, STATE_BYTES)
            if payload is not None and len(payload) >= _MARK.size and _MARK.unpack_from(payload) == mark:
                return payload[_MARK.size :]
        return None

    def claim(self) -> bool:
        """Become the one reader of this segment's file: True, or False when another holds it.

        An exclusive ``flock`` on the file, held until :meth:`close` (the
        kernel drops it when the holder dies, so a new agent can take over).
        Two agents, or an agent and a producer finishing the work itself,
        never read the same rings.
        """
        if self.path is None:
            return True
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._claim = fd
        return True

    def close(self) -> None:
        if self._claim is not None:
            os.close(self._claim)
            self._claim = None
        self._lanes.clear()
        self.header.clear()
        self.control = self.data = self.logs = None  # type: ignore[assignment]
        if self._mapping is not None:
            self._mapping.close()

    def damaged(self) -> bool:
        """Whether another process shrank the segment's file: what it holds is no longer to be trusted."""
        return self._mapping is not None and self._mapping.shrunk()
