// nccl_parity.c: the NCCL half of the communication layer against its MPI half. Each check runs a
// collective of lib/parallel.h twice on the same inputs: on device buffers (the group has an NCCL
// communicator, so the call goes through NCCL) and on host copies (host pointers go through MPI),
// then copies the device result back and compares every element exactly. Inputs are small
// multiples of 0.5, so every sum is exact in every type and in every order: NCCL's ring and MPI's
// tree must agree bit for bit. Also checked: stream ordering without host waits (a kernel queued
// before a collective and one after it), non-blocking calls with neox_wait and neox_test, grouped
// send/receive, an isend followed by a receive without a group (the held send), the statistics, and the gradient reducer (ZeRO 0 and 1, fp32 and
// bf16 wire) on device against the same reducer on the host.
//   mpiexec -n P nccl_parity     one GPU per rank (NCCL refuses two ranks of a communicator on one
//                                GPU); with one GPU, P = 1 (every group then has one rank)
// Output: TAP lines from rank 0; exit 1 if any check failed. Without a GPU, or with fewer GPUs than
// ranks on a node: one "# SKIP" line.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cuda/cuda.h"
#include "gradient.h"

static const neox_backend *gpu;
static neox_grid grid;
static int failures;

// The reducer these options ask for (none asks for what the environment may refuse).
static neox_grad_reducer *make_reducer(neox_comm *data, float *grads, size_t n, const size_t *offsets,
                                       const size_t *sizes, int nparams, const neox_grad_reducer_options *opt) {
    neox_error err = {0};
    neox_grad_reducer *r = neox_grad_reducer_make(data, grads, n, offsets, sizes, nparams, opt, &err);
    if (!r) neox_die_error(&err);
    return r;
}

enum { N = 4099 };  // elements per rank in most checks: not a multiple of anything NCCL likes

// Element i of rank r's input, as a double: a multiple of 0.5 in [-4, 4].
static double input(int r, size_t i, int salt) { return 0.5 * (double)((i * 7 + (size_t)r * 3 + (size_t)salt * 5) % 17) - 4.0; }

static float bf16f(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static double get(const void *p, size_t i, neox_dtype dt) {
    switch (dt) {
    case NEOX_F32: return ((const float *)p)[i];
    case NEOX_F64: return ((const double *)p)[i];
    case NEOX_BF16: return bf16f(((const uint16_t *)p)[i]);
    case NEOX_F16: return (double)((const _Float16 *)p)[i];
    case NEOX_I32: return ((const int32_t *)p)[i];
    case NEOX_I64: return (double)((const int64_t *)p)[i];
    default: return ((const uint8_t *)p)[i];
    }
}

static void set(void *p, size_t i, neox_dtype dt, double v) {  // v exact in every type (see input)
    switch (dt) {
    case NEOX_F32: ((float *)p)[i] = (float)v; break;
    case NEOX_F64: ((double *)p)[i] = v; break;
    case NEOX_BF16: { float f = (float)v; uint32_t bits; memcpy(&bits, &f, 4); ((uint16_t *)p)[i] = (uint16_t)(bits >> 16); break; }
    case NEOX_F16: ((_Float16 *)p)[i] = (_Float16)v; break;
    case NEOX_I32: ((int32_t *)p)[i] = (int32_t)(2 * v); break;  // integers: twice the value
    case NEOX_I64: ((int64_t *)p)[i] = (int64_t)(2 * v); break;
    default: ((uint8_t *)p)[i] = (uint8_t)(2 * v + 8); break;
    }
}

// A buffer on both sides with the same contents: h for MPI, d for NCCL.
typedef struct { void *h, *d; size_t n; neox_dtype dt; } pair;

static pair pair_make(size_t n, neox_dtype dt, int salt) {
    size_t bytes = (n ? n : 1) * neox_dtype_size(dt);
    pair p = {neox_malloc(bytes), gpu->alloc(bytes), n, dt};
    for (size_t i = 0; i < n; i++) set(p.h, i, dt, input(grid.world_rank, i, salt));
    gpu->to_device(p.d, p.h, n * neox_dtype_size(dt));
    return p;
}
static void pair_free(pair *p) {
    free(p->h);
    gpu->free(p->d);
}

// Every rank compares elements [from, from + n) of its pair; rank 0 prints one line for all ranks.
static void verdict(const char *name, const pair *p, size_t from, size_t n) {
    void *back = neox_malloc((p->n ? p->n : 1) * neox_dtype_size(p->dt));
    gpu->to_host(back, p->d, p->n * neox_dtype_size(p->dt));  // waits for the compute stream
    double worst = 0.0;
    for (size_t i = from; i < from + n; i++) {
        double a = get(p->h, i, p->dt), b = get(back, i, p->dt);
        double d = isnan(a) || isnan(b) ? INFINITY : fabs(a - b);
        if (d > worst) worst = d;
    }
    free(back);
    MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (worst > 0) failures++;
    if (grid.world_rank == 0) printf("%sok - nccl %s (largest difference %g)\n", worst > 0 ? "not " : "", name, worst);
}

static void check(const char *name, int ok) {
    int all = ok;
    MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all) failures++;
    if (grid.world_rank == 0) printf("%sok - nccl %s\n", all ? "" : "not ", name);
}

