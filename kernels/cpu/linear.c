// linear.c: torch.nn.Linear forward and backward on the CPU, as three CBLAS GEMMs from OpenBLAS.
// Weights are (out, in) as Hugging Face stores them, so the forward multiplies by weight^T.
#include <cblas.h>
#include <string.h>

#include "kernels/kernels.h"

void neox_linear_forward(float *out, int ldo, const float *inp, const float *weight, const float *bias,
                         int N, int IC, int OC) {
    if (bias) {
        // Start from the broadcast bias and let the GEMM add to it (beta = 1): one pass over out.
        #pragma omp parallel for
        for (int i = 0; i < N; i++) memcpy(out + (size_t)i * ldo, bias, (size_t)OC * sizeof(float));
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, inp, IC, weight, IC,
                bias ? 1.0f : 0.0f, out, ldo);
}

void neox_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout, int ldo,
                          const float *inp, const float *weight, int N, int IC, int OC, int accumulate) {
    if (dinp)  // dinp (N, IC) = dout (N, OC) @ weight (OC, IC)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, ldo, weight, IC,
                    accumulate ? 1.0f : 0.0f, dinp, IC);
    // dweight (OC, IC) += dout^T (OC, N) @ inp (N, IC)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, ldo, inp, IC, 1.0f, dweight, IC);
    if (dbias) {
        #pragma omp parallel for
        for (int o = 0; o < OC; o++) {
            float sum = 0.0f;
            for (int i = 0; i < N; i++) sum += dout[(size_t)i * ldo + o];
            dbias[o] += sum;
        }
    }
}
