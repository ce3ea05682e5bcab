// compression.c: the compute of the compressed and sparse gradient exchanges (lib/gradient's 1-bit
// all-reduce, PowerSGD and sparse embedding rows), as the readable reference of the backend ops in
// kernels.h: 1-bit compression with error feedback and its two decompressions, the scaled add of
// error feedback, PowerSGD's Gram-Schmidt and strided copies, and the sum and scaling of rows by id.
// lib/gradient keeps the layouts and the collectives; every loop over gradient or wire memory is here.
#include <math.h>
#include <string.h>

#include "kernels/cpu/parallel.h"
#include "kernels/kernels.h"

static float scale_of(const uint8_t *bytes) {
    float s;
    memcpy(&s, bytes, sizeof s);  // a float's bytes at any offset of a message block
    return s;
}

// Signs of n elements (a multiple of 8), >= 0 -> 1, most significant bit first.
static void pack_signs(const float *x, size_t n, uint8_t *bits) {
    #pragma omp parallel for if (n >= NEOX_PARALLEL_MIN_ELEMS)
    for (size_t j = 0; j < n / 8; j++) {
        unsigned byte = 0;
        for (int k = 0; k < 8; k++) byte = byte << 1 | (x[8 * j + (size_t)k] >= 0.0f);
        bits[j] = (uint8_t)byte;
    }
}

static float sign_value(const uint8_t *bits, size_t i, float scale) { return bits[i / 8] >> (7 - i % 8) & 1 ? scale : -scale; }

void neox_onebit_compress(uint8_t *signs, size_t sign_stride, uint8_t *scale, size_t scale_stride, float *error,
                          const float *x, size_t n, size_t padded, int chunks) {
    neox_add_inplace(error, x, n);  // the padding adds zeros: its error stays
    // torch.norm(x) / sqrt(n) in fp32, the sum of squares in double
    float s = padded ? (float)sqrt(neox_sum_squares(error, padded)) / (float)sqrt((double)padded) : 0.0f;
    size_t chunk = padded / (size_t)chunks;
    for (int c = 0; c < chunks; c++) {
        pack_signs(error + (size_t)c * chunk, chunk, signs + (size_t)c * sign_stride);
        memcpy(scale + (size_t)c * scale_stride, &s, sizeof s);
    }
    #pragma omp parallel for if (padded >= NEOX_PARALLEL_MIN_ELEMS)
    for (size_t i = 0; i < padded; i++) error[i] -= error[i] >= 0.0f ? s : -s;
}

void neox_onebit_average(float *out, const uint8_t *blocks, size_t block, size_t signs_at, size_t scale_at, size_t n,
                         int p) {
    float mean = 1.0f / (float)p;
    #pragma omp parallel for if (n >= NEOX_PARALLEL_MIN_ELEMS)
    for (size_t j = 0; j < n; j++) {
        float sum = 0.0f;
        for (int q = 0; q < p; q++) {
            const uint8_t *b = blocks + (size_t)q * block;
            float v = sign_value(b + signs_at, j, scale_of(b + scale_at) * mean);
            sum = q ? sum + v : v;
        }
        out[j] = sum;
    }
}

void neox_onebit_decompress(float *out, const uint8_t *blocks, size_t block, size_t signs_at, size_t scale_at,
                            size_t chunk, size_t n) {
    #pragma omp parallel for if (n >= NEOX_PARALLEL_MIN_ELEMS)
    for (size_t i = 0; i < n; i++) {
        const uint8_t *b = blocks + i / chunk * block;
        out[i] = sign_value(b + signs_at, i % chunk, scale_of(b + scale_at));
    }
}

void neox_add_scaled(float *acc, const float *x, size_t n, float s) {
    #pragma omp parallel for if (n >= NEOX_PARALLEL_MIN_ELEMS)
    for (size_t i = 0; i < n; i++) acc[i] += s * x[i];
}

void neox_orthonormalise_columns(float *P, int n, int r) {
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

void neox_copy_matrix(float *dst, int ldd, const float *src, int lds, int rows, int cols) {
    for (int i = 0; i < rows; i++)
        memcpy(dst + (size_t)i * (size_t)ldd, src + (size_t)i * (size_t)lds, (size_t)cols * sizeof(float));
}

void neox_rows_sum_by_id(float *grad, const float *rows, const int *ids, int n, int C) {
    size_t w = (size_t)C;
    for (int i = 0; i < n; i++) memset(grad + (size_t)ids[i] * w, 0, w * sizeof(float));
    for (int i = 0; i < n; i++) {
        float *dst = grad + (size_t)ids[i] * w;
        const float *src = rows + (size_t)i * w;
        for (size_t k = 0; k < w; k++) dst[k] += src[k];
    }
}

void neox_scale_rows(float *x, const int *ids, int n, int C, float s) {
    #pragma omp parallel for if ((size_t)n * (size_t)C >= NEOX_PARALLEL_MIN_ELEMS)
    for (int i = 0; i < n; i++) {
        float *row = x + (size_t)ids[i] * (size_t)C;
        for (int k = 0; k < C; k++) row[k] *= s;
    }
}
