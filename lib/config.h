// config.h: GPT-NeoX configuration. Loads one or more YAML files exactly as GPT-NeoX's deepy.py does
// (keys with '-' or '_' are the same key; a key set in two files is an error), checks every key
// against the typed schema of GPT-NeoX's arguments (lib/config/schema_gen.c), refuses values that select
// features neox.c does not support, and computes the derived values (batch sizes, parallel sizes,
// precision, optimizer and ZeRO settings from their nested dicts) as GPT-NeoX computes them.
#ifndef NEOX_CONFIG_H
#define NEOX_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include "config_keys_gen.h"
#include "core.h"

// ---- values ---------------------------------------------------------------------------------
// A YAML value as read, with where it came from. Scalars are resolved as YAML 1.1 (PyYAML) does:
// True/False/yes/no, ints (500000000, 0x10), floats (6.0e-4, 1e-5, .inf), null/~.
typedef enum {
    NEOX_VALUE_NULL,
    NEOX_VALUE_BOOL,
    NEOX_VALUE_INT,
    NEOX_VALUE_FLOAT,
    NEOX_VALUE_STRING,
    NEOX_VALUE_LIST,
    NEOX_VALUE_MAP,
} neox_value_kind;

typedef struct neox_value neox_value;
struct neox_value {
    neox_value_kind kind;
    int boolean;          // NEOX_VALUE_BOOL
    int64_t integer;      // NEOX_VALUE_INT
    double number;        // NEOX_VALUE_FLOAT (also set for INT, so numbers read uniformly)
    char *string;         // NEOX_VALUE_STRING
    // A plain (unquoted) scalar YAML 1.1 reads as a string but YAML 1.2, JSON and C read as a number
    // (1e-06, 1E5, 1.0e5: an exponent without a '.' or a sign): kind STRING, as PyYAML reads it, and
    // number its value; a key typed as a number takes it as that number (docs/config.md).
    int number_text;
    int count;            // LIST and MAP: number of items
    neox_value **items;   // LIST and MAP: the values
    char **keys;          // MAP: the keys, as written
    const char *file;     // source file (owned by the config), NULL for defaults and derived values
    int line, column;     // 1-based position in file
};

// Map lookup by key; '-' and '_' compare equal. NULL when absent or when map is not a MAP.
const neox_value *neox_value_get(const neox_value *map, const char *key);
// Writes the value as compact YAML flow text ("[0.9, 0.95]", "{stage: 1}") into buf.
const char *neox_value_format(const neox_value *v, char *buf, size_t size);

// ---- the schema -----------------------------------------------------------------------------
typedef enum {
    NEOX_TYPE_BOOL,
    NEOX_TYPE_INT,
    NEOX_TYPE_FLOAT,
    NEOX_TYPE_STR,
    NEOX_TYPE_CHOICE,   // a string from a fixed set
    NEOX_TYPE_LIST,
    NEOX_TYPE_DICT,
    NEOX_TYPE_ANY,      // GPT-NeoX Union types; checked by the key's own validator
} neox_type;

// What neox.c does with a key.
typedef enum {
    NEOX_KEY_USED,         // read by neox.c
    NEOX_KEY_IGNORED,      // DeepSpeed/launcher/logging-service knob with no meaning here: listed in one notice
    NEOX_KEY_UNSUPPORTED,  // any non-default value selects a feature neox.c refuses
} neox_key_use;

typedef struct neox_key_spec {
    const char *name;       // canonical, with '_'
    neox_type type;
    const char *default_text;   // YAML text of the default, NULL for None
    const char *choices;    // NEOX_TYPE_CHOICE: '|'-separated allowed values (matched case-insensitively)
    const char *supported;  // NEOX_TYPE_CHOICE: the values neox.c implements; NULL = all of choices
    const char *feature;    // UNSUPPORTED keys, and CHOICE keys with `supported`: the feature, for errors
    const char *group;      // GPT-NeoX argument class (NeoXArgsModel, ...) or "neox.c" for our own keys
    neox_key_use use;
    int nullable;           // None is an accepted value
    int derived;            // computed by neox.c (as GPT-NeoX computes it); a file may not set it
    double min, max;        // numeric range (inclusive); min > max means unchecked
} neox_key_spec;

extern const neox_key_spec neox_key_specs[];
extern const int neox_key_count;
const neox_key_spec *neox_key_find(const char *name);  // '-' and '_' equal; NULL if unknown
// Sub-keys of the dicts GPT-NeoX hands to DeepSpeed, named by their dotted path
// ("zero_optimization.offload_optimizer.device"); group is the top-level key. A dict with entries here
// accepts only those sub-keys; DeepSpeed reads sub-keys exactly as spelt, so the path is matched exactly.
extern const neox_key_spec neox_subkey_specs[];
extern const int neox_subkey_count;
const neox_key_spec *neox_subkey_find(const char *path);  // NULL if unknown

// ---- loading --------------------------------------------------------------------------------
typedef struct neox_config_options {
    int world_size;   // ranks the job runs on (derives the data-parallel size); <= 0 means 1
    int quiet;        // do not print the notice listing ignored keys
    // Every rank is data parallel (neox-eval): pipe_parallel_size and model_parallel_size describe
    // the checkpoint only (they still pad the vocabulary), the data-parallel size is world_size,
    // whatever the two sizes are, and global_num_gpus (the training job's) is not checked.
    int data_parallel_only;
} neox_config_options;

typedef struct neox_config neox_config;

