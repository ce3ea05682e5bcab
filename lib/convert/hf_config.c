// hf_config.c: the Hugging Face side of a model description — config.json and
// generation_config.json for GPTNeoXForCausalLM or the Llama family (Llama, Qwen2, Mistral, Mixtral) from a
// neox.c model (...ForSequenceClassification with one label for a reward model), refusing
// what the class cannot hold (docs/convert.md has the field-by-field mapping).
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert_internal.h"

// The epsilon as the config wrote it (1e-05), not as the float neox.c computes with (9.99999975e-06).
static json_t *epsilon(float eps) {
    char buf[32];
    snprintf(buf, sizeof buf, "%.7g", eps);
    return json_real(strtod(buf, NULL));
}

// Hugging Face's hidden_act names (transformers' ACT2FN) for each activation; the first of an
// activation's names is the one written. GPTNeoXForCausalLM applies hidden_act elementwise,
// LlamaForCausalLM as down(act(gate(x)) * up(x)), which is GPT-NeoX's gating with up_proj as x.
static const struct {
    const char *hf;
    neox_activation act;
} hf_activations[] = {
    {"gelu", NEOX_ACT_GELU},   {"gelu_new", NEOX_ACT_GELU_TANH}, {"gelu_pytorch_tanh", NEOX_ACT_GELU_TANH},
    {"gelu_fast", NEOX_ACT_GELU_TANH}, {"relu", NEOX_ACT_RELU},  {"silu", NEOX_ACT_SILU},
    {"swish", NEOX_ACT_SILU},  {"mish", NEOX_ACT_MISH},          {"silu", NEOX_ACT_SWIGLU},
    {"swish", NEOX_ACT_SWIGLU}, {"gelu", NEOX_ACT_GEGLU},        {"relu", NEOX_ACT_REGLU},
    {"linear", NEOX_ACT_BILINEAR}, {"sigmoid", NEOX_ACT_GLU},   {"gelu_pytorch_tanh", NEOX_ACT_GEGLU_TANH},
};
enum { NUM_HF_ACTIVATIONS = sizeof hf_activations / sizeof hf_activations[0] };

const char *neox_cvt_hf_act_name(neox_activation a) {
    for (int i = 0; i < NUM_HF_ACTIVATIONS; i++)
        if (hf_activations[i].act == a) return hf_activations[i].hf;
    return NULL;
}

int neox_cvt_activation_of_hf(const char *hf, int gated, neox_activation *out) {
    for (int i = 0; i < NUM_HF_ACTIVATIONS; i++)
        if (!strcmp(hf_activations[i].hf, hf) && neox_activation_gated(hf_activations[i].act) == gated)
            return *out = hf_activations[i].act, 0;
    return -1;
}

// GPTNeoXForCausalLM: layernorm with biases, an ungated activation, MLP biases,
// partial rotary, either residual. Anything else was given Llama names by neox_model_desc_check.
static json_t *gpt_neox_config(const neox_model_desc *d) {
    json_t *c = json_object();
    json_object_set_new(c, "architectures",
                        json_pack("[s]", d->value_head ? "GPTNeoXForSequenceClassification" : "GPTNeoXForCausalLM"));
    json_object_set_new(c, "model_type", json_string("gpt_neox"));
    json_object_set_new(c, "hidden_act", json_string(neox_cvt_hf_act_name(d->activation)));
    json_object_set_new(c, "rotary_pct", json_real(d->pos_emb == NEOX_POS_ROTARY ? (double)d->rotary_dims / d->head_size : 0.0));
    json_object_set_new(c, "rotary_emb_base", json_integer((json_int_t)d->rotary_base));
    json_object_set_new(c, "use_parallel_residual", json_boolean(d->parallel_residual));
    json_object_set_new(c, "layer_norm_eps", epsilon(d->norm_eps));
    json_object_set_new(c, "attention_bias", json_boolean(d->attn_bias));
    json_object_set_new(c, "hidden_dropout", json_real(d->hidden_dropout));
    json_object_set_new(c, "attention_dropout", json_real(d->attention_dropout));
    return c;
}

