// parallel.h: the process grid and the communication layer. Ranks are laid out as GPT-NeoX lays
// them (pipe outermost, then data, then model innermost): rank = (pipe * D + data) * M + model.
// Each group (world, pipe, data, model) is a neox_comm; the model and optimizer call only the
// collectives below, which count calls, bytes and time per operation so communication can be
// measured. MPI carries them on CPU ranks. In a CUDA build, neox_grid_enable_device gives each
// group an NCCL communicator, and from then on every call whose buffers are device memory goes
// through NCCL (nccl.c; host buffers still go through MPI, so host scalars keep working). On the
// emulated device (compute_backend: emulated), neox_grid_enable_emulated does the same with the
// emulated twin (emulated_comm.c): device buffers through MPI, in the device's stream order. Both
// fill one table of device entry points (lib/parallel/device_comm.h).
// MPI errors are fatal, and neox_die() on any rank aborts the whole job, so no rank hangs: a failure
// inside a collective (MPI, NCCL, CUDA, a count MPI cannot take, comm_timeout_seconds passing) ends
// the job rather than returning, since its peers wait in it. Misuse (mixed host and device buffers,
// groups nested) is a bug (neox_assert).
#ifndef NEOX_PARALLEL_H
#define NEOX_PARALLEL_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"
#include "kernels/kernels.h"

typedef enum { NEOX_F32, NEOX_F64, NEOX_BF16, NEOX_F16, NEOX_I32, NEOX_I64, NEOX_U8 } neox_dtype;
size_t neox_dtype_size(neox_dtype dt);
const char *neox_dtype_name(neox_dtype dt);
// The message type of tensors stored as e (activations: neox_model's act_elem).
neox_dtype neox_dtype_of_elem(neox_elem e);

typedef enum {
    NEOX_COMM_ALLREDUCE,
    NEOX_COMM_REDUCE_SCATTER,
    NEOX_COMM_ALLGATHER,
    NEOX_COMM_BROADCAST,
    NEOX_COMM_SEND,
    NEOX_COMM_RECV,
    NEOX_COMM_BARRIER,
    NEOX_COMM_ALLTOALL,
    NEOX_COMM_REDUCE,
    NEOX_COMM_OP_COUNT,
} neox_comm_op;
const char *neox_comm_op_name(neox_comm_op op);

// Per-communicator accounting, per operation: calls, bytes (the payload), sent (what this rank
// transmits under the operation's bandwidth-optimal algorithm) and seconds blocked (for non-blocking
// operations: in neox_wait). What each counts for each operation is defined once, in
// docs/communication.md ("Counting bytes"); the counting itself is in lib/parallel/collectives.c.
// sizes breaks each operation down by message size (the payload of one call), as DeepSpeed's
// comms_logger summarises: the first NEOX_COMM_SIZES - 1 distinct sizes get a row each, later ones
// share the last row (bytes -1: "other sizes", calls and seconds still counted).
enum { NEOX_COMM_SIZES = 8 };
typedef struct neox_comm_size_row {
    int64_t bytes;    // message size of the row; 0 in an unused row
    int64_t calls;
    double seconds;
} neox_comm_size_row;

typedef struct neox_comm_stats {
    int64_t calls[NEOX_COMM_OP_COUNT];
    int64_t bytes[NEOX_COMM_OP_COUNT];
    int64_t sent[NEOX_COMM_OP_COUNT];
    double seconds[NEOX_COMM_OP_COUNT];
    neox_comm_size_row sizes[NEOX_COMM_OP_COUNT][NEOX_COMM_SIZES];
} neox_comm_stats;

typedef struct neox_comm {
    char name[16];  // "world", "pipe", "data", "model"
    int rank, size;
    MPI_Comm mpi;
    neox_comm_stats stats;
    // The group's device communicator, once neox_grid_enable_device (an ncclComm_t) or
    // neox_grid_enable_emulated (the twin's MPI communicator) made one; else NULL.
    void *device;
} neox_comm;

