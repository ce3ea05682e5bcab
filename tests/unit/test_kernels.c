// test_kernels.c: every backward kernel against central finite differences of its forward, and
// the forwards against direct (naive) formulas. The scalar checked is L = sum(out * R) for a fixed
// random R, so dL/dout = R.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "kernels/kernels.h"

static unsigned long long rng_counter = 1;

static float *randn(size_t n, float scale) {
    float *x = neox_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = scale * (float)neox_normal(7, rng_counter++);
    return x;
}

static float *zeros(size_t n) { return neox_calloc(n, sizeof(float)); }

static double dotd(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

// The forward under test, evaluated as L = sum(out * R).
typedef double (*loss_fn)(void *ctx);

// Compares analytic[i] with (L(x_i + h) - L(x_i - h)) / 2h for (a sample of) the elements of x.
static void check_grad(const char *what, float *x, const float *analytic, size_t n, loss_fn loss, void *ctx) {
    double maxg = 1e-3, worst = 0;
    for (size_t i = 0; i < n; i++) maxg = fmax(maxg, fabs(analytic[i]));
    size_t stride = n > 97 ? n / 97 : 1;
    for (size_t i = 0; i < n; i += stride) {
        float saved = x[i], h = 1e-2f * fmaxf(1.0f, fabsf(saved));
        x[i] = saved + h;
        double lp = loss(ctx);
        x[i] = saved - h;
        double lm = loss(ctx);
        x[i] = saved;
        double fd = (lp - lm) / (2.0 * h);
        worst = fmax(worst, fabs(fd - analytic[i]) / maxg);
    }
    if (worst > 2e-2) fail_msg("%s: gradient differs from finite differences by %.3g of its max %.3g", what, worst, maxg);
}

// ---- linear -------------------------------------------------------------------------------------
enum { N_ = 6, IC_ = 5, OC_ = 7 };
struct linear_ctx { float *inp, *w, *b, *out, *R; };

static double linear_loss(void *p) {
    struct linear_ctx *c = p;
    neox_linear_forward(c->out, OC_, c->inp, c->w, c->b, N_, IC_, OC_, NEOX_ELEM_F32);
    return dotd(c->out, c->R, N_ * OC_);
}

static void test_linear(void **state) {
    (void)state;
    struct linear_ctx c = {randn(N_ * IC_, 1), randn(OC_ * IC_, 1), randn(OC_, 1), zeros(N_ * OC_), randn(N_ * OC_, 1)};
    linear_loss(&c);
    for (int i = 0; i < N_; i++)
        for (int o = 0; o < OC_; o++) {
            double ref = c.b[o];
            for (int k = 0; k < IC_; k++) ref += (double)c.inp[i * IC_ + k] * c.w[o * IC_ + k];
            assert_true(fabs(ref - c.out[i * OC_ + o]) < 1e-5);
        }
    float *dinp = randn(N_ * IC_, 1), *dw = zeros(OC_ * IC_), *db = zeros(OC_);
    neox_linear_backward(dinp, dw, db, c.R, OC_, c.inp, c.w, N_, IC_, OC_, 0, NEOX_ELEM_F32);
    check_grad("linear dinp", c.inp, dinp, N_ * IC_, linear_loss, &c);
    check_grad("linear dweight", c.w, dw, OC_ * IC_, linear_loss, &c);
    check_grad("linear dbias", c.b, db, OC_, linear_loss, &c);
    // Parameter gradients accumulate; input gradients accumulate on request.
    float *dinp2 = neox_malloc(sizeof(float) * N_ * IC_);
    memcpy(dinp2, dinp, sizeof(float) * N_ * IC_);
    neox_linear_backward(dinp2, dw, db, c.R, OC_, c.inp, c.w, N_, IC_, OC_, 1, NEOX_ELEM_F32);
    check_grad("linear dinp (accumulated, halved)", c.inp, (neox_scale(dinp2, N_ * IC_, 0.5f), dinp2), N_ * IC_, linear_loss, &c);
    check_grad("linear dbias (accumulated, halved)", c.b, (neox_scale(db, OC_, 0.5f), db), OC_, linear_loss, &c);
    // Weights first, then the input gradient alone (as backward does): the same numbers exactly.
    float *dinp3 = randn(N_ * IC_, 2), *dw3 = zeros(OC_ * IC_), *db3 = zeros(OC_), *dw4 = zeros(OC_ * IC_);
    float *db4 = zeros(OC_);
    neox_linear_backward(NULL, dw3, db3, c.R, OC_, c.inp, c.w, N_, IC_, OC_, 0, NEOX_ELEM_F32);
    neox_linear_backward(dinp3, NULL, NULL, c.R, OC_, c.inp, c.w, N_, IC_, OC_, 0, NEOX_ELEM_F32);
    neox_linear_backward(dinp2, dw4, db4, c.R, OC_, c.inp, c.w, N_, IC_, OC_, 0, NEOX_ELEM_F32);
    assert_memory_equal(dinp3, dinp2, sizeof(float) * N_ * IC_);
    assert_memory_equal(dw3, dw4, sizeof(float) * OC_ * IC_);
    assert_memory_equal(db3, db4, sizeof(float) * OC_);
    free(c.inp); free(c.w); free(c.b); free(c.out); free(c.R); free(dinp); free(dinp2); free(dw); free(db);
    free(dinp3); free(dw3); free(db3); free(dw4); free(db4);
}

// ---- embedding ----------------------------------------------------------------------------------
enum { EB = 2, ET = 5, EC = 4, EV = 6 };
struct emb_ctx { int ids[EB * ET]; float *wte, *wpe, *out, *R; };

static double emb_loss(void *p) {
    struct emb_ctx *c = p;
    neox_embedding_forward(c->out, c->ids, c->wte, c->wpe, EB, ET, EC, NEOX_ELEM_F32);
    return dotd(c->out, c->R, EB * ET * EC);
}

static void test_embedding(void **state) {
    (void)state;
    struct emb_ctx c = {{1, 3, 3, 0, 5, 2, 2, 2, 4, 1}, randn(EV * EC, 1), randn(ET * EC, 1), zeros(EB * ET * EC),
                        randn(EB * ET * EC, 1)};
    float *dwte = zeros(EV * EC), *dwpe = zeros(ET * EC);
    neox_embedding_backward(dwte, dwpe, c.R, c.ids, EB, ET, EC, NEOX_ELEM_F32);
    check_grad("embedding dwte", c.wte, dwte, EV * EC, emb_loss, &c);
    check_grad("embedding dwpe", c.wpe, dwpe, ET * EC, emb_loss, &c);
    free(c.wte); free(c.wpe); free(c.out); free(c.R); free(dwte); free(dwpe);
}

// The table a piece at a time: every piece's rows, then the positions added, are the whole lookup
// bit for bit; a token outside every piece given (another shard's, id < 0) keeps what out held.
static void test_embedding_rows(void **state) {
    (void)state;
    int ids[EB * ET] = {1, 3, 3, 0, 5, 2, 2, -1, 4, 1};
    float *wte = randn(EV * EC, 2), *wpe = randn(ET * EC, 3), *whole = zeros(EB * ET * EC), *pieces = randn(EB * ET * EC, 4);
    neox_embedding_forward(whole, ids, wte, wpe, EB, ET, EC, NEOX_ELEM_F32);
    float kept = pieces[7 * EC + 1];
    neox_embedding_rows(pieces, ids, wte, 0, 0, EB * ET, EC, NEOX_ELEM_F32);  // an empty piece changes nothing
    assert_true(pieces[7 * EC + 1] == kept);
    for (int v0 = 0; v0 < EV; v0 += 4)
        neox_embedding_rows(pieces, ids, wte + v0 * EC, v0, v0 + 4 < EV ? v0 + 4 : EV, EB * ET, EC, NEOX_ELEM_F32);
    assert_true(pieces[7 * EC + 1] == kept);  // id -1: in no piece
    for (int c = 0; c < EC; c++) pieces[7 * EC + c] = 0.0f;  // (embedding_forward's zero row)
    for (int b = 0; b < EB; b++) neox_add_inplace(pieces + b * ET * EC, wpe, ET * EC);
    assert_memory_equal(pieces, whole, EB * ET * EC * sizeof(float));
    free(wte); free(wpe); free(whole); free(pieces);
}

// The order of dwte's sums (kernels.h): restated here without sorting. A token's place in the sorted
// sequence is the number of tokens with a smaller id (as unsigned) plus the earlier ones with its id;
// its span is that place / NEOX_EMBEDDING_SPAN. Walking the tokens in order, a token in the span of its
// id's first token adds onto the row; a later span's tokens add into a piece that joins the row when
// the span changes or the tokens end.
static void emb_order_reference(float *dwte, const float *dout, const int *ids, int n, int C) {
    float *piece = zeros((size_t)C);
    for (int i = 0; i < n; i++) {  // each id once, from its first token
        int first = ids[i] >= 0, span0 = -1, piece_span = -1;
        for (int j = 0; j < i && first; j++) first = ids[j] != ids[i];
        if (!first) continue;
        float *row = dwte + (size_t)ids[i] * C;
        for (int j = i; j < n; j++) {
            if (ids[j] != ids[i]) continue;
            int place = 0;
            for (int k = 0; k < n; k++) place += (unsigned)ids[k] < (unsigned)ids[i] || (ids[k] == ids[i] && k < j);
            int span = place / NEOX_EMBEDDING_SPAN;
            if (span0 < 0) span0 = span;
            const float *d = dout + (size_t)j * C;
            if (span == span0) {
                for (int c = 0; c < C; c++) row[c] += d[c];
                continue;
            }
            if (span != piece_span) {
                for (int c = 0; piece_span >= 0 && c < C; c++) row[c] += piece[c];
                memset(piece, 0, (size_t)C * sizeof *piece);
                piece_span = span;
            }
            for (int c = 0; c < C; c++) piece[c] += d[c];
        }
        for (int c = 0; piece_span >= 0 && c < C; c++) row[c] += piece[c];
    }
    free(piece);
}

static void test_embedding_order(void **state) {
    (void)state;
    // Few tokens (every id inside one span: the plain token-order sum), one token repeated across
    // several spans, and many ids with -1s (another rank's rows) whose runs straddle span ends.
    enum { C = 67, V = 40 };
    int sizes[] = {37, 3 * NEOX_EMBEDDING_SPAN + 17, 5 * NEOX_EMBEDDING_SPAN + 3};
    for (int t = 0; t < 3; t++) {
        int n = sizes[t], *ids = neox_malloc((size_t)n * sizeof *ids);
        for (int i = 0; i < n; i++)
            ids[i] = t == 1 ? 7 : (int)(neox_uniform(5, rng_counter++) * (V + 1)) - 1;
        float *dout = randn((size_t)n * C, 1), *base = randn((size_t)V * C, 1);
        float *got = neox_malloc((size_t)V * C * sizeof *got), *want = neox_malloc((size_t)V * C * sizeof *want);
        memcpy(got, base, (size_t)V * C * sizeof *got);
        memcpy(want, base, (size_t)V * C * sizeof *want);
        neox_embedding_backward(got, NULL, dout, ids, 1, n, C, NEOX_ELEM_F32);
        emb_order_reference(want, dout, ids, n, C);
        assert_memory_equal(got, want, (size_t)V * C * sizeof *got);
        if (t == 1) {  // the spans matter: summing straight onto the row gives other bits
            float *plain = neox_malloc((size_t)C * sizeof *plain);
            memcpy(plain, base + 7 * C, (size_t)C * sizeof *plain);
            for (int j = 0; j < n; j++)
                for (int c = 0; c < C; c++) plain[c] += dout[(size_t)j * C + c];
            assert_true(memcmp(plain, got + 7 * C, (size_t)C * sizeof *plain) != 0);
            free(plain);
        }
        free(ids); free(dout); free(base); free(got); free(want);
    }
}

// ---- norms --------------------------------------------------------------------------------------
enum { NN = 5, NC = 9 };
struct norm_ctx { float *inp, *w, *b, *out, *mean, *rstd, *R; int rms; };

static double norm_loss(void *p) {
    struct norm_ctx *c = p;
    if (c->rms) neox_rmsnorm_forward(c->out, c->rstd, c->inp, c->w, NN, NC, 1e-5f, NEOX_ELEM_F32);
    else neox_layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->w, c->b, NN, NC, 1e-5f, NEOX_ELEM_F32);
    return dotd(c->out, c->R, NN * NC);
}

