"""Decoding and checking ``motrix.metrics/v1`` batches, fast, record by record.

The protocol has one definition, its JSON Schema (``motrix-metrics-v1.schema.json``).
:func:`compile_schema` turns the part of JSON Schema it uses (``$ref``,
``type``, ``const``, ``enum``, ``required``, ``properties``,
``additionalProperties``, ``propertyNames``, ``items``, ``allOf``,
``if``/``then``, ``minimum``, ``minLength``, ``maxLength``, ``pattern``) into
plain Python checks, a few microseconds per record where a general validator
takes over a hundred. Rules of the protocol that the schema states in words
are checked too: integers are in the signed 64-bit range, numbers are finite,
text is valid UTF-8 (no lone surrogates), and free-form objects (config,
meta, attributes) nest at most :data:`MAX_DEPTH` deep.

:func:`decode_batch` parses a body with orjson (which refuses NaN, Infinity,
numbers that overflow and lone surrogates); when that fails it falls back
to decoding record by record, so one bad record is refused alone and the
others are kept. Every refusal names the field as a JSON path
(``$.records[3].seq``).
"""

from __future__ import annotations

import json
import math
import re
import reprlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import orjson

from otel_rl.formats.protocol import PROTOCOL, json_schema

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_DEPTH = 64
"""Deepest nesting of a free-form object (config, meta, attributes)."""


