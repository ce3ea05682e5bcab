// model_io.c: reading a model out of a training checkpoint, shared by neox-train (resume) and
// neox-eval (evaluation, generation). A checkpoint directory is opened through its manifest (every
// shard file of whatever layout wrote it), its run state is parsed, the model shape recorded there
// is compared with the config's model, and whole tensors are read into a buffer by intersection.
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "kernels/backend.h"

int neox_ckpt_model_shape(const neox_model_desc *d, neox_shape_field *f) {
    int n = 0;
    f[n++] = (neox_shape_field){"num_layers", d->num_layers};
    f[n++] = (neox_shape_field){"hidden_size", d->hidden_size};
    f[n++] = (neox_shape_field){"num_attention_heads", d->num_heads};
    f[n++] = (neox_shape_field){"num_kv_heads", d->num_kv_heads};
    f[n++] = (neox_shape_field){"intermediate_size", d->ffn_size};
    f[n++] = (neox_shape_field){"padded_vocab_size", d->vocab_size};
    f[n++] = (neox_shape_field){"norm", d->norm};
    f[n++] = (neox_shape_field){"pos_emb", d->pos_emb};
    f[n++] = (neox_shape_field){"activation", d->activation};
    f[n++] = (neox_shape_field){"use_bias_in_attn_linear", d->attn_bias};
    f[n++] = (neox_shape_field){"use_bias_in_mlp", d->mlp_bias};
    f[n++] = (neox_shape_field){"no_weight_tying", !d->tied};
    f[n++] = (neox_shape_field){"use_qk_layernorm", d->qk_norm};
    f[n++] = (neox_shape_field){"moe_num_experts", d->moe_experts > 1 ? d->moe_experts : 1};
    if (d->moe_experts > 1) {
        f[n++] = (neox_shape_field){"moe_expert_interval", d->moe_interval};
        f[n++] = (neox_shape_field){"moe_expert_width", d->moe_ffn_size};
    }
    if (d->pos_emb == NEOX_POS_LEARNED) f[n++] = (neox_shape_field){"max_position_embeddings", d->max_positions};
    // Only a reward model records it, so a language model's checkpoint can start one (its value
    // head then initialised; lib/train/checkpoint.c).
    if (d->value_head) f[n++] = (neox_shape_field){"value_head", 1};
    return n;
}

neox_ckpt_reader *neox_ckpt_open_checkpoint(const char *dir, neox_error *err) {
    neox_ckpt_manifest man;
    neox_ckpt_reader *r = neox_ckpt_open_dir(dir, &man, err);
    if (r) neox_ckpt_manifest_free(&man);
    return r;
}

json_t *neox_ckpt_model_shape_json(const neox_model_desc *d) {
    json_t *model = json_object();
    neox_shape_field f[NEOX_SHAPE_FIELDS];
    int n = neox_ckpt_model_shape(d, f);
    for (int i = 0; i < n; i++) json_object_set_new(model, f[i].name, json_integer(f[i].value));
    return model;
}

int neox_ckpt_check_model_shape(const neox_model_desc *d, json_t *state, const char *dir, int status, neox_error *err) {
    json_t *model = json_object_get(state, "model");
    if (!json_is_object(model)) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: state/train.json has no model shape", dir);
    neox_shape_field f[NEOX_SHAPE_FIELDS];
    int n = neox_ckpt_model_shape(d, f);
    for (int i = 0; i < n; i++) {
        json_t *v = json_object_get(model, f[i].name);
        if (v && json_integer_value(v) != f[i].value)
            return neox_fail(err, status,
                             "%s: the checkpoint's model has %s = %lld but the config gives %d; the model shape must match",
                             dir, f[i].name, (long long)json_integer_value(v), f[i].value);
    }
    if (json_integer_value(json_object_get(model, "value_head")) && !d->value_head)
        return neox_fail(err, status, "%s: the checkpoint holds a reward model (train_impl rm: a value head, score.weight, "
                         "in place of the output layer); a language model cannot be read from it", dir);
    return 0;
}

// neox_ckpt_read_model_range into host memory.
static int read_range_host(const neox_model *m, const neox_ckpt_reader *r, const char *group, size_t begin, size_t end,
                           float *dst, neox_error *err) {
    for (int i = 0; i < m->nparams; i++) {
        const neox_param *p = &m->params[i];
        size_t lo, hi;
        if (!neox_overlap(p->offset, p->offset + p->numel, begin, end, &lo, &hi)) continue;
        char name[160];
        snprintf(name, sizeof name, "%s/%s", group, p->name);
        int ndim;
        int64_t shape[NEOX_CKPT_MAX_DIMS];
        if (neox_ckpt_tensor_shape(r, name, &ndim, shape, err) != 0) return -1;
        int same = ndim == p->ndim;
        for (int d = 0; same && d < ndim; d++) same = shape[d] == p->global_shape[d];
        if (!same) return neox_fail(err, NEOX_EXIT_USAGE, "tensor %s: the checkpoint's shape differs from the config's model", name);
        neox_param_piece pieces[3];
        int n = neox_param_pieces(p, lo - p->offset, hi - p->offset, pieces);
        for (int k = 0; k < n; k++)
            if (neox_ckpt_read_block(r, name, pieces[k].offset, pieces[k].count, dst + (p->offset - begin) + pieces[k].start,
                                     err) != 0)
                return -1;
    }
    return 0;
}

