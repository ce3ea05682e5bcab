// powersgd.c: PowerSGD (Vogels et al. 2019), the low-rank compressed all-reduce with error
// feedback of gradient.h. Per matrix M (n x m, plus this rank's error E): M' = M + E, P = M' Q,
// P averaged over the ranks and orthonormalised, Q = M'^T P averaged, and M becomes P Q^T; E keeps
// M' - P Q^T. Q persists between calls (one power iteration per step, warm-started), identical on
// every rank. Vectors, and matrices too small for rank r to pay, travel uncompressed beside P.
// Two all-reduces per call: [every P, every uncompressed element], then [every Q]. Adaptive
// compression changes the rank per bucket: each matrix's Q is stored at the largest rank and a call
// uses its leading columns, so a rank change moves no state (see neox_powersgd_set_rank). Every
// buffer (the error, Q, both messages) lives on the gradients' backend and every pass over one is
// its op (gemm_ex, orthonormalise_columns, add_inplace, add_scaled, scale, copy_matrix); the host
// only writes Q's random starting columns.
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "gradient.h"

// C = op(A) op(B) in fp32, through the backend's GEMM op.
static void f32_gemm(const neox_backend *be, int trans_a, int trans_b, int M, int N, int K, const float *A, int lda,
                     const float *B, int ldb, float *C, int ldc) {
    be->gemm_ex(trans_a, trans_b, M, N, K, 1.0f, A, lda, B, ldb, NEOX_ELEM_F32, 0.0f, C, ldc, NEOX_ELEM_F32);
}

typedef struct matrix {
    size_t offset;     // in the caller's buffer
    int rows, cols;
    int slot;          // it pays at the smallest rank: it has an error and a Q (cols x max_rank)
    int r;             // the rank it uses now; 0: sent uncompressed
    size_t err, q;     // offsets in the error buffer and the Q state
} matrix;

struct neox_powersgd {
    neox_comm *comm;
    const neox_backend *be;
    int n, max_rank;
    matrix *mat;
    float *error, *q, *msg, *qmsg;
    size_t error_len, q_len;
};

// A rank-r approximation pays when it sends fewer numbers than the matrix.
static int pays(int r, int rows, int cols) {
    return r > 0 && r < rows && r < cols && (size_t)r * (size_t)(rows + cols) < (size_t)rows * (size_t)cols;
}

#define Q_SEED 20190613u

static float *zeroed(const neox_backend *be, size_t count) {
    float *p = be->alloc(count * sizeof(float));
    be->memset_zero(p, count * sizeof(float));
    return p;
}

// A uniform draw in [-0.5, 0.5) from a fixed seed: Q's starting values, the same on every rank.
static float q_value(neox_mt19937 *rs) { return (float)neox_mt19937_next(rs) / 4294967296.0f - 0.5f; }

neox_powersgd *neox_powersgd_make_ranks(neox_comm *c, const neox_backend *be, const int *rows, const int *cols,
                                        int nseg, int min_rank, int rank) {
    // (gradient_compression_rank is at least 1 by the key schema.)
    neox_assert(min_rank >= 1 && min_rank <= rank, "powersgd: ranks %d-%d: expected 1 <= smallest <= largest", min_rank, rank);
    neox_powersgd *o = neox_calloc(1, sizeof *o);
    o->comm = c, o->be = be ? be : neox_backend_cpu(), o->n = nseg, o->max_rank = rank;
    o->mat = neox_calloc(nseg ? (size_t)nseg : 1, sizeof(matrix));
    size_t offset = 0;
    for (int s = 0; s < nseg; s++) {
        matrix *x = &o->mat[s];
        x->offset = offset, x->rows = rows[s], x->cols = cols[s];
        offset += (size_t)rows[s] * (size_t)cols[s];
        x->slot = pays(min_rank, rows[s], cols[s]);
        x->r = pays(rank, rows[s], cols[s]) ? rank : 0;
        if (!x->slot) continue;
        x->err = o->error_len, x->q = o->q_len;
        o->error_len += (size_t)rows[s] * (size_t)cols[s];
        o->q_len += (size_t)cols[s] * (size_t)rank;
    }
    o->error = zeroed(o->be, o->error_len + 1);
    o->q = zeroed(o->be, o->q_len + 1);
    o->msg = zeroed(o->be, offset + 1);  // no call sends more than the matrices
    o->qmsg = zeroed(o->be, o->q_len + 1);
    float *q = neox_calloc(o->q_len + 1, sizeof(float));
    neox_mt19937 rs;  // the same start on every rank: a fixed seed
    neox_mt19937_seed(&rs, Q_SEED);
    for (size_t i = 0; i < o->q_len; i++) q[i] = q_value(&rs);
    o->be->to_device(o->q, q, o->q_len * sizeof(float));
    free(q);
    return o;
}

