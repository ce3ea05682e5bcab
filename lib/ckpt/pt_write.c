// pt_write.c: writing PyTorch `.pt` files as torch.save does (lib/torch_pt.h): a tree of values built
// here is pickled (protocol 2, only the opcodes and globals the reader accepts, so
// torch.load(weights_only=True) loads it) into `<name>/data.pkl`, each tensor's elements into its
// own storage `<name>/data/<key>`, and `<name>/version`, stored uncompressed in a zip through libzip.
// The file is written under a temporary name and renamed when complete.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zip.h>

#include "torch_pt.h"

struct neox_pt_writer {
    char *path, *tmp, *archive;  // archive: the folder name inside the zip (the file's stem)
    zip_t *zip;
    neox_pt_value **values;      // every value made, freed at the end
    int nvalues, cap_values;
    void **blobs;                // storages' bytes, alive until the zip is written
    int nblobs;
    unsigned char *pickle;
    size_t len, cap;
};

static neox_pt_value *make(neox_pt_writer *w, neox_pt_kind kind) {
    if (w->nvalues == w->cap_values) {
        w->cap_values = w->cap_values ? 2 * w->cap_values : 64;
        w->values = neox_realloc(w->values, (size_t)w->cap_values * sizeof *w->values);
    }
    neox_pt_value *v = neox_calloc(1, sizeof *v);
    v->kind = kind;
    w->values[w->nvalues++] = v;
    return v;
}

neox_pt_writer *neox_pt_writer_open(const char *path, neox_error *err) {
    neox_pt_writer *w = neox_calloc(1, sizeof *w);
    w->path = neox_strdup(path);
    w->tmp = neox_asprintf("%s.tmp.%d", path, (int)getpid());
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    w->archive = neox_strdup(base);
    char *dot = strrchr(w->archive, '.');
    if (dot && dot != w->archive) *dot = 0;
    int code = 0;
    w->zip = zip_open(w->tmp, ZIP_CREATE | ZIP_EXCL, &code);
    if (!w->zip) {
        zip_error_t ze;
        zip_error_init_with_code(&ze, code);
        neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot create: %s", w->tmp, zip_error_strerror(&ze));
        zip_error_fini(&ze);
        neox_pt_writer_abort(w);
        return NULL;
    }
    return w;
}

neox_pt_value *neox_pt_new(neox_pt_writer *w, neox_pt_kind kind) { return make(w, kind); }

neox_pt_value *neox_pt_new_int(neox_pt_writer *w, int64_t i) {
    neox_pt_value *v = make(w, NEOX_PT_INT);
    v->i = i;
    return v;
}

neox_pt_value *neox_pt_new_float(neox_pt_writer *w, double f) {
    neox_pt_value *v = make(w, NEOX_PT_FLOAT);
    v->f = f;
    return v;
}

neox_pt_value *neox_pt_new_str(neox_pt_writer *w, const char *s) {
    neox_pt_value *v = make(w, NEOX_PT_STR);
    v->str = neox_strdup(s);
    v->len = strlen(s);
    return v;
}

neox_pt_value *neox_pt_new_global(neox_pt_writer *w, const char *qualified_name) {
    neox_assert(strrchr(qualified_name, '.'), "a global needs its module: %s", qualified_name);
    neox_pt_value *v = make(w, NEOX_PT_GLOBAL);
    v->str = neox_strdup(qualified_name);
    return v;
}

neox_pt_value *neox_pt_new_object(neox_pt_writer *w, const char *qualified_name) {
    neox_pt_value *v = neox_pt_new_global(w, qualified_name);
    v->kind = NEOX_PT_RECORD;
    return v;
}

void neox_pt_append(neox_pt_value *c, neox_pt_value *v) {
    if (c->count == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 4;
        c->items = neox_realloc(c->items, (size_t)c->cap * sizeof *c->items);
        c->keys = neox_realloc(c->keys, (size_t)c->cap * sizeof *c->keys);
    }
    c->keys[c->count] = NULL;
    c->items[c->count++] = v;
}

void neox_pt_set(neox_pt_writer *w, neox_pt_value *dict, const char *key, neox_pt_value *v) {
    neox_pt_append(dict, v);
    dict->keys[dict->count - 1] = neox_pt_new_str(w, key);
}

