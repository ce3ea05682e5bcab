// kto.c: Kahneman-Tversky Optimisation (train_impl: kto), with GPT-NeoX's formulas
// (megatron/training.py forward_step, after TRL's KTO trainer). A micro-batch holds B single
// sequences, each with a per-token reward row from its reward dataset (its document's reward over
// its tokens, 0 on padding). With lp and ref the policy's and the frozen reference's log p(label)
// on the scored positions, a row's log-ratio is sum_t (lp - ref). The batch is split into halves;
// each half's KL estimate, the mean over its rows of max(log-ratio, 0), is the other half's baseline
// (detached). Row b of half h has z_b = kto_beta * mean_t(reward_b) * (log-ratio_b - KL of the other
// half), and the loss is the mean over i < B/2 of 0.5 * S_1 * (1 - sigmoid(z_i)) + 0.5 * S_2 *
// (1 - sigmoid(z_{i+B/2})), S_h the mean over half h of each row's weight: kto_desirable_weight
// where the row's rewards sum above 0.001, kto_undesirable_weight where below -0.001, else 0. Its
// gradient reaches the model as one weight per token (neox_model_set_token_weights). The reference
// model is DPO's (preference.c): the same set-up, checkpoint group and pipeline schedule.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "internal.h"

// GPT-NeoX's metric names, in its order (logged as train/NAME, validation/NAME).
static const char *const metric_names[NEOX_KTO_METRICS] = {
    "ref_logp", "policy_logp", "pos_ref_logp", "neg_ref_logp", "pos_policy_logp", "neg_policy_logp",
    "kl", "reward_acc", "policy_rewards",
};
enum { REF_LOGP, POLICY_LOGP, POS_REF, NEG_REF, POS_POLICY, NEG_POLICY, KL, REWARD_ACC, POLICY_REWARDS };

const char *neox_train_kto_metric_name(int i) { return metric_names[i]; }

int neox_train_is_kto(const neox_config *cfg) {
    const char *impl = neox_config_str(cfg, train_impl);
    return impl && !strcmp(impl, "kto");
}

static double sigmoid(double x) { return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x)); }

// The mean over rows [r0, r1) of max(log-ratio, 0): a half's KL estimate.
static double half_kl(const double *ratio, int r0, int r1) {
    double s = 0.0;
    for (int b = r0; b < r1; b++) s += ratio[b] > 0 ? ratio[b] : 0.0;
    return s / (r1 - r0);
}

// GPT-NeoX's nine metrics of one micro-batch.
static void kto_metrics(const double *lp, const double *ref, const float *mask, const float *rewards, int B, int T,
                        double beta, double *m) {
    double scored = 0.0, diff = 0.0;
    memset(m, 0, NEOX_KTO_METRICS * sizeof *m);
    for (int b = 0; b < B; b++) {
        double row[6] = {0}, policy_reward = 0.0;
        for (int t = 0; t < T; t++) {
            size_t i = (size_t)b * T + t;
            double p = mask[i] * lp[i], r = mask[i] * ref[i];
            int pos = rewards[i] > 0.001f, neg = rewards[i] < -0.001f;
            row[0] += r, row[1] += p, row[2] += pos * r, row[3] += neg * r, row[4] += pos * p, row[5] += neg * p;
            policy_reward += beta * rewards[i] * (p - r);
            diff += p - r;
            scored += mask[i];
        }
        for (int k = 0; k < 6; k++) m[k] += row[k] / B;
        m[REWARD_ACC] += (policy_reward > 0.0) / (double)B;
        m[POLICY_REWARDS] += policy_reward;  // a sum over the micro-batch, as GPT-NeoX logs it
    }
    m[KL] = diff / scored;
}

double neox_kto_loss(const double *policy_lp, const double *ref_lp, const float *mask, const float *rewards, int B,
                     int T, const neox_kto_weights *w, float *weights, double *metrics) {
    int H = B / 2;
    double *ratio = neox_malloc((size_t)B * sizeof *ratio), *rmean = neox_malloc((size_t)B * sizeof *rmean);
    double scale[2] = {0.0, 0.0};
    for (int b = 0; b < B; b++) {
        double lr = 0.0, rsum = 0.0;
        for (int t = 0; t < T; t++) {
            size_t i = (size_t)b * T + t;
            lr += mask[i] * policy_lp[i] - mask[i] * ref_lp[i];
            rsum += rewards[i];
        }
        ratio[b] = lr;
        rmean[b] = rsum / T;
        // Summed in float32, as torch sums the reward tensor.
        float fsum = 0.0f;
        for (int t = 0; t < T; t++) fsum += rewards[(size_t)b * T + t];
        scale[b >= H] += (fsum > 0.001f) * w->desirable + (fsum < -0.001f) * w->undesirable;
    }
    scale[0] /= H, scale[1] /= B - H;
    double kl[2] = {half_kl(ratio, 0, H), half_kl(ratio, H, B)};
    double loss = 0.0;
    for (int b = 0; b < B; b++) {
        int h = b >= H;
        double z = w->beta * rmean[b] * (ratio[b] - kl[1 - h]);
        double s = sigmoid(z);
        loss += 0.5 * scale[h] * (1.0 - s);
        // -dloss/dz * dz/dlp per scored token: the weight of its -log p.
        float g = (float)(0.5 * scale[h] * s * (1.0 - s) * w->beta * rmean[b] / H);
        for (int t = 0; t < T; t++) weights[(size_t)b * T + t] = g * mask[(size_t)b * T + t];
    }
    if (metrics) kto_metrics(policy_lp, ref_lp, mask, rewards, B, T, w->beta, metrics);
    free(ratio);
    free(rmean);
    return loss / H;
}

