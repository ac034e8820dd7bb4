"""The fragments of a trace: each worker's (and each joined rank's) part, taken into the learner's trace at its end.

A worker process writes its part of the trace as a fragment next to the
learner's trace (named by :func:`otel_rl.run.files.fragment_name`, with
:data:`otel_rl.run.files.PARTIAL_SUFFIX` while it is written); serialized
traces concatenate, so the learner's trace takes finished fragments in whole.
A fragment a crashed worker left is cut after its last whole packet and marked
with :data:`otel_rl.formats.trace.CRASH_MARK` on that process.
"""

from __future__ import annotations

import os
import shutil
from collections import deque
from pathlib import Path

from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TracePacket, TrackEvent

from otel_rl.base.log import logger
from otel_rl.base.processes import pid_alive
from otel_rl.formats import trace
from otel_rl.formats.protowire import TRACE_PACKET, length_delimited
from otel_rl.outputs.perfetto.encoder import trace_entry, track_uuid
from otel_rl.run import files

_logger = logger(__name__)


def merge_fragments(path: Path, prefix: str = files.fragment_prefix()) -> None:
    """Append the fragments of worker processes (named ``prefix*``) to ``path``: serialized traces concatenate.

    Finished fragments (``trace-<role>.perfetto-trace``) go in whole. A
    ``.partial`` fragment whose process is gone is a worker that crashed:
    it is cut after its last whole packet and goes in with a
    :data:`otel_rl.formats.trace.CRASH_MARK` instant on that process. A ``.partial`` fragment of a
    live process is still being written and is left alone.
    """
    pattern = prefix + "*" + files.TRACE_SUFFIX
    fragments = sorted(path.parent.glob(pattern))
    crashed = [p for p in sorted(path.parent.glob(pattern + files.PARTIAL_SUFFIX)) if not _writer_alive(p)]
    if not fragments and not crashed:
        return
    with open(path, "ab") as merged:
        for fragment in fragments:
            with open(fragment, "rb") as part:
                shutil.copyfileobj(part, merged)
            fragment.unlink()
        for fragment in crashed:
            data = fragment.read_bytes()
            whole, last_ts, pid = _whole_packets(data)
            merged.write(data[:whole])
            if pid is not None:
                merged.write(crash_mark(pid, last_ts))
            fragment.unlink()
            _logger.warning("otel-rl: merged the trace of a crashed worker (%s), marked as crashed", fragment.name)


def _writer_alive(fragment: Path) -> bool:
    _, _, shown = _whole_packets(fragment.read_bytes()[:65536])
    pid = None if shown is None else trace.local_pid(shown)  # fragments are merged on the machine that wrote them
    return pid != os.getpid() and pid_alive(pid)


def _whole_packets(data: bytes) -> tuple[int, int, int | None]:
    """(bytes of whole packets, timestamp of the last packet that has one, pid of the first process descriptor)."""
    offset, pid = 0, None
    recent: deque[tuple[int, int]] = deque(maxlen=64)  # the last packets' spans, searched for a timestamp
    for tag, _, body, end in length_delimited(data):
        if tag != TRACE_PACKET:
            break
        if pid is None:
            pid = TracePacket.FromString(data[body:end]).track_descriptor.process.pid or None
        recent.append((body, end))
        offset = end
    last_ts = 0
    for begin, stop in reversed(recent):
        last_ts = TracePacket.FromString(data[begin:stop]).timestamp
        if last_ts:
            break
    return offset, last_ts, pid


def crash_mark(pid: int, time_ns: int, name: str = "") -> bytes:
    """An instant on a "crashed" track of process ``pid`` at ``time_ns`` (its own packet sequence)."""
    sequence = 0x7FFF0000 + (pid % 0xFFFF)
    uuid = track_uuid("crashed", pid)
    descriptor = TracePacket(trusted_packet_sequence_id=sequence)
    descriptor.track_descriptor.uuid = uuid
    descriptor.track_descriptor.parent_uuid = track_uuid("process", pid)
    descriptor.track_descriptor.name = "crashed"
    mark = TracePacket(trusted_packet_sequence_id=sequence, timestamp=time_ns)
    mark.track_event.type = TrackEvent.TYPE_INSTANT
    mark.track_event.track_uuid = uuid
    mark.track_event.name = name or trace.CRASH_MARK
    return trace_entry(descriptor.SerializeToString()) + trace_entry(mark.SerializeToString())
