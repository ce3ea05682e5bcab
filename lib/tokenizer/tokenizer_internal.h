// tokenizer_internal.h: the private pieces of lib/tokenizer shared between its files — the
// tokenizer struct, the byte-level alphabet, the GPT-2 pre-tokenizer, the BPE model with its
// hash tables and per-thread word cache, added-token matching and UTF-8 helpers.
#ifndef NEOX_TOKENIZER_INTERNAL_H
#define NEOX_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "core.h"
#include "tokenizer.h"

// ---------------------------------------------------------------------------------------------
// Byte-level alphabet (GPT-2's bytes_to_unicode): every byte maps to one printable code point so
// vocabulary files can store arbitrary bytes as text. Printable Latin-1 bytes map to themselves,
// the other 68 to U+0100.. in byte order.
uint32_t bytelevel_char_of_byte(uint8_t b);
// The byte a code point stands for, or -1 when the code point is not in the alphabet.
int bytelevel_byte_of_char(uint32_t cp);
// Converts a byte-level string (UTF-8 text of alphabet chars) to raw bytes in out (capacity at least
// size). Returns the byte count, or -1 when a char is outside the alphabet or the UTF-8 is invalid.
long bytelevel_decode(const char *text, size_t size, uint8_t *out);
// Appends the byte-level text of raw bytes to a growable buffer.
void bytelevel_encode(const uint8_t *bytes, size_t size, char **buf, size_t *len, size_t *cap);

// ---------------------------------------------------------------------------------------------
// UTF-8 helpers.
// Decodes one code point at s (n > 0 bytes available); sets *len. Returns -1 for an invalid sequence,
// with *len the length of its maximal subpart (the bytes one U+FFFD replaces, as Python and Rust do).
int32_t utf8_decode(const uint8_t *s, size_t n, int *len);
// Length of the valid UTF-8 prefix of s (== n when all valid).
size_t utf8_valid_prefix(const uint8_t *s, size_t n);
// A copy of s with each maximal invalid subpart replaced by U+FFFD (what Python's
// bytes.decode('utf-8', 'replace') and Rust's String::from_utf8_lossy produce). Sets *out_size.
char *utf8_replace_invalid(const uint8_t *s, size_t n, size_t *out_size);
int utf8_encode(uint32_t cp, char out[4]);
// A NUL-terminated copy of exactly n bytes (text may hold NULs, which neox_strndup stops at).
char *tok_bytes_dup(const char *s, size_t n);

// ---------------------------------------------------------------------------------------------
// GPT-2 pre-tokenizer: the regex
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// as a hand-written matcher over Unicode categories (utf8proc). text must be valid UTF-8.
// Returns the length in bytes of the match starting at pos (always > 0 when pos < size).
size_t pretok_gpt2_next(const uint8_t *text, size_t size, size_t pos);
// Unicode White_Space (what \s and Rust's char::is_whitespace match).
bool unicode_is_space(int32_t cp);

// ---------------------------------------------------------------------------------------------
// Open-addressing hash table from byte strings to int32 (vocabularies, added tokens).
typedef struct strmap {
    uint32_t *slots;      // index + 1 into entries, 0 = empty
    size_t mask;
    struct strmap_entry { uint64_t hash; uint32_t off, len; int32_t value; } *entries;
    size_t count, entries_cap;
    char *arena;          // key bytes
    size_t arena_len, arena_cap;
} strmap;

uint64_t tok_hash(const void *data, size_t len);
void strmap_init(strmap *m, size_t expected);
void strmap_free(strmap *m);
// Inserts key -> value; returns 0, or 1 (leaving the old value) when key is present.
int strmap_put(strmap *m, const void *key, size_t len, int32_t value);
// The value of key, or -1.
int32_t strmap_get(const strmap *m, const void *key, size_t len);

// ---------------------------------------------------------------------------------------------
// BPE model: ids of the 256 single bytes, merges ranked by line order, optional direct lookup of
// whole words (ignore_merges). Merging follows HF tokenizers: repeatedly merge the adjacent pair of
// lowest rank (leftmost on ties), with a binary heap over candidate pairs.
typedef struct bpe_merge_entry { uint64_t key; int32_t rank, new_id; } bpe_merge_entry;

