// graph.c: the training step captured once and replayed (`cuda_graph: true`; docs/cuda.md, "CUDA
// graphs"). On one rank on the late-read path (step.c), after GRAPH_WARMUP_STEPS eager steps (the
// backend's scratch and segment tables reach their size then, so nothing is allocated inside the
// capture) the step's device work is recorded once (the backend's graph_begin/graph_end: a CUDA graph,
// or the emulated device's twin) and every later step replays it with graph_launch. Before each step
// the host settles the previous one (its update count and fp16 scale decide this one: the dynamic
// scaler's decision stays on the host, a step late, as without graphs), reads the step's micro-batches
// into the model's page-locked staging sets (micro-batch k into set k, which the capture copies from)
// and writes the step scalars (the learning rate and the update count; the loss scale, each
// micro-batch's dropout row and loss gradient scale, which the capture copies up): so what changes
// between steps reaches the replay through memory, and one capture serves the whole run.
// Where the step cannot be captured set-up says which feature stops it, and the run trains eagerly.
#include <stdlib.h>
#include <string.h>

#include "internal.h"

enum { GRAPH_WARMUP_STEPS = 2 };

struct neox_graph {
    int captured;
    int warmup_left;         // eager steps still to run
    int64_t captures, replays;
    int frozen_lr;           // NEOX_TEST_GRAPH_FREEZE_LR: a replay leaves the learning rate as captured
    double captured_lr;      // (the capture's learning rate, for that test hook)
};

// Why this run's step cannot be captured (NULL: it can). The late read (t->late) already means one
// rank, AdamW, SGD or Lion on the device and the language model's loss with nothing read back inside the step.
static const char *cannot_capture(const neox_trainer *t) {
    const neox_model_desc *d = &t->model->desc;
    if (!t->be->graph_begin)
        return neox_profile_inner() ? "wall_clock_breakdown (the per-op profile times every op as it runs)"
                                    : "this compute_backend (no device stream to capture)";
    if (t->grid->world_size > 1) return "several ranks (collectives and the gradient norm go through MPI)";
    if (!t->late) return "the step reads values back while it runs (optimizer not AdamW, SGD or Lion, offload, a "
                         "part that replaces the loss or logs from the step's state)";
    if (d->moe_experts > 1) return "Mixture of Experts (routing is computed on the host)";
    if (d->recompute_inputs_on_host) return "recompute_inputs_on_host (synchronous copies inside the step)";
    if (neox_config_bool(t->cfg, sparse_gradients)) return "sparse_gradients (the touched rows are read on the host)";
    return NULL;
}

int neox_train_graph_setup(neox_trainer *t, neox_error *err) {
    (void)err;
    if (!neox_config_bool(t->cfg, cuda_graph)) return 0;
    const char *why = cannot_capture(t);
    if (why) {
        if (t->rank0 && !t->opts.quiet) neox_notice("cuda_graph: the step runs eagerly: %s", why);
        return 0;
    }
    neox_graph *g = neox_calloc(1, sizeof *g);
    g->warmup_left = GRAPH_WARMUP_STEPS;
    const char *freeze = getenv("NEOX_TEST_GRAPH_FREEZE_LR");
    g->frozen_lr = freeze && *freeze && strcmp(freeze, "0") != 0;
    t->graph = g;
    // One staging set per micro-batch: a capture copies micro-batch k from set k at every launch.
    neox_model_set_input_sets(t->model, t->grad_accum);
    if (t->rank0 && !t->opts.quiet)
        neox_info("cuda_graph: the step is captured after %d eager steps and replayed", GRAPH_WARMUP_STEPS);
    return 0;
}

void neox_train_graph_free(neox_trainer *t) {
    neox_graph *g = t->graph;
    if (!g) return;
    if (t->rank0 && !t->opts.quiet)
        neox_info("cuda_graph: %lld steps replayed, %lld captured", (long long)g->replays, (long long)g->captures);
    free(g);
    t->graph = NULL;
}

// The step run once inside a recording (its forwards take the staged sets), then launched.
static int capture(neox_trainer *t, neox_step_result *out, neox_error *err) {
    neox_graph *g = t->graph;
    neox_model *m = t->model;
    neox_model_restart_inputs(m);
    m->inputs_staged = 1;
    t->be->graph_begin();
    neox_train_step_scalars_send_staged(t);  // (each launch copies the staged step's values afresh)
    int rc = neox_train_run_step(t, out, err);
    t->be->graph_end();
    m->inputs_staged = 0;
    m->dropout_row0_at = NULL, m->head_scale_at = NULL;  // (the staged values are the capture's alone)
    if (rc != 0) return -1;
    t->be->graph_launch();  // (the recording's copy of the step's values stands for this launch)
    g->captured = 1;
    g->captured_lr = out->lr;
    g->captures++;
    return 0;
}

// The capture launched for this step, with its learning rate and update count in the step scalars.
static void replay(neox_trainer *t, neox_step_result *out) {
    neox_graph *g = t->graph;
    *out = (neox_step_result){0};
    out->iteration = t->state.iteration + 1;
    out->lr = neox_lr_at(&t->lr, t->state.iteration - t->state.overflow_skips);
    neox_train_step_scalars_write(t, g->frozen_lr ? g->captured_lr : out->lr, t->state.optimizer_steps + 1);
    int64_t ticket = t->be->graph_launch();
    neox_model_weights_changed(t->model);
    neox_train_late_replayed(t, out, t->scaler.scale, ticket);
    g->replays++;
}

int neox_train_graph_step(neox_trainer *t, neox_step_result *out, neox_error *err) {
    neox_graph *g = t->graph;
    // The previous step first: its update count, skips and fp16 scale decide this one's values.
    if (neox_train_settle(t, err) != 0) return -1;
    if (g->warmup_left > 0) {
        g->warmup_left--;
        return neox_train_run_step(t, out, err);
    }
    neox_model_restart_inputs(t->model);
    if (neox_train_pipeline_fill_inputs(t, err) != 0) return -1;
    if (!g->captured) return capture(t, out, err);
    // What the eager step does on the host around its passes (one rank: the exchange only keeps count).
    neox_train_parts_begin_micro_batches(t);
    if (neox_grad_exchange_begin_step(t->exchange, t->state.iteration, t->state.optimizer_steps, err) != 0) return -1;
    double gauges[NEOX_ADAPTIVE_GAUGES];
    neox_grad_exchange_end_step(t->exchange, gauges);  // (one rank: no adaptive plan, nothing to report)
    neox_train_parts_end_micro_batches(t);
    replay(t, out);
    return 0;
}
