"""Videos and images a loop records (``tel.video``, ``tel.image``), kept in the run folder's ``media/``: what both sides share.

The training thread checks a call (:func:`check_call`, :func:`check_shape`)
and hands its frames over in a *handoff file* (:func:`handoff_header`: a
header naming the call, then the frames as they were given, raw), one copy
and no encoding; the agent (:mod:`otel_rl.agent.media`) reads the file,
encodes it into the run folder's ``media/`` and removes it. What waits is
bounded (:data:`MAX_PENDING` items, :data:`MAX_PENDING_BYTES` of frames):
past it an item is dropped at the call, counted and said once.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from otel_rl.base.files import safe_name
from otel_rl.base.values import clean_text, describe

MEDIA_DIR = "media"
MAX_PENDING = 16
MAX_PENDING_BYTES = 512 * 1024 * 1024
VIDEO_FORMATS = {"mp4": "video/mp4", "webm": "video/webm", "gif": "image/gif"}
IMAGE_FORMATS = {"png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg", "gif": "image/gif", "webp": "image/webp"}
CONTENT_TYPES = {**VIDEO_FORMATS, **IMAGE_FORMATS}
EVENT_DROPPED = "media_dropped"
"""A video or image recorded but not written (``key``, ``type``, ``step``, ``reason``): the agent says which, and why."""

HANDOFF_MAGIC = b"OTRLMED1"
HANDOFF_MARK = ".media-"
"""A handoff file is named ``<producer's segment stem>.media-<n>`` (``.tmp`` while it is being filled)."""
PAGE = 4096
DTYPES = frozenset({"uint8", "int8", "uint16", "int16", "uint32", "int32", "int64", "uint64", "float16", "float32", "float64", "bool"})
"""The frames' element types a handoff carries (what numpy and torch share)."""


def check_call(kind: str, key: Any, fps: Any, step: Any, caption: Any) -> tuple[str, float, int | None, str | None]:
    """A ``tel.video()`` or ``tel.image()`` call's key, fps, step and caption, checked.

    Raises:
        TypeError, ValueError: what is wrong with the call, to be said in one warning.
    """
    if not isinstance(key, str) or not 0 < len(key) <= 256:
        raise TypeError(f"the key must be a text of 1 to 256 characters, got {describe(key)[:100]}")
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not (kind == "image" or 0 < fps <= 1000):
        raise ValueError(f"fps must be a number above 0 and at most 1000, got {describe(fps)[:100]}")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2**63):
        raise ValueError(f"step must be an integer from 0 below 2**63, got {describe(step)[:100]}")
    text = None if caption is None else clean_text(str(caption))[:1000]
    return key, float(fps), step, text


def handoff_header(meta: dict[str, Any]) -> bytes:
    """The header of a handoff file describing ``meta`` (kind, key, fps, step, caption, time_ns, shape, dtype), padded so
    that the frames start on a page boundary (:func:`read_header` gives their offset)."""
    body = json.dumps(meta, separators=(",", ":")).encode()
    raw = HANDOFF_MAGIC + struct.pack("<I", len(body)) + body
    return raw + b"\0" * (-len(raw) % PAGE)


def read_header(raw: bytes) -> tuple[dict[str, Any], int]:
    """The meta of a handoff file from its first bytes (at least its header's), and where its frames start.

    Raises:
        ValueError: not a handoff file's header.
    """
    if raw[:8] != HANDOFF_MAGIC or len(raw) < 12:
        raise ValueError("not an otel-rl handoff file")
    (length,) = struct.unpack("<I", raw[8:12])
    if len(raw) < 12 + length:
        raise ValueError("a handoff file's header is cut short")
    meta = json.loads(raw[12 : 12 + length])
    offset = 12 + length
    return meta, offset + (-offset % PAGE)


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


def file_stem(key: str, step: int | None, suffix: str = "") -> str:
    """A file name for ``key`` at ``step``: the key's characters that are safe in a name (``Media/play`` -> ``Media_play``)."""
    return f"{safe_name(key, 'media')}_{step if step is not None else 'x'}{suffix}"


