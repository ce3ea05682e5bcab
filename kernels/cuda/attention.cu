// attention.cu: exact causal attention, flash style, in fp32 on the CUDA cores: no (T, T) matrix
// ever exists. A block of ATT_WARPS warps takes ATT_WARPS consecutive rows (one per warp) and
// streams tiles of 32 keys/values through shared memory; in a tile, lane j scores key j, the warp
// keeps the online softmax (running max and sum, as kernels/cpu/attention.c), and lane d
// accumulates output dims d, d + 32, ... in registers (NU = ceil(HS / 32) of them, HS <= 256).
// Tiles are stored transposed with a row pitch of 33 floats, so that both "lane = key" reads
// (scores) and "lane = dim" reads (weighted sums) hit 32 different banks.
//
// Forward: also serves generation over a KV cache (rows at positions pos0 + i, keys strided by
// maxT). Backward, without atomics (deterministic): one kernel per query row gives dq and
// D = dout . out; a second, one warp per key row, walks every query head of its GQA group and the
// query tiles at or after the key, giving dk and dv. Probabilities are recomputed from the saved
// log-sum-exp; attention dropout uses the CPU's counter (neox_attention_dropout_row in kernels.h).
// With 16-bit operands the entry points hand over to cuDNN or the tensor-core kernels
// (attention_fa2.cu, or attention_mma.cu when asked for), as attention_cudnn.cu decides.
#include "kernels/cuda/attention.cuh"

enum { ATT_WARPS = 8, ATT_TILE = 32, ATT_PITCH = 33, ATT_MAX_NU = 8 };

// Loads rows [r0, r0 + 32) of a (rows, HS) matrix transposed into tile[d * 33 + r], zero past nrows.
__device__ __forceinline__ void load_tile(float *tile, const float *src, int r0, int nrows, int HS) {
    for (int e = threadIdx.x; e < ATT_TILE * HS; e += blockDim.x) {
        int r = e / HS, d = e % HS;
        tile[d * ATT_PITCH + r] = r0 + r < nrows ? src[(size_t)(r0 + r) * HS + d] : 0.0f;
    }
}

// Copies one HS-row into shared memory (one warp).
__device__ __forceinline__ void load_row(float *dst, const float *src, int HS, int lane) {
    for (int d = lane; d < HS; d += 32) dst[d] = src[d];
}

// Dot product of a shared row with column `col` of a transposed tile.
__device__ __forceinline__ float dot_column(const float *row, const float *tile, int col, int HS) {
    float s = 0.0f;
    for (int d = 0; d < HS; d++) s += row[d] * tile[d * ATT_PITCH + col];
    return s;
}

// acc[u] (dim lane + 32u) += sum over the tile's first n columns c of w_c * tile[dim][c], w_c
// being lane c's w.
template <int NU>
__device__ __forceinline__ void add_weighted_columns(float *acc, float w, const float *tile, int n, int HS, int lane) {
    for (int c = 0; c < n; c++) {
        float wc = __shfl_sync(0xffffffffu, w, c);
#pragma unroll
        for (int u = 0; u < NU; u++) {
            int d = lane + 32 * u;
            if (d < HS) acc[u] += wc * tile[d * ATT_PITCH + c];
        }
    }
}

// The same for two accumulators at once (dv and dk share the loop over the tile's query rows).
template <int NU>
__device__ __forceinline__ void add_weighted_columns2(float *acc1, float w1, const float *tile1, float *acc2, float w2,
                                                      const float *tile2, int n, int HS, int lane) {
    for (int c = 0; c < n; c++) {
        float w1c = __shfl_sync(0xffffffffu, w1, c), w2c = __shfl_sync(0xffffffffu, w2, c);
#pragma unroll
        for (int u = 0; u < NU; u++) {
            int d = lane + 32 * u;
            if (d < HS) {
                acc1[u] += w1c * tile1[d * ATT_PITCH + c];
                acc2[u] += w2c * tile2[d * ATT_PITCH + c];
            }
        }
    }
}

// The first key tile rows at positions from i_first on need: keys before the first row's window are
// seen by no row.
__device__ __forceinline__ int first_key_tile(int i_first, int window) {
    return window > 0 && i_first - window + 1 > 0 ? (i_first - window + 1) / ATT_TILE * ATT_TILE : 0;
}

