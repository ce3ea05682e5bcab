// model_parity.c: test driver for tests/oracle/test_model_parity.py. Loads a model's parameters by
// their Hugging Face names from a safetensors file, runs forward and backward on the token ids of a
// second file, and writes the logits, the loss and every parameter gradient ("grad.<name>").
//   model_parity WEIGHTS.safetensors INPUTS.safetensors OUT.safetensors key=value...
// keys: vocab hidden layers heads kv_heads ffn max_pos norm(layernorm|rmsnorm|scalenorm|non_parametric_layernorm)
// eps pos(rotary|learned|none|alibi) rotary_dims rotary_base parallel act(gelu|gelu_tanh|swiglu) attn_bias mlp_bias tied
// checkpoint qk_norm
// moe_experts moe_top_k moe_interval moe_ffn moe_router(sinkhorn|topk) moe_jitter moe_renorm training (the model's flag);
// with moe_jitter the noise factors of each MoE layer l are written as "moe_jitter.l" (B*T, C).
// adam_steps lr (adam_steps > 0: that many AdamW steps on the same batch; writes "losses")
// optimizer (adam|sgd|lion|madgrad_wd|sm3, through lib/optim) opt_steps opt_lr min_lr warmup decay_iters wd clip beta1
// beta2 opt_eps momentum sm3_beta: that many steps of the optimizer on the same batch, each clipped by the global gradient
// norm (clip), with GPT-NeoX's cosine schedule (lr at step i - 1) and weight decay wd on all but biases and norms;
// writes "param.<name>" after the last step; with grads=FILE each step's gradients are FILE's "grad.<step>.<name>"
// (1-based step, F32) instead of the model's own
// precision (fp32|bfloat16|fp16|fp8: the linear layers' operands; bfloat16 also stores the activations in bf16,
// unless storage=fp32) dpo_beta (DPO's loss, below);
// under fp8 the recipe fp8_format (hybrid|e4m3) fp8_wgrad fp8_history fp8_algo (max|most_recent)
// fp8_margin, its scales updated after every backward (one rank: no amax reduction), and "fp8_scales"
// written: the scales after the last step
// value_head z_loss (a reward model: the value head and its pairwise loss, below);
// kto_beta kto_desirable_weight kto_undesirable_weight (KTO's loss, below); head_rows (the output layer
// in chunks of that many rows, neox_model_set_head_rows: then no "logits" are written).
// INPUTS holds "input_ids" and "targets" (I64, (B, T)) and optionally "loss_mask" (F32, (B, T)).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "kernels/kernels.h"
#include "model.h"
#include "kernels/backend.h"
#include "model/model_internal.h"  // a MoE layer's jittered router input, for the oracle's noise
#include "optim.h"
#include "safetensors.h"
#include "train.h"

static neox_precision precision = NEOX_PRECISION_FP32;
static int fp32_storage;  // storage=fp32: the activations stay fp32 under bfloat16
static int training;  // the model's training flag (MoE: Sinkhorn routing)
static double dpo_beta = 0.0, z_loss = 0.0;
static neox_kto_weights kto = {0.0, 1.0, 1.0};
static int head_rows;
static neox_fp8_recipe fp8 = {.backward_format = NEOX_FP8_E5M2, .wgrad = 1, .history_len = 1};
// The optimizer= run: its settings and schedule (see the keys above).
static struct {
    const neox_optimizer_type *type;
    neox_optimizer_settings s;
    int steps, decay_iters;
    double lr, min_lr, warmup;
    const char *grads;  // recorded gradients, or NULL
} opt = {.s = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8}, .lr = 1e-3, .decay_iters = 1};

static int parse_optimizer_kv(const char *key, const char *v) {
    if (!strcmp(key, "optimizer")) return (opt.type = neox_optimizer_type_named(v)) ? 0 : -1;
    double x = strtod(v, NULL);
    if (!strcmp(key, "opt_steps")) opt.steps = atoi(v);
    else if (!strcmp(key, "opt_lr")) opt.lr = x;
    else if (!strcmp(key, "min_lr")) opt.min_lr = x;
    else if (!strcmp(key, "warmup")) opt.warmup = x;
    else if (!strcmp(key, "decay_iters")) opt.decay_iters = atoi(v);
    else if (!strcmp(key, "wd")) opt.s.weight_decay = x;
    else if (!strcmp(key, "clip")) opt.s.clip_grad = x;
    else if (!strcmp(key, "beta1")) opt.s.beta1 = x;
    else if (!strcmp(key, "beta2")) opt.s.beta2 = x;
    else if (!strcmp(key, "opt_eps")) opt.s.eps = x;
    else if (!strcmp(key, "momentum")) opt.s.momentum = x;
    else if (!strcmp(key, "sm3_beta")) opt.s.beta = x;
    else if (!strcmp(key, "grads")) opt.grads = v;
    else return -1;
    return 0;
}

