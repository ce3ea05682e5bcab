// alloc.c: allocation that never returns NULL, giving pages of a buffer back, string helpers and whole-file reads.
#include "core.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static _Thread_local const char *reading;  // what this thread reads, for the message below

const char *neox_alloc_reading(const char *what) {
    const char *previous = reading;
    reading = what;
    return previous;
}

// Out of memory stays a fatal exit rather than an error returned: every allocation in neox.c would
// otherwise need an error path (thousands of them, rarely tested), and a process that cannot get
// memory can seldom report anything more useful than this. The exit code is a runtime failure's.
static _Noreturn void out_of_memory(size_t size) {
    if (reading) neox_die(NEOX_EXIT_FAILURE, "out of memory allocating %zu bytes while reading %s", size, reading);
    neox_die(NEOX_EXIT_FAILURE, "out of memory allocating %zu bytes", size);
}

void *neox_malloc(size_t size) {
    void *p = malloc(size ? size : 1);
    if (!p) out_of_memory(size);
    return p;
}

void *neox_calloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) out_of_memory(count * size);
    return p;
}

void *neox_realloc(void *ptr, size_t size) {
    void *p = realloc(ptr, size ? size : 1);
    if (!p) out_of_memory(size);
    return p;
}

void *neox_aligned_alloc(size_t alignment, size_t size) {
    void *p = NULL;
    if (posix_memalign(&p, alignment, size ? size : alignment) != 0) out_of_memory(size);
    return p;
}

size_t neox_peak_rss_bytes(void) {
    struct rusage u;
    return getrusage(RUSAGE_SELF, &u) == 0 ? (size_t)u.ru_maxrss * 1024 : 0;  // Linux counts kilobytes
}

char *neox_strdup(const char *s) { return neox_strndup(s, strlen(s)); }

char *neox_strndup(const char *s, size_t n) {
    size_t len = strnlen(s, n);
    char *d = neox_malloc(len + 1);
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

char *neox_asprintf(const char *fmt, ...) {
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = neox_malloc((size_t)(n < 0 ? 0 : n) + 1);
    vsnprintf(s, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return s;
}

char *neox_read_file(const char *path, size_t *size, neox_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        neox_fail(err, NEOX_EXIT_FAILURE, "%s: %s", path, strerror(errno));
        return NULL;
    }
    // Regular files are read into one buffer of their size (+2: the NUL, and a byte that a short
    // read at the end leaves unfilled); pipes and the like grow as they come.
    struct stat st;
    size_t cap = fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) ? (size_t)st.st_size + 2 : 0, len = 0;
    if (cap < (1 << 16)) cap = 1 << 16;
    const char *previous = neox_alloc_reading(path);
    char *buf = neox_malloc(cap);
    for (;;) {
        size_t want = cap - len - 1, got = fread(buf + len, 1, want, f);
        len += got;
        if (got < want) break;  // end of file (or an error, checked below)
        buf = neox_realloc(buf, cap *= 2);
    }
    neox_alloc_reading(previous);
    int failed = ferror(f);
    fclose(f);
    if (failed) {
        free(buf);
        neox_fail(err, NEOX_EXIT_FAILURE, "%s: read error", path);
        return NULL;
    }
    buf[len] = '\0';
    if (size) *size = len;
    return buf;
}

char *neox_path_beside(const char *file, const char *name) {
    const char *slash = file ? strrchr(file, '/') : NULL;
    return slash ? neox_asprintf("%.*s/%s", (int)(slash - file), file, name) : neox_strdup(name);
}
