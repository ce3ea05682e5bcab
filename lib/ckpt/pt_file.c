// pt_file.c: the zip container of a torch.save file (lib/torch_pt.h), read through libzip: finds
// `<name>/data.pkl` (one top-level folder, as torch writes), unpickles it (pt_pickle.c), matches
// each storage to its entry `<name>/data/<key>` and checks that every tensor lies inside its
// storage before anyone allocates for it; then reads tensors (strided views gathered to row-major)
// one at a time, reading only the byte range each one spans.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zip.h>

#include "torch_pt.h"

// A pickle larger than this is refused: checkpoints' pickles are kilobytes to a few megabytes.
#define MAX_PICKLE_BYTES ((zip_uint64_t)256 << 20)
// The most a deflated entry can expand (deflate's limit is 1032:1), which bounds a size it claims.
#define MAX_DEFLATE_RATIO 1032

struct neox_pt_file {
    char *path;
    zip_t *zip;
    char *prefix;  // "<name>/"
    neox_pt_arena *arena;
    neox_pt_value *root;
};

static const struct { const char *name; size_t size; } dtype_info[NEOX_PT_DTYPE_COUNT] = {
    [NEOX_PT_F32] = {"float32", 4}, [NEOX_PT_F16] = {"float16", 2}, [NEOX_PT_BF16] = {"bfloat16", 2},
    [NEOX_PT_F64] = {"float64", 8}, [NEOX_PT_I64] = {"int64", 8},   [NEOX_PT_I32] = {"int32", 4},
    [NEOX_PT_I16] = {"int16", 2},   [NEOX_PT_I8] = {"int8", 1},     [NEOX_PT_U8] = {"uint8", 1},
    [NEOX_PT_BOOL_DTYPE] = {"bool", 1},
};

const char *neox_pt_dtype_name(neox_pt_dtype d) { return dtype_info[d].name; }
size_t neox_pt_dtype_size(neox_pt_dtype d) { return dtype_info[d].size; }

int64_t neox_pt_numel(const neox_pt_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

const char *neox_pt_path(const neox_pt_file *f) { return f->path; }
const neox_pt_value *neox_pt_root(const neox_pt_file *f) { return f->root; }
int neox_pt_tensors(const neox_pt_file *f, neox_pt_tensor ***tensors) { return neox_pt_arena_tensors(f->arena, tensors); }

static int zip_fail(neox_error *err, const char *path, const char *what, zip_error_t *ze) {
    return neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s: %s", path, what, zip_error_strerror(ze));
}

// The one "<name>/data.pkl" entry: its index and the prefix.
static int find_pickle(neox_pt_file *f, zip_int64_t *index, neox_error *err) {
    zip_int64_t n = zip_get_num_entries(f->zip, 0);
    for (zip_int64_t i = 0; i < n; i++) {
        const char *name = zip_get_name(f->zip, (zip_uint64_t)i, 0);
        const char *slash = name ? strchr(name, '/') : NULL;
        if (!slash || strcmp(slash, "/data.pkl") != 0) continue;
        if (f->prefix) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: more than one data.pkl in the archive", f->path);
        f->prefix = neox_strndup(name, (size_t)(slash - name) + 1);
        *index = i;
    }
    if (!f->prefix)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: no <name>/data.pkl in the archive (not a torch.save file)", f->path);
    return 0;
}

// The uncompressed size of an entry, bounded by what its compressed bytes can hold.
static int entry_size(neox_pt_file *f, zip_int64_t index, const char *name, zip_uint64_t *size, neox_error *err) {
    zip_stat_t st;
    if (zip_stat_index(f->zip, (zip_uint64_t)index, 0, &st) != 0 ||
        (st.valid & (ZIP_STAT_SIZE | ZIP_STAT_COMP_SIZE | ZIP_STAT_COMP_METHOD)) !=
            (ZIP_STAT_SIZE | ZIP_STAT_COMP_SIZE | ZIP_STAT_COMP_METHOD))
        return zip_fail(err, f->path, name, zip_get_error(f->zip));
    int stored = st.comp_method == ZIP_CM_STORE;
    if ((stored && st.size != st.comp_size) ||
        (!stored && st.comp_size < UINT64_MAX / MAX_DEFLATE_RATIO && st.size > st.comp_size * MAX_DEFLATE_RATIO))
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s: claims %llu bytes from %llu compressed", f->path, name,
                         (unsigned long long)st.size, (unsigned long long)st.comp_size);
    *size = st.size;
    return 0;
}

