// tokenizer.c: the public tokenizer API (lib/tokenizer.h) — loading by GPT-NeoX tokenizer_type,
// the encode pipeline and decoding. Encoding follows HF tokenizers step by step: invalid UTF-8
// becomes U+FFFD (the string Python would hand HF), added tokens that match the raw text are cut
// out, the pieces between are normalized, added tokens that match normalized text are cut out,
// then each remaining piece is split by the GPT-2 regex and every word goes through BPE.
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "tokenizer_internal.h"

#define CHAR_LEVEL_VOCAB 512  // GPT-NeoX: CharLevelTokenizer(vocab_size=512)

// ---------------------------------------------------------------------------------------------
// Id table and added tokens.
int tokenizer_set_id_text(neox_tokenizer *tok, int32_t id, const char *text, size_t len, const char *file,
                          neox_error *err) {
    if (id < 0) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: negative id %d", file, id);
    if (id >= tok->n_ids) {
        int32_t n = tok->n_ids ? tok->n_ids : 1024;
        while (n <= id) n *= 2;
        tok->id_text = neox_realloc(tok->id_text, (size_t)n * sizeof *tok->id_text);
        tok->id_is_special = neox_realloc(tok->id_is_special, (size_t)n);
        memset(tok->id_text + tok->n_ids, 0, (size_t)(n - tok->n_ids) * sizeof *tok->id_text);
        memset(tok->id_is_special + tok->n_ids, 0, (size_t)(n - tok->n_ids));
        tok->n_ids = n;
    }
    if (tok->id_text[id])
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: id %d is used by both \"%s\" and \"%.*s\"", file, id,
                         tok->id_text[id], (int)len, text);
    tok->id_text[id] = neox_strndup(text, len);
    return 0;
}

static int32_t added_id_of(const neox_tokenizer *tok, const char *content, size_t len) {
    for (size_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].len == len && !memcmp(tok->added[i].content, content, len)) return tok->added[i].id;
    return -1;
}

int tokenizer_add_token(neox_tokenizer *tok, const char *content, size_t len, int32_t id, bool special,
                        bool normalized, bool lstrip, bool rstrip, const char *file, neox_error *err) {
    if (len == 0) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: an added token has empty content", file);
    if (memchr(content, 0, len)) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: an added token contains a NUL", file);
    // Ids as HF's AddedVocabulary assigns them: the model's id for a token it knows, the id of an
    // earlier identical added token, else one past the largest (at least the model's size).
    bool is_new = false;
    if (id < 0) id = strmap_get(&tok->bpe.vocab, content, len);
    if (id < 0) id = added_id_of(tok, content, len);
    if (id < 0) {
        int32_t model_size = (int32_t)tok->bpe.vocab.count, max = -1;
        for (size_t i = 0; i < tok->n_added; i++)
            if (tok->added[i].id > max) max = tok->added[i].id;
        id = max >= model_size ? max + 1 : model_size;
        is_new = true;
    }
    tok->added = neox_realloc(tok->added, (tok->n_added + 1) * sizeof *tok->added);
    tok->added[tok->n_added++] = (added_token){neox_strndup(content, len), len, id, special, normalized, lstrip, rstrip};
    if (is_new) {
        if (tokenizer_set_id_text(tok, id, content, len, file, err) < 0) return -1;
        tok->vocab_size++;
    } else if (id < tok->n_ids && !tok->id_text[id]) {
        if (tokenizer_set_id_text(tok, id, content, len, file, err) < 0) return -1;
    }
    if (special) tok->id_is_special[id] = 1;
    return 0;
}

void tokenizer_finish_added(neox_tokenizer *tok) {
    added_matcher_init(&tok->raw_matcher);
    added_matcher_init(&tok->normalized_matcher);
    for (size_t i = 0; i < tok->n_added; i++) {
        added_token *t = &tok->added[i];
        if (!t->normalized) {
            added_matcher_add(&tok->raw_matcher, t->content, t->len, (int32_t)i);
            tok->has_raw_added = true;
            continue;
        }
        // A normalized token is matched against normalized text, so match its normalized form.
        size_t nlen = t->len;
        char *norm = tokenizer_normalize(tok, t->content, t->len, &nlen);
        added_matcher_add(&tok->normalized_matcher, norm ? norm : t->content, nlen, (int32_t)i);
        free(norm);
        tok->has_normalized_added = true;
    }
}

static int32_t token_to_id(const neox_tokenizer *tok, const char *text) {
    int32_t id = added_id_of(tok, text, strlen(text));
    return id >= 0 ? id : strmap_get(&tok->bpe.vocab, text, strlen(text));
}

int32_t neox_tokenizer_token_to_id(const neox_tokenizer *tok, const char *token) { return token_to_id(tok, token); }

