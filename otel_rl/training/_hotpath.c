/*
 * The training thread's hot path in C: entering and leaving a phase or an iteration.
 *
 * A Python context manager pays for two Python-level calls (__enter__ and
 * __exit__) plus tuples for the stack and the record; that alone is two to
 * three times the cost of two perf_counter_ns() calls and a list append. Here
 * nothing is allocated on the training thread: the open-phase stack is a
 * fixed array inside the lane, the lane is found in the thread state's dict,
 * and each finished phase or mark is one fixed record (LaneRecord, from
 * layout.h) written into the lane's ring in the shared-memory segment, where
 * the pipeline reads it. A full ring refuses the new record and counts it.
 *
 * Semantics are identical to the pure-Python twin in recorder.py, which is
 * used when this module is not built. Timestamps come from CLOCK_MONOTONIC,
 * the clock behind time.perf_counter_ns() on Linux.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "layout.h"  /* generated from otel_rl/shm/layout.py: the records shared with the agent */

#define MAX_DEPTH 64

static inline long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---------------------------------------------------------------- Lane */

typedef struct {
    PyObject_HEAD
    Py_ssize_t capacity, dropped;
    /* The lane's header and ring in the segment; NULL for a lane that records nothing (detached, or one
     * of a thread beyond the segment's lanes): its records are counted as dropped. */
    Py_buffer shm_view;
    LaneHeader *shm;
    LaneRecord *shm_records;
    PyObject *intern;  /* intern(str or exception type) -> id in the segment's string table */
    PyObject *thread_id;
    PyObject *thread_name;
    PyObject *open_iterations; /* dict: timeline -> Iteration */
    int depth;
    PyObject *stack_phase[MAX_DEPTH]; /* strong references while open */
    long long stack_start[MAX_DEPTH];
} LaneObject;

static int Lane_init(LaneObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"capacity", "thread_id", "thread_name", "buffer", "offset", "intern", NULL};
    PyObject *thread_id, *thread_name, *buffer = NULL, *intern = NULL;
    Py_ssize_t capacity, offset = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "nOO|OnO", kwlist, &capacity, &thread_id, &thread_name, &buffer, &offset, &intern))
        return -1;
    if (capacity < 1) {
        PyErr_Format(PyExc_ValueError, "capacity must be positive, got %zd", capacity);
        return -1;
    }
    if (self->shm != NULL || self->thread_id != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "lane already initialised");
        return -1;
    }
    if (buffer != NULL && buffer != Py_None) {
        if (intern == NULL || !PyCallable_Check(intern)) {
            PyErr_SetString(PyExc_TypeError, "a shared-memory lane needs an intern callable");
            return -1;
        }
        if (PyObject_GetBuffer(buffer, &self->shm_view, PyBUF_WRITABLE) < 0) return -1;
        size_t needed = (size_t)offset + sizeof(LaneHeader) + (size_t)capacity * sizeof(LaneRecord);
        if (offset < 0 || offset % 8 || (size_t)self->shm_view.len < needed) {
            PyBuffer_Release(&self->shm_view);
            PyErr_Format(PyExc_ValueError, "buffer too small or misaligned for a lane of %zd records at %zd", capacity, offset);
            return -1;
        }
        self->shm = (LaneHeader *)((char *)self->shm_view.buf + offset);
        self->shm_records = (LaneRecord *)(self->shm + 1);
        memset(self->shm, 0, sizeof(LaneHeader));
        self->shm->capacity = (uint64_t)capacity;
        self->shm->thread_id = PyLong_Check(thread_id) ? PyLong_AsLongLong(thread_id) : 0;
        if (PyErr_Occurred()) PyErr_Clear();
        if (PyUnicode_Check(thread_name)) {
            Py_ssize_t n;
            const char *name = PyUnicode_AsUTF8AndSize(thread_name, &n);
            if (name == NULL) PyErr_Clear();
            else memcpy(self->shm->thread_name, name, (size_t)(n < 23 ? n : 23));
        }
        Py_INCREF(intern); Py_XSETREF(self->intern, intern);
    }
    PyObject *open_iterations = PyDict_New();
    if (open_iterations == NULL) return -1;
    Py_INCREF(thread_id); Py_XSETREF(self->thread_id, thread_id);
    Py_INCREF(thread_name); Py_XSETREF(self->thread_name, thread_name);
    Py_XSETREF(self->open_iterations, open_iterations);
    self->capacity = self->shm != NULL ? capacity : 0;
    self->dropped = 0;
    self->depth = 0;
    return 0;
}

static int Lane_traverse(LaneObject *self, visitproc visit, void *arg) {
    for (int i = 0; i < self->depth; i++) Py_VISIT(self->stack_phase[i]);
    Py_VISIT(self->open_iterations);
    Py_VISIT(self->intern);
    return 0;
}

static int Lane_clear(LaneObject *self) {
    while (self->depth > 0) {
        self->depth--;
        Py_CLEAR(self->stack_phase[self->depth]);
    }
    Py_CLEAR(self->thread_id);
    Py_CLEAR(self->thread_name);
    Py_CLEAR(self->open_iterations);
    Py_CLEAR(self->intern);
    return 0;
}

