// tiktoken.c: TiktokenTokenizer — a local tiktoken rank file (one "base64-token rank" per line, as
// OpenAI publishes cl100k_base.tiktoken / o200k_base.tiktoken) as a byte-level BPE model that
// encodes as tiktoken's encode_ordinary: the encoding's regex picks the pieces (text between
// matches is dropped, as tiktoken drops it), a piece that is a token is that token, otherwise
// adjacent parts are merged lowest rank of their concatenation first (leftmost on ties). That
// rule is a BPE whose merges are every (a, b) with a, b and a+b tokens, ranked by a+b: the BPE
// model of bpe.c with those merges gives the same ids.
// The pattern and special tokens follow the file name (cl100k_base, o200k_base, r50k_base / gpt2
// / p50k_base); any other name gets cl100k's pattern and <|endoftext|> after the last rank.
#include <string.h>

#include "tokenizer_internal.h"

static const char cl100k_pattern[] =
    "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}++|\\p{N}{1,3}+| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*+|\\s++$|"
    "\\s*[\\r\\n]|\\s+(?!\\S)|\\s";
static const char o200k_pattern[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char r50k_pattern[] =
    "'(?:[sdmt]|ll|ve|re)| ?\\p{L}++| ?\\p{N}++| ?[^\\s\\p{L}\\p{N}]++|\\s++$|\\s+(?!\\S)|\\s";

typedef struct special { const char *text; int32_t id; } special;
typedef struct encoding {
    const char *name;     // matched against the file's base name
    const char *pattern;
    special specials[6];  // id -1: after the last rank
} encoding;

static const encoding encodings[] = {
    {"cl100k", cl100k_pattern,
     {{"<|endoftext|>", 100257}, {"<|fim_prefix|>", 100258}, {"<|fim_middle|>", 100259}, {"<|fim_suffix|>", 100260},
      {"<|endofprompt|>", 100276}, {NULL, 0}}},
    {"o200k", o200k_pattern, {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}, {NULL, 0}}},
    {"p50k", r50k_pattern, {{"<|endoftext|>", 50256}, {NULL, 0}}},
    {"r50k", r50k_pattern, {{"<|endoftext|>", 50256}, {NULL, 0}}},
    {"gpt2", r50k_pattern, {{"<|endoftext|>", 50256}, {NULL, 0}}},
    {"", cl100k_pattern, {{"<|endoftext|>", -1}, {NULL, 0}}},
};

static const encoding *encoding_of(const char *path) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    for (size_t i = 0;; i++)
        if (strstr(base, encodings[i].name)) return &encodings[i];
}

static int base64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

// Standard base64 with padding; returns the byte count or -1 when s is not base64.
static long base64_decode(const char *s, size_t n, uint8_t *out) {
    if (n == 0 || n % 4) return -1;
    size_t pad = s[n - 1] == '=' ? (s[n - 2] == '=' ? 2 : 1) : 0;
    long len = 0;
    for (size_t i = 0; i < n; i += 4) {
        uint32_t v = 0;
        for (size_t k = 0; k < 4; k++) {
            int d = i + k >= n - pad ? 0 : base64_value((unsigned char)s[i + k]);
            if (d < 0) return -1;
            v = v << 6 | (uint32_t)d;
        }
        size_t keep = i + 4 == n ? 3 - pad : 3;
        for (size_t k = 0; k < keep; k++) out[len++] = (uint8_t)(v >> (16 - 8 * k));
    }
    return len;
}

// One "token rank" line into the vocabulary (byte-level text -> rank) and raw (bytes -> rank).
static int load_line(neox_tokenizer *tok, strmap *raw, const char *line, size_t len, size_t line_no, const char *path,
                     neox_error *err) {
    const char *space = memchr(line, ' ', len);
    if (!space) return neox_fail(err, NEOX_EXIT_FAILURE, "%s:%zu: expected \"<base64 token> <rank>\"", path, line_no);
    size_t b64 = (size_t)(space - line);
    uint8_t bytes[1024];
    long n = b64 / 4 * 3 <= sizeof bytes ? base64_decode(line, b64, bytes) : -1;
    if (n <= 0) return neox_fail(err, NEOX_EXIT_FAILURE, "%s:%zu: the token is not base64 (or longer than 1 kB)", path, line_no);
    char digits[16];
    size_t dlen = len - b64 - 1;
    char *end;
    if (dlen == 0 || dlen >= sizeof digits) return neox_fail(err, NEOX_EXIT_FAILURE, "%s:%zu: bad rank", path, line_no);
    memcpy(digits, space + 1, dlen), digits[dlen] = 0;
    long rank = strtol(digits, &end, 10);
    if (*end || rank < 0 || rank >= (1L << 24))
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s:%zu: the rank '%s' is not an integer in 0..16777215", path, line_no,
                         digits);
    if (strmap_put(raw, bytes, (size_t)n, (int32_t)rank))
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s:%zu: the token is listed twice", path, line_no);
    char *text = NULL;
    size_t tlen = 0, tcap = 0;
    bytelevel_encode(bytes, (size_t)n, &text, &tlen, &tcap);
    strmap_put(&tok->bpe.vocab, text, tlen, (int32_t)rank);
    int rc = tokenizer_set_id_text(tok, (int32_t)rank, text, tlen, path, err);
    free(text);
    return rc;
}

