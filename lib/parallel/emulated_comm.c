// emulated_comm.c: the emulated device's twin of NCCL (compute_backend: emulated on many ranks). It
// fills the device table (device_comm.h) with operations that keep the emulated device's rules
// (kernels/cpu/emulated.c): its memory is PROT_NONE outside its own entry points, so a collective is
// queued on the device's stream and runs only when the device would have to have run it, through
// MPI on host copies of the device memory, opened for the run. Strictly as late as a device could:
//  - a blocking operation runs when the next op or stream-ordered memory entry point of the device
//    reaches it (the hook this file gives the device), or at synchronize;
//  - a non-blocking one once neox_wait has made the stream wait for it and an op reaches it, or when
//    neox_test asks (or synchronize); always in the order queued, as on one communication stream;
//  - a call that touches memory a queued operation touches runs that operation (and those before
//    it) first: the device's one communication stream would order them.
// Until it runs an operation's outputs read NaN (filled at the call), and every buffer it reads or
// writes is checksummed at the call and again at the run: a change in between (a kernel that did not
// wait for it, a host write) stops the process naming the operation. A send leaves from a copy taken
// at the call (MPI_Isend, owned here until MPI is done with it), so MPI-style isend-then-recv code
// (1F1B) cannot deadlock. Before the host blocks in an MPI wait of its own, the operations the
// stream has reached run (a device's stream runs them while its host waits; a peer blocked in them
// would otherwise wait for this rank's host forever). Each group's device communicator is a
// duplicate of its MPI one: device messages never match host ones. Every wait polls under
// comm_timeout_seconds (comm_timeout.c).
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "parallel.h"
#include "parallel/device_comm.h"

enum { MAX_SPANS = 2 };
typedef struct span {
    char *p;
    size_t bytes;
} span;

typedef struct queued_op queued_op;
struct queued_op {
    neox_comm *c;
    neox_comm_op op;
    const char *what;     // the operation as messages name it ("all-reduce max")
    neox_dtype dt;
    size_t count;         // elements per call (per block, per rank: as the entry point takes them)
    int *counts;          // a rank's counts (the v-forms; owned), else NULL
    int peer, max;        // root or peer; all-reduce max
    size_t payload;       // the bytes the accounting counted at the call
    char *stage;          // host copy the MPI operation runs on (owned)
    size_t stage_bytes;
    void *out;            // where the result lands (NULL: nowhere on this rank)
    size_t out_offset, out_bytes;  // the result's place in stage and its size
    span spans[MAX_SPANS];
    uint64_t hashes[MAX_SPANS];
    int nspans;
    int nonblocking, waited, done;
    MPI_Request send;     // a send: started at the call
    queued_op *next;
};

// Sends whose run has passed but whose MPI_Isend is still going: their copies live until it ends.
typedef struct flight {
    neox_comm *c;
    MPI_Request req;
    char *stage;
    struct flight *next;
} flight;

static queued_op *queue_head, *queue_tail;
static flight *flights;
static int running;  // inside run_through: its own MPI waits must not run the queue again

static MPI_Comm dev_mpi(const neox_comm *c) { return *(MPI_Comm *)c->device; }

static uint64_t hash_bytes(const void *p, size_t bytes) {
    const unsigned char *c = p;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < bytes; i++) h = (h ^ c[i]) * 0x100000001b3ULL;
    return h;
}

static int overlaps(span a, span b) { return a.bytes && b.bytes && a.p < b.p + b.bytes && b.p < a.p + a.bytes; }

static int need_int(size_t n, const queued_op *q) {
    if (n > INT_MAX)
        neox_die(NEOX_EXIT_FAILURE, "%s on the %s group: %zu elements are more than MPI takes in one call on the "
                 "emulated device", q->what, q->c->name, n);
    return (int)n;
}

// ---- running ------------------------------------------------------------------------------------

static void finish_flights(int wait) {
    for (flight **f = &flights; *f;) {
        int done = 0;
        if (wait) neox_comm_wait_mpi((*f)->c, &(*f)->req, NEOX_COMM_SEND), done = 1;
        else MPI_Test(&(*f)->req, &done, MPI_STATUS_IGNORE);
        if (!done) {
            f = &(*f)->next;
            continue;
        }
        flight *gone = *f;
        *f = gone->next;
        free(gone->stage);
        free(gone);
    }
}

