// preference.c: Direct Preference Optimisation (train_impl: dpo), with GPT-NeoX's formulas
// (megatron/training.py forward_step). A micro-batch holds B pairs: the chosen sequences in rows
// [0, B), the rejected ones in rows [B, 2B). Each sequence's log-probability is the sum of its
// scored tokens' log p(label); with the frozen reference model's sums r (0 with
// dpo_reference_free), z = (chosen - rejected) - (r_chosen - r_rejected) and the loss is the mean
// over pairs of -log sigmoid(dpo_beta * z). Its gradient reaches the model as one weight per token
// (neox_model_set_token_weights): +-dpo_beta * sigmoid(-dpo_beta * z) / B on the chosen (+) and
// rejected (-) tokens' losses. The reference is a second model on the same layout, loaded with the
// weights training starts from and saved in checkpoints (group `reference/`), so a resumed run
// compares against the same reference; under pipeline parallelism each stage holds its layers and
// runs them just before the policy's (pipeline.c). Log-probabilities are always computed in fp32 or wider,
// which is what dpo_fp32 asks for. KTO (kto.c) shares the reference and the buffers. DPO and KTO
// are one trainer part (parts.c): set-up, start, free, the reference in checkpoints, its memory,
// the reference model the passes run, the loss in place of the language model's and the metrics of
// each step.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "ckpt.h"
#include "internal.h"

// GPT-NeoX's metric names, in its order (logged as train/NAME, validation/NAME).
static const char *const metric_names[NEOX_DPO_METRICS] = {
    "ref_neg", "ref_pos", "chosen_neg", "chosen_pos", "chosen_rewards", "rejected_rewards", "reward_acc", "margins",
};
enum { REF_NEG, REF_POS, CHOSEN_NEG, CHOSEN_POS, CHOSEN_REWARDS, REJECTED_REWARDS, REWARD_ACC, MARGINS };

const char *neox_train_dpo_metric_name(int i) { return metric_names[i]; }

extern const neox_train_part neox_train_preference_part;

neox_dpo *neox_train_dpo_of(const neox_trainer *t) { return *neox_train_part_slot(t, &neox_train_preference_part); }

neox_dpo *neox_train_make_dpo(neox_trainer *t) {
    neox_dpo *d = neox_calloc(1, sizeof *d);
    *neox_train_part_slot(t, &neox_train_preference_part) = d;
    return d;
}

static int is_dpo(const neox_config *cfg) {
    const char *impl = neox_config_str(cfg, train_impl);
    return impl && !strcmp(impl, "dpo");
}

int neox_train_rows_per_sample(const neox_config *cfg) { return is_dpo(cfg) || neox_train_is_rm(cfg) ? 2 : 1; }

static int setup_dpo(neox_trainer *t, neox_error *err) {
    const char *data = neox_config_str(t->cfg, dataset_impl);
    int dpo = is_dpo(t->cfg), pairwise = data && !strcmp(data, "pairwise");
    if (neox_train_is_rm(t->cfg)) return 0;  // (reward_model.c)
    if (dpo != pairwise)
        return neox_fail(err, NEOX_EXIT_USAGE, dpo ? "train_impl dpo trains on pairs: set dataset_impl: pairwise"
                                                   : "dataset_impl pairwise is preference data: set train_impl: dpo or rm");
    if (neox_train_is_kto(t->cfg)) return neox_train_setup_kto(t, err);
    if (!dpo) return 0;
    if (neox_config_bool(t->cfg, char_level_ppl))
        return neox_fail(err, NEOX_EXIT_USAGE, "char_level_ppl: a character-level perplexity of preference pairs is not "
                         "defined (the DPO evaluation reports its loss and rewards); unset it for train_impl dpo");
    neox_dpo *d = neox_train_make_dpo(t);
    d->beta = neox_config_float(t->cfg, dpo_beta);
    d->pairs = t->micro_batch;
    return neox_train_make_reference(t, err);
}

int neox_train_make_reference(neox_trainer *t, neox_error *err) {
    neox_dpo *d = neox_train_dpo_of(t);
    size_t n = (size_t)t->rows * t->seq_length;
    d->policy_lp = neox_malloc(n * sizeof *d->policy_lp);
    d->ref_lp = neox_calloc(n, sizeof *d->ref_lp);
    d->weights = neox_malloc(n * sizeof *d->weights);
    if (!d->kto && neox_config_bool(t->cfg, dpo_reference_free)) return 0;
    d->reference = neox_model_create_on(&t->model->desc, t->be, err);
    if (!d->reference) return -1;
    neox_model_set_precision(d->reference, t->precision);
    d->reference->tp = t->model->tp;
    return neox_model_plan(d->reference, t->rows, t->seq_length, err);
}

