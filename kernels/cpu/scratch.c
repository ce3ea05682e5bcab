// scratch.c: the CPU kernels' working memory (scratch.h). Ops allocate their scratch (widened
// 16-bit operands, fp32 rows of a product: up to tens of MiB) and free it on return, many times a
// training step. Under glibc's default policy those frees give the pages back to the kernel (blocks
// from 128 KiB up are mapped and unmapped one by one, and the top of the heap is trimmed), so the
// next op faults fresh zeroed pages in again, and every unmap of a multi-threaded process shoots
// down the other cores' TLBs. The first scratch allocation therefore tells the allocator, once for
// the process, to serve blocks up to 16 MiB from the heap and to trim only what exceeds 16 MiB free
// at its top: the step's scratch then reuses the same pages, and the resident set keeps at most
// 16 MiB it no longer uses.
#include "scratch.h"

#include <malloc.h>
#include <pthread.h>
#include <stdio.h>

// Both limits at 16 MiB: the scratch of a step whose blocks are up to that size stays in the heap,
// while a larger block (and the buffers a run frees once, after set-up) is still given back, so the
// resident set does not keep more than 16 MiB it no longer uses. (Above 16 MiB an op's scratch is
// mapped for each use, as before.)
#define SCRATCH_KEEP_BYTES (16 << 20)

static void keep_freed_pages(void) {
#ifdef __GLIBC__
    mallopt(M_MMAP_THRESHOLD, SCRATCH_KEEP_BYTES);
    mallopt(M_TRIM_THRESHOLD, SCRATCH_KEEP_BYTES);
#endif
}

void *neox_cpu_scratch(size_t bytes, const char *what) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, keep_freed_pages);
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "neox: out of memory for %zu bytes of %s\n", bytes, what);
        abort();
    }
    return p;
}
