/*
 * Perfetto slice packets in C: the trace writer's per-phase work.
 *
 * A trace holds two packets per phase (slice BEGIN and END), thousands per
 * second. Built in Python, each costs several varint encodings and byte
 * concatenations, about 10 us per phase on the writer thread, time that a
 * GIL-holding training loop loses. Here one call encodes a whole list of
 * phase records with their nested phases, flows included, straight into the
 * output buffer.
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
    PyObject *bodies;   /* dict: id(spec) -> BEGIN body bytes (this track) */
    const char *end_body, *tail;
    Py_ssize_t end_len, tail_len;
    PyObject *missing;  /* borrowed: the first spec without a body */
} Context;

static PyObject *s_spec, *s_start_ns, *s_end_ns, *s_children, *s_flows;

/* One packet: timestamp, track event of ``body`` plus ``nflows`` fixed64 flow ids, the tail. */
static int put_packet(Buffer *b, const Context *ctx, unsigned long long ts, const char *body, Py_ssize_t body_len,
                      const unsigned long long *flows, const char *terminating, Py_ssize_t nflows) {
    Py_ssize_t event_len = body_len + nflows * 10; /* a flow: 2-byte tag + 8 bytes */
    Py_ssize_t packet_len = 1 + varint_size(ts) + 1 + varint_size((unsigned long long)event_len) + event_len + ctx->tail_len;
    if (buffer_reserve(b, 1 + 10 + packet_len) < 0) return -1;
    b->data[b->len++] = 0x0a;
    put_varint(b, (unsigned long long)packet_len);
    b->data[b->len++] = 0x40;
    put_varint(b, ts);
    b->data[b->len++] = 0x5a;
    put_varint(b, (unsigned long long)event_len);
    put_bytes(b, body, body_len);
    for (Py_ssize_t i = 0; i < nflows; i++) {
        /* flow_ids = 47 and terminating_flow_ids = 48, both fixed64 (wire type 1) */
        put_varint(b, terminating[i] ? (48 << 3 | 1) : (47 << 3 | 1));
        unsigned long long id = flows[i];
        for (int k = 0; k < 8; k++) { b->data[b->len++] = (char)(id & 0xff); id >>= 8; }
    }
    put_bytes(b, ctx->tail, ctx->tail_len);
    return 0;
}

static int get_ns(PyObject *record, PyObject *name, unsigned long long *out) {
    PyObject *value = PyObject_GetAttr(record, name);
    if (value == NULL) return -1;
    *out = PyLong_AsUnsignedLongLongMask(value);
    Py_DECREF(value);
    return (*out == (unsigned long long)-1 && PyErr_Occurred()) ? -1 : 0;
}

#define MAX_FLOWS 64