// Every (a, b) with a, b and a+b tokens merges into a+b at a+b's rank.
static void add_implied_merges(neox_tokenizer *tok, const strmap *raw) {
    for (size_t i = 0; i < raw->count; i++) {
        const struct strmap_entry *e = &raw->entries[i];
        const uint8_t *t = (const uint8_t *)raw->arena + e->off;
        for (uint32_t k = 1; k < e->len; k++) {
            int32_t a = strmap_get(raw, t, k), b = strmap_get(raw, t + k, e->len - k);
            if (a >= 0 && b >= 0) bpe_add_merge(&tok->bpe, a, b, e->value, e->value);
        }
    }
}

static int load_ranks(neox_tokenizer *tok, strmap *raw, const char *path, neox_error *err) {
    size_t size;
    char *text = neox_read_file(path, &size, err);
    if (!text) return -1;
    int rc = 0;
    size_t line_no = 0;
    for (char *line = text; rc == 0 && line < text + size;) {
        char *eol = memchr(line, '\n', (size_t)(text + size - line));
        if (!eol) eol = text + size;
        size_t len = (size_t)(eol - line);
        if (len && line[len - 1] == '\r') len--;
        line_no++;
        if (len) rc = load_line(tok, raw, line, len, line_no, path, err);
        line = eol + 1;
    }
    free(text);
    if (rc == 0 && raw->count == 0) rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: no tokens", path);
    for (int b = 0; rc == 0 && b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        if (strmap_get(raw, &byte, 1) < 0)
            rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: byte 0x%02X has no rank (every single byte must be a token)",
                           path, b);
    }
    return rc;
}

int tokenizer_load_tiktoken(neox_tokenizer *tok, const char *path, neox_error *err) {
    strmap raw;
    strmap_init(&raw, 1 << 16);
    bpe_init(&tok->bpe, 1 << 16);
    int rc = load_ranks(tok, &raw, path, err);
    if (rc == 0) add_implied_merges(tok, &raw);
    strmap_free(&raw);
    if (rc < 0) return -1;
    tok->bpe.byte_level = true;
    tok->bpe.ignore_merges = true;  // tiktoken looks a whole piece up first
    bpe_finish(&tok->bpe);
    const encoding *enc = encoding_of(path);
    tok_pretokenizer *split = &tok->pretokenizers[tok->n_pretokenizers++];
    *split = (tok_pretokenizer){.kind = PRE_SPLIT, .behavior = SPLIT_REMOVED, .invert = true};
    split->pattern.regex = tok_regex_compile(enc->pattern, strlen(enc->pattern), REGEX_RUST, path, "pattern", err);
    if (!split->pattern.regex) return -1;
    split->pattern.word_split = tokenizer_regex_splits_words(enc->pattern, strlen(enc->pattern));
    tok->has_decoder = true;
    tok->decoders[tok->n_decoders++] = (tok_decoder){.kind = DEC_BYTELEVEL};
    int32_t after_last = 0;  // one past the largest rank
    for (int32_t id = 0; id < tok->n_ids; id++)
        if (tok->id_text[id]) after_last = id + 1;
    for (int i = 0; enc->specials[i].text; i++) {
        int32_t id = enc->specials[i].id < 0 ? after_last : enc->specials[i].id;
        if (id < tok->n_ids && tok->id_text[id])
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s: rank %d is %s's special token %s in tiktoken", path, id,
                             enc->name[0] ? enc->name : "this encoding", enc->specials[i].text);
        if (tokenizer_set_id_text(tok, id, enc->specials[i].text, strlen(enc->specials[i].text), path, err) < 0) return -1;
        if (!strcmp(enc->specials[i].text, "<|endoftext|>")) tok->eod_id = id;
    }
    for (int32_t id = 0; id < tok->n_ids; id++)
        if (tok->id_text[id]) tok->vocab_size = id + 1;  // tiktoken's n_vocab: the largest id + 1
    return 0;
}
