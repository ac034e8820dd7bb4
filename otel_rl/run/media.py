"""Videos and images a loop records (``tel.video``, ``tel.image``), kept in the run folder's ``media/``.

The training thread hands over frames (one copy, so that the loop may reuse
its buffer) or a file's path, and goes on: no encoding, no IO. One thread of
this module's own writes each item (a video through imageio-ffmpeg, which
ships its own ffmpeg, to H.264 MP4; an image through imageio to PNG; a file
given by path is copied as it is), then hands the outputs a ``media`` event
naming the file. What waits is bounded (:data:`MAX_PENDING` items,
:data:`MAX_PENDING_BYTES` of frames): past it an item is dropped at the
call, counted and said once.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_rl.base import extras
from otel_rl.base.files import safe_name
from otel_rl.base.log import logger, once
from otel_rl.base.values import clean_text, describe

MEDIA_DIR = "media"
MAX_PENDING = 16
MAX_PENDING_BYTES = 512 * 1024 * 1024
VIDEO_FORMATS = {"mp4": "video/mp4", "webm": "video/webm", "gif": "image/gif"}
IMAGE_FORMATS = {"png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg", "gif": "image/gif", "webp": "image/webp"}
CONTENT_TYPES = {**VIDEO_FORMATS, **IMAGE_FORMATS}

_logger = logger(__name__)


@dataclass(slots=True)
class MediaItem:
    kind: str  # "video" or "image"
    key: str
    source: Any  # a numpy array of frames (or one image), or a Path
    fps: float
    step: int | None
    caption: str | None
    size: int  # bytes of frames held


def make_item(kind: str, key: Any, source: Any, fps: Any, step: Any, caption: Any, default_step: int | None) -> MediaItem:
    """A ``tel.video()`` or ``tel.image()`` call as an item to write (the training thread: checks, and one copy of frames).

    Raises:
        TypeError, ValueError, OSError: what is wrong with the call, to be said in one warning.
    """
    if not isinstance(key, str) or not 0 < len(key) <= 256:
        raise TypeError(f"the key must be a text of 1 to 256 characters, got {describe(key)[:100]}")
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not (kind == "image" or 0 < fps <= 1000):
        raise ValueError(f"fps must be a number above 0 and at most 1000, got {describe(fps)[:100]}")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2**63):
        raise ValueError(f"step must be an integer from 0 below 2**63, got {describe(step)[:100]}")
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        formats = VIDEO_FORMATS if kind == "video" else IMAGE_FORMATS
        if path.suffix.lower().lstrip(".") not in formats:
            raise ValueError(f"{str(path)[:200]!r} is not one of {', '.join('.' + f for f in formats)}")
        if not path.is_file():
            raise ValueError(f"{str(path)[:200]!r} is not a file")
        frames, size = path.resolve(), 0
    else:
        if extras.MEDIA[kind].missing():
            raise ValueError(extras.MEDIA[kind].message())
        frames = frames_of(source)
        check_shape(frames.shape, kind)
        size = int(frames.nbytes)
    text = None if caption is None else clean_text(str(caption))[:1000]
    return MediaItem(kind, key, frames, float(fps), step if step is not None else default_step, text, size)


def frames_of(value: Any) -> Any:
    """``value`` (frames or an image: a numpy array, a torch tensor, a list of arrays) as a numpy array of its own.

    Raises:
        TypeError: not an array or a list of arrays.
    """
    import numpy as np

    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor (on any device)
        value = value.detach().cpu().numpy()
    if isinstance(value, (list, tuple)):
        if not value:
            raise TypeError("an empty list holds no frame")
        value = np.stack([frames_of(frame) for frame in value])
    if not isinstance(value, np.ndarray):
        raise TypeError(f"expected frames (an array, a tensor or a list of them) or a file's path, got {type(value).__name__}")
    return np.array(value, copy=True)


def check_shape(shape: tuple[int, ...], kind: str) -> None:
    """Raise ValueError unless ``shape`` is a video's frames (``kind`` "video") or an image: see :func:`shaped`."""
    want = 4 if kind == "video" else 3
    dims = tuple(shape) + ((1,) if len(shape) == want - 1 else ())
    if len(dims) != want:
        expected = "(T, H, W, C) or (T, C, H, W)" if kind == "video" else "(H, W), (H, W, C) or (C, H, W)"
        article = "an" if kind == "image" else "a"
        raise ValueError(f"{article} {kind}'s shape must be {expected}, got {tuple(shape)}")
    if (dims[-1] not in (1, 3, 4) and dims[-3] not in (1, 3, 4)) or 0 in dims:
        raise ValueError(f"{'an' if kind == 'image' else 'a'} {kind} needs 1, 3 or 4 channels and at least one pixel, got shape {tuple(shape)}")