static void run_norm(int rms) {
    struct norm_ctx c = {randn(NN * NC, 2), randn(NC, 1), randn(NC, 1), zeros(NN * NC), zeros(NN), zeros(NN),
                         randn(NN * NC, 1), rms};
    for (int i = 0; i < NN * NC; i++) c.inp[i] += 0.5f;  // a non-zero mean
    norm_loss(&c);
    // Forward against the formula.
    for (int i = 0; i < NN; i++) {
        double mu = 0, var = 0;
        for (int k = 0; k < NC; k++) mu += c.inp[i * NC + k] / (double)NC;
        for (int k = 0; k < NC; k++) {
            double d = c.inp[i * NC + k] - (rms ? 0 : mu);
            var += d * d / NC;
        }
        for (int k = 0; k < NC; k++) {
            double ref = (c.inp[i * NC + k] - (rms ? 0 : mu)) / sqrt(var + 1e-5) * c.w[k] + (rms ? 0 : c.b[k]);
            assert_true(fabs(ref - c.out[i * NC + k]) < 1e-5 * (1 + fabs(ref)));
        }
    }
    float *dinp = zeros(NN * NC), *dw = zeros(NC), *db = zeros(NC);
    if (rms) neox_rmsnorm_backward(dinp, dw, NULL, c.R, c.inp, c.w, c.rstd, NN, NC, NEOX_ELEM_F32);
    else neox_layernorm_backward(dinp, dw, db, NULL, c.R, c.inp, c.w, c.mean, c.rstd, NN, NC, NEOX_ELEM_F32);
    check_grad(rms ? "rmsnorm dinp" : "layernorm dinp", c.inp, dinp, NN * NC, norm_loss, &c);
    check_grad(rms ? "rmsnorm dweight" : "layernorm dweight", c.w, dw, NC, norm_loss, &c);
    if (!rms) check_grad("layernorm dbias", c.b, db, NC, norm_loss, &c);
    free(c.inp); free(c.w); free(c.b); free(c.out); free(c.mean); free(c.rstd); free(c.R); free(dinp); free(dw); free(db);
}

static void test_layernorm(void **state) { (void)state; run_norm(0); }
static void test_rmsnorm(void **state) { (void)state; run_norm(1); }

// The fused residual add + norm: the sum and the norm of it, against a direct double-precision
// restatement (sum exact; the norm within fp32 rounding), in place (sum over a) and apart.
static void test_add_norm(void **state) {
    (void)state;
    enum { N = 3, C = 37 };
    for (int rms = 0; rms < 2; rms++) {
        float *a = randn(N * C, 1), *b = randn(N * C, 1), *w = randn(C, 1), *bias = randn(C, 1), *a0 = zeros(N * C);
        float *out = zeros(N * C), *mean = zeros(N), *rstd = zeros(N);
        memcpy(a0, a, sizeof(float) * N * C);
        if (rms) neox_add_rmsnorm_forward(a, out, rstd, a, b, NULL, w, N, C, 1e-6f, NEOX_ELEM_F32);
        else neox_add_layernorm_forward(a, out, mean, rstd, a, b, NULL, w, bias, N, C, 1e-5f, NEOX_ELEM_F32);
        for (int i = 0; i < N; i++) {
            double mu = 0, var = 0;
            for (int c = 0; c < C; c++) {
                float sum = a0[i * C + c] + b[i * C + c];
                assert_true(a[i * C + c] == sum);
                mu += rms ? 0.0 : (double)sum / C;
            }
            for (int c = 0; c < C; c++) var += ((double)a[i * C + c] - mu) * ((double)a[i * C + c] - mu) / C;
            double r = 1.0 / sqrt(var + (rms ? 1e-6 : 1e-5));
            assert_true(fabs(rstd[i] - r) <= 1e-6 * r);
            for (int c = 0; c < C; c++) {
                double want = ((double)a[i * C + c] - mu) * r * w[c] + (rms ? 0.0 : bias[c]);
                assert_true(fabs(out[i * C + c] - want) <= 1e-5 * (1 + fabs(want)));
            }
        }
        free(a); free(b); free(w); free(bias); free(a0); free(out); free(mean); free(rstd);
    }
}

// n random values stored as act (bf16: rounded), for the storage tests below.
static void *act_randn(size_t n, float scale, neox_elem act) {
    float *x = randn(n, scale);
    if (act == NEOX_ELEM_F32) return x;
    uint16_t *h = neox_malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = neox_bf16_from_f32(x[i]);
    free(x);
    return h;
}

static void *act_copy(const void *x, size_t n, neox_elem act) {
    size_t bytes = n * (act == NEOX_ELEM_F32 ? sizeof(float) : sizeof(uint16_t));
    void *y = neox_malloc(bytes);
    memcpy(y, x, bytes);
    return y;
}

static float act_at(const void *x, size_t i, neox_elem act) {
    return act == NEOX_ELEM_F32 ? ((const float *)x)[i] : neox_bf16_to_f32(((const uint16_t *)x)[i]);
}

// The fused ops against the unfused ops they replace in the model, bit for bit, in both storages:
// the add with b's row-parallel bias and the norm against add_bias, add, then the norm (and with out
// NULL the sum alone); the norm backward's dsum against the linear layer's bias gradient of the
// dinp it wrote, and against a double-precision column sum of that dinp.
static void test_add_norm_bias_unfused(void **state) {
    (void)state;
    enum { N = 7, C = 45 };
    size_t n = (size_t)N * C;
    for (int e = 0; e < 2; e++)
        for (int rms = 0; rms < 2; rms++) {
            neox_elem act = e ? NEOX_ELEM_BF16 : NEOX_ELEM_F32;
            size_t esz = e ? sizeof(uint16_t) : sizeof(float);
            void *a = act_randn(n, 1.0f, act), *b = act_randn(n, 1.0f, act), *dout = act_randn(n, 1.0f, act);
            void *dx0 = act_randn(n, 1.0f, act);
            float *bb = randn(C, 1.0f), *w = randn(C, 1.0f), *bias = randn(C, 1.0f);
            void *sum1 = neox_malloc(n * esz), *out1 = neox_malloc(n * esz), *sum2 = neox_malloc(n * esz);
            void *out2 = neox_malloc(n * esz), *sum3 = neox_malloc(n * esz), *b2 = act_copy(b, n, act);
            void *b0 = act_copy(b, n, act);
            float *m1 = zeros(N), *r1 = zeros(N), *m2 = zeros(N), *r2 = zeros(N);
            if (rms) {
                neox_add_rmsnorm_forward(sum1, out1, r1, a, b, bb, w, N, C, 1e-6f, act);
                neox_add_rmsnorm_forward(sum3, NULL, NULL, a, b, bb, NULL, N, C, 1e-6f, act);
            } else {
                neox_add_layernorm_forward(sum1, out1, m1, r1, a, b, bb, w, bias, N, C, 1e-5f, act);
                neox_add_layernorm_forward(sum3, NULL, NULL, NULL, a, b, bb, NULL, NULL, N, C, 1e-5f, act);
            }
            neox_add_bias(b2, bb, N, C, act);
            neox_add(sum2, a, b2, n, act);
            if (rms) neox_rmsnorm_forward(out2, r2, sum2, w, N, C, 1e-6f, act);
            else neox_layernorm_forward(out2, m2, r2, sum2, w, bias, N, C, 1e-5f, act);
            assert_memory_equal(sum1, sum2, n * esz);
            assert_memory_equal(sum3, sum2, n * esz);
            assert_memory_equal(out1, out2, n * esz);
            assert_memory_equal(r1, r2, N * sizeof(float));
            assert_memory_equal(m1, m2, N * sizeof(float));
            assert_memory_equal(b, b0, n * esz);  // (b itself is left as it was)

            void *dx1 = act_copy(dx0, n, act), *dx2 = act_copy(dx0, n, act);
            float *dw1 = zeros(C), *dw2 = zeros(C), *db1 = zeros(C), *db2 = zeros(C), *ds1 = randn(C, 1.0f);
            float *ds2 = neox_malloc(C * sizeof(float)), *ds0 = neox_malloc(C * sizeof(float));
            memcpy(ds2, ds1, C * sizeof(float));
            memcpy(ds0, ds1, C * sizeof(float));
            if (rms) {
                neox_rmsnorm_backward(dx1, dw1, ds1, dout, sum1, w, r1, N, C, act);
                neox_rmsnorm_backward(dx2, dw2, NULL, dout, sum1, w, r1, N, C, act);
            } else {
                neox_layernorm_backward(dx1, dw1, db1, ds1, dout, sum1, w, m1, r1, N, C, act);
                neox_layernorm_backward(dx2, dw2, db2, NULL, dout, sum1, w, m1, r1, N, C, act);
            }
            neox_linear_backward(NULL, NULL, ds2, dx2, C, NULL, NULL, N, C, C, 0, act);
            assert_memory_equal(dx1, dx2, n * esz);
            assert_memory_equal(dw1, dw2, C * sizeof(float));
            assert_memory_equal(db1, db2, C * sizeof(float));
            assert_memory_equal(ds1, ds2, C * sizeof(float));
            for (int c = 0; c < C; c++) {
                double col = ds0[c];
                for (int i = 0; i < N; i++) col += act_at(dx1, (size_t)i * C + c, act);
                assert_true(fabs(ds1[c] - col) <= 1e-5 * (1.0 + fabs(col)));
            }
            void *bufs[] = {a, b, b0, dout, dx0, bb, w, bias, sum1, out1, sum2, out2, sum3, b2, m1, r1, m2, r2,
                            dx1, dx2, dw1, dw2, db1, db2, ds1, ds2, ds0};
            for (size_t k = 0; k < sizeof bufs / sizeof *bufs; k++) free(bufs[k]);
        }
}

