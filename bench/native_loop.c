/* Greedy decoding of one sentence with the loop in C: what bench/native_loop.py times against
 * the product's Python loop.
 *
 * Between two decoder steps nothing but this function runs: it writes the fed token and its
 * position into the arrays the step's IO binding reads, calls the session's
 * run_with_iobinding (a public method of ONNX Runtime's Python binding, through the CPython
 * API: no bytecode is interpreted), and reads the best next token from the bound output. No
 * numpy function and no interpreter loop touches the core's caches between two graph runs.
 *
 * greedy(run, target_ids, positions, top_ids, top_log_probs, token, position, limit, eos,
 *        force_eos_at_limit) -> (tokens, log_prob)
 *   run: a callable that runs one step over the binding (no arguments);
 *   target_ids [1, 1] int64, positions [1] int64: bound inputs, written here;
 *   top_ids [1, k] int64, top_log_probs [1, k] float32: bound outputs, read here;
 *   token: the next token to feed, at `position` (the number of tokens produced so far);
 *   limit: the most tokens the sentence may produce, </s> included;
 *   returns the tokens produced from `position` on (</s> included when it ended) and the sum
 *   of their log-probs. The rules are the product's greedy search without the repetition
 *   guard (service/runtime/strategies.py): at the limit, </s> with log-prob 0 when the
 *   bundle forces it, otherwise the sentence just stops.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static int writable(PyObject *array, Py_buffer *view, Py_ssize_t itemsize) {
    if (PyObject_GetBuffer(array, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (view->itemsize != itemsize || view->len < itemsize) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_TypeError, "an array of the wrong type or size");
        return -1;
    }
    return 0;
}

static PyObject *greedy(PyObject *self, PyObject *args) {
    PyObject *run, *target_array, *position_array, *ids_array, *log_prob_array;
    long long token, eos;
    Py_ssize_t position, limit;
    int force_eos_at_limit;
    if (!PyArg_ParseTuple(args, "OOOOOLnnLp", &run, &target_array, &position_array, &ids_array,
                          &log_prob_array, &token, &position, &limit, &eos, &force_eos_at_limit))
        return NULL;
    Py_buffer target, positions, ids, log_probs;
    if (writable(target_array, &target, 8) < 0) return NULL;
    if (writable(position_array, &positions, 8) < 0) goto release_target;
    if (writable(ids_array, &ids, 8) < 0) goto release_positions;
    if (writable(log_prob_array, &log_probs, 4) < 0) goto release_ids;

    PyObject *tokens = PyList_New(0);
    double total = 0.0;
    int failed = tokens == NULL;
    for (; !failed && position < limit; position++) {
        ((int64_t *)target.buf)[0] = token;
        ((int64_t *)positions.buf)[0] = position;
        PyObject *ran = PyObject_CallNoArgs(run);
        if (ran == NULL) {
            failed = 1;
            break;
        }
        Py_DECREF(ran);
        token = ((int64_t *)ids.buf)[0];
        double log_prob = ((float *)log_probs.buf)[0];
        if (force_eos_at_limit && position + 1 >= limit) {
            token = eos;
            log_prob = 0.0;
        }
        total += log_prob;
        PyObject *item = PyLong_FromLongLong(token);
        failed = item == NULL || PyList_Append(tokens, item) < 0;
        Py_XDECREF(item);
        if (token == eos) break;
    }

    PyBuffer_Release(&log_probs);
    PyBuffer_Release(&ids);
    PyBuffer_Release(&positions);
    PyBuffer_Release(&target);
    if (failed) {
        Py_XDECREF(tokens);
        return NULL;
    }
    return Py_BuildValue("(Nd)", tokens, total);

release_ids:
    PyBuffer_Release(&ids);
release_positions:
    PyBuffer_Release(&positions);
release_target:
    PyBuffer_Release(&target);
    return NULL;
}

static PyMethodDef methods[] = {
    {"greedy", greedy, METH_VARARGS, "Greedy decoding of one sentence, the loop in C."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "native_loop", NULL, -1, methods};

PyMODINIT_FUNC PyInit_native_loop(void) { return PyModule_Create(&module); }
