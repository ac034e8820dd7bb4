"""The shared-memory format's binary layout, defined once: records, headers, kinds, value tags, ring offsets.

Both ends read it from here. Python builds its ``numpy`` dtypes and ``struct``
formats from these definitions (:mod:`otel_rl.shm.segment`); the C extensions
compile against ``layout.h``, which :func:`c_header` writes from them when the
package is built (``setup.py``), and each extension reports what its compiler
made of it (``layout_of_build()``), which a test holds against the offsets
computed here. Integers are little-endian, fields are naturally aligned.

This module imports nothing but the standard library: ``setup.py`` runs it
before anything is built.
"""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple

# -- scalar types: C name -> (struct code, numpy code, size) ------------------

_TYPES = {
    "int64_t": ("q", "<i8", 8),
    "uint64_t": ("Q", "<u8", 8),
    "int32_t": ("i", "<i4", 4),
    "uint32_t": ("I", "<u4", 4),
    "int16_t": ("h", "<i2", 2),
    "uint8_t": ("B", "u1", 1),
    "char": ("s", "S", 1),
    "ScalarValue": ("d", "<f8", 8),
}
"""``ScalarValue`` is the 8-byte union of a float and an int64 (a packed scalar's value, see :data:`VALUE_TAG`)."""


class Field(NamedTuple):
    name: str
    ctype: str
    count: int = 1
    """Elements: an array (``char[24]``) when more than one."""
    doc: str = ""

    @property
    def size(self) -> int:
        return _TYPES[self.ctype][2] * self.count

    @property
    def align(self) -> int:
        return _TYPES[self.ctype][2]

    def numpy(self) -> str | tuple[str, tuple[int]]:
        """This field's ``numpy`` format."""
        code = _TYPES[self.ctype][1]
        if self.ctype == "char":
            return f"S{self.count}"
        return code if self.count == 1 else (code, (self.count,))


class Struct(NamedTuple):
    """A C struct shared by both ends; offsets follow the C rules for natural alignment."""

    name: str
    fields: tuple[Field, ...]
    doc: str

    def offsets(self) -> dict[str, int]:
        """Each field's byte offset, and ``itemsize`` (the size padded to the widest alignment)."""
        out, at = {}, 0
        for field in self.fields:
            at += -at % field.align
            out[field.name] = at
            at += field.size
        out["itemsize"] = at + -at % max(field.align for field in self.fields)
        return out

    def offset(self, name: str) -> int:
        return self.offsets()[name]

    @property
    def itemsize(self) -> int:
        return self.offsets()["itemsize"]

    def numpy(self) -> dict:
        """The ``numpy.dtype`` argument of this struct (names, formats, offsets, itemsize)."""
        offsets = self.offsets()
        return {
            "names": [field.name for field in self.fields],
            "formats": [field.numpy() for field in self.fields],
            "offsets": [offsets[field.name] for field in self.fields],
            "itemsize": offsets["itemsize"],
        }

    def struct(self) -> struct.Struct:
        """A ``struct.Struct`` of this struct's bytes: one value per field but the ``reserved`` ones, which are
        zero bytes (arrays of char are one ``bytes`` value)."""
        codes, at = ["<"], 0
        for field, offset in zip(self.fields, (self.offsets()[f.name] for f in self.fields)):
            codes.append(f"{offset - at}x" if offset > at else "")
            code = _TYPES[field.ctype][0]
            if field.name == "reserved":
                codes.append(f"{field.size}x")
            else:
                codes.append(f"{field.count}s" if field.ctype == "char" else code * field.count)
            at = offset + field.size
        codes.append(f"{self.itemsize - at}x" if self.itemsize > at else "")
        return struct.Struct("".join(codes))


# -- lanes --------------------------------------------------------------------

