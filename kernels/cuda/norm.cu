// norm.cu: LayerNorm, RMSNorm and ScaleNorm forward and backward, the residual add (with the branch's
// row-parallel bias) fused before the forward, and the residual gradient's column sums (that bias's
// gradient) in the backward's pass; one warp per row, statistics accumulated in double as kernels/cpu/norm.c does (so wide
// rows lose nothing), with the CPU's expressions. The weight and bias gradients are deterministic column sums (kernels/cuda/reduce.cu).
// Every kernel here is a template on the activations' storage type (common.cuh); statistics and
// parameter gradients stay fp32.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.cuh"

// v rounded as storage type T stores it (the type is the pointer's), as fp32.
__device__ __forceinline__ float act_round(const float *, float v) { return v; }
__device__ __forceinline__ float act_round(const __nv_bfloat16 *, float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

enum { NORM_WARPS = 8 };

static unsigned norm_blocks(int N) { return (unsigned)((N + NORM_WARPS - 1) / NORM_WARPS); }

// x, out: (N, C) of storage type T; mean, rstd: (N).
template <typename T>
__global__ void layernorm_forward_kernel(T *out, float *mean, float *rstd, const T *inp, const float *weight,
                                         const float *bias, int N, int C, float eps) {
    int row = blockIdx.x * NORM_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= N) return;
    const T *x = inp + (size_t)row * C;
    double sum = 0.0;
    for (int c = lane; c < C; c += 32) sum += act_load(x, c);
    double mu = warp_sum(sum) / C, sq = 0.0;
    for (int c = lane; c < C; c += 32) {
        double d = act_load(x, c) - mu;
        sq += d * d;
    }
    sq = warp_sum(sq);
    float m = (float)mu, s = (float)(1.0 / sqrt(sq / C + eps));
    T *o = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32) act_store(o, c, (act_load(x, c) - m) * s * weight[c] + (bias ? bias[c] : 0.0f));
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

template <typename T>
__global__ void rmsnorm_forward_kernel(T *out, float *rstd, const T *inp, const float *weight, int N, int C, float eps) {
    int row = blockIdx.x * NORM_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= N) return;
    const T *x = inp + (size_t)row * C;
    double sq = 0.0;
    for (int c = lane; c < C; c += 32) sq += (double)act_load(x, c) * act_load(x, c);
    sq = warp_sum(sq);
    float s = (float)(1.0 / sqrt(sq / C + eps));
    T *o = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32) act_store(o, c, act_load(x, c) * s * weight[c]);
    if (lane == 0) rstd[row] = s;
}

// dinp += s * (g - mean(g) - xhat * mean(g * xhat)), g = dout * weight, xhat = (x - m) * s; for
// RMSNorm (mean == NULL) m = 0 and the mean(g) term is absent. dinp, dout, inp: (N, C) of storage type T.
template <typename T>
__global__ void norm_backward_kernel(T *dinp, const T *dout, const T *inp, const float *weight, const float *mean,
                                     const float *rstd, int N, int C) {
    int row = blockIdx.x * NORM_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= N) return;
    const T *d = dout + (size_t)row * C, *x = inp + (size_t)row * C;
    float m = mean ? mean[row] : 0.0f, s = rstd[row];
    double gsum = 0.0, gxsum = 0.0;
    for (int c = lane; c < C; c += 32) {
        float g = act_load(d, c) * weight[c];
        gsum += g;
        gxsum += g * (act_load(x, c) - m) * s;
    }
    float gmean = mean ? (float)(warp_sum(gsum) / C) : 0.0f, gxmean = (float)(warp_sum(gxsum) / C);
    T *dx = dinp + (size_t)row * C;
    for (int c = lane; c < C; c += 32)
        act_store(dx, c, act_load(dx, c) + s * (act_load(d, c) * weight[c] - gmean - (act_load(x, c) - m) * s * gxmean));
}

