// to_hf.c: a training checkpoint as a Hugging Face model folder (a reward model's as
// ...ForSequenceClassification with its value head score.weight) — config.json,
// generation_config.json, the tokenizer files the config names, and the parameters (already under
// their Hugging Face names, docs/design.md, decision 2) as model.safetensors, or as numbered shards plus
// model.safetensors.index.json when they exceed the shard size. Parameters are cast to fp32, bf16
// or fp16 (round to nearest even). Memory: one tensor at a time.
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "convert_internal.h"
#include "kernels/kernels.h"
#include "safetensors.h"
#include "tokenizer.h"

int neox_cvt_write_text(const char *dir, const char *name, const char *text, neox_error *err) {
    char *path = neox_asprintf("%s/%s", dir, name);
    int rc = neox_atomic_write(path, text, strlen(text), err);
    free(path);
    return rc;
}

int neox_cvt_copy_file(const char *src, const char *dir, const char *name, neox_error *err) {
    size_t size;
    char *data = neox_read_file(src, &size, err);
    if (!data) return -1;
    char *path = neox_asprintf("%s/%s", dir, name);
    int rc = neox_atomic_write(path, data, size, err);
    free(path);
    free(data);
    return rc;
}

// ---- dtype casts --------------------------------------------------------------------------------
static void cast(const float *src, size_t n, const char *dtype, void *dst) {
    if (!strcmp(dtype, "F32")) memcpy(dst, src, n * sizeof(float));
    else if (!strcmp(dtype, "BF16"))
        neox_cast_f32_to_bf16(dst, src, n);
    else
        neox_cast_f32_to_f16(dst, src, n);
}

static const char *st_dtype(const char *dtype) {
    return !strcmp(dtype, "fp32") ? "F32" : !strcmp(dtype, "bf16") ? "BF16" : !strcmp(dtype, "fp16") ? "F16" : NULL;
}

// ---- tokenizer files ------------------------------------------------------------------------------
// The files beside a tokenizer that describe it to transformers (special tokens, chat template,
// generation defaults), as from-hf copies them from a Hugging Face folder: carried as they are.
static int copy_if_beside(const char *file, const char *name, const char *dir, int *copied, neox_error *err) {
    char *src = neox_path_beside(file, name);
    struct stat st;
    *copied = stat(src, &st) == 0;
    int rc = *copied ? neox_cvt_copy_file(src, dir, name, err) : 0;
    free(src);
    return rc;
}

// tokenizer_config.json and special_tokens_map.json for a tokenizer without its own, so that
// transformers' AutoTokenizer loads the folder as neox.c tokenizes: without them it picks
// GPTNeoXTokenizerFast from config.json, which cannot read vocab.json + merges.txt and forces
// add_prefix_space off whatever tokenizer.json says. The tokenizer.json is then taken as it is
// (PreTrainedTokenizerFast), GPT-2 files by GPT2TokenizerFast; the end-of-document token is bos, eos
// and unk, as in GPT-NeoX's own exports.
static int tokenizer_config_files(const neox_tokenizer *tok, const char *dir, int64_t max_length, neox_error *err) {
    const char *eod = neox_tokenizer_id_to_token(tok, neox_tokenizer_eod_id(tok));
    int hf_json = !strcmp(neox_tokenizer_type(tok), "HFTokenizer");
    json_t *special = json_pack("{s:s, s:s, s:s}", "bos_token", eod, "eos_token", eod, "unk_token", eod);
    json_t *config = json_pack("{s:s, s:b, s:I, s:b}", "tokenizer_class",
                               hf_json ? "PreTrainedTokenizerFast" : "GPT2TokenizerFast", "add_prefix_space",
                               neox_tokenizer_adds_prefix_space(tok), "model_max_length", (json_int_t)max_length,
                               "clean_up_tokenization_spaces", 0);
    json_object_update(config, special);
    char *config_text = json_dumps(config, JSON_INDENT(2)), *special_text = json_dumps(special, JSON_INDENT(2));
    int rc = neox_cvt_write_text(dir, "tokenizer_config.json", config_text, err);
    if (rc == 0) rc = neox_cvt_write_text(dir, "special_tokens_map.json", special_text, err);
    free(config_text);
    free(special_text);
    json_decref(config);
    json_decref(special);
    return rc;
}

