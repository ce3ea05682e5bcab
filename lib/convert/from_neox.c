// from_neox.c: `neox-convert from-neox`: a GPT-NeoX (DeepSpeed) checkpoint, written at any
// tensor-parallel and data-parallel size, as a neox.c checkpoint from which neox-train continues:
// the weights (the fp32 master copy from ZeRO's partitions when present, else the module's),
// Adam's moments, the iteration and optimizer steps, the LR schedule's position, the fp16 loss
// scaler and the data position. The model is known from the run's GPT-NeoX YAML configs. Every
// tensor-parallel shard is joined (Megatron's cuts: rows for column-parallel weights, columns for
// row-parallel ones; GPT-NeoX's fused QKV is already Hugging Face's per-head interleaving), every
// ZeRO stage 1/2 partition placed by DeepSpeed's own param_slice_mappings. A Llama-style run (GPT-NeoX's
// llama configs) has its fused QKV split per head into q_proj, k_proj, v_proj and its gated MLP's
// linear1 into up_proj and gate_proj (under grouped-query attention its QKV is [q | k | v] per
// tensor-parallel shard). A pipeline's tied embedding is read from the first stage, the last stage's
// copy checked equal to it. What neox.c cannot hold (ZeRO-3, an optimizer other than Adam, a parameter
// it has no place for) is refused by name before anything is written. See docs/convert.md, "From a GPT-NeoX run".
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "checkpoint.h"
#include "convert_internal.h"
#include "neox_source.h"
#include "optim.h"

typedef struct {
    neox_pt_file *file;
    const neox_pt_tensor *t;
} shard_ref;

// How a tensor GPT-NeoX stores holds neox.c's parameters: as one, or (a Llama-style model) as its
// fused QKV, interleaved per head ([q k v] of head 0, then of head 1, ...: q_proj, k_proj, v_proj;
// with grouped-query attention [q | k | v] of each tensor-parallel shard's heads),
// or the gated MLP's linear1, whose every tensor-parallel shard is [up | gate] of its rows (GPT-NeoX's
// Gated_Activation chunks the shard's output in two: x, then gate).
typedef enum { HOLDS_ONE, HOLDS_QKV, HOLDS_UP_GATE } neox_holds;

typedef struct {
    neox_cvt_param whole;  // neox.c's name of its first parameter, GPT-NeoX's whole shape
    int first, count;      // the neox.c parameters it holds: params[first .. first + count)
    neox_holds holds;
} source_tensor;

typedef struct {
    neox_source src;
    neox_config *cfg;
    neox_model_desc desc;
    neox_cvt_param *params;      // neox.c's parameters, in the checkpoint's order
    int nparams, tied, llama;
    source_tensor *tensors;      // GPT-NeoX's tensors, each holding params[first .. first + count)
    int ntensors;
    shard_ref *weights;          // [tensor * tp + rank]
    neox_pt_file **layer_files;  // kept open while their tensors are read
    int nlayer_files;
    float **opt[3];              // master, exp_avg, exp_avg_sq: [param * tp + rank], NULL without ZeRO files
    int64_t optimizer_steps;
    // A tied embedding's copy in a later pipeline stage's optimizer (GPT-NeoX's TiedLayerSpec "embed":
    // DeepSpeed keeps one in each end stage's ZeRO groups): master, exp_avg, exp_avg_sq of one
    // tensor-parallel rank, and how much of it the stage's partitions have filled.
    float *tied_copy[3];
    int64_t tied_filled;
    int tied_tensor;  // the embedding's index in tensors
    int dynamic_scaler;          // DeepSpeed's DynamicLossScaler, with its state:
    double scale;
    int64_t scaler_iter, last_overflow, hysteresis;
} importer;

static const char *const opt_groups[3] = {"params", "optimizer/exp_avg", "optimizer/exp_avg_sq"};

static int tensor_index(const importer *im, const char *hf) {
    for (int i = 0; i < im->ntensors; i++)
        if (strcmp(im->tensors[i].whole.name, hf) == 0) return i;
    return -1;
}

static int64_t numel_of(const neox_cvt_param *p) { return p->shape[0] * (p->ndim == 2 ? p->shape[1] : 1); }

static int ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && strcmp(s + n - k, tail) == 0;
}