static int parse_kv(neox_model_desc *d, int *adam_steps, float *lr, const char *arg) {
    const char *eq = strchr(arg, '=');
    if (!eq) return -1;
    size_t k = (size_t)(eq - arg);
    const char *v = eq + 1;
#define KEY(s) (k == strlen(s) && strncmp(arg, s, k) == 0)
    if (KEY("vocab")) d->vocab_size = atoi(v);
    else if (KEY("hidden")) d->hidden_size = atoi(v);
    else if (KEY("layers")) d->num_layers = atoi(v);
    else if (KEY("heads")) d->num_heads = atoi(v);
    else if (KEY("kv_heads")) d->num_kv_heads = atoi(v);
    else if (KEY("ffn")) d->ffn_size = atoi(v);
    else if (KEY("max_pos")) d->max_positions = atoi(v);
    else if (KEY("norm"))
        d->norm = strcmp(v, "rmsnorm") == 0                    ? NEOX_NORM_RMSNORM
                  : strcmp(v, "scalenorm") == 0                ? NEOX_NORM_SCALENORM
                  : strcmp(v, "non_parametric_layernorm") == 0 ? NEOX_NORM_NONPARAMETRIC
                                                               : NEOX_NORM_LAYERNORM;
    else if (KEY("eps")) d->norm_eps = strtof(v, NULL);
    else if (KEY("pos"))
        d->pos_emb = strcmp(v, "learned") == 0 ? NEOX_POS_LEARNED
                     : strcmp(v, "none") == 0  ? NEOX_POS_NONE
                     : strcmp(v, "alibi") == 0 ? NEOX_POS_ALIBI
                                               : NEOX_POS_ROTARY;
    else if (KEY("rotary_dims")) d->rotary_dims = atoi(v);
    else if (KEY("rotary_base")) d->rotary_base = strtod(v, NULL);
    else if (KEY("rope_type")) d->rope_scaling.kind = strcmp(v, "linear") == 0 ? NEOX_ROPE_LINEAR : NEOX_ROPE_LLAMA3;
    else if (KEY("rope_factor")) d->rope_scaling.factor = strtod(v, NULL);
    else if (KEY("rope_low")) d->rope_scaling.low_freq_factor = strtod(v, NULL);
    else if (KEY("rope_high")) d->rope_scaling.high_freq_factor = strtod(v, NULL);
    else if (KEY("rope_orig")) d->rope_scaling.original_max_positions = atoi(v);
    else if (KEY("parallel")) d->parallel_residual = atoi(v);
    else if (KEY("act")) {
        if (strcmp(v, "gelu_tanh") == 0) d->activation = NEOX_ACT_GELU_TANH;
        else if (strcmp(v, "gelu_onnx") == 0) d->activation = NEOX_ACT_GELU_ONNX;
        else if (strcmp(v, "geglu_tanh") == 0) d->activation = NEOX_ACT_GEGLU_TANH;
        else if (neox_activation_parse(v, &d->activation) != 0) return -1;
    }
    else if (KEY("attn_bias")) d->attn_bias = atoi(v);
    else if (KEY("mlp_bias")) d->mlp_bias = atoi(v);
    else if (KEY("attn_out_bias")) d->attn_out_unbiased = !atoi(v);
    else if (KEY("tied")) d->tied = atoi(v);
    else if (KEY("window")) d->attn_window = atoi(v);
    else if (KEY("qk_norm")) d->qk_norm = atoi(v);
    else if (KEY("moe_experts")) d->moe_experts = atoi(v);
    else if (KEY("moe_top_k")) d->moe_top_k = atoi(v);
    else if (KEY("moe_interval")) d->moe_interval = atoi(v);
    else if (KEY("moe_ffn")) d->moe_ffn_size = atoi(v);
    else if (KEY("moe_jitter")) d->moe_jitter_eps = strtof(v, NULL);
    else if (KEY("moe_renorm")) d->moe_renormalize = atoi(v);
    else if (KEY("moe_router")) d->moe_router = strcmp(v, "topk") == 0 ? NEOX_MOE_TOPK : NEOX_MOE_SINKHORN;
    else if (KEY("training")) training = atoi(v);
    else if (KEY("checkpoint")) d->checkpoint_activations = atoi(v);
    else if (KEY("adam_steps")) *adam_steps = atoi(v);
    else if (KEY("lr")) *lr = strtof(v, NULL);
    else if (KEY("precision")) return neox_precision_parse(v, &precision);
    else if (KEY("storage")) return strcmp(v, "fp32") ? -1 : (fp32_storage = 1, 0);
    else if (KEY("dpo_beta")) dpo_beta = atof(v);
    else if (KEY("value_head")) d->value_head = atoi(v);
    else if (KEY("z_loss")) z_loss = atof(v);
    else if (KEY("kto_beta")) kto.beta = atof(v);
    else if (KEY("kto_desirable_weight")) kto.desirable = atof(v);
    else if (KEY("kto_undesirable_weight")) kto.undesirable = atof(v);
    else if (KEY("head_rows")) head_rows = atoi(v);
    else if (KEY("fp8_format")) fp8.backward_format = strcmp(v, "e4m3") == 0 ? NEOX_FP8_E4M3 : NEOX_FP8_E5M2;
    else if (KEY("fp8_wgrad")) fp8.wgrad = atoi(v);
    else if (KEY("fp8_history")) fp8.history_len = atoi(v);
    else if (KEY("fp8_algo")) fp8.algo_max = strcmp(v, "max") == 0;
    else if (KEY("fp8_margin")) fp8.margin = atoi(v);
    else {
        char key[32];
        snprintf(key, sizeof key, "%.*s", (int)k, arg);
        return parse_optimizer_kv(key, v);
    }
#undef KEY
    return 0;
}