class Invalid(ValueError):
    """A value that breaks the protocol; ``field`` is its JSON path."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def __reduce__(self):  # crosses process boundaries (decoding processes)
        return (Invalid, (self.field, self.message))

    def shown(self) -> str:
        """The field, cut to a length an answer can carry."""
        return self.field if len(self.field) <= 300 else self.field[:297] + "..."


Check = Callable[[Any], None]
"""``check(value)`` raises :class:`Invalid` naming the first problem (``field`` relative to ``value``: ``.seq``)."""

_PY_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
    "null": (type(None),),
    "integer": (int,),
    "number": (int, float),
}
# Both decoders refuse NaN, Infinity and overflowing numbers: floats here are always finite.


def _ok(value: Any) -> None:
    return None


def _resolve(node: Any, root: dict[str, Any]) -> Any:
    while isinstance(node, dict) and set(node) == {"$ref"}:
        ref = node["$ref"]
        if not ref.startswith("#/"):
            raise ValueError(f"only local references are supported, got {ref!r}")
        node = root
        for part in ref[2:].split("/"):
            node = node[part]
    return node


def _plain_types(node: Any, root: dict[str, Any]) -> frozenset[type] | None:
    """The Python types a schema allows, when it says nothing but ``type``."""
    node = _resolve(node, root)
    if not isinstance(node, dict) or set(node) != {"type"}:
        return None
    kinds = [node["type"]] if isinstance(node["type"], str) else node["type"]
    return frozenset(t for kind in kinds for t in _PY_TYPES[kind])


def compile_schema(node: dict[str, Any] | bool, root: dict[str, Any]) -> Check:
    """Checks for ``node`` of the schema ``root`` (local ``$ref`` resolved; the protocol's schema has no cycles)."""
    node = _resolve(node, root)
    if node is True or node == {}:
        return _ok
    if node is False:

        def never(value: Any) -> None:
            raise Invalid("", "is not allowed")

        return never
    checks: list[Check] = []
    if "$ref" in node:
        checks.append(compile_schema({"$ref": node["$ref"]}, root))
    if "type" in node:
        checks.append(_type_check(node["type"]))
    if "const" in node:
        checks.append(_const(node["const"]))
    if "enum" in node:
        checks.append(_enum(node["enum"]))
    if any(k in node for k in ("minLength", "maxLength", "pattern")):
        checks.append(_string(node.get("minLength"), node.get("maxLength"), node.get("pattern")))
    if "minimum" in node:
        checks.append(_minimum(node["minimum"]))
    if any(k in node for k in ("required", "properties", "additionalProperties", "propertyNames")):
        checks.append(_object(node, root))
    if "items" in node:
        checks.append(_items(compile_schema(node["items"], root)))
    for part in node.get("allOf", []):
        checks.append(compile_schema(part, root))
    if "if" in node:
        checks.append(_conditional(node["if"], compile_schema(node.get("then", True), root), root))
    if len(checks) == 1:
        return checks[0]
    checks_tuple = tuple(checks)

    def all_of(value: Any) -> None:
        for check in checks_tuple:
            check(value)

    return all_of


def _type_check(kind: str | list[str]) -> Check:
    kinds = [kind] if isinstance(kind, str) else kind
    allowed = frozenset(t for k in kinds for t in _PY_TYPES[k])
    label = " or ".join(kinds)

    def check(value: Any) -> None:
        kind_of = type(value)
        if kind_of not in allowed:
            raise Invalid("", f"{_describe(value)} is not of type {label}")
        if kind_of is int and not INT64_MIN <= value <= INT64_MAX:
            raise Invalid("", "integer out of the signed 64-bit range")

    return check


def _const(expected: Any) -> Check:
    def check(value: Any) -> None:
        if value != expected or type(value) is not type(expected):
            raise Invalid("", f"{expected!r} was expected")

    return check


def _enum(options: list[Any]) -> Check:
    allowed = frozenset(options)

    def check(value: Any) -> None:
        try:
            if value in allowed:
                return
        except TypeError:  # unhashable
            pass
        raise Invalid("", f"{_describe(value)} is not one of {sorted(map(str, options))}")

    return check


def _string(min_length: int | None, max_length: int | None, pattern: str | None) -> Check:
    regex = re.compile(pattern) if pattern else None

    def check(value: Any) -> None:
        if type(value) is not str:
            return
        if min_length is not None and len(value) < min_length:
            raise Invalid("", f"is shorter than {min_length} characters")
        if max_length is not None and len(value) > max_length:
            raise Invalid("", f"is longer than {max_length} characters")
        if regex is not None and not regex.search(value):
            raise Invalid("", f"does not match {pattern!r}")

    return check


def _minimum(minimum: float) -> Check:
    def check(value: Any) -> None:
        if type(value) in (int, float) and value < minimum:
            raise Invalid("", f"{value} is less than the minimum of {minimum}")

    return check


def _object(node: dict[str, Any], root: dict[str, Any]) -> Check:
    required = tuple(node.get("required", ()))
    properties = {name: compile_schema(sub, root) for name, sub in node.get("properties", {}).items()}
    named = tuple(properties.items())
    extra = node.get("additionalProperties", True)
    extra_check = None if extra is True else compile_schema(extra, root)
    # The common shape of "values": a flat map of numbers. Checked in bulk by C loops.
    extra_types = None if extra is True else _plain_types(extra, root)
    names = _resolve(node.get("propertyNames"), root)
    name_check = None if names is None else compile_schema(names, root)
    name_bounds = (
        (names.get("minLength", 0), names.get("maxLength", 2**62))
        if isinstance(names, dict) and set(names) <= {"minLength", "maxLength"}
        else None
    )

    def check(value: Any) -> None:
        if type(value) is not dict:
            return
        for name in required:
            if name not in value:
                raise Invalid("", f"{name!r} is a required property")
        if extra_types is not None and not properties and value:
            kinds = set(map(type, value.values()))
            in_range = int not in kinds or all(INT64_MIN <= v <= INT64_MAX for v in value.values() if type(v) is int)
            lengths_ok = name_bounds is not None and name_bounds[0] <= min(map(len, value)) and max(map(len, value)) <= name_bounds[1]
            if kinds <= extra_types and in_range and (lengths_ok or name_check is None):
                return
        if extra_check is None and name_check is None:
            # Other members are free: look up the named properties only.
            for name, sub in named:
                if name in value:
                    try:
                        sub(value[name])
                    except Invalid as exc:
                        raise Invalid(f".{name}{exc.field}", exc.message) from None
            return
        for name, item in value.items():
            try:
                if name_check is not None:
                    name_check(name)
                sub = properties.get(name)
                if sub is not None:
                    sub(item)
                elif extra_check is not None:
                    extra_check(item)
            except Invalid as exc:
                raise Invalid(f".{name}{exc.field}", exc.message) from None

    return check


def _items(item_check: Check) -> Check:
    def check(value: Any) -> None:
        if type(value) is list:
            for index, item in enumerate(value):
                try:
                    item_check(item)
                except Invalid as exc:
                    raise Invalid(f"[{index}]{exc.field}", exc.message) from None

    return check


def _conditional(condition_node: Any, then: Check, root: dict[str, Any]) -> Check:
    condition_node = _resolve(condition_node, root)
    # The protocol's conditions are all "kind is X": a dictionary lookup instead of a check that raises.
    kind = condition_node.get("properties", {}).get("kind", {}) if isinstance(condition_node, dict) else {}
    if isinstance(condition_node, dict) and set(condition_node) == {"properties"} and set(kind) == {"const"}:
        expected = kind["const"]

        def by_kind(value: Any) -> None:
            if type(value) is dict and value.get("kind") == expected:
                then(value)

        return by_kind
    condition = compile_schema(condition_node, root)

    def check(value: Any) -> None:
        try:
            condition(value)
        except Invalid:
            return
        then(value)

    return check


_SHORT = reprlib.Repr()  # keyword arguments only from Python 3.12
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlist, _SHORT.maxdict = 2, 40, 40, 4, 4


def _describe(value: Any) -> str:
    return _SHORT.repr(value)


def free_form(value: Any, path: str, depth: int = 0) -> None:
    """Protocol-wide rules inside free-form values: nesting depth, integer range, finite numbers."""
    kind = type(value)
    if kind is dict or kind is list:
        if depth >= MAX_DEPTH:
            raise Invalid(path, f"nests deeper than {MAX_DEPTH} levels")
        items = value.items() if kind is dict else enumerate(value)
        for key, item in items:
            if type(item) in (dict, list, int, float):
                free_form(item, f"{path}.{key}" if kind is dict else f"{path}[{key}]", depth + 1)
    elif kind is int and not INT64_MIN <= value <= INT64_MAX:
        raise Invalid(path, "integer out of the signed 64-bit range")
    elif kind is float and not math.isfinite(value):
        raise Invalid(path, "number is not finite")


_TYPED = frozenset(("values", "axes"))
"""Members whose contents the schema types fully; every other object or array is free-form."""


@cache
def record_check() -> Check:
    """The compiled checks of one record, from the shipped JSON Schema."""
    schema = json_schema()
    return compile_schema({"$ref": "#/$defs/record"}, schema)


def check_record(record: Any, path: str) -> None:
    """Raise :class:`Invalid`, with ``field`` a JSON path under ``path``, unless ``record`` is a valid record."""
    try:
        record_check()(record)
    except Invalid as exc:
        raise Invalid(path + exc.field, exc.message) from None
    for name, value in record.items():
        if (type(value) is dict or type(value) is list) and name not in _TYPED:
            free_form(value, f"{path}.{name}")


# -- bodies ----------------------------------------------------------------------------

LARGE_BODY_BYTES = 1024 * 1024
"""Bodies above this are decoded record by record, in chunks (see :func:`iter_large_batch`)."""


@dataclass(slots=True)
class Decoded:
    """Part of a batch split into valid records and refusals ``(index, field, message)``."""

    records: list[tuple[int, dict[str, Any]]]
    rejected: list[tuple[int, str, str]]


def decode_batch(body: bytes) -> Decoded:
    """Parse and check a whole (small) batch body.

    orjson parses it in one call; when it refuses the body (a NaN, a lone
    surrogate, an overflowing number somewhere), the records are decoded one
    by one so that only the bad ones are refused.

    Raises:
        Invalid: the body is not a batch at all (not JSON, wrong protocol, no
            ``records`` array); refusals of single records are in the result.
    """
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        decoded = Decoded([], [])
        for chunk in iter_large_batch(body, chunk_records=2**62):
            decoded.records += chunk.records
            decoded.rejected += chunk.rejected
        return decoded
    _check_envelope(document)
    records: list[tuple[int, dict[str, Any]]] = []
    rejected: list[tuple[int, str, str]] = []
    nul_possible = b"\\u0000" in body  # JSON escapes a NUL character so: one scan of the body
    for index, record in enumerate(document["records"]):
        try:
            if nul_possible and _has_text(record, _NUL):
                raise Invalid(f"$.records[{index}]", NUL_MESSAGE)
            check_record(record, f"$.records[{index}]")
        except Invalid as exc:
            rejected.append((index, exc.shown(), exc.message))
            continue
        except RecursionError:
            rejected.append((index, f"$.records[{index}]", f"nests deeper than {MAX_DEPTH} levels"))
            continue
        records.append((index, record))
    return Decoded(records, rejected)


def _check_envelope(document: Any) -> None:
    if type(document) is not dict:
        raise Invalid("$", "a batch is a JSON object")
    if document.get("protocol") != PROTOCOL:
        raise Invalid("$.protocol", f"{PROTOCOL!r} was expected")
    if type(document.get("records")) is not list:
        raise Invalid("$.records", "an array of records is required")


class _Refused(ValueError):
    pass


def _refuse(text: str) -> Any:
    raise _Refused(f"{text} is not a JSON number")


def _strict_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"{text} overflows a double")
    return value


