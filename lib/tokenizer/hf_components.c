// hf_components.c: reading the pipeline components of a tokenizer.json — normalizer,
// pre_tokenizer, decoder, post_processor — into the tokenizer, with HF tokenizers' defaults.
// A component neox.c does not implement is refused by its JSON path and type
// (`pre_tokenizer.pretokenizers[1].type: "Foo" is not supported`), exit status 2: encoding
// without it would silently give other ids than HF.
#include <string.h>

#include "tokenizer_internal.h"

static const char *type_of(json_t *obj) {
    json_t *t = json_object_get(obj, "type");
    return json_is_string(t) ? json_string_value(t) : NULL;
}

static int unsupported(neox_error *err, const char *file, const char *where, json_t *obj) {
    const char *type = type_of(obj);
    if (!type) return neox_fail(err, NEOX_EXIT_USAGE, "%s: %s: an object with a string \"type\" is expected", file, where);
    return neox_fail(err, NEOX_EXIT_USAGE, "%s: %s.type: \"%s\" is not supported (see docs/tokenizers.md)", file,
                     where, type);
}

static int get_bool(json_t *obj, const char *key, bool *out, const char *file, const char *where, neox_error *err) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return neox_fail(err, NEOX_EXIT_USAGE, "%s: %s.%s must be true or false", file, where, key);
    *out = json_is_true(v);
    return 0;
}

static int get_string(json_t *obj, const char *key, const char **out, size_t *len, const char *file,
                      const char *where, neox_error *err) {
    json_t *v = json_object_get(obj, key);
    if (!json_is_string(v)) return neox_fail(err, NEOX_EXIT_USAGE, "%s: %s.%s must be a string", file, where, key);
    *out = json_string_value(v), *len = json_string_length(v);
    return 0;
}

static int get_count(json_t *obj, const char *key, int64_t *out, const char *file, const char *where,
                     neox_error *err) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s: %s.%s must be a non-negative integer", file, where, key);
    *out = json_integer_value(v);
    return 0;
}

// {"String": "..."} or {"Regex": "..."} (HF's SplitPattern / ReplacePattern).
static int load_pattern(json_t *obj, tok_pattern *p, const char *file, const char *where, neox_error *err) {
    json_t *pat = json_object_get(obj, "pattern");
    json_t *lit = json_object_get(pat, "String"), *re = json_object_get(pat, "Regex");
    char at[256];
    snprintf(at, sizeof at, "%s.pattern", where);
    if (json_is_string(lit)) {
        if (json_string_length(lit) == 0) return neox_fail(err, NEOX_EXIT_USAGE, "%s: %s.String is empty", file, at);
        p->literal = tok_bytes_dup(json_string_value(lit), json_string_length(lit));
        p->literal_len = json_string_length(lit);
        return 0;
    }
    if (json_is_string(re)) {
        snprintf(at, sizeof at, "%s.pattern.Regex", where);
        p->regex = tok_regex_compile(json_string_value(re), json_string_length(re), REGEX_ONIGURUMA, file, at, err);
        p->word_split = tokenizer_regex_splits_words(json_string_value(re), json_string_length(re));
        return p->regex ? 0 : -1;
    }
    return neox_fail(err, NEOX_EXIT_USAGE, "%s: %s must be {\"String\": ...} or {\"Regex\": ...}", file, at);
}

// One Unicode character (Metaspace's replacement, Strip's content).
static int load_char(json_t *obj, const char *key, char *out, size_t *len, const char *file, const char *where,
                     neox_error *err) {
    const char *s = NULL;
    size_t n = 0;
    if (get_string(obj, key, &s, &n, file, where, err) < 0) return -1;
    int clen;
    if (n == 0 || utf8_decode((const uint8_t *)s, n, &clen) < 0 || (size_t)clen != n)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s: %s.%s must be one character", file, where, key);
    memcpy(out, s, n);
    *len = n;
    return 0;
}

