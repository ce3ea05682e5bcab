// torch_pt.h: reading PyTorch `.pt` files (torch.save's zip format: `<name>/data.pkl`, a pickle of
// the saved object, and `<name>/data/<key>`, one raw storage per key) without Python and without
// executing anything. The pickle is read by neox.c's own unpickler (lib/ckpt/pt_pickle.c) into a
// tree of inert values; the zip container is read through libzip (lib/ckpt/pt_file.c). Only what
// tensor checkpoints need is accepted: pickle protocol 2 and above, and the globals torch's
// `weights_only` loader allows (tensors and their storages, OrderedDict, torch.Size, set/frozenset,
// plain containers, scalars, strings, bytes). Any other global is refused naming the file and the
// global, except a short list of objects whose state is plain data (DeepSpeed's loss scalers and
// ZeRO's fragment addresses: kept as records of their attributes) and of state neox.c does not need (numpy's RNG state:
// skipped with a notice). Files are untrusted input: every size, offset and stride is checked.
#ifndef NEOX_TORCH_PT_H
#define NEOX_TORCH_PT_H

#include <stddef.h>
#include <stdint.h>

#include "core.h"

#define NEOX_PT_MAX_DIMS 8

typedef enum {
    NEOX_PT_NONE,
    NEOX_PT_BOOL,
    NEOX_PT_INT,
    NEOX_PT_FLOAT,
    NEOX_PT_STR,
    NEOX_PT_BYTES,
    NEOX_PT_TUPLE,
    NEOX_PT_LIST,
    NEOX_PT_SET,
    NEOX_PT_DICT,     // dict and OrderedDict, in insertion order
    NEOX_PT_TENSOR,
    NEOX_PT_RECORD,   // an allowed data-only object: its class in str, its attributes as a dict in items
    NEOX_PT_SKIPPED,  // state neox.c does not read (numpy RNG state): its global in str
    NEOX_PT_STORAGE,  // a storage reference (only inside a tensor)
    NEOX_PT_GLOBAL,   // an allowed callable (only while unpickling)
} neox_pt_kind;

typedef enum {
    NEOX_PT_F32, NEOX_PT_F16, NEOX_PT_BF16, NEOX_PT_F64, NEOX_PT_I64, NEOX_PT_I32, NEOX_PT_I16, NEOX_PT_I8,
    NEOX_PT_U8, NEOX_PT_BOOL_DTYPE, NEOX_PT_DTYPE_COUNT
} neox_pt_dtype;

typedef struct neox_pt_storage {
    char *key;            // the entry `data/<key>` in the archive
    neox_pt_dtype dtype;
    uint64_t bytes;       // the entry's size
} neox_pt_storage;

typedef struct neox_pt_tensor {
    neox_pt_storage *storage;
    neox_pt_dtype dtype;
    int ndim;
    int64_t shape[NEOX_PT_MAX_DIMS];
    int64_t stride[NEOX_PT_MAX_DIMS];  // elements
    int64_t offset;                    // elements from the storage's start
} neox_pt_tensor;

typedef struct neox_pt_value neox_pt_value;
struct neox_pt_value {
    neox_pt_kind kind;
    int64_t i;                // BOOL, INT
    double f;                 // FLOAT
    char *str;                // STR, BYTES (len bytes, NUL-terminated too), RECORD/SKIPPED/GLOBAL: the global's name
    size_t len;
    int count;                // TUPLE, LIST, SET, DICT: items (DICT: keys[i] -> items[i])
    int cap;
    neox_pt_value **items;
    neox_pt_value **keys;
    neox_pt_tensor *tensor;   // TENSOR
    neox_pt_storage *storage; // STORAGE
};

typedef struct neox_pt_file neox_pt_file;

// Opens path and reads its pickle; every tensor is checked against its storage. NULL + err
// naming the file (and the global, opcode or storage) when the file is not one neox.c reads.
neox_pt_file *neox_pt_open(const char *path, neox_error *err);
void neox_pt_close(neox_pt_file *f);
const char *neox_pt_path(const neox_pt_file *f);
const neox_pt_value *neox_pt_root(const neox_pt_file *f);
// Every tensor in the file, in the pickle's order.
int neox_pt_tensors(const neox_pt_file *f, neox_pt_tensor ***tensors);

