// tokenizer.h: the tokenizers GPT-NeoX's tokenizer_type names — GPT2BPETokenizer (vocab.json +
// merges.txt), HFTokenizer (a `tokenizers` JSON file with a BPE model), HFGPT2Tokenizer (GPT-2 plus
// a padding token) and CharLevelTokenizer — byte-exact with Hugging Face `tokenizers`.
// A loaded tokenizer is immutable; encode may be called from many threads at once.
#ifndef NEOX_TOKENIZER_H
#define NEOX_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "core.h"

typedef struct neox_tokenizer neox_tokenizer;

typedef struct neox_tokenizer_options {
    const char *type;        // GPT-NeoX tokenizer_type: "GPT2BPETokenizer", "HFTokenizer", ...
    const char *vocab_file;  // vocab.json, or the tokenizer.json for HFTokenizer (NULL for CharLevel)
    const char *merge_file;  // merges.txt for GPT2BPETokenizer / HFGPT2Tokenizer
} neox_tokenizer_options;

// Loads a tokenizer; errors name the file and what is wrong (status 2 for an unknown or refused
// type, 1 for unreadable or malformed files).
neox_tokenizer *neox_tokenizer_load(const neox_tokenizer_options *opts, neox_error *err);
void neox_tokenizer_free(neox_tokenizer *tok);

// Number of ids (the vocabulary GPT-NeoX reports as tokenizer.vocab_size, before padding).
int64_t neox_tokenizer_vocab_size(const neox_tokenizer *tok);
int32_t neox_tokenizer_eod_id(const neox_tokenizer *tok);  // end of document
int32_t neox_tokenizer_pad_id(const neox_tokenizer *tok);  // -1 when the tokenizer has none
// The special tokens Hugging Face's AutoTokenizer would report for the folder of the vocab file:
// tokenizer_config.json's (else special_tokens_map.json's) "bos_token", "eos_token", "pad_token",
// "unk_token" there; -1 when neither file names one (a lone tokenizer.json, GPT-2 files,
// CharLevel). A SentencePiece model declares its own bos.
typedef enum neox_special { NEOX_SPECIAL_BOS, NEOX_SPECIAL_EOS, NEOX_SPECIAL_PAD, NEOX_SPECIAL_UNK, NEOX_SPECIAL_COUNT } neox_special;
int32_t neox_tokenizer_declared_id(const neox_tokenizer *tok, neox_special which);
int32_t neox_tokenizer_bos_id(const neox_tokenizer *tok);
const char *neox_tokenizer_type(const neox_tokenizer *tok);
// 1 when a space is put before text that does not start with one (ByteLevel add_prefix_space).
int neox_tokenizer_adds_prefix_space(const neox_tokenizer *tok);

// Encodes size bytes of text (UTF-8; invalid bytes are handled as HF does, see docs/tokenizers.md).
// Appends ids to *ids (a growable array: *len used, *cap allocated, realloc'ed with neox_realloc).
// Returns the number of ids appended, or -1 with err set.
int64_t neox_tokenizer_encode(const neox_tokenizer *tok, const char *text, size_t size, int32_t **ids, size_t *len,
                              size_t *cap, neox_error *err);

// Large texts on several threads. A text may be cut where the tokenizer guarantees that encoding
// the pieces one by one and joining their ids gives exactly the ids of the whole text (between an
// ASCII letter and a space followed by one; docs/tokenizers.md says why that is exact and which
// tokenizers refuse). Writes up to max_cuts increasing offsets (0 < cut < size) into cuts, each at
// the first such point at least piece_bytes after the previous one, and returns how many; 0 when
// the tokenizer refuses cuts or the text has no such point.
size_t neox_tokenizer_cuts(const neox_tokenizer *tok, const char *text, size_t size, size_t piece_bytes,
                           size_t *cuts, size_t max_cuts);
// Why the tokenizer refuses every cut (a sentence naming the component), or NULL when it does not.
const char *neox_tokenizer_cut_refusal(const neox_tokenizer *tok);
// Encodes one piece between cuts: starts / ends say whether it begins / ends the whole text.
int64_t neox_tokenizer_encode_piece(const neox_tokenizer *tok, const char *text, size_t size, int starts, int ends,
                                    int32_t **ids, size_t *len, size_t *cap, neox_error *err);
