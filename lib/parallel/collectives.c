// collectives.c: the communication calls of parallel.h over MPI, with accounting. Blocking
// all-reduce, broadcast and point-to-point calls are chunked so element counts above MPI's int
// limit work; bf16 and fp16 sums use a custom MPI operation that adds in fp32. A call whose buffers
// are device memory on a group with a device communicator goes to the device table instead
// (device_comm.h: NCCL in a CUDA build, the emulated device's twin over MPI); the accounting is the
// same for both.
#include <limits.h>
#include <stdlib.h>
#include <string.h>


#include "parallel.h"
#include "kernels/kernels.h"
#include "parallel/device_comm.h"

size_t neox_dtype_size(neox_dtype dt) {
    static const size_t sizes[] = {4, 8, 2, 2, 4, 8, 1};
    return sizes[dt];
}

const char *neox_dtype_name(neox_dtype dt) {
    static const char *names[] = {"f32", "f64", "bf16", "f16", "i32", "i64", "u8"};
    return names[dt];
}

neox_dtype neox_dtype_of_elem(neox_elem e) {
    return e == NEOX_ELEM_BF16 ? NEOX_BF16 : e == NEOX_ELEM_F16 ? NEOX_F16 : NEOX_F32;
}

const char *neox_comm_op_name(neox_comm_op op) {
    static const char *names[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                  "send",       "recv",           "barrier",    "all_to_all", "reduce"};
    return names[op];
}

// ---- 16-bit float sums ------------------------------------------------------------------------

// Each element is summed in fp32 and rounded back, as the device collectives do.
static void sum_bf16(void *in, void *inout, int *len, MPI_Datatype *type) {
    (void)type;
    uint16_t *a = in, *b = inout;
    for (int i = 0; i < *len; i++) b[i] = neox_bf16_from_f32(neox_bf16_to_f32(a[i]) + neox_bf16_to_f32(b[i]));
}

// Widened a chunk at a time (the casts are the kernels' own: no _Float16, which not every
// compiler has on x86), summed in fp32 and rounded back, as a half addition rounds.
static void sum_f16(void *in, void *inout, int *len, MPI_Datatype *type) {
    (void)type;
    uint16_t *a = in, *b = inout;
    for (int i = 0; i < *len; i++) b[i] = neox_f16_from_f32(neox_f16_to_f32(a[i]) + neox_f16_to_f32(b[i]));
}

MPI_Op neox_mpi_sum_op(neox_dtype dt) {
    static MPI_Op bf16_op = MPI_OP_NULL, f16_op = MPI_OP_NULL;
    if (dt == NEOX_BF16) {
        if (bf16_op == MPI_OP_NULL) MPI_Op_create(sum_bf16, 1, &bf16_op);
        return bf16_op;
    }
    if (dt == NEOX_F16) {
        if (f16_op == MPI_OP_NULL) MPI_Op_create(sum_f16, 1, &f16_op);
        return f16_op;
    }
    return MPI_SUM;
}

MPI_Datatype neox_mpi_type(neox_dtype dt) {
    switch (dt) {
    case NEOX_F32: return MPI_FLOAT;
    case NEOX_F64: return MPI_DOUBLE;
    case NEOX_BF16:
    case NEOX_F16: return MPI_UINT16_T;
    case NEOX_I32: return MPI_INT32_T;
    case NEOX_I64: return MPI_INT64_T;
    default: return MPI_UINT8_T;
    }
}

// ---- accounting -------------------------------------------------------------------------------

// The bytes a rank transmits for a payload of `bytes` (parallel.h: the bandwidth-optimal algorithm).
static double sent_bytes(const neox_comm *c, neox_comm_op op, size_t bytes) {
    double p = c->size, share = p > 1 ? (p - 1) / p * (double)bytes : 0.0;
    switch (op) {
    case NEOX_COMM_ALLREDUCE: return 2 * share;
    case NEOX_COMM_SEND: return (double)bytes;
    case NEOX_COMM_RECV:
    case NEOX_COMM_BARRIER: return 0;
    default: return share;
    }
}