struct att_shape {
    att_queries q;                         // the query rows per head and their positions
    int kv_stride, NH, NKV, HS;            // key rows per kv head
    int window;                            // keys a query sees, itself included (0: all earlier ones)
    float scale, dropout, keep_scale;
    unsigned long long seed, drop_row0;    // dropout: the counter's first row and heads (kernels.h)
    const unsigned long long *drop_row0_at;  // NULL, or a row on the device added to drop_row0 (a replayed step's)
    int drop_head0, drop_heads;
    const float *alibi;                    // (NH) slopes on the device, or NULL
};

// The first dropout counter row of head h of micro-batch row b (the CPU's).
__device__ __forceinline__ unsigned long long dropout_row(const att_shape &a, int b, int h) {
    return neox_attention_dropout_row(neox_attention_dropout_first_row(a.drop_row0, a.drop_row0_at), a.drop_head0,
                                      a.drop_heads, a.NH, b, h, a.q.n);
}

// Head h's ALiBi slope (0 without ALiBi).
__device__ __forceinline__ float slope_of(const att_shape &a, int h) { return a.alibi ? a.alibi[h] : 0.0f; }

// Grid (query blocks, NH, B); the heaviest (last) query blocks start first. q: (B, NH, Tq, HS);
// k, v: (B, NKV, kv_stride, HS); out: (B, Tq, NH, HS); lse: (B, NH, Tq) or NULL.
template <int NU>
__global__ void __launch_bounds__(ATT_WARPS * 32)
attention_forward_kernel(float *out, float *lse, const float *q, const float *k, const float *v, att_shape a) {
    extern __shared__ float smem[];
    int HS = a.HS, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *Ks = smem, *Vs = Ks + HS * ATT_PITCH, *Qr = Vs + HS * ATT_PITCH + warp * HS;
    int b = blockIdx.z, h = blockIdx.y, g = h / (a.NH / a.NKV);
    int i0 = (gridDim.x - 1 - blockIdx.x) * ATT_WARPS, i = i0 + warp;
    bool active = i < a.q.n;
    size_t head = (size_t)b * a.NH + h;
    const unsigned long long drow = dropout_row(a, b, h);  // dropout's counter row of (b, h, 0)
    const float *kh = k + ((size_t)b * a.NKV + g) * a.kv_stride * HS, *vh = v + ((size_t)b * a.NKV + g) * a.kv_stride * HS;
    if (active) load_row(Qr, q + (head * a.q.n + i) * HS, HS, lane);
    float o[NU], m = -INFINITY, sum = 0.0f;
#pragma unroll
    for (int u = 0; u < NU; u++) o[u] = 0.0f;
    int nkeys = query_pos(a.q, min(i0 + ATT_WARPS, a.q.n) - 1) + 1;  // keys seen by the block's last row, plus one
    int last = query_pos(a.q, i);                                    // this row's last visible key
    float slope = slope_of(a, h);
    for (int j0 = first_key_tile(query_pos(a.q, i0), a.window); j0 < nkeys; j0 += ATT_TILE) {
        __syncthreads();  // the previous tile is consumed (and Qr written)
        load_tile(Ks, kh, j0, nkeys, HS);
        load_tile(Vs, vh, j0, nkeys, HS);
        __syncthreads();
        if (!active) continue;
        int j = j0 + lane;
        bool visible = sees(last, j, a.window);
        float x = visible ? dot_column(Qr, Ks, lane, HS) * a.scale + slope * (float)(j - last) : -INFINITY;
        float m_new = fmaxf(m, warp_max(x));
        if (m_new == -INFINITY) continue;  // nothing visible yet (warp-uniform)
        float alpha = expf(m - m_new);     // rescales what was accumulated under the old max
        float p = visible ? expf(x - m_new) : 0.0f;
        sum = sum * alpha + warp_sum(p);
        m = m_new;
        if (a.dropout > 0.0f && visible)  // the sum is of the undropped probabilities
            p *= keep_factor(a.dropout, a.keep_scale, a.seed, drow + i, a.q.n, j);
#pragma unroll
        for (int u = 0; u < NU; u++) o[u] *= alpha;
        add_weighted_columns<NU>(o, p, Vs, min(ATT_TILE, nkeys - j0), HS, lane);
    }
    if (!active) return;
    float inv = 1.0f / sum;
    float *orow = out + (((size_t)b * a.q.n + i) * a.NH + h) * HS;
#pragma unroll
    for (int u = 0; u < NU; u++)
        if (lane + 32 * u < HS) orow[lane + 32 * u] = o[u] * inv;
    if (lse && lane == 0) lse[head * a.q.n + i] = m + logf(sum);
}

