// norm.cu: LayerNorm and RMSNorm forward and backward, one warp per row, statistics accumulated in
// double as kernels/cpu/norm.c does (so wide rows lose nothing), with the CPU's expressions. The
// weight and bias gradients are deterministic column sums (kernels/cuda/reduce.cu).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.cuh"

enum { NORM_WARPS = 8 };

static unsigned norm_blocks(int N) { return (unsigned)((N + NORM_WARPS - 1) / NORM_WARPS); }

// x, out: (N, C); mean (or NULL for RMSNorm), rstd: (N).
__global__ void layernorm_forward_kernel(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                                         const float *bias, int N, int C, float eps) {
    int row = blockIdx.x * NORM_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C;
    double sum = 0.0;
    for (int c = lane; c < C; c += 32) sum += x[c];
    double mu = warp_sum(sum) / C, sq = 0.0;
    for (int c = lane; c < C; c += 32) {
        double d = x[c] - mu;
        sq += d * d;
    }
    sq = warp_sum(sq);
    float m = (float)mu, s = (float)(1.0 / sqrt(sq / C + eps));
    float *o = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32) o[c] = (x[c] - m) * s * weight[c] + (bias ? bias[c] : 0.0f);
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

__global__ void rmsnorm_forward_kernel(float *out, float *rstd, const float *inp, const float *weight, int N, int C,
                                       float eps) {
    int row = blockIdx.x * NORM_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C;
    double sq = 0.0;
    for (int c = lane; c < C; c += 32) sq += (double)x[c] * x[c];
    sq = warp_sum(sq);
    float s = (float)(1.0 / sqrt(sq / C + eps));
    float *o = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32) o[c] = x[c] * s * weight[c];
    if (lane == 0) rstd[row] = s;
}

// dinp += s * (g - mean(g) - xhat * mean(g * xhat)), g = dout * weight, xhat = (x - m) * s; for
// RMSNorm (mean == NULL) m = 0 and the mean(g) term is absent.
__global__ void norm_backward_kernel(float *dinp, const float *dout, const float *inp, const float *weight,
                                     const float *mean, const float *rstd, int N, int C) {
    int row = blockIdx.x * NORM_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= N) return;
    const float *d = dout + (size_t)row * C, *x = inp + (size_t)row * C;
    float m = mean ? mean[row] : 0.0f, s = rstd[row];
    double gsum = 0.0, gxsum = 0.0;
    for (int c = lane; c < C; c += 32) {
        float g = d[c] * weight[c];
        gsum += g;
        gxsum += g * (x[c] - m) * s;
    }
    float gmean = mean ? (float)(warp_sum(gsum) / C) : 0.0f, gxmean = (float)(warp_sum(gxsum) / C);
    float *dx = dinp + (size_t)row * C;
    for (int c = lane; c < C; c += 32) dx[c] += s * (d[c] * weight[c] - gmean - (x[c] - m) * s * gxmean);
}

extern "C" void neox_cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                                            const float *bias, int N, int C, float eps) {
    if (N <= 0) return;
    layernorm_forward_kernel<<<norm_blocks(N), NORM_WARPS * 32, 0, neox_cuda_current_stream()>>>(
        out, mean, rstd, inp, weight, bias, N, C, eps);
    CUDA_LAUNCHED();
}

extern "C" void neox_cuda_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                             const float *inp, const float *weight, const float *mean,
                                             const float *rstd, int N, int C) {
    if (N <= 0) return;
    norm_backward_kernel<<<norm_blocks(N), NORM_WARPS * 32, 0, neox_cuda_current_stream()>>>(
        dinp, dout, inp, weight, mean, rstd, N, C);
    CUDA_LAUNCHED();
    neox_cuda_column_sums(dweight, dout, C, inp, mean, rstd, N, C);
    if (dbias) neox_cuda_column_sums(dbias, dout, C, NULL, NULL, NULL, N, C);
}

extern "C" void neox_cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N, int C,
                                          float eps) {
    if (N <= 0) return;
    rmsnorm_forward_kernel<<<norm_blocks(N), NORM_WARPS * 32, 0, neox_cuda_current_stream()>>>(out, rstd, inp, weight,
                                                                                               N, C, eps);
    CUDA_LAUNCHED();
}

extern "C" void neox_cuda_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                                           const float *weight, const float *rstd, int N, int C) {
    if (N <= 0) return;
    norm_backward_kernel<<<norm_blocks(N), NORM_WARPS * 32, 0, neox_cuda_current_stream()>>>(
        dinp, dout, inp, weight, NULL, rstd, N, C);
    CUDA_LAUNCHED();
    neox_cuda_column_sums(dweight, dout, C, inp, NULL, rstd, N, C);
}
