// metrics/internal.h: building blocks shared by the files of lib/metrics and checked by
// tests/unit/test_metrics.c — CRC32C, protobuf wire encoding, the JSONL appender, mkdir -p.
#ifndef NEOX_METRICS_INTERNAL_H
#define NEOX_METRICS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "core.h"

// ---- CRC32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord frames use it ----------
uint32_t neox_crc32c(const void *data, size_t size);
// TFRecord's masked form: rotate right by 15 and add 0xa282ead8, so a CRC stored inside data
// that is itself checksummed does not cancel out.
uint32_t neox_crc32c_masked(const void *data, size_t size);

// ---- protobuf wire format -------------------------------------------------------------------
enum { NEOX_PB_VARINT = 0, NEOX_PB_FIXED64 = 1, NEOX_PB_BYTES = 2, NEOX_PB_FIXED32 = 5 };

typedef struct neox_pb {
    uint8_t *data;
    size_t len, cap;
} neox_pb;

// Writes v as a base-128 varint into out (at most 10 bytes); returns the byte count.
size_t neox_pb_varint_encode(uint64_t v, uint8_t out[10]);
void neox_pb_varint(neox_pb *b, uint64_t v);
void neox_pb_key(neox_pb *b, int field, int wire_type);
void neox_pb_int64_field(neox_pb *b, int field, int64_t v);    // negative: 10-byte two's complement
void neox_pb_double_field(neox_pb *b, int field, double v);    // fixed64, little-endian
void neox_pb_float_field(neox_pb *b, int field, float v);      // fixed32, little-endian
void neox_pb_bytes_field(neox_pb *b, int field, const void *data, size_t size);
void neox_pb_free(neox_pb *b);

// ---- JSONL appender -------------------------------------------------------------------------
typedef struct neox_jsonl neox_jsonl;

// Opens path for appending (creating it and its directory).
neox_jsonl *neox_jsonl_open(const char *path, neox_error *err);
// Appends obj as one line with a single write(); with sync, fsyncs the file afterwards.
int neox_jsonl_append(neox_jsonl *j, const json_t *obj, int sync, neox_error *err);
int neox_jsonl_sync(neox_jsonl *j, neox_error *err);
int neox_jsonl_close(neox_jsonl *j, neox_error *err);   // syncs; frees j even on failure
const char *neox_jsonl_path(const neox_jsonl *j);
// A JSON number, or null for NaN and infinities (which JSON cannot hold).
json_t *neox_json_number(double v);

#endif
