// gpt2_files.c: loading GPT-2's vocab.json (token text -> id) and merges.txt ("#version" line,
// then one "left right" pair per line, in rank order), as GPT2BPETokenizer and HFGPT2Tokenizer
// use them. Errors name the file, the line or key, and what is wrong.
#include <jansson.h>
#include <string.h>

#include "tokenizer_internal.h"

// Ids above this are refused: the id table is dense, and no real vocabulary comes close.
#define MAX_TOKEN_ID (1 << 24)

int tokenizer_load_vocab_object(neox_tokenizer *tok, json_t *vocab, const char *file, const char *where,
                                neox_error *err) {
    if (!json_is_object(vocab)) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s is not a JSON object", file, where);
    bpe_init(&tok->bpe, json_object_size(vocab));
    const char *key;
    json_t *value;
    json_object_foreach(vocab, key, value) {
        if (!json_is_integer(value))
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s: the id of token \"%s\" is not an integer", file, where,
                             key);
        json_int_t id = json_integer_value(value);
        if (id < 0 || id >= MAX_TOKEN_ID)
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s: the id %lld of token \"%s\" is out of range (0..%d)",
                             file, where, (long long)id, key, MAX_TOKEN_ID - 1);
        size_t len = strlen(key);
        strmap_put(&tok->bpe.vocab, key, len, (int32_t)id);  // keys are unique: the parser rejects duplicates
        if (tokenizer_set_id_text(tok, (int32_t)id, key, len, file, err) < 0) return -1;
    }
    return 0;
}

// Resolves one merge (left, right) by text and adds it with the given rank.
int tokenizer_add_merge_text(neox_tokenizer *tok, const char *left, size_t llen, const char *right, size_t rlen,
                             int32_t rank, const char *file, const char *where, neox_error *err) {
    int32_t a = strmap_get(&tok->bpe.vocab, left, llen), b = strmap_get(&tok->bpe.vocab, right, rlen);
    if (a < 0 || b < 0)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s: merge token \"%.*s\" is not in the vocabulary", file, where,
                         (int)(a < 0 ? llen : rlen), a < 0 ? left : right);
    // HF: the merged token is a + b less continuing_subword_prefix's length from the front of b.
    size_t skip = tok->bpe.prefix_len;
    if (skip > rlen)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s: \"%.*s\" is shorter than continuing_subword_prefix", file,
                         where, (int)rlen, right);
    right += skip, rlen -= skip;
    char small[256];
    char *joined = llen + rlen <= sizeof small ? small : neox_malloc(llen + rlen);
    memcpy(joined, left, llen);
    memcpy(joined + llen, right, rlen);
    int32_t c = strmap_get(&tok->bpe.vocab, joined, llen + rlen);
    if (c < 0) {
        neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s: the merged token \"%.*s\" is not in the vocabulary", file, where,
                  (int)(llen + rlen), joined);
        if (joined != small) free(joined);
        return -1;
    }
    if (joined != small) free(joined);
    bpe_add_merge(&tok->bpe, a, b, c, rank);
    return 0;
}

static int load_merges_txt(neox_tokenizer *tok, const char *path, neox_error *err) {
    size_t size;
    char *text = neox_read_file(path, &size, err);
    if (!text) return -1;
    int rc = 0;
    int32_t rank = 0;
    size_t line_no = 0;
    for (char *line = text; line < text + size;) {
        char *eol = memchr(line, '\n', (size_t)(text + size - line));
        if (!eol) eol = text + size;
        line_no++;
        size_t len = (size_t)(eol - line);
        if (len && line[len - 1] == '\r') len--;
        char *next = eol + 1;
        if (len >= 8 && !memcmp(line, "#version", 8)) {
            line = next;
            continue;
        }
        char *space = memchr(line, ' ', len);
        if (!space || space == line || space == line + len - 1 || memchr(space + 1, ' ', (size_t)(line + len - space - 1))) {
            rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s:%zu: a merge must be two tokens separated by one space", path,
                           line_no);
            break;
        }
        char where[64];
        snprintf(where, sizeof where, "line %zu", line_no);
        if (tokenizer_add_merge_text(tok, line, (size_t)(space - line), space + 1, (size_t)(line + len - space - 1),
                                     rank++, path, where, err) < 0) {
            rc = -1;
            break;
        }
        line = next;
    }
    free(text);
    return rc;
}

int tokenizer_load_gpt2_files(neox_tokenizer *tok, const char *vocab_file, const char *merge_file, neox_error *err) {
    json_error_t jerr;
    json_t *vocab = json_load_file(vocab_file, JSON_REJECT_DUPLICATES, &jerr);
    if (!vocab)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s:%d:%d: invalid JSON: %s", vocab_file, jerr.line, jerr.column,
                         jerr.text);
    int rc = tokenizer_load_vocab_object(tok, vocab, vocab_file, "vocabulary", err);
    json_decref(vocab);
    if (rc < 0) return -1;
    if (load_merges_txt(tok, merge_file, err) < 0) return -1;
    tok->bpe.byte_level = true;
    bpe_finish(&tok->bpe);
    tok->use_regex = true;
    tok->bytelevel_only = true;
    tok->has_decoder = true;
    tok->decoders[tok->n_decoders++] = (tok_decoder){.kind = DEC_BYTELEVEL};
    tok->vocab_size = (int64_t)tok->bpe.vocab.count;
    return 0;
}
