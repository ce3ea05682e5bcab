// norm.c: LayerNorm, RMSNorm and ScaleNorm forward and backward, and the residual add (with the branch's
// bias) fused before them (here the add and the norm in turn: the reference a GPU's one-pass kernel is
// held to); the backward's optional column sums of the residual gradient are the linear layer's bias
// gradient, called as it (the same additions). Statistics are accumulated in double for
// rows of any width; parameter gradients are reduced over rows by column blocks so that no
// per-thread scratch is needed and the sums do not depend on the thread count. LayerNorm and RMSNorm
// read and write activations in their storage type (storage.h): a bf16 row is widened into fp32
// scratch, normalised there and rounded once when stored; ScaleNorm and the query/key norm (strided
// over heads) read and write element by element.
#include <math.h>
#include <stddef.h>
#include <stdlib.h>

#include "kernels/kernels.h"
#include "parallel.h"
#include "scratch.h"
#include "storage.h"

// Per-thread fp32 rows for bf16 storage (storage.h): `rows` rows of C; nothing under fp32.
static float *row_scratch(neox_elem act, int rows, int C) {
    return act == NEOX_ELEM_BF16 ? neox_cpu_scratch((size_t)rows * C * sizeof(float), "bf16 activation rows") : NULL;
}

// One row: out = (x - mean) * rstd * weight + bias, the statistics in double.
static void layernorm_row(float *o, float *mean, float *rstd, const float *x, const float *weight, const float *bias,
                          int C, float eps) {
    double sum = 0.0, sq = 0.0;
    for (int c = 0; c < C; c++) sum += x[c];
    double mu = sum / C;
    for (int c = 0; c < C; c++) { double d = x[c] - mu; sq += d * d; }
    float m = (float)mu, s = (float)(1.0 / sqrt(sq / C + eps));
    for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + (bias ? bias[c] : 0.0f);
    *mean = m;
    *rstd = s;
}

void neox_layernorm_forward(void *out, float *mean, float *rstd, const void *inp, const float *weight,
                            const float *bias, int N, int C, float eps, neox_elem act) {
    #pragma omp parallel if ((size_t)N * C >= NEOX_PARALLEL_MIN_ELEMS)
    {
        float *s = row_scratch(act, 2, C);
        #pragma omp for
        for (int i = 0; i < N; i++) {
            size_t at = (size_t)i * C;
            float *o = neox_act_dest(out, at, act, s + C);
            layernorm_row(o, &mean[i], &rstd[i], neox_act_load(inp, at, C, act, s), weight, bias, C, eps);
            neox_act_store(out, at, o, C, act);
        }
        free(s);
    }
}

// Sums rows of a*(b - row_shift)*row_scale (or of a when b is NULL) into acc, column block by column block.
static void add_column_sums(float *acc, const void *a, const void *b, const float *row_shift, const float *row_scale,
                            int N, int C, neox_elem act) {
    #pragma omp parallel for
    for (int c0 = 0; c0 < C; c0 += 32) {
        int c1 = c0 + 32 < C ? c0 + 32 : C;
        float s[32] = {0};
        for (int i = 0; i < N; i++) {
            size_t row = (size_t)i * C;
            if (b) {
                float sh = row_shift ? row_shift[i] : 0.0f, sc = row_scale[i];
                for (int c = c0; c < c1; c++)
                    s[c - c0] += neox_act_get(a, row + c, act) * (neox_act_get(b, row + c, act) - sh) * sc;
            } else {
                for (int c = c0; c < c1; c++) s[c - c0] += neox_act_get(a, row + c, act);
            }
        }
        for (int c = c0; c < c1; c++) acc[c] += s[c - c0];
    }
}

// One row of LayerNorm's input gradient, added into dx. With xhat = (x - m) * s and g = dout * weight:
// dx += s * (g - mean(g) - xhat * mean(g * xhat)).
static void layernorm_backward_row(float *dx, const float *d, const float *x, const float *weight, float m, float s,
                                   int C) {
    double gsum = 0.0, gxsum = 0.0;
    for (int c = 0; c < C; c++) {
        float g = d[c] * weight[c];
        gsum += g;
        gxsum += g * (x[c] - m) * s;
    }
    float gmean = (float)(gsum / C), gxmean = (float)(gxsum / C);
    for (int c = 0; c < C; c++) dx[c] += s * (d[c] * weight[c] - gmean - (x[c] - m) * s * gxmean);
}