// The message-size row of a payload: its own row, a fresh one, or the shared last row when full.
static int size_row(neox_comm_stats *s, neox_comm_op op, size_t bytes) {
    neox_comm_size_row *rows = s->sizes[op];
    for (int i = 0; i < NEOX_COMM_SIZES - 1; i++) {
        if (rows[i].calls == 0) rows[i].bytes = (int64_t)bytes;
        if (rows[i].bytes == (int64_t)bytes) return i;
    }
    rows[NEOX_COMM_SIZES - 1].bytes = -1;
    return NEOX_COMM_SIZES - 1;
}

// Returns the size row the call was counted in (non-blocking calls add their wait time there).
// Under a profile's capture the call is also an event of the trace (lib/core/trace.c): a blocking
// call from its start to its return, a non-blocking one at its issue (its wait is neox_wait's).
static int account(neox_comm *c, neox_comm_op op, size_t bytes, double seconds) {
    if (neox_trace_on) neox_trace_complete_at(neox_comm_op_name(op), c->name, neox_now() - seconds, seconds, (double)bytes, 0);
    c->stats.calls[op]++;
    c->stats.bytes[op] += (int64_t)bytes;
    c->stats.sent[op] += (int64_t)(sent_bytes(c, op, bytes) + 0.5);
    c->stats.seconds[op] += seconds;
    int row = size_row(&c->stats, op, bytes);
    c->stats.sizes[op][row].calls++;
    c->stats.sizes[op][row].seconds += seconds;
    return row;
}

void neox_comm_add_seconds(neox_comm *c, neox_comm_op op, size_t bytes, double seconds) {
    c->stats.seconds[op] += seconds;
    c->stats.sizes[op][size_row(&c->stats, op, bytes)].seconds += seconds;
}

void neox_comm_stats_delta(neox_comm_stats *delta, const neox_comm_stats *now, const neox_comm_stats *before) {
    memset(delta, 0, sizeof *delta);
    for (int i = 0; i < NEOX_COMM_OP_COUNT; i++) {
        delta->calls[i] = now->calls[i] - before->calls[i];
        delta->bytes[i] = now->bytes[i] - before->bytes[i];
        delta->sent[i] = now->sent[i] - before->sent[i];
        delta->seconds[i] = now->seconds[i] - before->seconds[i];
    }
}

void neox_comm_stats_add(neox_comm_stats *total, const neox_comm_stats *s) {
    for (int i = 0; i < NEOX_COMM_OP_COUNT; i++) {
        total->calls[i] += s->calls[i];
        total->bytes[i] += s->bytes[i];
        total->sent[i] += s->sent[i];
        total->seconds[i] += s->seconds[i];
    }
}

// ---- the device table -------------------------------------------------------------------------

const neox_device_comm *neox_device_comm_active;

int neox_device_pick(const neox_comm *c, const void *a, const void *b, const char *what) {
    const neox_device_comm *d = neox_device_comm_active;
    if (!c->device || !d) return 0;
    int da = a && a != MPI_IN_PLACE ? d->owns(a) : -1, db = b ? d->owns(b) : -1;
    neox_assert(!(a == MPI_IN_PLACE && db > 0), "%s on group %s: MPI_IN_PLACE is for host buffers; on the device pass "
                "the send buffer (recv inside it for in place)", what, c->name);
    neox_assert(!(da >= 0 && db >= 0 && da != db), "%s on group %s: one buffer is device memory, the other host memory",
                what, c->name);
    return da > 0 || db > 0;
}

int neox_comm_on_device(const neox_comm *c, const void *p) {
    return c->device && neox_device_comm_active && neox_device_comm_active->owns(p);
}

void neox_device_comm_free(neox_comm *c) {
    if (c->device && neox_device_comm_active) neox_device_comm_active->comm_free(c);
    c->device = NULL;
}