LANE_RECORD = Struct(
    "LaneRecord",
    (
        Field("start", "int64_t", doc="a phase's start; a mark's time"),
        Field("end", "int64_t", doc="a phase's end; an iteration mark's thread CPU time (-1: not measured)"),
        Field("a", "int64_t", doc="an iteration mark's index; a flow's id (its low 64 bits); a correlation"),
        Field("b", "int64_t", doc="an iteration mark's env steps (NO_STEPS: none)"),
        Field("name", "int32_t", doc="a phase's id (string table: timeline TAB name); an iteration mark's timeline id"),
        Field("depth", "int16_t", doc="a phase's depth; the phases open at a mark"),
        Field("kind", "uint8_t", doc="a RecordKind"),
        Field("flags", "uint8_t", doc="a flow mark: 1 when it ends the flow"),
        Field("exc", "int32_t", doc="the id of the exception type's name a phase ended with (-1: none)"),
        Field("reserved", "int32_t"),
    ),
    "One record of a lane: what its thread recorded, names as ids of the segment's string table.",
)

LANE_HEADER = Struct(
    "LaneHeader",
    (
        Field("write", "uint64_t", doc="records written (the lane's thread moves it)"),
        Field("read", "uint64_t", doc="records read (the agent moves it, once its outputs wrote them)"),
        Field("dropped", "uint64_t", doc="records refused by a full lane"),
        Field("capacity", "uint64_t"),
        Field("thread_id", "int64_t"),
        Field("thread_name", "char", 24, "UTF-8, NUL-padded"),
    ),
    "The header of a lane, followed by its ring of `capacity` LaneRecord.",
)


class RecordKind(enum.IntEnum):
    """What a :data:`LANE_RECORD` is."""

    PHASE = 1
    ITERATION_START = 2
    ITERATION_END = 3
    FLOW = 4
    CORRELATE = 5


NO_STEPS = -(2**63)
"""An axis (a step, an iteration, env steps) that is not given."""

# -- message rings --------------------------------------------------------------

RING_HEADER = Struct(
    "RingHeader",
    (
        Field("write", "uint64_t", doc="bytes written (the writer publishes it after the bytes it covers)"),
        Field("read", "uint64_t", doc="bytes read (the reader publishes it once it copied them)"),
        Field("dropped", "uint64_t", doc="frames refused by a full ring"),
        Field("capacity", "uint64_t"),
        Field("reserved", "uint64_t", 4),
    ),
    "The header of a message ring, followed by `capacity` bytes of frames.",
)

FRAME_HEADER = Struct(
    "FrameHeader",
    (Field("length", "uint32_t", doc="payload bytes"), Field("kind", "uint32_t", doc="a MessageKind, with PICKLED when pickled")),
    "The header of a frame in a message ring; the payload follows, padded to 8 bytes.",
)


class MessageKind(enum.IntEnum):
    """What a frame of a message ring holds."""

    SKIP = 0
    """Filler to the ring's end: the next frame starts at offset 0."""
    RUN = 1
    EVENT = 2
    SCALARS = 3
    """A ``scalars()`` call that is not plain (see :data:`SCALARS_HEADER`), marshalled."""
    DISTRIBUTION = 4
    DEVICE_INTERVAL = 5
    REMOTE_CYCLE = 6
    CUDA_FALLBACK = 7
    SCALARS_PACKED = 8
    """A ``scalars()`` call of string keys and numbers: :data:`SCALARS_HEADER` and its entries."""
    LOG = 9
    """A warning of the agent, for its producer to log (the log ring)."""
    MEDIA = 10
    """A video or image to write: the handoff file holding its frames, or the file it names (:mod:`otel_rl.training.media_out`)."""
    NOTICE = 11
    """An otel-rl warning of the training process while a panel draws, for the panel to print above itself (:mod:`otel_rl.training.panel_warnings`)."""


PICKLED = 0x100
"""Set in a frame's kind when its payload is a pickle; otherwise it is ``marshal`` (plain values only, faster)."""

SCALARS_HEADER = Struct(
    "ScalarsHeader",
    (
        Field("time", "int64_t"),
        Field("step", "int64_t", doc="NO_STEPS: none, as for the other axes"),
        Field("iteration", "int64_t"),
        Field("env_steps", "int64_t"),
        Field("count", "uint32_t", doc="entries that follow"),
        Field("reserved", "uint32_t"),
    ),
    "A packed scalars() call (MESSAGE_KIND_SCALARS_PACKED): this header, then `count` ScalarEntry.",
)

