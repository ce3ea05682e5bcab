// grid.c: MPI start-up and the GPT-NeoX process grid (pipe outermost, data, model innermost) with
// one communicator per group, and where each rank computes (its GPU: local rank % GPUs). An error on any rank aborts the whole job through MPI_Abort, so the
// other ranks never wait for a peer that is gone.
#include <errno.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "parallel.h"
#include "parallel/device_comm.h"

static void abort_all_ranks(int status) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized) return;
    // The launcher forwards our stderr through a pipe; aborting at once can kill the job before
    // the error message that explains it has been forwarded.
    fflush(stderr);
    usleep(200 * 1000);
    MPI_Abort(MPI_COMM_WORLD, status ? status : 1);
}

int neox_grid_local_rank(const neox_grid *g) {
    (void)g;
    MPI_Comm local;
    int rank;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &rank);
    MPI_Comm_free(&local);
    return rank;
}

// The cores this process may run on (its affinity mask; all online cores if that is unknown).
static long usable_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    return sysconf(_SC_NPROCESSORS_ONLN);
}

// Ranks sharing a machine share its cores: unless OMP_NUM_THREADS says otherwise, each gets
// cores / ranks-on-this-machine OpenMP threads (oversubscribed spinning threads would stall every
// collective on the slowest rank). When they still outnumber the cores, waits sleep (comm_timeout.c).
static void share_cores(void) {
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
    int local_size;
    MPI_Comm_size(local, &local_size);
    MPI_Comm_free(&local);
    long cores = usable_cores();
    if (!getenv("OMP_NUM_THREADS") && local_size > 1)
        omp_set_num_threads(cores / local_size > 1 ? (int)(cores / local_size) : 1);
    const char *forced = getenv("NEOX_SHARED_CORES");
    int shared = (long)local_size * omp_get_max_threads() > cores;
    neox_comm_set_shared_cores(forced && *forced ? atoi(forced) != 0 : shared);
}

static int thread_multiple;

int neox_parallel_thread_multiple(void) { return thread_multiple; }

// Two of MPICH 4.0's default algorithms fail ZeRO's collectives, whose counts per rank are uneven
// (a bucket or a stage-3 unit is cut where the partitions meet, so some ranks have little or
// none of it). For a large in-place non-blocking reduce-scatter it picks pairwise, which then copies
// a rank's block onto an overlapping range, and its own check aborts the job ("memcpy argument
// memory ranges overlap"; stages 1-3 at dp4 with buckets of a few hundred thousand elements):
// recursive halving sums the same blocks without that copy. For the non-blocking all-gather of
// varying counts it picks the ring, which took 5.9 s per 52 MB gather of counts (7.6M, 5.3M, 0, 0)
// on 4 ranks of one machine where recursive doubling took 0.66 s (and 0.40 s against 0.29 s for
// even counts): a stage-3 step of a 30M-parameter model spent 15 s of its 18 s gathering. Set
// before MPI_Init, which reads them; values set in the environment are kept.
static void choose_collective_algorithms(void) {
    setenv("MPIR_CVAR_IREDUCE_SCATTER_INTRA_ALGORITHM", "sched_recursive_halving", 0);
    setenv("MPIR_CVAR_IALLGATHERV_INTRA_ALGORITHM", "sched_recursive_doubling", 0);
}

