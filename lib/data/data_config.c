// data_config.c: the data settings of a loaded GPT-NeoX config (data_path/split or the
// train/valid/test paths and weights, seq_length, seed, iteration counts, packing) as the plain
// neox_data_settings struct the rest of lib/data takes, and the one owner of the rules that tie
// those settings together (neox_data_settings_check), which neox-preprocess index runs on its
// options as well.
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

// A list of paths that goes beside the data paths (labels, rewards, rejected data), or NULL.
static int read_paths_list(const neox_config *cfg, neox_key_id id, const char *const **out, int *count, neox_error *err) {
    char **paths = NULL;
    int rc = read_list(cfg, id, &paths, NULL, count, err);
    *out = (const char *const *)paths;
    return rc;
}

// train/valid/test_data_paths and their label and reward datasets.
static int read_paths(const neox_config *cfg, neox_data_settings *s, neox_data_list_lengths *n, neox_error *err) {
    static const neox_key_id data[3] = {NEOX_K_train_data_paths, NEOX_K_valid_data_paths, NEOX_K_test_data_paths};
    static const neox_key_id labels[3] = {NEOX_K_train_label_data_paths, NEOX_K_valid_label_data_paths,
                                          NEOX_K_test_label_data_paths};
    static const neox_key_id rewards[3] = {NEOX_K_train_reward_data_paths, NEOX_K_valid_reward_data_paths,
                                           NEOX_K_test_reward_data_paths};
    const char *const **paths[3] = {&s->train_paths, &s->valid_paths, &s->test_paths};
    const char *const **label_paths[3] = {&s->train_label_paths, &s->valid_label_paths, &s->test_label_paths};
    const char *const **reward_paths[3] = {&s->train_reward_paths, &s->valid_reward_paths, &s->test_reward_paths};
    int *count[3] = {&s->ntrain, &s->nvalid, &s->ntest};
    int rc = 0;
    for (int i = 0; i < 3 && rc == 0; i++) rc = read_paths_list(cfg, data[i], paths[i], count[i], err);
    for (int i = 0; i < 3 && rc == 0; i++) rc = read_paths_list(cfg, labels[i], label_paths[i], &n->labels[i], err);
    for (int i = 0; i < 3 && rc == 0; i++) rc = read_paths_list(cfg, rewards[i], reward_paths[i], &n->rewards[i], err);
    return rc;
}

// dataset_impl pairwise: the pos_*/neg_* lists; the plain *_data_paths and data_path do not apply.
static int read_pairwise_paths(const neox_config *cfg, neox_data_settings *s, neox_data_list_lengths *n,
                               neox_error *err) {
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
    const char *const **paths[3] = {&s->train_paths, &s->valid_paths, &s->test_paths};
    const char *const **labels[3] = {&s->train_label_paths, &s->valid_label_paths, &s->test_label_paths};
    const char *const **neg[3] = {&s->train_neg_paths, &s->valid_neg_paths, &s->test_neg_paths};
    const char *const **neg_labels[3] = {&s->train_neg_label_paths, &s->valid_neg_label_paths, &s->test_neg_label_paths};
    int *count[3] = {&s->ntrain, &s->nvalid, &s->ntest};
    int rc = 0;
    for (int i = 0; i < 3 && rc == 0; i++) {
        rc = read_paths_list(cfg, ids[i][0], paths[i], count[i], err);
        if (rc == 0) rc = read_paths_list(cfg, ids[i][1], neg[i], &n->neg[i], err);
        if (rc == 0) rc = read_paths_list(cfg, ids[i][2], labels[i], &n->labels[i], err);
        if (rc == 0) rc = read_paths_list(cfg, ids[i][3], neg_labels[i], &n->neg_labels[i], err);
    }
    return rc;
}

// A reward list of the config under dataset_impl pairwise (they are not read into s there).
static int refuse_pairwise_rewards(const neox_config *cfg, neox_error *err) {
    static const neox_key_id reward_keys[3] = {NEOX_K_train_reward_data_paths, NEOX_K_valid_reward_data_paths,
                                               NEOX_K_test_reward_data_paths};
    for (int i = 0; i < 3; i++)
        if (neox_config_has_id(cfg, reward_keys[i]) && neox_config_value_id(cfg, reward_keys[i]))
            return neox_fail(err, NEOX_EXIT_USAGE, "%s: reward datasets go with train_data_paths (KTO), not with "
                             "dataset_impl pairwise", neox_key_specs[reward_keys[i]].name);
    return 0;
}

static int read_weights(const neox_config *cfg, neox_data_settings *s, neox_data_list_lengths *n, neox_error *err) {
    double *wt = NULL, *wv = NULL, *ws = NULL;
    int rc = read_list(cfg, NEOX_K_train_data_weights, NULL, &wt, &n->weights[0], err);
    if (rc == 0) rc = read_list(cfg, NEOX_K_valid_data_weights, NULL, &wv, &n->weights[1], err);
    if (rc == 0) rc = read_list(cfg, NEOX_K_test_data_weights, NULL, &ws, &n->weights[2], err);
    s->train_weights = wt, s->valid_weights = wv, s->test_weights = ws;
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
    neox_data_list_lengths n = {0};
    int rc = s->pairwise ? refuse_pairwise_rewards(cfg, err) : 0;
    if (rc == 0) rc = s->pairwise ? read_pairwise_paths(cfg, s, &n, err) : read_paths(cfg, s, &n, err);
    if (rc == 0) rc = read_weights(cfg, s, &n, err);
    if (rc == 0) rc = neox_data_settings_check(s, &n, err);
    if (rc != 0) neox_data_settings_release(s);
    return rc;
}