static int load_prepend_scheme(json_t *obj, enum prepend_scheme *out, const char *file, const char *where,
                               neox_error *err) {
    *out = PREPEND_ALWAYS;
    json_t *v = json_object_get(obj, "prepend_scheme");
    if (!v || json_is_null(v)) {  // older files: add_prefix_space
        bool add = true;
        if (get_bool(obj, "add_prefix_space", &add, file, where, err) < 0) return -1;
        *out = add ? PREPEND_ALWAYS : PREPEND_NEVER;
        return 0;
    }
    const char *s = json_is_string(v) ? json_string_value(v) : "";
    if (!strcmp(s, "always")) *out = PREPEND_ALWAYS;
    else if (!strcmp(s, "first")) *out = PREPEND_FIRST;
    else if (!strcmp(s, "never")) *out = PREPEND_NEVER;
    else return neox_fail(err, NEOX_EXIT_USAGE, "%s: %s.prepend_scheme must be \"always\", \"first\" or \"never\"", file, where);
    return 0;
}

// Calls load(item, "<where>.<key>[i]") for each item of obj[key].
static int load_each(neox_tokenizer *tok, json_t *obj, const char *key, const char *file, const char *where,
                     int (*load)(neox_tokenizer *, json_t *, const char *, const char *, neox_error *), neox_error *err) {
    json_t *list = json_object_get(obj, key);
    if (!json_is_array(list)) return neox_fail(err, NEOX_EXIT_USAGE, "%s: %s.%s must be an array", file, where, key);
    size_t i;
    json_t *item;
    json_array_foreach(list, i, item) {
        char at[256];
        snprintf(at, sizeof at, "%s.%s[%zu]", where, key, i);
        if (load(tok, item, file, at, err) < 0) return -1;
    }
    return 0;
}

static int too_many(neox_error *err, const char *file, const char *where) {
    return neox_fail(err, NEOX_EXIT_USAGE, "%s: %s: more than %d components", file, where, TOK_MAX_COMPONENTS);
}

