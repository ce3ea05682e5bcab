// loss.cu: softmax cross-entropy fused over the vocabulary, one block per row, as kernels/cpu/
// cross_entropy.c: the row max, the sum of exponentials in double, the log-sum-exp saved for the
// backward, which recomputes the probabilities and may overwrite the logits in place. The two
// halves (row max, row sum) serve a vocabulary split over tensor-parallel ranks. The fused loss
// (neox_cross_entropy_fused) does a row's statistics and gradient in one pass, the row held in
// shared memory when it fits. Logits and their gradient are stored as the activations are (fp32 or
// bf16; the fused op also fp16); the statistics stay fp32 (the sums of exponentials double).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/common.cuh"

enum { CE_THREADS = 512 };

// The separate ops below read logits stored as the activations are (templates on the storage type S,
// common.cuh): widened to fp32 on load, the gradient rounded once on store.
template <typename S> __device__ float row_max(const S *z, int V) {
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, act_load(z, j));
    return block_max(mx);
}

template <typename S> __device__ double row_sumexp(const S *z, float mx, int V) {
    double sum = 0.0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) sum += (double)expf(act_load(z, j) - mx);
    return block_sum(sum);
}

template <typename S>
__global__ void cross_entropy_forward_kernel(float *losses, float *lse, const S *logits, const int *targets, int V) {
    const S *z = logits + (size_t)blockIdx.x * V;
    float mx = row_max(z, V);
    double sum = row_sumexp(z, mx, V);
    if (threadIdx.x == 0) {
        float l = mx + (float)log(sum);
        lse[blockIdx.x] = l;
        int t = targets[blockIdx.x];
        losses[blockIdx.x] = t >= 0 && t < V ? l - act_load(z, t) : 0.0f;  // a masked position: no loss (as the CPU)
    }
}

template <typename S> __global__ void row_max_kernel(float *mx, const S *logits, int V) {
    float m = row_max(logits + (size_t)blockIdx.x * V, V);
    if (threadIdx.x == 0) mx[blockIdx.x] = m;
}

template <typename S> __global__ void row_sumexp_kernel(double *sum, const S *logits, const float *mx, int V) {
    double s = row_sumexp(logits + (size_t)blockIdx.x * V, mx[blockIdx.x], V);
    if (threadIdx.x == 0) sum[blockIdx.x] = s;
}

// Each element is read and written by the same thread, so dlogits may alias logits.
template <typename S>
__global__ void cross_entropy_backward_kernel(S *dlogits, const S *logits, const float *lse, const int *targets,
                                              const float *weight, float scale, const float *scale_at, int V) {
    size_t row = blockIdx.x;
    float w = (weight ? weight[row] : 1.0f) * (scale_at ? *scale_at : scale), l = lse[row];
    int target = targets[row];
    const S *z = logits + row * V;
    S *dz = dlogits + row * V;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float d = expf(act_load(z, j) - l) * w;
        act_store(dz, j, j == target ? d - w : d);
    }
}

// out, targets: (N); one thread per row.
template <typename S> __global__ void target_logit_kernel(double *out, const S *logits, const int *targets, int N, int V) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    int t = targets[i];
    out[i] = t >= 0 && t < V ? (double)act_load(logits, (size_t)i * V + t) : 0.0;
}

// Rows go one per block; a grid's first dimension holds 2^31 - 1 blocks, far more than N.
extern "C" void neox_cuda_cross_entropy_forward(float *losses, float *lse, const void *logits, const int *targets,
                                                int N, int V, neox_elem act) {
    if (N <= 0) return;
    ACT_DISPATCH(act, S, cross_entropy_forward_kernel<S><<<N, CE_THREADS, 0, neox_cuda_current_stream()>>>(
                             losses, lse, (const S *)logits, targets, V));
    CUDA_LAUNCHED();
}

extern "C" void neox_cuda_cross_entropy_row_max(float *mx, const void *logits, int N, int V, neox_elem act) {
    if (N <= 0) return;
    ACT_DISPATCH(act, S, row_max_kernel<S><<<N, CE_THREADS, 0, neox_cuda_current_stream()>>>(mx, (const S *)logits, V));
    CUDA_LAUNCHED();
}

extern "C" void neox_cuda_cross_entropy_row_sumexp(double *sum, const void *logits, const float *mx, int N, int V,
                                                   neox_elem act) {
    if (N <= 0) return;
    ACT_DISPATCH(act, S, row_sumexp_kernel<S><<<N, CE_THREADS, 0, neox_cuda_current_stream()>>>(
                             sum, (const S *)logits, mx, V));
    CUDA_LAUNCHED();
}

extern "C" void neox_cuda_cross_entropy_backward(void *dlogits, const void *logits, const float *lse,
                                                 const int *targets, const float *weight, float scale,
                                                 const float *scale_at, int N, int V, neox_elem act) {
    if (N <= 0) return;
    ACT_DISPATCH(act, S, cross_entropy_backward_kernel<S><<<N, CE_THREADS, 0, neox_cuda_current_stream()>>>(
                             (S *)dlogits, (const S *)logits, lse, targets, weight, scale, scale_at, V));
    CUDA_LAUNCHED();
}

extern "C" void neox_cuda_cross_entropy_target_logit(double *out, const void *logits, const int *targets, int N, int V,
                                                     neox_elem act) {
    if (N <= 0) return;
    ACT_DISPATCH(act, S, target_logit_kernel<S><<<(N + 255) / 256, 256, 0, neox_cuda_current_stream()>>>(
                             out, (const S *)logits, targets, N, V));
    CUDA_LAUNCHED();
}

