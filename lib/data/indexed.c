// indexed.c: the Megatron MMIDIDX indexed dataset: a memory-mapped reader that validates every
// field of the .idx against the .bin before trusting it, and a streaming writer that produces the
// bytes Megatron's MMapIndexedDatasetBuilder would, under temporary names until committed. Token
// datasets hold integer ids; reward datasets may hold float32/float64 values (dtype codes 6 and 7,
// which GPT-NeoX's indexed_dataset.py reads as np.float32 and np.float64).
#include "data.h"

#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const char IDX_MAGIC[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
enum { IDX_HEADER_SIZE = 9 + 8 + 1 + 8 + 8 };  // magic, version, dtype, items, doc_idx entries

size_t neox_index_dtype_size(int dtype) {
    switch (dtype) {
    case NEOX_DTYPE_U8: case NEOX_DTYPE_I8: return 1;
    case NEOX_DTYPE_I16: case NEOX_DTYPE_U16: return 2;
    case NEOX_DTYPE_I32: case NEOX_DTYPE_F32: return 4;
    case NEOX_DTYPE_I64: case NEOX_DTYPE_F64: return 8;
    default: return 0;
    }
}

const char *neox_index_dtype_name(int dtype) {
    static const char *names[] = {"unknown", "uint8", "int8", "int16", "int32", "int64", "float32", "float64", "uint16"};
    return dtype >= 1 && dtype <= 8 ? names[dtype] : names[0];
}

int neox_dtype_for_vocab(int64_t vocab_size) { return vocab_size < 65500 ? NEOX_DTYPE_U16 : NEOX_DTYPE_I32; }

static uint64_t load_u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;  // the format and every supported host are little-endian
}

// ---------------------------------------------------------------------------------------------
// Reader

static int map_bin(neox_indexed_dataset *ds, neox_error *err) {
    int fd = open(ds->bin_path, O_RDONLY);
    if (fd < 0) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot open: %s", ds->bin_path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot stat: %s", ds->bin_path, strerror(errno));
    }
    ds->bin_size = (size_t)st.st_size;
    if (ds->bin_size > 0) {
        void *m = mmap(NULL, ds->bin_size, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            close(fd);
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot mmap: %s", ds->bin_path, strerror(errno));
        }
        ds->bin = m;
    }
    close(fd);
    return 0;
}

static int parse_header(neox_indexed_dataset *ds, const uint8_t *p, size_t size, neox_error *err) {
    const char *path = ds->idx_path;
    if (size < IDX_HEADER_SIZE || memcmp(p, IDX_MAGIC, 9) != 0)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: not a Megatron MMIDIDX index (bad magic or shorter than its header)",
                         path);
    uint64_t version = load_u64(p + 9);
    if (version != 1)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: unsupported index version %llu (expected 1)", path,
                         (unsigned long long)version);
    ds->dtype = p[17];
    ds->elem_size = neox_index_dtype_size(ds->dtype);
    if (!ds->elem_size) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: unknown dtype code %d", path, ds->dtype);
    uint64_t n = load_u64(p + 18), d = load_u64(p + 26);
    // Each item takes 12 bytes and each doc_idx entry 8, so bound the counts by the file size
    // before multiplying (a forged count must not overflow the size check).
    uint64_t room = size - IDX_HEADER_SIZE;
    if (n > room / 12 || d > (room - n * 12) / 8 || IDX_HEADER_SIZE + n * 12 + d * 8 != size)
        return neox_fail(err, NEOX_EXIT_FAILURE,
                         "%s: header says %llu items and %llu doc_idx entries, which does not match the file size %zu",
                         path, (unsigned long long)n, (unsigned long long)d, size);
    ds->num_items = (int64_t)n;
    ds->num_doc_idx = (int64_t)d;
    return 0;
}

