// scratch.h: working memory for the CPU kernels. They link without lib/core (the GPU tests and
// benchmarks take the kernels alone), so running out of memory ends the process here with a
// message naming what the memory was for, as an op has no error to return. An op frees its scratch
// with free() before it returns; scratch.c keeps the freed pages mapped for the next op.
#ifndef NEOX_CPU_SCRATCH_H
#define NEOX_CPU_SCRATCH_H

#include <stddef.h>
#include <stdlib.h>

void *neox_cpu_scratch(size_t bytes, const char *what);

#endif