neox_powersgd *neox_powersgd_make(neox_comm *c, const neox_backend *be, const int *rows, const int *cols, int nseg,
                                  int rank) {
    return neox_powersgd_make_ranks(c, be, rows, cols, nseg, rank, rank);
}

void neox_powersgd_free(neox_powersgd *o) {
    if (!o) return;
    free(o->mat);
    float *mem[] = {o->error, o->q, o->msg, o->qmsg};
    for (size_t i = 0; i < sizeof mem / sizeof *mem; i++) o->be->free(mem[i]);
    free(o);
}

float *neox_powersgd_state(neox_powersgd *o, int which, size_t *count) {
    *count = which ? o->q_len : o->error_len;
    return which ? o->q : o->error;
}

static void check_range(const neox_powersgd *o, int first, int count) {
    neox_assert(first >= 0 && count >= 0 && first + count <= o->n, "powersgd: segments %d-%d outside 0-%d", first,
                first + count, o->n);
}

static void add_error_to(neox_powersgd *o, matrix *x, float *buf) {
    size_t len = (size_t)x->rows * (size_t)x->cols;
    o->be->add_inplace(buf + x->offset, o->error + x->err, len);
    o->be->memset_zero(o->error + x->err, len * sizeof(float));
}

// Column j of matrix s's Q drawn afresh, from the matrix's and the column's own seed; staged through
// qmsg, which is free between calls.
static void new_q_column(neox_powersgd *o, int s, int j) {
    const matrix *x = &o->mat[s];
    float *column = neox_malloc((size_t)x->cols * sizeof(float));
    neox_mt19937 rs;
    neox_mt19937_seed(&rs, Q_SEED + 7919u * (uint32_t)s + 104729u * (uint32_t)j);
    for (int k = 0; k < x->cols; k++) column[k] = q_value(&rs);
    o->be->to_device(o->qmsg, column, (size_t)x->cols * sizeof(float));
    o->be->copy_matrix(o->q + x->q + (size_t)j, o->max_rank, o->qmsg, 1, x->cols, 1);
    free(column);
}

void neox_powersgd_set_rank(neox_powersgd *o, int first, int count, int r, float *buf) {
    check_range(o, first, count);
    neox_assert(r >= 1 && r <= o->max_rank, "powersgd: rank %d outside 1-%d", r, o->max_rank);
    for (int s = first; s < first + count; s++) {
        matrix *x = &o->mat[s];
        int next = x->slot && pays(r, x->rows, x->cols) ? r : 0;
        if (next == x->r || !buf) {
            x->r = next;
            continue;
        }
        if (!next) add_error_to(o, x, buf);
        // New columns start as every column of Q starts: drawn from a fixed seed (here the matrix's
        // and the column's), the same on every rank.
        for (int j = x->r; j < next; j++) new_q_column(o, s, j);
        x->r = next;
    }
}

int neox_powersgd_rank_of(const neox_powersgd *o, int first, int count) {
    check_range(o, first, count);
    int r = 0;
    for (int s = first; s < first + count; s++) r = o->mat[s].r > r ? o->mat[s].r : r;
    return r;
}

double neox_powersgd_wire_bytes_at(const neox_powersgd *o, int first, int count, int r) {
    check_range(o, first, count);
    double p = o->comm->size, floats = 0;
    for (int s = first; s < first + count; s++) {
        const matrix *x = &o->mat[s];
        floats += x->slot && pays(r, x->rows, x->cols) ? (double)r * (x->rows + x->cols) : (double)x->rows * x->cols;
    }
    return p > 1 ? 2.0 * (p - 1) / p * floats * sizeof(float) : 0.0;
}

double neox_powersgd_work_at(const neox_powersgd *o, int first, int count, int r) {
    check_range(o, first, count);
    double work = 0;
    for (int s = first; s < first + count; s++) {
        const matrix *x = &o->mat[s];
        if (x->slot && pays(r, x->rows, x->cols)) work += (double)r * x->rows * x->cols;
    }
    return work;
}

