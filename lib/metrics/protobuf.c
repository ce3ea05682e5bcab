// protobuf.c: the few pieces of the protobuf wire format the TensorBoard Event and Summary
// messages need (varints, fixed64/fixed32 numbers, length-delimited fields), encoded by hand so
// neox.c needs no protobuf compiler or runtime for writing scalars.
#include <stdlib.h>
#include <string.h>

#include "metrics/internal.h"

static void pb_reserve(neox_pb *b, size_t extra) {
    if (b->len + extra <= b->cap) return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra) cap *= 2;
    b->data = neox_realloc(b->data, cap);
    b->cap = cap;
}

static void pb_append(neox_pb *b, const void *data, size_t size) {
    pb_reserve(b, size);
    if (size) memcpy(b->data + b->len, data, size);
    b->len += size;
}

size_t neox_pb_varint_encode(uint64_t v, uint8_t out[10]) {
    size_t n = 0;
    while (v >= 0x80) {
        out[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    out[n++] = (uint8_t)v;
    return n;
}

void neox_pb_varint(neox_pb *b, uint64_t v) {
    uint8_t tmp[10];
    pb_append(b, tmp, neox_pb_varint_encode(v, tmp));
}

void neox_pb_key(neox_pb *b, int field, int wire_type) {
    neox_pb_varint(b, ((uint64_t)field << 3) | (uint64_t)wire_type);
}

void neox_pb_int64_field(neox_pb *b, int field, int64_t v) {
    neox_pb_key(b, field, NEOX_PB_VARINT);
    neox_pb_varint(b, (uint64_t)v);
}

// Little-endian byte order is the wire format's, whatever the host's.
static void pb_fixed(neox_pb *b, uint64_t bits, int bytes) {
    uint8_t tmp[8];
    for (int i = 0; i < bytes; i++) tmp[i] = (uint8_t)(bits >> (8 * i));
    pb_append(b, tmp, (size_t)bytes);
}

void neox_pb_double_field(neox_pb *b, int field, double v) {
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    neox_pb_key(b, field, NEOX_PB_FIXED64);
    pb_fixed(b, bits, 8);
}

void neox_pb_float_field(neox_pb *b, int field, float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    neox_pb_key(b, field, NEOX_PB_FIXED32);
    pb_fixed(b, bits, 4);
}

void neox_pb_bytes_field(neox_pb *b, int field, const void *data, size_t size) {
    neox_pb_key(b, field, NEOX_PB_BYTES);
    neox_pb_varint(b, size);
    pb_append(b, data, size);
}

void neox_pb_free(neox_pb *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}