// The backward with the weight (and bias) gradients' partial sums in the same pass, so dout and inp
// are read once: one block per row chunk of neox_cuda_column_chunks, warp w taking rows r0 + w,
// r0 + w + 8, ... (the column sums' lanes); each row's dinp as norm_backward_kernel, and the warp's
// column sums of dout * (x - m) * s and dout in registers (column lane + 32k, k < K: C <= 32 K), then
// the warps summed in order into pw, pb (chunks, C): the column sums' own order, finished by
// neox_cuda_column_finish. mean NULL: RMSNorm (m = 0, no mean(g) term, no bias). ps (or NULL): the
// column sums of dinp as stored, in the same order: neox_cuda_column_sums_act's, which the linear
// layers' bias gradients use, so the bias gradient made here has their bits.
static_assert(NORM_WARPS == 8, "the fused backward's warps are the column sums' 8 lanes (kernels/cuda/reduce.cu)");

// out[c] = the sum over the block's warps, in order, of each warp's column sums v (column lane + 32k).
template <int K>
__device__ void warps_in_order(float *out, float (*part)[32 * K], const float *v, int C) {
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
#pragma unroll
    for (int k = 0; k < K; k++) part[warp][lane + 32 * k] = v[k];
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float t = 0.0f;
        for (int w = 0; w < NORM_WARPS; w++) t += part[w][c];
        out[c] = t;
    }
}

template <int K, typename T>
__global__ void norm_backward_fused_kernel(T *dinp, float *pw, float *pb, float *ps, const T *dout, const T *inp,
                                           const float *weight, const float *mean, const float *rstd, int N, int C,
                                           int rows_per_chunk) {
    __shared__ float part[NORM_WARPS][32 * K];
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int r0 = blockIdx.x * rows_per_chunk, r1 = min(N, r0 + rows_per_chunk);
    float sw[K], sb[K], sd[K];
#pragma unroll
    for (int k = 0; k < K; k++) sw[k] = sb[k] = sd[k] = 0.0f;
    for (int row = r0 + warp; row < r1; row += NORM_WARPS) {
        const T *d = dout + (size_t)row * C, *x = inp + (size_t)row * C;
        float m = mean ? mean[row] : 0.0f, s = rstd[row];
        double gsum = 0.0, gxsum = 0.0;
#pragma unroll
        for (int k = 0; k < K; k++) {
            int c = lane + 32 * k;
            if (c >= C) break;
            float dc = act_load(d, c), xc = act_load(x, c);
            float g = dc * weight[c];
            gsum += g;
            gxsum += g * (xc - m) * s;
            sw[k] += dc * (xc - m) * s;
            sb[k] += dc;
        }
        float gmean = mean ? (float)(warp_sum(gsum) / C) : 0.0f, gxmean = (float)(warp_sum(gxsum) / C);
        T *dx = dinp + (size_t)row * C;
#pragma unroll
        for (int k = 0; k < K; k++) {
            int c = lane + 32 * k;
            if (c >= C) break;
            float v = act_round(dx, act_load(dx, c) + s * (act_load(d, c) * weight[c] - gmean -
                                                          (act_load(x, c) - m) * s * gxmean));
            act_store(dx, c, v);
            sd[k] += v;
        }
    }
    warps_in_order<K>(pw + (size_t)blockIdx.x * C, part, sw, C);
    if (pb) {
        __syncthreads();  // part is rewritten for the bias
        warps_in_order<K>(pb + (size_t)blockIdx.x * C, part, sb, C);
    }
    if (ps) {
        __syncthreads();
        warps_in_order<K>(ps + (size_t)blockIdx.x * C, part, sd, C);
    }
}

// Runs the fused backward for C <= 1024 and returns 1; 0 for wider rows (the caller runs the row
// kernel and the column sums apart).
template <typename T>
static int norm_backward_fused(T *dinp, float *dweight, float *dbias, float *dsum, const T *dout, const T *inp,
                               const float *weight, const float *mean, const float *rstd, int N, int C) {
    int K = (C + 31) / 32, rows_per_chunk, chunks = neox_cuda_column_chunks(N, &rows_per_chunk);
    if (K > 32) return 0;
    size_t part = (size_t)chunks * C;
    float *pw = (float *)neox_cuda_scratch(3 * part * sizeof(float));
    float *pb = dbias ? pw + part : NULL, *ps = dsum ? pw + 2 * part : NULL;
    cudaStream_t st = neox_cuda_current_stream();
#define FUSED(KK) norm_backward_fused_kernel<KK, T><<<chunks, NORM_WARPS * 32, 0, st>>>(dinp, pw, pb, ps, dout, inp,     \
                                                                                        weight, mean, rstd, N, C,       \
                                                                                        rows_per_chunk)
    if (K <= 8) FUSED(8);
    else if (K <= 16) FUSED(16);
    else if (K <= 24) FUSED(24);
    else FUSED(32);
