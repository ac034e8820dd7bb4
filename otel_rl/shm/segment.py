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

Every ring has one writer and one reader and moves two counters: the writer
publishes ``write`` after the bytes it covers, the reader publishes ``read``
after it has copied them. A writer that finds its ring full drops the new
record and counts it (it can never take back what the reader may be
copying). Lanes are written by ``otel_rl.training._hotpath`` (or
:class:`PyShmLane`) with the layout of :data:`RECORD`.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import re
import struct
import threading
import time
from glob import escape as glob_escape
from pathlib import Path

import numpy as np

from otel_rl.background import pid_alive
from otel_rl.config import AGENT_NAME

try:
    from otel_rl.training._hotpath import put_frame, put_scalars
except ImportError:  # not built: the pure-Python writer
    put_frame = put_scalars = None

MAGIC = b"OTELRL\x00\x01"
HEADER_BYTES = 4096
NAMES_BYTES = 1 << 20
CONFIG_BYTES = 1 << 20
SLOT_BYTES = 64 << 10
LOG_BYTES = 256 << 10
RING_HEADER_BYTES = 64
LANE_HEADER_BYTES = 64
MAX_LANES = 8
"""Recording threads per process with a lane; the records of further threads are dropped (one warning)."""
MAX_LANE_CAPACITY = 65_536
"""Records per lane at most (3 MiB, several seconds of phases: what waits while the agent starts up);
the segment's memory (about 42 MiB) is reserved up front."""

RECORD = np.dtype(
    [
        ("start", "<i8"),
        ("end", "<i8"),
        ("a", "<i8"),
        ("b", "<i8"),
        ("name", "<i4"),
        ("depth", "<i2"),
        ("kind", "u1"),
        ("flags", "u1"),
        ("exc", "<i4"),
        ("reserved", "<i4"),
    ]
)
"""A lane record (``ShmRecord`` in ``_hotpath.c``)."""
assert RECORD.itemsize == 48

# Lane record kinds.
PHASE, ITERATION_START, ITERATION_END, FLOW, CORRELATE = 1, 2, 3, 4, 5
NO_STEPS = -(2**63)
"""``b`` of an iteration mark without env steps."""

# Message kinds (the first u32 of a frame is its payload length, the second its kind).
SKIP = 0
"""Filler to the ring's end: the next frame starts at offset 0."""
RUN, EVENT, SCALARS, DISTRIBUTION, DEVICE_INTERVAL, REMOTE_CYCLE, CUDA_FALLBACK, SCALARS_PACKED, LOG = 1, 2, 3, 4, 5, 6, 7, 8, 9
CONTROL_KINDS = frozenset({RUN, EVENT, CUDA_FALLBACK})
FOREIGN = "\x00otel-rl foreign"
"""First item of the stand-in ``(FOREIGN, type name, repr)`` sent for a key or value of a marshalled
record that is not plain data (an enum, a path, a bytes object...): the agent's checks word it alike."""
PICKLED = 0x100
"""Set in a frame's kind when its payload is a pickle; otherwise it is ``marshal`` (plain values only, faster)."""

SCALARS_HEADER = struct.Struct("<qqqqII")
"""A packed scalars record (``SCALARS_PACKED``, written by ``_hotpath.put_scalars``): time, step,
iteration, env steps (:data:`NO_STEPS`: none), the number of entries; then the entries."""
SCALAR_ENTRY = np.dtype([("key", "<u4"), ("tag", "u1"), ("reserved", "u1", (3,)), ("value", "<f8")])
"""One value of a packed scalars record: its key's id in the string table, its type, its 8 bytes."""
VALUE_FLOAT, VALUE_INT, VALUE_NONE, VALUE_BOOL = 0, 1, 2, 3

# Producer states.
RUNNING, CLOSING = 0, 1
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
}
_RING_WRITE, _RING_READ, _RING_DROPPED, _RING_CAPACITY = 0, 8, 16, 24
_FRAME = struct.Struct("<II")