static void free_dpo(neox_trainer *t) {
    neox_dpo *d = neox_train_dpo_of(t);
    if (!d) return;
    neox_model_free(d->reference);
    free(d->policy_lp);
    free(d->ref_lp);
    free(d->weights);
    free(d->kto);
    free(d);
    *neox_train_part_slot(t, &neox_train_preference_part) = NULL;
}

// After loading: a reference not read from the checkpoint is the policy's starting weights (under
// ZeRO-3 gathered whole for the copy).
static void dpo_start(neox_trainer *t) {
    neox_dpo *d = neox_train_dpo_of(t);
    if (!d || !d->reference || d->reference_loaded) return;
    neox_train_zero3_gather_all(t);
    t->be->copy(d->reference->param_buf, t->model->param_buf, t->model->num_floats * sizeof(float));
    neox_train_zero3_end(t);
    neox_model_weights_changed(d->reference);
}

static int dpo_save(const neox_trainer *t, neox_ckpt_writer *w, json_t *run_state, neox_error *err) {
    (void)run_state;
    const neox_dpo *d = neox_train_dpo_of(t);
    if (!d || !d->reference) return 0;
    return neox_train_write_share_of(t, w, "reference", d->reference->param_buf, 0, err);
}

// A resumed DPO run (not a fine-tuning start, which takes its reference from the weights it loads)
// reads the reference its checkpoint holds.
static int dpo_load(neox_trainer *t, const neox_part_loading *from, neox_error *err) {
    neox_dpo *d = neox_train_dpo_of(t);
    const neox_ckpt_reader *r = from->reader;
    if (!d || !d->reference || from->finetune) return 0;
    char first[160];
    snprintf(first, sizeof first, "reference/%s", t->model->params[0].name);
    if (!neox_ckpt_has(r, first)) return 0;
    if (neox_ckpt_read_model_tensors(d->reference, r, "reference", d->reference->param_buf, err) != 0) return -1;
    neox_model_weights_changed(d->reference);
    d->reference_loaded = 1;
    return 0;
}

// Per row: the sum of lp over the row's scored positions.
static double row_sum(const double *lp, const float *mask, int row, int T) {
    double s = 0.0;
    for (int i = row * T; i < (row + 1) * T; i++) s += mask[i] * lp[i];
    return s;
}

// -log(sigmoid(x)), stable for large |x|.
static double neg_log_sigmoid(double x) { return x >= 0 ? log1p(exp(-x)) : -x + log1p(exp(x)); }
static double sigmoid(double x) { return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x)); }

double neox_dpo_loss(const double *policy_lp, const double *ref_lp, const float *mask, int B, int T, double beta,
                     float *weights, double *metrics) {
    double sum = 0.0;
    memset(metrics, 0, NEOX_DPO_METRICS * sizeof *metrics);
    for (int p = 0; p < B; p++) {
        double pos = row_sum(policy_lp, mask, p, T), neg = row_sum(policy_lp, mask, B + p, T);
        double ref_pos = row_sum(ref_lp, mask, p, T), ref_neg = row_sum(ref_lp, mask, B + p, T);
        double z = (pos - neg) - (ref_pos - ref_neg);
        sum += neg_log_sigmoid(beta * z);
        float g = (float)(beta * sigmoid(-beta * z) / B);  // -dL/dz of this pair's share of the mean
        for (int i = 0; i < T; i++) {
            weights[p * T + i] = g * mask[p * T + i];
            weights[(B + p) * T + i] = -g * mask[(B + p) * T + i];
        }
        double chosen = beta * (pos - ref_pos), rejected = beta * (neg - ref_neg);
        double v[NEOX_DPO_METRICS] = {ref_neg, ref_pos, neg, pos, chosen, rejected, chosen > rejected, chosen - rejected};
        for (int k = 0; k < NEOX_DPO_METRICS; k++) metrics[k] += v[k] / B;
    }
    return sum / B;
}

// The pipeline runs the reference (when there is one) on each micro-batch just before the policy;
// the last stage keeps its log-probabilities in ref_lp for the loss.
static neox_model *dpo_reference_model(const neox_trainer *t, double **token_logprobs) {
    neox_dpo *d = neox_train_dpo_of(t);
    if (!d) return NULL;
    *token_logprobs = d->ref_lp;
    return d->reference;
}

