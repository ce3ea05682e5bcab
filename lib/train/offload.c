// offload.c: ZeRO-Offload of the optimizer (DeepSpeed's zero_optimization.offload_optimizer with
// device cpu, its older cpu_offload: true, and GPT-NeoX's optimizer.type cpu_adam). On a device
// backend the optimizer state and an fp32 copy of the weights it updates (this rank's range
// [state_begin, state_end): its ZeRO partition, or all of it) live in host memory. On the CPU
// backend everything already is host memory: a notice says that the keys change nothing.
//
// The copies run on the backend's copy queue (kernels/backend.h), beside the device's work:
// - gradients go to the host as backward finishes them, where nothing changes them after backward
//   (one data-parallel rank, one stage: the model reports each parameter's final gradient, and the
//   copy is queued then) and the host buffers are page-locked (pin_memory); the rest at the step;
// - the update runs on the host unit by unit in the order forward reads them (embedding, layers,
//   head), each unit's weights queued back to the device as soon as it is updated, so the copy of
//   one unit runs while the host updates the next;
// - where each rank updates every weight it reads (no ZeRO partition to all-gather first), the next
//   forward waits for each unit's copy just before it reads that unit (the model's weights_use
//   hook), so the last units' copies run behind the first units' compute; else every copy is waited
//   for before the partitions are gathered.
// Readers of the weights outside a pass (checkpoints, norms, tasks) call neox_train_offload_settle.
// A trainer part (parts.c): set-up, start, free, the step's start, its memory and its copies in
// comm_stats.json are its hooks.
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal.h"

// What the copies did over the run (comm_stats.json's "offload").
typedef struct neox_offload_stats {
    int64_t steps;                  // updates on the host
    int64_t grad_bytes;             // gradient bytes copied to the host
    int64_t grad_bytes_in_backward; // of them, queued while backward ran
    int64_t units_copied;           // units' updated weights queued back to the device
    int64_t units_waited_by_forward;  // of them, waited for by the next forward just before it read them
} neox_offload_stats;

typedef struct neox_offload {
    float *params, *grads;        // host copies of [state_begin, state_end)
    int pinned;                   // both from the backend's host_alloc (page-locked), else malloc
    size_t n;                     // state_end - state_begin
    int stream_grads;             // gradients are queued as backward finishes them
    int defer_weights;            // forward waits for each unit's weights (the hook is installed)
    char *streamed;               // (nparams) this step's gradient of parameter p is queued already
    int64_t grads_ticket;         // the last gradient copy queued
    int nunits;
    size_t *unit_begin, *unit_end;  // (nunits) each unit's elements in the flat buffer
    int64_t *unit_ticket;         // (nunits) the copy of a unit's updated weights not yet waited for, or 0
    int64_t weights_ticket;       // the last weight copy queued
    float grad_scale;             // clipping for an optimizer that does not scale what it reads (SGD)
    neox_offload_stats stats;
} neox_offload;

extern const neox_train_part neox_train_offload_part;

// The part's state: NULL when the optimizer is not offloaded.
static neox_offload *offload_of(const neox_trainer *t) { return *neox_train_part_slot(t, &neox_train_offload_part); }

int neox_train_offloaded(const neox_trainer *t) { return offload_of(t) != NULL; }

static int asks_offload(const neox_trainer *t) {
    const neox_value *dict = neox_config_sub(t->cfg, zero_optimization__offload_optimizer);
    const neox_value *dev = dict ? neox_config_sub(t->cfg, zero_optimization__offload_optimizer__device) : NULL;
    const neox_value *old = neox_config_sub(t->cfg, zero_optimization__cpu_offload);
    return t->optim.host || (dev && dev->kind == NEOX_VALUE_STRING && !strcasecmp(dev->string, "cpu")) ||
           (old && old->kind == NEOX_VALUE_BOOL && old->boolean);
}

static int asks_pinned(const neox_trainer *t) {
    const neox_value *pin = neox_config_sub(t->cfg, zero_optimization__offload_optimizer__pin_memory);
    return pin && pin->kind == NEOX_VALUE_BOOL && pin->boolean;
}