#undef FUSED
    CUDA_LAUNCHED();
    neox_cuda_column_finish(dweight, pw, chunks, C);
    if (dbias) neox_cuda_column_finish(dbias, pb, chunks, C);
    if (dsum) neox_cuda_column_finish(dsum, ps, chunks, C);
    return 1;
}

// LayerNorm's (mean != NULL) or RMSNorm's backward: the fused pass, or for wide rows the row kernel and the column sums.
template <typename T>
static void norm_backward(T *dinp, float *dweight, float *dbias, float *dsum, const T *dout, const T *inp,
                          const float *weight, const float *mean, const float *rstd, int N, int C, neox_elem act) {
    if (N <= 0 || norm_backward_fused<T>(dinp, dweight, dbias, dsum, dout, inp, weight, mean, rstd, N, C)) return;
    norm_backward_kernel<T><<<norm_blocks(N), NORM_WARPS * 32, 0, neox_cuda_current_stream()>>>(
        dinp, dout, inp, weight, mean, rstd, N, C);
    CUDA_LAUNCHED();
    neox_cuda_column_sums_act(dweight, dout, C, inp, mean, rstd, N, C, act);
    if (dbias) neox_cuda_column_sums_act(dbias, dout, C, NULL, NULL, NULL, N, C, act);
    if (dsum) neox_cuda_column_sums_act(dsum, dinp, C, NULL, NULL, NULL, N, C, act);
}

extern "C" void neox_cuda_layernorm_forward(void *out, float *mean, float *rstd, const void *inp, const float *weight,
                                            const float *bias, int N, int C, float eps, neox_elem act) {
    if (N <= 0) return;
    ACT_DISPATCH(act, T, layernorm_forward_kernel<T><<<norm_blocks(N), NORM_WARPS * 32, 0, neox_cuda_current_stream()>>>(
                             (T *)out, mean, rstd, (const T *)inp, weight, bias, N, C, eps));
    CUDA_LAUNCHED();
}

extern "C" void neox_cuda_layernorm_backward(void *dinp, float *dweight, float *dbias, float *dsum, const void *dout,
                                             const void *inp, const float *weight, const float *mean,
                                             const float *rstd, int N, int C, neox_elem act) {
    ACT_DISPATCH(act, T, norm_backward<T>((T *)dinp, dweight, dbias, dsum, (const T *)dout, (const T *)inp, weight, mean,
                                          rstd, N, C, act));
}

extern "C" void neox_cuda_rmsnorm_forward(void *out, float *rstd, const void *inp, const float *weight, int N, int C,
                                          float eps, neox_elem act) {
    if (N <= 0) return;
    ACT_DISPATCH(act, T, rmsnorm_forward_kernel<T><<<norm_blocks(N), NORM_WARPS * 32, 0, neox_cuda_current_stream()>>>(
                             (T *)out, rstd, (const T *)inp, weight, N, C, eps));
    CUDA_LAUNCHED();
}

extern "C" void neox_cuda_rmsnorm_backward(void *dinp, float *dweight, float *dsum, const void *dout, const void *inp,
                                           const float *weight, const float *rstd, int N, int C, neox_elem act) {
    ACT_DISPATCH(act, T, norm_backward<T>((T *)dinp, dweight, NULL, dsum, (const T *)dout, (const T *)inp, weight, NULL,
                                          rstd, N, C, act));
}

// inp, out: (N, C) stored as T; rnorm: (N). One warp per row.
template <typename T>
__global__ void scalenorm_forward_kernel(T *out, float *rnorm, const T *inp, const float *g, int N, int C, float eps) {
    int row = blockIdx.x * NORM_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= N) return;
    size_t at = (size_t)row * C;
    double sq = 0.0;
    for (int c = lane; c < C; c += 32) {
        double x = act_load(inp, at + c);
        sq += x * x;
    }
    double n = sqrt(warp_sum(sq));
    float r = (float)(1.0 / (n < eps ? (double)eps : n)), gain = g[0];
    for (int c = lane; c < C; c += 32) act_store(out, at + c, act_load(inp, at + c) * r * gain);
    if (lane == 0) rnorm[row] = r;
}

