// team.c: the CPU's thread team for a decoding step (kernels/backend.h, NEOX_BACKEND_TEAM). The
// step runs in one OpenMP parallel region: every thread walks the layers itself, computes the small
// ops (norms, rotary, attention over the cache, adds) on its own copies, and meets the others only
// in the products, whose rows the threads share out (an orphaned `omp for`, which binds to the
// team's region and ends in its barrier). Each row's sum is the one-row kernel's, as gemm.c computes
// it outside a team, so a step's results are bit for bit the op-by-op step's.
#include <omp.h>
#include <string.h>

#include "gemm.h"
#include "kernels/backend.h"
#include "team.h"

int neox_team_threads(void) { return omp_get_max_threads(); }

void neox_team_run(void (*body)(void *ctx, int thread, int threads), void *ctx) {
    #pragma omp parallel
    body(ctx, omp_get_thread_num(), omp_get_num_threads());
}

void neox_team_barrier(void) {
    #pragma omp barrier
}

// Output rows [s, e) of row m of a team product: fp32 with the bias as the sums' start (as
// linear_forward: the bias copied in, then beta = 1), or bfloat16 with the bias added afterwards
// (as gemm_ex then add_bias).
static void chunk(float *out, const void *inp, const void *weight, const float *bias, int m, int s, int e, int IC,
                  int OC, int bf16) {
    float *y = out + (size_t)m * OC + s;
    if (!bf16) {
        if (bias) memcpy(y, bias + s, (size_t)(e - s) * sizeof *y);
        neox_cpu_gemv_rows(e - s, IC, 1.0f, (const float *)weight + (size_t)s * IC, IC, (const float *)inp + (size_t)m * IC,
                           bias ? 1.0f : 0.0f, y);
        return;
    }
    neox_cpu_gemv_bf16_rows(e - s, IC, 1.0f, (const uint16_t *)weight + (size_t)s * IC, IC,
                            (const uint16_t *)inp + (size_t)m * IC, 0.0f, y);
    if (bias)
        for (int j = 0; j < e - s; j++) y[j] = y[j] + bias[s + j];
}

// out: (N, OC), inp: (N, IC), weight: (OC, IC), bias: (OC) or NULL.
void neox_team_linear(float *out, const void *inp, const void *weight, const float *bias, int N, int IC, int OC,
                      neox_elem operands) {
    int bf16 = operands == NEOX_ELEM_BF16;
    int rows = neox_cpu_gemv_chunk_rows(N, OC, IC, bf16 ? sizeof(uint16_t) : sizeof(float));
    int chunks = (OC + rows - 1) / rows;
    #pragma omp for schedule(dynamic, 1)
    for (int i = 0; i < chunks; i++) {
        int s = i * rows, e = s + rows < OC ? s + rows : OC;
        for (int m = 0; m < N; m++) chunk(out, inp, weight, bias, m, s, e, IC, OC, bf16);
    }
}
