// to_neox.c: `neox-convert to-neox`: a neox.c checkpoint of a GPT-NeoX-style or Llama-style model (the
// latter under GPT-NeoX's llama names: RMSNorm's scale, the fused QKV per head, linear1 = [up | gate]
// per shard) as the DeepSpeed checkpoint GPT-NeoX writes, for a chosen tensor-parallel size and ZeRO-1/2 data-parallel size:
// `global_stepN/mp_rank_YY_model_states.pt` (the module's fp32 state dict under GPT-NeoX's
// sequential names, the iteration, AnnealingLR's state), `zero_pp_rank_D_mp_rank_YY_optim_states.pt`
// (ZeRO's fp32 partitions and Adam's moments over GPT-NeoX's two weight-decay groups, partitioned
// and padded as DeepSpeed's stage 1/2 optimizer does, with param_slice_mappings), and `latest`; with
// --pp, per-layer files and per-stage optimizers (a tied embedding as GPT-NeoX's TiedLayerSpec). Every
// file loads with torch.load(weights_only=True): DeepSpeed's own objects (the loss scaler, the
// fragment addresses, the ZeRO stage enum) are written as the plain dicts and numbers they hold.
// See docs/convert.md, "Back to GPT-NeoX".
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "config.h"
#include "convert_internal.h"
#include "neox_source.h"
#include "optim.h"
#include "torch_pt.h"

// The parts of a transformer layer in the order GPT-NeoX's ParallelTransformerLayer registers them
// (its parameters' order, which ZeRO's flat groups follow), the MLP under GPT-NeoX's names until
// September 2024 (dense_h_to_4h) or since (linear1).
static const char *const layer_order[2][12] = {
    {"input_layernorm.weight", "input_layernorm.bias", "attention.query_key_value.weight",
     "attention.query_key_value.bias", "attention.dense.weight", "attention.dense.bias",
     "post_attention_layernorm.weight", "post_attention_layernorm.bias", "mlp.dense_h_to_4h.weight",
     "mlp.dense_h_to_4h.bias", "mlp.dense_4h_to_h.weight", "mlp.dense_4h_to_h.bias"},
    {"input_layernorm.weight", "input_layernorm.bias", "attention.query_key_value.weight",
     "attention.query_key_value.bias", "attention.dense.weight", "attention.dense.bias",
     "post_attention_layernorm.weight", "post_attention_layernorm.bias", "mlp.linear1.weight",
     "mlp.linear1.bias", "mlp.linear2.weight", "mlp.linear2.bias"},
};

// The same for a Llama-style model, under GPT-NeoX's names now (the MLP's linear1/linear2); RMSNorm's
// one parameter is `scale`, LayerNorm's `weight` and `bias` (rms: which of the two norms).
static const char *const llama_layer_order[2][10] = {
    {"input_layernorm.weight", "input_layernorm.bias", "attention.query_key_value.weight",
     "attention.query_key_value.bias", "attention.dense.weight", "attention.dense.bias", "post_attention_layernorm.weight",
     "post_attention_layernorm.bias", "mlp.linear1.weight", "mlp.linear1.bias"},
    {"input_layernorm.scale", "attention.query_key_value.weight", "attention.query_key_value.bias",
     "attention.dense.weight", "attention.dense.bias", "post_attention_layernorm.scale", "mlp.linear1.weight",
     "mlp.linear1.bias", NULL, NULL},
};
static const char *const llama_layer_tail[] = {"mlp.linear2.weight", "mlp.linear2.bias"};

typedef struct {
    char neox[128];    // GPT-NeoX's name: sequential.N.PART, or N.PART in a PipelineModule
    const char *part;  // PART (a static string)
    int layer;         // N, GPT-NeoX's layer number
    int param;         // index in the neox.c parameter list of its first parameter
    int count;         // the neox.c parameters it holds: 3 (a Llama-style QKV), 2 (linear1's up, gate) or 1
    int blocks;        // per tensor-parallel shard, the row blocks its parameters interleave in (QKV: heads, or 1)
    int decay;         // in the weight-decay group (not a bias or a norm)
    int tied;          // a pipeline's tied embedding (TiedLayerSpec "embed": in both end stages' optimizers)
} neox_param_ref;

typedef struct {
    neox_cvt_ckpt c;
    neox_cvt_param *params;
    int nparams;
    neox_param_ref *refs;  // GPT-NeoX's parameter order
    int nrefs, nref_params;  // (nref_params: the neox.c parameters they hold)
    int tp, dp, zero;
    int pp;                 // pipeline stages (0: no pipeline, the module in mp_rank_YY_model_states.pt)
    int stage_start[65];    // stage s holds GPT-NeoX layers [stage_start[s], stage_start[s + 1])
    int dynamic_scaler;     // an fp16 run's dynamic loss scaler: its settings (the config's) and state
    neox_loss_scaler scaler;
    int linear_names;       // the MLP as mlp.linear1/linear2 (else dense_h_to_4h/dense_4h_to_h)
    int inv_freq;           // write each layer's attention.rotary_emb.inv_freq buffer
} exporter;

