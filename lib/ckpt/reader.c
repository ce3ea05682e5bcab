// reader.c: reads layout-free checkpoints (see ckpt.h). Opening indexes every piece of every shard
// file; reading a region (a block or a flat range of a tensor) cuts each overlapping piece into row
// segments — runs that never cross a row of the last dimension — and copies each segment's part
// inside the region. A bitmap of the region records coverage, so a missing shard is an error that
// names the first element no file holds, never silently zero.
#include "ckpt.h"

#include <errno.h>
#include <hdf5.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/hdf5_util.h"

typedef enum { PIECE_BLOCK, PIECE_RANGE, PIECE_BYTES } piece_kind;

typedef struct piece {
    int file;                          // index into reader->files
    char *dataset;                     // path of the dataset in that file
    piece_kind kind;
    int64_t offset[NEOX_CKPT_MAX_DIMS];  // PIECE_BLOCK: where the block starts
    int64_t count[NEOX_CKPT_MAX_DIMS];   // PIECE_BLOCK: its extent
    int64_t start, n;                  // PIECE_RANGE: flat elements [start, start + n); PIECE_BYTES: n bytes
} piece;

typedef struct tensor {
    char *name;
    int ndim;
    int64_t shape[NEOX_CKPT_MAX_DIMS];
    int is_bytes;
    piece *pieces;
    int npieces;
} tensor;

struct neox_ckpt_reader {
    hid_t *files;
    char **paths;
    int nfiles;
    tensor *tensors;  // sorted by name once opened
    int ntensors, cap;
    uint64_t stored_bytes;  // what the datasets of every file store, together
};

// ---- indexing ---------------------------------------------------------------------------------

static int read_attr_str(hid_t obj, const char *name, char *buf, size_t size) {
    if (H5Aexists(obj, name) <= 0) return -1;
    hid_t attr = H5Aopen(obj, name, H5P_DEFAULT);
    hid_t type = H5Aget_type(attr);
    int rc = -1;
    size_t len = H5Tget_size(type);
    if (H5Tget_class(type) == H5T_STRING && !H5Tis_variable_str(type) && len > 0 && len < size) {
        hid_t mem = H5Tcopy(H5T_C_S1);
        H5Tset_size(mem, len);
        if (H5Aread(attr, mem, buf) >= 0) buf[len] = '\0', rc = 0;
        H5Tclose(mem);
    }
    H5Tclose(type);
    H5Aclose(attr);
    return rc;
}

// Reads a 1-D int64 attribute of at most max values; returns the count or -1. A null dataspace
// (what a 0-dimensional shape is written as) gives 0.
static int read_attr_i64(hid_t obj, const char *name, int64_t *values, int max) {
    if (H5Aexists(obj, name) <= 0) return -1;
    hid_t attr = H5Aopen(obj, name, H5P_DEFAULT);
    hid_t space = H5Aget_space(attr);
    hid_t type = H5Aget_type(attr);
    int rc = -1;
    if (H5Sget_simple_extent_type(space) == H5S_NULL) rc = 0;
    else if (H5Tget_class(type) == H5T_INTEGER && H5Sget_simple_extent_ndims(space) == 1) {
        hssize_t n = H5Sget_simple_extent_npoints(space);
        if (n >= 0 && n <= max && H5Aread(attr, H5T_NATIVE_INT64, values) >= 0) rc = (int)n;
    }
    H5Tclose(type);
    H5Sclose(space);
    H5Aclose(attr);
    return rc;
}

static tensor *find_tensor(const neox_ckpt_reader *r, const char *name) {
    for (int lo = 0, hi = r->ntensors - 1; lo <= hi;) {
        int mid = (lo + hi) / 2, c = strcmp(name, r->tensors[mid].name);
        if (c == 0) return &r->tensors[mid];
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

// During indexing tensors are unsorted; a linear search keeps opening simple (it runs once).
static tensor *tensor_for(neox_ckpt_reader *r, const char *name) {
    for (int i = 0; i < r->ntensors; i++)
        if (!strcmp(r->tensors[i].name, name)) return &r->tensors[i];
    if (r->ntensors == r->cap) r->tensors = neox_realloc(r->tensors, (r->cap = r->cap ? 2 * r->cap : 64) * sizeof(tensor));
    tensor *t = &r->tensors[r->ntensors++];
    memset(t, 0, sizeof *t);
    t->name = neox_strdup(name);
    t->ndim = -1;
    return t;
}

typedef struct visit_state {
    neox_ckpt_reader *r;
    int file;
    neox_error *err;
} visit_state;

// Elements of a shape, or -1 when a dimension is negative or the product exceeds
// NEOX_CKPT_MAX_ELEMENTS (which keeps every byte count derived from it inside int64_t).
static int64_t shape_elements(const int64_t *shape, int ndim) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0 || (shape[d] && n > NEOX_CKPT_MAX_ELEMENTS / shape[d])) return -1;
        n *= shape[d];
    }
    return n;
}

