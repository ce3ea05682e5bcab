// step_scalars.c: the values of a step that change from step to step and that the step's ops read
// from the backend's memory, so that a captured step (graph.c) replays with each step's own. The one
// owner of two blocks, each one copy on the backend and one in page-locked host memory:
// - the update's (kernels.h, neox_step_scalars: the learning rate and the update's step count), which
//   the optimizer's ops read. Before each update the host writes the host copy and queues one
//   asynchronous copy up, which the update waits for on the device, not the host;
// - one entry per micro-batch of a captured step (micro_scalars: the first row of its dropout masks
//   among all rows that drew masks), which the dropout and attention kernels read. The host writes a
//   step's entries while it stages the step's inputs, and the capture copies them up as it begins.
// A replayed capture makes those copies again from the same host copies, which the host rewrote.
//
// The other values a step passes by value and that may change (the loss scale, which clip_by_norm and
// the loss's backward take; each micro-batch's loss-mask sum) stay arguments: graph.c keys the capture
// on them and captures afresh when they change, which they rarely do.
#include <string.h>

#include "internal.h"

// What a micro-batch's kernels read in a captured step.
typedef struct micro_scalars {
    unsigned long long dropout_row0;  // the micro-batch's first row among all rows that drew masks
} micro_scalars;

struct neox_step_scalars_block {
    neox_step_scalars *device;  // (1) on t->be
    neox_step_scalars *host;    // (1) host_alloc'ed: its source
    int64_t ticket;             // the last copy up
    micro_scalars *micro_device, *micro_host;  // (grad_accum) likewise, one per micro-batch
    int64_t micro_ticket;
};

void neox_train_step_scalars_setup(neox_trainer *t) {
    neox_step_scalars_block *b = neox_calloc(1, sizeof *b);
    size_t micro_bytes = (size_t)t->grad_accum * sizeof *b->micro_host;
    b->device = t->be->alloc(sizeof *b->device);
    b->host = t->be->host_alloc(sizeof *b->host);
    *b->host = (neox_step_scalars){0};
    b->micro_device = t->be->alloc(micro_bytes);
    b->micro_host = t->be->host_alloc(micro_bytes);
    memset(b->micro_host, 0, micro_bytes);
    t->scalars = b;
}

void neox_train_step_scalars_free(neox_trainer *t) {
    neox_step_scalars_block *b = t->scalars;
    if (!b) return;
    t->be->host_wait(b->ticket);  // (no copy may still read memory freed here)
    t->be->host_wait(b->micro_ticket);
    t->be->host_free(b->host);
    t->be->free(b->device);
    t->be->host_free(b->micro_host);
    t->be->free(b->micro_device);
    free(b);
    t->scalars = NULL;
}

void neox_train_step_scalars_write(neox_trainer *t, double lr, int64_t step) {
    neox_step_scalars_block *b = t->scalars;
    t->be->host_wait(b->ticket);  // (the last copy read the host copy long since: a step ago)
    b->host->lr = (float)lr;
    b->host->step = step;
}

const neox_step_scalars *neox_train_step_scalars_send(neox_trainer *t) {
    neox_step_scalars_block *b = t->scalars;
    b->ticket = t->be->to_device_async(b->device, b->host, sizeof *b->host);
    t->be->device_wait(b->ticket);
    return b->device;
}

void neox_train_step_scalars_set_micro(neox_trainer *t, int k, unsigned long long dropout_row0) {
    neox_step_scalars_block *b = t->scalars;
    neox_assert(k >= 0 && k < t->grad_accum, "micro-batch %d of a step of %d", k, t->grad_accum);
    t->be->host_wait(b->micro_ticket);  // (the last launch's copy: done, as the previous step is settled)
    b->micro_host[k].dropout_row0 = dropout_row0;
}

void neox_train_step_scalars_send_micro(neox_trainer *t) {
    neox_step_scalars_block *b = t->scalars;
    b->micro_ticket = t->be->to_device_async(b->micro_device, b->micro_host, (size_t)t->grad_accum * sizeof *b->micro_host);
    t->be->device_wait(b->micro_ticket);
}

const unsigned long long *neox_train_step_scalars_dropout_row(const neox_trainer *t, int k) {
    return &t->scalars->micro_device[k].dropout_row0;
}