// Whether stage s holds ref (every stage without a pipeline). The tied embedding is in the first
// stage's layers and, as GPT-NeoX's output layer, in the last stage's optimizer too.
static int in_stage(const exporter *e, int s, const neox_param_ref *ref) {
    if (e->pp == 0 || (ref->tied && s == e->pp - 1)) return 1;
    return ref->layer >= e->stage_start[s] && ref->layer < e->stage_start[s + 1];
}

static int find_param(const exporter *e, const char *hf) {
    for (int i = 0; i < e->nparams; i++)
        if (strcmp(e->params[i].name, hf) == 0) return i;
    return -1;
}

static int add_ref(exporter *e, int layer, const char *part, neox_error *err) {
    const neox_model_desc *d = &e->c.desc;
    int llama = d->naming != NEOX_NAMES_GPT_NEOX;
    char hf[128];
    int rc = neox_source_hf_name(d, layer, part, hf, sizeof hf, err);
    if (rc != 0) return rc == NEOX_SRC_SKIP ? 0 : -1;
    int i = find_param(e, hf);
    if (i < 0) return 0;  // a part this model does not have (biases it was configured without)
    neox_param_ref *r = &e->refs[e->nrefs++];
    // (a pipeline's tied embedding is named in the optimizers by its TiedLayerSpec, which DeepSpeed's
    // PipelineModule registers before its layers: tied_modules.embed.PART)
    r->tied = e->pp && d->tied && layer == 0;
    if (r->tied) snprintf(r->neox, sizeof r->neox, "tied_modules.embed.%s", part);
    else snprintf(r->neox, sizeof r->neox, e->pp ? "%d.%s" : "sequential.%d.%s", layer, part);
    r->part = part;
    r->layer = layer;
    r->param = i;
    r->count = 1, r->blocks = 1;
    if (llama && strstr(part, "query_key_value.")) r->count = 3, r->blocks = neox_source_qkv_blocks(d, e->tp);
    if (llama && strstr(part, "linear1.") && neox_activation_gated(d->activation)) r->count = 2;
    r->decay = !strstr(part, "bias") && !strstr(part, "norm");
    e->nref_params += r->count;
    return 0;
}

// A Llama-style model's layers in GPT-NeoX's order (norms by their GPT-NeoX names: RMSNorm's scale).
static int plan_llama_layers(exporter *e, neox_error *err) {
    const neox_model_desc *d = &e->c.desc;
    if (neox_source_check_llama(d, e->tp, err) != 0) return neox_fail_context(err, "%s", e->c.dir);
    if (d->norm != NEOX_NORM_RMSNORM && d->norm != NEOX_NORM_LAYERNORM)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s: a Llama-style model's norm is written as GPT-NeoX's RMSNorm (scale) "
                         "or LayerNorm (weight, bias), not this one", e->c.dir);
    int rms = d->norm == NEOX_NORM_RMSNORM, rc = 0;
    for (int l = 0; l < d->num_layers && rc == 0; l++) {
        for (int k = 0; k < 10 && llama_layer_order[rms][k] && rc == 0; k++)
            rc = add_ref(e, l + 2, llama_layer_order[rms][k], err);
        for (int k = 0; k < 2 && rc == 0; k++) rc = add_ref(e, l + 2, llama_layer_tail[k], err);
    }
    return rc;
}

// GPT-NeoX's parameter list; every neox.c parameter must have a place in it.
static int plan_names(exporter *e, neox_error *err) {
    const neox_model_desc *d = &e->c.desc;
    int llama = d->naming != NEOX_NAMES_GPT_NEOX, rms = llama && d->norm == NEOX_NORM_RMSNORM;
    e->refs = neox_calloc((size_t)e->nparams + 1, sizeof *e->refs);
    int L = d->num_layers, rc = add_ref(e, 0, "word_embeddings.weight", err);
    if (llama && rc == 0) rc = plan_llama_layers(e, err);
    for (int l = 0; l < L && rc == 0 && !llama; l++)
        for (size_t k = 0; k < sizeof layer_order[0] / sizeof layer_order[0][0] && rc == 0; k++)
            rc = add_ref(e, l + 2, layer_order[e->linear_names][k], err);
    if (rc == 0) rc = add_ref(e, L + 3, rms ? "norm.scale" : "norm.weight", err);
    if (rc == 0 && !rms) rc = add_ref(e, L + 3, "norm.bias", err);
    if (rc == 0 && !d->tied) rc = add_ref(e, L + 4, "final_linear.weight", err);
    if (rc == 0 && e->nref_params != e->nparams)
        rc = neox_fail(err, NEOX_EXIT_USAGE, "%s: %d of the model's %d parameters have GPT-NeoX names (a feature "
                       "GPT-NeoX's checkpoints cannot hold)", e->c.dir, e->nref_params, e->nparams);
    return rc;
}

