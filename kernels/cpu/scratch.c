// scratch.c: the CPU kernels' working memory (scratch.h). Ops allocate their scratch (widened
// 16-bit operands, fp32 rows of a product: up to tens of MiB) and free it on return, many times a
// training step; an allocation that fails ends the process naming what it was for. glibc's default
// policy gives freed blocks back to the kernel, so the next op faults zeroed pages in again; keeping
// them (mallopt's thresholds) made the step cheaper but left freed pages in the resident set past
// the memory plan (docs/performance.md, "The loss, the scratch's page faults and the casts").
#include "scratch.h"

#include <stdlib.h>
#include <stdio.h>

void *neox_cpu_scratch(size_t bytes, const char *what) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "neox: out of memory for %zu bytes of %s\n", bytes, what);
        abort();
    }
    return p;
}