// The Llama-family class of a model with Llama names: MixtralForCausalLM for a Mixture of Experts,
// Qwen2ForCausalLM for q/k/v biases without an output bias (its fixed layout), MistralForCausalLM
// for a sliding window, else LlamaForCausalLM.
static const char *llama_class(const neox_model_desc *d) {
    return d->moe_experts > 1 ? "MixtralForCausalLM" : d->attn_out_unbiased ? "Qwen2ForCausalLM"
           : d->attn_window ? "MistralForCausalLM" : "LlamaForCausalLM";
}

// MixtralForCausalLM computes a MoE on every layer with softmax top-k weights renormalised to sum 1
// and gated experts (w1 gate, w3 up, w2 down); GPT-NeoX's MoE (ungated experts, Sinkhorn or
// unrenormalised weights) has no transformers class. The first field that differs is named.
static int mixtral_refuses(const neox_model_desc *d, neox_error *err) {
    const char *why = !neox_activation_gated(d->activation)
                          ? "activation: ungated experts (GPT-NeoX's w1, w2; Mixtral's experts are gated, w1 w2 w3)"
                      : d->moe_router != NEOX_MOE_TOPK ? "moe_router_type: sinkhorn (Mixtral's router is topk)"
                      : !d->moe_renormalize ? "moe_topk_renormalize: false (GPT-NeoX's top-k weights are not "
                                              "renormalised; Mixtral's sum to 1)"
                      : d->moe_interval != 1 ? "moe_expert_interval above 1 (every Mixtral layer is a MoE)"
                      : d->attn_bias || d->attn_out_unbiased ? "attention biases (Mixtral's attention has none)"
                      : NULL;
    if (why) return neox_fail(err, NEOX_EXIT_USAGE, "moe_num_experts %d: MixtralForCausalLM cannot hold this Mixture "
                              "of Experts: %s", d->moe_experts, why);
    return 0;
}

static int llama_refuses(const neox_model_desc *d, neox_error *err) {
    const char *why = d->norm != NEOX_NORM_RMSNORM ? "layernorm with num_kv_heads or without biases"
                      : !neox_activation_gated(d->activation) ? "an ungated MLP without biases or with num_kv_heads"
                      : d->parallel_residual ? "gpt_j_residual (parallel residual)"
                      : d->pos_emb != NEOX_POS_ROTARY ? "pos_emb other than rotary"
                      : d->rotary_dims != d->head_size ? "rotary_pct below 1"
                      : d->rotary_base != floor(d->rotary_base) ? "a fractional rotary_emb_base"
                      : d->attn_out_unbiased && d->mlp_bias ? "MLP biases with q/k/v biases but no output bias"
                      : d->attn_window && d->attn_out_unbiased ? "sliding_window_width (Qwen2's window is chosen per layer)"
                      : d->attn_window && (d->attn_bias || d->mlp_bias) ? "biases with sliding_window_width" : NULL;
    if (why) return neox_fail(err, NEOX_EXIT_USAGE, "%s cannot hold this model: it has %s", llama_class(d), why);
    return 0;
}