def segment_dir() -> Path:
    """The user's private directory of segments (created 0700)."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(os.environ.get("TMPDIR", "/tmp"))
    path = base / f"otel-rl-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    if path.stat().st_uid != os.getuid() or path.stat().st_mode & 0o077:
        raise PermissionError(f"{path} is not private to this user")
    return path


AGENT_LOCK = "agent.lock"
"""In an agent's directory: the file its agent holds an exclusive ``flock`` on while it serves."""


def agent_dir(name: str) -> Path:
    """The directory of the agent called ``name`` (created 0700): its producers' segments and its lock."""
    if not AGENT_NAME.fullmatch(name) or name in (".", ".."):
        raise ValueError(f"an agent name is 1 to 64 of A-Z a-z 0-9 _ . -, got {name[:80]!r}")
    path = segment_dir() / name
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def agent_running(directory: Path) -> bool:
    """Whether an agent serves ``directory`` (holds its lock)."""
    try:
        fd = os.open(directory / AGENT_LOCK, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # granted only while no agent holds it exclusively
    except OSError:
        return True
    finally:
        os.close(fd)  # releases the probe's shared lock
    return False


def remove_if_empty(directory: Path) -> None:
    """Remove an agent's directory (and its lock) that holds no segment; quietly keep it otherwise.

    A producer arriving meanwhile makes the directory again (its first try
    finds it gone) and starts a new agent.
    """
    try:
        if not any(directory.glob("*.seg")):
            (directory / AGENT_LOCK).unlink(missing_ok=True)
            directory.rmdir()
    except OSError:
        pass


def lock_agent(directory: Path, wait_s: float = 1.0) -> int | None:
    """Become the agent of ``directory``: the lock's descriptor, or None when another agent holds it.

    Retried for ``wait_s``: a producer's :func:`agent_running` probe holds a shared lock for microseconds.
    """
    fd = os.open(directory / AGENT_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.01)


def run_prefix(run_id: str) -> str:
    """How the names of a run's segment files begin."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", run_id)[:80] + "-"


def _peek(path: Path) -> dict[str, int] | None:
    """The header fields of a segment file (None when it is not one, or not yet)."""
    with open(path, "rb") as f:
        header = f.read(HEADER_BYTES)
    if header[: len(MAGIC)] != MAGIC:
        return None
    return {name: struct.unpack_from("<q", header, offset)[0] for name, offset in _FIELDS.items()}


def wait_for_agents(run_id: str, timeout_s: float) -> bool:
    """Wait while an agent still finishes the outputs of ``run_id`` for a producer that died; True when none does.

    A run resumed right after a SIGKILL would otherwise write its folder while
    the dead producer's agent is still writing its end there.
    """
    prefix = run_prefix(run_id)
    deadline = time.monotonic() + timeout_s
    while True:
        busy = False
        for path in segment_dir().glob(f"*/{glob_escape(prefix)}*.seg"):
            try:
                header = _peek(path)
            except (OSError, struct.error):
                continue
            if header is not None and header["agent_state"] != AGENT_DONE:
                busy = busy or (not pid_alive(header["pid"]) and pid_alive(header["agent_pid"]))
        if not busy:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


STALE_AFTER_S = 60.0
"""A segment this old whose producer and agent are both gone is removed by the next producer that starts."""


def remove_stale(directory: Path) -> list[Path]:
    """Remove segments left by a producer and an agent that both died (each reserved tens of MiB); returns them.

    ``directory`` and the agents' directories in it are searched.
    """
    removed = []
    for path in [*directory.glob("*.seg"), *directory.glob("*/*.seg")]:
        try:
            if time.time() - path.stat().st_mtime < STALE_AFTER_S:
                continue  # being created, or young: never raced
            header = _peek(path)
            if header is not None and (pid_alive(header["pid"]) or pid_alive(header["agent_pid"])):
                continue
            path.unlink()
            removed.append(path)
        except (OSError, struct.error):
            continue
    for agent in directory.iterdir():  # an agent's directory whose agent ended and producers left
        try:
            if not agent.is_dir() or time.time() - agent.stat().st_mtime < STALE_AFTER_S or agent_running(agent):
                continue
            remove_if_empty(agent)
        except OSError:
            continue
    return removed


def _u64(buffer: mmap.mmap, offset: int) -> ctypes.c_uint64:
    # One aligned 8-byte load or store: the other process never sees half a counter.
    return ctypes.c_uint64.from_buffer(buffer, offset)


def _i64(buffer: mmap.mmap, offset: int) -> ctypes.c_int64:
    return ctypes.c_int64.from_buffer(buffer, offset)


def _write_slot(buffer: mmap.mmap, offset: int, payload: bytes) -> bool:
    """Replace a slot's payload (one writer): its version is odd while it is written (a seqlock)."""
    if len(payload) > SLOT_BYTES - 16:
        return False
    version = _u64(buffer, offset)
    version.value += 1
    struct.pack_into("<Q", buffer, offset + 8, len(payload))
    buffer[offset + 16 : offset + 16 + len(payload)] = payload
    version.value += 1
    return True


def _read_slot(buffer: mmap.mmap, offset: int) -> bytes | None:
    """A slot's payload as one whole version; None before the first write (or if it kept changing)."""
    version = _u64(buffer, offset)
    for _ in range(100):
        before = version.value
        if before % 2:  # being written
            continue
        (length,) = struct.unpack_from("<Q", buffer, offset + 8)
        payload = bytes(buffer[offset + 16 : offset + 16 + min(length, SLOT_BYTES - 16)])
        if version.value == before:
            return payload if before else None
    return None


class _Layout:
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
        self.total = self.lanes + MAX_LANES * self.lane_bytes

    def lane(self, index: int) -> int:
        return self.lanes + index * self.lane_bytes


class _Ring:
    """A byte ring of length-prefixed frames; either end (writer or reader) of it."""

    def __init__(self, buffer: mmap.mmap, offset: int, capacity: int) -> None:
        self.buffer = buffer
        self.offset = offset
        self.data = offset + RING_HEADER_BYTES
        self.capacity = capacity
        self.write = _u64(buffer, offset + _RING_WRITE)
        self.read = _u64(buffer, offset + _RING_READ)
        self.dropped = _u64(buffer, offset + _RING_DROPPED)

    def put(self, kind: int, payload: bytes, limit: int) -> bool:
        """Append one frame (caller holds the writer's lock); False when it would pass ``limit`` bytes in use.

        ``otel_rl.training._hotpath.put_frame`` is the same in C (and needs no lock: it holds the GIL throughout).
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
                _FRAME.pack_into(self.buffer, self.data + position, 0, SKIP)
            write += skip
            position = 0
        start = self.data + position
        _FRAME.pack_into(self.buffer, start, len(payload), kind)
        self.buffer[start + _FRAME.size : start + _FRAME.size + len(payload)] = payload
        self.write.value = write + size  # published after the bytes
        return True

    def take(self, budget: int) -> list[tuple[int, bytes]]:
        """Frames written since the last call (about ``budget`` bytes at most), oldest first."""
        frames = []
        read, write = self.read.value, self.write.value
        taken = 0
        while read < write and taken < budget:
            position = read % self.capacity
            if self.capacity - position < _FRAME.size:
                read += self.capacity - position
                continue
            length, kind = _FRAME.unpack_from(self.buffer, self.data + position)
            if kind == SKIP:
                read += self.capacity - position
                continue
            start = self.data + position + _FRAME.size
            frames.append((kind, self.buffer[start : start + length]))
            size = _FRAME.size + length
            size += -size % 8
            read += size
            taken += size
        self.read.value = read  # the writer may reuse the bytes now
        return frames

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
        control_bytes: int = 2 << 20,
        data_bytes: int = 16 << 20,
    ) -> None:
        if len(config) > CONFIG_BYTES:
            raise ValueError(f"the outputs' configuration is {len(config)} bytes; at most {CONFIG_BYTES} fit")
        self.path = path
        lane_capacity = min(lane_capacity, MAX_LANE_CAPACITY)
        self.lane_capacity = lane_capacity
        self.layout = layout = _Layout(lane_capacity, control_bytes, data_bytes)
        if path is None:
            self.buffer = mmap.mmap(-1, layout.total)
        else:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                # Reserve the memory now: touching a page the tmpfs cannot back later would be a SIGBUS.
                os.posix_fallocate(fd, 0, layout.total)
                self.buffer = mmap.mmap(fd, layout.total)
            except BaseException:
                os.close(fd)
                path.unlink(missing_ok=True)
                raise
            os.close(fd)
        buffer = self.buffer
        header = {name: _i64(buffer, offset) for name, offset in _FIELDS.items()}
        header["pid"].value = os.getpid()
        header["lane_capacity"].value = lane_capacity
        header["control_bytes"].value = control_bytes
        header["data_bytes"].value = data_bytes
        buffer[layout.config : layout.config + len(config)] = config
        header["config_bytes"].value = len(config)
        _u64(buffer, layout.control + _RING_CAPACITY).value = control_bytes
        _u64(buffer, layout.data + _RING_CAPACITY).value = data_bytes
        _u64(buffer, layout.logs + _RING_CAPACITY).value = LOG_BYTES
        buffer[: len(MAGIC)] = MAGIC  # last: a reader trusts nothing before it
        self.header = header
        self.control = _Ring(buffer, layout.control, control_bytes)
        self.data = _Ring(buffer, layout.data, data_bytes)
        self.logs = _Ring(buffer, layout.logs, LOG_BYTES)
        self._lock = threading.Lock()
        self._final_totals: bytes | None = None
        self._names: dict[str, int] = {}
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
        found = self._names.get(text)
        if found is not None:
            return found
        with self._lock:
            found = self._names.get(text)
            if found is not None:
                return found
            encoded = text.encode("utf-8", "replace")[:4096]
            header = self.header
            end = header["names_end"].value
            if end + 2 + len(encoded) > NAMES_BYTES:
                return -1
            start = self.layout.names + end
            struct.pack_into("<H", self.buffer, start, len(encoded))
            self.buffer[start + 2 : start + 2 + len(encoded)] = encoded
            header["names_end"].value = end + 2 + len(encoded)
            found = header["names_count"].value
            header["names_count"].value = found + 1  # published after the entry
            self._names[text] = found
            return found

    # -- lanes and messages ----------------------------------------------

    def new_lane(self) -> int | None:
        """The offset of a fresh lane, or None when all :data:`MAX_LANES` are taken."""
        with self._lock:
            count = self.header["lane_count"].value
            if count >= MAX_LANES:
                return None
            self.header["lane_count"].value = count + 1  # the lane initialises its header before its first record
            return self.layout.lane(count)

    def put(self, kind: int, payload: bytes) -> bool:
        """One message (``kind``, with :data:`PICKLED` when it is); False (counted in the ring) when its ring is full.

        Events (and the other control records) may fill three quarters of the
        control ring; the rest is kept for run records, so a lifecycle change
        always finds room.
        """
        base = kind & ~PICKLED
        ring = self.control if base in CONTROL_KINDS else self.data
        limit = ring.capacity if base == RUN else ring.capacity * 3 // 4
        if put_frame is not None:
            return put_frame(self.buffer, ring.offset, ring.capacity, kind, payload, limit)
        with self._lock:
            return ring.put(kind, payload, limit)

    def put_scalars(self, record: tuple) -> bool | None:
        """A ``scalars()`` record packed in C (key ids, 8-byte values): False when the ring is full,
        None when it is not plain (keys not all ``str``, values not all numbers) or C is not built."""
        if put_scalars is None:
            return None
        time_ns, values, step, iteration, env_steps, _ = record
        ring = self.data
        return put_scalars(
            self.buffer, ring.offset, ring.capacity, ring.capacity, SCALARS_PACKED, time_ns, values, step, iteration,
            env_steps, self._names, self.intern,
        )  # fmt: skip

    def set(self, field: str, value: int) -> None:
        self.header[field].value = value

    def get(self, field: str) -> int:
        return self.header[field].value

    def totals(self) -> bytes | None:
        """What the agent last published with :meth:`SegmentReader.publish_totals` (None before that; kept after close)."""
        if self.control is None:
            return self._final_totals
        return _read_slot(self.buffer, self.layout.totals)

    def publish_run(self, payload: bytes) -> bool:
        """The open run's start record (empty: no run open), for an agent that takes over mid-run."""
        return _write_slot(self.buffer, self.layout.run, payload)

    def close(self) -> None:
        """Forget the mapping (the reader unlinks the file)."""
        if self.control is not None:
            self._final_totals = _read_slot(self.buffer, self.layout.totals)
        self.header.clear()
        self.control = self.data = self.logs = None  # type: ignore[assignment]
        try:
            self.buffer.close()
        except BufferError:  # a C lane still holds it; freed with the lane
            pass


class SegmentReader:
    """The agent's end of a :class:`Segment` (the file, or the producer's own mapping)."""

    def __init__(self, source: Path | mmap.mmap) -> None:
        if isinstance(source, mmap.mmap):
            self.path = None
            buffer = source
        else:
            self.path = Path(source)
            fd = os.open(self.path, os.O_RDWR)
            try:
                buffer = mmap.mmap(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)
        if bytes(buffer[: len(MAGIC)]) != MAGIC:
            raise ValueError(f"{source} is not an otel-rl segment (or not initialised yet)")
        self.buffer = buffer
        self.header = {name: _i64(buffer, offset) for name, offset in _FIELDS.items()}
        self.layout = layout = _Layout(
            self.header["lane_capacity"].value, self.header["control_bytes"].value, self.header["data_bytes"].value
        )
        self.control = _Ring(buffer, layout.control, layout.control_bytes)
        self.data = _Ring(buffer, layout.data, layout.data_bytes)
        self.logs = _Ring(buffer, layout.logs, LOG_BYTES)
        self.names: list[str] = []
        self._names_at = 0
        self._claim: int | None = None
        self._lanes: list[tuple[ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64, int, np.ndarray]] = []

    def get(self, field: str) -> int:
        return self.header[field].value

    def set(self, field: str, value: int) -> None:
        self.header[field].value = value

    def config(self) -> bytes:
        start = self.layout.config
        return bytes(self.buffer[start : start + self.get("config_bytes")])

    def publish_totals(self, payload: bytes) -> bool:
        """Publish the outputs' totals for the producer; False if too large."""
        return _write_slot(self.buffer, self.layout.totals, payload)

    def run(self) -> bytes | None:
        """The open run's start record as the producer published it, or None."""
        return _read_slot(self.buffer, self.layout.run) or None

    def update_names(self) -> list[str]:
        """Read the string table's new entries; returns the whole table."""
        count = self.get("names_count")
        offset = self._names_at
        while len(self.names) < count:
            start = self.layout.names + offset
            (length,) = struct.unpack_from("<H", self.buffer, start)
            self.names.append(bytes(self.buffer[start + 2 : start + 2 + length]).decode("utf-8", "replace"))
            offset += 2 + length
        self._names_at = offset
        return self.names

    def lanes(self) -> list[tuple[int, str, int]]:
        """``(thread_id, thread_name, dropped)`` per lane, new lanes included."""
        count = min(self.get("lane_count"), MAX_LANES)
        capacity = self.layout.lane_capacity
        while len(self._lanes) < count:
            offset = self.layout.lane(len(self._lanes))
            records = np.frombuffer(self.buffer, RECORD, capacity, offset + LANE_HEADER_BYTES)
            self._lanes.append(
                (_u64(self.buffer, offset), _u64(self.buffer, offset + 8), _u64(self.buffer, offset + 16), offset, records)
            )
        out = []
        for _, _, dropped, offset, _ in self._lanes:
            thread_id, name = struct.unpack_from("<q24s", self.buffer, offset + 32)
            out.append((thread_id, name.split(b"\0", 1)[0].decode("utf-8", "replace"), dropped.value))
        return out

    def take_lane(self, index: int, budget: int) -> np.ndarray:
        """Records of lane ``index`` written since the last call (at most ``budget``), as a copy."""
        write, read, _, _, records = self._lanes[index]
        end, start = write.value, read.value
        end = min(end, start + budget)
        if end <= start:
            return records[:0].copy()
        out = records[np.arange(start, end, dtype=np.uint64) % np.uint64(len(records))]  # a copy, wrapped
        read.value = end  # the writer may reuse those records now
        return out

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
        if self.path is not None:
            try:
                self.buffer.close()
            except BufferError:
                pass
