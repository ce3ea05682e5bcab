// grad_reducer_check.c: run under mpiexec; bucketed data-parallel gradient reduction gives the
// mean gradient (ZeRO 0) or each rank's partition of it (ZeRO 1/2) for several bucket sizes, with
// and without overlap and predivision, with all-reduce instead of reduce-scatter under ZeRO
// (reduce_scatter false) and with bf16/fp16 on the wire (within their rounding); and with a wire
// of its own per bucket and buckets left to the caller (adaptive compression's plans); and under
// ZeRO-2 on the host, buckets cut across tensors with a tensor reported ready in pieces. Prints TAP
// lines from rank 0.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "gradient.h"

static neox_grid grid;

// The reducer these options ask for (none asks for what the environment may refuse).
static neox_grad_reducer *make_reducer(neox_comm *data, float *grads, size_t n, const size_t *offsets,
                                       const size_t *sizes, int nparams, const neox_grad_reducer_options *opt) {
    neox_error err = {0};
    neox_grad_reducer *r = neox_grad_reducer_make(data, grads, n, offsets, sizes, nparams, opt, &err);
    if (!r) neox_die_error(&err);
    return r;
}

static void report(const char *name, int ok) {
    int all = ok;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (grid.world_rank == 0) printf("%s - dp%d: %s\n", all ? "ok" : "not ok", grid.data_size, name);
}

// Rank r's gradient element i; the mean over ranks has a closed form.
static float grad_value(int r, size_t i) { return (float)((r + 1) * (int)(i % 97)) * 0.25f; }
static float mean_value(int ranks, size_t i) { return (float)(ranks + 1) / 2.0f * (float)(i % 97) * 0.25f; }

static void run_case(int stage, size_t bucket_bytes, int overlap, double predivide, int all_reduce, neox_dtype wire) {
    // 16-bit wire: each value and each sum is rounded to 8 (bf16) or 11 (fp16) significant bits.
    float tol = wire == NEOX_BF16 ? 1e-2f : wire == NEOX_F16 ? 2e-3f : 1e-5f;
    enum { NPARAMS = 7 };
    size_t sizes[NPARAMS] = {5, 300, 1, 64, 1000, 17, 250}, offsets[NPARAMS], n = 0;
    for (int p = 0; p < NPARAMS; p++) offsets[p] = n, n += sizes[p];
    float *g = neox_malloc(n * sizeof(float));
    neox_grad_reducer_options opt = {.bucket_bytes = bucket_bytes, .zero_stage = stage, .overlap = overlap, .predivide_factor = predivide,
                                     .all_reduce = all_reduce, .wire = wire};
    neox_grad_reducer *red = make_reducer(&grid.data, g, n, offsets, sizes, NPARAMS, &opt);
    int ok = 1;
    for (int step = 0; step < 2; step++) {  // the reducer resets itself between steps
        for (size_t i = 0; i < n; i++) g[i] = grad_value(grid.data_rank, i) * (float)(step + 1);
        for (int p = NPARAMS - 1; p >= 0; p--) neox_grad_reducer_ready(red, p);
        neox_grad_reducer_finish(red);
        size_t lo = 0, hi = n;
        if (stage > 0) neox_grad_reducer_partition(red, grid.data_rank, &lo, &hi);
        for (size_t i = lo; i < hi; i++)
            ok &= fabsf(g[i] - mean_value(grid.data_size, i) * (float)(step + 1)) <= tol * (1.0f + fabsf(g[i]));
    }
    char name[160];
    snprintf(name, sizeof name, "zero stage %d, bucket %zu bytes (%d buckets), overlap %d, predivide %g%s, wire %s",
             stage, bucket_bytes, neox_grad_reducer_bucket_count(red), overlap, predivide,
             all_reduce && stage > 0 ? ", all-reduce" : "", neox_dtype_name(wire));
    report(name, ok);
    neox_grad_reducer_free(red);
    free(g);
}

// Seven buckets (one parameter each): every third left to the caller (its own values stay), every
// third after it summed in bf16, the rest in fp32; the next step, all fp32 again.
static void run_per_bucket(int overlap) {
    enum { NPARAMS = 7 };
    size_t sizes[NPARAMS] = {5, 300, 1, 64, 1000, 17, 250}, offsets[NPARAMS], n = 0;
    for (int p = 0; p < NPARAMS; p++) offsets[p] = n, n += sizes[p];
    float *g = neox_malloc(n * sizeof(float));
    neox_grad_reducer_options opt = {.bucket_bytes = 4, .overlap = overlap, .predivide_factor = 1.0, .wire = NEOX_F32};
    neox_grad_reducer *red = make_reducer(&grid.data, g, n, offsets, sizes, NPARAMS, &opt);
    int ok = neox_grad_reducer_bucket_count(red) == NPARAMS;
    for (int step = 0; ok && step < 2; step++) {
        for (int b = 0; b < NPARAMS; b++)
            neox_grad_reducer_set_bucket(red, b, step == 0 && b % 3 == 0, step == 0 && b % 3 == 1 ? NEOX_BF16 : NEOX_F32);
        for (size_t i = 0; i < n; i++) g[i] = grad_value(grid.data_rank, i);
        for (int p = NPARAMS - 1; p >= 0; p--) neox_grad_reducer_ready(red, p);
        neox_grad_reducer_finish(red);
        size_t covered = 0;
        for (int b = 0; b < NPARAMS; b++) {
            size_t lo, hi;
            double slack;
            neox_grad_reducer_bucket_range(red, b, &lo, &hi, &slack);
            covered += hi - lo;
            ok &= slack >= 0;
            int mode = step == 0 ? b % 3 : 2;
            float tol = mode == 1 ? 1e-2f : 1e-5f;
            for (size_t i = lo; i < hi; i++)
                ok &= mode == 0 ? g[i] == grad_value(grid.data_rank, i)
                                : fabsf(g[i] - mean_value(grid.data_size, i)) <= tol * (1.0f + fabsf(g[i]));
        }
        ok &= covered == n;
    }
    char name[160];
    snprintf(name, sizeof name, "per bucket: skipped, bf16 and fp32 buckets in one reduction, then all fp32 (overlap %d)",
             overlap);
    report(name, ok);
    neox_grad_reducer_free(red);
    free(g);
}

