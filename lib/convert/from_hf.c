// from_hf.c: a Hugging Face GPTNeoX, Llama, Mistral, Mixtral or Qwen2 ...ForCausalLM folder (config.json and
// model.safetensors, or shards listed by model.safetensors.index.json) as a training checkpoint:
// SAVE/global_step0 in the requested layout, SAVE/latest, SAVE/model.yml (the GPT-NeoX-style config
// of the model and its tokenizer) and SAVE/run.yml (context, batch, `load` and `finetune: true`, the
// part a user changes), with the tokenizer files and their Hugging Face descriptions beside them.
// The YAML is loaded back through the config loader, so the model the trainer will build from it
// is the one whose parameters are written. Memory: one safetensors file at a time.
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "convert_internal.h"
#include "kernels/kernels.h"
#include "safetensors.h"
#include "tokenizer.h"

typedef struct hf_model {
    const char *dir;
    json_t *config;
    int llama;               // Llama's names and layout: Llama, Mistral, Mixtral or Qwen2 (else GPTNeoXForCausalLM)
    const char *class_name;  // the Hugging Face class
    json_t *weight_map;      // name -> file (NULL: everything is in model.safetensors)
} hf_model;

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static json_t *load_json(const char *path, neox_error *err) {
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    if (!j) neox_fail(err, NEOX_EXIT_FAILURE, "%s:%d:%d: %s", path, jerr.line, jerr.column, jerr.text);
    else if (!json_is_object(j)) json_decref(j), j = NULL, neox_fail(err, NEOX_EXIT_FAILURE, "%s: not a JSON object", path);
    return j;
}

// ---- config.json -> GPT-NeoX YAML -------------------------------------------------------------
typedef struct yaml_out {
    char *text;
    size_t size;
    FILE *f;
} yaml_out;