// Reads bytes [offset, offset + n) of an entry into dst.
static int read_entry(neox_pt_file *f, zip_int64_t index, const char *name, zip_uint64_t offset, void *dst, size_t n,
                      neox_error *err) {
    zip_file_t *zf = zip_fopen_index(f->zip, (zip_uint64_t)index, 0);
    if (!zf) return zip_fail(err, f->path, name, zip_get_error(f->zip));
    int status = 0;
    if (offset && zip_fseek(zf, (zip_int64_t)offset, SEEK_SET) != 0) {
        // A compressed entry cannot seek: read up to the offset.
        char skip[65536];
        for (zip_uint64_t left = offset; left && status == 0;) {
            zip_int64_t got = zip_fread(zf, skip, left < sizeof skip ? left : sizeof skip);
            if (got <= 0) status = neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s: shorter than it claims", f->path, name);
            else left -= (zip_uint64_t)got;
        }
    }
    for (size_t done = 0; done < n && status == 0;) {
        zip_int64_t got = zip_fread(zf, (char *)dst + done, n - done);
        if (got < 0) status = zip_fail(err, f->path, name, zip_file_get_error(zf));
        else if (got == 0) status = neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s: shorter than it claims", f->path, name);
        else done += (size_t)got;
    }
    zip_fclose(zf);
    return status;
}

static zip_int64_t storage_index(neox_pt_file *f, const neox_pt_storage *s) {
    char *name = neox_asprintf("%sdata/%s", f->prefix, s->key);
    zip_int64_t index = zip_name_locate(f->zip, name, 0);
    free(name);
    return index;
}

// The largest element index a tensor reaches plus one, or -1 when it overflows.
static int64_t tensor_extent(const neox_pt_tensor *t) {
    int64_t last = t->offset;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 0) return 0;
        if (t->stride[i] && t->shape[i] - 1 > (INT64_MAX - last) / t->stride[i]) return -1;
        last += (t->shape[i] - 1) * t->stride[i];
    }
    return last == INT64_MAX ? -1 : last + 1;
}

// Sizes each storage from its entry, then checks every tensor against its storage.
static int check_tensors(neox_pt_file *f, neox_error *err) {
    neox_pt_storage **storages;
    int ns = neox_pt_arena_storages(f->arena, &storages);
    for (int i = 0; i < ns; i++) {
        zip_int64_t index = storage_index(f, storages[i]);
        if (index < 0)
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s: storage '%s' has no entry data/%s in the archive", f->path,
                             storages[i]->key, storages[i]->key);
        zip_uint64_t size;
        if (entry_size(f, index, storages[i]->key, &size, err) < 0) return -1;
        storages[i]->bytes = size;
    }
    neox_pt_tensor **tensors;
    int nt = neox_pt_arena_tensors(f->arena, &tensors);
    for (int i = 0; i < nt; i++) {
        const neox_pt_tensor *t = tensors[i];
        int64_t extent = tensor_extent(t);
        size_t esize = neox_pt_dtype_size(t->dtype);
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++)
            numel = t->shape[d] && numel > INT64_MAX / t->shape[d] ? -1 : numel * t->shape[d];
        if (extent < 0 || numel < 0 || (uint64_t)extent > t->storage->bytes / esize || (uint64_t)numel > SIZE_MAX / esize)
            return neox_fail(err, NEOX_EXIT_FAILURE,
                             "%s: a %s tensor reaches past its storage '%s' (%llu bytes): storage shorter than the tensor",
                             f->path, neox_pt_dtype_name(t->dtype), t->storage->key,
                             (unsigned long long)t->storage->bytes);
    }
    return 0;
}

