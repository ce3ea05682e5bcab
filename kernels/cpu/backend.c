// backend.c: the CPU backend's table (kernels/backend.h): the ops of kernels/cpu and plain host
// memory, so code written against the table runs unchanged on the CPU.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "team.h"

// Buffers of 64 MiB and more (a model's parameters, its gradients, a long KV cache) start on a
// 2 MiB boundary and ask for transparent huge pages. A decoding step streams every weight once; with
// 4 KiB pages that is a TLB miss every 4 KiB, and greedy generation on the SmolLM2-135M shape ran
// about 30% faster with the parameters in huge pages (docs/performance.md). The price is paid once,
// when the pages are first touched (zeroing 2 MiB at a time was slower on the measuring machine),
// so smaller buffers, which are many and gain little, keep 4 KiB pages. Where the kernel has no
// huge pages the advice is ignored.
#define HUGE_PAGE ((size_t)2 << 20)
#define HUGE_PAGE_MIN ((size_t)64 << 20)

static void *cpu_alloc(size_t bytes) {
    void *p = NULL;
    // 64-byte alignment: whole cache lines and full AVX-512 vectors, as the GPU's allocations are.
    size_t align = bytes >= HUGE_PAGE_MIN ? HUGE_PAGE : 64;
    if (posix_memalign(&p, align, bytes ? bytes : 1) != 0) {
        fprintf(stderr, "neox: out of host memory allocating %zu bytes\n", bytes);
        abort();
    }
#ifdef MADV_HUGEPAGE
    if (align == HUGE_PAGE) madvise(p, bytes & ~(HUGE_PAGE - 1), MADV_HUGEPAGE);
#endif
    return p;
}
static void cpu_free(void *p) { free(p); }
static void cpu_memset_zero(void *p, size_t bytes) { memset(p, 0, bytes); }
static void cpu_copy(void *dst, const void *src, size_t bytes) { memmove(dst, src, bytes); }
static void cpu_synchronize(void) {}
static size_t cpu_peak_bytes(void) { return 0; }
// The one owner of giving host pages back (ZeRO's partly used flat buffers call it through the table).
// MADV_DONTNEED on private anonymous memory: the next read of a page sees zeros, so the whole range is
// left zero (the partial pages at its ends by a memset), which the host paths rely on.
static size_t cpu_release(void *p, size_t bytes) {
    if (bytes == 0) return 0;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo = (uintptr_t)p, hi = lo + bytes;
    uintptr_t inner_lo = (lo + page - 1) / page * page, inner_hi = hi / page * page;
    if (inner_lo < inner_hi && madvise((void *)inner_lo, inner_hi - inner_lo, MADV_DONTNEED) == 0) {
        memset(p, 0, inner_lo - lo);
        memset((void *)inner_hi, 0, hi - inner_hi);
        return inner_hi - inner_lo;
    }
    memset(p, 0, bytes);
    return 0;
}
// A host page given back comes back when it is next written (zero-filled).
static size_t cpu_commit(void *p, size_t bytes) {
    (void)p, (void)bytes;
    return 0;
}
static size_t cpu_release_granularity(void) { return (size_t)sysconf(_SC_PAGESIZE); }
// Host memory is the backend's: an asynchronous copy is done when it returns.
static int64_t cpu_copy_now(void *dst, const void *src, size_t bytes) {
    memmove(dst, src, bytes);
    return 0;
}
static void cpu_wait(int64_t ticket) { (void)ticket; }

#define CPU_OP(ret, name, params, args) .name = neox_##name,

static const neox_backend cpu_backend = {
    .name = "cpu",
    .on_device = 0,
    .releases = 1,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .memset_zero = cpu_memset_zero,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .copy = cpu_copy,
    .synchronize = cpu_synchronize,
    .peak_bytes = cpu_peak_bytes,
    .release = cpu_release,
    .commit = cpu_commit,
    .release_granularity = cpu_release_granularity,
    .host_alloc = cpu_alloc,
    .host_free = cpu_free,
    .to_host_async = cpu_copy_now,
    .to_device_async = cpu_copy_now,
    .host_wait = cpu_wait,
    .device_wait = cpu_wait,
    .team_threads = neox_team_threads,
    .team_run = neox_team_run,
    .team_barrier = neox_team_barrier,
    .team_linear = neox_team_linear,
    NEOX_BACKEND_OPS(CPU_OP)
};

const neox_backend *neox_backend_cpu(void) { return &cpu_backend; }
