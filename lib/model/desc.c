// desc.c: the model description from a GPT-NeoX config, with GPT-NeoX's derived sizes: the MLP
// width (4h, or intermediate_size / expansion_factor; 2/3 of it per half for the gated activations;
// rounded to mlp_multiple_of as GPT-NeoX's ParallelMLP rounds it; Transformer Engine's LayerNormMLP's
// otherwise: transformer_engine.c), rotary dims int(head * rotary_pct), the padded vocabulary, the
// epsilon of the chosen norm.
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "model_internal.h"

// `norm`: te_rmsnorm and te_layernorm are GPT-NeoX's Transformer Engine modules for the same
// arithmetic (fused kernels), so they select RMSNorm and LayerNorm.
static int parse_norm(const neox_config *cfg, neox_model_desc *d, neox_error *err) {
    const char *norm = neox_config_str(cfg, norm);
    if (strcmp(norm, "rmsnorm") == 0 || strcmp(norm, "te_rmsnorm") == 0) {
        d->norm = NEOX_NORM_RMSNORM;
        d->norm_eps = (float)neox_config_float(cfg, rms_norm_epsilon);
    } else if (strcmp(norm, "layernorm") == 0 || strcmp(norm, "te_layernorm") == 0) {
        d->norm = NEOX_NORM_LAYERNORM;
        d->norm_eps = (float)neox_config_float(cfg, layernorm_epsilon);
        d->norm_bias = neox_config_bool(cfg, use_bias_in_norms);
    } else if (strcmp(norm, "non_parametric_layernorm") == 0) {
        d->norm = NEOX_NORM_NONPARAMETRIC;
        d->norm_eps = (float)neox_config_float(cfg, layernorm_epsilon);
    } else if (strcmp(norm, "scalenorm") == 0) {
        d->norm = NEOX_NORM_SCALENORM;
        d->norm_eps = (float)neox_config_float(cfg, scalenorm_epsilon);
    } else {
        return neox_fail(err, NEOX_EXIT_USAGE, "norm '%s' is not supported (layernorm, non_parametric_layernorm, rmsnorm, "
                         "scalenorm, te_layernorm, te_rmsnorm)", norm);
    }
    return 0;
}

static int parse_init(const char *name, neox_init_method *out) {
    static const struct { const char *name; neox_init_method m; } methods[] = {
        {"normal", NEOX_INIT_NORMAL}, {"scaled_normal", NEOX_INIT_SCALED_NORMAL},
        {"small_init", NEOX_INIT_SMALL}, {"wang_init", NEOX_INIT_WANG},
    };
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (strcmp(name, methods[i].name) == 0) { *out = methods[i].m; return 0; }
    return -1;
}

static const struct {
    const char *name;
    neox_activation act;
    neox_act_fn fn;
} activations[] = {
    {"gelu", NEOX_ACT_GELU, NEOX_FN_GELU},           {"gelu", NEOX_ACT_GELU_TANH, NEOX_FN_GELU_TANH},
    {"gelu", NEOX_ACT_GELU_ONNX, NEOX_FN_GELU_ONNX}, {"relu", NEOX_ACT_RELU, NEOX_FN_RELU},
    {"silu", NEOX_ACT_SILU, NEOX_FN_SILU},           {"swish", NEOX_ACT_SILU, NEOX_FN_SILU},
    {"softsign", NEOX_ACT_SOFTSIGN, NEOX_FN_SOFTSIGN}, {"mish", NEOX_ACT_MISH, NEOX_FN_MISH},
    {"swiglu", NEOX_ACT_SWIGLU, NEOX_FN_SILU},       {"geglu", NEOX_ACT_GEGLU, NEOX_FN_GELU},
    {"reglu", NEOX_ACT_REGLU, NEOX_FN_RELU},         {"bilinear", NEOX_ACT_BILINEAR, NEOX_FN_IDENTITY},
    {"glu", NEOX_ACT_GLU, NEOX_FN_SIGMOID},          {"geglu", NEOX_ACT_GEGLU_TANH, NEOX_FN_GELU_TANH},
};
enum { NUM_ACTIVATIONS = sizeof activations / sizeof activations[0] };