static const neox_st_tensor *need(const neox_safetensors *st, const char *name, const char *dtype, int64_t numel) {
    const neox_st_tensor *t = neox_safetensors_find(st, name);
    if (!t) neox_die(1, "%s: no tensor '%s'", st->name, name);
    if (strcmp(t->dtype, dtype) != 0 || (numel >= 0 && neox_st_numel(t) != numel))
        neox_die(1, "%s: tensor '%s' is %s with %lld elements, expected %s with %lld", st->name, name, t->dtype,
                 (long long)neox_st_numel(t), dtype, (long long)numel);
    return t;
}

static int *ids_of(const neox_safetensors *st, const char *name, int64_t numel) {
    const int64_t *src = need(st, name, "I64", numel)->data;
    int *ids = neox_malloc((size_t)numel * sizeof(int));
    for (int64_t i = 0; i < numel; i++) ids[i] = (int)src[i];
    return ids;
}

// opt.steps steps of opt.type on one batch (the first one's gradients are in the model already),
// as the trainer takes them: the global norm, DeepSpeed's clipping coefficient applied to the
// gradients, the update with the schedule's lr at step - 1.
static void optimizer_steps(neox_model *m, const int *ids, const int *targets, const float *mask) {
    const neox_backend *be = neox_backend_cpu();
    for (int k = 0; k < NEOX_OPTIMIZER_COUNT; k++)
        if (neox_optimizer_type_of((neox_optimizer_kind)k) == opt.type) opt.s.kind = (neox_optimizer_kind)k;
    neox_optimizer *o = neox_optimizer_make(&opt.s, be, m->num_floats);
    neox_segment *segs = neox_malloc((size_t)m->nparams * sizeof *segs);
    neox_optimizer_tensor *tensors = neox_calloc((size_t)m->nparams, sizeof *tensors);  // (SM3's shapes; one rank)
    for (int i = 0; i < m->nparams; i++) {
        const neox_param *p = &m->params[i];
        segs[i] = (neox_segment){p->offset, p->offset + p->numel, p->no_decay ? 0.0f : (float)opt.s.weight_decay};
        tensors[i] = (neox_optimizer_tensor){.offset = p->offset, .numel = p->numel, .matrix = p->ndim == 2,
                                             .rows = p->ndim == 2 ? p->shape[0] : (int64_t)p->numel,
                                             .cols = p->ndim == 2 ? p->shape[1] : 1};
    }
    neox_optimizer_set_tensors(o, 0, tensors, m->nparams);
    free(tensors);
    neox_lr_schedule sched = neox_lr_schedule_make(opt.lr, opt.min_lr, opt.warmup, opt.decay_iters, NEOX_LR_COSINE);
    neox_error err = {0};
    float *first_grads = neox_malloc(m->num_floats * sizeof(float));  // (the output's gradients)
    memcpy(first_grads, m->grad_buf, m->num_floats * sizeof(float));
    neox_safetensors *recorded = opt.grads ? neox_safetensors_open(opt.grads, &err) : NULL;
    if (opt.grads && !recorded) neox_die_error(&err);
    for (int step = 1; step <= opt.steps; step++) {
        if (recorded) {
            for (int i = 0; i < m->nparams; i++) {
                const neox_param *p = &m->params[i];
                char *name = neox_asprintf("grad.%d.%s", step, p->name);
                memcpy(m->grad_buf + p->offset, need(recorded, name, "F32", (int64_t)p->numel)->data, p->numel * sizeof(float));
                free(name);
            }
        } else if (step > 1) {
            neox_model_zero_grad(m);
            if (neox_model_forward(m, ids, targets, mask, &err) != 0) neox_die_error(&err);
            neox_model_backward(m, 1.0f);
        }
        double coef = neox_clip_coefficient(opt.s.clip_grad, sqrt(neox_sum_squares(m->grad_buf, m->num_floats)));
        if (coef != 1.0) neox_scale(m->grad_buf, m->num_floats, (float)coef);
        neox_optimizer_step(o, m->param_buf, m->grad_buf, segs, m->nparams, neox_lr_at(&sched, step - 1), step);
        neox_model_weights_changed(m);
    }
    neox_safetensors_close(recorded);
    memcpy(m->grad_buf, first_grads, m->num_floats * sizeof(float));
    free(first_grads);
    free(segs);
    neox_optimizer_free(o);
}

