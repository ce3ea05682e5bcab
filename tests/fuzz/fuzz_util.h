// fuzz_util.h: what the fuzz targets share. Most parsers read files by path, so each input is
// written to a file in a scratch directory private to the process (under $TMPDIR), then parsed
// through the library's own entry point, as the tools would parse it.
#ifndef NEOX_FUZZ_UTIL_H
#define NEOX_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

// The scratch directory, made on first use.
static inline const char *fuzz_dir(void) {
    static char *dir;
    if (!dir) {
        const char *tmp = getenv("TMPDIR");
        dir = neox_asprintf("%s/neox-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(dir)) {
            perror(dir);
            abort();
        }
    }
    return dir;
}

// "<scratch>/<name>" (malloc'ed).
static inline char *fuzz_path(const char *name) { return neox_asprintf("%s/%s", fuzz_dir(), name); }

// Writes size bytes to <scratch>/<name>; returns the path (malloc'ed).
static inline char *fuzz_write(const char *name, const void *data, size_t size) {
    char *path = fuzz_path(name);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        perror(path);
        abort();
    }
    return path;
}

// Splits the input at the first occurrence of sep: the part before into *a, after into *b
// (the whole input goes to *a, and nothing to *b, when sep is absent).
static inline void fuzz_split(const uint8_t *data, size_t size, const char *sep, const uint8_t **a, size_t *asize,
                              const uint8_t **b, size_t *bsize) {
    size_t n = strlen(sep);
    const uint8_t *at = size >= n ? memmem(data, size, sep, n) : NULL;
    *a = data;
    *asize = at ? (size_t)(at - data) : size;
    *b = at ? at + n : data + size;
    *bsize = at ? size - *asize - n : 0;
}

#endif