static void check_unchanged(const queued_op *q) {
    for (int i = 0; i < q->nspans; i++)
        if (hash_bytes(q->spans[i].p, q->spans[i].bytes) != q->hashes[i])
            neox_die(NEOX_EXIT_FAILURE, "emulated device: a buffer of %s on the %s group (%zu bytes at %p) changed between "
                     "the call and when the device ran it: a kernel or copy wrote it without waiting for the collective",
                     q->what, q->c->name, q->spans[i].bytes, (void *)q->spans[i].p);
}

// displs of counts, in elements (the v-forms).
static int *displacements(const queued_op *q) {
    int *d = neox_malloc((size_t)q->c->size * sizeof *d);
    size_t at = 0;
    for (int r = 0; r < q->c->size; r++) d[r] = need_int(at, q), at += (size_t)q->counts[r];
    return d;
}

// Starts the MPI operation of q on its copy; returns the request to wait for (MPI_REQUEST_NULL for a
// send, already started at the call).
static MPI_Request start_mpi(queued_op *q) {
    MPI_Comm comm = dev_mpi(q->c);
    MPI_Datatype type = neox_mpi_type(q->dt);
    MPI_Op sum = neox_mpi_sum_op(q->dt);
    MPI_Request req = MPI_REQUEST_NULL;
    int n = need_int(q->count, q), *displs = NULL;
    switch (q->op) {
    case NEOX_COMM_ALLREDUCE:
        MPI_Iallreduce(MPI_IN_PLACE, q->stage, n, type, q->max ? MPI_MAX : sum, comm, &req);
        break;
    case NEOX_COMM_REDUCE_SCATTER:
        if (q->counts) MPI_Ireduce_scatter(MPI_IN_PLACE, q->stage, q->counts, type, sum, comm, &req);
        else MPI_Ireduce_scatter_block(MPI_IN_PLACE, q->stage, n, type, sum, comm, &req);
        break;
    case NEOX_COMM_ALLGATHER:
        if (q->counts) {
            displs = displacements(q);
            MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, q->stage, q->counts, displs, type, comm, &req);
        } else {
            MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, q->stage, n, type, comm, &req);
        }
        break;
    case NEOX_COMM_BROADCAST: MPI_Ibcast(q->stage, n, type, q->peer, comm, &req); break;
    case NEOX_COMM_REDUCE:
        MPI_Ireduce(q->c->rank == q->peer ? MPI_IN_PLACE : q->stage, q->stage, n, type, sum, q->peer, comm, &req);
        break;
    case NEOX_COMM_ALLTOALL:
        MPI_Ialltoall(q->stage, n, type, q->stage + q->out_offset, n, type, comm, &req);
        break;
    case NEOX_COMM_RECV: MPI_Irecv(q->stage, n, type, q->peer, 0, comm, &req); break;
    default: break;  // a send: started at the call
    }
    if (req != MPI_REQUEST_NULL) neox_comm_wait_mpi(q->c, &req, q->op);
    free(displs);  // (MPI reads displs only until the operation completes)
    return req;
}

// Runs the front of the queue (memory open).
static void run_front(void) {
    queued_op *q = queue_head;
    queue_head = q->next;
    if (!queue_head) queue_tail = NULL;
    double t0 = neox_now();
    check_unchanged(q);
    start_mpi(q);
    if (q->out && q->out_bytes) memcpy(q->out, q->stage + q->out_offset, q->out_bytes);
    neox_comm_add_seconds(q->c, q->op, q->payload, neox_now() - t0);
    if (q->op == NEOX_COMM_SEND) {
        flight *f = neox_malloc(sizeof *f);
        *f = (flight){q->c, q->send, q->stage, flights};
        flights = f;
        q->stage = NULL;
    }
    free(q->stage);
    free(q->counts);
    q->stage = NULL, q->counts = NULL, q->done = 1;
    if (!q->nonblocking || q->waited) free(q);  // else its request frees it
}

// Runs the queue up to and including last (in order); NULL: nothing.
static void run_through(const queued_op *last) {
    if (!last) return;
    running = 1;
    neox_emulated_open();
    for (int stop = 0; !stop;) {
        stop = queue_head == last;
        run_front();
    }
    neox_emulated_close();
    finish_flights(0);
    running = 0;
}

