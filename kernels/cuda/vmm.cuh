// vmm.cuh: device allocations that can give part of themselves back (kernels/cuda/vmm.cu), for the
// backend's memory entry points in backend.cu.
#ifndef NEOX_CUDA_VMM_CUH
#define NEOX_CUDA_VMM_CUH

#include <cuda_runtime.h>
#include <stddef.h>

int neox_vmm_ready(void);                        // 1 when the device maps granules (release can give back)
size_t neox_vmm_granularity(void);               // the granule's bytes, 0 when not ready
void *neox_vmm_alloc(size_t bytes);              // NULL: not a block for granules (small, or unavailable)
int neox_vmm_free(void *p);                      // 1 when p was such a block, now freed
size_t neox_vmm_release(void *p, size_t bytes, cudaStream_t stream);  // the granules inside, after the stream's work
size_t neox_vmm_commit(void *p, size_t bytes);   // maps the granules the range touches again

// backend.cu's count of the device memory held (its peak is the backend's peak_bytes): granules
// mapped and unmapped change it.
void neox_cuda_note_held(long long delta);

#endif
