// neox_source.c: a GPT-NeoX (DeepSpeed) checkpoint directory as from-neox reads it: its files found
// by DeepSpeed's names (`mp_rank_YY_model_states.pt`, `layer_XX-model_YY-model_states.pt`,
// `zero_pp_rank_D_mp_rank_YY_optim_states.pt`), the tensor-parallel and data-parallel sizes they
// were written with, and GPT-NeoX's parameter names mapped to neox.c's (Hugging Face's) names.
// GPT-NeoX's PipelineModule numbers its layers: 0 the embedding, 1 a function without parameters,
// 2 .. L+1 the transformer layers, L+2 another function, L+3 the final norm, L+4 the output layer.
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "neox_source.h"

static int file_exists(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    return f != NULL;
}

// The checkpoint directory: DIR itself when it holds mp_rank_00_model_states.pt, else DIR/<latest>.
static char *resolve_dir(const char *dir, neox_error *err) {
    char *probe = neox_asprintf("%s/mp_rank_00_model_states.pt", dir);
    int here = file_exists(probe);
    free(probe);
    if (here) return neox_strdup(dir);
    char *latest_path = neox_asprintf("%s/latest", dir);
    size_t size;
    char *tag = neox_read_file(latest_path, &size, NULL);
    free(latest_path);
    if (!tag)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: neither a GPT-NeoX checkpoint (no mp_rank_00_model_states.pt) "
                         "nor a save directory (no latest)", dir), NULL;
    tag[strcspn(tag, "\r\n")] = 0;
    char *out = neox_asprintf("%s/%s", dir, tag);
    free(tag);
    return out;
}

// Counts DeepSpeed's files: the tensor-parallel size (mp_rank_YY; in a pipeline run, the model_YY of
// the layer files, the mp_rank_YY files then being DeepSpeed's ranks in its pipe x model group,
// stage x tp + YY), the data-parallel size (zero_pp_rank_D), whether the model is in per-layer
// files, and the highest layer index.
static int scan_files(neox_source *s, neox_error *err) {
    DIR *d = opendir(s->dir);
    if (!d) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot open the directory", s->dir);
    struct dirent *e;
    int max_mp = -1, max_dp = -1, max_layer_mp = -1;
    while ((e = readdir(d))) {
        int a, b;
        char tail[64];
        if (sscanf(e->d_name, "mp_rank_%d_model_state%63s", &a, tail) == 2 && a > max_mp) max_mp = a;
        if (sscanf(e->d_name, "zero_pp_rank_%d_mp_rank_%d_optim_state%63s", &a, &b, tail) == 3 && a > max_dp) max_dp = a;
        if (sscanf(e->d_name, "layer_%d-model_%d-model_state%63s", &a, &b, tail) == 3) {
            s->layered = 1;
            if (a > s->max_layer) s->max_layer = a;
            if (b > max_layer_mp) max_layer_mp = b;
        }
        if (sscanf(e->d_name, "bf16_zero_pp_rank_%d", &a) == 1 || sscanf(e->d_name, "zero3_%d", &a) == 1)
            s->bf16_optimizer = 1;
    }
    closedir(d);
    if (max_mp < 0) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: no mp_rank_00_model_states.pt", s->dir);
    s->tp = s->layered ? max_layer_mp + 1 : max_mp + 1;
    s->pp = (max_mp + 1) / s->tp;
    s->dp = max_dp + 1;
    if (s->pp * s->tp != max_mp + 1)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: %d mp_rank_YY files for %d tensor-parallel ranks (model_YY of the "
                         "layer files): not a whole number of pipeline stages", s->dir, max_mp + 1, s->tp);
    return 0;
}

int neox_source_open(neox_source *s, const char *path, neox_error *err) {
    memset(s, 0, sizeof *s);
    s->max_layer = -1;
    s->dir = resolve_dir(path, err);
    if (!s->dir || scan_files(s, err) != 0) return -1;
    s->model_files = neox_calloc((size_t)(s->tp * s->pp), sizeof *s->model_files);
    for (int r = 0; r < s->tp * s->pp; r++) {
        char *p = neox_asprintf("%s/mp_rank_%02d_model_states.pt", s->dir, r);
        s->model_files[r] = neox_pt_open(p, err);
        free(p);
        if (!s->model_files[r]) return -1;
    }
    return 0;
}

void neox_source_close(neox_source *s) {
    for (int r = 0; s->model_files && r < s->tp * s->pp; r++) neox_pt_close(s->model_files[r]);
    free(s->model_files);
    free(s->dir);
    memset(s, 0, sizeof *s);
}

neox_pt_file *neox_source_layer_file(const neox_source *s, int layer, int tp_rank, neox_error *err) {
    char *p = neox_asprintf("%s/layer_%02d-model_%02d-model_states.pt", s->dir, layer, tp_rank);
    neox_pt_file *f = file_exists(p) ? neox_pt_open(p, err) : NULL;  // (NULL and err set: unreadable)
    free(p);
    return f;
}

