// devcomm_check.c: run under mpiexec; checks the emulated device's twin of NCCL
// (lib/parallel/emulated_comm.c) and prints TAP lines from rank 0.
//   mpiexec -n 2 devcomm_check            every collective on device buffers, and each rule of when
//                                         a queued collective runs
//   mpiexec -n 2 devcomm_check modify     a kernel writes an all-reduce's buffer before the all-reduce
//                                         ran: the process must stop naming it (exit status != 0)
//   mpiexec -n 2 devcomm_check stall S    rank 1 sleeps S seconds before its part of a device
//                                         all-reduce (comm_timeout_seconds tests stop it first)
// It also runs the overlapped gradient reducer (lib/gradient/grad_reducer.c) on device gradients
// with backward's compute between the buckets: the result must equal the same reducer's on host
// memory bit for bit, every bucket must still be pending when backward ends, and reading the
// gradients before finish (the optimizer not waiting) must read NaN.
// Expected values are closed forms of the ranks' inputs, computed here independently; device buffers
// are read only through the backend's to_host.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gradient.h"
#include "kernels/backend.h"
#include "parallel.h"

static neox_grid grid;
static const neox_backend *be;

static void report(const char *name, int ok) {
    int all = ok;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (grid.world_rank == 0) printf("%s - emulated device, %d ranks: %s\n", all ? "ok" : "not ok", grid.world_size, name);
    fflush(stdout);
}

// A device buffer of n floats holding f(i) (f of this rank's inputs).
static float *device_floats(size_t n, float (*f)(int rank, size_t i)) {
    float *h = neox_malloc(n * sizeof *h), *d = be->alloc(n * sizeof *d);
    for (size_t i = 0; i < n; i++) h[i] = f(grid.world_rank, i);
    be->to_device(d, h, n * sizeof *d);
    free(h);
    return d;
}

static float *host_copy(const float *d, size_t n) {
    float *h = neox_malloc(n * sizeof *h);
    be->to_host(h, d, n * sizeof *h);
    return h;
}

static float ramp(int rank, size_t i) { return (float)(rank + 1) * (float)(i % 97); }
static float zero(int rank, size_t i) { return (void)rank, (void)i, 0.0f; }

// sum over ranks q of ramp(q, i)
static float ramp_sum(size_t i) {
    int n = grid.world_size;
    return (float)(n * (n + 1) / 2) * (float)(i % 97);
}

static int all_nan(const float *h, size_t n) {
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= isnan(h[i]);
    return ok;
}

enum { N = 1000 };

static void check_blocking(neox_comm *c) {
    float *d = device_floats(N, ramp);
    neox_allreduce_sum(c, d, N, NEOX_F32);
    be->scale(d, N, 2.0f);  // the op that reaches the all-reduce on the stream runs it first
    float *h = host_copy(d, N);
    int ok = 1;
    for (size_t i = 0; i < N; i++) ok &= h[i] == 2 * ramp_sum(i);
    report("a blocking all-reduce runs before the next op on the stream", ok);
    free(h);

    neox_allreduce_sum(c, d, N, NEOX_F32);  // the host reads it through to_host alone
    h = host_copy(d, N);
    ok = 1;
    for (size_t i = 0; i < N; i++) ok &= h[i] == 2 * ramp_sum(i) * (float)c->size;
    report("to_host runs a blocking all-reduce queued before it", ok);
    free(h);
    be->free(d);
}

static void check_nonblocking(neox_comm *c) {
    float *d = device_floats(N, ramp), *seen = be->alloc(N * sizeof *seen);
    neox_request req;
    neox_iallreduce_sum(c, d, N, NEOX_F32, &req);
    be->copy(seen, d, N * sizeof *seen);  // no neox_wait: the stream does not wait for it
    float *h = host_copy(seen, N);
    report("an op not ordered after a non-blocking all-reduce (no neox_wait) reads NaN", all_nan(h, N));
    free(h);
    neox_wait(&req);
    be->copy(seen, d, N * sizeof *seen);
    h = host_copy(seen, N);
    int ok = 1;
    for (size_t i = 0; i < N; i++) ok &= h[i] == ramp_sum(i);
    report("after neox_wait the next op sees the non-blocking all-reduce's result", ok);
    free(h);

    // neox_test runs it (and reports it done); its result is there for the next op.
    float *e = device_floats(N, ramp);
    neox_iallreduce_sum(c, e, N, NEOX_F32, &req);
    int done = neox_test(&req);
    be->copy(seen, e, N * sizeof *seen);
    h = host_copy(seen, N);
    ok = done;
    for (size_t i = 0; i < N; i++) ok &= h[i] == ramp_sum(i);
    report("neox_test runs a non-blocking all-reduce and reports it done", ok);
    free(h);

    // Queue order: a blocking operation queued after a non-blocking one that nobody waited for runs
    // it first, as one communication stream would.
    neox_request first;
    float *a = device_floats(N, ramp), *b = device_floats(N, ramp);
    neox_iallreduce_sum(c, a, N, NEOX_F32, &first);
    neox_allreduce_sum(c, b, N, NEOX_F32);
    be->copy(seen, a, N * sizeof *seen);  // reaches the blocking one, and so the one before it
    h = host_copy(seen, N);
    ok = 1;
    for (size_t i = 0; i < N; i++) ok &= h[i] == ramp_sum(i);
    report("queued operations run in the order queued", ok);
    neox_wait(&first);
    free(h);
    be->free(a), be->free(b), be->free(d), be->free(e), be->free(seen);
}