int neox_activation_gated(neox_activation a) { return a >= NEOX_ACT_SWIGLU; }

neox_act_fn neox_activation_function(neox_activation a) {
    for (int i = 0; i < NUM_ACTIVATIONS; i++)
        if (activations[i].act == a) return activations[i].fn;
    return NEOX_FN_IDENTITY;
}

const char *neox_activation_name(neox_activation a) {
    for (int i = 0; i < NUM_ACTIVATIONS; i++)
        if (activations[i].act == a) return activations[i].name;
    return "?";
}

int neox_activation_parse(const char *name, neox_activation *out) {
    for (int i = 0; i < NUM_ACTIVATIONS; i++)
        if (strcmp(activations[i].name, name) == 0) return *out = activations[i].act, 0;
    return -1;
}

// gelu's variant: GPT-NeoX refuses onnx_safe with bias_gelu_fusion.
static int gelu_variant(const neox_config *cfg, neox_activation *out, neox_error *err) {
    int onnx = neox_config_bool(cfg, onnx_safe), tanh_fused = neox_config_bool(cfg, bias_gelu_fusion);
    if (onnx && tanh_fused)
        return neox_fail(err, NEOX_EXIT_USAGE, "onnx_safe and bias_gelu_fusion cannot both be set (GPT-NeoX refuses "
                         "the pair)");
    *out = onnx ? NEOX_ACT_GELU_ONNX : tanh_fused ? NEOX_ACT_GELU_TANH : NEOX_ACT_GELU;
    return 0;
}

static int parse_activation(const neox_config *cfg, neox_activation *out, neox_error *err) {
    const char *act = neox_config_str(cfg, activation);
    if (neox_activation_parse(act, out) != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "activation '%s' is not supported (gelu, relu, silu, swish, softsign, "
                         "mish, swiglu, geglu, reglu, bilinear, glu)", act);
    return *out == NEOX_ACT_GELU ? gelu_variant(cfg, out, err) : 0;
}

// rope_scaling: {rope_type (or type): default | linear | llama3, factor, low_freq_factor,
// high_freq_factor, original_max_position_embeddings} as Hugging Face's config.json writes it.
static double rope_number(const neox_config *cfg, neox_subkey_id path, int *missing) {
    const neox_value *v = neox_config_sub_id(cfg, path);
    if (!v || (v->kind != NEOX_VALUE_INT && v->kind != NEOX_VALUE_FLOAT)) return *missing = 1, 0;
    return v->number;
}

static int parse_rope_scaling(const neox_config *cfg, neox_rope_scaling *s, neox_error *err) {
    memset(s, 0, sizeof *s);
    if (!neox_config_has(cfg, rope_scaling)) return 0;
    // transformers reads `type` where rope_type is absent; both given must agree.
    const neox_value *type = neox_config_sub(cfg, rope_scaling__rope_type), *old = neox_config_sub(cfg, rope_scaling__type);
    if (type && old && strcmp(type->string, old->string) != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "rope_scaling: rope_type '%s' and type '%s' disagree", type->string,
                         old->string);
    const char *name = type ? type->string : old ? old->string : "default";
    if (!strcmp(name, "default")) return 0;
    int missing = 0;
    s->kind = !strcmp(name, "linear") ? NEOX_ROPE_LINEAR : NEOX_ROPE_LLAMA3;
    s->factor = rope_number(cfg, NEOX_SK_rope_scaling__factor, &missing);
    if (missing) return neox_fail(err, NEOX_EXIT_USAGE, "rope_scaling.factor is not set (rope_type %s needs it)", name);
    if (s->kind == NEOX_ROPE_LINEAR) return 0;
    s->low_freq_factor = rope_number(cfg, NEOX_SK_rope_scaling__low_freq_factor, &missing);
    s->high_freq_factor = rope_number(cfg, NEOX_SK_rope_scaling__high_freq_factor, &missing);
    s->original_max_positions = (int)rope_number(cfg, NEOX_SK_rope_scaling__original_max_position_embeddings, &missing);
    if (missing)
        return neox_fail(err, NEOX_EXIT_USAGE, "rope_scaling: rope_type llama3 needs factor, low_freq_factor, "
                         "high_freq_factor and original_max_position_embeddings");
    if (!(s->high_freq_factor > s->low_freq_factor))
        return neox_fail(err, NEOX_EXIT_USAGE, "rope_scaling: high_freq_factor %g must exceed low_freq_factor %g",
                         s->high_freq_factor, s->low_freq_factor);
    return 0;
}

