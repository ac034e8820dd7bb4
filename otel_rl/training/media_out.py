"""The training thread's side of ``tel.video()`` and ``tel.image()``: the frames, copied once into a handoff file, and a request.

The call is checked and the frames measured (a list's frames one by one,
before anything is copied); an item past the bound of what waits
(:data:`~otel_rl.run.media.MAX_PENDING` items, :data:`~otel_rl.run.media.MAX_PENDING_BYTES`
of frames) is refused there, at no cost. Otherwise the frames are copied, as
they are (no conversion, no temporary), into a handoff file made with all its
room at once (``posix_fallocate``: a full filesystem is an error here, never
a ``SIGBUS`` later), named in a request to the segment, and the loop goes on.
The agent (:mod:`otel_rl.agent.media`) encodes the file and removes it; what
this side still holds is the handoff files not yet removed.

Handoff files live beside the producer's segment in shared memory
(``/dev/shm``); where that has no room, in the run folder's ``media/.handoff``.
This module starts no process and imports nothing once ``init()`` returned:
its one library, numpy, is imported with it.
"""

from __future__ import annotations

import errno
import mmap
import os
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

from otel_rl.run import media

HANDOFF_FOLDER = ".handoff"
"""In the run folder's ``media/``: the handoff files that found no room in shared memory."""


class Refused(Exception):
    """An item that finds no room: counted and said once (not a wrong call)."""


