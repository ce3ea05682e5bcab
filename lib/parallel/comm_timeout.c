// comm_timeout.c: the communication timeout (comm_timeout_seconds). With a timeout set, every MPI
// call waits by polling its request; one that makes no progress for that long ends the job naming
// the ranks that did not respond (a rank stopped with SIGSTOP, hung, or lost), where a blocking
// call would wait forever. To find them, each rank that timed out reports to world rank 0 on
// MPI_COMM_WORLD under a reserved tag; rank 0 collects the reports for one more timeout period and
// names the ranks it did not hear from; a rank that hears nothing back from rank 0 names rank 0.
// Every wait for a request polls here (neox_wait too), so this file also says how a rank waits.
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "parallel.h"

enum { SLEEP_BETWEEN_POLLS_NS = 20000 };
#define SPIN_BEFORE_SLEEP_S 50e-6

static double timeout_seconds;  // 0: wait forever (the blocking MPI calls)
static void (*host_wait_hook)(void);

void neox_comm_set_host_wait_hook(void (*hook)(void)) { host_wait_hook = hook; }

void neox_comm_set_timeout(double seconds) { timeout_seconds = seconds > 0 ? seconds : 0; }
double neox_comm_timeout(void) { return timeout_seconds; }

// The two largest tags MPI allows: no other message of ours uses them.
static int reserved_tag(int which) {
    int *ub = NULL, found = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &found);
    return (found && ub ? *ub : 32767) - which;
}

static int shared_cores;  // this machine runs more threads of ranks than it has cores

void neox_comm_set_shared_cores(int shared) { shared_cores = shared; }
int neox_comm_shared_cores(void) { return shared_cores; }

// Between two polls of a wait: a rank with a core to itself yields (sched_yield returns at once
// when nothing else wants the core, so this is MPI_Wait's spin). Where ranks share cores a yield
// is not enough: the yielding rank stays runnable and takes its turn on the core from the peer
// it waits for (stage-3 ranks at dp4 on 2 cores spent a fifth of their time in sched_yield), so
// after a short spin it sleeps, and the peer runs.
static void pause_between_polls(double waited_s) {
    if (!shared_cores || waited_s < SPIN_BEFORE_SLEEP_S) {
        sched_yield();
        return;
    }
    nanosleep(&(struct timespec){0, SLEEP_BETWEEN_POLLS_NS}, NULL);
}

// Polls req until it completes or deadline passes (deadline 0: forever); 1 when it completed.
static int poll_until(MPI_Request *req, MPI_Status *status, double deadline) {
    double start = neox_now();
    for (int done = 0;;) {
        MPI_Test(req, &done, status ? status : MPI_STATUS_IGNORE);
        if (done) return 1;
        double now = neox_now();
        if (deadline > 0 && now > deadline) return 0;
        pause_between_polls(now - start);
    }
}

// Appends the ranks not marked alive to buf, "1, 3".
static void list_silent(const unsigned char *alive, int n, char *buf, size_t size) {
    buf[0] = '\0';
    for (int r = 0; r < n; r++)
        if (!alive[r]) snprintf(buf + strlen(buf), size - strlen(buf), "%s%d", buf[0] ? ", " : "", r);
}

_Noreturn static void collect_reports(const neox_comm *c, neox_comm_op op, int world_size) {
    unsigned char *alive = neox_calloc((size_t)world_size, 1);
    alive[0] = 1;
    int heard = 1, who = 0, ack = 1;
    double deadline = neox_now() + timeout_seconds;
    MPI_Request req;
    MPI_Status status;
    MPI_Irecv(&who, 1, MPI_INT, MPI_ANY_SOURCE, reserved_tag(0), MPI_COMM_WORLD, &req);
    while (heard < world_size && poll_until(&req, &status, deadline)) {
        if (!alive[status.MPI_SOURCE]) heard++;
        alive[status.MPI_SOURCE] = 1;
        MPI_Request sent;
        MPI_Isend(&ack, 1, MPI_INT, status.MPI_SOURCE, reserved_tag(1), MPI_COMM_WORLD, &sent);
        MPI_Request_free(&sent);
        if (heard < world_size) MPI_Irecv(&who, 1, MPI_INT, MPI_ANY_SOURCE, reserved_tag(0), MPI_COMM_WORLD, &req);
    }
    char silent[512];
    list_silent(alive, world_size, silent, sizeof silent);
    if (!silent[0])
        neox_die(NEOX_EXIT_FAILURE, "%s on the %s group made no progress for %g s (comm_timeout_seconds), yet every "
                 "rank responded: the ranks are waiting in different communication calls", neox_comm_op_name(op),
                 c->name, timeout_seconds);
    neox_die(NEOX_EXIT_FAILURE, "%s on the %s group made no progress for %g s (comm_timeout_seconds): rank %s did not "
             "respond (stopped, hung or lost)", neox_comm_op_name(op), c->name, timeout_seconds, silent);
}

_Noreturn static void report_to_rank0(const neox_comm *c, neox_comm_op op, int me) {
    int ack = 0;
    MPI_Request sent, reply;
    MPI_Isend(&me, 1, MPI_INT, 0, reserved_tag(0), MPI_COMM_WORLD, &sent);
    MPI_Irecv(&ack, 1, MPI_INT, 0, reserved_tag(1), MPI_COMM_WORLD, &reply);
    // Rank 0 may time out up to one period later than this rank and then collects for one more.
    if (poll_until(&reply, NULL, neox_now() + 2 * timeout_seconds + 1)) {
        poll_until(&sent, NULL, 0);
        for (;;) pause();  // rank 0 names the silent ranks and ends the job
    }
    neox_die(NEOX_EXIT_FAILURE, "%s on the %s group made no progress for %g s (comm_timeout_seconds): rank 0 did not "
             "respond (stopped, hung or lost)", neox_comm_op_name(op), c->name, timeout_seconds);
}

void neox_comm_wait_mpi(const neox_comm *c, MPI_Request *req, neox_comm_op op) {
    if (host_wait_hook) host_wait_hook();
    if (poll_until(req, NULL, timeout_seconds > 0 ? neox_now() + timeout_seconds : 0)) return;
    int me, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (me == 0) collect_reports(c, op, n);
    report_to_rank0(c, op, me);
}