// On a device, through a host copy of [begin, end) (pieces the checkpoint lacks keep their values).
int neox_ckpt_read_model_range(const neox_model *m, const neox_ckpt_reader *r, const char *group, size_t begin, size_t end,
                          float *dst, neox_error *err) {
    const neox_backend *be = m->be;
    if (!be->on_device) return read_range_host(m, r, group, begin, end, dst, err);
    size_t bytes = (end - begin) * sizeof(float);
    float *host = neox_malloc(bytes + sizeof(float));
    be->to_host(host, dst, bytes);
    int rc = read_range_host(m, r, group, begin, end, host, err);
    if (rc == 0) be->to_device(dst, host, bytes);
    free(host);
    return rc;
}

int neox_ckpt_read_model_tensors(const neox_model *m, const neox_ckpt_reader *r, const char *group, float *buf, neox_error *err) {
    return neox_ckpt_read_model_range(m, r, group, 0, m->num_floats, buf, err);
}

// model.padded_vocab_size of state/train.json, which sizes the model built to load the checkpoint:
// it must be the row count of the stored input embedding (a forged one would size the model).
static int stored_padded_vocab(const neox_ckpt_reader *r, json_t *state, const char *dir, int *vocab, neox_error *err) {
    json_t *v = json_object_get(json_object_get(state, "model"), "padded_vocab_size");
    if (!v) return 0;
    static const char *const embeddings[] = {"params/gpt_neox.embed_in.weight", "params/model.embed_tokens.weight"};
    int64_t rows = -1, shape[NEOX_CKPT_MAX_DIMS];
    int ndim;
    for (int i = 0; i < 2 && rows < 0; i++)
        if (neox_ckpt_has(r, embeddings[i]) && neox_ckpt_tensor_shape(r, embeddings[i], &ndim, shape, err) == 0 && ndim == 2)
            rows = shape[0];
    json_int_t value = json_integer_value(v);
    if (!json_is_integer(v) || value <= 0 || value > INT_MAX || (rows >= 0 && value != rows))
        return neox_fail(err, NEOX_EXIT_FAILURE,
                         "%s: state/train.json: model.padded_vocab_size is not a positive integer equal to the rows of the "
                         "stored input embedding (%lld)", dir, (long long)rows);
    *vocab = (int)value;
    return 0;
}

int neox_checkpoint_padded_vocab(const char *load_dir, int *vocab, neox_error *err) {
    int64_t iteration;
    int found;
    if (neox_ckpt_read_latest(load_dir, &iteration, &found, err) != 0) return -1;
    if (!found) return 0;
    char *dir = neox_ckpt_dir(load_dir, iteration);
    neox_ckpt_reader *r = neox_ckpt_open_checkpoint(dir, err);
    json_t *state = NULL;
    int rc = r ? neox_ckpt_read_run_state(r, dir, &state, err) : -1;
    if (rc == 0) rc = stored_padded_vocab(r, state, dir, vocab, err);
    if (rc != 0) neox_fail_context(err, "loading checkpoint %s", dir);
    json_decref(state);
    neox_ckpt_reader_close(r);
    free(dir);
    return rc;
}

static int load_params(neox_model *m, const char *dir, neox_error *err) {
    neox_ckpt_reader *r = neox_ckpt_open_checkpoint(dir, err);
    if (!r) return -1;
    json_t *state = NULL;
    int rc = neox_ckpt_read_run_state(r, dir, &state, err);
    if (rc == 0) rc = neox_ckpt_check_model_shape(&m->desc, state, dir, NEOX_EXIT_USAGE, err);
    if (rc == 0) rc = neox_ckpt_read_model_tensors(m, r, "params", m->param_buf, err);
    neox_model_weights_changed(m);
    json_decref(state);
    neox_ckpt_reader_close(r);
    return rc;
}

int neox_load_model_params(neox_model *m, const char *load_dir, int64_t iteration, int64_t *loaded, neox_error *err) {
    if (iteration <= 0) {
        int found;
        if (neox_ckpt_read_latest(load_dir, &iteration, &found, err) != 0) return -1;
        if (!found) return neox_fail(err, NEOX_EXIT_FAILURE, "load: no checkpoint in %s (no 'latest' file)", load_dir);
    }
    char *dir = neox_ckpt_dir(load_dir, iteration);
    int rc = load_params(m, dir, err);
    if (rc == 0) rc = neox_model_check_finite(m, "the checkpoint's weights", err);
    if (rc != 0) neox_fail_context(err, "loading checkpoint %s", dir);
    free(dir);
    if (rc == 0 && loaded) *loaded = iteration;
    return rc;
}
