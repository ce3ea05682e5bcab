// shard_crc.h: private to lib/ckpt. The CRC-32 of a shard file assembled from the CRC-32s of the
// raw-data extents the writer computed from memory while writing, plus a read of only the bytes
// between them (HDF5's metadata, a few KB), so a shard is not read back whole for its manifest entry.
#ifndef NEOX_CKPT_SHARD_CRC_H
#define NEOX_CKPT_SHARD_CRC_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"

typedef struct neox_crc_extent {
    uint64_t addr, size;  // where the bytes lie in the file
    uint32_t crc;         // zlib CRC-32 of those bytes
} neox_crc_extent;

typedef struct neox_crc_extents {
    neox_crc_extent *items;
    int count, cap;
} neox_crc_extents;

// Records that bytes [addr, addr + size) of the file will hold data (CRC-32 computed here).
void neox_crc_extents_add(neox_crc_extents *x, uint64_t addr, const void *data, uint64_t size);
void neox_crc_extents_free(neox_crc_extents *x);
// Size and CRC-32 of the closed file at path into entry: the recorded extents combined with the
// bytes read between them. Extents that overlap or pass the end of the file (they cannot, in a
// sound HDF5 file) make it read the whole file instead.
int neox_crc_extents_file(neox_crc_extents *x, const char *path, neox_ckpt_file_entry *entry, neox_error *err);

#endif
