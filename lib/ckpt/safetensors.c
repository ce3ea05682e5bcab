// safetensors.c: the safetensors format (lib/safetensors.h). The header is parsed with jansson;
// the checks follow the format's rules: known dtypes, shapes that match the byte ranges, ranges
// inside the data section that cover it exactly without overlap, unique names.
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"

#define MAX_HEADER (100u << 20)  // as the reference implementation

static const struct { const char *name; size_t size; } dtypes[] = {
    {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},
    {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1}, {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
};

size_t neox_st_dtype_size(const char *dtype) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (strcmp(dtypes[i].name, dtype) == 0) return dtypes[i].size;
    return 0;
}

int64_t neox_st_numel(const neox_st_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

void neox_safetensors_close(neox_safetensors *st) {
    if (!st) return;
    for (int i = 0; i < st->count; i++) free(st->tensors[i].name);
    free(st->tensors);
    if (st->mapped) munmap(st->file, st->file_size);
    else free(st->file);
    free(st->name);
    free(st);
}

const neox_st_tensor *neox_safetensors_find(const neox_safetensors *st, const char *name) {
    for (int i = 0; i < st->count; i++)
        if (strcmp(st->tensors[i].name, name) == 0) return &st->tensors[i];
    return NULL;
}

// Fills t from one header entry; data_size bounds the byte range.
static int parse_entry(neox_st_tensor *t, const char *key, json_t *v, size_t data_size, const char *file,
                       neox_error *err) {
    if (!json_is_object(v)) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: tensor '%s': entry is not an object", file, key);
    json_t *dtype = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape");
    json_t *offsets = json_object_get(v, "data_offsets");
    if (!json_is_string(dtype) || neox_st_dtype_size(json_string_value(dtype)) == 0)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: tensor '%s': missing or unknown dtype", file, key);
    if (!json_is_array(shape) || json_array_size(shape) > NEOX_ST_MAX_DIMS)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: tensor '%s': shape must be an array of at most %d sizes", file,
                         key, NEOX_ST_MAX_DIMS);
    if (!json_is_array(offsets) || json_array_size(offsets) != 2 || !json_is_integer(json_array_get(offsets, 0)) ||
        !json_is_integer(json_array_get(offsets, 1)))
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: tensor '%s': data_offsets must be [begin, end]", file, key);
    snprintf(t->dtype, sizeof t->dtype, "%s", json_string_value(dtype));
    t->ndim = (int)json_array_size(shape);
    size_t bytes = neox_st_dtype_size(t->dtype);
    for (int i = 0; i < t->ndim; i++) {
        json_t *d = json_array_get(shape, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s: tensor '%s': shape[%d] is not a size", file, key, i);
        t->shape[i] = json_integer_value(d);
        if (t->shape[i] > 0 && bytes > SIZE_MAX / (size_t)t->shape[i])
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s: tensor '%s': shape is too large", file, key);
        bytes *= (size_t)t->shape[i];
    }
    json_int_t begin = json_integer_value(json_array_get(offsets, 0)), end = json_integer_value(json_array_get(offsets, 1));
    if (begin < 0 || end < begin || (uint64_t)end > data_size)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: tensor '%s': data_offsets [%lld, %lld] outside the %zu data bytes",
                         file, key, (long long)begin, (long long)end, data_size);
    if ((size_t)(end - begin) != bytes)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: tensor '%s': %lld data bytes, but dtype %s and its shape need %zu",
                         file, key, (long long)(end - begin), t->dtype, bytes);
    t->offset = (size_t)begin;
    t->size = bytes;
    return 0;
}

static int by_offset(const void *a, const void *b) {
    const neox_st_tensor *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset ? 1 : (x->size > y->size) - (x->size < y->size);
}