// Loads and merges the files, validates, derives. On error returns NULL with a message naming
// file:line and the key (status NEOX_EXIT_USAGE for config errors, NEOX_EXIT_FAILURE for I/O).
neox_config *neox_config_load(const char *const *paths, int npaths, const neox_config_options *opts,
                              neox_error *err);
// Parses YAML text (name is used in messages) into a value tree; for tests and for tools that read
// YAML of their own. Free with neox_value_free.
neox_value *neox_yaml_parse(const char *text, size_t size, const char *name, neox_error *err);
void neox_value_free(neox_value *v);
void neox_config_free(neox_config *cfg);

// ---- reading values -------------------------------------------------------------------------
// Keys are named by their schema name as a bare identifier, not a string: neox_config_int(cfg,
// seq_length) reads NEOX_K_seq_length (config_keys_gen.h, generated with the schema), so a key that is not
// in the schema fails to compile. Reading a key with the wrong type is a programming error and aborts.
#define neox_config_has(cfg, key) neox_config_has_id((cfg), NEOX_K_##key)     // value is not None
#define neox_config_bool(cfg, key) neox_config_bool_id((cfg), NEOX_K_##key)
#define neox_config_int(cfg, key) neox_config_int_id((cfg), NEOX_K_##key)
#define neox_config_float(cfg, key) neox_config_float_id((cfg), NEOX_K_##key)
#define neox_config_str(cfg, key) neox_config_str_id((cfg), NEOX_K_##key)     // NULL when None
#define neox_config_value(cfg, key) neox_config_value_id((cfg), NEOX_K_##key)
// An integer key whose None means a value the schema cannot state as a default (zero_stage None is
// stage 0 because the zero_optimization dict sets it): fallback when None.
#define neox_config_int_or(cfg, key, fallback) neox_config_int_or_id((cfg), NEOX_K_##key, (fallback))
// The value at a sub-key's dotted path, '.' written '__' (neox_config_sub(cfg, fp16__loss_scale_window)),
// or NULL when the file does not set it (DeepSpeed's default applies).
#define neox_config_sub(cfg, path) neox_config_sub_id((cfg), NEOX_SK_##path)
// Where the effective value came from: "default", "derived", or "FILE:LINE".
#define neox_config_source(cfg, key, buf, size) neox_config_source_id((cfg), NEOX_K_##key, (buf), (size))

// The same by id, for code that holds ids (a table of keys); neox_key_id_of names a key at run time and
// reports a bug (neox_bug) when the schema has no such key, neox_subkey_id_of a dotted sub-key path.
int neox_config_has_id(const neox_config *cfg, neox_key_id key);
int neox_config_bool_id(const neox_config *cfg, neox_key_id key);
int64_t neox_config_int_id(const neox_config *cfg, neox_key_id key);
int64_t neox_config_int_or_id(const neox_config *cfg, neox_key_id key, int64_t fallback);
double neox_config_float_id(const neox_config *cfg, neox_key_id key);
const char *neox_config_str_id(const neox_config *cfg, neox_key_id key);
const neox_value *neox_config_value_id(const neox_config *cfg, neox_key_id key);
const neox_value *neox_config_sub_id(const neox_config *cfg, neox_subkey_id path);
const char *neox_config_source_id(const neox_config *cfg, neox_key_id key, char *buf, size_t size);
neox_key_id neox_key_id_of(const char *name);
// The schema's default of a scalar key, parsed as a file's value is: tools that take the same setting
// as an option default to it. The string is the caller's to free (NULL for None); the integer is 0 for None.
char *neox_key_default_str(neox_key_id key);
int64_t neox_key_default_int(neox_key_id key);
// A sub-key's schema default as an integer; fallback when its default is None.
int64_t neox_subkey_default_int(neox_subkey_id path, int64_t fallback);
neox_subkey_id neox_subkey_id_of(const char *path);

// The `split` key's weights for train, valid and test ("949,50,1" or "1/3"; missing parts are 0).
int neox_split_weights(const char *split, double weights[3], neox_error *err);

// With the environment variable NEOX_CONFIG_READS=FILE set when a config is loaded, each key and
// sub-key path the program reads (through the accessors above) is appended to FILE once per process:
// the record tests/tools/config_reads.sh compares with the schema's used keys.

// Prints every key: "name = value  # source", grouped as GPT-NeoX groups them.
void neox_config_print(const neox_config *cfg, FILE *out);
// The same as one JSON object: {"key": {"value": V, "source": "default|derived|FILE:LINE",
// "group": G, "use": "used|ignored|unsupported", "set": {"value": V, "at": "FILE:LINE"}}}, where
// "set" (present when a file set the key) holds the value exactly as the file wrote it.
void neox_config_print_json(const neox_config *cfg, FILE *out);
// Prints cfg as "text" (neox_config_print) or "json" (neox_config_print_json); -1 for another format.
int neox_config_print_as(const neox_config *cfg, const char *format, FILE *out);
// The --print-config of every tool: loads paths (world size from opts), prints them in format to out.
// Returns 0, or -1 with err set (a config error, or an unknown format).
int neox_config_print_files(const char *const *paths, int npaths, const neox_config_options *opts, const char *format,
                            FILE *out, neox_error *err);
// The files the config was loaded from, in order (for saving them into checkpoints).
int neox_config_file_count(const neox_config *cfg);
const char *neox_config_file_path(const neox_config *cfg, int i);

// GPT-NeoX's vocabulary padding: the smallest multiple of divisible_by * model_parallel_size that
// is >= vocab_size.
int64_t neox_padded_vocab_size(int64_t vocab_size, int64_t divisible_by, int64_t model_parallel_size);

#endif