// ---------------------------------------------------------------------------------------------
// The declared beginning-of-sequence token: transformers reads "bos_token" (a string, or an
// AddedToken object with "content") from these files of the tokenizer's folder, in this order.
static int bos_from_folder(neox_tokenizer *tok, const char *vocab_file, neox_error *err) {
    static const char *const files[] = {"tokenizer_config.json", "special_tokens_map.json"};
    const char *slash = strrchr(vocab_file, '/');
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char *path = slash ? neox_asprintf("%.*s/%s", (int)(slash - vocab_file), vocab_file, files[i]) : neox_strdup(files[i]);
        json_error_t jerr;
        json_t *root = access(path, F_OK) == 0 ? json_load_file(path, 0, &jerr) : NULL;
        if (access(path, F_OK) == 0 && !root) {
            neox_fail(err, NEOX_EXIT_FAILURE, "%s:%d: %s", path, jerr.line, jerr.text);
            free(path);
            return -1;
        }
        json_t *bos = json_object_get(root, "bos_token");
        if (json_is_object(bos)) bos = json_object_get(bos, "content");
        int rc = 0;
        if (json_is_string(bos)) {
            tok->bos_id = token_to_id(tok, json_string_value(bos));
            if (tok->bos_id < 0)
                rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: bos_token '%s' is not a token of %s", path,
                               json_string_value(bos), vocab_file);
        }
        json_decref(root);
        free(path);
        if (rc != 0 || tok->bos_id >= 0) return rc;
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Loading.
static const char *const refused_types[] = {"SPMTokenizer", "TiktokenTokenizer", NULL};

neox_tokenizer *neox_tokenizer_load(const neox_tokenizer_options *opts, neox_error *err) {
    const char *type = opts->type ? opts->type : "";
    neox_tokenizer *tok = neox_calloc(1, sizeof *tok);
    tok->pad_id = -1;
    tok->bos_id = -1;
    int rc = 0;
    // GPT-NeoX compares tokenizer_type case-insensitively.
    if (!strcasecmp(type, "CharLevelTokenizer")) {
        snprintf(tok->type, sizeof tok->type, "CharLevelTokenizer");
        tok->kind = TOK_CHAR;
        tok->vocab_size = CHAR_LEVEL_VOCAB;
        tok->eod_id = 0, tok->pad_id = 1;
        return tok;
    }
    tok->kind = TOK_BPE;
    if (!strcasecmp(type, "GPT2BPETokenizer") || !strcasecmp(type, "HFGPT2Tokenizer")) {
        bool hf = !strcasecmp(type, "HFGPT2Tokenizer");
        snprintf(tok->type, sizeof tok->type, "%s", hf ? "HFGPT2Tokenizer" : "GPT2BPETokenizer");
        if (!opts->vocab_file || !opts->merge_file) {
            neox_fail(err, NEOX_EXIT_USAGE, "%s needs a vocab file (vocab.json) and a merge file (merges.txt)", tok->type);
            goto fail;
        }
        rc = tokenizer_load_gpt2_files(tok, opts->vocab_file, opts->merge_file, err);
        if (rc < 0) goto fail;
        if (hf) {  // GPT2TokenizerFast: <|endoftext|> is special; GPT-NeoX adds <|padding|>
            if (tokenizer_add_token(tok, "<|endoftext|>", 13, -1, true, false, false, false, opts->vocab_file, err) < 0 ||
                tokenizer_add_token(tok, "<|padding|>", 11, -1, true, false, false, false, opts->vocab_file, err) < 0)
                goto fail;
        }
    } else if (!strcasecmp(type, "HFTokenizer")) {
        snprintf(tok->type, sizeof tok->type, "HFTokenizer");
        if (!opts->vocab_file) {
            neox_fail(err, NEOX_EXIT_USAGE, "HFTokenizer needs a vocab file (a tokenizers JSON file)");
            goto fail;
        }
        tok->vocab_size = 0;
        if (tokenizer_load_hf_json(tok, opts->vocab_file, err) < 0) goto fail;
        tok->vocab_size += (int64_t)tok->bpe.vocab.count;
    } else {
        for (const char *const *r = refused_types; *r; r++)
            if (!strcasecmp(type, *r)) {
                neox_fail(err, NEOX_EXIT_USAGE, "tokenizer type '%s' is not supported by neox.c", *r);
                goto fail;
            }
        neox_fail(err, NEOX_EXIT_USAGE,
                  "unknown tokenizer type '%s' (expected GPT2BPETokenizer, HFTokenizer, HFGPT2Tokenizer or "
                  "CharLevelTokenizer)", type);
        goto fail;
    }
    tokenizer_finish_added(tok);
    tok->eod_id = token_to_id(tok, "<|endoftext|>");
    if (!strcmp(tok->type, "GPT2BPETokenizer") && tok->eod_id < 0) {
        neox_fail(err, NEOX_EXIT_FAILURE, "%s: the vocabulary has no <|endoftext|> token", opts->vocab_file);
        goto fail;
    }
    if (strcmp(tok->type, "GPT2BPETokenizer")) tok->pad_id = token_to_id(tok, "<|padding|>");
    if (bos_from_folder(tok, opts->vocab_file, err) != 0) goto fail;
    return tok;
fail:
    neox_tokenizer_free(tok);
    return NULL;
}

