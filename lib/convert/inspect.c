// inspect.c and verify: what a checkpoint holds, and whether it is sound. inspect prints the layout,
// the run state, a model summary and every tensor (shape, dtype, L2 norm and the CRC-32 of its fp32
// bytes, so two checkpoints can be compared bit for bit whatever their layouts); verify checks every
// file against the manifest (size, CRC-32), that the shards index, that the stored config gives a
// model whose every parameter and optimizer tensor is present with its shape and fully covered,
// that nothing unexpected is stored, and that the run state agrees with the manifest.
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "convert_internal.h"
#include "optim.h"

static const char *norm_name(neox_norm_kind k) {
    return k == NEOX_NORM_RMSNORM         ? "rmsnorm"
           : k == NEOX_NORM_SCALENORM      ? "scalenorm"
           : k == NEOX_NORM_NONPARAMETRIC ? "non_parametric_layernorm"
                                           : "layernorm";
}
static const char *act_name(neox_activation a) {
    return a == NEOX_ACT_GELU_TANH ? "gelu (tanh)" : a == NEOX_ACT_GEGLU_TANH ? "geglu (tanh)"
           : a == NEOX_ACT_GELU_ONNX ? "gelu (onnx_safe)" : neox_activation_name(a);
}
static const char *pos_name(neox_pos_kind p) {
    return p == NEOX_POS_ROTARY ? "rotary" : p == NEOX_POS_LEARNED ? "learned" : p == NEOX_POS_ALIBI ? "alibi" : "none";
}

// Whether the checkpoint holds any tensor of group (its name followed by '/').
static int holds_group(const neox_cvt_ckpt *c, const char *group) {
    size_t len = strlen(group);
    for (int i = 0; i < neox_ckpt_tensor_count(c->reader); i++) {
        const char *name = neox_ckpt_tensor_name(c->reader, i);
        if (!strncmp(name, group, len) && name[len] == '/') return 1;
    }
    return 0;
}

// The optimizer state groups the run state names, as long as the parameters: those of its type the
// checkpoint holds (SM3 keeps its momentum only with a momentum).
int neox_cvt_optimizer_groups(const neox_cvt_ckpt *c, const char **groups) {
    const neox_optimizer_type *type =
        neox_optimizer_type_named(json_string_value(json_object_get((json_t *)c->state, "optimizer")));
    int n = 0;
    for (int i = 0; type && i < type->nstate; i++)
        if (holds_group(c, type->state_names[i])) groups[n++] = type->state_names[i];
    return n;
}

static int64_t state_int(const neox_cvt_ckpt *c, const char *key) {
    return (int64_t)json_integer_value(json_object_get((json_t *)c->state, key));
}

static void print_summary(const neox_cvt_ckpt *c, FILE *out) {
    const neox_ckpt_manifest *m = &c->manifest;
    const neox_model_desc *d = &c->desc;
    fprintf(out, "checkpoint: %s\n", c->dir);
    fprintf(out, "layout: world %d = pipe %d x data %d x model %d, zero stage %d, %d files\n", m->world_size, m->pipe_size,
            m->data_size, m->model_size, m->zero_stage, m->nfiles);
    // The data position counts global micro-batches (micro-batch x data-parallel ranks samples each).
    int64_t seq = neox_config_has(c->cfg, seq_length) ? neox_config_int(c->cfg, seq_length) : 0;
    int64_t per_batch = neox_config_int(c->cfg, train_batch_size) / neox_config_int(c->cfg, gradient_accumulation_steps);
    int64_t samples = state_int(c, "train_position") * per_batch;
    fprintf(out, "iteration: %lld, optimizer steps: %lld\n", (long long)state_int(c, "iteration"),
            (long long)state_int(c, "optimizer_steps"));
    fprintf(out, "samples seen: %lld, tokens seen: %lld\n", (long long)samples, (long long)(samples * seq));
    const char *opt = json_string_value(json_object_get((json_t *)c->state, "optimizer"));
    fprintf(out, "optimizer: %s\n", opt ? opt : "none");
    fprintf(out, "model: %s names, %d layers, hidden %d, heads %d (kv %d), head size %d, MLP %d, vocab %d (padded), "
            "max positions %d\n", d->naming == NEOX_NAMES_GPT_NEOX ? "GPTNeoXForCausalLM" : "LlamaForCausalLM",
            d->num_layers, d->hidden_size, d->num_heads, d->num_kv_heads, d->head_size, d->ffn_size, d->vocab_size,
            d->max_positions);
    fprintf(out, "features: %s eps %g, %s positions (rotary dims %d, base %g), %s residual, %s, attn bias %d, "
            "mlp bias %d, %s embeddings\n", norm_name(d->norm), d->norm_eps, pos_name(d->pos_emb), d->rotary_dims,
            d->rotary_base, d->parallel_residual ? "parallel" : "sequential", act_name(d->activation), d->attn_bias,
            d->mlp_bias, d->tied ? "tied" : "untied");
}