// 1F1B's pattern on both sides: isend, then irecv from the same peer, then the waits.
static void check_exchange(neox_comm *c) {
    int peer = (c->rank + 1) % c->size, from = (c->rank + c->size - 1) % c->size;
    float *out = device_floats(N, ramp), *in = device_floats(N, zero);
    neox_request s, r;
    neox_isend(c, out, N, NEOX_F32, peer, 0, &s);
    neox_irecv(c, in, N, NEOX_F32, from, 0, &r);
    neox_wait(&s);
    neox_wait(&r);
    float *h = host_copy(in, N);
    int ok = 1;
    for (size_t i = 0; i < N; i++) ok &= h[i] == ramp(grid.world_rank == 0 ? c->size - 1 : c->rank - 1, i);
    report("isend then irecv on every rank (1F1B) exchanges without deadlock", ok);
    free(h);
    neox_send(c, out, N, NEOX_F32, peer, 0);  // blocking forms: the send leaves from a copy
    neox_recv(c, in, N, NEOX_F32, from, 0);
    h = host_copy(in, N);
    ok = 1;
    for (size_t i = 0; i < N; i++) ok &= h[i] == ramp(grid.world_rank == 0 ? c->size - 1 : c->rank - 1, i);
    report("blocking send then recv on every rank", ok);
    free(h);
    be->free(out), be->free(in);
}

static void check_collectives(neox_comm *c) {
    int p = c->size, r = c->rank;
    size_t B = 10;
    float *send = device_floats(B * (size_t)p, ramp), *recv = device_floats(B * (size_t)p, zero);
    neox_reduce_scatter_sum(c, send, recv, B, NEOX_F32);
    float *h = host_copy(recv, B);
    int ok = 1;
    for (size_t i = 0; i < B; i++) ok &= h[i] == ramp_sum((size_t)r * B + i);
    report("reduce-scatter", ok);
    free(h);

    neox_allgather(c, send, recv, B, NEOX_F32);
    h = host_copy(recv, B * (size_t)p);
    ok = 1;
    for (int q = 0; q < p; q++)
        for (size_t i = 0; i < B; i++) ok &= h[(size_t)q * B + i] == ramp(q, i);
    report("all-gather", ok);
    free(h);

    int counts[64];
    size_t total = 0, mine = 0;
    for (int q = 0; q < p; q++) counts[q] = 3 + 2 * q, mine += q < r ? (size_t)counts[q] : 0, total += (size_t)counts[q];
    float *v = device_floats(total, ramp);
    neox_allgatherv_inplace(c, v, counts, NEOX_F32);
    h = host_copy(v, total);
    ok = 1;
    size_t at = 0;
    for (int q = 0; q < p; q++)
        for (int i = 0; i < counts[q]; i++, at++) ok &= h[at] == ramp(q, at);
    report("all-gather of varying counts in place", ok);
    free(h);

    be->free(v);
    v = device_floats(total, ramp);
    neox_request req;
    neox_ireduce_scatterv_sum(c, v, (char *)v + mine * sizeof(float), counts, NEOX_F32, &req);
    neox_wait(&req);
    h = host_copy(v + mine, (size_t)counts[r]);
    ok = 1;
    for (int i = 0; i < counts[r]; i++) ok &= h[i] == ramp_sum(mine + (size_t)i);
    report("reduce-scatter of varying counts in place (non-blocking)", ok);
    free(h);

    float *x = device_floats(B, ramp);
    neox_broadcast(c, x, B, NEOX_F32, p - 1);
    h = host_copy(x, B);
    ok = 1;
    for (size_t i = 0; i < B; i++) ok &= h[i] == ramp(p - 1, i);
    report("broadcast", ok);
    free(h);

    be->free(x);
    x = device_floats(B, ramp);
    neox_reduce_sum(c, x, B, NEOX_F32, 0);
    h = host_copy(x, B);
    ok = 1;
    for (size_t i = 0; r == 0 && i < B; i++) ok &= h[i] == ramp_sum(i);
    report("reduce to rank 0", ok);
    free(h);

    neox_alltoall(c, send, recv, B, NEOX_F32);
    h = host_copy(recv, B * (size_t)p);
    ok = 1;
    for (int q = 0; q < p; q++)
        for (size_t i = 0; i < B; i++) ok &= h[(size_t)q * B + i] == ramp(q, (size_t)r * B + i);
    report("all-to-all", ok);
    free(h);

    float *m = device_floats(B, ramp);
    neox_allreduce_max(c, m, B, NEOX_F32);
    h = host_copy(m, B);
    ok = 1;
    for (size_t i = 0; i < B; i++) ok &= h[i] == ramp(p - 1, i);
    report("all-reduce max", ok);
    free(h);
    be->free(send), be->free(recv), be->free(v), be->free(x), be->free(m);
}

