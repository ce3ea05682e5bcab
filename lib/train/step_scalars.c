// step_scalars.c: the values of an update that change from step to step and that the optimizer's
// ops read from the backend's memory (kernels.h, neox_step_scalars: the learning rate and the update's
// step count), so that a captured step (graph.c) replays with each step's own. The one owner of the
// block: one copy on the backend, one in page-locked host memory. Before each update the host writes
// the host copy and queues one asynchronous copy up, which the update waits for on the device, not the
// host; a replayed capture makes that copy again from the same host copy, which the host rewrote.
//
// The other values a step passes by value and that may change (the loss scale, which clip_by_norm and
// the loss's backward take; each micro-batch's loss-mask sum) stay arguments: graph.c keys the capture
// on them and captures afresh when they change, which they rarely do.
#include "internal.h"

struct neox_step_scalars_block {
    neox_step_scalars *device;  // (1) on t->be
    neox_step_scalars *host;    // (1) host_alloc'ed: its source
    int64_t ticket;             // the last copy up
};

void neox_train_step_scalars_setup(neox_trainer *t) {
    neox_step_scalars_block *b = neox_calloc(1, sizeof *b);
    b->device = t->be->alloc(sizeof *b->device);
    b->host = t->be->host_alloc(sizeof *b->host);
    *b->host = (neox_step_scalars){0};
    t->scalars = b;
}

void neox_train_step_scalars_free(neox_trainer *t) {
    neox_step_scalars_block *b = t->scalars;
    if (!b) return;
    t->be->host_wait(b->ticket);  // (no copy may still read memory freed here)
    t->be->host_free(b->host);
    t->be->free(b->device);
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