// dq (B, NH, Tq, HS) overwritten; D (B, NH, Tq) = dout . out. Grid as the forward's.
template <int NU>
__global__ void __launch_bounds__(ATT_WARPS * 32)
attention_dq_kernel(float *dq, float *D, const float *dout, const float *q, const float *k, const float *v,
                    const float *out, const float *lse, att_shape a) {
    extern __shared__ float smem[];
    int HS = a.HS, T = a.q.n, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *Ks = smem, *Vs = Ks + HS * ATT_PITCH, *Qr = Vs + HS * ATT_PITCH + warp * 2 * HS, *Dr = Qr + HS;
    int b = blockIdx.z, h = blockIdx.y, g = h / (a.NH / a.NKV);
    int i0 = (gridDim.x - 1 - blockIdx.x) * ATT_WARPS, i = i0 + warp;
    bool active = i < T;
    size_t head = (size_t)b * a.NH + h, orow = (((size_t)b * T + i) * a.NH + h) * HS;
    const unsigned long long drow = dropout_row(a, b, h);  // dropout's counter row of (b, h, 0)
    size_t kv = ((size_t)b * a.NKV + g) * a.kv_stride * HS;
    const float *kh = k + kv, *vh = v + kv;
    float Di = 0.0f, l = 0.0f, slope = slope_of(a, h);
    int last = query_pos(a.q, i);  // this row's last visible key
    if (active) {
        load_row(Qr, q + (head * T + i) * HS, HS, lane);
        load_row(Dr, dout + orow, HS, lane);
        float s = 0.0f;
        for (int d = lane; d < HS; d += 32) s += dout[orow + d] * out[orow + d];
        Di = warp_sum(s);
        l = lse[head * T + i];
        if (lane == 0) D[head * T + i] = Di;
    }
    float acc[NU];
#pragma unroll
    for (int u = 0; u < NU; u++) acc[u] = 0.0f;
    int nkeys = query_pos(a.q, min(i0 + ATT_WARPS, T) - 1) + 1;
    for (int j0 = first_key_tile(query_pos(a.q, i0), a.window); j0 < nkeys; j0 += ATT_TILE) {
        __syncthreads();
        load_tile(Ks, kh, j0, nkeys, HS);
        load_tile(Vs, vh, j0, nkeys, HS);
        __syncthreads();
        if (!active) continue;
        int j = j0 + lane;
        float ds = 0.0f;
        if (sees(last, j, a.window)) {
            float p = expf(dot_column(Qr, Ks, lane, HS) * a.scale + slope * (float)(j - last) - l);
            float dp = dot_column(Dr, Vs, lane, HS);
            if (a.dropout > 0.0f) dp *= keep_factor(a.dropout, a.keep_scale, a.seed, drow + i, T, j);
            ds = p * (dp - Di) * a.scale;
        }
        add_weighted_columns<NU>(acc, ds, Ks, min(ATT_TILE, nkeys - j0), HS, lane);
    }
    if (!active) return;
    float *dqr = dq + (head * T + i) * HS;
#pragma unroll
    for (int u = 0; u < NU; u++)
        if (lane + 32 * u < HS) dqr[lane + 32 * u] = acc[u];
}

