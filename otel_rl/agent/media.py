"""The agent's side of ``tel.video()`` and ``tel.image()``: handoff files encoded into the run folder's ``media/``.

The training thread copied the frames into a handoff file and sent its path
(:mod:`otel_rl.training.media_out`); the pipeline hands each request to a
:class:`MediaWriter`, which writes one item at a time on a thread of its own:
frames are made 8-bit a few at a time (floats from 0 to 1 scaled, NaN and
infinities clipped, channels first or last, grey) and piped to the ffmpeg
that imageio-ffmpeg ships (an H.264 MP4, a PNG); a file given by its path is
copied as it is. Each is written under a hidden ``.part`` name and takes its
own name only once whole, so no file in ``media/`` is ever half-written; then
the outputs get a ``media`` record naming it and the handoff file is removed.

An item that cannot be written (a full disk, ffmpeg failing, the shutdown
deadline passing) is lost loudly: counted (queue ``media``), said once, and
named in a ``media_dropped`` record with the reason. An agent that takes over
from one that was killed finds the producer's handoff files and writes them
(the ``.part`` file the dead one left is removed).

ffmpeg is started without a fork (``subprocess`` execs it straight from a
``vfork``): no fork handler of a library (OpenBLAS's) runs, in an agent or
in a thread host's training process.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from time import perf_counter_ns
from typing import Any

from otel_rl.base import extras
from otel_rl.base.deadline import Deadline
from otel_rl.base.drops import Drops
from otel_rl.base.log import logger, once
from otel_rl.base.loops import BackgroundLoop
from otel_rl.base.processes import pid_running
from otel_rl.formats import schema
from otel_rl.run import media

_logger = logger(__name__)

CHUNK_BYTES = 8 * 1024 * 1024
"""Frames converted and piped at a time: what converting a video holds beyond its handoff file."""
PART = ".part"


class Lost(Exception):
    """An item that cannot be written: the reason, as its ``media_dropped`` record says it."""


def ffmpeg_exe() -> str | None:
    """The ffmpeg that imageio-ffmpeg ships (or the one ``IMAGEIO_FFMPEG_EXE`` names); None without the package."""
    if extras.MEDIA["video"].missing():
        return None
    try:
        import imageio_ffmpeg

        return imageio_ffmpeg.get_ffmpeg_exe()
    except Exception as exc:  # the package without a binary for this platform
        _logger.warning("otel-rl: imageio-ffmpeg has no ffmpeg here (%s); videos and images of frames are not written", exc)
        return None


class MediaWriter(BackgroundLoop):
    """Writes the videos and images handed over into ``folder`` (see the module docstring).

    Args:
        folder: the run folder's ``media/``.
        suffix: added to each file name (a rank's ``-learner1``), so that the ranks of one folder never write one file.
        record: called with ``(time_ns, name, attributes)`` of each ``media`` and ``media_dropped`` record (``perf_counter_ns``).
        drops: where what is lost is counted (queue ``media``).
        stem: the producer's handoff files are ``<stem>.media-<n>`` (here and in ``folder/.handoff``).
        takeover: an agent served the producer before: its handoff files left are written.
    """

    def __init__(self, folder: Path, suffix: str, record: Callable[[tuple], None], drops: Drops, stem: Path | None = None,
                 takeover: bool = False) -> None:  # fmt: skip
        super().__init__("otel-rl-media", 1.0)
        self.folder = folder
        self._suffix = suffix
        self._record = record
        self._drops = drops
        self._stem = stem
        self._items: deque[dict[str, Any]] = deque()
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._busy = False
        self.written = 0
        self.lost = 0
        self._exe = ffmpeg_exe()  # now: a thread host's training process imports nothing once init() returned
        self._started = False
        self._closed = False
        self._part_tag = f"{socket.gethostname()}-{os.getpid()}"
        if takeover and stem is not None:
            for path in self._left_by_the_last_agent():
                self.take({"handoff": str(path)})

    # -- taking requests (the pipeline's thread) ----------------------------

    def take(self, request: dict[str, Any]) -> None:
        """Queue a request of the producer's (a handoff file or a file's path): written in the order they came."""
        handoff = request.get("handoff")
        if self._closed:  # after the outputs' last wait for media: lost, named
            self._drop_request(request, "it came after the writer closed")
            return
        with self._lock:
            if handoff is not None:
                if handoff in self._seen:  # read again after a takeover: queued once
                    return
                self._seen.add(handoff)
            self._items.append(request)
            start = not self._started
            self._started = True
        if start:
            self._tidy_parts()
            self.start()
        self.wake()

    def has_work(self) -> bool:
        with self._lock:
            return bool(self._items) or self._busy

    queue_only = True

    def pending(self) -> int:
        with self._lock:
            return len(self._items) + self._busy

    # -- the writer's thread -----------------------------------------------

    def run_once(self) -> None:
        while True:
            with self._lock:
                if not self._items:
                    return
                request = self._items.popleft()
                self._busy = True
            try:
                self._one(request)
            finally:
                with self._lock:
                    self._busy = False

    def _one(self, request: dict[str, Any]) -> None:
        handoff = request.get("handoff")
        meta = request
        try:
            if handoff is not None:
                meta = _read_meta(Path(handoff))
            if self.stopping and self.time_left() == 0:
                raise Lost("the shutdown deadline passed before it was written")
            attributes = self._write(meta, Path(handoff) if handoff else None)
        except FileNotFoundError as exc:
            if handoff is not None and exc.filename == handoff:
                return  # written already (a request read again after a takeover)
            self._lose(meta, f"its file is gone ({exc.filename})")
        except Lost as exc:
            self._lose(meta, str(exc))
        except Exception as exc:  # a bad file, a full disk: this item only
            self._lose(meta, _reason(exc))
        else:
            self.written += 1
            self._record((meta.get("time_ns") or perf_counter_ns(), schema.EVENT_MEDIA, attributes))
        finally:
            if handoff is not None:
                with contextlib.suppress(OSError):
                    os.unlink(handoff)
                with self._lock:
                    self._seen.discard(handoff)

    def _write(self, meta: dict[str, Any], handoff: Path | None) -> dict[str, Any]:
        kind, key, step = meta.get("kind"), meta.get("key"), meta.get("step")
        attributes: dict[str, Any] = {"key": key, "type": kind}
        stem = media.file_stem(key, step, self._suffix)
        self.folder.mkdir(parents=True, exist_ok=True)
        if meta.get("source"):  # a file the loop has: copied as it is
            source = Path(meta["source"])
            fmt = source.suffix.lower().lstrip(".")
            part = self._part(stem, fmt)
            try:
                shutil.copyfile(source, part)
                target = self._place(part, stem, fmt)
            finally:
                part.unlink(missing_ok=True)
        else:
            if self._exe is None:
                raise Lost(extras.MEDIA[kind].message())
            fmt = "mp4" if kind == "video" else "png"
            part = self._part(stem, fmt)
            try:
                shape = self._encode(handoff, meta, part)
                target = self._place(part, stem, fmt)
            finally:
                part.unlink(missing_ok=True)
            if kind == "video":
                attributes.update(fps=meta["fps"], frames=shape[0], height=shape[1], width=shape[2])
            else:
                attributes.update(height=shape[0], width=shape[1])
        attributes.update(path=f"{media.MEDIA_DIR}/{target.name}", format=fmt, bytes=target.stat().st_size)
        if step is not None:
            attributes["step"] = step
        if meta.get("caption"):
            attributes["caption"] = meta["caption"]
        return attributes

    def _encode(self, handoff: Path, meta: dict[str, Any], part: Path) -> tuple[int, ...]:
        """The handoff file's frames through ffmpeg into ``part``; the frames' shape as written ``(T, H, W)`` or ``(H, W)``.

        The frames are read a few at a time (never mapped whole): what this holds beyond them is a chunk's worth.
        """
        kind = meta["kind"]
        shape = tuple(meta["shape"])
        media.check_shape(shape, kind)
        frames, height, width, channels = _layout(shape if kind == "video" else (1, *shape))
        with open(handoff, "rb") as file:
            _, offset = media.read_header(file.read(1 << 16))
            reader = _Chunks(file, offset, meta["dtype"], (frames, *_given(shape if kind == "video" else (1, *shape))[1:]))
            scale = _scale(reader)
            pix = {1: "gray", 3: "rgb24", 4: "rgba"}[channels]
            command = [self._exe, "-hide_banner", "-nostdin", "-loglevel", "error", "-y", "-f", "rawvideo", "-pix_fmt", pix,
                       "-s", f"{width}x{height}"]  # fmt: skip
            if kind == "video":
                command += ["-r", f"{meta['fps']:.6g}", "-i", "-", "-an", "-c:v", "libx264", "-pix_fmt", "yuv420p",
                            "-vf", "pad=ceil(iw/2)*2:ceil(ih/2)*2", "-movflags", "+faststart", "-f", "mp4", str(part)]  # fmt: skip
            else:
                command += ["-i", "-", "-frames:v", "1", "-c:v", "png", "-f", "image2", "-update", "1", str(part)]
            self._pipe(command, (_to_uint8(chunk, scale) for chunk in reader))
        return (frames, height, width) if kind == "video" else (height, width)

    def _pipe(self, command: list[str], chunks) -> None:
        """Run ffmpeg on ``chunks`` (its standard input); Lost with its reason when it fails or the deadline passes."""
        with tempfile.TemporaryFile() as errors:
            process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errors, close_fds=True)
            broken = False
            try:
                for chunk in chunks:
                    if self.stopping and self.time_left() == 0:
                        raise Lost("the shutdown deadline passed while it was written")
                    try:
                        process.stdin.write(memoryview(chunk).cast("B"))  # type: ignore[union-attr]
                    except BrokenPipeError:
                        broken = True
                        break
                with contextlib.suppress(BrokenPipeError):
                    process.stdin.close()  # type: ignore[union-attr]
                while process.poll() is None:
                    if self.stopping and self.time_left() == 0:
                        raise Lost("the shutdown deadline passed while it was written")
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        process.wait(0.1)
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
            if process.returncode != 0 or broken:
                errors.seek(0)
                said = errors.read().decode(errors="replace")
                if "No space left" in said or "Disk quota" in said:
                    raise Lost("the disk is full")
                lines = [line.strip() for line in said.splitlines() if line.strip()]
                raise Lost(f"ffmpeg exited with {process.returncode}" + (f": {lines[-1][:200]}" if lines else ""))

    def _part(self, stem: str, fmt: str) -> Path:
        return self.folder / f".{stem}.{fmt}.{self._part_tag}{PART}"

    def _place(self, part: Path, stem: str, fmt: str) -> Path:
        """``part``, whole, under a name no other file has (``stem.fmt``, ``stem-2.fmt``...): linked, never replacing one."""
        for n in range(1, 10_000):
            target = self.folder / (f"{stem}.{fmt}" if n == 1 else f"{stem}-{n}.{fmt}")
            try:
                os.link(part, target)
                return target
            except FileExistsError:
                continue
            except OSError:  # a filesystem without hard links
                if target.exists():
                    continue
                os.rename(part, target)
                return target
        raise Lost(f"{self.folder / stem}.{fmt} and 9,999 more are taken")

    def _lose(self, meta: dict[str, Any], reason: str) -> None:
        kind, key = meta.get("kind") or "video or image", meta.get("key")
        self.lost += 1
        self._drops.add("media", "media")
        _logger.warning("otel-rl: %s %r not written: %s", kind, key, reason, extra=once(f"media-lost:{reason[:24]}"))
        attributes = {"key": key, "type": kind, "reason": reason}
        if meta.get("step") is not None:
            attributes["step"] = meta["step"]
        try:
            self._record((perf_counter_ns(), media.EVENT_DROPPED, attributes))
        except Exception:  # never the thread
            pass

    def release(self) -> None:
        """What the deadline left unwritten is lost, each named."""
        with self._lock:
            left, self._items = list(self._items), deque()
        for request in left:
            self._drop_request(request, "the shutdown deadline passed before it was written")

    def _drop_request(self, request: dict[str, Any], reason: str) -> None:
        handoff = request.get("handoff")
        meta = request
        if handoff is not None:
            with contextlib.suppress(Exception):
                meta = _read_meta(Path(handoff))
            with contextlib.suppress(OSError):
                os.unlink(handoff)
        self._lose(meta, reason)

    def close_by(self, deadline: Deadline) -> None:
        """Write what waits, until ``deadline``: what is left then is lost, each named (before the outputs close)."""
        if self._started:
            self.shutdown(deadline)
        self._closed = True

    # -- what a killed agent left ------------------------------------------

    def _left_by_the_last_agent(self) -> list[Path]:
        assert self._stem is not None
        found: list[tuple[int, Path]] = []
        for folder in (self._stem.parent, self.folder / ".handoff"):
            with contextlib.suppress(OSError):
                for path in folder.glob(f"{self._stem.name}{media.HANDOFF_MARK}*"):
                    number = path.name.rsplit(media.HANDOFF_MARK, 1)[1]
                    if number.isdigit():
                        found.append((int(number), path))
        return [path for _, path in sorted(found)]

    def _tidy_parts(self) -> None:
        """The ``.part`` files of this machine's agents that died while writing: removed."""
        host = socket.gethostname()
        with contextlib.suppress(OSError):
            for path in self.folder.glob(f".*{PART}"):
                tag = path.name[: -len(PART)].rsplit(".", 1)[-1]
                made_on, _, pid = tag.rpartition("-")
                if made_on == host and pid.isdigit() and not pid_running(int(pid)):
                    path.unlink(missing_ok=True)