// Groups are the device's (NCCL's fused launches); MPI operations ignore them.
static int g_grouped;

void neox_group_begin(void) {
    neox_assert(!g_grouped, "neox_group_begin: groups do not nest");
    g_grouped = 1;
    if (neox_device_comm_active) neox_device_comm_active->group_begin();
}

void neox_group_end(void) {
    neox_assert(g_grouped, "neox_group_end without neox_group_begin");
    g_grouped = 0;
    if (neox_device_comm_active) neox_device_comm_active->group_end();
}

// ---- blocking ---------------------------------------------------------------------------------

// A blocking MPI call, or with a communication timeout set its non-blocking form waited for under
// the timeout (comm_timeout.c).
#define WAITED(c, op, blocking, nonblocking, ...)                                        \
    do {                                                                                 \
        if (neox_comm_timeout() > 0) {                                                   \
            MPI_Request waited_req_;                                                     \
            nonblocking(__VA_ARGS__, &waited_req_);                                      \
            neox_comm_wait_mpi((c), &waited_req_, (op));                                 \
        } else {                                                                         \
            blocking(__VA_ARGS__);                                                       \
        }                                                                                \
    } while (0)

// Every MPI call gets an int count: larger buffers go in pieces of this many elements.
#define REDUCE_CHUNK ((size_t)1 << 30)

void neox_allreduce_sum(neox_comm *c, void *buf, size_t count, neox_dtype dt) {
    double t0 = neox_now();
    size_t esize = neox_dtype_size(dt);
    if (NEOX_DEVICE(c, buf, NULL, "all-reduce")) neox_device_comm_active->allreduce(c, buf, count, dt, 0, NULL);
    else
        for (size_t done = 0; done < count && c->size > 1;) {
            size_t n = count - done < REDUCE_CHUNK ? count - done : REDUCE_CHUNK;
            WAITED(c, NEOX_COMM_ALLREDUCE, MPI_Allreduce, MPI_Iallreduce, MPI_IN_PLACE, (char *)buf + done * esize, (int)n,
                   neox_mpi_type(dt), neox_mpi_sum_op(dt), c->mpi);
            done += n;
        }
    account(c, NEOX_COMM_ALLREDUCE, count * esize, neox_now() - t0);
}

void neox_allreduce_max(neox_comm *c, void *buf, size_t count, neox_dtype dt) {
    neox_assert(dt != NEOX_BF16 && dt != NEOX_F16, "all-reduce max of %s is not supported", neox_dtype_name(dt));
    double t0 = neox_now();
    size_t esize = neox_dtype_size(dt);
    if (NEOX_DEVICE(c, buf, NULL, "all-reduce max")) neox_device_comm_active->allreduce(c, buf, count, dt, 1, NULL);
    else
        for (size_t done = 0; done < count && c->size > 1;) {
            size_t n = count - done < REDUCE_CHUNK ? count - done : REDUCE_CHUNK;
            WAITED(c, NEOX_COMM_ALLREDUCE, MPI_Allreduce, MPI_Iallreduce, MPI_IN_PLACE, (char *)buf + done * esize, (int)n,
                   neox_mpi_type(dt), MPI_MAX, c->mpi);
            done += n;
        }
    account(c, NEOX_COMM_ALLREDUCE, count * esize, neox_now() - t0);
}

void neox_allreduce_max_uncounted(neox_comm *c, double *buf, int count) {
    if (c->size > 1)
        WAITED(c, NEOX_COMM_ALLREDUCE, MPI_Allreduce, MPI_Iallreduce, MPI_IN_PLACE, buf, count, MPI_DOUBLE, MPI_MAX, c->mpi);
}

void neox_allreduce_min_uncounted(neox_comm *c, double *buf, int count) {
    if (c->size > 1)
        WAITED(c, NEOX_COMM_ALLREDUCE, MPI_Allreduce, MPI_Iallreduce, MPI_IN_PLACE, buf, count, MPI_DOUBLE, MPI_MIN, c->mpi);
}