// The device calls count as the host calls do: one call, its payload and the same bytes sent.
static void check_accounting(neox_comm *c) {
    neox_comm_stats before = c->stats;
    float *d = device_floats(N, ramp), host[N] = {0};
    neox_allreduce_sum(c, d, N, NEOX_F32);
    neox_comm_stats mid = c->stats;
    neox_allreduce_sum(c, host, N, NEOX_F32);
    be->synchronize();
    int64_t dev_calls = mid.calls[NEOX_COMM_ALLREDUCE] - before.calls[NEOX_COMM_ALLREDUCE];
    int64_t dev_bytes = mid.bytes[NEOX_COMM_ALLREDUCE] - before.bytes[NEOX_COMM_ALLREDUCE];
    int64_t dev_sent = mid.sent[NEOX_COMM_ALLREDUCE] - before.sent[NEOX_COMM_ALLREDUCE];
    int ok = dev_calls == 1 && dev_bytes == N * 4 && dev_sent == c->stats.sent[NEOX_COMM_ALLREDUCE] - mid.sent[NEOX_COMM_ALLREDUCE];
    report("a device all-reduce counts one call, its payload and the host call's bytes sent", ok);
    be->free(d);
}

// ---- the overlapped gradient reducer ------------------------------------------------------------

enum { PARAMS = 6, PARAM_ELEMS = 300 };

static float grad_value(int rank, size_t i) { return (float)(rank + 1) * 0.37f + (float)(i % 89) * 0.011f; }

// A reducer over PARAMS parameters of PARAM_ELEMS each, one bucket per two parameters, overlapped.
static neox_grad_reducer *overlapped_reducer(float *grads, const neox_backend *on, int stage, float *partition_sum) {
    size_t offsets[PARAMS], sizes[PARAMS];
    for (int p = 0; p < PARAMS; p++) offsets[p] = (size_t)p * PARAM_ELEMS, sizes[p] = PARAM_ELEMS;
    neox_grad_reducer_options opt = {.zero_stage = stage, .overlap = 1, .bucket_bytes = 2 * PARAM_ELEMS * sizeof(float),
                                     .backend = on, .partition_sum = partition_sum};
    neox_error err = {0};
    neox_grad_reducer *r = neox_grad_reducer_make(&grid.data, grads, (size_t)PARAMS * PARAM_ELEMS, offsets, sizes,
                                                  PARAMS, &opt, &err);
    if (!r) neox_die_error(&err);
    return r;
}

// Backward: parameters become ready last to first, each after a kernel on the device's stream (the
// compute the buckets' reductions overlap). `work` is a device buffer of PARAM_ELEMS floats.
static void backward(neox_grad_reducer *r, const neox_backend *on, float *work) {
    for (int p = PARAMS - 1; p >= 0; p--) {
        on->scale(work, PARAM_ELEMS, 0.5f);
        neox_grad_reducer_ready(r, p);
        neox_grad_reducer_progress(r);
    }
}

