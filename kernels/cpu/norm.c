// norm.c: LayerNorm and RMSNorm forward and backward, and the residual add fused before them (here
// the add and the norm in turn: the reference a GPU's one-pass kernel is held to). Statistics are accumulated in double for
// rows of any width; parameter gradients are reduced over rows by column blocks so that no
// per-thread scratch is needed and the sums do not depend on the thread count.
#include <math.h>
#include <stddef.h>

#include "kernels/kernels.h"

void neox_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                            const float *bias, int N, int C, float eps) {
    #pragma omp parallel for
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
    #pragma omp parallel for
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