// GPT-NeoX's tensors over neox.c's parameters: one each, but a Llama-style model's q_proj, k_proj,
// v_proj (weights, or biases) are one fused QKV and its up_proj, gate_proj one linear1 (adjacent in
// neox.c's order, lib/model/params.c).
static void plan_tensors(importer *im) {
    im->tensors = neox_calloc((size_t)im->nparams, sizeof *im->tensors);
    for (int i = 0; i < im->nparams;) {
        source_tensor *t = &im->tensors[im->ntensors++];
        const char *name = im->params[i].name;
        int qkv = im->llama && (ends_with(name, "q_proj.weight") || ends_with(name, "q_proj.bias"));
        int up_gate = im->llama && (ends_with(name, "up_proj.weight") || ends_with(name, "up_proj.bias")) &&
                      i + 1 < im->nparams && strstr(im->params[i + 1].name, "gate_proj.");
        *t = (source_tensor){.whole = im->params[i], .first = i, .count = qkv ? 3 : up_gate ? 2 : 1,
                             .holds = qkv ? HOLDS_QKV : up_gate ? HOLDS_UP_GATE : HOLDS_ONE};
        for (int k = 1; k < t->count; k++) t->whole.shape[0] += im->params[i + k].shape[0];
        i += t->count;
    }
}

// Calls fn for every (layer, part, tensor) of tensor-parallel rank r's model files.
typedef int (*weight_fn)(importer *im, int r, int layer, const char *part, neox_pt_file *f, const neox_pt_value *v,
                         neox_error *err);

static int each_in_dict(importer *im, int r, int layer, neox_pt_file *f, const neox_pt_value *dict, weight_fn fn,
                        neox_error *err) {
    for (int k = 0; k < dict->count; k++) {
        if (dict->keys[k]->kind != NEOX_PT_STR) continue;
        int l = layer;
        const char *part = dict->keys[k]->str;
        if (layer < 0 && neox_source_split_name(dict->keys[k]->str, &l, &part) != 0)
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s: module parameter '%s' is not named sequential.N.NAME",
                             neox_pt_path(f), dict->keys[k]->str);
        if (fn(im, r, l, part, f, dict->items[k], err) != 0) return -1;
    }
    return 0;
}

static int each_weight(importer *im, weight_fn fn, neox_error *err) {
    for (int r = 0; r < im->src.tp; r++) {
        if (!im->src.layered) {
            neox_pt_file *f = im->src.model_files[r];
            const neox_pt_value *module = neox_pt_get(neox_pt_root(f), "module");
            if (!module || module->kind != NEOX_PT_DICT)
                return neox_fail(err, NEOX_EXIT_FAILURE, "%s: no 'module' state dict (and no layer_XX files)", neox_pt_path(f));
            if (each_in_dict(im, r, -1, f, module, fn, err) != 0) return -1;
            continue;
        }
        for (int layer = 0; layer <= im->src.max_layer; layer++) {
            neox_pt_file *f = neox_source_layer_file(&im->src, layer, r, err);
            if (!f && err->status) return -1;
            if (!f) continue;
            im->layer_files = neox_realloc(im->layer_files, (size_t)(im->nlayer_files + 1) * sizeof *im->layer_files);
            im->layer_files[im->nlayer_files++] = f;
            const neox_pt_value *root = neox_pt_root(f);
            if (root->kind != NEOX_PT_DICT)
                return neox_fail(err, NEOX_EXIT_FAILURE, "%s: not a layer's state dict", neox_pt_path(f));
            if (each_in_dict(im, r, layer, f, root, fn, err) != 0) return -1;
        }
    }
    return 0;
}

// First pass: the embedding's rows (the padded vocabulary over the tensor-parallel ranks).
static int count_vocab(importer *im, int r, int layer, const char *part, neox_pt_file *f, const neox_pt_value *v,
                       neox_error *err) {
    (void)r, (void)err, (void)f;
    if (layer == 0 && strcmp(part, "word_embeddings.weight") == 0 && v->kind == NEOX_PT_TENSOR && v->tensor->ndim == 2)
        im->desc.vocab_size += v->tensor->shape[0];
    return 0;
}

// Second pass: each tensor to its neox.c parameter.
static int place_weight(importer *im, int r, int layer, const char *part, neox_pt_file *f, const neox_pt_value *v,
                        neox_error *err) {
    char hf[128];
    int rc = neox_source_hf_name(&im->desc, layer, part, hf, sizeof hf, err);
    if (rc == NEOX_SRC_SKIP) return 0;
    if (rc != 0) return neox_fail_context(err, "%s", neox_pt_path(f));
    int i = tensor_index(im, hf);
    if (i < 0) return neox_fail(err, NEOX_EXIT_USAGE, "%s: '%s' (%s) is not a parameter of the model the configs describe",
                                neox_pt_path(f), part, hf);
    if (v->kind != NEOX_PT_TENSOR) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: '%s' is not a tensor", neox_pt_path(f), part);
    if (im->weights[i * im->src.tp + r].t)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: '%s' appears twice for tensor-parallel rank %d", neox_pt_path(f), part, r);
    im->weights[i * im->src.tp + r] = (shard_ref){f, v->tensor};
    return 0;
}

