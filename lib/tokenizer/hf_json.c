// hf_json.c: loading a Hugging Face `tokenizers` JSON file (tokenizer.json) with a BPE model.
// Supported, with HF's semantics: normalizers NFC/NFD/NFKC/NFKD (alone or in a Sequence), the
// ByteLevel pre-tokenizer, decoder and post-processor, added tokens (special or not, normalized
// or not, lstrip/rstrip). Anything else — other models (WordPiece, Unigram, WordLevel), other
// components, BPE dropout, truncation or padding — is refused with an error naming it, because
// encoding without it would silently give different ids than HF.
#include <jansson.h>
#include <string.h>

#include "tokenizer_internal.h"

static const char *type_of(json_t *obj) {
    json_t *t = json_object_get(obj, "type");
    return json_is_string(t) ? json_string_value(t) : NULL;
}

// Reads an optional boolean member; absent or null keeps *out.
static int get_bool(json_t *obj, const char *key, bool *out, const char *file, const char *where, neox_error *err) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v))
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s.%s must be true or false", file, where, key);
    *out = json_is_true(v);
    return 0;
}

static int refuse(neox_error *err, const char *file, const char *what, const char *name) {
    return neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s '%s' is not supported (supported: see docs/tokenizers.md)", file,
                     what, name ? name : "(no type)");
}

static int load_normalizer(neox_tokenizer *tok, json_t *n, const char *file, neox_error *err) {
    if (!n || json_is_null(n)) return 0;
    if (!json_is_object(n)) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: normalizer must be an object or null", file);
    const char *type = type_of(n);
    if (type && !strcmp(type, "Sequence")) {
        json_t *list = json_object_get(n, "normalizers");
        if (!json_is_array(list))
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s: normalizer.normalizers must be an array", file);
        size_t i;
        json_t *item;
        json_array_foreach(list, i, item) if (load_normalizer(tok, item, file, err) < 0) return -1;
        return 0;
    }
    enum normalizer_kind k = NORM_NONE;
    if (type && !strcmp(type, "NFC")) k = NORM_NFC;
    else if (type && !strcmp(type, "NFD")) k = NORM_NFD;
    else if (type && !strcmp(type, "NFKC")) k = NORM_NFKC;
    else if (type && !strcmp(type, "NFKD")) k = NORM_NFKD;
    else return refuse(err, file, "normalizer", type);
    if (tok->n_normalizers == TOK_MAX_NORMALIZERS)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: more than %d normalizers", file, TOK_MAX_NORMALIZERS);
    tok->normalizers[tok->n_normalizers++] = k;
    return 0;
}

static int load_bytelevel(neox_tokenizer *tok, json_t *p, const char *file, const char *where, neox_error *err) {
    tok->use_regex = true;
    if (get_bool(p, "add_prefix_space", &tok->add_prefix_space, file, where, err) < 0) return -1;
    return get_bool(p, "use_regex", &tok->use_regex, file, where, err);
}

static int load_pre_tokenizer(neox_tokenizer *tok, json_t *p, const char *file, neox_error *err) {
    const char *type = json_is_object(p) ? type_of(p) : NULL;
    if (type && !strcmp(type, "Sequence")) {  // a Sequence holding only one ByteLevel
        json_t *list = json_object_get(p, "pretokenizers");
        if (json_is_array(list) && json_array_size(list) == 1) return load_pre_tokenizer(tok, json_array_get(list, 0), file, err);
    }
    if (!type || strcmp(type, "ByteLevel")) return refuse(err, file, "pre_tokenizer", p && !json_is_null(p) ? type : "null");
    return load_bytelevel(tok, p, file, "pre_tokenizer", err);
}

static int load_decoder(neox_tokenizer *tok, json_t *d, const char *file, neox_error *err) {
    if (!d || json_is_null(d)) return 0;  // HF then joins the tokens with spaces
    const char *type = json_is_object(d) ? type_of(d) : NULL;
    if (!type || strcmp(type, "ByteLevel")) return refuse(err, file, "decoder", type);
    tok->bytelevel_decoder = true;
    return 0;
}

static int load_post_processor(json_t *p, const char *file, neox_error *err) {
    if (!p || json_is_null(p)) return 0;
    const char *type = json_is_object(p) ? type_of(p) : NULL;
    // ByteLevel post-processing only trims offsets; it never changes ids.
    if (!type || strcmp(type, "ByteLevel")) return refuse(err, file, "post_processor", type);
    return 0;
}

static int load_merges(neox_tokenizer *tok, json_t *merges, const char *file, neox_error *err) {
    if (!json_is_array(merges)) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: model.merges must be an array", file);
    size_t i;
    json_t *m;
    json_array_foreach(merges, i, m) {
        char where[64];
        snprintf(where, sizeof where, "model.merges[%zu]", i);
        const char *left, *right;
        size_t llen, rlen;
        if (json_is_string(m)) {  // "left right"
            const char *s = json_string_value(m);
            const char *space = strchr(s, ' ');
            if (!space || strchr(space + 1, ' ') || space == s || !space[1])
                return neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s: a merge must be two tokens separated by one space",
                                 file, where);
            left = s, llen = (size_t)(space - s), right = space + 1, rlen = strlen(right);
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {  // ["left", "right"]
            left = json_string_value(json_array_get(m, 0)), llen = json_string_length(json_array_get(m, 0));
            right = json_string_value(json_array_get(m, 1)), rlen = json_string_length(json_array_get(m, 1));
        } else {
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s must be a string \"a b\" or an array [\"a\", \"b\"]", file,
                             where);
        }
        if (tokenizer_add_merge_text(tok, left, llen, right, rlen, (int32_t)i, file, where, err) < 0) return -1;
    }
    return 0;
}

