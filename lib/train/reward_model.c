// reward_model.c: reward-model training (train_impl: rm) with GPT-NeoX's formulas (megatron/
// training.py forward_step). The model's output layer is a scalar value head (score.weight; see
// neox_model_desc.value_head). A micro-batch holds B pairs, the chosen sequences in rows [0, B)
// and the rejected ones in rows [B, 2B) as for DPO; a sequence's reward is the value at its one
// scored position (the loss mask: its label datasets label only the reward token, as
// `neox-preprocess chat --for-rm` writes them). GPT-NeoX gathers the i-th scored position of the
// whole micro-batch for row i, which is that value exactly when every row has one; a row with none
// or several is an error here. The loss is the mean over pairs of -log sigmoid(pos - neg) plus
// z_loss * (pos^2 + neg^2); its gradient reaches the model as one value gradient per position
// (neox_model_set_value_grads). Metrics: pos_values, neg_values, margin, accuracy. A trainer part
// (parts.c): set-up, free, the loss in place of the language model's and the metrics of each step.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

extern const neox_train_part neox_train_reward_model_part;

neox_rm *neox_train_rm_of(const neox_trainer *t) { return *neox_train_part_slot(t, &neox_train_reward_model_part); }

static const char *const metric_names[NEOX_RM_METRICS] = {"pos_values", "neg_values", "margin", "accuracy"};

int neox_train_is_rm(const neox_config *cfg) {
    const char *impl = neox_config_str(cfg, train_impl);
    return impl && !strcmp(impl, "rm");
}

static int setup_rm(neox_trainer *t, neox_error *err) {
    const neox_config *cfg = t->cfg;
    if (!neox_train_is_rm(cfg)) {
        if (neox_config_float(cfg, z_loss) != 0.0)
            return neox_fail(err, NEOX_EXIT_USAGE, "z_loss: the penalty on squared rewards applies to train_impl rm only "
                             "(GPT-NeoX ignores it otherwise); unset it");
        return 0;
    }
    const char *data = neox_config_str(cfg, dataset_impl);
    if (!data || strcmp(data, "pairwise") != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "train_impl rm trains on pairs: set dataset_impl: pairwise");
    if (!neox_config_has(cfg, pos_train_label_data_paths))
        return neox_fail(err, NEOX_EXIT_USAGE, "train_impl rm reads each sequence's reward at its one labelled position: "
                         "set pos_train_label_data_paths and neg_train_label_data_paths (label datasets as "
                         "neox-preprocess chat --for-rm writes them)");
    const char *pack = neox_config_str(cfg, pack_impl);
    if (pack && !strcmp(pack, "pack_until_overflow"))
        return neox_fail(err, NEOX_EXIT_USAGE, "pack_impl: pack_until_overflow puts several pairs in a row, each with its "
                         "own reward position, which GPT-NeoX's reward gather misaligns; set pack_impl: unpacked for "
                         "train_impl rm");
    if (neox_config_bool(cfg, char_level_ppl))
        return neox_fail(err, NEOX_EXIT_USAGE, "char_level_ppl: a reward model predicts no tokens; unset it for train_impl rm");
    if (neox_config_has(cfg, eval_tasks))
        return neox_fail(err, NEOX_EXIT_USAGE, "eval_tasks: a reward model predicts no tokens, so the tasks cannot be "
                         "scored; unset it for train_impl rm");
    neox_rm *rm = neox_calloc(1, sizeof *rm);
    *neox_train_part_slot(t, &neox_train_reward_model_part) = rm;
    rm->z_loss = neox_config_float(cfg, z_loss);
    rm->pairs = t->micro_batch;
    size_t n = (size_t)t->rows * t->seq_length;
    rm->values = neox_malloc(n * sizeof *rm->values);
    rm->grads = neox_malloc(n * sizeof *rm->grads);
    return 0;
}

static void free_rm(neox_trainer *t) {
    neox_rm *rm = neox_train_rm_of(t);
    if (!rm) return;
    free(rm->values);
    free(rm->grads);
    free(rm);
    *neox_train_part_slot(t, &neox_train_reward_model_part) = NULL;
}

static int scored_positions(const float *mask, int r, int T) {
    int count = 0;
    for (int i = 0; i < T; i++) count += mask[(size_t)r * T + i] != 0.0f;
    return count;
}

// The one scored position of row r, or -1 when it has none or several.
static int reward_position(const float *mask, int r, int T) {
    if (scored_positions(mask, r, T) != 1) return -1;
    int i = 0;
    while (mask[(size_t)r * T + i] == 0.0f) i++;
    return i;
}

static double neg_log_sigmoid(double x) { return x >= 0 ? log1p(exp(-x)) : -x + log1p(exp(x)); }
static double sigmoid(double x) { return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x)); }