// Joins tensor-parallel shards (fp32, each of its weight tensor's shape) into the whole tensor.
static int join_shards(const importer *im, int i, float *const *shards, float *whole, neox_error *err) {
    const neox_cvt_param *p = &im->tensors[i].whole;
    int tp = im->src.tp, dim = neox_source_tp_dim(p->name);
    if (dim < 0 || tp == 1) {
        memcpy(whole, shards[0], (size_t)numel_of(p) * sizeof *whole);
        return 0;
    }
    int64_t cols = p->ndim == 2 ? p->shape[1] : 1, at = 0;
    for (int r = 0; r < tp; r++) {
        const neox_pt_tensor *t = im->weights[i * tp + r].t;
        int64_t rows = t->shape[0], w = t->ndim == 2 ? t->shape[1] : 1;
        for (int64_t y = 0; y < rows; y++)
            if (dim == 0) memcpy(whole + (at + y) * cols, shards[r] + y * w, (size_t)w * sizeof *whole);
            else memcpy(whole + y * cols + at, shards[r] + y * w, (size_t)w * sizeof *whole);
        at += dim == 0 ? rows : w;
    }
    if (at != p->shape[dim])
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: its %d tensor-parallel shards join to %lld along dimension %d, the "
                         "model has %lld", p->name, tp, (long long)at, dim, (long long)p->shape[dim]);
    return 0;
}

// Every parameter has a shard from every rank, of a shape that joins to the model's.
static int check_weights(const importer *im, neox_error *err) {
    for (int i = 0; i < im->ntensors; i++) {
        const neox_cvt_param *p = &im->tensors[i].whole;
        int dim = neox_source_tp_dim(p->name);
        for (int r = 0; r < im->src.tp; r++) {
            const neox_pt_tensor *t = im->weights[i * im->src.tp + r].t;
            if (!t)
                return neox_fail(err, NEOX_EXIT_FAILURE, "%s: no tensor for %s from tensor-parallel rank %d", im->src.dir,
                                 p->name, r);
            int64_t want[2] = {p->shape[0], p->ndim == 2 ? p->shape[1] : 1};
            if (dim >= 0) want[dim] /= im->src.tp;
            if (t->ndim != p->ndim || t->shape[0] != want[0] || (t->ndim == 2 && t->shape[1] != want[1]))
                return neox_fail(err, NEOX_EXIT_USAGE, "%s: %s of tensor-parallel rank %d is %lld x %lld, the configs' "
                                 "model's %lld x %lld (their hidden_size, intermediate_size, mlp_multiple_of, activation)",
                                 neox_pt_path(im->weights[i * im->src.tp + r].file), p->name, r, (long long)t->shape[0],
                                 (long long)(t->ndim == 2 ? t->shape[1] : 1), (long long)want[0], (long long)want[1]);
        }
    }
    return 0;
}

// DeepSpeed's fp16 loss scaler (a record of its attributes); a static one (fp32, bf16) has no state.
static int read_scaler(importer *im, neox_pt_file *f, const neox_pt_value *ls, neox_error *err) {
    if (!ls || ls->kind != NEOX_PT_RECORD || !strstr(ls->str, "DynamicLossScaler")) return 0;
    im->dynamic_scaler = 1;
    double x;
    if (neox_pt_number(f, neox_pt_get(ls, "cur_scale"), "loss_scaler.cur_scale", &im->scale, err) != 0 ||
        neox_pt_integer(f, neox_pt_get(ls, "cur_iter"), "loss_scaler.cur_iter", &im->scaler_iter, err) != 0 ||
        neox_pt_number(f, neox_pt_get(ls, "last_overflow_iter"), "loss_scaler.last_overflow_iter", &x, err) != 0)
        return -1;
    im->last_overflow = (int64_t)x;
    const neox_pt_value *h = neox_pt_get(ls, "cur_hysteresis");
    im->hysteresis = h && h->kind == NEOX_PT_INT ? h->i : 2;
    return 0;
}

// A param_slice_mappings name -> GPT-NeoX's layer and part. A pipeline run's tied embedding is named
// by its TiedLayerSpec key (tied_modules.embed.word_embeddings.weight): layer 0's embedding.
static int fragment_name(const importer *im, const char *path, const neox_pt_value *key, int *layer, const char **part,
                         neox_error *err) {
    const char *tied = "tied_modules.embed.";
    if (key->kind == NEOX_PT_STR && !strncmp(key->str, tied, strlen(tied))) {
        if (!im->tied)
            return neox_fail(err, NEOX_EXIT_USAGE, "%s: '%s': a tied embedding (GPT-NeoX's TiedLayerSpec), but the "
                             "configs say no_weight_tying: true", path, key->str);
        *layer = 0, *part = key->str + strlen(tied);
        return 0;
    }
    if (key->kind != NEOX_PT_STR || neox_source_split_name(key->str, layer, part) != 0)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: param_slice_mappings names '%s'", path,
                         key->kind == NEOX_PT_STR ? key->str : "?");
    return 0;
}

