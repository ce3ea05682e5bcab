// dry.c: a backend table whose ops do nothing (kernels/backend.h, neox_backend_dry). Wrapped by the
// per-op profile with its trace on, it records a step as the model issues it, shapes and all, without
// computing it, so bench/gpu_predict.c can cost the step of a model far larger than this machine's
// memory. Allocations are addresses in one reservation that is never made accessible (PROT_NONE,
// no swap reserved): nothing is committed, and host code that touched "device" memory would fault
// (on_device is set, so the model's host code goes through to_host/to_device, as with a GPU).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kernels/backend.h"

#define RESERVATION ((size_t)1 << 42)  // 4 TiB of address space
#define ALIGN 256                      // as cudaMalloc aligns

typedef struct dry_block {
    char *p;
    size_t bytes;
} dry_block;

static char *base;
static size_t top;           // the next free offset (freed blocks are not reused: addresses only)
static size_t held, peak;    // bytes live, and the most at once since none were
static dry_block *blocks;
static int nblocks, block_cap;

static void *dry_alloc(size_t bytes) {
    if (!base) {
        void *p = mmap(NULL, RESERVATION, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
            perror("neox dry backend: reserving address space");
            abort();
        }
        base = p;
    }
    size_t len = (bytes + ALIGN - 1) / ALIGN * ALIGN;
    if (len == 0) len = ALIGN;
    if (top + len > RESERVATION) {
        fprintf(stderr, "neox dry backend: more than %zu bytes allocated\n", (size_t)RESERVATION);
        abort();
    }
    if (nblocks == block_cap) {
        block_cap = block_cap ? 2 * block_cap : 256;
        blocks = realloc(blocks, (size_t)block_cap * sizeof *blocks);
        if (!blocks) abort();
    }
    char *p = base + top;
    top += len;
    if (held == 0) peak = 0;  // a new set of allocations (another model): its own peak
    blocks[nblocks++] = (dry_block){p, len};
    held += len;
    if (held > peak) peak = held;
    return p;
}

static void dry_free(void *p) {
    for (int i = 0; p && i < nblocks; i++)
        if (blocks[i].p == p) {
            held -= blocks[i].bytes;
            blocks[i] = blocks[--nblocks];
            return;
        }
}

static void dry_nothing(void *p, size_t bytes) { (void)p, (void)bytes; }
static void dry_to_device(void *dst, const void *src, size_t bytes) { (void)dst, (void)src, (void)bytes; }
static void dry_to_host(void *dst, const void *src, size_t bytes) {
    (void)src;
    memset(dst, 0, bytes);
}
static void dry_synchronize(void) {}
static size_t dry_peak_bytes(void) { return peak; }
// As CUDA's table: allocations are whole blocks, none of which can be given back in part.
static size_t dry_release(void *p, size_t bytes) {
    (void)p, (void)bytes;
    return 0;
}
static size_t dry_commit(void *p, size_t bytes) {
    (void)p, (void)bytes;
    return 0;
}
static size_t dry_release_granularity(void) { return 0; }
static void *dry_host_alloc(size_t bytes) { return neox_backend_cpu()->host_alloc(bytes); }
static void dry_host_free(void *p) { neox_backend_cpu()->host_free(p); }
static int64_t tickets;
static int64_t dry_to_host_async(void *dst, const void *src, size_t bytes) {
    dry_to_host(dst, src, bytes);
    return ++tickets;
}
static int64_t dry_to_device_async(void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src, (void)bytes;
    return ++tickets;
}
static void dry_wait(int64_t ticket) { (void)ticket; }

// Every op: nothing; ops that return a host value return 0.
#define DRY_OP(ret, name, params, args) \
    static ret dry_##name params { return (ret)0; }
#define DRY_VOID_OP(ret, name, params, args) \
    static void dry_##name params {}
// (void ops and the two that return a double differ only in the return)
#define DRY_ANY(ret, name, params, args) DRY_SELECT_##ret(ret, name, params, args)
#define DRY_SELECT_void DRY_VOID_OP
#define DRY_SELECT_double DRY_OP
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
NEOX_BACKEND_OPS(DRY_ANY)
#pragma GCC diagnostic pop

#define DRY_ENTRY(ret, name, params, args) .name = dry_##name,

static const neox_backend dry_backend = {
    .name = "dry",
    .on_device = 1,
    .alloc = dry_alloc,
    .free = dry_free,
    .memset_zero = dry_nothing,
    .to_device = dry_to_device,
    .to_host = dry_to_host,
    .copy = dry_to_device,
    .synchronize = dry_synchronize,
    .peak_bytes = dry_peak_bytes,
    .release = dry_release,
    .commit = dry_commit,
    .release_granularity = dry_release_granularity,
    .host_alloc = dry_host_alloc,
    .host_free = dry_host_free,
    .to_host_async = dry_to_host_async,
    .to_device_async = dry_to_device_async,
    .host_wait = dry_wait,
    .device_wait = dry_wait,
    NEOX_BACKEND_OPS(DRY_ENTRY)
};

const neox_backend *neox_backend_dry(void) { return &dry_backend; }
