// grad_stats.c: log_grad_norm, log_grad_pct_zeros and log_optimizer_states — per-parameter
// statistics of every step, as GPT-NeoX's training_log logs them: gradient_norms/NAME (the
// Frobenius norm of the parameter's gradient), pct_grad_zeros/NAME (the percentage of its gradient's
// elements that are zero) and optimizer_state_norms/NAME_STATE (the norm of each optimizer state
// buffer, named as checkpoints name them: exp_avg, exp_avg_sq, momentum_buffer, ...).
// The gradients are the step's, reduced over the data-parallel ranks, unscaled (fp16) and before
// clipping, read when the micro-batches end; the optimizer state after the update. Every tensor is
// counted once over the grid by param_norm.c's neox_train_param_sums, so a sharded parameter
// reports its whole norm (GPT-NeoX logs each rank's own shard). A trainer part (parts.c).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct neox_grad_stats {
    int nwhole;                  // the whole model's parameters
    double *numel;               // (nwhole): their sizes
    double *sums;                // (nwhole): scratch for neox_train_param_sums
    int log_norms, log_zeros, log_states;
    char **norm_tags, **zero_tags, **state_tags;   // (nwhole), (nwhole), (nstate x nwhole)
    double *norms, *pct_zeros, *state_norms;
    int nstate;
    float *host_piece;           // log_grad_pct_zeros on a device: the gradients are counted on the host through it
} neox_grad_stats;

extern const neox_train_part neox_train_grad_stats_part;

static char **make_tags(const neox_param *all, int n, const char *prefix, const char *suffix) {
    char **tags = neox_malloc((size_t)n * sizeof *tags);
    for (int i = 0; i < n; i++) tags[i] = neox_asprintf("%s/%s%s", prefix, all[i].name, suffix);
    return tags;
}

static void free_tags(char **tags, int n) {
    for (int i = 0; tags && i < n; i++) free(tags[i]);
    free(tags);
}

// The tags of optimizer state k: optimizer_state_norms/NAME_STATE, STATE the checkpoint name's last part.
static void make_state_tags(neox_grad_stats *gs, const neox_param *all, const neox_optimizer *o) {
    const neox_optimizer_type *type = o->type;
    gs->nstate = o->nstate;
    gs->state_tags = neox_malloc((size_t)gs->nstate * (size_t)gs->nwhole * sizeof *gs->state_tags);
    for (int k = 0; k < gs->nstate; k++) {
        const char *slash = strrchr(type->state_names[k], '/');
        char *suffix = neox_asprintf("_%s", slash ? slash + 1 : type->state_names[k]);
        char **tags = make_tags(all, gs->nwhole, "optimizer_state_norms", suffix);
        memcpy(gs->state_tags + (size_t)k * (size_t)gs->nwhole, tags, (size_t)gs->nwhole * sizeof *tags);
        free(tags);
        free(suffix);
    }
    gs->state_norms = neox_malloc((size_t)gs->nstate * (size_t)gs->nwhole * sizeof *gs->state_norms);
}

static int setup_grad_stats(neox_trainer *t, neox_error *err) {
    int norms = neox_config_bool(t->cfg, log_grad_norm), zeros = neox_config_bool(t->cfg, log_grad_pct_zeros);
    int states = neox_config_bool(t->cfg, log_optimizer_states);
    if (!norms && !zeros && !states) return 0;
    neox_grad_stats *gs = neox_calloc(1, sizeof *gs);
    *neox_train_part_slot(t, &neox_train_grad_stats_part) = gs;
    gs->log_norms = norms, gs->log_zeros = zeros, gs->log_states = states;
    neox_param *all = neox_train_whole_params(t, &gs->nwhole, err);
    if (!all) return -1;
    size_t n = (size_t)gs->nwhole;
    gs->numel = neox_malloc(n * sizeof *gs->numel);
    for (int i = 0; i < gs->nwhole; i++) gs->numel[i] = (double)all[i].numel;
    gs->sums = neox_malloc(n * sizeof *gs->sums);
    if (norms) {
        gs->norm_tags = make_tags(all, gs->nwhole, "gradient_norms", "");
        gs->norms = neox_malloc(n * sizeof *gs->norms);
    }
    if (zeros) {
        gs->zero_tags = make_tags(all, gs->nwhole, "pct_grad_zeros", "");
        gs->pct_zeros = neox_malloc(n * sizeof *gs->pct_zeros);
    }
    if (zeros && t->be->on_device) gs->host_piece = neox_malloc(NEOX_FLAT_SHARE_PIECE * sizeof(float));
    if (states) make_state_tags(gs, all, t->optimizer);
    free(all);
    return 0;
}