// Tensor-parallel rank r's shard of parameter i of group ("params", "optimizer/exp_avg", ...), fp32.
static float *read_shard(const exporter *e, const char *group, int i, int r, int64_t shape[2], neox_error *err) {
    const neox_cvt_param *p = &e->params[i];
    char name[160];
    snprintf(name, sizeof name, "%s/%s", group, p->name);
    int dim = neox_source_tp_dim(p->name);
    int64_t offset[2] = {0, 0}, count[2] = {p->shape[0], p->ndim == 2 ? p->shape[1] : 1};
    shape[0] = count[0], shape[1] = count[1];
    if (dim >= 0 && e->tp > 1) {
        shape[dim] = count[dim] / e->tp;
        offset[dim] = shape[dim] * r;
        count[dim] = shape[dim];
    }
    float *buf = neox_malloc((size_t)(count[0] * count[1]) * sizeof *buf + 4);
    int rc = p->ndim == 2 ? neox_ckpt_read_block(e->c.reader, name, offset, count, buf, err)
                          : neox_ckpt_read_range(e->c.reader, name, offset[0], count[0], buf, err);
    if (rc != 0) return free(buf), NULL;
    return buf;
}

// GPT-NeoX's tensor `ref` on tensor-parallel rank r: its parameters' shards, a Llama-style fused one
// as row blocks each holding a slice of every part (QKV: [q k v] of each local head, or under
// grouped-query attention one block [q | k | v] of the shard; linear1: [up | gate] of the shard).
static float *read_ref(const exporter *e, const char *group, const neox_param_ref *ref, int r, int64_t shape[2],
                       neox_error *err) {
    if (ref->count == 1) return read_shard(e, group, ref->param, r, shape, err);
    float *parts[3] = {NULL, NULL, NULL}, *out = NULL;
    int64_t part_rows[3] = {0, 0, 0}, part_shape[2] = {0, 0};
    shape[0] = 0;
    for (int k = 0; k < ref->count; k++) {
        if (!(parts[k] = read_shard(e, group, ref->param + k, r, part_shape, err))) goto done;
        part_rows[k] = part_shape[0] / ref->blocks;
        shape[0] += part_shape[0];
    }
    int64_t cols = part_shape[1];
    shape[1] = cols;
    out = neox_malloc((size_t)(shape[0] * cols) * sizeof *out + 4);
    float *dst = out;
    for (int64_t b = 0; b < ref->blocks; b++)
        for (int k = 0; k < ref->count; k++) {
            memcpy(dst, parts[k] + b * part_rows[k] * cols, (size_t)(part_rows[k] * cols) * sizeof *out);
            dst += part_rows[k] * cols;
        }
done:
    for (int k = 0; k < 3; k++) free(parts[k]);
    return out;
}

// The elements of GPT-NeoX's tensor `ref` on one tensor-parallel rank.
static int64_t ref_shard_numel(const exporter *e, const neox_param_ref *ref) {
    int64_t n = 0;
    for (int k = 0; k < ref->count; k++) {
        const neox_cvt_param *p = &e->params[ref->param + k];
        int64_t shape[2] = {p->shape[0], p->ndim == 2 ? p->shape[1] : 1};
        int dim = neox_source_tp_dim(p->name);
        if (dim >= 0) shape[dim] /= e->tp;
        n += shape[0] * shape[1];
    }
    return n;
}

static neox_pt_value *tensor_of(neox_pt_writer *w, const exporter *e, int i, const float *data, const int64_t shape[2]) {
    return neox_pt_new_tensor(w, NEOX_PT_F32, e->params[i].ndim, shape, data);
}

static json_t *state_field(const exporter *e, const char *section, const char *key) {
    json_t *s = section ? json_object_get((json_t *)e->c.state, section) : (json_t *)e->c.state;
    return json_object_get(s, key);
}

static neox_pt_value *lr_scheduler(neox_pt_writer *w, const exporter *e) {
    neox_pt_value *lr = neox_pt_new(w, NEOX_PT_DICT);
    neox_pt_set(w, lr, "start_lr", neox_pt_new_float(w, json_number_value(state_field(e, "lr_schedule", "lr"))));
    // (GPT-NeoX's warmup_iter is warmup x the decay iterations: a float)
    neox_pt_set(w, lr, "warmup_iter", neox_pt_new_float(w, json_number_value(state_field(e, "lr_schedule", "warmup_iters"))));
    neox_pt_set(w, lr, "num_iters", neox_pt_new_int(w, json_integer_value(state_field(e, "lr_schedule", "num_iters"))));
    const char *style = json_string_value(state_field(e, "lr_schedule", "style"));
    neox_pt_set(w, lr, "decay_style", neox_pt_new_str(w, style ? style : "constant"));
    neox_pt_set(w, lr, "end_iter", neox_pt_new_int(w, json_integer_value(state_field(e, "lr_schedule", "decay_iters"))));
    neox_pt_set(w, lr, "min_lr", neox_pt_new_float(w, json_number_value(state_field(e, "lr_schedule", "min_lr"))));
    return lr;
}