// ---- qkv split/merge and rotary -----------------------------------------------------------------
static void run_qkv_adjoint(int interleaved, int NH, int NKV) {
    int B = 2, T = 3, HS = 4, W = (NH + 2 * NKV) * HS;
    float *qkv = randn((size_t)B * T * W, 1), *q = zeros((size_t)B * NH * T * HS), *k = zeros((size_t)B * NKV * T * HS),
          *v = zeros((size_t)B * NKV * T * HS), *back = zeros((size_t)B * T * W);
    neox_qkv_split(q, k, v, qkv, B, T, NH, NKV, HS, interleaved, NEOX_ELEM_F32);
    neox_qkv_merge(back, q, k, v, B, T, NH, NKV, HS, interleaved, NEOX_ELEM_F32);
    assert_memory_equal(back, qkv, sizeof(float) * B * T * W);  // a permutation: merge undoes split
    // Spot check one element: head 1's k at (b=1, t=2, d=3).
    size_t off = interleaved ? (size_t)(1 * 3 * HS + HS + 3) : (size_t)(NH + 1) * HS + 3;
    assert_true(k[((1 * NKV + 1) * T + 2) * HS + 3] == qkv[(1 * T + 2) * (size_t)W + off]);
    free(qkv); free(q); free(k); free(v); free(back);
}

static void test_qkv_split_merge(void **state) {
    (void)state;
    run_qkv_adjoint(1, 3, 3);
    run_qkv_adjoint(0, 4, 2);
}

static void test_rotary(void **state) {
    (void)state;
    int B = 2, H = 3, T = 5, HS = 8, R = 4;
    float cs[5 * 2], sn[5 * 2];
    neox_rotary_tables(cs, sn, T, R, 10000.0, (neox_rope_scaling){0});
    float *x = randn((size_t)B * H * T * HS, 1), *y = neox_malloc(sizeof(float) * B * H * T * HS);
    memcpy(y, x, sizeof(float) * B * H * T * HS);
    neox_rotary_apply(y, cs, sn, B, H, T, HS, R, 0, NEOX_ELEM_F32, (neox_head_strides){0});
    // Against the formula: x*cos + rotate_half(x)*sin on the first R dims, pass-through beyond.
    for (int bh = 0; bh < B * H; bh++)
        for (int t = 0; t < T; t++)
            for (int d = 0; d < HS; d++) {
                const float *xr = x + ((size_t)bh * T + t) * HS;
                double ref = xr[d];
                if (d < R) {
                    int i = d % (R / 2);
                    double ang = t * pow(10000.0, -2.0 * i / R);
                    double rot = d < R / 2 ? -xr[d + R / 2] : xr[d - R / 2];
                    ref = xr[d] * cos(ang) + rot * sin(ang);
                }
                assert_true(fabs(ref - y[((size_t)bh * T + t) * HS + d]) < 1e-5);
            }
    // The inverse is the transpose of an orthogonal map: it restores x.
    neox_rotary_apply(y, cs, sn, B, H, T, HS, R, 1, NEOX_ELEM_F32, (neox_head_strides){0});
    for (int i = 0; i < B * H * T * HS; i++) assert_true(fabs(x[i] - y[i]) < 1e-5);
    free(x); free(y);
}

// ---- attention ----------------------------------------------------------------------------------
// T = 6 fits in one block of the blocked kernel; T = 150 spans three (the last one partial), so the
// online softmax across key blocks and the tiles off and on the diagonal are all exercised.
enum { AB = 2, AHS = 4 };
struct attn_ctx { float *q, *k, *v, *out, *lse, *R; int T, NH, NKV, window; float dropout; const float *alibi; };

static double attn_loss(void *p) {
    struct attn_ctx *c = p;
    neox_attention_forward(c->out, c->lse, c->q, c->k, c->v, AB, c->T, c->NH, c->NKV, AHS,
                           (neox_attention_opts){.scale = 0.5f, .window = c->window, .dropout = c->dropout, .seed = 99,
                                                 .operands = NEOX_ELEM_F32, .alibi = c->alibi},
                           NEOX_ELEM_F32);
    return dotd(c->out, c->R, (size_t)AB * c->T * c->NH * AHS);
}

// window: keys each query sees (0: all earlier ones); alibi: NH slopes or NULL.
static void run_attention_biased(int T, int NH, int NKV, float dropout, int window, const float *alibi) {
    size_t nq = (size_t)AB * NH * T * AHS, nk = (size_t)AB * NKV * T * AHS;
    struct attn_ctx c = {randn(nq, 1), randn(nk, 1), randn(nk, 1), zeros(nq), zeros((size_t)AB * NH * T), randn(nq, 1),
                         T, NH, NKV, window, dropout, alibi};
    attn_loss(&c);
    if (dropout == 0.0f) {  // forward against softmax(q k^T * scale + causal (and window) mask) v
        double *s = neox_malloc((size_t)T * sizeof(double));
        for (int b = 0; b < AB; b++)
            for (int h = 0; h < NH; h++)
                for (int i = 0; i < T; i++) {
                    int g = h / (NH / NKV);
                    double mx = -1e30, sum = 0;
                    int j0 = window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;
                    for (int j = j0; j <= i; j++) {
                        s[j] = 0;
                        for (int d = 0; d < AHS; d++)
                            s[j] += 0.5 * c.q[((b * NH + h) * T + i) * AHS + d] * c.k[((b * NKV + g) * T + j) * AHS + d];
                        if (alibi) s[j] += (double)alibi[h] * (j - i);  // ALiBi: slope * (j - i)
                        mx = fmax(mx, s[j]);
                    }
                    for (int j = j0; j <= i; j++) sum += exp(s[j] - mx);
                    assert_true(fabs(mx + log(sum) - c.lse[(b * NH + h) * T + i]) < 1e-5);
                    for (int d = 0; d < AHS; d++) {
                        double ref = 0;
                        for (int j = j0; j <= i; j++) ref += exp(s[j] - mx) / sum * c.v[((b * NKV + g) * T + j) * AHS + d];
                        assert_true(fabs(ref - c.out[((b * T + i) * NH + h) * AHS + d]) < 1e-5);
                    }
                }
        free(s);
    }
    float *dq = zeros(nq), *dk = zeros(nk), *dv = zeros(nk);
    neox_attention_backward(dq, dk, dv, c.R, c.q, c.k, c.v, c.out, c.lse, AB, T, NH, NKV, AHS,
                            (neox_attention_opts){.scale = 0.5f, .window = window, .dropout = dropout, .seed = 99,
                                                  .operands = NEOX_ELEM_F32, .alibi = c.alibi},
                            NEOX_ELEM_F32);
    check_grad("attention dq", c.q, dq, nq, attn_loss, &c);
    check_grad("attention dk", c.k, dk, nk, attn_loss, &c);
    check_grad("attention dv", c.v, dv, nk, attn_loss, &c);
    free(c.q); free(c.k); free(c.v); free(c.out); free(c.lse); free(c.R); free(dq); free(dk); free(dv);
}

static void run_attention_window(int T, int NH, int NKV, float dropout, int window) {
    run_attention_biased(T, NH, NKV, dropout, window, NULL);
}
static void run_attention(int T, int NH, int NKV, float dropout) { run_attention_window(T, NH, NKV, dropout, 0); }

static void test_attention(void **state) { (void)state; run_attention(6, 3, 3, 0.0f); }
static void test_attention_gqa(void **state) { (void)state; run_attention(6, 4, 2, 0.0f); run_attention(6, 4, 1, 0.0f); }
static void test_attention_dropout(void **state) { (void)state; run_attention(6, 2, 2, 0.3f); }
static void test_attention_blocks(void **state) {
    (void)state;
    run_attention(150, 2, 2, 0.0f);
    run_attention(150, 4, 2, 0.0f);
    run_attention(150, 2, 1, 0.2f);
}
// Sliding windows: one key (only itself), a window inside one block, windows whose edge crosses
// the 64-key tiles (whole tiles before it skipped, rows with nothing visible in a tile), with GQA
// and dropout.
static void test_attention_window(void **state) {
    (void)state;
    run_attention_window(6, 2, 2, 0.0f, 1);
    run_attention_window(6, 2, 1, 0.0f, 3);
    run_attention_window(150, 2, 1, 0.0f, 70);
    run_attention_window(150, 4, 2, 0.0f, 5);
    run_attention_window(150, 2, 2, 0.2f, 40);
}

