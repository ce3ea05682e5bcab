// spm.h: SentencePiece (.model files, BPE and unigram) through Debian's libsentencepiece. The
// library is C++; spm_shim.cc wraps the few calls neox.c needs in this C interface, and spm.c
// turns them into the tokenizer's (errors through neox_error, ids appended to growable arrays).
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

#ifdef __cplusplus
}
#endif

#ifndef __cplusplus
// The C side (spm.c).
#include "core.h"

typedef struct neox_tokenizer neox_tokenizer;
int tokenizer_load_spm(neox_tokenizer *tok, const char *path, neox_error *err);
int spm_encode(const spm_model *m, const char *text, size_t n, int32_t **ids, size_t *len, size_t *cap,
               neox_error *err);
char *spm_decode(const spm_model *m, const int32_t *ids, size_t n, size_t *size, neox_error *err);
void spm_free(spm_model *m);
#endif

#endif