typedef struct bpe_model {
    strmap vocab;              // raw token bytes -> id
    int32_t byte_id[256];      // id of each single byte, or -1 (such bytes are dropped, as HF does)
    bpe_merge_entry *merges;   // open addressing on key = left << 32 | right; key 0 + rank -1 = empty
    size_t merges_mask, n_merges;
    bool ignore_merges;        // look whole words up in the vocabulary first
    int32_t unk_id;            // -1 when the model has no unknown token
    bool fuse_unk;
    // Words are raw bytes and the vocabulary byte-level text (a ByteLevel pre-tokenizer, GPT-2
    // files, tiktoken); otherwise words are UTF-8 text in the vocabulary's own alphabet and start
    // as one symbol per character.
    bool byte_level;
    bool byte_fallback;        // unknown characters become <0xXX> byte tokens
    int32_t fallback_id[256];  // id of "<0xXX>" per byte, -1 when absent
    char *continuing_subword_prefix, *end_of_word_suffix;  // NULL when unset
    size_t prefix_len, suffix_len;
    uint64_t uid;              // identifies the model for the per-thread word cache
} bpe_model;

void bpe_init(bpe_model *m, size_t vocab_hint);
void bpe_free(bpe_model *m);
// Adds merge (left, right) -> new_id with the given rank (its line index). A pair listed twice takes
// the later rank, as HF's merge map does; returns 1 in that case.
int bpe_add_merge(bpe_model *m, int32_t left, int32_t right, int32_t new_id, int32_t rank);
void bpe_finish(bpe_model *m);  // after loading: computes byte_id / fallback_id and allocates the uid
// Encodes one pre-tokenized word (raw bytes) and appends its ids to out (growable).
void bpe_encode_word(const bpe_model *m, const uint8_t *word, size_t len, int32_t **ids, size_t *n, size_t *cap);
// The id of a whole word (raw bytes) in the vocabulary, or -1.
int32_t bpe_lookup_word(const bpe_model *m, const uint8_t *word, size_t len);

// ---------------------------------------------------------------------------------------------
// Added tokens: literal strings matched in the text before the model sees it (leftmost, longest),
// as HF's AddedVocabulary does.
typedef struct added_token {
    char *content;
    size_t len;
    int32_t id;
    bool special, normalized, lstrip, rstrip;
} added_token;

typedef struct added_matcher {    // a byte trie over the contents of a set of added tokens
    struct trie_node { int32_t first_child, next_sibling, token; uint8_t byte; } *nodes;
    size_t n_nodes, cap;
    bool first_byte[256];
} added_matcher;

void added_matcher_init(added_matcher *m);
void added_matcher_add(added_matcher *m, const char *s, size_t len, int32_t token_index);
void added_matcher_free(added_matcher *m);
// Finds the leftmost-longest match in text[from..size); returns its start (size when none) and
// sets *match_len and *token_index.
size_t added_matcher_find(const added_matcher *m, const uint8_t *text, size_t size, size_t from, size_t *match_len,
                          int32_t *token_index);

// ---------------------------------------------------------------------------------------------
// Regular expressions (PCRE2, UTF + UCP; \s widened to White_Space as HF and tiktoken match it).
typedef struct tok_regex tok_regex;
enum regex_dialect { REGEX_ONIGURUMA, REGEX_RUST };  // HF tokenizers' engine; tiktoken's (fancy-regex)
tok_regex *tok_regex_compile(const char *pattern, size_t len, enum regex_dialect dialect, const char *file,
                             const char *where, neox_error *err);
void tok_regex_free(tok_regex *re);
// The leftmost match at or after from: 1 with [*start, *end), 0 when none, -1 (err set) when the
// matcher gives up (a resource limit).
int tok_regex_find(const tok_regex *re, const uint8_t *s, size_t n, size_t from, size_t *start, size_t *end,
                   neox_error *err);

// ---------------------------------------------------------------------------------------------
// Pipeline components of a tokenizer.json, as HF tokenizers defines them.
enum normalizer_kind { NORM_NFC = 1, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_LOWERCASE, NORM_STRIP, NORM_REPLACE,
                       NORM_PREPEND };
// A literal or regex pattern (Split, Replace): "String" or "Regex" in the file.
// word_split: a regex of the known word-splitting family (cut.c), whose matches cannot join an ASCII
// letter to a following space and do not depend on the text before or after them otherwise.
typedef struct tok_pattern { char *literal; size_t literal_len; tok_regex *regex; bool word_split; } tok_pattern;

typedef struct tok_normalizer {
    enum normalizer_kind kind;
    bool strip_left, strip_right;   // Strip
    tok_pattern pattern;            // Replace
    char *content;                  // Replace's replacement, Prepend's prefix
    size_t content_len;
} tok_normalizer;

enum split_behavior { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_WITH_PREVIOUS, SPLIT_MERGED_WITH_NEXT,
                      SPLIT_CONTIGUOUS };
