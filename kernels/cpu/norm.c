// norm.c: LayerNorm, RMSNorm and ScaleNorm forward and backward, and the residual add fused before them (here
// the add and the norm in turn: the reference a GPU's one-pass kernel is held to). Statistics are accumulated in double for
// rows of any width; parameter gradients are reduced over rows by column blocks so that no
// per-thread scratch is needed and the sums do not depend on the thread count.
#include <math.h>
#include <stddef.h>

#include "kernels/kernels.h"
#include "parallel.h"

void neox_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                            const float *bias, int N, int C, float eps) {
    #pragma omp parallel for if ((size_t)N * C >= NEOX_PARALLEL_MIN_ELEMS)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        double sum = 0.0, sq = 0.0;
        for (int c = 0; c < C; c++) sum += x[c];
        double mu = sum / C;
        for (int c = 0; c < C; c++) { double d = x[c] - mu; sq += d * d; }
        float m = (float)mu, s = (float)(1.0 / sqrt(sq / C + eps));
        float *o = out + (size_t)i * C;
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + (bias ? bias[c] : 0.0f);
        mean[i] = m;
        rstd[i] = s;
    }
}

// Sums rows of a*b (or of a when b is NULL) into acc, column block by column block.
static void add_column_sums(float *acc, const float *a, const float *b, const float *row_shift,
                            const float *row_scale, int N, int C) {
    #pragma omp parallel for
    for (int c0 = 0; c0 < C; c0 += 32) {
        int c1 = c0 + 32 < C ? c0 + 32 : C;
        float s[32] = {0};
        for (int i = 0; i < N; i++) {
            const float *ar = a + (size_t)i * C;
            if (b) {
                const float *br = b + (size_t)i * C;
                float sh = row_shift ? row_shift[i] : 0.0f, sc = row_scale[i];
                for (int c = c0; c < c1; c++) s[c - c0] += ar[c] * (br[c] - sh) * sc;
            } else {
                for (int c = c0; c < c1; c++) s[c - c0] += ar[c];
            }
        }
        for (int c = c0; c < c1; c++) acc[c] += s[c - c0];
    }
}

void neox_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                             const float *weight, const float *mean, const float *rstd, int N, int C) {
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        const float *d = dout + (size_t)i * C, *x = inp + (size_t)i * C;
        float m = mean[i], s = rstd[i];
        // With xhat = (x - m) * s and g = dout * weight:
        // dx = s * (g - mean(g) - xhat * mean(g * xhat))
        double gsum = 0.0, gxsum = 0.0;
        for (int c = 0; c < C; c++) {
            float g = d[c] * weight[c];
            gsum += g;
            gxsum += g * (x[c] - m) * s;
        }
        float gmean = (float)(gsum / C), gxmean = (float)(gxsum / C);
        float *dx = dinp + (size_t)i * C;
        for (int c = 0; c < C; c++) dx[c] += s * (d[c] * weight[c] - gmean - (x[c] - m) * s * gxmean);
    }
    add_column_sums(dweight, dout, inp, mean, rstd, N, C);
    if (dbias) add_column_sums(dbias, dout, NULL, NULL, NULL, N, C);
}

void neox_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N, int C, float eps) {
    #pragma omp parallel for if ((size_t)N * C >= NEOX_PARALLEL_MIN_ELEMS)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        double sq = 0.0;
        for (int c = 0; c < C; c++) sq += (double)x[c] * x[c];
        float s = (float)(1.0 / sqrt(sq / C + eps));
        float *o = out + (size_t)i * C;
        for (int c = 0; c < C; c++) o[c] = x[c] * s * weight[c];
        rstd[i] = s;
    }
}

void neox_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                           const float *rstd, int N, int C) {
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        const float *d = dout + (size_t)i * C, *x = inp + (size_t)i * C;
        float s = rstd[i];
        // dx = s * (g - xhat * mean(g * xhat)), g = dout * weight, xhat = x * s
        double gxsum = 0.0;
        for (int c = 0; c < C; c++) gxsum += d[c] * weight[c] * x[c] * s;
        float gxmean = (float)(gxsum / C);
        float *dx = dinp + (size_t)i * C;
        for (int c = 0; c < C; c++) dx[c] += s * (d[c] * weight[c] - x[c] * s * gxmean);
    }
    add_column_sums(dweight, dout, inp, NULL, rstd, N, C);
}

// The row's L2 norm, in double, as the forward and the backward both need it.
static double row_norm(const float *x, int C) {
    double sq = 0.0;
    for (int c = 0; c < C; c++) sq += (double)x[c] * x[c];
    return sqrt(sq);
}

void neox_scalenorm_forward(float *out, float *rnorm, const float *inp, const float *g, int N, int C, float eps) {
    float gain = g[0];
    #pragma omp parallel for if ((size_t)N * C >= NEOX_PARALLEL_MIN_ELEMS)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        double n = row_norm(x, C);
        float r = (float)(1.0 / (n < eps ? (double)eps : n));
        float *o = out + (size_t)i * C;
        for (int c = 0; c < C; c++) o[c] = x[c] * r * gain;
        rnorm[i] = r;
    }
}