// The tokenizer files the config names, copied as they are.
static int copy_named_files(const char *type, const char *vocab, const char *merges, const char *dir, neox_error *err) {
    int hf_json = !strcmp(type, "HFTokenizer"), rc = 0;
    if (vocab) rc = neox_cvt_copy_file(vocab, dir, hf_json ? "tokenizer.json" : "vocab.json", err);
    if (rc == 0 && !hf_json && merges) rc = neox_cvt_copy_file(merges, dir, "merges.txt", err);
    return rc;
}

// The special tokens the tokenizer declares (its folder's tokenizer_config.json), else its end of
// document as bos and eos.
static neox_cvt_token_ids token_ids_of(const neox_tokenizer *tok) {
    int eod = neox_tokenizer_eod_id(tok), bos = neox_tokenizer_declared_id(tok, NEOX_SPECIAL_BOS),
        eos = neox_tokenizer_declared_id(tok, NEOX_SPECIAL_EOS);
    return (neox_cvt_token_ids){bos >= 0 ? bos : eod, eos >= 0 ? eos : eod, neox_tokenizer_declared_id(tok, NEOX_SPECIAL_PAD)};
}

// Copies the tokenizer's files with transformers' configuration of them and gives the token ids
// config.json declares. A tokenizer that cannot be read here still has its files copied (the
// weights are what an export must not lose), without token ids.
static int tokenizer_files(const neox_cvt_ckpt *c, const char *dir, neox_cvt_token_ids *ids, neox_error *err) {
    *ids = (neox_cvt_token_ids){-1, -1, -1};
    const char *type = neox_config_str(c->cfg, tokenizer_type);
    const char *vocab = neox_config_str(c->cfg, vocab_file), *merges = neox_config_str(c->cfg, merge_file);
    struct stat st;
    if (!vocab && strcmp(type, "CharLevelTokenizer") != 0) {
        neox_warn("the config names no tokenizer file (vocab_file): no tokenizer files and token ids in the export");
        return 0;
    }
    if (vocab && stat(vocab, &st) != 0) {
        neox_warn("the config's vocab_file %s is not readable here (%s): no tokenizer files in the export", vocab, strerror(errno));
        return 0;
    }
    if (merges && stat(merges, &st) != 0) {
        neox_warn("the config's merge_file %s is not readable here (%s): no tokenizer files in the export", merges, strerror(errno));
        return 0;
    }
    neox_tokenizer_options to = {type, vocab, merges};
    neox_error tok_err = {0};
    neox_tokenizer *tok = neox_tokenizer_load(&to, &tok_err);
    if (!tok) neox_warn("the checkpoint's tokenizer cannot be read here (%s): its files are copied as they are, and "
                        "config.json declares no token ids", tok_err.message);
    else *ids = token_ids_of(tok);
    int rc = copy_named_files(type, vocab, merges, dir, err), own = 0, copied = 0;
    if (rc == 0 && vocab) rc = copy_if_beside(vocab, "tokenizer_config.json", dir, &own, err);
    if (rc == 0 && vocab && own) rc = copy_if_beside(vocab, "special_tokens_map.json", dir, &copied, err);
    if (rc == 0 && vocab && !own && tok) rc = tokenizer_config_files(tok, dir, c->desc.max_positions, err);
    neox_tokenizer_free(tok);
    return rc;
}

// ---- the parameters ------------------------------------------------------------------------------
static int64_t numel(const neox_cvt_param *p) { return p->shape[0] * (p->ndim == 2 ? p->shape[1] : 1); }

