// common.cuh: what every kernels/cuda file shares: error checks, the stream, scratch memory, launch
// sizes, warp/block reductions (in float and double) and activation storage's loads and stores.
#ifndef NEOX_CUDA_COMMON_CUH
#define NEOX_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda/cuda.h"

// A CUDA error inside an op is a bug or a lost device: report where and stop (ops return nothing).
#define CUDA_CHECK(call)                                                                                      \
    do {                                                                                                      \
        cudaError_t err_ = (call);                                                                            \
        if (err_ != cudaSuccess) {                                                                            \
            fprintf(stderr, "neox cuda: %s at %s:%d: %s\n", #call, __FILE__, __LINE__, cudaGetErrorString(err_)); \
            abort();                                                                                          \
        }                                                                                                     \
    } while (0)
// After a launch: catches bad launch configurations at once. Faults inside a kernel surface at a
// later synchronisation, unless NEOX_CUDA_SYNC=1 is set in the environment: then every launch is
// waited for, so that a fault is reported at the kernel that caused it (for debugging; slow).
void neox_cuda_after_launch(const char *file, int line);
#define CUDA_LAUNCHED() neox_cuda_after_launch(__FILE__, __LINE__)

// The stream all ops are queued on (initialising the backend on first use).
cudaStream_t neox_cuda_current_stream(void);
// Scratch memory of at least `bytes`, valid until the next call (ops run in stream order, so one
// op's scratch is free again when the next op starts; growing it synchronises).
void *neox_cuda_scratch(size_t bytes);

// Blocks for n items at `threads` per block, capped for grid-stride loops.
static inline unsigned blocks_for(size_t n, int threads) {
    size_t b = (n + threads - 1) / threads;
    if (b > 65535u * 8) b = 65535u * 8;
    return (unsigned)(b ? b : 1);
}

template <typename T> __device__ __forceinline__ T warp_sum(T x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// The order of additions is fixed by the thread layout, so results are run-to-run identical.
template <typename T> __device__ T block_sum(T x) {
    __shared__ T part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    x = warp_sum(x);
    __syncthreads();  // part[] may still be read by a previous call
    if (lane == 0) part[warp] = x;
    __syncthreads();
    x = lane < nwarps ? part[lane] : (T)0;
    return warp_sum(x);
}
__device__ inline float block_max(float x) {
    __shared__ float part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    x = warp_max(x);
    __syncthreads();
    if (lane == 0) part[warp] = x;
    __syncthreads();
    x = lane < nwarps ? part[lane] : -INFINITY;
    return warp_max(x);
}

// Activation storage (kernels.h, "Activation storage"): kernels that read or write activations are
// templates on their storage type T (float or __nv_bfloat16); they load elements as fp32, compute in
// fp32 and store once, rounded to nearest even (the CPU's kernels/cpu/storage.h, bit for bit).
__device__ __forceinline__ float act_load(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float act_load(const __nv_bfloat16 *p, size_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void act_store(float *p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void act_store(__nv_bfloat16 *p, size_t i, float v) { p[i] = __float2bfloat16_rn(v); }
// Runs the statements with T the C++ type of storage type `act` (host code: picks the template).
#define ACT_DISPATCH(act, T, ...)                                                                             \
    do {                                                                                                      \
        if ((act) == NEOX_ELEM_BF16) {                                                                        \
            typedef __nv_bfloat16 T;                                                                          \
            __VA_ARGS__;                                                                                      \
        } else {                                                                                              \
            typedef float T;                                                                                  \
            __VA_ARGS__;                                                                                      \
        }                                                                                                     \
    } while (0)

#endif
