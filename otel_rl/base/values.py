"""Turning what RL code hands us into plain, JSON-safe values: one rule for every field.

Every record is made safe once, when it is made; encoders downstream can then
rely on it. The rules:

* numbers: ``int`` and finite ``float`` as they are; ``bool`` stays a bool in
  documents and is 0/1 as a scalar; numpy and torch scalars become Python
  numbers; integers outside the signed 64-bit range become floats as scalar
  values and their decimal string in documents (a seed of ``2**64 - 1`` keeps
  its digits); NaN and ±Inf become null, and the caller reports each such key
  once with a ``nonfinite`` event.
* arrays and tensors: as a scalar value, one element is that number and more
  elements are recorded as their mean, with one warning naming the key and
  shape; in documents (config, metadata, event attributes) they become lists
  of up to :data:`MAX_ITEMS` numbers, larger ones a ``"ndarray(shape=..., dtype=...)"``
  summary string.
* ``pathlib`` paths to strings, enums to their value when it is a string or
  a number (else their name), dates and times to ISO 8601, ``timedelta`` to
  seconds, sets to sorted lists, dataclasses, namedtuples and
  ``argparse.Namespace`` to objects; anything else to a description that runs
  none of its own code (:func:`describe`: a built-in value's repr, else its
  type's name), so a ``__repr__`` that raises or sleeps costs nothing.
* strings longer than :data:`MAX_STRING` characters are cut; lone surrogates
  (which UTF-8 cannot carry) are replaced; collections longer than
  :data:`MAX_ITEMS` are cut; nesting deeper than :data:`MAX_DEPTH` becomes a
  string, a container holding itself becomes ``"<cycle>"``, and past
  :data:`MAX_VALUES` values in one document the rest become ``"<truncated>"``
  (one warning): the work of one call is bounded.
* keys of documents are strings: other keys are converted with ``str()``; a
  key that then collides with another gets its type appended.

:func:`snapshot` runs on the training thread: it copies the mapping and
converts numpy and torch values with at most one host transfer per call (all
tensors are stacked and copied together), so a dict of 40 CUDA scalars costs
one device synchronization, not forty. Plain ints and floats pass through
untouched.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import hashlib
import math
import operator
import os
import types
from collections.abc import Callable, Mapping
from typing import Any

from otel_rl.base.log import logger, once

_logger = logger(__name__)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_STRING = 8192
MAX_REPR = 256
MAX_ITEMS = 1000
MAX_DEPTH = 16
MAX_VALUES = 100_000
"""Values made JSON-safe in one document at most (a bound on the work of one call)."""
NAME_LIMIT = 256
"""Longest scalar key or event name the protocol carries (longer ones are shortened by :func:`shorten`)."""

OnNonfinite = Callable[[str, Any], None]
_PLAIN = (str, int, float, bool, type(None))


# -- scalars (training thread) ---------------------------------------------------


def snapshot(values: Mapping[Any, Any]) -> dict[Any, Any]:
    """Copy ``values``, turning numpy and torch values into numbers (arrays into their mean).

    Keys are not checked here (the pipeline does, off the training thread).

    Raises:
        TypeError: ``values`` is not a mapping.
    """
    if not isinstance(values, Mapping):
        raise TypeError(f"scalars() takes a mapping of key to number, got {type(values).__name__}")
    out = dict(values)
    tensors: list[Any] | None = None
    for key, value in out.items():
        kind = type(value)
        if kind is float or kind is int:
            continue
        module = kind.__module__
        if module.startswith("torch"):
            if tensors is None:
                tensors = []
            tensors.append(key)
        elif module.startswith("numpy"):
            out[key] = _numpy_number(key, value)
    if tensors:
        _tensors_to_host(out, tensors)
    return out


def _numpy_number(key: Any, value: Any) -> Any:
    size = getattr(value, "size", 1)
    if size == 1:
        return value.item() if hasattr(value, "item") else value
    if size == 0:
        _warn_shape(key, getattr(value, "shape", ()), "is empty; dropped")
        return None
    _warn_shape(key, value.shape, "has several elements; recorded as their mean")
    try:
        return float(value.mean())
    except (TypeError, ValueError):
        return None


def _warn_shape(key: Any, shape: Any, what: str) -> None:
    name = describe(key)
    _logger.warning(
        "otel-rl: scalars(): %s is an array of shape %s that %s",
        name,
        tuple(shape),
        what,
        extra=once(f"shape:{name}:{what}"),
    )


def _tensors_to_host(out: dict[Any, Any], keys: list[Any]) -> None:
    import torch  # only reached when the caller passed torch values

    reduced: list[Any] = []
    for key in keys:
        tensor = out[key]
        if not isinstance(tensor, torch.Tensor):  # a torch dtype or device, say: left for the pipeline to name
            continue
        if tensor.numel() == 0:
            _warn_shape(key, tensor.shape, "is empty; dropped")
            out[key] = None
            continue
        if tensor.numel() > 1:
            _warn_shape(key, tensor.shape, "has several elements; recorded as their mean")
            if tensor.is_complex():
                out[key] = None
                continue
            tensor = tensor.detach().double().mean()
        reduced.append((key, tensor))
    if not reduced:
        return
    # One stack, one copy: a single host transfer for every tensor of the call.
    # Tensors on different devices are moved per device.
    by_device: dict[Any, list[tuple[Any, Any]]] = {}
    for key, tensor in reduced:
        by_device.setdefault(tensor.device, []).append((key, tensor))
    for group in by_device.values():
        stacked = torch.stack([t.detach().reshape(()).to(torch.float64) for _, t in group])
        for (key, _), number in zip(group, stacked.cpu().tolist(), strict=True):
            out[key] = number


def scalar_number(key: str, value: Any) -> tuple[float | int | None, bool]:
    """``(number, ok)`` of one scalar value (pipeline thread).

    ``(number, True)`` for a finite number, ``(None, True)`` for NaN or ±Inf
    (exported as null, reported by a ``nonfinite`` event), ``(None, False)``
    for something that is not a number (dropped, with one warning naming the
    key and the type).
    """
    kind = type(value)
    if kind is int:
        return (value, True) if INT64_MIN <= value <= INT64_MAX else _big_int(value)
    if kind is float:
        return (value, True) if math.isfinite(value) else (None, True)
    if kind is bool:
        return int(value), True
    if isinstance(value, int):  # IntEnum, numpy ints that escaped snapshot
        return scalar_number(key, int(value))
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        _logger.warning(
            "otel-rl: scalars(): %r is %s, not a number; dropped", key, type(value).__name__, extra=once(f"nan:{key}")
        )
        return None, False
    return (number, True) if math.isfinite(number) else (None, True)


def _big_int(value: int) -> tuple[float | None, bool]:
    try:
        return float(value), True
    except OverflowError:  # beyond a float's range: as infinite as it gets
        return None, True


def as_step(value: Any, what: str) -> int | None:
    """A step, env-step count or iteration index as a plain ``int`` (training thread).

    numpy and torch integers and integral floats are accepted; anything else,
    or an integer outside the signed 64-bit range, gives None with one warning.
    """
    if type(value) is int and INT64_MIN <= value <= INT64_MAX:
        return value
    if value is None:
        return None
    try:
        number = operator.index(value)
    except TypeError:
        number = int(value) if isinstance(value, float) and value.is_integer() else None
    if number is not None and not isinstance(value, bool) and INT64_MIN <= number <= INT64_MAX:
        return number
    _logger.warning(
        "otel-rl: %s=%s (%s) is not an integer in the signed 64-bit range; ignored",
        what,
        describe(value),
        type(value).__name__,
        extra=once(f"step:{what}:{type(value).__name__}"),
    )
    return None


# -- names ----------------------------------------------------------------------------


def shorten(name: str, limit: int = NAME_LIMIT) -> str:
    """``name`` if it fits in ``limit`` characters, else its start and a hash of the whole (stays unique)."""
    if len(name) <= limit:
        return name
    digest = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=4).hexdigest()
    return name[: limit - 9] + "~" + digest


def clean_text(text: str, limit: int = MAX_STRING) -> str:
    """``text`` without lone surrogates and NUL characters (each replaced by U+FFFD), cut to ``limit`` characters."""
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    if "\x00" in text:  # no database keeps it in text (PostgreSQL refuses it)
        text = text.replace("\x00", "\ufffd")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


# -- documents (config, metadata, event attributes) -----------------------------------


def json_safe(value: Any, on_nonfinite: OnNonfinite | None = None, path: str = "") -> Any:
    """``value`` as plain JSON data by the module's rules; never raises.

    ``on_nonfinite(path, value)`` is called for each NaN or ±Inf replaced by
    null, with its path (``config.optim.max_grad_norm``).
    """
    walk = _Walk(on_nonfinite)
    try:
        return _safe(value, walk, path, 0)
    except Exception as exc:  # a hostile __iter__ or __eq__: keep what we can say about it
        return f"<{type(value).__name__}: {type(exc).__name__}>"


class _Walk:
    """One :func:`json_safe` call's state: the NaN reporter, the containers open on the path, the values left."""

    __slots__ = ("report", "open", "left")

    def __init__(self, report: OnNonfinite | None) -> None:
        self.report = report
        self.open: set[int] = set()
        self.left = MAX_VALUES