void neox_gather_bytes_uncounted(neox_comm *c, const void *send, int bytes, void *recv) {
    if (c->size > 1)
        WAITED(c, NEOX_COMM_ALLGATHER, MPI_Gather, MPI_Igather, send, bytes, MPI_BYTE, recv, bytes, MPI_BYTE, 0, c->mpi);
    else
        memcpy(recv, send, (size_t)bytes);
}

void neox_gather_uncounted(neox_comm *c, const double *send, int count, double *recv) {
    if (c->size > 1)
        WAITED(c, NEOX_COMM_ALLGATHER, MPI_Gather, MPI_Igather, send, count, MPI_DOUBLE, recv, count, MPI_DOUBLE, 0, c->mpi);
    else
        memcpy(recv, send, (size_t)count * sizeof *send);
}

void neox_reduce_scatter_sum(neox_comm *c, const void *send, void *recv, size_t recv_count, neox_dtype dt) {
    if (recv_count > INT_MAX) neox_die(NEOX_EXIT_FAILURE, "reduce-scatter of %zu elements per rank is too large", recv_count);
    double t0 = neox_now();
    if (NEOX_DEVICE(c, send, recv, "reduce-scatter")) neox_device_comm_active->reduce_scatter(c, send, recv, recv_count, dt, NULL);
    else WAITED(c, NEOX_COMM_REDUCE_SCATTER, MPI_Reduce_scatter_block, MPI_Ireduce_scatter_block, send, recv,
                (int)recv_count, neox_mpi_type(dt), neox_mpi_sum_op(dt), c->mpi);
    account(c, NEOX_COMM_REDUCE_SCATTER, recv_count * c->size * neox_dtype_size(dt), neox_now() - t0);
}

void neox_allgather(neox_comm *c, const void *send, void *recv, size_t send_count, neox_dtype dt) {
    if (send_count > INT_MAX) neox_die(NEOX_EXIT_FAILURE, "all-gather of %zu elements per rank is too large", send_count);
    double t0 = neox_now();
    if (NEOX_DEVICE(c, send, recv, "all-gather")) neox_device_comm_active->allgather(c, send, recv, send_count, dt, NULL);
    else WAITED(c, NEOX_COMM_ALLGATHER, MPI_Allgather, MPI_Iallgather, send, (int)send_count, neox_mpi_type(dt), recv,
                (int)send_count, neox_mpi_type(dt), c->mpi);
    account(c, NEOX_COMM_ALLGATHER, send_count * c->size * neox_dtype_size(dt), neox_now() - t0);
}

void neox_allgatherv_inplace(neox_comm *c, void *buf, const int *counts, neox_dtype dt) {
    double t0 = neox_now();
    int *displs = neox_malloc((size_t)c->size * sizeof(int));
    size_t total = 0;
    for (int r = 0; r < c->size; r++) {
        if (total > INT_MAX) neox_die(NEOX_EXIT_FAILURE, "all-gather of %zu elements is too large", total);
        displs[r] = (int)total;
        total += (size_t)counts[r];
    }
    if (NEOX_DEVICE(c, buf, NULL, "all-gather")) {
        neox_device_comm_active->allgatherv_inplace(c, buf, counts, dt);
    } else if (c->size > 1) {
        // Always the non-blocking call, waited for: MPICH 4.0's blocking all-gather (its ring
        // algorithm for large messages) took 46 s for 120 MB on 4 ranks of one machine where
        // MPI_Iallgatherv took 0.3 s, and ZeRO-1/2 gather every updated partition so.
        MPI_Request req;
        MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, neox_mpi_type(dt), c->mpi, &req);
        neox_comm_wait_mpi(c, &req, NEOX_COMM_ALLGATHER);
    }
    free(displs);
    account(c, NEOX_COMM_ALLGATHER, total * neox_dtype_size(dt), neox_now() - t0);
}

