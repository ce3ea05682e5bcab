// commtopo_check.c: run under mpiexec; the row-sparse embedding reduction (sparse_grad.c) against
// the dense all-reduce of the same gradients, and the hierarchical all-reduce (hierarchical.c)
// against the flat one, with the bytes each group counted. Prints TAP lines from rank 0.
//   commtopo_check sparse   every rank touches its own random rows; bit-identical at 2 ranks,
//                           otherwise within the error bound of a float sum of p terms in any order:
//                           |a - b| <= p x FLT_EPSILON x sum |terms| (p - 1 roundings of the sum,
//                           one of the scaling)
//   commtopo_check hier N   N = the nodes expected (NEOX_RANKS_PER_NODE sets them; 0: none)
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gradient.h"

static neox_grid grid;

static void report(const char *name, int ok) {
    int all = ok;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (grid.world_rank == 0) printf("%s - %d ranks: %s\n", all ? "ok" : "not ok", grid.world_size, name);
}

static uint64_t rng_next(uint64_t *s) { return *s = *s * 6364136223846793005ULL + 1442695040888963407ULL, *s >> 33; }
static float rng_float(uint64_t *s) { return (float)((double)rng_next(s) / 2147483648.0 - 0.5) * 3.0f; }

// Worst |a - b| in units of FLT_EPSILON x (the sum over ranks of |x|, x this rank's terms, scaled).
static double worst_error(const float *a, const float *b, const float *x, size_t n, double scale) {
    double *mag = neox_malloc(n * sizeof(double)), worst = 0;
    for (size_t i = 0; i < n; i++) mag[i] = fabs((double)x[i]) * scale;
    MPI_Allreduce(MPI_IN_PLACE, mag, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > 0 && d / (FLT_EPSILON * mag[i]) > worst) worst = d / (FLT_EPSILON * mag[i]);
    }
    free(mag);
    return worst;
}

