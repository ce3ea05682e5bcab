// data_config.c: the data settings of a loaded GPT-NeoX config (data_path/split or the
// train/valid/test paths and weights, seq_length, seed, iteration counts, packing) as the plain
// neox_data_settings struct the rest of lib/data takes.
#include "config.h"
#include "data.h"

#include <stdlib.h>
#include <string.h>

// A list of strings or numbers from the config; NULL and 0 when the key is None.
static int read_list(const neox_config *cfg, neox_key_id id, char ***strings, double **numbers, int *count,
                     neox_error *err) {
    const neox_value *v = neox_config_has_id(cfg, id) ? neox_config_value_id(cfg, id) : NULL;
    const char *key = neox_key_specs[id].name;
    *count = 0;
    if (!v) return 0;
    if (v->kind != NEOX_VALUE_LIST) return neox_fail(err, NEOX_EXIT_USAGE, "%s: expected a list", key);
    if (strings) *strings = neox_calloc((size_t)v->count + 1, sizeof **strings);
    if (numbers) *numbers = neox_calloc((size_t)v->count + 1, sizeof **numbers);
    for (int i = 0; i < v->count; i++) {
        const neox_value *item = v->items[i];
        if (strings && item->kind != NEOX_VALUE_STRING)
            return neox_fail(err, NEOX_EXIT_USAGE, "%s:%d: %s[%d] must be a path", item->file ? item->file : "config",
                             item->line, key, i);
        if (numbers && item->kind != NEOX_VALUE_INT && item->kind != NEOX_VALUE_FLOAT)
            return neox_fail(err, NEOX_EXIT_USAGE, "%s:%d: %s[%d] must be a number", item->file ? item->file : "config",
                             item->line, key, i);
        if (strings) (*strings)[i] = item->string;
        if (numbers) (*numbers)[i] = item->number;
    }
    *count = v->count;
    return 0;
}

// A *_label_data_paths or *_reward_data_paths list: one dataset per path of the matching *_data_paths
// (GPT-NeoX pairs them by position), so it exists only beside train/valid/test_data_paths, never with
// data_path.
static int read_labels(const neox_config *cfg, neox_key_id id, int ndata, const char *const **out,
                       neox_error *err) {
    char **paths = NULL;
    int n = 0;
    if (read_list(cfg, id, &paths, NULL, &n, err) != 0) return free(paths), -1;
    *out = (const char *const *)paths;
    const char *key = neox_key_specs[id].name;
    if (paths && n != ndata)
        return neox_fail(err, NEOX_EXIT_USAGE,
                         "%s: has %d paths but the matching *_data_paths has %d: each token dataset needs its own "
                         "(%s needs the *_data_paths lists, not data_path)",
                         key, n, ndata, key);
    return 0;
}

// train/valid/test_data_paths and their label datasets.
static int read_paths(const neox_config *cfg, neox_data_settings *s, neox_error *err) {
    char **train = NULL, **valid = NULL, **test = NULL;
    int rc = read_list(cfg, NEOX_K_train_data_paths, &train, NULL, &s->ntrain, err);
    s->train_paths = (const char *const *)train;
    if (rc == 0) rc = read_list(cfg, NEOX_K_valid_data_paths, &valid, NULL, &s->nvalid, err);
    s->valid_paths = (const char *const *)valid;
    if (rc == 0) rc = read_list(cfg, NEOX_K_test_data_paths, &test, NULL, &s->ntest, err);
    s->test_paths = (const char *const *)test;
    if (rc == 0) rc = read_labels(cfg, NEOX_K_train_label_data_paths, s->ntrain, &s->train_label_paths, err);
    if (rc == 0) rc = read_labels(cfg, NEOX_K_valid_label_data_paths, s->nvalid, &s->valid_label_paths, err);
    if (rc == 0) rc = read_labels(cfg, NEOX_K_test_label_data_paths, s->ntest, &s->test_label_paths, err);
    if (rc == 0) rc = read_labels(cfg, NEOX_K_train_reward_data_paths, s->ntrain, &s->train_reward_paths, err);
    if (rc == 0) rc = read_labels(cfg, NEOX_K_valid_reward_data_paths, s->nvalid, &s->valid_reward_paths, err);
    if (rc == 0) rc = read_labels(cfg, NEOX_K_test_reward_data_paths, s->ntest, &s->test_reward_paths, err);
    // GPT2Dataset asserts the same: a reward belongs to one document, and a packed sample holds several.
    if (rc == 0 && (s->train_reward_paths || s->valid_reward_paths || s->test_reward_paths) &&
        s->pack_impl != NEOX_PACK_UNPACKED)
        rc = neox_fail(err, NEOX_EXIT_USAGE, "*_reward_data_paths: reward datasets are read with pack_impl: unpacked "
                       "only (one document per sample, as GPT-NeoX requires), not %s", neox_pack_impl_name(s->pack_impl));
    return rc;
}