int neox_train_setup_kto(neox_trainer *t, neox_error *err) {
    if (t->micro_batch < 2 || t->micro_batch % 2)
        return neox_fail(err, NEOX_EXIT_USAGE, "train_micro_batch_size_per_gpu: train_impl kto splits each micro-batch "
                         "into two halves, each the other's KL baseline, so it must be even and at least 2 (it is %d)",
                         t->micro_batch);
    if (neox_config_bool(t->cfg, char_level_ppl))
        return neox_fail(err, NEOX_EXIT_USAGE, "char_level_ppl: unset it for train_impl kto (its evaluation reports the "
                         "KTO loss and metrics)");
    neox_kto *k = neox_calloc(1, sizeof *k);
    k->w.beta = neox_config_float(t->cfg, kto_beta);
    k->w.desirable = neox_config_float(t->cfg, kto_desirable_weight);
    k->w.undesirable = neox_config_float(t->cfg, kto_undesirable_weight);
    neox_dpo *d = neox_train_make_dpo(t);
    d->kto = k;
    d->pairs = t->micro_batch;
    return neox_train_make_reference(t, err);
}

// After the datasets are built: KTO reads a reward dataset beside every token dataset it trains or
// evaluates on; reward datasets are KTO's only.
int neox_train_check_kto_data(const neox_trainer *t, neox_error *err) {
    static const char *split[3] = {"train", "valid", "test"};
    int kto = neox_train_is_kto(t->cfg);
    for (int i = 0; i < 3; i++) {
        const neox_dataset *d = t->datasets[i];
        if (!d) continue;
        if (kto && !d->has_rewards)
            return neox_fail(err, NEOX_EXIT_USAGE, "train_impl kto needs %s_reward_data_paths beside %s_data_paths "
                             "(one reward dataset per token dataset, e.g. from neox-preprocess chat --reward-key)",
                             split[i], split[i]);
        if (!kto && d->has_rewards)
            return neox_fail(err, NEOX_EXIT_USAGE, "%s_reward_data_paths: reward datasets are read by train_impl kto "
                             "only; set train_impl: kto or remove the key", split[i]);
    }
    return 0;
}

int neox_train_kto_loss(neox_trainer *t, const neox_batch *b, double *loss) {
    neox_dpo *d = neox_train_dpo_of(t);
    neox_kto *k = d->kto;
    neox_model_token_logprobs(t->model, d->policy_lp);  // ref_lp: the reference's forward (pipeline.c)
    double metrics[NEOX_KTO_METRICS];
    *loss = neox_kto_loss(d->policy_lp, d->ref_lp, b->loss_mask, b->rewards, t->micro_batch, t->seq_length, &k->w,
                          d->weights, metrics);
    neox_model_set_token_weights(t->model, d->weights);
    for (int i = 0; i < NEOX_KTO_METRICS; i++) k->sums[i] += metrics[i];
    d->micro_batches++;
    return 0;
}

// The metrics since neox_train_dpo_begin: per micro-batch values averaged over micro-batches and
// data-parallel ranks (GPT-NeoX's reduce_losses), from the last pipe stage on every rank.
int neox_train_kto_metrics(neox_trainer *t, neox_eval_value *out) {
    neox_dpo *d = neox_train_dpo_of(t);
    double v[NEOX_KTO_METRICS + 1];
    memcpy(v, d->kto->sums, sizeof d->kto->sums);
    v[NEOX_KTO_METRICS] = (double)d->micro_batches;
    if (t->grid->data_size > 1) neox_allreduce_sum(&t->grid->data, v, NEOX_KTO_METRICS + 1, NEOX_F64);
    if (t->grid->pipe_size > 1) neox_broadcast(&t->grid->pipe, v, NEOX_KTO_METRICS + 1, NEOX_F64, t->grid->pipe_size - 1);
    for (int i = 0; i < NEOX_KTO_METRICS; i++) {
        snprintf(out[i].name, sizeof out[i].name, "%s", metric_names[i]);
        out[i].value = v[NEOX_KTO_METRICS] > 0 ? v[i] / v[NEOX_KTO_METRICS] : NAN;
    }
    return NEOX_KTO_METRICS;
}