void neox_alltoall(neox_comm *c, const void *send, void *recv, size_t block_count, neox_dtype dt) {
    if (block_count > INT_MAX) neox_die(NEOX_EXIT_FAILURE, "all-to-all of %zu elements per rank is too large", block_count);
    double t0 = neox_now();
    if (NEOX_DEVICE(c, send, recv, "all-to-all")) neox_device_comm_active->alltoall(c, send, recv, block_count, dt);
    else WAITED(c, NEOX_COMM_ALLTOALL, MPI_Alltoall, MPI_Ialltoall, send, (int)block_count, neox_mpi_type(dt), recv,
                (int)block_count, neox_mpi_type(dt), c->mpi);
    account(c, NEOX_COMM_ALLTOALL, block_count * c->size * neox_dtype_size(dt), neox_now() - t0);
}

// On the device, one group of point-to-point messages (NCCL's own form of an all-to-all of varying
// counts): a send to and a receive from each peer with rows for it, itself included. The counts are
// host memory (the caller's plan); the two ranks of a message agree on its size by construction
// (one's send count is the other's receive count), so empty messages are skipped on both sides.
static void device_alltoallv(neox_comm *c, const void *send, const int *send_counts, const int *send_displs,
                             void *recv, const int *recv_counts, const int *recv_displs, neox_dtype dt) {
    const neox_device_comm *dev = neox_device_comm_active;
    size_t size = neox_dtype_size(dt);
    dev->group_begin();
    for (int q = 0; q < c->size; q++) {
        if (send_counts[q] > 0)
            dev->p2p(c, (char *)send + (size_t)send_displs[q] * size, (size_t)send_counts[q], dt, q, 1, NULL);
        if (recv_counts[q] > 0) dev->p2p(c, (char *)recv + (size_t)recv_displs[q] * size, (size_t)recv_counts[q], dt, q, 0, NULL);
    }
    dev->group_end();
}

void neox_alltoallv(neox_comm *c, const void *send, const int *send_counts, const int *send_displs, void *recv,
                    const int *recv_counts, const int *recv_displs, neox_dtype dt) {
    double t0 = neox_now();
    if (NEOX_DEVICE(c, send, recv, "all-to-all of varying counts"))
        device_alltoallv(c, send, send_counts, send_displs, recv, recv_counts, recv_displs, dt);
    else WAITED(c, NEOX_COMM_ALLTOALL, MPI_Alltoallv, MPI_Ialltoallv, send, send_counts, send_displs, neox_mpi_type(dt),
                recv, recv_counts, recv_displs, neox_mpi_type(dt), c->mpi);
    size_t total = 0, away = 0;
    for (int r = 0; r < c->size; r++) total += (size_t)send_counts[r], away += r == c->rank ? 0 : (size_t)send_counts[r];
    total *= neox_dtype_size(dt), away *= neox_dtype_size(dt);
    account(c, NEOX_COMM_ALLTOALL, total, neox_now() - t0);
    // The counts say exactly what leaves this rank: that, not the even split's estimate, is sent.
    c->stats.sent[NEOX_COMM_ALLTOALL] += (int64_t)away - (int64_t)(sent_bytes(c, NEOX_COMM_ALLTOALL, total) + 0.5);
}

// MPI_Recv, under the communication timeout when one is set.
static void recv_waited(neox_comm *c, void *p, int n, MPI_Datatype type, int peer, int tag) {
    if (neox_comm_timeout() <= 0) {
        MPI_Recv(p, n, type, peer, tag, c->mpi, MPI_STATUS_IGNORE);
        return;
    }
    MPI_Request req;
    MPI_Irecv(p, n, type, peer, tag, c->mpi, &req);
    neox_comm_wait_mpi(c, &req, NEOX_COMM_RECV);
}

