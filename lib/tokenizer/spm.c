// spm.c: SPMTokenizer — a SentencePiece .model file (BPE or unigram) through spm_shim.cc. Ids,
// normalization and decoding are the library's own, so they are SentencePiece's exactly. The
// vocabulary size is the piece count; eod is "<|endoftext|>" when the model has that piece, else
// its eos (</s>); pad and bos are the model's (-1 when disabled).
#include <string.h>

#include "spm.h"
#include "tokenizer_internal.h"

int tokenizer_load_spm(neox_tokenizer *tok, const char *path, neox_error *err) {
    char msg[512] = "";
    tok->spm = spm_shim_load(path, msg, sizeof msg);
    if (!tok->spm) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: not a SentencePiece model (%s)", path, msg);
    int32_t n = spm_shim_piece_count(tok->spm);
    for (int32_t id = 0; id < n; id++) {
        const char *piece = spm_shim_piece(tok->spm, id);
        if (tokenizer_set_id_text(tok, id, piece, strlen(piece), path, err) < 0) return -1;
    }
    tok->vocab_size = n;
    int32_t eot = spm_shim_piece_id(tok->spm, "<|endoftext|>");
    tok->eod_id = eot >= 0 ? eot : spm_shim_special_id(tok->spm, 'e');
    tok->pad_id = spm_shim_special_id(tok->spm, 'p');
    tok->declared[NEOX_SPECIAL_BOS] = spm_shim_special_id(tok->spm, 'b');
    return 0;
}

int spm_encode(const spm_model *m, const char *text, size_t n, int32_t **ids, size_t *len, size_t *cap,
               neox_error *err) {
    char msg[512] = "";
    size_t count = 0;
    int32_t *got = spm_shim_encode(m, text, n, &count, msg, sizeof msg);
    if (!got) return neox_fail(err, NEOX_EXIT_FAILURE, "SentencePiece encode failed: %s", msg);
    if (*len + count > *cap) {
        *cap = (*len + count) * 2 > 1024 ? (*len + count) * 2 : 1024;
        *ids = neox_realloc(*ids, *cap * sizeof **ids);
    }
    memcpy(*ids + *len, got, count * sizeof *got);
    *len += count;
    free(got);
    return 0;
}

char *spm_decode(const spm_model *m, const int32_t *ids, size_t n, size_t *size, neox_error *err) {
    int32_t count = spm_shim_piece_count(m);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= count) {
            neox_fail(err, NEOX_EXIT_FAILURE, "token id %d is out of range for SPMTokenizer (vocabulary of %d)", ids[i],
                      count);
            return NULL;
        }
    char msg[512] = "";
    char *text = spm_shim_decode(m, ids, n, size, msg, sizeof msg);
    if (!text) neox_fail(err, NEOX_EXIT_FAILURE, "SentencePiece decode failed: %s", msg);
    return text;
}

void spm_free(spm_model *m) {
    if (m) spm_shim_free(m);
}