// ALiBi: GPT-NeoX's slopes (its AliBi._get_slopes, restated in double here) and the biased scores
// against the naive attention and finite differences, across tiles, with GQA, a window and dropout.
static double neox_slope(int n, int h) {  // get_slopes(n)[h]
    if (log2(n) == floor(log2(n))) {
        double start = pow(2.0, -pow(2.0, -(log2(n) - 3)));
        return start * pow(start, h);
    }
    int m = (int)pow(2.0, floor(log2(n)));
    return h < m ? neox_slope(m, h) : neox_slope(2 * m, 2 * (h - m));
}

static void test_attention_alibi(void **state) {
    (void)state;
    // Slopes: powers of two (8: 1/2, 1/4, ... 1/256), and 12 heads (8 of the 8-sequence, then the
    // even ones of the 16-sequence), whole and as a tensor-parallel rank's slice.
    float sl[12];
    neox_alibi_slopes(sl, 8, 0, 8);
    for (int h = 0; h < 8; h++) assert_float_equal(sl[h], ldexp(1.0, -(h + 1)), 0);
    neox_alibi_slopes(sl, 12, 0, 12);
    for (int h = 0; h < 12; h++) assert_true(sl[h] == (float)neox_slope(12, h));
    assert_float_equal(sl[8], pow(2.0, -0.5), 1e-7);  // the 16-sequence's first: 2^(-8/16)
    float part[4];
    neox_alibi_slopes(part, 12, 4, 4);
    for (int h = 0; h < 4; h++) assert_true(part[h] == sl[4 + h]);
    float s4[4], s3[3];  // 3 heads: a sequence that is not a power of two
    neox_alibi_slopes(s4, 4, 0, 4);
    neox_alibi_slopes(s3, 3, 0, 3);
    run_attention_biased(6, 4, 4, 0.0f, 0, s4);
    run_attention_biased(150, 4, 2, 0.0f, 0, s4);
    run_attention_biased(150, 3, 1, 0.2f, 40, s3);
}

// ---- context parallelism: queries at given positions ----------------------------------------------
// Rank r of cp holds positions [r c, r c + c) and [(2cp-1-r) c, (2cp-1-r) c + c) of T = 2 cp c (query
// rows in that order, o.q_*) against all T keys. Its outputs, log-sum-exps and dq must be the whole
// attention's rows at those positions, and dk, dv summed over the ranks the whole attention's.
static void pick_positions(float *dst, const float *src, int groups, int T, int c, int p0, int p1, int width) {
    for (int g = 0; g < groups; g++) {
        memcpy(dst + ((size_t)g * 2 * c) * width, src + ((size_t)g * T + p0) * width, (size_t)c * width * sizeof(float));
        memcpy(dst + ((size_t)g * 2 * c + c) * width, src + ((size_t)g * T + p1) * width, (size_t)c * width * sizeof(float));
    }
}

static void run_query_positions(int c, int cp, int NH, int NKV, int window, const float *alibi) {
    int T = 2 * cp * c, Tq = 2 * c, B = 2, HS = AHS;
    size_t nq = (size_t)B * NH * T * HS, nkv = (size_t)B * NKV * T * HS, nl = (size_t)B * NH * Tq * HS;
    float *q = randn(nq, 1), *k = randn(nkv, 1), *v = randn(nkv, 1), *dout = randn(nq, 1);
    float *out = malloc(nq * 4), *lse = malloc((size_t)B * NH * T * 4), *dq = malloc(nq * 4), *dk = malloc(nkv * 4);
    float *dv = malloc(nkv * 4), *dk_sum = calloc(nkv, 4), *dv_sum = calloc(nkv, 4);
    neox_attention_opts o = {.scale = 0.5f, .window = window, .operands = NEOX_ELEM_F32, .alibi = alibi};
    neox_attention_forward(out, lse, q, k, v, B, T, NH, NKV, HS, o, NEOX_ELEM_F32);
    neox_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, B, T, NH, NKV, HS, o, NEOX_ELEM_F32);
    float *ql = malloc(nl * 4), *dl = malloc(nl * 4), *ol = malloc(nl * 4), *ll = malloc((size_t)B * NH * Tq * 4);
    float *dql = malloc(nl * 4), *dkl = malloc(nkv * 4), *dvl = malloc(nkv * 4), *want = malloc(nl * 4);
    for (int r = 0; r < cp; r++) {
        int p0 = r * c, p1 = (2 * cp - 1 - r) * c;
        neox_attention_opts oc = o;
        oc.q_rows = Tq, oc.q_split = c, oc.q_pos0 = p0, oc.q_pos1 = p1;
        pick_positions(ql, q, B * NH, T, c, p0, p1, HS);           // q: (B, NH, T, HS)
        pick_positions(dl, dout, B, T, c, p0, p1, NH * HS);         // dout: (B, T, NH, HS)
        neox_attention_forward(ol, ll, ql, k, v, B, T, NH, NKV, HS, oc, NEOX_ELEM_F32);
        neox_attention_backward(dql, dkl, dvl, dl, ql, k, v, ol, ll, B, T, NH, NKV, HS, oc, NEOX_ELEM_F32);
        pick_positions(want, out, B, T, c, p0, p1, NH * HS);
        for (size_t i = 0; i < nl; i++) assert_float_equal(ol[i], want[i], 1e-5);
        pick_positions(want, lse, B * NH, T, c, p0, p1, 1);
        for (size_t i = 0; i < (size_t)B * NH * Tq; i++) assert_float_equal(ll[i], want[i], 1e-5);
        pick_positions(want, dq, B * NH, T, c, p0, p1, HS);
        for (size_t i = 0; i < nl; i++) assert_float_equal(dql[i], want[i], 1e-5);
        for (size_t i = 0; i < nkv; i++) dk_sum[i] += dkl[i], dv_sum[i] += dvl[i];
    }
    for (size_t i = 0; i < nkv; i++) assert_float_equal(dk_sum[i], dk[i], 1e-5), assert_float_equal(dv_sum[i], dv[i], 1e-5);
    float *bufs[] = {q, k, v, dout, out, lse, dq, dk, dv, dk_sum, dv_sum, ql, dl, ol, ll, dql, dkl, dvl, want};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
}

static void test_attention_query_positions(void **state) {
    (void)state;
    float s4[4];
    neox_alibi_slopes(s4, 4, 0, 4);
    run_query_positions(4, 2, 2, 2, 0, NULL);    // small chunks, one block
    run_query_positions(40, 2, 4, 2, 0, NULL);   // a rank's 80 rows across two query blocks, GQA
    run_query_positions(20, 4, 4, 1, 30, NULL);  // cp 4, a window reaching back across chunks
    run_query_positions(40, 2, 4, 2, 0, s4);     // ALiBi's j - i at global positions
}

// ---- attention with 16-bit operands: the rounding points ------------------------------------------
// One key tile (T <= 64), so a tile's running max is its row's max: a naive attention in double that
// rounds where kernels.h says (q, k, v, dout; the probability tile before it weights v or dout; the
// score gradients before they weight k or q) must match the kernel far more closely than the same
// naive attention without the tile roundings (inputs rounded in both). A rounding boundary crossed
// by the last fp32 bit on one side moves one element by a unit of the 16-bit type at most.
enum { RT = 60, RNH = 2, RNKV = 1, RHS = 16 };
typedef struct { double out[RNH * RT * RHS], dq[RNH * RT * RHS], dk[RNKV * RT * RHS], dv[RNKV * RT * RHS]; } attn_ref;

static double rnd(double x, neox_elem e, int on) { return on ? neox_round_to_elem((float)x, e) : x; }

static void naive_rounded_attention(attn_ref *r, const float *q, const float *k, const float *v, const float *dout,
                                    const float *out, const float *lse, float scale, neox_elem e, int tiles) {
    memset(r, 0, sizeof *r);
    for (int h = 0; h < RNH; h++) {
        const float *qh = q + (size_t)h * RT * RHS, *kh = k + (size_t)(h / (RNH / RNKV)) * RT * RHS;
        const float *vh = v + (size_t)(h / (RNH / RNKV)) * RT * RHS;
        double *dkh = r->dk + (size_t)(h / (RNH / RNKV)) * RT * RHS, *dvh = r->dv + (size_t)(h / (RNH / RNKV)) * RT * RHS;
        for (int i = 0; i < RT; i++) {
            double sc[RT], mx = -1e300, sum = 0, Di = 0;
            const float *dor = dout + ((size_t)i * RNH + h) * RHS, *orow = out + ((size_t)i * RNH + h) * RHS;
            for (int j = 0; j <= i; j++) {
                sc[j] = 0;
                for (int d = 0; d < RHS; d++) sc[j] += rnd(qh[i * RHS + d], e, 1) * rnd(kh[j * RHS + d], e, 1);
                sc[j] *= scale;
                mx = fmax(mx, sc[j]);
            }
            for (int j = 0; j <= i; j++) sum += exp(sc[j] - mx);
            for (int d = 0; d < RHS; d++) Di += (double)dor[d] * orow[d];
            for (int j = 0; j <= i; j++) {
                double pf = exp(sc[j] - mx), pb = exp(sc[j] - lse[h * RT + i]), dp = 0;
                for (int d = 0; d < RHS; d++) {
                    r->out[((size_t)i * RNH + h) * RHS + d] += rnd(pf, e, tiles) * rnd(vh[j * RHS + d], e, 1) / sum;
                    dp += rnd(dor[d], e, 1) * rnd(vh[j * RHS + d], e, 1);
                }
                double ds = rnd(pb * (dp - Di) * scale, e, tiles);
                for (int d = 0; d < RHS; d++) {
                    dvh[j * RHS + d] += rnd(pb, e, tiles) * rnd(dor[d], e, 1);
                    r->dq[((size_t)h * RT + i) * RHS + d] += ds * rnd(kh[j * RHS + d], e, 1);
                    dkh[j * RHS + d] += ds * rnd(qh[i * RHS + d], e, 1);
                }
            }
        }
    }
}

// Mean distance of got from a and from b, and the largest from a relative to a's largest value.
static void distances(const float *got, const double *a, const double *b, size_t n, double *to_a, double *to_b,
                      double *worst_rel) {
    double sa = 0, sb = 0, worst = 0, amax = 0;
    for (size_t i = 0; i < n; i++) {
        sa += fabs(got[i] - a[i]), sb += fabs(got[i] - b[i]);
        worst = fmax(worst, fabs(got[i] - a[i])), amax = fmax(amax, fabs(a[i]));
    }
    *to_a = sa / n, *to_b = sb / n, *worst_rel = worst / amax;
}