static int get_int(const hf_model *m, const char *key, int64_t fallback, int64_t *out, neox_error *err) {
    json_t *v = json_object_get(m->config, key);
    if (!v || json_is_null(v)) {
        if (fallback < 0) return neox_fail(err, NEOX_EXIT_USAGE, "%s/config.json: '%s' is missing", m->dir, key);
        *out = fallback;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s/config.json: '%s' is not a non-negative integer", m->dir, key);
    if (json_integer_value(v) > INT_MAX)  // every size of a neox.c model is an int
        return neox_fail(err, NEOX_EXIT_USAGE, "%s/config.json: '%s' = %lld is larger than %d", m->dir, key,
                         (long long)json_integer_value(v), INT_MAX);
    *out = json_integer_value(v);
    return 0;
}

// A number in [lo, hi] (the fallback when absent), named by its config.json key when it is not.
static int get_num_in(const hf_model *m, const char *key, double fallback, double lo, double hi, double *out,
                      neox_error *err) {
    json_t *v = json_object_get(m->config, key);
    *out = !v || json_is_null(v) ? fallback : json_number_value(v);
    if (v && !json_is_null(v) && !json_is_number(v))
        return neox_fail(err, NEOX_EXIT_USAGE, "%s/config.json: '%s' is not a number", m->dir, key);
    if (!(*out >= lo && *out <= hi))
        return neox_fail(err, NEOX_EXIT_USAGE, "%s/config.json: '%s' = %g is outside [%g, %g]", m->dir, key, *out, lo, hi);
    return 0;
}

// bos_token_id and eos_token_id (an id or a list of ids, as transformers allows) inside the vocabulary.
static int check_token_ids(const hf_model *m, int64_t vocab, neox_error *err) {
    static const char *const keys[] = {"bos_token_id", "eos_token_id", "pad_token_id"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        json_t *v = json_object_get(m->config, keys[k]), *one;
        size_t i, n = json_is_array(v) ? json_array_size(v) : 1;
        for (i = 0; v && !json_is_null(v) && i < n; i++) {
            one = json_is_array(v) ? json_array_get(v, i) : v;
            if (!json_is_integer(one) || json_integer_value(one) < 0 || json_integer_value(one) >= vocab)
                return neox_fail(err, NEOX_EXIT_USAGE, "%s/config.json: '%s' is not a token id of the vocabulary "
                                 "(vocab_size %lld)", m->dir, keys[k], (long long)vocab);
        }
    }
    return 0;
}

static double get_num(const hf_model *m, const char *key, double fallback) {
    json_t *v = json_object_get(m->config, key);
    return json_is_number(v) ? json_number_value(v) : fallback;
}

static int get_bool(const hf_model *m, const char *key, int fallback) {
    json_t *v = json_object_get(m->config, key);
    return json_is_boolean(v) ? json_is_true(v) : fallback;
}

static const char *get_str(const hf_model *m, const char *key, const char *fallback) {
    const char *s = json_string_value(json_object_get(m->config, key));
    return s ? s : fallback;
}

// A float as YAML 1.1 reads it (an exponent needs a '.' in the mantissa: 1.0e-05, not 1e-05).
static const char *yaml_float(double x, char *buf, size_t size) {
    char tmp[40];
    snprintf(tmp, sizeof tmp, "%.9g", x);
    char *e = strchr(tmp, 'e');
    if (e && !memchr(tmp, '.', (size_t)(e - tmp))) snprintf(buf, size, "%.*s.0%s", (int)(e - tmp), tmp, e);
    else snprintf(buf, size, "%s", tmp);
    return buf;
}

// The largest power of two up to 128 dividing the vocabulary: GPT-NeoX pads the tokenizer's size
// up to a multiple of it, which gives the Hugging Face vocabulary back.
static int64_t vocab_unit(int64_t vocab) {
    int64_t unit = 1;
    while (unit < 128 && vocab % (unit * 2) == 0) unit *= 2;
    return unit;
}

// MistralForCausalLM is Llama's block with attention to the last sliding_window positions (the query
// itself included). A window that covers every position (null, or at least max_position_embeddings)
// is none; a shorter one is GPT-NeoX's sliding_window_width, which keeps one key more than its value.
static int mistral_window(const hf_model *m, int64_t *width, neox_error *err) {
    *width = -1;
    json_t *w = json_object_get(m->config, "sliding_window");
    if (!w || json_is_null(w)) return 0;
    int64_t max_pos = 0;
    if (get_int(m, "max_position_embeddings", 2048, &max_pos, err)) return -1;
    if (!json_is_integer(w) || json_integer_value(w) < 1)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s/config.json: 'sliding_window' is not a positive integer", m->dir);
    if (json_integer_value(w) < max_pos) *width = json_integer_value(w) - 1;
    return 0;
}

// Qwen2ForCausalLM slides its window only with use_sliding_window (on layers from max_window_layers).
static int qwen2_window_check(const hf_model *m, neox_error *err) {
    if (get_bool(m, "use_sliding_window", 0))
        return neox_fail(err, NEOX_EXIT_USAGE, "%s/config.json: use_sliding_window: sliding-window attention is not "
                         "supported", m->dir);
    return 0;
}

static int architecture_of(hf_model *m, neox_error *err) {
    const char *type = get_str(m, "model_type", "");
    json_t *arch = json_array_get(json_object_get(m->config, "architectures"), 0);
    const char *a = json_string_value(arch) ? json_string_value(arch) : "";
    if (strstr(a, "ForSequenceClassification"))
        return neox_fail(err, NEOX_EXIT_USAGE, "%s/config.json: architectures '%s': from-hf imports language models "
                         "(...ForCausalLM), not reward or classification models", m->dir, a);
    // model_type decides (transformers' AutoConfig reads it); architectures only when it is absent.
    static const struct { const char *type, *class_name; int llama; } classes[] = {
        {"gpt_neox", "GPTNeoXForCausalLM", 0}, {"llama", "LlamaForCausalLM", 1}, {"mistral", "MistralForCausalLM", 1},
        {"qwen2", "Qwen2ForCausalLM", 1}, {"mixtral", "MixtralForCausalLM", 1},
    };
    for (size_t i = 0; i < sizeof classes / sizeof *classes; i++)
        if (*type ? !strcmp(type, classes[i].type) : !strcmp(a, classes[i].class_name)) {
            m->llama = classes[i].llama;
            m->class_name = classes[i].class_name;
            return !strcmp(classes[i].type, "qwen2") ? qwen2_window_check(m, err) : 0;
        }
    return neox_fail(err, NEOX_EXIT_USAGE, "%s/config.json: model_type '%s' (architectures '%s') is not "
                     "GPTNeoXForCausalLM, LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM or Qwen2ForCausalLM",
                     m->dir, type, a);
}

// rope_scaling: linear and llama3 carried into the YAML as the same dict; anything else refused.
static int rope_scaling_yaml(const hf_model *m, FILE *f, neox_error *err) {
    json_t *scaling = json_object_get(m->config, "rope_scaling");
    if (!scaling || json_is_null(scaling)) return 0;
    const char *type = json_string_value(json_object_get(scaling, "rope_type"));
    if (!type) type = json_string_value(json_object_get(scaling, "type"));
    if (!type || (strcmp(type, "linear") && strcmp(type, "llama3") && strcmp(type, "default")))
        return neox_fail(err, NEOX_EXIT_USAGE, "%s/config.json: rope_scaling.rope_type '%s' is not supported (default, "
                         "linear, llama3)", m->dir, type ? type : "(none)");
    static const char *const numbers[] = {"factor", "low_freq_factor", "high_freq_factor"};
    fprintf(f, "rope_scaling:\n  rope_type: %s\n", type);
    for (size_t i = 0; i < sizeof numbers / sizeof *numbers && strcmp(type, "default"); i++) {
        json_t *v = json_object_get(scaling, numbers[i]);
        if (i > 0 && !strcmp(type, "linear")) break;
        if (!json_is_number(v))
            return neox_fail(err, NEOX_EXIT_USAGE, "%s/config.json: rope_scaling.%s is not a number", m->dir, numbers[i]);
        char buf[40];
        fprintf(f, "  %s: %s\n", numbers[i], yaml_float(json_number_value(v), buf, sizeof buf));
    }
    if (!strcmp(type, "llama3")) {
        json_t *v = json_object_get(scaling, "original_max_position_embeddings");
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > INT_MAX)
            return neox_fail(err, NEOX_EXIT_USAGE, "%s/config.json: rope_scaling.original_max_position_embeddings is not "
                             "a positive integer", m->dir);
        fprintf(f, "  original_max_position_embeddings: %lld\n", (long long)json_integer_value(v));
    }
    return 0;
}