// dk, dv (B, NKV, kv_stride, HS) overwritten. Grid (key blocks, NKV, B): warp w owns key row j and
// sums over the query heads of its group and the query rows at positions >= j.
template <int NU>
__global__ void __launch_bounds__(ATT_WARPS * 32)
attention_dkv_kernel(float *dk, float *dv, const float *dout, const float *q, const float *k, const float *v,
                     const float *lse, const float *D, att_shape a) {
    extern __shared__ float smem[];
    int HS = a.HS, T = a.q.n, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *Qs = smem, *Os = Qs + HS * ATT_PITCH, *Ls = Os + HS * ATT_PITCH, *Dt = Ls + ATT_TILE;
    float *Kr = Dt + ATT_TILE + warp * 2 * HS, *Vr = Kr + HS;
    int b = blockIdx.z, g = blockIdx.y, group = a.NH / a.NKV;
    int j_first = blockIdx.x * ATT_WARPS, j = j_first + warp;
    bool active = j < a.kv_stride;
    size_t kvrow = (((size_t)b * a.NKV + g) * a.kv_stride + j) * HS;
    if (active) {
        load_row(Kr, k + kvrow, HS, lane);
        load_row(Vr, v + kvrow, HS, lane);
    }
    float dka[NU], dva[NU];
#pragma unroll
    for (int u = 0; u < NU; u++) dka[u] = dva[u] = 0.0f;
    for (int h = g * group; h < (g + 1) * group; h++) {
        size_t head = (size_t)b * a.NH + h;
        const unsigned long long drow = dropout_row(a, b, h);  // dropout's counter row of (b, h, 0)
        const float *qh = q + head * T * HS;
        float slope = slope_of(a, h);
        // Queries before the block's first key, and after the window of its last, see none of its keys.
        int i_end = a.window > 0 ? rows_before(a.q, j_first + ATT_WARPS - 1 + a.window) : T;
        for (int i0 = rows_before(a.q, j_first) / ATT_TILE * ATT_TILE; i0 < i_end; i0 += ATT_TILE) {
            __syncthreads();
            load_tile(Qs, qh, i0, T, HS);
            // dout rows of head h are strided by NH * HS: (B, T, NH, HS).
            for (int e = threadIdx.x; e < ATT_TILE * HS; e += blockDim.x) {
                int r = e / HS, d = e % HS;
                Os[d * ATT_PITCH + r] = i0 + r < T ? dout[(((size_t)b * T + i0 + r) * a.NH + h) * HS + d] : 0.0f;
            }
            if (threadIdx.x < ATT_TILE) {
                int r = i0 + threadIdx.x;
                Ls[threadIdx.x] = r < T ? lse[head * T + r] : 0.0f;
                Dt[threadIdx.x] = r < T ? D[head * T + r] : 0.0f;
            }
            __syncthreads();
            if (!active) continue;
            int i = i0 + lane;
            float pk = 0.0f, ds = 0.0f;
            int pos = query_pos(a.q, i);
            if (i < T && sees(pos, j, a.window)) {
                float p = expf(dot_column(Kr, Qs, lane, HS) * a.scale + slope * (float)(j - pos) - Ls[lane]);
                float dp = dot_column(Vr, Os, lane, HS), kf = 1.0f;
                if (a.dropout > 0.0f) kf = keep_factor(a.dropout, a.keep_scale, a.seed, drow + i, T, j);
                pk = p * kf;
                ds = p * (dp * kf - Dt[lane]) * a.scale;
            }
            add_weighted_columns2<NU>(dva, pk, Os, dka, ds, Qs, min(ATT_TILE, T - i0), HS, lane);
        }
    }
    if (!active) return;
#pragma unroll
    for (int u = 0; u < NU; u++)
        if (lane + 32 * u < HS) {
            dk[kvrow + lane + 32 * u] = dka[u];
            dv[kvrow + lane + 32 * u] = dva[u];
        }
}

// ---- launch -------------------------------------------------------------------------------------

// Shared memory of each kernel: two transposed tiles plus per-warp rows (and, for dkv, 64 floats).
static size_t tiles_bytes(int HS, int rows_per_warp, int extra) {
    return ((size_t)2 * HS * ATT_PITCH + (size_t)ATT_WARPS * rows_per_warp * HS + extra) * sizeof(float);
}