// A dataset's extent is only a claim: refuses one whose elements the file does not store (a small
// file claiming gigabytes), before anything is allocated for it. The writer stores every dataset
// contiguously and uncompressed, so its storage holds each element.
static int check_stored(visit_state *vs, hid_t dset, const char *path, int rank, const hsize_t *dims) {
    uint64_t elements = 1;
    for (int d = 0; d < rank; d++) elements = dims[d] && elements > UINT64_MAX / dims[d] ? UINT64_MAX : elements * dims[d];
    hid_t type = H5Dget_type(dset);
    size_t elem_size = type >= 0 ? H5Tget_size(type) : 0;
    if (type >= 0) H5Tclose(type);
    uint64_t stored = (uint64_t)H5Dget_storage_size(dset);
    vs->r->stored_bytes += stored;
    if (rank < 0 || elem_size == 0 || elements > stored / elem_size)
        return neox_fail(vs->err, NEOX_EXIT_FAILURE,
                         "%s: dataset '%s' claims %llu elements but the file stores %llu bytes of it (damaged or forged)",
                         vs->r->paths[vs->file], path, (unsigned long long)elements, (unsigned long long)stored);
    return 0;
}

// Reads one dataset's tags into a piece; fails naming the file and dataset when they are wrong.
static int index_dataset(visit_state *vs, hid_t dset, const char *path) {
    const char *file = vs->r->paths[vs->file];
    char kind[16];
    int64_t shape[NEOX_CKPT_MAX_DIMS], offset[NEOX_CKPT_MAX_DIMS], start = 0;
    if (read_attr_str(dset, "neox_piece", kind, sizeof kind) < 0)
        return neox_fail(vs->err, NEOX_EXIT_FAILURE, "%s: dataset '%s' has no valid 'neox_piece' attribute", file, path);
    hid_t space = H5Dget_space(dset);
    int rank = H5Sget_simple_extent_ndims(space);
    hsize_t dims[H5S_MAX_RANK] = {0};
    if (rank > 0 && rank <= H5S_MAX_RANK) H5Sget_simple_extent_dims(space, dims, NULL);
    H5Sclose(space);
    if (check_stored(vs, dset, path, rank, dims) != 0) return -1;
    piece p = {.file = vs->file, .dataset = NULL};
    int ndim = 0, is_bytes = 0;
    if (!strcmp(kind, "bytes")) {
        if (rank != 1) return neox_fail(vs->err, NEOX_EXIT_FAILURE, "%s: '%s' is not a 1-D byte string", file, path);
        p.kind = PIECE_BYTES, p.n = (int64_t)dims[0], is_bytes = 1;
    } else {
        ndim = read_attr_i64(dset, "global_shape", shape, NEOX_CKPT_MAX_DIMS);
        if (ndim < 0) return neox_fail(vs->err, NEOX_EXIT_FAILURE, "%s: '%s' has no valid 'global_shape'", file, path);
        if (shape_elements(shape, ndim) < 0)
            return neox_fail(vs->err, NEOX_EXIT_FAILURE,
                             "%s: '%s': global_shape is negative or has more than %lld elements", file, path,
                             (long long)NEOX_CKPT_MAX_ELEMENTS);
        if (!strcmp(kind, "block")) {
            if (read_attr_i64(dset, "offset", offset, NEOX_CKPT_MAX_DIMS) != ndim || rank != (ndim ? ndim : 1))
                return neox_fail(vs->err, NEOX_EXIT_FAILURE, "%s: '%s': 'offset' or dataset rank does not match global_shape",
                                 file, path);
            p.kind = PIECE_BLOCK;
            for (int d = 0; d < ndim; d++) {
                p.offset[d] = offset[d];
                p.count[d] = (int64_t)dims[d];
                if (offset[d] < 0 || p.count[d] > shape[d] || offset[d] > shape[d] - p.count[d])
                    return neox_fail(vs->err, NEOX_EXIT_FAILURE, "%s: '%s': block outside global_shape in dimension %d",
                                     file, path, d);
            }
        } else if (!strcmp(kind, "range")) {
            int64_t total = shape_elements(shape, ndim);
            if (read_attr_i64(dset, "range_start", &start, 1) != 1 || rank != 1 || start < 0 ||
                (int64_t)dims[0] > total || start > total - (int64_t)dims[0])
                return neox_fail(vs->err, NEOX_EXIT_FAILURE, "%s: '%s': 'range_start' missing or range outside the tensor",
                                 file, path);
            p.kind = PIECE_RANGE, p.start = start, p.n = (int64_t)dims[0];
        } else
            return neox_fail(vs->err, NEOX_EXIT_FAILURE, "%s: '%s': unknown piece kind '%s'", file, path, kind);
    }
    tensor *t = tensor_for(vs->r, path);
    if (t->ndim >= 0 && (t->is_bytes != is_bytes || t->ndim != ndim || memcmp(t->shape, shape, ndim * sizeof *shape)))
        return neox_fail(vs->err, NEOX_EXIT_FAILURE, "%s: '%s': global shape differs from the one in %s", file, path,
                         vs->r->paths[t->pieces[0].file]);
    if (is_bytes && t->npieces > 0)
        return neox_fail(vs->err, NEOX_EXIT_FAILURE, "%s: byte string '%s' is also in %s", file, path,
                         vs->r->paths[t->pieces[0].file]);
    t->ndim = ndim, t->is_bytes = is_bytes;
    memcpy(t->shape, shape, ndim * sizeof *shape);
    p.dataset = neox_strdup(path);
    t->pieces = neox_realloc(t->pieces, (t->npieces + 1) * sizeof(piece));
    t->pieces[t->npieces++] = p;
    return 0;
}