// dinp += g r (dout - x r^2 (x . dout)), the norm's term absent where the norm was clamped.
// dinp, dout, inp: (N, C) stored as T; rnorm: (N).
template <typename T>
__global__ void scalenorm_backward_kernel(T *dinp, const T *dout, const T *inp, const float *g, const float *rnorm,
                                          int N, int C, float eps) {
    int row = blockIdx.x * NORM_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= N) return;
    size_t at = (size_t)row * C;
    double sq = 0.0, xd = 0.0;
    for (int c = lane; c < C; c += 32) {
        double x = act_load(inp, at + c);
        sq += x * x;
        xd += x * act_load(dout, at + c);
    }
    sq = warp_sum(sq);
    xd = warp_sum(xd);
    float r = rnorm[row], gain = g[0];
    float through_norm = sqrt(sq) < eps ? 0.0f : (float)(xd * r * r);
    for (int c = lane; c < C; c += 32)
        act_store(dinp, at + c,
                  act_load(dinp, at + c) + gain * r * (act_load(dout, at + c) - act_load(inp, at + c) * through_norm));
}

// dg += sum over rows of r (x . dout): one block, rows strided over its threads, a fixed-order sum.
template <typename T>
__global__ void scalenorm_gain_grad_kernel(float *dg, const T *dout, const T *inp, const float *rnorm, int N, int C) {
    double sum = 0.0;
    for (int i = threadIdx.x; i < N; i += blockDim.x) {
        size_t at = (size_t)i * C;
        double xd = 0.0;
        for (int c = 0; c < C; c++) xd += (double)act_load(inp, at + c) * act_load(dout, at + c);
        sum += xd * rnorm[i];
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) dg[0] += (float)sum;
}

extern "C" void neox_cuda_scalenorm_forward(void *out, float *rnorm, const void *inp, const float *g, int N, int C,
                                            float eps, neox_elem act) {
    if (N <= 0) return;
    ACT_DISPATCH(act, T, scalenorm_forward_kernel<T><<<norm_blocks(N), NORM_WARPS * 32, 0, neox_cuda_current_stream()>>>(
                             (T *)out, rnorm, (const T *)inp, g, N, C, eps));
    CUDA_LAUNCHED();
}

extern "C" void neox_cuda_scalenorm_backward(void *dinp, float *dg, const void *dout, const void *inp,
                                             const float *g, const float *rnorm, int N, int C, float eps,
                                             neox_elem act) {
    if (N <= 0) return;
    cudaStream_t st = neox_cuda_current_stream();
    ACT_DISPATCH(act, T, {
        scalenorm_backward_kernel<T><<<norm_blocks(N), NORM_WARPS * 32, 0, st>>>((T *)dinp, (const T *)dout,
                                                                                  (const T *)inp, g, rnorm, N, C, eps);
        CUDA_LAUNCHED();
        scalenorm_gain_grad_kernel<T><<<1, 256, 0, st>>>(dg, (const T *)dout, (const T *)inp, rnorm, N, C);
        CUDA_LAUNCHED();
    });
}

// ---- query/key normalisation over heads (kernels/cpu/norm.c's neox_head_norm_*) ----------------
// x: (B, H, T, HS); one warp per row (b, t, group of G heads), G * HS values.
__device__ static size_t head_norm_at(int row, int e, int H, int T, int HS, int G) {
    int groups = H / G, g = row % groups, bt = row / groups, b = bt / T, t = bt % T;
    int h = g * G + e / HS, d = e % HS;
    return (((size_t)b * H + h) * T + t) * HS + d;
}

