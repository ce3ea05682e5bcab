// shard_crc.c: the one owner of checkpoint file checksums. Writing: a shard file's CRC-32 from the
// extents written from memory (shard_crc.h); zlib's crc32_combine() joins the CRC of the bytes
// before an extent with the extent's own CRC, so only the gaps between extents are read from the
// file. Loading: every file a manifest lists is checked (size, then the streamed CRC-32 of
// neox_file_crc32 in lib/core) before HDF5 opens any shard, for verify, the trainer's resume, the
// evaluator and every conversion.
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
        return neox_file_crc32(path, &entry->bytes, &entry->crc32, err);
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

// ---- checking a checkpoint before it is opened ---------------------------------------------------

int neox_ckpt_check_file(const char *dir, const neox_ckpt_file_entry *want, neox_error *err) {
    char *path = neox_asprintf("%s/%s", dir, want->name);
    struct stat st;
    neox_ckpt_file_entry got = *want;
    int rc = 0;
    if (stat(path, &st) != 0)
        rc = errno == ENOENT ? neox_fail(err, NEOX_EXIT_FAILURE, "%s: missing shard file (listed in manifest.json)", path)
                             : neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s (listed in manifest.json)", path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: not a regular file (listed in manifest.json)", path);
    else if ((uint64_t)st.st_size != want->bytes)  // found without reading a byte
        rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: %llu bytes, manifest.json says %llu (truncated or replaced)", path,
                       (unsigned long long)st.st_size, (unsigned long long)want->bytes);
    else if ((rc = neox_file_crc32(path, &got.bytes, &got.crc32, err)) == 0 && got.bytes != want->bytes)
        rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: %llu bytes, manifest.json says %llu (changed while read)", path,
                       (unsigned long long)got.bytes, (unsigned long long)want->bytes);
    else if (rc == 0 && got.crc32 != want->crc32)
        rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: CRC-32 %08x, manifest.json says %08x (corrupt)", path, got.crc32,
                       want->crc32);
    free(path);
    return rc;
}

// The files of the directory checked last in this process, as stat() saw them then: a checkpoint
// opened twice by one tool (the trainer reads its vocabulary size, then its tensors) is read for
// its CRC-32s once, unless a file was changed, replaced or touched in between.
typedef struct file_identity {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime, ctime;
} file_identity;

static struct {
    char *dir;
    int nfiles;
    file_identity *ids;
} last_checked;

// The identities of the manifest's files (0 when one cannot be stat'ed).
static int identify(const char *dir, const neox_ckpt_manifest *m, file_identity *ids) {
    for (int i = 0; i < m->nfiles; i++) {
        char *path = neox_asprintf("%s/%s", dir, m->files[i].name);
        struct stat st;
        int ok = stat(path, &st) == 0;
        free(path);
        if (!ok) return 0;
        ids[i] = (file_identity){st.st_dev, st.st_ino, st.st_size, st.st_mtim, st.st_ctim};
    }
    return 1;
}

static int same_time(struct timespec a, struct timespec b) { return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec; }

static int checked_already(const char *dir, const neox_ckpt_manifest *m, const file_identity *ids) {
    if (!last_checked.dir || strcmp(last_checked.dir, dir) || last_checked.nfiles != m->nfiles) return 0;
    for (int i = 0; i < m->nfiles; i++) {
        const file_identity *a = &ids[i], *b = &last_checked.ids[i];
        if (a->dev != b->dev || a->ino != b->ino || a->size != b->size || !same_time(a->mtime, b->mtime) ||
            !same_time(a->ctime, b->ctime))
            return 0;
    }
    return 1;
}

int neox_ckpt_check_files(const char *dir, const neox_ckpt_manifest *m, neox_error *err) {
    file_identity *ids = neox_calloc((size_t)m->nfiles + 1, sizeof *ids);
    int known = identify(dir, m, ids);
    if (known && checked_already(dir, m, ids)) {
        free(ids);
        return 0;
    }
    double start = neox_now(), bytes = 0;
    for (int i = 0; i < m->nfiles; i++) {
        if (neox_ckpt_check_file(dir, &m->files[i], err) != 0) {
            free(ids);
            return -1;
        }
        bytes += (double)m->files[i].bytes;
    }
    double seconds = neox_now() - start;
    neox_debug("%s: %d files (%.1f MB) match manifest.json (sizes and CRC-32), checked in %.3f s (%.0f MB/s)", dir,
               m->nfiles, bytes / 1e6, seconds, seconds > 0 ? bytes / 1e6 / seconds : 0.0);
    free(last_checked.dir);
    free(last_checked.ids);
    last_checked.dir = known ? neox_strdup(dir) : NULL;
    last_checked.nfiles = m->nfiles;
    last_checked.ids = ids;
    return 0;
}

neox_ckpt_reader *neox_ckpt_open_dir(const char *dir, neox_ckpt_manifest *m, neox_error *err) {
    if (neox_ckpt_manifest_read(dir, m, err) != 0) return NULL;
    if (neox_ckpt_check_files(dir, m, err) != 0) {
        neox_ckpt_manifest_free(m);
        return NULL;
    }
    const char **paths = neox_calloc((size_t)m->nfiles + 1, sizeof *paths);
    int npaths = 0;
    for (int i = 0; i < m->nfiles; i++)
        if (m->files[i].rank >= 0) paths[npaths++] = neox_asprintf("%s/%s", dir, m->files[i].name);
    neox_ckpt_reader *r = neox_ckpt_reader_open(paths, npaths, err);
    for (int i = 0; i < npaths; i++) free((void *)paths[i]);
    free(paths);
    if (!r) neox_ckpt_manifest_free(m);
    return r;
}