// P = (M + E) Q for each compressed matrix (E holds M' = M + E until the end of the call), the plain
// elements of the others; returns the message's length.
static size_t project(neox_powersgd *o, float *buf, int first, int count) {
    const neox_backend *be = o->be;
    size_t msg_len = 0;
    for (int s = first; s < first + count; s++) {
        matrix *x = &o->mat[s];
        float *M = buf + x->offset, *E = o->error + x->err;
        size_t len = (size_t)x->rows * (size_t)x->cols;
        if (!x->r) {
            be->copy(o->msg + msg_len, M, len * sizeof(float));
            msg_len += len;
            continue;
        }
        be->add_inplace(E, M, len);
        f32_gemm(be, 0, 0, x->rows, x->r, x->cols, E, x->cols, o->q + x->q, o->max_rank, o->msg + msg_len, x->r);
        msg_len += (size_t)x->rows * (size_t)x->r;
    }
    return msg_len;
}

// Q = M'^T P over the orthonormalised mean P; returns the Q message's length.
static size_t back_project(neox_powersgd *o, int first, int count) {
    size_t msg_len = 0, q_len = 0;
    for (int s = first; s < first + count; s++) {
        matrix *x = &o->mat[s];
        if (!x->r) {
            msg_len += (size_t)x->rows * (size_t)x->cols;
            continue;
        }
        float *P = o->msg + msg_len;
        o->be->orthonormalise_columns(P, x->rows, x->r);
        f32_gemm(o->be, 1, 0, x->cols, x->r, x->rows, o->error + x->err, x->cols, P, x->r, o->qmsg + q_len, x->r);
        msg_len += (size_t)x->rows * (size_t)x->r, q_len += (size_t)x->cols * (size_t)x->r;
    }
    return q_len;
}

// M = P Q^T (Q kept for the next call's warm start); E = M' - M. The plain elements come back.
static void reconstruct(neox_powersgd *o, float *buf, int first, int count) {
    const neox_backend *be = o->be;
    int R = o->max_rank;
    size_t msg_len = 0, q_len = 0;
    for (int s = first; s < first + count; s++) {
        matrix *x = &o->mat[s];
        float *M = buf + x->offset, *E = o->error + x->err;
        size_t len = (size_t)x->rows * (size_t)x->cols;
        if (!x->r) {
            be->copy(M, o->msg + msg_len, len * sizeof(float));
            msg_len += len;
            continue;
        }
        float *Q = o->q + x->q;  // cols x R, of which the first r columns are in use
        be->copy_matrix(Q, R, o->qmsg + q_len, x->r, x->cols, x->r);
        f32_gemm(be, 0, 1, x->rows, x->cols, x->r, o->msg + msg_len, x->r, Q, R, M, x->cols);
        be->add_scaled(E, M, len, -1.0f);
        msg_len += (size_t)x->rows * (size_t)x->r, q_len += (size_t)x->cols * (size_t)x->r;
    }
}

void neox_powersgd_allreduce_range(neox_powersgd *o, float *buf, int first, int count) {
    check_range(o, first, count);
    if (o->comm->size <= 1 || count == 0) return;
    float mean = 1.0f / (float)o->comm->size;
    size_t msg_len = project(o, buf, first, count);
    neox_allreduce_sum(o->comm, o->msg, msg_len, NEOX_F32);
    o->be->scale(o->msg, msg_len, mean);
    size_t q_len = back_project(o, first, count);
    neox_allreduce_sum(o->comm, o->qmsg, q_len, NEOX_F32);
    o->be->scale(o->qmsg, q_len, mean);
    reconstruct(o, buf, first, count);
}

void neox_powersgd_allreduce(neox_powersgd *o, float *buf) { neox_powersgd_allreduce_range(o, buf, 0, o->n); }

double neox_powersgd_wire_bytes(const neox_powersgd *o) {
    return neox_powersgd_wire_bytes_at(o, 0, o->n, o->max_rank);
}

void neox_powersgd_flush_range(neox_powersgd *o, float *buf, int first, int count) {
    check_range(o, first, count);
    for (int s = first; s < first + count; s++)
        if (o->mat[s].slot) add_error_to(o, &o->mat[s], buf);
}

void neox_powersgd_flush(neox_powersgd *o, float *buf) { neox_powersgd_flush_range(o, buf, 0, o->n); }
