// cut.c: cutting one long text into pieces whose ids, encoded one by one and joined in order, are
// exactly the ids of the whole text — so that several threads can share one large document.
//
// A cut goes between an ASCII letter and a single space followed by an ASCII letter ("a| b"): the
// piece before ends with the letter, the piece after starts with the space. Whether that point
// splits identically is the tokenizer's to say, component by component, when it is loaded
// (tokenizer_plan_cuts); a tokenizer that cannot promise it refuses every cut (its texts stay one
// piece) and says why in neox_tokenizer_cut_refusal. The argument per component:
//  - invalid UTF-8 becomes U+FFFD per maximal invalid subpart, which an ASCII byte always ends;
//  - added tokens are matched leftmost-longest: none may hold a letter followed by a space (so no
//    match covers the cut; GPT-NeoX-20B's runs of spaces cannot), and none that ends in a letter
//    may rstrip (it would eat the space after the cut); one with lstrip starting after the cut eats
//    the space in the piece as in the whole text;
//  - NFC/NFD/NFKC/NFKD and Lowercase: a letter and a space are starters that never compose or
//    reorder, and Rust's final-sigma rule stops at the letter; Strip may strip the right end only;
//    Prepend starts a split, so a piece that continues one skips it (tokenizer.c's `continued`);
//    Replace must be a literal without letters whose content is not empty (the space may become
//    that content — a "space form" — but never a letter and never nothing);
//  - pre-tokenizers: ByteLevel's GPT-2 regex and the known word-splitting Split regexes (GPT-2,
//    Llama 3, Qwen 2, cl100k, o200k, r50k: a letter run ends before a space, the space starts the
//    next match, no alternative looks behind and the only lookaheads, (?!\S) and $, look past
//    whitespace, which ends before the cut's letter) split there; Whitespace, WhitespaceSplit and
//    Metaspace(split) split there; Digits, Punctuation and literal Splits are context-free. Other
//    regexes are refused: a lookahead or lookbehind could reach across the cut. A prefix space
//    (ByteLevel, Metaspace) is never added to a piece starting with a space, unless a Replace
//    turned that space into something else, which is refused;
//  - the model: when the pre-tokenizers split at the cut, BPE sees the same words. When they may
//    not (no pre-tokenizer, Llama-2 style), BPE merges pairs of adjacent symbols, so the two sides
//    stay independent as long as no vocabulary token holds a letter followed by a space form;
//    subword affixes (which mark word boundaries) and fused unknown letters are refused then;
//  - SentencePiece (spm.c decides): see spm_plan_cuts there.
#include <omp.h>
#include <string.h>

#include "tokenizer_internal.h"

// The Split / tiktoken regexes whose cuts are exact (see the header), as tokenizer files and
// tiktoken spell them.
static const char *const word_split_patterns[] = {
    // GPT-2 (HF ByteLevel's regex, as some tokenizer.json files write it in a Split)
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
    // Llama 3
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    // Qwen 2
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    // tiktoken cl100k_base
    "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}++|\\p{N}{1,3}+| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*+|\\s++$|"
    "\\s*[\\r\\n]|\\s+(?!\\S)|\\s",
    // tiktoken o200k_base
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    // tiktoken r50k_base / p50k_base / gpt2
    "'(?:[sdmt]|ll|ve|re)| ?\\p{L}++| ?\\p{N}++| ?[^\\s\\p{L}\\p{N}]++|\\s++$|\\s+(?!\\S)|\\s",
};

bool tokenizer_regex_splits_words(const char *pattern, size_t len) {
    for (size_t i = 0; i < sizeof word_split_patterns / sizeof *word_split_patterns; i++)
        if (strlen(word_split_patterns[i]) == len && !memcmp(word_split_patterns[i], pattern, len)) return true;
    return false;
}

static bool is_letter(uint8_t c) { return (uint8_t)((c | 0x20) - 'a') < 26; }

// What the space at a cut may have become by the time the model sees it.
#define MAX_FORMS (TOK_MAX_COMPONENTS + 2)
typedef struct space_forms { const char *s[MAX_FORMS]; size_t n[MAX_FORMS]; int count; } space_forms;

static void add_form(space_forms *f, const char *s, size_t n) {
    if (f->count < MAX_FORMS) f->s[f->count] = s, f->n[f->count++] = n;
}

// s holds an ASCII letter followed by a space form: a token or match that could cover a cut.
static bool joins_letter_to_space(const char *s, size_t n, const space_forms *f) {
    for (size_t i = 0; i + 1 < n; i++) {
        if (!is_letter((uint8_t)s[i])) continue;
        for (int k = 0; k < f->count; k++)
            if (f->n[k] <= n - i - 1 && !memcmp(s + i + 1, f->s[k], f->n[k])) return true;
    }
    return false;
}

