// hf_json.c: loading a Hugging Face `tokenizers` JSON file (tokenizer.json) with a BPE model
// (byte_fallback, ignore_merges, fuse_unk, unk_token, continuing_subword_prefix,
// end_of_word_suffix) and its added tokens (special or not, normalized or not, lstrip/rstrip);
// the pipeline components are read by hf_components.c. Anything else — other models (WordPiece,
// Unigram, WordLevel), BPE dropout, truncation or padding — is refused with an error naming it,
// because encoding without it would silently give different ids than HF.
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
    return neox_fail(err, NEOX_EXIT_USAGE, "%s: %s: \"%s\" is not supported (see docs/tokenizers.md)", file, what,
                     name ? name : "(no type)");
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

static int load_affix(json_t *model, const char *key, char **out, size_t *len, const char *file, neox_error *err) {
    json_t *v = json_object_get(model, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return neox_fail(err, NEOX_EXIT_USAGE, "%s: model.%s must be a string or null", file, key);
    if (json_string_length(v) == 0) return 0;
    *out = neox_strndup(json_string_value(v), json_string_length(v));
    *len = json_string_length(v);
    return 0;
}

static int load_model(neox_tokenizer *tok, json_t *model, const char *file, neox_error *err) {
    if (!json_is_object(model)) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: model is missing or not an object", file);
    const char *type = type_of(model);
    if (type && strcmp(type, "BPE")) return refuse(err, file, "model.type", type);
    if (!type && !json_object_get(model, "merges")) return refuse(err, file, "model.type", NULL);
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout))  // random merges: the ids would differ from call to call
        return neox_fail(err, NEOX_EXIT_USAGE, "%s: model.dropout: BPE dropout is not supported (it must be null)", file);
    if (tokenizer_load_vocab_object(tok, json_object_get(model, "vocab"), file, "model.vocab", err) < 0) return -1;
    bpe_model *m = &tok->bpe;
    if (get_bool(model, "ignore_merges", &m->ignore_merges, file, "model", err) < 0 ||
        get_bool(model, "fuse_unk", &m->fuse_unk, file, "model", err) < 0 ||
        get_bool(model, "byte_fallback", &m->byte_fallback, file, "model", err) < 0 ||
        load_affix(model, "continuing_subword_prefix", &m->continuing_subword_prefix, &m->prefix_len, file, err) < 0 ||
        load_affix(model, "end_of_word_suffix", &m->end_of_word_suffix, &m->suffix_len, file, err) < 0)
        return -1;
    json_t *unk = json_object_get(model, "unk_token");
    if (unk && !json_is_null(unk)) {
        if (!json_is_string(unk)) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: model.unk_token must be a string", file);
        m->unk_id = strmap_get(&m->vocab, json_string_value(unk), json_string_length(unk));
        if (m->unk_id < 0)
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s: model.unk_token \"%s\" is not in the vocabulary", file,
                             json_string_value(unk));
    }
    return load_merges(tok, json_object_get(model, "merges"), file, err);
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

// A last ByteLevel pre-tokenizer makes the model byte-level (words stay raw bytes); a lone one
// takes encode's fast path.
static void use_pre_tokenizers(neox_tokenizer *tok) {
    int n = tok->n_pretokenizers;
    const tok_pretokenizer *last = n ? &tok->pretokenizers[n - 1] : NULL;
    tok->bpe.byte_level = last && last->kind == PRE_BYTELEVEL;
    if (n == 1 && tok->bpe.byte_level) {
        tok->bytelevel_only = true;
        tok->add_prefix_space = last->add_prefix_space;
        tok->use_regex = last->use_regex;
    }
    bpe_finish(&tok->bpe);
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
    if (load_model(tok, json_object_get(root, "model"), path, err) < 0 ||
        tokenizer_load_normalizer(tok, json_object_get(root, "normalizer"), path, "normalizer", err) < 0 ||
        tokenizer_load_pre_tokenizer(tok, json_object_get(root, "pre_tokenizer"), path, "pre_tokenizer", err) < 0 ||
        tokenizer_load_decoder(tok, json_object_get(root, "decoder"), path, "decoder", err) < 0 ||
        tokenizer_load_post_processor(tok, json_object_get(root, "post_processor"), path, "post_processor", err) < 0)
        goto done;
    use_pre_tokenizers(tok);
    if (load_added_tokens(tok, json_object_get(root, "added_tokens"), path, err) < 0) goto done;
    tok->skip_special_on_decode = true;  // tokenizers' decode() default
    rc = 0;
done:
    json_decref(root);
    return rc;
}
