// prefetch.c: the next micro-batch read on a background thread while the current one computes
// (num_workers >= 1, as a PyTorch DataLoader's workers read ahead). A batch is a pure function of
// its iterator's dataset, slice and position, so the thread reads from a copy of the iterator and
// the caller takes the result only when its own iterator asks for exactly that batch; anything
// else (an evaluation between training steps, a seek, a failed read) is read again in the
// caller's thread, so batches — and errors — are the ones the synchronous reader gives.
#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"

struct neox_prefetch {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    neox_batch_iterator job;   // a copy of the iterator at the batch to read next
    neox_batch_iterator done;  // the iterator of the batch in spare (when ready)
    neox_batch *spare;         // where the thread reads
    int queued;                // job is set and not yet begun
    int reading;               // the thread is reading into spare
    int discard;               // the read in progress is no longer wanted
    int ready;                 // spare holds done's batch (rc, err its outcome)
    int stop;
    int rc;
    neox_error err;
};

static void *reader(void *arg) {
    neox_prefetch *p = arg;
    // The lowest priority (Linux nices threads one by one): waking the reader must not preempt
    // the training thread on a busy core; a reader that gets no time is simply read around.
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!p->queued && !p->stop) pthread_cond_wait(&p->changed, &p->lock);
        if (p->stop) break;
        neox_batch_iterator it = p->job, begun = p->job;  // neox_batch_next advances it
        neox_batch *into = p->spare;
        p->queued = 0, p->reading = 1, p->ready = 0;
        pthread_mutex_unlock(&p->lock);
        neox_error err = {0};
        int rc = neox_batch_next(&it, into, &err);  // the dataset is read-only: no lock needed
        pthread_mutex_lock(&p->lock);
        p->reading = 0;
        if (!p->discard) p->ready = 1, p->done = begun, p->rc = rc, p->err = err;
        p->discard = 0;
        pthread_cond_broadcast(&p->changed);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

neox_prefetch *neox_prefetch_start(int micro_batch, int seq_length) {
    neox_prefetch *p = neox_calloc(1, sizeof *p);
    p->spare = neox_batch_alloc(micro_batch, seq_length);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->changed, NULL);
    int e = pthread_create(&p->thread, NULL, reader, p);
    if (e != 0) {
        // Prefetching only hides the read; the batches are the same read in the training thread, so
        // a system out of threads costs speed, not the run.
        neox_warn("cannot start the data prefetch thread: %s; batches are read in the training thread", strerror(e));
        pthread_cond_destroy(&p->changed);
        pthread_mutex_destroy(&p->lock);
        neox_batch_free(p->spare);
        free(p);
        return NULL;
    }
    return p;
}

void neox_prefetch_free(neox_prefetch *p) {
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    while (p->reading) pthread_cond_wait(&p->changed, &p->lock);  // let a read in flight finish
    p->stop = 1;
    pthread_cond_broadcast(&p->changed);
    pthread_mutex_unlock(&p->lock);
    pthread_join(p->thread, NULL);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->changed);
    neox_batch_free(p->spare);
    free(p);
}

static int same_batch(const neox_batch_iterator *a, const neox_batch_iterator *b) {
    return a->dataset == b->dataset && a->micro_batch == b->micro_batch && a->dp_size == b->dp_size &&
           a->dp_rank == b->dp_rank && a->position == b->position && a->eod_id == b->eod_id &&
           a->eod_mask_loss == b->eod_mask_loss;
}

// Whether the prefetched batch is it's, read without error. Never waits: a read not begun is
// withdrawn and one in progress discarded (on a busy host the thread may be waiting for a core,
// and the caller reads sooner itself).
static int take_ready(neox_prefetch *p, const neox_batch_iterator *it) {
    pthread_mutex_lock(&p->lock);
    int hit = p->ready && p->rc == 0 && same_batch(&p->done, it);
    if (p->reading) p->discard = 1;
    p->queued = 0, p->ready = 0;
    pthread_mutex_unlock(&p->lock);
    return hit;
}

int neox_prefetch_next(neox_prefetch *p, neox_batch_iterator *it, neox_batch **b, neox_error *err) {
    if (take_ready(p, it)) {
        neox_batch *got = p->spare;
        p->spare = *b, *b = got;
        it->position++;
    } else if (neox_batch_next(it, *b, err) != 0) {
        return -1;
    }
    pthread_mutex_lock(&p->lock);
    p->job = *it, p->queued = 1;
    pthread_cond_broadcast(&p->changed);
    pthread_mutex_unlock(&p->lock);
    return 0;
}