// Reads a whole tensor; its L2 norm and the CRC-32 of its bytes.
static int tensor_stats(const neox_ckpt_reader *r, const char *name, double *norm, uint32_t *crc, int *finite,
                        neox_error *err) {
    int ndim;
    int64_t shape[NEOX_CKPT_MAX_DIMS], n = 1;
    if (neox_ckpt_tensor_shape(r, name, &ndim, shape, err) != 0) return -1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    float *buf = neox_malloc((size_t)(n ? n : 1) * sizeof(float));
    if (neox_ckpt_read_range(r, name, 0, n, buf, err) != 0) {
        free(buf);
        return -1;
    }
    double sum = 0;
    *finite = 1;
    for (int64_t i = 0; i < n; i++) {
        sum += (double)buf[i] * buf[i];
        if (!isfinite(buf[i])) *finite = 0;
    }
    *norm = sqrt(sum);
    *crc = (uint32_t)crc32(crc32(0L, Z_NULL, 0), (const Bytef *)buf, (uInt)((size_t)n * sizeof(float)));
    free(buf);
    return 0;
}

int neox_convert_inspect(const char *ckpt, FILE *out, neox_error *err) {
    neox_cvt_ckpt c;
    if (neox_cvt_open(&c, ckpt, err) != 0) return -1;
    print_summary(&c, out);
    fprintf(out, "tensors:\n");
    int rc = 0;
    for (int i = 0; i < neox_ckpt_tensor_count(c.reader) && rc == 0; i++) {
        const char *name = neox_ckpt_tensor_name(c.reader, i);
        int ndim;
        int64_t shape[NEOX_CKPT_MAX_DIMS];
        neox_error ignored = {0};
        if (neox_ckpt_tensor_shape(c.reader, name, &ndim, shape, &ignored) != 0) {  // a byte string
            void *data;
            size_t size;
            rc = neox_ckpt_read_bytes(c.reader, name, &data, &size, err);
            if (rc == 0) fprintf(out, "  %-60s bytes %zu\n", name, size);
            if (rc == 0) free(data);
            continue;
        }
        char dims[128] = "";
        for (int d = 0; d < ndim; d++)
            snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%s%lld", d ? "x" : "", (long long)shape[d]);
        double norm;
        uint32_t crc;
        int finite;
        rc = tensor_stats(c.reader, name, &norm, &crc, &finite, err);
        if (rc == 0) fprintf(out, "  %-60s %-12s float32 norm %.9g crc32 %08x\n", name, dims, norm, crc);
    }
    if (rc != 0) neox_fail_context(err, "%s", c.dir);
    neox_cvt_close(&c);
    return rc;
}

// ---- verify ---------------------------------------------------------------------------------------
static const neox_optimizer_type *optimizer_type(const neox_cvt_ckpt *c) {
    return neox_optimizer_type_named(json_string_value(json_object_get((json_t *)c->state, "optimizer")));
}

// SM3's accumulators: per parameter, one per row (a vector: per element) and a matrix's one per
// column, present, fully covered and finite.
static int verify_accumulators(const neox_cvt_ckpt *c, const neox_cvt_param *ps, int n, FILE *out, neox_error *err) {
    const neox_optimizer_type *type = optimizer_type(c);
    if (!type || !type->per_tensor) return 0;
    int rc = 0, checked = 0;
    for (int i = 0; i < n && rc == 0; i++)
        for (int dim = 0; dim < ps[i].ndim && rc == 0; dim++, checked++) {
            char name[160];
            snprintf(name, sizeof name, "%s/%s", type->accumulator_names[dim], ps[i].name);
            int ndim, finite;
            int64_t shape[NEOX_CKPT_MAX_DIMS];
            double norm;
            uint32_t crc;
            if (!neox_ckpt_has(c->reader, name)) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: tensor %s is missing", c->dir, name);
            rc = neox_ckpt_tensor_shape(c->reader, name, &ndim, shape, err);
            if (rc == 0 && (ndim != 1 || shape[0] != ps[i].shape[dim]))
                rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: tensor %s is not one float per %s of %s", c->dir, name,
                               dim ? "column" : "row", ps[i].name);
            if (rc == 0) rc = tensor_stats(c->reader, name, &norm, &crc, &finite, err);
            if (rc == 0 && !finite) rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: tensor %s holds NaN or Inf", c->dir, name);
        }
    if (rc == 0) fprintf(out, "ok: %d %s accumulators present, one per row and column, fully covered and finite\n", checked,
                         type->name);
    return rc;
}