// MixtralForCausalLM: every layer's MLP is a sparse MoE block, GPT-NeoX's dropless MoE with the topk
// router, renormalised top-k weights and gated experts of width intermediate_size (GPT-NeoX's
// grouped LLaMA MLP takes it as it is). What neox.c cannot compute is refused by its key.
static int mixtral_yaml(const hf_model *m, FILE *f, neox_error *err) {
    int64_t experts = 0, top_k = 0;
    double jitter = 0, aux = 0;
    if (get_int(m, "num_local_experts", 8, &experts, err) || get_int(m, "num_experts_per_tok", 2, &top_k, err) ||
        get_num_in(m, "router_jitter_noise", 0.0, 0, 1, &jitter, err) ||
        get_num_in(m, "router_aux_loss_coef", 0.001, -1e30, 1e30, &aux, err))
        return -1;
    if (experts < 2)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s/config.json: 'num_local_experts' = %lld: a Mixture of Experts "
                         "needs at least 2", m->dir, (long long)experts);
    if (top_k < 1 || top_k > experts)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s/config.json: 'num_experts_per_tok' = %lld is not between 1 and "
                         "num_local_experts %lld", m->dir, (long long)top_k, (long long)experts);
    // Mixtral's jitter multiplies the experts' input too; GPT-NeoX's (moe_jitter_eps) only the router's.
    if (jitter > 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s/config.json: 'router_jitter_noise' = %g: Mixtral's jitter scales "
                         "the experts' input as well as the router's, which neox.c's moe_jitter_eps does not; set "
                         "it to 0", m->dir, jitter);
    if (get_bool(m, "output_router_logits", 0) && aux != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s/config.json: 'output_router_logits' with router_aux_loss_coef %g: "
                         "neox.c's MoE has no load-balancing loss; set output_router_logits to false", m->dir, aux);
    fprintf(f, "moe_num_experts: %lld\nmoe_top_k: %lld\nmoe_router_type: topk\nmoe_topk_renormalize: true\n"
            "moe_expert_interval: 1\n", (long long)experts, (long long)top_k);
    return 0;
}