// The value of a string key in a dict or a record's attributes; NULL when absent or v is neither.
const neox_pt_value *neox_pt_get(const neox_pt_value *v, const char *key);
// A dotted path of string keys from v ("optimizer_state_dict.loss_scaler.cur_scale"); list and tuple
// items by their index ("base_optimizer_state.param_groups.0.lr"). NULL when any step is missing.
const neox_pt_value *neox_pt_find(const neox_pt_value *v, const char *path);
// A number (INT, BOOL or FLOAT) as a double / an integer. -1 + err naming what when it is not one.
int neox_pt_number(const neox_pt_file *f, const neox_pt_value *v, const char *what, double *out, neox_error *err);
int neox_pt_integer(const neox_pt_file *f, const neox_pt_value *v, const char *what, int64_t *out, neox_error *err);

const char *neox_pt_dtype_name(neox_pt_dtype d);  // "float32", "bfloat16", ... (torch's names)
size_t neox_pt_dtype_size(neox_pt_dtype d);
int64_t neox_pt_numel(const neox_pt_tensor *t);

// Reads a tensor's elements in row-major order (strides and offset applied) into dst, which holds
// numel * dtype size bytes, in the tensor's own dtype.
int neox_pt_read(neox_pt_file *f, const neox_pt_tensor *t, void *dst, neox_error *err);
// The same converted to fp32 (from fp32, fp16, bf16 or fp64; other dtypes are refused naming what).
int neox_pt_read_f32(neox_pt_file *f, const neox_pt_tensor *t, const char *what, float *dst, neox_error *err);

// The unpickler alone, on a buffer (what neox_pt_open runs on data.pkl): the tree of values, whose
// storages are not yet matched to archive entries. name is for messages. The values live in an arena
// freed by neox_pt_arena_free.
typedef struct neox_pt_arena neox_pt_arena;
neox_pt_value *neox_pt_unpickle(const unsigned char *data, size_t size, const char *name, neox_pt_arena **arena,
                                neox_error *err);
void neox_pt_arena_free(neox_pt_arena *arena);
// Storages the pickle referred to (each key once), in the order of first reference.
int neox_pt_arena_storages(const neox_pt_arena *arena, neox_pt_storage ***storages);
// Tensors the pickle built, in order.
int neox_pt_arena_tensors(const neox_pt_arena *arena, neox_pt_tensor ***tensors);

// ---- writing (lib/ckpt/pt_write.c) ---------------------------------------------------------------
// A file torch.load(weights_only=True) reads: build a tree of values (each owned by the writer),
// then commit pickles it (protocol 2) with every tensor in its own storage, zips it uncompressed
// (folder: the file's stem) under a temporary name and renames it to path. Tensors are contiguous
// copies of the data given. commit and abort free the writer.
typedef struct neox_pt_writer neox_pt_writer;
neox_pt_writer *neox_pt_writer_open(const char *path, neox_error *err);
neox_pt_value *neox_pt_new(neox_pt_writer *w, neox_pt_kind kind);  // NONE, DICT, LIST, TUPLE (empty)
neox_pt_value *neox_pt_new_int(neox_pt_writer *w, int64_t i);
neox_pt_value *neox_pt_new_float(neox_pt_writer *w, double f);
neox_pt_value *neox_pt_new_str(neox_pt_writer *w, const char *s);
neox_pt_value *neox_pt_new_tensor(neox_pt_writer *w, neox_pt_dtype dtype, int ndim, const int64_t *shape,
                                  const void *data);
// A reference to a global ("torch.float16"), pickled as GLOBAL.
neox_pt_value *neox_pt_new_global(neox_pt_writer *w, const char *qualified_name);
// An object of class qualified_name ("deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler") whose
// attributes are set with neox_pt_set: pickled as Python pickles a plain object (NEWOBJ of the class,
// then BUILD with its __dict__). torch.load(weights_only=True) reads it only with the class allowed
// (torch.serialization.add_safe_globals).
neox_pt_value *neox_pt_new_object(neox_pt_writer *w, const char *qualified_name);
void neox_pt_append(neox_pt_value *list_or_tuple, neox_pt_value *v);
void neox_pt_set(neox_pt_writer *w, neox_pt_value *dict, const char *key, neox_pt_value *v);
int neox_pt_writer_commit(neox_pt_writer *w, const neox_pt_value *root, neox_error *err);
void neox_pt_writer_abort(neox_pt_writer *w);

#endif