typedef struct neox_grid {
    int world_rank, world_size;
    int pipe_size, data_size, model_size;
    int pipe_rank, data_rank, model_rank;
    neox_comm world, pipe, data, model;
    // The first and last pipe stage of one (data, model) coordinate, which both hold the tied
    // input embedding (pipe_size > 1 only; size 0 on middle stages and without pipelining).
    neox_comm embed;
    // Hierarchical data-parallel all-reduce (hierarchical.c): the data group's ranks on this node
    // and the nodes' leaders; size 0 when the data group is on one node or one rank per node.
    neox_comm data_intra, data_inter;
    // Expert parallelism (neox_grid_make_expert): `expert`, the expert_size consecutive data ranks
    // that share out the experts, and `expert_data`, the data ranks holding the same experts (one
    // per expert group); size 0 until made.
    neox_comm expert, expert_data;
    // Context parallelism (neox_grid_make_context): `context`, the cp_size consecutive data ranks
    // that share out each sequence (size 0 until made). They read the same samples, so the batches
    // are cut into data_size / cp_size ways (neox_grid_sample_ways), while gradients are still
    // reduced over the whole data group.
    int cp_size, cp_rank;
    neox_comm context;
} neox_grid;

// The data-parallel ways samples are dealt to (data ranks / context-parallel ranks), and this
// rank's way among them.
static inline int neox_grid_sample_ways(const neox_grid *g) { return g->data_size / (g->cp_size > 1 ? g->cp_size : 1); }
static inline int neox_grid_sample_rank(const neox_grid *g) { return g->data_rank / (g->cp_size > 1 ? g->cp_size : 1); }

// Initialises MPI (asking for thread level MULTIPLE), tags log messages with the rank and makes
// neox_die() abort every rank. Safe to call once per process.
int neox_parallel_init(int *argc, char ***argv, neox_error *err);
// Ends MPI after a barrier over the world; `status` is what the tool will exit with, used if
// MPI_Finalize hangs (grid.c says when) and the process has to end without it.
void neox_parallel_finalize(int status);
// Whether MPI may be called from several threads at once (MPI_THREAD_MULTIPLE was granted): the
// progress thread below needs it, since the main thread keeps calling MPI while it polls.
int neox_parallel_thread_multiple(void);

// A thread that calls fn(ctx) every interval_seconds while armed, sleeping (not spinning) in
// between, to move non-blocking communication on while the main thread computes
// (progress_thread.c). fn runs with the thread's mutex held; the owner takes the same mutex around
// the state it shares with fn, and arms and disarms while holding it (after disarm returns and the
// mutex is released, fn does not run again until the next arm). NULL, with a warning, when the
// thread cannot be started: the owner's own tests then move the communication on.
typedef struct neox_progress_thread neox_progress_thread;
neox_progress_thread *neox_progress_thread_start(void (*fn)(void *ctx), void *ctx, double interval_seconds);
void neox_progress_thread_lock(neox_progress_thread *p);
void neox_progress_thread_unlock(neox_progress_thread *p);
void neox_progress_thread_arm(neox_progress_thread *p);
void neox_progress_thread_disarm(neox_progress_thread *p);
// Calls of fn so far (read under the lock, or after stop).
int64_t neox_progress_thread_polls(const neox_progress_thread *p);
// Ends and joins the thread (NULL: nothing).
void neox_progress_thread_stop(neox_progress_thread *p);

// Builds the grid over MPI_COMM_WORLD: the data-parallel size is world / (pipe x model); an error
// when that does not divide.
int neox_grid_make(neox_grid *g, int pipe_size, int model_size, neox_error *err);
// Makes the context-parallel groups of cp consecutive data ranks (cp must divide the data size).
int neox_grid_make_context(neox_grid *g, int cp, neox_error *err);
// Frees the groups (and their NCCL communicators, after the queued operations are done).
void neox_grid_free(neox_grid *g);
// This process's rank among the ranks on its machine (MPI_COMM_TYPE_SHARED): one GPU per local rank.
// Collective over the world.
int neox_grid_local_rank(const neox_grid *g);
// The compute backend `compute_backend` names (cpu, cuda, auto, emulated) for this rank: on a GPU
// machine each rank first starts GPU (local rank % GPUs). NULL + err when unavailable. Collective
// over the world.
typedef struct neox_backend neox_backend;
const neox_backend *neox_backend_for_rank(const char *choice, const neox_grid *grid, neox_error *err);
// Splits the data group into expert groups of expert_size consecutive data ranks (which must divide
// the data-parallel size) and the expert-data groups across them. Collective over the data group.
int neox_grid_make_expert(neox_grid *g, int expert_size, neox_error *err);
// World rank of the process at (pipe, data, model) in a grid of these sizes.
int neox_grid_rank_of(int data_size, int model_size, int pipe_rank, int data_rank, int model_rank);

