/*
 * The protocol's scalars lines of a stretch of calls of one key set, in C.
 *
 * A loop that calls scalars() every iteration makes thousands of lines a
 * second. Built in Python, each costs a dictionary of its values, another of
 * the record and a JSON encoding: the largest part of the agent's CPU. Here
 * the floats are not formatted at all: orjson formats each column of a run
 * (the times, the values) in one call, and this splices those numbers between
 * the record's fixed parts and the keys. The result is, byte for byte, what
 * orjson.dumps gives for the record's dictionary (scalars_record in
 * otel_rl/formats/protocol.py, whose field order this writes);
 * otel_rl/outputs/motrix/scalar_lines.py is the pure-Python twin used when
 * this module is not built, and the tests compare the two.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

typedef struct {
    char *data;
    Py_ssize_t length, capacity;
} Buffer;

static int reserve(Buffer *buffer, Py_ssize_t more) {
    if (buffer->length + more <= buffer->capacity) return 0;
    Py_ssize_t capacity = (buffer->length + more) * 2;
    char *data = PyMem_Realloc(buffer->data, capacity);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    buffer->data = data;
    buffer->capacity = capacity;
    return 0;
}

static int put(Buffer *buffer, const char *text, Py_ssize_t length) {
    if (reserve(buffer, length) < 0) return -1;
    memcpy(buffer->data + buffer->length, text, length);
    buffer->length += length;
    return 0;
}

#define PUT_LITERAL(buffer, text) put(buffer, text, sizeof(text) - 1)

/* An int (as orjson writes it: decimal) or None ("null"). */
static int put_int(Buffer *buffer, PyObject *value) {
    if (value == Py_None) return PUT_LITERAL(buffer, "null");
    int overflow;
    long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow) {
        PyErr_SetString(PyExc_OverflowError, "an axis past 64 bits");
        return -1;
    }
    if (number == -1 && PyErr_Occurred()) return -1;
    char text[24], *end = text + sizeof text, *p = end;
    unsigned long long magnitude = number < 0 ? 0ULL - (unsigned long long)number : (unsigned long long)number;
    do {
        *--p = (char)('0' + magnitude % 10);
        magnitude /= 10;
    } while (magnitude);
    if (number < 0) *--p = '-';
    return put(buffer, p, end - p);
}

/* The longest number orjson writes (-1.7976931348623157e+308 is 24 characters). */
#define MAX_NUMBER 32

/* Copies the next number of a JSON array of numbers at *cursor into the buffer (room reserved by the
 * caller); *cursor then points past the ',' or ']' after it. */
static int copy_number(Buffer *buffer, const char **cursor, const char *end) {
    const char *start = *cursor, *p = start, *stop = end - start > MAX_NUMBER ? start + MAX_NUMBER : end;
#ifdef __SSE2__
    if (stop - start == MAX_NUMBER) {  /* the common case: two 16-byte compares find the end of the number */
        const __m128i comma = _mm_set1_epi8(','), bracket = _mm_set1_epi8(']');
        __m128i low = _mm_loadu_si128((const __m128i *)start), high = _mm_loadu_si128((const __m128i *)(start + 16));
        unsigned mask = (unsigned)_mm_movemask_epi8(_mm_or_si128(_mm_cmpeq_epi8(low, comma), _mm_cmpeq_epi8(low, bracket))) |
                        (unsigned)_mm_movemask_epi8(_mm_or_si128(_mm_cmpeq_epi8(high, comma), _mm_cmpeq_epi8(high, bracket))) << 16;
        p = mask ? start + __builtin_ctz(mask) : stop;
    } else
#endif
        while (p < stop && *p != ',' && *p != ']') p++;
    if (p == stop || p == start) {
        PyErr_SetString(PyExc_ValueError, "not a JSON array of numbers");
        return -1;
    }
    memcpy(buffer->data + buffer->length, start, p - start);
    buffer->length += p - start;
    *cursor = p + 1;
    return 0;
}

static int expect(const char **cursor, const char *end, char c) {
    if (*cursor >= end || **cursor != c) {
        PyErr_Format(PyExc_ValueError, "expected '%c' in a JSON array", c);
        return -1;
    }
    (*cursor)++;
    return 0;
}