static int64_t round_up(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

// GPT-NeoX's MLP width: the fused first projection has `out` columns (both halves when gated) and
// the second projection `in` rows; they must agree for the model to exist — unless no layer has a
// dense MLP (dense 0: every layer a Mixture of Experts, whose width is intermediate_size as given,
// as in a Mixtral of intermediate_size 14336, whose 2/3 is odd).
static int mlp_width(const neox_config *cfg, int hidden, int gated, int dense, int *width, neox_error *err) {
    int64_t ffn = 4 * (int64_t)hidden;
    if (neox_config_has(cfg, intermediate_size)) ffn = neox_config_int(cfg, intermediate_size);
    else if (neox_config_has(cfg, expansion_factor)) ffn = (int64_t)(neox_config_float(cfg, expansion_factor) * hidden);
    int64_t multiple = neox_config_int(cfg, mlp_multiple_of);
    if (multiple <= 0) return neox_fail(err, NEOX_EXIT_USAGE, "mlp_multiple_of must be positive");
    int64_t in = ffn;
    if (gated) {
        ffn = ffn * 2 / 3;
        in = ffn / 2;
    }
    int64_t out = round_up(ffn, 2 * multiple);
    in = round_up(in, multiple);
    if ((out != (gated ? 2 * in : in) && dense) || in <= 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "intermediate_size/mlp_multiple_of give MLP widths %lld and %lld that "
                         "do not match", (long long)out, (long long)in);
    *width = (int)in;
    return 0;
}

// The padded vocabulary: pinned_padded_vocab_size, the same under every model_parallel_size, or
// GPT-NeoX's (the tokenizer's vocabulary rounded up to make_vocab_size_divisible_by x
// model_parallel_size), or padded_vocab_size without a tokenizer. GPT-NeoX overwrites a
// padded_vocab_size the file set with its own; here the two must agree.
static int padded_vocab(neox_model_desc *d, const neox_config *cfg, int64_t tokenizer_vocab, neox_error *err) {
    char where[4096];
    const int64_t given = neox_config_has(cfg, padded_vocab_size) ? neox_config_int(cfg, padded_vocab_size) : 0;
    const int64_t mp = neox_config_int(cfg, model_parallel_size);
    if (neox_config_has(cfg, pinned_padded_vocab_size)) {
        int64_t pinned = neox_config_int(cfg, pinned_padded_vocab_size);
        const char *src = neox_config_source(cfg, pinned_padded_vocab_size, where, sizeof where);
        if (pinned < tokenizer_vocab || pinned > INT_MAX)
            return neox_fail(err, NEOX_EXIT_USAGE, "%s: key 'pinned_padded_vocab_size': %lld rows cannot hold the "
                             "tokenizer's vocabulary of %lld", src, (long long)pinned, (long long)tokenizer_vocab);
        if (mp > 1 && pinned % mp != 0)
            return neox_fail(err, NEOX_EXIT_USAGE, "%s: key 'pinned_padded_vocab_size': %lld is not divisible by "
                             "model_parallel_size %lld (every tensor-parallel rank holds as many vocabulary rows)", src,
                             (long long)pinned, (long long)mp);
        d->vocab_size = (int)pinned;
    } else if (tokenizer_vocab > 0) {
        d->vocab_size = (int)neox_padded_vocab_size(tokenizer_vocab, neox_config_int(cfg, make_vocab_size_divisible_by), mp);
    } else if (given > 0) {
        d->vocab_size = (int)given;
    } else {
        return neox_fail(err, NEOX_EXIT_USAGE, "padded_vocab_size is not set and no tokenizer gives the vocabulary");
    }
    if (given > 0 && given != d->vocab_size)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s: key 'padded_vocab_size': %lld does not match %s %d%s; leave it unset",
                         neox_config_source(cfg, padded_vocab_size, where, sizeof where), (long long)given,
                         neox_config_has(cfg, pinned_padded_vocab_size) ? "pinned_padded_vocab_size"
                                                                        : "the tokenizer's vocabulary padded to",
                         d->vocab_size,
                         neox_config_has(cfg, pinned_padded_vocab_size)
                             ? "" : " (make_vocab_size_divisible_by x model_parallel_size)");
    return 0;
}

