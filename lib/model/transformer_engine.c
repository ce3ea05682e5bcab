// transformer_engine.c: what GPT-NeoX's Transformer Engine keys (te_mha, te_layernorm_mlp,
// te_columnparallel, te_rowparallel; megatron/model/transformer_engine.py) select in a model
// description. Each selects a TE module whose arithmetic neox.c's own layers compute, except where TE
// computes differently, which the description then records: LayerNormMLP's gelu is the tanh
// approximation and its width is not GPT-NeoX's gated 2/3 nor rounded. Combinations GPT-NeoX's TE
// modules cannot express (a bias switched off, another epsilon, a MoE layer) are refused by name.
#include <stdint.h>

#include "model_internal.h"

// TE's LayerNormMLP normalises with a fixed epsilon: GPT-NeoX passes it 1e-5 for LayerNorm and 1e-8
// for RMSNorm, whatever layernorm_epsilon or rms_norm_epsilon say.
#define TE_LAYERNORM_EPS 1.0e-5f
#define TE_RMSNORM_EPS 1.0e-8f

int neox_te_mlp_width(const neox_config *cfg, int hidden, int *width, neox_error *err) {
    // LayerNormMLP's ffn_hidden_size as GPT-NeoX computes it: no 2/3 for gated activations (TE's
    // first projection is then 2F wide), no rounding to mlp_multiple_of.
    int64_t ffn = 4 * (int64_t)hidden;
    if (neox_config_has(cfg, intermediate_size)) ffn = neox_config_int(cfg, intermediate_size);
    else if (neox_config_has(cfg, expansion_factor)) ffn = (int64_t)(neox_config_float(cfg, expansion_factor) * hidden);
    if (neox_config_int(cfg, mlp_multiple_of) != 1)
        return neox_fail(err, NEOX_EXIT_USAGE, "mlp_multiple_of %lld with te_layernorm_mlp: Transformer Engine's "
                         "LayerNormMLP does not round its width (GPT-NeoX hands it mlp_multiple_of unused); set "
                         "intermediate_size to the width wanted and leave mlp_multiple_of at 1",
                         (long long)neox_config_int(cfg, mlp_multiple_of));
    if (ffn <= 0 || ffn > INT32_MAX)
        return neox_fail(err, NEOX_EXIT_USAGE, "te_layernorm_mlp: MLP width %lld", (long long)ffn);
    *width = (int)ffn;
    return 0;
}

// TE's activation for GPT-NeoX's `activation` name: TE's gelu (and geglu's gelu) is the tanh
// approximation (transformer_engine/common/util/math.h); relu, reglu and swiglu are neox.c's.
// TE's swiglu is silu(first half) * second half and GPT-NeoX's own silu(second half) * first half:
// the same arithmetic with the halves named gate and up, which is how neox.c stores them.
static int te_activation(neox_activation *act, neox_error *err) {
    switch (*act) {
    case NEOX_ACT_GELU: case NEOX_ACT_GELU_TANH: *act = NEOX_ACT_GELU_TANH; return 0;
    case NEOX_ACT_GEGLU: *act = NEOX_ACT_GEGLU_TANH; return 0;
    case NEOX_ACT_RELU: case NEOX_ACT_REGLU: case NEOX_ACT_SWIGLU: return 0;
    default:
        return neox_fail(err, NEOX_EXIT_USAGE, "activation '%s' with te_layernorm_mlp: Transformer Engine's "
                         "LayerNormMLP takes gelu, geglu, relu, reglu or swiglu", neox_activation_name(*act));
    }
}

static int te_layernorm_mlp(const neox_config *cfg, neox_model_desc *d, neox_error *err) {
    const char *why = NULL;
    float te_eps = d->norm == NEOX_NORM_RMSNORM ? TE_RMSNORM_EPS : TE_LAYERNORM_EPS;
    if (d->norm != NEOX_NORM_LAYERNORM && d->norm != NEOX_NORM_RMSNORM)
        why = "its norm is LayerNorm or RMSNorm (norm layernorm, te_layernorm, rmsnorm or te_rmsnorm)";
    else if (d->norm_eps != te_eps)
        why = d->norm == NEOX_NORM_RMSNORM ? "it normalises with epsilon 1e-08 whatever rms_norm_epsilon says, so "
                                             "set rms_norm_epsilon to 1e-08 for the model's norms to agree"
                                           : "it normalises with epsilon 1e-05 whatever layernorm_epsilon says, so "
                                             "set layernorm_epsilon to 1e-05 for the model's norms to agree";
    else if (d->norm == NEOX_NORM_LAYERNORM && !d->norm_bias)
        why = "its LayerNorm always has a bias (use_bias_in_norms: false cannot apply to it)";
    else if (!d->mlp_bias)
        why = "its linears always have biases (use_bias_in_mlp: false cannot apply to them)";
    else if (d->moe_experts > 1)
        why = "GPT-NeoX then drops the post-attention norm of its Mixture-of-Experts layers (set moe_num_experts "
              "to 1)";
    else if (neox_config_bool(cfg, onnx_safe))
        why = "its gelu is the tanh approximation, not onnx_safe's erf_gelu";
    if (why) return neox_fail(err, NEOX_EXIT_USAGE, "te_layernorm_mlp: Transformer Engine's LayerNormMLP cannot "
                              "hold this model: %s", why);
    return te_activation(&d->activation, err);
}

// TE's MultiheadAttention as GPT-NeoX builds it: fused QKV interleaved per head (TE's default, as
// Megatron's), biases on, causal softmax(q k^T / sqrt(head size)), GPT-NeoX's rotary embeddings
// applied by TE (rotate-half, the leading rotary_pct of each head), GQA by num_kv_heads: neox.c's
// attention. The pre-attention norm stays the layer's (input_layernorm=False).
static int te_mha(const neox_model_desc *d, neox_error *err) {
    const char *why = NULL;
    if (d->pos_emb != NEOX_POS_ROTARY)
        why = "GPT-NeoX feeds it rotary embeddings, which it builds only for pos_emb rotary";
    else if (d->rope_scaling.kind != NEOX_ROPE_DEFAULT)
        why = "GPT-NeoX's rotary embeddings for it are unscaled (unset rope_scaling)";
    else if (!d->attn_bias || d->attn_out_unbiased)
        why = "its linears always have biases (use_bias_in_attn_linear and use_bias_in_attn_output cannot be false)";
    else if (d->qk_norm)
        why = "it has no query/key norm (unset use_qk_layernorm)";
    if (why) return neox_fail(err, NEOX_EXIT_USAGE, "te_mha: Transformer Engine's MultiheadAttention cannot hold "
                              "this model: %s", why);
    return 0;
}

int neox_te_apply(const neox_config *cfg, neox_model_desc *d, neox_error *err) {
    if (neox_config_bool(cfg, te_layernorm_mlp) && te_layernorm_mlp(cfg, d, err) != 0) return -1;
    if (neox_config_bool(cfg, te_mha) && te_mha(d, err) != 0) return -1;
    // te_columnparallel and te_rowparallel put TE's Linear (y = x W^T + b, one bias added after the
    // row-parallel reduction) where Megatron's column- and row-parallel linears were: the arithmetic
    // of neox.c's linears, which they therefore select. Their communication is neox.c's (docs/model.md,
    // "Transformer Engine").
    (void)neox_config_bool(cfg, te_columnparallel);
    (void)neox_config_bool(cfg, te_rowparallel);
    return 0;
}