// Checks that sizes, pointers and doc_idx describe exactly the .bin.
static int check_index(neox_indexed_dataset *ds, neox_error *err) {
    const char *path = ds->idx_path;
    int64_t expect = 0;
    for (int64_t i = 0; i < ds->num_items; i++) {
        if (ds->sizes[i] < 0) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: item %lld has negative size %d", path, (long long)i, ds->sizes[i]);
        if (ds->pointers[i] != expect)
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s: item %lld starts at byte %lld, expected %lld (index and .bin disagree)",
                             path, (long long)i, (long long)ds->pointers[i], (long long)expect);
        expect += (int64_t)ds->sizes[i] * (int64_t)ds->elem_size;
        ds->total_tokens += ds->sizes[i];
    }
    if ((uint64_t)expect != ds->bin_size)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: the index describes %lld bytes of tokens but %s has %zu", path,
                         (long long)expect, ds->bin_path, ds->bin_size);
    if (ds->num_doc_idx < 1 || ds->doc_idx[0] != 0)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: doc_idx must start with 0", path);
    for (int64_t i = 1; i < ds->num_doc_idx; i++)
        if (ds->doc_idx[i] < ds->doc_idx[i - 1] || ds->doc_idx[i] > ds->num_items)
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s: doc_idx[%lld] = %lld is out of order or beyond %lld items", path,
                             (long long)i, (long long)ds->doc_idx[i], (long long)ds->num_items);
    if (ds->doc_idx[ds->num_doc_idx - 1] != ds->num_items)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: doc_idx ends at %lld, expected %lld items", path,
                         (long long)ds->doc_idx[ds->num_doc_idx - 1], (long long)ds->num_items);
    return 0;
}

static int read_index(neox_indexed_dataset *ds, neox_error *err) {
    size_t size;
    char *buf = neox_read_file(ds->idx_path, &size, err);
    if (!buf) return -1;
    const uint8_t *p = (const uint8_t *)buf;
    if (parse_header(ds, p, size, err) != 0) {
        free(buf);
        return -1;
    }
    size_t n = (size_t)ds->num_items, d = (size_t)ds->num_doc_idx;
    // The arrays sit unaligned from byte 34: copy them out rather than casting pointers.
    ds->sizes = neox_malloc(n * 4 + 1);
    ds->pointers = neox_malloc(n * 8 + 1);
    ds->doc_idx = neox_malloc(d * 8 + 1);
    memcpy(ds->sizes, p + IDX_HEADER_SIZE, n * 4);
    memcpy(ds->pointers, p + IDX_HEADER_SIZE + n * 4, n * 8);
    memcpy(ds->doc_idx, p + IDX_HEADER_SIZE + n * 12, d * 8);
    free(buf);
    return 0;
}

neox_indexed_dataset *neox_indexed_open(const char *prefix, neox_error *err) {
    neox_indexed_dataset *ds = neox_calloc(1, sizeof *ds);
    ds->idx_path = neox_asprintf("%s.idx", prefix);
    ds->bin_path = neox_asprintf("%s.bin", prefix);
    if (read_index(ds, err) != 0 || map_bin(ds, err) != 0 || check_index(ds, err) != 0) {
        neox_indexed_close(ds);
        return NULL;
    }
    return ds;
}

void neox_indexed_close(neox_indexed_dataset *ds) {
    if (!ds) return;
    if (ds->bin) munmap((void *)ds->bin, ds->bin_size);
    free(ds->sizes);
    free(ds->pointers);
    free(ds->doc_idx);
    free(ds->bin_path);
    free(ds->idx_path);
    free(ds);
}

static int32_t token_at(const uint8_t *p, int dtype) {
    switch (dtype) {
    case NEOX_DTYPE_U8: return p[0];
    case NEOX_DTYPE_I8: return (int8_t)p[0];
    case NEOX_DTYPE_U16: { uint16_t v; memcpy(&v, p, 2); return v; }
    case NEOX_DTYPE_I16: { int16_t v; memcpy(&v, p, 2); return v; }
    case NEOX_DTYPE_I32: { int32_t v; memcpy(&v, p, 4); return v; }
    default: { int64_t v; memcpy(&v, p, 8); return (int32_t)v; }
    }
}

// Elements [offset, offset + *length) of item (*length < 0: to its end) in the mapped .bin, or NULL
// with an error naming the file and the range (unit: what the elements are called).
static const uint8_t *item_span(const neox_indexed_dataset *ds, int64_t item, int64_t offset, int64_t *length,
                                const char *unit, neox_error *err) {
    if (item < 0 || item >= ds->num_items)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: item %lld out of range (%lld items)", ds->idx_path, (long long)item,
                         (long long)ds->num_items), NULL;
    int64_t size = ds->sizes[item];
    if (*length < 0) *length = size - offset;
    if (offset < 0 || *length < 0 || offset + *length > size)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s [%lld, %lld) out of range of item %lld (%lld %s)", ds->idx_path,
                         unit, (long long)offset, (long long)(offset + *length), (long long)item, (long long)size, unit),
               NULL;
    return ds->bin + ds->pointers[item] + offset * (int64_t)ds->elem_size;
}