// One ZeRO partition file of pipeline stage `stage`: each parameter fragment (DeepSpeed's
// param_slice_mappings) copied into its rank's shard of master weights and moments; filled[] counts
// what each shard has received. A later stage's copy of the tied embedding goes to im->tied_copy.
static int read_partition(importer *im, int pipe_stage, int r, neox_pt_file *f, int64_t *filled, neox_error *err) {
    const char *path = neox_pt_path(f);
    const neox_pt_value *osd = neox_pt_get(neox_pt_root(f), "optimizer_state_dict");
    int64_t stage = 0;
    if (!osd) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: no optimizer_state_dict", path);
    if (neox_pt_integer(f, neox_pt_get(osd, "zero_stage"), "optimizer_state_dict.zero_stage", &stage, err) != 0) return -1;
    if (stage < 1 || stage > 2)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s: a ZeRO stage %lld checkpoint; from-neox reads ZeRO stages 1 and 2",
                         path, (long long)stage);
    const neox_pt_value *groups = neox_pt_get(osd, "single_partition_of_fp32_groups");
    const neox_pt_value *maps = neox_pt_get(osd, "param_slice_mappings");
    const neox_pt_value *state = neox_pt_find(osd, "base_optimizer_state.state");
    if (!groups || groups->kind != NEOX_PT_LIST || !maps || maps->kind != NEOX_PT_LIST || maps->count != groups->count ||
        !state || state->kind != NEOX_PT_DICT)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: not DeepSpeed's ZeRO state dict (single_partition_of_fp32_groups, "
                         "param_slice_mappings, base_optimizer_state.state)", path);
    if (read_scaler(im, f, neox_pt_get(osd, "loss_scaler"), err) != 0) return -1;
    for (int g = 0; g < groups->count; g++) {
        char key[32];
        snprintf(key, sizeof key, "%d", g);
        const neox_pt_value *st = neox_pt_find(state, key), *m = neox_pt_get(st, "exp_avg"), *v = neox_pt_get(st, "exp_avg_sq");
        const neox_pt_value *step = neox_pt_get(st, "step"), *flat = groups->items[g];
        if (st && (!m || !v))
            return neox_fail(err, NEOX_EXIT_USAGE, "%s: the optimizer state of group %d is not Adam's (no exp_avg and "
                             "exp_avg_sq): neox.c imports Adam/AdamW runs", path, g);
        if (!st || m->kind != NEOX_PT_TENSOR || v->kind != NEOX_PT_TENSOR || flat->kind != NEOX_PT_TENSOR)
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s: group %d has no fp32 partition and Adam state", path, g);
        if (step && step->kind == NEOX_PT_TENSOR) {
            float s;
            if (neox_pt_numel(step->tensor) != 1 || neox_pt_read_f32(f, step->tensor, "step", &s, err) != 0) return -1;
            im->optimizer_steps = (int64_t)s;
        } else if (step && neox_pt_integer(f, step, "step", &im->optimizer_steps, err) != 0) {
            return -1;
        }
        int64_t n = neox_pt_numel(flat->tensor);
        if (neox_pt_numel(m->tensor) < n || neox_pt_numel(v->tensor) < n)
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s: group %d's Adam state is shorter than its partition", path, g);
        float *buf[3];
        for (int k = 0; k < 3; k++) buf[k] = neox_malloc((size_t)(k ? neox_pt_numel(m->tensor) : n) * sizeof(float) + 4);
        int rc = neox_pt_read_f32(f, flat->tensor, "fp32 partition", buf[0], err);
        if (rc == 0) rc = neox_pt_read_f32(f, m->tensor, "exp_avg", buf[1], err);
        if (rc == 0) rc = neox_pt_read_f32(f, v->tensor, "exp_avg_sq", buf[2], err);
        const neox_pt_value *map = maps->items[g];
        for (int k = 0; rc == 0 && map->kind == NEOX_PT_DICT && k < map->count; k++) {
            int layer, i;
            const char *part;
            char hf[128];
            int64_t start, numel;
            if ((rc = fragment_name(im, path, map->keys[k], &layer, &part, err)) != 0) break;
            int named = neox_source_hf_name(&im->desc, layer, part, hf, sizeof hf, err);
            if (named == NEOX_SRC_SKIP) continue;
            if (named != 0 || (i = tensor_index(im, hf)) < 0) {
                rc = named != 0 ? neox_fail_context(err, "%s", path)
                                : neox_fail(err, NEOX_EXIT_USAGE, "%s: %s is not a parameter of the configs' model", path, hf);
                break;
            }
            rc = neox_pt_integer(f, neox_pt_get(map->items[k], "start"), "fragment start", &start, err);
            if (rc == 0) rc = neox_pt_integer(f, neox_pt_get(map->items[k], "numel"), "fragment numel", &numel, err);
            int later_copy = pipe_stage > 0 && layer == 0;  // (the tied embedding, its owner being stage 0)
            int64_t shard = neox_pt_numel(im->weights[i * im->src.tp + r].t);
            int64_t *got = later_copy ? &im->tied_filled : &filled[i * im->src.tp + r];
            if (later_copy) im->tied_tensor = i;
            if (rc == 0 && (start < 0 || numel < 0 || start > n - numel || *got > shard - numel))
                rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: the fragment of %s [%lld, +%lld) lies outside its partition or "
                               "its tensor", path, map->keys[k]->str, (long long)start, (long long)numel);
            for (int s = 0; rc == 0 && s < 3; s++) {
                float **dst = later_copy ? &im->tied_copy[s] : &im->opt[s][i * im->src.tp + r];
                if (!*dst) *dst = neox_calloc((size_t)shard + 1, sizeof **dst);
                memcpy(*dst + *got, buf[s] + start, (size_t)numel * sizeof **dst);
            }
            if (rc == 0) *got += numel;
        }
        for (int k = 0; k < 3; k++) free(buf[k]);
        if (rc != 0) return -1;
    }
    return 0;
}