// The device's hook: what the stream has reached (blocking operations, and waited non-blocking
// ones, with everything before them), or everything at synchronize.
static void reach(int everything) {
    const queued_op *last = NULL;
    for (const queued_op *q = queue_head; q; q = q->next)
        if (everything || !q->nonblocking || q->waited) last = q;
    run_through(last);
}

// The host is about to block in an MPI wait that is not the twin's own.
static void before_host_wait(void) {
    if (!running) reach(0);
}

// ---- queueing -----------------------------------------------------------------------------------

static queued_op *new_op(neox_comm *c, neox_comm_op op, const char *what, neox_dtype dt, size_t count) {
    queued_op *q = neox_calloc(1, sizeof *q);
    *q = (queued_op){.c = c, .op = op, .what = what, .dt = dt, .count = count, .send = MPI_REQUEST_NULL};
    return q;
}

static void watch(queued_op *q, const void *p, size_t bytes) {
    for (int i = 0; i < q->nspans; i++)
        if (q->spans[i].p == p && q->spans[i].bytes == bytes) return;
    q->spans[q->nspans++] = (span){(char *)p, bytes};
}

// The host copy the operation runs on: stage_bytes, starting with `bytes` of src (NULL: none).
static void stage_from(queued_op *q, size_t stage_bytes, const void *src, size_t bytes) {
    q->stage = neox_calloc(stage_bytes ? stage_bytes : 1, 1);
    q->stage_bytes = stage_bytes;
    if (src && bytes) memcpy(q->stage, src, bytes);
}

static void set_output(queued_op *q, void *out, size_t offset, size_t bytes) {
    q->out = out, q->out_offset = offset, q->out_bytes = bytes;
}

// Whether a queued operation touches memory q touches: the last such one (it runs first).
static const queued_op *last_conflict(const queued_op *q) {
    const queued_op *last = NULL;
    for (const queued_op *o = queue_head; o; o = o->next)
        for (int i = 0; i < o->nspans; i++)
            for (int j = 0; j < q->nspans; j++)
                if (overlaps(o->spans[i], q->spans[j])) last = o;
    return last;
}

// Stages q's inputs (fill_stage, with the memory open), fills its outputs with NaN bytes, checksums
// its buffers and queues it; a non-blocking one's request gets it. (Called once q's spans are set.)
typedef void (*stager)(queued_op *q, void *ctx);
static void enqueue(queued_op *q, stager fill_stage, void *ctx, neox_request *req) {
    run_through(last_conflict(q));
    neox_emulated_open();
    fill_stage(q, ctx);
    if (q->op == NEOX_COMM_ALLGATHER && q->counts) {  // in place: every part but this rank's own
        size_t esize = neox_dtype_size(q->dt), mine = 0;
        for (int r = 0; r < q->c->rank; r++) mine += (size_t)q->counts[r];
        memset(q->out, 0xff, mine * esize);
        size_t after = (mine + (size_t)q->counts[q->c->rank]) * esize;
        memset((char *)q->out + after, 0xff, q->out_bytes - after);
    } else if (q->out && q->out_bytes) {
        memset(q->out, 0xff, q->out_bytes);  // a NaN in every float until the operation runs
    }
    for (int i = 0; i < q->nspans; i++) q->hashes[i] = hash_bytes(q->spans[i].p, q->spans[i].bytes);
    neox_emulated_close();
    if (q->op == NEOX_COMM_SEND)
        MPI_Isend(q->stage, need_int(q->count, q), neox_mpi_type(q->dt), q->peer, 0, dev_mpi(q->c), &q->send);
    if (req) q->nonblocking = 1, req->device = q;
    if (queue_tail) queue_tail->next = q;
    else queue_head = q;
    queue_tail = q;
}

typedef struct io {
    const void *send;
    void *recv;
} io;

static void stage_input(queued_op *q, void *ctx) {
    const io *b = ctx;
    stage_from(q, q->stage_bytes, b->send, q->spans[0].bytes);
}