// One split of pairwise data: pos_SPLIT_data_paths (the chosen side, into *data), neg_SPLIT_data_paths
// (as many), and both label lists or neither (GPT-NeoX's PairwiseDataset asserts as much).
static int read_pairwise_split(const neox_config *cfg, const neox_key_id ids[4], const char *const **data, int *n,
                               const char *const **labels, const char *const **neg, const char *const **neg_labels,
                               neox_error *err) {
    char **pos = NULL, **rejected = NULL;
    int nneg = 0;
    int rc = read_list(cfg, ids[0], &pos, NULL, n, err);
    *data = (const char *const *)pos;
    if (rc == 0) rc = read_list(cfg, ids[1], &rejected, NULL, &nneg, err);
    *neg = (const char *const *)rejected;
    if (rc == 0 && nneg != *n)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s has %d paths but %s has %d: each chosen dataset needs its rejected one",
                         neox_key_specs[ids[0]].name, *n, neox_key_specs[ids[1]].name, nneg);
    if (rc == 0) rc = read_labels(cfg, ids[2], *n, labels, err);
    if (rc == 0) rc = read_labels(cfg, ids[3], *n, neg_labels, err);
    if (rc == 0 && (*labels == NULL) != (*neg_labels == NULL))
        return neox_fail(err, NEOX_EXIT_USAGE, "%s and %s: set both label lists or neither",
                         neox_key_specs[ids[2]].name, neox_key_specs[ids[3]].name);
    return rc;
}

// dataset_impl pairwise: the pos_*/neg_* lists; the plain *_data_paths and data_path do not apply.
static int read_pairwise_paths(const neox_config *cfg, neox_data_settings *s, neox_error *err) {
    if (s->data_path || neox_config_has(cfg, train_data_paths))
        return neox_fail(err, NEOX_EXIT_USAGE, "dataset_impl pairwise reads pos_train_data_paths and "
                         "neg_train_data_paths (and the valid and test lists), not %s",
                         s->data_path ? "data_path" : "train_data_paths");
    static const neox_key_id ids[3][4] = {
        {NEOX_K_pos_train_data_paths, NEOX_K_neg_train_data_paths, NEOX_K_pos_train_label_data_paths,
         NEOX_K_neg_train_label_data_paths},
        {NEOX_K_pos_valid_data_paths, NEOX_K_neg_valid_data_paths, NEOX_K_pos_valid_label_data_paths,
         NEOX_K_neg_valid_label_data_paths},
        {NEOX_K_pos_test_data_paths, NEOX_K_neg_test_data_paths, NEOX_K_pos_test_label_data_paths,
         NEOX_K_neg_test_label_data_paths},
    };
    int rc = read_pairwise_split(cfg, ids[0], &s->train_paths, &s->ntrain, &s->train_label_paths, &s->train_neg_paths,
                                 &s->train_neg_label_paths, err);
    if (rc == 0)
        rc = read_pairwise_split(cfg, ids[1], &s->valid_paths, &s->nvalid, &s->valid_label_paths, &s->valid_neg_paths,
                                 &s->valid_neg_label_paths, err);
    if (rc == 0)
        rc = read_pairwise_split(cfg, ids[2], &s->test_paths, &s->ntest, &s->test_label_paths, &s->test_neg_paths,
                                 &s->test_neg_label_paths, err);
    if (rc == 0 && s->ntrain == 0)
        rc = neox_fail(err, NEOX_EXIT_USAGE, "dataset_impl pairwise: pos_train_data_paths is not set");
    return rc;
}