static void Lane_dealloc(LaneObject *self) {
    PyObject_GC_UnTrack(self);
    Lane_clear(self);
    if (self->shm != NULL) {
        self->shm = NULL;
        PyBuffer_Release(&self->shm_view);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The next free record of the lane, or NULL (counted as dropped) when the reader is a whole ring behind
 * (a single producer can only drop what it has not published, never what the reader may be copying) or
 * the lane records nothing. */
static LaneRecord *shm_next(LaneObject *lane) {
    LaneHeader *h = lane->shm;
    if (h == NULL) {
        lane->dropped++;
        return NULL;
    }
    uint64_t w = h->write;  /* only this thread writes it */
    uint64_t r = __atomic_load_n(&h->read, __ATOMIC_ACQUIRE);
    if (w - r >= (uint64_t)lane->capacity) {
        lane->dropped++;
        __atomic_store_n(&h->dropped, (uint64_t)lane->dropped, __ATOMIC_RELAXED);
        return NULL;
    }
    LaneRecord *rec = &lane->shm_records[w % (uint64_t)lane->capacity];
    memset(rec, 0, sizeof(LaneRecord));
    return rec;
}

/* Publish the record shm_next returned: the reader sees it whole or not at all. */
static void shm_commit(LaneObject *lane) {
    __atomic_store_n(&lane->shm->write, lane->shm->write + 1, __ATOMIC_RELEASE);
}

#define INTERRUPTED (-2)

/* intern(obj) as an id; -1 (and no error) if it fails or obj is None. INTERRUPTED, with the error
   set, when what was raised is no Exception: a KeyboardInterrupt that arrived during the call is the
   user's Ctrl-C, which the caller must raise, never swallow. */
static int32_t shm_intern(LaneObject *lane, PyObject *obj) {
    if (obj == NULL || obj == Py_None) return -1;
    PyObject *r = PyObject_CallOneArg(lane->intern, obj);
    long id = r == NULL ? -1 : PyLong_AsLong(r);
    Py_XDECREF(r);
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_Exception)) return INTERRUPTED;
        PyErr_WriteUnraisable(lane->intern);
        return -1;
    }
    return (int32_t)id;
}

/* A Python int as int64; `fallback` when it is not an int or does not fit. */
static int64_t as_int64(PyObject *obj, int64_t fallback) {
    if (obj == NULL || !PyLong_Check(obj)) return fallback;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred()) { PyErr_Clear(); return fallback; }
    return overflow ? fallback : (int64_t)v;
}

typedef struct {
    PyObject_HEAD
    PyObject *spec;
    PyObject *key;      /* the recorder's lane key in each thread state's dict */
    PyObject *recorder; /* recorder.lane() creates and binds the lane on first use */
    PyObject *warn;     /* warn(kind, phase, other) on misuse */
    int id;             /* the phase's id in a shared-memory segment's string table (-1: none) */
} PhaseObject;

static PyTypeObject PhaseType;

/* phase(phase, start_ns, end_ns, exc_type): a phase measured elsewhere, nested in the phases open on this lane. */
static PyObject *Lane_phase(LaneObject *self, PyObject *args) {
    PyObject *phase, *exc_type;
    long long start, end;
    if (!PyArg_ParseTuple(args, "O!LLO", &PhaseType, &phase, &start, &end, &exc_type)) return NULL;
    int32_t exc = exc_type == Py_None ? -1 : shm_intern(self, exc_type);
    if (exc == INTERRUPTED) return NULL;
    LaneRecord *rec = shm_next(self);
    if (rec == NULL) Py_RETURN_NONE;
    rec->kind = RECORD_KIND_PHASE;
    rec->name = ((PhaseObject *)phase)->id;
    rec->start = start;
    rec->end = end;
    rec->depth = (int16_t)self->depth;
    rec->exc = exc;
    shm_commit(self);
    Py_RETURN_NONE;
}

/* timeline_id(timeline): the timeline's id in the string table (PyLane.timeline_id's twin). */
static PyObject *Lane_timeline_id(LaneObject *self, PyObject *timeline) {
    int32_t id = shm_intern(self, timeline);
    if (id == INTERRUPTED) return NULL;
    return PyLong_FromLong(id);
}

/* iteration_mark(kind, time_ns, cpu_ns, index, env_steps, timeline_id): an iteration's start or end measured
   elsewhere (PyLane.iteration_mark's twin), at the depth of the phases open now. */
