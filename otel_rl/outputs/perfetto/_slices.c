/*
 * Perfetto slice packets in C: the trace writer's per-phase work.
 *
 * A trace holds two packets per phase (slice BEGIN and END), thousands per
 * second. Built in Python, each costs several varint encodings and byte
 * concatenations, about 10 us per phase on the writer thread, time that a
 * GIL-holding training loop loses. Here one call encodes a whole batch of
 * phases held as columns, their iterations, nesting and flows included,
 * straight into the output buffer.
 *
 * Wire layout of one entry (a Trace.packet, field 1):
 *   0x0a len  TracePacket{ 0x40 timestamp, 0x5a len TrackEvent{ body [flows] }, sequence_tail }
 * where ``body`` (type, track, name and category) is prepared once per track
 * and phase spec by the Python encoder, and ``sequence_tail`` carries the
 * sequence id and flags. otel_rl/outputs/perfetto/trace.py has the pure-Python
 * twin used when this module is not built; the tests check both against the
 * perfetto protos.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buffer;

static int buffer_reserve(Buffer *b, Py_ssize_t extra) {
    if (b->len + extra <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) cap *= 2;
    char *data = PyMem_Realloc(b->data, (size_t)cap);
    if (data == NULL) { PyErr_NoMemory(); return -1; }
    b->data = data;
    b->cap = cap;
    return 0;
}

static int varint_size(unsigned long long v) {
    int n = 1;
    while (v >= 0x80) { v >>= 7; n++; }
    return n;
}

static void put_varint(Buffer *b, unsigned long long v) {
    while (v >= 0x80) { b->data[b->len++] = (char)((v & 0x7f) | 0x80); v >>= 7; }
    b->data[b->len++] = (char)v;
}

static void put_bytes(Buffer *b, const char *data, Py_ssize_t n) {
    memcpy(b->data + b->len, data, (size_t)n);
    b->len += n;
}

typedef struct {
    const char *end_body, *tail;
    Py_ssize_t end_len, tail_len;
} Context;

/* One packet: timestamp, track event of ``body``, the sequence tail. */
static int put_packet(Buffer *b, const Context *ctx, unsigned long long ts, const char *body, Py_ssize_t body_len) {
    Py_ssize_t packet_len = 1 + varint_size(ts) + 1 + varint_size((unsigned long long)body_len) + body_len + ctx->tail_len;
    if (buffer_reserve(b, 1 + 10 + packet_len) < 0) return -1;
    b->data[b->len++] = 0x0a;
    put_varint(b, (unsigned long long)packet_len);
    b->data[b->len++] = 0x40;
    put_varint(b, ts);
    b->data[b->len++] = 0x5a;
    put_varint(b, (unsigned long long)body_len);
    put_bytes(b, body, body_len);
    put_bytes(b, ctx->tail, ctx->tail_len);
    return 0;
}

/* One debug annotation (field 4) of an integer value: ``name`` is its name field, as it precedes the value. */
static int put_annotation(Buffer *b, const char *name, Py_ssize_t name_len, long long value) {
    if (buffer_reserve(b, name_len + 32) < 0) return -1;
    Py_ssize_t inner = name_len + 1 + varint_size((unsigned long long)value);
    b->data[b->len++] = 0x22;  /* field 4, length-delimited */
    put_varint(b, (unsigned long long)inner);
    put_bytes(b, name, name_len);
    b->data[b->len++] = 0x20;  /* int_value, varint (two's complement when negative) */
    put_varint(b, (unsigned long long)value);
    return 0;
}

#define MAX_NESTING 64

/* encode_rows(out, starts, ends, indices, env_steps, counts, phase_starts, phase_ends, phase_bodies, phase_depths,
 *             phase_extras, outer_body, end_body, sequence_tail, iteration_name, env_steps_name) -> None
 * Phases held as columns (otel_rl.core.batches), each phase followed by the phases nested in it
 * (``phase_depths``: 0 at the top level; None: all at the top level) and its BEGIN body plus, in
 * ``phase_extras`` (None, or one entry per phase, None or bytes), the flow fields to append to it.
 * With iterations (``starts`` not None), each is an enclosing slice with its index (and env steps,
 * unless None) as annotations around its ``counts[i]`` phases; without, ``counts`` has one entry, the
 * phases outside any iteration. One call for all of them. */