int neox_parallel_init(int *argc, char ***argv, neox_error *err) {
    int initialized = 0, provided = 0;
    MPI_Initialized(&initialized);
    if (!initialized) choose_collective_algorithms();
    // Not FUNNELED: neox-eval serve's rank 0 talks to its other ranks from its scheduler thread
    // (SERIALIZED would do), and the gradient reducer's progress thread tests requests while the
    // main thread makes other calls (MULTIPLE). MPICH grants MULTIPLE at the price of a lock per call.
    if (!initialized && MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
        return neox_fail(err, NEOX_EXIT_FAILURE, "MPI initialisation failed");
    if (initialized) MPI_Query_thread(&provided);
    thread_multiple = provided >= MPI_THREAD_MULTIPLE;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    neox_log_set_rank(rank, size);
    if (size > 1) neox_set_exit_hook(abort_all_ranks);
    share_cores();
    int ranks_per_node;
    return neox_hier_ranks_per_node(&ranks_per_node, err);
}

// MPI_Finalize over MPICH's UCX TCP transport can hang: a rank that has closed its endpoints waits
// in the process manager's barrier, which does not progress UCX, while a peer still needs it to
// acknowledge its own close (seen on ranks in network namespaces of their own, docs/parallel.md).
// The barrier before it means every rank has finished its work and its last message, so a
// finalize that has not returned in FINALIZE_GRACE_SECONDS ends the process with the status the
// tool was going to return; the launcher then ends the others.
enum { FINALIZE_GRACE_SECONDS = 20 };
static int finalize_status;

static void *finalize_watchdog(void *arg) {
    (void)arg;
    struct timespec grace = {FINALIZE_GRACE_SECONDS, 0};
    while (nanosleep(&grace, &grace) != 0 && errno == EINTR) {}
    neox_warn("MPI_Finalize has not returned in %d s (MPICH over UCX's TCP transport can hang there after a "
                 "complete run); exiting with status %d", FINALIZE_GRACE_SECONDS, finalize_status);
    _exit(finalize_status);
    return NULL;
}

void neox_parallel_finalize(int status) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    neox_set_exit_hook(NULL);
    if (!initialized || finalized) return;
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 1) {
        MPI_Barrier(MPI_COMM_WORLD);
        finalize_status = status;
        pthread_t watchdog;
        if (pthread_create(&watchdog, NULL, finalize_watchdog, NULL) == 0) pthread_detach(watchdog);
    }
    MPI_Finalize();
}

int neox_grid_rank_of(int data_size, int model_size, int pipe_rank, int data_rank, int model_rank) {
    return (pipe_rank * data_size + data_rank) * model_size + model_rank;
}

// Ranks sharing `color` form one group; key orders them by their coordinate along the group.
static void split(neox_comm *out, const char *name, int color, int key) {
    MPI_Comm_split(MPI_COMM_WORLD, color, key, &out->mpi);
    MPI_Comm_rank(out->mpi, &out->rank);
    MPI_Comm_size(out->mpi, &out->size);
    snprintf(out->name, sizeof out->name, "%s", name);
    memset(&out->stats, 0, sizeof out->stats);
}

void neox_comm_split(const neox_comm *parent, int color, int key, const char *name, neox_comm *out) {
    memset(out, 0, sizeof *out);
    MPI_Comm_split(parent->mpi, color, key, &out->mpi);
    MPI_Comm_rank(out->mpi, &out->rank);
    MPI_Comm_size(out->mpi, &out->size);
    snprintf(out->name, sizeof out->name, "%s", name);
}

void neox_comm_free(neox_comm *c) {
    if (c->mpi != MPI_COMM_NULL && c->mpi != 0) MPI_Comm_free(&c->mpi);
    c->mpi = MPI_COMM_NULL;
}

int neox_grid_make(neox_grid *g, int pipe_size, int model_size, neox_error *err) {
    memset(g, 0, sizeof *g);
    MPI_Comm_rank(MPI_COMM_WORLD, &g->world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g->world_size);
    if (pipe_size < 1 || model_size < 1 || g->world_size % (pipe_size * model_size) != 0)
        return neox_fail(err, NEOX_EXIT_USAGE,
                         "%d ranks cannot be divided into pipe_parallel_size %d x model_parallel_size %d",
                         g->world_size, pipe_size, model_size);
    g->pipe_size = pipe_size;
    g->model_size = model_size;
    g->data_size = g->world_size / (pipe_size * model_size);
    g->cp_size = 1;
    g->model_rank = g->world_rank % model_size;
    g->data_rank = g->world_rank / model_size % g->data_size;
    g->pipe_rank = g->world_rank / (model_size * g->data_size);

    MPI_Comm_dup(MPI_COMM_WORLD, &g->world.mpi);
    g->world.rank = g->world_rank;
    g->world.size = g->world_size;
    snprintf(g->world.name, sizeof g->world.name, "world");
    // A group is identified by the coordinates its members share.
    split(&g->model, "model", g->pipe_rank * g->data_size + g->data_rank, g->model_rank);
    split(&g->data, "data", g->pipe_rank * model_size + g->model_rank, g->data_rank);
    split(&g->pipe, "pipe", g->data_rank * model_size + g->model_rank, g->pipe_rank);
    int ends = pipe_size > 1 && (g->pipe_rank == 0 || g->pipe_rank == pipe_size - 1);
    MPI_Comm_split(MPI_COMM_WORLD, ends ? g->data_rank * model_size + g->model_rank : MPI_UNDEFINED, g->pipe_rank,
                   &g->embed.mpi);
    snprintf(g->embed.name, sizeof g->embed.name, "embed");
    if (ends) {
        MPI_Comm_rank(g->embed.mpi, &g->embed.rank);
        MPI_Comm_size(g->embed.mpi, &g->embed.size);
    }
    return 0;
}

