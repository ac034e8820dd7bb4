"""The Perfetto trace: every phase of every process on one timeline.

The trace reads the pipeline's batches (not the sampled spans), so the
timeline is complete however the span budget samples. Layout:

* a process track per producer (the learner, each collector process, each
  joined rank), with a thread track per thread; iterations and phases are
  nested slices on it (names from :mod:`otel_rl.formats.trace`);
* a "GPU n" process with one track per CUDA stream for device intervals;
* flows linking a collector's inference request to the learner's inference
  and back to the collector's action wait (:meth:`otel_rl.Telemetry.flow`);
* counter tracks for throughput, queue depths and ``sys/*`` values, and,
  with ``trace_thread_time``, each thread's CPU share per iteration.

The pipeline thread encodes each batch from its columns as it arrives
(:mod:`otel_rl.outputs.perfetto.encoder`) and hands the bytes to a bounded
queue; a writer thread streams them to the trace file. A full queue makes the
pipeline's thread wait for the disk, as ``metrics.jsonl`` does: the trace
drops nothing the pipeline took unless the disk stalls. A file that outgrows
``max_bytes`` is rotated (:func:`otel_rl.run.files.rotated`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from pathlib import Path

import numpy as np

from otel_rl.base.deadline import Deadline
from otel_rl.base.drops import Drops
from otel_rl.base.files import close_quietly
from otel_rl.base.log import logger, once
from otel_rl.base.loops import BackgroundLoop
from otel_rl.core.batches import IterationBatch, PhaseBatch, ScalarBatch
from otel_rl.core.pipeline import RecordSink
from otel_rl.core.records import DeviceIntervalRecord, EventRecord
from otel_rl.formats import schema, trace
from otel_rl.outputs.perfetto.encoder import TraceEncoder, track_uuid
from otel_rl.outputs.perfetto.fragments import crash_mark, merge_fragments
from otel_rl.outputs.perfetto.profile import KeptIntervals, fit, nested_order, read_profile
from otel_rl.run import files

_logger = logger(__name__)

_RETRY = "retry"
"""Marks a write the disk refused, queued again first: it goes on in the file it was meant for."""
_ROTATE = object()  # a mark in the writer's queue: start the next file here
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
PIECE = 64
"""Iterations of a batch encoded in one piece at first; then as many as the file has room for, at the size they took."""
QUEUE_CAPACITY = 100_000
FINISH_S = 0.2
"""What a closing writer keeps of its deadline to count what it could not write."""
GIVE_UP_S = 1.0
"""How long a closing writer tries a failing disk again: the run's end is said in time."""
MAX_BEHIND_BYTES = 128 * 1024 * 1024
"""Packets kept for a disk that refuses them (full), to be written once it takes them again; past it, dropped and counted."""
COUNTER_PREFIXES = ("Perf/total_fps", "Train/mean_reward", "sys/", "Perf/replay_", "Perf/queue", trace.CLOCK_OFFSET_KEY)
MAX_COUNTER_TRACKS = 64
"""Counter tracks per process at most (the clock offset, which readers need, is always kept)."""
MAX_CLASSIFIED_KEYS = 10_000
"""Scalar keys whose counter-or-not decision is remembered (bounds memory with ever-new keys)."""