// After a later stage's partitions of tensor-parallel rank r: its copy of the tied embedding must be
// stage 0's, whole, in master weights and both moments (DeepSpeed all-reduces the tied gradients over
// the end stages, so their Adam updates agree; stage 0's is the copy its load_checkpoint broadcasts).
static int check_tied_copy(importer *im, int stage, int r, neox_error *err) {
    if (!im->tied_copy[0]) return 0;
    int i = im->tied_tensor;
    int64_t n = neox_pt_numel(im->weights[i * im->src.tp + r].t);
    static const char *const what[3] = {"fp32 master weights", "exp_avg", "exp_avg_sq"};
    int rc = 0;
    if (im->tied_filled != n)
        rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: pipeline stage %d's ZeRO partitions hold %lld of the %lld elements of "
                       "the tied embedding (tensor-parallel rank %d)", im->src.dir, stage, (long long)im->tied_filled,
                       (long long)n, r);
    for (int s = 0; s < 3 && rc == 0; s++)
        if (memcmp(im->tied_copy[s], im->opt[s][i * im->src.tp + r], (size_t)n * sizeof(float)) != 0)
            rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: the tied embedding's %s on pipeline stage %d differ from stage 0's "
                           "(tensor-parallel rank %d): GPT-NeoX's two copies of tied_modules.embed must be equal",
                           im->src.dir, what[s], stage, r);
    for (int s = 0; s < 3; s++) free(im->tied_copy[s]), im->tied_copy[s] = NULL;
    im->tied_filled = 0;
    return rc;
}

static int read_optimizer(importer *im, neox_error *err) {
    if (im->src.bf16_optimizer)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s: DeepSpeed's bf16 optimizer or ZeRO-3 files (bf16_zero_pp_rank_*, "
                         "zero3_*): from-neox reads ZeRO stages 1 and 2", im->src.dir);
    if (im->src.dp == 0) return 0;
    size_t n = (size_t)im->ntensors * (size_t)im->src.tp;
    for (int s = 0; s < 3; s++) im->opt[s] = neox_calloc(n, sizeof *im->opt[s]);
    int64_t *filled = neox_calloc(n, sizeof *filled);
    int rc = 0;
    for (int stage = 0; stage < im->src.pp && rc == 0; stage++)  // (a pipeline's stages: each its own layers)
        for (int r = 0; r < im->src.tp && rc == 0; r++) {
            for (int d = 0; d < im->src.dp && rc == 0; d++) {
                neox_pt_file *f = neox_source_optim_file(&im->src, d, stage, r, err);
                rc = f ? read_partition(im, stage, r, f, filled, err) : -1;
                neox_pt_close(f);
            }
            if (rc == 0) rc = check_tied_copy(im, stage, r, err);
        }
    for (size_t k = 0; k < n && rc == 0; k++)
        if (filled[k] != neox_pt_numel(im->weights[k].t))
            rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: ZeRO partitions hold %lld of the %lld elements of %s (rank %zu)",
                           im->src.dir, (long long)filled[k], (long long)neox_pt_numel(im->weights[k].t),
                           im->tensors[k / (size_t)im->src.tp].whole.name, k % (size_t)im->src.tp);
    free(filled);
    return rc;
}