static int dpo_replaces_loss(const neox_trainer *t) { return neox_train_dpo_of(t) != NULL; }

// After the reference's and the policy's forward of batch b (last stage): the DPO loss of the
// micro-batch into *loss, the token weights of its backward set, the metrics accumulated.
static int dpo_loss(neox_trainer *t, const neox_batch *b, int training, double *loss, neox_error *err) {
    (void)training, (void)err;
    neox_dpo *d = neox_train_dpo_of(t);
    if (d->kto) return neox_train_kto_loss(t, b, loss);
    neox_model_token_logprobs(t->model, d->policy_lp);  // ref_lp: the reference's forward (pipeline.c), or 0
    double metrics[NEOX_DPO_METRICS];
    *loss = neox_dpo_loss(d->policy_lp, d->ref_lp, b->loss_mask, d->pairs, t->seq_length, d->beta, d->weights, metrics);
    neox_model_set_token_weights(t->model, d->weights);
    for (int k = 0; k < NEOX_DPO_METRICS; k++) d->sums[k] += metrics[k];
    d->micro_batches++;
    return 0;
}

void neox_train_dpo_begin(neox_trainer *t) {
    neox_dpo *d = neox_train_dpo_of(t);
    if (!d) return;
    memset(d->sums, 0, sizeof d->sums);
    if (d->kto) memset(d->kto->sums, 0, sizeof d->kto->sums);
    d->micro_batches = 0;
}

// The metrics since neox_train_dpo_begin: per micro-batch means, averaged over micro-batches and
// data-parallel ranks (GPT-NeoX's reduce_losses), from the last pipe stage on every rank. Without a reference the ref_* metrics and the
// rewards are not defined (GPT-NeoX does not log them): only chosen_neg and chosen_pos are given.
int neox_train_dpo_metrics(neox_trainer *t, neox_eval_value *out) {
    neox_dpo *d = neox_train_dpo_of(t);
    if (!d) return 0;
    if (d->kto) return neox_train_kto_metrics(t, out);
    double v[NEOX_DPO_METRICS + 1];
    memcpy(v, d->sums, sizeof d->sums);
    v[NEOX_DPO_METRICS] = (double)d->micro_batches;
    if (t->grid->data_size > 1) neox_allreduce_sum(&t->grid->data, v, NEOX_DPO_METRICS + 1, NEOX_F64);
    // Only the last pipe stage computes the loss.
    if (t->grid->pipe_size > 1) neox_broadcast(&t->grid->pipe, v, NEOX_DPO_METRICS + 1, NEOX_F64, t->grid->pipe_size - 1);
    int n = 0;
    for (int k = 0; k < NEOX_DPO_METRICS; k++) {
        if (!d->reference && k != CHOSEN_NEG && k != CHOSEN_POS) continue;
        snprintf(out[n].name, sizeof out[n].name, "%s", metric_names[k]);
        out[n++].value = v[NEOX_DPO_METRICS] > 0 ? v[k] / v[NEOX_DPO_METRICS] : NAN;
    }
    return n;
}

// DPO's and KTO's frozen reference model: its weights, the gradient buffer every model holds
// (unused by a model that only runs forward) and its activations.
static void dpo_memory(const neox_trainer *t, neox_memory_plan *p) {
    const neox_dpo *d = neox_train_dpo_of(t);
    const neox_model *ref = d ? d->reference : NULL;
    if (!ref) return;
    p->params += (double)ref->num_floats * 4, p->params16 += ref->param16 ? (double)ref->num_floats * 2 : 0;
    p->grads += (double)ref->num_floats * 4, p->activations += (double)neox_model_activation_bytes(ref);
    p->offloaded += (double)neox_model_host_recompute_bytes(ref);
}

static void dpo_log(neox_trainer *t, neox_step_stats *stats) {
    (void)stats;
    neox_eval_value values[NEOX_PREFERENCE_MAX_METRICS];
    neox_train_add_step_metrics(t, values, neox_train_dpo_metrics(t, values));
}

const neox_train_part neox_train_preference_part = {
    .name = "preference (DPO, KTO)",
    .stage = NEOX_PART_AFTER_MODEL,
    .setup = setup_dpo,
    .check_data = neox_train_check_kto_data,
    .start = dpo_start,
    .free = free_dpo,
    .save = dpo_save,
    .load = dpo_load,
    .memory = dpo_memory,
    .begin_step = neox_train_dpo_begin,
    .log = dpo_log,
    .reference_model = dpo_reference_model,
    .replaces_loss = dpo_replaces_loss,
    .loss = dpo_loss,
};