class PerfettoTraceSink(RecordSink):
    """Streams this process's records to a Perfetto trace file from a writer thread.

    Args:
        path: the trace file.
        process_name: the producer shown as this process's name.
        drops: where records dropped by a full queue are counted (queue ``perfetto``).
        thread_time: add a CPU-share counter per thread (needs iteration thread times).
        cuda_events: put device intervals on GPU stream tracks.
        max_bytes: rotate the file past this size.
        fragments: this trace takes in the fragments named so (:func:`otel_rl.run.files.fragment_prefix`) when it
            ends (a machine's first learner rank's); None: it is a fragment itself.
        pid: the process the trace shows (default: this one; an agent passes its producer's).
        profile: the ``torch.profiler`` window configured, ``(start, count)``: the intervals of the iterations and
            phases around it are kept until its event arrives, so that its operators are fitted inside them
            (:mod:`otel_rl.outputs.perfetto.profile`).
        clock_offset_ns: the producer's epoch minus ``perf_counter_ns`` (the profile's markers are read on the latter).
        node, host: the producer's machine in a job of several (its pids and GPUs are told apart by it,
            :func:`otel_rl.formats.trace.node_pid`); 0 and None on one machine.
    """

    def __init__(
        self,
        path: Path,
        process_name: str,
        drops: Drops | None = None,
        thread_time: bool = False,
        cuda_events: bool = True,
        max_bytes: int = DEFAULT_MAX_BYTES,
        capacity: int = QUEUE_CAPACITY,
        fragments: str | None = None,
        pid: int | None = None,
        profile: tuple[int, int] | None = None,
        clock_offset_ns: int = 0,
        node: int = 0,
        host: str | None = None,
    ) -> None:
        self.path = Path(path)
        self._fragments = fragments
        # A worker's fragment is written under a temporary name and renamed when
        # complete, so the learner only ever merges finished fragments.
        self._writing = self.path if fragments is not None else files.partial(self.path)
        self._encoder = TraceEncoder(os.getpid() if pid is None else pid, process_name, node=node, host=host)
        self._thread_time = thread_time
        self._cuda_events = cuda_events
        self._max_bytes = max_bytes
        self._drops = drops
        self._capacity = capacity
        self._encoded = 0  # bytes encoded for the current file
        self.dropped = 0
        self._counters: dict[str, int] = {}
        self._classified: set[str] = set()  # scalar keys seen, and those drawn as counter tracks
        self._counter_keys: set[str] = set()
        self._kept = None if profile is None else KeptIntervals(*profile)
        self._profile_event: dict | None = None  # the profile's event, merged at the end of its pass
        self._clock_offset_ns = clock_offset_ns
        self._writer = TraceWriter(self.path, self._writing, drops)

    # -- pipeline side: encode (C for the slices), then enqueue bytes ----------

    def _put(self, chunks: list[bytes], records: int, state: bool) -> None:
        """Queue the encoded packets of ``records`` records; when full, wait for the writer, and drop only when it stalled.

        Descriptor and interning packets are never dropped: the packets after
        them refer to their ids, and there are only a handful per file.
        """
        writer = self._writer
        queue = writer.queue
        # The run folder's copy waits for the disk (the pipeline's thread, never training's); a stalled or failing one is not.
        behind = writer.error is not None and writer.queued_bytes - writer.written_bytes > MAX_BEHIND_BYTES  # a disk that stays full
        if not state and (behind or len(queue) >= self._capacity and not writer.wait_for_room(
            lambda: len(queue) < self._capacity, lambda: writer.written, lambda: writer.error is not None
        )):  # fmt: skip
            self.dropped += records
            if self._drops is not None:
                self._drops.add("perfetto", "records", records)
            return
        data = b"".join(chunks)
        writer.queued_bytes += len(data)
        queue.append((data, records))
        self._encoded += len(data)
        if self._encoded > self._max_bytes:
            # Rotate between records, so each file starts with its own descriptors.
            queue.append(_ROTATE)
            self._encoder.reset()
            self._encoded = 0

    def _encode(self, records: int, encode) -> int:
        """Queue what ``encode()`` gives (a list of packets) for ``records`` records; its size, 0 when it failed (skipped alone)."""
        state_before = self._encoder.state_packets
        try:
            chunks = encode()
        except Exception:
            _logger.warning("otel-rl: could not encode a trace record; skipped", exc_info=True, extra=once("trace-encode"))
            return 0
        self._put(chunks, records, self._encoder.state_packets != state_before)
        return sum(map(len, chunks))

    def on_iterations(self, batch: IterationBatch) -> None:
        # Encoded now, so the batch dies now: records that wait for another thread survive
        # garbage collections and make every later one slower.
        if self._kept is not None and not self._kept.add_iterations(batch):
            self._kept = None
        bounds = np.concatenate(([0], np.cumsum(batch.counts))).tolist()
        first, total, each = 0, len(batch), 0
        while first < total:  # in pieces, so that the file rotates between iterations
            last = min(total, first + (max(1, (self._max_bytes - self._encoded) // each) if each else PIECE))
            size = self._encode(last - first, lambda: self._iterations(batch, bounds, first, last))
            each = max(1, size // (last - first))
            first = last

    def _iterations(self, batch: IterationBatch, bounds: list[int], first: int, last: int) -> list[bytes]:
        enc = self._encoder
        track, out = enc.thread_track(batch.thread_id, batch.thread_name)
        out.append(enc.batch(track, batch.phases, bounds[first], bounds[last], batch, (first, last)))
        if self._thread_time:
            counter, descriptors = enc.counter_track(batch.thread_name + trace.CPU_COUNTER_SUFFIX, "%")
            out += descriptors
            walls = batch.walls().tolist()
            for i in range(first, last):
                cpu = batch.cpu_ns[i]
                if cpu is not None and walls[i] > 0:
                    out.append(enc.counter(counter, int(batch.ends[i]), 100.0 * cpu / walls[i]))
        return out

    def on_phases(self, batch: PhaseBatch) -> None:
        if self._kept is not None:
            self._kept.add_phases(batch.thread_id, batch.thread_name, batch.phases)
        phases = batch.phases

        def encode() -> list[bytes]:
            track, out = self._encoder.thread_track(batch.thread_id, batch.thread_name)
            out.append(self._encoder.batch(track, phases, 0, len(phases)))
            return out

        self._encode(len(batch), encode)

    def on_device_interval(self, interval: DeviceIntervalRecord) -> None:
        if not self._cuda_events:
            return

        def encode() -> list[bytes]:
            track, out = self._encoder.gpu_stream_track(interval.device, interval.stream)
            out.append(self._encoder.slice(track, interval.spec.title, trace.DEVICE_CATEGORY, interval.start_ns, interval.end_ns))
            return out

        self._encode(1, encode)

    def on_scalars(self, batch: ScalarBatch) -> None:
        new = set(batch.names) - self._classified
        if new:
            if len(self._classified) < MAX_CLASSIFIED_KEYS:
                self._classified |= new
            self._counter_keys |= {k for k in new if k.startswith(COUNTER_PREFIXES)}
        columns = [index for index, key in enumerate(batch.names) if key in self._counter_keys]
        if columns:
            names = [batch.names[index] for index in columns]
            rows = zip(batch.times_ns.tolist(), batch.values[:, columns].tolist())
            self._encode(len(batch), lambda: self._counter_packets(names, rows))

    def _counter_packets(self, names: list[str], rows) -> list[bytes]:
        enc, out = self._encoder, []
        for time_ns, row in rows:
            for key, value in zip(names, row):
                full = key not in self._counters and len(self._counters) >= MAX_COUNTER_TRACKS and key != trace.CLOCK_OFFSET_KEY
                if value is None or full:
                    continue
                track, descriptors = enc.counter_track(key, schema.metric_spec(key).unit)
                self._counters[key] = track
                out += descriptors
                out.append(enc.counter(track, time_ns, float(value)))
        return out

    def on_event(self, event: EventRecord) -> None:
        if event.name == schema.EVENT_TORCH_PROFILE:
            # Merged at the end of the pass: a pass hands over its events before its phases, and the
            # window's last iteration may be among them.
            self._profile_event = dict(event.attributes)
        elif event.name == schema.EVENT_CLOCK_OFFSET:  # this process's clock against rank 0's, for the readers
            offset = event.attributes.get("offset_ms")
            if isinstance(offset, (int, float)) and not isinstance(offset, bool):
                self._encode(1, lambda: self._counter_packets([trace.CLOCK_OFFSET_KEY], [(event.time_ns, [float(offset)])]))
        # The agent saw this process die: its timeline ends with the mark a crashed worker's merged fragment gets.
        elif event.name == schema.EVENT_PROCESS_DIED:
            name = f"{trace.CRASH_MARK} ({event.attributes.get('reason')})"
            self._put([crash_mark(self._encoder.pid, event.time_ns, name)], 1, True)

    def _merge_profile(self, attributes: dict) -> None:
        """The operators of a ``torch.profiler`` window, on the thread tracks and kernel tracks they ran on."""
        kept, self._kept = self._kept, None  # one window per run
        try:
            profile = read_profile(Path(attributes["file"]), attributes["timebase_markers_ns"], self._encoder.pid, self._clock_offset_ns)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            _logger.warning("otel-rl: the torch.profiler window is not in the trace (%s: %s)", type(exc).__name__, exc)
            return
        enc = self._encoder
        intervals, names = (kept.intervals, kept.names) if kept is not None else ({}, {})
        chunks: list[bytes] = []
        ops = 0
        tracks = [(enc.thread_track(tid, names.get(tid, f"thread {tid}")), intervals.get(tid, ()), thread_ops)
                  for tid, thread_ops in profile.threads.items()]  # fmt: skip
        tracks += [(enc.gpu_stream_track(*stream, kernels=True), (), stream_ops) for stream, stream_ops in profile.streams.items()]
        for (track, descriptors), spans, track_ops in tracks:
            chunks += descriptors
            for ts, op in nested_order(fit(spans, track_ops)):
                if op is None:
                    chunks.append(enc.end(track, ts))
                    continue
                flow = None if op.flow is None else track_uuid("torch flow", enc.pid, op.flow)
                chunks.append(enc.begin(track, op.name, op.category, ts, flow, op.terminating))
                ops += 1
        self._put(chunks, ops, True)

    def on_drain(self, now_ns: int) -> None:
        if self._profile_event is not None:
            attributes, self._profile_event = self._profile_event, None
            self._merge_profile(attributes)
        if self._writer.queue:
            self._writer.wake()

    # -- lifecycle --------------------------------------------------------

    def flush(self, deadline: Deadline) -> bool:
        return self._writer.flush(deadline)

    @property
    def size(self) -> int:
        """Bytes written to the trace file so far."""
        return self._writer.size

    @property
    def lost(self) -> int:
        """Records that are not in the trace: its queue was full before a stalled disk, or the disk refused them."""
        return self.dropped + self._writer.lost

    @property
    def error(self) -> str | None:
        """Why the disk last refused a write (None once one succeeds)."""
        return self._writer.error

    def shutdown(self, deadline: Deadline) -> None:
        self._writer.shutdown(deadline)
        if self.dropped or self._writer.lost:
            _logger.warning("otel-rl: %d records are missing from %s (%s)", self.dropped + self._writer.lost, self.path,
                            f"the disk: {self._writer.error or 'it failed'}" if self._writer.lost else "its queue was full")  # fmt: skip
        try:
            if self._writing != self.path and self._writing.exists():
                os.replace(self._writing, self.path)
            if self._fragments is not None:
                merge_fragments(self.path, self._fragments)
        except OSError as exc:
            _logger.warning("otel-rl: could not finish %s (%s)", self.path, exc)


class TraceWriter(BackgroundLoop):
    """Writes encoded packets (and rotates files at the marks, once packets follow) on its own thread: file IO only.

    The queue holds ``(packets, records)`` pairs and rotation marks. A write
    that fails (a full disk) is cut back to the last whole packet and queued
    again first: the trace stays readable up to the failure, and what the disk
    refused is written, in order, once it takes it again (as ``metrics.jsonl``
    waits for it). Only what a disk that stays full holds back past
    :data:`MAX_BEHIND_BYTES`, or what is left at the shutdown deadline, is
    dropped and counted (``perfetto``).
    """

    queue_only = True

    def __init__(self, path: Path, writing: Path, drops: Drops | None = None) -> None:
        super().__init__("otel-rl-perfetto", 0.5)
        self.path = path
        self._writing = writing
        self._drops = drops
        self.queue: deque = deque()  # (encoded packets, records) and rotation marks
        self._file = None
        self._made = False  # the current file was created: reopened after a failure, it is continued, not emptied
        self._rotation_due = False
        self.size = 0
        """Bytes of whole packets in the file being written."""
        self.written = 0
        """Writes that reached a file so far (every file): the progress a full queue waits on."""
        self.lost = 0
        """Records whose packets the disk refused."""
        self._closing_since: float | None = None
        self.queued_bytes = 0
        """Bytes of packets ever queued (counted by the sink's thread only)."""
        self.written_bytes = 0
        """Bytes of packets ever written (this writer's thread only): what a failing disk holds back is the difference."""
        self.error: str | None = None
        """Why the last write failed (None once one succeeds): a full disk is not waited for."""
        self.start()

    def has_work(self) -> bool:
        """Packets to write; a closing writer whose disk still fails after :data:`GIVE_UP_S` has none left to try."""
        if not self.queue:
            return False
        since = self._closing_since
        return self.error is None or since is None or time.monotonic() - since < GIVE_UP_S

    def close(self, deadline: Deadline) -> None:
        """Write what is queued until :data:`FINISH_S` before ``deadline``: what is left is then counted within it."""
        if self._closing_since is None:
            self._closing_since = time.monotonic()
        super().close(Deadline(deadline.left() - FINISH_S))

    def run_once(self) -> None:
        queue = self.queue
        chunks: list[bytes] = []
        records = 0
        for _ in range(len(queue)):
            item = queue.popleft()
            if item is _ROTATE:
                if not self._write(b"".join(chunks), records):
                    queue.appendleft(_ROTATE)  # the file is not whole yet: rotated once it is
                    queue.appendleft((b"".join(chunks), records, _RETRY))
                    return self._pause()
                chunks, records = [], 0
                self._rotation_due = True
            else:
                if self._rotation_due and len(item) == 2:  # rotated once packets follow the mark: a run's last file is never the .1
                    self._rotate()
                    self._rotation_due = False
                chunks.append(item[0])
                records += item[1]
        if chunks and not self._write(b"".join(chunks), records):
            queue.appendleft((b"".join(chunks), records, _RETRY))  # kept, in order, until the disk takes it (as metrics.jsonl waits)
            self._pause()

    def _pause(self) -> None:
        """After a failed write: a closing writer tries again in a moment, not in a spin."""
        if self.stopping:
            time.sleep(0.05)

    def release(self) -> None:
        for item in self.queue:  # the writer stops with packets the disk never took
            if item is not _ROTATE:
                self._lose(item[1])

        self.queue.clear()
        self._close_file()

    def _write(self, data: bytes, records: int) -> bool:
        """Append ``data``; False when the disk refused it (the file is cut back to its last whole packet)."""
        done = 0
        try:
            if self._file is None:
                self._open()
            view = memoryview(data)
            while done < len(data):
                done += self._file.write(view[done:])  # type: ignore[union-attr]
        except OSError as exc:
            self.error = exc.strerror or str(exc)
            _logger.warning("otel-rl: cannot write %s (%s); trace records are lost until it can", self.path, exc, extra=once(f"write:{self.path}"))
            if done:  # a packet cut short would hide every packet after it from a reader: back to the last whole one
                with contextlib.suppress(OSError):
                    self._file.truncate(self.size)  # type: ignore[union-attr]
            self._close_file()
            return False
        self.size += len(data)
        self.written += 1
        self.written_bytes += len(data)
        self.error = None
        return True

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self._made:  # after a failure: on after the whole packets it holds
            self._file = open(self._writing, "r+b", buffering=0)  # noqa: SIM115 - kept open while streaming
            self._file.truncate(self.size)
            self._file.seek(self.size)
        else:
            self._file = open(self._writing, "wb", buffering=0)  # noqa: SIM115 - kept open while streaming
            self._made, self.size = True, 0

    def _lose(self, records: int) -> None:
        self.lost += records
        if self._drops is not None and records:
            self._drops.add("perfetto", "records", records)

    def _rotate(self) -> None:
        self._close_file()
        self._made = False
        try:
            os.replace(self._writing, files.rotated(self.path))
        except OSError as exc:
            _logger.warning("otel-rl: cannot rotate %s (%s)", self.path, exc)

    def _close_file(self) -> None:
        close_quietly(self._file)
        self._file = None