int neox_data_settings_from_config(const neox_config *cfg, neox_data_settings *s, neox_error *err) {
    *s = (neox_data_settings){0};
    s->data_path = neox_config_str(cfg, data_path);
    s->split = neox_config_str(cfg, split);
    s->weight_by_num_documents = neox_config_bool(cfg, weight_by_num_documents);
    s->weighted_sampler_alpha = neox_config_float(cfg, weighted_sampler_alpha);
    s->seq_length = (int)neox_config_int(cfg, seq_length);
    s->seed = (uint32_t)neox_config_int(cfg, seed);
    s->train_iters = neox_config_has(cfg, train_iters) ? neox_config_int(cfg, train_iters) : 0;
    s->eval_interval = neox_config_int(cfg, eval_interval);
    s->eval_iters = neox_config_int(cfg, eval_iters);
    s->train_batch_size = neox_config_has(cfg, train_batch_size) ? neox_config_int(cfg, train_batch_size) : 0;
    s->allow_chopped = neox_config_bool(cfg, allow_chopped);
    s->use_cache = 1;
    s->cache_dir = neox_config_str(cfg, data_cache_dir);
    if (neox_pack_impl_parse(neox_config_str(cfg, pack_impl), &s->pack_impl) != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "pack_impl: '%s' is not supported (packed, pack_until_overflow, unpacked)",
                         neox_config_str(cfg, pack_impl));
    const char *impl = neox_config_str(cfg, dataset_impl);
    s->pairwise = impl && !strcmp(impl, "pairwise");
    int rc = 0;
    static const neox_key_id reward_keys[3] = {NEOX_K_train_reward_data_paths, NEOX_K_valid_reward_data_paths,
                                               NEOX_K_test_reward_data_paths};
    for (int i = 0; s->pairwise && i < 3 && rc == 0; i++)
        if (neox_config_has_id(cfg, reward_keys[i]) && neox_config_value_id(cfg, reward_keys[i]))
            rc = neox_fail(err, NEOX_EXIT_USAGE, "%s: reward datasets go with train_data_paths (KTO), not with "
                           "dataset_impl pairwise", neox_key_specs[reward_keys[i]].name);
    if (rc == 0) rc = s->pairwise ? read_pairwise_paths(cfg, s, err) : read_paths(cfg, s, err);
    double *wt = NULL, *wv = NULL, *ws = NULL;
    int nwt = 0, nwv = 0, nws = 0;
    if (rc == 0) rc = read_list(cfg, NEOX_K_train_data_weights, NULL, &wt, &nwt, err);
    if (rc == 0) rc = read_list(cfg, NEOX_K_valid_data_weights, NULL, &wv, &nwv, err);
    if (rc == 0) rc = read_list(cfg, NEOX_K_test_data_weights, NULL, &ws, &nws, err);
    s->train_weights = wt, s->valid_weights = wv, s->test_weights = ws;
    if (rc == 0 && ((wt && nwt != s->ntrain) || (wv && nwv != s->nvalid) || (ws && nws != s->ntest)))
        rc = neox_fail(err, NEOX_EXIT_USAGE, "*_data_weights must have one weight per path in *_data_paths");
    if (rc != 0) neox_data_settings_release(s);
    return rc;
}

void neox_data_settings_release(neox_data_settings *s) {
    free((void *)s->train_paths);
    free((void *)s->valid_paths);
    free((void *)s->test_paths);
    free((void *)s->train_weights);
    free((void *)s->valid_weights);
    free((void *)s->test_weights);
    free((void *)s->train_label_paths);
    free((void *)s->valid_label_paths);
    free((void *)s->test_label_paths);
    free((void *)s->train_reward_paths);
    free((void *)s->valid_reward_paths);
    free((void *)s->test_reward_paths);
    s->train_reward_paths = s->valid_reward_paths = s->test_reward_paths = NULL;
    free((void *)s->train_neg_paths);
    free((void *)s->valid_neg_paths);
    free((void *)s->test_neg_paths);
    free((void *)s->train_neg_label_paths);
    free((void *)s->valid_neg_label_paths);
    free((void *)s->test_neg_label_paths);
    s->train_neg_paths = s->valid_neg_paths = s->test_neg_paths = NULL;
    s->train_neg_label_paths = s->valid_neg_label_paths = s->test_neg_label_paths = NULL;
    s->train_label_paths = s->valid_label_paths = s->test_label_paths = NULL;
    s->train_paths = s->valid_paths = s->test_paths = NULL;
    s->train_weights = s->valid_weights = s->test_weights = NULL;
}