// neox_tokenizer_encode on `threads` OpenMP threads, over pieces of about piece_bytes (0: the
// default below); the same ids, appended the same way.
#define NEOX_TOKENIZER_PIECE_BYTES (16 * 1024)
int64_t neox_tokenizer_encode_threads(const neox_tokenizer *tok, const char *text, size_t size, int threads,
                                      size_t piece_bytes, int32_t **ids, size_t *len, size_t *cap, neox_error *err);

// Decodes ids to text, NUL-terminated, into a new buffer (free()); *size gets its length.
// An id out of range is an error naming it.
char *neox_tokenizer_decode(const neox_tokenizer *tok, const int32_t *ids, size_t n, size_t *size, neox_error *err);

// The text of one id (as the vocabulary stores it), or NULL when out of range.
const char *neox_tokenizer_id_to_token(const neox_tokenizer *tok, int32_t id);
// The id of a token's text (an added token or a vocabulary entry), or -1.
int32_t neox_tokenizer_token_to_id(const neox_tokenizer *tok, const char *token);

// ---------------------------------------------------------------------------------------------
// Training (neox-preprocess train-tokenizer): a byte-level BPE tokenizer as GPT-NeoX's
// tools/datasets/train_tokenizer.py builds it with HF tokenizers — NFKC normalizer, ByteLevel
// pre-tokenizer with add_prefix_space, ByteLevel decoder, special tokens first — written as a
// tokenizer.json that HF tokenizers loads and that encodes the same in HF and neox.c.
// Each line of each input file is one training sequence. Deterministic: the most frequent pair is
// merged first, ties going to the smallest pair of ids.
typedef struct neox_bpe_train_options {
    const char *const *inputs;       // text files
    size_t n_inputs;
    int64_t vocab_size;              // including the special tokens and the 256-byte alphabet
    const char *const *special_tokens;  // NULL: <|endoftext|>, <|padding|>
    size_t n_special;
    int64_t min_frequency;           // pairs seen fewer times are not merged (default 0)
} neox_bpe_train_options;

int neox_tokenizer_train_bpe(const neox_bpe_train_options *opts, const char *output, neox_error *err);

// ---------------------------------------------------------------------------------------------
// Chat templates: the Jinja2 templates tokenizer_config.json carries ("chat_template"), rendered as
// transformers' apply_chat_template renders them (trim_blocks and lstrip_blocks on). The subset the
// common templates use is supported (docs/post-training.md lists it); anything else is refused when
// the template is parsed, naming the feature and the template's line.
typedef struct neox_chat_template neox_chat_template;
struct json_t;

// Parses size bytes of template source; name is what errors call it. Status 2 for a syntax error or
// an unsupported feature.
neox_chat_template *neox_chat_template_parse(const char *source, size_t size, const char *name, neox_error *err);
void neox_chat_template_free(neox_chat_template *tmpl);

typedef struct neox_chat_context {
    const struct json_t *messages;  // a JSON array of {"role": ..., "content": ...} objects
    // The special tokens apply_chat_template passes (NULL: not defined in the template).
    const char *bos_token, *eos_token, *unk_token, *pad_token;
    int add_generation_prompt;
} neox_chat_context;

// Renders the template into a new NUL-terminated buffer (free()); *size gets its length. A runtime
// error (raise_exception, an undefined value used as a string, a type error) names the template's
// line; status 1.
char *neox_chat_template_render(const neox_chat_template *tmpl, const neox_chat_context *ctx, size_t *size,
                                neox_error *err);

// A tokenizer's chat format as transformers' AutoTokenizer reads it from tokenizer_config.json in the
// folder of the vocab file: "chat_template" (a string, or a list of {"name", "template"} of which
// "default" is used) and the special tokens bos/eos/unk/pad (strings or {"content": ...}).
typedef struct neox_chat_format {
    neox_chat_template *tmpl;
    char *bos_token, *eos_token, *unk_token, *pad_token;  // NULL where tokenizer_config.json has none
    int32_t eos_id;                                       // -1 without an eos_token
} neox_chat_format;

// template_file, when not NULL, replaces tokenizer_config.json's chat_template (which may then be
// absent). Errors name the file: no template, an eos_token that is not a token, a template error.
int neox_chat_format_load(neox_chat_format *fmt, const neox_tokenizer *tok, const char *vocab_file,
                          const char *template_file, neox_error *err);
void neox_chat_format_free(neox_chat_format *fmt);

#endif
