// powersgd.c: PowerSGD (Vogels et al. 2019), the low-rank compressed all-reduce with error
// feedback of gradient.h. Per matrix M (n x m, plus this rank's error E): M' = M + E, P = M' Q,
// P averaged over the ranks and orthonormalised, Q = M'^T P averaged, and M becomes P Q^T; E keeps
// M' - P Q^T. Q persists between calls (one power iteration per step, warm-started), identical on
// every rank. Vectors, and matrices too small for rank r to pay, travel uncompressed beside P.
// Two all-reduces per call: [every P, every uncompressed element], then [every Q].
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
    int rows, cols, r; // r = 0: sent uncompressed
    size_t err, q, p;  // offsets in the error buffer, Q state, and the P / plain part of the message
} matrix;

struct neox_powersgd {
    neox_comm *comm;
    int n;
    matrix *mat;
    float *error, *q, *msg, *qmsg;
    size_t error_len, q_len, msg_len;
};

neox_powersgd *neox_powersgd_make(neox_comm *c, const int *rows, const int *cols, int nseg, int rank) {
    neox_powersgd *o = neox_calloc(1, sizeof *o);
    o->comm = c, o->n = nseg;
    o->mat = neox_calloc(nseg ? (size_t)nseg : 1, sizeof(matrix));
    size_t offset = 0;
    for (int s = 0; s < nseg; s++) {
        matrix *x = &o->mat[s];
        x->offset = offset, x->rows = rows[s], x->cols = cols[s];
        offset += (size_t)rows[s] * (size_t)cols[s];
        int r = rank < rows[s] && rank < cols[s] ? rank : 0;
        if ((size_t)r * (size_t)(rows[s] + cols[s]) >= (size_t)rows[s] * (size_t)cols[s]) r = 0;
        x->r = r;
        x->p = o->msg_len;
        o->msg_len += r ? (size_t)rows[s] * (size_t)r : (size_t)rows[s] * (size_t)cols[s];
        if (!r) continue;
        x->err = o->error_len, x->q = o->q_len;
        o->error_len += (size_t)rows[s] * (size_t)cols[s];
        o->q_len += (size_t)cols[s] * (size_t)r;
    }
    o->error = neox_calloc(o->error_len + 1, sizeof(float));
    o->q = neox_calloc(o->q_len + 1, sizeof(float));
    o->msg = neox_calloc(o->msg_len + 1, sizeof(float));
    o->qmsg = neox_calloc(o->q_len + 1, sizeof(float));
    neox_mt19937 rs;  // the same start on every rank: a fixed seed
    neox_mt19937_seed(&rs, 20190613u);
    for (size_t i = 0; i < o->q_len; i++) o->q[i] = (float)neox_mt19937_next(&rs) / 4294967296.0f - 0.5f;
    return o;
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

void neox_powersgd_allreduce(neox_powersgd *o, float *buf) {
    if (neox_comm_on_device(o->comm, buf))
        neox_die(NEOX_EXIT_USAGE, "gradient_compression: powersgd runs on host memory only; these gradients are on "
                 "the GPU (compute_backend: cuda)");
    if (o->comm->size <= 1) return;
    float mean = 1.0f / (float)o->comm->size;
    for (int s = 0; s < o->n; s++) {  // P = (M + E) Q, or the plain elements
        matrix *x = &o->mat[s];
        float *M = buf + x->offset, *E = o->error + x->err;
        size_t len = (size_t)x->rows * (size_t)x->cols;
        if (!x->r) {
            memcpy(o->msg + x->p, M, len * sizeof(float));
            continue;
        }
        for (size_t i = 0; i < len; i++) E[i] += M[i];  // E holds M' until the end
        f32_gemm(0, 0, x->rows, x->r, x->cols, 1.0f, E, x->cols, o->q + x->q, x->r, 0.0f, o->msg + x->p, x->r);
    }
    neox_allreduce_sum(o->comm, o->msg, o->msg_len, NEOX_F32);
    scale_all(o->msg, o->msg_len, mean);
    for (int s = 0; s < o->n; s++) {  // Q = M'^T P over the orthonormalised mean P
        matrix *x = &o->mat[s];
        if (!x->r) continue;
        orthonormalise(o->msg + x->p, x->rows, x->r);
        f32_gemm(1, 0, x->cols, x->r, x->rows, 1.0f, o->error + x->err, x->cols, o->msg + x->p, x->r, 0.0f,
                       o->qmsg + x->q, x->r);
    }
    neox_allreduce_sum(o->comm, o->qmsg, o->q_len, NEOX_F32);
    scale_all(o->qmsg, o->q_len, mean);
    memcpy(o->q, o->qmsg, o->q_len * sizeof(float));
    for (int s = 0; s < o->n; s++) {  // M = P Q^T; E = M' - M
        matrix *x = &o->mat[s];
        float *M = buf + x->offset, *E = o->error + x->err;
        size_t len = (size_t)x->rows * (size_t)x->cols;
        if (!x->r) {
            memcpy(M, o->msg + x->p, len * sizeof(float));
            continue;
        }
        f32_gemm(0, 1, x->rows, x->cols, x->r, 1.0f, o->msg + x->p, x->r, o->q + x->q, x->r, 0.0f, M, x->cols);
        for (size_t i = 0; i < len; i++) E[i] -= M[i];
    }
}

double neox_powersgd_wire_bytes(const neox_powersgd *o) {
    double p = o->comm->size;
    return p > 1 ? 2.0 * (p - 1) / p * (double)(o->msg_len + o->q_len) * sizeof(float) : 0.0;
}

void neox_powersgd_flush(neox_powersgd *o, float *buf) {
    for (int s = 0; s < o->n; s++) {
        const matrix *x = &o->mat[s];
        if (!x->r) continue;
        size_t len = (size_t)x->rows * (size_t)x->cols;
        neox_add_inplace(buf + x->offset, o->error + x->err, len);
    }
    memset(o->error, 0, o->error_len * sizeof(float));
}