// ---- collectives ------------------------------------------------------------------------------

static void allreduces(neox_comm *c) {
    const neox_dtype types[] = {NEOX_F32, NEOX_F64, NEOX_BF16, NEOX_F16, NEOX_I32, NEOX_I64};
    char name[96];
    for (int t = 0; t < 6; t++) {
        pair p = pair_make(N, types[t], t);
        neox_allreduce_sum(c, p.d, N, types[t]);
        neox_allreduce_sum(c, p.h, N, types[t]);
        snprintf(name, sizeof name, "all-reduce sum %s on %s", neox_dtype_name(types[t]), c->name);
        verdict(name, &p, 0, N);
        pair_free(&p);
        if (types[t] == NEOX_BF16 || types[t] == NEOX_F16) continue;  // max: f32, f64, i32, i64
        p = pair_make(N, types[t], t + 1);
        neox_allreduce_max(c, p.d, N, types[t]);
        neox_allreduce_max(c, p.h, N, types[t]);
        snprintf(name, sizeof name, "all-reduce max %s on %s", neox_dtype_name(types[t]), c->name);
        verdict(name, &p, 0, N);
        pair_free(&p);
    }
}

static void gathers_and_scatters(neox_comm *c) {
    size_t P = (size_t)c->size;
    char name[96];
    // reduce-scatter: P blocks of N in, one block out (blocking and non-blocking).
    for (int blocking = 1; blocking >= 0; blocking--) {
        pair in = pair_make(P * N, NEOX_F32, 2), out = pair_make(N, NEOX_F32, 3);
        neox_request rq[2];
        if (blocking) {
            neox_reduce_scatter_sum(c, in.d, out.d, N, NEOX_F32);
            neox_reduce_scatter_sum(c, in.h, out.h, N, NEOX_F32);
        } else {
            neox_ireduce_scatter_sum(c, in.d, out.d, N, NEOX_F32, &rq[0]);
            neox_ireduce_scatter_sum(c, in.h, out.h, N, NEOX_F32, &rq[1]);
            neox_wait(&rq[0]);
            neox_wait(&rq[1]);
        }
        snprintf(name, sizeof name, "%sreduce-scatter f32 on %s", blocking ? "" : "non-blocking ", c->name);
        verdict(name, &out, 0, N);
        pair_free(&in);
        pair_free(&out);
    }
    // all-gather: N in, P blocks out; the non-blocking form is completed by polling neox_test.
    for (int blocking = 1; blocking >= 0; blocking--) {
        pair in = pair_make(N, NEOX_BF16, 4), out = pair_make(P * N, NEOX_BF16, 5);
        if (blocking) {
            neox_allgather(c, in.d, out.d, N, NEOX_BF16);
            neox_allgather(c, in.h, out.h, N, NEOX_BF16);
        } else {
            neox_request rq[2];
            neox_iallgather(c, in.d, out.d, N, NEOX_BF16, &rq[0]);
            neox_iallgather(c, in.h, out.h, N, NEOX_BF16, &rq[1]);
            while (!neox_test(&rq[0])) {}
            neox_wait(&rq[1]);
        }
        snprintf(name, sizeof name, "%sall-gather bf16 on %s", blocking ? "" : "non-blocking ", c->name);
        verdict(name, &out, 0, P * N);
        pair_free(&in);
        pair_free(&out);
    }
    // Variable counts (rank 1 contributes nothing): ZeRO's in-place all-gather, and the reduce-scatter
    // with counts, on the device in place at this rank's offset, on the host into a separate buffer.
    int *counts = neox_malloc(P * sizeof(int));
    size_t total = 0, mine_at = 0;
    for (size_t q = 0; q < P; q++) {
        counts[q] = q == 1 ? 0 : 100 + (int)q * 37;
        if ((int)q < c->rank) mine_at += (size_t)counts[q];
        total += (size_t)counts[q];
    }
    pair v = pair_make(total, NEOX_F32, 6);
    neox_allgatherv_inplace(c, v.d, counts, NEOX_F32);
    neox_allgatherv_inplace(c, v.h, counts, NEOX_F32);
    snprintf(name, sizeof name, "all-gatherv in place f32 on %s", c->name);
    verdict(name, &v, 0, total);
    pair_free(&v);
    pair sv = pair_make(total, NEOX_F32, 7);
    float *host_out = neox_malloc((size_t)(counts[c->rank] + 1) * sizeof(float));
    neox_request rq[2];
    neox_ireduce_scatterv_sum(c, sv.d, (float *)sv.d + mine_at, counts, NEOX_F32, &rq[0]);
    neox_ireduce_scatterv_sum(c, sv.h, host_out, counts, NEOX_F32, &rq[1]);
    neox_wait(&rq[0]);
    neox_wait(&rq[1]);
    memcpy((float *)sv.h + mine_at, host_out, (size_t)counts[c->rank] * sizeof(float));
    snprintf(name, sizeof name, "reduce-scatterv in place f32 on %s", c->name);
    verdict(name, &sv, mine_at, (size_t)counts[c->rank]);
    pair_free(&sv);
    free(host_out);
    free(counts);
}