SCALAR_ENTRY = Struct(
    "ScalarEntry",
    (
        Field("key", "uint32_t", doc="the key's id in the string table"),
        Field("tag", "uint8_t", doc="a ValueTag: how to read `value`"),
        Field("reserved", "uint8_t", 3),
        Field("value", "ScalarValue"),
    ),
    "One value of a packed scalars() call.",
)


class ValueTag(enum.IntEnum):
    """How a :data:`SCALAR_ENTRY`'s 8 bytes are read."""

    FLOAT = 0
    INT = 1
    NONE = 2
    BOOL = 3


STRUCTS = (LANE_RECORD, LANE_HEADER, RING_HEADER, FRAME_HEADER, SCALARS_HEADER, SCALAR_ENTRY)
ENUMS = (RecordKind, MessageKind, ValueTag)

# -- the C header ------------------------------------------------------------------


def _c_field(field: Field) -> str:
    array = f"[{field.count}]" if field.count > 1 else ""
    comment = f"  /* {field.doc} */" if field.doc else ""
    return f"    {field.ctype} {field.name}{array};{comment}"


def c_name(member: enum.IntEnum) -> str:
    """A kind's name in C: ``RecordKind.PHASE`` is ``RECORD_KIND_PHASE``."""
    prefix = "".join("_" + c if c.isupper() and i else c for i, c in enumerate(type(member).__name__)).upper()
    return f"{prefix}_{member.name}"


def _c_enum(kind: type[enum.IntEnum]) -> str:
    return f"enum {{ {', '.join(f'{c_name(member)} = {member.value}' for member in kind)} }};"


def c_header() -> str:
    """``layout.h``: every struct, kind and constant above, in C."""
    lines = [
        "/* Generated from otel_rl/shm/layout.py by setup.py: edit that file, not this one. */",
        "#ifndef OTEL_RL_SHM_LAYOUT_H",
        "#define OTEL_RL_SHM_LAYOUT_H",
        "#include <stddef.h>",
        "#include <stdint.h>",
        "",
        "typedef union { double f; int64_t i; } ScalarValue;",
        "#define NO_STEPS INT64_MIN",
        f"#define PICKLED {PICKLED:#x}",
        f"#define RING_HEADER_BYTES {RING_HEADER.itemsize}",
        "",
    ]
    lines += [_c_enum(kind) for kind in ENUMS]
    for declared in STRUCTS:
        lines += ["", f"/* {declared.doc} */", "typedef struct {", *map(_c_field, declared.fields), f"}} {declared.name};"]
    lines += ["", "#define LAYOUT_FIELD(type, name) #name, (Py_ssize_t)offsetof(type, name)", ""]
    lines += _c_layout_function()
    return "\n".join([*lines, "", "#endif", ""])


def _c_layout_function() -> list[str]:
    """``layout_of_build()``: what the compiler made of the structs and enums, as Python data (for a test)."""
    out = ["/* {struct: {field: offset, ..., \"itemsize\": size}, enum: {member: value}} as this build compiled them. */",
           "static PyObject *layout_of_build(void) {", "    return Py_BuildValue(", '        "{"']  # fmt: skip
    formats, arguments = [], []
    for declared in STRUCTS:
        formats.append("s:{" + ",".join(["s:n"] * (len(declared.fields) + 1)) + "}")
        arguments.append(f'"{declared.name}", ' + ", ".join(f"LAYOUT_FIELD({declared.name}, {f.name})" for f in declared.fields)
                         + f', "itemsize", (Py_ssize_t)sizeof({declared.name})')  # fmt: skip
    for kind in ENUMS:
        formats.append("s:{" + ",".join(["s:n"] * len(kind)) + "}")
        arguments.append(f'"{kind.__name__}", ' + ", ".join(f'"{member.name}", (Py_ssize_t){c_name(member)}' for member in kind))
    return [*out, f'        "{",".join(formats)}"', '        "}",', *[f"        {arg}," for arg in arguments[:-1]],
            f"        {arguments[-1]});", "}"]  # fmt: skip


if __name__ == "__main__":
    print(c_header(), end="")
