// internal.h: the steps of loading a config that load.c runs in order (validate.c, derive.c),
// shared by the files of lib/config and nothing outside it. The steps read and fill the value store
// (store.h); the store calls none of them.
#ifndef NEOX_CONFIG_INTERNAL_H
#define NEOX_CONFIG_INTERNAL_H

#include "config/store.h"

// Deepest nesting of YAML lists/maps accepted; GPT-NeoX configs need 4, so this only guards the stack.
#define NEOX_YAML_MAX_DEPTH 64

// A dict-valued switch that is off: empty, `enabled: false`, or (offload dicts) `device: none`.
int neox_dict_is_off(const neox_value *v);

// Checks each value set in a file against its schema entry (type, range, choice, unsupported).
int neox_config_validate_values(neox_config *cfg, neox_error *err);
// Refuses a model whose attention_config names a layer kind that is not a transformer layer
// (mamba, rwkv), before any other key is checked: those configs' other keys (their activation,
// init methods) only mean something for that kind of layer.
int neox_config_check_layer_kinds(const neox_config *cfg, neox_error *err);
// Computes GPT-NeoX's derived values and checks their consistency.
int neox_config_derive(neox_config *cfg, neox_error *err);

#endif