_STRICT = json.JSONDecoder(parse_constant=_refuse, parse_float=_strict_float)
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_NUL = re.compile("\x00")
NUL_MESSAGE = "text holds a NUL character (U+0000), which no store keeps in text"
_WS = re.compile(r"[ \t\n\r]*")


def iter_large_batch(body: bytes, chunk_records: int = 2000) -> Iterator[Decoded]:
    """Decode and check a batch record by record, ``chunk_records`` at a time.

    Each record is decoded on its own (a few microseconds of C code), so a
    thread running this gives the GIL up between records: other requests are
    served while a backfill of 100,000 records is being read. A record that
    cannot be decoded is refused alone, and the next one is read.

    Raises:
        Invalid: the body is not a batch (checked before the first chunk).
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Invalid("$", f"body is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    envelope, records_at = _envelope(text)
    _check_envelope({**envelope, "records": []} if records_at is not None else envelope)
    pos = records_at + 1  # past "["
    index = 0
    chunk = Decoded([], [])
    while True:
        pos = _WS.match(text, pos).end()
        if text.startswith("]", pos):
            break
        path = f"$.records[{index}]"
        try:
            record, end = _STRICT.raw_decode(text, pos)
        except (ValueError, RecursionError) as exc:
            end = _value_end(text, pos)
            chunk.rejected.append((index, path, f"not valid JSON: {str(exc)[:200] or type(exc).__name__}"))
        else:
            try:
                if text.find("\\u", pos, end) >= 0 and _has_text(record, _SURROGATE):
                    raise Invalid(path, "text holds a lone surrogate (not valid UTF-8)")
                if text.find("\\u0000", pos, end) >= 0 and _has_text(record, _NUL):
                    raise Invalid(path, NUL_MESSAGE)
                check_record(record, path)
                chunk.records.append((index, record))
            except Invalid as exc:
                chunk.rejected.append((index, exc.shown(), exc.message))
            except RecursionError:
                chunk.rejected.append((index, path, f"nests deeper than {MAX_DEPTH} levels"))
        index += 1
        pos = _WS.match(text, end).end()
        if text.startswith(",", pos):
            pos += 1
        elif not text.startswith("]", pos):
            raise Invalid("$.records", "is not a valid JSON array")
        if len(chunk.records) + len(chunk.rejected) >= chunk_records:
            yield chunk
            chunk = Decoded([], [])
    yield chunk


def _has_text(value: Any, pattern: re.Pattern) -> bool:
    """Whether a string anywhere in ``value`` (keys too) matches ``pattern``."""
    if type(value) is str:
        return pattern.search(value) is not None
    if type(value) is dict:
        return any(_has_text(k, pattern) or _has_text(v, pattern) for k, v in value.items())
    if type(value) is list:
        return any(_has_text(v, pattern) for v in value)
    return False


def _envelope(text: str) -> tuple[dict[str, Any], int | None]:
    """The batch's members other than ``records``, and where the ``records`` array starts."""
    envelope: dict[str, Any] = {}
    records_at = None
    pos = _WS.match(text, 0).end()
    if not text.startswith("{", pos):
        raise Invalid("$", "a batch is a JSON object")
    pos += 1
    while True:
        pos = _WS.match(text, pos).end()
        if text.startswith("}", pos):
            break
        try:
            key, pos = _STRICT.raw_decode(text, pos)
        except ValueError:
            raise Invalid("$", "body is not valid JSON") from None
        pos = _WS.match(text, pos).end()
        if not text.startswith(":", pos):
            raise Invalid("$", "body is not valid JSON")
        pos = _WS.match(text, pos + 1).end()
        end = _value_end(text, pos)
        if key == "records" and text.startswith("[", pos):
            records_at = pos
        else:
            try:
                envelope[key] = _STRICT.decode(text[pos:end])
            except (ValueError, RecursionError):
                raise Invalid(f"$.{key}", "is not valid JSON") from None
        pos = _WS.match(text, end).end()
        if text.startswith(",", pos):
            pos += 1
        elif not text.startswith("}", pos):
            raise Invalid("$", "body is not valid JSON")
    if records_at is None:
        raise Invalid("$.records", "an array of records is required")
    return envelope, records_at