// HDF5 1.12 changed the object-visit API; these names pick the one the installed HDF5 has.
#if H5_VERSION_GE(1, 12, 0)
typedef H5O_info2_t object_info;
#define visit_objects(file, fn, data) H5Ovisit3(file, H5_INDEX_NAME, H5_ITER_INC, fn, data, H5O_INFO_BASIC)
#else
typedef H5O_info_t object_info;
#define visit_objects(file, fn, data) H5Ovisit2(file, H5_INDEX_NAME, H5_ITER_INC, fn, data, H5O_INFO_BASIC)
#endif

static herr_t visit_object(hid_t root, const char *path, const object_info *info, void *data) {
    visit_state *vs = data;
    if (info->type != H5O_TYPE_DATASET) return 0;
    hid_t dset = H5Dopen2(root, path, H5P_DEFAULT);
    if (dset < 0) {
        char msg[256];
        neox_fail(vs->err, NEOX_EXIT_FAILURE, "%s: cannot open dataset '%s': %s", vs->r->paths[vs->file], path,
                  neox_hdf5_error(msg));
        return -1;
    }
    int rc = index_dataset(vs, dset, path);
    H5Dclose(dset);
    return rc < 0 ? -1 : 0;
}

static int compare_tensors(const void *a, const void *b) {
    return strcmp(((const tensor *)a)->name, ((const tensor *)b)->name);
}

// A global shape is a claim too: no tensor may have more elements than the open files store in
// all (plus CLAIM_SLACK_BYTES, so that a small checkpoint missing a shard is still diagnosed when
// a region is read, naming the first element no file holds), so no allocation sized by a shape (a
// model built from it, a tensor read whole) exceeds what the files hold.
enum { CLAIM_SLACK_BYTES = 1 << 20 };
static int check_claims(const neox_ckpt_reader *r, neox_error *err) {
    for (int i = 0; i < r->ntensors; i++) {
        const tensor *t = &r->tensors[i];
        int64_t claimed = shape_elements(t->shape, t->ndim);
        if (!t->is_bytes && (uint64_t)claimed > (r->stored_bytes + CLAIM_SLACK_BYTES) / sizeof(float))
            return neox_fail(err, NEOX_EXIT_FAILURE,
                             "%s: tensor '%s' claims %lld elements, more than the shards store in all (%llu bytes)",
                             r->paths[t->pieces[0].file], t->name, (long long)claimed, (unsigned long long)r->stored_bytes);
    }
    return 0;
}

neox_ckpt_reader *neox_ckpt_reader_open(const char *const *paths, int npaths, neox_error *err) {
    neox_hdf5_quiet();
    neox_ckpt_reader *r = neox_calloc(1, sizeof *r);
    r->files = neox_calloc(npaths, sizeof(hid_t));
    r->paths = neox_calloc(npaths, sizeof(char *));
    for (int i = 0; i < npaths; i++) {
        char msg[256];
        r->paths[i] = neox_strdup(paths[i]);
        r->files[i] = H5Fopen(paths[i], H5F_ACC_RDONLY, H5P_DEFAULT);
        r->nfiles = i + 1;
        if (r->files[i] < 0) {
            neox_fail(err, NEOX_EXIT_FAILURE, "%s: not a readable checkpoint shard: %s", paths[i], neox_hdf5_error(msg));
            neox_ckpt_reader_close(r);
            return NULL;
        }
        visit_state vs = {r, i, err};
        if (visit_objects(r->files[i], visit_object, &vs) < 0) {
            if (!err || !err->status) neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot index: %s", paths[i], neox_hdf5_error(msg));
            neox_ckpt_reader_close(r);
            return NULL;
        }
    }
    if (r->ntensors > 1) qsort(r->tensors, r->ntensors, sizeof(tensor), compare_tensors);
    if (check_claims(r, err) != 0) {
        neox_ckpt_reader_close(r);
        return NULL;
    }
    return r;
}