// Whether refs[k] is the last part of its layer's fused QKV: GPT-NeoX's ParallelSelfAttention
// registers its rotary_emb (and its buffer) right after query_key_value.
static int last_qkv_part(const exporter *e, int k) {
    const char *qkv = "attention.query_key_value.";
    if (strncmp(e->refs[k].part, qkv, strlen(qkv)) != 0) return 0;
    return k + 1 == e->nrefs || strncmp(e->refs[k + 1].part, qkv, strlen(qkv)) != 0;
}

// GPT-NeoX's RotaryEmbedding buffer of one layer: 1 / base^(2i / R) over its R rotary dimensions,
// in fp32 as torch computes it (the whole head, or rotary_pct of it; the same on every rank).
static void add_inv_freq(neox_pt_writer *w, const exporter *e, neox_pt_value *module, int layer, int full) {
    const neox_model_desc *d = &e->c.desc;
    int64_t n = d->rotary_dims / 2;
    float *freq = neox_malloc((size_t)n * sizeof *freq + 4);
    for (int64_t i = 0; i < n; i++)
        freq[i] = 1.0f / powf((float)d->rotary_base, (float)(2 * i) / (float)d->rotary_dims);
    char name[128];
    snprintf(name, sizeof name, full ? "sequential.%d.attention.rotary_emb.inv_freq" : "attention.rotary_emb.inv_freq",
             layer);
    neox_pt_set(w, module, name, neox_pt_new_tensor(w, NEOX_PT_F32, 1, &n, freq));
    free(freq);
}

// The state dict of tensor-parallel rank r's parameters in layers [lo, hi), keyed by
// GPT-NeoX's names (full: sequential.N.PART) or by PART alone (a pipeline layer file).
static neox_pt_value *module_dict(neox_pt_writer *w, const exporter *e, int r, int lo, int hi, int full, neox_error *err) {
    neox_pt_value *module = neox_pt_new(w, NEOX_PT_DICT);
    for (int k = 0; k < e->nrefs; k++) {
        if (e->refs[k].layer < lo || e->refs[k].layer >= hi) continue;
        int64_t shape[2];
        float *data = read_ref(e, "params", &e->refs[k], r, shape, err);
        if (!data) return NULL;
        neox_pt_set(w, module, full ? e->refs[k].neox : e->refs[k].part, tensor_of(w, e, e->refs[k].param, data, shape));
        free(data);
        if (e->inv_freq && last_qkv_part(e, k)) add_inv_freq(w, e, module, e->refs[k].layer, full);
    }
    return module;
}

// A PipelineModule's layer_XX-model_YY-model_states.pt: layer XX's state dict on tensor-parallel rank YY.
static int write_layer_file(const exporter *e, const char *dir, int layer, int r, neox_error *err) {
    char *path = neox_asprintf("%s/layer_%02d-model_%02d-model_states.pt", dir, layer, r);
    neox_pt_writer *w = neox_pt_writer_open(path, err);
    free(path);
    if (!w) return -1;
    neox_pt_value *sd = module_dict(w, e, r, layer, layer + 1, 0, err);
    if (!sd) return neox_pt_writer_abort(w), -1;
    return neox_pt_writer_commit(w, sd, err);
}

// mp_rank_YY_model_states.pt of stage s, tensor-parallel rank r (YY = s x tp + r: DeepSpeed's
// rank in the pipe x model group). A pipeline's module is in its layer files, so `module` is None.
static int write_model_states(const exporter *e, const char *dir, int s, int r, int64_t iteration, neox_error *err) {
    char *path = neox_asprintf("%s/mp_rank_%02d_model_states.pt", dir, s * e->tp + r);
    neox_pt_writer *w = neox_pt_writer_open(path, err);
    free(path);
    if (!w) return -1;
    neox_pt_value *root = neox_pt_new(w, NEOX_PT_DICT);
    neox_pt_value *module = e->pp ? neox_pt_new(w, NEOX_PT_NONE) : module_dict(w, e, r, 0, 1 << 30, 1, err);
    if (!module) return neox_pt_writer_abort(w), -1;
    neox_pt_set(w, root, "module", module);
    neox_pt_set(w, root, "buffer_names", neox_pt_new(w, NEOX_PT_LIST));
    neox_pt_set(w, root, "optimizer", neox_pt_new(w, NEOX_PT_NONE));
    neox_pt_set(w, root, "lr_scheduler", state_field(e, NULL, "lr_schedule") ? lr_scheduler(w, e) : neox_pt_new(w, NEOX_PT_NONE));
    neox_pt_set(w, root, "skipped_steps", neox_pt_new_int(w, json_integer_value(state_field(e, NULL, "skipped_total"))));
    neox_pt_set(w, root, "global_steps", neox_pt_new_int(w, iteration));
    neox_pt_set(w, root, "global_samples", neox_pt_new_int(w, json_integer_value(state_field(e, NULL, "train_samples"))));
    neox_pt_set(w, root, "dp_world_size", neox_pt_new_int(w, e->dp));
    neox_pt_set(w, root, "mp_world_size", neox_pt_new_int(w, e->tp * (e->pp ? e->pp : 1)));
    neox_pt_set(w, root, "ds_version", neox_pt_new_str(w, "0.14.4"));
    neox_pt_set(w, root, "iteration", neox_pt_new_int(w, iteration));
    return neox_pt_writer_commit(w, root, err);
}

