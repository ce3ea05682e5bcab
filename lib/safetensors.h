// safetensors.h: reading and writing Hugging Face safetensors files (an 8-byte little-endian header
// length, a JSON header naming each tensor's dtype, shape and byte range, then the raw data).
// Files are untrusted input: every offset, size and shape in the header is checked before use.
#ifndef NEOX_SAFETENSORS_H
#define NEOX_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core.h"

#define NEOX_ST_MAX_DIMS 8

typedef struct neox_st_tensor {
    char *name;
    char dtype[8];        // "F32", "BF16", "I64", ...
    int ndim;
    int64_t shape[NEOX_ST_MAX_DIMS];
    size_t offset, size;  // bytes, relative to the start of the data section
    const void *data;     // points into the loaded file
} neox_st_tensor;

typedef struct neox_safetensors {
    char *name;           // for messages
    unsigned char *file;  // the whole file: mapped read-only (open) or malloc'ed (parse)
    size_t file_size;
    int mapped;
    int count;
    neox_st_tensor *tensors;  // in file-data order
} neox_safetensors;

// Reads and validates a file. NULL + err (naming the file and the tensor) when malformed.
neox_safetensors *neox_safetensors_open(const char *path, neox_error *err);
// The same on a buffer in memory, which the result takes ownership of (freed by close, also on error).
neox_safetensors *neox_safetensors_parse(unsigned char *buf, size_t size, const char *name, neox_error *err);
void neox_safetensors_close(neox_safetensors *st);
const neox_st_tensor *neox_safetensors_find(const neox_safetensors *st, const char *name);
size_t neox_st_dtype_size(const char *dtype);  // 0 for an unknown dtype
int64_t neox_st_numel(const neox_st_tensor *t);

// One tensor to write. data holds numel(shape) elements of dtype.
typedef struct neox_st_entry {
    const char *name;
    const char *dtype;
    int ndim;
    int64_t shape[NEOX_ST_MAX_DIMS];
    const void *data;
} neox_st_entry;

// Writes entries (in this order) atomically to path; metadata_json is an optional JSON object of
// strings stored as "__metadata__" (NULL for none).
int neox_safetensors_write(const char *path, const neox_st_entry *entries, int count, const char *metadata_json,
                           neox_error *err);

// The same, streamed: open writes the header for entries (their data is not used), then put takes
// the tensors' bytes in order, in as many calls as convenient, and commit checks that exactly the
// announced bytes came and publishes the file. Memory is then one tensor, not the whole file.
typedef struct neox_st_writer neox_st_writer;
neox_st_writer *neox_st_writer_open(const char *path, const neox_st_entry *entries, int count,
                                    const char *metadata_json, neox_error *err);
int neox_st_writer_put(neox_st_writer *w, const void *data, size_t bytes, neox_error *err);
// Instead of put: the caller writes the next `bytes` bytes itself into *fd at *offset (pwrite,
// copy_file_range), then calls neox_st_writer_written.
int neox_st_writer_reserve(neox_st_writer *w, size_t bytes, int *fd, int64_t *offset, neox_error *err);
void neox_st_writer_written(neox_st_writer *w);
int neox_st_writer_commit(neox_st_writer *w, neox_error *err);  // frees w, also on failure
void neox_st_writer_abort(neox_st_writer *w);                   // removes the temporary; frees w

#endif