static int llama_yaml(const hf_model *m, FILE *f, int64_t hidden, int64_t heads, neox_error *err) {
    int64_t kv = 0, ffn = 0, head_dim = 0;
    if (get_int(m, "num_key_value_heads", heads, &kv, err) || get_int(m, "intermediate_size", -1, &ffn, err) ||
        get_int(m, "head_dim", hidden / heads, &head_dim, err))
        return -1;
    const char *act = get_str(m, "hidden_act", "silu");
    neox_activation activation;
    double theta = 0, eps_value = 0;
    if (get_num_in(m, "rope_theta", 10000.0, 1, 1e12, &theta, err) || get_num_in(m, "rms_norm_eps", 1e-6, 0, 1, &eps_value, err))
        return -1;
    if (neox_cvt_activation_of_hf(act, 1, &activation) != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s/config.json: hidden_act '%s' is not supported in a gated MLP (silu, "
                         "gelu, relu, linear, sigmoid)", m->dir, act);
    // Gating with the tanh gelu is Transformer Engine's LayerNormMLP (te_layernorm_mlp), whose
    // constraints (biases, a fixed epsilon, its own width) an import does not pick for the user.
    if (activation == NEOX_ACT_GEGLU_TANH)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s/config.json: hidden_act '%s' in a gated MLP is not imported: "
                         "GPT-NeoX's geglu gates with the exact gelu (the tanh one is te_layernorm_mlp's, docs/model.md)",
                         m->dir, act);
    if (head_dim * heads != hidden)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s/config.json: head_dim %lld x num_attention_heads is not hidden_size",
                         m->dir, (long long)head_dim);
    if (theta != floor(theta))
        return neox_fail(err, NEOX_EXIT_USAGE, "%s/config.json: rope_theta %g is not an integer (rotary_emb_base)", m->dir, theta);
    // GPT-NeoX's gated MLP takes 2/3 of intermediate_size for both halves: 3F gives halves of F.
    // Its gated experts take intermediate_size as it is: a Mixtral's F.
    char eps[40];
    int qwen2 = !strcmp(m->class_name, "Qwen2ForCausalLM"), mixtral = !strcmp(m->class_name, "MixtralForCausalLM");
    fprintf(f, "norm: rmsnorm\nrms_norm_epsilon: %s\nactivation: %s\nintermediate_size: %lld\nmlp_multiple_of: 1\n"
            "num_kv_heads: %lld\nrotary_pct: 1.0\nrotary_emb_base: %.0f\ngpt_j_residual: false\n"
            "use_bias_in_attn_linear: %s\nuse_bias_in_mlp: %s\n",
            yaml_float(eps_value, eps, sizeof eps), neox_activation_name(activation), (long long)(mixtral ? ffn : 3 * ffn),
            (long long)kv, theta,
            qwen2 || get_bool(m, "attention_bias", 0) ? "true" : "false",
            !qwen2 && get_bool(m, "mlp_bias", 0) ? "true" : "false");
    // Qwen2's layout is fixed: q/k/v biases, none on the output projection or the MLP.
    if (qwen2) fprintf(f, "use_bias_in_attn_output: false\n");
    if (mixtral && mixtral_yaml(m, f, err) != 0) return -1;
    int64_t width = -1;
    if ((mixtral || !strcmp(m->class_name, "MistralForCausalLM")) && mistral_window(m, &width, err) != 0) return -1;
    if (width >= 0) fprintf(f, "sliding_window_width: %lld\n", (long long)width);
    return rope_scaling_yaml(m, f, err);
}

