/* The intent classifier's hashed features and its linear layer, compiled.
 *
 * A short prompt's features cost numpy about fifty microseconds in per-call overhead alone
 * (a dozen array operations and a sort for the counts) and the classifier's dot product
 * another forty; here the whole path is one pass over the code points, a counting table and
 * the weight rows, a few microseconds. features.py documents what the features are; this file
 * is their only implementation, used by training and by the gateway alike.
 *
 * Every call runs with the GIL held (it is short), so the module's scratch buffers are safe:
 * nothing that could run other Python code (a collection allocating a tracked object) happens
 * between counting a text's features and clearing the counts.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BUCKET_BITS 17
#define BUCKETS (1u << BUCKET_BITS)
#define CHAR_NGRAM_MAX 3
#define EDGE_CHARS 100
#define START_MARK 0x02
#define END_MARK 0x03

static const uint64_t STEP = 0x100000001B3ull; /* the 64-bit FNV prime */
static const uint64_t MIX = 0x9E3779B97F4A7C15ull; /* 2**64 / golden ratio, odd */

/* Seeds keep each kind of feature's hashes apart: crc32(kind) << 32, set at module load. */
static uint64_t char_seeds[CHAR_NGRAM_MAX + 1];
static uint64_t head_seeds[CHAR_NGRAM_MAX + 1];
static uint64_t tail_seeds[CHAR_NGRAM_MAX + 1];
static uint64_t word_seed;
static uint64_t bigram_seed;

static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[n] = c;
    }
}

/* zlib's crc32, fed one byte at a time; start with 0xFFFFFFFF, finish by inverting. */
static inline uint32_t crc_byte(uint32_t crc, uint8_t byte) {
    return crc_table[(crc ^ byte) & 0xFF] ^ (crc >> 8);
}

static uint32_t crc_utf8(uint32_t crc, Py_UCS4 c) {
    if (c < 0x80) return crc_byte(crc, (uint8_t)c);
    if (c < 0x800) {
        crc = crc_byte(crc, (uint8_t)(0xC0 | (c >> 6)));
        return crc_byte(crc, (uint8_t)(0x80 | (c & 0x3F)));
    }
    if (c < 0x10000) {
        crc = crc_byte(crc, (uint8_t)(0xE0 | (c >> 12)));
        crc = crc_byte(crc, (uint8_t)(0x80 | ((c >> 6) & 0x3F)));
        return crc_byte(crc, (uint8_t)(0x80 | (c & 0x3F)));
    }
    crc = crc_byte(crc, (uint8_t)(0xF0 | (c >> 18)));
    crc = crc_byte(crc, (uint8_t)(0x80 | ((c >> 12) & 0x3F)));
    crc = crc_byte(crc, (uint8_t)(0x80 | ((c >> 6) & 0x3F)));
    return crc_byte(crc, (uint8_t)(0x80 | (c & 0x3F)));
}

static uint64_t seed_of(const char *kind) {
    uint32_t crc = 0xFFFFFFFFu;
    for (const char *p = kind; *p; p++) crc = crc_byte(crc, (uint8_t)*p);
    return (uint64_t)(crc ^ 0xFFFFFFFFu) << 32;
}

/* features.py's _WORD: [0-9a-z\u00df-\u024f]+ */
static inline int is_word_char(Py_UCS4 c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 0xDF && c <= 0x24F);
}

static inline uint32_t bucket_of(uint64_t hash, uint64_t seed) {
    return (uint32_t)(((hash + seed) * MIX) >> (64 - BUCKET_BITS));
}

/* Scratch, grown as needed and kept: counts per bucket (zero between calls) and the list of
 * distinct buckets of the current text. */
static uint32_t *counts;
static uint32_t *distinct;
static Py_ssize_t distinct_capacity;
static uint64_t *grams; /* the current n-gram hashes, one per position */
static Py_ssize_t grams_capacity;

static int reserve(Py_ssize_t size) {
    if (counts == NULL) {
        counts = calloc(BUCKETS, sizeof *counts);
        if (counts == NULL) return -1;
    }
    if (size > grams_capacity) {
        uint64_t *g = realloc(grams, (size_t)size * sizeof *grams);
        if (g == NULL) return -1;
        grams = g;
        grams_capacity = size;
    }
    return 0;
}

