// lookup.h: finding keys in the schema (lookup.c), shared by the files of lib/config: the bottom of
// lib/config's calls with the value tree (yaml.c); it needs no loaded config.
#ifndef NEOX_CONFIG_LOOKUP_H
#define NEOX_CONFIG_LOOKUP_H

#include "config.h"

int neox_key_index(const char *name);   // -1 when unknown
// The entry of specs[0..count) closest to name among those whose name starts with prefix, or NULL when
// none is close enough to be a plausible typo.
const char *neox_key_suggest(const char *name, const neox_key_spec *specs, int count, const char *prefix);
// Keys compare with '-' and '_' equal.
int neox_key_equal(const char *a, const char *b);

#endif
