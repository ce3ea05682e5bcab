// tokenizer.c: the public tokenizer API (lib/tokenizer.h) — loading by GPT-NeoX tokenizer_type,
// the encode pipeline and decoding. Encoding follows HF tokenizers step by step: invalid UTF-8
// becomes U+FFFD (the string Python would hand HF), added tokens that match the raw text are cut
// out, the pieces between are normalized, added tokens that match normalized text are cut out,
// then each remaining piece is split by the GPT-2 regex and every word goes through BPE.
#include <omp.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "spm.h"
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
        char *norm = tokenizer_normalize(tok, t->content, t->len, false, &nlen);
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
// The declared special tokens: transformers reads "bos_token", "eos_token", "pad_token" and
// "unk_token" (each a string, or an AddedToken object with "content") from tokenizer_config.json of
// the tokenizer's folder, and from special_tokens_map.json for a key tokenizer_config.json lacks.
static const char *const special_keys[NEOX_SPECIAL_COUNT] = {"bos_token", "eos_token", "pad_token", "unk_token"};

static int special_from_file(neox_tokenizer *tok, const char *path, const char *vocab_file, neox_error *err) {
    if (access(path, F_OK) != 0) return 0;
    json_error_t jerr;
    // Only strings are read; integers as reals, so transformers' "unset" model_max_length (1e30) loads.
    json_t *root = json_load_file(path, JSON_DECODE_INT_AS_REAL, &jerr);
    if (!root) return neox_fail(err, NEOX_EXIT_FAILURE, "%s:%d: %s", path, jerr.line, jerr.text);
    int rc = 0;
    for (int k = 0; k < NEOX_SPECIAL_COUNT && rc == 0; k++) {
        json_t *v = json_object_get(root, special_keys[k]);
        if (json_is_object(v)) v = json_object_get(v, "content");
        if (tok->declared[k] >= 0 || !json_is_string(v)) continue;
        tok->declared[k] = token_to_id(tok, json_string_value(v));
        if (tok->declared[k] < 0)
            rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s '%s' is not a token of %s", path, special_keys[k],
                           json_string_value(v), vocab_file);
    }
    json_decref(root);
    return rc;
}

static int special_from_folder(neox_tokenizer *tok, const char *vocab_file, neox_error *err) {
    static const char *const files[] = {"tokenizer_config.json", "special_tokens_map.json"};
    int rc = 0;
    for (size_t i = 0; i < sizeof files / sizeof *files && rc == 0; i++) {
        char *path = neox_path_beside(vocab_file, files[i]);
        rc = special_from_file(tok, path, vocab_file, err);
        free(path);
    }
    return rc;
}

// ---------------------------------------------------------------------------------------------
// Loading.
static int load_gpt2(neox_tokenizer *tok, const neox_tokenizer_options *opts, bool hf, neox_error *err) {
    snprintf(tok->type, sizeof tok->type, "%s", hf ? "HFGPT2Tokenizer" : "GPT2BPETokenizer");
    if (!opts->vocab_file || !opts->merge_file)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s needs a vocab file (vocab.json) and a merge file (merges.txt)",
                         tok->type);
    if (tokenizer_load_gpt2_files(tok, opts->vocab_file, opts->merge_file, err) < 0) return -1;
    if (!hf) return 0;
    // GPT2TokenizerFast: <|endoftext|> is special; GPT-NeoX adds <|padding|>
    if (tokenizer_add_token(tok, "<|endoftext|>", 13, -1, true, false, false, false, opts->vocab_file, err) < 0 ||
        tokenizer_add_token(tok, "<|padding|>", 11, -1, true, false, false, false, opts->vocab_file, err) < 0)
        return -1;
    return 0;
}

static int load_hf(neox_tokenizer *tok, const neox_tokenizer_options *opts, neox_error *err) {
    snprintf(tok->type, sizeof tok->type, "HFTokenizer");
    if (!opts->vocab_file) return neox_fail(err, NEOX_EXIT_USAGE, "HFTokenizer needs a vocab file (a tokenizers JSON file)");
    tok->vocab_size = 0;
    if (tokenizer_load_hf_json(tok, opts->vocab_file, err) < 0) return -1;
    tok->vocab_size += (int64_t)tok->bpe.vocab.count;
    return 0;
}