static int read_pickle(neox_pt_file *f, neox_error *err) {
    zip_int64_t index = -1;
    zip_uint64_t size;
    if (find_pickle(f, &index, err) < 0) return -1;
    char *name = neox_asprintf("%sdata.pkl", f->prefix);
    int status = entry_size(f, index, name, &size, err);
    if (status == 0 && size > MAX_PICKLE_BYTES)
        status = neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s is %llu bytes, larger than a checkpoint's pickle", f->path,
                           name, (unsigned long long)size);
    unsigned char *buf = status == 0 ? neox_malloc(size ? size : 1) : NULL;
    if (status == 0) status = read_entry(f, index, name, 0, buf, size, err);
    if (status == 0) {
        char *what = neox_asprintf("%s (%s)", f->path, name);
        f->root = neox_pt_unpickle(buf, size, what, &f->arena, err);
        free(what);
        if (!f->root) status = -1;
    }
    free(buf);
    free(name);
    return status;
}

neox_pt_file *neox_pt_open(const char *path, neox_error *err) {
    neox_pt_file *f = neox_calloc(1, sizeof *f);
    f->path = neox_strdup(path);
    int code = 0;
    f->zip = zip_open(path, ZIP_RDONLY | ZIP_CHECKCONS, &code);
    if (!f->zip) {
        zip_error_t ze;
        zip_error_init_with_code(&ze, code);
        zip_fail(err, path, "not a readable zip archive (torch.save's format)", &ze);
        zip_error_fini(&ze);
        neox_pt_close(f);
        return NULL;
    }
    if (read_pickle(f, err) < 0 || check_tensors(f, err) < 0) {
        neox_pt_close(f);
        return NULL;
    }
    return f;
}

void neox_pt_close(neox_pt_file *f) {
    if (!f) return;
    if (f->zip) zip_discard(f->zip);
    neox_pt_arena_free(f->arena);
    free(f->prefix);
    free(f->path);
    free(f);
}

// Copies the elements of dims [d, ndim) from src (at element index `at` relative to span) to dst.
static void gather(const neox_pt_tensor *t, int d, const unsigned char *span, int64_t at, size_t esize,
                   unsigned char **dst) {
    if (d == t->ndim) {
        memcpy(*dst, span + (size_t)at * esize, esize);
        *dst += esize;
        return;
    }
    if (d == t->ndim - 1 && t->stride[d] == 1) {
        size_t bytes = (size_t)t->shape[d] * esize;
        memcpy(*dst, span + (size_t)at * esize, bytes);
        *dst += bytes;
        return;
    }
    for (int64_t i = 0; i < t->shape[d]; i++) gather(t, d + 1, span, at + i * t->stride[d], esize, dst);
}

int neox_pt_read(neox_pt_file *f, const neox_pt_tensor *t, void *dst, neox_error *err) {
    int64_t extent = tensor_extent(t);
    if (neox_pt_numel(t) == 0 || extent == 0) return 0;
    size_t esize = neox_pt_dtype_size(t->dtype);
    size_t span_bytes = (size_t)(extent - t->offset) * esize;
    zip_int64_t index = storage_index(f, t->storage);
    neox_assert(index >= 0, "storage checked at open");
    unsigned char *span = neox_malloc(span_bytes);
    int status = read_entry(f, index, t->storage->key, (zip_uint64_t)t->offset * esize, span, span_bytes, err);
    if (status == 0) {
        unsigned char *out = dst;
        gather(t, 0, span, 0, esize, &out);
    }
    free(span);
    return status;
}

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0x1f) bits = sign | 0x7f800000u | mant << 13;
    else if (exp) bits = sign | (exp + 112) << 23 | mant << 13;
    else if (!mant) bits = sign;
    else {  // subnormal: normalise
        int e = -1;
        do {
            e++;
            mant <<= 1;
        } while (!(mant & 0x400));
        bits = sign | (uint32_t)(112 - e) << 23 | (mant & 0x3ff) << 13;
    }
    float x;
    memcpy(&x, &bits, 4);
    return x;
}

