// moe.cu: the token movement of a Mixture-of-Experts layer (kernels/cpu/moe.c's ops): gathering
// token rows into expert order and combining expert outputs per token, each token's slots in order
// (no atomics), with the CPU's expressions.
#include "kernels/cuda/common.cuh"

// One block per row j, threads over C; out: (n, C), inp: (rows, C), both stored as T.
template <typename T> __global__ void gather_rows_kernel(T *out, const T *inp, const int *idx, int C) {
    int j = blockIdx.x;
    const T *src = inp + (size_t)idx[j] * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) out[(size_t)j * C + c] = src[c];
}

// One block per token t, threads over C; the token's K slots in order. out: (N, C), rows: (N*K, C).
template <typename T>
__global__ void moe_combine_kernel(T *out, const T *rows, const int *slot, const float *weight, int K, int C) {
    int t = blockIdx.x;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float o = 0.0f;
        for (int k = 0; k < K; k++)
            o += (weight ? weight[t * K + k] : 1.0f) * act_load(rows, (size_t)slot[t * K + k] * C + c);
        act_store(out, (size_t)t * C + c, o);
    }
}

// One warp per token slot (t, k): its row's gradient and the dot product for its weight.
// drows, rows: (N*K, C), dout: (N, C) stored as T; dweight, weight: (N*K).
template <typename T>
__global__ void moe_combine_backward_kernel(T *drows, float *dweight, const T *dout, const T *rows, const int *slot,
                                            const float *weight, int NK, int K, int C) {
    int s = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (s >= NK) return;
    size_t j = (size_t)slot[s], d = (size_t)(s / K) * C;
    float w = weight[s];
    double dot = 0.0;
    for (int c = lane; c < C; c += 32) {
        float dy = act_load(dout, d + c);
        dot += (double)dy * act_load(rows, j * C + c);
        act_store(drows, j * C + c, w * dy);
    }
    dot = warp_sum(dot);
    if (lane == 0) dweight[s] = (float)dot;
}

extern "C" void neox_cuda_gather_rows(void *out, const void *inp, const int *idx, int n, int C, neox_elem act) {
    if (n <= 0) return;
    ACT_DISPATCH(act, T,
                 gather_rows_kernel<T><<<n, 256, 0, neox_cuda_current_stream()>>>((T *)out, (const T *)inp, idx, C));
    CUDA_LAUNCHED();
}

extern "C" void neox_cuda_moe_combine(void *out, const void *rows, const int *slot, const float *weight, int N, int K,
                                      int C, neox_elem act) {
    if (N <= 0) return;
    ACT_DISPATCH(act, T, moe_combine_kernel<T><<<N, 256, 0, neox_cuda_current_stream()>>>((T *)out, (const T *)rows,
                                                                                           slot, weight, K, C));
    CUDA_LAUNCHED();
}

extern "C" void neox_cuda_moe_combine_backward(void *drows, float *dweight, const void *dout, const void *rows,
                                               const int *slot, const float *weight, int N, int K, int C,
                                               neox_elem act) {
    int NK = N * K;
    if (NK <= 0) return;
    ACT_DISPATCH(act, T, moe_combine_backward_kernel<T><<<(NK + 7) / 8, 256, 0, neox_cuda_current_stream()>>>(
                             (T *)drows, dweight, (const T *)dout, (const T *)rows, slot, weight, NK, K, C));
    CUDA_LAUNCHED();
}
