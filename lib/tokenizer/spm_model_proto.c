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

// One field: its number, wire type, and value (a varint in v, a LEN field's bytes in sub).
typedef struct field { int number, wire; uint64_t v; cursor sub; } field;

// Reads the next field of c into *f (fixed-size values are skipped). Returns 1, 0 at the end,
// -1 on malformed input.
static int next_field(cursor *c, field *f) {
    if (c->p == c->end) return 0;
    uint64_t key;
    if (read_varint(c, &key) < 0 || key >> 3 == 0 || key >> 3 > INT32_MAX) return -1;
    *f = (field){(int)(key >> 3), (int)(key & 7), 0, {c->p, c->p}};
    switch (f->wire) {
    case WIRE_VARINT: return read_varint(c, &f->v) < 0 ? -1 : 1;
    case WIRE_FIXED64:
    case WIRE_FIXED32: {
        size_t n = f->wire == WIRE_FIXED64 ? 8 : 4;
        if ((size_t)(c->end - c->p) < n) return -1;
        c->p += n;
        return 1;
    }
    case WIRE_LEN: {
        uint64_t len;
        if (read_varint(c, &len) < 0 || len > (uint64_t)(c->end - c->p)) return -1;
        f->sub = (cursor){c->p, c->p + len};
        c->p += len;
        return 1;
    }
    default: return -1;  // groups (3, 4) and unknown wire types: not in a SentencePiece model
    }
}

// Whether f is field `number`: 1, 0 when it is another field, -1 when it is that field with
// another wire type than `wire` (the library would not have written it).
static int field_is(const field *f, int number, int wire) {
    if (f->number != number) return 0;
    return f->wire == wire ? 1 : -1;
}

static int read_piece_type(cursor c, uint8_t *type) {
    *type = SPM_PIECE_NORMAL;  // the proto's default
    field f;
    int rc, is;
    while ((rc = next_field(&c, &f)) > 0) {
        if ((is = field_is(&f, PIECE_TYPE, WIRE_VARINT)) < 0) return -1;
        if (is) *type = f.v <= 255 ? (uint8_t)f.v : 0;
    }
    return rc;
}

// Reads a boolean or enum field into *out when f is field `number`; -1 for the wrong wire type.
static int read_varint_field(const field *f, int number, uint64_t *out) {
    int is = field_is(f, number, WIRE_VARINT);
    if (is > 0) *out = f->v;
    return is;
}

static int read_trainer_spec(cursor c, spm_proto_fields *out) {
    field f;
    int rc;
    while ((rc = next_field(&c, &f)) > 0) {
        uint64_t model_type = (uint64_t)out->model_type, byte_fallback = out->byte_fallback,
                 suffix = out->treat_whitespace_as_suffix;
        if (read_varint_field(&f, TRAINER_MODEL_TYPE, &model_type) < 0 ||
            read_varint_field(&f, TRAINER_BYTE_FALLBACK, &byte_fallback) < 0 ||
            read_varint_field(&f, TRAINER_WHITESPACE_AS_SUFFIX, &suffix) < 0)
            return -1;
        out->model_type = model_type <= 255 ? (int)model_type : 0;
        out->byte_fallback = byte_fallback != 0, out->treat_whitespace_as_suffix = suffix != 0;
    }
    return rc;
}

static int read_normalizer_spec(cursor c, spm_proto_fields *out) {
    field f;
    int rc, is;
    while ((rc = next_field(&c, &f)) > 0) {
        if ((is = field_is(&f, NORMALIZER_CHARSMAP, WIRE_LEN)) < 0) return -1;
        if (is) {
            free(out->charsmap);
            out->charsmap_size = (size_t)(f.sub.end - f.sub.p);
            out->charsmap = out->charsmap_size ? neox_malloc(out->charsmap_size) : NULL;
            if (out->charsmap_size) memcpy(out->charsmap, f.sub.p, out->charsmap_size);
        }
        uint64_t prefix = out->add_dummy_prefix, remove = out->remove_extra_whitespaces,
                 escape = out->escape_whitespaces;
        if (read_varint_field(&f, NORMALIZER_DUMMY_PREFIX, &prefix) < 0 ||
            read_varint_field(&f, NORMALIZER_REMOVE_SPACES, &remove) < 0 ||
            read_varint_field(&f, NORMALIZER_ESCAPE_SPACES, &escape) < 0)
            return -1;
        out->add_dummy_prefix = prefix != 0, out->remove_extra_whitespaces = remove != 0;
        out->escape_whitespaces = escape != 0;
    }
    return rc;
}

// The fields of the top-level message: 1 when read, -1 when malformed.
static int read_model_field(const field *f, spm_proto_fields *out, size_t *cap) {
    int is;
    if ((is = field_is(f, MODEL_PIECES, WIRE_LEN)) != 0) {
        if (is < 0) return -1;
        if (out->n_pieces == *cap) {
            *cap = *cap ? *cap * 2 : 256;
            out->types = neox_realloc(out->types, *cap);
        }
        return read_piece_type(f->sub, &out->types[out->n_pieces++]) < 0 ? -1 : 1;
    }
    // A message field that occurs twice is merged: later values win, as in protobuf.
    if ((is = field_is(f, MODEL_TRAINER_SPEC, WIRE_LEN)) != 0)
        return is < 0 || read_trainer_spec(f->sub, out) < 0 ? -1 : 1;
    if ((is = field_is(f, MODEL_NORMALIZER_SPEC, WIRE_LEN)) != 0)
        return is < 0 || read_normalizer_spec(f->sub, out) < 0 ? -1 : 1;
    return 1;
}

int spm_proto_read(const uint8_t *data, size_t size, spm_proto_fields *out) {
    memset(out, 0, sizeof *out);
    // The proto's defaults.
    out->model_type = SPM_MODEL_UNIGRAM;
    out->add_dummy_prefix = out->remove_extra_whitespaces = out->escape_whitespaces = true;
    size_t cap = 0;
    cursor c = {data, data + size};
    field f;
    int rc;
    while ((rc = next_field(&c, &f)) > 0)
        if (read_model_field(&f, out, &cap) < 0) {
            rc = -1;
            break;
        }
    if (rc < 0) {
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