static void emu_allreduce(neox_comm *c, void *buf, size_t count, neox_dtype dt, int max, neox_request *req) {
    queued_op *q = new_op(c, NEOX_COMM_ALLREDUCE, max ? "all-reduce max" : "all-reduce", dt, count);
    size_t bytes = count * neox_dtype_size(dt);
    q->max = max, q->payload = bytes, q->stage_bytes = bytes;
    watch(q, buf, bytes);
    set_output(q, buf, 0, bytes);
    enqueue(q, stage_input, &(io){buf, buf}, req);
}

static void emu_reduce_scatter(neox_comm *c, const void *send, void *recv, size_t recv_count, neox_dtype dt,
                               neox_request *req) {
    queued_op *q = new_op(c, NEOX_COMM_REDUCE_SCATTER, "reduce-scatter", dt, recv_count);
    size_t block = recv_count * neox_dtype_size(dt);
    q->payload = q->stage_bytes = block * (size_t)c->size;
    watch(q, send, q->stage_bytes);
    watch(q, recv, block);
    set_output(q, recv, 0, block);
    enqueue(q, stage_input, &(io){send, recv}, req);
}

static int *copy_counts(const neox_comm *c, const int *counts, size_t *total) {
    int *copy = neox_malloc((size_t)c->size * sizeof *copy);
    *total = 0;
    for (int r = 0; r < c->size; r++) copy[r] = counts[r], *total += (size_t)counts[r];
    return copy;
}

static void emu_reduce_scatterv(neox_comm *c, const void *send, void *recv, const int *counts, neox_dtype dt,
                                neox_request *req) {
    queued_op *q = new_op(c, NEOX_COMM_REDUCE_SCATTER, "reduce-scatter", dt, 0);
    size_t total, esize = neox_dtype_size(dt);
    q->counts = copy_counts(c, counts, &total);
    q->payload = q->stage_bytes = total * esize;
    watch(q, send, q->stage_bytes);
    watch(q, recv, (size_t)counts[c->rank] * esize);
    set_output(q, recv, 0, (size_t)counts[c->rank] * esize);
    enqueue(q, stage_input, &(io){send, recv}, req);
}

// This rank's block at its place in the gathered copy.
static void stage_own_block(queued_op *q, void *ctx) {
    const io *b = ctx;
    size_t block = q->count * neox_dtype_size(q->dt);
    stage_from(q, q->stage_bytes, NULL, 0);
    memcpy(q->stage + (size_t)q->c->rank * block, b->send, block);
}

static void emu_allgather(neox_comm *c, const void *send, void *recv, size_t send_count, neox_dtype dt,
                          neox_request *req) {
    queued_op *q = new_op(c, NEOX_COMM_ALLGATHER, "all-gather", dt, send_count);
    size_t block = send_count * neox_dtype_size(dt);
    q->payload = q->stage_bytes = block * (size_t)c->size;
    watch(q, send, block);
    watch(q, recv, q->stage_bytes);
    set_output(q, recv, 0, q->stage_bytes);
    enqueue(q, stage_own_block, &(io){send, recv}, req);
}

static void emu_allgatherv_inplace(neox_comm *c, void *buf, const int *counts, neox_dtype dt) {
    queued_op *q = new_op(c, NEOX_COMM_ALLGATHER, "all-gather", dt, 0);
    size_t total;
    q->counts = copy_counts(c, counts, &total);
    q->payload = q->stage_bytes = total * neox_dtype_size(dt);
    watch(q, buf, q->stage_bytes);
    set_output(q, buf, 0, q->stage_bytes);
    enqueue(q, stage_input, &(io){buf, buf}, NULL);
}

// Rooted operations: the root's buffer is the input; the result lands on the non-roots (broadcast)
// or the root (reduce).
static void emu_rooted(neox_comm *c, neox_comm_op op, const char *what, void *buf, size_t count, neox_dtype dt,
                       int root) {
    queued_op *q = new_op(c, op, what, dt, count);
    size_t bytes = count * neox_dtype_size(dt);
    int lands_here = (op == NEOX_COMM_BROADCAST) != (c->rank == root);
    q->peer = root, q->payload = q->stage_bytes = bytes;
    watch(q, buf, bytes);
    if (lands_here) set_output(q, buf, 0, bytes);
    enqueue(q, stage_input, &(io){buf, buf}, NULL);
}

static void emu_broadcast(neox_comm *c, void *buf, size_t count, neox_dtype dt, int root) {
    emu_rooted(c, NEOX_COMM_BROADCAST, "broadcast", buf, count, dt, root);
}