// Raises the kernel's dynamic shared memory limit when it needs more than the default 48 KB.
template <typename K> static void allow_smem(K kernel, size_t bytes) {
    if (bytes > 48 * 1024) CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

static void check_head_size(int HS) {
    if (HS < 1 || HS > 32 * ATT_MAX_NU) {
        fprintf(stderr, "neox cuda: attention head size %d not supported (1..%d)\n", HS, 32 * ATT_MAX_NU);
        abort();
    }
}

template <int NU> static void forward_nu(float *out, float *lse, const float *q, const float *k, const float *v, int B,
                                         const att_shape &a) {
    size_t smem = tiles_bytes(a.HS, 1, 0);
    allow_smem(attention_forward_kernel<NU>, smem);
    dim3 grid((a.q.n + ATT_WARPS - 1) / ATT_WARPS, a.NH, B);
    attention_forward_kernel<NU><<<grid, ATT_WARPS * 32, smem, neox_cuda_current_stream()>>>(out, lse, q, k, v, a);
    CUDA_LAUNCHED();
}

template <int NU> static void backward_nu(float *dq, float *dk, float *dv, float *D, const float *dout, const float *q,
                                          const float *k, const float *v, const float *out, const float *lse, int B,
                                          const att_shape &a) {
    cudaStream_t st = neox_cuda_current_stream();
    size_t smem_q = tiles_bytes(a.HS, 2, 0), smem_kv = tiles_bytes(a.HS, 2, 2 * ATT_TILE);
    allow_smem(attention_dq_kernel<NU>, smem_q);
    allow_smem(attention_dkv_kernel<NU>, smem_kv);
    int blocks = (a.q.n + ATT_WARPS - 1) / ATT_WARPS;
    attention_dq_kernel<NU><<<dim3(blocks, a.NH, B), ATT_WARPS * 32, smem_q, st>>>(dq, D, dout, q, k, v, out, lse, a);
    CUDA_LAUNCHED();
    int key_blocks = (a.kv_stride + ATT_WARPS - 1) / ATT_WARPS;
    attention_dkv_kernel<NU><<<dim3(key_blocks, a.NKV, B), ATT_WARPS * 32, smem_kv, st>>>(dk, dv, dout, q, k, v, lse, D,
                                                                                          a);
    CUDA_LAUNCHED();
}

// Calls FN<NU>(args...) for NU = ceil(HS / 32), HS <= 256.
#define DISPATCH_NU(HS, FN, ...)                        \
    switch ((HS + 31) / 32) {                           \
    case 1: FN<1>(__VA_ARGS__); break;                  \
    case 2: FN<2>(__VA_ARGS__); break;                  \
    case 3: FN<3>(__VA_ARGS__); break;                  \
    case 4: FN<4>(__VA_ARGS__); break;                  \
    case 5: FN<5>(__VA_ARGS__); break;                  \
    case 6: FN<6>(__VA_ARGS__); break;                  \
    case 7: FN<7>(__VA_ARGS__); break;                  \
    default: FN<8>(__VA_ARGS__); break;                 \
    }

// Queries qr over keys strided by kv_stride rows.
static att_shape make_shape(att_queries qr, int kv_stride, int NH, int NKV, int HS, const neox_attention_opts &o) {
    float scale = o.scale, dropout = o.dropout;
    int window = o.window;
    unsigned long long seed = o.seed;
    att_shape a;
    a.alibi = o.alibi;
    a.window = window;
    a.q = qr;
    a.kv_stride = kv_stride;
    a.NH = NH;
    a.NKV = NKV;
    a.HS = HS;
    a.scale = scale;
    a.dropout = dropout;
    a.keep_scale = dropout > 0.0f ? 1.0f / (1.0f - dropout) : 1.0f;  // the CPU's keep factor
    a.seed = seed;
    a.drop_row0 = o.dropout_row0;
    a.drop_row0_at = o.dropout_row0_at;
    a.drop_head0 = o.dropout_head0;
    a.drop_heads = o.dropout_heads;
    return a;
}

static void forward_f32(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T, int NH,
                        int NKV, int HS, neox_attention_opts o) {
    if (o.operands != NEOX_ELEM_F32) {  // (cuDNN and the pipelined kernels have declined: the entry point)
        neox_cuda_attention_mma_forward(out, lse, q, k, v, B, T, NH, NKV, HS, o);
        return;
    }
    check_head_size(HS);
    if (B <= 0 || T <= 0) return;
    att_shape a = make_shape(att_queries_of(o, T), T, NH, NKV, HS, o);
    DISPATCH_NU(HS, forward_nu, out, lse, q, k, v, B, a);
}

extern "C" void neox_cuda_attention_cached(float *out, const float *q, const float *kcache, const float *vcache, int S,
                                           int pos0, int NH, int NKV, int HS, int maxT, neox_attention_opts o) {
    check_head_size(HS);
    if (S <= 0) return;
    o.dropout = 0.0f;  // the cached form has none (kernels.h)
    att_queries rows = {S, pos0, 0, 0};
    att_shape a = make_shape(rows, maxT, NH, NKV, HS, o);
    DISPATCH_NU(HS, forward_nu, out, (float *)NULL, q, kcache, vcache, 1, a);
}

static void backward_f32(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                         const float *v, const float *out, const float *lse, int B, int T, int NH, int NKV, int HS,
                         neox_attention_opts o) {
    if (o.operands != NEOX_ELEM_F32) {  // (cuDNN and the pipelined kernels have declined: the entry point)
        neox_cuda_attention_mma_backward(dq, dk, dv, dout, q, k, v, out, lse, B, T, NH, NKV, HS, o);
        return;
    }
    check_head_size(HS);
    if (B <= 0 || T <= 0) return;
    int Tq = neox_attention_query_rows(&o, T);
    float *D = (float *)neox_cuda_scratch((size_t)B * NH * Tq * sizeof(float));
    att_shape a = make_shape(att_queries_of(o, T), T, NH, NKV, HS, o);
    DISPATCH_NU(HS, backward_nu, dq, dk, dv, D, dout, q, k, v, out, lse, B, a);
}

// ---- bf16 activation storage (kernels.h, "Activation storage") ---------------------------------
// cuDNN (where it runs: bf16 operands, no dropout, no ALiBi) and the pipelined tensor-core kernels
// take the bf16 tensors as they are, with no pass before or after them. Otherwise (fp32 operands, or
// the first tensor-core kernels when asked for) the tensors are widened into fp32 copies, the fp32-stored
// attention runs on them (the tensor-core or the CUDA-core kernels) and the results are rounded once
// as they are stored, as the CPU's reference does. The copies live in a buffer of this file's own (the
// shared scratch is the attention kernels'), grown when needed. The widening and rounding passes are
// the own kernels' cost of bf16 storage until they read and write bf16 themselves.
static float *copies(size_t floats) {
    static float *buf;
    static size_t cap;
    if (floats > cap) {
        if (buf) neox_cuda_free(buf);  // (cudaFree waits for the kernels that used it)
        buf = (float *)neox_cuda_alloc(floats * sizeof(float));
        cap = floats;
    }
    return buf;
}

template <typename S> __global__ void widen_kernel(float *w, const S *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        w[i] = act_load(x, i);
}
template <typename S> __global__ void store_kernel(S *x, const float *w, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        act_store(x, i, w[i]);
}

static void widen(float *w, const void *x, size_t n, neox_elem act) {
    if (n == 0) return;
    ACT_DISPATCH(act, S,
                 widen_kernel<S><<<blocks_for(n, 256), 256, 0, neox_cuda_current_stream()>>>(w, (const S *)x, n));
    CUDA_LAUNCHED();
}
static void store(void *x, const float *w, size_t n, neox_elem act) {
    if (n == 0) return;
    ACT_DISPATCH(act, S, store_kernel<S><<<blocks_for(n, 256), 256, 0, neox_cuda_current_stream()>>>((S *)x, w, n));
    CUDA_LAUNCHED();
}

// ---- q, k, v through strided views (kernels.h's opts.views) ----------------------------------------
// cuDNN and the pipelined kernels read q, k, v where they are (the fused QKV buffer) when it is stored
// in the operand type, and write the gradients there. The CUDA-core fp32 kernels and the first
// tensor-core kernels address dense tensors only, and the others' copies into the operand type are
// dense: for those the views are first copied into dense scratch of this file's own (the split the
// model no longer makes, kept here for the kernels that cannot take strides) and the gradients are
// copied back into their views.
// (q has the query rows, k and v the T keys': context parallelism's differ.)
static bool dense_views(const neox_attention_opts &o, int T, int NH, int NKV, int HS) {
    return neox_head_strides_is_contiguous(o.views.q, NH, neox_attention_query_rows(&o, T), HS) &&
           neox_head_strides_is_contiguous(o.views.k, NKV, T, HS) &&
           neox_head_strides_is_contiguous(o.views.v, NKV, T, HS);
}

// Whether cuDNN and the pipelined kernels may be handed these views as they are.
static bool views_in_place(const neox_attention_opts &o, int T, int NH, int NKV, int HS, neox_elem act) {
    return dense_views(o, T, NH, NKV, HS) || act == o.operands;
}

// dst = src, both (B, H, T, HS) at their strides; one thread per element.
template <typename E>
__global__ void view_copy_kernel(E *dst, neox_head_strides ds, const E *src, neox_head_strides ss, int H, int T,
                                 int HS, size_t n) {
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t row = e / HS, bh = row / T, b = bh / H, h = bh % H, t = row % T, d = e % HS;
        dst[b * ds.batch + h * ds.head + t * ds.row + d] = src[b * ss.batch + h * ss.head + t * ss.row + d];
    }
}

