// ckpt.h: layout-free checkpoint shards in HDF5 (docs/design.md, decision 6). Every rank writes its own
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
// The most elements a tensor of a checkpoint may have (2^48: far above any model, far below
// where its byte count overflows); shards claiming more are refused.
#define NEOX_CKPT_MAX_ELEMENTS (INT64_C(1) << 48)

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
// The same, also filling entry->bytes and entry->crc32 (name and rank are left as they are) for
// the manifest: what neox_file_crc32() gives on the finished file, computed from the data
// as it was written plus a read of HDF5's metadata only, not of the whole file.
typedef struct neox_ckpt_file_entry neox_ckpt_file_entry;
int neox_ckpt_writer_close_entry(neox_ckpt_writer *w, neox_ckpt_file_entry *entry, neox_error *err);
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
// Writes the flat range [start, start + n) of a float tensor to fd at byte fd_offset, as native
// floats. Pieces stored as plain runs of the tensor's bytes (ranges, blocks of whole rows) are
// copied file to file in the kernel (copy_file_range), never passing through user memory: exporting
// is then as fast as `cp`. Other pieces go through memory. Coverage is checked as for reads.
int neox_ckpt_copy_range_to_fd(const neox_ckpt_reader *r, const char *name, int64_t start, int64_t n, int fd,
                               int64_t fd_offset, neox_error *err);
// Reads a byte string written with neox_ckpt_write_bytes; *data is malloc'ed (free()).
int neox_ckpt_read_bytes(const neox_ckpt_reader *r, const char *name, void **data, size_t *size, neox_error *err);

// ---- checkpoint directories -------------------------------------------------------------------
// SAVE/global_stepN/ holds the shard files, the effective config and manifest.json (written last,
// by one rank, once every shard is in place); SAVE/latest names the newest complete checkpoint and
// is replaced atomically after the manifest. See docs/checkpoints.md.

typedef struct neox_ckpt_file_entry {
    char name[64];      // file name inside the checkpoint directory
    int rank;           // world rank that wrote it (-1 for files written once, like config.yml)
    uint64_t bytes;
    uint32_t crc32;     // zlib CRC-32 of the whole file
} neox_ckpt_file_entry;

typedef struct neox_ckpt_manifest {
    int64_t iteration;
    int world_size, pipe_size, data_size, model_size, zero_stage;
    int nfiles;
    neox_ckpt_file_entry *files;
} neox_ckpt_manifest;

// "SAVE/global_stepN" (malloc'ed).
char *neox_ckpt_dir(const char *save, int64_t iteration);
// "rank_RRRRR.h5": the shard name of a world rank.
void neox_ckpt_shard_name(int rank, char *buf, size_t size);
// Creates SAVE/global_stepN (and SAVE), succeeding when it exists.
int neox_ckpt_make_dir(const char *save, int64_t iteration, neox_error *err);
// A new checkpoint of SAVE is written into a temporary directory beside SAVE/global_stepN
// (begin; creates SAVE too) and switched into place whole once complete: a new name is a rename,
// an existing checkpoint of the same iteration (saving again into a directory `latest` may name)
// is exchanged with the new one atomically (renameat2 RENAME_EXCHANGE) and removed only after.
char *neox_ckpt_begin_dir(const char *save, int64_t iteration, neox_error *err);
int neox_ckpt_switch_dir(const char *save, int64_t iteration, const char *tmp, neox_error *err);
// Checks dir/<entry name> against its manifest entry: its size first (a truncation is refused
// without reading), then its CRC-32; the error names the file.
int neox_ckpt_check_file(const char *dir, const neox_ckpt_file_entry *entry, neox_error *err);
// Checks every file the manifest lists (a directory checked just before, whose files stat() finds
// unchanged, is not read again).
int neox_ckpt_check_files(const char *dir, const neox_ckpt_manifest *m, neox_error *err);
// Opens a checkpoint directory the one way every tool does: reads its manifest into m, checks
// every file against it, and only then lets HDF5 open the shard files (rank >= 0). NULL + err
// naming the file when anything does not match; m is freed then.
neox_ckpt_reader *neox_ckpt_open_dir(const char *dir, neox_ckpt_manifest *m, neox_error *err);
// Writes manifest.json atomically into the checkpoint directory.
int neox_ckpt_manifest_write(const char *dir, const neox_ckpt_manifest *m, neox_error *err);
// Reads and validates a manifest.json; m->files is malloc'ed (neox_ckpt_manifest_free).
int neox_ckpt_manifest_read(const char *dir, neox_ckpt_manifest *m, neox_error *err);
void neox_ckpt_manifest_free(neox_ckpt_manifest *m);
// Points SAVE/latest at global_stepN (atomic replace), then removes the oldest global_step
// directories beyond keep_last (keep_last <= 0 keeps all).
int neox_ckpt_mark_latest(const char *save, int64_t iteration, int keep_last, neox_error *err);
// The iteration SAVE/latest names; 0 with *found = 0 when there is no checkpoint to resume.
int neox_ckpt_read_latest(const char *save, int64_t *iteration, int *found, neox_error *err);

#endif
