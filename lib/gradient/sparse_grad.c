// sparse_grad.c: sparse_gradients — the input embedding's gradient summed (or averaged) over the
// data group as (row ids, rows) for the rows each rank's tokens touched, instead of a dense
// all-reduce of the whole vocabulary x hidden matrix. Three all-gathers: the counts, the ids, the rows (variable
// counts); every rank then sums the gathered rows in rank order, so all ranks hold the same result.
//
// Exactness: a row nobody touched has gradient exactly zero on every rank, so it needs no message.
// A touched row becomes ((0 + g_0) + g_1) + ... over the ranks that touched it, in rank order; the
// dense all-reduce adds the same values (zeros for untouched copies) in MPI's order. For two ranks
// both orders are g_0 + g_1 (addition commutes exactly), so the result is bit-identical; for more
// ranks MPI may associate differently (for example (g_0 + g_1) + (g_2 + g_3)), a difference of a
// few ulps per element (docs/communication.md).
//
// Where things live: the marks, the counts and the row ids are the host's (ids come from the
// tokens); the gradient and the gathered rows are the backend's, gathered by id (gather_rows), summed
// by id in rank order (rows_sum_by_id) and scaled (scale, scale_rows) by its ops.
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "gradient.h"

struct neox_sparse_rows {
    neox_comm *c;
    const neox_backend *be;
    int64_t rows, width, row_begin;  // this rank's block of the embedding: global rows [row_begin, +rows)
    double predivide;
    int mean_over;                   // the sum is divided by this many ranks (1: left a sum)
    uint8_t *touched;                // per local row: touched by this rank's tokens since the last reduce
    int32_t *ids;                    // gathered ids (capacity cap_ids), then the distinct ones
    int32_t *dev_ids;                // the same on the backend
    float *vals;                     // gathered rows, on the backend
    size_t cap_ids;
    int *counts, *elems;             // per rank: ids, floats
};

neox_sparse_rows *neox_sparse_rows_make(neox_comm *c, const neox_backend *be, int64_t rows, int64_t width,
                                        int64_t row_begin, double predivide, int mean_over) {
    neox_sparse_rows *s = neox_calloc(1, sizeof *s);
    s->c = c, s->be = be ? be : neox_backend_cpu(), s->rows = rows, s->width = width, s->row_begin = row_begin;
    s->predivide = predivide > 0 ? predivide : 1.0;
    s->mean_over = mean_over > 0 ? mean_over : c->size;
    s->touched = neox_calloc((size_t)rows + 1, 1);
    s->counts = neox_calloc((size_t)c->size, sizeof(int));
    s->elems = neox_calloc((size_t)c->size, sizeof(int));
    return s;
}

void neox_sparse_rows_free(neox_sparse_rows *s) {
    if (!s) return;
    if (s->dev_ids) s->be->free(s->dev_ids);
    if (s->vals) s->be->free(s->vals);
    free(s->touched), free(s->ids), free(s->counts), free(s->elems), free(s);
}

void neox_sparse_rows_touch(neox_sparse_rows *s, const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int64_t r = (int64_t)ids[i] - s->row_begin;
        if (r >= 0 && r < s->rows) s->touched[r] = 1;
    }
}

static void reserve(neox_sparse_rows *s, size_t ids) {
    if (ids <= s->cap_ids) return;
    s->cap_ids = ids;
    free(s->ids);
    if (s->dev_ids) s->be->free(s->dev_ids), s->be->free(s->vals);
    s->ids = neox_malloc(ids * sizeof *s->ids);
    s->dev_ids = s->be->alloc(ids * sizeof *s->dev_ids);
    s->vals = s->be->alloc(ids * (size_t)s->width * sizeof *s->vals);
}

static void ids_to_backend(neox_sparse_rows *s, size_t first, size_t n) {
    s->be->to_device(s->dev_ids + first, s->ids + first, n * sizeof *s->ids);
}

// Sums the gathered rows into grad, rank by rank, and scales the rows that were touched anywhere.
static void sum_rows(neox_sparse_rows *s, float *grad, size_t total) {
    int w = (int)s->width;
    ids_to_backend(s, 0, total);
    s->be->rows_sum_by_id(grad, s->vals, s->dev_ids, (int)total, w);
    float after = (float)(s->predivide / s->mean_over);
    if (after == 1.0f) return;
    // Each distinct row once: the touched mask now marks the union, and the ids list the distinct
    // rows (to_device is ordered after the sum queued above, which reads the gathered list).
    memset(s->touched, 0, (size_t)s->rows);
    size_t distinct = 0;
    for (size_t i = 0; i < total; i++) {
        if (s->touched[s->ids[i]]) continue;
        s->touched[s->ids[i]] = 1;
        s->ids[distinct++] = s->ids[i];
    }
    ids_to_backend(s, 0, distinct);
    s->be->scale_rows(grad, s->dev_ids, (int)distinct, w, after);
}

// This rank's touched rows, ascending, at its place [before, + mine) in the gathered buffers, each
// divided by predivide.
static void gather_mine(neox_sparse_rows *s, const float *grad, size_t before, size_t mine) {
    size_t w = (size_t)s->width, k = before;
    for (int64_t r = 0; r < s->rows; r++)
        if (s->touched[r]) s->ids[k++] = (int32_t)r;
    ids_to_backend(s, before, mine);
    s->be->gather_rows(s->vals + before * w, grad, s->dev_ids + before, (int)mine, (int)w, NEOX_ELEM_F32);
    float inv = (float)(1.0 / s->predivide);
    if (inv != 1.0f) s->be->scale(s->vals + before * w, mine * w, inv);
}

void neox_sparse_rows_reduce(neox_sparse_rows *s, float *grad) {
    neox_comm *c = s->c;
    size_t w = (size_t)s->width;
    int32_t mine = 0;
    for (int64_t r = 0; r < s->rows; r++) mine += s->touched[r];
    neox_allgather(c, &mine, s->counts, 1, NEOX_I32);
    size_t total = 0, before = 0;
    for (int q = 0; q < c->size; q++) {
        if (q == c->rank) before = total;
        total += (size_t)s->counts[q];
        // A count MPI cannot take ends the job (docs/design.md, "Errors"): every rank has the same
        // counts from the all-gather, so all of them stop here rather than one leaving its peers
        // waiting in the next collective.
        if ((size_t)s->counts[q] * w > INT_MAX)
            neox_die(NEOX_EXIT_FAILURE, "sparse gradients: %d rows of %zu are too many for one message", s->counts[q], w);
        s->elems[q] = s->counts[q] * (int)w;
    }
    reserve(s, total ? total : 1);
    gather_mine(s, grad, before, (size_t)mine);
    neox_allgatherv_inplace(c, s->ids, s->counts, NEOX_I32);
    neox_allgatherv_inplace(c, s->vals, s->elems, NEOX_F32);
    sum_rows(s, grad, total);
    memset(s->touched, 0, (size_t)s->rows);
}