// LlamaForCausalLM, Qwen2ForCausalLM or MistralForCausalLM (llama_class).
static json_t *llama_config(const neox_model_desc *d) {
    json_t *c = json_object();
    const char *cls = llama_class(d);
    int mixtral = d->moe_experts > 1, qwen2 = !mixtral && d->attn_out_unbiased, mistral = !mixtral && !qwen2 && d->attn_window;
    char *arch = neox_strdup(cls);
    if (d->value_head) {  // ...ForCausalLM -> ...ForSequenceClassification
        free(arch);
        arch = neox_asprintf("%.*sForSequenceClassification", (int)(strlen(cls) - strlen("ForCausalLM")), cls);
    }
    json_object_set_new(c, "architectures", json_pack("[s]", arch));
    free(arch);
    json_object_set_new(c, "model_type", json_string(mixtral ? "mixtral" : qwen2 ? "qwen2" : mistral ? "mistral" : "llama"));
    json_object_set_new(c, "hidden_act", json_string(neox_cvt_hf_act_name(d->activation)));
    json_object_set_new(c, "num_key_value_heads", json_integer(d->num_kv_heads));
    json_object_set_new(c, "head_dim", json_integer(d->head_size));
    json_object_set_new(c, "rms_norm_eps", epsilon(d->norm_eps));
    json_object_set_new(c, "rope_theta", json_real(d->rotary_base));
    if (mixtral) {  // moe_jitter_eps, a training choice, is not carried (Mixtral's would scale the experts' input)
        json_object_set_new(c, "num_local_experts", json_integer(d->moe_experts));
        json_object_set_new(c, "num_experts_per_tok", json_integer(d->moe_top_k));
        json_object_set_new(c, "sliding_window", d->attn_window ? json_integer(d->attn_window) : json_null());
        json_object_set_new(c, "router_jitter_noise", json_real(0.0));
        json_object_set_new(c, "output_router_logits", json_false());
        json_object_set_new(c, "router_aux_loss_coef", json_real(0.001));  // transformers' default, unused
    } else if (qwen2) {
        json_object_set_new(c, "use_sliding_window", json_false());
    } else if (mistral) {  // HF's window counts the keys a query sees, itself included
        json_object_set_new(c, "sliding_window", json_integer(d->attn_window));
    } else {
        json_object_set_new(c, "attention_bias", json_boolean(d->attn_bias));
        json_object_set_new(c, "mlp_bias", json_boolean(d->mlp_bias));
    }
    json_object_set_new(c, "attention_dropout", json_real(d->attention_dropout));
    return c;
}

// rope_scaling as transformers writes it (rope_type and the numbers its kind reads).
static json_t *rope_scaling_json(const neox_rope_scaling *s) {
    json_t *j = json_object();
    json_object_set_new(j, "rope_type", json_string(s->kind == NEOX_ROPE_LINEAR ? "linear" : "llama3"));
    json_object_set_new(j, "factor", json_real(s->factor));
    if (s->kind == NEOX_ROPE_LLAMA3) {
        json_object_set_new(j, "low_freq_factor", json_real(s->low_freq_factor));
        json_object_set_new(j, "high_freq_factor", json_real(s->high_freq_factor));
        json_object_set_new(j, "original_max_position_embeddings", json_integer(s->original_max_positions));
    }
    return j;
}

static void set_token_ids(json_t *c, neox_cvt_token_ids ids) {
    if (ids.bos >= 0) json_object_set_new(c, "bos_token_id", json_integer(ids.bos));
    if (ids.eos >= 0) json_object_set_new(c, "eos_token_id", json_integer(ids.eos));
    if (ids.pad >= 0) json_object_set_new(c, "pad_token_id", json_integer(ids.pad));
}

static const char *torch_dtype(const char *dtype) {
    return !strcmp(dtype, "bf16") ? "bfloat16" : !strcmp(dtype, "fp16") ? "float16" : "float32";
}