void neox_ckpt_reader_close(neox_ckpt_reader *r) {
    if (!r) return;
    for (int i = 0; i < r->ntensors; i++) {
        for (int j = 0; j < r->tensors[i].npieces; j++) free(r->tensors[i].pieces[j].dataset);
        free(r->tensors[i].pieces);
        free(r->tensors[i].name);
    }
    for (int i = 0; i < r->nfiles; i++) {
        if (r->files[i] >= 0) H5Fclose(r->files[i]);
        free(r->paths[i]);
    }
    free(r->tensors);
    free(r->files);
    free(r->paths);
    free(r);
}

int neox_ckpt_tensor_count(const neox_ckpt_reader *r) { return r->ntensors; }
const char *neox_ckpt_tensor_name(const neox_ckpt_reader *r, int i) {
    return i >= 0 && i < r->ntensors ? r->tensors[i].name : NULL;
}
int neox_ckpt_has(const neox_ckpt_reader *r, const char *name) { return find_tensor(r, name) != NULL; }

static const tensor *lookup(const neox_ckpt_reader *r, const char *name, int want_bytes, neox_error *err) {
    const tensor *t = find_tensor(r, name);
    if (!t) {
        neox_fail(err, NEOX_EXIT_FAILURE, "checkpoint has no tensor '%s'", name);
        return NULL;
    }
    if (t->is_bytes != want_bytes) {
        neox_fail(err, NEOX_EXIT_FAILURE, "checkpoint entry '%s' is %s", name, t->is_bytes ? "a byte string" : "a tensor");
        return NULL;
    }
    return t;
}

int neox_ckpt_tensor_shape(const neox_ckpt_reader *r, const char *name, int *ndim, int64_t *shape, neox_error *err) {
    const tensor *t = lookup(r, name, 0, err);
    if (!t) return -1;
    *ndim = t->ndim;
    memcpy(shape, t->shape, t->ndim * sizeof *shape);
    return 0;
}

// ---- reading regions --------------------------------------------------------------------------

// The region asked for, in the same row-segment terms as the pieces.
typedef struct region {
    int is_range;
    int64_t offset[NEOX_CKPT_MAX_DIMS], count[NEOX_CKPT_MAX_DIMS];  // block
    int64_t start, n;                                             // range
    int64_t size;                                                 // elements
} region;

typedef struct copy_state {
    const tensor *t;
    const region *want;
    float *dst;
    uint64_t *covered;  // one bit per element of the region
    int64_t row_len;    // length of the last dimension (1 for scalars)
} copy_state;

// Marks elements [lo, hi) of the region as covered, a word at a time where possible.
static void mark_covered(uint64_t *bits, int64_t lo, int64_t hi) {
    while (lo < hi && (lo & 63)) bits[lo >> 6] |= 1ull << (lo & 63), lo++;
    for (; lo + 64 <= hi; lo += 64) bits[lo >> 6] = ~0ull;
    for (; lo < hi; lo++) bits[lo >> 6] |= 1ull << (lo & 63);
}

// The first element of [0, n) not covered, or -1.
static int64_t first_uncovered(const uint64_t *bits, int64_t n) {
    for (int64_t w = 0; w * 64 < n; w++) {
        uint64_t want = (w + 1) * 64 <= n ? ~0ull : (1ull << (n - w * 64)) - 1;
        if ((bits[w] & want) != want) return w * 64 + __builtin_ctzll(~bits[w] & want);
    }
    return -1;
}

// Copies the part of one row segment that lies inside the region. The segment holds the
// elements [flat, flat + len) of the tensor, all in one row, from src.
static void copy_segment(copy_state *cs, int64_t flat, int64_t len, const float *src) {
    const region *w = cs->want;
    int64_t lo = flat, hi = flat + len, dst_of_lo;
    if (w->is_range) {
        if (lo < w->start) lo = w->start;
        if (hi > w->start + w->n) hi = w->start + w->n;
        if (lo >= hi) return;
        dst_of_lo = lo - w->start;
    } else {
        int nd = cs->t->ndim;
        if (nd == 0) {
            dst_of_lo = 0;
        } else {
            // Position of the row in the region, and the column interval inside it.
            int64_t row = flat / cs->row_len, col = flat % cs->row_len, region_row = 0;
            for (int d = nd - 2; d >= 0; d--) {
                int64_t idx = row % cs->t->shape[d];
                row /= cs->t->shape[d];
                if (idx < w->offset[d] || idx >= w->offset[d] + w->count[d]) return;
            }
            row = flat / cs->row_len;
            int64_t stride = 1;
            for (int d = nd - 2; d >= 0; d--) {
                int64_t idx = row % cs->t->shape[d];
                row /= cs->t->shape[d];
                region_row += (idx - w->offset[d]) * stride;
                stride *= w->count[d];
            }
            int64_t c_lo = col, c_hi = col + len, w_lo = w->offset[nd - 1], w_hi = w_lo + w->count[nd - 1];
            if (c_lo < w_lo) c_lo = w_lo;
            if (c_hi > w_hi) c_hi = w_hi;
            if (c_lo >= c_hi) return;
            lo = flat + (c_lo - col), hi = flat + (c_hi - col);
            dst_of_lo = region_row * w->count[nd - 1] + (c_lo - w_lo);
        }
    }
    memcpy(cs->dst + dst_of_lo, src + (lo - flat), (size_t)(hi - lo) * sizeof(float));
    mark_covered(cs->covered, dst_of_lo, dst_of_lo + (hi - lo));
}