int neox_pt_read_f32(neox_pt_file *f, const neox_pt_tensor *t, const char *what, float *dst, neox_error *err) {
    if (t->dtype != NEOX_PT_F32 && t->dtype != NEOX_PT_F16 && t->dtype != NEOX_PT_BF16 && t->dtype != NEOX_PT_F64)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s is a %s tensor, not a floating-point one", f->path, what,
                         neox_pt_dtype_name(t->dtype));
    if (t->dtype == NEOX_PT_F32) return neox_pt_read(f, t, dst, err);
    size_t n = (size_t)neox_pt_numel(t);
    void *raw = neox_malloc(n * neox_pt_dtype_size(t->dtype) + 1);
    int status = neox_pt_read(f, t, raw, err);
    for (size_t i = 0; status == 0 && i < n; i++) {
        if (t->dtype == NEOX_PT_F64) {
            dst[i] = (float)((const double *)raw)[i];
        } else if (t->dtype == NEOX_PT_F16) {
            dst[i] = half_to_float(((const uint16_t *)raw)[i]);
        } else {
            uint32_t bits = (uint32_t)((const uint16_t *)raw)[i] << 16;
            memcpy(&dst[i], &bits, 4);
        }
    }
    free(raw);
    return status;
}

const neox_pt_value *neox_pt_get(const neox_pt_value *v, const char *key) {
    if (!v || (v->kind != NEOX_PT_DICT && v->kind != NEOX_PT_RECORD)) return NULL;
    size_t n = strlen(key);
    for (int i = 0; i < v->count; i++)
        if (v->keys[i]->kind == NEOX_PT_STR && v->keys[i]->len == n && memcmp(v->keys[i]->str, key, n) == 0)
            return v->items[i];
    return NULL;
}

// One step of a path: a string key, or for a list/tuple an index (and for a dict an integer key).
static const neox_pt_value *step_into(const neox_pt_value *v, const char *key) {
    char *end;
    long index = strtol(key, &end, 10);
    int numeric = *key && !*end;
    if (numeric && (v->kind == NEOX_PT_LIST || v->kind == NEOX_PT_TUPLE))
        return index >= 0 && index < v->count ? v->items[index] : NULL;
    if (numeric && v->kind == NEOX_PT_DICT)
        for (int i = 0; i < v->count; i++)
            if (v->keys[i]->kind == NEOX_PT_INT && v->keys[i]->i == index) return v->items[i];
    return neox_pt_get(v, key);
}

const neox_pt_value *neox_pt_find(const neox_pt_value *v, const char *path) {
    char *copy = neox_strdup(path), *save = NULL;
    for (char *key = strtok_r(copy, ".", &save); key && v; key = strtok_r(NULL, ".", &save)) v = step_into(v, key);
    free(copy);
    return v;
}

int neox_pt_number(const neox_pt_file *f, const neox_pt_value *v, const char *what, double *out, neox_error *err) {
    if (v && (v->kind == NEOX_PT_INT || v->kind == NEOX_PT_BOOL)) *out = (double)v->i;
    else if (v && v->kind == NEOX_PT_FLOAT) *out = v->f;
    else return neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s is %s, not a number", f->path, what, v ? "not a number" : "missing");
    return 0;
}

int neox_pt_integer(const neox_pt_file *f, const neox_pt_value *v, const char *what, int64_t *out, neox_error *err) {
    if (!v || (v->kind != NEOX_PT_INT && v->kind != NEOX_PT_BOOL))
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s is %s, not an integer", f->path, what, v ? "present" : "missing");
    *out = v->i;
    return 0;
}
