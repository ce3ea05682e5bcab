// scratch.h: working memory for the CPU kernels. They link without lib/core (the GPU tests and
// benchmarks take the kernels alone), so running out of memory ends the process here with a
// message naming what the memory was for, as an op has no error to return.
#ifndef NEOX_CPU_SCRATCH_H
#define NEOX_CPU_SCRATCH_H

#include <stdio.h>
#include <stdlib.h>

static inline void *neox_cpu_scratch(size_t bytes, const char *what) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "neox: out of memory for %zu bytes of %s\n", bytes, what);
        abort();
    }
    return p;
}

#endif