static void check_rounding_points(neox_elem e) {
    size_t nq = (size_t)RNH * RT * RHS, nkv = (size_t)RNKV * RT * RHS;
    float *q = randn(nq, 1), *k = randn(nkv, 1), *v = randn(nkv, 1), *dout = randn(nq, 1), scale = 0.25f;
    float *out = zeros(nq), *lse = zeros((size_t)RNH * RT), *dq = zeros(nq), *dk = zeros(nkv), *dv = zeros(nkv);
    neox_attention_opts o = {.scale = scale, .operands = e};
    neox_attention_forward(out, lse, q, k, v, 1, RT, RNH, RNKV, RHS, o, NEOX_ELEM_F32);
    neox_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, 1, RT, RNH, RNKV, RHS, o, NEOX_ELEM_F32);
    attn_ref *ref = neox_malloc(sizeof *ref), *loose = neox_malloc(sizeof *loose);
    naive_rounded_attention(ref, q, k, v, dout, out, lse, scale, e, 1);
    naive_rounded_attention(loose, q, k, v, dout, out, lse, scale, e, 0);
    const float *got[] = {out, dq, dk, dv};
    const double *want[] = {ref->out, ref->dq, ref->dk, ref->dv}, *skip[] = {loose->out, loose->dq, loose->dk, loose->dv};
    size_t n[] = {nq, nq, nkv, nkv};
    double unit = e == NEOX_ELEM_BF16 ? 1.0 / 256 : 1.0 / 2048;  // half a unit in the last place, relative
    for (int t = 0; t < 4; t++) {
        double to_ref, to_loose, worst;
        distances(got[t], want[t], skip[t], n[t], &to_ref, &to_loose, &worst);
        if (!(to_ref < 0.05 * to_loose && worst < 4 * unit))
            fail_msg("tensor %d (out, dq, dk, dv), operands %d: mean distance %.3g to the rounded reference, %.3g to "
                     "the one without tile roundings; worst %.3g of the largest value", t, (int)e, to_ref, to_loose,
                     worst);
    }
    free(q); free(k); free(v); free(dout); free(out); free(lse); free(dq); free(dk); free(dv); free(ref); free(loose);
}

static void test_attention_rounding_points(void **state) {
    (void)state;
    check_rounding_points(NEOX_ELEM_BF16);
    check_rounding_points(NEOX_ELEM_F16);
}

// Longer sequences (the running max changes from tile to tile): 16-bit operands stay within a few
// units of their precision of fp32 attention, and do differ from it (the roundings happen).
static void test_attention_16bit_tiles(void **state) {
    (void)state;
    int T = 150, NH = 4, NKV = 2, HS = 16;
    size_t nq = (size_t)2 * NH * T * HS, nkv = (size_t)2 * NKV * T * HS;
    float *q = randn(nq, 1), *k = randn(nkv, 1), *v = randn(nkv, 1), *dout = randn(nq, 1);
    for (int e = NEOX_ELEM_BF16; e <= NEOX_ELEM_F16; e++) {
        float *o32 = zeros(nq), *o16 = zeros(nq), *l32 = zeros((size_t)2 * NH * T), *l16 = zeros((size_t)2 * NH * T);
        float *g32[3] = {zeros(nq), zeros(nkv), zeros(nkv)}, *g16[3] = {zeros(nq), zeros(nkv), zeros(nkv)};
        neox_attention_opts o32_opts = {.scale = 0.25f, .dropout = 0.1f, .seed = 5, .operands = NEOX_ELEM_F32};
        neox_attention_opts o16_opts = o32_opts;
        o16_opts.operands = (neox_elem)e;
        neox_attention_forward(o32, l32, q, k, v, 2, T, NH, NKV, HS, o32_opts, NEOX_ELEM_F32);
        neox_attention_forward(o16, l16, q, k, v, 2, T, NH, NKV, HS, o16_opts, NEOX_ELEM_F32);
        neox_attention_backward(g32[0], g32[1], g32[2], dout, q, k, v, o32, l32, 2, T, NH, NKV, HS, o32_opts,
                                NEOX_ELEM_F32);
        neox_attention_backward(g16[0], g16[1], g16[2], dout, q, k, v, o16, l16, 2, T, NH, NKV, HS, o16_opts,
                                NEOX_ELEM_F32);
        double unit = e == NEOX_ELEM_BF16 ? 1.0 / 128 : 1.0 / 1024;
        const float *a[] = {o32, g32[0], g32[1], g32[2]}, *b[] = {o16, g16[0], g16[1], g16[2]};
        size_t n[] = {nq, nq, nkv, nkv};
        for (int t = 0; t < 4; t++) {
            double worst = 0, amax = 0;
            for (size_t i = 0; i < n[t]; i++) worst = fmax(worst, fabs(a[t][i] - b[t][i])), amax = fmax(amax, fabs(a[t][i]));
            assert_true(worst > 1e-3 * unit * amax);  // rounded: not fp32's values
            assert_true(worst < 8 * unit * amax);
        }
        free(o32); free(o16); free(l32); free(l16);
        for (int t = 0; t < 3; t++) free(g32[t]), free(g16[t]);
    }
    free(q); free(k); free(v); free(dout);
}

// The one place that picks attention's operands: 16-bit only where the tensor-core kernel tiles.
static void test_attention_operands_choice(void **state) {
    (void)state;
    assert_int_equal(neox_attention_operands(NEOX_ELEM_F32, 64), NEOX_ELEM_F32);
    assert_int_equal(neox_attention_operands(NEOX_ELEM_BF16, 64), NEOX_ELEM_BF16);
    assert_int_equal(neox_attention_operands(NEOX_ELEM_F16, 128), NEOX_ELEM_F16);
    assert_int_equal(neox_attention_operands(NEOX_ELEM_BF16, 40), NEOX_ELEM_F32);
    assert_int_equal(neox_attention_operands(NEOX_ELEM_BF16, 256), NEOX_ELEM_F32);
}

// ---- activations --------------------------------------------------------------------------------
struct act_ctx { float *inp, *out, *R; neox_act_fn fn; int gated; };
enum { AN = 4, AF = 5 };

static double act_loss(void *p) {
    struct act_ctx *c = p;
    if (c->gated) neox_gated_forward(c->out, c->inp, AN, AF, c->fn, NEOX_ELEM_F32);
    else neox_activation_forward(c->out, c->inp, AN * AF, c->fn, NEOX_ELEM_F32);
    return dotd(c->out, c->R, AN * AF);
}

// The functions restated in double from their definitions (torch's and GPT-NeoX's activations.py).
static double act_reference(neox_act_fn fn, double x) {
    double sig = 1 / (1 + exp(-x));
    switch (fn) {
    case NEOX_FN_GELU: return 0.5 * x * (1 + erf(x / sqrt(2)));
    case NEOX_FN_GELU_TANH: return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case NEOX_FN_GELU_ONNX: return x * 0.5 * (erf(x / 1.41421) + 1);
    case NEOX_FN_RELU: return x > 0 ? x : 0;
    case NEOX_FN_SILU: return x * sig;
    case NEOX_FN_SOFTSIGN: return x / (1 + fabs(x));
    case NEOX_FN_MISH: return x * tanh(log1p(exp(x)));
    case NEOX_FN_SIGMOID: return sig;
    case NEOX_FN_IDENTITY: return x;
    }
    return NAN;
}

static void run_activation(neox_act_fn fn, int gated) {
    size_t nin = gated ? 2 * AN * AF : AN * AF;
    struct act_ctx c = {randn(nin, 2), zeros(AN * AF), randn(AN * AF, 1), fn, gated};
    act_loss(&c);
    for (int r = 0; r < AN; r++)
        for (int i = 0; i < AF; i++) {
            double ref = gated ? act_reference(fn, c.inp[r * 2 * AF + AF + i]) * c.inp[r * 2 * AF + i]
                               : act_reference(fn, c.inp[r * AF + i]);
            assert_true(fabs(ref - c.out[r * AF + i]) < 1e-5 * (1 + fabs(ref)));
        }
    float *dinp = zeros(nin);
    if (gated) neox_gated_backward(dinp, c.R, c.inp, AN, AF, fn, NEOX_ELEM_F32);
    else neox_activation_backward(dinp, c.R, c.inp, AN * AF, fn, NEOX_ELEM_F32);
    char what[32];
    snprintf(what, sizeof what, "activation %d%s", (int)fn, gated ? " gated" : "");
    check_grad(what, c.inp, dinp, nin, act_loss, &c);
    free(c.inp); free(c.out); free(c.R); free(dinp);
}

static void test_gelu(void **state) { (void)state; run_activation(NEOX_FN_GELU, 0); }
static void test_gelu_tanh(void **state) { (void)state; run_activation(NEOX_FN_GELU_TANH, 0); }
static void test_swiglu(void **state) { (void)state; run_activation(NEOX_FN_SILU, 1); }
// Every function, elementwise and gated (relu's kink at 0 has probability 0 under randn).
static void test_activations_all(void **state) {
    (void)state;
    for (int fn = NEOX_FN_GELU; fn <= NEOX_FN_IDENTITY; fn++) {
        run_activation((neox_act_fn)fn, 0);
        run_activation((neox_act_fn)fn, 1);
    }
}

// Heads h0 .. h0 + nh - 1 of micro-batch row b of (B, H, T, HS)-shaped x, copied out: what a
// data-parallel rank holding that row and a tensor-parallel rank holding those heads see.
static float *head_slice(const float *x, int b, int h0, int nh, int H, int T, int HS) {
    float *s = neox_malloc((size_t)nh * T * HS * sizeof(float));
    memcpy(s, x + ((size_t)b * H + h0) * T * HS, (size_t)nh * T * HS * sizeof(float));
    return s;
}

// (B, T, NH, HS)-shaped x's rows of micro-batch row b, heads h0 .. h0 + nh - 1 (the merged output layout).
static float *merged_slice(const float *x, int b, int h0, int nh, int NH, int T, int HS) {
    float *s = neox_malloc((size_t)nh * T * HS * sizeof(float));
    for (int t = 0; t < T; t++)
        memcpy(s + (size_t)t * nh * HS, x + (((size_t)b * T + t) * NH + h0) * HS, (size_t)nh * HS * sizeof(float));
    return s;
}