// A Replace content the cut's space may become: "▁" or ASCII that is neither a letter nor a digit.
static bool neutral_content(const char *s, size_t n) {
    if (n == 3 && !memcmp(s, "\xe2\x96\x81", 3)) return true;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)s[i];
        if (c >= 0x80 || is_letter(c) || (c >= '0' && c <= '9')) return false;
    }
    return n > 0;
}

static const char *normalizer_refusal(const neox_tokenizer *tok, space_forms *forms, bool *space_replaced) {
    for (int i = 0; i < tok->n_normalizers; i++) {
        const tok_normalizer *nm = &tok->normalizers[i];
        if (nm->kind == NORM_STRIP && nm->strip_left) return "a Strip normalizer strips the left end of each piece";
        if (nm->kind != NORM_REPLACE) continue;
        if (!nm->pattern.literal) return "a Replace normalizer with a regex";
        if (!neutral_content(nm->content, nm->content_len))
            return "a Replace normalizer whose content is empty or holds letters or digits";
        for (size_t j = 0; j < nm->pattern.literal_len; j++)
            if (is_letter((uint8_t)nm->pattern.literal[j])) return "a Replace normalizer whose pattern holds letters";
        add_form(forms, nm->content, nm->content_len);
        if (memchr(nm->pattern.literal, ' ', nm->pattern.literal_len)) *space_replaced = true;
    }
    return NULL;
}

// Sets *splits when the pre-tokenizers always put a word boundary at a cut.
static const char *pretokenizer_refusal(const neox_tokenizer *tok, space_forms *forms, bool space_replaced,
                                        bool *splits) {
    *splits = false;
    if (tok->bytelevel_only) {
        if (tok->add_prefix_space && space_replaced) return "ByteLevel's prefix space after a Replace of spaces";
        *splits = tok->use_regex;
        return NULL;
    }
    for (int i = 0; i < tok->n_pretokenizers; i++) {
        const tok_pretokenizer *p = &tok->pretokenizers[i];
        bool isolating = p->behavior == SPLIT_ISOLATED || p->behavior == SPLIT_REMOVED;
        switch (p->kind) {
        case PRE_BYTELEVEL:
            if (p->add_prefix_space && space_replaced) return "ByteLevel's prefix space after a Replace of spaces";
            *splits |= p->use_regex;
            break;
        case PRE_SPLIT:
            if (p->pattern.regex && !p->pattern.word_split)
                return "a Split regex outside the known word-splitting patterns (docs/tokenizers.md)";
            if (p->pattern.literal && joins_letter_to_space(p->pattern.literal, p->pattern.literal_len, forms))
                return "a Split literal that joins a letter to a space";
            if (p->pattern.regex && isolating) *splits = true;
            if (p->pattern.literal && isolating && p->pattern.literal_len == 1 && p->pattern.literal[0] == ' ')
                *splits = true;
            break;
        case PRE_METASPACE:
            if (p->prepend != PREPEND_NEVER && space_replaced)
                return "Metaspace's prefix after a Replace of spaces";
            add_form(forms, p->replacement, p->replacement_len);
            *splits |= p->split;
            break;
        case PRE_WHITESPACE: case PRE_WHITESPACE_SPLIT: *splits = true; break;
        case PRE_DIGITS: case PRE_PUNCTUATION: break;
        }
    }
    return NULL;
}

// Tokens matched in the raw text see the space itself; normalized ones what it became.
static const char *added_refusal(const neox_tokenizer *tok, const space_forms *forms) {
    space_forms raw = {0};
    add_form(&raw, " ", 1);
    for (size_t i = 0; i < tok->n_added; i++) {
        const added_token *t = &tok->added[i];
        if (joins_letter_to_space(t->content, t->len, t->normalized ? forms : &raw))
            return "an added token joins a letter to a space";
        if (t->rstrip && is_letter((uint8_t)t->content[t->len - 1]))
            return "an added token that ends in a letter strips the spaces after it";
    }
    return NULL;
}