static void sparse_case(double predivide) {
    enum { ROWS = 300, W = 7, TOKENS = 40 };
    int p = grid.data_size, r = grid.data_rank;
    float *sparse = neox_calloc(ROWS * W, sizeof(float)), *dense = neox_calloc(ROWS * W, sizeof(float));
    float *terms = neox_calloc(ROWS * W, sizeof(float));
    int32_t ids[TOKENS];
    uint64_t s = 1234 + (uint64_t)r * 7919;
    for (int t = 0; t < TOKENS; t++) {  // tokens repeat; rows 1000+ are outside the block
        ids[t] = t % 9 == 8 ? 1000 + t : (int32_t)(rng_next(&s) % (ROWS / 2) + (r % 2) * (ROWS / 4));
        if (ids[t] >= ROWS) continue;
        for (int k = 0; k < W; k++) sparse[ids[t] * W + k] += rng_float(&s);
    }
    memcpy(dense, sparse, ROWS * W * sizeof(float));
    memcpy(terms, sparse, ROWS * W * sizeof(float));
    neox_comm_stats before = grid.data.stats;
    neox_sparse_rows *sr = neox_sparse_rows_make(&grid.data, NULL, ROWS, W, 0, predivide, 0);
    neox_sparse_rows_touch(sr, ids, TOKENS);
    neox_sparse_rows_reduce(sr, sparse);
    int32_t mine = 0;
    for (int i = 0; i < ROWS; i++) {
        int hit = 0;
        for (int t = 0; t < TOKENS; t++) hit |= ids[t] == i;
        mine += hit;
    }
    int64_t total = 0, gathered = grid.data.stats.bytes[NEOX_COMM_ALLGATHER] - before.bytes[NEOX_COMM_ALLGATHER];
    MPI_Allreduce(&(int64_t){mine}, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    neox_sparse_rows_free(sr);
    // The dense path as grad_reducer.c runs it: predivide, all-reduce, scale by predivide / p.
    float inv = (float)(1.0 / predivide), after = (float)(predivide / p);
    for (int i = 0; i < ROWS * W && inv != 1.0f; i++) dense[i] *= inv;
    neox_allreduce_sum(&grid.data, dense, ROWS * W, NEOX_F32);
    for (int i = 0; i < ROWS * W && after != 1.0f; i++) dense[i] *= after;
    double worst = worst_error(sparse, dense, terms, ROWS * W, 1.0 / p);
    char name[200];
    snprintf(name, sizeof name, "sparse rows (predivide %g) equal the dense all-reduce %s (worst %.2f eps x sum)", predivide,
             p == 2 ? "bit for bit" : "within p x eps x sum |terms|", worst);
    report(name, p == 2 ? memcmp(sparse, dense, ROWS * W * sizeof(float)) == 0 : worst <= p);
    snprintf(name, sizeof name, "sparse rows: all-gathers count %lld bytes = 4 x ranks + rows x (4 + 4 x width)", (long long)gathered);
    report(name, gathered == 4 * p + total * (4 + 4 * W) && total > 0);
    free(sparse), free(dense), free(terms);
}

// The non-blocking chains as grad_reducer.c runs them: a buffer cut into CHAINS pieces, each
// chain started when the one before completes, moved on only by neox_hier_test (uneven polling
// across ranks), ends with the blocking call's sums bit for bit.
static void hier_nonblocking_case(neox_comm *intra, neox_comm *inter, const float *blocking, const float *terms, size_t n) {
    enum { CHAINS = 5 };
    float *x = neox_malloc(n * sizeof(float));
    memcpy(x, terms, n * sizeof(float));
    neox_hier_request chains[CHAINS];
    size_t cut[CHAINS + 1];
    for (int c = 0; c <= CHAINS; c++) cut[c] = n * (size_t)c / CHAINS;
    int head = 0, polls = 0;
    neox_hier_iallreduce_sum(intra, inter, x, cut[1], NEOX_F32, &chains[0]);
    while (head < CHAINS) {
        polls++;
        if (!neox_hier_test(&chains[head])) continue;
        if (++head < CHAINS)
            neox_hier_iallreduce_sum(intra, inter, x + cut[head], cut[head + 1] - cut[head], NEOX_F32, &chains[head]);
    }
    char name[200];
    snprintf(name, sizeof name, "non-blocking hierarchical all-reduce (%d chains, %d polls here) equals the blocking one bit for bit",
             CHAINS, polls);
    report(name, memcmp(x, blocking, n * sizeof(float)) == 0);
    neox_hier_request one;
    memcpy(x, terms, n * sizeof(float));
    neox_hier_iallreduce_sum(intra, inter, x, n, NEOX_F32, &one);
    neox_hier_wait(&one);
    report("non-blocking hierarchical all-reduce completed by neox_hier_wait equals the blocking one bit for bit",
           memcmp(x, blocking, n * sizeof(float)) == 0);
    free(x);
}

static void hier_case(int want_nodes) {
    enum { N = 100003 };
    neox_comm intra = {0}, inter = {0};
    int nodes = neox_hier_make(&grid.data, &intra, &inter);
    char name[200];
    snprintf(name, sizeof name, "hierarchical all-reduce finds %d node(s) (0: flat)", want_nodes);
    report(name, nodes == want_nodes);
    if (nodes == 0) return;
    float *flat = neox_malloc(N * sizeof(float)), *hier = neox_malloc(N * sizeof(float));
    float *terms = neox_malloc(N * sizeof(float));
    uint64_t s = 99 + (uint64_t)grid.data_rank;
    for (int i = 0; i < N; i++) flat[i] = hier[i] = terms[i] = rng_float(&s);
    neox_allreduce_sum(&grid.data, flat, N, NEOX_F32);
    neox_hier_allreduce_sum(&intra, &inter, hier, N, NEOX_F32);
    double worst = worst_error(hier, flat, terms, N, 1.0);
    int same = memcmp(hier, flat, N * sizeof(float)) == 0;
    snprintf(name, sizeof name, "hierarchical all-reduce equals the flat one within p x eps x sum |terms| (worst %.2f; %s)", worst,
             same ? "bit for bit" : "not bit for bit");
    report(name, worst <= grid.data_size);
    // Bytes: the node's ranks reduce and broadcast the buffer; only leaders all-reduce across nodes.
    int leader = intra.rank == 0;
    int64_t b = 4 * (int64_t)N;
    int ok = intra.stats.bytes[NEOX_COMM_REDUCE] == b && intra.stats.bytes[NEOX_COMM_BROADCAST] == b &&
             inter.stats.bytes[NEOX_COMM_ALLREDUCE] == (leader ? b : 0) && inter.size == (leader ? nodes : 0);
    int64_t sent = inter.stats.sent[NEOX_COMM_ALLREDUCE], want = leader ? (int64_t)(2.0 * (nodes - 1) / nodes * b + 0.5) : 0;
    snprintf(name, sizeof name, "hierarchical all-reduce counts intra reduce + broadcast and leader-only inter bytes "
             "(leader sends %lld across nodes)", (long long)sent);
    report(name, ok && sent == want);
    hier_nonblocking_case(&intra, &inter, hier, terms, N);
    neox_hier_free(&intra, &inter);
    free(flat), free(hier), free(terms);
}

int main(int argc, char **argv) {
    neox_set_progname(argv[0]);
    neox_error err = {0};
    if (neox_parallel_init(&argc, &argv, &err) < 0 || neox_grid_make(&grid, 1, 1, &err) < 0) neox_die_error(&err);
    if (argc > 1 && !strcmp(argv[1], "sparse")) sparse_case(1.0), sparse_case(2.0);
    else if (argc > 2 && !strcmp(argv[1], "hier")) hier_case(atoi(argv[2]));
    else neox_die(NEOX_EXIT_USAGE, "usage: commtopo_check sparse | hier NODES");
    neox_grid_free(&grid);
    neox_parallel_finalize(0);
    return 0;
}