static int gpt_neox_yaml(const hf_model *m, FILE *f, int64_t hidden, neox_error *err) {
    int64_t ffn = 0;
    if (get_int(m, "intermediate_size", 4 * hidden, &ffn, err)) return -1;
    const char *act = get_str(m, "hidden_act", "gelu");
    neox_activation activation;
    if (neox_cvt_activation_of_hf(act, 0, &activation) != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s/config.json: hidden_act '%s' is not supported (gelu, gelu_new, "
                         "gelu_pytorch_tanh, gelu_fast, relu, silu, swish, mish)", m->dir, act);
    int tanh_gelu = activation == NEOX_ACT_GELU_TANH;
    double base = 0, eps_value = 0, rotary_pct = 0;
    if (get_num_in(m, "rotary_emb_base", 10000.0, 1, 1e12, &base, err) ||
        get_num_in(m, "layer_norm_eps", 1e-5, 0, 1, &eps_value, err) || get_num_in(m, "rotary_pct", 0.25, 0, 1, &rotary_pct, err))
        return -1;
    if (base != floor(base))
        return neox_fail(err, NEOX_EXIT_USAGE, "%s/config.json: rotary_emb_base %g is not an integer", m->dir, base);
    char eps[40];
    fprintf(f, "norm: layernorm\nlayernorm_epsilon: %s\nuse_bias_in_norms: true\nactivation: %s\n"
            "bias_gelu_fusion: %s\nintermediate_size: %lld\nmlp_multiple_of: 1\nrotary_pct: %.17g\n"
            "rotary_emb_base: %.0f\ngpt_j_residual: %s\nuse_bias_in_attn_linear: %s\nuse_bias_in_mlp: true\n",
            yaml_float(eps_value, eps, sizeof eps), neox_activation_name(activation), tanh_gelu ? "true" : "false", (long long)ffn, rotary_pct, base, get_bool(m, "use_parallel_residual", 1) ? "true" : "false",
            get_bool(m, "attention_bias", 1) ? "true" : "false");
    return rope_scaling_yaml(m, f, err);
}

// The folder's tokenizer: tokenizer.json (HFTokenizer), else vocab.json + merges.txt (GPT-2 BPE);
// type NULL when it has neither.
typedef struct hf_tokenizer {
    const char *type;
    char *file, *merges;  // in the Hugging Face folder
    const char *name, *merges_name;
} hf_tokenizer;

static hf_tokenizer tokenizer_of(const hf_model *m) {
    hf_tokenizer t = {.file = neox_asprintf("%s/tokenizer.json", m->dir)};
    if (file_exists(t.file)) return t.type = "HFTokenizer", t.name = "tokenizer.json", t;
    free(t.file);
    t.file = neox_asprintf("%s/vocab.json", m->dir), t.merges = neox_asprintf("%s/merges.txt", m->dir);
    if (file_exists(t.file) && file_exists(t.merges))
        return t.type = "GPT2BPETokenizer", t.name = "vocab.json", t.merges_name = "merges.txt", t;
    free(t.file), free(t.merges);
    return (hf_tokenizer){0};
}

static void tokenizer_free(hf_tokenizer *t) { free(t->file), free(t->merges); }

// A tokenizer neox.c cannot read is refused here, naming its component, rather than written into a
// model.yml every later tool would fail on.
static int check_tokenizer(const hf_model *m, const hf_tokenizer *t, neox_error *err) {
    if (!t->type) return 0;
    neox_tokenizer_options opts = {.type = t->type, .vocab_file = t->file, .merge_file = t->merges};
    neox_tokenizer *tok = neox_tokenizer_load(&opts, err);
    if (!tok) return neox_fail_context(err, "%s: its tokenizer", m->dir);
    neox_tokenizer_free(tok);
    return 0;
}

// The tokenizer keys: the folder's tokenizer files, copied into the save directory.
static void tokenizer_yaml(const hf_model *m, const hf_tokenizer *t, FILE *f, const char *save_abs) {
    if (!t->type) {
        fprintf(f, "# %s has no tokenizer.json nor vocab.json + merges.txt: set tokenizer_type and vocab_file\n", m->dir);
        return;
    }
    fprintf(f, "tokenizer_type: %s\nvocab_file: \"%s/%s\"\n", t->type, save_abs, t->name);
    if (t->merges_name) fprintf(f, "merge_file: \"%s/%s\"\n", save_abs, t->merges_name);
}

// model.yml: what the checkpoint is (the model and its tokenizer), which a user does not change.
static char *model_yaml(const hf_model *m, const hf_tokenizer *t, const char *save_abs, int64_t *vocab,
                        int64_t *max_pos, neox_error *err) {
    int64_t hidden = 0, layers = 0, heads = 0;
    if (get_int(m, "hidden_size", -1, &hidden, err) || get_int(m, "num_hidden_layers", -1, &layers, err) ||
        get_int(m, "num_attention_heads", -1, &heads, err) || get_int(m, "vocab_size", -1, vocab, err) ||
        get_int(m, "max_position_embeddings", 2048, max_pos, err))
        return NULL;
    if (check_token_ids(m, *vocab, err) != 0) return NULL;
    if (heads == 0 || hidden % heads != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s/config.json: hidden_size is not divisible by num_attention_heads", m->dir), NULL;
    char *text = NULL, std[40];
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    fprintf(f, "# The model imported by neox-convert from-hf from %s (%s) and its tokenizer.\n"
            "# Use it with run.yml beside it, or with a run config of your own (see run.yml).\n",
            m->dir, m->class_name);
    fprintf(f, "num_layers: %lld\nhidden_size: %lld\nnum_attention_heads: %lld\nmax_position_embeddings: %lld\n"
            "pos_emb: rotary\nno_weight_tying: %s\nmake_vocab_size_divisible_by: %lld\ninit_method_std: %s\n",
            (long long)layers, (long long)hidden, (long long)heads, (long long)*max_pos,
            get_bool(m, "tie_word_embeddings", 0) ? "false" : "true", (long long)vocab_unit(*vocab),
            yaml_float(get_num(m, "initializer_range", 0.02), std, sizeof std));
    int rc = m->llama ? llama_yaml(m, f, hidden, heads, err) : gpt_neox_yaml(m, f, hidden, err);
    tokenizer_yaml(m, t, f, save_abs);
    fclose(f);
    if (rc != 0) free(text), text = NULL;
    return text;
}

// run.yml: what a user changes — the context, batch and the checkpoint to start from.
static char *run_yaml(const char *save_abs, int64_t max_pos) {
    return neox_asprintf("# Settings of a run on the model in model.yml: neox-eval and neox-eval generate take\n"
                         "# model.yml + run.yml as they are; to fine-tune, copy this file and add data, optimizer\n"
                         "# and schedule keys (finetune: true starts a fresh run from these parameters).\n"
                         "seq_length: %lld\ntrain_micro_batch_size_per_gpu: 1\nload: \"%s\"\nfinetune: true\n",
                         (long long)(max_pos < 2048 ? max_pos : 2048), save_abs);
}

// ---- the tensors ----------------------------------------------------------------------------------
typedef struct source {
    const hf_model *m;
    char *file;              // the safetensors file open now
    neox_safetensors *st;
    float *data;             // it, converted to fp32 (BF16, F16, or F32 stored unaligned)
    const float *whole;      // it in fp32: data, or the file's bytes when F32 and aligned
} source;

static int open_file_of(source *s, const char *name, neox_error *err) {
    const char *file = "model.safetensors";
    if (s->m->weight_map) {
        file = json_string_value(json_object_get(s->m->weight_map, name));
        if (!file) return neox_fail(err, NEOX_EXIT_FAILURE, "%s/model.safetensors.index.json: no entry for tensor '%s'", s->m->dir, name);
        if (strchr(file, '/')) return neox_fail(err, NEOX_EXIT_FAILURE, "%s/model.safetensors.index.json: file '%s' is "
                                                "outside the folder", s->m->dir, file);
    }
    if (s->file && !strcmp(s->file, file)) return 0;
    neox_safetensors_close(s->st);
    free(s->file);
    s->file = neox_strdup(file);
    char *path = neox_asprintf("%s/%s", s->m->dir, file);
    s->st = neox_safetensors_open(path, err);
    free(path);
    return s->st ? 0 : -1;
}

static int load_tensor(source *s, const neox_cvt_param *p, neox_error *err) {
    if (open_file_of(s, p->name, err) != 0) return -1;
    const neox_st_tensor *t = neox_safetensors_find(s->st, p->name);
    if (!t) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: tensor '%s' is missing", s->st->name, p->name);
    int same = t->ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
    if (!same) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: tensor '%s' has another shape than config.json gives "
                                "(%lldx%lld expected)", s->st->name, p->name, (long long)p->shape[0],
                                (long long)(p->ndim == 2 ? p->shape[1] : 1));
    int64_t n = neox_st_numel(t);
    const unsigned char *src = t->data;
    if (!strcmp(t->dtype, "F32") && (uintptr_t)src % sizeof(float) == 0) {
        s->whole = (const float *)t->data;  // used in place: no copy
        return 0;
    }
    s->data = neox_realloc(s->data, (size_t)(n ? n : 1) * sizeof(float));
    s->whole = s->data;
    if (!strcmp(t->dtype, "F32")) memcpy(s->data, src, (size_t)n * 4);
    else if (!strcmp(t->dtype, "BF16") || !strcmp(t->dtype, "F16")) {
        int bf16 = !strcmp(t->dtype, "BF16");
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            s->data[i] = bf16 ? neox_bf16_to_f32(h) : neox_f16_to_f32(h);
        }
    } else {
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: tensor '%s' is %s (F32, BF16 or F16 expected)", s->st->name,
                         p->name, t->dtype);
    }
    return 0;
}