// dsum += the column sums of dinp as stored, by the linear layer's own bias gradient: the same additions
// as the pass it replaces in the model.
static void residual_sums(float *dsum, const void *dinp, int N, int C, neox_elem act) {
    if (dsum) neox_linear_backward(NULL, NULL, dsum, dinp, C, NULL, NULL, N, C, C, 0, act);
}

void neox_layernorm_backward(void *dinp, float *dweight, float *dbias, float *dsum, const void *dout, const void *inp,
                             const float *weight, const float *mean, const float *rstd, int N, int C, neox_elem act) {
    #pragma omp parallel
    {
        float *s = row_scratch(act, 3, C);
        #pragma omp for
        for (int i = 0; i < N; i++) {
            size_t at = (size_t)i * C;
            float *dx = (float *)neox_act_load(dinp, at, C, act, s + 2 * (size_t)C);
            layernorm_backward_row(dx, neox_act_load(dout, at, C, act, s), neox_act_load(inp, at, C, act, s + C),
                                   weight, mean[i], rstd[i], C);
            neox_act_store(dinp, at, dx, C, act);
        }
        free(s);
    }
    add_column_sums(dweight, dout, inp, mean, rstd, N, C, act);
    if (dbias) add_column_sums(dbias, dout, NULL, NULL, NULL, N, C, act);
    residual_sums(dsum, dinp, N, C, act);
}

// One row: out = x * rstd * weight.
static void rmsnorm_row(float *o, float *rstd, const float *x, const float *weight, int C, float eps) {
    double sq = 0.0;
    for (int c = 0; c < C; c++) sq += (double)x[c] * x[c];
    float s = (float)(1.0 / sqrt(sq / C + eps));
    for (int c = 0; c < C; c++) o[c] = x[c] * s * weight[c];
    *rstd = s;
}

void neox_rmsnorm_forward(void *out, float *rstd, const void *inp, const float *weight, int N, int C, float eps,
                          neox_elem act) {
    #pragma omp parallel if ((size_t)N * C >= NEOX_PARALLEL_MIN_ELEMS)
    {
        float *s = row_scratch(act, 2, C);
        #pragma omp for
        for (int i = 0; i < N; i++) {
            size_t at = (size_t)i * C;
            float *o = neox_act_dest(out, at, act, s + C);
            rmsnorm_row(o, &rstd[i], neox_act_load(inp, at, C, act, s), weight, C, eps);
            neox_act_store(out, at, o, C, act);
        }
        free(s);
    }
}

// One row of RMSNorm's input gradient, added into dx: dx += s * (g - xhat * mean(g * xhat)), g = dout * weight,
// xhat = x * s.
static void rmsnorm_backward_row(float *dx, const float *d, const float *x, const float *weight, float s, int C) {
    double gxsum = 0.0;
    for (int c = 0; c < C; c++) gxsum += d[c] * weight[c] * x[c] * s;
    float gxmean = (float)(gxsum / C);
    for (int c = 0; c < C; c++) dx[c] += s * (d[c] * weight[c] - x[c] * s * gxmean);
}

void neox_rmsnorm_backward(void *dinp, float *dweight, float *dsum, const void *dout, const void *inp,
                           const float *weight, const float *rstd, int N, int C, neox_elem act) {
    #pragma omp parallel
    {
        float *s = row_scratch(act, 3, C);
        #pragma omp for
        for (int i = 0; i < N; i++) {
            size_t at = (size_t)i * C;
            float *dx = (float *)neox_act_load(dinp, at, C, act, s + 2 * (size_t)C);
            rmsnorm_backward_row(dx, neox_act_load(dout, at, C, act, s), neox_act_load(inp, at, C, act, s + C), weight,
                                 rstd[i], C);
            neox_act_store(dinp, at, dx, C, act);
        }
        free(s);
    }
    add_column_sums(dweight, dout, inp, NULL, rstd, N, C, act);
    residual_sums(dsum, dinp, N, C, act);
}