// Parameter i of group s ("params" from the fp32 master copy when ZeRO files were read, else from
// the module's weights) as a whole fp32 tensor.
static int whole_tensor(importer *im, int s, int i, float *whole, neox_error *err) {
    int tp = im->src.tp, rc = 0;
    float **shards = neox_calloc((size_t)tp, sizeof *shards);
    for (int r = 0; r < tp && rc == 0; r++) {
        const shard_ref *w = &im->weights[i * tp + r];
        if (im->opt[s]) {
            shards[r] = im->opt[s][i * tp + r];
            continue;
        }
        float *buf = neox_malloc((size_t)neox_pt_numel(w->t) * sizeof *buf + 4);
        rc = neox_pt_read_f32(w->file, w->t, im->tensors[i].whole.name, buf, err);
        shards[r] = buf;
    }
    if (rc == 0) rc = join_shards(im, i, shards, whole, err);
    for (int r = 0; r < tp; r++)
        if (!im->opt[s]) free(shards[r]);
    free(shards);
    return rc;
}

// A fused tensor (whole, as GPT-NeoX's shards join) -> its neox.c parameters one after another in out.
// It is row blocks, each holding a slice of every part in turn: QKV per head [q_h; k_h; v_h], or under
// grouped-query attention per tensor-parallel shard [q_r; k_r; v_r] (neox_source_qkv_blocks);
// linear1 per shard [up_r; gate_r]. Part k's slice in each block is its rows / blocks.
static void split_tensor(const importer *im, const source_tensor *t, const float *whole, float *out) {
    int64_t cols = t->whole.ndim == 2 ? t->whole.shape[1] : 1;
    int64_t blocks = t->holds == HOLDS_QKV ? (int64_t)neox_source_qkv_blocks(&im->desc, im->src.tp) * im->src.tp
                                           : im->src.tp;
    const float *src = whole;
    for (int64_t b = 0; b < blocks; b++) {
        int64_t at = 0;  // part k's first row in out
        for (int k = 0; k < t->count; at += im->params[t->first + k].shape[0], k++) {
            int64_t rows = im->params[t->first + k].shape[0] / blocks;
            memcpy(out + (at + b * rows) * cols, src, (size_t)(rows * cols) * sizeof *out);
            src += rows * cols;
        }
    }
}

static int64_t int_or(const neox_pt_value *v, int64_t fallback) { return v && v->kind == NEOX_PT_INT ? v->i : fallback; }