char *neox_cvt_hf_config_json(const neox_model_desc *d, const char *dtype, neox_cvt_token_ids ids, neox_error *err) {
    if (d->pos_emb == NEOX_POS_LEARNED)
        return neox_fail(err, NEOX_EXIT_USAGE, "pos_emb 'learned': neither GPTNeoXForCausalLM nor LlamaForCausalLM has "
                         "a learned position table"), NULL;
    if (d->pos_emb == NEOX_POS_NONE)
        return neox_fail(err, NEOX_EXIT_USAGE, "pos_emb 'none': GPTNeoXForCausalLM and LlamaForCausalLM always rotate"), NULL;
    if (d->norm == NEOX_NORM_SCALENORM)
        return neox_fail(err, NEOX_EXIT_USAGE, "norm 'scalenorm': GPTNeoXForCausalLM and LlamaForCausalLM have no "
                         "ScaleNorm (one gain per norm; their norms scale each channel)"), NULL;
    if (d->norm == NEOX_NORM_NONPARAMETRIC)
        return neox_fail(err, NEOX_EXIT_USAGE, "norm 'non_parametric_layernorm': GPTNeoXForCausalLM and "
                         "LlamaForCausalLM have no LayerNorm without weights (their norms load a weight per channel)"),
               NULL;
    if (d->pos_emb == NEOX_POS_ALIBI)
        return neox_fail(err, NEOX_EXIT_USAGE, "pos_emb 'alibi': GPTNeoXForCausalLM and LlamaForCausalLM have no "
                         "attention biases (they always rotate)"), NULL;
    if (d->moe_experts > 1 && mixtral_refuses(d, err) != 0) return NULL;
    if (d->moe_experts > 1 && d->value_head)
        return neox_fail(err, NEOX_EXIT_USAGE, "train_impl rm with moe_num_experts: exporting a Mixture-of-Experts "
                         "reward model (MixtralForSequenceClassification) is not supported"), NULL;
    if (d->qk_norm)
        return neox_fail(err, NEOX_EXIT_USAGE, "use_qk_layernorm: no transformers class normalises queries and keys "
                         "with one shared norm (qk_layernorm, heads x head_size)"), NULL;
    if (!neox_cvt_hf_act_name(d->activation))
        return neox_fail(err, NEOX_EXIT_USAGE, "activation %s: transformers has no hidden_act for it",
                         d->activation == NEOX_ACT_GELU_ONNX ? "gelu with onnx_safe (erf_gelu's 1.41421)"
                                                               : neox_activation_name(d->activation)), NULL;
    if (d->naming == NEOX_NAMES_GPT_NEOX && d->attn_window)
        return neox_fail(err, NEOX_EXIT_USAGE, "sliding_window_width: GPTNeoXForCausalLM attends to every earlier "
                         "position (a Llama-shaped model exports as MistralForCausalLM)"), NULL;
    if (d->naming == NEOX_NAMES_GPT_NEOX && d->attn_out_unbiased)
        return neox_fail(err, NEOX_EXIT_USAGE, "use_bias_in_attn_output: false: GPTNeoXForCausalLM's attention_bias "
                         "covers both the query_key_value and dense biases"), NULL;
    json_t *c;
    if (d->naming == NEOX_NAMES_GPT_NEOX) c = gpt_neox_config(d);
    else if (llama_refuses(d, err) != 0) return NULL;
    else c = llama_config(d);
    if (d->rope_scaling.kind != NEOX_ROPE_DEFAULT) json_object_set_new(c, "rope_scaling", rope_scaling_json(&d->rope_scaling));
    json_object_set_new(c, "vocab_size", json_integer(d->vocab_size));
    json_object_set_new(c, "hidden_size", json_integer(d->hidden_size));
    json_object_set_new(c, "num_hidden_layers", json_integer(d->num_layers));
    json_object_set_new(c, "num_attention_heads", json_integer(d->num_heads));
    json_object_set_new(c, "intermediate_size", json_integer(d->moe_experts > 1 ? d->moe_ffn_size : d->ffn_size));
    json_object_set_new(c, "max_position_embeddings", json_integer(d->max_positions));
    json_object_set_new(c, "tie_word_embeddings", json_boolean(d->tied));
    if (d->value_head) {  // one label: the reward, as transformers writes num_labels 1
        json_object_set_new(c, "id2label", json_pack("{s:s}", "0", "LABEL_0"));
        json_object_set_new(c, "label2id", json_pack("{s:i}", "LABEL_0", 0));
    }
    json_object_set_new(c, "initializer_range", json_real(d->init_std));
    json_object_set_new(c, "use_cache", json_true());
    json_object_set_new(c, "torch_dtype", json_string(torch_dtype(dtype)));
    set_token_ids(c, ids);
    char *text = json_dumps(c, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    json_decref(c);
    return text;
}

char *neox_cvt_generation_config_json(neox_cvt_token_ids ids) {
    json_t *c = json_object();
    set_token_ids(c, ids);
    json_object_set_new(c, "_from_model_config", json_true());
    char *text = json_dumps(c, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(c);
    return text;
}
