// compress_flush_check.c: what a compressor owes is handed back when adaptive compression leaves it
// (tests/mpi/adaptive_compression.sh). Every rank draws its own gradients; after a few compressed
// all-reduces with error feedback (1-bit, PowerSGD), the last output y plus the plain average of
// the flushed errors must equal the plain average of the last inputs plus what the earlier steps
// left unsent — checked as: sum of outputs + average of flushed errors = sum of input averages,
// which holds exactly in real arithmetic for error feedback. Also: after a flush the errors are
// zero, and without it the identity fails (the check can fail). The same identity holds when each
// bucket (a range of tensors) switches on its own, step by step, between the plain average, 1-bit
// and PowerSGD at ranks 2 and 1, as adaptive compression's per-bucket plans do: a bucket leaving a
// compressor hands back that bucket's error, and a PowerSGD rank change carries it.
//   mpiexec -n P compress_flush_check
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gradient.h"

enum { NSEG = 3, STEPS = 4 };
static const int rows[NSEG] = {1, 48, 1}, cols[NSEG] = {37, 64, 10};

static void draw(neox_mt19937 *rng, float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = (float)neox_mt19937_next(rng) / 4294967296.0f - 0.5f;
}

static void average(neox_comm *c, float *x, size_t n) {
    neox_allreduce_sum(c, x, n, NEOX_F32);
    for (size_t i = 0; i < n; i++) x[i] /= (float)c->size;
}

// Runs STEPS compressed all-reduces; returns max |sum(outputs) + mean(flushed) - sum(mean(inputs))|
// relative to the largest sum, with (flush 1) or without (flush 0) the flush.
static double owed(neox_comm *c, int powersgd, int flush, size_t n) {
    size_t sizes[NSEG];
    for (int s = 0; s < NSEG; s++) sizes[s] = (size_t)rows[s] * (size_t)cols[s];
    neox_onebit *ob = powersgd ? NULL : neox_onebit_make(c, NULL, sizes, NSEG);
    neox_powersgd *ps = powersgd ? neox_powersgd_make(c, NULL, rows, cols, NSEG, 2) : NULL;
    neox_mt19937 rng;
    neox_mt19937_seed(&rng, 1000u + (unsigned)c->rank);
    float *x = neox_malloc(n * sizeof(float)), *mean = neox_malloc(n * sizeof(float));
    double *sent = neox_calloc(n, sizeof(double)), *wanted = neox_calloc(n, sizeof(double));
    for (int step = 0; step < STEPS; step++) {
        draw(&rng, x, n);
        memcpy(mean, x, n * sizeof(float));
        average(c, mean, n);
        for (size_t i = 0; i < n; i++) wanted[i] += mean[i];
        if (ob) neox_onebit_allreduce(ob, x);
        else neox_powersgd_allreduce(ps, x);
        for (size_t i = 0; i < n; i++) sent[i] += x[i];
    }
    memset(x, 0, n * sizeof(float));
    if (flush && ob) neox_onebit_flush(ob, x);
    if (flush && ps) neox_powersgd_flush(ps, x);
    average(c, x, n);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs(sent[i] + x[i] - wanted[i]));
        scale = fmax(scale, fabs(wanted[i]));
    }
    if (flush) {  // the errors are cleared
        size_t count;
        const float *e = ob ? neox_onebit_error(ob, 0, &count) : neox_powersgd_state(ps, 0, &count);
        for (size_t i = 0; i < count; i++)
            if (e[i] != 0.0f) worst = INFINITY;
    }
    free(x), free(mean), free(sent), free(wanted);
    neox_onebit_free(ob);
    neox_powersgd_free(ps);
    return worst / scale;
}

// ---- per-bucket switching ---------------------------------------------------------------------
enum { MSEG = 5, MBUCKETS = 3, MSTEPS = 10 };
static const int mrows[MSEG] = {1, 48, 32, 1, 40}, mcols[MSEG] = {37, 64, 24, 10, 16};
static const int bucket_first[MBUCKETS + 1] = {0, 2, 3, 5};  // bucket b: segments [first[b], first[b + 1])
enum { PLAIN, ONEBIT, PSGD2, PSGD1 };

// Bucket b's scheme at step k: every bucket visits every scheme, in its own order.
static int scheme_at(int b, int k) {
    static const int cycle[6] = {ONEBIT, PSGD2, PLAIN, PSGD1, PSGD2, ONEBIT};
    return k < 1 ? PLAIN : cycle[(k + 2 * b) % 6];
}