void neox_scalenorm_backward(float *dinp, float *dg, const float *dout, const float *inp, const float *g,
                             const float *rnorm, int N, int C, float eps) {
    float gain = g[0];
    // y = g x r, r = 1 / n: dx = g r (dout - x r^2 (x . dout)), or g r dout where n was clamped.
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        const float *d = dout + (size_t)i * C, *x = inp + (size_t)i * C;
        float r = rnorm[i];
        double xd = 0.0;
        for (int c = 0; c < C; c++) xd += (double)x[c] * d[c];
        float through_norm = row_norm(x, C) < eps ? 0.0f : (float)(xd * r * r);
        float *dx = dinp + (size_t)i * C;
        for (int c = 0; c < C; c++) dx[c] += gain * r * (d[c] - x[c] * through_norm);
    }
    // dg = sum over rows of r (x . dout), in row order so that it does not depend on the threads.
    double sum = 0.0;
    for (int i = 0; i < N; i++) {
        const float *d = dout + (size_t)i * C, *x = inp + (size_t)i * C;
        double xd = 0.0;
        for (int c = 0; c < C; c++) xd += (double)x[c] * d[c];
        sum += xd * rnorm[i];
    }
    dg[0] += (float)sum;
}

// ---- query/key normalisation over heads ---------------------------------------------------------
// x: (B, H, T, HS). Row r = (b, t, group) holds the G * HS values of heads group*G .. group*G + G - 1
// at position t; its element e is head group*G + e / HS, dim e % HS.
static size_t head_norm_at(int b, int t, int h, int d, int H, int T, int HS) {
    return (((size_t)b * H + h) * T + t) * HS + d;
}

void neox_head_norm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                            const float *bias, int B, int H, int T, int HS, int G, float eps) {
    int groups = H / G, E = G * HS;
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int g = 0; g < groups; g++) {
                double sum = 0.0, sq = 0.0;
                for (int e = 0; e < E; e++) sum += inp[head_norm_at(b, t, g * G + e / HS, e % HS, H, T, HS)];
                double mu = mean ? sum / E : 0.0;
                for (int e = 0; e < E; e++) {
                    double x = inp[head_norm_at(b, t, g * G + e / HS, e % HS, H, T, HS)] - mu;
                    sq += x * x;
                }
                float m = (float)mu, s = (float)(1.0 / sqrt(sq / E + eps));
                for (int e = 0; e < E; e++) {
                    int h = g * G + e / HS, d = e % HS;
                    size_t at = head_norm_at(b, t, h, d, H, T, HS);
                    out[at] = (inp[at] - m) * s * weight[h * HS + d] + (bias ? bias[h * HS + d] : 0.0f);
                }
                size_t r = ((size_t)b * T + t) * groups + g;
                if (mean) mean[r] = m;
                rstd[r] = s;
            }
}

void neox_head_norm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                             const float *weight, const float *mean, const float *rstd, int B, int H, int T, int HS,
                             int G) {
    int groups = H / G, E = G * HS;
    // Parameter gradients first (dinp may be dout): one (h, d) per iteration, rows in order.
    #pragma omp parallel for
    for (int hd = 0; hd < H * HS; hd++) {
        int h = hd / HS, d = hd % HS;
        float sw = 0.0f, sb = 0.0f;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                size_t r = ((size_t)b * T + t) * groups + h / G, at = head_norm_at(b, t, h, d, H, T, HS);
                sw += dout[at] * (inp[at] - (mean ? mean[r] : 0.0f)) * rstd[r];
                sb += dout[at];
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
                    float gr = dout[at] * weight[h * HS + d];
                    gsum += gr;
                    gxsum += gr * (inp[at] - m) * s;
                }
                float gmean = mean ? (float)(gsum / E) : 0.0f, gxmean = (float)(gxsum / E);
                for (int e = 0; e < E; e++) {
                    int h = g * G + e / HS, d = e % HS;
                    size_t at = head_norm_at(b, t, h, d, H, T, HS);
                    dinp[at] = s * (dout[at] * weight[h * HS + d] - gmean - (inp[at] - m) * s * gxmean);
                }
            }
}

void neox_add_layernorm_forward(float *sum, float *out, float *mean, float *rstd, const float *a, const float *b,
                                const float *weight, const float *bias, int N, int C, float eps) {
    neox_add(sum, a, b, (size_t)N * C);
    neox_layernorm_forward(out, mean, rstd, sum, weight, bias, N, C, eps);
}

void neox_add_rmsnorm_forward(float *sum, float *out, float *rstd, const float *a, const float *b, const float *weight,
                              int N, int C, float eps) {
    neox_add(sum, a, b, (size_t)N * C);
    neox_rmsnorm_forward(out, rstd, sum, weight, N, C, eps);
}
