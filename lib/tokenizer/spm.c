// spm.c: SPMTokenizer — a SentencePiece .model file (BPE or unigram) through spm_shim.cc.
// Loading and decoding are the library's own; unigram and BPE models are normalized by
// spm_normalize.c and segmented by unigram.c or spm_bpe.c, over the pieces and scores the library
// loaded (word and char models, which no tokenizer here uses, stay the library's). The
// vocabulary size is the piece count; eod is "<|endoftext|>" when the model has that piece, else
// its eos (</s>); pad and bos are the model's (-1 when disabled).
#include <string.h>

#include "spm.h"
#include "tokenizer_internal.h"

// Whether a SentencePiece model's texts may be cut "a| b" (cut.c): the piece after the cut starts
// with a space, which the normalizer must turn into the "▁" the whole text has there — it strips
// leading whitespace and adds the dummy prefix, or does neither. BPE merges adjacent symbols by
// piece score, so the sides stay apart when no piece joins a letter to a following "▁", and
// consecutive unknown pieces (which spm_bpe.c merges) cannot meet at a cut when the letters are
// pieces. Unused pieces are refused: their split is recorded over the whole text. Unigram's best path is a float sum over the whole text, whose rounding a cut
// would change: a near tie could then go the other way, so unigram models are not cut.
static const char *spm_cut_refusal(const neox_tokenizer *tok, const spm_proto_fields *f) {
    if (f->model_type != SPM_MODEL_BPE) return "a SentencePiece model that is not BPE (path scores are float sums)";
    if (f->treat_whitespace_as_suffix || !f->escape_whitespaces || f->add_dummy_prefix != f->remove_extra_whitespaces)
        return "a SentencePiece normalizer that would not turn the space a piece starts with into the whole text's";
    int32_t n = spm_shim_piece_count(tok->spm), unk = spm_shim_special_id(tok->spm, 'u');
    for (size_t id = 0; id < f->n_pieces; id++)
        if (f->types[id] == SPM_PIECE_UNUSED) return "a SentencePiece BPE model with unused pieces";
    char one[2] = {0, 0};
    for (int c = 'A'; c <= 'z'; c++) {
        if (c > 'Z' && c < 'a') continue;
        one[0] = (char)c;
        int32_t id = spm_shim_piece_id(tok->spm, one);
        if (id < 0 || id == unk) return "a SentencePiece model without a piece for every ASCII letter";
    }
    for (int32_t id = 0; id < n; id++) {
        const char *piece = spm_shim_piece(tok->spm, id), *at = piece;
        while ((at = strstr(at, "\xe2\x96\x81")) != NULL) {
            if (at > piece && (uint8_t)((at[-1] | 0x20) - 'a') < 26)
                return "a SentencePiece piece joins a letter to a following U+2581";
            at += 3;
        }
        if (strchr(piece, ' ')) return "a SentencePiece piece holds a space";
    }
    return NULL;
}

// A unigram model gets its lattice, a BPE model its merges, and both the normalizer. The library
// has already checked the file: the fields it does not expose are read from its own serialization,
// so a failure here would mean a library version that writes what this code does not know.
static int load_encoder(neox_tokenizer *tok, const char *path, neox_error *err) {
    size_t size = 0;
    uint8_t *bytes = spm_shim_serialized(tok->spm, &size);
    spm_proto_fields fields;
    int rc = bytes ? spm_proto_read(bytes, size, &fields) : -1;
    free(bytes);
    if (rc < 0) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: the SentencePiece model could not be read back", path);
    int32_t n = spm_shim_piece_count(tok->spm);
    if (fields.n_pieces != (size_t)n) {
        spm_proto_fields_free(&fields);
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: the SentencePiece model has %zu pieces, the library %d", path,
                         fields.n_pieces, n);
    }
    tok->cut_refusal = spm_cut_refusal(tok, &fields);
    if (fields.model_type != SPM_MODEL_UNIGRAM && fields.model_type != SPM_MODEL_BPE) {
        spm_proto_fields_free(&fields);
        return 0;  // word and char models: the library encodes them
    }
    const char **pieces = neox_malloc((size_t)n * sizeof *pieces);
    float *scores = neox_malloc((size_t)n * sizeof *scores);
    for (int32_t id = 0; id < n; id++) {
        pieces[id] = spm_shim_piece(tok->spm, id);
        scores[id] = spm_shim_score(tok->spm, id);
    }
    int32_t unk = spm_shim_special_id(tok->spm, 'u');
    const unigram_model *user_symbols;
    if (fields.model_type == SPM_MODEL_UNIGRAM) {
        tok->spm_unigram = unigram_new(pieces, scores, fields.types, n, unk, fields.byte_fallback);
        user_symbols = tok->spm_unigram;
    } else {
        tok->spm_bpe = spm_bpe_new(pieces, scores, fields.types, n, unk, fields.byte_fallback,
                                   fields.escape_whitespaces);
        user_symbols = spm_bpe_user_symbols(tok->spm_bpe);
    }
    free(pieces);
    free(scores);
    tok->spm_normalizer = spm_normalizer_new(&fields, user_symbols);
    spm_proto_fields_free(&fields);
    return 0;
}

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
    return load_encoder(tok, path, err);
}

static void encode_normalized(const neox_tokenizer *tok, const char *text, size_t n, int32_t **ids, size_t *len,
                              size_t *cap) {
    size_t size = 0;
    char *normalized = spm_normalize(tok->spm_normalizer, text, n, &size);
    if (tok->spm_unigram) unigram_encode(tok->spm_unigram, normalized, size, ids, len, cap);
    else spm_bpe_encode(tok->spm_bpe, normalized, size, ids, len, cap);
    free(normalized);
}

int spm_encode(const neox_tokenizer *tok, const char *text, size_t n, int32_t **ids, size_t *len, size_t *cap,
               neox_error *err) {
    if (tok->spm_normalizer) {
        encode_normalized(tok, text, n, ids, len, cap);
        return 0;
    }
    const spm_model *m = tok->spm;
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

void spm_free(neox_tokenizer *tok) {
    if (tok->spm) spm_shim_free(tok->spm);
    unigram_free(tok->spm_unigram);
    spm_bpe_free(tok->spm_bpe);
    spm_normalizer_free(tok->spm_normalizer);
}