static void view_copy(void *dst, neox_head_strides ds, const void *src, neox_head_strides ss, int B, int H, int T,
                      int HS, neox_elem act) {
    size_t n = (size_t)B * H * T * HS;
    if (n == 0) return;
    ds = neox_head_strides_of(ds, H, T, HS), ss = neox_head_strides_of(ss, H, T, HS);
    ACT_DISPATCH(act, E,
                 view_copy_kernel<E><<<blocks_for(n, 256), 256, 0, neox_cuda_current_stream()>>>((E *)dst, ds,
                                                                                                  (const E *)src, ss,
                                                                                                  H, T, HS, n));
    CUDA_LAUNCHED();
}

// The dense scratch the views are copied into (its own buffer: the calls below use the others).
static char *split_room(size_t bytes) {
    static char *buf;
    static size_t cap;
    if (bytes > cap) {
        if (buf) neox_cuda_free(buf);  // (cudaFree waits for the kernels that used it)
        buf = (char *)neox_cuda_alloc(bytes);
        cap = bytes;
    }
    return buf;
}

// Dense copies of q, k, v (and room for their gradients when grads) in split_room: p[0..2] the copies,
// p[3..5] the gradients' room.
static void split_views(char *p[6], const void *q, const void *k, const void *v, int B, int T, int NH, int NKV, int HS,
                        const neox_attention_opts &o, neox_elem act, bool grads) {
    int Tq = neox_attention_query_rows(&o, T);
    size_t es = neox_elem_size(act), nq = (size_t)B * NH * Tq * HS * es, nkv = (size_t)B * NKV * T * HS * es;
    size_t sizes[6] = {nq, nkv, nkv, nq, nkv, nkv}, at = 0;
    char *room = split_room((grads ? 2 : 1) * (nq + 2 * nkv));
    for (int i = 0; i < (grads ? 6 : 3); i++) p[i] = room + at, at += sizes[i];
    neox_head_strides dense = {0, 0, 0};
    view_copy(p[0], dense, q, o.views.q, B, NH, Tq, HS, act);
    view_copy(p[1], dense, k, o.views.k, B, NKV, T, HS, act);
    view_copy(p[2], dense, v, o.views.v, B, NKV, T, HS, act);
}