def shaped(array: Any, kind: str) -> Any:
    """Frames as ``(T, H, W, 3)`` (a video) or one image as ``(H, W, C)``, uint8.

    Channels may come last or first (``(T, C, H, W)``, as W&B and TensorBoard take them); one channel is grey.
    Floats are taken as 0 to 1.

    Raises:
        ValueError: a shape that is not frames (or an image).
    """
    import numpy as np

    check_shape(array.shape, kind)
    if array.ndim == (3 if kind == "video" else 2):  # no channel axis: grey
        array = array[..., None]
    if array.shape[-1] not in (1, 3, 4):  # channels first
        array = np.moveaxis(array, -3, -1)
    if array.dtype != np.uint8:
        values = np.nan_to_num(array.astype(np.float64), nan=0.0, posinf=1.0, neginf=0.0)
        scale = 255.0 if values.size and values.max() <= 1.0 else 1.0
        array = np.clip(values * scale, 0, 255).astype(np.uint8)
    if kind == "video":
        if array.shape[-1] == 1:
            array = np.repeat(array, 3, axis=-1)
        elif array.shape[-1] == 4:
            array = array[..., :3]
    return np.ascontiguousarray(array)


def file_stem(key: str, step: int | None, suffix: str = "") -> str:
    """A file name for ``key`` at ``step``: the key's characters that are safe in a name (``Media/play`` -> ``Media_play``)."""
    return f"{safe_name(key, 'media')}_{step if step is not None else 'x'}{suffix}"