// GPT-NeoX's dropless MoE (megatron/model/moe.py, moe_mlp.py): an expert's width is intermediate_size
// as given (not the dense MLP's 2/3 of it when gated), else rounded up to 256 (the grouped MLPs'
// multiple_of, whatever mlp_multiple_of says) from 4 x hidden (ParallelGroupedMLP) or, gated,
// int(2 x hidden x 4 / 3) (ParallelGroupedLLaMAMLP).
static int64_t moe_default_width(int64_t hidden, int gated) {
    return round_up(gated ? (int64_t)(2.0 * (double)hidden * 4.0 / 3.0) : 4 * hidden, 256);
}

static int moe_from_config(neox_model_desc *d, const neox_config *cfg, neox_error *err) {
    int64_t experts = neox_config_int(cfg, moe_num_experts);
    if (experts <= 1) return 0;
    if (experts > 4096) return neox_fail(err, NEOX_EXIT_USAGE, "moe_num_experts %lld: at most 4096", (long long)experts);
    d->moe_experts = (int)experts;
    d->moe_top_k = (int)neox_config_int(cfg, moe_top_k);
    d->moe_interval = (int)neox_config_int(cfg, moe_expert_interval);
    d->moe_router = strcmp(neox_config_str(cfg, moe_router_type), "topk") == 0 ? NEOX_MOE_TOPK : NEOX_MOE_SINKHORN;
    if (neox_config_has(cfg, moe_jitter_eps)) d->moe_jitter_eps = (float)neox_config_float(cfg, moe_jitter_eps);
    d->moe_renormalize = neox_config_bool(cfg, moe_topk_renormalize);
    int64_t width = neox_config_has(cfg, intermediate_size)
                        ? neox_config_int(cfg, intermediate_size)
                        : moe_default_width(d->hidden_size, neox_activation_gated(d->activation));
    if (width <= 0 || width > INT_MAX) return neox_fail(err, NEOX_EXIT_USAGE, "MoE expert width %lld", (long long)width);
    d->moe_ffn_size = (int)width;
    return 0;
}