int main(int argc, char **argv) {
    neox_set_progname(argv[0]);
    if (argc < 4) neox_die(2, "usage: model_parity WEIGHTS INPUTS OUT key=value...");
    neox_model_desc d = {.norm_eps = 1e-5f, .rotary_base = 10000.0, .init_std = 0.02, .mlp_bias = 1, .attn_bias = 1,
                         .norm_bias = 1, .max_positions = 2048};
    int adam_steps = 0;
    float lr = 1e-3f;
    for (int i = 4; i < argc; i++)
        if (parse_kv(&d, &adam_steps, &lr, argv[i]) != 0) neox_die(2, "bad argument '%s'", argv[i]);
    neox_error err = {0};
    neox_model *m = neox_model_create(&d, &err);
    if (!m) neox_die_error(&err);
    neox_model_set_precision(m, precision);
    if (fp32_storage) neox_model_set_storage(m, NEOX_ELEM_F32);
    if (precision == NEOX_PRECISION_FP8) neox_model_set_fp8_recipe(m, &fp8);
    m->training = training;
    neox_model_set_head_rows(m, head_rows);
    neox_safetensors *w = neox_safetensors_open(argv[1], &err), *in = w ? neox_safetensors_open(argv[2], &err) : NULL;
    if (!w || !in) neox_die_error(&err);
    for (int i = 0; i < w->count; i++)
        if (!neox_model_find_param(m, w->tensors[i].name)) neox_die(1, "%s: '%s' is not a parameter of this model", argv[1], w->tensors[i].name);
    for (int i = 0; i < m->nparams; i++) {
        const neox_param *p = &m->params[i];
        memcpy(m->param_buf + p->offset, need(w, p->name, "F32", (int64_t)p->numel)->data, p->numel * sizeof(float));
    }
    const neox_st_tensor *ids_t = need(in, "input_ids", "I64", -1);
    if (ids_t->ndim != 2) neox_die(1, "input_ids must be (B, T)");
    int B = (int)ids_t->shape[0], T = (int)ids_t->shape[1];
    int *ids = ids_of(in, "input_ids", (int64_t)B * T), *targets = ids_of(in, "targets", (int64_t)B * T);
    const neox_st_tensor *mask_t = neox_safetensors_find(in, "loss_mask");
    const float *mask = mask_t ? need(in, "loss_mask", "F32", (int64_t)B * T)->data : NULL;
    if (neox_model_plan(m, B, T, &err) != 0 || neox_model_forward(m, ids, targets, mask, &err) != 0) neox_die_error(&err);
    float loss = m->loss;
    // With dpo_beta: rows [0, B/2) chosen, [B/2, B) rejected, and INPUTS' "ref_logprobs" (F64, (B, T))
    // the reference model's; the loss and gradients are DPO's.
    if (dpo_beta > 0) {
        if (B % 2 || !mask) neox_die(1, "dpo_beta needs an even number of rows and a loss_mask");
        const double *ref = (const double *)need(in, "ref_logprobs", "F64", (int64_t)B * T)->data;
        double *lp = neox_malloc((size_t)B * T * sizeof *lp), metrics[NEOX_DPO_METRICS];
        float *weights = neox_malloc((size_t)B * T * sizeof *weights);
        neox_model_token_logprobs(m, lp);
        loss = (float)neox_dpo_loss(lp, ref, mask, B / 2, T, dpo_beta, weights, metrics);
        neox_model_set_token_weights(m, weights);
        free(lp);
        free(weights);
    }
    // With value_head: rows [0, B/2) chosen, [B/2, B) rejected, each with one scored position of the
    // loss_mask; the loss and gradients are the reward model's (neox_rm_loss).
    float *values = NULL;  // kept for the output (set_value_grads overwrites the model's copy)
    if (d.value_head) {
        if (B % 2 || !mask) neox_die(1, "value_head needs an even number of rows and a loss_mask");
        values = neox_malloc((size_t)B * T * sizeof *values);
        float *grads = neox_malloc((size_t)B * T * sizeof *grads);
        double metrics[NEOX_RM_METRICS];
        int bad;
        neox_model_values(m, values);
        loss = (float)neox_rm_loss(values, mask, B / 2, T, z_loss, grads, metrics, &bad);
        if (bad >= 0) neox_die(1, "row %d of loss_mask does not have exactly one scored position", bad);
        neox_model_set_value_grads(m, grads);
        free(grads);
    }

    // With kto_beta: INPUTS' "ref_logprobs" (F64, (B, T)) and "rewards" (F32, (B, T)); the loss and
    // gradients are KTO's, and "kto_metrics" (F32, 9) its metrics.
    float kto_metrics[NEOX_KTO_METRICS];
    if (kto.beta > 0) {
        if (!mask) neox_die(1, "kto_beta needs a loss_mask");
        const double *ref = (const double *)need(in, "ref_logprobs", "F64", (int64_t)B * T)->data;
        const float *rewards = (const float *)need(in, "rewards", "F32", (int64_t)B * T)->data;
        double *lp = neox_malloc((size_t)B * T * sizeof *lp), metrics[NEOX_KTO_METRICS];
        float *weights = neox_malloc((size_t)B * T * sizeof *weights);
        neox_model_token_logprobs(m, lp);
        loss = (float)neox_kto_loss(lp, ref, mask, rewards, B, T, &kto, weights, metrics);
        for (int i = 0; i < NEOX_KTO_METRICS; i++) kto_metrics[i] = (float)metrics[i];
        neox_model_set_token_weights(m, weights);
        free(lp);
        free(weights);
    }

    // Outputs: logits and loss of the forward, then the gradients of one backward.
    int n = 0, cap = m->nparams + 4 + d.num_layers;
    neox_st_entry *e = neox_calloc(cap, sizeof *e);
    int cols = d.value_head ? 1 : d.vocab_size;
    size_t nlogits = (size_t)B * T * cols;
    float *logits = NULL;
    if (m->head_rows == B * T) {  // a chunked head keeps no logits
        logits = neox_malloc(nlogits * sizeof(float));
        if (values) memcpy(logits, values, nlogits * sizeof(float));
        else neox_model_act_to_host(m, logits, neox_model_logits(m), nlogits);
        e[n++] = (neox_st_entry){d.value_head ? "values" : "logits", "F32", d.value_head ? 2 : 3, {B, T, cols}, logits};
    }
    free(values);
    e[n++] = (neox_st_entry){"loss", "F32", 1, {1}, &loss};
    if (kto.beta > 0) e[n++] = (neox_st_entry){"kto_metrics", "F32", 1, {NEOX_KTO_METRICS}, kto_metrics};
    neox_model_backward(m, 1.0f);
    neox_model_fp8_update(m);
    float *jitter = NULL;
    char jitter_names[8][32];
    if (d.moe_jitter_eps > 0 && training) {  // factor = jittered input / input (no recomputation here)
        size_t NC = (size_t)B * T * d.hidden_size;
        jitter = neox_malloc((size_t)d.num_layers * NC * sizeof(float));
        const neox_acts *a = m->acts;
        for (int l = 0; l < d.num_layers && l < 8; l++) {
            const neox_layer_acts *la = &a->layers[l];
            if (!la->moe.jx) continue;
            for (size_t i = 0; i < NC; i++) jitter[l * NC + i] = la->moe.jx[i] / la->ln2[i];
            snprintf(jitter_names[l], sizeof jitter_names[l], "moe_jitter.%d", l);
            e[n++] = (neox_st_entry){jitter_names[l], "F32", 2, {(int64_t)B * T, d.hidden_size}, jitter + l * NC};
        }
    }
    char **names = neox_calloc(m->nparams, sizeof *names);
    for (int i = 0; i < m->nparams; i++) {
        const neox_param *p = &m->params[i];
        names[i] = neox_asprintf("grad.%s", p->name);
        e[n++] = (neox_st_entry){names[i], "F32", p->ndim, {p->shape[0], p->shape[1]}, m->grad_buf + p->offset};
    }
    // Optional AdamW steps on the same batch (no weight decay on biases and norms), recording losses.
    float *losses = NULL, *mom = NULL, *vel = NULL;
    if (adam_steps > 0) {
        losses = neox_calloc(adam_steps, sizeof(float));
        mom = neox_calloc(m->num_floats, sizeof(float));
        vel = neox_calloc(m->num_floats, sizeof(float));
        float *grads = neox_malloc(m->num_floats * sizeof(float));
        memcpy(grads, m->grad_buf, m->num_floats * sizeof(float));  // keep the first gradients for output
        for (int s = 0; s < adam_steps; s++) {
            if (s > 0) {
                neox_model_zero_grad(m);
                if (neox_model_forward(m, ids, targets, mask, &err) != 0) neox_die_error(&err);
                neox_model_backward(m, 1.0f);
                neox_model_fp8_update(m);
            }
            losses[s] = m->loss;
            for (int i = 0; i < m->nparams; i++) {
                const neox_param *p = &m->params[i];
                neox_adamw(m->param_buf + p->offset, m->grad_buf + p->offset, mom + p->offset, vel + p->offset, p->numel,
                           lr, 0.9f, 0.95f, 1e-8f, p->no_decay ? 0.0f : 0.1f, s + 1);
            }
            neox_model_weights_changed(m);
        }
        memcpy(m->grad_buf, grads, m->num_floats * sizeof(float));
        free(grads);
        e[n++] = (neox_st_entry){"losses", "F32", 1, {adam_steps}, losses};
    }
    int nscales = neox_model_fp8_tensors(m);
    if (nscales) {
        e = neox_realloc(e, (size_t)(n + m->nparams + 1) * sizeof *e);
        e[n++] = (neox_st_entry){"fp8_scales", "F32", 1, {nscales}, neox_model_fp8_scale(m)};
    }
    char **param_names = NULL;
    if (opt.type && opt.steps > 0) {
        optimizer_steps(m, ids, targets, mask);
        param_names = neox_calloc(m->nparams, sizeof *param_names);
        e = neox_realloc(e, (size_t)(n + m->nparams) * sizeof *e);
        for (int i = 0; i < m->nparams; i++) {
            const neox_param *p = &m->params[i];
            param_names[i] = neox_asprintf("param.%s", p->name);
            e[n++] = (neox_st_entry){param_names[i], "F32", p->ndim, {p->shape[0], p->shape[1]}, m->param_buf + p->offset};
        }
    }
    if (neox_safetensors_write(argv[3], e, n, NULL, &err) != 0) neox_die_error(&err);
    for (int i = 0; param_names && i < m->nparams; i++) free(param_names[i]);
    free(param_names);
    for (int i = 0; i < m->nparams; i++) free(names[i]);
    free(names); free(e); free(jitter); free(logits); free(ids); free(targets); free(losses); free(mom); free(vel);
    neox_safetensors_close(w);
    neox_safetensors_close(in);
    neox_model_free(m);
    return 0;
}
