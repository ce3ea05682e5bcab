// pretok_split.c: HF tokenizers' pre-tokenizers other than the GPT-2 regex — Split (a literal or a
// regex, with its behavior and invert), Digits, Metaspace, Whitespace, WhitespaceSplit,
// Punctuation — and ByteLevel as one step of a Sequence. Each step maps every piece of text to
// the pieces HF's NormalizedString::split gives: the pattern's matches and the gaps between them
// (Pattern::find_matches), merged or dropped by the behavior, empty pieces left out.
#include <string.h>
#include <utf8proc.h>

#include "tokenizer_internal.h"

void pieces_clear(tok_pieces *p) { p->text_len = 0, p->n = 0; }

void pieces_free(tok_pieces *p) {
    free(p->text);
    free(p->items);
    memset(p, 0, sizeof *p);
}

void pieces_push(tok_pieces *p, const char *s, size_t n, bool first) {
    if (n == 0) return;  // HF drops empty splits
    if (p->text_len + n > p->text_cap) {
        p->text_cap = (p->text_len + n) * 2 > 4096 ? (p->text_len + n) * 2 : 4096;
        p->text = neox_realloc(p->text, p->text_cap);
    }
    if (p->n == p->cap) {
        p->cap = p->cap ? p->cap * 2 : 64;
        p->items = neox_realloc(p->items, p->cap * sizeof *p->items);
    }
    memcpy(p->text + p->text_len, s, n);
    p->items[p->n++] = (tok_piece){p->text_len, n, first};
    p->text_len += n;
}

// ---------------------------------------------------------------------------------------------
// Matches.
typedef struct segments { tok_segment *items; size_t n, cap; } segments;

static void seg_push(segments *s, size_t start, size_t end, bool is_match) {
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 64;
        s->items = neox_realloc(s->items, s->cap * sizeof *s->items);
    }
    s->items[s->n++] = (tok_segment){start, end, is_match};
}

static size_t char_len_at(const char *s, size_t n, size_t i) {
    int len;
    utf8_decode((const uint8_t *)s + i, n - i, &len);
    return (size_t)len;
}

// Regex or literal: every match, with the gaps between (find_iter; after an empty match the search
// resumes one character on, as Oniguruma's iterator does).
int pattern_find_matches(const tok_pattern *p, const char *s, size_t n, tok_segment **out, size_t *n_out,
                         neox_error *err) {
    segments segs = {0};
    size_t prev = 0, from = 0;
    while (from <= n) {
        size_t start, end;
        if (p->regex) {
            int rc = tok_regex_find(p->regex, (const uint8_t *)s, n, from, &start, &end, err);
            if (rc < 0) { free(segs.items); return -1; }
            if (rc == 0) break;
        } else {
            const char *hit = p->literal_len ? memmem(s + from, n - from, p->literal, p->literal_len) : NULL;
            if (!hit) break;
            start = (size_t)(hit - s), end = start + p->literal_len;
        }
        if (prev != start) seg_push(&segs, prev, start, false);
        seg_push(&segs, start, end, true);
        prev = end;
        from = end > start ? end : end < n ? end + char_len_at(s, n, end) : n + 1;
    }
    if (prev != n || segs.n == 0) seg_push(&segs, prev, n, false);
    *out = segs.items, *n_out = segs.n;
    return 0;
}

typedef bool (*char_pred)(int32_t cp);

// A character predicate: every matching character is one match (HF's impl Pattern for Fn(char)).
static void find_char_matches(const char *s, size_t n, char_pred pred, segments *segs) {
    size_t last = 0;
    for (size_t i = 0; i < n;) {
        int len;
        int32_t cp = utf8_decode((const uint8_t *)s + i, n - i, &len);
        if (pred(cp)) {
            if (last < i) seg_push(segs, last, i, false);
            seg_push(segs, i, i + (size_t)len, true);
            last = i + (size_t)len;
        }
        i += (size_t)len;
    }
    if (last < n || segs->n == 0) seg_push(segs, last, n, false);
}