// One weight-decay group's flat buffer of a tensor group ("params", ...) on tensor-parallel rank r,
// in GPT-NeoX's parameter order.
static float *group_flat(const exporter *e, const char *group, int decay, int s, int r, int64_t *n, neox_error *err) {
    float *flat = NULL;
    *n = 0;
    for (int k = 0; k < e->nrefs; k++) {
        if (e->refs[k].decay != decay || !in_stage(e, s, &e->refs[k])) continue;
        int64_t shape[2];
        float *data = read_ref(e, group, &e->refs[k], r, shape, err);
        if (!data) return free(flat), NULL;
        flat = neox_realloc(flat, (size_t)(*n + shape[0] * shape[1]) * sizeof *flat + 4);
        memcpy(flat + *n, data, (size_t)(shape[0] * shape[1]) * sizeof *flat);
        *n += shape[0] * shape[1];
        free(data);
    }
    return flat;
}

// DeepSpeed pads each group's flat buffer to a multiple of 2 x dp (its fp16 alignment of partition
// starts) and gives every data rank an equal partition; the padding sits at the end of the last.
static int64_t partition_size(int64_t n, int dp) {
    if (n == 0) return 0;
    int64_t unit = 2 * (int64_t)dp;
    return (n + unit - 1) / unit * unit / dp;
}

// param_slice_mappings of one group on data rank d: each parameter's fragment in the partition.
static neox_pt_value *slice_mappings(neox_pt_writer *w, const exporter *e, int decay, int s, int64_t lo, int64_t hi) {
    neox_pt_value *map = neox_pt_new(w, NEOX_PT_DICT);
    int64_t at = 0;
    for (int k = 0; k < e->nrefs; k++) {
        if (e->refs[k].decay != decay || !in_stage(e, s, &e->refs[k])) continue;
        int64_t begin = at, end = at + ref_shard_numel(e, &e->refs[k]);
        at = end;
        if (end <= lo || begin >= hi) continue;
        int64_t from = begin > lo ? begin : lo, to = end < hi ? end : hi;
        neox_pt_value *frag = neox_pt_new(w, NEOX_PT_DICT);
        neox_pt_set(w, frag, "numel", neox_pt_new_int(w, to - from));
        neox_pt_set(w, frag, "start", neox_pt_new_int(w, from - lo));
        neox_pt_set(w, map, e->refs[k].neox, frag);
    }
    return map;
}

static neox_pt_value *param_group(neox_pt_writer *w, const exporter *e, int g) {
    const neox_config *cfg = e->c.cfg;
    neox_pt_value *pg = neox_pt_new(w, NEOX_PT_DICT), *betas = neox_pt_new(w, NEOX_PT_TUPLE);
    // (the defaults are Adam's, as lib/optim/adamw.c reads them)
    neox_pt_set(w, pg, "lr", neox_pt_new_float(w, neox_config_float(cfg, lr)));
    neox_pt_append(betas, neox_pt_new_float(w, neox_config_has(cfg, adam_beta1) ? neox_config_float(cfg, adam_beta1) : 0.9));
    neox_pt_append(betas, neox_pt_new_float(w, neox_config_has(cfg, adam_beta2) ? neox_config_float(cfg, adam_beta2) : 0.999));
    neox_pt_set(w, pg, "betas", betas);
    neox_pt_set(w, pg, "eps", neox_pt_new_float(w, neox_config_has(cfg, adam_eps) ? neox_config_float(cfg, adam_eps) : 1e-8));
    neox_pt_set(w, pg, "weight_decay", neox_pt_new_float(w, g == 0 ? neox_config_float(cfg, weight_decay) : 0.0));
    neox_pt_value *params = neox_pt_new(w, NEOX_PT_LIST);
    neox_pt_append(params, neox_pt_new_int(w, g));
    neox_pt_set(w, pg, "params", params);
    return pg;
}