/* One line: head, seq, ts, step, axes, then the row's values after their keys (``keys_length``: their sum). */
static int put_line(Buffer *line, const char *head, Py_ssize_t head_length, PyObject *seq, const char **ts, const char *ts_end,
                    PyObject *step, PyObject *env_steps, PyObject *iteration, PyObject *keys, Py_ssize_t keys_length,
                    const char **row, const char *end) {
    Py_ssize_t count = PyTuple_GET_SIZE(keys);
    if (reserve(line, head_length + 256 + keys_length + count * (MAX_NUMBER + 1)) < 0 || put(line, head, head_length) < 0 ||
        put_int(line, seq) < 0 || PUT_LITERAL(line, ",\"ts\":") < 0 || copy_number(line, ts, ts_end) < 0 ||
        PUT_LITERAL(line, ",\"kind\":\"scalars\",\"step\":") < 0 || put_int(line, step == Py_None ? env_steps : step) < 0 ||
        PUT_LITERAL(line, ",\"axes\":{\"env_steps\":") < 0 || put_int(line, env_steps) < 0 || PUT_LITERAL(line, ",\"iteration\":") < 0 ||
        put_int(line, iteration) < 0 || PUT_LITERAL(line, "},\"values\":{") < 0 || expect(row, end, '[') < 0)
        return -1;
    if (count == 0 && expect(row, end, ']') < 0) return -1;
    for (Py_ssize_t k = 0; k < count; k++) {  /* room for all of it was reserved above */
        PyObject *key = PyTuple_GET_ITEM(keys, k);
        if (k) line->data[line->length++] = ',';
        memcpy(line->data + line->length, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key));
        line->length += PyBytes_GET_SIZE(key);
        if (copy_number(line, row, end) < 0) return -1;
    }
    return PUT_LITERAL(line, "}}");
}

/* scalar_lines(kind, head, keys, seqs, ts, steps, env_steps, iterations, values) -> [(kind, line), ...]
 *
 * head: the record up to its seq ('{"run_id":...,"writer":...,"seq":'); keys: each key's JSON string and
 * its colon, as bytes; seqs and the axes: lists of ints or None, one per call (step None: the env steps);
 * ts: the calls' times as one orjson array; values: the calls' rows as one orjson array of arrays. */
static PyObject *scalar_lines(PyObject *module, PyObject *args) {
    PyObject *kind, *keys, *seqs, *steps, *env_steps, *iterations;
    const char *head, *ts, *values;
    Py_ssize_t head_length, ts_length, values_length;
    if (!PyArg_ParseTuple(args, "Uy#O!O!y#O!O!O!y#", &kind, &head, &head_length, &PyTuple_Type, &keys, &PyList_Type, &seqs, &ts,
                          &ts_length, &PyList_Type, &steps, &PyList_Type, &env_steps, &PyList_Type, &iterations, &values, &values_length))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(seqs);
    if (PyList_GET_SIZE(steps) != n || PyList_GET_SIZE(env_steps) != n || PyList_GET_SIZE(iterations) != n) {
        PyErr_SetString(PyExc_ValueError, "columns of different lengths");
        return NULL;
    }
    Py_ssize_t keys_length = 0;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(keys); k++) {
        PyObject *key = PyTuple_GET_ITEM(keys, k);
        if (!PyBytes_Check(key)) {
            PyErr_SetString(PyExc_TypeError, "keys must be bytes");
            return NULL;
        }
        keys_length += PyBytes_GET_SIZE(key) + 1;
    }
    const char *ts_cursor = ts, *ts_end = ts + ts_length, *row = values, *values_end = values + values_length;
    if (expect(&ts_cursor, ts_end, '[') < 0 || expect(&row, values_end, '[') < 0) return NULL;
    Buffer line = {NULL, 0, 0};
    PyObject *lines = PyList_New(n);
    for (Py_ssize_t i = 0; lines != NULL && i < n; i++) {
        line.length = 0;
        PyObject *item = NULL;
        if (put_line(&line, head, head_length, PyList_GET_ITEM(seqs, i), &ts_cursor, ts_end, PyList_GET_ITEM(steps, i),
                     PyList_GET_ITEM(env_steps, i), PyList_GET_ITEM(iterations, i), keys, keys_length, &row, values_end) == 0 &&
            expect(&row, values_end, i + 1 < n ? ',' : ']') == 0) {
            PyObject *text = PyUnicode_DecodeUTF8(line.data, line.length, "strict");
            item = text == NULL ? NULL : PyTuple_Pack(2, kind, text);
            Py_XDECREF(text);
        }
        if (item == NULL) {
            Py_CLEAR(lines);
            break;
        }
        PyList_SET_ITEM(lines, i, item);
    }
    PyMem_Free(line.data);
    return lines;
}

static PyMethodDef methods[] = {
    {"scalar_lines", scalar_lines, METH_VARARGS, "The protocol's scalars lines of a stretch of calls of one key set."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_lines", NULL, -1, methods};

PyMODINIT_FUNC PyInit__lines(void) { return PyModule_Create(&module); }
