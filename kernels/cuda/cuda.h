// cuda.h: the CUDA backend's C entry points. Each op of kernels/backend.h exists here as
// neox_cuda_<op> with kernels.h's signature, taking device pointers; the table that
// neox_backend_cuda() returns points at them. Plus what only the GPU has: device selection, the
// TF32 switch and the stream every op is queued on.
#ifndef NEOX_CUDA_H
#define NEOX_CUDA_H

#include "kernels/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NEOX_CUDA_DECLARE(ret, name, params, args) ret neox_cuda_##name params;
NEOX_BACKEND_MEMORY(NEOX_CUDA_DECLARE)
NEOX_BACKEND_OPS(NEOX_CUDA_DECLARE)
#undef NEOX_CUDA_DECLARE

// Makes `device` current for this process and creates the stream and library handles (once; later
// calls with the same device do nothing). Returns 0, or -1 with a message on stderr. The table's
// first use calls it with device 0 unless the caller chose one first (one rank per GPU: local
// rank % device count).
int neox_cuda_init(int device);
// fp32 GEMMs may use TF32 tensor cores (about 8x faster, 10-bit mantissa products) when allowed;
// off by default so that fp32 runs match the CPU. 16-bit GEMMs always accumulate in fp32.
void neox_cuda_set_tf32(int allow);
// The cudaStream_t every op runs on (as void *, so C code needs no CUDA headers).
void *neox_cuda_stream(void);

#ifdef __cplusplus
}
#endif
#endif