// Attention dropout keyed on global coordinates: a batch row alone (a data-parallel rank's share) with
// its global row index, and a head group alone (a tensor-parallel rank's heads) with its global head
// index, compute exactly the outputs and gradients the whole batch does; with the partition's local
// coordinates instead, the masks (and outputs) differ.
static void test_attention_dropout_partition(void **state) {
    (void)state;
    enum { B = 2, T = 70, NH = 4, NKV = 2, HS = 4, P = 2 };
    size_t nq = (size_t)B * NH * T * HS, nkv = (size_t)B * NKV * T * HS;
    float *q = randn(nq, 1), *k = randn(nkv, 1), *v = randn(nkv, 1), *dout = randn(nq, 1);
    float *out = zeros(nq), *lse = zeros((size_t)B * NH * T), *dq = zeros(nq), *dk = zeros(nkv), *dv = zeros(nkv);
    neox_attention_opts whole = {.scale = 0.5f, .dropout = 0.3f, .seed = 77, .operands = NEOX_ELEM_F32,
                                 .dropout_row0 = 3};
    neox_attention_forward(out, lse, q, k, v, B, T, NH, NKV, HS, whole, NEOX_ELEM_F32);
    neox_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, B, T, NH, NKV, HS, whole, NEOX_ELEM_F32);
    int local_differs = 0;
    for (int b = 0; b < B; b++)
        for (int r = 0; r < P; r++) {
            int nh = NH / P, nkv_r = NKV / P, h0 = r * nh, g0 = r * nkv_r;
            size_t pq = (size_t)nh * T * HS, pkv = (size_t)nkv_r * T * HS;
            float *qs = head_slice(q, b, h0, nh, NH, T, HS), *ks = head_slice(k, b, g0, nkv_r, NKV, T, HS);
            float *vs = head_slice(v, b, g0, nkv_r, NKV, T, HS), *ds = merged_slice(dout, b, h0, nh, NH, T, HS);
            float *o = zeros(pq), *l = zeros((size_t)nh * T), *gq = zeros(pq), *gk = zeros(pkv), *gv = zeros(pkv);
            neox_attention_opts part = whole;
            part.dropout_row0 = whole.dropout_row0 + (unsigned long long)b, part.dropout_head0 = h0;
            part.dropout_heads = NH;
            neox_attention_forward(o, l, qs, ks, vs, 1, T, nh, nkv_r, HS, part, NEOX_ELEM_F32);
            neox_attention_backward(gq, gk, gv, ds, qs, ks, vs, o, l, 1, T, nh, nkv_r, HS, part, NEOX_ELEM_F32);
            float *want = merged_slice(out, b, h0, nh, NH, T, HS);
            assert_memory_equal(o, want, pq * sizeof(float));
            free(want);
            want = head_slice(dq, b, h0, nh, NH, T, HS);
            assert_memory_equal(gq, want, pq * sizeof(float));
            free(want);
            want = head_slice(dk, b, g0, nkv_r, NKV, T, HS);
            assert_memory_equal(gk, want, pkv * sizeof(float));
            free(want);
            want = head_slice(dv, b, g0, nkv_r, NKV, T, HS);
            assert_memory_equal(gv, want, pkv * sizeof(float));
            // The same slice with the partition's own coordinates (row 0, heads from 0 of nh).
            neox_attention_opts local = whole;
            local.dropout_row0 = 0;
            neox_attention_forward(o, l, qs, ks, vs, 1, T, nh, nkv_r, HS, local, NEOX_ELEM_F32);
            float *got = merged_slice(out, b, h0, nh, NH, T, HS);
            local_differs += memcmp(o, got, pq * sizeof(float)) != 0;
            free(got); free(want);
            free(qs); free(ks); free(vs); free(ds); free(o); free(l); free(gq); free(gk); free(gv);
        }
    assert_int_equal(local_differs, B * P);
    free(q); free(k); free(v); free(dout); free(out); free(lse); free(dq); free(dk); free(dv);
}

// Hidden dropout's counter is the element's flat index: a part of the rows with its offset draws
// exactly the whole's mask.
static void test_dropout_partition(void **state) {
    (void)state;
    size_t n = 3000, cut = 1234;
    float *x = randn(n, 1), *whole = zeros(n), *part = zeros(n);
    neox_dropout(whole, x, n, 0.2f, 11, 9000, NULL, 0, NEOX_ELEM_F32);
    neox_dropout(part, x, cut, 0.2f, 11, 9000, NULL, 0, NEOX_ELEM_F32);
    neox_dropout(part + cut, x + cut, n - cut, 0.2f, 11, 9000 + cut, NULL, 0, NEOX_ELEM_F32);
    assert_memory_equal(whole, part, n * sizeof(float));
    neox_dropout(part + cut, x + cut, n - cut, 0.2f, 11, 9000, NULL, 0, NEOX_ELEM_F32);  // a local offset: another mask
    assert_true(memcmp(whole + cut, part + cut, (n - cut) * sizeof(float)) != 0);
    // A row read from memory (a replayed step's): row 3 of 1000-element rows past offset 9000 - 3000.
    unsigned long long row = 3;
    neox_dropout(part, x, n, 0.2f, 11, 6000, &row, 1000, NEOX_ELEM_F32);
    assert_memory_equal(whole, part, n * sizeof(float));
    free(x); free(whole); free(part);
}

static void test_dropout(void **state) {
    (void)state;
    size_t n = 10000;
    float *x = randn(n, 1), *y = zeros(n), *y2 = zeros(n);
    neox_dropout(y, x, n, 0.25f, 5, 100, NULL, 0, NEOX_ELEM_F32);
    neox_dropout(y2, x, n, 0.25f, 5, 100, NULL, 0, NEOX_ELEM_F32);
    assert_memory_equal(y, y2, n * sizeof(float));  // deterministic
    size_t dropped = 0;
    for (size_t i = 0; i < n; i++) {
        if (y[i] == 0.0f) dropped++;
        else assert_true(fabsf(y[i] - x[i] / 0.75f) < 1e-6f);
    }
    assert_true(dropped > 2200 && dropped < 2800);
    free(x); free(y); free(y2);
}

// ---- cross entropy ------------------------------------------------------------------------------
enum { CN = 5, CV = 7 };
struct ce_ctx { float *logits, *losses, *lse, *w; int targets[CN]; };

static double ce_loss(void *p) {  // weighted mean, as the model uses it
    struct ce_ctx *c = p;
    neox_cross_entropy_forward(c->losses, c->lse, c->logits, c->targets, CN, CV, NEOX_ELEM_F32);
    double sum = 0, wsum = 0;
    for (int i = 0; i < CN; i++) { sum += c->losses[i] * c->w[i]; wsum += c->w[i]; }
    return sum / wsum;
}

static void test_cross_entropy(void **state) {
    (void)state;
    float w[CN] = {1, 0, 1, 1, 0};
    struct ce_ctx c = {randn(CN * CV, 3), zeros(CN), zeros(CN), w, {0, 6, 3, 3, 1}};
    ce_loss(&c);
    for (int i = 0; i < CN; i++) {
        double s = 0;
        for (int j = 0; j < CV; j++) s += exp(c.logits[i * CV + j]);
        assert_true(fabs(log(s) - c.logits[i * CV + c.targets[i]] - c.losses[i]) < 1e-5);
    }
    float *d = zeros(CN * CV);
    neox_cross_entropy_backward(d, c.logits, c.lse, c.targets, w, 1.0f / 3, NULL, CN, CV, NEOX_ELEM_F32);
    check_grad("cross entropy", c.logits, d, CN * CV, ce_loss, &c);
    // In place (dlogits aliasing logits) gives the same.
    float *inplace = neox_malloc(sizeof(float) * CN * CV);
    memcpy(inplace, c.logits, sizeof(float) * CN * CV);
    neox_cross_entropy_backward(inplace, inplace, c.lse, c.targets, w, 1.0f / 3, NULL, CN, CV, NEOX_ELEM_F32);
    assert_memory_equal(inplace, d, sizeof(float) * CN * CV);
    free(c.logits); free(c.losses); free(c.lse); free(d); free(inplace);
}

// A target outside [0, V) marks a position that is not scored: loss 0, and its gradient is the
// softmax alone (no -1 anywhere in the row); the first row's -1 once read before the logits.
static void test_cross_entropy_masked_target(void **state) {
    (void)state;
    float w[CN] = {1, 1, 1, 1, 1};
    struct ce_ctx c = {randn(CN * CV, 3), zeros(CN), zeros(CN), w, {-1, 6, CV, 3, -7}};
    neox_cross_entropy_forward(c.losses, c.lse, c.logits, c.targets, CN, CV, NEOX_ELEM_F32);
    float *d = zeros(CN * CV);
    neox_cross_entropy_backward(d, c.logits, c.lse, c.targets, w, 1.0f, NULL, CN, CV, NEOX_ELEM_F32);
    for (int i = 0; i < CN; i++) {
        double s = 0;
        for (int j = 0; j < CV; j++) s += exp(c.logits[i * CV + j]);
        int scored = c.targets[i] >= 0 && c.targets[i] < CV;
        double want = scored ? log(s) - c.logits[i * CV + c.targets[i]] : 0.0;
        assert_true(fabs(want - c.losses[i]) < 1e-5);
        for (int j = 0; j < CV; j++) {
            double g = exp(c.logits[i * CV + j]) / s - (scored && j == c.targets[i] ? 1.0 : 0.0);
            assert_true(fabs(g - d[i * CV + j]) < 1e-5);
        }
    }
    free(c.logits); free(c.losses); free(c.lse); free(d);
}

// The fused loss and gradient against the formulas restated in double: per row lse = log sum exp,
// the target logit, and dlogits = (softmax - onehot) * w * scale, for fp32 and bf16 logits, a masked
// target and a weighted mask. In fp32 it equals the separate ops bit for bit (the unfused model's
// path), and so it does for 16-bit logits, whose rows the CPU visits in blocks of 1024 (the
// vocabulary here spans two blocks and a short one, with targets in each); its vocab-parallel second
// phase, on two halves of the vocabulary with statistics reduced by hand, gives the whole rows'
// gradient.
enum { FN = 6, FV = 2500 };