// inp, out: (B, H, T_, HS) stored as T (out may be inp); mean, rstd: (rows) = (B, T_, H / G).
template <typename T>
__global__ void head_norm_forward_kernel(T *out, float *mean, float *rstd, const T *inp, const float *weight,
                                         const float *bias, int rows, int H, int T_, int HS, int G, float eps) {
    int row = blockIdx.x * NORM_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31, E = G * HS;
    if (row >= rows) return;
    double sum = 0.0, sq = 0.0;
    for (int e = lane; e < E; e += 32) sum += act_load(inp, head_norm_at(row, e, H, T_, HS, G));
    double mu = mean ? warp_sum(sum) / E : 0.0;
    for (int e = lane; e < E; e += 32) {
        double x = act_load(inp, head_norm_at(row, e, H, T_, HS, G)) - mu;
        sq += x * x;
    }
    sq = warp_sum(sq);
    float m = (float)mu, s = (float)(1.0 / sqrt(sq / E + eps));
    int h0 = (row % (H / G)) * G;
    for (int e = lane; e < E; e += 32) {
        size_t at = head_norm_at(row, e, H, T_, HS, G);
        int w = (h0 + e / HS) * HS + e % HS;
        act_store(out, at, (act_load(inp, at) - m) * s * weight[w] + (bias ? bias[w] : 0.0f));
    }
    if (lane == 0) {
        if (mean) mean[row] = m;
        rstd[row] = s;
    }
}

// ---- the residual add fused before the norm --------------------------------------------------------

__device__ __forceinline__ float4 add4(float4 x, float4 y) {
    return make_float4(__fadd_rn(x.x, y.x), __fadd_rn(x.y, y.y), __fadd_rn(x.z, y.z), __fadd_rn(x.w, y.w));
}

// The same op in any storage, element by element as add_bias_kernel, add_kernel (elementwise.cu) and
// then layernorm_forward_kernel or rmsnorm_forward_kernel compute it: each lane takes the columns those
// take (lane, lane + 32, ...), rounds b + b_bias and the sum to T, and sums the rounded row in double
// in their order, so the statistics and outputs are theirs bit for bit. sum, out, a, b: (N, C) of T.
template <typename T, bool RMS>
__global__ void add_norm_rows_kernel(T *sum, T *out, float *mean, float *rstd, const T *a, const T *b,
                                     const float *b_bias, const float *weight, const float *bias, int N, int C,
                                     float eps) {
    int row = blockIdx.x * NORM_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= N) return;
    size_t off = (size_t)row * C;
    const T *ar = a + off, *br = b + off;
    T *x = sum + off;
    double acc = 0.0;
    for (int c = lane; c < C; c += 32) {  // sum may alias a: each element is read before it is written
        float bc = act_load(br, c);
        if (b_bias) bc = act_round(br, __fadd_rn(bc, b_bias[c]));
        float z = act_round(br, __fadd_rn(act_load(ar, c), bc));
        act_store(x, c, z);
        acc += RMS ? (double)z * z : (double)z;
    }
    if (!out) return;
    acc = warp_sum(acc);
    float m = 0.0f, s;
    if (RMS) {
        s = (float)(1.0 / sqrt(acc / C + eps));
    } else {
        double mu = acc / C, sq = 0.0;
        for (int c = lane; c < C; c += 32) {
            double d = act_load(x, c) - mu;
            sq += d * d;
        }
        sq = warp_sum(sq);
        m = (float)mu, s = (float)(1.0 / sqrt(sq / C + eps));
    }
    T *o = out + off;
    for (int c = lane; c < C; c += 32) {
        if (RMS) act_store(o, c, act_load(x, c) * s * weight[c]);
        else act_store(o, c, (act_load(x, c) - m) * s * weight[c] + (bias ? bias[c] : 0.0f));
    }
    if (lane == 0) {
        if (!RMS) mean[row] = m;
        rstd[row] = s;
    }
}

