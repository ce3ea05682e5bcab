// gemm_bf16.c: the bfloat16 matrix product of kernels/cpu/gemm_bf16.c on the shapes of a training
// step (bench/gemm_bf16.sh runs it beside torch's bf16 matmul). For every linear layer of the model,
// (tokens, in) -> (tokens, out): the forward x W^T (trans_b), the input gradient dy W and the weight
// gradient dy^T x (trans_a, beta 1), each timed as the best of `repeats` calls after one warm-up, at
// the OpenMP thread count of the caller (OMP_NUM_THREADS). The forward and the input gradient are
// stored rounded to bf16 (neox_gemm_bf16_rounded, the forward with a bias where the layer has one),
// as the step under bf16 storage makes them and as torch's bf16 matmul returns them. Also the
// machine's vdpbf16ps peak: a loop of independent vdpbf16ps on registers (no loads), the ceiling a
// product on packed operands can reach.
// Times are the process's CPU seconds (all its threads), which other programs on a shared machine
// disturb much less than wall time. Prints one JSON line per product: name, M N K, transposes, CPU
// seconds, GFLOP per CPU second (2 M N K / s) and its fraction of the measured peak.
//   gemm_bf16 key=value...   keys: hidden vocab tokens repeats
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core.h"
#include "kernels/cpu/gemm_bf16.h"

static int arg_int(const char *arg, const char *key, int *value) {
    size_t n = strlen(key);
    if (strncmp(arg, key, n) != 0 || arg[n] != '=') return 0;
    *value = atoi(arg + n + 1);
    return 1;
}

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#include <immintrin.h>
// GFLOP per CPU second of vdpbf16ps on one thread: 24 independent accumulators (more than latency x
// throughput needs), each instruction 16 lanes x 2 products x 2 FLOPs = 64 FLOPs; the best of 20
// short runs (another program's time slice or cache traffic lands in a few of them).
__attribute__((target("avx512f,avx512bf16"), noinline)) static double peak_gflops(void) {
    enum { ACC = 24, ITERS = 200000, RUNS = 20 };
    __m512 acc[ACC];
    for (int i = 0; i < ACC; i++) acc[i] = _mm512_set1_ps((float)i);
    __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = (__m512bh)_mm512_set1_epi32(0x00010001);
    double best = 1e30;
    for (int run = 0; run < RUNS; run++) {
        double t0 = cpu_now();
        for (int it = 0; it < ITERS; it++) {
            for (int i = 0; i < ACC; i++) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
            __asm__ volatile("" : "+v"(a), "+v"(b));
        }
        double t = cpu_now() - t0;
        best = t < best ? t : best;
    }
    float sink = 0;
    for (int i = 0; i < ACC; i++) sink += _mm512_reduce_add_ps(acc[i]);
    if (sink == 12345.0f) printf("#\n");
    return (double)ITERS * ACC * 64 / best / 1e9;
}

static uint16_t *random_bf16(size_t n) {
    uint16_t *x = neox_malloc(n * sizeof *x);
    uint32_t s = 12345;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = (uint16_t)(0x3c00 | (s >> 20 & 0x3ff) | (s >> 16 & 0x8000));  // |x| in [2^-7, 2^-6)...
    }
    return x;
}

// One call of the product as the step makes it: into fp32 C (beta: the weight gradient's
// accumulation), or rounded into bf16 C16 as it is stored (a linear layer's output, with its bias
// when given, and its input gradient under bf16 storage: kernels/cpu/linear.c).
typedef struct call {
    int ta, tb, M, N, K, rounded;
    float beta;
    const uint16_t *A, *B;
    const float *bias;
    float *C;
    uint16_t *C16;
} call;

