// nccl.h: the NCCL side of the communication layer, private to lib/parallel. collectives.c asks
// NEOX_NCCL(c, a, b, what) whether a call goes through NCCL (a CUDA build, the group has an NCCL
// communicator and the buffers are device memory) and then calls the neox_nccl_* form instead of
// MPI. In a CPU build NEOX_NCCL is the constant 0, so the NCCL branches compile away and the MPI
// code is all there is. req NULL: a blocking call (the compute stream waits for it).
#ifndef NEOX_PARALLEL_NCCL_H
#define NEOX_PARALLEL_NCCL_H

#include "parallel.h"

#ifdef NEOX_CUDA
// 1 when c has NCCL and a and b (the call's buffers; NULL for none) are device memory; 0 when they
// are host memory; dies when one is device and the other host, naming the operation and group.
int neox_nccl_pick(const neox_comm *c, const void *a, const void *b, const char *what);
#define NEOX_NCCL(c, a, b, what) neox_nccl_pick((c), (a), (b), (what))
#define NEOX_NCCL_REQUEST(req) ((req)->event != NULL)
#else
#define NEOX_NCCL(c, a, b, what) 0
#define NEOX_NCCL_REQUEST(req) 0
#endif

// max: element-wise maximum instead of the sum.
void neox_nccl_allreduce(neox_comm *c, void *buf, size_t count, neox_dtype dt, int max, neox_request *req);
void neox_nccl_reduce_scatter(neox_comm *c, const void *send, void *recv, size_t recv_count, neox_dtype dt,
                              neox_request *req);
// send holds sum(counts); rank r's sum lands at recv (which may be send + its own offset: in place).
void neox_nccl_reduce_scatterv(neox_comm *c, const void *send, void *recv, const int *counts, neox_dtype dt,
                               neox_request *req);
void neox_nccl_allgather(neox_comm *c, const void *send, void *recv, size_t send_count, neox_dtype dt,
                         neox_request *req);
void neox_nccl_allgatherv_inplace(neox_comm *c, void *buf, const int *counts, neox_dtype dt);
void neox_nccl_broadcast(neox_comm *c, void *buf, size_t count, neox_dtype dt, int root);
void neox_nccl_reduce(neox_comm *c, void *buf, size_t count, neox_dtype dt, int root);
void neox_nccl_alltoall(neox_comm *c, const void *send, void *recv, size_t block_count, neox_dtype dt);
// send 1: buf goes to peer; send 0: buf comes from peer.
void neox_nccl_p2p(neox_comm *c, void *buf, size_t count, neox_dtype dt, int peer, int send, neox_request *req);
// A request with an event: neox_wait and neox_test's NCCL halves.
void neox_nccl_wait(neox_request *req);
int neox_nccl_test(neox_request *req);
// Destroys c's NCCL communicator, if any, after the queued operations (grid.c, hierarchical.c).
void neox_nccl_comm_free(neox_comm *c);

#endif
