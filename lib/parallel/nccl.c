// nccl.c: NCCL behind the communication layer's device table (CUDA builds; a CPU build has only the
// refusal at the end). neox_grid_enable_device gives every group of the grid an NCCL communicator,
// made from an ncclUniqueId that the group's rank 0 creates and broadcasts over the group's MPI
// communicator, and the process one communication stream, and makes this file's table the active
// one: collectives.c sends each call whose buffers are device memory here (device_comm.h).
//
// Ordering without host waits: before an operation the communication stream waits for an event
// recorded on the compute stream (neox_cuda_stream()), so the operation sees every kernel queued
// before it; after it an event is recorded on the communication stream. A blocking call makes the
// compute stream wait for that event; a non-blocking one keeps it in the request, and neox_wait makes
// the compute stream wait for it (neox_test queries it). The host never waits for the GPU here.
//
// Every NCCL operation of the process runs on the one communication stream, in issue order: NCCL
// asks that operations on different communicators not run concurrently, and one stream also keeps
// the order the same as the MPI code's. The cost: a send occupies the stream until its peer's
// receive runs, where an MPI_Isend returns at once. So that MPI-style code (1F1B's isend of
// activations followed by the receive of a gradient, on both sides of a stage boundary) does not
// deadlock, a non-blocking send is held back and launched together with the process's next receive
// (one NCCL group: they progress together), or on its own just before any other NCCL operation, or
// when it is waited for or tested. Explicit groups: neox_group_begin/end.
//
// No job hangs forever (comm_timeout_seconds): the communicators are non-blocking (ncclConfig_t
// blocking 0: a call that returns ncclInProgress is settled by polling ncclCommGetAsyncError), and
// every operation outside a group (and every group) records a watch event after it. A watchdog
// thread polls the oldest event and the communicator's asynchronous error; an operation that has not
// finished a timeout after it was issued aborts its communicator (ncclCommAbort) and ends the job
// naming the operation, the group and its world ranks. (Compile-checked; not yet run on a GPU.)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel.h"
#include "parallel/device_comm.h"

#ifdef NEOX_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <pthread.h>
#include <time.h>

#include "kernels/kernels.h"

static cudaStream_t g_stream;         // the communication stream; NULL until enable_device
static cudaEvent_t g_ready, g_done;   // reused: a wait takes the event's latest record when issued
static int g_ncomms;                  // communicators alive (the stream goes with the last)
static int g_grouped;                 // between neox_group_begin and neox_group_end
enum { MAX_PENDING = 256 };
static cudaEvent_t g_pending[MAX_PENDING];  // a group's non-blocking requests' events, recorded at its end
static int g_npending, g_pending_blocking;
enum { MAX_HELD = 64 };
typedef struct held_send {
    neox_comm *c;
    const void *buf;
    size_t count;
    neox_dtype dt;
    int peer;
    cudaEvent_t event;  // the request's (requests are copied by value, like MPI_Request)
} held_send;
static held_send g_held[MAX_HELD];    // non-blocking sends not launched yet (see the top)
static int g_nheld;

// A failed NCCL or CUDA call ends the job (neox_die, through the exit hook's MPI_Abort), as MPI's own
// errors do (parallel.h): the collective's peers are blocked in it, so no error could be returned
// that every rank would see.
static void nccl_ok(ncclResult_t r, const char *call) {
    if (r != ncclSuccess && r != ncclInProgress)
        neox_die(NEOX_EXIT_FAILURE, "NCCL: %s failed: %s (%s)", call, ncclGetErrorString(r), ncclGetLastError(NULL));
}
static void cuda_ok(cudaError_t e, const char *call) {
    if (e != cudaSuccess) neox_die(NEOX_EXIT_FAILURE, "CUDA: %s failed: %s", call, cudaGetErrorString(e));
}
#define NCCL_OK(call) nccl_ok((call), #call)
#define CUDA_OK(call) cuda_ok((call), #call)

static cudaStream_t compute_stream(void) { return (cudaStream_t)neox_cuda_stream(); }

// A group of one rank gets no NCCL communicator (nothing to exchange, and each costs device memory
// and start-up time): its `nccl` is this marker, and its operations are the local copies they
// amount to, queued on the communication stream in the same order as any other operation.
static char g_self;
static int is_self(const neox_comm *c) { return c->device == &g_self; }
static void self_copy(void *dst, const void *src, size_t bytes) {
    if (dst != src && bytes) CUDA_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g_stream));
}
// On such a group a rank can only send to itself: a send waits here, in order, for the receive
// that copies from it (MPI's matching order; sends are queued before their receives).
typedef struct self_send { const void *buf; size_t bytes; } self_send;
enum { MAX_SELF_SENDS = 256 };
static self_send g_self_sends[MAX_SELF_SENDS];
static int g_nself_sends;