// ---------------------------------------------------------------------------------------------
// Normalizers.
int tokenizer_load_normalizer(neox_tokenizer *tok, json_t *n, const char *file, const char *where, neox_error *err) {
    if (!n || json_is_null(n)) return 0;
    const char *type = json_is_object(n) ? type_of(n) : NULL;
    if (type && !strcmp(type, "Sequence")) return load_each(tok, n, "normalizers", file, where, tokenizer_load_normalizer, err);
    if (tok->n_normalizers == TOK_MAX_COMPONENTS) return too_many(err, file, where);
    tok_normalizer nm = {0};
    static const struct { const char *name; enum normalizer_kind kind; } simple[] = {
        {"NFC", NORM_NFC}, {"NFD", NORM_NFD}, {"NFKC", NORM_NFKC}, {"NFKD", NORM_NFKD}, {"Lowercase", NORM_LOWERCASE}};
    for (size_t i = 0; type && i < sizeof simple / sizeof *simple; i++)
        if (!strcmp(type, simple[i].name)) nm.kind = simple[i].kind;
    const char *s = NULL;
    size_t len = 0;
    if (nm.kind) {
    } else if (type && !strcmp(type, "Strip")) {
        nm.kind = NORM_STRIP, nm.strip_left = nm.strip_right = true;
        if (get_bool(n, "strip_left", &nm.strip_left, file, where, err) < 0 ||
            get_bool(n, "strip_right", &nm.strip_right, file, where, err) < 0)
            return -1;
    } else if (type && !strcmp(type, "Prepend")) {
        if (get_string(n, "prepend", &s, &len, file, where, err) < 0) return -1;
        nm.kind = NORM_PREPEND, nm.content = tok_bytes_dup(s, len), nm.content_len = len;
    } else if (type && !strcmp(type, "Replace")) {
        if (get_string(n, "content", &s, &len, file, where, err) < 0) return -1;
        nm.kind = NORM_REPLACE;
        if (load_pattern(n, &nm.pattern, file, where, err) < 0) return -1;
        nm.content = tok_bytes_dup(s, len), nm.content_len = len;
    } else {
        return unsupported(err, file, where, n);
    }
    tok->normalizers[tok->n_normalizers++] = nm;
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenizers.
static int load_behavior(json_t *p, enum split_behavior *out, const char *file, const char *where, neox_error *err) {
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    json_t *v = json_object_get(p, "behavior");
    if (!v || json_is_null(v)) return 0;
    for (int i = 0; i < 5; i++)
        if (json_is_string(v) && !strcmp(json_string_value(v), names[i])) {
            *out = (enum split_behavior)i;
            return 0;
        }
    return neox_fail(err, NEOX_EXIT_USAGE,
                     "%s: %s.behavior must be Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous",
                     file, where);
}

// Rust regex's \w (Alphabetic, marks, decimal numbers, connector punctuation, joiners) as PCRE2
// classes, for the Whitespace pre-tokenizer's \w+|[^\w\s]+.
#define WORD_CLASS "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}"
static const char whitespace_pattern[] = "[" WORD_CLASS "]+|[^" WORD_CLASS "\\s]+";

static int load_one_pre_tokenizer(tok_pretokenizer *pt, json_t *p, const char *type, const char *file,
                                  const char *where, neox_error *err) {
    if (!strcmp(type, "ByteLevel")) {
        pt->kind = PRE_BYTELEVEL, pt->use_regex = true;
        return get_bool(p, "add_prefix_space", &pt->add_prefix_space, file, where, err) < 0 ||
                       get_bool(p, "use_regex", &pt->use_regex, file, where, err) < 0
                   ? -1
                   : 0;
    }
    if (!strcmp(type, "Split")) {
        pt->kind = PRE_SPLIT, pt->behavior = SPLIT_REMOVED;
        if (load_behavior(p, &pt->behavior, file, where, err) < 0 || get_bool(p, "invert", &pt->invert, file, where, err) < 0)
            return -1;
        return load_pattern(p, &pt->pattern, file, where, err);
    }
    if (!strcmp(type, "Digits")) {
        pt->kind = PRE_DIGITS;
        return get_bool(p, "individual_digits", &pt->individual_digits, file, where, err);
    }
    if (!strcmp(type, "Metaspace")) {
        pt->kind = PRE_METASPACE, pt->split = true;
        if (load_char(p, "replacement", pt->replacement, &pt->replacement_len, file, where, err) < 0 ||
            load_prepend_scheme(p, &pt->prepend, file, where, err) < 0)
            return -1;
        return get_bool(p, "split", &pt->split, file, where, err);
    }
    if (!strcmp(type, "Whitespace")) {
        pt->kind = PRE_WHITESPACE;
        pt->pattern.regex = tok_regex_compile(whitespace_pattern, sizeof whitespace_pattern - 1, REGEX_RUST, file, where, err);
        return pt->pattern.regex ? 0 : -1;
    }
    if (!strcmp(type, "WhitespaceSplit")) {
        pt->kind = PRE_WHITESPACE_SPLIT;
        return 0;
    }
    if (!strcmp(type, "Punctuation")) {
        pt->kind = PRE_PUNCTUATION, pt->behavior = SPLIT_ISOLATED;
        return load_behavior(p, &pt->behavior, file, where, err);
    }
    return 1;
}

int tokenizer_load_pre_tokenizer(neox_tokenizer *tok, json_t *p, const char *file, const char *where, neox_error *err) {
    if (!p || json_is_null(p)) return 0;
    const char *type = json_is_object(p) ? type_of(p) : NULL;
    if (type && !strcmp(type, "Sequence"))
        return load_each(tok, p, "pretokenizers", file, where, tokenizer_load_pre_tokenizer, err);
    if (!type) return unsupported(err, file, where, p);
    if (tok->n_pretokenizers == TOK_MAX_COMPONENTS) return too_many(err, file, where);
    // The BPE model sees ByteLevel's output as raw bytes, so nothing may follow it.
    if (tok->n_pretokenizers > 0 && tok->pretokenizers[tok->n_pretokenizers - 1].kind == PRE_BYTELEVEL)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s: %s: a pre-tokenizer after ByteLevel is not supported", file, where);
    tok_pretokenizer pt = {0};
    int rc = load_one_pre_tokenizer(&pt, p, type, file, where, err);
    if (rc > 0) return unsupported(err, file, where, p);
    tok->pretokenizers[tok->n_pretokenizers++] = pt;  // also on failure, so it is freed
    return rc;
}

// ---------------------------------------------------------------------------------------------
// Decoders.
static int load_one_decoder(tok_decoder *d, json_t *j, const char *type, const char *file, const char *where,
                            neox_error *err) {
    const char *s = NULL;
    size_t len = 0;
    if (!strcmp(type, "ByteLevel")) d->kind = DEC_BYTELEVEL;
    else if (!strcmp(type, "ByteFallback")) d->kind = DEC_BYTE_FALLBACK;
    else if (!strcmp(type, "Fuse")) d->kind = DEC_FUSE;
    else if (!strcmp(type, "Metaspace")) {
        d->kind = DEC_METASPACE;
        return load_char(j, "replacement", d->replacement, &d->replacement_len, file, where, err) < 0
                   ? -1
                   : load_prepend_scheme(j, &d->prepend, file, where, err);
    } else if (!strcmp(type, "Strip")) {
        d->kind = DEC_STRIP;
        char c[8];
        size_t clen;
        if (load_char(j, "content", c, &clen, file, where, err) < 0 ||
            get_count(j, "start", &d->strip_start, file, where, err) < 0 ||
            get_count(j, "stop", &d->strip_stop, file, where, err) < 0)
            return -1;
        d->content = tok_bytes_dup(c, clen), d->content_len = clen;
    } else if (!strcmp(type, "Replace")) {
        d->kind = DEC_REPLACE;
        if (get_string(j, "content", &s, &len, file, where, err) < 0) return -1;
        d->content = tok_bytes_dup(s, len), d->content_len = len;
        return load_pattern(j, &d->pattern, file, where, err);
    } else if (!strcmp(type, "BPEDecoder")) {
        d->kind = DEC_BPE;
        s = "</w>", len = 4;  // HF's default suffix
        json_t *v = json_object_get(j, "suffix");
        if (v && !json_is_null(v) && get_string(j, "suffix", &s, &len, file, where, err) < 0) return -1;
        d->content = tok_bytes_dup(s, len), d->content_len = len;
    } else {
        return 1;
    }
    return 0;
}

int tokenizer_load_decoder(neox_tokenizer *tok, json_t *d, const char *file, const char *where, neox_error *err) {
    if (!d || json_is_null(d)) return 0;
    tok->has_decoder = true;
    const char *type = json_is_object(d) ? type_of(d) : NULL;
    if (type && !strcmp(type, "Sequence")) return load_each(tok, d, "decoders", file, where, tokenizer_load_decoder, err);
    if (!type) return unsupported(err, file, where, d);
    if (tok->n_decoders == TOK_MAX_COMPONENTS) return too_many(err, file, where);
    tok_decoder dec = {0};
    int rc = load_one_decoder(&dec, d, type, file, where, err);
    if (rc > 0) return unsupported(err, file, where, d);
    tok->decoders[tok->n_decoders++] = dec;
    return rc;
}

// ---------------------------------------------------------------------------------------------
// Post-processors. ByteLevel only trims offsets (ids unchanged); TemplateProcessing's "single"
// template puts its special tokens' ids around the text's (what HF's encode() adds by default).
static int load_template_piece(neox_tokenizer *tok, json_t *piece, json_t *specials, bool *seen_sequence,
                               const char *file, const char *where, neox_error *err) {
    if (json_is_object(json_object_get(piece, "Sequence"))) {
        if (*seen_sequence) return neox_fail(err, NEOX_EXIT_USAGE, "%s: %s: the template has two sequences", file, where);
        *seen_sequence = true;
        return 0;
    }
    json_t *special = json_object_get(piece, "SpecialToken");
    json_t *name = json_object_get(special, "id");
    if (!json_is_string(name)) return neox_fail(err, NEOX_EXIT_USAGE, "%s: %s must be a Sequence or a SpecialToken", file, where);
    json_t *ids = json_object_get(json_object_get(specials, json_string_value(name)), "ids");
    if (!json_is_array(ids))
        return neox_fail(err, NEOX_EXIT_USAGE, "%s: %s: special token \"%s\" is not in special_tokens", file, where,
                         json_string_value(name));
    size_t i;
    json_t *id;
    json_array_foreach(ids, i, id) {
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > INT32_MAX)
            return neox_fail(err, NEOX_EXIT_USAGE, "%s: special_tokens.%s.ids[%zu] is not a token id", file,
                             json_string_value(name), i);
        int32_t **list = *seen_sequence ? &tok->template_suffix : &tok->template_prefix;
        size_t *n = *seen_sequence ? &tok->n_template_suffix : &tok->n_template_prefix;
        *list = neox_realloc(*list, (*n + 1) * sizeof **list);
        (*list)[(*n)++] = (int32_t)json_integer_value(id);
    }
    return 0;
}