static int parse_header(neox_safetensors *st, neox_error *err) {
    const char *file = st->name;
    if (st->file_size < 8) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: too short for a safetensors file", file);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | st->file[i];
    if (hlen > MAX_HEADER || hlen > st->file_size - 8)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: header length %llu exceeds the file (%zu bytes)", file,
                         (unsigned long long)hlen, st->file_size);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)st->file + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: header: %s (column %d)", file, jerr.text, jerr.column);
    if (!json_is_object(root)) {
        json_decref(root);
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: header is not a JSON object", file);
    }
    size_t data_size = st->file_size - 8 - (size_t)hlen;
    const unsigned char *data = st->file + 8 + hlen;
    st->tensors = neox_calloc(json_object_size(root) + 1, sizeof *st->tensors);
    const char *key;
    json_t *v;
    int rc = 0;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            const char *mk;
            json_t *mv;
            if (!json_is_object(v)) { rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: __metadata__ is not an object", file); break; }
            json_object_foreach(v, mk, mv) if (!json_is_string(mv)) {
                rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: __metadata__ value '%s' is not a string", file, mk);
                break;
            }
            if (rc) break;
            continue;
        }
        neox_st_tensor *t = &st->tensors[st->count];
        if ((rc = parse_entry(t, key, v, data_size, file, err)) != 0) break;
        t->name = neox_strdup(key);
        t->data = data + t->offset;
        st->count++;
    }
    json_decref(root);
    if (rc) return rc;
    // The tensors must tile the data section: sorted by offset, each starts where the previous ends.
    qsort(st->tensors, st->count, sizeof *st->tensors, by_offset);
    size_t expect = 0;
    for (int i = 0; i < st->count; i++) {
        if (st->tensors[i].offset != expect)
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s: tensor '%s' starts at byte %zu, expected %zu (overlap or hole)",
                             file, st->tensors[i].name, st->tensors[i].offset, expect);
        expect += st->tensors[i].size;
    }
    if (expect != data_size)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: %zu data bytes, but the tensors cover %zu", file, data_size, expect);
    return 0;
}

// Takes ownership of buf: unmapped (mapped) or freed by close, also on error.
static neox_safetensors *parse_owned(unsigned char *buf, size_t size, int mapped, const char *name, neox_error *err) {
    neox_safetensors *st = neox_calloc(1, sizeof *st);
    st->name = neox_strdup(name);
    st->file = buf;
    st->file_size = size;
    st->mapped = mapped;
    if (parse_header(st, err) != 0) {
        neox_safetensors_close(st);
        return NULL;
    }
    return st;
}

neox_safetensors *neox_safetensors_parse(unsigned char *buf, size_t size, const char *name, neox_error *err) {
    return parse_owned(buf, size, 0, name, err);
}

// The file mapped read-only (NULL when it cannot be: empty, or not a regular file). Tensors are
// then used where the page cache holds them: reading them into a buffer would cost a copy and
// the zeroing of as many fresh pages, as much time as the conversion's own writing.
static unsigned char *map_file(const char *path, size_t *size) {
    int fd = open(path, O_RDONLY);
    struct stat st;
    void *p = MAP_FAILED;
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
        *size = (size_t)st.st_size;
        p = mmap(NULL, *size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    }
    if (fd >= 0) close(fd);
    return p == MAP_FAILED ? NULL : p;
}

neox_safetensors *neox_safetensors_open(const char *path, neox_error *err) {
    size_t size;
    unsigned char *map = map_file(path, &size);
    if (map) return parse_owned(map, size, 1, path, err);
    char *buf = neox_read_file(path, &size, err);
    return buf ? parse_owned((unsigned char *)buf, size, 0, path, err) : NULL;
}

// ---- writing ---------------------------------------------------------------------------------
struct neox_st_writer {
    neox_atomic_file *af;
    size_t expected, written;  // data-section bytes: all tensors, and those put so far
    size_t synced;             // data bytes already handed to the disk (sync_file_range)
    size_t data_start;         // file offset of the data section
};

static size_t entry_bytes(const neox_st_entry *e) {
    size_t bytes = neox_st_dtype_size(e->dtype);
    for (int d = 0; d < e->ndim; d++) bytes *= (size_t)e->shape[d];
    return bytes;
}

// The JSON header for entries laid out back to back in this order; NULL + err on a bad entry.
static char *header_json(const char *path, const neox_st_entry *entries, int count, const char *metadata_json,
                         size_t *data_bytes, neox_error *err) {
    json_t *root = json_object();
    if (metadata_json) {
        json_error_t jerr;
        json_t *meta = json_loads(metadata_json, 0, &jerr);
        if (!json_is_object(meta)) {
            json_decref(meta);
            json_decref(root);
            neox_fail(err, NEOX_EXIT_FAILURE, "%s: metadata is not a JSON object", path);
            return NULL;
        }
        json_object_set_new(root, "__metadata__", meta);
    }
    size_t offset = 0;
    for (int i = 0; i < count; i++) {
        const neox_st_entry *e = &entries[i];
        if (neox_st_dtype_size(e->dtype) == 0 || e->ndim < 0 || e->ndim > NEOX_ST_MAX_DIMS) {
            json_decref(root);
            neox_fail(err, NEOX_EXIT_FAILURE, "%s: tensor '%s': bad dtype or rank", path, e->name);
            return NULL;
        }
        json_t *shape = json_array();
        for (int d = 0; d < e->ndim; d++) json_array_append_new(shape, json_integer(e->shape[d]));
        size_t bytes = entry_bytes(e);
        json_t *t = json_object();
        json_object_set_new(t, "dtype", json_string(e->dtype));
        json_object_set_new(t, "shape", shape);
        json_object_set_new(t, "data_offsets", json_pack("[II]", (json_int_t)offset, (json_int_t)(offset + bytes)));
        json_object_set_new(root, e->name, t);
        offset += bytes;
    }
    char *header = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    *data_bytes = offset;
    return header;
}