int neox_model_desc_from_config(neox_model_desc *d, const neox_config *cfg, int64_t tokenizer_vocab, neox_error *err) {
    memset(d, 0, sizeof *d);
    const neox_key_id need[] = {NEOX_K_hidden_size, NEOX_K_num_layers, NEOX_K_num_attention_heads};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (!neox_config_has_id(cfg, need[i]))
            return neox_fail(err, NEOX_EXIT_USAGE, "%s is not set", neox_key_specs[need[i]].name);
    d->hidden_size = (int)neox_config_int(cfg, hidden_size);
    d->num_layers = (int)neox_config_int(cfg, num_layers);
    d->num_heads = (int)neox_config_int(cfg, num_attention_heads);
    d->num_kv_heads = neox_config_has(cfg, num_kv_heads) ? (int)neox_config_int(cfg, num_kv_heads) : d->num_heads;
    if (padded_vocab(d, cfg, tokenizer_vocab, err) != 0) return -1;
    d->max_positions = neox_config_has(cfg, max_position_embeddings) ? (int)neox_config_int(cfg, max_position_embeddings)
                       : neox_config_has(cfg, seq_length) ? (int)neox_config_int(cfg, seq_length) : 0;
    if (d->max_positions <= 0) return neox_fail(err, NEOX_EXIT_USAGE, "max_position_embeddings is not set");

    if (parse_norm(cfg, d, err) != 0) return -1;

    const char *pos = neox_config_str(cfg, pos_emb);
    if (strcmp(pos, "rotary") == 0) d->pos_emb = NEOX_POS_ROTARY;
    else if (strcmp(pos, "learned") == 0) d->pos_emb = NEOX_POS_LEARNED;
    else if (strcmp(pos, "none") == 0) d->pos_emb = NEOX_POS_NONE;
    else if (strcmp(pos, "alibi") == 0) d->pos_emb = NEOX_POS_ALIBI;
    else return neox_fail(err, NEOX_EXIT_USAGE, "pos_emb '%s' is not supported (rotary, learned, none, alibi)", pos);
    if (d->num_heads > 0 && d->pos_emb == NEOX_POS_ROTARY)
        d->rotary_dims = (int)(d->hidden_size / d->num_heads * neox_config_float(cfg, rotary_pct));
    d->rotary_base = (double)neox_config_int(cfg, rotary_emb_base);
    if (parse_rope_scaling(cfg, &d->rope_scaling, err) != 0) return -1;

    if (parse_activation(cfg, &d->activation, err) != 0) return -1;
    int dense = neox_config_int(cfg, moe_num_experts) <= 1 || neox_config_int(cfg, moe_expert_interval) != 1;
    if (neox_config_bool(cfg, te_layernorm_mlp) ? neox_te_mlp_width(cfg, d->hidden_size, &d->ffn_size, err) != 0
        : mlp_width(cfg, d->hidden_size, neox_activation_gated(d->activation), dense, &d->ffn_size, err) != 0)
        return -1;

    d->parallel_residual = neox_config_bool(cfg, gpt_j_residual);
    d->attn_bias = neox_config_bool(cfg, use_bias_in_attn_linear);
    // use_bias_in_attn_output (unset: as use_bias_in_attn_linear) turns off the output projection's bias alone.
    if (neox_config_has(cfg, use_bias_in_attn_output)) {
        int out_bias = neox_config_bool(cfg, use_bias_in_attn_output);
        if (out_bias && !d->attn_bias)
            return neox_fail(err, NEOX_EXIT_USAGE, "use_bias_in_attn_output: true needs use_bias_in_attn_linear: true");
        d->attn_out_unbiased = !out_bias;
    }
    // GPT-NeoX's sliding-window mask keeps keys i - W .. i of query i: W + 1 of them.
    if (neox_config_has(cfg, sliding_window_width)) {
        int64_t w = neox_config_int(cfg, sliding_window_width);
        if (w < 0 || w >= INT_MAX)
            return neox_fail(err, NEOX_EXIT_USAGE, "sliding_window_width: %lld is not a width in [0, %d)", (long long)w, INT_MAX);
        d->attn_window = (int)w + 1;
    }
    d->mlp_bias = neox_config_bool(cfg, use_bias_in_mlp);
    d->qk_norm = neox_config_bool(cfg, use_qk_layernorm);
    if (moe_from_config(d, cfg, err) != 0) return -1;
    d->tied = !neox_config_bool(cfg, no_weight_tying);
    const char *impl = neox_config_str(cfg, train_impl);
    d->value_head = impl && !strcmp(impl, "rm");
    d->init_std = neox_config_float(cfg, init_method_std);
    if (parse_init(neox_config_str(cfg, init_method), &d->init_method) != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "init_method '%s' is not supported", neox_config_str(cfg, init_method));
    if (parse_init(neox_config_str(cfg, output_layer_init_method), &d->output_init_method) != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "output_layer_init_method '%s' is not supported",
                         neox_config_str(cfg, output_layer_init_method));
    d->hidden_dropout = (float)neox_config_float(cfg, hidden_dropout);
    d->attention_dropout = (float)neox_config_float(cfg, attention_dropout);
    d->checkpoint_activations = neox_config_bool(cfg, checkpoint_activations);
    if (neox_te_apply(cfg, d, err) != 0) return -1;
    return neox_model_desc_check(d, err);
}