// The types whose files carry their own special tokens: eod, pad and bos come from the loader.
static int load_self_described(neox_tokenizer *tok, const neox_tokenizer_options *opts, bool tiktoken,
                               neox_error *err) {
    snprintf(tok->type, sizeof tok->type, "%s", tiktoken ? "TiktokenTokenizer" : "SPMTokenizer");
    if (!opts->vocab_file)
        return neox_fail(err, NEOX_EXIT_USAGE, "%s needs a vocab file (%s)", tok->type,
                         tiktoken ? "a tiktoken rank file" : "a SentencePiece .model file");
    tok->eod_id = tok->pad_id = -1;
    if (tiktoken) return tokenizer_load_tiktoken(tok, opts->vocab_file, err);
    tok->kind = TOK_SPM;
    return tokenizer_load_spm(tok, opts->vocab_file, err);
}

neox_tokenizer *neox_tokenizer_load(const neox_tokenizer_options *opts, neox_error *err) {
    const char *type = opts->type ? opts->type : "";
    neox_tokenizer *tok = neox_calloc(1, sizeof *tok);
    tok->pad_id = -1;
    for (int k = 0; k < NEOX_SPECIAL_COUNT; k++) tok->declared[k] = -1;
    tok->kind = TOK_BPE;
    int rc;
    // GPT-NeoX compares tokenizer_type case-insensitively.
    if (!strcasecmp(type, "CharLevelTokenizer")) {
        snprintf(tok->type, sizeof tok->type, "CharLevelTokenizer");
        tok->kind = TOK_CHAR;
        tok->vocab_size = CHAR_LEVEL_VOCAB;
        tok->eod_id = 0, tok->pad_id = 1;
        tokenizer_plan_cuts(tok);
        return tok;
    }
    bool self_described = !strcasecmp(type, "TiktokenTokenizer") || !strcasecmp(type, "SPMTokenizer");
    if (!strcasecmp(type, "GPT2BPETokenizer") || !strcasecmp(type, "HFGPT2Tokenizer")) {
        rc = load_gpt2(tok, opts, !strcasecmp(type, "HFGPT2Tokenizer"), err);
    } else if (!strcasecmp(type, "HFTokenizer")) {
        rc = load_hf(tok, opts, err);
    } else if (self_described) {
        rc = load_self_described(tok, opts, !strcasecmp(type, "TiktokenTokenizer"), err);
    } else {
        rc = neox_fail(err, NEOX_EXIT_USAGE,
                       "unknown tokenizer type '%s' (expected GPT2BPETokenizer, HFTokenizer, HFGPT2Tokenizer, "
                       "SPMTokenizer, TiktokenTokenizer or CharLevelTokenizer)", type);
    }
    if (rc < 0) goto fail;
    if (tok->kind != TOK_SPM) tokenizer_plan_cuts(tok);  // spm.c decides for SentencePiece models
    if (self_described) return tok;
    tokenizer_finish_added(tok);
    tok->eod_id = token_to_id(tok, "<|endoftext|>");
    if (!strcmp(tok->type, "GPT2BPETokenizer") && tok->eod_id < 0) {
        neox_fail(err, NEOX_EXIT_FAILURE, "%s: the vocabulary has no <|endoftext|> token", opts->vocab_file);
        goto fail;
    }
    if (strcmp(tok->type, "GPT2BPETokenizer")) tok->pad_id = token_to_id(tok, "<|padding|>");
    if (special_from_folder(tok, opts->vocab_file, err) != 0) goto fail;
    // GPT-NeoX finds no end of document in a tokenizer without <|endoftext|> (Llama 3's, Qwen's
    // <|endoftext|> aside): the declared eos_token serves, as it ends documents for those models.
    if (tok->eod_id < 0) tok->eod_id = tok->declared[NEOX_SPECIAL_EOS];
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
    spm_free(tok);
    tokenizer_free_components(tok);
    free(tok);
}

