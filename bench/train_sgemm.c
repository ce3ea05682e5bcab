// train_sgemm.c: the SGEMM reference of bench/train_cpu.sh. Times OpenBLAS cblas_sgemm, with its
// own threads, on exactly the GEMMs one training step of the benchmarked model runs (for every
// linear layer the forward out = x W^T, the input gradient dx = dy W and the weight gradient
// dW += dy^T x), and prints one JSON line with the FLOP/s of that mix: total FLOPs / total time.
// Then the same through neox.c's own GEMM (kernels/cpu/gemm.c: single-threaded OpenBLAS on each
// OpenMP thread's panel), for information.
//   train_sgemm key=value...   keys: layers hidden vocab seq batch threads repeats
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "kernels/cpu/gemm.h"

typedef struct gemm_shape { const char *name; int rows, in, out, count; } gemm_shape;

static int arg_int(const char *arg, const char *key, int *value) {
    size_t n = strlen(key);
    if (strncmp(arg, key, n) != 0 || arg[n] != '=') return 0;
    *value = atoi(arg + n + 1);
    return 1;
}

// Seconds for one forward + backward of a linear layer (N, IC) -> (N, OC), best of `repeats`, through
// cblas_sgemm (OpenBLAS's threads) or neox_cpu_sgemm (neox.c's).
static double time_linear(int neox, float *x, float *w, float *y, float *dx, float *dw, int N, int IC, int OC,
                          int repeats) {
    double best = 1e30;
    for (int r = 0; r < repeats; r++) {
        double t0 = neox_now();
        if (neox) {
            neox_cpu_sgemm(0, 1, N, OC, IC, 1.0f, x, IC, w, IC, 0.0f, y, OC);
            neox_cpu_sgemm(0, 0, N, IC, OC, 1.0f, y, OC, w, IC, 0.0f, dx, IC);
            neox_cpu_sgemm(1, 0, OC, IC, N, 1.0f, y, OC, x, IC, 1.0f, dw, IC);
        } else {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, x, IC, w, IC, 0.0f, y, OC);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, y, OC, w, IC, 0.0f, dx, IC);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, y, OC, x, IC, 1.0f, dw, IC);
        }
        double t = neox_now() - t0;
        best = t < best ? t : best;
    }
    return best;
}

int main(int argc, char **argv) {
    neox_set_progname(argv[0]);
    int layers = 6, hidden = 512, vocab = 50304, seq = 512, batch = 8, threads = 2, repeats = 3;
    for (int i = 1; i < argc; i++)
        if (!arg_int(argv[i], "layers", &layers) && !arg_int(argv[i], "hidden", &hidden) &&
            !arg_int(argv[i], "vocab", &vocab) && !arg_int(argv[i], "seq", &seq) && !arg_int(argv[i], "batch", &batch) &&
            !arg_int(argv[i], "threads", &threads) && !arg_int(argv[i], "repeats", &repeats))
            neox_die(2, "bad argument '%s' (keys: layers hidden vocab seq batch threads repeats)", argv[i]);
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
    int N = batch * seq, C = hidden;
    gemm_shape shapes[] = {
        {"qkv", N, C, 3 * C, layers}, {"attn_out", N, C, C, layers}, {"mlp_up", N, C, 4 * C, layers},
        {"mlp_down", N, 4 * C, C, layers}, {"lm_head", N, C, vocab, 1},
    };
    size_t most = (size_t)N * vocab > (size_t)vocab * C ? (size_t)N * vocab : (size_t)vocab * C;
    float *x = neox_malloc((size_t)N * 4 * C * sizeof(float)), *dx = neox_malloc((size_t)N * 4 * C * sizeof(float));
    float *w = neox_malloc((size_t)vocab * C * sizeof(float)), *dw = neox_calloc((size_t)vocab * C, sizeof(float));
    float *y = neox_malloc(most * sizeof(float));
    for (size_t i = 0; i < (size_t)N * 4 * C; i++) x[i] = (float)(i % 17) * 0.01f;
    for (size_t i = 0; i < (size_t)vocab * C; i++) w[i] = (float)(i % 13) * 0.01f;
    // OpenBLAS's own threading first: neox_cpu_sgemm switches OpenBLAS to one thread on first use.
    printf("{\"impl\": \"openblas-sgemm\", \"threads\": %d", threads);
    for (int neox = 0; neox <= 1; neox++) {
        double flops = 0, seconds = 0;
        printf(", \"%s\": {\"shapes_gflops_per_s\": {", neox ? "neox_gemm" : "openblas");
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const gemm_shape *g = &shapes[s];
            double t = time_linear(neox, x, w, y, dx, dw, g->rows, g->in, g->out, repeats);
            double f = 3.0 * 2.0 * g->rows * g->in * g->out;
            printf("%s\"%s\": %.2f", s ? ", " : "", g->name, f / t / 1e9);
            flops += f * g->count;
            seconds += t * g->count;
        }
        printf("}, \"gflops_per_s\": %.2f, \"step_gemm_flops\": %.4e, \"step_gemm_s\": %.4f}", flops / seconds / 1e9,
               flops, seconds);
    }
    printf("}\n");
    free(x); free(dx); free(w); free(dw); free(y);
    return 0;
}