static PyObject *Lane_iteration_mark(LaneObject *self, PyObject *args) {
    int kind, timeline_id;
    long long time_ns, cpu_ns, index, env_steps;
    if (!PyArg_ParseTuple(args, "iLLLLi", &kind, &time_ns, &cpu_ns, &index, &env_steps, &timeline_id)) return NULL;
    if (kind != RECORD_KIND_ITERATION_START && kind != RECORD_KIND_ITERATION_END) {
        PyErr_SetString(PyExc_ValueError, "kind must be an iteration's start or end");
        return NULL;
    }
    LaneRecord *rec = shm_next(self);
    if (rec == NULL) Py_RETURN_NONE;
    rec->kind = (uint8_t)kind;
    rec->name = timeline_id;
    rec->start = time_ns;
    rec->end = cpu_ns;
    rec->a = index;
    rec->b = env_steps;
    rec->depth = (int16_t)self->depth;
    rec->exc = -1;
    shm_commit(self);
    Py_RETURN_NONE;
}

/* flow(time_ns, flow_id, terminating): a flow mark for the innermost open phase (its low 64 bits). */
static PyObject *Lane_flow(LaneObject *self, PyObject *args) {
    long long time_ns;
    PyObject *flow;
    int terminating;
    if (!PyArg_ParseTuple(args, "LOp", &time_ns, &flow, &terminating)) return NULL;
    LaneRecord *rec = shm_next(self);
    if (rec == NULL) Py_RETURN_NONE;
    rec->kind = RECORD_KIND_FLOW;
    rec->start = time_ns;
    rec->a = PyLong_Check(flow) ? (int64_t)PyLong_AsUnsignedLongLongMask(flow) : 0;
    if (PyErr_Occurred()) PyErr_Clear();
    rec->flags = (uint8_t)terminating;
    rec->depth = (int16_t)self->depth;
    rec->name = rec->exc = -1;
    shm_commit(self);
    Py_RETURN_NONE;
}

/* correlate(correlation): pairs the innermost open phase with its GPU interval. */
static PyObject *Lane_correlate(LaneObject *self, PyObject *arg) {
    int64_t correlation = as_int64(arg, 0);
    LaneRecord *rec = shm_next(self);
    if (rec == NULL) Py_RETURN_NONE;
    rec->kind = RECORD_KIND_CORRELATE;
    rec->a = correlation;
    rec->depth = (int16_t)self->depth;
    rec->name = rec->exc = -1;
    shm_commit(self);
    Py_RETURN_NONE;
}

/* Stop writing to shared memory (a forked child: the segment is its parent's); later records are dropped. */
static PyObject *Lane_detach(LaneObject *self, PyObject *unused) {
    if (self->shm == NULL) Py_RETURN_NONE;
    self->shm = NULL;
    self->shm_records = NULL;
    PyBuffer_Release(&self->shm_view);
    self->capacity = 0;
    Py_RETURN_NONE;
}

static Py_ssize_t Lane_len(LaneObject *self) {
    if (self->shm == NULL) return 0;
    return (Py_ssize_t)(self->shm->write - __atomic_load_n(&self->shm->read, __ATOMIC_ACQUIRE));
}

/* rebind(thread_id, thread_name): the lane of a thread that ended, drained, given to another thread. */
static PyObject *Lane_rebind(LaneObject *self, PyObject *args) {
    PyObject *thread_id, *thread_name;
    if (!PyArg_ParseTuple(args, "OU", &thread_id, &thread_name)) return NULL;
    PyObject *open_iterations = PyDict_New();
    if (open_iterations == NULL) return NULL;
    while (self->depth > 0) {  /* phases the ended thread left open: never exited, never recorded */
        self->depth--;
        Py_CLEAR(self->stack_phase[self->depth]);
    }
    Py_XSETREF(self->open_iterations, open_iterations);
    Py_INCREF(thread_id); Py_XSETREF(self->thread_id, thread_id);
    Py_INCREF(thread_name); Py_XSETREF(self->thread_name, thread_name);
    if (self->shm != NULL) {
        self->shm->thread_id = PyLong_Check(thread_id) ? PyLong_AsLongLong(thread_id) : 0;
        if (PyErr_Occurred()) PyErr_Clear();
        memset(self->shm->thread_name, 0, sizeof(self->shm->thread_name));
        Py_ssize_t n;
        const char *name = PyUnicode_AsUTF8AndSize(thread_name, &n);
        if (name == NULL) PyErr_Clear();
        else memcpy(self->shm->thread_name, name, (size_t)(n < 23 ? n : 23));
    }
    Py_RETURN_NONE;
}

static PyObject *Lane_get_depth(LaneObject *self, void *closure) {
    return PyLong_FromLong(self->depth);
}

static PyMethodDef Lane_methods[] = {
    {"phase", (PyCFunction)Lane_phase, METH_VARARGS, "Record a phase measured elsewhere, nested in the open phases."},
    {"flow", (PyCFunction)Lane_flow, METH_VARARGS, "Record a flow mark for the innermost open phase."},
    {"timeline_id", (PyCFunction)Lane_timeline_id, METH_O, "A timeline's id in the string table."},
    {"iteration_mark", (PyCFunction)Lane_iteration_mark, METH_VARARGS, "Record an iteration's start or end measured elsewhere."},
    {"correlate", (PyCFunction)Lane_correlate, METH_O, "Pair the innermost open phase with a GPU interval."},
    {"detach", (PyCFunction)Lane_detach, METH_NOARGS, "Stop writing to shared memory; later records are dropped."},
    {"rebind", (PyCFunction)Lane_rebind, METH_VARARGS, "Give a drained lane of an ended thread to another thread."},
    {NULL}
};