// Row i's L2 norm, in double, as the forward and the backward both need it.
static double row_norm(const void *x, size_t row, int C, neox_elem act) {
    double sq = 0.0;
    for (int c = 0; c < C; c++) {
        double v = neox_act_get(x, row + c, act);
        sq += v * v;
    }
    return sqrt(sq);
}

// Row i's x . dout, in double.
static double row_dot(const void *x, const void *d, size_t row, int C, neox_elem act) {
    double xd = 0.0;
    for (int c = 0; c < C; c++) xd += (double)neox_act_get(x, row + c, act) * neox_act_get(d, row + c, act);
    return xd;
}

void neox_scalenorm_forward(void *out, float *rnorm, const void *inp, const float *g, int N, int C, float eps,
                            neox_elem act) {
    float gain = g[0];
    #pragma omp parallel for if ((size_t)N * C >= NEOX_PARALLEL_MIN_ELEMS)
    for (int i = 0; i < N; i++) {
        size_t row = (size_t)i * C;
        double n = row_norm(inp, row, C, act);
        float r = (float)(1.0 / (n < eps ? (double)eps : n));
        for (int c = 0; c < C; c++) neox_act_set(out, row + c, neox_act_get(inp, row + c, act) * r * gain, act);
        rnorm[i] = r;
    }
}

void neox_scalenorm_backward(void *dinp, float *dg, const void *dout, const void *inp, const float *g,
                             const float *rnorm, int N, int C, float eps, neox_elem act) {
    float gain = g[0];
    // y = g x r, r = 1 / n: dx = g r (dout - x r^2 (x . dout)), or g r dout where n was clamped.
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        size_t row = (size_t)i * C;
        float r = rnorm[i];
        double xd = row_dot(inp, dout, row, C, act);
        float through_norm = row_norm(inp, row, C, act) < eps ? 0.0f : (float)(xd * r * r);
        for (int c = 0; c < C; c++) {
            size_t at = row + c;
            float d = neox_act_get(dout, at, act), x = neox_act_get(inp, at, act);
            neox_act_set(dinp, at, neox_act_get(dinp, at, act) + gain * r * (d - x * through_norm), act);
        }
    }
    // dg = sum over rows of r (x . dout), in row order so that it does not depend on the threads.
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += row_dot(inp, dout, (size_t)i * C, C, act) * rnorm[i];
    dg[0] += (float)sum;
}

// ---- query/key normalisation over heads ---------------------------------------------------------
// x: (B, H, T, HS). Row r = (b, t, group) holds the G * HS values of heads group*G .. group*G + G - 1
// at position t; its element e is head group*G + e / HS, dim e % HS.
static size_t head_norm_at(int b, int t, int h, int d, int H, int T, int HS) {
    return (((size_t)b * H + h) * T + t) * HS + d;
}

void neox_head_norm_forward(void *out, float *mean, float *rstd, const void *inp, const float *weight,
                            const float *bias, int B, int H, int T, int HS, int G, float eps, neox_elem act) {
    int groups = H / G, E = G * HS;
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int g = 0; g < groups; g++) {
                double sum = 0.0, sq = 0.0;
                for (int e = 0; e < E; e++)
                    sum += neox_act_get(inp, head_norm_at(b, t, g * G + e / HS, e % HS, H, T, HS), act);
                double mu = mean ? sum / E : 0.0;
                for (int e = 0; e < E; e++) {
                    double x = neox_act_get(inp, head_norm_at(b, t, g * G + e / HS, e % HS, H, T, HS), act) - mu;
                    sq += x * x;
                }
                float m = (float)mu, s = (float)(1.0 / sqrt(sq / E + eps));
                for (int e = 0; e < E; e++) {
                    int h = g * G + e / HS, d = e % HS;
                    size_t at = head_norm_at(b, t, h, d, H, T, HS);
                    float y = (neox_act_get(inp, at, act) - m) * s * weight[h * HS + d] + (bias ? bias[h * HS + d] : 0.0f);
                    neox_act_set(out, at, y, act);
                }
                size_t r = ((size_t)b * T + t) * groups + g;
                if (mean) mean[r] = m;
                rstd[r] = s;
            }
}