static int64_t flat_index(const tensor *t, const int64_t *idx) {
    int64_t f = 0;
    for (int d = 0; d < t->ndim; d++) f = f * t->shape[d] + idx[d];
    return f;
}

// Cuts a piece's data (already read into buf) into row segments and copies each.
static void copy_piece(copy_state *cs, const piece *p, const float *buf) {
    const tensor *t = cs->t;
    if (p->kind == PIECE_RANGE) {
        for (int64_t f = p->start, end = p->start + p->n; f < end;) {
            int64_t row_end = (f / cs->row_len + 1) * cs->row_len;
            int64_t seg = (row_end < end ? row_end : end) - f;
            copy_segment(cs, f, seg, buf + (f - p->start));
            f += seg;
        }
        return;
    }
    if (t->ndim == 0) {
        copy_segment(cs, 0, 1, buf);
        return;
    }
    int nd = t->ndim;
    int64_t rows = 1, idx[NEOX_CKPT_MAX_DIMS];
    for (int d = 0; d < nd - 1; d++) rows *= p->count[d];
    int64_t width = p->count[nd - 1];
    if (width == 0) return;
    for (int64_t r = 0; r < rows; r++) {
        int64_t rem = r;
        for (int d = nd - 2; d >= 0; d--) idx[d] = p->offset[d] + rem % p->count[d], rem /= p->count[d];
        idx[nd - 1] = p->offset[nd - 1];
        copy_segment(cs, flat_index(t, idx), width, buf + r * width);
    }
}

// Whether a piece can touch the region at all (cheap box or interval test).
static int piece_overlaps(const tensor *t, const piece *p, const region *w) {
    if (p->kind == PIECE_BLOCK && !w->is_range) {
        for (int d = 0; d < t->ndim; d++)
            if (p->offset[d] >= w->offset[d] + w->count[d] || w->offset[d] >= p->offset[d] + p->count[d]) return 0;
        return 1;
    }
    if (p->kind == PIECE_RANGE && w->is_range) return p->start < w->start + w->n && w->start < p->start + p->n;
    return 1;  // mixed kinds: decided segment by segment
}

// Reads the intersection of a piece and a region of the same kind straight into dst through HDF5
// hyperslab selections: no staging buffer, no copy. Returns 1 when done, 0 when the kinds differ
// (the caller then takes the general path), -1 on an HDF5 error.
static int read_direct(hid_t dset, const tensor *t, const piece *p, const region *w, float *dst, uint64_t *covered) {
    int nd = t->ndim;
    hsize_t file_start[NEOX_CKPT_MAX_DIMS], count[NEOX_CKPT_MAX_DIMS], mem_dims[NEOX_CKPT_MAX_DIMS],
        mem_start[NEOX_CKPT_MAX_DIMS];
    int rank;
    if (p->kind == PIECE_BLOCK && w->is_range && nd > 0) {
        // A block of whole rows (every dimension after the first complete) inside the range is a
        // contiguous run of it: read all of it at its flat position.
        int64_t row = 1, numel;
        for (int d = 1; d < nd; d++) {
            if (p->offset[d] != 0 || p->count[d] != t->shape[d]) return 0;
            row *= t->shape[d];
        }
        int64_t start = p->offset[0] * row;
        numel = p->count[0] * row;
        if (start < w->start || start + numel > w->start + w->n) return 0;
        hsize_t dims = (hsize_t)w->n, at = (hsize_t)(start - w->start), n = (hsize_t)numel;
        hid_t mem_space = H5Screate_simple(1, &dims, NULL);
        herr_t rc = H5Sselect_hyperslab(mem_space, H5S_SELECT_SET, &at, NULL, &n, NULL);
        if (rc >= 0 && numel > 0) rc = H5Dread(dset, H5T_NATIVE_FLOAT, mem_space, H5S_ALL, H5P_DEFAULT, dst);
        H5Sclose(mem_space);
        if (rc < 0) return -1;
        mark_covered(covered, start - w->start, start - w->start + numel);
        return 1;
    }
    if (p->kind == PIECE_RANGE && w->is_range) {
        int64_t lo = p->start > w->start ? p->start : w->start;
        int64_t hi = p->start + p->n < w->start + w->n ? p->start + p->n : w->start + w->n;
        if (lo >= hi) return 1;
        rank = 1;
        file_start[0] = (hsize_t)(lo - p->start), count[0] = (hsize_t)(hi - lo);
        mem_dims[0] = (hsize_t)w->n, mem_start[0] = (hsize_t)(lo - w->start);
    } else if (p->kind == PIECE_BLOCK && !w->is_range && nd > 0) {
        rank = nd;
        for (int d = 0; d < nd; d++) {
            int64_t lo = p->offset[d] > w->offset[d] ? p->offset[d] : w->offset[d];
            int64_t hi = p->offset[d] + p->count[d] < w->offset[d] + w->count[d] ? p->offset[d] + p->count[d]
                                                                                  : w->offset[d] + w->count[d];
            if (lo >= hi) return 1;
            file_start[d] = (hsize_t)(lo - p->offset[d]), count[d] = (hsize_t)(hi - lo);
            mem_dims[d] = (hsize_t)w->count[d], mem_start[d] = (hsize_t)(lo - w->offset[d]);
        }
    } else {
        return 0;
    }
    hid_t file_space = H5Dget_space(dset), mem_space = H5Screate_simple(rank, mem_dims, NULL);
    herr_t rc = H5Sselect_hyperslab(file_space, H5S_SELECT_SET, file_start, NULL, count, NULL);
    if (rc >= 0) rc = H5Sselect_hyperslab(mem_space, H5S_SELECT_SET, mem_start, NULL, count, NULL);
    if (rc >= 0) rc = H5Dread(dset, H5T_NATIVE_FLOAT, mem_space, file_space, H5P_DEFAULT, dst);
    H5Sclose(mem_space);
    H5Sclose(file_space);
    if (rc < 0) return -1;
    // Coverage, one run per row of the intersection (the whole run for ranges).
    int64_t rows = 1;
    for (int d = 0; d < rank - 1; d++) rows *= (int64_t)count[d];
    for (int64_t row = 0; row < rows; row++) {
        int64_t rem = row, at = 0, stride = 1;
        for (int d = rank - 1; d >= 0; d--) {
            int64_t idx = d == rank - 1 ? (int64_t)mem_start[d] : (int64_t)mem_start[d] + rem % (int64_t)count[d];
            if (d < rank - 1) rem /= (int64_t)count[d];
            at += idx * stride;
            stride *= (int64_t)mem_dims[d];
        }
        mark_covered(covered, at, at + (int64_t)count[rank - 1]);
    }
    return 1;
}

