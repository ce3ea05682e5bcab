// store.h: the value store of a loaded config (store.c): one slot per schema key (effective value,
// where it came from, what a file set) and the calls that fill and read the slots. The loading steps
// (load.c, validate.c, derive.c) and printing (print.c) call it; it calls none of them.
#ifndef NEOX_CONFIG_STORE_H
#define NEOX_CONFIG_STORE_H

#include "config/lookup.h"

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

// An empty store with room for npaths files' names and trees; free with neox_config_free.
neox_config *neox_config_store_new(int npaths);

// Values the config creates (defaults, derived values); the config frees them.
neox_value *neox_config_new_value(neox_config *cfg, neox_value_kind kind);
// Hands v to the config, which frees it with itself; returns v.
neox_value *neox_config_own_value(neox_config *cfg, neox_value *v);

// Filling a slot: its default (a value the config owns), the value a file set (owned by the file's
// tree), a derived value (the config owns it) by key name.
void neox_config_set_default(neox_config *cfg, neox_key_id key, neox_value *v);
void neox_config_set_from_file(neox_config *cfg, neox_key_id key, const neox_value *v);
void neox_config_set_derived(neox_config *cfg, const char *key, neox_value *v);
void neox_config_set_derived_int(neox_config *cfg, const char *key, int64_t x);
void neox_config_set_derived_float(neox_config *cfg, const char *key, double x);
void neox_config_set_derived_bool(neox_config *cfg, const char *key, int b);
void neox_config_set_derived_str(neox_config *cfg, const char *key, const char *s);
const neox_config_slot *neox_config_slot_of(const neox_config *cfg, const char *key);

// "FILE:LINE" of a value (into buf), or "default"/"derived" when it has no file.
const char *neox_value_where(const neox_value *v, char *buf, size_t size);

#endif