static void run(const call *c) {
    int lda = c->ta ? c->M : c->K, ldb = c->tb ? c->K : c->N;
    if (c->rounded) {
        if (!neox_gemm_bf16_rounded(c->ta, c->tb, c->M, c->N, c->K, 1.0f, c->A, lda, c->B, ldb, c->bias, 0, c->C16,
                                    c->N))
            neox_die(1, "the rounded product declined %dx%dx%d", c->M, c->N, c->K);
    } else
        neox_gemm_bf16_best()(c->ta, c->tb, c->M, c->N, c->K, 1.0f, c->A, lda, c->B, ldb, c->beta, c->C, c->N);
}

static double time_product(int ta, int tb, int M, int N, int K, float beta, int rounded, int with_bias, int repeats) {
    call c = {ta, tb, M, N, K, rounded, beta, random_bf16((size_t)M * K), random_bf16((size_t)N * K), NULL, NULL, NULL};
    float *bias = with_bias ? neox_calloc((size_t)N, sizeof *bias) : NULL;
    for (int j = 0; with_bias && j < N; j++) bias[j] = 0.01f * (float)(j % 7);
    c.bias = bias;
    if (rounded) c.C16 = neox_calloc((size_t)M * N, sizeof *c.C16);
    else c.C = neox_calloc((size_t)M * N, sizeof *c.C);
    run(&c);
    double best = 1e30;
    for (int r = 0; r < repeats; r++) {
        double t0 = cpu_now();
        run(&c);
        double t = cpu_now() - t0;
        best = t < best ? t : best;
    }
    free((void *)c.A), free((void *)c.B), free(bias), free(c.C), free(c.C16);
    return best;
}

int main(int argc, char **argv) {
    neox_set_progname(argv[0]);
    int hidden = 256, vocab = 8192, tokens = 1024, repeats = 5;
    for (int i = 1; i < argc; i++)
        if (!arg_int(argv[i], "hidden", &hidden) && !arg_int(argv[i], "vocab", &vocab) &&
            !arg_int(argv[i], "tokens", &tokens) && !arg_int(argv[i], "repeats", &repeats))
            neox_die(2, "bad argument '%s' (keys: hidden vocab tokens repeats)", argv[i]);
    if (!neox_cpu_has_avx512_bf16()) neox_die(1, "this CPU has no AVX512_BF16 (the reference build is sgemm)");
    double peak = peak_gflops();
    printf("{\"name\": \"peak\", \"threads\": %d, \"gflops_per_s\": %.1f}\n", omp_get_max_threads(), peak);
    int C = hidden;
    struct { const char *name; int in, out; } layers[] = {
        {"qkv", C, 3 * C}, {"attn_out", C, C}, {"mlp_up", C, 4 * C}, {"mlp_down", 4 * C, C}, {"logits", C, vocab}};
    for (size_t l = 0; l < sizeof layers / sizeof *layers; l++) {
        int in = layers[l].in, out = layers[l].out;
        int bias = l + 1 < (int)(sizeof layers / sizeof *layers);  // every layer but the output layer has one
        struct { const char *pass; int ta, tb, M, N, K; float beta; int rounded, bias; } products[] = {
            {"forward", 0, 1, tokens, out, in, 0.0f, 1, bias},   // y = x W^T + b, stored in bf16
            {"dinput", 0, 0, tokens, in, out, 0.0f, 1, 0},       // dx = dy W, stored in bf16
            {"dweight", 1, 0, out, in, tokens, 1.0f, 0, 0}};     // dW += dy^T x, fp32
        for (int p = 0; p < 3; p++) {
            int M = products[p].M, N = products[p].N, K = products[p].K;
            double s = time_product(products[p].ta, products[p].tb, M, N, K, products[p].beta, products[p].rounded,
                                    products[p].bias, repeats);
            double g = 2.0 * M * N * K / s / 1e9;
            printf("{\"name\": \"%s.%s\", \"M\": %d, \"N\": %d, \"K\": %d, \"ta\": %d, \"tb\": %d, \"s\": %.6f, "
                   "\"gflops_per_s\": %.1f, \"of_peak\": %.3f}\n",
                   layers[l].name, products[p].pass, M, N, K, products[p].ta, products[p].tb, s, g, g / peak);
        }
    }
    return 0;
}