neox_pt_value *neox_pt_new_tensor(neox_pt_writer *w, neox_pt_dtype dtype, int ndim, const int64_t *shape,
                                  const void *data) {
    neox_assert(ndim >= 0 && ndim <= NEOX_PT_MAX_DIMS, "tensor of %d dimensions", ndim);
    neox_pt_tensor *t = neox_calloc(1, sizeof *t);
    t->dtype = dtype;
    t->ndim = ndim;
    int64_t stride = 1;
    for (int d = ndim - 1; d >= 0; d--) t->shape[d] = shape[d], t->stride[d] = stride, stride *= shape[d];
    size_t bytes = (size_t)stride * neox_pt_dtype_size(dtype);
    t->storage = neox_calloc(1, sizeof *t->storage);
    t->storage->key = neox_asprintf("%d", w->nblobs);
    t->storage->dtype = dtype;
    t->storage->bytes = bytes;
    w->blobs = neox_realloc(w->blobs, (size_t)(w->nblobs + 1) * sizeof *w->blobs);
    void *copy = neox_malloc(bytes + 1);
    if (bytes) memcpy(copy, data, bytes);
    w->blobs[w->nblobs++] = copy;
    neox_pt_value *v = make(w, NEOX_PT_TENSOR);
    v->tensor = t;
    return v;
}

// ---- the pickle ---------------------------------------------------------------------------------
static void put(neox_pt_writer *w, const void *p, size_t n) {
    if (w->len + n > w->cap) {
        w->cap = (w->len + n) * 2 + 256;
        w->pickle = neox_realloc(w->pickle, w->cap);
    }
    memcpy(w->pickle + w->len, p, n);
    w->len += n;
}

static void put_byte(neox_pt_writer *w, unsigned char b) { put(w, &b, 1); }

static void put_le(neox_pt_writer *w, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) put_byte(w, (unsigned char)(v >> (8 * i)));
}

static void put_global(neox_pt_writer *w, const char *module, const char *name) {
    put_byte(w, 'c');
    put(w, module, strlen(module));
    put_byte(w, '\n');
    put(w, name, strlen(name));
    put_byte(w, '\n');
}

// "module.sub.name" as GLOBAL module.sub name.
static void put_qualified(neox_pt_writer *w, const char *qualified_name) {
    const char *dot = strrchr(qualified_name, '.');
    char *module = neox_strdup(qualified_name);
    module[dot - qualified_name] = 0;
    put_global(w, module, dot + 1);
    free(module);
}

static void put_int(neox_pt_writer *w, int64_t i) {
    if (i >= INT32_MIN && i <= INT32_MAX) {
        put_byte(w, 'J');
        put_le(w, (uint64_t)(uint32_t)(int32_t)i, 4);
    } else {
        put_byte(w, 0x8a);  // LONG1, 8 bytes two's complement
        put_byte(w, 8);
        put_le(w, (uint64_t)i, 8);
    }
}

static void put_str(neox_pt_writer *w, const char *s, size_t n) {
    put_byte(w, 'X');
    put_le(w, n, 4);
    put(w, s, n);
}

static const char *storage_type(neox_pt_dtype d) {
    static const char *const names[NEOX_PT_DTYPE_COUNT] = {
        [NEOX_PT_F32] = "FloatStorage", [NEOX_PT_F16] = "HalfStorage", [NEOX_PT_BF16] = "BFloat16Storage",
        [NEOX_PT_F64] = "DoubleStorage", [NEOX_PT_I64] = "LongStorage", [NEOX_PT_I32] = "IntStorage",
        [NEOX_PT_I16] = "ShortStorage", [NEOX_PT_I8] = "CharStorage", [NEOX_PT_U8] = "ByteStorage",
        [NEOX_PT_BOOL_DTYPE] = "BoolStorage"};
    return names[d];
}

static void put_ints_tuple(neox_pt_writer *w, const int64_t *v, int n) {
    put_byte(w, '(');
    for (int i = 0; i < n; i++) put_int(w, v[i]);
    put_byte(w, 't');
}

// _rebuild_tensor_v2(storage, 0, size, stride, False, OrderedDict()), the storage by persistent id.
static void put_tensor(neox_pt_writer *w, const neox_pt_tensor *t) {
    put_global(w, "torch._utils", "_rebuild_tensor_v2");
    put_byte(w, '(');
    put_byte(w, '(');
    put_str(w, "storage", 7);
    put_global(w, "torch", storage_type(t->dtype));
    put_str(w, t->storage->key, strlen(t->storage->key));
    put_str(w, "cpu", 3);
    put_int(w, (int64_t)(t->storage->bytes / neox_pt_dtype_size(t->dtype)));
    put_byte(w, 't');
    put_byte(w, 'Q');
    put_int(w, 0);
    put_ints_tuple(w, t->shape, t->ndim);
    put_ints_tuple(w, t->stride, t->ndim);
    put_byte(w, 0x89);
    put_global(w, "collections", "OrderedDict");
    put_byte(w, ')');
    put_byte(w, 'R');
    put_byte(w, 't');
    put_byte(w, 'R');
}