// Like owed(), with the buckets switching per step; without flush, a compressor that is left
// drops what it owed (as if it were reset).
static double owed_per_bucket(neox_comm *c, int flush) {
    size_t sizes[MSEG], off[MSEG + 1] = {0};
    for (int s = 0; s < MSEG; s++) sizes[s] = (size_t)mrows[s] * (size_t)mcols[s], off[s + 1] = off[s] + sizes[s];
    size_t n = off[MSEG];
    neox_onebit *ob = neox_onebit_make(c, NULL, sizes, MSEG);
    neox_powersgd *ps = neox_powersgd_make_ranks(c, NULL, mrows, mcols, MSEG, 1, 2);
    neox_mt19937 rng;
    neox_mt19937_seed(&rng, 2000u + (unsigned)c->rank);
    float *x = neox_malloc(n * sizeof(float)), *mean = neox_malloc(n * sizeof(float)), *lost = neox_calloc(n, sizeof(float));
    double *sent = neox_calloc(n, sizeof(double)), *wanted = neox_calloc(n, sizeof(double));
    int use[MBUCKETS] = {PLAIN, PLAIN, PLAIN}, rank[MBUCKETS] = {2, 2, 2};
    for (int k = 0; k < MSTEPS; k++) {
        draw(&rng, x, n);
        memcpy(mean, x, n * sizeof(float));
        average(c, mean, n);
        for (size_t i = 0; i < n; i++) wanted[i] += mean[i];
        for (int b = 0; b < MBUCKETS; b++) {
            int first = bucket_first[b], count = bucket_first[b + 1] - first, next = scheme_at(b, k);
            float *into = flush ? x : lost;
            if (use[b] == ONEBIT && next != ONEBIT) neox_onebit_flush_range(ob, into, first, count);
            if ((use[b] == PSGD2 || use[b] == PSGD1) && next != PSGD2 && next != PSGD1)
                neox_powersgd_flush_range(ps, into, first, count);
            int r = next == PSGD1 ? 1 : 2;
            if ((next == PSGD2 || next == PSGD1) && r != rank[b]) neox_powersgd_set_rank(ps, first, count, r, into), rank[b] = r;
            use[b] = next;
            if (next == PLAIN) average(c, x + off[first], off[first + count] - off[first]);
            if (next == ONEBIT) neox_onebit_allreduce_range(ob, x, first, count);
            if (next == PSGD2 || next == PSGD1) neox_powersgd_allreduce_range(ps, x, first, count);
        }
        for (size_t i = 0; i < n; i++) sent[i] += x[i];
    }
    memset(x, 0, n * sizeof(float));
    neox_onebit_flush(ob, x);
    neox_powersgd_flush(ps, x);
    average(c, x, n);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs(sent[i] + x[i] - wanted[i]));
        scale = fmax(scale, fabs(wanted[i]));
    }
    free(x), free(mean), free(lost), free(sent), free(wanted);
    neox_onebit_free(ob);
    neox_powersgd_free(ps);
    return worst / scale;
}

int main(int argc, char **argv) {
    neox_set_progname(argv[0]);
    neox_error err = {0};
    if (neox_parallel_init(&argc, &argv, &err) < 0) neox_die_error(&err);
    neox_grid grid;
    if (neox_grid_make(&grid, 1, 1, &err) != 0) neox_die_error(&err);
    size_t n = 0;
    for (int s = 0; s < NSEG; s++) n += (size_t)rows[s] * (size_t)cols[s];
    int failed = 0;
    for (int powersgd = 0; powersgd < 2; powersgd++) {
        double with = owed(&grid.data, powersgd, 1, n), without = owed(&grid.data, powersgd, 0, n);
        int ok = with < 1e-5 && without > 1e-3;
        if (grid.data.rank == 0)
            printf("%s on %d ranks: relative error owed %.2e with the flush, %.2e without: %s\n",
                   powersgd ? "powersgd" : "onebit", grid.data.size, with, without, ok ? "ok" : "FAILED");
        failed |= !ok;
    }
    double with = owed_per_bucket(&grid.data, 1), without = owed_per_bucket(&grid.data, 0);
    int ok = with < 1e-5 && without > 1e-3;
    if (grid.data.rank == 0)
        printf("per-bucket switches on %d ranks: relative error owed %.2e with the flush, %.2e without: %s\n",
               grid.data.size, with, without, ok ? "ok" : "FAILED");
    failed |= !ok;
    neox_grid_free(&grid);
    neox_parallel_finalize(failed);
    return failed;
}
