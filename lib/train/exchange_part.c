// exchange_part.c: the gradient exchange's compressors and adaptive plan (compression.c,
// adaptive_compression.c, their checkpointed state in checkpoint.c) as a trainer part: their hooks
// into the step, checkpoints, the memory plan and the communication report. Their set-up and free
// stay with the reducer's (setup.c), which they are made with.
#include "internal.h"

static int save_exchange(const neox_trainer *t, neox_ckpt_writer *w, json_t *run_state, neox_error *err) {
    return neox_train_save_exchange_state(t, w, run_state, err);
}

static int load_exchange(neox_trainer *t, const neox_part_loading *from, neox_error *err) {
    return neox_train_load_exchange_state(t, from, err);
}

// The compressors' error buffers; adaptive compression may put any bucket on a bf16 wire, whose
// copy is allocated when first used.
static void exchange_memory(const neox_trainer *t, neox_memory_plan *p) {
    if (t->adaptive && t->reducer && !neox_grad_reducer_wire_bytes(t->reducer))
        p->comm += (double)neox_grad_reducer_size(t->reducer) * 2;
    const char *names[6];
    float *bufs[6];
    size_t counts[6];
    int n = neox_train_onebit_buffers(t, names, bufs, counts);
    for (int i = 0; i < n; i++) p->comm += (double)counts[i] * 4;
}

// gradient_compression: adaptive: per bucket, the steps reduced with each scheme.
static void exchange_report(neox_trainer *t, json_t *doc) {
    json_t *adaptive = doc ? neox_train_adaptive_summary(t) : NULL;
    if (adaptive) json_object_set_new(doc, "gradient_compression_buckets", adaptive);
}

// The adaptive plan's decision may hand a compressor's error to the zeroed gradients; then whether
// this step leaves its gradients unreduced.
static void exchange_begin_micro_batches(neox_trainer *t) {
    neox_train_adaptive_begin_step(t);
    t->local_grads = neox_train_local_grads(t);
}

static void exchange_end_micro_batches(neox_trainer *t) { neox_train_adaptive_end_step(t); }

const neox_train_part neox_train_exchange_part = {
    .name = "gradient exchange",
    .save = save_exchange,
    .load = load_exchange,
    .memory = exchange_memory,
    .report = exchange_report,
    .begin_micro_batches = exchange_begin_micro_batches,
    .end_micro_batches = exchange_end_micro_batches,
};