// One block: thread t takes rows t, t + blockDim.x, ...; the block's sums in the fixed order of
// block_sum, so the loss repeats bit for bit from run to run.
__global__ void cross_entropy_loss_kernel(float *lse, double *loss, const float *mx, const double *stats,
                                          const float *mask, int N) {
    double sum = 0.0, wsum = 0.0;
    for (int i = threadIdx.x; i < N; i += blockDim.x) {
        float l = mx[i] + (float)log(stats[i]);
        lse[i] = l;
        sum += (double)mask[i] * (l - (float)stats[N + i]);
        wsum += mask[i];
    }
    sum = block_sum(sum);
    wsum = block_sum(wsum);
    if (threadIdx.x == 0) loss[0] = sum, loss[1] = wsum;
}

extern "C" void neox_cuda_cross_entropy_loss(float *lse, double *loss, const float *mx, const double *stats,
                                             const float *mask, int N) {
    cross_entropy_loss_kernel<<<1, 1024, 0, neox_cuda_current_stream()>>>(lse, loss, mx, stats, mask, N);
    CUDA_LAUNCHED();
}

// ---- the fused loss and gradient ---------------------------------------------------------------
// The logits' storage types, widened to fp32 and rounded back (to nearest even) one element at a time.
__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ float widen(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float widen(__half x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T narrow(float x);
template <> __device__ __forceinline__ float narrow<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half narrow<__half>(float x) { return __float2half_rn(x); }

// The most dynamic shared memory a block may opt in to on this device (an H100's 227 KiB, an A100's
// 163), less room for the block reductions' own: a row up to this long is kept there between the
// passes, a longer one read from global memory (L2) again.
static size_t fused_cache_bytes(void) {
    static size_t bytes;
    if (!bytes) {
        int device, optin;
        CUDA_CHECK(cudaGetDevice(&device));
        CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        bytes = optin > 4096 ? (size_t)optin - 1024 : 1;
    }
    return bytes;
}

// z: (N, V) logits of type T, one block per row, overwritten by the row's gradient; mx, sum,
// target_logit: (N), written unless stats_given (then mx, sum are the reduced inputs). The row sits in
// dynamic shared memory (cached = 1) or is re-read. The sum of exponentials is in double and the
// target's one-hot subtracted in fp32 before rounding, as the CPU's cross_entropy.c.
template <typename T>
__global__ void cross_entropy_fused_kernel(T *logits, float *mx, double *sum, double *target_logit, const int *targets,
                                           const float *weight, float scale, const float *scale_at, int V,
                                           int stats_given, int cached) {
    extern __shared__ __align__(16) unsigned char fused_row[];
    size_t row = blockIdx.x;
    T *z = logits + row * V;
    const T *src = z;
    int t = targets[row];
    if (cached) {
        T *cache = (T *)fused_row;
        for (int j = threadIdx.x; j < V; j += blockDim.x) cache[j] = z[j];
        __syncthreads();
        src = cache;
    }
    float m;
    double s;
    if (stats_given) {
        m = mx[row], s = sum[row];
    } else {
        m = -INFINITY;
        for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, widen(src[j]));
        m = block_max(m);
        s = 0.0;
        for (int j = threadIdx.x; j < V; j += blockDim.x) s += (double)expf(widen(src[j]) - m);
        s = block_sum(s);
        if (threadIdx.x == 0) {
            mx[row] = m, sum[row] = s;
            target_logit[row] = t >= 0 && t < V ? (double)widen(src[t]) : 0.0;
        }
    }
    float l = m + (float)log(s), w = (weight ? weight[row] : 1.0f) * (scale_at ? *scale_at : scale);
    // Each element is read and written by the same thread (and the cache is not written), so the
    // gradient may overwrite the logits.
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float d = expf(widen(src[j]) - l) * w;
        z[j] = narrow<T>(j == t ? d - w : d);
    }
}

template <typename T>
static void launch_fused(void *logits, float *mx, double *sum, double *target_logit, const int *targets,
                         const float *weight, float scale, const float *scale_at, int N, int V, int stats_given) {
    static int limit_set;  // the opt-in above 48 KiB of dynamic shared memory, once per instantiation
    if (!limit_set) {
        CUDA_CHECK(cudaFuncSetAttribute(cross_entropy_fused_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)fused_cache_bytes()));
        limit_set = 1;
    }
    size_t bytes = (size_t)V * sizeof(T);
    int cached = bytes <= fused_cache_bytes();
    cross_entropy_fused_kernel<T><<<N, CE_THREADS, cached ? bytes : 0, neox_cuda_current_stream()>>>(
        (T *)logits, mx, sum, target_logit, targets, weight, scale, scale_at, V, stats_given, cached);
    CUDA_LAUNCHED();
}

extern "C" void neox_cuda_cross_entropy_fused(void *logits, neox_elem logits_elem, float *mx, double *sum,
                                              double *target_logit, const int *targets, const float *weight,
                                              float scale, const float *scale_at, int N, int V, int stats_given) {
    if (N <= 0) return;
    if (logits_elem == NEOX_ELEM_BF16)
        launch_fused<__nv_bfloat16>(logits, mx, sum, target_logit, targets, weight, scale, scale_at, N, V, stats_given);
    else if (logits_elem == NEOX_ELEM_F16)
        launch_fused<__half>(logits, mx, sum, target_logit, targets, weight, scale, scale_at, N, V, stats_given);
    else launch_fused<float>(logits, mx, sum, target_logit, targets, weight, scale, scale_at, N, V, stats_given);
}