// Data rank d's share of one group: its fp32 partition (without the padding) and Adam's state.
static int add_group(neox_pt_writer *w, const exporter *e, int g, int s, int r, int d, neox_pt_value *fp32s, neox_pt_value *state,
                     neox_pt_value *maps, neox_pt_value *paddings, neox_error *err) {
    float *flat[3];
    int64_t n = 0;
    int rc = 0;
    for (int k = 0; k < 3; k++) flat[k] = NULL;
    for (int k = 0; k < 3 && rc == 0; k++) {
        static const char *const groups[3] = {"params", "optimizer/exp_avg", "optimizer/exp_avg_sq"};
        flat[k] = group_flat(e, groups[k], g == 0, s, r, &n, err);
        if (!flat[k] && err->status) rc = -1;
    }
    if (rc != 0) {
        for (int k = 0; k < 3; k++) free(flat[k]);
        return -1;
    }
    int64_t part = partition_size(n, e->dp), lo = part * d, hi = lo + part, real = hi < n ? hi : n;
    int64_t kept = real > lo ? real - lo : 0, padding = part - kept;
    float *buf = neox_calloc((size_t)part + 1, sizeof *buf);
    neox_pt_value *st = neox_pt_new(w, NEOX_PT_DICT);
    int64_t steps = json_integer_value(state_field(e, NULL, "optimizer_steps"));
    float step = (float)steps;
    neox_pt_set(w, st, "step", neox_pt_new_tensor(w, NEOX_PT_F32, 0, NULL, &step));
    for (int k = 0; k < 3; k++) {
        memset(buf, 0, (size_t)part * sizeof *buf);
        if (kept) memcpy(buf, flat[k] + lo, (size_t)kept * sizeof *buf);
        if (k == 0) neox_pt_append(fp32s, neox_pt_new_tensor(w, NEOX_PT_F32, 1, &kept, buf));
        else neox_pt_set(w, st, k == 1 ? "exp_avg" : "exp_avg_sq", neox_pt_new_tensor(w, NEOX_PT_F32, 1, &part, buf));
        free(flat[k]);
    }
    free(buf);
    neox_pt_append(state, st);
    neox_pt_append(maps, slice_mappings(w, e, g == 0, s, lo, real));
    neox_pt_append(paddings, neox_pt_new_int(w, padding));
    return 0;
}

static neox_pt_value *bool_value(neox_pt_writer *w, int x) {
    neox_pt_value *v = neox_pt_new(w, NEOX_PT_BOOL);
    v->i = x != 0;
    return v;
}

// DeepSpeed's DynamicLossScaler object with its attributes (the object DeepSpeed's ZeRO optimizer
// saves and, on load_checkpoint, takes as its scaler). A static scaler (fp32, bf16, a fixed fp16
// loss_scale) is left out of the files: DeepSpeed then keeps the one its own config makes.
static neox_pt_value *dynamic_loss_scaler(neox_pt_writer *w, const exporter *e) {
    const neox_loss_scaler *s = &e->scaler;
    neox_pt_value *o = neox_pt_new_object(w, "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler");
    neox_pt_set(w, o, "cur_scale", neox_pt_new_float(w, s->scale));
    neox_pt_set(w, o, "cur_iter", neox_pt_new_int(w, s->iteration));
    neox_pt_set(w, o, "last_overflow_iter", neox_pt_new_int(w, s->last_overflow));
    neox_pt_set(w, o, "scale_factor", neox_pt_new_float(w, 2.0));
    neox_pt_set(w, o, "scale_window", neox_pt_new_int(w, s->window));
    neox_pt_set(w, o, "min_scale", neox_pt_new_float(w, s->min_scale));
    neox_pt_set(w, o, "delayed_shift", neox_pt_new_int(w, s->hysteresis));
    neox_pt_set(w, o, "cur_hysteresis", neox_pt_new_int(w, s->hysteresis_left));
    neox_pt_set(w, o, "consecutive_hysteresis", bool_value(w, s->consecutive_hysteresis));
    neox_pt_set(w, o, "raise_error_at_min_scale", bool_value(w, 1));
    neox_pt_set(w, o, "dynamic", bool_value(w, 1));
    neox_pt_set(w, o, "dtype", neox_pt_new_global(w, "torch.float16"));
    return o;
}

// The run's loss scaler: the fp16 dict's settings, the checkpoint's state (scale, hysteresis, counters).
static int plan_scaler(exporter *e, neox_error *err) {
    const char *precision = neox_config_str(e->c.cfg, precision);
    if (!precision || strcmp(precision, "fp16") != 0) return 0;
    if (neox_loss_scaler_fp16_from_config(e->c.cfg, &e->scaler, err) != 0) return -1;
    e->dynamic_scaler = e->scaler.window > 0;
    json_t *ls = state_field(e, NULL, "loss_scaler");
    if (e->dynamic_scaler && ls) {
        e->scaler.scale = json_number_value(json_object_get(ls, "scale"));
        e->scaler.hysteresis_left = (int)json_integer_value(json_object_get(ls, "hysteresis_left"));
        e->scaler.iteration = json_integer_value(json_object_get(ls, "iteration"));
        e->scaler.last_overflow = json_integer_value(json_object_get(ls, "last_overflow"));
    }
    return 0;
}

