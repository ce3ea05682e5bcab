// backend.c: the CPU backend's table (kernels/backend.h): the ops of kernels/cpu and plain host
// memory, so code written against the table runs unchanged on the CPU.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"

static void *cpu_alloc(size_t bytes) {
    void *p = NULL;
    // 64-byte alignment: whole cache lines and full AVX-512 vectors, as the GPU's allocations are.
    if (posix_memalign(&p, 64, bytes ? bytes : 1) != 0) {
        fprintf(stderr, "neox: out of host memory allocating %zu bytes\n", bytes);
        abort();
    }
    return p;
}
static void cpu_free(void *p) { free(p); }
static void cpu_memset_zero(void *p, size_t bytes) { memset(p, 0, bytes); }
static void cpu_copy(void *dst, const void *src, size_t bytes) { memmove(dst, src, bytes); }
static void cpu_synchronize(void) {}
static size_t cpu_peak_bytes(void) { return 0; }

#define CPU_OP(ret, name, params, args) .name = neox_##name,

static const neox_backend cpu_backend = {
    .name = "cpu",
    .on_device = 0,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .memset_zero = cpu_memset_zero,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .copy = cpu_copy,
    .synchronize = cpu_synchronize,
    .peak_bytes = cpu_peak_bytes,
    NEOX_BACKEND_OPS(CPU_OP)
};

const neox_backend *neox_backend_cpu(void) { return &cpu_backend; }