static int check_shapes(const neox_cvt_ckpt *c, const neox_cvt_param *ps, int n, neox_error *err) {
    for (int i = 0; i < n; i++) {
        char name[128];
        snprintf(name, sizeof name, "params/%s", ps[i].name);
        int ndim;
        int64_t shape[NEOX_CKPT_MAX_DIMS];
        if (neox_ckpt_tensor_shape(c->reader, name, &ndim, shape, err) != 0) return neox_fail_context(err, "%s", c->dir);
        if (ndim != ps[i].ndim || shape[0] != ps[i].shape[0] || (ndim == 2 && shape[1] != ps[i].shape[1]))
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s: tensor %s has a shape other than the stored config's model gives",
                             c->dir, name);
    }
    return 0;
}

// Writes params [first, last) as one safetensors file, streamed one tensor at a time through
// buffers kept across tensors (the largest tensor's size).
typedef struct tensor_buffers {
    float *f32;
    void *cast;
    size_t cap;  // elements
} tensor_buffers;

static int write_shard(const neox_cvt_ckpt *c, const neox_cvt_param *ps, int first, int last, const char *dtype,
                       const char *path, tensor_buffers *buf, neox_progress *bar, double *done, neox_error *err) {
    int n = last - first;
    neox_st_entry *e = neox_calloc((size_t)n, sizeof *e);
    for (int i = 0; i < n; i++)
        e[i] = (neox_st_entry){.name = ps[first + i].name, .dtype = dtype, .ndim = ps[first + i].ndim,
                               .shape = {ps[first + i].shape[0], ps[first + i].shape[1]}};
    neox_st_writer *w = neox_st_writer_open(path, e, n, "{\"format\": \"pt\"}", err);
    free(e);
    if (!w) return -1;
    size_t esize = neox_st_dtype_size(dtype);
    int rc = 0;
    for (int i = first; i < last && rc == 0; i++) {
        size_t count = (size_t)numel(&ps[i]);
        if (esize != 4 && count > buf->cap) {
            free(buf->f32);
            free(buf->cast);
            buf->f32 = neox_malloc(count * sizeof(float));
            buf->cast = neox_malloc(count * esize);
            buf->cap = count;
        }
        char name[128];
        snprintf(name, sizeof name, "params/%s", ps[i].name);
        if (esize == 4) {  // the checkpoint's own bytes: copied file to file
            int fd;
            int64_t at;
            rc = neox_st_writer_reserve(w, count * esize, &fd, &at, err);
            if (rc == 0) rc = neox_ckpt_copy_range_to_fd(c->reader, name, 0, (int64_t)count, fd, at, err);
            if (rc == 0) neox_st_writer_written(w);
        } else {
            rc = neox_ckpt_read_range(c->reader, name, 0, (int64_t)count, buf->f32, err);
            if (rc == 0) cast(buf->f32, count, dtype, buf->cast);
            if (rc == 0) rc = neox_st_writer_put(w, buf->cast, count * esize, err);
        }
        *done += (double)(count * esize);
        neox_progress_update(bar, *done, NULL);
    }
    if (rc == 0) return neox_st_writer_commit(w, err);
    if (!strncmp(err->message, "cannot write", 12)) neox_fail_context(err, "%s", path);  // name the output
    neox_st_writer_abort(w);
    return -1;
}

