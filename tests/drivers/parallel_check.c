// parallel_check.c: run under mpiexec; checks the process grid and every collective of
// lib/parallel for one (pipe, model) layout and prints TAP lines from rank 0.
//   mpiexec -n 4 parallel_check PIPE MODEL
// Expected values are closed forms of the ranks' inputs, computed here independently.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel.h"

static neox_grid grid;

// Every rank contributes pass/fail; rank 0 prints one TAP line with the verdict of all.
static void report(const char *name, int ok) {
    int all = ok;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (grid.world_rank == 0) printf("%s - pp%d tp%d dp%d: %s\n", all ? "ok" : "not ok", grid.pipe_size,
                                     grid.model_size, grid.data_size, name);
}

static void check_grid(void) {
    int ok = grid.world_rank == neox_grid_rank_of(grid.data_size, grid.model_size, grid.pipe_rank, grid.data_rank,
                                                  grid.model_rank);
    ok &= grid.model_rank == grid.world_rank % grid.model_size;  // model innermost
    ok &= grid.pipe_rank == grid.world_rank / (grid.model_size * grid.data_size);  // pipe outermost
    ok &= grid.model.size == grid.model_size && grid.data.size == grid.data_size && grid.pipe.size == grid.pipe_size;
    ok &= grid.model.rank == grid.model_rank && grid.data.rank == grid.data_rank && grid.pipe.rank == grid.pipe_rank;
    report("grid coordinates and group sizes", ok);

    // Members of my data group are exactly the ranks with my pipe and model coordinates.
    int *members = neox_malloc(grid.data.size * sizeof(int));
    neox_allgather(&grid.data, &grid.world_rank, members, 1, NEOX_I32);
    int good = 1;
    for (int d = 0; d < grid.data.size; d++)
        good &= members[d] == neox_grid_rank_of(grid.data_size, grid.model_size, grid.pipe_rank, d, grid.model_rank);
    report("data group members", good);
    free(members);
    members = neox_malloc(grid.model.size * sizeof(int));
    neox_allgather(&grid.model, &grid.world_rank, members, 1, NEOX_I32);
    good = 1;
    for (int m = 0; m < grid.model.size; m++)
        good &= members[m] == neox_grid_rank_of(grid.data_size, grid.model_size, grid.pipe_rank, grid.data_rank, m);
    report("model group members", good);
    free(members);
}