// Point-to-point and broadcast move large buffers in int-sized pieces, in order.
static void chunked(neox_comm *c, neox_comm_op op, void *buf, size_t count, neox_dtype dt, int peer, int tag) {
    size_t esize = neox_dtype_size(dt);
    for (size_t done = 0; done < count;) {
        size_t n = count - done < REDUCE_CHUNK ? count - done : REDUCE_CHUNK;
        char *p = (char *)buf + done * esize;
        if (op == NEOX_COMM_BROADCAST) WAITED(c, op, MPI_Bcast, MPI_Ibcast, p, (int)n, neox_mpi_type(dt), peer, c->mpi);
        else if (op == NEOX_COMM_SEND) WAITED(c, op, MPI_Send, MPI_Isend, p, (int)n, neox_mpi_type(dt), peer, tag, c->mpi);
        else recv_waited(c, p, (int)n, neox_mpi_type(dt), peer, tag);
        done += n;
    }
}

void neox_broadcast(neox_comm *c, void *buf, size_t count, neox_dtype dt, int root) {
    double t0 = neox_now();
    if (NEOX_DEVICE(c, buf, NULL, "broadcast")) neox_device_comm_active->broadcast(c, buf, count, dt, root);
    else if (c->size > 1) chunked(c, NEOX_COMM_BROADCAST, buf, count, dt, root, 0);
    account(c, NEOX_COMM_BROADCAST, count * neox_dtype_size(dt), neox_now() - t0);
}

void neox_send(neox_comm *c, const void *buf, size_t count, neox_dtype dt, int dest, int tag) {
    double t0 = neox_now();
    if (NEOX_DEVICE(c, buf, NULL, "send")) neox_device_comm_active->p2p(c, (void *)buf, count, dt, dest, 1, NULL);
    else chunked(c, NEOX_COMM_SEND, (void *)buf, count, dt, dest, tag);
    account(c, NEOX_COMM_SEND, count * neox_dtype_size(dt), neox_now() - t0);
}

void neox_recv(neox_comm *c, void *buf, size_t count, neox_dtype dt, int source, int tag) {
    double t0 = neox_now();
    if (NEOX_DEVICE(c, buf, NULL, "recv")) neox_device_comm_active->p2p(c, buf, count, dt, source, 0, NULL);
    else chunked(c, NEOX_COMM_RECV, buf, count, dt, source, tag);
    account(c, NEOX_COMM_RECV, count * neox_dtype_size(dt), neox_now() - t0);
}

void neox_reduce_sum(neox_comm *c, void *buf, size_t count, neox_dtype dt, int root) {
    double t0 = neox_now();
    size_t esize = neox_dtype_size(dt);
    if (NEOX_DEVICE(c, buf, NULL, "reduce")) neox_device_comm_active->reduce(c, buf, count, dt, root);
    else
        for (size_t done = 0; done < count && c->size > 1;) {
            size_t n = count - done < REDUCE_CHUNK ? count - done : REDUCE_CHUNK;
            char *p = (char *)buf + done * esize;
            WAITED(c, NEOX_COMM_REDUCE, MPI_Reduce, MPI_Ireduce, c->rank == root ? MPI_IN_PLACE : p, p, (int)n, neox_mpi_type(dt),
                   neox_mpi_sum_op(dt), root, c->mpi);
            done += n;
        }
    account(c, NEOX_COMM_REDUCE, count * esize, neox_now() - t0);
}

void neox_barrier(neox_comm *c) {
    double t0 = neox_now();
    WAITED(c, NEOX_COMM_BARRIER, MPI_Barrier, MPI_Ibarrier, c->mpi);
    account(c, NEOX_COMM_BARRIER, 0, neox_now() - t0);
}

// ---- non-blocking -----------------------------------------------------------------------------

// A count MPI cannot take ends the job like any failure of a collective (parallel.h): a collective has
// no error to return, and every rank reaches it with the same count, so every rank stops here.
static void need_int(size_t count, const char *what) {
    if (count > INT_MAX) neox_die(NEOX_EXIT_FAILURE, "non-blocking %s of %zu elements is too large", what, count);
}