enum pretok_kind { PRE_BYTELEVEL, PRE_SPLIT, PRE_DIGITS, PRE_METASPACE, PRE_WHITESPACE, PRE_WHITESPACE_SPLIT,
                   PRE_PUNCTUATION };
enum prepend_scheme { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };

typedef struct tok_pretokenizer {
    enum pretok_kind kind;
    enum split_behavior behavior;   // Split, Punctuation
    bool invert;                    // Split
    bool individual_digits;         // Digits
    bool add_prefix_space, use_regex;  // ByteLevel
    tok_pattern pattern;            // Split; Whitespace's \w+|[^\w\s]+
    char replacement[8];            // Metaspace: one character, UTF-8
    size_t replacement_len;
    enum prepend_scheme prepend;    // Metaspace
    bool split;                     // Metaspace
} tok_pretokenizer;

enum decoder_kind { DEC_BYTELEVEL, DEC_METASPACE, DEC_BYTE_FALLBACK, DEC_FUSE, DEC_STRIP, DEC_REPLACE, DEC_BPE };
typedef struct tok_decoder {
    enum decoder_kind kind;
    tok_pattern pattern;            // Replace
    char *content;                  // Replace's replacement, Strip's character, BPEDecoder's suffix
    size_t content_len;
    int64_t strip_start, strip_stop;  // Strip
    char replacement[8];            // Metaspace
    size_t replacement_len;
    enum prepend_scheme prepend;    // Metaspace
} tok_decoder;

#define TOK_MAX_COMPONENTS 16

// The text pieces a pre-tokenizer step produces: each piece's bytes in one arena, and whether the
// piece starts at the beginning of the original text (Metaspace's prepend_scheme "first").
typedef struct tok_piece { size_t off, len; bool first; } tok_piece;
typedef struct tok_pieces {
    char *text;
    size_t text_len, text_cap;
    tok_piece *items;
    size_t n, cap;
} tok_pieces;

// A match or a gap of a pattern over a string (HF's (Offsets, bool)).
typedef struct tok_segment { size_t start, end; bool is_match; } tok_segment;

void pieces_clear(tok_pieces *p);
void pieces_free(tok_pieces *p);
void pieces_push(tok_pieces *p, const char *s, size_t n, bool first);

// ---------------------------------------------------------------------------------------------
// The tokenizer.
enum tokenizer_kind { TOK_CHAR, TOK_BPE, TOK_SPM };

typedef struct spm_model spm_model;  // spm.h: a SentencePiece model
typedef struct unigram_model unigram_model;  // spm.h: the lattice of a unigram model
typedef struct spm_normalizer spm_normalizer;  // spm.h: SentencePiece's normalizer
typedef struct spm_bpe_model spm_bpe_model;  // spm.h: the merges of a BPE model

struct neox_tokenizer {
    char type[32];
    enum tokenizer_kind kind;
    int64_t vocab_size;
    int32_t eod_id, pad_id;
    int32_t declared[NEOX_SPECIAL_COUNT];  // by the tokenizer_config.json beside the vocab file; -1: none

    // Every id's text as its file stores it (byte-level text for model tokens), NUL-terminated.
    int32_t n_ids;             // 1 + the largest id
    char **id_text;            // NULL for ids that do not exist
    uint8_t *id_is_special;    // decode skips these when skip_special_on_decode

    bpe_model bpe;
    spm_model *spm;            // TOK_SPM
    unigram_model *spm_unigram;  // TOK_SPM with a unigram model: its segmentation (unigram.c) ...
    spm_bpe_model *spm_bpe;      // ... or with a BPE model, its merges (spm_bpe.c) ...
    spm_normalizer *spm_normalizer;  // ... and its normalizer (spm_normalize.c)
    added_token *added;
    size_t n_added;
    added_matcher raw_matcher, normalized_matcher;  // added tokens matched before / after normalizing
    bool has_raw_added, has_normalized_added;

    tok_normalizer normalizers[TOK_MAX_COMPONENTS];
    int n_normalizers;
    tok_pretokenizer pretokenizers[TOK_MAX_COMPONENTS];
    int n_pretokenizers;
    bool bytelevel_only;       // the pre-tokenizer is one ByteLevel: the fast path of encode
    bool add_prefix_space;     // ByteLevel pre-tokenizer option
    bool use_regex;            // ByteLevel pre-tokenizer option (GPT-2 regex split)
    tok_decoder decoders[TOK_MAX_COMPONENTS];
    int n_decoders;
    bool has_decoder;          // false: tokens joined with spaces, as HF without a decoder
    bool skip_special_on_decode;
    // TemplateProcessing's single-sequence template: ids put before and after the text's ids.
    int32_t *template_prefix, *template_suffix;
    size_t n_template_prefix, n_template_suffix;
    // Why texts cannot be cut for parallel encoding (cut.c); NULL when they can.
    const char *cut_refusal;
};