// The whole tensor as a block region (0 when w is not the whole tensor): a block piece, say a
// column block of a row-parallel weight, then lands in it through one strided hyperslab read
// instead of being staged and cut row by row.
static int whole_as_block(const tensor *t, const region *w, region *block) {
    if (!w->is_range || w->start != 0 || t->ndim == 0) return 0;
    int64_t total = 1;
    for (int d = 0; d < t->ndim; d++) total *= t->shape[d];
    if (w->n != total) return 0;
    *block = (region){.is_range = 0, .size = total};
    for (int d = 0; d < t->ndim; d++) block->count[d] = t->shape[d];
    return 1;
}

static int read_region(const neox_ckpt_reader *r, const tensor *t, const region *w, float *dst, neox_error *err) {
    region block;
    int whole = whole_as_block(t, w, &block);
    copy_state cs = {t, w, dst, neox_calloc((size_t)(w->size + 63) / 64 + 1, sizeof(uint64_t)), 1};
    if (t->ndim > 0) cs.row_len = t->shape[t->ndim - 1];
    int rc = 0;
    for (int i = 0; i < t->npieces && rc == 0 && cs.row_len > 0; i++) {
        const piece *p = &t->pieces[i];
        if (!piece_overlaps(t, p, w)) continue;
        char msg[256];
        hid_t dset = H5Dopen2(r->files[p->file], p->dataset, H5P_DEFAULT);
        const region *as = whole && p->kind == PIECE_BLOCK ? &block : w;
        int direct = dset < 0 ? -1 : read_direct(dset, t, p, as, dst, cs.covered);
        if (direct == 0) {  // mixed kinds: stage the piece and cut it into row segments
            int64_t n = p->kind == PIECE_RANGE ? p->n : 1;
            if (p->kind == PIECE_BLOCK)
                for (int d = 0; d < t->ndim; d++) n *= p->count[d];
            char what[PATH_MAX + 256];
            snprintf(what, sizeof what, "%s (a piece of '%s')", r->paths[p->file], p->dataset);
            const char *previous = neox_alloc_reading(what);
            float *buf = neox_malloc((size_t)(n ? n : 1) * sizeof(float));
            neox_alloc_reading(previous);
            if (H5Dread(dset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) direct = -1;
            else copy_piece(&cs, p, buf);
            free(buf);
        }
        if (direct < 0)
            rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot read '%s': %s", r->paths[p->file], p->dataset,
                           neox_hdf5_error(msg));
        if (dset >= 0) H5Dclose(dset);
    }
    int64_t missing = rc == 0 ? first_uncovered(cs.covered, w->size) : -1;
    if (missing >= 0)
        rc = neox_fail(err, NEOX_EXIT_FAILURE,
                       "checkpoint tensor '%s': element %lld of the requested region is in no shard file (a shard is missing)",
                       t->name, (long long)missing);
    free(cs.covered);
    return rc;
}

