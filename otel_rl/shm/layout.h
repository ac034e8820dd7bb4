/* Generated from otel_rl/shm/layout.py by setup.py: edit that file, not this one. */
#ifndef OTEL_RL_SHM_LAYOUT_H
#define OTEL_RL_SHM_LAYOUT_H
#include <stddef.h>
#include <stdint.h>

typedef union { double f; int64_t i; } ScalarValue;
#define NO_STEPS INT64_MIN
#define PICKLED 0x100
#define RING_HEADER_BYTES 64

enum { RECORD_KIND_PHASE = 1, RECORD_KIND_ITERATION_START = 2, RECORD_KIND_ITERATION_END = 3, RECORD_KIND_FLOW = 4, RECORD_KIND_CORRELATE = 5 };
enum { MESSAGE_KIND_SKIP = 0, MESSAGE_KIND_RUN = 1, MESSAGE_KIND_EVENT = 2, MESSAGE_KIND_SCALARS = 3, MESSAGE_KIND_DISTRIBUTION = 4, MESSAGE_KIND_DEVICE_INTERVAL = 5, MESSAGE_KIND_REMOTE_CYCLE = 6, MESSAGE_KIND_CUDA_FALLBACK = 7, MESSAGE_KIND_SCALARS_PACKED = 8, MESSAGE_KIND_LOG = 9, MESSAGE_KIND_MEDIA = 10, MESSAGE_KIND_NOTICE = 11 };
enum { VALUE_TAG_FLOAT = 0, VALUE_TAG_INT = 1, VALUE_TAG_NONE = 2, VALUE_TAG_BOOL = 3 };

/* One record of a lane: what its thread recorded, names as ids of the segment's string table. */
typedef struct {
    int64_t start;  /* a phase's start; a mark's time */
    int64_t end;  /* a phase's end; an iteration mark's thread CPU time (-1: not measured) */
    int64_t a;  /* an iteration mark's index; a flow's id (its low 64 bits); a correlation */
    int64_t b;  /* an iteration mark's env steps (NO_STEPS: none) */
    int32_t name;  /* a phase's id (string table: timeline TAB name); an iteration mark's timeline id */
    int16_t depth;  /* a phase's depth; the phases open at a mark */
    uint8_t kind;  /* a RecordKind */
    uint8_t flags;  /* a flow mark: 1 when it ends the flow */
    int32_t exc;  /* the id of the exception type's name a phase ended with (-1: none) */
    int32_t reserved;
} LaneRecord;

/* The header of a lane, followed by its ring of `capacity` LaneRecord. */
typedef struct {
    uint64_t write;  /* records written (the lane's thread moves it) */
    uint64_t read;  /* records read (the agent moves it, once its outputs wrote them) */
    uint64_t dropped;  /* records refused by a full lane */
    uint64_t capacity;
    int64_t thread_id;
    char thread_name[24];  /* UTF-8, NUL-padded */
} LaneHeader;

/* The header of a message ring, followed by `capacity` bytes of frames. */
typedef struct {
    uint64_t write;  /* bytes written (the writer publishes it after the bytes it covers) */
    uint64_t read;  /* bytes read (the reader publishes it once it copied them) */
    uint64_t dropped;  /* frames refused by a full ring */
    uint64_t capacity;
    uint64_t reserved[4];
} RingHeader;

/* The header of a frame in a message ring; the payload follows, padded to 8 bytes. */
typedef struct {
    uint32_t length;  /* payload bytes */
    uint32_t kind;  /* a MessageKind, with PICKLED when pickled */
} FrameHeader;

/* A packed scalars() call (MESSAGE_KIND_SCALARS_PACKED): this header, then `count` ScalarEntry. */
typedef struct {
    int64_t time;
    int64_t step;  /* NO_STEPS: none, as for the other axes */
    int64_t iteration;
    int64_t env_steps;
    uint32_t count;  /* entries that follow */
    uint32_t reserved;
} ScalarsHeader;

/* One value of a packed scalars() call. */
typedef struct {
    uint32_t key;  /* the key's id in the string table */
    uint8_t tag;  /* a ValueTag: how to read `value` */
    uint8_t reserved[3];
    ScalarValue value;
} ScalarEntry;

#define LAYOUT_FIELD(type, name) #name, (Py_ssize_t)offsetof(type, name)

