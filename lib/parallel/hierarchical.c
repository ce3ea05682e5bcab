// hierarchical.c: topology-aware all-reduce for a group whose ranks span several nodes: reduce to
// one leader per node over the node's ranks (group "<name>_intra"), all-reduce among the leaders
// (group "<name>_inter", the only traffic that leaves a node), broadcast within each node. Per
// element a node then sends 2(N-1)/N across nodes for N nodes (the leaders' ring all-reduce)
// instead of every rank sending 2(p-1)/p through the node's links.
//
// Nodes come from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED). NEOX_RANKS_PER_NODE=k overrides that
// and pretends nodes of k consecutive ranks of the group (for testing on one host).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel.h"
#include "parallel/device_comm.h"

static void name_comm(neox_comm *out, MPI_Comm mpi, const char *base, const char *suffix) {
    out->mpi = mpi;
    out->device = NULL;  // neox_grid_enable_device (or _emulated) adds one
    snprintf(out->name, sizeof out->name, "%.9s_%s", base, suffix);  // name[16]
    memset(&out->stats, 0, sizeof out->stats);
    out->rank = out->size = 0;
    if (mpi != MPI_COMM_NULL) {
        MPI_Comm_rank(mpi, &out->rank);
        MPI_Comm_size(mpi, &out->size);
    }
}

int neox_hier_ranks_per_node(int *k, neox_error *err) {
    const char *v = getenv("NEOX_RANKS_PER_NODE");
    *k = 0;
    if (!v || !*v) return 0;
    char *end;
    long n = strtol(v, &end, 10);
    if (*end || n < 1 || n > 1 << 20)
        return neox_fail(err, NEOX_EXIT_USAGE, "NEOX_RANKS_PER_NODE=%s: expected a positive number of ranks", v);
    *k = (int)n;
    return 0;
}

// The override's ranks per node, 0 without one (neox_parallel_init refused a bad value).
static int ranks_per_node_override(void) {
    int k;
    neox_error err = {0};
    int read = neox_hier_ranks_per_node(&k, &err);
    neox_assert(read == 0, "%s, past neox_parallel_init", err.message);
    return k;
}

int neox_hier_make(neox_comm *c, neox_comm *intra, neox_comm *inter) {
    MPI_Comm node;
    int k = ranks_per_node_override();
    if (k > 0) MPI_Comm_split(c->mpi, c->rank / k, c->rank, &node);
    else MPI_Comm_split_type(c->mpi, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &node);
    int node_rank, node_size, leader, nodes, most;
    MPI_Comm_rank(node, &node_rank);
    MPI_Comm_size(node, &node_size);
    leader = node_rank == 0;
    MPI_Allreduce(&leader, &nodes, 1, MPI_INT, MPI_SUM, c->mpi);
    MPI_Allreduce(&node_size, &most, 1, MPI_INT, MPI_MAX, c->mpi);
    if (nodes <= 1 || most <= 1) {  // one node, or one rank per node: the flat all-reduce is the same thing
        MPI_Comm_free(&node);
        return 0;
    }
    MPI_Comm leaders;
    MPI_Comm_split(c->mpi, leader ? 0 : MPI_UNDEFINED, c->rank, &leaders);
    name_comm(intra, node, c->name, "intra");
    name_comm(inter, leaders, c->name, "inter");
    return nodes;
}

void neox_hier_free(neox_comm *intra, neox_comm *inter) {
    neox_device_comm_free(intra);
    neox_device_comm_free(inter);
    if (intra->mpi != MPI_COMM_NULL && intra->mpi != 0) MPI_Comm_free(&intra->mpi);
    if (inter->mpi != MPI_COMM_NULL && inter->mpi != 0) MPI_Comm_free(&inter->mpi);
}

void neox_hier_allreduce_sum(neox_comm *intra, neox_comm *inter, void *buf, size_t count, neox_dtype dt) {
    neox_reduce_sum(intra, buf, count, dt, 0);
    if (intra->rank == 0) neox_allreduce_sum(inter, buf, count, dt);
    neox_broadcast(intra, buf, count, dt, 0);
}

enum { HIER_REDUCE, HIER_ALLREDUCE, HIER_BROADCAST, HIER_DONE };

void neox_hier_iallreduce_sum(neox_comm *intra, neox_comm *inter, void *buf, size_t count, neox_dtype dt,
                              neox_hier_request *r) {
    *r = (neox_hier_request){.intra = intra, .inter = inter, .buf = buf, .count = count, .dt = dt, .step = HIER_REDUCE};
    neox_ireduce_sum(intra, buf, count, dt, 0, &r->req);
}

// The step after the one just completed: the leaders all-reduce, everyone then takes the broadcast.
static void next_step(neox_hier_request *r) {
    if (r->step == HIER_REDUCE && r->intra->rank == 0) {
        r->step = HIER_ALLREDUCE;
        neox_iallreduce_sum(r->inter, r->buf, r->count, r->dt, &r->req);
    } else if (r->step == HIER_REDUCE || r->step == HIER_ALLREDUCE) {
        r->step = HIER_BROADCAST;
        neox_ibroadcast(r->intra, r->buf, r->count, r->dt, 0, &r->req);
    } else {
        r->step = HIER_DONE;
    }
}

int neox_hier_test(neox_hier_request *r) {
    while (r->step != HIER_DONE && neox_test(&r->req)) next_step(r);
    return r->step == HIER_DONE;
}

void neox_hier_wait(neox_hier_request *r) {
    while (r->step != HIER_DONE) {
        neox_wait(&r->req);
        next_step(r);
    }
}
