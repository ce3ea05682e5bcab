// open.c: opening a training checkpoint for conversion — the manifest, a reader over every shard,
// the run state, and the model rebuilt from the config files the checkpoint stores
// (config/input/K-NAME, loaded as the trainer loaded them) with the vocabulary size it recorded.
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "convert_internal.h"

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

// PATH itself when it holds manifest.json, else the checkpoint its `latest` names.
char *neox_cvt_resolve(const char *path, neox_error *err) {
    char *manifest = neox_asprintf("%s/manifest.json", path);
    int direct = is_file(manifest);
    free(manifest);
    if (direct) return neox_strdup(path);
    char *latest = neox_asprintf("%s/latest", path);
    int has_latest = is_file(latest);
    free(latest);
    if (!has_latest) {
        neox_fail(err, NEOX_EXIT_FAILURE, "%s: not a checkpoint (no manifest.json) nor a save directory (no 'latest'); "
                  "an incomplete checkpoint has no manifest", path);
        return NULL;
    }
    int64_t iteration;
    int found;
    if (neox_ckpt_read_latest(path, &iteration, &found, err) != 0) return NULL;
    return neox_ckpt_dir(path, iteration);
}

static int read_json(const neox_ckpt_reader *r, const char *dir, const char *name, json_t **out, neox_error *err) {
    void *data;
    size_t size;
    if (neox_ckpt_read_bytes(r, name, &data, &size, err) != 0) return neox_fail_context(err, "%s", dir);
    json_error_t jerr;
    *out = json_loadb(data, size, 0, &jerr);
    free(data);
    if (!*out || !json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s: %s", dir, name, jerr.text[0] ? jerr.text : "not a JSON object");
    }
    return 0;
}

// The world size the config was loaded with (global_num_gpus in config/effective.json).
static int config_world_size(const neox_ckpt_reader *r, const char *dir, int *world, neox_error *err) {
    json_t *eff;
    if (read_json(r, dir, "config/effective.json", &eff, err) != 0) return -1;
    json_t *v = json_object_get(json_object_get(eff, "global_num_gpus"), "value");
    *world = json_is_integer(v) ? (int)json_integer_value(v) : 1;
    json_decref(eff);
    if (*world < 1) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: config/effective.json: global_num_gpus is not positive", dir);
    return 0;
}

// Writes the stored config files into a temporary directory and loads them in their order.
static neox_config *load_stored_config(const neox_ckpt_reader *r, const char *dir, json_t *state, neox_error *err) {
    json_t *files = json_object_get(state, "config_files");
    if (!json_is_array(files) || json_array_size(files) == 0) {
        neox_fail(err, NEOX_EXIT_FAILURE, "%s: state/train.json: config_files is missing or empty", dir);
        return NULL;
    }
    int world;
    if (config_world_size(r, dir, &world, err) != 0) return NULL;
    char *tmpl = neox_scratch_dir_create("neox-convert-config", err);
    if (!tmpl) return NULL;
    neox_cleanup_register(tmpl);  // removed (once emptied) should the tool be stopped meanwhile
    size_t n = json_array_size(files);
    char **paths = neox_calloc(n, sizeof *paths);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const char *name = json_string_value(json_array_get(files, i));
        const char *base = name ? strrchr(name, '/') : NULL;
        if (!name || !base) {
            rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: state/train.json: config_files[%zu] is not a stored file name", dir, i);
            break;
        }
        void *data;
        size_t size;
        if (neox_ckpt_read_bytes(r, name, &data, &size, err) != 0) {
            rc = neox_fail_context(err, "%s", dir);
            break;
        }
        paths[i] = neox_asprintf("%s/%s", tmpl, base + 1);
        rc = neox_atomic_write(paths[i], data, size, err);
        neox_cleanup_register(paths[i]);
        free(data);
    }
    neox_config *cfg = NULL;
    if (rc == 0) {
        neox_config_options opts = {.world_size = world, .quiet = 1};
        cfg = neox_config_load((const char *const *)paths, (int)n, &opts, err);
        if (!cfg) neox_fail_context(err, "%s: the stored config", dir);
    }
    for (size_t i = 0; i < n; i++) {
        if (paths[i]) unlink(paths[i]), neox_cleanup_unregister(paths[i]);
        free(paths[i]);
    }
    free(paths);
    rmdir(tmpl);
    neox_cleanup_unregister(tmpl);
    free(tmpl);
    return cfg;
}

// The model of the stored config, with the vocabulary the checkpoint was trained with.
static int derive_model(neox_cvt_ckpt *c, neox_error *err) {
    json_t *model = json_object_get(c->state, "model");
    json_t *vocab = json_object_get(model, "padded_vocab_size");
    if (!json_is_integer(vocab))
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: state/train.json: model.padded_vocab_size is missing", c->dir);
    // The stored size is already padded (a multiple of the padding unit), so padding it again keeps it.
    if (neox_model_desc_from_config(&c->desc, c->cfg, json_integer_value(vocab), err) != 0)
        return neox_fail_context(err, "%s: the stored config", c->dir);
    if (c->desc.vocab_size != json_integer_value(vocab))
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: state/train.json: model.padded_vocab_size = %lld does not agree "
                         "with the stored config (%d)", c->dir, (long long)json_integer_value(vocab), c->desc.vocab_size);
    if (neox_ckpt_check_model_shape(&c->desc, c->state, c->dir, NEOX_EXIT_FAILURE, err) != 0)
        return neox_fail_context(err, "the stored config");
    return 0;
}

int neox_cvt_open(neox_cvt_ckpt *c, const char *path, neox_error *err) {
    memset(c, 0, sizeof *c);
    c->dir = neox_cvt_resolve(path, err);
    if (!c->dir) return -1;
    c->reader = neox_ckpt_open_dir(c->dir, &c->manifest, err);
    if (!c->reader) {
        free(c->dir);
        c->dir = NULL;
        return -1;
    }
    json_t *state;
    if (neox_ckpt_read_run_state(c->reader, c->dir, &state, err) != 0) goto fail;
    c->state = state;
    c->cfg = load_stored_config(c->reader, c->dir, state, err);
    if (!c->cfg || derive_model(c, err) != 0) goto fail;
    return 0;
fail:
    neox_cvt_close(c);
    return -1;
}

void neox_cvt_close(neox_cvt_ckpt *c) {
    if (c->reader) neox_ckpt_reader_close(c->reader);
    if (c->state) json_decref((json_t *)c->state);
    if (c->cfg) neox_config_free(c->cfg);
    if (c->dir) neox_ckpt_manifest_free(&c->manifest);
    free(c->dir);
    memset(c, 0, sizeof *c);
}
