// noise_scale.c: log_gradient_noise_scale — McCandlish et al.'s simple noise scale
// B_simple = tr(Sigma) / |G|^2 (arXiv:1812.06162), estimated as GPT-NeoX's GradientNoiseScale does and
// logged as train/noise_scale. The small batch is one step's global batch (B_small =
// train_batch_size); the large batch is the mean of gradient_noise_scale_n_batches consecutive steps'
// gradients (B_big = n B_small), summed in a buffer. Every n-th measured step, from |g_small|^2 (that
// step's gradient) and |g_big|^2 (the buffer's mean):
//   |G|^2      ~ (B_big |g_big|^2 - B_small |g_small|^2) / (B_big - B_small)
//   tr(Sigma)  ~ (|g_small|^2 - |g_big|^2) / (1 / B_small - 1 / B_big)
// each smoothed by GPT-NeoX's bias-corrected EMA (beta 0.99, corrected by 1 - beta^(i+1) with i the
// count of steps measured so far, as GPT-NeoX counts), and the scale is their ratio. A step whose
// gradients are not finite is left out (neither buffered nor counted), as GPT-NeoX leaves it out.
// Where GPT-NeoX differs: it refuses ZeRO stages 1-3 and under tensor parallelism measures rank 0's
// shard; here the norms are of the whole model over the grid (param_norm.c's neox_train_param_sums)
// and the buffer is this rank's share of the optimizer's range, so every layout gives one rank's value.
// gradient_noise_scale_cpu_offload keeps the buffer in host memory (a device's gradients are copied
// to it in pieces each step); on a host backend the buffer is host memory either way.
// A trainer part (parts.c).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define NOISE_SCALE_BETA 0.99   // GradientNoiseScale's default; GPT-NeoX passes no other

typedef struct neox_noise_scale {
    int n_batches;
    double b_small, b_big;          // samples per step, per n steps
    const neox_backend *buffer_be;  // where the buffer lives: the trainer's backend, or the host
    float *buffer;                  // (state_end - state_begin): the sum of the steps buffered so far
    float *staging;                 // cpu_offload from a device: (NEOX_FLAT_SHARE_PIECE) a piece of the gradients
    size_t n;                       // elements of the optimizer's range
    int nwhole;
    double *sums;                   // (nwhole): scratch for neox_train_param_sums
    int64_t n_updates;              // steps measured (GradientNoiseScale.n_updates)
    double ema_noise, ema_scale;    // the EMAs of |G|^2 and tr(Sigma), uncorrected
    double value;                   // the last noise scale (NAN until the first)
    char *tag[1];
} neox_noise_scale;

extern const neox_train_part neox_train_noise_scale_part;

// Rank 0's notice for the estimate's keys set in a run that does not estimate it.
static void notice_unused_keys(const neox_trainer *t) {
    static const neox_key_id keys[] = {NEOX_K_gradient_noise_scale_n_batches, NEOX_K_gradient_noise_scale_cpu_offload};
    for (size_t i = 0; t->rank0 && !t->opts.quiet && i < sizeof keys / sizeof *keys; i++) {
        char source[256];
        if (strcmp(neox_config_source_id(t->cfg, keys[i], source, sizeof source), "default") != 0)
            neox_notice("config key with no effect in this run: %s (log_gradient_noise_scale is not true)",
                        neox_key_specs[keys[i]].name);
    }
}

static int setup_noise_scale(neox_trainer *t, neox_error *err) {
    if (!neox_config_bool(t->cfg, log_gradient_noise_scale)) return notice_unused_keys(t), 0;
    neox_noise_scale *ns = neox_calloc(1, sizeof *ns);
    *neox_train_part_slot(t, &neox_train_noise_scale_part) = ns;
    ns->n_batches = (int)neox_config_int(t->cfg, gradient_noise_scale_n_batches);
    if (ns->n_batches < 2)
        return neox_fail(err, NEOX_EXIT_USAGE, "key 'gradient_noise_scale_n_batches': %d, but the large batch must be "
                         "at least 2 steps (B_big > B_small)", ns->n_batches);
    ns->b_small = (double)t->train_batch_size;
    ns->b_big = ns->b_small * ns->n_batches;
    int host = neox_config_bool(t->cfg, gradient_noise_scale_cpu_offload) && t->be->on_device;
    ns->buffer_be = host ? neox_backend_cpu() : t->be;
    ns->n = t->state_end - t->state_begin;
    ns->buffer = ns->buffer_be->alloc(ns->n * sizeof(float));
    ns->buffer_be->memset_zero(ns->buffer, ns->n * sizeof(float));
    if (host) ns->staging = neox_malloc(NEOX_FLAT_SHARE_PIECE * sizeof(float));
    neox_param *all = neox_train_whole_params(t, &ns->nwhole, err);
    if (!all) return -1;
    free(all);
    ns->sums = neox_malloc((size_t)ns->nwhole * sizeof *ns->sums);
    ns->value = NAN;
    ns->tag[0] = neox_strdup("train/noise_scale");
    return 0;
}