// ---- pipeline partition ------------------------------------------------------------------------
// Contiguous ranges of layers over pp stages minimising the heaviest stage, where a stage weighs the
// sum of its layers plus `first` on stage 0 and `last` on the final stage (dynamic programming over
// (stages, layers); the first minimum is kept, so the result is deterministic).
static void balance(const double *w, int L, int pp, double first, double last, int *bounds) {
    double *best = neox_malloc((size_t)(pp + 1) * (L + 1) * sizeof *best);
    int *cut = neox_malloc((size_t)(pp + 1) * (L + 1) * sizeof *cut);
    double *prefix = neox_malloc((size_t)(L + 1) * sizeof *prefix);
    prefix[0] = 0;
    for (int l = 0; l < L; l++) prefix[l + 1] = prefix[l] + w[l];
#define AT(s, l) ((size_t)(s) * (L + 1) + (l))
    for (int s = 1; s <= pp; s++)
        for (int l = s; l <= L - (pp - s); l++) {
            best[AT(s, l)] = -1;
            int kmax = s == 1 ? 1 : l;
            for (int k = s - 1; k < kmax; k++) {  // stage s-1 holds layers [k, l)
                double stage = prefix[l] - prefix[k] + (s == 1 ? first : 0) + (s == pp ? last : 0);
                double worst = s == 1 ? stage : (best[AT(s - 1, k)] > stage ? best[AT(s - 1, k)] : stage);
                if (best[AT(s, l)] < 0 || worst < best[AT(s, l)]) best[AT(s, l)] = worst, cut[AT(s, l)] = k;
            }
        }
    bounds[pp] = L;
    for (int s = pp, l = L; s >= 1; s--) l = bounds[s - 1] = cut[AT(s, l)];
#undef AT
    free(best);
    free(cut);
    free(prefix);
}

int neox_model_pipe_partition(const neox_model_desc *desc, int pp, const char *method, int *bounds, neox_error *err) {
    int L = desc->num_layers;
    if (pp < 1 || pp > L)
        return neox_fail(err, NEOX_EXIT_USAGE, "pipe_parallel_size %d: need between 1 and num_layers = %d stages", pp, L);
    // type:REGEX balances the layers whose class matches REGEX; neox.c's only layer kind is the
    // transformer layer, so any pattern naming it balances transformer layers.
    if (!method || (strncmp(method, "type:", 5) == 0 && strcasestr(method, "transformer"))) {
        for (int s = 0; s <= pp; s++) bounds[s] = (int)((int64_t)s * L / pp);
        return 0;
    }
    double *w = neox_calloc((size_t)L, sizeof *w);
    double first = 1, last = 1;
    if (strcmp(method, "parameters") == 0) {
        neox_model_desc whole = *desc;
        whole.tp_size = whole.pp_size = 1;
        whole.tp_rank = whole.pp_rank = whole.layer_begin = whole.layer_end = 0;
        int n;
        neox_param *params = neox_model_param_list(&whole, &n, err);
        if (!params) return free(w), -1;
        first = last = 0;
        for (int i = 0; i < n; i++) {
            const char *at = strstr(params[i].name, ".layers.");
            double count = (double)params[i].numel;
            if (at) w[atoi(at + strlen(".layers."))] += count;
            else if (strstr(params[i].name, "embed_in") || strstr(params[i].name, "embed_tokens") ||
                     strstr(params[i].name, "embed_pos") || strstr(params[i].name, "embed_positions")) first += count;
            else last += count;
        }
        if (whole.tied) last += (double)whole.vocab_size * whole.hidden_size;  // the last stage's copy
        free(params);
    } else if (strcmp(method, "uniform") == 0) {
        for (int l = 0; l < L; l++) w[l] = 1;
    } else {
        free(w);
        return neox_fail(err, NEOX_EXIT_USAGE, "pipe_partition_method '%s' is not supported (type:transformer|mlp, "
                         "parameters, uniform)", method);
    }
    if (strcmp(method, "uniform") == 0) first = last = 1;
    balance(w, L, pp, first, last, bounds);
    free(w);
    return 0;
}