static void check_collectives(void) {
    neox_comm *c = &grid.world;
    int n = c->size, r = c->rank;
    enum { K = 1000 };
    float x[K];
    for (int i = 0; i < K; i++) x[i] = (float)(r + 1) * (float)i;
    neox_allreduce_sum(c, x, K, NEOX_F32);
    int ok = 1;
    for (int i = 0; i < K; i++) ok &= x[i] == (float)(n * (n + 1) / 2) * (float)i;
    report("all-reduce sum (f32)", ok);

    // bf16: values exactly representable, so the sum is exact.
    uint16_t h[8];
    for (int i = 0; i < 8; i++) {
        float v = (float)(r + 1) * 0.5f;
        uint32_t bits;
        memcpy(&bits, &v, 4);
        h[i] = (uint16_t)(bits >> 16);
    }
    neox_allreduce_sum(c, h, 8, NEOX_BF16);
    uint32_t bits = (uint32_t)h[3] << 16;
    float got;
    memcpy(&got, &bits, 4);
    report("all-reduce sum (bf16, accumulated in fp32)", got == 0.5f * (float)(n * (n + 1) / 2));

    // Reduce-scatter: block b of rank r holds r*100 + b; rank r receives sum over ranks of (q*100 + r).
    float *send = neox_malloc(n * 3 * sizeof(float)), recv[3];
    for (int b = 0; b < n; b++)
        for (int j = 0; j < 3; j++) send[b * 3 + j] = (float)(r * 100 + b + j);
    neox_reduce_scatter_sum(c, send, recv, 3, NEOX_F32);
    ok = 1;
    for (int j = 0; j < 3; j++) ok &= recv[j] == (float)(100 * n * (n - 1) / 2 + n * (r + j));
    report("reduce-scatter sum", ok);

    // All-gather returns every rank's block in rank order.
    float mine[2] = {(float)r, (float)(-r)}, *all = neox_malloc(2 * n * sizeof(float));
    neox_allgather(c, mine, all, 2, NEOX_F32);
    ok = 1;
    for (int q = 0; q < n; q++) ok &= all[2 * q] == (float)q && all[2 * q + 1] == (float)-q;
    report("all-gather in rank order", ok);

    double v = r == n - 1 ? 3.25 : 0.0;
    neox_broadcast(c, &v, 1, NEOX_F64, n - 1);
    report("broadcast from the last rank", v == 3.25);

    // Ring exchange with non-blocking send/recv, then blocking.
    int64_t out = 1000 + r, in = -1;
    neox_request sreq, rreq;
    neox_irecv(c, &in, 1, NEOX_I64, (r + n - 1) % n, 7, &rreq);
    neox_isend(c, &out, 1, NEOX_I64, (r + 1) % n, 7, &sreq);
    neox_wait(&rreq);
    neox_wait(&sreq);
    report("non-blocking ring send/recv", in == 1000 + (r + n - 1) % n);

    float y[K];
    for (int i = 0; i < K; i++) y[i] = 1.0f;
    neox_request req;
    neox_iallreduce_sum(c, y, K, NEOX_F32, &req);
    neox_wait(&req);
    neox_wait(&req);  // waiting twice is harmless
    ok = 1;
    for (int i = 0; i < K; i++) ok &= y[i] == (float)n;
    report("non-blocking all-reduce", ok);

    // Accounting: bytes are the payloads defined in parallel.h.
    const neox_comm_stats *s = &c->stats;
    ok = s->calls[NEOX_COMM_ALLREDUCE] == 3 && s->bytes[NEOX_COMM_ALLREDUCE] == (int64_t)(K * 4 + 8 * 2 + K * 4);
    ok &= s->calls[NEOX_COMM_REDUCE_SCATTER] == 1 && s->bytes[NEOX_COMM_REDUCE_SCATTER] == (int64_t)(n * 3 * 4);
    ok &= s->bytes[NEOX_COMM_ALLGATHER] == (int64_t)(2 * n * 4) && s->bytes[NEOX_COMM_BROADCAST] == 8;
    ok &= s->bytes[NEOX_COMM_SEND] == 8 && s->bytes[NEOX_COMM_RECV] == 8;
    report("communication accounting", ok);
    free(send);
    free(all);
}

// The device half of the layer in a CPU build: enabling it is refused with a message that says how
// to get it, no buffer counts as device memory, and neox_group_begin/end leave MPI operations as
// they are (a ring of isend/irecv inside a group).
static void check_device_api(void) {
#ifndef NEOX_CUDA
    neox_error err = {0};
    int refused = neox_grid_enable_device(&grid, &err) == -1 && strstr(err.message, "make CUDA=1") != NULL;
    report("CPU build: neox_grid_enable_device refused, naming make CUDA=1", refused && !grid.world.device);
    neox_comm *c = &grid.world;
    int next = (c->rank + 1) % c->size, prev = (c->rank + c->size - 1) % c->size, out = c->rank, in = -1;
    neox_request rq[2];
    neox_group_begin();
    neox_isend(c, &out, 1, NEOX_I32, next, 3, &rq[0]);
    neox_irecv(c, &in, 1, NEOX_I32, prev, 3, &rq[1]);
    neox_group_end();
    neox_wait(&rq[0]);
    neox_wait(&rq[1]);
    report("CPU build: MPI isend/irecv inside neox_group_begin/end", in == prev && !neox_comm_on_device(c, &in));
#endif
}

int main(int argc, char **argv) {
    neox_set_progname(argv[0]);
    neox_error err = {0};
    if (neox_parallel_init(&argc, &argv, &err) < 0) neox_die_error(&err);
    if (argc == 4 && !strcmp(argv[1], "die")) {
        // Failure drill: one rank dies; every rank must be ended by the launcher, none hangs.
        int rank;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        if (rank == atoi(argv[2])) neox_die(NEOX_EXIT_FAILURE, "deliberate failure on rank %d", rank);
        MPI_Barrier(MPI_COMM_WORLD);
        neox_parallel_finalize(0);
        return 0;
    }
    if (argc != 3) neox_die(NEOX_EXIT_USAGE, "usage: parallel_check PIPE MODEL | die RANK x");
    if (neox_grid_make(&grid, atoi(argv[1]), atoi(argv[2]), &err) < 0) neox_die_error(&err);
    check_grid();
    check_collectives();
    check_device_api();
    neox_grid_free(&grid);
    neox_parallel_finalize(0);
    return 0;
}