static int write_optim_states(const exporter *e, const char *dir, int s, int r, int d, neox_error *err) {
    char *path = neox_asprintf("%s/zero_pp_rank_%d_mp_rank_%02d_optim_states.pt", dir, d, s * e->tp + r);
    neox_pt_writer *w = neox_pt_writer_open(path, err);
    free(path);
    if (!w) return -1;
    neox_pt_value *root = neox_pt_new(w, NEOX_PT_DICT), *osd = neox_pt_new(w, NEOX_PT_DICT);
    neox_pt_value *fp32s = neox_pt_new(w, NEOX_PT_LIST), *states = neox_pt_new(w, NEOX_PT_LIST);
    neox_pt_value *maps = neox_pt_new(w, NEOX_PT_LIST), *paddings = neox_pt_new(w, NEOX_PT_LIST);
    for (int g = 0; g < 2; g++)
        if (add_group(w, e, g, s, r, d, fp32s, states, maps, paddings, err) != 0) return neox_pt_writer_abort(w), -1;
    // base_optimizer_state is torch's Adam state_dict over the two flat partitions (param ids 0, 1).
    neox_pt_value *base = neox_pt_new(w, NEOX_PT_DICT), *state = neox_pt_new(w, NEOX_PT_DICT);
    neox_pt_value *groups = neox_pt_new(w, NEOX_PT_LIST);
    for (int g = 0; g < 2; g++) {
        neox_pt_append(state, states->items[g]);
        state->keys[g] = neox_pt_new_int(w, g);
        neox_pt_append(groups, param_group(w, e, g));
    }
    neox_pt_set(w, base, "state", state);
    neox_pt_set(w, base, "param_groups", groups);
    if (e->dynamic_scaler) neox_pt_set(w, osd, "loss_scaler", dynamic_loss_scaler(w, e));
    neox_pt_set(w, osd, "dynamic_loss_scale", bool_value(w, e->dynamic_scaler));
    neox_pt_set(w, osd, "overflow", neox_pt_new_int(w, 0));
    neox_pt_set(w, osd, "clip_grad", neox_pt_new_float(w, neox_config_float(e->c.cfg, gradient_clipping)));
    neox_pt_set(w, osd, "base_optimizer_state", base);
    neox_pt_set(w, osd, "single_partition_of_fp32_groups", fp32s);
    neox_pt_set(w, osd, "zero_stage", neox_pt_new_int(w, e->zero));
    neox_pt_set(w, osd, "group_paddings", paddings);
    neox_pt_value *counts = neox_pt_new(w, NEOX_PT_LIST);
    for (int g = 0; g < 2; g++) neox_pt_append(counts, neox_pt_new_int(w, e->dp));
    neox_pt_set(w, osd, "partition_count", counts);
    neox_pt_set(w, osd, "ds_version", neox_pt_new_str(w, "0.14.4"));
    neox_pt_set(w, osd, "param_slice_mappings", maps);
    neox_pt_set(w, root, "optimizer_state_dict", osd);
    neox_pt_set(w, root, "ds_version", neox_pt_new_str(w, "0.14.4"));
    return neox_pt_writer_commit(w, root, err);
}

// GPT-NeoX's pipeline stages: DeepSpeed's PipelineModule partitions its n = L + 5 layers by
// GPT-NeoX's pipe_partition_method "type:transformer|mlp" (weight 1 for each transformer layer) with
// DeepSpeed's partition_balanced, restated here: the split minimising (the heaviest stage - the
// lightest), ties going to the later split point, as DeepSpeed's dynamic programme resolves them.
static void plan_stages(exporter *e) {
    int L = e->c.desc.num_layers, n = L + 5, m = e->pp;
    if (n <= m) {  // (DeepSpeed's partition_uniform; to-neox refuses more stages than layers before this)
        for (int s = 0; s <= m; s++) e->stage_start[s] = s < n ? s : n;
        return;
    }
    double *mx = neox_malloc((size_t)((n + 1) * (m + 1)) * sizeof *mx), *mn = neox_malloc((size_t)((n + 1) * (m + 1)) * sizeof *mn);
    double *cost = neox_malloc((size_t)((n + 1) * (m + 1)) * sizeof *cost);
    int *pos = neox_calloc((size_t)((n + 1) * (m + 1)), sizeof *pos), *prefix = neox_calloc((size_t)n + 1, sizeof *prefix);
    for (int k = 0; k < (n + 1) * (m + 1); k++) mx[k] = mn[k] = cost[k] = 1e300;
    for (int i = 1; i <= n; i++) prefix[i] = prefix[i - 1] + (i - 1 >= 2 && i - 1 < L + 2);
    mx[0] = cost[0] = 0;
#define AT(i, j) ((i) * (m + 1) + (j))
    for (int i = 1; i <= n; i++)
        for (int j = 1; j <= (i < m ? i : m); j++)
            for (int k = 0; k < i; k++) {
                double part = prefix[i] - prefix[k];
                double hi = mx[AT(k, j - 1)] > part ? mx[AT(k, j - 1)] : part;
                double lo = mn[AT(k, j - 1)] < part ? mn[AT(k, j - 1)] : part;
                if (cost[AT(i, j)] >= hi - lo) cost[AT(i, j)] = hi - lo, mx[AT(i, j)] = hi, mn[AT(i, j)] = lo, pos[AT(i, j)] = k;
            }
    e->stage_start[m] = n;
    for (int j = m; j >= 1; j--) e->stage_start[j - 1] = pos[AT(e->stage_start[j], j)];
#undef AT
    free(mx), free(mn), free(cost), free(pos), free(prefix);
}