/* Returns 0 on success, 1 when a spec has no body yet (ctx->missing), -1 on error. */
static int encode_phase(Buffer *b, Context *ctx, PyObject *phase, int depth) {
    if (depth > 64) { PyErr_SetString(PyExc_ValueError, "phases nested too deep"); return -1; }
    PyObject *spec = PyObject_GetAttr(phase, s_spec);
    if (spec == NULL) return -1;
    /* Bodies are keyed by id(spec): a dataclass's hash is a Python call, an id is not. */
    PyObject *key = PyLong_FromVoidPtr(spec);
    if (key == NULL) { Py_DECREF(spec); return -1; }
    PyObject *body = PyDict_GetItemWithError(ctx->bodies, key); /* borrowed */
    Py_DECREF(key);
    if (body == NULL) {
        if (PyErr_Occurred()) { Py_DECREF(spec); return -1; }
        ctx->missing = spec;
        Py_DECREF(spec); /* the record still holds the spec */
        return 1;
    }
    Py_DECREF(spec);
    if (!PyBytes_Check(body)) { PyErr_SetString(PyExc_TypeError, "slice bodies must be bytes"); return -1; }
    unsigned long long start, end;
    if (get_ns(phase, s_start_ns, &start) < 0 || get_ns(phase, s_end_ns, &end) < 0) return -1;

    unsigned long long flow_ids[MAX_FLOWS];
    char terminating[MAX_FLOWS];
    Py_ssize_t nflows = 0;
    PyObject *flows = PyObject_GetAttr(phase, s_flows);
    if (flows == NULL) return -1;
    if (flows != Py_None) {
        PyObject *seq = PySequence_Fast(flows, "flows must be a sequence");
        Py_DECREF(flows);
        if (seq == NULL) return -1;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        for (Py_ssize_t i = 0; i < n && nflows < MAX_FLOWS; i++) {
            PyObject *pair = PySequence_Fast_GET_ITEM(seq, i);
            if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
                Py_DECREF(seq);
                PyErr_SetString(PyExc_TypeError, "a flow is a (flow_id, terminating) tuple");
                return -1;
            }
            flow_ids[nflows] = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(pair, 0));
            int t = PyObject_IsTrue(PyTuple_GET_ITEM(pair, 1));
            if ((flow_ids[nflows] == (unsigned long long)-1 && PyErr_Occurred()) || t < 0) { Py_DECREF(seq); return -1; }
            terminating[nflows++] = (char)t;
        }
        Py_DECREF(seq);
    } else {
        Py_DECREF(flows);
    }
    if (put_packet(b, ctx, start, PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body), flow_ids, terminating, nflows) < 0)
        return -1;

    PyObject *children = PyObject_GetAttr(phase, s_children);
    if (children == NULL) return -1;
    if (children != Py_None) {
        PyObject *seq = PySequence_Fast(children, "children must be a sequence");
        Py_DECREF(children);
        if (seq == NULL) return -1;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        for (Py_ssize_t i = 0; i < n; i++) {
            int r = encode_phase(b, ctx, PySequence_Fast_GET_ITEM(seq, i), depth + 1);
            if (r != 0) { Py_DECREF(seq); return r; }
        }
        Py_DECREF(seq);
    } else {
        Py_DECREF(children);
    }
    return put_packet(b, ctx, end, ctx->end_body, ctx->end_len, NULL, NULL, 0);
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

static PyObject *encode_phases(PyObject *module, PyObject *args) {
    PyObject *out, *phases, *bodies, *outer = Py_None;
    Py_buffer end_body, tail;
    if (!PyArg_ParseTuple(args, "O!OO!y*y*|O", &PyByteArray_Type, &out, &phases, &PyDict_Type, &bodies, &end_body,
                          &tail, &outer))
        return NULL;
    Context ctx = {bodies, end_body.buf, tail.buf, end_body.len, tail.len, NULL};
    Buffer b = {NULL, 0, 0};
    PyObject *result = NULL;
    unsigned long long outer_start = 0, outer_end = 0;
    const char *outer_body = NULL;
    if (outer != Py_None) {
        PyObject *body, *annotations;
        if (!PyArg_ParseTuple(outer, "KKO!O!;outer is (start_ns, end_ns, body, annotations)", &outer_start, &outer_end,
                              &PyBytes_Type, &body, &PyTuple_Type, &annotations))
            goto done;
        /* The BEGIN body, then one debug annotation (field 4) per (name field, integer value). */
        Buffer event = {NULL, 0, 0};
        Py_ssize_t n_annotations = PyTuple_GET_SIZE(annotations);
        if (buffer_reserve(&event, PyBytes_GET_SIZE(body) + n_annotations * 64) < 0) goto done;
        put_bytes(&event, PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body));
        for (Py_ssize_t i = 0; i < n_annotations; i++) {
            PyObject *pair = PyTuple_GET_ITEM(annotations, i), *name;
            long long value;
            if (!PyArg_ParseTuple(pair, "O!L;an annotation is (name field bytes, int)", &PyBytes_Type, &name, &value)
                || put_annotation(&event, PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name), value) < 0) {
                PyMem_Free(event.data);
                goto done;
            }
        }
        int r = put_packet(&b, &ctx, outer_start, event.data, event.len, NULL, NULL, 0);
        PyMem_Free(event.data);
        if (r < 0) goto done;
        outer_body = "";  /* marks that an END is due */
    }
    PyObject *seq = PySequence_Fast(phases, "phases must be a sequence");
    if (seq == NULL) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int r = 0;
    for (Py_ssize_t i = 0; i < n && r == 0; i++) r = encode_phase(&b, &ctx, PySequence_Fast_GET_ITEM(seq, i), 0);
    Py_DECREF(seq);
    if (r == 0 && outer_body != NULL) r = put_packet(&b, &ctx, outer_end, ctx.end_body, ctx.end_len, NULL, NULL, 0);
    if (r < 0) goto done;
    if (r == 1) {
        /* Nothing is appended: the caller adds the body and calls again. */
        result = ctx.missing;
        Py_INCREF(result);
        goto done;
    }
    Py_ssize_t old = PyByteArray_GET_SIZE(out);
    if (PyByteArray_Resize(out, old + b.len) < 0) goto done;
    memcpy(PyByteArray_AS_STRING(out) + old, b.data, (size_t)b.len);
    result = Py_None;
    Py_INCREF(result);