static PySequenceMethods Lane_as_sequence = {
    .sq_length = (lenfunc)Lane_len,
};

static PyMemberDef Lane_members[] = {
    {"thread_id", T_OBJECT_EX, offsetof(LaneObject, thread_id), READONLY, NULL},
    {"thread_name", T_OBJECT_EX, offsetof(LaneObject, thread_name), READONLY, NULL},
    {"open_iterations", T_OBJECT_EX, offsetof(LaneObject, open_iterations), READONLY, NULL},
    {"capacity", T_PYSSIZET, offsetof(LaneObject, capacity), READONLY, NULL},
    {"dropped", T_PYSSIZET, offsetof(LaneObject, dropped), READONLY, NULL},
    {NULL}
};

static PyGetSetDef Lane_getset[] = {
    {"depth", (getter)Lane_get_depth, NULL, "Number of open phases on this thread.", NULL},
    {NULL}
};

static PyTypeObject LaneType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_rl.training._hotpath.Lane",
    .tp_basicsize = sizeof(LaneObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The lane of one thread in a segment (a bounded ring of records) and its open-phase stack.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Lane_init,
    .tp_dealloc = (destructor)Lane_dealloc,
    .tp_traverse = (traverseproc)Lane_traverse,
    .tp_clear = (inquiry)Lane_clear,
    .tp_methods = Lane_methods,
    .tp_members = Lane_members,
    .tp_getset = Lane_getset,
    .tp_as_sequence = &Lane_as_sequence,
};

/* The calling thread's lane for `key` (borrowed), or NULL without an error set. */
static LaneObject *lookup_lane(PyObject *key) {
    PyObject *dict = PyThreadState_GetDict();
    if (dict == NULL) return NULL;
    PyObject *lane = PyDict_GetItemWithError(dict, key);
    if (lane == NULL || !PyObject_TypeCheck(lane, &LaneType)) return NULL;
    return (LaneObject *)lane;
}

static PyObject *current_lane(PyObject *module, PyObject *key) {
    LaneObject *lane = lookup_lane(key);
    if (lane == NULL) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    Py_INCREF(lane);
    return (PyObject *)lane;
}

static PyObject *bind_lane(PyObject *module, PyObject *args) {
    PyObject *key, *lane;
    if (!PyArg_ParseTuple(args, "UO!", &key, &LaneType, &lane)) return NULL;
    PyObject *dict = PyThreadState_GetDict();
    if (dict == NULL) { PyErr_SetString(PyExc_RuntimeError, "no thread state dict"); return NULL; }
    if (PyDict_SetItem(dict, key, lane) < 0) return NULL;
    Py_RETURN_NONE;
}

/* The calling thread's lane for `key` (borrowed), created through recorder.lane() on first use; NULL with an error set. */
static LaneObject *entering_lane(PyObject *key, PyObject *recorder) {
    LaneObject *lane = lookup_lane(key);
    if (lane != NULL || PyErr_Occurred()) return lane;
    PyObject *created = PyObject_CallMethod(recorder, "lane", NULL);
    if (created == NULL) return NULL;
    Py_DECREF(created);  /* the thread state's dict keeps it */
    lane = lookup_lane(key);
    if (lane == NULL && !PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "recorder.lane() did not bind a C lane");
    return lane;
}

/* warn_fn(kind, obj, other) for a misuse; returns False (what __exit__ returns), NULL on error. */
static PyObject *misuse(PyObject *warn_fn, const char *kind, PyObject *obj, PyObject *other) {
    PyObject *r = PyObject_CallFunction(warn_fn, "sOO", kind, obj, other ? other : Py_None);
    if (r == NULL) return NULL;
    Py_DECREF(r);
    Py_RETURN_FALSE;
}

/* --------------------------------------------------------------- Phase */


static int Phase_init(PhaseObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"spec", "key", "recorder", "warn", "id", NULL};
    PyObject *spec, *key, *recorder, *warn;
    int id = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OUOO|i", kwlist, &spec, &key, &recorder, &warn, &id))
        return -1;
    self->id = id;
    Py_INCREF(spec); Py_XSETREF(self->spec, spec);
    Py_INCREF(key); Py_XSETREF(self->key, key);
    Py_INCREF(recorder); Py_XSETREF(self->recorder, recorder);
    Py_INCREF(warn); Py_XSETREF(self->warn, warn);
    return 0;
}

static int Phase_traverse(PhaseObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->spec);
    Py_VISIT(self->recorder);
    Py_VISIT(self->warn);
    return 0;
}

static int Phase_clear(PhaseObject *self) {
    Py_CLEAR(self->spec);
    Py_CLEAR(self->key);
    Py_CLEAR(self->recorder);
    Py_CLEAR(self->warn);
    return 0;
}