// ZeRO-2 on the host (partition_sum): buckets cut at exactly 300 elements across the tensors, the
// 1000-element tensor reported ready in pieces of 250 (ready_range) and the rest whole; the
// partition's sum is the mean, the buffer is left zero, no bucket exceeds 300 elements, and the
// resident bytes are two buckets plus fill_elems.
static void run_split(int overlap, int all_reduce) {
    enum { NPARAMS = 7, LIMIT = 300 };
    size_t sizes[NPARAMS] = {5, 300, 1, 64, 1000, 17, 250}, offsets[NPARAMS], n = 0;
    for (int p = 0; p < NPARAMS; p++) offsets[p] = n, n += sizes[p];
    float *g = neox_calloc(n, sizeof(float));
    size_t lo, hi;
    neox_even_share(n, grid.data_rank, grid.data_size, &lo, &hi);
    float *sum = neox_calloc(hi - lo + 1, sizeof(float));
    neox_grad_reducer_options opt = {.bucket_bytes = LIMIT * sizeof(float), .zero_stage = 2, .overlap = overlap,
                                     .predivide_factor = 1.0, .all_reduce = all_reduce, .partition_sum = sum,
                                     .fill_elems = 250};
    neox_grad_reducer *red = make_reducer(&grid.data, g, n, offsets, sizes, NPARAMS, &opt);
    int ok = neox_grad_reducer_bucket_count(red) == (int)((n + LIMIT - 1) / LIMIT);
    for (int b = 0; b < neox_grad_reducer_bucket_count(red); b++) {
        size_t blo, bhi;
        neox_grad_reducer_bucket_range(red, b, &blo, &bhi, NULL);
        ok &= bhi - blo <= LIMIT && bhi > blo;
    }
    ok &= neox_grad_reducer_resident_bytes(red) == (2 * LIMIT + 250) * sizeof(float);
    for (int step = 0; step < 2; step++) {
        for (size_t i = 0; i < n; i++) g[i] = grad_value(grid.data_rank, i);
        for (int p = NPARAMS - 1; p >= 0; p--) {
            if (sizes[p] != 1000) {
                neox_grad_reducer_ready(red, p);
                continue;
            }
            for (size_t at = offsets[p] + sizes[p]; at > offsets[p]; at -= 250) neox_grad_reducer_ready_range(red, at - 250, at);
        }
        neox_grad_reducer_finish(red);
        for (size_t i = 0; i < n; i++) ok &= g[i] == 0.0f;
        for (size_t i = lo; i < hi; i++)
            ok &= fabsf(sum[i - lo] - (float)(step + 1) * mean_value(grid.data_size, i)) <= 1e-5f * (1.0f + fabsf(sum[i - lo]));
    }
    char name[160];
    snprintf(name, sizeof name, "zero stage 2 on the host: buckets of at most %d elements across tensors, a tensor ready in "
             "pieces (overlap %d%s)", LIMIT, overlap, all_reduce ? ", all-reduce" : "");
    report(name, ok);
    neox_grad_reducer_free(red);
    free(sum);
    free(g);
}

int main(int argc, char **argv) {
    neox_set_progname(argv[0]);
    neox_error err = {0};
    if (neox_parallel_init(&argc, &argv, &err) < 0 || neox_grid_make(&grid, 1, 1, &err) < 0) neox_die_error(&err);
    for (int stage = 0; stage <= 2; stage += 1)
        for (int overlap = 0; overlap <= 1; overlap++) {
            run_case(stage, 0, overlap, 1.0, 0, NEOX_F32);
            run_case(stage, 1200, overlap, 1.0, 0, NEOX_F32);
            run_case(stage, 4, overlap, 2.0, 0, NEOX_F32);
            run_case(stage, 1200, overlap, 1.0, 0, NEOX_BF16);
            run_case(stage, 4, overlap, 2.0, 0, NEOX_F16);
            if (stage > 0) {
                run_case(stage, 1200, overlap, 1.0, 1, NEOX_F32);
                run_case(stage, 4, overlap, 2.0, 1, NEOX_BF16);
            }
        }
    for (int overlap = 0; overlap <= 1; overlap++) run_per_bucket(overlap);
    for (int overlap = 0; overlap <= 1; overlap++)
        for (int all_reduce = 0; all_reduce <= 1; all_reduce++) run_split(overlap, all_reduce);
    // Partitions tile the buffer in rank order.
    size_t sizes[1] = {10}, offsets[1] = {0};
    float g[10];
    neox_grad_reducer_options opt = {.bucket_bytes = 0, .zero_stage = 1, .overlap = 1, .predivide_factor = 1.0};
    neox_grad_reducer *red = make_reducer(&grid.data, g, 10, offsets, sizes, 1, &opt);
    size_t expect = 0, lo, hi;
    int ok = 1;
    for (int q = 0; q < grid.data_size; q++) {
        neox_grad_reducer_partition(red, q, &lo, &hi);
        ok &= lo == expect && hi >= lo;
        expect = hi;
    }
    report("partitions tile the flat buffer", ok && expect == 10);
    neox_grad_reducer_free(red);
    neox_grid_free(&grid);
    neox_parallel_finalize(0);
    return 0;
}