static void free_grad_stats(neox_trainer *t) {
    void **slot = neox_train_part_slot(t, &neox_train_grad_stats_part);
    neox_grad_stats *gs = *slot;
    if (!gs) return;
    free_tags(gs->norm_tags, gs->nwhole);
    free_tags(gs->zero_tags, gs->nwhole);
    free_tags(gs->state_tags, gs->nstate * gs->nwhole);
    free(gs->numel), free(gs->sums), free(gs->norms), free(gs->pct_zeros), free(gs->state_norms), free(gs->host_piece);
    free(gs);
    *slot = NULL;
}

// A collective: the step's gradients, reduced and not yet clipped (the loss scale divided out).
static void measure_grads(neox_trainer *t) {
    neox_grad_stats *gs = *neox_train_part_slot(t, &neox_train_grad_stats_part);
    if (!gs || (!gs->log_norms && !gs->log_zeros)) return;
    neox_flat_share grads = neox_train_grad_share(t);
    grads.host_piece = gs->host_piece;
    if (gs->log_norms) {
        neox_train_param_sums(t, &grads, NEOX_PARAM_SUM_SQUARES, gs->sums, gs->nwhole);
        for (int i = 0; i < gs->nwhole; i++) gs->norms[i] = sqrt(gs->sums[i]) / t->scaler.scale;
    }
    if (gs->log_zeros) {
        neox_train_param_sums(t, &grads, NEOX_PARAM_SUM_ZEROS, gs->sums, gs->nwhole);
        for (int i = 0; i < gs->nwhole; i++) gs->pct_zeros[i] = 100.0 * gs->sums[i] / gs->numel[i];
    }
}

// A collective: the optimizer state's norms after the update, then every series into the step's values.
static void grad_stats_log(neox_trainer *t, neox_step_stats *stats) {
    neox_grad_stats *gs = *neox_train_part_slot(t, &neox_train_grad_stats_part);
    if (!gs) return;
    if (gs->log_norms) neox_metrics_step_series(stats, gs->norm_tags, gs->norms, gs->nwhole);
    if (gs->log_zeros) neox_metrics_step_series(stats, gs->zero_tags, gs->pct_zeros, gs->nwhole);
    if (!gs->log_states) return;
    neox_train_offload_settle(t);
    for (int k = 0; k < gs->nstate; k++) {
        neox_flat_share state = neox_train_optimizer_state_share(t, k);
        double *norms = gs->state_norms + (size_t)k * (size_t)gs->nwhole;
        neox_train_param_sums(t, &state, NEOX_PARAM_SUM_SQUARES, norms, gs->nwhole);
        for (int i = 0; i < gs->nwhole; i++) norms[i] = sqrt(norms[i]);
    }
    neox_metrics_step_series(stats, gs->state_tags, gs->state_norms, gs->nstate * gs->nwhole);
}

// The host piece zeros are counted through (on a device backend).
static void grad_stats_memory(const neox_trainer *t, neox_memory_plan *plan) {
    neox_grad_stats *gs = *neox_train_part_slot(t, &neox_train_grad_stats_part);
    if (gs && gs->host_piece) plan->offloaded += NEOX_FLAT_SHARE_PIECE * sizeof(float);
}

const neox_train_part neox_train_grad_stats_part = {
    .name = "gradient and optimizer statistics",
    .stage = NEOX_PART_AFTER_LOAD,
    .setup = setup_grad_stats,
    .free = free_grad_stats,
    .memory = grad_stats_memory,
    .end_micro_batches = measure_grads,
    .log = grad_stats_log,
};