// sum, out, a, b: (N, C) fp32 with C % 4 == 0 and 16-byte aligned rows; b_bias (C) or NULL; mean
// (LayerNorm only), rstd: (N). One warp per row in 16-byte loads: the first pass writes
// sum = a + (b + b_bias) and accumulates the row's sum (LayerNorm) or sum of squares (RMSNorm) in
// double; the row is read back (from L1) for the variance and the output, with the expressions of
// layernorm_forward_kernel and rmsnorm_forward_kernel. out NULL: the sum alone.
template <bool RMS>
__global__ void add_norm_forward_kernel(float *sum, float *out, float *mean, float *rstd, const float *a, const float *b,
                                        const float *b_bias, const float *weight, const float *bias, int N, int C,
                                        float eps) {
    int row = blockIdx.x * NORM_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31, C4 = C / 4;
    if (row >= N) return;
    size_t off = (size_t)row * C;
    const float4 *a4 = (const float4 *)(a + off), *b4 = (const float4 *)(b + off), *bb4 = (const float4 *)b_bias;
    float4 *s4 = (float4 *)(sum + off), *o4 = (float4 *)(out + off);
    const float4 *w4 = (const float4 *)weight, *bias4 = (const float4 *)bias;
    double acc = 0.0;
    for (int g = lane; g < C4; g += 32) {  // sum may alias a: each element is read before it is written
        float4 z = add4(a4[g], b_bias ? add4(b4[g], bb4[g]) : b4[g]);
        s4[g] = z;
        if (RMS) acc += (double)z.x * z.x + (double)z.y * z.y + (double)z.z * z.z + (double)z.w * z.w;
        else acc += (double)z.x + (double)z.y + (double)z.z + (double)z.w;
    }
    if (!out) return;
    acc = warp_sum(acc);
    float m = 0.0f, s;
    if (RMS) {
        s = (float)(1.0 / sqrt(acc / C + eps));
    } else {
        double mu = acc / C, sq = 0.0;
        for (int g = lane; g < C4; g += 32) {
            float4 z = s4[g];
            double d0 = z.x - mu, d1 = z.y - mu, d2 = z.z - mu, d3 = z.w - mu;
            sq += d0 * d0 + d1 * d1 + d2 * d2 + d3 * d3;
        }
        sq = warp_sum(sq);
        m = (float)mu, s = (float)(1.0 / sqrt(sq / C + eps));
    }
    for (int g = lane; g < C4; g += 32) {
        float4 z = s4[g], w = w4[g], bb = !RMS && bias ? bias4[g] : make_float4(0.0f, 0.0f, 0.0f, 0.0f), o;
        if (RMS) o = make_float4(z.x * s * w.x, z.y * s * w.y, z.z * s * w.z, z.w * s * w.w);
        else o = make_float4((z.x - m) * s * w.x + bb.x, (z.y - m) * s * w.y + bb.y, (z.z - m) * s * w.z + bb.z,
                             (z.w - m) * s * w.w + bb.w);
        o4[g] = o;
    }
    if (lane == 0) {
        if (!RMS) mean[row] = m;
        rstd[row] = s;
    }
}

// One thread per (h, d): rows in order, as the CPU sums them.
template <typename T>
__global__ void head_norm_params_kernel(float *dweight, float *dbias, const T *dout, const T *inp, const float *mean,
                                        const float *rstd, int B, int H, int T_, int HS, int G) {
    int hd = blockIdx.x * blockDim.x + threadIdx.x;
    if (hd >= H * HS) return;
    int h = hd / HS, d = hd % HS, groups = H / G;
    float sw = 0.0f, sb = 0.0f;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T_; t++) {
            size_t r = ((size_t)b * T_ + t) * groups + h / G, at = (((size_t)b * H + h) * T_ + t) * HS + d;
            float dy = act_load(dout, at);
            sw += dy * (act_load(inp, at) - (mean ? mean[r] : 0.0f)) * rstd[r];
            sb += dy;
        }
    dweight[hd] += sw;
    if (dbias) dbias[hd] += sb;
}

// Each lane writes only the elements it read, after the row's sums: dinp may be dout.
template <typename T>
__global__ void head_norm_backward_kernel(T *dinp, const T *dout, const T *inp, const float *weight, const float *mean,
                                          const float *rstd, int rows, int H, int T_, int HS, int G) {
    int row = blockIdx.x * NORM_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31, E = G * HS;
    if (row >= rows) return;
    float m = mean ? mean[row] : 0.0f, s = rstd[row];
    int h0 = (row % (H / G)) * G;
    double gsum = 0.0, gxsum = 0.0;
    for (int e = lane; e < E; e += 32) {
        size_t at = head_norm_at(row, e, H, T_, HS, G);
        float g = act_load(dout, at) * weight[(h0 + e / HS) * HS + e % HS];
        gsum += g;
        gxsum += g * (act_load(inp, at) - m) * s;
    }
    float gmean = mean ? (float)(warp_sum(gsum) / E) : 0.0f, gxmean = (float)(warp_sum(gxsum) / E);
    for (int e = lane; e < E; e += 32) {
        size_t at = head_norm_at(row, e, H, T_, HS, G);
        float w = weight[(h0 + e / HS) * HS + e % HS];
        act_store(dinp, at, s * (act_load(dout, at) * w - gmean - (act_load(inp, at) - m) * s * gxmean));
    }
}