static ncclDataType_t nccl_type(neox_dtype dt) {
    switch (dt) {
    case NEOX_F32: return ncclFloat32;
    case NEOX_F64: return ncclFloat64;
    case NEOX_BF16: return ncclBfloat16;  // NCCL 2.10 and later
    case NEOX_F16: return ncclFloat16;
    case NEOX_I32: return ncclInt32;
    case NEOX_I64: return ncclInt64;
    default: return ncclUint8;
    }
}

// Device (or managed) memory; host memory, registered or not, is not.
static int is_device(const void *p) {
    struct cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
        cudaGetLastError();  // an unknown pointer is host memory; clear the error
        return 0;
    }
    return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}


// The communication stream waits for what the compute stream has queued so far.
static void after_compute(void) {
    CUDA_OK(cudaEventRecord(g_ready, compute_stream()));
    CUDA_OK(cudaStreamWaitEvent(g_stream, g_ready, 0));
}

// After an operation (or a group): a request's event is recorded; for a blocking call (NULL) the
// compute stream waits for the communication stream.
static void record(cudaEvent_t event) {
    if (event) {
        CUDA_OK(cudaEventRecord(event, g_stream));
    } else {
        CUDA_OK(cudaEventRecord(g_done, g_stream));
        CUDA_OK(cudaStreamWaitEvent(compute_stream(), g_done, 0));
    }
}

// The held sends, into the NCCL group the caller has open; then their events, after the group.
static void launch_held(void) {
    for (int i = 0; i < g_nheld; i++) {
        held_send *h = &g_held[i];
        NCCL_OK(ncclSend(h->buf, h->count, nccl_type(h->dt), h->peer, (ncclComm_t)h->c->device, g_stream));
    }
}
static void record_held(void) {
    for (int i = 0; i < g_nheld; i++) record(g_held[i].event);
    g_nheld = 0;
}
static void flush_held(void) {
    if (g_nheld == 0) return;
    NCCL_OK(ncclGroupStart());
    launch_held();
    NCCL_OK(ncclGroupEnd());
    record_held();
}

// ---- the watchdog (comm_timeout_seconds) ---------------------------------------------------------
typedef struct watched {
    cudaEvent_t event;  // recorded on the communication stream after the operation
    neox_comm *c;
    const char *what;   // the entry point's name
    double since;       // when it was issued
} watched;
enum { MAX_WATCHED = 1024 };
static watched g_watched[MAX_WATCHED];  // a ring, oldest at g_watch_head
static int g_watch_head, g_nwatched, g_device_id;
static pthread_mutex_t g_watch_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_t g_watchdog;
static int g_watchdog_running;
static neox_comm *g_op_comm;        // the operation in progress (begin .. end)
static const char *g_op_name;

// A non-blocking communicator's call may return ncclInProgress: poll until it has settled.
static void settle(neox_comm *c) {
    if (!c || is_self(c)) return;
    ncclResult_t state = ncclInProgress;
    double deadline = neox_comm_timeout() > 0 ? neox_now() + neox_comm_timeout() : 0;
    while (state == ncclInProgress) {
        NCCL_OK(ncclCommGetAsyncError((ncclComm_t)c->device, &state));
        if (state == ncclInProgress && deadline > 0 && neox_now() > deadline) {
            ncclCommAbort((ncclComm_t)c->device);
            neox_die(NEOX_EXIT_FAILURE, "NCCL: group %s did not settle within %g s (comm_timeout_seconds)", c->name,
                     neox_comm_timeout());
        }
    }
    if (state != ncclSuccess) neox_die(NEOX_EXIT_FAILURE, "NCCL: group %s: %s", c->name, ncclGetErrorString(state));
}

// "0, 1, 3": the world ranks of c's members.
static void world_ranks(const neox_comm *c, char *buf, size_t size) {
    MPI_Group group, world;
    MPI_Comm_group(c->mpi, &group);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    buf[0] = '\0';
    for (int r = 0; r < c->size; r++) {
        int w = -1;
        MPI_Group_translate_ranks(group, 1, &r, world, &w);
        snprintf(buf + strlen(buf), size - strlen(buf), "%s%d", r ? ", " : "", w);
    }
    MPI_Group_free(&group);
    MPI_Group_free(&world);
}