// HF's SplitDelimiterBehavior over the segments (NormalizedString::split), then the kept pieces.
static void split_by_behavior(tok_segment *m, size_t n, enum split_behavior behavior, bool invert, const char *s,
                              bool first, tok_pieces *out) {
    if (invert)
        for (size_t i = 0; i < n; i++) m[i].is_match = !m[i].is_match;
    size_t k = 0;  // segments merged in place: m[0..k)
    bool prev_match = false;
    switch (behavior) {
    case SPLIT_ISOLATED:
        for (size_t i = 0; i < n; i++) m[i].is_match = false;
        k = n;
        break;
    case SPLIT_REMOVED:
        k = n;
        break;
    case SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < n; i++) {
            bool is = m[i].is_match;
            if (is == prev_match && k > 0) m[k - 1].end = m[i].end;
            else m[k++] = (tok_segment){m[i].start, m[i].end, false};
            prev_match = is;
        }
        break;
    case SPLIT_MERGED_WITH_PREVIOUS:
        for (size_t i = 0; i < n; i++) {
            bool is = m[i].is_match;
            if (is && !prev_match && k > 0) m[k - 1].end = m[i].end;
            else m[k++] = (tok_segment){m[i].start, m[i].end, false};
            prev_match = is;
        }
        break;
    case SPLIT_MERGED_WITH_NEXT:  // the same from the right
        for (size_t j = n; j-- > 0;) {
            bool is = m[j].is_match;
            size_t slot = n - 1 - k;  // filled from the back; never overtakes j
            if (is && !prev_match && k > 0) m[slot + 1].start = m[j].start;
            else m[slot] = (tok_segment){m[j].start, m[j].end, false}, k++;
            prev_match = is;
        }
        memmove(m, m + (n - k), k * sizeof *m);
        break;
    }
    for (size_t i = 0; i < k; i++)
        if (!m[i].is_match) pieces_push(out, s + m[i].start, m[i].end - m[i].start, first && m[i].start == 0);
}

// ---------------------------------------------------------------------------------------------
// Character classes of the predicate pre-tokenizers.
// Rust's char::is_numeric (HF's Digits): the categories Nd, Nl and No, so "¼" and "²" split too.
static bool is_numeric(int32_t cp) {
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}
static bool is_whitespace(int32_t cp) { return unicode_is_space(cp); }

// Rust's char::is_ascii_punctuation || the Unicode P* categories (HF's is_punctuation).
static bool is_punctuation(int32_t cp) {
    if (cp < 0x80) return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
                          (cp >= 0x7B && cp <= 0x7E);
    switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_PC: case UTF8PROC_CATEGORY_PD: case UTF8PROC_CATEGORY_PS: case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI: case UTF8PROC_CATEGORY_PF: case UTF8PROC_CATEGORY_PO:
        return true;
    default:
        return false;
    }
}

static void split_on_chars(const char *s, size_t n, bool first, char_pred pred, enum split_behavior b,
                           tok_pieces *out) {
    segments segs = {0};
    find_char_matches(s, n, pred, &segs);
    split_by_behavior(segs.items, segs.n, b, false, s, first, out);
    free(segs.items);
}

static int split_on_pattern(const tok_pattern *p, const char *s, size_t n, bool first, enum split_behavior b,
                            bool invert, tok_pieces *out, neox_error *err) {
    tok_segment *segs;
    size_t n_segs;
    if (pattern_find_matches(p, s, n, &segs, &n_segs, err) < 0) return -1;
    split_by_behavior(segs, n_segs, b, invert, s, first, out);
    free(segs);
    return 0;
}