extern "C" void neox_cuda_head_norm_forward(void *out, float *mean, float *rstd, const void *inp,
                                            const float *weight, const float *bias, int B, int H, int T, int HS,
                                            int G, float eps, neox_elem act) {
    int rows = B * T * (H / G);
    if (rows <= 0) return;
    ACT_DISPATCH(act, E, head_norm_forward_kernel<E><<<norm_blocks(rows), NORM_WARPS * 32, 0, neox_cuda_current_stream()>>>(
                             (E *)out, mean, rstd, (const E *)inp, weight, bias, rows, H, T, HS, G, eps));
    CUDA_LAUNCHED();
}

extern "C" void neox_cuda_head_norm_backward(void *dinp, float *dweight, float *dbias, const void *dout,
                                             const void *inp, const float *weight, const float *mean,
                                             const float *rstd, int B, int H, int T, int HS, int G, neox_elem act) {
    int rows = B * T * (H / G);
    if (rows <= 0) return;
    cudaStream_t st = neox_cuda_current_stream();
    ACT_DISPATCH(act, E, {
        head_norm_params_kernel<E><<<(H * HS + 127) / 128, 128, 0, st>>>(dweight, dbias, (const E *)dout,
                                                                         (const E *)inp, mean, rstd, B, H, T, HS, G);
        CUDA_LAUNCHED();
        head_norm_backward_kernel<E><<<norm_blocks(rows), NORM_WARPS * 32, 0, st>>>(
            (E *)dinp, (const E *)dout, (const E *)inp, weight, mean, rstd, rows, H, T, HS, G);
        CUDA_LAUNCHED();
    });
}

// Whether every row of every tensor can be read in 16-byte pieces.
static bool vec4_rows(int C, const void *const *ptrs, int n) {
    if (C % 4) return false;
    for (int i = 0; i < n; i++)
        if (ptrs[i] && (uintptr_t)ptrs[i] % 16) return false;
    return true;
}

// fp32 rows of 16-byte pieces take the vectorised kernel (its double sums group four elements per
// lane); every other case, bf16 storage included, the element-wise one, which normalises the sum as
// stored (rounded), as the unfused ops do.
template <bool RMS>
static void add_norm_forward(void *sum, void *out, float *mean, float *rstd, const void *a, const void *b,
                             const float *b_bias, const float *weight, const float *bias, int N, int C, float eps,
                             neox_elem act) {
    if (N <= 0) return;
    const void *ptrs[] = {sum, out, a, b, b_bias, weight, bias};
    cudaStream_t st = neox_cuda_current_stream();
    if (act == NEOX_ELEM_F32 && vec4_rows(C, ptrs, 7)) {
        add_norm_forward_kernel<RMS><<<norm_blocks(N), NORM_WARPS * 32, 0, st>>>(
            (float *)sum, (float *)out, mean, rstd, (const float *)a, (const float *)b, b_bias, weight, bias, N, C, eps);
    } else {
        ACT_DISPATCH(act, T, add_norm_rows_kernel<T, RMS><<<norm_blocks(N), NORM_WARPS * 32, 0, st>>>(
                                 (T *)sum, (T *)out, mean, rstd, (const T *)a, (const T *)b, b_bias, weight, bias, N,
                                 C, eps));
    }
    CUDA_LAUNCHED();
}

extern "C" void neox_cuda_add_layernorm_forward(void *sum, void *out, float *mean, float *rstd, const void *a,
                                                const void *b, const float *b_bias, const float *weight,
                                                const float *bias, int N, int C, float eps, neox_elem act) {
    add_norm_forward<false>(sum, out, mean, rstd, a, b, b_bias, weight, bias, N, C, eps, act);
}

extern "C" void neox_cuda_add_rmsnorm_forward(void *sum, void *out, float *rstd, const void *a, const void *b,
                                              const float *b_bias, const float *weight, int N, int C, float eps,
                                              neox_elem act) {
    add_norm_forward<true>(sum, out, NULL, rstd, a, b, b_bias, weight, NULL, N, C, eps, act);
}