// Loaders: fill tok (already zeroed, type set) or return -1 with err naming the file.
int tokenizer_load_gpt2_files(neox_tokenizer *tok, const char *vocab_file, const char *merge_file, neox_error *err);
int tokenizer_load_hf_json(neox_tokenizer *tok, const char *path, neox_error *err);
// Loads a JSON object of token text -> id into tok->bpe.vocab and the id table; `where` names it.
int tokenizer_load_vocab_object(neox_tokenizer *tok, json_t *vocab, const char *file, const char *where,
                                neox_error *err);
// Adds the merge of two tokens given as text, with rank; both and their concatenation must exist.
int tokenizer_add_merge_text(neox_tokenizer *tok, const char *left, size_t llen, const char *right, size_t rlen,
                             int32_t rank, const char *file, const char *where, neox_error *err);
// Registers an id's text (copying it); fails on a duplicate id or negative id.
int tokenizer_set_id_text(neox_tokenizer *tok, int32_t id, const char *text, size_t len, const char *file,
                          neox_error *err);
// Adds an added token (HF semantics), after the model is loaded.
int tokenizer_add_token(neox_tokenizer *tok, const char *content, size_t len, int32_t id, bool special,
                        bool normalized, bool lstrip, bool rstrip, const char *file, neox_error *err);
void tokenizer_finish_added(neox_tokenizer *tok);
// Normalizes text with the tokenizer's normalizers; returns a new buffer or NULL when unchanged.
// continued: the text continues a split cut by cut.c, so Prepend (which only starts a split) is skipped.
char *tokenizer_normalize(const neox_tokenizer *tok, const char *text, size_t size, bool continued,
                          size_t *out_size);
// Runs the pre-tokenizers over one normalized piece (first: it starts the original text); the
// words land in out. Returns -1 with err set when a regex gives up.
int tokenizer_pretokenize(const neox_tokenizer *tok, const char *s, size_t n, bool first, tok_pieces *out,
                          neox_error *err);
// Finds the matches of a pattern in s as HF's Pattern::find_matches does; the caller owns *segs.
int pattern_find_matches(const tok_pattern *p, const char *s, size_t n, tok_segment **segs, size_t *n_segs,
                         neox_error *err);
// Replaces every match of p in s with content (Replace normalizer and decoder); a new buffer.
char *pattern_replace_all(const tok_pattern *p, const char *s, size_t n, const char *content, size_t content_len,
                          size_t *out_size, neox_error *err);
void pattern_free(tok_pattern *p);
// Applies the decoders to the tokens' texts and joins them; a new NUL-terminated buffer.
char *tokenizer_run_decoders(const neox_tokenizer *tok, char **tokens, size_t *lens, size_t n, size_t *size);
// Frees the pipeline components.
void tokenizer_free_components(neox_tokenizer *tok);
// The tokenizer.json loader's component parsers (hf_components.c); `where` is the JSON path.
int tokenizer_load_normalizer(neox_tokenizer *tok, json_t *n, const char *file, const char *where, neox_error *err);
int tokenizer_load_pre_tokenizer(neox_tokenizer *tok, json_t *p, const char *file, const char *where, neox_error *err);
int tokenizer_load_decoder(neox_tokenizer *tok, json_t *d, const char *file, const char *where, neox_error *err);
int tokenizer_load_post_processor(neox_tokenizer *tok, json_t *p, const char *file, const char *where,
                                  neox_error *err);
// Encodes one piece of a text: starts / ends say whether the piece begins / ends the whole text
// (the template's ids and the first split's decorations belong there). neox_tokenizer_encode is
// the piece that does both.
int64_t tokenizer_encode_span(const neox_tokenizer *tok, const char *text, size_t size, bool starts, bool ends,
                              int32_t **ids, size_t *len, size_t *cap, neox_error *err);
// cut.c: whether a regex is one of the word-splitting patterns whose cuts are known to be exact,
// and the load-time decision whether a tokenizer's texts may be cut (sets tok->cut_refusal).
bool tokenizer_regex_splits_words(const char *pattern, size_t len);
void tokenizer_plan_cuts(neox_tokenizer *tok);
// A tiktoken rank file (base64 token, rank per line) as a byte-level BPE model.
int tokenizer_load_tiktoken(neox_tokenizer *tok, const char *path, neox_error *err);

#endif