static void rooted_and_pairwise(neox_comm *c) {
    int P = c->size, me = c->rank;
    char name[96];
    pair b = pair_make(N, NEOX_F64, 8);
    neox_broadcast(c, b.d, N, NEOX_F64, P - 1);
    neox_broadcast(c, b.h, N, NEOX_F64, P - 1);
    snprintf(name, sizeof name, "broadcast f64 from the last rank on %s", c->name);
    verdict(name, &b, 0, N);
    pair_free(&b);
    pair r = pair_make(N, NEOX_F16, 9);
    neox_reduce_sum(c, r.d, N, NEOX_F16, 0);
    neox_reduce_sum(c, r.h, N, NEOX_F16, 0);
    snprintf(name, sizeof name, "reduce f16 to rank 0 on %s", c->name);
    verdict(name, &r, 0, me == 0 ? N : 0);  // only the root's buffer is specified
    pair_free(&r);
    pair in = pair_make((size_t)P * N, NEOX_I32, 10), out = pair_make((size_t)P * N, NEOX_I32, 11);
    neox_alltoall(c, in.d, out.d, N, NEOX_I32);
    neox_alltoall(c, in.h, out.h, N, NEOX_I32);
    snprintf(name, sizeof name, "all-to-all i32 on %s", c->name);
    verdict(name, &out, 0, (size_t)P * N);
    pair_free(&in);
    pair_free(&out);
    // A ring: send to the next rank, receive from the previous (itself when alone), the send and
    // the receive in one group so that they progress together on the GPU.
    int next = (me + 1) % P, prev = (me + P - 1) % P;
    pair s = pair_make(N, NEOX_I64, 12), got = pair_make(N, NEOX_I64, 13);
    neox_request rq[4];
    neox_group_begin();
    neox_isend(c, s.d, N, NEOX_I64, next, 7, &rq[0]);
    neox_irecv(c, got.d, N, NEOX_I64, prev, 7, &rq[1]);
    neox_group_end();
    neox_isend(c, s.h, N, NEOX_I64, next, 7, &rq[2]);
    neox_irecv(c, got.h, N, NEOX_I64, prev, 7, &rq[3]);
    for (int i = 0; i < 4; i++) neox_wait(&rq[i]);
    snprintf(name, sizeof name, "grouped send/recv ring i64 on %s", c->name);
    verdict(name, &got, 0, N);
    // The blocking forms in a group (the device pair), against the host pair's result.
    neox_group_begin();
    neox_send(c, s.d, N, NEOX_I64, next, 8);
    neox_recv(c, got.d, N, NEOX_I64, prev, 8);
    neox_group_end();
    snprintf(name, sizeof name, "grouped blocking send/recv ring i64 on %s", c->name);
    verdict(name, &got, 0, N);
    // MPI style, no group: a non-blocking send, then a blocking receive. Launched one after the
    // other on the stream, every rank's send would wait for a receive queued behind it; the layer
    // holds the send back and launches it with the receive.
    pair s2 = pair_make(N, NEOX_F32, 16), got2 = pair_make(N, NEOX_F32, 17);
    neox_isend(c, s2.d, N, NEOX_F32, next, 9, &rq[0]);
    neox_recv(c, got2.d, N, NEOX_F32, prev, 9);
    neox_wait(&rq[0]);
    neox_isend(c, s2.h, N, NEOX_F32, next, 9, &rq[1]);
    neox_recv(c, got2.h, N, NEOX_F32, prev, 9);
    neox_wait(&rq[1]);
    snprintf(name, sizeof name, "isend then recv (the send held for the receive) ring f32 on %s", c->name);
    verdict(name, &got2, 0, N);
    pair_free(&s2);
    pair_free(&got2);
    pair_free(&s);
    pair_free(&got);
}