static int load_template(neox_tokenizer *tok, json_t *p, const char *file, const char *where, neox_error *err) {
    if (tok->n_template_prefix || tok->n_template_suffix)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s: %s: a second TemplateProcessing is not supported", file, where);
    json_t *single = json_object_get(p, "single");
    if (!json_is_array(single)) return neox_fail(err, NEOX_EXIT_USAGE, "%s: %s.single must be an array", file, where);
    json_t *specials = json_object_get(p, "special_tokens");
    bool seen_sequence = false;
    size_t i;
    json_t *piece;
    json_array_foreach(single, i, piece) {
        char at[256];
        snprintf(at, sizeof at, "%s.single[%zu]", where, i);
        if (load_template_piece(tok, piece, specials, &seen_sequence, file, at, err) < 0) return -1;
    }
    if (!seen_sequence) return neox_fail(err, NEOX_EXIT_USAGE, "%s: %s.single has no Sequence", file, where);
    return 0;
}

int tokenizer_load_post_processor(neox_tokenizer *tok, json_t *p, const char *file, const char *where,
                                  neox_error *err) {
    if (!p || json_is_null(p)) return 0;
    const char *type = json_is_object(p) ? type_of(p) : NULL;
    if (type && !strcmp(type, "Sequence"))
        return load_each(tok, p, "processors", file, where, tokenizer_load_post_processor, err);
    if (type && !strcmp(type, "ByteLevel")) return 0;
    if (type && !strcmp(type, "TemplateProcessing")) return load_template(tok, p, file, where, err);
    return unsupported(err, file, where, p);
}

void tokenizer_free_components(neox_tokenizer *tok) {
    for (int i = 0; i < tok->n_normalizers; i++) {
        pattern_free(&tok->normalizers[i].pattern);
        free(tok->normalizers[i].content);
    }
    for (int i = 0; i < tok->n_pretokenizers; i++) pattern_free(&tok->pretokenizers[i].pattern);
    for (int i = 0; i < tok->n_decoders; i++) {
        pattern_free(&tok->decoders[i].pattern);
        free(tok->decoders[i].content);
    }
    free(tok->template_prefix);
    free(tok->template_suffix);
}