static int is_expected(const char *name, const neox_cvt_param *ps, int n, const char **groups, int ngroups) {
    if (!strncmp(name, "state/", 6) || !strncmp(name, "config/", 7)) return 1;
    const char *slash = strrchr(name, '/');
    if (!slash) return 0;
    size_t glen = (size_t)(slash - name);
    int group_ok = glen == 6 && !strncmp(name, "params", 6);
    for (int g = 0; g < ngroups; g++) group_ok |= strlen(groups[g]) == glen && !strncmp(name, groups[g], glen);
    if (!group_ok) return 0;
    for (int i = 0; i < n; i++)
        if (!strcmp(ps[i].name, slash + 1)) return 1;
    return 0;
}

static int verify_tensors(const neox_cvt_ckpt *c, FILE *out, neox_error *err) {
    int n;
    neox_cvt_param *ps = neox_cvt_params(&c->desc, &n);
    const char *groups[1 + NEOX_OPTIMIZER_MAX_STATE + 2] = {"params"};  // (+ 2: SM3's accumulators, below)
    int ngroups = 1 + neox_cvt_optimizer_groups(c, groups + 1), rc = 0, checked = 0;
    for (int g = 0; g < ngroups && rc == 0; g++) {
        for (int i = 0; i < n && rc == 0; i++) {
            char name[160];
            snprintf(name, sizeof name, "%s/%s", groups[g], ps[i].name);
            int ndim;
            int64_t shape[NEOX_CKPT_MAX_DIMS];
            if (!neox_ckpt_has(c->reader, name)) {
                rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: tensor %s is missing", c->dir, name);
                break;
            }
            rc = neox_ckpt_tensor_shape(c->reader, name, &ndim, shape, err);
            if (rc == 0 && (ndim != ps[i].ndim || shape[0] != ps[i].shape[0] || (ndim == 2 && shape[1] != ps[i].shape[1])))
                rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: tensor %s has another shape than the stored config's model",
                               c->dir, name);
            double norm;
            uint32_t crc;
            int finite;
            if (rc == 0) rc = tensor_stats(c->reader, name, &norm, &crc, &finite, err);
            if (rc == 0 && !finite) rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: tensor %s holds NaN or Inf", c->dir, name);
            checked++;
        }
    }
    if (rc == 0) fprintf(out, "ok: %d tensors present, of the model's shapes, fully covered and finite\n", checked);
    if (rc == 0) rc = verify_accumulators(c, ps, n, out, err);
    const neox_optimizer_type *type = optimizer_type(c);
    for (int k = 0; k < 2 && type && type->per_tensor; k++) groups[ngroups++] = type->accumulator_names[k];
    for (int i = 0; i < neox_ckpt_tensor_count(c->reader) && rc == 0; i++) {
        const char *name = neox_ckpt_tensor_name(c->reader, i);
        if (!is_expected(name, ps, n, groups, ngroups))
            rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: unexpected entry %s (not a parameter or optimizer tensor of the "
                           "stored config's model)", c->dir, name);
    }
    if (rc == 0) fprintf(out, "ok: no unexpected entries\n");
    free(ps);
    return rc;
}

int neox_convert_verify(const char *ckpt, FILE *out, neox_error *err) {
    // Opening checks every file against the manifest first: a damaged file is reported as such,
    // before anything is read from it.
    neox_cvt_ckpt c;
    if (neox_cvt_open(&c, ckpt, err) != 0) return -1;
    fprintf(out, "ok: %d files match manifest.json (sizes and CRC-32)\n", c.manifest.nfiles);
    int rc = 0;
    fprintf(out, "ok: manifest, shards, run state and stored config readable; model derived\n");
    if (state_int(&c, "iteration") != c.manifest.iteration)
        rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: state/train.json has iteration %lld but manifest.json %lld", c.dir,
                       (long long)state_int(&c, "iteration"), (long long)c.manifest.iteration);
    if (rc == 0) rc = verify_tensors(&c, out, err);
    if (rc == 0) fprintf(out, "checkpoint %s is sound\n", c.dir);
    neox_cvt_close(&c);
    return rc;
}