_Noreturn static void timed_out(const watched *w) {
    char ranks[256];
    world_ranks(w->c, ranks, sizeof ranks);
    if (!is_self(w->c)) ncclCommAbort((ncclComm_t)w->c->device);
    const char *what = strncmp(w->what, "neox_nccl_", 10) ? w->what : w->what + 10;
    neox_die(NEOX_EXIT_FAILURE, "NCCL %s on the %s group made no progress for %g s (comm_timeout_seconds): one of its "
             "ranks (world ranks %s) did not join it (stopped, hung or lost); communicator aborted", what, w->c->name,
             neox_comm_timeout(), ranks);
}

// One look at the oldest watched operation: 1 when it finished (and was dropped).
static int check_oldest(void) {
    watched *w = &g_watched[g_watch_head];
    cudaError_t e = cudaEventQuery(w->event);
    if (e == cudaErrorNotReady) {
        ncclResult_t async = ncclSuccess;
        if (!is_self(w->c)) ncclCommGetAsyncError((ncclComm_t)w->c->device, &async);
        if (async != ncclSuccess && async != ncclInProgress)
            neox_die(NEOX_EXIT_FAILURE, "NCCL: group %s: %s", w->c->name, ncclGetErrorString(async));
        if (neox_now() - w->since > neox_comm_timeout()) timed_out(w);
        return 0;
    }
    cuda_ok(e, "cudaEventQuery (a watched NCCL operation)");
    cudaEventDestroy(w->event);
    g_watch_head = (g_watch_head + 1) % MAX_WATCHED;
    g_nwatched--;
    return 1;
}

static void *watchdog(void *arg) {
    (void)arg;
    cudaSetDevice(g_device_id);  // the current device is per thread
    for (;;) {
        pthread_mutex_lock(&g_watch_lock);
        while (g_nwatched > 0 && check_oldest()) {}
        pthread_mutex_unlock(&g_watch_lock);
        nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    }
    return NULL;
}

// After an operation (or a group) on the communication stream: its watch event. With the ring full
// the operation goes unwatched (a thousand operations in flight: the oldest are watched).
static void watch(neox_comm *c, const char *what) {
    if (neox_comm_timeout() <= 0 || !c) return;
    if (!g_watchdog_running) {
        CUDA_OK(cudaGetDevice(&g_device_id));
        g_watchdog_running = pthread_create(&g_watchdog, NULL, watchdog, NULL) == 0;
        if (g_watchdog_running) pthread_detach(g_watchdog);
    }
    pthread_mutex_lock(&g_watch_lock);
    if (g_nwatched < MAX_WATCHED) {
        watched *w = &g_watched[(g_watch_head + g_nwatched) % MAX_WATCHED];
        CUDA_OK(cudaEventCreateWithFlags(&w->event, cudaEventDisableTiming));
        CUDA_OK(cudaEventRecord(w->event, g_stream));
        w->c = c, w->what = what, w->since = neox_now();
        g_nwatched++;
    }
    pthread_mutex_unlock(&g_watch_lock);
}

// Before an operation: held sends go first (issue order), then the wait for the compute stream.
static ncclComm_t begin_op(neox_comm *c, const char *what) {
    flush_held();
    after_compute();
    g_op_comm = c, g_op_name = what;
    return (ncclComm_t)c->device;
}
#define begin(c) begin_op((c), __func__)

// The event exists from the call on (so neox_wait knows an NCCL request), but inside a group it is
// recorded only at neox_group_end, when the operations are actually queued.
static cudaEvent_t new_event(neox_request *req) {
    cudaEvent_t ev;
    CUDA_OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    req->device = ev;
    return ev;
}
static void end(neox_request *req) {
    cudaEvent_t ev = req ? new_event(req) : NULL;
    if (!g_grouped) {  // (inside a group nothing is launched before neox_group_end, which settles)
        settle(g_op_comm);
        record(ev);
        watch(g_op_comm, g_op_name);
    } else if (ev) {
        neox_assert(g_npending < MAX_PENDING, "neox_group_begin/end: more than %d non-blocking operations", MAX_PENDING);
        g_pending[g_npending++] = ev;
    } else {
        g_pending_blocking = 1;
    }
}

// (collectives.c checks the nesting.)
static void nccl_group_begin(void) {
    if (g_stream) {
        flush_held();
        NCCL_OK(ncclGroupStart());
    }
    g_grouped = 1;
}

