// step_scalars.c: the values of a step that change from step to step and that the step's ops read
// from the backend's memory, so that a captured step (graph.c) replays with each step's own. The one
// owner of two blocks, each one copy on the backend and one in page-locked host memory:
// - the update's (kernels.h, neox_step_scalars: the learning rate and the update's step count), which
//   the optimizer's ops read. Before each update the host writes the host copy and queues one
//   asynchronous copy up, which the update waits for on the device, not the host;
// - the staged step's (staged_scalars), which a captured step's other kernels read: the loss scale
//   (clip_by_norm's) and one entry per micro-batch (the first row of its dropout masks among all rows
//   that drew masks; its loss gradient's scale, the loss scale over its mask's sum). The host writes
//   them while it stages the step's inputs, and the capture copies them up as it begins.
// A replayed capture makes those copies again from the same host copies, which the host rewrote, so
// nothing a step passes by value changes between replays.
#include <string.h>

#include "internal.h"

// What a captured step's kernels read besides the update's values: written while the step is staged.
typedef struct micro_scalars {
    unsigned long long dropout_row0;  // the micro-batch's first row among all rows that drew masks
    float head_scale;                 // its loss gradient's scale (neox_model_head_scale)
    float unused;
} micro_scalars;
typedef struct staged_scalars {
    double loss_scale;       // the loss scale this step's backward takes (clip_by_norm unscales by it)
    double unused;
    micro_scalars micro[];   // (grad_accum)
} staged_scalars;

struct neox_step_scalars_block {
    neox_step_scalars *device;  // (1) on t->be
    neox_step_scalars *host;    // (1) host_alloc'ed: its source
    int64_t ticket;             // the last copy up
    staged_scalars *staged_device, *staged_host;  // likewise, for the staged step
    size_t staged_bytes;
    int64_t staged_ticket;
};

void neox_train_step_scalars_setup(neox_trainer *t) {
    neox_step_scalars_block *b = neox_calloc(1, sizeof *b);
    b->staged_bytes = sizeof *b->staged_host + (size_t)t->grad_accum * sizeof b->staged_host->micro[0];
    b->device = t->be->alloc(sizeof *b->device);
    b->host = t->be->host_alloc(sizeof *b->host);
    *b->host = (neox_step_scalars){0};
    b->staged_device = t->be->alloc(b->staged_bytes);
    b->staged_host = t->be->host_alloc(b->staged_bytes);
    memset(b->staged_host, 0, b->staged_bytes);
    t->scalars = b;
}

void neox_train_step_scalars_free(neox_trainer *t) {
    neox_step_scalars_block *b = t->scalars;
    if (!b) return;
    t->be->host_wait(b->ticket);  // (no copy may still read memory freed here)
    t->be->host_wait(b->staged_ticket);
    t->be->host_free(b->host);
    t->be->free(b->device);
    t->be->host_free(b->staged_host);
    t->be->free(b->staged_device);
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

// The host copy of the staged step: its source, which the last launch's copy read long since (the
// previous step is settled before the next is staged).
static staged_scalars *staged_host(neox_trainer *t) {
    neox_step_scalars_block *b = t->scalars;
    t->be->host_wait(b->staged_ticket);
    return b->staged_host;
}

void neox_train_step_scalars_set_micro(neox_trainer *t, int k, unsigned long long dropout_row0, float head_scale) {
    neox_assert(k >= 0 && k < t->grad_accum, "micro-batch %d of a step of %d", k, t->grad_accum);
    micro_scalars *e = &staged_host(t)->micro[k];
    e->dropout_row0 = dropout_row0;
    e->head_scale = head_scale;
}

void neox_train_step_scalars_set_loss_scale(neox_trainer *t, double loss_scale) {
    staged_host(t)->loss_scale = loss_scale;
}

void neox_train_step_scalars_send_staged(neox_trainer *t) {
    neox_step_scalars_block *b = t->scalars;
    b->staged_ticket = t->be->to_device_async(b->staged_device, b->staged_host, b->staged_bytes);
    t->be->device_wait(b->staged_ticket);
}

const unsigned long long *neox_train_step_scalars_dropout_row(const neox_trainer *t, int k) {
    return &t->scalars->staged_device->micro[k].dropout_row0;
}

const float *neox_train_step_scalars_head_scale(const neox_trainer *t, int k) {
    return &t->scalars->staged_device->micro[k].head_scale;
}

const double *neox_train_step_scalars_loss_scale(const neox_trainer *t) {
    return &t->scalars->staged_device->loss_scale;
}