static void fused_reference(const float *z, const int *t, const float *w, float scale, int i, double *lse, double *grad) {
    double mx = -INFINITY, s = 0;
    for (int j = 0; j < FV; j++) mx = fmax(mx, z[i * FV + j]);
    for (int j = 0; j < FV; j++) s += exp(z[i * FV + j] - mx);
    *lse = mx + log(s);
    for (int j = 0; j < FV; j++)
        grad[j] = (exp(z[i * FV + j] - *lse) - (j == t[i] ? 1.0 : 0.0)) * w[i] * scale;
}

static void check_fused_rows(const float *z, const float *dz, const float *mx, const double *sum, const double *tl,
                             const int *t, const float *w, float scale, double tol, double atol) {
    double grad[FV], lse;
    for (int i = 0; i < FN; i++) {
        fused_reference(z, t, w, scale, i, &lse, grad);
        if (mx) assert_true(fabs(mx[i] + log(sum[i]) - lse) < 1e-5);
        if (tl) assert_true(fabs(tl[i] - (t[i] >= 0 && t[i] < FV ? z[i * FV + t[i]] : 0.0)) < 1e-6);
        for (int j = 0; j < FV; j++) assert_true(fabs(grad[j] - dz[i * FV + j]) <= tol * fabs(grad[j]) + atol);
    }
}

// The separate ops (forward, the vocab-parallel phases, backward) on the 16-bit rounding of z give
// the fused op's statistics (mx, sum, tl) and gradient (dh, in e) bit for bit.
static void check_fused_16bit_against_separate_ops(const float *z, const uint16_t *dh, neox_elem e, const float *mx,
                                                   const double *sum, const double *tl, const int *t, const float *w) {
    uint16_t *h = neox_malloc(sizeof(uint16_t) * FN * FV), *d2 = neox_malloc(sizeof(uint16_t) * FN * FV);
    if (e == NEOX_ELEM_BF16) neox_cast_f32_to_bf16(h, z, FN * FV);
    else neox_cast_f32_to_f16(h, z, FN * FV);
    float mx2[FN], lse[FN], lse_fwd[FN], losses[FN];
    double stats[2 * FN], loss[2];
    neox_cross_entropy_row_max(mx2, h, FN, FV, e);
    neox_cross_entropy_row_sumexp(stats, h, mx2, FN, FV, e);
    neox_cross_entropy_target_logit(stats + FN, h, t, FN, FV, e);
    neox_cross_entropy_loss(lse, loss, mx2, stats, w, FN);
    neox_cross_entropy_forward(losses, lse_fwd, h, t, FN, FV, e);
    neox_cross_entropy_backward(d2, h, lse, t, w, 0.25f, NULL, FN, FV, e);
    assert_memory_equal(mx, mx2, sizeof mx2);
    assert_memory_equal(sum, stats, FN * sizeof(double));
    assert_memory_equal(tl, stats + FN, FN * sizeof(double));
    assert_memory_equal(lse, lse_fwd, sizeof lse);
    assert_memory_equal(dh, d2, sizeof(uint16_t) * FN * FV);
    free(h); free(d2);
}

static void test_cross_entropy_fused(void **state) {
    (void)state;
    float *z = randn(FN * FV, 4), *dz = neox_malloc(sizeof(float) * FN * FV), w[FN] = {1, 0, 0.5f, 2, 1, 1}, mx[FN];
    int t[FN] = {3, 1500, -1, 0, 2400, FV};
    double sum[FN], tl[FN];
    memcpy(dz, z, sizeof(float) * FN * FV);
    neox_cross_entropy_fused(dz, NEOX_ELEM_F32, mx, sum, tl, t, w, 0.25f, NULL, FN, FV, 0);
    check_fused_rows(z, dz, mx, sum, tl, t, w, 0.25f, 1e-5, 1e-5 * 1e-6);
    // fp32: the separate ops' values bit for bit
    float mx2[FN], lse[FN], *d2 = zeros(FN * FV);
    double stats[2 * FN], loss[2];
    neox_cross_entropy_row_max(mx2, z, FN, FV, NEOX_ELEM_F32);
    neox_cross_entropy_row_sumexp(stats, z, mx2, FN, FV, NEOX_ELEM_F32);
    neox_cross_entropy_target_logit(stats + FN, z, t, FN, FV, NEOX_ELEM_F32);
    neox_cross_entropy_loss(lse, loss, mx2, stats, w, FN);
    neox_cross_entropy_backward(d2, z, lse, t, w, 0.25f, NULL, FN, FV, NEOX_ELEM_F32);
    assert_memory_equal(mx, mx2, sizeof mx);
    assert_memory_equal(sum, stats, sizeof sum);
    assert_memory_equal(tl, stats + FN, sizeof tl);
    assert_memory_equal(dz, d2, sizeof(float) * FN * FV);
    // The scale read from memory in place of the argument (a replayed step's), for both forms.
    float scale_at = 0.25f;
    memcpy(dz, z, sizeof(float) * FN * FV);
    neox_cross_entropy_fused(dz, NEOX_ELEM_F32, mx, sum, tl, t, w, 99.0f, &scale_at, FN, FV, 0);
    assert_memory_equal(dz, d2, sizeof(float) * FN * FV);
    neox_cross_entropy_backward(d2, z, lse, t, w, -1.0f, &scale_at, FN, FV, NEOX_ELEM_F32);
    assert_memory_equal(dz, d2, sizeof(float) * FN * FV);
    // bf16 logits in, bf16 dlogits out: the restatement on the rounded logits, to bf16's precision
    uint16_t *h = neox_malloc(sizeof(uint16_t) * FN * FV);
    float *zr = zeros(FN * FV), *dh = zeros(FN * FV);
    neox_cast_f32_to_bf16(h, z, FN * FV);
    neox_cast_bf16_to_f32(zr, h, FN * FV);
    neox_cross_entropy_fused(h, NEOX_ELEM_BF16, mx, sum, tl, t, w, 0.25f, NULL, FN, FV, 0);
    neox_cast_bf16_to_f32(dh, h, FN * FV);
    check_fused_rows(zr, dh, mx, sum, tl, t, w, 0.25f, 1.0 / 128, 1.0 / 128 * 1e-6);
    check_fused_16bit_against_separate_ops(z, h, NEOX_ELEM_BF16, mx, sum, tl, t, w);
    // fp16 logits: the same, to fp16's precision
    neox_cast_f32_to_f16(h, z, FN * FV);
    neox_cast_f16_to_f32(zr, h, FN * FV);
    neox_cross_entropy_fused(h, NEOX_ELEM_F16, mx, sum, tl, t, w, 0.25f, NULL, FN, FV, 0);
    neox_cast_f16_to_f32(dh, h, FN * FV);
    check_fused_rows(zr, dh, mx, sum, tl, t, w, 0.25f, 1.0 / 1024, 3e-8);  // (fp16's subnormal spacing 6e-8)
    check_fused_16bit_against_separate_ops(z, h, NEOX_ELEM_F16, mx, sum, tl, t, w);
    // Two halves of the vocabulary (a vocab-parallel pair), statistics reduced as the all-reduces
    // would, then the second phase on each half.
    enum { H = FV / 2 };
    float *half[2] = {zeros(FN * H), zeros(FN * H)}, hm[2][FN];
    double hs[2][FN], ht[2][FN], gsum[FN];
    int ht_targets[2][FN];
    for (int r = 0; r < 2; r++) {
        for (int i = 0; i < FN; i++) {
            memcpy(half[r] + i * H, z + i * FV + r * H, sizeof(float) * H);
            ht_targets[r][i] = t[i] >= r * H && t[i] < (r + 1) * H ? t[i] - r * H : -1;
        }
        neox_cross_entropy_row_max(hm[r], half[r], FN, H, NEOX_ELEM_F32);
    }
    for (int i = 0; i < FN; i++) hm[0][i] = hm[1][i] = fmaxf(hm[0][i], hm[1][i]);
    for (int r = 0; r < 2; r++) {
        neox_cross_entropy_row_sumexp(hs[r], half[r], hm[r], FN, H, NEOX_ELEM_F32);
        neox_cross_entropy_target_logit(ht[r], half[r], ht_targets[r], FN, H, NEOX_ELEM_F32);
    }
    for (int i = 0; i < FN; i++) gsum[i] = hs[0][i] + hs[1][i];
    for (int r = 0; r < 2; r++) {
        neox_cross_entropy_fused(half[r], NEOX_ELEM_F32, hm[r], gsum, NULL, ht_targets[r], w, 0.25f, NULL, FN, H, 1);
        for (int i = 0; i < FN; i++) memcpy(dh + i * FV + r * H, half[r] + i * H, sizeof(float) * H);
    }
    check_fused_rows(z, dh, NULL, NULL, NULL, t, w, 0.25f, 1e-5, 1e-5 * 1e-6);
    free(z); free(dz); free(d2); free(h); free(zr); free(dh); free(half[0]); free(half[1]);
}