static neox_attention_opts dense_opts(neox_attention_opts o) {
    memset(&o.views, 0, sizeof o.views);
    return o;
}

extern "C" void neox_cuda_attention_forward(void *out, float *lse, const void *q, const void *k, const void *v, int B,
                                            int T, int NH, int NKV, int HS, neox_attention_opts o, neox_elem act) {
    // 16-bit operands: cuDNN where it runs, else the pipelined kernels (which read the stored tensors
    // as they are), unless the first tensor-core kernels were asked for (below, through fp32 copies).
    if (o.operands != NEOX_ELEM_F32 && views_in_place(o, T, NH, NKV, HS, act)) {
        if (neox_cuda_attention_cudnn_forward(out, lse, q, k, v, B, T, NH, NKV, HS, o, act)) return;
        if (neox_cuda_attention_pipelined() &&
            neox_cuda_attention_fa2_forward(out, lse, q, k, v, B, T, NH, NKV, HS, o, act))
            return;
    }
    if (!dense_views(o, T, NH, NKV, HS)) {
        char *p[6];
        split_views(p, q, k, v, B, T, NH, NKV, HS, o, act, false);
        neox_cuda_attention_forward(out, lse, p[0], p[1], p[2], B, T, NH, NKV, HS, dense_opts(o), act);
        return;
    }
    if (act == NEOX_ELEM_F32) {
        forward_f32((float *)out, lse, (const float *)q, (const float *)k, (const float *)v, B, T, NH, NKV, HS, o);
        return;
    }
    size_t nq = (size_t)B * NH * neox_attention_query_rows(&o, T) * HS, nkv = (size_t)B * NKV * T * HS;
    float *qw = copies(2 * nq + 2 * nkv), *kw = qw + nq, *vw = kw + nkv, *ow = vw + nkv;
    widen(qw, q, nq, act), widen(kw, k, nkv, act), widen(vw, v, nkv, act);
    forward_f32(ow, lse, qw, kw, vw, B, T, NH, NKV, HS, o);
    store(out, ow, nq, act);
}