// Tensor-parallel rank r's layer files of stage s (the layers holding parameters).
static int write_layer_files(const exporter *e, const char *dir, int s, int r, neox_error *err) {
    for (int layer = e->stage_start[s]; layer < e->stage_start[s + 1]; layer++) {
        int has = 0;
        for (int k = 0; k < e->nrefs && !has; k++) has = e->refs[k].layer == layer;
        if (has && write_layer_file(e, dir, layer, r, err) != 0) return -1;
    }
    return 0;
}

static int export_into(exporter *e, const char *out, neox_error *err) {
    int64_t iteration = json_integer_value(state_field(e, NULL, "iteration"));
    char *dir = neox_asprintf("%s/global_step%lld", out, (long long)iteration);
    int rc = mkdir(dir, 0777) == 0 ? 0 : neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot create the directory", dir);
    int has_optim = state_field(e, NULL, "optimizer") != NULL;
    for (int s = 0; s < (e->pp ? e->pp : 1) && rc == 0; s++)
        for (int r = 0; r < e->tp && rc == 0; r++) {
            if (e->pp) rc = write_layer_files(e, dir, s, r, err);
            if (rc == 0) rc = write_model_states(e, dir, s, r, iteration, err);
            for (int d = 0; d < e->dp && rc == 0 && has_optim; d++) rc = write_optim_states(e, dir, s, r, d, err);
        }
    if (rc == 0) {
        char *latest = neox_asprintf("global_step%lld\n", (long long)iteration);
        rc = neox_cvt_write_text(out, "latest", latest, err);
        free(latest);
    }
    free(dir);
    return rc;
}

// The options against the model: GPT-NeoX built a gated MLP's linear1 only under its linear1 names
// (before them, LLaMAParallelMLP's w1, w2, w3, which are not written); inv_freq needs rotary positions.
static int plan_options(exporter *e, const neox_to_neox_options *opts, neox_error *err) {
    const neox_model_desc *d = &e->c.desc;
    int llama = d->naming != NEOX_NAMES_GPT_NEOX;
    const char *names = opts && opts->mlp_names ? opts->mlp_names : llama ? "linear1" : "dense_h_to_4h";
    e->linear_names = strcmp(names, "linear1") == 0;
    if (llama && !e->linear_names)
        return neox_fail(err, NEOX_EXIT_USAGE, "--mlp-names %s: a Llama-style model's MLP has GPT-NeoX names only as "
                         "mlp.linear1/linear2 (GPT-NeoX since September 2024)", names);
    e->inv_freq = opts && opts->inv_freq;
    if (e->inv_freq && d->pos_emb != NEOX_POS_ROTARY)
        return neox_fail(err, NEOX_EXIT_USAGE, "--inv-freq: %s has no rotary positions (pos_emb), so GPT-NeoX "
                         "registers no inv_freq buffer", e->c.dir);
    return 0;
}

int neox_convert_to_neox(const char *ckpt, const char *out_dir, const neox_cvt_layout *lay,
                         const neox_to_neox_options *opts, neox_error *err) {
    exporter e = {.tp = lay->tp, .dp = lay->dp, .zero = lay->zero ? lay->zero : 1, .pp = lay->pp};
    if (e.zero > 2) return neox_fail(err, NEOX_EXIT_USAGE, "--zero %d: to-neox writes ZeRO stage 1 or 2 files", e.zero);
    if (e.pp && e.zero != 1)
        return neox_fail(err, NEOX_EXIT_USAGE, "--pp %d with --zero %d: DeepSpeed's pipeline engine runs ZeRO stage 1 only",
                         e.pp, e.zero);
    if (e.pp > 64) return neox_fail(err, NEOX_EXIT_USAGE, "--pp %d: to-neox writes at most 64 pipeline stages", e.pp);
    if (neox_cvt_open(&e.c, ckpt, err) != 0) return -1;
    e.params = neox_cvt_params(&e.c.desc, &e.nparams);
    const char *opt = json_string_value(state_field(&e, NULL, "optimizer"));
    int rc = plan_options(&e, opts, err);
    if (rc == 0) rc = plan_names(&e, err);
    if (rc == 0 && opt && strcmp(opt, "adam") != 0)
        rc = neox_fail(err, NEOX_EXIT_USAGE, "%s: optimizer '%s': to-neox writes Adam's state (DeepSpeed's ZeRO files)",
                       e.c.dir, opt);
    neox_cvt_layout check = *lay;
    check.zero = e.zero;
    check.pp = e.pp ? e.pp : 1;
    if (rc == 0) rc = neox_cvt_layout_check(&e.c.desc, &check, err);
    if (rc == 0 && e.pp) plan_stages(&e);
    if (rc == 0) rc = plan_scaler(&e, err);
    char *tmp = rc == 0 ? neox_cvt_outdir_begin(out_dir, err) : NULL;
    if (rc == 0 && !tmp) rc = -1;
    if (rc == 0) rc = export_into(&e, tmp, err);
    if (rc == 0) rc = neox_cvt_outdir_commit(tmp, out_dir, err);
    else if (tmp) neox_cvt_outdir_abort(tmp);
    free(tmp);
    free(e.refs);
    free(e.params);
    neox_cvt_close(&e.c);
    return rc;
}