class MediaOut:
    """Hands this producer's videos and images to its agent (see the module docstring).

    Args:
        stem: where the handoff files go and how they are named: ``<stem>.media-<n>`` (a segment's path less ``.seg``).
        fallback: the folder for handoff files that found no room beside ``stem`` (in the run folder).
        send: puts a request into the segment; False when its ring was full (the item is then dropped, counted).
    """

    def __init__(self, stem: Path, fallback: Path | None, send) -> None:
        self._stem = stem
        self._fallback = fallback
        self._send = send
        self._lock = threading.Lock()
        self._count = 0
        self._held: dict[str, int] = {}  # handoff files not yet taken by the agent: path -> bytes
        self.refused = 0

    # -- the training thread ---------------------------------------------

    def hand(self, meta: dict[str, Any], source: Any) -> None:
        """Hand ``source`` (frames, an image, or a file's path) over with ``meta`` (kind, key, fps, step, caption, time_ns).

        Raises:
            TypeError, ValueError: what is wrong with the call (one warning, nothing else is lost).
            Refused: no room for it now (counted; the caller says it once).
        """
        if isinstance(source, (str, os.PathLike)):
            path = Path(source)
            formats = media.VIDEO_FORMATS if meta["kind"] == "video" else media.IMAGE_FORMATS
            if path.suffix.lower().lstrip(".") not in formats:
                raise ValueError(f"{str(path)[:200]!r} is not one of {', '.join('.' + f for f in formats)}")
            if not path.is_file():
                raise ValueError(f"{str(path)[:200]!r} is not a file")
            # A handoff file of its header only: the agent copies the file it names, and close() waits for it alike.
            meta, nbytes, parts = {**meta, "source": str(path.resolve())}, 0, []
        else:
            shape, dtype, parts = measure(source)
            media.check_shape(shape, meta["kind"])
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            meta = {**meta, "shape": list(shape), "dtype": dtype}
        with self._lock:
            self._forget_taken()
            if len(self._held) >= media.MAX_PENDING or sum(self._held.values()) + nbytes > media.MAX_PENDING_BYTES:
                self.refused += 1
                raise Refused(f"{media.MAX_PENDING} items or {media.MAX_PENDING_BYTES >> 20} MiB of frames wait to be written")
            self._count += 1
            number = self._count
        path = self._fill(number, meta, nbytes, parts)
        with self._lock:
            self._held[str(path)] = nbytes
        try:
            self._request({**meta, "handoff": str(path)})
        except Refused:
            with self._lock:
                self._held.pop(str(path), None)
            path.unlink(missing_ok=True)
            raise

    def _request(self, request: dict[str, Any]) -> None:
        if self._send(request):
            return
        with self._lock:
            self.refused += 1
        raise Refused("the segment's message ring is full")

    def _fill(self, number: int, meta: dict[str, Any], nbytes: int, parts: list[Any]) -> Path:
        """A handoff file holding ``parts`` after a header for ``meta``, made whole before it takes its final name."""
        header = media.handoff_header(meta)
        tried: list[str] = []
        for folder in (self._stem.parent, self._fallback):
            if folder is None:
                continue
            final = folder / f"{self._stem.name}{media.HANDOFF_MARK}{number}"
            partial = final.with_name(final.name + ".tmp")
            try:
                folder.mkdir(mode=0o700, parents=True, exist_ok=True)
                fd = os.open(partial, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            except OSError as exc:
                tried.append(f"{folder}: {exc.strerror or exc}")
                continue
            try:
                try:
                    os.posix_fallocate(fd, 0, len(header) + nbytes)
                except OSError as exc:
                    if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                        raise
                    tried.append(f"{folder}: no room for {nbytes >> 20} MiB")
                    continue
                _write(fd, header, meta, parts)
                os.rename(partial, final)
                partial = None
                return final
            finally:
                os.close(fd)
                if partial is not None:
                    partial.unlink(missing_ok=True)
        with self._lock:
            self.refused += 1
        raise Refused("no room to hand the frames over (" + "; ".join(tried) + ")")

    def _forget_taken(self) -> None:
        for path in [p for p in self._held if not os.path.exists(p)]:
            del self._held[path]

    # -- close -------------------------------------------------------------

    def held(self) -> int:
        """Handoff files the agent has not finished with yet."""
        with self._lock:
            self._forget_taken()
            return len(self._held)


def measure(value: Any) -> tuple[tuple[int, ...], str, list[Any]]:
    """The shape and element type of frames (an array, a tensor on any device, a list of them) and its parts to copy, none copied.

    Raises:
        TypeError: not frames, or a list whose frames differ in shape or type.
    """
    if isinstance(value, (list, tuple)):
        if not value:
            raise TypeError("an empty list holds no frame")
        first = _one(value[0])
        for n, frame in enumerate(value[1:], 1):
            shape, dtype = _one(frame)
            if (shape, dtype) != first:
                raise TypeError(f"frame {n} is {dtype} {shape}, frame 0 {first[1]} {first[0]}: the frames of a list must match")
        return (len(value), *first[0]), first[1], list(value)
    shape, dtype = _one(value)
    return shape, dtype, [value]


def _one(value: Any) -> tuple[tuple[int, ...], str]:
    if isinstance(value, np.ndarray):
        dtype = value.dtype.name
    elif hasattr(value, "detach") and hasattr(value, "shape") and hasattr(value, "dtype"):  # a torch tensor
        dtype = str(value.dtype).removeprefix("torch.")
    else:
        raise TypeError(f"expected frames (an array, a tensor or a list of them) or a file's path, got {type(value).__name__}")
    if dtype not in media.DTYPES:
        raise TypeError(f"frames of {dtype} are not taken (uint8, or floats from 0 to 1)")
    return tuple(int(n) for n in value.shape), dtype


def _write(fd: int, header: bytes, meta: dict[str, Any], parts: list[Any]) -> None:
    """The header, then ``parts`` (one array or tensor, or a list's frames), into the file ``fd``: the one copy.

    Arrays are written by the kernel straight from their memory (no page of the file is mapped into this
    process); tensors, on any device, are copied into a mapping of the file (no host copy first).
    """
    _write_all(fd, memoryview(header), 0)
    if not parts:  # a file given by its path: the header names it
        return
    if all(isinstance(part, np.ndarray) for part in parts):
        position = len(header)
        for part in parts:
            pieces = [part] if part.flags.c_contiguous else part  # a strided array: a frame at a time
            for piece in pieces:
                flat = np.ascontiguousarray(piece).reshape(-1).view(np.uint8)
                _write_all(fd, memoryview(flat), position)
                position += flat.nbytes
        return
    size = len(header) + int(np.prod(meta["shape"], dtype=np.int64)) * np.dtype(meta["dtype"]).itemsize
    with mmap.mmap(fd, size) as mapped:
        dest = np.frombuffer(mapped, dtype=meta["dtype"], offset=len(header)).reshape(meta["shape"])
        if len(parts) == 1 and dest.shape == tuple(parts[0].shape):
            _copy_one(dest, parts[0])
        else:
            for n, part in enumerate(parts):
                _copy_one(dest[n], part)
        del dest


def _write_all(fd: int, data: memoryview, position: int) -> None:
    while len(data):
        written = os.pwrite(fd, data, position)
        data, position = data[written:], position + written


def _copy_one(dest: np.ndarray, part: Any) -> None:
    if isinstance(part, np.ndarray):
        np.copyto(dest, part)
    else:  # a tensor, on any device: copied straight into the file
        torch = sys.modules["torch"]
        torch.from_numpy(dest).copy_(part.detach())