static float *host_buffer(const neox_trainer *t, size_t n) {
    size_t bytes = (n + 1) * sizeof(float);
    return offload_of(t)->pinned ? t->be->host_alloc(bytes) : neox_malloc(bytes);
}

static void free_host_buffer(const neox_trainer *t, float *p) {
    if (offload_of(t)->pinned) t->be->host_free(p);
    else free(p);
}

// Each unit's elements (units are runs of parameters in buffer order; under expert parallelism the
// experts, stored after everything else, fall in the last unit's run).
static void find_units(neox_trainer *t) {
    neox_offload *o = offload_of(t);
    const neox_model *m = t->model;
    o->nunits = neox_model_unit_count(&m->desc);
    int *first = neox_malloc((size_t)(o->nunits + 1) * sizeof(int));
    neox_model_unit_params(m, first);
    o->unit_begin = neox_calloc((size_t)o->nunits, sizeof(size_t));
    o->unit_end = neox_calloc((size_t)o->nunits, sizeof(size_t));
    o->unit_ticket = neox_calloc((size_t)o->nunits, sizeof(int64_t));
    for (int u = 0; u < o->nunits; u++) {
        int last = first[u + 1];  // (first[nunits] is nparams)
        if (first[u] >= last) continue;
        o->unit_begin[u] = m->params[first[u]].offset;
        o->unit_end[u] = m->params[last - 1].offset + m->params[last - 1].numel;
    }
    free(first);
}

static void wait_unit(neox_trainer *t, int u) {
    neox_offload *o = offload_of(t);
    t->be->device_wait(o->unit_ticket[u]);
    neox_model_refresh_range(t->model, o->unit_begin[u], o->unit_end[u]);  // (queued after the wait)
    o->unit_ticket[u] = 0;
}

static void on_weights_use(void *ctx, int unit, int use) {
    neox_trainer *t = ctx;
    neox_offload *o = offload_of(t);
    if (!use || unit >= o->nunits || !o->unit_ticket[unit]) return;
    wait_unit(t, unit);
    o->stats.units_waited_by_forward++;
}

// Once [state_begin, state_end) is known, before the optimizer is made: whether its state goes to
// the host (a notice on a host backend, where nothing moves).
static int setup_offload(neox_trainer *t, neox_error *err) {
    if (!asks_offload(t)) return 0;
    // (The offloaded update runs unit by unit; SM3's accumulators take the maxima of a whole step.
    // DeepSpeed's ZeRO-Offload is for its CPU Adam too.)
    if (neox_optimizer_type_of(t->optim.kind)->per_tensor)
        return neox_fail(err, NEOX_EXIT_USAGE, "zero_optimization.offload_optimizer: optimizer.type %s cannot be "
                         "offloaded (ZeRO-Offload runs Adam on the host)", neox_optimizer_type_of(t->optim.kind)->name);
    int pinned = asks_pinned(t);
    if (!t->be->on_device) {
        if (t->rank0 && !t->opts.quiet)
            neox_notice("optimizer offload (cpu_adam, offload_optimizer.device cpu or cpu_offload): nothing to move, "
                        "compute_backend %s keeps the optimizer in host memory already%s", t->be->name,
                        pinned ? " (and offload_optimizer.pin_memory has nothing to pin)" : "");
        return 0;
    }
    neox_offload *o = neox_calloc(1, sizeof *o);
    *neox_train_part_slot(t, &neox_train_offload_part) = o;
    neox_model *m = t->model;
    o->n = t->state_end - t->state_begin;
    o->pinned = pinned;
    o->params = host_buffer(t, o->n);
    o->grads = host_buffer(t, o->n);
    o->grad_scale = 1.0f;
    o->streamed = neox_calloc((size_t)m->nparams + 1, 1);
    find_units(t);
    // Backward's final gradients are the step's where no reduction or pipeline sum follows it. From
    // pageable memory a GPU's copy to the host makes the host wait for it (and for the kernels
    // queued before it), which in backward would hold up every launch: then they go at the step.
    o->stream_grads = pinned && !neox_grad_exchange_reduces(t->exchange) && t->grid->pipe_size == 1;
    if (o->stream_grads) neox_train_install_grad_hook(t);
    // The hook owns the 16-bit copy, so forward may wait per unit only where this rank updates the
    // whole model it reads (nothing to all-gather) and each unit is one run (no experts after the head).
    o->defer_weights = o->n == m->num_floats && m->dense_params == m->nparams && !m->weights_use;
    return 0;
}