void neox_head_norm_backward(void *dinp, float *dweight, float *dbias, const void *dout, const void *inp,
                             const float *weight, const float *mean, const float *rstd, int B, int H, int T, int HS,
                             int G, neox_elem act) {
    int groups = H / G, E = G * HS;
    // Parameter gradients first (dinp may be dout): one (h, d) per iteration, rows in order.
    #pragma omp parallel for
    for (int hd = 0; hd < H * HS; hd++) {
        int h = hd / HS, d = hd % HS;
        float sw = 0.0f, sb = 0.0f;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                size_t r = ((size_t)b * T + t) * groups + h / G, at = head_norm_at(b, t, h, d, H, T, HS);
                float dy = neox_act_get(dout, at, act);
                sw += dy * (neox_act_get(inp, at, act) - (mean ? mean[r] : 0.0f)) * rstd[r];
                sb += dy;
            }
        dweight[hd] += sw;
        if (dbias) dbias[hd] += sb;
    }
    // dx = s * (g - mean(g) - xhat * mean(g * xhat)), g = dout * weight (no mean(g) term for RMS)
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int g = 0; g < groups; g++) {
                size_t r = ((size_t)b * T + t) * groups + g;
                float m = mean ? mean[r] : 0.0f, s = rstd[r];
                double gsum = 0.0, gxsum = 0.0;
                for (int e = 0; e < E; e++) {
                    int h = g * G + e / HS, d = e % HS;
                    size_t at = head_norm_at(b, t, h, d, H, T, HS);
                    float gr = neox_act_get(dout, at, act) * weight[h * HS + d];
                    gsum += gr;
                    gxsum += gr * (neox_act_get(inp, at, act) - m) * s;
                }
                float gmean = mean ? (float)(gsum / E) : 0.0f, gxmean = (float)(gxsum / E);
                for (int e = 0; e < E; e++) {
                    int h = g * G + e / HS, d = e % HS;
                    size_t at = head_norm_at(b, t, h, d, H, T, HS);
                    float dx = s * (neox_act_get(dout, at, act) * weight[h * HS + d] - gmean -
                                    (neox_act_get(inp, at, act) - m) * s * gxmean);
                    neox_act_set(dinp, at, dx, act);
                }
            }
}

// sum = a + (b + b_bias), each sum rounded to act as neox_add_bias, then neox_add round it (b is
// left as it is).
static void add_biased(void *sum, const void *a, const void *b, const float *b_bias, int N, int C, neox_elem act) {
    if (!b_bias) {
        neox_add(sum, a, b, (size_t)N * C, act);
        return;
    }
    #pragma omp parallel for if ((size_t)N * C >= NEOX_PARALLEL_MIN_ELEMS)
    for (int i = 0; i < N; i++)
        for (size_t at = (size_t)i * C, end = at + C; at < end; at++) {
            float biased = neox_act_round(neox_act_get(b, at, act) + b_bias[at - (size_t)i * C], act);
            neox_act_set(sum, at, neox_act_get(a, at, act) + biased, act);
        }
}

void neox_add_layernorm_forward(void *sum, void *out, float *mean, float *rstd, const void *a, const void *b,
                                const float *b_bias, const float *weight, const float *bias, int N, int C, float eps,
                                neox_elem act) {
    add_biased(sum, a, b, b_bias, N, C, act);
    if (out) neox_layernorm_forward(out, mean, rstd, sum, weight, bias, N, C, eps, act);
}

void neox_add_rmsnorm_forward(void *sum, void *out, float *rstd, const void *a, const void *b, const float *b_bias,
                              const float *weight, int N, int C, float eps, neox_elem act) {
    add_biased(sum, a, b, b_bias, N, C, act);
    if (out) neox_rmsnorm_forward(out, rstd, sum, weight, N, C, eps, act);
}