// ---- device communication (CUDA builds: nccl.c) -------------------------------------------------
// Makes this process's GPU current (node-local rank, as MPI_COMM_TYPE_SHARED numbers it, which must
// be below the node's device count: NCCL cannot put two ranks of one communicator on one GPU) and
// creates an NCCL communicator for every group of g with at least one rank (world, pipe, data,
// model, embed, data_intra, data_inter: call it after neox_hier_make when that is used), each from
// an ncclUniqueId made on the group's rank 0 and broadcast over its MPI communicator, plus one
// high-priority communication stream. Collective over MPI_COMM_WORLD. A CPU build returns an error.
// Call it before the first use of the CUDA backend (neox_backend_select / neox_backend_cuda start
// device 0 when no device was chosen, and the device cannot change afterwards), or choose the same
// device first with neox_cuda_init(node-local rank).
// From then on, a collective on one of these groups whose buffers are device memory:
//  - waits (on the GPU, not the host) for the work already queued on the compute stream
//    (neox_cuda_stream()), runs on the communication stream, and
//  - blocking calls: the compute stream waits for it, so later ops see the result; the host does
//    not wait (read the result with the backend's to_host, which is ordered on the compute stream);
//  - non-blocking calls: neox_wait makes the compute stream wait for it (no host wait); neox_test
//    asks whether it has finished.
// Host buffers go through MPI as before. Every NCCL operation of the process runs on the one
// communication stream in the order issued (NCCL's rule for several communicators), and a send
// finishes only when its peer's receive runs: ranks must issue their operations in compatible
// orders. So that MPI-style isend-then-recv code (1F1B) works, a non-blocking send is held back and
// launched with the process's next receive (or before any other NCCL operation, or when waited for
// or tested); other operations that must progress together go between neox_group_begin/end.
// Statistics: as for MPI, except that seconds is host time (the GPU's time is not measured).
int neox_grid_enable_device(neox_grid *g, neox_error *err);
// The emulated device's twin of the above (emulated_comm.c), for compute_backend: emulated on any
// number of ranks: every group of g gets a device communicator (a duplicate of its MPI one, so device
// messages never match host ones), and from then on a call whose buffers are emulated device memory
// behaves towards its caller as the NCCL one does, with the emulated device's rules made strict:
//  - it is queued in stream order and runs as late as a device could run it: a blocking one when the
//    next op or memory entry point of the emulated backend reaches it (or to_host, synchronize); a
//    non-blocking one once neox_wait has made the stream wait for it and a later op reaches it, or
//    when neox_test asks; always in the order queued (an operation touching memory of one queued
//    before it runs that one first, as the device's one communication stream would);
//  - its outputs read NaN until it runs, and a buffer it reads or writes that changes between the
//    call and the run stops the process with a message naming the operation and group;
//  - it runs through MPI on host copies (a send leaves from a copy taken at the call, so MPI-style
//    isend-then-recv code, 1F1B, cannot deadlock), waited for by polling under comm_timeout_seconds.
// Collective over MPI_COMM_WORLD; call it once the emulated backend is chosen.
int neox_grid_enable_emulated(neox_grid *g, neox_error *err);
// Whether the communicator carries device buffers (NCCL or the twin) and p is device memory.
int neox_comm_on_device(const neox_comm *c, const void *p);
// Fuse the NCCL operations issued in between into one launch (ncclGroupStart/End), e.g. 1F1B's
// send-forward and receive-backward; nothing in the group starts before neox_group_end. No-ops for
// MPI operations. Not nested.
void neox_group_begin(void);
void neox_group_end(void);