neox_pt_file *neox_source_optim_file(const neox_source *s, int dp_rank, int stage, int tp_rank, neox_error *err) {
    char *p = neox_asprintf("%s/zero_pp_rank_%d_mp_rank_%02d_optim_states.pt", s->dir, dp_rank, stage * s->tp + tp_rank);
    neox_pt_file *f = neox_pt_open(p, err);
    free(p);
    return f;
}

static const char *const layer_parts[] = {
    "input_layernorm.weight", "input_layernorm.bias", "post_attention_layernorm.weight", "post_attention_layernorm.bias",
    "attention.query_key_value.weight", "attention.query_key_value.bias", "attention.dense.weight",
    "attention.dense.bias", "mlp.dense_h_to_4h.weight", "mlp.dense_h_to_4h.bias", "mlp.dense_4h_to_h.weight",
    "mlp.dense_4h_to_h.bias",
};

// A Llama-style model's layer: GPT-NeoX's module names (after the renames above) -> Hugging Face's.
// The fused QKV goes to q_proj (from-neox splits it into q_proj, k_proj and v_proj), the gated MLP's
// linear1 to up_proj (its halves: up_proj, then gate_proj).
static const char *const llama_layer_parts[][2] = {
    {"input_layernorm.weight", "input_layernorm.weight"},
    {"input_layernorm.bias", "input_layernorm.bias"},
    {"post_attention_layernorm.weight", "post_attention_layernorm.weight"},
    {"post_attention_layernorm.bias", "post_attention_layernorm.bias"},
    {"attention.query_key_value.weight", "self_attn.q_proj.weight"},
    {"attention.query_key_value.bias", "self_attn.q_proj.bias"},
    {"attention.dense.weight", "self_attn.o_proj.weight"},
    {"attention.dense.bias", "self_attn.o_proj.bias"},
    {"mlp.dense_h_to_4h.weight", "mlp.up_proj.weight"},
    {"mlp.dense_h_to_4h.bias", "mlp.up_proj.bias"},
    {"mlp.dense_4h_to_h.weight", "mlp.down_proj.weight"},
    {"mlp.dense_4h_to_h.bias", "mlp.down_proj.bias"},
};

// GPT-NeoX's renamed parts: the MLP's linear1/linear2 (its TransformerEngine release, December 2024;
// before it dense_h_to_4h/dense_4h_to_h) and RMSNorm's `scale` (LayerNorm's `weight`), each checked
// against the configs' norm; NULL + err when the files' norm is another.
static const char *canonical_part(const neox_model_desc *d, const char *part, char *buf, size_t size, neox_error *err) {
    if (!strncmp(part, "mlp.linear1.", 12) || !strncmp(part, "mlp.linear2.", 12)) {
        snprintf(buf, size, "mlp.%s.%s", part[10] == '1' ? "dense_h_to_4h" : "dense_4h_to_h", part + 12);
        return buf;
    }
    size_t n = strlen(part);
    int rms = d->norm == NEOX_NORM_RMSNORM, norm = strstr(part, "norm.") != NULL;
    int scale = norm && n >= 6 && strcmp(part + n - 6, ".scale") == 0;
    int weight = norm && n >= 7 && strcmp(part + n - 7, ".weight") == 0;
    if ((scale && !rms) || (weight && rms))
        return neox_fail(err, NEOX_EXIT_USAGE, "GPT-NeoX parameter '%s': %s, but the configs say norm: %s", part,
                         scale ? "RMSNorm's scale" : "a LayerNorm's weight", rms ? "rmsnorm" : "not rmsnorm"), NULL;
    if (!scale) return part;
    snprintf(buf, size, "%.*s.weight", (int)(n - 6), part);
    return buf;
}

static int layer_name(int l, const char *part, int llama, char *out, size_t size) {
    for (size_t i = 0; !llama && i < sizeof layer_parts / sizeof layer_parts[0]; i++)
        if (strcmp(part, layer_parts[i]) == 0) return snprintf(out, size, "gpt_neox.layers.%d.%s", l, part), 1;
    for (size_t i = 0; llama && i < sizeof llama_layer_parts / sizeof llama_layer_parts[0]; i++)
        if (strcmp(part, llama_layer_parts[i][0]) == 0)
            return snprintf(out, size, "model.layers.%d.%s", l, llama_layer_parts[i][1]), 1;
    return 0;
}