done:
    PyMem_Free(b.data);
    PyBuffer_Release(&end_body);
    PyBuffer_Release(&tail);
    return result;
}

/* encode_rows(out, starts, ends, indices, env_steps, counts, phase_starts, phase_ends, phase_bodies,
 *             outer_body, end_body, sequence_tail, iteration_name, env_steps_name) -> None
 * Iterations held as columns (otel_rl.core.iteration_rows), each an enclosing slice with its index
 * (and env steps, unless None) as annotations around its ``counts[i]`` phases without nested phases
 * or flows: the same packets as encode_phases of their records, one call for all of them. */
static PyObject *encode_rows(PyObject *module, PyObject *args) {
    PyObject *out, *columns[8];
    Py_buffer outer_body, end_body, tail, iteration_name, env_name;
    if (!PyArg_ParseTuple(args, "O!OOOOOOOOy*y*y*y*y*", &PyByteArray_Type, &out, &columns[0], &columns[1], &columns[2],
                          &columns[3], &columns[4], &columns[5], &columns[6], &columns[7], &outer_body, &end_body, &tail,
                          &iteration_name, &env_name))
        return NULL;
    PyObject *seq[8] = {NULL};
    Buffer b = {NULL, 0, 0}, event = {NULL, 0, 0};
    PyObject *result = NULL;
    Context ctx = {NULL, end_body.buf, tail.buf, end_body.len, tail.len, NULL};
    for (int k = 0; k < 8; k++)
        if ((seq[k] = PySequence_Fast(columns[k], "encode_rows takes lists")) == NULL) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq[0]), phases = PySequence_Fast_GET_SIZE(seq[5]);
    if (PySequence_Fast_GET_SIZE(seq[1]) != n || PySequence_Fast_GET_SIZE(seq[2]) != n || PySequence_Fast_GET_SIZE(seq[3]) != n
        || PySequence_Fast_GET_SIZE(seq[4]) != n || PySequence_Fast_GET_SIZE(seq[6]) != phases
        || PySequence_Fast_GET_SIZE(seq[7]) != phases) {
        PyErr_SetString(PyExc_ValueError, "encode_rows: columns of different lengths");
        goto done;
    }
    PyObject **starts = PySequence_Fast_ITEMS(seq[0]), **ends = PySequence_Fast_ITEMS(seq[1]),
             **indices = PySequence_Fast_ITEMS(seq[2]), **envs = PySequence_Fast_ITEMS(seq[3]),
             **counts = PySequence_Fast_ITEMS(seq[4]), **phase_starts = PySequence_Fast_ITEMS(seq[5]),
             **phase_ends = PySequence_Fast_ITEMS(seq[6]), **bodies = PySequence_Fast_ITEMS(seq[7]);
    Py_ssize_t p = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long long start = PyLong_AsUnsignedLongLongMask(starts[i]), end = PyLong_AsUnsignedLongLongMask(ends[i]);
        long long index = PyLong_AsLongLong(indices[i]), count = PyLong_AsLongLong(counts[i]);
        if (PyErr_Occurred()) goto done;
        if (count < 0 || p + count > phases) {
            PyErr_SetString(PyExc_ValueError, "encode_rows: counts past the phases");
            goto done;
        }
        event.len = 0;
        if (buffer_reserve(&event, outer_body.len) < 0) goto done;
        put_bytes(&event, outer_body.buf, outer_body.len);
        if (put_annotation(&event, iteration_name.buf, iteration_name.len, index) < 0) goto done;
        if (envs[i] != Py_None) {
            long long steps = PyLong_AsLongLong(envs[i]);
            if ((steps == -1 && PyErr_Occurred()) || put_annotation(&event, env_name.buf, env_name.len, steps) < 0) goto done;
        }
        if (put_packet(&b, &ctx, start, event.data, event.len, NULL, NULL, 0) < 0) goto done;
        for (Py_ssize_t k = 0; k < count; k++, p++) {
            unsigned long long phase_start = PyLong_AsUnsignedLongLongMask(phase_starts[p]);
            unsigned long long phase_end = PyLong_AsUnsignedLongLongMask(phase_ends[p]);
            if (PyErr_Occurred()) goto done;
            if (!PyBytes_Check(bodies[p])) {
                PyErr_SetString(PyExc_TypeError, "slice bodies must be bytes");
                goto done;
            }
            if (put_packet(&b, &ctx, phase_start, PyBytes_AS_STRING(bodies[p]), PyBytes_GET_SIZE(bodies[p]), NULL, NULL, 0) < 0
                || put_packet(&b, &ctx, phase_end, ctx.end_body, ctx.end_len, NULL, NULL, 0) < 0)
                goto done;
        }
        if (put_packet(&b, &ctx, end, ctx.end_body, ctx.end_len, NULL, NULL, 0) < 0) goto done;
    }
    Py_ssize_t old = PyByteArray_GET_SIZE(out);
    if (PyByteArray_Resize(out, old + b.len) < 0) goto done;
    memcpy(PyByteArray_AS_STRING(out) + old, b.data, (size_t)b.len);
    result = Py_NewRef(Py_None);