static void nccl_group_end(void) {
    g_grouped = 0;
    if (!g_stream) return;
    NCCL_OK(ncclGroupEnd());
    settle(g_op_comm);
    watch(g_op_comm, "group of operations");
    for (int i = 0; i < g_npending; i++) record(g_pending[i]);
    if (g_pending_blocking) record(NULL);
    g_npending = g_pending_blocking = 0;
}

// ---- operations -------------------------------------------------------------------------------

static void neox_nccl_allreduce(neox_comm *c, void *buf, size_t count, neox_dtype dt, int max, neox_request *req) {
    ncclComm_t nc = begin(c);
    if (!is_self(c)) NCCL_OK(ncclAllReduce(buf, buf, count, nccl_type(dt), max ? ncclMax : ncclSum, nc, g_stream));
    end(req);
}

static void neox_nccl_reduce_scatter(neox_comm *c, const void *send, void *recv, size_t recv_count, neox_dtype dt,
                              neox_request *req) {
    ncclComm_t nc = begin(c);
    if (is_self(c)) self_copy(recv, send, recv_count * neox_dtype_size(dt));
    else NCCL_OK(ncclReduceScatter(send, recv, recv_count, nccl_type(dt), ncclSum, nc, g_stream));
    end(req);
}

// One ncclReduce per rank, rooted there, fused into one launch; zero counts (the same on every
// rank) are skipped.
static void neox_nccl_reduce_scatterv(neox_comm *c, const void *send, void *recv, const int *counts, neox_dtype dt,
                               neox_request *req) {
    ncclComm_t nc = begin(c);
    size_t esize = neox_dtype_size(dt), at = 0;
    if (is_self(c)) {
        self_copy(recv, send, (size_t)counts[0] * esize);
        end(req);
        return;
    }
    NCCL_OK(ncclGroupStart());
    for (int q = 0; q < c->size; q++) {
        const char *part = (const char *)send + at * esize;
        if (counts[q] > 0)
            NCCL_OK(ncclReduce(part, q == c->rank ? recv : (void *)part, (size_t)counts[q], nccl_type(dt), ncclSum, q,
                               nc, g_stream));
        at += (size_t)counts[q];
    }
    NCCL_OK(ncclGroupEnd());
    end(req);
}

static void neox_nccl_allgather(neox_comm *c, const void *send, void *recv, size_t send_count, neox_dtype dt,
                         neox_request *req) {
    ncclComm_t nc = begin(c);
    if (is_self(c)) self_copy(recv, send, send_count * neox_dtype_size(dt));
    else NCCL_OK(ncclAllGather(send, recv, send_count, nccl_type(dt), nc, g_stream));
    end(req);
}

// Each rank broadcasts its own part in place, all in one launch.
static void neox_nccl_allgatherv_inplace(neox_comm *c, void *buf, const int *counts, neox_dtype dt) {
    ncclComm_t nc = begin(c);
    size_t esize = neox_dtype_size(dt), at = 0;
    if (is_self(c)) {  // one part, already in place
        end(NULL);
        return;
    }
    NCCL_OK(ncclGroupStart());
    for (int q = 0; q < c->size; q++) {
        char *part = (char *)buf + at * esize;
        if (counts[q] > 0) NCCL_OK(ncclBroadcast(part, part, (size_t)counts[q], nccl_type(dt), q, nc, g_stream));
        at += (size_t)counts[q];
    }
    NCCL_OK(ncclGroupEnd());
    end(NULL);
}

static void neox_nccl_broadcast(neox_comm *c, void *buf, size_t count, neox_dtype dt, int root) {
    ncclComm_t nc = begin(c);
    if (!is_self(c)) NCCL_OK(ncclBroadcast(buf, buf, count, nccl_type(dt), root, nc, g_stream));
    end(NULL);
}

static void neox_nccl_reduce(neox_comm *c, void *buf, size_t count, neox_dtype dt, int root) {
    ncclComm_t nc = begin(c);
    if (!is_self(c)) NCCL_OK(ncclReduce(buf, buf, count, nccl_type(dt), ncclSum, root, nc, g_stream));
    end(NULL);
}