// When words may span a cut, BPE must not be able to merge across it.
static const char *model_refusal(const neox_tokenizer *tok, const space_forms *forms) {
    const bpe_model *m = &tok->bpe;
    if (m->continuing_subword_prefix || m->end_of_word_suffix)
        return "subword affixes mark word boundaries the pre-tokenizers do not put at a cut";
    if (m->unk_id >= 0 && m->fuse_unk && !m->byte_level)
        for (int c = 'a'; c <= 'z'; c++) {
            char up = (char)(c - 32), low = (char)c;
            bool known = (strmap_get(&m->vocab, &low, 1) >= 0 || (m->byte_fallback && m->fallback_id[c] >= 0)) &&
                         (strmap_get(&m->vocab, &up, 1) >= 0 || (m->byte_fallback && m->fallback_id[c - 32] >= 0));
            if (!known)
                return "fused unknown tokens could join across a cut (an ASCII letter is not in the vocabulary)";
        }
    for (size_t i = 0; i < m->vocab.count; i++) {
        const struct strmap_entry *e = &m->vocab.entries[i];
        if (joins_letter_to_space(m->vocab.arena + e->off, e->len, forms))
            return "the vocabulary has tokens that join a letter to a following space";
    }
    return NULL;
}

void tokenizer_plan_cuts(neox_tokenizer *tok) {
    tok->cut_refusal = NULL;
    if (tok->kind == TOK_CHAR) return;  // one id per byte
    space_forms forms = {0};
    add_form(&forms, " ", 1);
    bool space_replaced = false, splits = false;
    const char *why = normalizer_refusal(tok, &forms, &space_replaced);
    if (!why) why = pretokenizer_refusal(tok, &forms, space_replaced, &splits);
    if (!why) why = added_refusal(tok, &forms);
    if (!why && !splits) why = model_refusal(tok, &forms);
    tok->cut_refusal = why;
}

const char *neox_tokenizer_cut_refusal(const neox_tokenizer *tok) { return tok->cut_refusal; }

size_t neox_tokenizer_cuts(const neox_tokenizer *tok, const char *text, size_t size, size_t piece_bytes,
                           size_t *cuts, size_t max_cuts) {
    if (tok->cut_refusal || piece_bytes == 0) return 0;
    size_t n = 0;
    for (size_t from = piece_bytes; n < max_cuts && from + 1 < size;) {
        const char *sp = memchr(text + from, ' ', size - 1 - from);
        if (!sp) break;
        size_t p = (size_t)(sp - text);
        if (is_letter((uint8_t)text[p - 1]) && is_letter((uint8_t)text[p + 1])) {
            cuts[n++] = p;
            from = p + piece_bytes;
        } else {
            from = p + 1;
        }
    }
    return n;
}

int64_t neox_tokenizer_encode_piece(const neox_tokenizer *tok, const char *text, size_t size, int starts, int ends,
                                    int32_t **ids, size_t *len, size_t *cap, neox_error *err) {
    return tokenizer_encode_span(tok, text, size, starts != 0, ends != 0, ids, len, cap, err);
}

typedef struct piece_ids { int32_t *ids; size_t n, cap; int64_t rc; neox_error err; } piece_ids;

int64_t neox_tokenizer_encode_threads(const neox_tokenizer *tok, const char *text, size_t size, int threads,
                                      size_t piece_bytes, int32_t **ids, size_t *len, size_t *cap, neox_error *err) {
    if (threads < 1) threads = 1;
    if (piece_bytes == 0) piece_bytes = NEOX_TOKENIZER_PIECE_BYTES;
    size_t max_cuts = size / piece_bytes + 1, *cuts = neox_malloc((max_cuts + 2) * sizeof *cuts);
    size_t n_cuts = neox_tokenizer_cuts(tok, text, size, piece_bytes, cuts + 1, max_cuts);
    if (n_cuts == 0) {
        free(cuts);
        return neox_tokenizer_encode(tok, text, size, ids, len, cap, err);
    }
    size_t n = n_cuts + 1;
    cuts[0] = 0, cuts[n] = size;
    piece_ids *out = neox_calloc(n, sizeof *out);
    #pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (size_t i = 0; i < n; i++)
        out[i].rc = tokenizer_encode_span(tok, text + cuts[i], cuts[i + 1] - cuts[i], i == 0, i == n - 1, &out[i].ids,
                                          &out[i].n, &out[i].cap, &out[i].err);
    int64_t total = 0;
    for (size_t i = 0; i < n && total >= 0; i++) {
        if (out[i].rc < 0) {
            if (err) *err = out[i].err;
            total = -1;
            break;
        }
        if (*len + out[i].n > *cap) {
            *cap = (*len + out[i].n) * 2;
            *ids = neox_realloc(*ids, *cap * sizeof **ids);
        }
        memcpy(*ids + *len, out[i].ids, out[i].n * sizeof **ids);
        *len += out[i].n;
        total += (int64_t)out[i].n;
    }
    for (size_t i = 0; i < n; i++) free(out[i].ids);
    free(out);
    free(cuts);
    return total;
}