// state/train.json: the counters, Adam's name, GPT-NeoX's AnnealingLR position and the loss scaler.
// GPT-NeoX places the data by the iteration alone (consumed samples = iteration x global batch), so
// the position is the iteration's micro-batches; its evaluation has drawn eval_iters batches at each
// eval_interval.
static char *state_json(const importer *im, int64_t iteration, json_t *files) {
    const neox_config *cfg = im->cfg;
    int64_t accum = neox_config_int(cfg, gradient_accumulation_steps);
    int64_t interval = neox_config_int(cfg, eval_interval), evals = neox_config_int(cfg, eval_iters);
    neox_run_counters c = {.iteration = iteration, .optimizer_steps = im->optimizer_steps ? im->optimizer_steps : iteration,
                           .train_position = iteration * accum,
                           .valid_position = interval > 0 ? iteration / interval * evals * accum : 0,
                           .seed = neox_config_int(cfg, seed), .has_rng = 1};
    c.train_samples = c.train_position * neox_config_int(cfg, train_micro_batch_size_per_gpu);
    json_t *s = neox_ckpt_run_state_json(&c, &im->desc, files);
    if (im->opt[1]) json_object_set_new(s, "optimizer", json_string("adam"));
    const neox_pt_value *lr = neox_pt_get(neox_pt_root(im->src.model_files[0]), "lr_scheduler");
    if (im->opt[1] && lr && lr->kind == NEOX_PT_DICT) {
        double start = 0, min_lr = 0, warmup = 0;  // (GPT-NeoX's warmup_iter is warmup x iterations: a float)
        const neox_pt_value *style = neox_pt_get(lr, "decay_style");
        neox_pt_number(im->src.model_files[0], neox_pt_get(lr, "start_lr"), "start_lr", &start, NULL);
        neox_pt_number(im->src.model_files[0], neox_pt_get(lr, "min_lr"), "min_lr", &min_lr, NULL);
        neox_pt_number(im->src.model_files[0], neox_pt_get(lr, "warmup_iter"), "warmup_iter", &warmup, NULL);
        json_object_set_new(s, "lr_schedule",
                            json_pack("{s:f, s:f, s:f, s:I, s:s, s:I}", "lr", start, "min_lr", min_lr, "warmup_iters",
                                      warmup, "decay_iters",
                                      (json_int_t)int_or(neox_pt_get(lr, "end_iter"), 1), "style",
                                      style && style->kind == NEOX_PT_STR ? style->str : "constant", "num_iters",
                                      (json_int_t)int_or(neox_pt_get(lr, "num_iters"), iteration)));
    }
    if (im->dynamic_scaler)
        json_object_set_new(s, "loss_scaler", json_pack("{s:f, s:I, s:I, s:I}", "scale", im->scale, "hysteresis_left",
                                                        (json_int_t)im->hysteresis, "iteration", (json_int_t)im->scaler_iter,
                                                        "last_overflow", (json_int_t)im->last_overflow));
    char *text = json_dumps(s, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(s);
    return text;
}

// The configs as the trainer stores them (config/input/K-NAME), their names for the run state.
static int write_configs(neox_cvt_out *o, const char *const *configs, int n, json_t *files, neox_error *err) {
    for (int k = 0; k < n; k++) {
        size_t size;
        char *text = neox_read_file(configs[k], &size, err), *copy = neox_strdup(configs[k]);
        char *name = neox_asprintf("config/input/%d-%s", k, basename(copy));
        int rc = text ? neox_cvt_out_bytes(o, name, text, size, err) : -1;
        json_array_append_new(files, json_string(name));
        free(text), free(copy), free(name);
        if (rc != 0) return -1;
    }
    return 0;
}

static int write_checkpoint(importer *im, const char *save, const char *const *configs, int nconfigs,
                            const neox_cvt_layout *lay, neox_error *err) {
    int64_t iteration = int_or(neox_pt_get(neox_pt_root(im->src.model_files[0]), "iteration"), 0);
    neox_cvt_out o;
    if (neox_cvt_out_open(&o, save, iteration, &im->desc, lay, err) != 0) return -1;
    int rc = 0, ngroups = im->opt[1] ? 3 : 1;
    neox_progress *bar = neox_progress_start("from-neox", (double)o.flat_total * sizeof(float) * ngroups, "B");
    for (int s = 0; s < ngroups && rc == 0; s++)
        for (int i = 0; i < im->ntensors && rc == 0; i++) {
            const source_tensor *t = &im->tensors[i];
            float *whole = neox_malloc((size_t)numel_of(&t->whole) * sizeof *whole + 4);
            float *split = t->count > 1 ? neox_malloc((size_t)numel_of(&t->whole) * sizeof *split + 4) : whole;
            rc = whole_tensor(im, s, i, whole, err);
            if (rc == 0 && t->count > 1) split_tensor(im, t, whole, split);
            for (int k = 0, at = 0; k < t->count && rc == 0; at += (int)numel_of(&im->params[t->first + k]), k++)
                rc = neox_cvt_out_tensor(&o, opt_groups[s], t->first + k, split + at, err);
            if (split != whole) free(split);
            free(whole);
            neox_progress_update(bar, o.bytes_written, NULL);
        }
    neox_progress_finish(bar, o.bytes_written, NULL);
    json_t *files = json_array();
    if (rc == 0) rc = write_configs(&o, configs, nconfigs, files, err);
    char *state = rc == 0 ? state_json(im, iteration, files) : (json_decref(files), NULL), *effective = NULL;
    size_t size = 0;
    FILE *mem = open_memstream(&effective, &size);
    neox_config_print_as(im->cfg, "json", mem);
    fclose(mem);
    if (rc == 0) rc = neox_cvt_out_bytes(&o, "state/train.json", state, strlen(state), err);
    if (rc == 0) rc = neox_cvt_out_bytes(&o, "config/effective.json", effective, size, err);
    free(state);
    free(effective);
    if (rc == 0) return neox_cvt_out_finish(&o, save, iteration, err);
    neox_cvt_out_abort(&o);
    return -1;
}

// Whether v holds state the reader skipped (numpy's RNG state), within a few levels.
static int holds_skipped(const neox_pt_value *v, int depth) {
    if (v->kind == NEOX_PT_SKIPPED) return 1;
    if (depth > 4 || v->kind == NEOX_PT_TENSOR) return 0;
    for (int i = 0; i < v->count && (v->kind == NEOX_PT_TUPLE || v->kind == NEOX_PT_LIST || v->kind == NEOX_PT_DICT); i++)
        if (holds_skipped(v->items[i], depth + 1)) return 1;
    return 0;
}

// GPT-NeoX's client state carries the RNG states of its ranks (python, numpy, torch, CUDA, the
// model-parallel tracker): neox.c draws dropout from its own generator seeded by the config.
static void notice_rng_state(const importer *im) {
    static const char *const rng_keys[] = {"random_rng_state", "np_rng_state", "torch_rng_state", "cuda_rng_state",
                                           "rng_tracker_states"};
    const neox_pt_value *root = neox_pt_root(im->src.model_files[0]);
    for (size_t k = 0; k < sizeof rng_keys / sizeof rng_keys[0]; k++) {
        const neox_pt_value *v = neox_pt_get(root, rng_keys[k]);
        if (v && v->kind != NEOX_PT_NONE)
            neox_notice("%s: '%s' is not imported%s: neox.c's dropout stream starts from the config's seed",
                        neox_pt_path(im->src.model_files[0]), rng_keys[k],
                        holds_skipped(v, 0) ? " (numpy's RNG state, skipped unread)" : "");
    }
}

// The model from the configs, its vocabulary the checkpoint's (already padded) embedding rows.
static int describe_model(importer *im, const char *const *configs, int nconfigs, neox_error *err) {
    // The run's world (data x tensor x pipeline ranks, as the files count them): the stored config then
    // reloads as it is (neox-convert's other commands derive it with that world).
    int world = (im->src.dp > 0 ? im->src.dp : 1) * im->src.tp * im->src.pp;
    neox_config_options opts = {.world_size = world, .quiet = 1};
    im->cfg = neox_config_load(configs, nconfigs, &opts, err);
    if (!im->cfg) return -1;
    int64_t stages = neox_config_int(im->cfg, pipe_parallel_size);  // (0: GPT-NeoX without its PipelineModule)
    if ((stages > 1 ? stages : 1) != im->src.pp)
        return neox_fail(err, NEOX_EXIT_USAGE, "pipe_parallel_size: the configs say %lld, %s was written by %d pipeline "
                         "stages", (long long)stages, im->src.dir, im->src.pp);
    if (neox_config_int(im->cfg, model_parallel_size) != im->src.tp)
        return neox_fail(err, NEOX_EXIT_USAGE, "model_parallel_size: the configs say %lld, %s was written by %d "
                         "tensor-parallel ranks", (long long)neox_config_int(im->cfg, model_parallel_size), im->src.dir,
                         im->src.tp);
    im->desc.vocab_size = 0;
    if (each_weight(im, count_vocab, err) != 0) return -1;
    int64_t vocab = im->desc.vocab_size;
    if (vocab <= 0) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: no word_embeddings.weight in layer 0", im->src.dir);
    if (neox_model_desc_from_config(&im->desc, im->cfg, vocab, err) != 0) return -1;
    im->llama = im->desc.naming != NEOX_NAMES_GPT_NEOX;
    if (im->llama && neox_source_check_llama(&im->desc, im->src.tp, err) != 0) return -1;
    if (im->desc.vocab_size != vocab)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s: the embedding has %lld rows, the configs pad the vocabulary to %lld",
                         im->src.dir, (long long)vocab, (long long)im->desc.vocab_size);
    im->tied = im->desc.tied;
    im->params = neox_cvt_params(&im->desc, &im->nparams);
    plan_tensors(im);
    im->weights = neox_calloc((size_t)im->ntensors * (size_t)im->src.tp, sizeof *im->weights);
    for (int k = 0; k < im->nlayer_files; k++) neox_pt_close(im->layer_files[k]);
    im->nlayer_files = 0;
    return 0;
}

