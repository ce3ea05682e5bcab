// powersgd.c: PowerSGD (Vogels et al. 2019), the low-rank compressed all-reduce with error
// feedback of gradient.h. Per matrix M (n x m, plus this rank's error E): M' = M + E, P = M' Q,
// P averaged over the ranks and orthonormalised, Q = M'^T P averaged, and M becomes P Q^T; E keeps
// M' - P Q^T. Q persists between calls (one power iteration per step, warm-started), identical on
// every rank. Vectors, and matrices too small for rank r to pay, travel uncompressed beside P.
// Two all-reduces per call: [every P, every uncompressed element], then [every Q]. Adaptive
// compression changes the rank per bucket: each matrix's Q is stored at the largest rank and a call
// uses its leading columns, so a rank change moves no state (see neox_powersgd_set_rank).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "gradient.h"

// C = alpha op(A) op(B) + beta C in fp32, through the kernels' GEMM op (host buffers only).
static void f32_gemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                     const float *B, int ldb, float beta, float *C, int ldc) {
    neox_gemm_ex(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, NEOX_ELEM_F32, beta, C, ldc, NEOX_ELEM_F32);
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

neox_powersgd *neox_powersgd_make_ranks(neox_comm *c, const int *rows, const int *cols, int nseg, int min_rank, int rank) {
    // (gradient_compression_rank is at least 1 by the key schema.)
    neox_assert(min_rank >= 1 && min_rank <= rank, "powersgd: ranks %d-%d: expected 1 <= smallest <= largest", min_rank, rank);
    neox_powersgd *o = neox_calloc(1, sizeof *o);
    o->comm = c, o->n = nseg, o->max_rank = rank;
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
    o->error = neox_calloc(o->error_len + 1, sizeof(float));
    o->q = neox_calloc(o->q_len + 1, sizeof(float));
    o->msg = neox_calloc(offset + 1, sizeof(float));  // no call sends more than the matrices
    o->qmsg = neox_calloc(o->q_len + 1, sizeof(float));
    neox_mt19937 rs;  // the same start on every rank: a fixed seed
    neox_mt19937_seed(&rs, Q_SEED);
    for (size_t i = 0; i < o->q_len; i++) o->q[i] = (float)neox_mt19937_next(&rs) / 4294967296.0f - 0.5f;
    return o;
}

neox_powersgd *neox_powersgd_make(neox_comm *c, const int *rows, const int *cols, int nseg, int rank) {
    return neox_powersgd_make_ranks(c, rows, cols, nseg, rank, rank);
}

void neox_powersgd_free(neox_powersgd *o) {
    if (!o) return;
    free(o->mat);
    free(o->error);
    free(o->q);
    free(o->msg);
    free(o->qmsg);
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
    neox_add_inplace(buf + x->offset, o->error + x->err, len);
    memset(o->error + x->err, 0, len * sizeof(float));
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
        for (int j = x->r; j < next; j++) {
            neox_mt19937 rs;
            neox_mt19937_seed(&rs, Q_SEED + 7919u * (uint32_t)s + 104729u * (uint32_t)j);
            for (int k = 0; k < x->cols; k++)
                o->q[x->q + (size_t)k * (size_t)o->max_rank + (size_t)j] = (float)neox_mt19937_next(&rs) / 4294967296.0f - 0.5f;
        }
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

// Gram-Schmidt on the r columns of P (n x r, row-major), in double.
static void orthonormalise(float *P, int n, int r) {
    for (int i = 0; i < r; i++) {
        for (int j = 0; j < i; j++) {
            double dot = 0;
            for (int k = 0; k < n; k++) dot += (double)P[k * r + i] * P[k * r + j];
            for (int k = 0; k < n; k++) P[k * r + i] -= (float)(dot * P[k * r + j]);
        }
        double norm = 0;
        for (int k = 0; k < n; k++) norm += (double)P[k * r + i] * P[k * r + i];
        float inv = (float)(1.0 / (sqrt(norm) + 1e-8));
        for (int k = 0; k < n; k++) P[k * r + i] *= inv;
    }
}

static void scale_all(float *x, size_t n, float s) {
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

void neox_powersgd_allreduce_range(neox_powersgd *o, float *buf, int first, int count) {
    // (The trainer's set-up refuses gradient_compression on a device backend.)
    neox_assert(!neox_comm_on_device(o->comm, buf), "powersgd runs on host memory only; these gradients are on the GPU");
    check_range(o, first, count);
    if (o->comm->size <= 1 || count == 0) return;
    float mean = 1.0f / (float)o->comm->size;
    int R = o->max_rank;
    size_t msg_len = 0, q_len = 0;
    for (int s = first; s < first + count; s++) {  // P = (M + E) Q, or the plain elements
        matrix *x = &o->mat[s];
        float *M = buf + x->offset, *E = o->error + x->err;
        size_t len = (size_t)x->rows * (size_t)x->cols;
        if (!x->r) {
            memcpy(o->msg + msg_len, M, len * sizeof(float));
            msg_len += len;
            continue;
        }
        for (size_t i = 0; i < len; i++) E[i] += M[i];  // E holds M' until the end
        f32_gemm(0, 0, x->rows, x->r, x->cols, 1.0f, E, x->cols, o->q + x->q, R, 0.0f, o->msg + msg_len, x->r);
        msg_len += (size_t)x->rows * (size_t)x->r;
    }
    neox_allreduce_sum(o->comm, o->msg, msg_len, NEOX_F32);
    scale_all(o->msg, msg_len, mean);
    msg_len = 0;
    for (int s = first; s < first + count; s++) {  // Q = M'^T P over the orthonormalised mean P
        matrix *x = &o->mat[s];
        if (!x->r) {
            msg_len += (size_t)x->rows * (size_t)x->cols;
            continue;
        }
        float *P = o->msg + msg_len;
        orthonormalise(P, x->rows, x->r);
        f32_gemm(1, 0, x->cols, x->r, x->rows, 1.0f, o->error + x->err, x->cols, P, x->r, 0.0f, o->qmsg + q_len, x->r);
        msg_len += (size_t)x->rows * (size_t)x->r, q_len += (size_t)x->cols * (size_t)x->r;
    }
    neox_allreduce_sum(o->comm, o->qmsg, q_len, NEOX_F32);
    scale_all(o->qmsg, q_len, mean);
    msg_len = q_len = 0;
    for (int s = first; s < first + count; s++) {  // M = P Q^T; E = M' - M
        matrix *x = &o->mat[s];
        float *M = buf + x->offset, *E = o->error + x->err;
        size_t len = (size_t)x->rows * (size_t)x->cols;
        if (!x->r) {
            memcpy(M, o->msg + msg_len, len * sizeof(float));
            msg_len += len;
            continue;
        }
        float *Q = o->q + x->q;  // cols x R, of which the first r columns are in use
        for (int k = 0; k < x->cols; k++)
            memcpy(Q + (size_t)k * (size_t)R, o->qmsg + q_len + (size_t)k * (size_t)x->r, (size_t)x->r * sizeof(float));
        f32_gemm(0, 1, x->rows, x->cols, x->r, 1.0f, o->msg + msg_len, x->r, Q, R, 0.0f, M, x->cols);
        for (size_t i = 0; i < len; i++) E[i] -= M[i];
        msg_len += (size_t)x->rows * (size_t)x->r, q_len += (size_t)x->cols * (size_t)x->r;
    }
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