static Py_ssize_t n_distinct;

static int add(uint32_t bucket) {
    if (counts[bucket]++ == 0) {
        if (n_distinct == distinct_capacity) {
            Py_ssize_t capacity = distinct_capacity ? distinct_capacity * 2 : 1024;
            uint32_t *d = realloc(distinct, (size_t)capacity * sizeof *distinct);
            if (d == NULL) return -1;
            distinct = d;
            distinct_capacity = capacity;
        }
        distinct[n_distinct++] = bucket;
    }
    return 0;
}

static void clear_counts(void) {
    for (Py_ssize_t i = 0; i < n_distinct; i++) counts[distinct[i]] = 0;
    n_distinct = 0;
}

/* Count every feature of normalised text into counts/distinct; -1 with an exception set. */
static int count_features(PyObject *text) {
    if (PyUnicode_READY(text) < 0) return -1;
    const int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    const Py_ssize_t length = PyUnicode_GET_LENGTH(text);
    const Py_ssize_t size = length + 2; /* with the start and end marks */
    if (reserve(size) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    n_distinct = 0;
#define POINT(i) \
    ((i) == 0 ? START_MARK : (i) == size - 1 ? END_MARK : PyUnicode_READ(kind, data, (i) - 1))
    for (Py_ssize_t i = 0; i < size; i++) grams[i] = POINT(i);
    for (int n = 1; n <= CHAR_NGRAM_MAX; n++) {
        if (n > 1) {
            /* grams[i] becomes the hash of the n-gram starting at i, in place. */
            for (Py_ssize_t i = 0; i + n <= size; i++) grams[i] = grams[i] * STEP + POINT(i + n - 1);
        }
        const Py_ssize_t count = size - n + 1;
        if (count <= 0) break;
        const Py_ssize_t edge = size < EDGE_CHARS ? size : EDGE_CHARS;
        const Py_ssize_t head = edge - n + 1 > 0 ? edge - n + 1 : 0;
        const Py_ssize_t tail_from = size - EDGE_CHARS > 0 ? size - EDGE_CHARS : 0;
        for (Py_ssize_t i = 0; i < count; i++) {
            if (add(bucket_of(grams[i], char_seeds[n])) < 0) goto nomem;
            if (i < head && add(bucket_of(grams[i], head_seeds[n])) < 0) goto nomem;
            if (i >= tail_from && add(bucket_of(grams[i], tail_seeds[n])) < 0) goto nomem;
        }
    }
#undef POINT
    /* Words and word bigrams. */
    int have_previous = 0;
    uint64_t previous = 0;
    for (Py_ssize_t i = 0; i < length;) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (!is_word_char(c)) {
            i++;
            continue;
        }
        uint32_t crc = 0xFFFFFFFFu;
        while (i < length && is_word_char(c = PyUnicode_READ(kind, data, i))) {
            crc = crc_utf8(crc, c);
            i++;
        }
        uint64_t word = (uint64_t)(crc ^ 0xFFFFFFFFu);
        if (add(bucket_of(word, word_seed)) < 0) goto nomem;
        if (have_previous && add(bucket_of(previous * STEP + word, bigram_seed)) < 0) goto nomem;
        previous = word;
        have_previous = 1;
    }
    return 0;
nomem:
    clear_counts();
    PyErr_NoMemory();
    return -1;
}

static int compare_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* The weights of the distinct buckets, in distinct[] order: 1 + log(count), unit length. */
static void unit_weights(float *out) {
    float norm = 0.0f;
    for (Py_ssize_t i = 0; i < n_distinct; i++) {
        out[i] = logf((float)counts[distinct[i]]) + 1.0f;
        norm += out[i] * out[i];
    }
    norm = sqrtf(norm);
    for (Py_ssize_t i = 0; i < n_distinct; i++) out[i] /= norm;
}

static PyObject *text_arg(PyObject *arg) {
    if (!PyUnicode_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "text must be a str");
        return NULL;
    }
    return arg;
}

PyDoc_STRVAR(features_doc,
             "features(normalised_text) -> (ids, weights)\n\n"
             "The sorted distinct buckets (int64 bytes) and their unit-length weights "
             "(float32 bytes).");