int neox_grid_make_expert(neox_grid *g, int expert_size, neox_error *err) {
    if (expert_size < 1 || g->data_size % expert_size != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "moe_expert_parallel_size %d must divide the data-parallel size %d",
                         expert_size, g->data_size);
    neox_comm_split(&g->data, g->data_rank / expert_size, g->data_rank, "expert", &g->expert);
    neox_comm_split(&g->data, g->data_rank % expert_size, g->data_rank, "expert_data", &g->expert_data);
    // Made after the device's groups (the model's set-up decides them): the new groups get theirs
    // from the same table (its enabling skips the groups that have one).
    if (!neox_device_comm_active) return 0;
    if (neox_device_comm_active->owns == neox_emulated_owns) return neox_grid_enable_emulated(g, err);
    return neox_grid_enable_device(g, err);
}

int neox_grid_make_context(neox_grid *g, int cp, neox_error *err) {
    if (cp < 1 || g->data_size % cp != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "context_parallel_size %d must divide the data-parallel dimension's %d ranks",
                         cp, g->data_size);
    g->cp_size = cp;
    g->cp_rank = g->data_rank % cp;
    if (cp == 1) return 0;
    neox_comm_split(&g->data, g->data_rank / cp, g->data_rank, "context", &g->context);
    // (made after the model's device groups, like the expert groups: enabled from the same table)
    if (!neox_device_comm_active) return 0;
    if (neox_device_comm_active->owns == neox_emulated_owns) return neox_grid_enable_emulated(g, err);
    return neox_grid_enable_device(g, err);
}

void neox_grid_free(neox_grid *g) {
    neox_comm *comms[] = {&g->world, &g->pipe, &g->data, &g->model, &g->embed, &g->data_intra, &g->data_inter,
                          &g->expert, &g->expert_data, &g->context};
    for (int i = 0; i < 10; i++) {
        neox_device_comm_free(comms[i]);
        if (comms[i]->mpi != MPI_COMM_NULL && comms[i]->mpi != 0) MPI_Comm_free(&comms[i]->mpi);
    }
}

const neox_backend *neox_backend_for_rank(const char *choice, const neox_grid *grid, neox_error *err) {
    char msg[256] = "";
    choice = choice ? choice : "auto";
#ifdef NEOX_CUDA
    // This rank's GPU first: the first use of the CUDA backend would otherwise start device 0 for good.
    if ((!strcmp(choice, "cuda") || !strcmp(choice, "auto")) && neox_cuda_device_count() > 0) {
        int device = neox_grid_local_rank(grid) % neox_cuda_device_count();
        if (neox_cuda_init(device) != 0)
            return neox_fail(err, NEOX_EXIT_FAILURE, "compute_backend %s: GPU %d failed to initialise", choice, device), NULL;
    }
#else
    (void)grid;
#endif
    const neox_backend *be = neox_backend_select(choice, msg, sizeof msg);
    if (!be) return neox_fail(err, NEOX_EXIT_USAGE, "compute_backend: %s", msg), NULL;
    return be;
}