// ---- optimizer ----------------------------------------------------------------------------------
static void test_adamw_and_norm(void **state) {
    (void)state;
    float p[3] = {1, -2, 0.5f}, g[3] = {0.1f, 0.2f, -0.3f}, m[3] = {0}, v[3] = {0};
    double ref[3], rm[3] = {0}, rv[3] = {0};
    for (int i = 0; i < 3; i++) ref[i] = p[i];
    for (long step = 1; step <= 3; step++) {
        neox_adamw(p, g, m, v, 3, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
        for (int i = 0; i < 3; i++) {  // torch.optim.AdamW's documented algorithm, in double
            ref[i] *= 1 - 1e-2 * 0.1;
            rm[i] = 0.9 * rm[i] + 0.1 * g[i];
            rv[i] = 0.95 * rv[i] + 0.05 * (double)g[i] * g[i];
            ref[i] -= 1e-2 * (rm[i] / (1 - pow(0.9, step))) / (sqrt(rv[i] / (1 - pow(0.95, step))) + 1e-8);
        }
    }
    for (int i = 0; i < 3; i++) assert_true(fabs(ref[i] - p[i]) < 1e-6);
    assert_true(fabs(neox_sum_squares(g, 3) - (0.01 + 0.04 + 0.09)) < 1e-7);
}

// The gradient norm's sum of squares over a buffer of several parallel groups of blocks with a
// ragged tail, against a long double sum: the same bits with one thread or two (its order is fixed
// by n alone).
static void test_sum_squares_large(void **state) {
    (void)state;
    size_t n = ((size_t)1 << 22) * 2 + 12345;  // two groups of 256 blocks of 2^14, and a partial one
    float *x = randn(n, 3.0f);
    long double want = 0;
    for (size_t i = 0; i < n; i++) want += (long double)x[i] * x[i];
    omp_set_num_threads(1);
    double one = neox_sum_squares(x, n);
    omp_set_num_threads(2);
    double two = neox_sum_squares(x, n);
    assert_true(fabsl(one - want) <= 1e-12L * want);
    assert_memory_equal(&one, &two, sizeof one);
    for (size_t k = 0; k < 40; k++) {  // short sums (a bias, a norm) and the lanes' tail
        double small = neox_sum_squares(x + k, k);
        long double w = 0;
        for (size_t i = 0; i < k; i++) w += (long double)x[k + i] * x[k + i];
        assert_true(fabsl(small - w) <= 1e-15L * (w + 1));
    }
    free(x);
}

// AdamW with the gradients' scale folded in equals scaling them first, bit for bit, over segments
// of many vector blocks and ragged ends, and leaves the gradients untouched; each element equals a
// plain scalar loop of torch's formula in float.
static void test_adamw_grad_scale(void **state) {
    (void)state;
    size_t n = 3 * 4096 + 1001;
    neox_segment segs[3] = {{0, 5000, 0.1f}, {5000, 5007, 0.0f}, {5100, n, 0.1f}};
    float *p1 = randn(n, 1.0f), *g = randn(n, 0.5f), *m1 = randn(n, 0.01f), *v1 = randn(n, 0.01f);
    float *p2 = neox_malloc(n * sizeof(float)), *m2 = neox_malloc(n * sizeof(float)), *v2 = neox_malloc(n * sizeof(float));
    float *g2 = neox_malloc(n * sizeof(float)), *g0 = neox_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) v1[i] = fabsf(v1[i]);
    memcpy(p2, p1, n * sizeof(float)), memcpy(m2, m1, n * sizeof(float)), memcpy(v2, v1, n * sizeof(float));
    memcpy(g2, g, n * sizeof(float)), memcpy(g0, g, n * sizeof(float));
    float s = 0.37f, lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f;
    long step = 4;
    float *pr = neox_malloc(n * sizeof(float));
    memcpy(pr, p1, n * sizeof(float));
    float bc1 = 1.0f - powf(b1, (float)step), bc2 = 1.0f - powf(b2, (float)step);
    for (int k = 0; k < 3; k++)
        for (size_t i = segs[k].begin; i < segs[k].end; i++) {
            float gi = g[i] * s, mi = b1 * m1[i] + (1.0f - b1) * gi, vi = b2 * v1[i] + (1.0f - b2) * gi * gi;
            float decayed = pr[i] * (1.0f - lr * segs[k].weight_decay);
            pr[i] = decayed - lr / bc1 * mi / (sqrtf(vi) / sqrtf(bc2) + eps);
        }
    neox_step_scalars sc = {.lr = lr, .step = step};
    neox_adamw_segments(p1, g, m1, v1, segs, 3, &sc, b1, b2, eps, s, NULL);
    neox_scale(g2, n, s);
    neox_adamw_segments(p2, g2, m2, v2, segs, 3, &sc, b1, b2, eps, 1.0f, NULL);
    assert_memory_equal(p1, p2, n * sizeof(float));
    assert_memory_equal(m1, m2, n * sizeof(float));
    assert_memory_equal(v1, v2, n * sizeof(float));
    assert_memory_equal(g, g0, n * sizeof(float));
    assert_memory_equal(p1, pr, n * sizeof(float));  // (the gap [5007, 5100) untouched in both)
    free(p1), free(g), free(m1), free(v1), free(p2), free(m2), free(v2), free(g2), free(g0), free(pr);
}

// The device step's ops: the sum of squares into memory, unscaling + DeepSpeed's clipping from it
// (clip_grad / (norm + 1e-6) when below 1, the norm being that of the unscaled gradients), and AdamW
// skipped by a non-finite guard.
static void test_clip_by_norm_and_guard(void **state) {
    (void)state;
    float g[4] = {3, -4, 12, 0}, want[4];
    neox_segment all = {0, 4, 0.0f};
    double sumsq = -1;
    neox_sum_squares_segments_into(&sumsq, g, &all, 1);
    assert_true(sumsq == 169.0);
    double scale = 2.0, norm = 13.0 / scale, coef = 0.5 * (1.0 / (norm + 1e-6));  // clip_grad 1
    for (int i = 0; i < 4; i++) want[i] = g[i] * (float)coef;
    neox_clip_by_norm(g, 4, &sumsq, scale, NULL, 1.0);
    assert_memory_equal(g, want, sizeof g);
    neox_clip_by_norm(g, 4, &sumsq, 1.0, NULL, 100.0);  // below the clip and no loss scale: untouched
    assert_memory_equal(g, want, sizeof g);
    float g2[4] = {3, -4, 12, 0};
    neox_clip_by_norm(g2, 4, &sumsq, 1e9, &scale, 1.0);  // the scale read from memory in place of the argument
    assert_memory_equal(g2, want, sizeof g);
    double bad[2] = {INFINITY, NAN};
    neox_step_scalars sc = {.lr = 1e-2f, .step = 1};
    float p[4] = {1, 2, 3, 4}, m[4] = {0}, v[4] = {0}, p0[4];
    memcpy(p0, p, sizeof p);
    for (int k = 0; k < 2; k++) {
        neox_clip_by_norm(g, 4, &bad[k], 1.0, NULL, 1.0);
        assert_memory_equal(g, want, sizeof g);
        neox_adamw_segments(p, g, m, v, &all, 1, &sc, 0.9f, 0.95f, 1e-8f, 1.0f, &bad[k]);
        assert_memory_equal(p, p0, sizeof p);
        assert_true(m[0] == 0 && v[0] == 0);
    }
    neox_adamw_segments(p, g, m, v, &all, 1, &sc, 0.9f, 0.95f, 1e-8f, 1.0f, &sumsq);
    assert_true(p[0] != p0[0] && m[0] != 0);
}

// The update's guard from the micro-batches' loss pairs (masked sum, mask sum): the sum of squares
// while every mean loss sum / mask sum is finite in float (a pair with no mask counts as loss 0,
// whatever its sum), NaN as soon as one is not: a loss that overflows float, an inf, a NaN.
static void test_loss_guard(void **state) {
    (void)state;
    double sumsq = 42.5, guard = 0;
    double finite[6] = {10.0, 4.0, 1e300, 0.0, NAN, 0.0};  // 2.5, then two pairs with an empty mask
    neox_loss_guard(&guard, &sumsq, finite, 3);
    assert_true(guard == 42.5);
    double bad[3][4] = {{1.0, 1.0, INFINITY, 2.0}, {NAN, 3.0, 1.0, 1.0}, {1e39, 1.0, 1.0, 1.0}};
    for (int k = 0; k < 3; k++) {
        guard = 0;
        neox_loss_guard(&guard, &sumsq, bad[k], 2);
        assert_true(isnan(guard));
    }
    double inf_sum = INFINITY;  // a non-finite norm stays one
    neox_loss_guard(&guard, &inf_sum, finite, 3);
    assert_true(isinf(guard));
}

// DeepSpeed's OnebitAdam update, in double: warm-up steps move both moments, frozen steps only m;
// p -= lr * (m / (sqrt(v) + eps) + wd * p), no bias correction.
static void test_onebit_adam(void **state) {
    (void)state;
    float p[3] = {1, -2, 0.5f}, g[3] = {0.1f, 0.2f, -0.3f}, m[3] = {0}, v[3] = {0};
    double ref[3], rm[3] = {0}, rv[3] = {0};
    for (int i = 0; i < 3; i++) ref[i] = p[i];
    for (int step = 1; step <= 4; step++) {
        int frozen = step > 2;
        neox_adam_moments(m, frozen ? NULL : v, g, 3, 0.9f, 0.95f);
        neox_onebit_adam_apply(p, m, v, 3, 1e-2f, 1e-8f, 0.1f);
        for (int i = 0; i < 3; i++) {
            rm[i] = 0.9 * rm[i] + 0.1 * g[i];
            if (!frozen) rv[i] = 0.95 * rv[i] + 0.05 * (double)g[i] * g[i];
            ref[i] -= 1e-2 * (rm[i] / (sqrt(rv[i]) + 1e-8) + 0.1 * ref[i]);
        }
    }
    for (int i = 0; i < 3; i++) assert_true(fabs(ref[i] - p[i]) < 1e-6);
    for (int i = 0; i < 3; i++) assert_true(fabs(rv[i] - v[i]) < 1e-6 * rv[i]);  // frozen after step 2
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear),          cmocka_unit_test(test_embedding), cmocka_unit_test(test_embedding_rows),
        cmocka_unit_test(test_embedding_order),
        cmocka_unit_test(test_layernorm),       cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_add_norm),
        cmocka_unit_test(test_add_norm_bias_unfused),
        cmocka_unit_test(test_qkv_split_merge), cmocka_unit_test(test_rotary),
        cmocka_unit_test(test_attention),       cmocka_unit_test(test_attention_gqa),
        cmocka_unit_test(test_attention_dropout), cmocka_unit_test(test_attention_blocks),
        cmocka_unit_test(test_attention_window),  cmocka_unit_test(test_attention_rounding_points),
        cmocka_unit_test(test_attention_16bit_tiles), cmocka_unit_test(test_attention_operands_choice),
        cmocka_unit_test(test_attention_alibi),
        cmocka_unit_test(test_attention_query_positions),
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_gelu_tanh),       cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_activations_all),
        cmocka_unit_test(test_dropout),         cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_attention_dropout_partition), cmocka_unit_test(test_dropout_partition),
        cmocka_unit_test(test_cross_entropy_masked_target),
        cmocka_unit_test(test_cross_entropy_fused),
        cmocka_unit_test(test_adamw_and_norm),  cmocka_unit_test(test_onebit_adam),
        cmocka_unit_test(test_clip_by_norm_and_guard), cmocka_unit_test(test_loss_guard), cmocka_unit_test(test_sum_squares_large),
        cmocka_unit_test(test_adamw_grad_scale),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