// Stream order with no host wait in between: a kernel scales the buffer, the all-reduce must see
// the scaled values, and the kernel after it must see the sum. A large buffer makes a missing
// dependency show (the scale would still be running when NCCL reads).
static void ordering(neox_comm *c) {
    size_t n = (size_t)1 << 24;
    float *h = neox_malloc(n * sizeof(float)), *d = gpu->alloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = 1.0f;
    gpu->to_device(d, h, n * sizeof(float));
    gpu->scale(d, n, 3.0f);
    neox_allreduce_sum(c, d, n, NEOX_F32);
    gpu->scale(d, n, 0.5f);
    neox_request rq;
    neox_iallreduce_sum(c, d, n, NEOX_F32, &rq);
    neox_wait(&rq);
    gpu->scale(d, n, 2.0f);
    gpu->to_host(h, d, n * sizeof(float));
    float want = 3.0f * (float)c->size * (float)c->size;  // ((3 P) / 2 P) x 2
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += h[i] != want;
    check("stream order: kernel, all-reduce, kernel, non-blocking all-reduce, kernel (2^24 floats)", bad == 0);
    free(h);
    gpu->free(d);
}

// The statistics count a device call as they count a host call.
static void accounting(neox_comm *c) {
    pair p = pair_make(N, NEOX_F32, 14);
    neox_comm_stats before = c->stats;
    neox_allreduce_sum(c, p.d, N, NEOX_F32);
    neox_comm_stats mid = c->stats;
    neox_allreduce_sum(c, p.h, N, NEOX_F32);
    int ok = mid.calls[NEOX_COMM_ALLREDUCE] - before.calls[NEOX_COMM_ALLREDUCE] == 1 &&
             mid.bytes[NEOX_COMM_ALLREDUCE] - before.bytes[NEOX_COMM_ALLREDUCE] == (int64_t)(N * sizeof(float)) &&
             c->stats.sent[NEOX_COMM_ALLREDUCE] - mid.sent[NEOX_COMM_ALLREDUCE] ==
                 mid.sent[NEOX_COMM_ALLREDUCE] - before.sent[NEOX_COMM_ALLREDUCE];
    check("statistics: a device all-reduce counts one call, its bytes and the same sent bytes as on the host", ok);
    pair_free(&p);
}

// ---- the gradient reducer ---------------------------------------------------------------------

