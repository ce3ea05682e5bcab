// device_comm.h: the device side of the communication layer, private to lib/parallel. A call
// whose buffers are device memory on a group with a device communicator goes through one table of
// entry points (neox_device_comm) instead of MPI on host buffers. Two implementations fill it: NCCL
// in CUDA builds (nccl.c) and the emulated device's twin over MPI (emulated_comm.c) for
// `compute_backend: emulated`. collectives.c asks NEOX_DEVICE(c, a, b, what) whether a call goes to
// the table, keeps the accounting (calls, bytes, sent) and calls the entry point; req NULL is a
// blocking call (ordered before the compute stream's later work, no host wait).
#ifndef NEOX_PARALLEL_DEVICE_COMM_H
#define NEOX_PARALLEL_DEVICE_COMM_H

#include "parallel.h"

typedef struct neox_device_comm {
    const char *name;  // "NCCL", "emulated"
    // 1 when p is memory of this table's device.
    int (*owns)(const void *p);
    // max: element-wise maximum instead of the sum.
    void (*allreduce)(neox_comm *c, void *buf, size_t count, neox_dtype dt, int max, neox_request *req);
    void (*reduce_scatter)(neox_comm *c, const void *send, void *recv, size_t recv_count, neox_dtype dt,
                           neox_request *req);
    // send holds sum(counts); rank r's sum lands at recv (which may be send + its own offset: in place).
    void (*reduce_scatterv)(neox_comm *c, const void *send, void *recv, const int *counts, neox_dtype dt,
                            neox_request *req);
    void (*allgather)(neox_comm *c, const void *send, void *recv, size_t send_count, neox_dtype dt,
                      neox_request *req);
    void (*allgatherv_inplace)(neox_comm *c, void *buf, const int *counts, neox_dtype dt);
    void (*broadcast)(neox_comm *c, void *buf, size_t count, neox_dtype dt, int root);
    void (*reduce)(neox_comm *c, void *buf, size_t count, neox_dtype dt, int root);
    void (*alltoall)(neox_comm *c, const void *send, void *recv, size_t block_count, neox_dtype dt);
    // send 1: buf goes to peer; send 0: buf comes from peer. Messages between two ranks of a group
    // match in the order they are issued (no tags, as NCCL).
    void (*p2p)(neox_comm *c, void *buf, size_t count, neox_dtype dt, int peer, int send, neox_request *req);
    // A request whose `device` handle is set: neox_wait's and neox_test's device halves.
    void (*wait)(neox_request *req);
    int (*test)(neox_request *req);
    void (*group_begin)(void);
    void (*group_end)(void);
    // Releases c's device communicator after its queued operations (grid.c, hierarchical.c).
    void (*comm_free)(neox_comm *c);
} neox_device_comm;

// The table the process's groups use: set by neox_grid_enable_device (NCCL) or
// neox_grid_enable_emulated (the twin); NULL before (every call is MPI on host buffers).
extern const neox_device_comm *neox_device_comm_active;

// 1 when c has a device communicator and a and b (the call's buffers; NULL for none) are device
// memory; 0 when they are host memory; a bug (neox_assert) when one is device and the other host,
// naming the operation and group.
int neox_device_pick(const neox_comm *c, const void *a, const void *b, const char *what);
#define NEOX_DEVICE(c, a, b, what) neox_device_pick((c), (a), (b), (what))
#define NEOX_DEVICE_REQUEST(req) ((req)->device != NULL)
void neox_device_comm_free(neox_comm *c);

// What the twin shares with collectives.c's MPI calls: the MPI datatype of dt, the sum operation
// (bf16 and fp16 summed in fp32) and the accounting of time spent running an operation later than
// its call (added to the operation's seconds and to its message-size row).
MPI_Datatype neox_mpi_type(neox_dtype dt);
MPI_Op neox_mpi_sum_op(neox_dtype dt);
void neox_comm_add_seconds(neox_comm *c, neox_comm_op op, size_t bytes, double seconds);

#endif