int64_t neox_indexed_get(const neox_indexed_dataset *ds, int64_t item, int64_t offset, int64_t length, int32_t *out,
                         neox_error *err) {
    if (ds->dtype == NEOX_DTYPE_F32 || ds->dtype == NEOX_DTYPE_F64)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: dtype %s holds no token ids", ds->idx_path, neox_index_dtype_name(ds->dtype));
    const uint8_t *p = item_span(ds, item, offset, &length, "tokens", err);
    if (!p) return -1;
    if (ds->dtype == NEOX_DTYPE_I32) {
        memcpy(out, p, (size_t)length * 4);
    } else {
        for (int64_t i = 0; i < length; i++) out[i] = token_at(p + i * (int64_t)ds->elem_size, ds->dtype);
    }
    return length;
}

static double value_at(const uint8_t *p, int dtype) {
    switch (dtype) {
    case NEOX_DTYPE_F32: { float v; memcpy(&v, p, 4); return v; }
    case NEOX_DTYPE_F64: { double v; memcpy(&v, p, 8); return v; }
    case NEOX_DTYPE_I64: { int64_t v; memcpy(&v, p, 8); return (double)v; }
    default: return token_at(p, dtype);
    }
}

int64_t neox_indexed_get_values(const neox_indexed_dataset *ds, int64_t item, int64_t offset, int64_t length,
                                double *out, neox_error *err) {
    const uint8_t *p = item_span(ds, item, offset, &length, "values", err);
    if (!p) return -1;
    for (int64_t i = 0; i < length; i++) out[i] = value_at(p + i * (int64_t)ds->elem_size, ds->dtype);
    return length;
}

// ---------------------------------------------------------------------------------------------
// Writer

struct neox_indexed_writer {
    int dtype;
    size_t elem_size;
    char *prefix;
    neox_atomic_file *bin;
    int32_t *sizes;
    size_t nsizes, cap_sizes;
    int64_t *doc_idx;
    size_t ndocs, cap_docs;
    int64_t tokens;
    uint8_t *scratch;
    size_t scratch_cap;
};

neox_indexed_writer *neox_indexed_writer_open(const char *prefix, int dtype, neox_error *err) {
    if (!neox_index_dtype_size(dtype)) {
        neox_fail(err, NEOX_EXIT_USAGE, "%s: cannot write dtype code %d", prefix, dtype);
        return NULL;
    }
    char *bin_path = neox_asprintf("%s.bin", prefix);
    neox_atomic_file *bin = neox_atomic_open(bin_path, err);
    free(bin_path);
    if (!bin) return NULL;
    setvbuf(bin->fp, NULL, _IOFBF, 1 << 20);
    neox_indexed_writer *w = neox_calloc(1, sizeof *w);
    w->dtype = dtype;
    w->elem_size = neox_index_dtype_size(dtype);
    w->prefix = neox_strdup(prefix);
    w->bin = bin;
    w->cap_docs = 1024;
    w->doc_idx = neox_malloc(w->cap_docs * sizeof *w->doc_idx);
    w->doc_idx[w->ndocs++] = 0;
    return w;
}

static int id_fits(int32_t id, int dtype) {
    switch (dtype) {
    case NEOX_DTYPE_U8: return id >= 0 && id <= 255;
    case NEOX_DTYPE_I8: return id >= -128 && id <= 127;
    case NEOX_DTYPE_U16: return id >= 0 && id <= 65535;
    case NEOX_DTYPE_I16: return id >= -32768 && id <= 32767;
    default: return 1;
    }
}

static void encode_ids(neox_indexed_writer *w, const int32_t *ids, size_t n) {
    if (w->scratch_cap < n * w->elem_size) {
        w->scratch_cap = n * w->elem_size * 2;
        w->scratch = neox_realloc(w->scratch, w->scratch_cap);
    }
    for (size_t i = 0; i < n; i++) {
        uint8_t *p = w->scratch + i * w->elem_size;
        switch (w->dtype) {
        case NEOX_DTYPE_U8: case NEOX_DTYPE_I8: p[0] = (uint8_t)ids[i]; break;
        case NEOX_DTYPE_U16: case NEOX_DTYPE_I16: { uint16_t v = (uint16_t)ids[i]; memcpy(p, &v, 2); break; }
        case NEOX_DTYPE_I32: memcpy(p, &ids[i], 4); break;
        default: { int64_t v = ids[i]; memcpy(p, &v, 8); break; }
        }
    }
}

