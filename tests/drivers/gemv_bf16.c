// gemv_bf16.c: test driver for tests/oracle/test_gemv_bf16.py. Multiplies a bfloat16 weight matrix
// with one bfloat16 row through each build of the decoding step's bfloat16 product
// (kernels/cpu/gemv.h) this CPU runs, and through neox_gemm_ex (the path 16-bit precision's
// generation takes: the rows split over the OpenMP threads), and writes each build's result.
//   gemv_bf16 IN.safetensors OUT.safetensors
// IN holds "w" (BF16, N x K, shape [N, K]) and "x" (BF16, K); OUT holds "y_reference", "y_avx2",
// "y_avx512" (those this CPU runs) and "y_gemm_ex", each F32 of N.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/gemv.h"
#include "kernels/kernels.h"
#include "safetensors.h"

static int fail(const char *what) {
    fprintf(stderr, "gemv_bf16: %s\n", what);
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: gemv_bf16 IN.safetensors OUT.safetensors\n");
        return 2;
    }
    neox_error err = {0};
    neox_safetensors *in = neox_safetensors_open(argv[1], &err);
    if (!in) return fail(err.message);
    const neox_st_tensor *w = neox_safetensors_find(in, "w"), *x = neox_safetensors_find(in, "x");
    if (!w || !x || strcmp(w->dtype, "BF16") || strcmp(x->dtype, "BF16") || w->ndim != 2 || x->ndim != 1 ||
        x->shape[0] != w->shape[1])
        return fail("need w (BF16, [N, K]) and x (BF16, [K])");
    int N = (int)w->shape[0], K = (int)w->shape[1];
    struct { const char *name; neox_gemv_bf16_rows_fn *fn; int runs; } builds[] = {
        {"y_reference", neox_gemv_bf16_rows_reference, 1},
        {"y_avx2", neox_gemv_bf16_rows_avx2, neox_cpu_has_avx2_fma()},
        {"y_avx512", neox_gemv_bf16_rows_avx512, neox_cpu_has_avx512_bf16()},
    };
    neox_st_entry out[4];
    int n = 0;
    for (size_t b = 0; b < sizeof builds / sizeof *builds; b++) {
        if (!builds[b].runs) continue;
        float *y = neox_malloc((size_t)N * sizeof *y);
        builds[b].fn(N, K, 1.0f, w->data, K, x->data, 0.0f, y);
        out[n++] = (neox_st_entry){builds[b].name, "F32", 1, {N}, y};
    }
    float *y = neox_malloc((size_t)N * sizeof *y);
    neox_gemm_ex(0, 1, 1, N, K, 1.0f, x->data, K, w->data, K, NEOX_ELEM_BF16, 0.0f, y, N, NEOX_ELEM_F32);
    out[n++] = (neox_st_entry){"y_gemm_ex", "F32", 1, {N}, y};
    if (neox_safetensors_write(argv[2], out, n, NULL, &err) != 0) return fail(err.message);
    return 0;  // (the process's memory is left to its exit)
}
