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

// ---- query/key normalisation over heads (kernels/cpu/norm.c's neox_head_norm_*) ----------------
// x: (B, H, T, HS); one warp per row (b, t, group of G heads), G * HS values.
__device__ static size_t head_norm_at(int row, int e, int H, int T, int HS, int G) {
    int groups = H / G, g = row % groups, bt = row / groups, b = bt / T, t = bt % T;
    int h = g * G + e / HS, d = e % HS;
    return (((size_t)b * H + h) * T + t) * HS + d;
}

__global__ void head_norm_forward_kernel(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                                         const float *bias, int rows, int H, int T, int HS, int G, float eps) {
    int row = blockIdx.x * NORM_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31, E = G * HS;
    if (row >= rows) return;
    double sum = 0.0, sq = 0.0;
    for (int e = lane; e < E; e += 32) sum += inp[head_norm_at(row, e, H, T, HS, G)];
    double mu = mean ? warp_sum(sum) / E : 0.0;
    for (int e = lane; e < E; e += 32) {
        double x = inp[head_norm_at(row, e, H, T, HS, G)] - mu;
        sq += x * x;
    }
    sq = warp_sum(sq);
    float m = (float)mu, s = (float)(1.0 / sqrt(sq / E + eps));
    int h0 = (row % (H / G)) * G;
    for (int e = lane; e < E; e += 32) {
        size_t at = head_norm_at(row, e, H, T, HS, G);
        int w = (h0 + e / HS) * HS + e % HS;
        out[at] = (inp[at] - m) * s * weight[w] + (bias ? bias[w] : 0.0f);
    }
    if (lane == 0) {
        if (mean) mean[row] = m;
        rstd[row] = s;
    }
}

// One thread per (h, d): rows in order, as the CPU sums them.
__global__ void head_norm_params_kernel(float *dweight, float *dbias, const float *dout, const float *inp,
                                        const float *mean, const float *rstd, int B, int H, int T, int HS, int G) {
    int hd = blockIdx.x * blockDim.x + threadIdx.x;
    if (hd >= H * HS) return;
    int h = hd / HS, d = hd % HS, groups = H / G;
    float sw = 0.0f, sb = 0.0f;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            size_t r = ((size_t)b * T + t) * groups + h / G, at = (((size_t)b * H + h) * T + t) * HS + d;
            sw += dout[at] * (inp[at] - (mean ? mean[r] : 0.0f)) * rstd[r];
            sb += dout[at];
        }
    dweight[hd] += sw;
    if (dbias) dbias[hd] += sb;
}

// Each lane writes only the elements it read, after the row's sums: dinp may be dout.
__global__ void head_norm_backward_kernel(float *dinp, const float *dout, const float *inp, const float *weight,
                                          const float *mean, const float *rstd, int rows, int H, int T, int HS,
                                          int G) {
    int row = blockIdx.x * NORM_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31, E = G * HS;
    if (row >= rows) return;
    float m = mean ? mean[row] : 0.0f, s = rstd[row];
    int h0 = (row % (H / G)) * G;
    double gsum = 0.0, gxsum = 0.0;
    for (int e = lane; e < E; e += 32) {
        size_t at = head_norm_at(row, e, H, T, HS, G);
        float g = dout[at] * weight[(h0 + e / HS) * HS + e % HS];
        gsum += g;
        gxsum += g * (inp[at] - m) * s;
    }
    float gmean = mean ? (float)(warp_sum(gsum) / E) : 0.0f, gxmean = (float)(warp_sum(gxsum) / E);
    for (int e = lane; e < E; e += 32) {
        size_t at = head_norm_at(row, e, H, T, HS, G);
        dinp[at] = s * (dout[at] * weight[(h0 + e / HS) * HS + e % HS] - gmean - (inp[at] - m) * s * gxmean);
    }
}

extern "C" void neox_cuda_head_norm_forward(float *out, float *mean, float *rstd, const float *inp,
                                            const float *weight, const float *bias, int B, int H, int T, int HS,
                                            int G, float eps) {
    int rows = B * T * (H / G);
    if (rows <= 0) return;
    head_norm_forward_kernel<<<norm_blocks(rows), NORM_WARPS * 32, 0, neox_cuda_current_stream()>>>(
        out, mean, rstd, inp, weight, bias, rows, H, T, HS, G, eps);
    CUDA_LAUNCHED();
}

extern "C" void neox_cuda_head_norm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                             const float *inp, const float *weight, const float *mean,
                                             const float *rstd, int B, int H, int T, int HS, int G) {
    int rows = B * T * (H / G);
    if (rows <= 0) return;
    cudaStream_t st = neox_cuda_current_stream();
    head_norm_params_kernel<<<(H * HS + 127) / 128, 128, 0, st>>>(dweight, dbias, dout, inp, mean, rstd, B, H, T, HS,
                                                                  G);
    CUDA_LAUNCHED();
    head_norm_backward_kernel<<<norm_blocks(rows), NORM_WARPS * 32, 0, st>>>(dinp, dout, inp, weight, mean, rstd,
                                                                              rows, H, T, HS, G);
    CUDA_LAUNCHED();
}
