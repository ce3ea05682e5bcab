// parallel.h: when a CPU kernel's loop is worth the OpenMP thread team. Opening a parallel region
// wakes the other threads and joins them at its end; for the small passes of a decoding step (one
// position: a row of the hidden size, 576 elements on a SmolLM2 shape) that costs more than the
// pass itself, and a step runs hundreds of them. Loops below these sizes run on the calling thread
// (an `if` clause on the pragma); each element or row is computed the same way either way.
#ifndef NEOX_CPU_PARALLEL_H
#define NEOX_CPU_PARALLEL_H

// Elements an elementwise pass (a few flops each) must have to be split over the threads.
#define NEOX_PARALLEL_MIN_ELEMS ((size_t)1 << 15)
// Multiply-adds a vectorised pass over rows (attention over a cache: about 60 microseconds' worth
// on one core) must do to be split.
#define NEOX_PARALLEL_MIN_FLOPS ((size_t)1 << 20)

#endif