neox_st_writer *neox_st_writer_open(const char *path, const neox_st_entry *entries, int count,
                                    const char *metadata_json, neox_error *err) {
    size_t data_bytes;
    char *header = header_json(path, entries, count, metadata_json, &data_bytes, err);
    if (!header) return NULL;
    size_t hlen = strlen(header), padded = (hlen + 7) / 8 * 8;  // data starts 8-byte aligned
    neox_atomic_file *af = neox_atomic_open(path, err);
    if (!af) {
        free(header);
        return NULL;
    }
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    fwrite(len, 1, 8, af->fp);
    fwrite(header, 1, hlen, af->fp);
    for (size_t i = hlen; i < padded; i++) fputc(' ', af->fp);
    free(header);
    neox_st_writer *w = neox_calloc(1, sizeof *w);
    w->af = af;
    w->expected = data_bytes;
    w->data_start = 8 + padded;
    return w;
}

// Hands what has been written since the last call to the disk without waiting, once it is worth a
// system call: the disk then works while the next tensors are produced, and the fsync at commit
// waits only for the tail.
static void start_writeback(neox_st_writer *w) {
#ifdef SYNC_FILE_RANGE_WRITE
    if (w->written - w->synced < (8u << 20) || fflush(w->af->fp) != 0) return;
    sync_file_range(fileno(w->af->fp), (off_t)(w->data_start + w->synced), (off_t)(w->written - w->synced),
                    SYNC_FILE_RANGE_WRITE);
    w->synced = w->written;
#else
    (void)w;
#endif
}

int neox_st_writer_put(neox_st_writer *w, const void *data, size_t bytes, neox_error *err) {
    if (bytes > w->expected - w->written)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: more tensor data than the header announces", w->af->path);
    if (bytes && fwrite(data, 1, bytes, w->af->fp) != bytes)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: write failed: %s", w->af->path, strerror(errno));
    w->written += bytes;
    start_writeback(w);
    return 0;
}

int neox_st_writer_reserve(neox_st_writer *w, size_t bytes, int *fd, int64_t *offset, neox_error *err) {
    if (bytes > w->expected - w->written)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: more tensor data than the header announces", w->af->path);
    if (fflush(w->af->fp) != 0)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: write failed: %s", w->af->path, strerror(errno));
    *fd = fileno(w->af->fp);
    *offset = (int64_t)(w->data_start + w->written);
    if (fseeko(w->af->fp, (off_t)(*offset + (int64_t)bytes), SEEK_SET) != 0)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: seek failed: %s", w->af->path, strerror(errno));
    w->written += bytes;
    return 0;
}

void neox_st_writer_written(neox_st_writer *w) { start_writeback(w); }

int neox_st_writer_commit(neox_st_writer *w, neox_error *err) {
    int rc;
    if (w->written != w->expected) {
        rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: %zu bytes of tensor data written, the header announces %zu",
                       w->af->path, w->written, w->expected);
        neox_atomic_abort(w->af);
    } else {
        rc = neox_atomic_commit(w->af, err);
    }
    free(w);
    return rc;
}

void neox_st_writer_abort(neox_st_writer *w) {
    if (!w) return;
    neox_atomic_abort(w->af);
    free(w);
}

int neox_safetensors_write(const char *path, const neox_st_entry *entries, int count, const char *metadata_json,
                           neox_error *err) {
    neox_st_writer *w = neox_st_writer_open(path, entries, count, metadata_json, err);
    if (!w) return -1;
    for (int i = 0; i < count; i++)
        if (neox_st_writer_put(w, entries[i].data, entry_bytes(&entries[i]), err) != 0) {
            neox_st_writer_abort(w);
            return -1;
        }
    return neox_st_writer_commit(w, err);
}
