// desc.c: the model description from a GPT-NeoX config, with GPT-NeoX's derived sizes: the MLP
// width (4h, or intermediate_size / expansion_factor; 2/3 of it per half for the gated swiglu;
// rounded to mlp_multiple_of as GPT-NeoX's ParallelMLP rounds it), rotary dims int(head * rotary_pct),
// the padded vocabulary, the epsilon of the chosen norm.
#include <string.h>

#include "model.h"

static int parse_init(const char *name, neox_init_method *out) {
    static const struct { const char *name; neox_init_method m; } methods[] = {
        {"normal", NEOX_INIT_NORMAL}, {"scaled_normal", NEOX_INIT_SCALED_NORMAL},
        {"small_init", NEOX_INIT_SMALL}, {"wang_init", NEOX_INIT_WANG},
    };
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (strcmp(name, methods[i].name) == 0) { *out = methods[i].m; return 0; }
    return -1;
}

static int64_t round_up(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

// GPT-NeoX's MLP width: the fused first projection has `out` columns (both halves when gated) and
// the second projection `in` rows; they must agree for the model to exist.
static int mlp_width(const neox_config *cfg, int hidden, int gated, int *width, neox_error *err) {
    int64_t ffn = 4 * (int64_t)hidden;
    if (neox_config_has(cfg, "intermediate_size")) ffn = neox_config_int(cfg, "intermediate_size");
    else if (neox_config_has(cfg, "expansion_factor")) ffn = (int64_t)(neox_config_float(cfg, "expansion_factor") * hidden);
    int64_t multiple = neox_config_int(cfg, "mlp_multiple_of");
    if (multiple <= 0) return neox_fail(err, NEOX_EXIT_USAGE, "mlp_multiple_of must be positive");
    int64_t in = ffn;
    if (gated) {
        ffn = ffn * 2 / 3;
        in = ffn / 2;
    }
    int64_t out = round_up(ffn, 2 * multiple);
    in = round_up(in, multiple);
    if (out != (gated ? 2 * in : in) || in <= 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "intermediate_size/mlp_multiple_of give MLP widths %lld and %lld that "
                         "do not match", (long long)out, (long long)in);
    *width = (int)in;
    return 0;
}

int neox_model_desc_from_config(neox_model_desc *d, const neox_config *cfg, int64_t tokenizer_vocab, neox_error *err) {
    memset(d, 0, sizeof *d);
    const char *need[] = {"hidden_size", "num_layers", "num_attention_heads"};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (!neox_config_has(cfg, need[i])) return neox_fail(err, NEOX_EXIT_USAGE, "%s is not set", need[i]);
    d->hidden_size = (int)neox_config_int(cfg, "hidden_size");
    d->num_layers = (int)neox_config_int(cfg, "num_layers");
    d->num_heads = (int)neox_config_int(cfg, "num_attention_heads");
    d->num_kv_heads = neox_config_has(cfg, "num_kv_heads") ? (int)neox_config_int(cfg, "num_kv_heads") : d->num_heads;
    if (tokenizer_vocab > 0)
        d->vocab_size = (int)neox_padded_vocab_size(tokenizer_vocab, neox_config_int(cfg, "make_vocab_size_divisible_by"),
                                                    neox_config_int(cfg, "model_parallel_size"));
    else if (neox_config_has(cfg, "padded_vocab_size"))
        d->vocab_size = (int)neox_config_int(cfg, "padded_vocab_size");
    else
        return neox_fail(err, NEOX_EXIT_USAGE, "padded_vocab_size is not set and no tokenizer gives the vocabulary");
    d->max_positions = neox_config_has(cfg, "max_position_embeddings") ? (int)neox_config_int(cfg, "max_position_embeddings")
                       : neox_config_has(cfg, "seq_length") ? (int)neox_config_int(cfg, "seq_length") : 0;
    if (d->max_positions <= 0) return neox_fail(err, NEOX_EXIT_USAGE, "max_position_embeddings is not set");

    const char *norm = neox_config_str(cfg, "norm");
    if (strcmp(norm, "rmsnorm") == 0) {
        d->norm = NEOX_NORM_RMSNORM;
        d->norm_eps = (float)neox_config_float(cfg, "rms_norm_epsilon");
    } else if (strcmp(norm, "layernorm") == 0) {
        d->norm = NEOX_NORM_LAYERNORM;
        d->norm_eps = (float)neox_config_float(cfg, "layernorm_epsilon");
        d->norm_bias = neox_config_bool(cfg, "use_bias_in_norms");
    } else {
        return neox_fail(err, NEOX_EXIT_USAGE, "norm '%s' is not supported (layernorm, rmsnorm)", norm);
    }

    const char *pos = neox_config_str(cfg, "pos_emb");
    if (strcmp(pos, "rotary") == 0) d->pos_emb = NEOX_POS_ROTARY;
    else if (strcmp(pos, "learned") == 0) d->pos_emb = NEOX_POS_LEARNED;
    else if (strcmp(pos, "none") == 0) d->pos_emb = NEOX_POS_NONE;
    else return neox_fail(err, NEOX_EXIT_USAGE, "pos_emb '%s' is not supported (rotary, learned, none)", pos);
    if (d->num_heads > 0 && d->pos_emb == NEOX_POS_ROTARY)
        d->rotary_dims = (int)(d->hidden_size / d->num_heads * neox_config_float(cfg, "rotary_pct"));
    d->rotary_base = (double)neox_config_int(cfg, "rotary_emb_base");

    const char *act = neox_config_str(cfg, "activation");
    if (strcmp(act, "swiglu") == 0) d->activation = NEOX_ACT_SWIGLU;
    else if (strcmp(act, "gelu") == 0)
        d->activation = neox_config_bool(cfg, "bias_gelu_fusion") ? NEOX_ACT_GELU_TANH : NEOX_ACT_GELU;
    else return neox_fail(err, NEOX_EXIT_USAGE, "activation '%s' is not supported (gelu, swiglu)", act);
    if (mlp_width(cfg, d->hidden_size, d->activation == NEOX_ACT_SWIGLU, &d->ffn_size, err) != 0) return -1;

    d->parallel_residual = neox_config_bool(cfg, "gpt_j_residual");
    d->attn_bias = neox_config_bool(cfg, "use_bias_in_attn_linear");
    d->mlp_bias = neox_config_bool(cfg, "use_bias_in_mlp");
    d->tied = !neox_config_bool(cfg, "no_weight_tying");
    d->init_std = neox_config_float(cfg, "init_method_std");
    if (parse_init(neox_config_str(cfg, "init_method"), &d->init_method) != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "init_method '%s' is not supported", neox_config_str(cfg, "init_method"));
    if (parse_init(neox_config_str(cfg, "output_layer_init_method"), &d->output_init_method) != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "output_layer_init_method '%s' is not supported",
                         neox_config_str(cfg, "output_layer_init_method"));
    d->hidden_dropout = (float)neox_config_float(cfg, "hidden_dropout");
    d->attention_dropout = (float)neox_config_float(cfg, "attention_dropout");
    d->checkpoint_activations = neox_config_bool(cfg, "checkpoint_activations");
    return neox_model_desc_check(d, err);
}
