// ckpt.h: layout-free checkpoint shards in HDF5 (DESIGN.md decision 6). Every rank writes its own
// shard file; each dataset in it is one piece of a global tensor and records the tensor's global
// shape and where the piece sits in it — either a block (an offset and a count per dimension, as
// tensor parallelism cuts tensors) or a flat range of the row-major tensor (as ZeRO cuts flat
// buffers). A reader indexes every piece of every shard file of a checkpoint and fills any block
// or range a layout asks for from the intersections, so any layout can load any checkpoint.
#ifndef NEOX_CKPT_H
#define NEOX_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "core.h"

#define NEOX_CKPT_MAX_DIMS 8

// ---- writing one shard file -------------------------------------------------------------------
typedef struct neox_ckpt_writer neox_ckpt_writer;

// Creates path under a temporary name; neox_ckpt_writer_close() renames it into place.
neox_ckpt_writer *neox_ckpt_writer_open(const char *path, neox_error *err);
// Writes a block of the global tensor `name` (a '/'-separated path such as "params/gpt_neox.embed_in.weight"):
// data holds count[0] x ... x count[ndim-1] floats, row-major, starting at offset in the tensor.
int neox_ckpt_write_block(neox_ckpt_writer *w, const char *name, int ndim, const int64_t *global_shape,
                          const int64_t *offset, const int64_t *count, const float *data, neox_error *err);
// Writes elements [start, start + n) of the row-major global tensor `name`.
int neox_ckpt_write_range(neox_ckpt_writer *w, const char *name, int ndim, const int64_t *global_shape, int64_t start,
                          int64_t n, const float *data, neox_error *err);
// Writes an opaque byte string (RNG state, data position, YAML text) under `name`.
int neox_ckpt_write_bytes(neox_ckpt_writer *w, const char *name, const void *data, size_t size, neox_error *err);
// Flushes, fsyncs and renames the file into place; frees w. On error the temporary is removed.
int neox_ckpt_writer_close(neox_ckpt_writer *w, neox_error *err);
// Removes the temporary file and frees w (for error paths).
void neox_ckpt_writer_abort(neox_ckpt_writer *w);

// ---- reading any layout -----------------------------------------------------------------------
typedef struct neox_ckpt_reader neox_ckpt_reader;

// Opens shard files (all of them, from any layout) and indexes their pieces. Pieces of one tensor
// must agree on its global shape.
neox_ckpt_reader *neox_ckpt_reader_open(const char *const *paths, int npaths, neox_error *err);
void neox_ckpt_reader_close(neox_ckpt_reader *r);

// The tensors the checkpoint holds (sorted by name).
int neox_ckpt_tensor_count(const neox_ckpt_reader *r);
const char *neox_ckpt_tensor_name(const neox_ckpt_reader *r, int i);
// Global shape of a tensor; -1 with an error naming it when the checkpoint has no such tensor.
int neox_ckpt_tensor_shape(const neox_ckpt_reader *r, const char *name, int *ndim, int64_t *shape, neox_error *err);
int neox_ckpt_has(const neox_ckpt_reader *r, const char *name);

// Fills dst (count[0] x ... row-major) with the block at offset. Fails, naming the tensor and the
// first element not covered, when the shards do not cover the whole block (a missing shard file).
int neox_ckpt_read_block(const neox_ckpt_reader *r, const char *name, const int64_t *offset, const int64_t *count,
                         float *dst, neox_error *err);
// Fills dst with elements [start, start + n) of the row-major tensor.
int neox_ckpt_read_range(const neox_ckpt_reader *r, const char *name, int64_t start, int64_t n, float *dst,
                         neox_error *err);
// Reads a byte string written with neox_ckpt_write_bytes; *data is malloc'ed (free()).
int neox_ckpt_read_bytes(const neox_ckpt_reader *r, const char *name, void **data, size_t *size, neox_error *err);

#endif