static PyObject *encode_rows(PyObject *module, PyObject *args) {
    PyObject *out, *columns[10];
    Py_buffer outer_body, end_body, tail, iteration_name, env_name;
    if (!PyArg_ParseTuple(args, "O!OOOOOOOOOOy*y*y*y*y*", &PyByteArray_Type, &out, &columns[0], &columns[1], &columns[2],
                          &columns[3], &columns[4], &columns[5], &columns[6], &columns[7], &columns[8], &columns[9],
                          &outer_body, &end_body, &tail, &iteration_name, &env_name))
        return NULL;
    PyObject *seq[10] = {NULL};
    Buffer b = {NULL, 0, 0}, event = {NULL, 0, 0};
    PyObject *result = NULL;
    Context ctx = {end_body.buf, tail.buf, end_body.len, tail.len};
    int outer = columns[0] != Py_None;
    for (int k = 0; k < 10; k++) {
        if (columns[k] == Py_None && (k < 4 || k >= 8)) continue;  /* the iterations' columns, depths and extras may be absent */
        if ((seq[k] = PySequence_Fast(columns[k], "encode_rows takes lists")) == NULL) goto done;
    }
    Py_ssize_t groups = PySequence_Fast_GET_SIZE(seq[4]), phases = PySequence_Fast_GET_SIZE(seq[5]);
    if (PySequence_Fast_GET_SIZE(seq[6]) != phases || PySequence_Fast_GET_SIZE(seq[7]) != phases
        || (seq[8] && PySequence_Fast_GET_SIZE(seq[8]) != phases) || (seq[9] && PySequence_Fast_GET_SIZE(seq[9]) != phases)
        || (outer && (PySequence_Fast_GET_SIZE(seq[0]) != groups || PySequence_Fast_GET_SIZE(seq[1]) != groups
                      || PySequence_Fast_GET_SIZE(seq[2]) != groups || PySequence_Fast_GET_SIZE(seq[3]) != groups))) {
        PyErr_SetString(PyExc_ValueError, "encode_rows: columns of different lengths");
        goto done;
    }
    PyObject **counts = PySequence_Fast_ITEMS(seq[4]), **phase_starts = PySequence_Fast_ITEMS(seq[5]),
             **phase_ends = PySequence_Fast_ITEMS(seq[6]), **bodies = PySequence_Fast_ITEMS(seq[7]);
    PyObject **depths = seq[8] ? PySequence_Fast_ITEMS(seq[8]) : NULL, **extras = seq[9] ? PySequence_Fast_ITEMS(seq[9]) : NULL;
    unsigned long long open_ends[MAX_NESTING];
    Py_ssize_t p = 0;
    for (Py_ssize_t i = 0; i < groups; i++) {
        long long count = PyLong_AsLongLong(counts[i]);
        if (PyErr_Occurred()) goto done;
        if (count < 0 || p + count > phases) {
            PyErr_SetString(PyExc_ValueError, "encode_rows: counts past the phases");
            goto done;
        }
        unsigned long long end = 0;
        if (outer) {
            PyObject **starts = PySequence_Fast_ITEMS(seq[0]), **ends = PySequence_Fast_ITEMS(seq[1]);
            PyObject **indices = PySequence_Fast_ITEMS(seq[2]), **envs = PySequence_Fast_ITEMS(seq[3]);
            unsigned long long start = PyLong_AsUnsignedLongLongMask(starts[i]);
            end = PyLong_AsUnsignedLongLongMask(ends[i]);
            long long index = PyLong_AsLongLong(indices[i]);
            if (PyErr_Occurred()) goto done;
            event.len = 0;
            if (buffer_reserve(&event, outer_body.len) < 0) goto done;
            put_bytes(&event, outer_body.buf, outer_body.len);
            if (put_annotation(&event, iteration_name.buf, iteration_name.len, index) < 0) goto done;
            if (envs[i] != Py_None) {
                long long steps = PyLong_AsLongLong(envs[i]);
                if ((steps == -1 && PyErr_Occurred()) || put_annotation(&event, env_name.buf, env_name.len, steps) < 0) goto done;
            }
            if (put_packet(&b, &ctx, start, event.data, event.len) < 0) goto done;
        }
        int open = 0;
        for (Py_ssize_t k = 0; k < count; k++, p++) {
            unsigned long long phase_start = PyLong_AsUnsignedLongLongMask(phase_starts[p]);
            unsigned long long phase_end = PyLong_AsUnsignedLongLongMask(phase_ends[p]);
            long depth = depths ? PyLong_AsLong(depths[p]) : 0;
            if (PyErr_Occurred()) goto done;
            if (!PyBytes_Check(bodies[p]) || (extras && extras[p] != Py_None && !PyBytes_Check(extras[p]))) {
                PyErr_SetString(PyExc_TypeError, "slice bodies and their extras must be bytes");
                goto done;
            }
            if (depth < 0 || depth >= MAX_NESTING) depth = depth < 0 ? 0 : MAX_NESTING - 1;
            while (open > depth)  /* the phases this one is not nested in end before it begins */
                if (put_packet(&b, &ctx, open_ends[--open], ctx.end_body, ctx.end_len) < 0) goto done;
            const char *body = PyBytes_AS_STRING(bodies[p]);
            Py_ssize_t body_len = PyBytes_GET_SIZE(bodies[p]);
            if (extras && extras[p] != Py_None) {
                event.len = 0;
                if (buffer_reserve(&event, body_len + PyBytes_GET_SIZE(extras[p])) < 0) goto done;
                put_bytes(&event, body, body_len);
                put_bytes(&event, PyBytes_AS_STRING(extras[p]), PyBytes_GET_SIZE(extras[p]));
                body = event.data;
                body_len = event.len;
            }
            if (put_packet(&b, &ctx, phase_start, body, body_len) < 0) goto done;
            open_ends[open++] = phase_end;
        }
        while (open > 0)
            if (put_packet(&b, &ctx, open_ends[--open], ctx.end_body, ctx.end_len) < 0) goto done;
        if (outer && put_packet(&b, &ctx, end, ctx.end_body, ctx.end_len) < 0) goto done;
    }
    Py_ssize_t old = PyByteArray_GET_SIZE(out);
    if (PyByteArray_Resize(out, old + b.len) < 0) goto done;
    memcpy(PyByteArray_AS_STRING(out) + old, b.data, (size_t)b.len);
    result = Py_NewRef(Py_None);
done:
    for (int k = 0; k < 10; k++) Py_XDECREF(seq[k]);
    PyMem_Free(b.data);
    PyMem_Free(event.data);
    PyBuffer_Release(&outer_body);
    PyBuffer_Release(&end_body);
    PyBuffer_Release(&tail);
    PyBuffer_Release(&iteration_name);
    PyBuffer_Release(&env_name);
    return result;
}

static PyMethodDef module_methods[] = {
    {"encode_rows", encode_rows, METH_VARARGS,
     "encode_rows(out, starts, ends, indices, env_steps, counts, phase_starts, phase_ends, phase_bodies, phase_depths,\n"
     "            phase_extras, outer_body, end_body, sequence_tail, iteration_name, env_steps_name) -> None\n\n"
     "Appends the slice packets of phases held as columns (lists, one entry per iteration and per phase; env_steps None\n"
     "where absent; phase_depths and phase_extras None, or one entry per phase), each iteration's slice around its\n"
     "phases' slices, nested ones inside the phases they are nested in (no iterations: starts is None)."},
    {NULL}
};

static struct PyModuleDef slices_module = {
    PyModuleDef_HEAD_INIT, "otel_rl.outputs.perfetto._slices", "Perfetto slice packets of phase records, in C.", -1, module_methods,
};

PyMODINIT_FUNC PyInit__slices(void) { return PyModule_Create(&slices_module); }
