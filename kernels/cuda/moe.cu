// moe.cu: the token movement of a Mixture-of-Experts layer (kernels/cpu/moe.c's ops): gathering
// token rows into expert order and combining expert outputs per token, each token's slots in order
// (no atomics), with the CPU's expressions.
#include "kernels/cuda/common.cuh"

// One block per row j, threads over C.
__global__ void gather_rows_kernel(float *out, const float *inp, const int *idx, int C) {
    int j = blockIdx.x;
    const float *src = inp + (size_t)idx[j] * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) out[(size_t)j * C + c] = src[c];
}

// One block per token t, threads over C; the token's K slots in order.
__global__ void moe_combine_kernel(float *out, const float *rows, const int *slot, const float *weight, int K, int C) {
    int t = blockIdx.x;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float o = 0.0f;
        for (int k = 0; k < K; k++)
            o += (weight ? weight[t * K + k] : 1.0f) * rows[(size_t)slot[t * K + k] * C + c];
        out[(size_t)t * C + c] = o;
    }
}

// One warp per token slot (t, k): its row's gradient and the dot product for its weight.
__global__ void moe_combine_backward_kernel(float *drows, float *dweight, const float *dout, const float *rows,
                                            const int *slot, const float *weight, int NK, int K, int C) {
    int s = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (s >= NK) return;
    size_t j = (size_t)slot[s];
    const float *d = dout + (size_t)(s / K) * C, *r = rows + j * C;
    float w = weight[s];
    double dot = 0.0;
    for (int c = lane; c < C; c += 32) {
        dot += (double)d[c] * r[c];
        drows[j * C + c] = w * d[c];
    }
    dot = warp_sum(dot);
    if (lane == 0) dweight[s] = (float)dot;
}

extern "C" void neox_cuda_gather_rows(float *out, const float *inp, const int *idx, int n, int C) {
    if (n <= 0) return;
    gather_rows_kernel<<<n, 256, 0, neox_cuda_current_stream()>>>(out, inp, idx, C);
    CUDA_LAUNCHED();
}

extern "C" void neox_cuda_moe_combine(float *out, const float *rows, const int *slot, const float *weight, int N, int K,
                                      int C) {
    if (N <= 0) return;
    moe_combine_kernel<<<N, 256, 0, neox_cuda_current_stream()>>>(out, rows, slot, weight, K, C);
    CUDA_LAUNCHED();
}

extern "C" void neox_cuda_moe_combine_backward(float *drows, float *dweight, const float *dout, const float *rows,
                                               const int *slot, const float *weight, int N, int K, int C) {
    int NK = N * K;
    if (NK <= 0) return;
    moe_combine_backward_kernel<<<(NK + 7) / 8, 256, 0, neox_cuda_current_stream()>>>(drows, dweight, dout, rows, slot,
                                                                                       weight, NK, K, C);
    CUDA_LAUNCHED();
}