void neox_tokenizer_free(neox_tokenizer *tok) {
    if (!tok) return;
    for (int32_t i = 0; i < tok->n_ids; i++) free(tok->id_text[i]);
    free(tok->id_text);
    free(tok->id_is_special);
    for (size_t i = 0; i < tok->n_added; i++) free(tok->added[i].content);
    free(tok->added);
    added_matcher_free(&tok->raw_matcher);
    added_matcher_free(&tok->normalized_matcher);
    bpe_free(&tok->bpe);
    free(tok);
}

int64_t neox_tokenizer_vocab_size(const neox_tokenizer *tok) { return tok->vocab_size; }
int32_t neox_tokenizer_eod_id(const neox_tokenizer *tok) { return tok->eod_id; }
int32_t neox_tokenizer_bos_id(const neox_tokenizer *tok) { return tok->bos_id; }
int32_t neox_tokenizer_pad_id(const neox_tokenizer *tok) { return tok->pad_id; }
const char *neox_tokenizer_type(const neox_tokenizer *tok) { return tok->type; }

int neox_tokenizer_adds_prefix_space(const neox_tokenizer *tok) { return tok->add_prefix_space != 0; }

const char *neox_tokenizer_id_to_token(const neox_tokenizer *tok, int32_t id) {
    if (tok->kind == TOK_CHAR || id < 0 || id >= tok->n_ids) return NULL;
    return tok->id_text[id];
}

// ---------------------------------------------------------------------------------------------
// Encoding.
typedef struct id_out { int32_t **ids; size_t *len, *cap; } id_out;

static void push_id(id_out *o, int32_t id) {
    if (*o->len == *o->cap) {
        *o->cap = *o->cap ? *o->cap * 2 : 1024;
        *o->ids = neox_realloc(*o->ids, *o->cap * sizeof **o->ids);
    }
    (*o->ids)[(*o->len)++] = id;
}

// Pre-tokenizes one piece (ByteLevel: optional prefix space, GPT-2 regex) and runs BPE on each word.
static void encode_words(const neox_tokenizer *tok, const uint8_t *s, size_t n, id_out *o) {
    if (n == 0) return;
    char *prefixed = NULL;
    if (tok->add_prefix_space && s[0] != ' ') {
        prefixed = neox_malloc(n + 1);
        prefixed[0] = ' ';
        memcpy(prefixed + 1, s, n);
        s = (const uint8_t *)prefixed, n++;
    }
    if (!tok->use_regex) {
        bpe_encode_word(&tok->bpe, s, n, o->ids, o->len, o->cap);
    } else {
        for (size_t pos = 0; pos < n;) {
            size_t len = pretok_gpt2_next(s, n, pos);
            bpe_encode_word(&tok->bpe, s + pos, len, o->ids, o->len, o->cap);
            pos += len;
        }
    }
    free(prefixed);
}

static size_t strip_left(const uint8_t *s, size_t floor, size_t start) {
    // Moves start back over whitespace, not before floor (HF: lstrip, bounded by the previous split).
    size_t i = start;
    while (i > floor) {
        size_t j = i - 1;
        while (j > floor && (s[j] & 0xC0) == 0x80) j--;
        int len;
        int32_t cp = utf8_decode(s + j, i - j, &len);
        if (cp < 0 || !unicode_is_space(cp)) break;
        i = j;
    }
    return i;
}

static size_t strip_right(const uint8_t *s, size_t n, size_t stop) {
    while (stop < n) {
        int len;
        int32_t cp = utf8_decode(s + stop, n - stop, &len);
        if (cp < 0 || !unicode_is_space(cp)) break;
        stop += (size_t)len;
    }
    return stop;
}

typedef void (*piece_fn)(const neox_tokenizer *tok, const uint8_t *s, size_t n, id_out *o);

// Splits s on the added tokens of matcher m (HF's split_with_indices), emitting token ids and
// passing the text between to piece().
static void split_added(const neox_tokenizer *tok, const added_matcher *m, const uint8_t *s, size_t n, id_out *o,
                        piece_fn piece) {
    size_t offset = 0, from = 0;
    while (from < n) {
        size_t mlen;
        int32_t index;
        size_t start = added_matcher_find(m, s, n, from, &mlen, &index);
        if (start >= n) break;
        const added_token *t = &tok->added[index];
        size_t stop = start + mlen;
        from = stop;
        if (t->lstrip) start = strip_left(s, offset, start);
        if (t->rstrip) stop = strip_right(s, n, stop);
        if (offset < start) piece(tok, s + offset, start - offset, o);
        push_id(o, t->id);
        offset = stop;
    }
    if (offset < n) piece(tok, s + offset, n - offset, o);
}