done:
    for (int k = 0; k < 8; k++) Py_XDECREF(seq[k]);
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
    {"encode_phases", encode_phases, METH_VARARGS,
     "encode_phases(out, phases, bodies, end_body, sequence_tail, outer=None) -> None or the first spec without a body.\n\n"
     "Appends a BEGIN and END slice packet per phase record (nested phases in between) to ``out``,\n"
     "inside an enclosing slice when ``outer`` is (start_ns, end_ns, BEGIN body, annotations), annotations\n"
     "being (name field bytes, int) pairs; ``bodies`` maps\n"
     "id(spec) to the BEGIN body. Appends nothing when a spec is missing from ``bodies``."},
    {"encode_rows", encode_rows, METH_VARARGS,
     "encode_rows(out, starts, ends, indices, env_steps, counts, phase_starts, phase_ends, phase_bodies, outer_body,\n"
     "            end_body, sequence_tail, iteration_name, env_steps_name) -> None\n\n"
     "Appends what encode_phases appends for each of these iterations' records (lists, one entry per iteration\n"
     "and per phase; env_steps None where absent): the iteration's slice around its phases' slices."},
    {NULL}
};

static struct PyModuleDef slices_module = {
    PyModuleDef_HEAD_INIT, "otel_rl.outputs.perfetto._slices", "Perfetto slice packets of phase records, in C.", -1, module_methods,
};

PyMODINIT_FUNC PyInit__slices(void) {
    if ((s_spec = PyUnicode_InternFromString("spec")) == NULL) return NULL;
    if ((s_start_ns = PyUnicode_InternFromString("start_ns")) == NULL) return NULL;
    if ((s_end_ns = PyUnicode_InternFromString("end_ns")) == NULL) return NULL;
    if ((s_children = PyUnicode_InternFromString("children")) == NULL) return NULL;
    if ((s_flows = PyUnicode_InternFromString("flows")) == NULL) return NULL;
    return PyModule_Create(&slices_module);
}
