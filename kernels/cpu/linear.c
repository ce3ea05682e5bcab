// linear.c: torch.nn.Linear forward and backward on the CPU, as three GEMMs (kernels/cpu/gemm.c).
// Weights are (out, in) as Hugging Face stores them, so the forward multiplies by weight^T.
#include <string.h>

#include "gemm.h"
#include "kernels/kernels.h"
#include "parallel.h"

void neox_linear_forward(float *out, int ldo, const float *inp, const float *weight, const float *bias,
                         int N, int IC, int OC) {
    if (bias) {
        // Start from the broadcast bias and let the GEMM add to it (beta = 1): one pass over out.
        #pragma omp parallel for if ((size_t)N * OC >= NEOX_PARALLEL_MIN_ELEMS)
        for (int i = 0; i < N; i++) memcpy(out + (size_t)i * ldo, bias, (size_t)OC * sizeof(float));
    }
    neox_cpu_sgemm(0, 1, N, OC, IC, 1.0f, inp, IC, weight, IC, bias ? 1.0f : 0.0f, out, ldo);
}

void neox_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout, int ldo,
                          const float *inp, const float *weight, int N, int IC, int OC, int accumulate) {
    if (dinp)  // dinp (N, IC) = dout (N, OC) @ weight (OC, IC)
        neox_cpu_sgemm(0, 0, N, IC, OC, 1.0f, dout, ldo, weight, IC, accumulate ? 1.0f : 0.0f, dinp, IC);
    // dweight (OC, IC) += dout^T (OC, N) @ inp (N, IC)
    if (dweight) neox_cpu_sgemm(1, 0, OC, IC, N, 1.0f, dout, ldo, inp, IC, 1.0f, dweight, IC);
    if (dbias) {
        // Column blocks, rows in order: reads dout row by row (not down a column) and each column's
        // sum is the same sequence of additions whatever the thread count.
        #pragma omp parallel for
        for (int o0 = 0; o0 < OC; o0 += 64) {
            int n = OC - o0 < 64 ? OC - o0 : 64;
            float sum[64] = {0};
            for (int i = 0; i < N; i++) {
                const float *row = dout + (size_t)i * ldo + o0;
                #pragma omp simd
                for (int c = 0; c < n; c++) sum[c] += row[c];
            }
            for (int c = 0; c < n; c++) dbias[o0 + c] += sum[c];
        }
    }
}
