// spm_model_proto.c: the fields of a serialized SentencePiece ModelProto that the library's public
// interface does not expose — each piece's type (user-defined pieces score differently in the
// unigram lattice), the model type, byte_fallback, and the normalizer_spec that spm_normalize.c
// applies. Protocol-buffer wire format, read with bounds checks on every length, so any byte
// string gives either the fields or an error.
#include <stdlib.h>
#include <string.h>

#include "spm.h"

// Field numbers in sentencepiece_model.proto.
enum {
    MODEL_PIECES = 1, MODEL_TRAINER_SPEC = 2, MODEL_NORMALIZER_SPEC = 3,
    PIECE_TYPE = 3,
    TRAINER_MODEL_TYPE = 3, TRAINER_WHITESPACE_AS_SUFFIX = 24, TRAINER_BYTE_FALLBACK = 35,
    NORMALIZER_CHARSMAP = 2, NORMALIZER_DUMMY_PREFIX = 3, NORMALIZER_REMOVE_SPACES = 4, NORMALIZER_ESCAPE_SPACES = 5,
};
enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_LEN = 2, WIRE_FIXED32 = 5 };

typedef struct cursor { const uint8_t *p, *end; } cursor;

static int read_varint(cursor *c, uint64_t *v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (c->p >= c->end) return -1;
        uint8_t b = *c->p++;
        *v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) return 0;
    }
    return -1;
}

// Reads one field's key and value: a varint into *v, or a LEN field's bytes into *sub; fixed
// fields are skipped. Returns the field number, 0 at the end, -1 on malformed input.
static int next_field(cursor *c, uint64_t *v, cursor *sub) {
    if (c->p == c->end) return 0;
    uint64_t key;
    if (read_varint(c, &key) < 0 || key >> 3 == 0 || key >> 3 > INT32_MAX) return -1;
    switch (key & 7) {
    case WIRE_VARINT: return read_varint(c, v) < 0 ? -1 : (int)(key >> 3);
    case WIRE_FIXED64:
        if (c->end - c->p < 8) return -1;
        c->p += 8;
        return (int)(key >> 3);
    case WIRE_FIXED32:
        if (c->end - c->p < 4) return -1;
        c->p += 4;
        return (int)(key >> 3);
    case WIRE_LEN: {
        uint64_t len;
        if (read_varint(c, &len) < 0 || len > (uint64_t)(c->end - c->p)) return -1;
        *sub = (cursor){c->p, c->p + len};
        c->p += len;
        return (int)(key >> 3);
    }
    default: return -1;  // groups (3, 4) and unknown wire types: not in a SentencePiece model
    }
}

static int read_piece_type(cursor c, uint8_t *type) {
    *type = SPM_PIECE_NORMAL;  // the proto's default
    uint64_t v = 0;
    cursor sub;
    int f;
    while ((f = next_field(&c, &v, &sub)) > 0)
        if (f == PIECE_TYPE) *type = v <= 255 ? (uint8_t)v : 0;
    return f;
}

static int read_trainer_spec(cursor c, spm_proto_fields *out) {
    uint64_t v = 0;
    cursor sub;
    int f;
    while ((f = next_field(&c, &v, &sub)) > 0) {
        if (f == TRAINER_MODEL_TYPE) out->model_type = (int)(v <= 255 ? v : 0);
        if (f == TRAINER_BYTE_FALLBACK) out->byte_fallback = v != 0;
        if (f == TRAINER_WHITESPACE_AS_SUFFIX) out->treat_whitespace_as_suffix = v != 0;
    }
    return f;
}

static int read_normalizer_spec(cursor c, spm_proto_fields *out) {
    uint64_t v = 0;
    cursor sub = {0};
    int f;
    while ((f = next_field(&c, &v, &sub)) > 0) {
        if (f == NORMALIZER_CHARSMAP) {
            free(out->charsmap);
            out->charsmap_size = (size_t)(sub.end - sub.p);
            out->charsmap = out->charsmap_size ? neox_malloc(out->charsmap_size) : NULL;
            if (out->charsmap_size) memcpy(out->charsmap, sub.p, out->charsmap_size);
        }
        if (f == NORMALIZER_DUMMY_PREFIX) out->add_dummy_prefix = v != 0;
        if (f == NORMALIZER_REMOVE_SPACES) out->remove_extra_whitespaces = v != 0;
        if (f == NORMALIZER_ESCAPE_SPACES) out->escape_whitespaces = v != 0;
    }
    return f;
}

int spm_proto_read(const uint8_t *data, size_t size, spm_proto_fields *out) {
    memset(out, 0, sizeof *out);
    // The proto's defaults.
    out->model_type = SPM_MODEL_UNIGRAM;
    out->add_dummy_prefix = out->remove_extra_whitespaces = out->escape_whitespaces = true;
    size_t cap = 0;
    cursor c = {data, data + size}, sub;
    uint64_t v = 0;
    int f;
    while ((f = next_field(&c, &v, &sub)) > 0) {
        if (f == MODEL_PIECES) {
            if (out->n_pieces == cap) {
                cap = cap ? cap * 2 : 256;
                out->types = neox_realloc(out->types, cap);
            }
            if (read_piece_type(sub, &out->types[out->n_pieces++]) < 0) f = -1;
        } else if (f == MODEL_TRAINER_SPEC) {
            // A message field that occurs twice is merged: later values win, as in protobuf.
            if (read_trainer_spec(sub, out) < 0) f = -1;
        } else if (f == MODEL_NORMALIZER_SPEC) {
            if (read_normalizer_spec(sub, out) < 0) f = -1;
        }
        if (f < 0) break;
    }
    if (f < 0) {
        spm_proto_fields_free(out);
        return -1;
    }
    return 0;
}

void spm_proto_fields_free(spm_proto_fields *f) {
    free(f->types);
    free(f->charsmap);
    f->types = f->charsmap = NULL;
    f->n_pieces = f->charsmap_size = 0;
}
