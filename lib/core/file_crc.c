// file_crc.c: the one owner of a whole file's size and CRC-32, streamed through a bounded buffer.
// Checkpoint manifests (lib/ckpt) and the identity of a sample-index cache (lib/data) both record
// it, so it sits below both. zlib computes the CRC-32: the same function the shard writer combines
// per extent, so a manifest entry means the same whichever way it was computed.
#include "core.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

// Large sequential reads keep the check I/O-bound; the buffer is bounded whatever the file's size.
#define CHECKSUM_BUFFER (1 << 20)

int neox_file_crc32(const char *path, uint64_t *bytes, uint32_t *crc32_out, neox_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s", path, strerror(errno));
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    unsigned char *buf = neox_malloc(CHECKSUM_BUFFER);
    uLong crc = crc32(0L, Z_NULL, 0);
    uint64_t total = 0;
    ssize_t n;
    while ((n = read(fd, buf, CHECKSUM_BUFFER)) > 0 || (n < 0 && errno == EINTR)) {
        if (n < 0) continue;
        crc = crc32_z(crc, buf, (z_size_t)n);
        total += (uint64_t)n;
    }
    int e = errno;
    free(buf);
    close(fd);
    if (n < 0) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: read error: %s", path, strerror(e));
    *bytes = total;
    *crc32_out = (uint32_t)crc;
    return 0;
}