static void Phase_dealloc(PhaseObject *self) {
    PyObject_GC_UnTrack(self);
    Phase_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Phase_enter(PhaseObject *self, PyObject *unused) {
    LaneObject *lane = entering_lane(self->key, self->recorder);
    if (lane == NULL) return NULL;
    if (lane->depth >= MAX_DEPTH) {
        PyObject *r = misuse(self->warn, "too-deep", (PyObject *)self, NULL);
        if (r == NULL) return NULL;
        Py_DECREF(r);
    } else {
        Py_INCREF(self);
        lane->stack_phase[lane->depth] = (PyObject *)self;
        lane->stack_start[lane->depth] = now_ns();
        lane->depth++;
    }
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *Phase_exit(PhaseObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long end = now_ns();
    PyObject *exc_type = nargs > 0 ? args[0] : Py_None;
    LaneObject *lane = lookup_lane(self->key);
    if (lane == NULL || lane->depth == 0) {
        if (PyErr_Occurred()) return NULL;
        return misuse(self->warn, lane == NULL ? "foreign" : "not-open", (PyObject *)self, NULL);
    }
    int position = lane->depth - 1;
    while (position >= 0 && lane->stack_phase[position] != (PyObject *)self) position--;
    if (position < 0) return misuse(self->warn, "not-open", (PyObject *)self, NULL);
    if (position < lane->depth - 1) {
        /* Exited out of order: the phases entered after it were never exited. They are dropped (the
         * warning names the innermost) and the stack unwinds to this one, so later phases nest right. */
        PyObject *innermost = Py_NewRef(lane->stack_phase[lane->depth - 1]);
        while (lane->depth - 1 > position) {
            lane->depth--;
            Py_CLEAR(lane->stack_phase[lane->depth]);
        }
        PyObject *r = misuse(self->warn, "order", (PyObject *)self, innermost);
        Py_DECREF(innermost);
        if (r == NULL) return NULL;
        Py_DECREF(r);
    }
    lane->depth--;
    int32_t exc = exc_type == Py_None ? -1 : shm_intern(lane, exc_type);
    int interrupted = exc == INTERRUPTED;  /* the phase is recorded all the same, then the interrupt raised */
    if (interrupted) exc = -1;
    LaneRecord *rec = shm_next(lane);
    if (rec != NULL) {
        rec->kind = RECORD_KIND_PHASE;
        rec->name = self->id;
        rec->start = lane->stack_start[lane->depth];
        rec->end = end;
        rec->depth = (int16_t)lane->depth;
        rec->exc = exc;
        shm_commit(lane);
    }
    lane->stack_phase[lane->depth] = NULL;
    Py_DECREF(self);  /* the stack's reference */
    if (interrupted) return NULL;
    Py_RETURN_FALSE;
}

static PyMethodDef Phase_methods[] = {
    {"__enter__", (PyCFunction)Phase_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))Phase_exit, METH_FASTCALL, NULL},
    {NULL}
};

static PyMemberDef Phase_members[] = {
    {"spec", T_OBJECT_EX, offsetof(PhaseObject, spec), READONLY, NULL},
    {"id", T_INT, offsetof(PhaseObject, id), READONLY, NULL},
    {NULL}
};

static PyTypeObject PhaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_rl.training._hotpath.Phase",
    .tp_basicsize = sizeof(PhaseObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Enter/exit of a phase: timestamps into the calling thread's lane.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Phase_init,
    .tp_dealloc = (destructor)Phase_dealloc,
    .tp_traverse = (traverseproc)Phase_traverse,
    .tp_clear = (inquiry)Phase_clear,
    .tp_methods = Phase_methods,
    .tp_members = Phase_members,
};


/* ----------------------------------------------------------- Iteration */

static inline long long thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);  /* the clock behind time.thread_time_ns() */
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

typedef struct {
    PyObject_HEAD
    PyObject *key, *recorder, *warn;
    PyObject *timeline, *index, *env_steps;
    PyObject *on_enter;  /* on_enter(iteration) or None */
    int thread_time;
    int active;
    int32_t timeline_id;  /* the timeline's id in the string table, interned on enter */
} IterationObject;

static int Iteration_init(IterationObject *self, PyObject *args, PyObject *kwds) {
    /* Positional only, the per-run arguments first (bound once with functools.partial). */
    PyObject *key, *recorder, *warn_fn, *on_enter, *timeline, *index, *env_steps;
    int thread_time;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) { PyErr_SetString(PyExc_TypeError, "Iteration takes positional arguments"); return -1; }
    if (!PyArg_ParseTuple(args, "UOOOpUOO", &key, &recorder, &warn_fn, &on_enter, &thread_time, &timeline, &index, &env_steps))
        return -1;
    Py_INCREF(key); Py_XSETREF(self->key, key);
    Py_INCREF(recorder); Py_XSETREF(self->recorder, recorder);
    Py_INCREF(warn_fn); Py_XSETREF(self->warn, warn_fn);
    Py_INCREF(timeline); Py_XSETREF(self->timeline, timeline);
    Py_INCREF(index); Py_XSETREF(self->index, index);
    Py_INCREF(env_steps); Py_XSETREF(self->env_steps, env_steps);
    Py_INCREF(on_enter); Py_XSETREF(self->on_enter, on_enter);
    self->thread_time = thread_time;
    self->active = 0;
    return 0;
}

