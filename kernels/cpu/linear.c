// linear.c: torch.nn.Linear forward and backward on the CPU, as three GEMMs (kernels/cpu/gemm.c).
// Weights are (out, in) as Hugging Face stores them, so the forward multiplies by weight^T. Under
// bf16 activation storage (kernels.h, "Activation storage") the products are gemm_ex's bf16 ones
// (kernels/cpu/gemm_bf16.c: fp32 sums) into fp32 rows, which take the bias (or dinp's old value)
// in fp32 and are rounded once as they are stored.
#include <stdlib.h>
#include <string.h>

#include "gemm.h"
#include "gemm_bf16.h"
#include "kernels/kernels.h"
#include "parallel.h"
#include "scratch.h"
#include "storage.h"

// rows (N, OC, packed) = bias broadcast (bias given) or zero.
static void bias_rows(float *rows, int ld, const float *bias, int N, int OC) {
    #pragma omp parallel for if ((size_t)N * OC >= NEOX_PARALLEL_MIN_ELEMS)
    for (int i = 0; i < N; i++) memcpy(rows + (size_t)i * ld, bias, (size_t)OC * sizeof(float));
}

// out (N, OC; row stride ldo, type act) = rows (N, OC; fp32, packed), each element rounded once.
static void store_rows(void *out, int ldo, const float *rows, int N, int OC, neox_elem act) {
    #pragma omp parallel for if ((size_t)N * OC >= NEOX_PARALLEL_MIN_ELEMS)
    for (int i = 0; i < N; i++) neox_act_store(out, (size_t)i * ldo, rows + (size_t)i * OC, (size_t)OC, act);
}

// The bf16 forward: the product of the bf16 operands into fp32 rows that hold the bias, then stored.
// The AVX512_BF16 product adds the bias and rounds into out directly (the same bits, no rows).
static void forward16(void *out, int ldo, const void *inp, const void *weight, const float *bias, int N, int IC,
                      int OC, neox_elem act) {
    if (act == NEOX_ELEM_BF16 && neox_gemm_bf16_rounded(0, 1, N, OC, IC, 1.0f, inp, IC, weight, IC, bias, 0, out, ldo))
        return;
    float *rows = neox_cpu_scratch((size_t)N * OC * sizeof(float), "the linear layer's fp32 rows");
    if (bias) bias_rows(rows, OC, bias, N, OC);
    neox_gemm_ex(0, 1, N, OC, IC, 1.0f, inp, IC, weight, IC, act, bias ? 1.0f : 0.0f, rows, OC, NEOX_ELEM_F32);
    store_rows(out, ldo, rows, N, OC, act);
    free(rows);
}

void neox_linear_forward(void *out, int ldo, const void *inp, const void *weight, const float *bias, int N, int IC,
                         int OC, neox_elem act) {
    if (act != NEOX_ELEM_F32) {
        forward16(out, ldo, inp, weight, bias, N, IC, OC, act);
        return;
    }
    if (bias) bias_rows(out, ldo, bias, N, OC);  // the GEMM adds to it (beta = 1): one pass over out
    neox_cpu_sgemm(0, 1, N, OC, IC, 1.0f, inp, IC, weight, IC, bias ? 1.0f : 0.0f, out, ldo);
}

// dbias (OC) += column sums of dout (N, OC; row stride ldo, type act). Column blocks, rows in order:
// reads dout row by row (not down a column) and each column's sum is the same sequence of additions
// whatever the thread count.
static void bias_grad(float *dbias, const void *dout, int ldo, int N, int OC, neox_elem act) {
    #pragma omp parallel for
    for (int o0 = 0; o0 < OC; o0 += 64) {
        int n = OC - o0 < 64 ? OC - o0 : 64;
        float sum[64] = {0}, widened[64];
        for (int i = 0; i < N; i++) {
            const float *row = neox_act_load(dout, (size_t)i * ldo + o0, (size_t)n, act, widened);
            #pragma omp simd
            for (int c = 0; c < n; c++) sum[c] += row[c];
        }
        for (int c = 0; c < n; c++) dbias[o0 + c] += sum[c];
    }
}

// The bf16 input gradient: dout @ weight into fp32 rows (holding dinp's widened value when
// accumulating), rounded once into dinp; the AVX512_BF16 product rounds into dinp directly.
static void input_grad16(void *dinp, const void *dout, int ldo, const void *weight, int N, int IC, int OC,
                         int accumulate, neox_elem act) {
    if (act == NEOX_ELEM_BF16 &&
        neox_gemm_bf16_rounded(0, 0, N, IC, OC, 1.0f, dout, ldo, weight, IC, NULL, accumulate, dinp, IC))
        return;
    size_t n = (size_t)N * IC;
    float *rows = neox_cpu_scratch(n * sizeof(float), "the linear layer's fp32 input gradient");
    if (accumulate) neox_act_load(dinp, 0, n, act, rows);  // (a 16-bit act: widened into rows)
    neox_gemm_ex(0, 0, N, IC, OC, 1.0f, dout, ldo, weight, IC, act, accumulate ? 1.0f : 0.0f, rows, IC, NEOX_ELEM_F32);
    store_rows(dinp, IC, rows, N, IC, act);
    free(rows);
}

void neox_linear_backward(void *dinp, float *dweight, float *dbias, const void *dout, int ldo, const void *inp,
                          const void *weight, int N, int IC, int OC, int accumulate, neox_elem act) {
    if (dinp && act != NEOX_ELEM_F32) input_grad16(dinp, dout, ldo, weight, N, IC, OC, accumulate, act);
    else if (dinp)  // dinp (N, IC) = dout (N, OC) @ weight (OC, IC)
        neox_cpu_sgemm(0, 0, N, IC, OC, 1.0f, dout, ldo, weight, IC, accumulate ? 1.0f : 0.0f, dinp, IC);
    // dweight (OC, IC) += dout^T (OC, N) @ inp (N, IC), summed in fp32 whatever act is
    if (dweight) neox_gemm_ex(1, 0, OC, IC, N, 1.0f, dout, ldo, inp, IC, act, 1.0f, dweight, IC, NEOX_ELEM_F32);
    if (dbias) bias_grad(dbias, dout, ldo, N, OC, act);
}

// The reference of a fused linear + activation: the ops themselves, in the order a model without
// the fusion runs them (so a model calling it trains bit for bit as before), at the storage act.
void neox_linear_act_forward(void *out, void *pre, const void *inp, const void *weight, const float *bias, int N,
                             int IC, int OC, neox_act_fn fn, neox_elem act) {
    neox_linear_forward(pre, OC, inp, weight, bias, N, IC, OC, act);
    neox_activation_forward(out, pre, (size_t)N * OC, fn, act);
}

void neox_linear_act_backward(void *dpre, float *dbias, const void *dout, const void *weight, const void *pre, int N,
                              int IC, int OC, neox_act_fn fn, neox_elem act) {
    neox_linear_backward(dpre, NULL, NULL, dout, OC, NULL, weight, N, IC, OC, 0, act);
    neox_activation_backward(dpre, dpre, pre, (size_t)N * IC, fn, act);  // (elementwise: in place)
    if (dbias) bias_grad(dbias, dpre, IC, N, IC, act);
}