_TOKEN_END = re.compile(r"[\s,\]}]")
_STRUCTURE = re.compile(r'["\[\]{}]')


def _value_end(text: str, pos: int) -> int:
    """End of the JSON value starting at ``pos``, following strings and brackets only (it may be invalid inside)."""
    if pos >= len(text):
        raise Invalid("$", "body ends too early")
    if text[pos] == '"':
        return _string_end(text, pos)
    if text[pos] not in "[{":
        found = _TOKEN_END.search(text, pos)
        return len(text) if found is None else found.start()
    depth = 0
    found = _STRUCTURE.search(text, pos)
    while found is not None:
        char = found.group()
        if char == '"':
            found = _STRUCTURE.search(text, _string_end(text, found.start()))
            continue
        depth += 1 if char in "[{" else -1
        if depth == 0:
            return found.end()
        found = _STRUCTURE.search(text, found.end())
    raise Invalid("$", "body ends inside a value")


_STRING_END = re.compile(r'\\.|"', re.DOTALL)


def _string_end(text: str, pos: int) -> int:
    found = _STRING_END.search(text, pos + 1)
    while found is not None and found.group() != '"':
        found = _STRING_END.search(text, found.end())
    if found is None:
        raise Invalid("$", "body ends inside a string")
    return found.end()


def stored_text(record: dict[str, Any]) -> str:
    """The canonical JSON text a record is stored as."""
    return orjson.dumps(record).decode("utf-8")