int neox_train_offload_pinned(const neox_trainer *t) { return offload_of(t) && offload_of(t)->pinned; }

const neox_backend *neox_train_optimizer_backend(const neox_trainer *t) { return offload_of(t) ? neox_backend_cpu() : t->be; }

// After the weights are initialised or loaded: the host copy of the range the optimizer updates.
static void offload_take_weights(neox_trainer *t) {
    neox_offload *o = offload_of(t);
    if (!o) return;
    neox_model *m = t->model;
    t->be->to_host(o->params, m->param_buf + t->state_begin, o->n * sizeof(float));
    if (!o->defer_weights) return;
    neox_model_refresh_range(m, 0, m->num_floats);  // (the hook keeps the 16-bit copy from here on)
    m->param16_stale = 0;
    m->weights_use = on_weights_use;
    m->weights_use_ctx = t;
}

// Before a step's gradients are zeroed: no gradient of it is on its way to the host yet.
static void offload_begin_step(neox_trainer *t) {
    neox_offload *o = offload_of(t);
    if (!o) return;
    // A skipped step's copies may still be reading the gradients this step is about to zero.
    t->be->host_wait(o->grads_ticket);
    memset(o->streamed, 0, (size_t)t->model->nparams);
}

// Queues the gradient of [begin, end) of the flat buffer (its part in the state range) to the host.
static void queue_grads(neox_trainer *t, const float *grads, size_t begin, size_t end, int in_backward) {
    neox_offload *o = offload_of(t);
    size_t lo, hi;
    if (!neox_overlap(begin, end, t->state_begin, t->state_end, &lo, &hi)) return;
    size_t at = lo - t->state_begin, bytes = (hi - lo) * sizeof(float);
    o->grads_ticket = t->be->to_host_async(o->grads + at, grads + at, bytes);
    o->stats.grad_bytes += bytes;
    if (in_backward) o->stats.grad_bytes_in_backward += bytes;
}

// Backward's gradients on the step's last micro-batch go to the host as each parameter's is final.
static void offload_grads_ready(neox_trainer *t, int begin, int end) {
    neox_offload *o = offload_of(t);
    if (!o || !o->stream_grads) return;
    const neox_model *m = t->model;
    for (int p = begin; p < end; p++) {
        if (o->streamed[p]) continue;
        o->streamed[p] = 1;
        queue_grads(t, m->grad_buf + t->state_begin, m->params[p].offset, m->params[p].offset + m->params[p].numel, 1);
    }
}

// The gradients backward did not send: runs of parameters in buffer order, one copy each.
static void queue_rest_of_grads(neox_trainer *t, const float *grads) {
    neox_offload *o = offload_of(t);
    const neox_model *m = t->model;
    for (int p = 0; p < m->nparams;) {
        if (o->streamed[p]) {
            p++;
            continue;
        }
        int q = p;
        while (q < m->nparams && !o->streamed[q]) o->streamed[q++] = 1;
        queue_grads(t, grads, m->params[p].offset, m->params[q - 1].offset + m->params[q - 1].numel, 0);
        p = q;
    }
}

void neox_train_offload_scale_grads(neox_trainer *t, double coef) { offload_of(t)->grad_scale = (float)coef; }

// One unit's update: the segments from *next that begin before end (relative to state_begin; the
// segments follow the buffer, and units begin and end at parameter boundaries).
static void update_run(neox_trainer *t, const neox_segment *segs, int nseg, size_t end, double lr, int64_t step,
                       int *next) {
    int first = *next;
    while (*next < nseg && segs[*next].begin < end) (*next)++;
    if (*next > first) neox_optimizer_step(t->optimizer, offload_of(t)->params, offload_of(t)->grads, segs + first,
                                           *next - first, lr, step);
}