// Metaspace: spaces become the replacement, which is put in front (prepend_scheme), then the text
// is split before each replacement (MergedWithNext).
static void metaspace(const tok_pretokenizer *p, const char *s, size_t n, bool first, tok_pieces *out) {
    size_t cap = p->replacement_len * (n + 1) + 1, len = 0;
    char *buf = neox_malloc(cap);
    bool starts = n > 0 && (s[0] == ' ' || (n >= p->replacement_len && !memcmp(s, p->replacement, p->replacement_len)));
    if (!starts && (p->prepend == PREPEND_ALWAYS || (p->prepend == PREPEND_FIRST && first)) && n > 0)
        memcpy(buf, p->replacement, p->replacement_len), len = p->replacement_len;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') memcpy(buf + len, p->replacement, p->replacement_len), len += p->replacement_len;
        else buf[len++] = s[i];
    }
    if (!p->split) {
        pieces_push(out, buf, len, first);
    } else {
        tok_pattern lit = {.literal = (char *)p->replacement, .literal_len = p->replacement_len};
        split_on_pattern(&lit, buf, len, first, SPLIT_MERGED_WITH_NEXT, false, out, NULL);  // a literal cannot fail
    }
    free(buf);
}

// ByteLevel: the optional prefix space, then the GPT-2 regex; the bytes stay raw (the BPE model
// maps them to its byte-level alphabet).
static void bytelevel(const tok_pretokenizer *p, const char *s, size_t n, bool first, tok_pieces *out) {
    char *prefixed = NULL;
    if (p->add_prefix_space && n > 0 && s[0] != ' ') {
        prefixed = neox_malloc(n + 1);
        prefixed[0] = ' ';
        memcpy(prefixed + 1, s, n);
        s = prefixed, n++;
    }
    if (!p->use_regex) {
        pieces_push(out, s, n, first);
    } else {
        for (size_t pos = 0; pos < n;) {
            size_t len = pretok_gpt2_next((const uint8_t *)s, n, pos);
            pieces_push(out, s + pos, len, first && pos == 0);
            pos += len;
        }
    }
    free(prefixed);
}

static int run_step(const tok_pretokenizer *p, const char *s, size_t n, bool first, tok_pieces *out, neox_error *err) {
    switch (p->kind) {
    case PRE_BYTELEVEL: bytelevel(p, s, n, first, out); return 0;
    case PRE_SPLIT: return split_on_pattern(&p->pattern, s, n, first, p->behavior, p->invert, out, err);
    case PRE_DIGITS:
        split_on_chars(s, n, first, is_numeric, p->individual_digits ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS, out);
        return 0;
    case PRE_METASPACE: metaspace(p, s, n, first, out); return 0;
    case PRE_WHITESPACE: return split_on_pattern(&p->pattern, s, n, first, SPLIT_REMOVED, true, out, err);
    case PRE_WHITESPACE_SPLIT: split_on_chars(s, n, first, is_whitespace, SPLIT_REMOVED, out); return 0;
    case PRE_PUNCTUATION: split_on_chars(s, n, first, is_punctuation, p->behavior, out); return 0;
    }
    return 0;
}

int tokenizer_pretokenize(const neox_tokenizer *tok, const char *s, size_t n, bool first, tok_pieces *out,
                          neox_error *err) {
    pieces_clear(out);
    if (tok->n_pretokenizers == 0) {
        pieces_push(out, s, n, first);
        return 0;
    }
    tok_pieces cur = {0};
    pieces_push(&cur, s, n, first);
    for (int i = 0; i < tok->n_pretokenizers; i++) {
        tok_pieces tmp = {0};
        tok_pieces *next = i == tok->n_pretokenizers - 1 ? out : &tmp;
        for (size_t k = 0; k < cur.n; k++) {
            const tok_piece *pc = &cur.items[k];
            if (run_step(&tok->pretokenizers[i], cur.text + pc->off, pc->len, pc->first, next, err) < 0) {
                pieces_free(&cur);
                pieces_free(&tmp);
                return -1;
            }
        }
        pieces_free(&cur);
        cur = tmp;
    }
    return 0;
}