static int Iteration_traverse(IterationObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->recorder);
    Py_VISIT(self->warn);
    Py_VISIT(self->index);
    Py_VISIT(self->env_steps);
    Py_VISIT(self->on_enter);
    return 0;
}

static int Iteration_clear(IterationObject *self) {
    Py_CLEAR(self->key);
    Py_CLEAR(self->recorder);
    Py_CLEAR(self->warn);
    Py_CLEAR(self->timeline);
    Py_CLEAR(self->index);
    Py_CLEAR(self->env_steps);
    Py_CLEAR(self->on_enter);
    return 0;
}

static void Iteration_dealloc(IterationObject *self) {
    PyObject_GC_UnTrack(self);
    Iteration_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* An iteration's start or end mark (`kind`) into the lane. */
static void iteration_mark(IterationObject *self, LaneObject *lane, uint8_t kind, long long time_ns) {
    LaneRecord *rec = shm_next(lane);
    if (rec == NULL) return;
    rec->kind = kind;
    rec->name = self->timeline_id;
    rec->start = time_ns;
    rec->end = self->thread_time ? thread_cpu_ns() : -1;
    rec->a = as_int64(self->index, -1);
    rec->b = self->env_steps == Py_None ? NO_STEPS : as_int64(self->env_steps, NO_STEPS);
    rec->depth = (int16_t)lane->depth;  /* phases open at the mark: the iteration's phases sit at this depth */
    rec->exc = -1;
    shm_commit(lane);
}

static PyObject *Iteration_enter(IterationObject *self, PyObject *unused) {
    LaneObject *lane = entering_lane(self->key, self->recorder);
    if (lane == NULL) return NULL;
    PyObject *open = PyDict_GetItemWithError(lane->open_iterations, self->timeline); /* borrowed */
    if (open != NULL) {
        PyObject *r = misuse(self->warn, "twice", (PyObject *)self, open);
        if (r == NULL) return NULL;
        Py_DECREF(r);
        return Py_NewRef(self);
    }
    if (PyErr_Occurred()) return NULL;
    self->timeline_id = shm_intern(lane, self->timeline);
    if (self->timeline_id == INTERRUPTED) return NULL;
    if (PyDict_SetItem(lane->open_iterations, self->timeline, (PyObject *)self) < 0) return NULL;
    self->active = 1;
    if (self->on_enter != Py_None) {
        PyObject *r = PyObject_CallOneArg(self->on_enter, (PyObject *)self);
        if (r == NULL) return NULL;
        Py_DECREF(r);
    }
    iteration_mark(self, lane, RECORD_KIND_ITERATION_START, now_ns());
    return Py_NewRef(self);
}

static PyObject *Iteration_exit(IterationObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long end = now_ns();
    if (!self->active) Py_RETURN_FALSE;
    self->active = 0;
    LaneObject *lane = lookup_lane(self->key);
    PyObject *open = lane == NULL ? NULL : PyDict_GetItemWithError(lane->open_iterations, self->timeline);
    if (open != (PyObject *)self) {
        if (PyErr_Occurred()) return NULL;
        return misuse(self->warn, "foreign", (PyObject *)self, NULL);
    }
    if (PyDict_DelItem(lane->open_iterations, self->timeline) < 0) return NULL;
    iteration_mark(self, lane, RECORD_KIND_ITERATION_END, end);
    Py_RETURN_FALSE;
}

static PyMethodDef Iteration_methods[] = {
    {"__enter__", (PyCFunction)Iteration_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))Iteration_exit, METH_FASTCALL, NULL},
    {NULL}
};

static PyMemberDef Iteration_members[] = {
    {"timeline", T_OBJECT_EX, offsetof(IterationObject, timeline), READONLY, NULL},
    {"index", T_OBJECT_EX, offsetof(IterationObject, index), READONLY, NULL},
    {"env_steps", T_OBJECT_EX, offsetof(IterationObject, env_steps), READONLY, NULL},
    {NULL}
};

static PyTypeObject IterationType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_rl.training._hotpath.Iteration",
    .tp_basicsize = sizeof(IterationObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Enter/exit of one cycle: start and end marks into the calling thread's lane.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Iteration_init,
    .tp_dealloc = (destructor)Iteration_dealloc,
    .tp_traverse = (traverseproc)Iteration_traverse,
    .tp_clear = (inquiry)Iteration_clear,
    .tp_methods = Iteration_methods,
    .tp_members = Iteration_members,
};

/* Room for a frame of `size` bytes (header included, a multiple of 8) in a segment's message ring
 * at `ring` (layout in otel_rl/shm/segment.py): where to write it, or NULL (counted as dropped)
 * when the ring has less than that free under `limit`. commit_frame publishes it. */