int64_t neox_tokenizer_vocab_size(const neox_tokenizer *tok) { return tok->vocab_size; }
int32_t neox_tokenizer_eod_id(const neox_tokenizer *tok) { return tok->eod_id; }
int32_t neox_tokenizer_bos_id(const neox_tokenizer *tok) { return tok->declared[NEOX_SPECIAL_BOS]; }
int32_t neox_tokenizer_declared_id(const neox_tokenizer *tok, neox_special which) {
    return which >= 0 && which < NEOX_SPECIAL_COUNT ? tok->declared[which] : -1;
}
int32_t neox_tokenizer_pad_id(const neox_tokenizer *tok) { return tok->pad_id; }
const char *neox_tokenizer_type(const neox_tokenizer *tok) { return tok->type; }

int neox_tokenizer_adds_prefix_space(const neox_tokenizer *tok) { return tok->add_prefix_space != 0; }

const char *neox_tokenizer_id_to_token(const neox_tokenizer *tok, int32_t id) {
    if (tok->kind == TOK_CHAR || id < 0 || id >= tok->n_ids) return NULL;
    return tok->id_text[id];
}

// ---------------------------------------------------------------------------------------------
// Encoding.
// continued: the text being encoded starts at a cut (cut.c) inside a split of the whole text, so
// what HF puts at the start of a split is not put there; cleared once the first split is passed.
typedef struct id_out { int32_t **ids; size_t *len, *cap; bool continued; } id_out;

static void push_id(id_out *o, int32_t id) {
    if (*o->len == *o->cap) {
        *o->cap = *o->cap ? *o->cap * 2 : 1024;
        *o->ids = neox_realloc(*o->ids, *o->cap * sizeof **o->ids);
    }
    (*o->ids)[(*o->len)++] = id;
}

// A long text inside an OpenMP team (a caller encoding documents in parallel) has its words cut
// into blocks that idle threads of the team encode as tasks: the thread holding the largest
// document then no longer decides when the team is done. The ids are the same, since BPE encodes
// each word on its own; the blocks' ids are joined in order.
#define PARALLEL_WORDS 16384

typedef struct id_block { int32_t *ids; size_t n, cap; } id_block;

static void encode_pieces(const neox_tokenizer *tok, const uint8_t *base, const tok_piece *w, size_t n, id_out *o) {
    int team = omp_in_parallel() ? omp_get_num_threads() : 1;
    if (n < PARALLEL_WORDS || team < 2) {
        for (size_t i = 0; i < n; i++) bpe_encode_word(&tok->bpe, base + w[i].off, w[i].len, o->ids, o->len, o->cap);
        return;
    }
    size_t nblocks = (size_t)team * 4, per = (n + nblocks - 1) / nblocks;
    id_block *blocks = neox_calloc(nblocks, sizeof *blocks);
    for (size_t b = 0; b < nblocks; b++) {
        #pragma omp task firstprivate(b) shared(blocks)
        for (size_t i = b * per; i < n && i < (b + 1) * per; i++)
            bpe_encode_word(&tok->bpe, base + w[i].off, w[i].len, &blocks[b].ids, &blocks[b].n, &blocks[b].cap);
    }
    #pragma omp taskwait
    for (size_t b = 0; b < nblocks; b++) {
        for (size_t i = 0; i < blocks[b].n; i++) push_id(o, blocks[b].ids[i]);
        free(blocks[b].ids);
    }
    free(blocks);
}

// The GPT-2 pre-tokenizer's words of s, for encode_pieces.
static tok_piece *gpt2_words(const uint8_t *s, size_t n, size_t *count) {
    size_t cap = n / 4 + 16, k = 0;
    tok_piece *w = neox_malloc(cap * sizeof *w);
    for (size_t pos = 0; pos < n; k++) {
        if (k == cap) w = neox_realloc(w, (cap *= 2) * sizeof *w);
        size_t len = pretok_gpt2_next(s, n, pos);
        w[k] = (tok_piece){pos, len, false};
        pos += len;
    }
    *count = k;
    return w;
}