// ---- the rules -------------------------------------------------------------------------------

static const char *const SPLIT[3] = {"train", "valid", "test"};

// A list that goes one per data path of its split: given, it has as many entries.
static int check_one_per_path(const void *given, int n, int npaths, const char *key, neox_error *err) {
    if (!given || n == npaths) return 0;
    return neox_fail(err, NEOX_EXIT_USAGE,
                     "%s: has %d paths but the matching *_data_paths has %d: each token dataset needs its own "
                     "(%s needs the *_data_paths lists, not data_path)", key, n, npaths, key);
}

// Rewards and labels of plain (not pairwise) data.
static int check_plain_lists(const neox_data_settings *s, const neox_data_list_lengths *n, const int npaths[3],
                             neox_error *err) {
    const void *labels[3] = {s->train_label_paths, s->valid_label_paths, s->test_label_paths};
    const void *rewards[3] = {s->train_reward_paths, s->valid_reward_paths, s->test_reward_paths};
    const void *neg[6] = {s->train_neg_paths, s->valid_neg_paths, s->test_neg_paths, s->train_neg_label_paths,
                          s->valid_neg_label_paths, s->test_neg_label_paths};
    char key[64];
    for (int i = 0; i < 6; i++)
        if (neg[i])
            return neox_fail(err, NEOX_EXIT_USAGE, "neg_%s_%sdata_paths: rejected data goes with dataset_impl pairwise "
                             "(and pos_*_data_paths)", SPLIT[i % 3], i < 3 ? "" : "label_");
    for (int i = 0; i < 3; i++) {
        snprintf(key, sizeof key, "%s_label_data_paths", SPLIT[i]);
        if (check_one_per_path(labels[i], n->labels[i], npaths[i], key, err) != 0) return -1;
    }
    for (int i = 0; i < 3; i++) {
        snprintf(key, sizeof key, "%s_reward_data_paths", SPLIT[i]);
        if (check_one_per_path(rewards[i], n->rewards[i], npaths[i], key, err) != 0) return -1;
    }
    // GPT2Dataset asserts the same: a reward belongs to one document, and a packed sample holds several.
    if ((rewards[0] || rewards[1] || rewards[2]) && s->pack_impl != NEOX_PACK_UNPACKED)
        return neox_fail(err, NEOX_EXIT_USAGE, "*_reward_data_paths: reward datasets are read with pack_impl: unpacked "
                         "only (one document per sample, as GPT-NeoX requires), not %s", neox_pack_impl_name(s->pack_impl));
    return 0;
}

// The rejected side and the labels of pairwise data, as GPT-NeoX's PairwiseDataset asserts them.
static int check_pairwise_lists(const neox_data_settings *s, const neox_data_list_lengths *n, const int npaths[3],
                                neox_error *err) {
    const void *labels[3] = {s->train_label_paths, s->valid_label_paths, s->test_label_paths};
    const void *neg_labels[3] = {s->train_neg_label_paths, s->valid_neg_label_paths, s->test_neg_label_paths};
    if (s->train_reward_paths || s->valid_reward_paths || s->test_reward_paths)
        return neox_fail(err, NEOX_EXIT_USAGE, "*_reward_data_paths: reward datasets go with train_data_paths (KTO), "
                         "not with dataset_impl pairwise");
    char key[64], other[64];
    for (int i = 0; i < 3; i++) {
        if (n->neg[i] != npaths[i])
            return neox_fail(err, NEOX_EXIT_USAGE, "pos_%s_data_paths has %d paths but neg_%s_data_paths has %d: each "
                             "chosen dataset needs its rejected one", SPLIT[i], npaths[i], SPLIT[i], n->neg[i]);
        snprintf(key, sizeof key, "pos_%s_label_data_paths", SPLIT[i]);
        snprintf(other, sizeof other, "neg_%s_label_data_paths", SPLIT[i]);
        if (check_one_per_path(labels[i], n->labels[i], npaths[i], key, err) != 0 ||
            check_one_per_path(neg_labels[i], n->neg_labels[i], npaths[i], other, err) != 0)
            return -1;
        if ((labels[i] == NULL) != (neg_labels[i] == NULL))
            return neox_fail(err, NEOX_EXIT_USAGE, "%s and %s: set both label lists or neither", key, other);
    }
    if (npaths[0] == 0) return neox_fail(err, NEOX_EXIT_USAGE, "dataset_impl pairwise: pos_train_data_paths is not set");
    return 0;
}

int neox_data_settings_check(const neox_data_settings *s, const neox_data_list_lengths *n, neox_error *err) {
    const int npaths[3] = {s->ntrain, s->nvalid, s->ntest};
    int rc = s->pairwise ? check_pairwise_lists(s, n, npaths, err) : check_plain_lists(s, n, npaths, err);
    const void *weights[3] = {s->train_weights, s->valid_weights, s->test_weights};
    for (int i = 0; i < 3 && rc == 0; i++)
        if (weights[i] && n->weights[i] != npaths[i])
            rc = neox_fail(err, NEOX_EXIT_USAGE, "*_data_weights must have one weight per path in *_data_paths "
                           "(%s_data_weights has %d, %s_data_paths %d)", SPLIT[i], n->weights[i], SPLIT[i], npaths[i]);
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