// A send and a receive per peer (this rank included), fused.
static void neox_nccl_alltoall(neox_comm *c, const void *send, void *recv, size_t block_count, neox_dtype dt) {
    ncclComm_t nc = begin(c);
    size_t block = block_count * neox_dtype_size(dt);
    if (is_self(c)) {
        self_copy(recv, send, block);
        end(NULL);
        return;
    }
    NCCL_OK(ncclGroupStart());
    for (int q = 0; q < c->size; q++) {
        NCCL_OK(ncclSend((const char *)send + q * block, block_count, nccl_type(dt), q, nc, g_stream));
        NCCL_OK(ncclRecv((char *)recv + q * block, block_count, nccl_type(dt), q, nc, g_stream));
    }
    NCCL_OK(ncclGroupEnd());
    end(NULL);
}

// A non-blocking send outside a group is held (see the top); a receive takes the held sends into
// its launch.
static void self_p2p(neox_comm *c, void *buf, size_t bytes, int send, neox_request *req) {
    begin(c);
    if (send) {
        neox_assert(g_nself_sends < MAX_SELF_SENDS, "send on group %s: more than %d sends to itself without their receives",
                    c->name, MAX_SELF_SENDS);
        g_self_sends[g_nself_sends++] = (self_send){buf, bytes};
    } else {
        neox_assert(g_nself_sends > 0, "recv on group %s (one rank): no send to itself before it", c->name);
        self_send first = g_self_sends[0];
        neox_assert(first.bytes == bytes, "recv on group %s (one rank): %zu bytes expected, the send has %zu", c->name, bytes,
                    first.bytes);
        self_copy(buf, first.buf, bytes);
        memmove(g_self_sends, g_self_sends + 1, (size_t)--g_nself_sends * sizeof *g_self_sends);
    }
    end(req);
}

static void neox_nccl_p2p(neox_comm *c, void *buf, size_t count, neox_dtype dt, int peer, int send, neox_request *req) {
    if (is_self(c)) {
        (void)peer;  // the only rank: itself
        self_p2p(c, buf, count * neox_dtype_size(dt), send, req);
        return;
    }
    if (send && req && !g_grouped) {
        if (g_nheld == MAX_HELD) flush_held();
        after_compute();  // the send reads buf as it is now, whenever it is launched
        g_held[g_nheld++] = (held_send){c, buf, count, dt, peer, new_event(req)};  // recorded at launch
        return;
    }
    if (!send && g_nheld > 0 && !g_grouped) {
        after_compute();
        g_op_comm = c, g_op_name = __func__;
        NCCL_OK(ncclGroupStart());
        launch_held();
        NCCL_OK(ncclRecv(buf, count, nccl_type(dt), peer, (ncclComm_t)c->device, g_stream));
        NCCL_OK(ncclGroupEnd());
        record_held();
        end(req);
        return;
    }
    ncclComm_t nc = begin(c);
    if (send) NCCL_OK(ncclSend(buf, count, nccl_type(dt), peer, nc, g_stream));
    else NCCL_OK(ncclRecv(buf, count, nccl_type(dt), peer, nc, g_stream));
    end(req);
}

// ---- requests ---------------------------------------------------------------------------------

static void neox_nccl_wait(neox_request *req) {
    neox_assert(!g_grouped, "neox_wait inside neox_group_begin/end: the group has not started");
    flush_held();  // req may be a held send
    cudaEvent_t ev = (cudaEvent_t)req->device;
    CUDA_OK(cudaStreamWaitEvent(compute_stream(), ev, 0));
    CUDA_OK(cudaEventDestroy(ev));  // released once the wait is done with it
    req->device = NULL;
}

static int neox_nccl_test(neox_request *req) {
    if (g_grouped) return 0;
    flush_held();
    cudaError_t e = cudaEventQuery((cudaEvent_t)req->device);
    if (e == cudaErrorNotReady) {
        // Still running: report a failed peer or network instead of letting the caller poll forever.
        ncclResult_t async = ncclSuccess;
        if (!is_self(req->comm)) NCCL_OK(ncclCommGetAsyncError((ncclComm_t)req->comm->device, &async));
        if (async != ncclSuccess && async != ncclInProgress)
            neox_die(NEOX_EXIT_FAILURE, "NCCL: group %s: %s", req->comm->name, ncclGetErrorString(async));
        return 0;
    }
    CUDA_OK(e);
    neox_nccl_wait(req);
    return 1;
}

// ---- communicators ----------------------------------------------------------------------------

static void init_comm(neox_comm *c) {
    g_ncomms++;
    if (c->size == 1) {
        c->device = &g_self;
        return;
    }
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (c->rank == 0) NCCL_OK(ncclGetUniqueId(&id));
    MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, c->mpi);
    ncclComm_t nc;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // calls return at once; settle() and the watchdog bound every wait
    NCCL_OK(ncclCommInitRankConfig(&nc, c->size, id, c->rank, &config));
    c->device = nc;
    settle(c);
}