class MediaWriter:
    """Writes videos and images into ``folder`` on a thread of its own and hands each one's description to ``record``.

    Args:
        folder: the run folder's ``media/`` (made when the first item is written).
        record: called with the ``media`` event's attributes once the file is whole (on this writer's thread).
        suffix: added to each file name (a rank's ``-r1``), so that the ranks of one folder never write one file.
    """

    def __init__(self, folder: Path, record: Callable[[dict[str, Any]], None], suffix: str = "") -> None:
        self.folder = folder
        self._record = record
        self._suffix = suffix
        self._items: deque[MediaItem] = deque()
        self._bytes = 0
        self._busy = False
        self._closed = False
        self.dropped = 0
        self.written = 0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="otel-rl-media", daemon=True)
        self._thread.start()

    def refuse(self, kind: str, key: str) -> None:
        """Drop a ``kind`` of ``key`` that found no room (:meth:`has_room`): counted, said once."""
        with self._cond:
            self._refuse(kind, key)

    def _refuse(self, kind: str, key: str) -> None:
        self.dropped += 1
        why = "after close()" if self._closed else f"{MAX_PENDING} items or {MAX_PENDING_BYTES >> 20} MiB of frames wait to be written"
        _logger.warning("otel-rl: %s %r dropped: %s", kind, key, why, extra=once(f"media-drop:{why[:5]}"))

    def has_room(self, size: int) -> bool:
        """Whether an item of ``size`` bytes of frames would be taken now (asked before the frames are copied)."""
        with self._cond:
            return not self._closed and len(self._items) < MAX_PENDING and self._bytes + size <= MAX_PENDING_BYTES

    def put(self, item: MediaItem) -> bool:
        """Queue ``item`` (the training thread: no IO); False when it is dropped (counted, said once)."""
        with self._cond:
            full = len(self._items) >= MAX_PENDING or self._bytes + item.size > MAX_PENDING_BYTES
            if self._closed or full:
                self._refuse(item.kind, item.key)
                return False
            self._items.append(item)
            self._bytes += item.size
            self._cond.notify_all()
        return True

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._items and not self._closed:
                    self._cond.wait()
                if not self._items:
                    return
                item = self._items[0]
                self._busy = True
            try:
                attributes = self._write(item)
            except Exception as exc:  # a bad shape, a full disk: this item only
                attributes = None
                _logger.warning("otel-rl: %s %r could not be written (%s: %s); dropped it", item.kind, item.key, type(exc).__name__,
                                str(exc)[:300], extra=once(f"media-write:{item.key}:{type(exc).__name__}"))  # fmt: skip
            with self._cond:
                self._items.popleft()
                self._bytes -= item.size
                self._busy = False
                if attributes is None:
                    self.dropped += 1
                else:
                    self.written += 1
                self._cond.notify_all()
            if attributes is not None:
                try:
                    self._record(attributes)
                except Exception as exc:  # never into training, never the thread
                    _logger.warning("otel-rl: the %s %r was written but not recorded (%s)", item.kind, item.key, exc, extra=once("media-record"))

    def _write(self, item: MediaItem) -> dict[str, Any]:
        self.folder.mkdir(parents=True, exist_ok=True)
        attributes: dict[str, Any] = {"key": item.key, "type": item.kind}
        if isinstance(item.source, Path):
            fmt = item.source.suffix.lower().lstrip(".")
            target = self._claim(file_stem(item.key, item.step, self._suffix), fmt)
            shutil.copyfile(item.source, target)
        elif item.kind == "video":
            frames = shaped(item.source, "video")
            fmt = "mp4"
            target = self._claim(file_stem(item.key, item.step, self._suffix), fmt)
            _encode_video(target, frames, item.fps)
            attributes.update(fps=item.fps, frames=int(frames.shape[0]), height=int(frames.shape[1]), width=int(frames.shape[2]))
        else:
            image = shaped(item.source, "image")
            fmt = "png"
            target = self._claim(file_stem(item.key, item.step, self._suffix), fmt)
            import imageio.v3 as iio

            iio.imwrite(target, image[..., 0] if image.shape[-1] == 1 else image, extension=".png")
            attributes.update(height=int(image.shape[0]), width=int(image.shape[1]))
        attributes.update(path=f"{MEDIA_DIR}/{target.name}", format=fmt, bytes=target.stat().st_size)
        if item.step is not None:
            attributes["step"] = item.step
        if item.caption:
            attributes["caption"] = item.caption
        return attributes

    def _claim(self, stem: str, fmt: str) -> Path:
        """A new file ``stem.fmt`` (``stem-2.fmt``... when taken), made at once so that no other writer takes it."""
        for n in range(1, 10_000):
            path = self.folder / (f"{stem}.{fmt}" if n == 1 else f"{stem}-{n}.{fmt}")
            try:
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                return path
            except FileExistsError:
                continue
        raise FileExistsError(f"{self.folder / stem}.{fmt} and 9,999 more are taken")

    def drain(self, deadline_s: float) -> bool:
        """Wait until what waits is written, or ``deadline_s`` (``time.monotonic()``); True when it all was."""
        with self._cond:
            while (self._items or self._busy) and time.monotonic() < deadline_s:
                self._cond.wait(max(deadline_s - time.monotonic(), 0.0))
            return not (self._items or self._busy)

    def close(self, deadline_s: float) -> int:
        """Write what waits until ``deadline_s`` (``time.monotonic()``); returns the items left unwritten (counted as dropped)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self.drain(deadline_s)
        with self._cond:
            left = len(self._items)
            if left:
                self.dropped += left
                self._items.clear()
                self._bytes = 0
        if left:
            _logger.warning("otel-rl: %d video(s) or image(s) were not written before the shutdown deadline", left)
        return left


def _encode_video(target: Path, frames: Any, fps: float) -> None:
    """``frames`` ``(T, H, W, 3)`` uint8 to an H.264 MP4 that browsers, W&B and players read (imageio-ffmpeg's own ffmpeg)."""
    import imageio_ffmpeg

    height, width = frames.shape[1:3]
    writer = imageio_ffmpeg.write_frames(
        str(target), (width, height), fps=fps, codec="libx264", macro_block_size=1, quality=None,
        output_params=["-movflags", "+faststart", "-vf", "pad=ceil(iw/2)*2:ceil(ih/2)*2"], ffmpeg_log_level="error",
    )  # fmt: skip
    writer.send(None)
    try:
        for frame in frames:
            writer.send(frame)
    finally:
        writer.close()