static void emu_reduce(neox_comm *c, void *buf, size_t count, neox_dtype dt, int root) {
    emu_rooted(c, NEOX_COMM_REDUCE, "reduce", buf, count, dt, root);
}

static void emu_alltoall(neox_comm *c, const void *send, void *recv, size_t block_count, neox_dtype dt) {
    queued_op *q = new_op(c, NEOX_COMM_ALLTOALL, "all-to-all", dt, block_count);
    size_t bytes = block_count * neox_dtype_size(dt) * (size_t)c->size;
    q->payload = bytes, q->stage_bytes = 2 * bytes;  // what leaves, then what arrives
    watch(q, send, bytes);
    watch(q, recv, bytes);
    set_output(q, recv, bytes, bytes);
    enqueue(q, stage_input, &(io){send, recv}, NULL);
}

static void stage_nothing(queued_op *q, void *ctx) {
    (void)ctx;
    stage_from(q, q->stage_bytes, NULL, 0);
}

static void emu_p2p(neox_comm *c, void *buf, size_t count, neox_dtype dt, int peer, int send, neox_request *req) {
    queued_op *q = new_op(c, send ? NEOX_COMM_SEND : NEOX_COMM_RECV, send ? "send" : "recv", dt, count);
    size_t bytes = count * neox_dtype_size(dt);
    q->peer = peer, q->payload = q->stage_bytes = bytes;
    watch(q, buf, bytes);
    if (!send) set_output(q, buf, 0, bytes);
    enqueue(q, send ? stage_input : stage_nothing, &(io){buf, buf}, req);
}

// ---- requests -----------------------------------------------------------------------------------

// The stream now waits for it: the next op that reaches the stream runs it (reach). One already run
// (a later operation needed it first) is done.
static void emu_wait(neox_request *req) {
    queued_op *q = req->device;
    req->device = NULL;
    if (q->done) free(q);
    else q->waited = 1;
}

// Runs it (and the queue before it) now: as late as a device could have finished it is when asked.
static int emu_test(neox_request *req) {
    queued_op *q = req->device;
    if (!q->done) run_through(q);
    req->device = NULL;
    free(q);
    return 1;
}

// Groups fuse NCCL launches; queued operations already progress together.
static void emu_group_begin(void) {}
static void emu_group_end(void) {}

static void emu_comm_free(neox_comm *c) {
    reach(1);
    finish_flights(1);
    MPI_Comm_free((MPI_Comm *)c->device);
    free(c->device);
    c->device = NULL;
}

static const neox_device_comm emulated_table = {
    .name = "the emulated device",
    .owns = neox_emulated_owns,
    .allreduce = emu_allreduce,
    .reduce_scatter = emu_reduce_scatter,
    .reduce_scatterv = emu_reduce_scatterv,
    .allgather = emu_allgather,
    .allgatherv_inplace = emu_allgatherv_inplace,
    .broadcast = emu_broadcast,
    .reduce = emu_reduce,
    .alltoall = emu_alltoall,
    .p2p = emu_p2p,
    .wait = emu_wait,
    .test = emu_test,
    .group_begin = emu_group_begin,
    .group_end = emu_group_end,
    .comm_free = emu_comm_free,
};

static void enable_comm(neox_comm *c) {
    if (c->size < 1 || c->device) return;
    MPI_Comm *dup = neox_malloc(sizeof *dup);
    MPI_Comm_dup(c->mpi, dup);
    c->device = dup;
}

int neox_grid_enable_emulated(neox_grid *g, neox_error *err) {
    if (neox_device_comm_active && neox_device_comm_active != &emulated_table)
        return neox_fail(err, NEOX_EXIT_USAGE, "device communication: %s already carries this process's device buffers",
                         neox_device_comm_active->name);
    neox_device_comm_active = &emulated_table;
    neox_emulated_set_stream_hook(reach);
    neox_comm_set_host_wait_hook(before_host_wait);
    // The same order on every rank: each group's members all reach it after the groups before it.
    neox_comm *comms[] = {&g->world, &g->pipe, &g->data, &g->model, &g->embed, &g->data_intra, &g->data_inter,
                          &g->expert, &g->expert_data, &g->context};
    for (int i = 0; i < 10; i++) enable_comm(comms[i]);
    return 0;
}
