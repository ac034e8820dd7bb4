/* A segment's mapping that survives its file being shrunk by another process.
 *
 * A store to (or load from) a page of a shared file mapping past the file's
 * end raises SIGBUS, which kills the process: another process of the same
 * user truncating /dev/shm/otel-rl-<uid>/.../<segment>.seg would kill
 * training. protect() registers a mapping and a descriptor of its file; the
 * SIGBUS handler installed with the first one gives a fault inside a
 * registered mapping its file's length back (ftruncate is async-signal-safe;
 * the pages lost read as zeros) and returns, so the access is retried and
 * succeeds. faults() tells how often that happened: the owner then stops
 * trusting the segment. A fault anywhere else goes to the handler that was
 * there before (the default one: the process dies as it would have).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_GUARDED 1024

typedef struct {
    volatile sig_atomic_t used;
    uintptr_t start;
    size_t length;
    int fd;
    volatile sig_atomic_t faults;
} Guarded;

static Guarded guarded[MAX_GUARDED];
static struct sigaction previous;
static int installed = 0;

static void on_sigbus(int signum, siginfo_t *info, void *context) {
    uintptr_t address = (uintptr_t)info->si_addr;
    for (int i = 0; i < MAX_GUARDED; i++) {
        Guarded *g = &guarded[i];
        if (!g->used || address < g->start || address >= g->start + g->length) continue;
        g->faults++;
        if (ftruncate(g->fd, (off_t)g->length) != 0) {
            /* The file cannot be given its length back: private zeroed memory in its place keeps the process alive. */
            mmap((void *)g->start, g->length, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        }
        return;
    }
    /* Not a segment's: what would have happened without us. */
    sigaction(SIGBUS, &previous, NULL);
    if (!(previous.sa_flags & SA_SIGINFO) && (previous.sa_handler == SIG_DFL || previous.sa_handler == SIG_IGN)) {
        signal(SIGBUS, SIG_DFL);
        raise(SIGBUS);
        return;
    }
    if (previous.sa_flags & SA_SIGINFO) previous.sa_sigaction(signum, info, context);
    else previous.sa_handler(signum);
}

static int install(void) {
    if (installed) return 0;
    struct sigaction action;
    memset(&action, 0, sizeof(action));
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGBUS, &action, &previous) != 0) return -1;
    installed = 1;
    return 0;
}

/* protect(buffer, fd) -> None: guard the mapping that `buffer` (a writable buffer over the whole mapping) is. */
static PyObject *protect(PyObject *module, PyObject *args) {
    PyObject *buffer;
    int fd;
    if (!PyArg_ParseTuple(args, "Oi", &buffer, &fd)) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(buffer, &view, PyBUF_WRITABLE) != 0) return NULL;
    uintptr_t start = (uintptr_t)view.buf;
    size_t length = (size_t)view.len;
    PyBuffer_Release(&view);
    if (install() != 0) return PyErr_SetFromErrno(PyExc_OSError);
    int slot = -1;
    for (int i = 0; i < MAX_GUARDED; i++) {
        if (guarded[i].used && guarded[i].start == start) { /* a mapping at the address of one gone unreleased */
            guarded[i].used = 0;
            slot = i;
            break;
        }
        if (!guarded[i].used && slot < 0) slot = i;
    }
    if (slot >= 0) {
        Guarded *g = &guarded[slot];
        g->start = start;
        g->length = length;
        g->fd = fd;
        g->faults = 0;
        g->used = 1; /* last: the handler trusts nothing before it */
        Py_RETURN_NONE;
    }
    PyErr_SetString(PyExc_RuntimeError, "too many guarded segments in this process");
    return NULL;
}

static Guarded *find(PyObject *args) {
    unsigned long long start;
    if (!PyArg_ParseTuple(args, "K", &start)) return NULL;
    for (int i = 0; i < MAX_GUARDED; i++) {
        if (guarded[i].used && guarded[i].start == (uintptr_t)start) return &guarded[i];
    }
    PyErr_SetString(PyExc_KeyError, "not a guarded mapping");
    return NULL;
}

/* faults(start) -> int: how often the mapping at `start` faulted past its file's end. */
static PyObject *faults(PyObject *module, PyObject *args) {
    Guarded *g = find(args);
    return g == NULL ? NULL : PyLong_FromLong((long)g->faults);
}

/* release(start) -> None: no longer guard the mapping at `start` (before it is unmapped). */
static PyObject *release(PyObject *module, PyObject *args) {
    Guarded *g = find(args);
    if (g == NULL) return NULL;
    g->used = 0;
    Py_RETURN_NONE;
}

/* address(buffer) -> int: where a buffer starts, the key of faults() and release(). */
static PyObject *address(PyObject *module, PyObject *args) {
    PyObject *buffer;
    if (!PyArg_ParseTuple(args, "O", &buffer)) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE) != 0) return NULL;
    uintptr_t start = (uintptr_t)view.buf;
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong((unsigned long long)start);
}

static PyMethodDef methods[] = {
    {"protect", protect, METH_VARARGS, "Guard a segment's mapping (a writable buffer) with a descriptor of its file."},
    {"faults", faults, METH_VARARGS, "How often a guarded mapping faulted past its file's end."},
    {"release", release, METH_VARARGS, "Stop guarding a mapping."},
    {"address", address, METH_VARARGS, "Where a buffer starts."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_guard", "Mappings that survive their file being shrunk.", -1, methods};

PyMODINIT_FUNC PyInit__guard(void) { return PyModule_Create(&module); }