static void neox_nccl_comm_free(neox_comm *c) {
    if (!c->device) return;
    flush_held();
    CUDA_OK(cudaStreamSynchronize(g_stream));
    if (!is_self(c)) NCCL_OK(ncclCommDestroy((ncclComm_t)c->device));
    c->device = NULL;
    if (--g_ncomms == 0) {
        CUDA_OK(cudaEventDestroy(g_ready));
        CUDA_OK(cudaEventDestroy(g_done));
        CUDA_OK(cudaStreamDestroy(g_stream));
        g_stream = NULL;
    }
}

// This rank's GPU: its rank among the ranks of its node. Every rank learns whether all succeeded,
// so that none goes on into ncclCommInitRank waiting for one that stopped.
static int choose_device(neox_grid *g, neox_error *err) {
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g->world_rank, MPI_INFO_NULL, &node);
    int local, local_size, count = neox_cuda_device_count();
    MPI_Comm_rank(node, &local);
    MPI_Comm_size(node, &local_size);
    MPI_Comm_free(&node);
    int bad = count < 1 ? 1 : local_size > count ? 2 : neox_cuda_init(local) != 0 ? 3 : 0, worst = 0;
    MPI_Allreduce(&bad, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (worst == 1) return neox_fail(err, NEOX_EXIT_FAILURE, "device communication: no CUDA device visible on some node");
    if (worst == 2)
        return neox_fail(err, NEOX_EXIT_USAGE,
                         "device communication: %d ranks on this node for %d GPU(s); NCCL needs a GPU of its own for "
                         "each rank (start at most one rank per GPU)", local_size, count);
    if (worst == 3) return neox_fail(err, NEOX_EXIT_FAILURE, "device communication: a rank could not start its GPU");
    return 0;
}

static const neox_device_comm nccl_table = {
    .name = "NCCL",
    .owns = is_device,
    .allreduce = neox_nccl_allreduce,
    .reduce_scatter = neox_nccl_reduce_scatter,
    .reduce_scatterv = neox_nccl_reduce_scatterv,
    .allgather = neox_nccl_allgather,
    .allgatherv_inplace = neox_nccl_allgatherv_inplace,
    .broadcast = neox_nccl_broadcast,
    .reduce = neox_nccl_reduce,
    .alltoall = neox_nccl_alltoall,
    .p2p = neox_nccl_p2p,
    .wait = neox_nccl_wait,
    .test = neox_nccl_test,
    .group_begin = nccl_group_begin,
    .group_end = nccl_group_end,
    .comm_free = neox_nccl_comm_free,
};

int neox_grid_enable_device(neox_grid *g, neox_error *err) {
    if (neox_device_comm_active && neox_device_comm_active != &nccl_table)
        return neox_fail(err, NEOX_EXIT_USAGE, "device communication: %s already carries this process's device buffers",
                         neox_device_comm_active->name);
    if (choose_device(g, err) != 0) return -1;
    neox_device_comm_active = &nccl_table;
    if (!g_stream) {
        int least, greatest;  // NCCL kernels first when compute kernels also wait for the SMs
        CUDA_OK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
        CUDA_OK(cudaStreamCreateWithPriority(&g_stream, cudaStreamNonBlocking, greatest));
        CUDA_OK(cudaEventCreateWithFlags(&g_ready, cudaEventDisableTiming));
        CUDA_OK(cudaEventCreateWithFlags(&g_done, cudaEventDisableTiming));
    }
    // The same order on every rank: each group's members all reach it after the groups before it.
    neox_comm *comms[] = {&g->world, &g->pipe, &g->data, &g->model, &g->embed, &g->data_intra, &g->data_inter,
                          &g->expert, &g->expert_data, &g->context};
    for (int i = 0; i < 10; i++)
        if (comms[i]->size >= 1 && !comms[i]->device) init_comm(comms[i]);  // one-rank groups: no NCCL (is_self)
    int version = 0;
    ncclGetVersion(&version);
    if (g->world_rank == 0) neox_info("device communication: NCCL %d, one communicator per group of 2 or more ranks", version);
    return 0;
}

#else  // a CPU build: no device communication

int neox_grid_enable_device(neox_grid *g, neox_error *err) {
    (void)g;
    return neox_fail(err, NEOX_EXIT_USAGE, "device communication: this build has no CUDA (build with make CUDA=1)");
}

#endif
