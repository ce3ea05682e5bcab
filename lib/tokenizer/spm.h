// spm.h: SentencePiece (.model files, BPE and unigram) through Debian's libsentencepiece. The
// library is C++; spm_shim.cc wraps the few calls neox.c needs in this C interface, and spm.c
// turns them into the tokenizer's (errors through neox_error, ids appended to growable arrays).
// Unigram models are normalized by spm_normalize.c and segmented by unigram.c (sentencepiece
// 0.2.3's lattice arithmetic, which the library's 0.1.97 does not have), BPE models by spm_bpe.c;
// the library loads and decodes.
#ifndef NEOX_TOKENIZER_SPM_H
#define NEOX_TOKENIZER_SPM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct spm_model spm_model;

// The C++ side (spm_shim.cc). Messages go to msg (msg_size bytes); nothing throws.
spm_model *spm_shim_load(const char *path, char *msg, size_t msg_size);
void spm_shim_free(spm_model *m);
// The ids of text (n bytes of UTF-8) in a new malloc'ed array (*count ids), NULL on failure.
int32_t *spm_shim_encode(const spm_model *m, const char *text, size_t n, size_t *count, char *msg, size_t msg_size);
// The text of ids (all in range) in a new malloc'ed NUL-terminated buffer, NULL on failure.
char *spm_shim_decode(const spm_model *m, const int32_t *ids, size_t n, size_t *size, char *msg, size_t msg_size);
int32_t spm_shim_piece_count(const spm_model *m);
const char *spm_shim_piece(const spm_model *m, int32_t id);  // valid while m lives
int32_t spm_shim_piece_id(const spm_model *m, const char *piece);  // -1 when absent
int32_t spm_shim_special_id(const spm_model *m, char which);  // 'b'os, 'e'os, 'u'nk, 'p'ad; -1 when none
float spm_shim_score(const spm_model *m, int32_t id);
// The model as the library holds it (a serialized ModelProto) in a new malloc'ed buffer.
uint8_t *spm_shim_serialized(const spm_model *m, size_t *size);

#ifdef __cplusplus
}
#endif

#ifndef __cplusplus
#include <stdbool.h>

#include "core.h"

// Piece types and model types as sentencepiece_model.proto numbers them.
enum { SPM_PIECE_NORMAL = 1, SPM_PIECE_UNKNOWN = 2, SPM_PIECE_CONTROL = 3, SPM_PIECE_USER_DEFINED = 4,
       SPM_PIECE_UNUSED = 5, SPM_PIECE_BYTE = 6 };
enum { SPM_MODEL_UNIGRAM = 1, SPM_MODEL_BPE = 2, SPM_MODEL_WORD = 3, SPM_MODEL_CHAR = 4 };

// spm_model_proto.c: the fields of a serialized ModelProto that the library's interface hides.
typedef struct spm_proto_fields {
    uint8_t *types;  // per piece, in id order
    size_t n_pieces;
    int model_type;
    bool byte_fallback, treat_whitespace_as_suffix;  // trainer_spec
    uint8_t *charsmap;  // normalizer_spec: precompiled_charsmap (NULL when empty) ...
    size_t charsmap_size;
    bool add_dummy_prefix, remove_extra_whitespaces, escape_whitespaces;  // ... and its switches
} spm_proto_fields;
int spm_proto_read(const uint8_t *data, size_t size, spm_proto_fields *out);  // 0, or -1 when malformed
void spm_proto_fields_free(spm_proto_fields *f);

// unigram.c: the unigram lattice over normalized text.
typedef struct unigram_model unigram_model;
unigram_model *unigram_new(const char *const *pieces, const float *scores, const uint8_t *types, int32_t n,
                           int32_t unk_id, bool byte_fallback);
void unigram_free(unigram_model *u);
// Appends the ids of normalized text (n bytes) to the growable array *ids.
void unigram_encode(const unigram_model *u, const char *normalized, size_t n, int32_t **ids, size_t *len,
                    size_t *cap);
// The length of the longest user-defined piece that starts s (n bytes), 0 when none.
size_t unigram_user_symbol_prefix(const unigram_model *u, const uint8_t *s, size_t n);
// The id of the piece s (n bytes) when it is a normal, user-defined or unused piece, else -1.
int32_t unigram_piece_id(const unigram_model *u, const uint8_t *s, size_t n);

// spm_bpe.c: the BPE merges over normalized text.
typedef struct spm_bpe_model spm_bpe_model;
spm_bpe_model *spm_bpe_new(const char *const *pieces, const float *scores, const uint8_t *types, int32_t n,
                           int32_t unk_id, bool byte_fallback, bool escape_whitespaces);
void spm_bpe_free(spm_bpe_model *b);
// Appends the ids of normalized text (n bytes) to the growable array *ids.
void spm_bpe_encode(const spm_bpe_model *b, const char *normalized, size_t n, int32_t **ids, size_t *len,
                    size_t *cap);
// The user-defined pieces for the normalizer (NULL when the model has none).
const unigram_model *spm_bpe_user_symbols(const spm_bpe_model *b);

// spm_normalize.c: SentencePiece's normalizer (the model's normalizer_spec).
typedef struct spm_normalizer spm_normalizer;
spm_normalizer *spm_normalizer_new(const spm_proto_fields *f, const unigram_model *user_symbols);
void spm_normalizer_free(spm_normalizer *n);
// The normalized form of valid UTF-8 text in a new NUL-terminated buffer of *out_size bytes.
char *spm_normalize(const spm_normalizer *n, const char *text, size_t size, size_t *out_size);

// The C side (spm.c).

typedef struct neox_tokenizer neox_tokenizer;
int tokenizer_load_spm(neox_tokenizer *tok, const char *path, neox_error *err);
int spm_encode(const neox_tokenizer *tok, const char *text, size_t n, int32_t **ids, size_t *len, size_t *cap,
               neox_error *err);
char *spm_decode(const spm_model *m, const int32_t *ids, size_t n, size_t *size, neox_error *err);
void spm_free(neox_tokenizer *tok);
#endif

#endif