static char *reserve_frame(char *ring, uint64_t cap, uint64_t size, uint64_t limit, uint64_t *end) {
    RingHeader *header = (RingHeader *)ring;
    uint64_t *write = &header->write, *read = &header->read, *dropped = &header->dropped;
    char *data = ring + RING_HEADER_BYTES;
    uint64_t w = *write, r = __atomic_load_n(read, __ATOMIC_ACQUIRE), pos = w % cap;
    uint64_t skip = pos + size > cap ? cap - pos : 0;
    uint64_t room = limit < cap ? limit : cap;
    if (w + skip + size - r > room) {
        __atomic_store_n(dropped, *dropped + 1, __ATOMIC_RELAXED);
        return NULL;
    }
    if (skip) {
        if (skip >= sizeof(FrameHeader)) memset(data + pos, 0, sizeof(FrameHeader));  /* a SKIP frame: length 0, kind 0 */
        w += skip;
        pos = 0;
    }
    *end = w + size;
    return data + pos;
}

static void commit_frame(char *ring, uint64_t end) {
    __atomic_store_n((uint64_t *)ring, end, __ATOMIC_RELEASE);
}

/* The ring at `offset` of a writable buffer view, or NULL with an error set. */
static char *ring_of(Py_buffer *view, Py_ssize_t offset, Py_ssize_t capacity) {
    if (offset < 0 || offset % 8 || capacity < 64 || capacity % 8 || view->len < offset + RING_HEADER_BYTES + capacity) {
        PyErr_SetString(PyExc_ValueError, "not a message ring of this buffer");
        return NULL;
    }
    return (char *)view->buf + offset;
}

/* put_frame(buffer, ring_offset, capacity, kind, payload, limit) -> bool: one frame into a
 * message ring of a segment. Nothing here releases the GIL, so the threads of this process
 * append one at a time without a lock. */
static PyObject *put_frame(PyObject *module, PyObject *args) {
    PyObject *buffer;
    Py_ssize_t offset, capacity, limit;
    unsigned int kind;
    Py_buffer payload;
    if (!PyArg_ParseTuple(args, "OnnIy*n", &buffer, &offset, &capacity, &kind, &payload, &limit)) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(buffer, &view, PyBUF_WRITABLE) < 0) { PyBuffer_Release(&payload); return NULL; }
    PyObject *result = NULL;
    char *ring = ring_of(&view, offset, capacity);
    if (ring != NULL && payload.len > 0x7fffffff) PyErr_SetString(PyExc_ValueError, "payload too large");
    else if (ring != NULL) {
        uint64_t size = sizeof(FrameHeader) + (uint64_t)payload.len, end;
        size += (8 - size % 8) % 8;
        char *at = reserve_frame(ring, (uint64_t)capacity, size, (uint64_t)limit, &end);
        if (at == NULL) result = Py_NewRef(Py_False);
        else {
            FrameHeader header = {(uint32_t)payload.len, kind};
            memcpy(at, &header, sizeof header);
            memcpy(at + sizeof header, payload.buf, (size_t)payload.len);
            commit_frame(ring, end);
            result = Py_NewRef(Py_True);
        }
    }
    PyBuffer_Release(&view);
    PyBuffer_Release(&payload);
    return result;
}

static int optional_int64(PyObject *obj, int64_t *out) {
    if (obj == Py_None) { *out = INT64_MIN; return 1; }
    if (!PyLong_CheckExact(obj)) return 0;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred()) || v == INT64_MIN) { PyErr_Clear(); return 0; }
    *out = v;
    return 1;
}

/* put_scalars(buffer, ring_offset, capacity, limit, kind, time_ns, values, step, iteration,
 * env_steps, key_ids, intern) -> True, False (ring full) or None (not plain: encode it another way).
 * Keys must be exact str (ids from key_ids, else intern(key)), values float, int (64-bit), bool or
 * None. Every key is looked up before the ring is touched: intern() runs Python code. */