void neox_train_offload_step(neox_trainer *t, const float *grads, const neox_segment *segs, int nseg, double lr,
                             int64_t step) {
    neox_offload *o = offload_of(t);
    const neox_backend *be = t->be;
    queue_rest_of_grads(t, grads);
    be->host_wait(o->grads_ticket);  // (and the last step's weight copies, queued before them)
    if (o->grad_scale != 1.0f) neox_backend_cpu()->scale(o->grads, o->n, o->grad_scale);
    o->grad_scale = 1.0f;
    int next = 0;
    for (int u = 0; u < o->nunits; u++) {
        size_t lo, hi;
        if (!neox_overlap(o->unit_begin[u], o->unit_end[u], t->state_begin, t->state_end, &lo, &hi)) continue;
        size_t at = lo - t->state_begin;
        update_run(t, segs, nseg, hi - t->state_begin, lr, step, &next);
        o->weights_ticket = be->to_device_async(t->model->param_buf + lo, o->params + at, (hi - lo) * sizeof(float));
        o->stats.units_copied++;
        if (o->defer_weights) o->unit_ticket[u] = o->weights_ticket;
    }
    o->stats.steps++;
    if (!o->defer_weights) be->device_wait(o->weights_ticket);  // (the copies run in order)
}

void neox_train_offload_settle(neox_trainer *t) {
    neox_offload *o = offload_of(t);
    for (int u = 0; o && u < o->nunits; u++)
        if (o->unit_ticket[u]) wait_unit(t, u);
}

static void free_offload(neox_trainer *t) {
    neox_offload *o = offload_of(t);
    if (!o) return;
    t->be->synchronize();  // (no copy may still write host memory freed here)
    free_host_buffer(t, o->params);
    free_host_buffer(t, o->grads);
    free(o->streamed), free(o->unit_begin), free(o->unit_end), free(o->unit_ticket);
    free(o);
    *neox_train_part_slot(t, &neox_train_offload_part) = NULL;
}

// The optimizer state, and the host copies of the weights and gradients it updates from, live in
// host memory instead of the device's.
static void offload_memory(const neox_trainer *t, neox_memory_plan *p) {
    if (!offload_of(t)) return;
    double n = (double)(t->state_end - t->state_begin);
    double state = n * (double)neox_optimizer_state_bytes_per_element(&t->optim);
    p->optimizer -= state;
    p->offloaded += state + n * 8;
}

static json_t *stats_json(const neox_offload_stats *s) {
    return json_pack("{s:I, s:I, s:I, s:I, s:I}", "steps", (json_int_t)s->steps, "grad_bytes", (json_int_t)s->grad_bytes,
                     "grad_bytes_in_backward", (json_int_t)s->grad_bytes_in_backward, "units_copied",
                     (json_int_t)s->units_copied, "units_waited_by_forward", (json_int_t)s->units_waited_by_forward);
}

// Every rank's copies over the run, as "offload" of each rank that updated on the host.
static void offload_report(neox_trainer *t, json_t *doc) {
    neox_offload_stats mine = offload_of(t) ? offload_of(t)->stats : (neox_offload_stats){0};
    json_t *ranks;
    neox_offload_stats *all = neox_train_gather_rank_stats(t, &mine, sizeof mine, doc, &ranks);
    for (int r = 0; ranks && r < t->grid->world_size; r++)
        if (all[r].steps > 0) json_object_set_new(json_array_get(ranks, (size_t)r), "offload", stats_json(&all[r]));
    free(all);
}

const neox_train_part neox_train_offload_part = {
    .name = "optimizer offload",
    .stage = NEOX_PART_AFTER_PARTITION,
    .setup = setup_offload,
    .start = offload_take_weights,
    .free = free_offload,
    .memory = offload_memory,
    .report = offload_report,
    .begin_step = offload_begin_step,
    .grads_ready = offload_grads_ready,
};