int neox_ckpt_read_block(const neox_ckpt_reader *r, const char *name, const int64_t *offset, const int64_t *count,
                         float *dst, neox_error *err) {
    const tensor *t = lookup(r, name, 0, err);
    if (!t) return -1;
    region w = {.is_range = 0, .size = 1};
    for (int d = 0; d < t->ndim; d++) {
        if (offset[d] < 0 || count[d] < 0 || offset[d] + count[d] > t->shape[d])
            return neox_fail(err, NEOX_EXIT_FAILURE, "tensor '%s': requested block outside the tensor in dimension %d",
                             name, d);
        w.offset[d] = offset[d], w.count[d] = count[d], w.size *= count[d];
    }
    if (w.size == 0) return 0;
    int whole = 1;
    for (int d = 0; d < t->ndim; d++) whole &= offset[d] == 0 && count[d] == t->shape[d];
    // The whole tensor, row-major, is also the flat range [0, size): ranges then read directly.
    if (whole) w = (region){.is_range = 1, .start = 0, .n = w.size, .size = w.size};
    return read_region(r, t, &w, dst, err);
}

// The float tensor NAME when [start, start + n) lies inside it; NULL + err otherwise.
static const tensor *lookup_range(const neox_ckpt_reader *r, const char *name, int64_t start, int64_t n,
                                  neox_error *err) {
    const tensor *t = lookup(r, name, 0, err);
    if (!t) return NULL;
    int64_t total = 1;
    for (int d = 0; d < t->ndim; d++) total *= t->shape[d];
    if (start < 0 || n < 0 || start + n > total) {
        neox_fail(err, NEOX_EXIT_FAILURE, "tensor '%s': requested range [%lld, %lld) outside the tensor", name,
                  (long long)start, (long long)(start + n));
        return NULL;
    }
    return t;
}

int neox_ckpt_read_range(const neox_ckpt_reader *r, const char *name, int64_t start, int64_t n, float *dst,
                         neox_error *err) {
    const tensor *t = lookup_range(r, name, start, n, err);
    if (!t) return -1;
    region w = {.is_range = 1, .start = start, .n = n, .size = n};
    return n == 0 ? 0 : read_region(r, t, &w, dst, err);
}

// ---- copying a range into a file ------------------------------------------------------------

// Where a piece's elements lie in its file as one run of the tensor's own bytes: a range, or a
// block of whole rows, stored contiguously as native floats. Sets *flat (the first element) and
// *addr (its byte address) and returns 1; 0 when the piece is stored otherwise.
static int piece_run(const neox_ckpt_reader *r, const tensor *t, const piece *p, int64_t *flat, uint64_t *addr) {
    if (p->kind == PIECE_RANGE) *flat = p->start;
    else if (p->kind == PIECE_BLOCK && t->ndim > 0) {
        int64_t row = 1;
        for (int d = 1; d < t->ndim; d++) {
            if (p->offset[d] != 0 || p->count[d] != t->shape[d]) return 0;
            row *= t->shape[d];
        }
        *flat = p->offset[0] * row;
    } else return 0;
    hid_t dset = H5Dopen2(r->files[p->file], p->dataset, H5P_DEFAULT);
    if (dset < 0) return 0;
    hid_t type = H5Dget_type(dset);
    haddr_t at = H5Dget_offset(dset);
    int native = type >= 0 && H5Tequal(type, H5T_NATIVE_FLOAT) > 0;
    if (type >= 0) H5Tclose(type);
    H5Dclose(dset);
    *addr = (uint64_t)at;
    return native && at != HADDR_UNDEF;
}

static int64_t piece_elements(const tensor *t, const piece *p) {
    if (p->kind == PIECE_RANGE) return p->n;
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= p->count[d];
    return n;
}

// Copies len bytes between files in the kernel (no trip through user memory), falling back to
// pread/pwrite where the file systems cannot.
// Returns 0, or -1 with errno set and *write_side telling whether writing the output failed (a
// full disk) rather than reading the shard.
static int copy_bytes_between(int in, off_t in_at, int out, off_t out_at, size_t len, int *write_side) {
    *write_side = 0;
    while (len > 0) {
        ssize_t k = copy_file_range(in, &in_at, out, &out_at, len, 0);
        if (k > 0) {
            len -= (size_t)k;
            continue;
        }
        if (k == 0) errno = EIO;
        if (k == 0 || (errno != EXDEV && errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)) {
            *write_side = errno == ENOSPC || errno == EDQUOT || errno == EFBIG;
            return -1;
        }
        char buf[1 << 16];
        while (len > 0) {
            ssize_t got = pread(in, buf, len < sizeof buf ? len : sizeof buf, in_at);
            if (got <= 0) {
                if (got == 0) errno = EIO;
                return -1;
            }
            for (ssize_t put = 0; put < got;) {
                ssize_t w = pwrite(out, buf + put, (size_t)(got - put), out_at + put);
                if (w <= 0) {
                    if (w == 0) errno = ENOSPC;
                    *write_side = 1;
                    return -1;
                }
                put += w;
            }
            in_at += got, out_at += got, len -= (size_t)got;
        }
    }
    return 0;
}

