/*
 * A message ring's frames read in C: the agent's per-record work of a pass.
 *
 * A producer that calls scalars() every iteration writes thousands of frames
 * a second into the data ring. Read in Python, each costs a struct unpack, a
 * slice and a few integer operations, about a microsecond of the agent's CPU;
 * here one call reads every frame a pass takes. The frame layout (an 8-byte
 * header: payload length and kind, both uint32; the payload; padding to 8
 * bytes; kind 0 a SKIP to the ring's start) is otel_rl/shm/layout.py's; segment.py's
 * Ring.take is the pure-Python twin used when this module is not built; the
 * tests read the same ring with both.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "layout.h"  /* generated from otel_rl/shm/layout.py */

/* take_frames(buffer, ring_offset, capacity, read, budget) -> (frames, read, behind) */
static PyObject *take_frames(PyObject *module, PyObject *args) {
    PyObject *buffer;
    Py_ssize_t offset, capacity, budget;
    unsigned long long read;
    if (!PyArg_ParseTuple(args, "OnnKn", &buffer, &offset, &capacity, &read, &budget)) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE) < 0) return NULL;
    if (offset < 0 || offset % 8 || capacity < RING_HEADER_BYTES || capacity % 8 || view.len < offset + RING_HEADER_BYTES + capacity) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "not a message ring of this buffer");
        return NULL;
    }
    const RingHeader *header = (const RingHeader *)((const char *)view.buf + offset);
    const char *data = (const char *)view.buf + offset + RING_HEADER_BYTES;
    uint64_t write = __atomic_load_n(&header->write, __ATOMIC_ACQUIRE), cap = (uint64_t)capacity, taken = 0;
    PyObject *frames = PyList_New(0);
    while (frames != NULL && read < write && taken < (uint64_t)budget) {
        uint64_t position = read % cap;
        FrameHeader frame;
        if (cap - position < sizeof frame) {
            read += cap - position;
            continue;
        }
        memcpy(&frame, data + position, sizeof frame);
        if (frame.kind == MESSAGE_KIND_SKIP) {  /* the writer went on at the ring's start */
            read += cap - position;
            continue;
        }
        /* As a slice of the buffer in Python: a length past the buffer's end (a torn segment) stops there. */
        Py_ssize_t start = offset + RING_HEADER_BYTES + (Py_ssize_t)(position + sizeof frame), length = (Py_ssize_t)frame.length;
        if (length > view.len - start) length = view.len - start;
        PyObject *item = Py_BuildValue("(Iy#)", frame.kind, (const char *)view.buf + start, length);
        if (item == NULL || PyList_Append(frames, item) < 0) {
            Py_XDECREF(item);
            Py_CLEAR(frames);
            break;
        }
        Py_DECREF(item);
        uint64_t size = sizeof frame + (uint64_t)frame.length;
        size += (8 - size % 8) % 8;
        read += size;
        taken += size;
    }
    PyBuffer_Release(&view);
    if (frames == NULL) return NULL;
    return Py_BuildValue("(NKO)", frames, read, read < write ? Py_True : Py_False);
}

static PyMethodDef module_methods[] = {
    {"take_frames", take_frames, METH_VARARGS,
     "take_frames(buffer, ring_offset, capacity, read, budget) -> (frames, read, behind)\n\n"
     "The frames written past ``read`` (about ``budget`` bytes at most), oldest first, as (kind, bytes);\n"
     "the position past them; whether it stopped at the budget before the write position it saw."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef frames_module = {
    PyModuleDef_HEAD_INIT, "otel_rl.shm._frames", "A message ring's frames, read in C.", -1, module_methods,
};

PyMODINIT_FUNC PyInit__frames(void) {
    PyObject *m = PyModule_Create(&frames_module);
    if (m != NULL && PyModule_AddObject(m, "layout", layout_of_build()) < 0) Py_CLEAR(m);
    return m;
}