static int is_float_dtype(int dtype) { return dtype == NEOX_DTYPE_F32 || dtype == NEOX_DTYPE_F64; }

// Records an item of n elements whose bytes are already written.
static void push_size(neox_indexed_writer *w, size_t n) {
    if (w->nsizes == w->cap_sizes) {
        w->cap_sizes = w->cap_sizes ? w->cap_sizes * 2 : 1024;
        w->sizes = neox_realloc(w->sizes, w->cap_sizes * sizeof *w->sizes);
    }
    w->sizes[w->nsizes++] = (int32_t)n;
    w->tokens += (int64_t)n;
}

// A value an integer dtype holds exactly: integral and within its range.
static int value_fits(double v, int dtype) {
    if (v != floor(v)) return 0;
    switch (dtype) {
    case NEOX_DTYPE_I32: return v >= -2147483648.0 && v <= 2147483647.0;
    case NEOX_DTYPE_I64: return v >= -9223372036854775808.0 && v < 9223372036854775808.0;
    default: return v >= -2147483648.0 && v <= 2147483647.0 && id_fits((int32_t)v, dtype);
    }
}

int neox_indexed_writer_add_values(neox_indexed_writer *w, const double *values, size_t n, neox_error *err) {
    if (n > INT32_MAX) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: item of %zu values exceeds int32 sizes", w->prefix, n);
    if (w->scratch_cap < n * w->elem_size) {
        w->scratch_cap = n * w->elem_size * 2;
        w->scratch = neox_realloc(w->scratch, w->scratch_cap);
    }
    for (size_t i = 0; i < n; i++) {
        double v = values[i];
        uint8_t *p = w->scratch + i * w->elem_size;
        if (w->dtype == NEOX_DTYPE_F32) { float f = (float)v; memcpy(p, &f, 4); continue; }
        if (w->dtype == NEOX_DTYPE_F64) { memcpy(p, &v, 8); continue; }
        if (!value_fits(v, w->dtype))
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s.bin: value %.17g does not fit dtype %s", w->prefix, v,
                             neox_index_dtype_name(w->dtype));
        if (w->dtype == NEOX_DTYPE_I64) { int64_t x = (int64_t)v; memcpy(p, &x, 8); continue; }
        int32_t id = (int32_t)v;
        switch (w->dtype) {
        case NEOX_DTYPE_U8: case NEOX_DTYPE_I8: p[0] = (uint8_t)id; break;
        case NEOX_DTYPE_U16: case NEOX_DTYPE_I16: { uint16_t x = (uint16_t)id; memcpy(p, &x, 2); break; }
        default: memcpy(p, &id, 4); break;
        }
    }
    if (n && fwrite(w->scratch, w->elem_size, n, w->bin->fp) != n)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: write failed: %s", w->bin->path, strerror(errno));
    push_size(w, n);
    return 0;
}

int neox_indexed_writer_add_item(neox_indexed_writer *w, const int32_t *ids, size_t n, neox_error *err) {
    if (is_float_dtype(w->dtype))
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: token ids cannot be written as %s", w->prefix,
                         neox_index_dtype_name(w->dtype));
    for (size_t i = 0; i < n; i++)
        if (!id_fits(ids[i], w->dtype))
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s.bin: token id %d does not fit dtype %s", w->prefix, ids[i],
                             neox_index_dtype_name(w->dtype));
    if (n > INT32_MAX) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: item of %zu tokens exceeds int32 sizes", w->prefix, n);
    const void *bytes = ids;
    if (w->dtype != NEOX_DTYPE_I32) {
        encode_ids(w, ids, n);
        bytes = w->scratch;
    }
    if (n && fwrite(bytes, w->elem_size, n, w->bin->fp) != n)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: write failed: %s", w->bin->path, strerror(errno));
    push_size(w, n);
    return 0;
}

