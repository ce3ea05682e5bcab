// shard_crc.c: a shard file's CRC-32 from the extents written from memory (shard_crc.h). zlib's
// crc32_combine() joins the CRC of the bytes before an extent with the extent's own CRC, so only
// the gaps between extents are read from the file.
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "ckpt/shard_crc.h"

void neox_crc_extents_add(neox_crc_extents *x, uint64_t addr, const void *data, uint64_t size) {
    if (x->count == x->cap) x->items = neox_realloc(x->items, (size_t)(x->cap = x->cap ? 2 * x->cap : 64) * sizeof *x->items);
    x->items[x->count++] = (neox_crc_extent){addr, size, (uint32_t)crc32_z(0L, data, (z_size_t)size)};
}

void neox_crc_extents_free(neox_crc_extents *x) {
    free(x->items);
    memset(x, 0, sizeof *x);
}

static int by_addr(const void *a, const void *b) {
    const neox_crc_extent *x = a, *y = b;
    return (x->addr > y->addr) - (x->addr < y->addr);
}

// Continues crc over bytes [from, to) of the file.
static int crc_of_range(int fd, uint64_t from, uint64_t to, uLong *crc) {
    unsigned char buf[1 << 16];
    while (from < to) {
        size_t want = to - from < sizeof buf ? (size_t)(to - from) : sizeof buf;
        ssize_t n = pread(fd, buf, want, (off_t)from);
        if (n <= 0) return -1;
        *crc = crc32(*crc, buf, (uInt)n);
        from += (uint64_t)n;
    }
    return 0;
}

// The extents, sorted, tile part of a file of `size` bytes without overlap.
static int extents_fit(neox_crc_extents *x, uint64_t size) {
    if (x->count > 1) qsort(x->items, (size_t)x->count, sizeof *x->items, by_addr);  // (a shard may hold no tensor)
    uint64_t end = 0;
    for (int i = 0; i < x->count; i++) {
        if (x->items[i].addr < end || x->items[i].size > size - x->items[i].addr || x->items[i].addr > size) return 0;
        end = x->items[i].addr + x->items[i].size;
    }
    return 1;
}

int neox_crc_extents_file(neox_crc_extents *x, const char *path, neox_ckpt_file_entry *entry, neox_error *err) {
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        int e = errno;
        if (fd >= 0) close(fd);
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s", path, strerror(e));
    }
    uint64_t size = (uint64_t)st.st_size;
    if (!extents_fit(x, size)) {
        close(fd);
        return neox_ckpt_file_checksum(path, entry, err);
    }
    uLong crc = crc32(0L, Z_NULL, 0);
    uint64_t pos = 0;
    int rc = 0;
    for (int i = 0; i < x->count && rc == 0; i++) {
        rc = crc_of_range(fd, pos, x->items[i].addr, &crc);
        crc = crc32_combine(crc, x->items[i].crc, (z_off_t)x->items[i].size);
        pos = x->items[i].addr + x->items[i].size;
    }
    if (rc == 0) rc = crc_of_range(fd, pos, size, &crc);
    close(fd);
    if (rc != 0) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: read error", path);
    entry->bytes = size;
    entry->crc32 = (uint32_t)crc;
    return 0;
}