// Tensors a Hugging Face folder may hold that are not parameters of the model.
static int ignorable(const char *name, int tied) {
    size_t n = strlen(name);
    const char *suffixes[] = {"rotary_emb.inv_freq", ".attention.bias", ".attention.masked_bias"};
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        size_t k = strlen(suffixes[i]);
        if (n >= k && !strcmp(name + n - k, suffixes[i])) return 1;
    }
    return tied && (!strcmp(name, "embed_out.weight") || !strcmp(name, "lm_head.weight"));
}

// Every tensor of the folder (the index's weight map, or the single file, open in st) must be a
// parameter of the model or a known non-parameter buffer.
static int check_no_extra(const hf_model *m, const neox_safetensors *st, const neox_cvt_param *ps, int n, int tied,
                          neox_error *err) {
    json_t *names = json_object();
    if (m->weight_map) json_object_update(names, m->weight_map);
    else
        for (int i = 0; st && i < st->count; i++) json_object_set_new(names, st->tensors[i].name, json_true());
    for (int i = 0; i < n; i++) json_object_del(names, ps[i].name);
    const char *key;
    json_t *v;
    int rc = 0;
    json_object_foreach(names, key, v) {
        if (!ignorable(key, tied)) {
            rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: tensor '%s' is not a parameter of the model config.json describes",
                           m->dir, key);
            break;
        }
    }
    json_decref(names);
    return rc;
}