static void start(neox_request *req, neox_comm *c, neox_comm_op op, size_t bytes) {
    req->comm = c;
    req->op = op;
    req->active = 1;
    req->size_row = account(c, op, bytes, 0.0);
}

// Each non-blocking call clears req->device first: an MPI request has none, a device one gets its own.
void neox_iallreduce_sum(neox_comm *c, void *buf, size_t count, neox_dtype dt, neox_request *req) {
    req->device = NULL;
    if (NEOX_DEVICE(c, buf, NULL, "all-reduce")) {
        neox_device_comm_active->allreduce(c, buf, count, dt, 0, req);
    } else {
        need_int(count, "all-reduce");
        MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, neox_mpi_type(dt), neox_mpi_sum_op(dt), c->mpi, &req->mpi);
    }
    start(req, c, NEOX_COMM_ALLREDUCE, count * neox_dtype_size(dt));
}

void neox_ireduce_scatter_sum(neox_comm *c, const void *send, void *recv, size_t recv_count, neox_dtype dt,
                              neox_request *req) {
    req->device = NULL;
    if (NEOX_DEVICE(c, send, recv, "reduce-scatter")) {
        neox_device_comm_active->reduce_scatter(c, send, recv, recv_count, dt, req);
    } else {
        need_int(recv_count, "reduce-scatter");
        MPI_Ireduce_scatter_block(send, recv, (int)recv_count, neox_mpi_type(dt), neox_mpi_sum_op(dt), c->mpi, &req->mpi);
    }
    start(req, c, NEOX_COMM_REDUCE_SCATTER, recv_count * c->size * neox_dtype_size(dt));
}

void neox_ireduce_sum(neox_comm *c, void *buf, size_t count, neox_dtype dt, int root, neox_request *req) {
    req->device = NULL;
    need_int(count, "reduce");
    MPI_Ireduce(c->rank == root ? MPI_IN_PLACE : buf, buf, (int)count, neox_mpi_type(dt), neox_mpi_sum_op(dt), root, c->mpi, &req->mpi);
    start(req, c, NEOX_COMM_REDUCE, count * neox_dtype_size(dt));
}

void neox_ibroadcast(neox_comm *c, void *buf, size_t count, neox_dtype dt, int root, neox_request *req) {
    req->device = NULL;
    need_int(count, "broadcast");
    MPI_Ibcast(buf, (int)count, neox_mpi_type(dt), root, c->mpi, &req->mpi);
    start(req, c, NEOX_COMM_BROADCAST, count * neox_dtype_size(dt));
}

void neox_iallgather(neox_comm *c, const void *send, void *recv, size_t send_count, neox_dtype dt, neox_request *req) {
    req->device = NULL;
    if (NEOX_DEVICE(c, send, recv, "all-gather")) {
        neox_device_comm_active->allgather(c, send, recv, send_count, dt, req);
    } else {
        need_int(send_count, "all-gather");
        MPI_Iallgather(send, (int)send_count, neox_mpi_type(dt), recv, (int)send_count, neox_mpi_type(dt), c->mpi, &req->mpi);
    }
    start(req, c, NEOX_COMM_ALLGATHER, send_count * c->size * neox_dtype_size(dt));
}

// counts and displs must stay unchanged until the request completes (MPI reads them while it runs).
// On the device the table's all-gather is stream-ordered (the compute stream's later work waits for
// it, the host does not), which is what the request promised: it completes at once; the device's
// form takes the ranks' parts packed in rank order, so displs must be the running sum of counts.
void neox_iallgatherv_inplace(neox_comm *c, void *buf, const int *counts, const int *displs, neox_dtype dt,
                              neox_request *req) {
    size_t total = 0;
    int packed = 1;
    for (int r = 0; r < c->size; r++) packed &= counts[r] == 0 || (size_t)displs[r] == total, total += (size_t)counts[r];
    req->device = NULL;
    if (NEOX_DEVICE(c, buf, NULL, "all-gather")) {
        neox_assert(packed, "non-blocking all-gather of varying counts on the %s group: device parts must be packed",
                    c->name);
        neox_device_comm_active->allgatherv_inplace(c, buf, counts, dt);
        req->mpi = MPI_REQUEST_NULL;
    } else {
        MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, neox_mpi_type(dt), c->mpi, &req->mpi);
    }
    start(req, c, NEOX_COMM_ALLGATHER, total * neox_dtype_size(dt));
}