double neox_rm_loss(const float *values, const float *mask, int B, int T, double z_loss, float *grads, double *metrics,
                    int *bad_row) {
    memset(grads, 0, (size_t)2 * B * T * sizeof *grads);
    memset(metrics, 0, NEOX_RM_METRICS * sizeof *metrics);
    double sum = 0.0;
    for (int p = 0; p < B; p++) {
        int ip = reward_position(mask, p, T), in = reward_position(mask, B + p, T);
        if (ip < 0 || in < 0) {
            *bad_row = ip < 0 ? p : B + p;
            return NAN;
        }
        size_t ap = (size_t)p * T + ip, an = (size_t)(B + p) * T + in;
        double pos = values[ap], neg = values[an], d = pos - neg;
        sum += neg_log_sigmoid(d) + z_loss * (pos * pos + neg * neg);
        double g = sigmoid(-d);  // -d(-log sigmoid(d))/dd
        grads[ap] = (float)((-g + 2.0 * z_loss * pos) / B);
        grads[an] = (float)((g + 2.0 * z_loss * neg) / B);
        double v[NEOX_RM_METRICS] = {pos, neg, d, d > 0};
        for (int k = 0; k < NEOX_RM_METRICS; k++) metrics[k] += v[k] / B;
    }
    *bad_row = -1;
    return sum / B;
}

static int rm_replaces_loss(const neox_trainer *t) { return neox_train_rm_of(t) != NULL; }

// After the forward of batch b (last stage): the loss into *loss, the metrics accumulated and, when
// training, the value gradients of its backward set.
static int rm_loss(neox_trainer *t, const neox_batch *b, int training, double *loss, neox_error *err) {
    neox_rm *rm = neox_train_rm_of(t);
    neox_model_values(t->model, rm->values);
    double metrics[NEOX_RM_METRICS];
    int bad, B = rm->pairs;
    double l = neox_rm_loss(rm->values, b->loss_mask, B, t->seq_length, rm->z_loss, rm->grads, metrics, &bad);
    if (bad >= 0) {
        int count = scored_positions(b->loss_mask, bad, t->seq_length);
        return neox_fail(err, NEOX_EXIT_FAILURE, "train_impl rm: the %s sequence of pair %d of a%s micro-batch at "
                         "iteration %lld has %d scored positions; a reward model reads the reward at exactly one (its "
                         "label datasets %s_*_label_data_paths must label only the reward token, as neox-preprocess chat "
                         "--for-rm writes them; eod_mask_loss masks an EOD input there)",
                         bad < B ? "chosen" : "rejected", bad % B, training ? " training" : "n evaluation",
                         (long long)t->state.iteration + (training ? 1 : 0), count, bad < B ? "pos" : "neg");
    }
    *loss = l;
    if (training) neox_model_set_value_grads(t->model, rm->grads);
    for (int k = 0; k < NEOX_RM_METRICS; k++) rm->sums[k] += metrics[k];
    rm->micro_batches++;
    return 0;
}

void neox_train_rm_begin(neox_trainer *t) {
    neox_rm *rm = neox_train_rm_of(t);
    if (!rm) return;
    memset(rm->sums, 0, sizeof rm->sums);
    rm->micro_batches = 0;
}

// Per micro-batch means averaged over micro-batches and data-parallel ranks, from the last pipe
// stage on every rank (as the DPO metrics).
int neox_train_rm_metrics(neox_trainer *t, neox_eval_value *out) {
    neox_rm *rm = neox_train_rm_of(t);
    if (!rm) return 0;
    double v[NEOX_RM_METRICS + 1];
    memcpy(v, rm->sums, sizeof rm->sums);
    v[NEOX_RM_METRICS] = (double)rm->micro_batches;
    if (t->grid->data_size > 1) neox_allreduce_sum(&t->grid->data, v, NEOX_RM_METRICS + 1, NEOX_F64);
    if (t->grid->pipe_size > 1) neox_broadcast(&t->grid->pipe, v, NEOX_RM_METRICS + 1, NEOX_F64, t->grid->pipe_size - 1);
    for (int k = 0; k < NEOX_RM_METRICS; k++) {
        snprintf(out[k].name, sizeof out[k].name, "%s", metric_names[k]);
        out[k].value = v[NEOX_RM_METRICS] > 0 ? v[k] / v[NEOX_RM_METRICS] : NAN;
    }
    return NEOX_RM_METRICS;
}

static void rm_log(neox_trainer *t, neox_step_stats *stats) {
    (void)stats;
    neox_eval_value values[NEOX_RM_METRICS];
    neox_train_add_step_metrics(t, values, neox_train_rm_metrics(t, values));
}

const neox_train_part neox_train_reward_model_part = {
    .name = "reward model",
    .stage = NEOX_PART_AFTER_MODEL,
    .setup = setup_rm,
    .free = free_rm,
    .begin_step = neox_train_rm_begin,
    .log = rm_log,
    .replaces_loss = rm_replaces_loss,
    .loss = rm_loss,
};