static int file_descriptor(const neox_ckpt_reader *r, int file) {
    int *handle = NULL;
    return H5Fget_vfd_handle(r->files[file], H5P_DEFAULT, (void **)&handle) >= 0 && handle ? *handle : -1;
}

// Copies each overlapping piece's run straight from its shard file; 1 when every overlapping piece
// was a run (and the range is covered), 0 when one is not (nothing was claimed), -1 on failure.
static int copy_runs(const neox_ckpt_reader *r, const tensor *t, int64_t start, int64_t n, int fd, int64_t fd_offset,
                     neox_error *err) {
    uint64_t *covered = neox_calloc((size_t)(n + 63) / 64 + 1, sizeof(uint64_t));
    int rc = 1;
    for (int i = 0; i < t->npieces && rc == 1; i++) {
        const piece *p = &t->pieces[i];
        int64_t flat, lo, hi;
        uint64_t addr;
        if (!piece_run(r, t, p, &flat, &addr)) {
            rc = 0;
            break;
        }
        lo = flat > start ? flat : start;
        hi = flat + piece_elements(t, p) < start + n ? flat + piece_elements(t, p) : start + n;
        if (lo >= hi) continue;
        int in = file_descriptor(r, p->file), write_side = 0;
        if (in < 0 || copy_bytes_between(in, (off_t)(addr + (uint64_t)(lo - flat) * sizeof(float)), fd,
                                         (off_t)(fd_offset + (lo - start) * (int64_t)sizeof(float)),
                                         (size_t)(hi - lo) * sizeof(float), &write_side) != 0)
            rc = write_side ? neox_fail(err, NEOX_EXIT_FAILURE, "cannot write tensor '%s': %s", t->name, strerror(errno))
                            : neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot copy '%s': %s", r->paths[p->file],
                                        p->dataset, strerror(errno));
        else mark_covered(covered, lo - start, hi - start);
    }
    int64_t missing = rc == 1 ? first_uncovered(covered, n) : -1;
    if (missing >= 0)
        rc = neox_fail(err, NEOX_EXIT_FAILURE,
                       "checkpoint tensor '%s': element %lld of the requested range is in no shard file (a shard is missing)",
                       t->name, (long long)(start + missing));
    free(covered);
    return rc;
}

int neox_ckpt_copy_range_to_fd(const neox_ckpt_reader *r, const char *name, int64_t start, int64_t n, int fd,
                               int64_t fd_offset, neox_error *err) {
    const tensor *t = lookup_range(r, name, start, n, err);
    if (!t) return -1;
    if (n == 0) return 0;
    int rc = copy_runs(r, t, start, n, fd, fd_offset, err);
    if (rc != 0) return rc < 0 ? -1 : 0;
    // Some piece is stored another way: read the range into memory and write it.
    float *buf = neox_malloc((size_t)n * sizeof(float));
    rc = neox_ckpt_read_range(r, name, start, n, buf, err);
    size_t bytes = (size_t)n * sizeof(float), done = 0;
    while (rc == 0 && done < bytes) {
        ssize_t k = pwrite(fd, (char *)buf + done, bytes - done, (off_t)(fd_offset + (int64_t)done));
        if (k <= 0) rc = neox_fail(err, NEOX_EXIT_FAILURE, "cannot write tensor '%s': %s", name, strerror(errno));
        else done += (size_t)k;
    }
    free(buf);
    return rc;
}

int neox_ckpt_read_bytes(const neox_ckpt_reader *r, const char *name, void **data, size_t *size, neox_error *err) {
    const tensor *t = lookup(r, name, 1, err);
    if (!t) return -1;
    const piece *p = &t->pieces[0];
    char what[PATH_MAX + 256];
    snprintf(what, sizeof what, "%s (byte string '%s')", r->paths[p->file], p->dataset);
    const char *previous = neox_alloc_reading(what);
    unsigned char *buf = neox_malloc((size_t)p->n + 1);
    neox_alloc_reading(previous);
    hid_t dset = H5Dopen2(r->files[p->file], p->dataset, H5P_DEFAULT);
    char msg[256];
    if (dset < 0 || (p->n > 0 && H5Dread(dset, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0)) {
        if (dset >= 0) H5Dclose(dset);
        free(buf);
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot read '%s': %s", r->paths[p->file], p->dataset,
                         neox_hdf5_error(msg));
    }
    H5Dclose(dset);
    buf[p->n] = '\0';
    *data = buf;
    *size = (size_t)p->n;
    return 0;
}
