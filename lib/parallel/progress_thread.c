// progress_thread.c: a thread that moves non-blocking communication on while its owner computes.
// MPI advances a non-blocking collective only inside MPI calls. Polls made between the backward
// pass's operations leave a slow link idle for most of each long operation once the socket
// buffers have drained; this thread calls its owner's progress function every `interval` while
// armed and sleeps in between (nanosleep: it blocks, it does not spin), so it costs a core only
// for the polls themselves. Unarmed, it waits on a condition variable and costs nothing.
// The function runs with the thread's mutex held: state it shares with the owner is guarded by
// taking the same mutex (neox_progress_thread_lock), and once the owner holds it the function is
// not running, so disarming under the lock is enough to have the thread leave the state alone.
// Calls into MPI from two threads need MPI_THREAD_MULTIPLE (neox_parallel_thread_multiple).
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "parallel.h"

struct neox_progress_thread {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    void (*fn)(void *ctx);
    void *ctx;
    struct timespec interval;
    int armed, stopping;
    int64_t polls;
};

static void *run(void *arg) {
    neox_progress_thread *p = arg;
    pthread_mutex_lock(&p->lock);
    while (!p->stopping) {
        if (!p->armed) {
            pthread_cond_wait(&p->wake, &p->lock);
            continue;
        }
        p->fn(p->ctx);
        p->polls++;
        pthread_mutex_unlock(&p->lock);
        struct timespec left = p->interval;
        while (nanosleep(&left, &left) != 0 && errno == EINTR) {}
        pthread_mutex_lock(&p->lock);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

neox_progress_thread *neox_progress_thread_start(void (*fn)(void *ctx), void *ctx, double interval_seconds) {
    neox_progress_thread *p = neox_calloc(1, sizeof *p);
    p->fn = fn, p->ctx = ctx;
    long ns = (long)(interval_seconds * 1e9 + 0.5);
    p->interval.tv_sec = ns / 1000000000L;
    p->interval.tv_nsec = ns % 1000000000L;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    int e = pthread_create(&p->thread, NULL, run, p);
    if (e != 0) {
        // The thread only moves communication on sooner; without it the owner's own tests do, so
        // a system out of threads costs overlap, not the run.
        neox_warn("cannot start the communication progress thread: %s; non-blocking communication moves on "
                  "only when the main thread tests it", strerror(e));
        pthread_cond_destroy(&p->wake);
        pthread_mutex_destroy(&p->lock);
        free(p);
        return NULL;
    }
    return p;
}

void neox_progress_thread_lock(neox_progress_thread *p) { pthread_mutex_lock(&p->lock); }
void neox_progress_thread_unlock(neox_progress_thread *p) { pthread_mutex_unlock(&p->lock); }

void neox_progress_thread_arm(neox_progress_thread *p) {
    if (!p->armed) p->armed = 1, pthread_cond_signal(&p->wake);
}

void neox_progress_thread_disarm(neox_progress_thread *p) { p->armed = 0; }

int64_t neox_progress_thread_polls(const neox_progress_thread *p) { return p->polls; }

void neox_progress_thread_stop(neox_progress_thread *p) {
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    p->stopping = 1;
    pthread_cond_signal(&p->wake);
    pthread_mutex_unlock(&p->lock);
    pthread_join(p->thread, NULL);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->lock);
    free(p);
}