static void encode_normalized(const neox_tokenizer *tok, const uint8_t *s, size_t n, id_out *o) {
    if (tok->has_normalized_added) split_added(tok, &tok->normalized_matcher, s, n, o, encode_words);
    else encode_words(tok, s, n, o);
}

static void encode_raw_piece(const neox_tokenizer *tok, const uint8_t *s, size_t n, id_out *o) {
    size_t nn;
    char *norm = tokenizer_normalize(tok, (const char *)s, n, &nn);
    if (norm) encode_normalized(tok, (const uint8_t *)norm, nn, o);
    else encode_normalized(tok, s, n, o);
    free(norm);
}

int64_t neox_tokenizer_encode(const neox_tokenizer *tok, const char *text, size_t size, int32_t **ids, size_t *len,
                              size_t *cap, neox_error *err) {
    (void)err;  // encoding cannot fail: every input has an encoding
    size_t before = *len;
    char *fixed = NULL;
    if (utf8_valid_prefix((const uint8_t *)text, size) != size) {
        fixed = utf8_replace_invalid((const uint8_t *)text, size, &size);
        text = fixed;
    }
    id_out o = {ids, len, cap};
    const uint8_t *s = (const uint8_t *)text;
    if (tok->kind == TOK_CHAR) {
        for (size_t i = 0; i < size; i++) push_id(&o, s[i]);
    } else if (tok->has_raw_added) {
        split_added(tok, &tok->raw_matcher, s, size, &o, encode_raw_piece);
    } else {
        encode_raw_piece(tok, s, size, &o);
    }
    free(fixed);
    return (int64_t)(*len - before);
}

// ---------------------------------------------------------------------------------------------
// Decoding.
static void append(char **buf, size_t *len, size_t *cap, const void *data, size_t n) {
    if (*len + n + 1 > *cap) {
        *cap = (*len + n + 1) * 2;
        *buf = neox_realloc(*buf, *cap);
    }
    memcpy(*buf + *len, data, n);
    *len += n;
    (*buf)[*len] = 0;
}

char *neox_tokenizer_decode(const neox_tokenizer *tok, const int32_t *ids, size_t n, size_t *size, neox_error *err) {
    char *buf = neox_malloc(64);
    size_t len = 0, cap = 64;
    int32_t bad = 0;
    buf[0] = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = bad = ids[i];
        if (tok->kind == TOK_CHAR) {
            if (id < 0 || id >= tok->vocab_size) goto bad_id;
            // GPT-NeoX: chr(max(32, min(id, vocab_size))) for each id.
            char u[4];
            append(&buf, &len, &cap, u, (size_t)utf8_encode((uint32_t)(id < 32 ? 32 : id), u));
            continue;
        }
        if (id < 0 || id >= tok->n_ids || !tok->id_text[id]) goto bad_id;
        if (tok->skip_special_on_decode && tok->id_is_special[id]) continue;
        const char *t = tok->id_text[id];
        size_t tlen = strlen(t);
        if (!tok->bytelevel_decoder) {  // HF without a decoder joins the tokens with spaces
            if (len) append(&buf, &len, &cap, " ", 1);
            append(&buf, &len, &cap, t, tlen);
            continue;
        }
        // ByteLevel decoder: alphabet chars back to bytes; a token with any other char keeps its
        // UTF-8 text (HF does the same, e.g. for added tokens made of plain spaces).
        if (len + tlen + 1 > cap) {
            cap = (len + tlen + 1) * 2;
            buf = neox_realloc(buf, cap);
        }
        long got = bytelevel_decode(t, tlen, (uint8_t *)buf + len);
        if (got < 0) append(&buf, &len, &cap, t, tlen);
        else len += (size_t)got, buf[len] = 0;
    }
    // Byte sequences that are not UTF-8 decode as U+FFFD (errors='replace' / from_utf8_lossy).
    if (utf8_valid_prefix((const uint8_t *)buf, len) != len) {
        char *fixed = utf8_replace_invalid((const uint8_t *)buf, len, &len);
        free(buf);
        buf = fixed;
    }
    *size = len;
    return buf;
bad_id:
    free(buf);
    neox_fail(err, NEOX_EXIT_FAILURE, "token id %d is out of range for %s (vocabulary of %lld)", bad, tok->type,
              (long long)tok->vocab_size);
    return NULL;
}