static PyObject *put_scalars(PyObject *module, PyObject *args) {
    PyObject *buffer, *values, *step, *iteration, *env_steps, *key_ids, *intern;
    Py_ssize_t offset, capacity, limit;
    unsigned int kind;
    long long time_ns;
    if (!PyArg_ParseTuple(args, "OnnnILO!OOOO!O", &buffer, &offset, &capacity, &limit, &kind, &time_ns,
                          &PyDict_Type, &values, &step, &iteration, &env_steps, &PyDict_Type, &key_ids, &intern))
        return NULL;
    ScalarsHeader header = {time_ns, 0, 0, 0, 0, 0};
    if (!optional_int64(step, &header.step) || !optional_int64(iteration, &header.iteration)
        || !optional_int64(env_steps, &header.env_steps))
        Py_RETURN_NONE;
    Py_ssize_t n = PyDict_GET_SIZE(values);
    ScalarEntry *entries = PyMem_Calloc(n ? (size_t)n : 1, sizeof(ScalarEntry));
    if (entries == NULL) return PyErr_NoMemory();
    PyObject *key, *value, *result = NULL;
    Py_ssize_t pos = 0, i = 0;
    int plain = 1;
    while (plain && PyDict_Next(values, &pos, &key, &value)) {
        ScalarEntry *e = &entries[i++];
        if (!PyUnicode_CheckExact(key)) { plain = 0; break; }
        if (PyFloat_CheckExact(value)) { e->tag = VALUE_TAG_FLOAT; e->value.f = PyFloat_AS_DOUBLE(value); }
        else if (value == Py_None) e->tag = VALUE_TAG_NONE;
        else if (PyBool_Check(value)) { e->tag = VALUE_TAG_BOOL; e->value.i = value == Py_True; }
        else if (PyLong_CheckExact(value)) {
            int overflow;
            long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
            if (overflow || (v == -1 && PyErr_Occurred())) { PyErr_Clear(); plain = 0; break; }
            e->tag = VALUE_TAG_INT;
            e->value.i = v;
        } else { plain = 0; break; }
    }
    if (!plain) { result = Py_NewRef(Py_None); goto done; }
    /* Key ids (values are checked: nothing above ran Python code; intern() below may). */
    pos = 0; i = 0;
    while (PyDict_Next(values, &pos, &key, &value)) {
        Py_INCREF(key);
        PyObject *id = PyDict_GetItemWithError(key_ids, key);
        if (id != NULL) Py_INCREF(id);
        else if (!PyErr_Occurred()) id = PyObject_CallOneArg(intern, key);
        Py_DECREF(key);
        if (id == NULL) goto done;
        long v = PyLong_AsLong(id);
        Py_DECREF(id);
        if (v == -1 && PyErr_Occurred()) goto done;
        if (v < 0) { result = Py_NewRef(Py_None); goto done; }  /* the string table is full */
        entries[i++].key = (uint32_t)v;
        if (i == n) break;
    }
    if (i != n) { result = Py_NewRef(Py_None); goto done; }  /* the dict changed under intern() */
    header.count = (uint32_t)n;
    Py_buffer view;
    if (PyObject_GetBuffer(buffer, &view, PyBUF_WRITABLE) < 0) goto done;
    char *ring = ring_of(&view, offset, capacity);
    if (ring != NULL) {
        uint64_t length = sizeof(ScalarsHeader) + (uint64_t)n * sizeof(ScalarEntry), end;
        char *at = reserve_frame(ring, (uint64_t)capacity, sizeof(FrameHeader) + length, (uint64_t)limit, &end);
        if (at == NULL) result = Py_NewRef(Py_False);
        else {
            FrameHeader frame = {(uint32_t)length, kind};
            memcpy(at, &frame, sizeof frame);
            memcpy(at + sizeof frame, &header, sizeof(ScalarsHeader));
            memcpy(at + sizeof frame + sizeof(ScalarsHeader), entries, (size_t)n * sizeof(ScalarEntry));
            commit_frame(ring, end);
            result = Py_NewRef(Py_True);
        }
    }
    PyBuffer_Release(&view);
done:
    PyMem_Free(entries);
    return result;
}

static PyObject *monotonic_ns(PyObject *module, PyObject *unused) {
    return PyLong_FromLongLong(now_ns());
}

static PyMethodDef module_methods[] = {
    {"monotonic_ns", monotonic_ns, METH_NOARGS, "The clock this module stamps phases with."},
    {"put_frame", put_frame, METH_VARARGS, "Append one frame to a segment's message ring; False when it is full."},
    {"put_scalars", put_scalars, METH_VARARGS, "Append a packed scalars record; False when the ring is full, None when not plain."},
    {"current_lane", current_lane, METH_O, "The calling thread's lane for a key, or None."},
    {"bind_lane", bind_lane, METH_VARARGS, "Make a lane the calling thread's lane for a key."},
    {NULL}
};

static struct PyModuleDef hotpath_module = {
    PyModuleDef_HEAD_INIT, "otel_rl.training._hotpath", "C hot path of the phase recorder.", -1, module_methods,
};

PyMODINIT_FUNC PyInit__hotpath(void) {
    if (PyType_Ready(&LaneType) < 0 || PyType_Ready(&PhaseType) < 0 || PyType_Ready(&IterationType) < 0) return NULL;
    PyObject *m = PyModule_Create(&hotpath_module);
    if (m == NULL) return NULL;
    if (PyModule_AddObject(m, "layout", layout_of_build()) < 0) { Py_DECREF(m); return NULL; }
    Py_INCREF(&LaneType);
    if (PyModule_AddObject(m, "Lane", (PyObject *)&LaneType) < 0) { Py_DECREF(&LaneType); Py_DECREF(m); return NULL; }
    Py_INCREF(&PhaseType);
    if (PyModule_AddObject(m, "Phase", (PyObject *)&PhaseType) < 0) { Py_DECREF(&PhaseType); Py_DECREF(m); return NULL; }
    Py_INCREF(&IterationType);
    if (PyModule_AddObject(m, "Iteration", (PyObject *)&IterationType) < 0) { Py_DECREF(&IterationType); Py_DECREF(m); return NULL; }
    return m;
}