static char *state_json(const neox_model_desc *d) {
    // A fresh run: the seed is the one the stored config trains with (it sets none: the schema's default).
    neox_run_counters c = {.seed = neox_key_default_int(NEOX_K_seed), .has_rng = 1};
    json_t *s = neox_ckpt_run_state_json(&c, d, json_pack("[s, s]", "config/input/0-model.yml", "config/input/1-run.yml"));
    char *text = json_dumps(s, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(s);
    return text;
}

static int write_checkpoint(const hf_model *m, const char *save, const neox_config *cfg, const neox_model_desc *d,
                            const char *model, const char *run, const neox_cvt_layout *lay, neox_error *err) {
    neox_cvt_out o;
    if (neox_cvt_out_open(&o, save, 0, d, lay, err) != 0) return -1;
    int rc = m->weight_map ? check_no_extra(m, NULL, o.params, o.nparams, d->tied, err) : 0;
    source s = {.m = m};
    neox_progress *bar = neox_progress_start("from-hf", (double)o.flat_total * sizeof(float), "B");
    for (int i = 0; i < o.nparams && rc == 0; i++) {
        rc = load_tensor(&s, &o.params[i], err);
        if (rc == 0) rc = neox_cvt_out_tensor(&o, "params", i, s.whole, err);
        neox_progress_update(bar, o.bytes_written, NULL);
    }
    neox_progress_finish(bar, o.bytes_written, NULL);
    if (rc == 0 && !m->weight_map) rc = check_no_extra(m, s.st, o.params, o.nparams, d->tied, err);
    neox_safetensors_close(s.st);
    free(s.file);
    free(s.data);
    char *state = state_json(d), *effective = NULL;
    size_t size = 0;
    FILE *mem = open_memstream(&effective, &size);
    neox_config_print_as(cfg, "json", mem);
    fclose(mem);
    if (rc == 0) rc = neox_cvt_out_bytes(&o, "state/train.json", state, strlen(state), err);
    if (rc == 0) rc = neox_cvt_out_bytes(&o, "config/effective.json", effective, size, err);
    if (rc == 0) rc = neox_cvt_out_bytes(&o, "config/input/0-model.yml", model, strlen(model), err);
    if (rc == 0) rc = neox_cvt_out_bytes(&o, "config/input/1-run.yml", run, strlen(run), err);
    free(state);
    free(effective);
    if (rc == 0) return neox_cvt_out_finish(&o, save, 0, err);
    neox_cvt_out_abort(&o);
    return -1;
}

// The tokenizer's files and the ones that describe it and the model's generation to transformers
// (special tokens, chat template, stop ids): to-hf carries them back out.
static int copy_tokenizer(const hf_model *m, const char *tmp, neox_error *err) {
    const char *names[] = {"tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json",
                           "special_tokens_map.json", "generation_config.json"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char *src = neox_asprintf("%s/%s", m->dir, names[i]);
        int rc = file_exists(src) ? neox_cvt_copy_file(src, tmp, names[i], err) : 0;
        free(src);
        if (rc != 0) return -1;
    }
    return 0;
}

// The save directory as an absolute path, so that model.yml and run.yml work from any directory.
static char *absolute(const char *path) {
    if (path[0] == '/') return neox_strdup(path);
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) return neox_strdup(path);
    while (path[0] == '.' && path[1] == '/') path += 2;
    return neox_asprintf("%s/%s", cwd, path);
}