// Pre-tokenizes one normalized piece and runs BPE on each word. A lone ByteLevel pre-tokenizer
// (GPT-2, GPT-NeoX-20B) is written out here without the general pipeline's copies.
static int encode_words(const neox_tokenizer *tok, const uint8_t *s, size_t n, bool first, id_out *o, neox_error *err) {
    if (n == 0) return 0;
    if (!tok->bytelevel_only) {
        tok_pieces words = {0};
        int rc = tokenizer_pretokenize(tok, (const char *)s, n, first, &words, err);
        if (rc == 0) encode_pieces(tok, (const uint8_t *)words.text, words.items, words.n, o);
        pieces_free(&words);
        return rc;
    }
    char *prefixed = NULL;
    if (tok->add_prefix_space && s[0] != ' ') {
        prefixed = neox_malloc(n + 1);
        prefixed[0] = ' ';
        memcpy(prefixed + 1, s, n);
        s = (const uint8_t *)prefixed, n++;
    }
    if (!tok->use_regex) {
        bpe_encode_word(&tok->bpe, s, n, o->ids, o->len, o->cap);
    } else if (n >= PARALLEL_WORDS * 4 && omp_in_parallel()) {
        size_t count;
        tok_piece *w = gpt2_words(s, n, &count);
        encode_pieces(tok, s, w, count, o);
        free(w);
    } else {
        for (size_t pos = 0; pos < n;) {
            size_t len = pretok_gpt2_next(s, n, pos);
            bpe_encode_word(&tok->bpe, s + pos, len, o->ids, o->len, o->cap);
            pos += len;
        }
    }
    free(prefixed);
    return 0;
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

// What is done with the text between added tokens; first: it starts the original text.
typedef int (*piece_fn)(const neox_tokenizer *tok, const uint8_t *s, size_t n, bool first, id_out *o,
                        neox_error *err);

// Splits s on the added tokens of matcher m (HF's split_with_indices), emitting token ids and
// passing the text between to piece().
static int split_added(const neox_tokenizer *tok, const added_matcher *m, const uint8_t *s, size_t n, bool first,
                       id_out *o, piece_fn piece, neox_error *err) {
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
        if (offset < start && piece(tok, s + offset, start - offset, first && offset == 0, o, err) < 0) return -1;
        push_id(o, t->id);
        o->continued = false;
        offset = stop;
    }
    if (offset < n) return piece(tok, s + offset, n - offset, first && offset == 0, o, err);
    return 0;
}

static int encode_normalized(const neox_tokenizer *tok, const uint8_t *s, size_t n, bool first, id_out *o,
                             neox_error *err) {
    if (tok->has_normalized_added) return split_added(tok, &tok->normalized_matcher, s, n, first, o, encode_words, err);
    return encode_words(tok, s, n, first, o, err);
}

static int encode_raw_piece(const neox_tokenizer *tok, const uint8_t *s, size_t n, bool first, id_out *o,
                            neox_error *err) {
    size_t nn;
    char *norm = tokenizer_normalize(tok, (const char *)s, n, o->continued, &nn);
    o->continued = false;
    int rc = norm ? encode_normalized(tok, (const uint8_t *)norm, nn, first, o, err)
                  : encode_normalized(tok, s, n, first, o, err);
    free(norm);
    return rc;
}