extern "C" void neox_cuda_attention_backward(void *dq, void *dk, void *dv, const void *dout, const void *q,
                                             const void *k, const void *v, const void *out, const float *lse, int B,
                                             int T, int NH, int NKV, int HS, neox_attention_opts o, neox_elem act) {
    if (o.operands != NEOX_ELEM_F32 && views_in_place(o, T, NH, NKV, HS, act)) {  // as the forward
        if (neox_cuda_attention_cudnn_backward(dq, dk, dv, dout, q, k, v, out, lse, B, T, NH, NKV, HS, o, act)) return;
        if (neox_cuda_attention_pipelined() &&
            neox_cuda_attention_fa2_backward(dq, dk, dv, dout, q, k, v, out, lse, B, T, NH, NKV, HS, o, act))
            return;
    }
    if (!dense_views(o, T, NH, NKV, HS)) {  // the gradients made dense, then written whole into their views
        char *p[6];
        neox_head_strides dense = {0, 0, 0};
        split_views(p, q, k, v, B, T, NH, NKV, HS, o, act, true);
        neox_cuda_attention_backward(p[3], p[4], p[5], dout, p[0], p[1], p[2], out, lse, B, T, NH, NKV, HS,
                                     dense_opts(o), act);
        view_copy(dq, o.views.q, p[3], dense, B, NH, neox_attention_query_rows(&o, T), HS, act);
        view_copy(dk, o.views.k, p[4], dense, B, NKV, T, HS, act);
        view_copy(dv, o.views.v, p[5], dense, B, NKV, T, HS, act);
        return;
    }
    if (act == NEOX_ELEM_F32) {
        backward_f32((float *)dq, (float *)dk, (float *)dv, (const float *)dout, (const float *)q, (const float *)k,
                     (const float *)v, (const float *)out, lse, B, T, NH, NKV, HS, o);
        return;
    }
    size_t nq = (size_t)B * NH * neox_attention_query_rows(&o, T) * HS, nkv = (size_t)B * NKV * T * HS;
    float *qw = copies(4 * nq + 4 * nkv), *kw = qw + nq, *vw = kw + nkv, *dw = vw + nkv, *ow = dw + nq;
    float *dqw = ow + nq, *dkw = dqw + nq, *dvw = dkw + nkv;
    widen(qw, q, nq, act), widen(kw, k, nkv, act), widen(vw, v, nkv, act);
    widen(dw, dout, nq, act), widen(ow, out, nq, act);
    backward_f32(dqw, dkw, dvw, dw, qw, kw, vw, ow, lse, B, T, NH, NKV, HS, o);
    store(dq, dqw, nq, act), store(dk, dkw, nkv, act), store(dv, dvw, nkv, act);
}