static void reducer(neox_comm *data, int zero_stage, neox_dtype wire) {
    const size_t sizes[] = {1000, 37, 5000, 3, 2222, 1};
    enum { NP = 6 };
    size_t offsets[NP], n = 0;
    for (int p = 0; p < NP; p++) offsets[p] = n, n += sizes[p];
    pair g = pair_make(n, NEOX_F32, 15);
    neox_grad_reducer_options opt = {.bucket_bytes = 2048 * sizeof(float), .zero_stage = zero_stage, .overlap = 1,
                                     .predivide_factor = 2.0, .wire = wire};
    neox_grad_reducer *host = make_reducer(data, g.h, n, offsets, sizes, NP, &opt);
    opt.backend = gpu;
    neox_grad_reducer *dev = make_reducer(data, g.d, n, offsets, sizes, NP, &opt);
    for (int step = 0; step < 2; step++) {  // the second step reuses the buckets' state
        // Both start from the same values (under ZeRO the buffer outside the partition is
        // unspecified after a step, and differs between the two).
        gpu->to_device(g.d, g.h, n * sizeof(float));
        for (int p = NP - 1; p >= 0; p--) {
            neox_grad_reducer_ready(dev, p);
            neox_grad_reducer_progress(dev);
            neox_grad_reducer_ready(host, p);
        }
        neox_grad_reducer_finish(dev);
        neox_grad_reducer_finish(host);
    }
    size_t lo = 0, hi = n;
    if (zero_stage > 0) neox_grad_reducer_partition(host, data->rank, &lo, &hi);
    char name[96];
    snprintf(name, sizeof name, "gradient reducer ZeRO %d, %s wire, predivide 2, %d buckets, 2 steps", zero_stage,
             neox_dtype_name(wire), neox_grad_reducer_bucket_count(dev));
    verdict(name, &g, lo, hi - lo);
    neox_grad_reducer_free(host);
    neox_grad_reducer_free(dev);
    pair_free(&g);
}

// ---- main -------------------------------------------------------------------------------------

// 1 when this node has a GPU for each of its ranks (decided together, so every rank agrees).
static int enough_gpus(int *ranks, int *gpus) {
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, ranks);
    MPI_Comm_free(&node);
    *gpus = neox_cuda_device_count();
    int ok = *gpus >= *ranks;
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return ok;
}

int main(int argc, char **argv) {
    neox_error err = {0};
    if (neox_parallel_init(&argc, &argv, &err) != 0) neox_die_error(&err);
    int ranks, gpus;
    MPI_Comm_rank(MPI_COMM_WORLD, &grid.world_rank);
    if (!enough_gpus(&ranks, &gpus)) {
        if (grid.world_rank == 0) {
            if (gpus == 0) printf("ok - nccl parity # SKIP no GPU: skipped\n");
            else printf("ok - nccl parity # SKIP %d ranks on a node with %d GPU(s): NCCL needs one GPU per rank\n", ranks, gpus);
        }
        neox_parallel_finalize(0);
        return 0;
    }
    if (neox_grid_make(&grid, 1, 1, &err) != 0 || neox_grid_enable_device(&grid, &err) != 0) neox_die_error(&err);
    gpu = neox_backend_cuda();  // after enable_device, which chose this rank's GPU
    if (!gpu) neox_die(NEOX_EXIT_FAILURE, "nccl_parity: the CUDA backend did not start");
    check("every group has an NCCL communicator", grid.world.device && grid.data.device && grid.pipe.device && grid.model.device);
    allreduces(&grid.world);
    allreduces(&grid.model);  // one rank: NCCL's single-rank path
    gathers_and_scatters(&grid.world);
    rooted_and_pairwise(&grid.world);
    ordering(&grid.data);
    accounting(&grid.world);
    reducer(&grid.data, 0, NEOX_F32);
    reducer(&grid.data, 0, NEOX_BF16);
    reducer(&grid.data, 1, NEOX_F32);
    reducer(&grid.data, 2, NEOX_F16);
    gpu->synchronize();
    neox_grid_free(&grid);
    if (grid.world_rank == 0) printf("# nccl parity: %d rank(s), %d failure(s)\n", grid.world_size, failures);
    neox_parallel_finalize(failures ? 1 : 0);
    return failures ? 1 : 0;
}