static int import_into(hf_model *m, const char *tmp, const char *save_final, const neox_cvt_layout *lay, neox_error *err) {
    int64_t vocab = 0, max_pos = 0;
    hf_tokenizer t = tokenizer_of(m);
    char *save_abs = absolute(save_final), *run = NULL;
    char *model = check_tokenizer(m, &t, err) == 0 ? model_yaml(m, &t, save_abs, &vocab, &max_pos, err) : NULL;
    int rc = model ? 0 : -1;
    if (rc == 0) run = run_yaml(save_abs, max_pos);
    if (rc == 0) rc = neox_cvt_write_text(tmp, "model.yml", model, err);
    if (rc == 0) rc = neox_cvt_write_text(tmp, "run.yml", run, err);
    char *paths[2] = {neox_asprintf("%s/model.yml", tmp), neox_asprintf("%s/run.yml", tmp)};
    neox_config_options opts = {.world_size = 1, .quiet = 1};
    neox_config *cfg = rc == 0 ? neox_config_load((const char *const *)paths, 2, &opts, err) : NULL;
    neox_model_desc d;
    if (!cfg) rc = -1;
    if (rc == 0 && neox_model_desc_from_config(&d, cfg, vocab, err) != 0)
        rc = neox_fail_context(err, "%s/config.json: the model it describes", m->dir);
    if (rc == 0 && (d.naming == NEOX_NAMES_LLAMA) != m->llama)
        rc = neox_fail(err, NEOX_EXIT_USAGE, "%s/config.json: this model's parameters would not carry %s names", m->dir,
                       m->class_name);
    if (rc == 0) rc = copy_tokenizer(m, tmp, err);
    if (rc == 0) rc = write_checkpoint(m, tmp, cfg, &d, model, run, lay, err);
    if (cfg) neox_config_free(cfg);
    free(paths[0]);
    free(paths[1]);
    free(model);
    free(run);
    free(save_abs);
    tokenizer_free(&t);
    return rc;
}

int neox_convert_from_hf(const char *hf_dir, const char *out_save, const neox_cvt_layout *lay, neox_error *err) {
    hf_model m = {.dir = hf_dir};
    char *path = neox_asprintf("%s/config.json", hf_dir);
    m.config = load_json(path, err);
    free(path);
    if (!m.config) return -1;
    int rc = architecture_of(&m, err);
    json_t *index = NULL;
    path = neox_asprintf("%s/model.safetensors.index.json", hf_dir);
    if (rc == 0 && file_exists(path)) {
        index = load_json(path, err);
        m.weight_map = index ? json_object_get(index, "weight_map") : NULL;
        if (!index) rc = -1;
        else if (!json_is_object(m.weight_map)) rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: no weight_map object", path);
    }
    free(path);
    char *tmp = rc == 0 ? neox_cvt_outdir_begin(out_save, err) : NULL;
    if (rc == 0 && !tmp) rc = -1;
    if (rc == 0) rc = import_into(&m, tmp, out_save, lay, err);
    if (rc == 0) rc = neox_cvt_outdir_commit(tmp, out_save, err);
    else neox_cvt_outdir_abort(tmp);
    free(tmp);
    json_decref(index);
    json_decref(m.config);
    return rc;
}