def _read_meta(path: Path) -> dict[str, Any]:
    with open(path, "rb") as file:
        meta, _ = media.read_header(file.read(1 << 16))
    return meta


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "the disk is full"
    return f"{type(exc).__name__}: {str(exc)[:200]}"


def _given(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A video's shape as given, with its channel axis (grey frames ``(T, H, W)`` get one)."""
    return (*shape, 1) if len(shape) == 3 else shape


def _layout(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """Frames, height, width and channels of a video's shape, channels first or last."""
    given = _given(shape)
    if given[-1] in (1, 3, 4):
        return given[0], given[1], given[2], given[3]
    return given[0], given[2], given[3], given[1]


class _Chunks:
    """A handoff file's frames, a few at a time, as ``(n, H, W, C)`` arrays (read, never mapped whole); iterable again."""

    def __init__(self, file: Any, offset: int, dtype: str, shape: tuple[int, ...]) -> None:
        import numpy as np

        self._np = np
        self._file, self._offset, self.dtype, self._shape = file, offset, np.dtype(dtype), shape
        self._frame_bytes = int(np.prod(shape[1:], dtype=np.int64)) * self.dtype.itemsize
        self._per_chunk = max(1, CHUNK_BYTES // max(1, self._frame_bytes // self.dtype.itemsize * max(self.dtype.itemsize, 4)))

    def __iter__(self):
        np = self._np
        frames = self._shape[0]
        for first in range(0, frames, self._per_chunk):
            count = min(self._per_chunk, frames - first)
            self._file.seek(self._offset + first * self._frame_bytes)
            raw = self._file.read(count * self._frame_bytes)
            if len(raw) != count * self._frame_bytes:
                raise Lost("its handoff file was cut short")
            chunk = np.frombuffer(raw, self.dtype).reshape((count, *self._shape[1:]))
            if chunk.shape[-1] not in (1, 3, 4):  # channels first
                chunk = np.moveaxis(chunk, 1, -1)
            yield chunk


def _scale(chunks: _Chunks) -> float:
    """255 for floats (or integers) from 0 to 1, else 1 (values already from 0 to 255): one pass over the frames."""
    import numpy as np

    if chunks.dtype == np.uint8:
        return 1.0
    for chunk in chunks:
        if chunk.dtype.kind == "f":
            chunk = np.nan_to_num(chunk, nan=0.0, posinf=1.0, neginf=0.0)
        if chunk.size and chunk.max() > 1:
            return 1.0
    return 255.0


def _to_uint8(chunk: Any, scale: float) -> Any:
    import numpy as np

    if chunk.dtype != np.uint8:
        values = np.nan_to_num(np.asarray(chunk, dtype=np.float32), nan=0.0, posinf=1.0, neginf=0.0)
        if scale != 1.0:
            values *= scale
        np.clip(values, 0, 255, out=values)
        chunk = values.astype(np.uint8)
    return np.ascontiguousarray(chunk)