// The gradients (stage 0) or the partition sum (stage 2) after one overlapped reduction, on the host.
static float *reduce_with(const neox_backend *on, int stage, size_t *len, int read_early, int *early_nan) {
    size_t n = (size_t)PARAMS * PARAM_ELEMS, lo, hi;
    neox_even_share(n, grid.data_rank, grid.data_size, &lo, &hi);
    float *host = neox_malloc(n * sizeof *host);
    for (size_t i = 0; i < n; i++) host[i] = grad_value(grid.world_rank, i);
    float *grads = on->alloc(n * sizeof *grads), *work = on->alloc(PARAM_ELEMS * sizeof *work);
    float *part = stage == 2 ? on->alloc((hi - lo) * sizeof *part) : NULL;
    on->to_device(grads, host, n * sizeof *grads);
    on->memset_zero(work, PARAM_ELEMS * sizeof *work);
    if (part) on->memset_zero(part, (hi - lo) * sizeof *part);
    neox_grad_reducer *r = overlapped_reducer(grads, on, stage, part);
    backward(r, on, work);
    if (read_early) {  // the optimizer reading before finish's waits: this rank's sums still run
        on->to_host(host, grads, n * sizeof *host);
        *early_nan = all_nan(host + lo, hi - lo);
    }
    neox_grad_reducer_finish(r);
    *len = part ? hi - lo : n;
    on->to_host(host, part ? part : grads, *len * sizeof *host);
    if (on->on_device && !read_early) {
        neox_grad_reducer_timing t = neox_grad_reducer_timing_of(r);
        report(stage == 2 ? "ZeRO-2: every overlapped bucket was still pending when backward ended"
                          : "every overlapped bucket was still pending when backward ended",
               t.pending_at_backward_end == neox_grad_reducer_bucket_count(r));
    }
    neox_grad_reducer_free(r);
    on->free(grads), on->free(work);
    if (part) on->free(part);
    return host;
}

static void check_overlapped_reducer(int stage) {
    size_t n_host, n_dev;
    int unused, early_nan = 0;
    float *want = reduce_with(neox_backend_cpu(), stage, &n_host, 0, &unused);
    float *got = reduce_with(be, stage, &n_dev, 0, &unused);
    report(stage == 2 ? "ZeRO-2: the overlapped reducer on device gradients equals the host's bit for bit"
                      : "the overlapped reducer on device gradients equals the host's bit for bit",
           n_host == n_dev && !memcmp(want, got, n_host * sizeof *want));
    free(got);
    got = reduce_with(be, stage, &n_dev, 1, &early_nan);
    report(stage == 2 ? "ZeRO-2: gradients read before finish waits for the buckets read NaN"
                      : "gradients read before finish waits for the buckets read NaN", early_nan);
    free(want), free(got);
}

// The device writes the buffer of a non-blocking all-reduce that the stream was not made to wait for:
// on a device the all-reduce may read either value. The run must stop the process naming it.
static void modify_before_run(neox_comm *c) {
    float *d = device_floats(N, ramp);
    neox_request req;
    neox_iallreduce_sum(c, d, N, NEOX_F32, &req);
    be->memset_zero(d, N * sizeof *d);  // (a kernel computing on the NaN the buffer reads now would keep it NaN)
    neox_wait(&req);
    be->synchronize();
    printf("rank %d: the changed buffer went unnoticed\n", grid.world_rank);
}

static void stall(neox_comm *c, int seconds) {
    float *d = device_floats(N, ramp);
    if (grid.world_rank == 1) sleep((unsigned)seconds);
    neox_allreduce_sum(c, d, N, NEOX_F32);
    be->synchronize();
    be->free(d);
}

int main(int argc, char **argv) {
    neox_error err = {0};
    if (neox_parallel_init(&argc, &argv, &err) != 0 || neox_grid_make(&grid, 1, 1, &err) != 0) {
        fprintf(stderr, "%s\n", err.message);
        return 1;
    }
    be = neox_backend_emulated();
    if (neox_grid_enable_emulated(&grid, &err) != 0) {
        fprintf(stderr, "%s\n", err.message);
        return 1;
    }
    const char *mode = argc > 1 ? argv[1] : "all";
    if (!strcmp(mode, "modify")) {
        modify_before_run(&grid.data);
    } else if (!strcmp(mode, "stall")) {
        neox_comm_set_timeout(argc > 3 ? atof(argv[3]) : 0);
        stall(&grid.data, argc > 2 ? atoi(argv[2]) : 1);
    } else {
        check_blocking(&grid.data);
        check_nonblocking(&grid.data);
        check_exchange(&grid.data);
        check_collectives(&grid.data);
        check_accounting(&grid.data);
        check_overlapped_reducer(0);
        check_overlapped_reducer(2);
    }
    neox_grid_free(&grid);
    neox_parallel_finalize(0);
    return 0;
}
