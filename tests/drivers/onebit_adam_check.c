// onebit_adam_check.c: steps lib/optim's 1-bit Adam (optimizer.type onebitadam) on every rank from
// gradients a torch/numpy oracle wrote, the way the trainer drives it (the gradient averaged over the
// ranks until freeze_step, each rank's own gradient after), and writes the parameters and moments of
// every step for the oracle to compare (tests/mpi/onebit_adam.sh).
//   mpiexec -n P onebit_adam_check DIR
// DIR/segments.txt: the parameter sizes; DIR/settings.txt: lr beta1 beta2 eps weight_decay
// freeze_step; DIR/params.f32: the initial parameters; DIR/grads.f32: steps x P x total float32.
// Rank r writes DIR/trace_<r>.f32: steps x (parameters, exp_avg, exp_avg_sq) after each step.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gradient.h"
#include "kernels/backend.h"
#include "optim.h"

static void *read_all(const char *dir, const char *name, size_t *size) {
    neox_error err = {0};
    char *path = neox_asprintf("%s/%s", dir, name);
    void *data = neox_read_file(path, size, &err);
    if (!data) neox_die_error(&err);
    free(path);
    return data;
}

static int read_segments(const char *dir, neox_segment *segs, size_t *sizes, int max, float weight_decay) {
    size_t n;
    char *text = read_all(dir, "segments.txt", &n);
    int nseg = 0;
    size_t off = 0;
    for (char *p = text, *end; nseg < max && (sizes[nseg] = strtoull(p, &end, 10), end != p); p = end, nseg++) {
        segs[nseg] = (neox_segment){off, off + sizes[nseg], weight_decay};
        off += sizes[nseg];
    }
    free(text);
    return nseg;
}

int main(int argc, char **argv) {
    neox_set_progname(argv[0]);
    neox_error err = {0};
    if (neox_parallel_init(&argc, &argv, &err) < 0) neox_die_error(&err);
    if (argc != 2) neox_die(NEOX_EXIT_USAGE, "usage: onebit_adam_check DIR");
    neox_grid grid;
    if (neox_grid_make(&grid, 1, 1, &err) != 0) neox_die_error(&err);
    const char *dir = argv[1];
    size_t n;
    char *text = read_all(dir, "settings.txt", &n);
    double lr, wd;
    neox_optimizer_settings s = {.kind = NEOX_OPTIMIZER_ONEBITADAM};
    long long freeze;
    if (sscanf(text, "%lf %lf %lf %lf %lf %lld", &lr, &s.beta1, &s.beta2, &s.eps, &wd, &freeze) != 6)
        neox_die(NEOX_EXIT_USAGE, "%s/settings.txt: want lr beta1 beta2 eps weight_decay freeze_step", dir);
    free(text);
    s.weight_decay = wd, s.freeze_step = freeze;

    neox_segment segs[64];
    size_t sizes[64];
    int nseg = read_segments(dir, segs, sizes, 64, (float)wd);
    size_t total = nseg ? segs[nseg - 1].end : 0;
    float *param = read_all(dir, "params.f32", &n);
    if (n != total * sizeof(float)) neox_die(NEOX_EXIT_USAGE, "%s/params.f32: want %zu floats", dir, total);
    float *grads = read_all(dir, "grads.f32", &n);
    int p = grid.data.size, r = grid.data.rank;
    size_t steps = n / sizeof(float) / total / (size_t)p;

    neox_optimizer *o = neox_optimizer_make(&s, neox_backend_cpu(), total);
    o->momentum_allreduce = p > 1 ? neox_onebit_make(&grid.data, NULL, sizes, nseg) : NULL;
    float *grad = neox_malloc(total * sizeof(float));
    float *trace = neox_malloc(steps * 3 * total * sizeof(float));
    for (size_t t = 0; t < steps; t++) {
        memcpy(grad, grads + (t * (size_t)p + (size_t)r) * total, total * sizeof(float));
        // The trainer's warm-up reduces the gradients (sum, then 1/P); from freeze_step on it does not.
        if ((int64_t)t < s.freeze_step) {
            neox_allreduce_sum(&grid.data, grad, total, NEOX_F32);
            for (size_t i = 0; i < total; i++) grad[i] *= 1.0f / (float)p;
        }
        neox_optimizer_step(o, param, grad, segs, nseg, lr, (int64_t)t + 1);
        float *row = trace + t * 3 * total;
        memcpy(row, param, total * sizeof(float));
        memcpy(row + total, o->state[0], total * sizeof(float));
        memcpy(row + 2 * total, o->state[1], total * sizeof(float));
    }
    char *path = neox_asprintf("%s/trace_%d.f32", dir, r);
    FILE *f = fopen(path, "wb");
    size_t bytes = steps * 3 * total * sizeof(float);
    if (!f || fwrite(trace, 1, bytes, f) != bytes || fclose(f) != 0) neox_die(NEOX_EXIT_FAILURE, "cannot write %s", path);
    free(path);
    neox_onebit_free(o->momentum_allreduce);
    neox_optimizer_free(o);
    free(trace);
    free(grad);
    free(grads);
    free(param);
    neox_grid_free(&grid);
    neox_parallel_finalize(0);
    return 0;
}