// GPT-NeoX's name of a parameter in PipelineModule layer `layer` -> neox.c's; NEOX_SRC_SKIP for
// buffers and tied copies; -1 + err for a parameter neox.c has no place for in the model d (its
// Llama-style names, model.*, self_attn.*, lm_head, when it is not GPT-NeoX-style).
int neox_source_hf_name(const neox_model_desc *d, int layer, const char *part, char *out, size_t size, neox_error *err) {
    if (strstr(part, "rotary_emb.inv_freq")) return NEOX_SRC_SKIP;  // a buffer neox.c computes
    int llama = d->naming != NEOX_NAMES_GPT_NEOX, num_layers = d->num_layers, tied = d->tied;
    char renamed[96];
    part = canonical_part(d, part, renamed, sizeof renamed, err);
    if (!part) return -1;
    if (layer == 0 && strcmp(part, "word_embeddings.weight") == 0)
        return snprintf(out, size, llama ? "model.embed_tokens.weight" : "gpt_neox.embed_in.weight"), 0;
    if (layer >= 2 && layer < num_layers + 2 && layer_name(layer - 2, part, llama, out, size)) return 0;
    if (layer == num_layers + 3 && (strcmp(part, "norm.weight") == 0 || strcmp(part, "norm.bias") == 0))
        return snprintf(out, size, "%s.%s", llama ? "model.norm" : "gpt_neox.final_layer_norm", part + 5), 0;
    if (layer == num_layers + 4 && strcmp(part, "final_linear.weight") == 0 && !tied)
        return snprintf(out, size, llama ? "lm_head.weight" : "embed_out.weight"), 0;
    if (layer == num_layers + 4 && strcmp(part, "word_embeddings.weight") == 0 && tied) return NEOX_SRC_SKIP;
    if (!strncmp(part, "mlp.w1.", 7) || !strncmp(part, "mlp.w2.", 7) || !strncmp(part, "mlp.w3.", 7))
        return neox_fail(err, NEOX_EXIT_USAGE, "GPT-NeoX parameter '%s' of layer %d: the LLaMAParallelMLP of GPT-NeoX "
                         "before September 2024 (w1, w2, w3) is not read; from-neox reads its ParallelMLP's linear1 "
                         "and linear2", part, layer);
    return neox_fail(err, NEOX_EXIT_USAGE,
                     "GPT-NeoX parameter '%s' of layer %d: neox.c has no such parameter in a %s model of %d "
                     "layers (%s embeddings)", part, layer, llama ? "Llama-style" : "GPT-NeoX-style", num_layers,
                     tied ? "tied" : "untied");
}

// What a Llama-style model (neox.c's names for norm: rmsnorm, a gated MLP, no biases) may hold to be
// read from or written to GPT-NeoX's names (from-neox, to-neox) at tp tensor-parallel ranks: GPT-NeoX
// cuts grouped-query attention's key/value heads over the ranks without copying them (its
// ParallelSelfAttention divides num_kv_heads by the model-parallel size); a query/key norm and experts
// have no Llama-style GPT-NeoX names here.
int neox_source_check_llama(const neox_model_desc *d, int tp, neox_error *err) {
    if (tp > 0 && d->num_kv_heads % tp != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "num_kv_heads: %d key/value heads over %d tensor-parallel ranks; GPT-NeoX "
                         "gives every rank whole key/value heads of its own", d->num_kv_heads, tp);
    if (d->qk_norm)
        return neox_fail(err, NEOX_EXIT_USAGE, "use_qk_layernorm: a Llama-style model's query/key norm has no GPT-NeoX name here");
    if (d->moe_experts > 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "moe_num_experts: a Llama-style model's experts have no GPT-NeoX names here");
    return 0;
}

// GPT-NeoX's fused QKV on one tensor-parallel rank is `blocks` row blocks, each [q k v]: with one
// key/value head per query head its heads interleaved ([q k v] of each head, as Hugging Face's
// GPT-NeoX), with grouped-query attention (num_kv_heads below the heads) one block, [q | k | v] of
// the rank's heads (ParallelSelfAttention's gqa_project splits the rank's output into the query
// heads, then the key heads, then the value heads).
int neox_source_qkv_blocks(const neox_model_desc *d, int tp) {
    return d->num_kv_heads != d->num_heads ? 1 : d->num_heads / tp;
}

// "sequential.5.attention.dense.weight", "module.5...." or "5...." -> layer 5, part "attention.dense.weight".
int neox_source_split_name(const char *name, int *layer, const char **part) {
    if (strncmp(name, "module.", 7) == 0) name += 7;
    if (strncmp(name, "sequential.", 11) == 0) name += 11;
    char *end;
    long l = strtol(name, &end, 10);
    if (end == name || *end != '.' || l < 0 || l > 1 << 20) return -1;
    *layer = (int)l;
    *part = end + 1;
    return 0;
}

// The dimension Megatron cuts a parameter along over tensor-parallel ranks (-1: replicated).
int neox_source_tp_dim(const char *hf_name) {
    static const char *const rows[] = {"embed_in.weight", "embed_out.weight", "query_key_value.weight",
                                       "query_key_value.bias", "dense_h_to_4h.weight", "dense_h_to_4h.bias",
                                       "embed_tokens.weight", "lm_head.weight", "q_proj.weight", "q_proj.bias",
                                       "k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias",
                                       "up_proj.weight", "up_proj.bias", "gate_proj.weight", "gate_proj.bias"};
    static const char *const cols[] = {"attention.dense.weight", "dense_4h_to_h.weight", "o_proj.weight",
                                       "down_proj.weight"};
    size_t n = strlen(hf_name);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        if (n >= strlen(rows[i]) && strcmp(hf_name + n - strlen(rows[i]), rows[i]) == 0) return 0;
    for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++)
        if (n >= strlen(cols[i]) && strcmp(hf_name + n - strlen(cols[i]), cols[i]) == 0) return 1;
    return -1;
}