static int write_weights(const neox_cvt_ckpt *c, const char *dir, const char *dtype, uint64_t max_bytes, neox_error *err) {
    int n;
    neox_cvt_param *ps = neox_cvt_params(&c->desc, &n);
    int rc = check_shapes(c, ps, n, err);
    size_t esize = neox_st_dtype_size(st_dtype(dtype));
    // Shards: consecutive parameters while they fit (a parameter larger than the limit goes alone).
    int *start = neox_calloc((size_t)n + 1, sizeof *start), nshards = 0;
    uint64_t in_shard = 0, total = 0;
    for (int i = 0; i < n; i++) {
        uint64_t bytes = (uint64_t)numel(&ps[i]) * esize;
        if (i == 0 || (in_shard > 0 && in_shard + bytes > max_bytes)) start[nshards++] = i, in_shard = 0;
        in_shard += bytes;
        total += bytes;
    }
    start[nshards] = n;
    neox_progress *bar = neox_progress_start("to-hf", (double)total, "B");
    double done = 0;
    tensor_buffers buf = {0};
    json_t *weight_map = json_object();
    for (int s = 0; s < nshards && rc == 0; s++) {
        char *file = nshards == 1 ? neox_strdup("model.safetensors")
                                  : neox_asprintf("model-%05d-of-%05d.safetensors", s + 1, nshards);
        char *path = neox_asprintf("%s/%s", dir, file);
        rc = write_shard(c, ps, start[s], start[s + 1], st_dtype(dtype), path, &buf, bar, &done, err);
        for (int i = start[s]; i < start[s + 1]; i++) json_object_set_new(weight_map, ps[i].name, json_string(file));
        free(path);
        free(file);
    }
    neox_progress_finish(bar, done, NULL);
    free(buf.f32);
    free(buf.cast);
    if (rc == 0 && nshards > 1) {
        json_t *index = json_pack("{s:{s:I}, s:O}", "metadata", "total_size", (json_int_t)total, "weight_map", weight_map);
        char *text = json_dumps(index, JSON_INDENT(2) | JSON_SORT_KEYS);
        rc = neox_cvt_write_text(dir, "model.safetensors.index.json", text, err);
        free(text);
        json_decref(index);
    }
    json_decref(weight_map);
    free(start);
    free(ps);
    return rc;
}

static int export_into(const neox_cvt_ckpt *c, const char *dir, const neox_to_hf_options *o, neox_error *err) {
    neox_cvt_token_ids ids;
    if (tokenizer_files(c, dir, &ids, err) != 0) return -1;
    if (o->pad_token_id >= 0) ids.pad = (int)o->pad_token_id;
    if (c->desc.value_head && ids.pad < 0)
        neox_warn("a reward model without a pad token: its ...ForSequenceClassification scores batches of one sequence "
                  "only (give --pad-token-id)");
    char *config = neox_cvt_hf_config_json(&c->desc, o->dtype, ids, err);
    if (!config) return -1;
    int rc = neox_cvt_write_text(dir, "config.json", config, err);
    free(config);
    // The model's own generation defaults when it came with them (from-hf keeps them beside its
    // tokenizer), else the declared tokens'.
    const char *vocab = neox_config_str(c->cfg, vocab_file);
    int copied = 0;
    if (rc == 0 && vocab) rc = copy_if_beside(vocab, "generation_config.json", dir, &copied, err);
    char *gen = neox_cvt_generation_config_json(ids);
    if (rc == 0 && !copied) rc = neox_cvt_write_text(dir, "generation_config.json", gen, err);
    free(gen);
    if (rc == 0) rc = write_weights(c, dir, st_dtype(o->dtype) ? o->dtype : "fp32", o->max_shard_bytes, err);
    return rc;
}

int neox_convert_to_hf(const char *ckpt, const char *out_dir, const neox_to_hf_options *opts, neox_error *err) {
    neox_to_hf_options o = opts ? *opts : (neox_to_hf_options){0};
    if (!o.dtype) o.dtype = "fp32";
    if (!st_dtype(o.dtype)) return neox_fail(err, NEOX_EXIT_USAGE, "--dtype '%s': use fp32, bf16 or fp16", o.dtype);
    if (!o.max_shard_bytes) o.max_shard_bytes = NEOX_HF_SHARD_BYTES;
    neox_cvt_ckpt c;
    if (neox_cvt_open(&c, ckpt, err) != 0) return -1;
    if (o.pad_token_id >= c.desc.vocab_size) {
        neox_cvt_close(&c);
        return neox_fail(err, NEOX_EXIT_USAGE, "--pad-token-id %lld is outside the model's vocabulary (%d tokens)",
                         o.pad_token_id, c.desc.vocab_size);
    }
    char *tmp = neox_cvt_outdir_begin(out_dir, err);
    int rc = tmp ? export_into(&c, tmp, &o, err) : -1;
    if (rc == 0) rc = neox_cvt_outdir_commit(tmp, out_dir, err);
    else neox_cvt_outdir_abort(tmp);
    free(tmp);
    neox_cvt_close(&c);
    return rc;
}