static void free_noise_scale(neox_trainer *t) {
    void **slot = neox_train_part_slot(t, &neox_train_noise_scale_part);
    neox_noise_scale *ns = *slot;
    if (!ns) return;
    if (ns->buffer) ns->buffer_be->free(ns->buffer);
    free(ns->staging), free(ns->sums), free(ns->tag[0]);
    free(ns);
    *slot = NULL;
}

// A collective: the whole model's sum of squares of a share.
static double whole_sum_squares(neox_trainer *t, neox_noise_scale *ns, const neox_flat_share *s) {
    neox_train_param_sums(t, s, NEOX_PARAM_SUM_SQUARES, ns->sums, ns->nwhole);
    double total = 0.0;
    for (int i = 0; i < ns->nwhole; i++) total += ns->sums[i];
    return total;
}

// buffer += grads * unscale, on the buffer's side (a device's gradients copied to the host in pieces).
static void buffer_add(neox_trainer *t, neox_noise_scale *ns, const float *grads, float unscale) {
    if (!ns->staging) {
        ns->buffer_be->add_scaled(ns->buffer, grads, ns->n, unscale);
        return;
    }
    for (size_t s = 0; s < ns->n; s += NEOX_FLAT_SHARE_PIECE) {
        size_t len = ns->n - s < NEOX_FLAT_SHARE_PIECE ? ns->n - s : NEOX_FLAT_SHARE_PIECE;
        t->be->to_host(ns->staging, grads + s, len * sizeof(float));
        ns->buffer_be->add_scaled(ns->buffer + s, ns->staging, len, unscale);
    }
}

// GPT-NeoX's ema: the average moved towards y, and its bias-corrected value for update i.
static double ema(double *avg, double y, int64_t i) {
    *avg = NOISE_SCALE_BETA * *avg + (1.0 - NOISE_SCALE_BETA) * y;
    return *avg / (1.0 - pow(NOISE_SCALE_BETA, (double)(i + 1)));
}

// The estimate from the small and the large batch's squared norms (GradientNoiseScale._update);
// 0 when a norm is not finite (nothing estimated).
static int estimate(neox_noise_scale *ns, double g_small, double g_big) {
    if (!isfinite(g_small) || !isfinite(g_big)) return 0;
    double noise = (ns->b_big * g_big - ns->b_small * g_small) / (ns->b_big - ns->b_small);
    double scale = (g_small - g_big) / (1.0 / ns->b_small - 1.0 / ns->b_big);
    double noise_c = ema(&ns->ema_noise, noise, ns->n_updates);
    double scale_c = ema(&ns->ema_scale, scale, ns->n_updates);
    ns->value = scale_c / noise_c;
    return 1;
}

// A collective after the step's micro-batches: its gradients measured and buffered; every n-th
// measured step, the estimate from the buffer's mean (then emptied).
static void noise_scale_measure(neox_trainer *t) {
    neox_noise_scale *ns = *neox_train_part_slot(t, &neox_train_noise_scale_part);
    if (!ns) return;
    double unscale = 1.0 / t->scaler.scale;
    neox_flat_share grads = neox_train_grad_share(t);
    double g_small = whole_sum_squares(t, ns, &grads) * unscale * unscale;
    if (!isfinite(g_small)) return;
    buffer_add(t, ns, grads.buf, (float)unscale);
    if (ns->n_updates % ns->n_batches == ns->n_batches - 1) {
        ns->buffer_be->scale(ns->buffer, ns->n, 1.0f / (float)ns->n_batches);
        neox_flat_share big = {ns->buffer_be, ns->buffer, grads.begin, grads.end, grads.partitioned, NULL};
        int estimated = estimate(ns, g_small, whole_sum_squares(t, ns, &big));
        ns->buffer_be->memset_zero(ns->buffer, ns->n * sizeof(float));
        if (!estimated) return;  // (GPT-NeoX counts no update then either)
    }
    ns->n_updates++;
}

static void noise_scale_log(neox_trainer *t, neox_step_stats *stats) {
    neox_noise_scale *ns = *neox_train_part_slot(t, &neox_train_noise_scale_part);
    if (ns && !isnan(ns->value)) neox_metrics_step_series(stats, ns->tag, &ns->value, 1);
}

// The buffer: device gradients' bytes, or with cpu_offload host memory beside the device's.
static void noise_scale_memory(const neox_trainer *t, neox_memory_plan *plan) {
    neox_noise_scale *ns = *neox_train_part_slot(t, &neox_train_noise_scale_part);
    if (!ns) return;
    double bytes = (double)ns->n * sizeof(float);
    if (ns->staging) plan->offloaded += bytes + NEOX_FLAT_SHARE_PIECE * sizeof(float);
    else plan->grads += bytes;
}

const neox_train_part neox_train_noise_scale_part = {
    .name = "gradient noise scale",
    .stage = NEOX_PART_AFTER_LOAD,
    .setup = setup_noise_scale,
    .free = free_noise_scale,
    .memory = noise_scale_memory,
    .end_micro_batches = noise_scale_measure,
    .log = noise_scale_log,
};