static void importer_free(importer *im) {
    for (int s = 0; s < 3; s++) {
        free(im->tied_copy[s]);
        for (int k = 0; im->opt[s] && k < im->ntensors * im->src.tp; k++) free(im->opt[s][k]);
        free(im->opt[s]);
    }
    for (int k = 0; k < im->nlayer_files; k++) neox_pt_close(im->layer_files[k]);
    free(im->layer_files);
    free(im->weights);
    free(im->params);
    free(im->tensors);
    if (im->cfg) neox_config_free(im->cfg);
    neox_source_close(&im->src);
}

int neox_convert_from_neox(const char *input, const char *const *configs, int nconfigs, const char *out_save,
                           const neox_cvt_layout *lay, neox_error *err) {
    importer im = {0};
    int rc = neox_source_open(&im.src, input, err);
    if (rc == 0) rc = describe_model(&im, configs, nconfigs, err);
    if (rc == 0) rc = each_weight(&im, place_weight, err);
    if (rc == 0) rc = check_weights(&im, err);
    if (rc == 0) rc = read_optimizer(&im, err);
    if (rc == 0) notice_rng_state(&im);
    if (rc == 0) rc = neox_cvt_layout_check(&im.desc, lay, err);
    char *tmp = rc == 0 ? neox_cvt_outdir_begin(out_save, err) : NULL;
    if (rc == 0 && !tmp) rc = -1;
    if (rc == 0) rc = write_checkpoint(&im, tmp, configs, nconfigs, lay, err);
    if (rc == 0) rc = neox_cvt_outdir_commit(tmp, out_save, err);
    else if (tmp) neox_cvt_outdir_abort(tmp);
    free(tmp);
    importer_free(&im);
    return rc;
}