/* {struct: {field: offset, ..., "itemsize": size}, enum: {member: value}} as this build compiled them. */
static PyObject *layout_of_build(void) {
    return Py_BuildValue(
        "{"
        "s:{s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n},s:{s:n,s:n,s:n,s:n,s:n,s:n,s:n},s:{s:n,s:n,s:n,s:n,s:n,s:n},s:{s:n,s:n,s:n},s:{s:n,s:n,s:n,s:n,s:n,s:n,s:n},s:{s:n,s:n,s:n,s:n,s:n},s:{s:n,s:n,s:n,s:n,s:n},s:{s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n},s:{s:n,s:n,s:n,s:n}"
        "}",
        "LaneRecord", LAYOUT_FIELD(LaneRecord, start), LAYOUT_FIELD(LaneRecord, end), LAYOUT_FIELD(LaneRecord, a), LAYOUT_FIELD(LaneRecord, b), LAYOUT_FIELD(LaneRecord, name), LAYOUT_FIELD(LaneRecord, depth), LAYOUT_FIELD(LaneRecord, kind), LAYOUT_FIELD(LaneRecord, flags), LAYOUT_FIELD(LaneRecord, exc), LAYOUT_FIELD(LaneRecord, reserved), "itemsize", (Py_ssize_t)sizeof(LaneRecord),
        "LaneHeader", LAYOUT_FIELD(LaneHeader, write), LAYOUT_FIELD(LaneHeader, read), LAYOUT_FIELD(LaneHeader, dropped), LAYOUT_FIELD(LaneHeader, capacity), LAYOUT_FIELD(LaneHeader, thread_id), LAYOUT_FIELD(LaneHeader, thread_name), "itemsize", (Py_ssize_t)sizeof(LaneHeader),
        "RingHeader", LAYOUT_FIELD(RingHeader, write), LAYOUT_FIELD(RingHeader, read), LAYOUT_FIELD(RingHeader, dropped), LAYOUT_FIELD(RingHeader, capacity), LAYOUT_FIELD(RingHeader, reserved), "itemsize", (Py_ssize_t)sizeof(RingHeader),
        "FrameHeader", LAYOUT_FIELD(FrameHeader, length), LAYOUT_FIELD(FrameHeader, kind), "itemsize", (Py_ssize_t)sizeof(FrameHeader),
        "ScalarsHeader", LAYOUT_FIELD(ScalarsHeader, time), LAYOUT_FIELD(ScalarsHeader, step), LAYOUT_FIELD(ScalarsHeader, iteration), LAYOUT_FIELD(ScalarsHeader, env_steps), LAYOUT_FIELD(ScalarsHeader, count), LAYOUT_FIELD(ScalarsHeader, reserved), "itemsize", (Py_ssize_t)sizeof(ScalarsHeader),
        "ScalarEntry", LAYOUT_FIELD(ScalarEntry, key), LAYOUT_FIELD(ScalarEntry, tag), LAYOUT_FIELD(ScalarEntry, reserved), LAYOUT_FIELD(ScalarEntry, value), "itemsize", (Py_ssize_t)sizeof(ScalarEntry),
        "RecordKind", "PHASE", (Py_ssize_t)RECORD_KIND_PHASE, "ITERATION_START", (Py_ssize_t)RECORD_KIND_ITERATION_START, "ITERATION_END", (Py_ssize_t)RECORD_KIND_ITERATION_END, "FLOW", (Py_ssize_t)RECORD_KIND_FLOW, "CORRELATE", (Py_ssize_t)RECORD_KIND_CORRELATE,
        "MessageKind", "SKIP", (Py_ssize_t)MESSAGE_KIND_SKIP, "RUN", (Py_ssize_t)MESSAGE_KIND_RUN, "EVENT", (Py_ssize_t)MESSAGE_KIND_EVENT, "SCALARS", (Py_ssize_t)MESSAGE_KIND_SCALARS, "DISTRIBUTION", (Py_ssize_t)MESSAGE_KIND_DISTRIBUTION, "DEVICE_INTERVAL", (Py_ssize_t)MESSAGE_KIND_DEVICE_INTERVAL, "REMOTE_CYCLE", (Py_ssize_t)MESSAGE_KIND_REMOTE_CYCLE, "CUDA_FALLBACK", (Py_ssize_t)MESSAGE_KIND_CUDA_FALLBACK, "SCALARS_PACKED", (Py_ssize_t)MESSAGE_KIND_SCALARS_PACKED, "LOG", (Py_ssize_t)MESSAGE_KIND_LOG, "MEDIA", (Py_ssize_t)MESSAGE_KIND_MEDIA, "NOTICE", (Py_ssize_t)MESSAGE_KIND_NOTICE,
        "ValueTag", "FLOAT", (Py_ssize_t)VALUE_TAG_FLOAT, "INT", (Py_ssize_t)VALUE_TAG_INT, "NONE", (Py_ssize_t)VALUE_TAG_NONE, "BOOL", (Py_ssize_t)VALUE_TAG_BOOL);
}

#endif
