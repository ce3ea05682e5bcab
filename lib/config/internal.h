// internal.h: what the files of lib/config share and nothing outside it needs — the loaded
// configuration (one slot per schema key: effective value, where it came from, what a file set) and
// the steps of loading (validate.c, derive.c) that load.c runs in order.
#ifndef NEOX_CONFIG_INTERNAL_H
#define NEOX_CONFIG_INTERNAL_H

#include "config.h"

// Deepest nesting of YAML lists/maps accepted; GPT-NeoX configs need 4, so this only guards the stack.
#define NEOX_YAML_MAX_DEPTH 64

typedef enum { NEOX_SOURCE_DEFAULT, NEOX_SOURCE_FILE, NEOX_SOURCE_DERIVED } neox_source;

typedef struct neox_config_slot {
    const neox_value *value;   // effective value (never NULL after loading; a NULL-kind value for None)
    neox_source source;
    const neox_value *set;     // the value a file set, or NULL
} neox_config_slot;

struct neox_config {
    neox_config_slot *slots;   // neox_key_count entries, in schema order
    char **paths;              // the files, in load order
    int npaths;
    neox_value **trees;        // one parsed tree per file (own the file values)
    neox_value **owned;        // defaults and derived values
    int nowned, owned_cap;
    int world_size;
    int data_parallel_only;    // neox_config_options.data_parallel_only
    unsigned char *read;       // per schema key: read through an accessor (recorded once)
    unsigned char *read_sub;   // per sub-key schema entry: the same
    FILE *reads;               // NEOX_CONFIG_READS, open for appending (line-buffered), or NULL
};

int neox_key_index(const char *name);   // -1 when unknown
// The entry of specs[0..count) closest to name among those whose name starts with prefix, or NULL when
// none is close enough to be a plausible typo.
const char *neox_key_suggest(const char *name, const neox_key_spec *specs, int count, const char *prefix);
// A dict-valued switch that is off: empty, `enabled: false`, or (offload dicts) `device: none`.
int neox_dict_is_off(const neox_value *v);
// Keys compare with '-' and '_' equal.
int neox_key_equal(const char *a, const char *b);

// Values the config creates (defaults, derived values); the config frees them.
neox_value *neox_config_new_value(neox_config *cfg, neox_value_kind kind);
void neox_config_set_derived(neox_config *cfg, const char *key, neox_value *v);
void neox_config_set_derived_int(neox_config *cfg, const char *key, int64_t x);
void neox_config_set_derived_float(neox_config *cfg, const char *key, double x);
void neox_config_set_derived_bool(neox_config *cfg, const char *key, int b);
void neox_config_set_derived_str(neox_config *cfg, const char *key, const char *s);
const neox_config_slot *neox_config_slot_of(const neox_config *cfg, const char *key);

// "FILE:LINE" of a value (into buf), or "default"/"derived" when it has no file.
const char *neox_value_where(const neox_value *v, char *buf, size_t size);

// Checks each value set in a file against its schema entry (type, range, choice, unsupported).
int neox_config_validate_values(neox_config *cfg, neox_error *err);
// Refuses a model whose attention_config names a layer kind that is not a transformer layer
// (mamba, rwkv), before any other key is checked: those configs' other keys (their activation,
// init methods) only mean something for that kind of layer.
int neox_config_check_layer_kinds(const neox_config *cfg, neox_error *err);
// Computes GPT-NeoX's derived values and checks their consistency.
int neox_config_derive(neox_config *cfg, neox_error *err);

#endif