int64_t tokenizer_encode_span(const neox_tokenizer *tok, const char *text, size_t size, bool starts, bool ends,
                              int32_t **ids, size_t *len, size_t *cap, neox_error *err) {
    size_t before = *len;
    char *fixed = NULL;
    if (utf8_valid_prefix((const uint8_t *)text, size) != size) {
        fixed = utf8_replace_invalid((const uint8_t *)text, size, &size);
        text = fixed;
    }
    id_out o = {ids, len, cap, !starts};
    const uint8_t *s = (const uint8_t *)text;
    int rc = 0;
    if (tok->kind == TOK_CHAR) {
        for (size_t i = 0; i < size; i++) push_id(&o, s[i]);
    } else if (tok->kind == TOK_SPM) {
        rc = spm_encode(tok, text, size, ids, len, cap, err);
    } else {
        for (size_t i = 0; starts && i < tok->n_template_prefix; i++) push_id(&o, tok->template_prefix[i]);
        rc = tok->has_raw_added ? split_added(tok, &tok->raw_matcher, s, size, starts, &o, encode_raw_piece, err)
                                : encode_raw_piece(tok, s, size, starts, &o, err);
        for (size_t i = 0; ends && i < tok->n_template_suffix; i++) push_id(&o, tok->template_suffix[i]);
    }
    free(fixed);
    if (rc < 0) {
        *len = before;
        return -1;
    }
    return (int64_t)(*len - before);
}

int64_t neox_tokenizer_encode(const neox_tokenizer *tok, const char *text, size_t size, int32_t **ids, size_t *len,
                              size_t *cap, neox_error *err) {
    return tokenizer_encode_span(tok, text, size, true, true, ids, len, cap, err);
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

// The texts of the ids (special tokens left out when the tokenizer skips them), joined with
// spaces without a decoder (as HF), else through the decoders.
static char *decode_tokens(const neox_tokenizer *tok, const int32_t *ids, size_t n, size_t *size, neox_error *err) {
    char **texts = neox_malloc((n + 1) * sizeof *texts);
    size_t *lens = neox_malloc((n + 1) * sizeof *lens), count = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= tok->n_ids || !tok->id_text[id]) {
            free(texts);
            free(lens);
            neox_fail(err, NEOX_EXIT_FAILURE, "token id %d is out of range for %s (vocabulary of %lld)", id, tok->type,
                      (long long)tok->vocab_size);
            return NULL;
        }
        if (tok->skip_special_on_decode && tok->id_is_special[id]) continue;
        texts[count] = tok->id_text[id], lens[count++] = strlen(tok->id_text[id]);
    }
    char *out;
    if (tok->has_decoder) {
        out = tokenizer_run_decoders(tok, texts, lens, count, size);
    } else {
        char *buf = neox_malloc(64);
        size_t len = 0, cap = 64;
        buf[0] = 0;
        for (size_t i = 0; i < count; i++) {
            if (i) append(&buf, &len, &cap, " ", 1);
            append(&buf, &len, &cap, texts[i], lens[i]);
        }
        out = buf, *size = len;
    }
    free(texts);
    free(lens);
    return out;
}

static char *decode_char_level(const neox_tokenizer *tok, const int32_t *ids, size_t n, size_t *size, neox_error *err) {
    char *buf = neox_malloc(64);
    size_t len = 0, cap = 64;
    buf[0] = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= tok->vocab_size) {
            free(buf);
            neox_fail(err, NEOX_EXIT_FAILURE, "token id %d is out of range for %s (vocabulary of %lld)", id, tok->type,
                      (long long)tok->vocab_size);
            return NULL;
        }
        // GPT-NeoX: chr(max(32, min(id, vocab_size))) for each id.
        char u[4];
        append(&buf, &len, &cap, u, (size_t)utf8_encode((uint32_t)(id < 32 ? 32 : id), u));
    }
    *size = len;
    return buf;
}

char *neox_tokenizer_decode(const neox_tokenizer *tok, const int32_t *ids, size_t n, size_t *size, neox_error *err) {
    size_t len = 0;
    char *buf = tok->kind == TOK_CHAR ? decode_char_level(tok, ids, n, &len, err)
              : tok->kind == TOK_SPM  ? spm_decode(tok->spm, ids, n, &len, err)
                                      : decode_tokens(tok, ids, n, &len, err);
    if (!buf) return NULL;
    // Byte sequences that are not UTF-8 decode as U+FFFD (errors='replace' / from_utf8_lossy).
    if (utf8_valid_prefix((const uint8_t *)buf, len) != len) {
        char *fixed = utf8_replace_invalid((const uint8_t *)buf, len, &len);
        free(buf);
        buf = fixed;
    }
    *size = len;
    return buf;
}