// On the device send must be a buffer (not MPI_IN_PLACE); recv may lie inside it at this rank's
// offset, which reduces in place (device_comm.h).
void neox_ireduce_scatterv_sum(neox_comm *c, const void *send, void *recv, const int *counts, neox_dtype dt,
                               neox_request *req) {
    size_t total = 0;
    for (int i = 0; i < c->size; i++) total += (size_t)counts[i];
    req->device = NULL;
    if (NEOX_DEVICE(c, send, recv, "reduce-scatter")) neox_device_comm_active->reduce_scatterv(c, send, recv, counts, dt, req);
    else MPI_Ireduce_scatter(send, recv, counts, neox_mpi_type(dt), neox_mpi_sum_op(dt), c->mpi, &req->mpi);
    start(req, c, NEOX_COMM_REDUCE_SCATTER, total * neox_dtype_size(dt));
}

// NCCL has no tags: on the device, messages between two ranks match in the order they are issued.
void neox_isend(neox_comm *c, const void *buf, size_t count, neox_dtype dt, int dest, int tag, neox_request *req) {
    req->device = NULL;
    if (NEOX_DEVICE(c, buf, NULL, "send")) {
        neox_device_comm_active->p2p(c, (void *)buf, count, dt, dest, 1, req);
    } else {
        need_int(count, "send");
        MPI_Isend(buf, (int)count, neox_mpi_type(dt), dest, tag, c->mpi, &req->mpi);
    }
    start(req, c, NEOX_COMM_SEND, count * neox_dtype_size(dt));
}

void neox_irecv(neox_comm *c, void *buf, size_t count, neox_dtype dt, int source, int tag, neox_request *req) {
    req->device = NULL;
    if (NEOX_DEVICE(c, buf, NULL, "recv")) {
        neox_device_comm_active->p2p(c, buf, count, dt, source, 0, req);
    } else {
        need_int(count, "recv");
        MPI_Irecv(buf, (int)count, neox_mpi_type(dt), source, tag, c->mpi, &req->mpi);
    }
    start(req, c, NEOX_COMM_RECV, count * neox_dtype_size(dt));
}

// Waits by polling with MPI_Test and yielding the core between polls, where MPI_Wait would spin:
// CPU ranks often share cores (with each other or other work), and a rank waiting for a peer
// should let that peer run. Measured with dp2 on a loaded 2-core machine: the overlapped gradient
// reduction's exposed time fell 2.4-3.8x (bench/parallel.sh; docs/parallel.md). With a core to
// itself sched_yield returns at once and this is MPI_Wait's spin.
void neox_wait(neox_request *req) {
    if (!req->active) return;
    double t0 = neox_now();
    if (NEOX_DEVICE_REQUEST(req)) {
        neox_device_comm_active->wait(req);  // the compute stream waits; the host does not
    } else {
        neox_comm_wait_mpi(req->comm, &req->mpi, req->op);
    }
    double seconds = neox_now() - t0;
    if (neox_trace_on) neox_trace_complete_at(neox_comm_op_name(req->op), req->comm->name, t0, seconds, -1, 1);
    req->comm->stats.seconds[req->op] += seconds;
    req->comm->stats.sizes[req->op][req->size_row].seconds += seconds;
    req->active = 0;
}

int neox_test(neox_request *req) {
    if (!req->active) return 1;
    int done = 0;
    if (NEOX_DEVICE_REQUEST(req)) done = neox_device_comm_active->test(req);
    else MPI_Test(&req->mpi, &done, MPI_STATUS_IGNORE);
    if (done) req->active = 0;
    return done;
}