// ---- blocking collectives (reductions are sums; bf16/f16 are summed in fp32) ------------------
void neox_allreduce_sum(neox_comm *c, void *buf, size_t count, neox_dtype dt);
// Element-wise maximum (f32, f64, i32, i64).
void neox_allreduce_max(neox_comm *c, void *buf, size_t count, neox_dtype dt);
// Bookkeeping collectives (reductions of measurements: memory peaks): they honour
// comm_timeout_seconds but are not counted, so the accounting's per-step bytes stay the training's.
// The gather's recv (count per rank, rank order) matters on rank 0 only.
void neox_allreduce_max_uncounted(neox_comm *c, double *buf, int count);
void neox_allreduce_min_uncounted(neox_comm *c, double *buf, int count);
void neox_gather_uncounted(neox_comm *c, const double *send, int count, double *recv);
// The same gather of a record of bytes per rank (counters of mixed types: the comms report).
void neox_gather_bytes_uncounted(neox_comm *c, const void *send, int bytes, void *recv);
// send holds c->size x recv_count elements; rank r receives the sum of block r.
void neox_reduce_scatter_sum(neox_comm *c, const void *send, void *recv, size_t recv_count, neox_dtype dt);
// recv receives c->size x send_count elements, block r from rank r.
void neox_allgather(neox_comm *c, const void *send, void *recv, size_t send_count, neox_dtype dt);
// In place: buf holds sum(counts) elements; rank r contributes the counts[r] elements starting at
// sum(counts[0..r-1]) and receives everyone else's (ZeRO's parameter all-gather).
void neox_allgatherv_inplace(neox_comm *c, void *buf, const int *counts, neox_dtype dt);
void neox_broadcast(neox_comm *c, void *buf, size_t count, neox_dtype dt, int root);
void neox_send(neox_comm *c, const void *buf, size_t count, neox_dtype dt, int dest, int tag);
void neox_recv(neox_comm *c, void *buf, size_t count, neox_dtype dt, int source, int tag);
void neox_barrier(neox_comm *c);
// Sum to root (payload: the buffer; sent (p-1)/p of it, as reduce-scatter + gather). buf is
// overwritten on every rank (MPI_IN_PLACE at the root; elsewhere its contents are unspecified).
void neox_reduce_sum(neox_comm *c, void *buf, size_t count, neox_dtype dt, int root);
// send holds c->size blocks of block_count elements, block r for rank r; recv receives block q of
// every rank q at block q (payload counted: the whole send buffer).
void neox_alltoall(neox_comm *c, const void *send, void *recv, size_t block_count, neox_dtype dt);

// Host buffers only: rank r sends send_counts[q] elements from send + send_displs[q] to each rank
// q and receives recv_counts[q] at recv + recv_displs[q] (element units; the counts must agree
// pairwise, so exchange them first). Payload counted: the elements sent; sent: those leaving the rank.
void neox_alltoallv(neox_comm *c, const void *send, const int *send_counts, const int *send_displs, void *recv,
                    const int *recv_counts, const int *recv_displs, neox_dtype dt);
// A subgroup of parent: the ranks passing the same color, ordered by key; out is named `name`.
// Collective over parent. Free with neox_comm_free.
void neox_comm_split(const neox_comm *parent, int color, int key, const char *name, neox_comm *out);
void neox_comm_free(neox_comm *c);
// ---- non-blocking -----------------------------------------------------------------------------
typedef struct neox_request {
    MPI_Request mpi;
    neox_comm *comm;
    neox_comm_op op;
    int size_row;     // the row of stats.sizes[op] the wait time goes to
    int active;
    void *device;     // device operations: NCCL's cudaEvent_t recorded after it, or the emulated twin's
                      // queued operation; NULL for MPI ones
} neox_request;

void neox_iallreduce_sum(neox_comm *c, void *buf, size_t count, neox_dtype dt, neox_request *req);
void neox_ireduce_scatter_sum(neox_comm *c, const void *send, void *recv, size_t recv_count, neox_dtype dt,
                              neox_request *req);
void neox_iallgather(neox_comm *c, const void *send, void *recv, size_t send_count, neox_dtype dt, neox_request *req);
// In place with a count per rank (as neox_allgatherv_inplace; displs[r] = sum(counts[0..r-1])),
// host buffers only; counts and displs must stay unchanged until the request completes.
void neox_iallgatherv_inplace(neox_comm *c, void *buf, const int *counts, const int *displs, neox_dtype dt,
                              neox_request *req);
// Reduce-scatter with a count per rank: send holds sum(counts) elements; rank r receives the sum
// of the counts[r] elements starting at sum(counts[0..r-1]).
void neox_ireduce_scatterv_sum(neox_comm *c, const void *send, void *recv, const int *counts, neox_dtype dt,
                               neox_request *req);