static int load_model(neox_tokenizer *tok, json_t *model, const char *file, neox_error *err) {
    if (!json_is_object(model)) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: model is missing or not an object", file);
    const char *type = type_of(model);
    if (type && strcmp(type, "BPE")) return refuse(err, file, "model type", type);
    if (!type && !json_object_get(model, "merges")) return refuse(err, file, "model type", NULL);
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout)) return refuse(err, file, "model option", "dropout");
    const char *affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(model, affixes[i]);
        if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0))
            return refuse(err, file, "model option", affixes[i]);
    }
    bool byte_fallback = false;
    if (get_bool(model, "byte_fallback", &byte_fallback, file, "model", err) < 0) return -1;
    if (byte_fallback) return refuse(err, file, "model option", "byte_fallback");
    if (tokenizer_load_vocab_object(tok, json_object_get(model, "vocab"), file, "model.vocab", err) < 0) return -1;
    if (get_bool(model, "ignore_merges", &tok->bpe.ignore_merges, file, "model", err) < 0) return -1;
    if (get_bool(model, "fuse_unk", &tok->bpe.fuse_unk, file, "model", err) < 0) return -1;
    json_t *unk = json_object_get(model, "unk_token");
    if (unk && !json_is_null(unk)) {
        if (!json_is_string(unk)) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: model.unk_token must be a string", file);
        tok->bpe.unk_id = strmap_get(&tok->bpe.vocab, json_string_value(unk), json_string_length(unk));
    }
    if (load_merges(tok, json_object_get(model, "merges"), file, err) < 0) return -1;
    bpe_finish(&tok->bpe);
    return 0;
}

static int load_added_tokens(neox_tokenizer *tok, json_t *list, const char *file, neox_error *err) {
    if (!list || json_is_null(list)) return 0;
    if (!json_is_array(list)) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: added_tokens must be an array", file);
    size_t i;
    json_t *t;
    json_array_foreach(list, i, t) {
        char where[64];
        snprintf(where, sizeof where, "added_tokens[%zu]", i);
        json_t *content = json_object_get(t, "content");
        if (!json_is_object(t) || !json_is_string(content))
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s must be an object with a string \"content\"", file, where);
        bool special = false, normalized = true, lstrip = false, rstrip = false, single_word = false;
        // HF's default for "normalized" is the opposite of "special".
        if (get_bool(t, "special", &special, file, where, err) < 0) return -1;
        normalized = !special;
        if (get_bool(t, "normalized", &normalized, file, where, err) < 0 ||
            get_bool(t, "lstrip", &lstrip, file, where, err) < 0 || get_bool(t, "rstrip", &rstrip, file, where, err) < 0 ||
            get_bool(t, "single_word", &single_word, file, where, err) < 0)
            return -1;
        if (single_word) return refuse(err, file, "added token option", "single_word");
        json_t *id = json_object_get(t, "id");
        if (id && !json_is_integer(id))
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s.id must be an integer", file, where);
        // HF ignores the stored id and assigns ids itself (the model's id when the content is in the
        // vocabulary, otherwise the next free one); tokenizer_add_token does the same.
        if (tokenizer_add_token(tok, json_string_value(content), json_string_length(content), -1, special, normalized,
                                lstrip, rstrip, file, err) < 0)
            return -1;
        if (id && json_integer_value(id) != tok->added[tok->n_added - 1].id)
            neox_warn("%s: %s: \"%s\" has id %d, not the stored %lld (as in HF tokenizers)", file, where,
                      json_string_value(content), tok->added[tok->n_added - 1].id, (long long)json_integer_value(id));
    }
    return 0;
}

int tokenizer_load_hf_json(neox_tokenizer *tok, const char *path, neox_error *err) {
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s:%d:%d: invalid JSON: %s", path, jerr.line, jerr.column, jerr.text);
    int rc = -1;
    if (!json_is_object(root)) {
        neox_fail(err, NEOX_EXIT_FAILURE, "%s: the top level is not a JSON object", path);
        goto done;
    }
    const char *unsupported[] = {"truncation", "padding"};
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(root, unsupported[i]);
        if (v && !json_is_null(v)) {
            refuse(err, path, "setting", unsupported[i]);
            goto done;
        }
    }
    tok->use_regex = true;
    if (load_model(tok, json_object_get(root, "model"), path, err) < 0 ||
        load_normalizer(tok, json_object_get(root, "normalizer"), path, err) < 0 ||
        load_pre_tokenizer(tok, json_object_get(root, "pre_tokenizer"), path, err) < 0 ||
        load_decoder(tok, json_object_get(root, "decoder"), path, err) < 0 ||
        load_post_processor(json_object_get(root, "post_processor"), path, err) < 0 ||
        load_added_tokens(tok, json_object_get(root, "added_tokens"), path, err) < 0)
        goto done;
    tok->skip_special_on_decode = true;  // tokenizers' decode() default
    rc = 0;
done:
    json_decref(root);
    return rc;
}