void neox_indexed_writer_end_document(neox_indexed_writer *w) {
    if (w->ndocs == w->cap_docs) {
        w->cap_docs *= 2;
        w->doc_idx = neox_realloc(w->doc_idx, w->cap_docs * sizeof *w->doc_idx);
    }
    w->doc_idx[w->ndocs++] = (int64_t)w->nsizes;
}

int neox_indexed_writer_append(neox_indexed_writer *w, const neox_indexed_dataset *ds, neox_error *err) {
    if (ds->dtype != w->dtype)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s: dtype %s differs from the output's %s", ds->idx_path,
                         neox_index_dtype_name(ds->dtype), neox_index_dtype_name(w->dtype));
    if (ds->bin_size && fwrite(ds->bin, 1, ds->bin_size, w->bin->fp) != ds->bin_size)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: write failed: %s", w->bin->path, strerror(errno));
    int64_t base = (int64_t)w->nsizes;
    for (int64_t i = 0; i < ds->num_items; i++) {
        if (w->nsizes == w->cap_sizes) {
            w->cap_sizes = w->cap_sizes ? w->cap_sizes * 2 : 1024;
            w->sizes = neox_realloc(w->sizes, w->cap_sizes * sizeof *w->sizes);
        }
        w->sizes[w->nsizes++] = ds->sizes[i];
    }
    // doc_idx[0] == 0 is the boundary the writer already has; the rest shift by the items before.
    for (int64_t i = 1; i < ds->num_doc_idx; i++) {
        if (w->ndocs == w->cap_docs) {
            w->cap_docs *= 2;
            w->doc_idx = neox_realloc(w->doc_idx, w->cap_docs * sizeof *w->doc_idx);
        }
        w->doc_idx[w->ndocs++] = base + ds->doc_idx[i];
    }
    w->tokens += ds->total_tokens;
    return 0;
}

int64_t neox_indexed_writer_items(const neox_indexed_writer *w) { return (int64_t)w->nsizes; }
int64_t neox_indexed_writer_tokens(const neox_indexed_writer *w) { return w->tokens; }

static int write_index(neox_indexed_writer *w, neox_atomic_file *idx, neox_error *err) {
    FILE *fp = idx->fp;
    uint64_t version = 1, n = w->nsizes, d = w->ndocs;
    uint8_t dtype = (uint8_t)w->dtype;
    int ok = fwrite(IDX_MAGIC, 1, 9, fp) == 9 && fwrite(&version, 8, 1, fp) == 1 && fwrite(&dtype, 1, 1, fp) == 1 &&
             fwrite(&n, 8, 1, fp) == 1 && fwrite(&d, 8, 1, fp) == 1;
    ok = ok && (n == 0 || fwrite(w->sizes, 4, n, fp) == n);
    int64_t pointer = 0;
    for (size_t i = 0; ok && i < n; i++) {
        ok = fwrite(&pointer, 8, 1, fp) == 1;
        pointer += (int64_t)w->sizes[i] * (int64_t)w->elem_size;
    }
    ok = ok && fwrite(w->doc_idx, 8, d, fp) == d;
    if (!ok) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: write failed: %s", idx->path, strerror(errno));
    return 0;
}

static void writer_free(neox_indexed_writer *w) {
    free(w->sizes);
    free(w->doc_idx);
    free(w->scratch);
    free(w->prefix);
    free(w);
}

// The .bin is renamed first and the .idx last: a dataset only looks complete once its index is
// in place, and a stale index left beside a new .bin fails the reader's size checks.
int neox_indexed_writer_commit(neox_indexed_writer *w, neox_error *err) {
    char *idx_path = neox_asprintf("%s.idx", w->prefix);
    neox_atomic_file *idx = neox_atomic_open(idx_path, err);
    free(idx_path);
    int rc = -1;
    if (idx && write_index(w, idx, err) == 0) {
        unlink(idx->path);  // an older dataset under this name stops looking complete now
        rc = neox_atomic_commit(w->bin, err);
        w->bin = NULL;
        if (rc == 0) {
            rc = neox_atomic_commit(idx, err);
            idx = NULL;
        }
    }
    if (idx) neox_atomic_abort(idx);
    if (w->bin) neox_atomic_abort(w->bin);
    writer_free(w);
    return rc;
}

void neox_indexed_writer_abort(neox_indexed_writer *w) {
    if (!w) return;
    neox_atomic_abort(w->bin);
    writer_free(w);
}