void neox_isend(neox_comm *c, const void *buf, size_t count, neox_dtype dt, int dest, int tag, neox_request *req);
void neox_irecv(neox_comm *c, void *buf, size_t count, neox_dtype dt, int source, int tag, neox_request *req);
// Host buffers only (the hierarchical all-reduce's steps): sum to root (MPI_IN_PLACE there), and
// root's buffer to every rank.
void neox_ireduce_sum(neox_comm *c, void *buf, size_t count, neox_dtype dt, int root, neox_request *req);
void neox_ibroadcast(neox_comm *c, void *buf, size_t count, neox_dtype dt, int root, neox_request *req);
// Completes a request (no-op for an inactive one); the time spent here is counted as exposed.
// An NCCL request: the compute stream waits for it on the GPU and the host returns at once (the
// seconds counted are host time only, ~0; the GPU's communication time is not measured).
void neox_wait(neox_request *req);

// The communication timeout (comm_timeout_seconds, 1800 s by default as torch.distributed's;
// lib/parallel/comm_timeout.c). 0 waits forever in blocking MPI calls. Otherwise every MPI call (on
// the host, and the emulated device's collectives) waits by polling, and one that makes no progress
// for that long ends the job naming the ranks that did not respond; NCCL operations are watched for
// as long (nccl.c) and abort their communicator.
void neox_comm_set_timeout(double seconds);
double neox_comm_timeout(void);
// How ranks wait (comm_timeout.c): with shared set (more ranks' threads on this machine than
// cores; neox_parallel_init decides, NEOX_SHARED_CORES=0|1 overrides) a wait that lasts sleeps
// between its polls instead of yielding, so the peer it waits for gets the core.
void neox_comm_set_shared_cores(int shared);
int neox_comm_shared_cores(void);
// Waits for an MPI request of c's operation op under the timeout.
void neox_comm_wait_mpi(const neox_comm *c, MPI_Request *req, neox_comm_op op);
// Called before each such wait: the emulated device's twin (emulated_comm.c) runs there what its
// stream has already reached, as a device's stream would while the host waits (a peer may be
// waiting for it). NULL: none.
void neox_comm_set_host_wait_hook(void (*hook)(void));
// Non-blocking check; returns 1 when the request has completed (and completes it).
int neox_test(neox_request *req);

// Adds one communicator's statistics into a total (for summaries over groups; calls, bytes, sent and
// seconds, not the size rows).
void neox_comm_stats_add(neox_comm_stats *total, const neox_comm_stats *s);
// What happened between two snapshots of the same communicator's statistics (per-step accounting):
// calls, bytes, sent and seconds of every operation (the size rows are left zero).
void neox_comm_stats_delta(neox_comm_stats *delta, const neox_comm_stats *now, const neox_comm_stats *before);

// ---- hierarchical all-reduce (hierarchical.c) -------------------------------------------------
// Splits c into nodes (MPI_COMM_TYPE_SHARED, or NEOX_RANKS_PER_NODE=k consecutive ranks) and returns
// the number of nodes with intra (this node's ranks of c) and inter (one leader per node; size 0
// elsewhere) created, or 0 (nothing created) when there is one node or no node has two ranks.
// Collective over c.
int neox_hier_make(neox_comm *c, neox_comm *intra, neox_comm *inter);
// The NEOX_RANKS_PER_NODE override into *k (0 without one); a value that is no positive number is a
// usage error naming the variable. neox_parallel_init checks it, so a bad value stops every tool at
// start-up rather than midway through setting up the groups.
int neox_hier_ranks_per_node(int *k, neox_error *err);
void neox_hier_free(neox_comm *intra, neox_comm *inter);
// Reduce to the node leader, all-reduce among leaders, broadcast within the node.
void neox_hier_allreduce_sum(neox_comm *intra, neox_comm *inter, void *buf, size_t count, neox_dtype dt);
// The same without blocking: a chain of three non-blocking steps (reduce to the node's leader, the
// leaders' all-reduce, broadcast from the leader), each started when neox_hier_test or
// neox_hier_wait finds the one before complete. Every rank of intra must start its chains in the
// same order and run them one at a time (a chain's broadcast is issued before the next chain's
// reduce), so that their collectives are issued in the same order everywhere.
typedef struct neox_hier_request {
    neox_comm *intra, *inter;
    void *buf;
    size_t count;
    neox_dtype dt;
    int step;           // the step in flight (or done)
    neox_request req;   // its request
} neox_hier_request;
void neox_hier_iallreduce_sum(neox_comm *intra, neox_comm *inter, void *buf, size_t count, neox_dtype dt,
                              neox_hier_request *r);
// 1 when the chain has completed (advancing it as far as it can go without waiting).
int neox_hier_test(neox_hier_request *r);
void neox_hier_wait(neox_hier_request *r);

#endif