static void put_value(neox_pt_writer *w, const neox_pt_value *v, int depth) {
    neox_assert(depth < 100, "a value nested 100 deep");
    switch (v->kind) {
    case NEOX_PT_NONE: put_byte(w, 'N'); return;
    case NEOX_PT_BOOL: put_byte(w, v->i ? 0x88 : 0x89); return;
    case NEOX_PT_INT: put_int(w, v->i); return;
    case NEOX_PT_FLOAT: {
        uint64_t bits;
        memcpy(&bits, &v->f, 8);
        put_byte(w, 'G');
        for (int i = 7; i >= 0; i--) put_byte(w, (unsigned char)(bits >> (8 * i)));
        return;
    }
    case NEOX_PT_STR: put_str(w, v->str, v->len); return;
    case NEOX_PT_TENSOR: put_tensor(w, v->tensor); return;
    case NEOX_PT_TUPLE:
        put_byte(w, '(');
        for (int i = 0; i < v->count; i++) put_value(w, v->items[i], depth + 1);
        put_byte(w, 't');
        return;
    case NEOX_PT_LIST:
        put_byte(w, ']');
        if (!v->count) return;
        put_byte(w, '(');
        for (int i = 0; i < v->count; i++) put_value(w, v->items[i], depth + 1);
        put_byte(w, 'e');
        return;
    case NEOX_PT_DICT:
    case NEOX_PT_RECORD:
        if (v->kind == NEOX_PT_RECORD) {  // cls.__new__(cls), then its __dict__ below and BUILD
            put_qualified(w, v->str);
            put_byte(w, ')');
            put_byte(w, 0x81);
        }
        put_byte(w, '}');
        if (v->count) {
            put_byte(w, '(');
            for (int i = 0; i < v->count; i++) {
                put_value(w, v->keys[i], depth + 1);
                put_value(w, v->items[i], depth + 1);
            }
            put_byte(w, 'u');
        }
        if (v->kind == NEOX_PT_RECORD) put_byte(w, 'b');
        return;
    case NEOX_PT_GLOBAL: put_qualified(w, v->str); return;
    default: neox_bug("value kind %d cannot be written", (int)v->kind);
    }
}

static int add_entry(neox_pt_writer *w, const char *name, const void *data, size_t size, neox_error *err) {
    char *full = neox_asprintf("%s/%s", w->archive, name);
    zip_source_t *src = zip_source_buffer(w->zip, data, size, 0);
    zip_int64_t index = src ? zip_file_add(w->zip, full, src, ZIP_FL_ENC_UTF_8) : -1;
    if (index < 0 && src) zip_source_free(src);
    free(full);
    if (index < 0 || zip_set_file_compression(w->zip, (zip_uint64_t)index, ZIP_CM_STORE, 0) != 0)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s: %s", w->tmp, name, zip_strerror(w->zip));
    return 0;
}

static void writer_free(neox_pt_writer *w) {
    for (int i = 0; i < w->nvalues; i++) {
        neox_pt_value *v = w->values[i];
        if (v->kind == NEOX_PT_TENSOR) {
            free(v->tensor->storage->key);
            free(v->tensor->storage);
            free(v->tensor);
        }
        free(v->str), free(v->items), free(v->keys), free(v);
    }
    for (int i = 0; i < w->nblobs; i++) free(w->blobs[i]);
    free(w->values), free(w->blobs), free(w->pickle), free(w->archive), free(w->tmp), free(w->path), free(w);
}

int neox_pt_writer_commit(neox_pt_writer *w, const neox_pt_value *root, neox_error *err) {
    put_byte(w, 0x80);
    put_byte(w, 2);
    put_value(w, root, 0);
    put_byte(w, '.');
    int rc = add_entry(w, "data.pkl", w->pickle, w->len, err);
    for (int i = 0; i < w->nvalues && rc == 0; i++) {
        const neox_pt_value *v = w->values[i];
        if (v->kind != NEOX_PT_TENSOR) continue;
        char *name = neox_asprintf("data/%s", v->tensor->storage->key);
        rc = add_entry(w, name, w->blobs[atoi(v->tensor->storage->key)], v->tensor->storage->bytes, err);
        free(name);
    }
    if (rc == 0) rc = add_entry(w, "version", "3\n", 2, err);
    if (rc == 0 && zip_close(w->zip) != 0) {
        rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s", w->tmp, zip_strerror(w->zip));
        zip_discard(w->zip);
    }
    w->zip = NULL;
    if (rc == 0 && rename(w->tmp, w->path) != 0)
        rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot rename into place", w->path);
    if (rc != 0) unlink(w->tmp);
    writer_free(w);
    return rc;
}

void neox_pt_writer_abort(neox_pt_writer *w) {
    if (!w) return;
    if (w->zip) zip_discard(w->zip);
    unlink(w->tmp);
    writer_free(w);
}