def _safe(value: Any, walk: _Walk, path: str, depth: int) -> Any:
    walk.left -= 1
    if walk.left < 0:
        if walk.left == -1:
            _logger.warning("otel-rl: %s holds more than %d values; the rest are left out", path.split(".")[0] or "a document",
                            MAX_VALUES, extra=once(f"values:{path.split('.')[0]}"))  # fmt: skip
        return "<truncated>"
    kind = type(value)
    if kind is str:
        return clean_text(value)
    if kind is bool or value is None:
        return value
    if kind is int:
        return value if INT64_MIN <= value <= INT64_MAX else str(value)
    if kind is float:
        if math.isfinite(value):
            return value
        if walk.report is not None:
            walk.report(path, value)
        return None
    if depth >= MAX_DEPTH:
        return describe(value)
    if isinstance(value, Mapping):
        return _safe_mapping(value, walk, path, depth)
    if isinstance(value, enum.Enum):
        inner = value.value
        return _safe(inner, walk, path, depth + 1) if isinstance(inner, (str, int, float)) else value.name
    if isinstance(value, str):
        return clean_text(str.__str__(value))
    if isinstance(value, (bool, int, float)):  # subclasses, numpy bool/int/float
        return _safe(_plain_number(value), walk, path, depth + 1)
    module = kind.__module__
    if module.startswith(("numpy", "torch")):
        return _safe_array(value, walk, path, depth)
    if isinstance(value, tuple) and hasattr(value, "_asdict"):  # namedtuple
        return _safe_mapping(value._asdict(), walk, path, depth)
    if isinstance(value, (list, tuple, range)):
        return _safe_items(value, walk, path, depth)
    if isinstance(value, (set, frozenset)):
        try:
            items = sorted(value)
        except TypeError:
            items = list(value)
        return _safe_items(items, walk, path, depth)
    if isinstance(value, os.PathLike):
        return clean_text(str(os.fspath(value)))
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, (bytes, bytearray)):
        return describe(bytes(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _safe_mapping({f.name: getattr(value, f.name, None) for f in dataclasses.fields(value)}, walk, path, depth)
    if kind.__name__ == "Namespace" and module == "argparse":
        return _safe_mapping(vars(value), walk, path, depth)
    return describe(value)


def _plain_number(value: Any) -> Any:
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    if isinstance(value, int) or hasattr(value, "__index__"):
        return operator.index(value)
    return float(value)


def _safe_mapping(value: Mapping, walk: _Walk, path: str, depth: int) -> dict[str, Any] | str:
    return _unless_cycle(_mapping_items, value, walk, path, depth)


def _unless_cycle(convert: Callable[[Any, _Walk, str, int], Any], value: Any, walk: _Walk, path: str, depth: int) -> Any:
    """``convert(value, ...)``, or ``"<cycle>"`` for a container already open on the path (one that holds itself)."""
    if id(value) in walk.open:
        return "<cycle>"
    walk.open.add(id(value))
    try:
        return convert(value, walk, path, depth)
    finally:
        walk.open.discard(id(value))


def _mapping_items(value: Mapping, walk: _Walk, path: str, depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for index, (key, item) in enumerate(value.items()):
        if index >= MAX_ITEMS:
            _logger.warning("otel-rl: %s has more than %d entries; the rest are left out", path or "a mapping", MAX_ITEMS,
                            extra=once(f"items:{path}"))
            break
        text = _key_text(key)
        if text in out:
            text = f"{text} ({type(key).__name__})"
            _logger.warning("otel-rl: key %s of %s collides with another once made a string; kept as %r",
                            describe(key), path or "a mapping", text, extra=once(f"collide:{path}:{text}"))
        out[text] = _safe(item, walk, f"{path}.{text}" if path else text, depth + 1)
    return out


def _key_text(key: Any) -> str:
    if type(key) is str:
        return clean_text(key, NAME_LIMIT * 4)
    if isinstance(key, enum.Enum):
        inner = key.value
        return clean_text(str(inner) if isinstance(inner, (str, int, float)) else key.name)
    if isinstance(key, str):
        return clean_text(str.__str__(key))
    if isinstance(key, os.PathLike):
        return clean_text(str(os.fspath(key)))
    return describe(key)


def _safe_items(value: Any, walk: _Walk, path: str, depth: int) -> list[Any] | str:
    return _unless_cycle(_list_items, value, walk, path, depth)


def _list_items(value: Any, walk: _Walk, path: str, depth: int) -> list[Any]:
    out = []
    for index, item in enumerate(value):
        if index >= MAX_ITEMS:
            _logger.warning("otel-rl: %s has more than %d items; the rest are left out", path or "a list", MAX_ITEMS,
                            extra=once(f"items:{path}"))
            break
        out.append(_safe(item, walk, f"{path}[{index}]", depth + 1))
    return out


def _safe_array(value: Any, walk: _Walk, path: str, depth: int) -> Any:
    size = getattr(value, "size", None)
    if callable(size):  # torch: size() is the shape
        size = value.numel() if hasattr(value, "numel") else None
    if size is None or not hasattr(value, "tolist"):
        return describe(value)
    if size > MAX_ITEMS:
        shape = tuple(getattr(value, "shape", ()))
        return f"{type(value).__name__}(shape={list(shape)}, dtype={getattr(value, 'dtype', '?')})"
    if hasattr(value, "detach"):
        value = value.detach().cpu()
    return _safe(value.tolist(), walk, path, depth + 1)


_BUILT_IN = frozenset({str, bytes, bytearray, float, bool, complex, type(None)})


class StandIn:
    """A value known only by its description (an odd key or value that crossed from the training process)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text

    __str__ = __repr__


def describe(value: Any) -> str:
    """A short text for ``value`` (in a warning, a stand-in, a document) that runs none of its own code.

    Built-in values show their repr (capped at :data:`MAX_REPR` characters);
    anything else its type's name: a ``__repr__`` that raises, sleeps or walks
    a huge structure never runs on the caller's thread.
    """
    kind = type(value)
    if kind in _BUILT_IN:
        return clean_text(repr(value), MAX_REPR)
    if isinstance(value, StandIn):
        return value.text
    if kind is int:
        return repr(value) if value.bit_length() <= 256 else f"<int of {value.bit_length()} bits>"
    if kind is tuple and len(value) <= 8:
        return clean_text("(" + ", ".join(map(describe, value)) + ("," if len(value) == 1 else "") + ")", MAX_REPR)
    if isinstance(value, enum.Enum):
        return clean_text(f"{kind.__name__}.{value._name_}", MAX_REPR)
    if isinstance(value, type) or kind in _NAMED_BY_PATH:  # a class or function in a configuration: where it lives
        return clean_text(f"{getattr(value, '__module__', None) or '?'}.{getattr(value, '__qualname__', '?')}", MAX_REPR)
    if kind.__module__ == "torch" and kind.__name__ in ("device", "dtype"):
        return str(value)
    return f"<{kind.__qualname__} object>"


_NAMED_BY_PATH = frozenset({types.FunctionType, types.BuiltinFunctionType, types.MethodType})