static PyObject *features(PyObject *self, PyObject *arg) {
    if (text_arg(arg) == NULL || count_features(arg) < 0) return NULL;
    qsort(distinct, (size_t)n_distinct, sizeof *distinct, compare_u32);
    PyObject *ids = PyBytes_FromStringAndSize(NULL, n_distinct * (Py_ssize_t)sizeof(int64_t));
    PyObject *weights = PyBytes_FromStringAndSize(NULL, n_distinct * (Py_ssize_t)sizeof(float));
    if (ids == NULL || weights == NULL) {
        Py_XDECREF(ids);
        Py_XDECREF(weights);
        clear_counts();
        return NULL;
    }
    int64_t *id_out = (int64_t *)PyBytes_AS_STRING(ids);
    for (Py_ssize_t i = 0; i < n_distinct; i++) id_out[i] = distinct[i];
    unit_weights((float *)PyBytes_AS_STRING(weights));
    clear_counts();
    return Py_BuildValue("(NN)", ids, weights);
}

PyDoc_STRVAR(logits_doc,
             "logits(normalised_text, weights, bias) -> list[float]\n\n"
             "weights: C-contiguous float32 buffer of shape (BUCKETS, labels); bias: float32 "
             "(labels,). Returns bias + the features' weighted sum of weight rows.");

static PyObject *logits(PyObject *self, PyObject *args) {
    PyObject *text;
    Py_buffer weights, bias;
    if (!PyArg_ParseTuple(args, "Uy*y*", &text, &weights, &bias)) return NULL;
    PyObject *result = NULL;
    const Py_ssize_t labels = bias.len / (Py_ssize_t)sizeof(float);
    if (labels <= 0 || weights.len != (Py_ssize_t)BUCKETS * labels * (Py_ssize_t)sizeof(float)) {
        PyErr_SetString(PyExc_ValueError, "weights must be float32 (BUCKETS, labels), bias (labels,)");
        goto done;
    }
    if (count_features(text) < 0) goto done;
    float *values = PyMem_Malloc((size_t)(n_distinct ? n_distinct : 1) * sizeof(float));
    double *sums = PyMem_Calloc((size_t)labels, sizeof(double));
    if (values == NULL || sums == NULL) {
        PyMem_Free(values);
        PyMem_Free(sums);
        clear_counts();
        PyErr_NoMemory();
        goto done;
    }
    unit_weights(values);
    const float *rows = weights.buf;
    for (Py_ssize_t i = 0; i < n_distinct; i++) {
        const float *row = rows + (size_t)distinct[i] * (size_t)labels;
        for (Py_ssize_t j = 0; j < labels; j++) sums[j] += (double)values[i] * row[j];
    }
    clear_counts();
    result = PyList_New(labels);
    if (result != NULL) {
        const float *b = bias.buf;
        for (Py_ssize_t j = 0; j < labels; j++)
            PyList_SET_ITEM(result, j, PyFloat_FromDouble(sums[j] + b[j]));
    }
    PyMem_Free(values);
    PyMem_Free(sums);
done:
    PyBuffer_Release(&weights);
    PyBuffer_Release(&bias);
    return result;
}

static PyMethodDef methods[] = {
    {"features", features, METH_O, features_doc},
    {"logits", logits, METH_VARARGS, logits_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_hashing", "The intent classifier's features, compiled.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__hashing(void) {
    crc_init();
    char kind[16];
    for (int n = 0; n <= CHAR_NGRAM_MAX; n++) {
        snprintf(kind, sizeof kind, "char%d", n);
        char_seeds[n] = seed_of(kind);
        snprintf(kind, sizeof kind, "head%d", n);
        head_seeds[n] = seed_of(kind);
        snprintf(kind, sizeof kind, "tail%d", n);
        tail_seeds[n] = seed_of(kind);
    }
    word_seed = seed_of("word");
    bigram_seed = seed_of("bigram");
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "BUCKET_BITS", BUCKET_BITS) < 0 ||
        PyModule_AddIntConstant(m, "CHAR_NGRAM_MAX", CHAR_NGRAM_MAX) < 0 ||
        PyModule_AddIntConstant(m, "EDGE_CHARS", EDGE_CHARS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
