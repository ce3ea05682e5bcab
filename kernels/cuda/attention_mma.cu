// attention_mma.cu: exact causal attention on the tensor cores, flash-attention-2 style, with bf16 or
// fp16 operands (mma.sync m16n8k16, fp32 accumulators, sm_80 and later). Shapes and rounding points
// are neox_attention_forward/backward's (kernels.h); kernels/cpu/attention.c with the same operand
// type is the reference it is checked against (tests/gpu/op_parity.c).
//
// A block of 4 warps owns 64 rows (queries in the forward and the dq pass, keys in the dk/dv pass);
// each warp owns 16 of them and streams tiles of 64 columns (keys, or queries) through shared
// memory, where the tiles sit row-major in the operand type with a row pitch of HS + 8 elements
// (16 bytes of padding keep the fragment loads of a warp on 32 different banks). The fp32 inputs
// are rounded as they are loaded; scores, the online softmax (in base 2: exp2 of scale * log2(e)
// times the score), probabilities and gradients stay in fp32 registers, and a probability or score
// gradient tile is rounded only where it becomes the A operand of the next product (an
// accumulator fragment of m16n8 is laid out as the A fragment of m16k16 needs, so it never leaves
// the registers). The backward, as attention.cu's, has no atomics: one pass gives dq (and
// D = dout . out), a second, one block per 64 keys of one key/value head, walks the query heads of
// its GQA group and the query tiles that see its keys, giving dk and dv.
//
// Fragments: as attention_mma.cuh lays them out.
#include "kernels/cuda/attention_mma.cuh"

enum { MMA_ROWS = 64, MMA_WARPS = 4, MMA_COLS = 64 };

// ---- tiles and fragments ------------------------------------------------------------------------------

template <int HS> struct tile_dims { static const int pitch = HS + 8; };  // elements per shared row

// Rows [r0, r0 + 64) of a (rows, HS) fp32 matrix whose rows are `stride` floats apart, rounded into
// tile[64][HS + 8]; rows at or past nrows are zero (masked products then add 0, never 0 * NaN).
template <class Ops, int HS>
__device__ __forceinline__ void load_tile(typename Ops::elem *tile, const float *src, size_t stride, int r0,
                                          int nrows) {
    const int pairs = HS / 2, pitch = tile_dims<HS>::pitch;
    for (int e = threadIdx.x; e < MMA_COLS * pairs; e += MMA_WARPS * 32) {
        int r = e / pairs, d = (e % pairs) * 2;
        float2 x = r0 + r < nrows ? *reinterpret_cast<const float2 *>(src + (size_t)(r0 + r) * stride + d)
                                  : make_float2(0.0f, 0.0f);
        *reinterpret_cast<uint32_t *>(tile + r * pitch + d) = Ops::pack(x.x, x.y);
    }
}

template <class E> __device__ __forceinline__ uint32_t word(const E *p) { return *reinterpret_cast<const uint32_t *>(p); }
template <class E> __device__ __forceinline__ uint32_t pair16(const E *lo, const E *hi) {
    uint16_t l = *reinterpret_cast<const uint16_t *>(lo), h = *reinterpret_cast<const uint16_t *>(hi);
    return (uint32_t)l | (uint32_t)h << 16;
}

// A fragment of rows r0.., columns k0.. of a row-major shared tile.
template <class E, int HS>
__device__ __forceinline__ void a_frag(uint32_t *a, const E *X, int r0, int k0, int g, int t) {
    const int P = tile_dims<HS>::pitch;
    a[0] = word(X + (r0 + g) * P + k0 + 2 * t);
    a[1] = word(X + (r0 + g + 8) * P + k0 + 2 * t);
    a[2] = word(X + (r0 + g) * P + k0 + 2 * t + 8);
    a[3] = word(X + (r0 + g + 8) * P + k0 + 2 * t + 8);
}

// B fragment (k0.., n0..) of B = X^T, X a row-major shared tile indexed [n][k] (keys by dims, for q k^T).
template <class E, int HS>
__device__ __forceinline__ void b_frag_t(uint32_t &b0, uint32_t &b1, const E *X, int k0, int n0, int g, int t) {
    const int P = tile_dims<HS>::pitch;
    b0 = word(X + (n0 + g) * P + k0 + 2 * t);
    b1 = word(X + (n0 + g) * P + k0 + 2 * t + 8);
}

// B fragment (k0.., n0..) of B = X itself, indexed [k][n] (keys by dims, for p v).
template <class E, int HS>
__device__ __forceinline__ void b_frag(uint32_t &b0, uint32_t &b1, const E *X, int k0, int n0, int g, int t) {
    const int P = tile_dims<HS>::pitch;
    const E *c = X + n0 + g;
    b0 = pair16(c + (k0 + 2 * t) * P, c + (k0 + 2 * t + 1) * P);
    b1 = pair16(c + (k0 + 2 * t + 8) * P, c + (k0 + 2 * t + 9) * P);
}

// A fragments of a warp's 16 rows (r0..) of a (rows, HS) fp32 matrix in global memory, rounded:
// frag[kk] covers columns 16 kk.. (rows at or past nrows are zero).
template <class Ops, int HS>
__device__ __forceinline__ void a_frags_global(uint32_t (*frag)[4], const float *src, size_t stride, int r0, int nrows,
                                               int g, int t) {
    const float *row_lo = src + (size_t)(r0 + g) * stride, *row_hi = src + (size_t)(r0 + g + 8) * stride;
    bool lo = r0 + g < nrows, hi = r0 + g + 8 < nrows;
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) {
        int c = kk * 16 + 2 * t;
        float2 x0 = lo ? *reinterpret_cast<const float2 *>(row_lo + c) : make_float2(0, 0);
        float2 x1 = hi ? *reinterpret_cast<const float2 *>(row_hi + c) : make_float2(0, 0);
        float2 x2 = lo ? *reinterpret_cast<const float2 *>(row_lo + c + 8) : make_float2(0, 0);
        float2 x3 = hi ? *reinterpret_cast<const float2 *>(row_hi + c + 8) : make_float2(0, 0);
        frag[kk][0] = Ops::pack(x0.x, x0.y);
        frag[kk][1] = Ops::pack(x1.x, x1.y);
        frag[kk][2] = Ops::pack(x2.x, x2.y);
        frag[kk][3] = Ops::pack(x3.x, x3.y);
    }
}

// The first 64-key tile a query tile starting at i0 needs (attention.c's first_key_block).
__device__ __forceinline__ int first_key_tile64(int i0, int window) {
    return window > 0 && i0 - window + 1 > 0 ? (i0 - window + 1) / MMA_COLS * MMA_COLS : 0;
}

// S (16 x 64 per warp) = A rows x B^T where the A fragments are given per k-step and B is a
// row-major shared tile of 64 rows: acc[n][.] for columns 8 n...
template <class Ops, int HS>
__device__ __forceinline__ void scores(float (*acc)[4], const uint32_t (*afr)[4], const typename Ops::elem *Bt, int g,
                                       int t) {
#pragma unroll
    for (int n = 0; n < MMA_COLS / 8; n++) {
        acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HS / 16; kk++) {
            uint32_t b0, b1;
            b_frag_t<typename Ops::elem, HS>(b0, b1, Bt, kk * 16, n * 8, g, t);
            Ops::mma(acc[n], afr[kk], b0, b1);
        }
    }
}

// out (16 x HS per warp) += P (16 x 64, accumulator fragments, rounded here) x X (64 x HS shared).
template <class Ops, int HS>
__device__ __forceinline__ void weighted_rows(float (*out)[4], const float (*p)[4], const typename Ops::elem *X, int g,
                                              int t) {
#pragma unroll
    for (int s = 0; s < MMA_COLS / 16; s++) {
        uint32_t a[4];
        a_from_acc<Ops>(a, p, s);
#pragma unroll
        for (int n = 0; n < HS / 8; n++) {
            uint32_t b0, b1;
            b_frag<typename Ops::elem, HS>(b0, b1, X, s * 16, n * 8, g, t);
            Ops::mma(out[n], a, b0, b1);
        }
    }
}

// ---- forward --------------------------------------------------------------------------------------

// Grid (query tiles, NH, B), the heaviest (last) query tiles first. q: (B, NH, Tq, HS); k, v:
// (B, NKV, T, HS); out: (B, Tq, NH, HS); lse: (B, NH, Tq).
template <class Ops, int HS>
__global__ void __launch_bounds__(MMA_WARPS * 32)
attention_mma_forward_kernel(float *out, float *lse, const float *q, const float *k, const float *v, mma_shape a) {
    typedef typename Ops::elem E;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    E *Ks = reinterpret_cast<E *>(smem_raw), *Vs = Ks + MMA_COLS * tile_dims<HS>::pitch;
    const int T = a.T, Tq = a.q.n, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int b = blockIdx.z, h = blockIdx.y, kvh = h / (a.NH / a.NKV);
    const int i0 = (gridDim.x - 1 - blockIdx.x) * MMA_ROWS, r0 = i0 + warp * 16;
    const size_t head = (size_t)b * a.NH + h;
    const unsigned long long drow = dropout_row(a, b, h);  // dropout's counter row of (b, h, 0)
    const float *kh = k + ((size_t)b * a.NKV + kvh) * T * HS, *vh = v + ((size_t)b * a.NKV + kvh) * T * HS;
    const float sl2 = a.scale * LOG2E, slope2 = slope2_of(a, h);

    uint32_t qf[HS / 16][4];
    a_frags_global<Ops, HS>(qf, q + head * Tq * HS, HS, r0, Tq, g, t);
    float o[HS / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < HS / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    const int row[2] = {r0 + g, r0 + g + 8}, pos[2] = {query_pos(a.q, row[0]), query_pos(a.q, row[1])};
    const int kend = query_pos(a.q, min(i0 + MMA_ROWS, Tq) - 1) + 1;  // keys seen by the tile's last row, plus one

    for (int j0 = first_key_tile64(query_pos(a.q, i0), a.window); j0 < kend; j0 += MMA_COLS) {
        __syncthreads();  // the previous tile is consumed
        load_tile<Ops, HS>(Ks, kh, HS, j0, T);
        load_tile<Ops, HS>(Vs, vh, HS, j0, T);
        __syncthreads();
        float s[MMA_COLS / 8][4];
        scores<Ops, HS>(s, qf, Ks, g, t);
        float alpha[2];
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {  // the thread's rows g (hr 0) and g + 8 (hr 1)
            float mx = -INFINITY;
#pragma unroll
            for (int n = 0; n < MMA_COLS / 8; n++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    int j = j0 + n * 8 + 2 * t + c;
                    float x = row[hr] < Tq && sees(pos[hr], j, a.window)
                                  ? s[n][2 * hr + c] * sl2 + slope2 * (float)(j - pos[hr])
                                  : -INFINITY;
                    s[n][2 * hr + c] = x;
                    mx = fmaxf(mx, x);
                }
            float m_new = fmaxf(m[hr], quad_max(mx));
            // Nothing visible to this row yet (before its window, or a row past Tq): no weight.
            alpha[hr] = m_new == -INFINITY ? 1.0f : exp2f(m[hr] - m_new);
            float rs = 0.0f;
#pragma unroll
            for (int n = 0; n < MMA_COLS / 8; n++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    float p = m_new == -INFINITY ? 0.0f : exp2f(s[n][2 * hr + c] - m_new);
                    rs += p;  // the sum is of the undropped, unrounded probabilities
                    if (a.dropout > 0.0f && p != 0.0f)
                        p *= keep_factor(a.dropout, a.keep_scale, a.seed, drow + row[hr], T, j0 + n * 8 + 2 * t + c);
                    s[n][2 * hr + c] = p;
                }
            l[hr] = l[hr] * alpha[hr] + rs;  // a partial sum: this thread's columns only
            m[hr] = m_new;
        }
#pragma unroll
        for (int n = 0; n < HS / 8; n++) {
            o[n][0] *= alpha[0], o[n][1] *= alpha[0];
            o[n][2] *= alpha[1], o[n][3] *= alpha[1];
        }
        weighted_rows<Ops, HS>(o, s, Vs, g, t);
    }
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        float sum = quad_sum(l[hr]);
        if (row[hr] >= Tq) continue;
        float inv = 1.0f / sum;
        float *orow = out + (((size_t)b * Tq + row[hr]) * a.NH + h) * HS;
#pragma unroll
        for (int n = 0; n < HS / 8; n++)
            *reinterpret_cast<float2 *>(orow + n * 8 + 2 * t) = make_float2(o[n][2 * hr] * inv, o[n][2 * hr + 1] * inv);
        if (t == 0) lse[head * Tq + row[hr]] = m[hr] * LN2 + logf(sum);
    }
}

// ---- backward: dq ---------------------------------------------------------------------------------

// dq (B, NH, Tq, HS) overwritten; D (B, NH, Tq) = dout . out (fp32, unrounded). Grid as the forward's.
template <class Ops, int HS>
__global__ void __launch_bounds__(MMA_WARPS * 32)
attention_mma_dq_kernel(float *dq, float *D, const float *dout, const float *q, const float *k, const float *v,
                        const float *out, const float *lse, mma_shape a) {
    typedef typename Ops::elem E;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    E *Ks = reinterpret_cast<E *>(smem_raw), *Vs = Ks + MMA_COLS * tile_dims<HS>::pitch;
    const int T = a.T, Tq = a.q.n, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int b = blockIdx.z, h = blockIdx.y, kvh = h / (a.NH / a.NKV);
    const int i0 = (gridDim.x - 1 - blockIdx.x) * MMA_ROWS, r0 = i0 + warp * 16;
    const size_t head = (size_t)b * a.NH + h, ostride = (size_t)a.NH * HS;
    const unsigned long long drow = dropout_row(a, b, h);  // dropout's counter row of (b, h, 0)
    const float *kh = k + ((size_t)b * a.NKV + kvh) * T * HS, *vh = v + ((size_t)b * a.NKV + kvh) * T * HS;
    const float *dout_h = dout + ((size_t)b * Tq * a.NH + h) * HS, *out_h = out + ((size_t)b * Tq * a.NH + h) * HS;
    const float sl2 = a.scale * LOG2E, slope2 = slope2_of(a, h);
    const int row[2] = {r0 + g, r0 + g + 8}, pos[2] = {query_pos(a.q, row[0]), query_pos(a.q, row[1])};

    // D and the log-sum-exp (in base-2 units of the scaled score) of the thread's two rows.
    float Dr[2], L[2];
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        float sum = 0.0f;
        if (row[hr] < Tq) {
            const float *x = dout_h + (size_t)row[hr] * ostride, *y = out_h + (size_t)row[hr] * ostride;
            for (int d = t; d < HS; d += 4) sum += x[d] * y[d];
        }
        Dr[hr] = quad_sum(sum);
        L[hr] = row[hr] < Tq ? lse[head * Tq + row[hr]] * LOG2E : 0.0f;
        if (row[hr] < Tq && t == 0) D[head * Tq + row[hr]] = Dr[hr];
    }
    uint32_t qf[HS / 16][4], df[HS / 16][4];
    a_frags_global<Ops, HS>(qf, q + head * Tq * HS, HS, r0, Tq, g, t);
    a_frags_global<Ops, HS>(df, dout_h, ostride, r0, Tq, g, t);
    float acc[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    const int kend = query_pos(a.q, min(i0 + MMA_ROWS, Tq) - 1) + 1;

    for (int j0 = first_key_tile64(query_pos(a.q, i0), a.window); j0 < kend; j0 += MMA_COLS) {
        __syncthreads();
        load_tile<Ops, HS>(Ks, kh, HS, j0, T);
        load_tile<Ops, HS>(Vs, vh, HS, j0, T);
        __syncthreads();
        float s[MMA_COLS / 8][4], dp[MMA_COLS / 8][4];
        scores<Ops, HS>(s, qf, Ks, g, t);   // q k^T
        scores<Ops, HS>(dp, df, Vs, g, t);  // dout v^T
#pragma unroll
        for (int n = 0; n < MMA_COLS / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int hr = e >> 1, j = j0 + n * 8 + 2 * t + (e & 1);
                float ds = 0.0f;
                if (row[hr] < Tq && sees(pos[hr], j, a.window)) {
                    float p = exp2f(s[n][e] * sl2 + slope2 * (float)(j - pos[hr]) - L[hr]), d = dp[n][e];
                    if (a.dropout > 0.0f) d *= keep_factor(a.dropout, a.keep_scale, a.seed, drow + row[hr], T, j);
                    ds = p * (d - Dr[hr]) * a.scale;
                }
                s[n][e] = ds;
            }
        weighted_rows<Ops, HS>(acc, s, Ks, g, t);  // dq += dS k
    }
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        if (row[hr] >= Tq) continue;
        float *dst = dq + (head * Tq + row[hr]) * HS;
#pragma unroll
        for (int n = 0; n < HS / 8; n++)
            *reinterpret_cast<float2 *>(dst + n * 8 + 2 * t) = make_float2(acc[n][2 * hr], acc[n][2 * hr + 1]);
    }
}

// ---- backward: dk, dv -----------------------------------------------------------------------------

// dk, dv (B, NKV, T, HS) overwritten. Grid (key tiles, NKV, B): warp w owns keys j0 + 16 w.. and sums
// over the query heads of its group and the query tiles that see them (q, dout, lse and D with Tq
// rows), in transposed form:
// S^T = k q^T, dP^T = v dout^T, dv += (P^T * K) dout, dk += dS^T q.
template <class Ops, int HS>
__global__ void __launch_bounds__(MMA_WARPS * 32)
attention_mma_dkv_kernel(float *dk, float *dv, const float *dout, const float *q, const float *k, const float *v,
                         const float *lse, const float *D, mma_shape a) {
    typedef typename Ops::elem E;
    const int P = tile_dims<HS>::pitch;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    E *Ks = reinterpret_cast<E *>(smem_raw), *Vs = Ks + MMA_ROWS * P, *Qs = Vs + MMA_ROWS * P, *Os = Qs + MMA_COLS * P;
    float *Ls = reinterpret_cast<float *>(Os + MMA_COLS * P), *Ds = Ls + MMA_COLS;
    const int T = a.T, Tq = a.q.n, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int b = blockIdx.z, kvh = blockIdx.y, group = a.NH / a.NKV;
    const int j0 = blockIdx.x * MMA_ROWS, r0 = warp * 16;  // r0: the warp's rows in Ks, Vs
    const size_t kv = ((size_t)b * a.NKV + kvh) * T * HS, ostride = (size_t)a.NH * HS;
    const float sl2 = a.scale * LOG2E;
    const int key[2] = {j0 + r0 + g, j0 + r0 + g + 8};

    load_tile<Ops, HS>(Ks, k + kv, HS, j0, T);
    load_tile<Ops, HS>(Vs, v + kv, HS, j0, T);
    float dka[HS / 8][4], dva[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dka[n][e] = dva[n][e] = 0.0f;
    // Queries before the tile's first key, and after the window of its last, see none of its keys.
    const int i_first = rows_before(a.q, j0), i_end = a.window > 0 ? rows_before(a.q, j0 + MMA_ROWS - 1 + a.window) : Tq;

    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
        const size_t head = (size_t)b * a.NH + h;
        const unsigned long long drow = dropout_row(a, b, h);  // dropout's counter row of (b, h, 0)
        const float *dout_h = dout + ((size_t)b * Tq * a.NH + h) * HS, slope2 = slope2_of(a, h);
        for (int i0 = i_first; i0 < i_end; i0 += MMA_COLS) {
            __syncthreads();  // the previous query tile is consumed (and Ks, Vs written)
            load_tile<Ops, HS>(Qs, q + head * Tq * HS, HS, i0, Tq);
            load_tile<Ops, HS>(Os, dout_h, ostride, i0, Tq);
            if (threadIdx.x < MMA_COLS) {
                int i = i0 + threadIdx.x;
                Ls[threadIdx.x] = i < Tq ? lse[head * Tq + i] * LOG2E : 0.0f;
                Ds[threadIdx.x] = i < Tq ? D[head * Tq + i] : 0.0f;
            }
            __syncthreads();
            uint32_t kfrag[HS / 16][4], vf[HS / 16][4];
#pragma unroll
            for (int kk = 0; kk < HS / 16; kk++) {
                a_frag<E, HS>(kfrag[kk], Ks, r0, kk * 16, g, t);
                a_frag<E, HS>(vf[kk], Vs, r0, kk * 16, g, t);
            }
            float st[MMA_COLS / 8][4], dpt[MMA_COLS / 8][4];
            scores<Ops, HS>(st, kfrag, Qs, g, t);   // k q^T
            scores<Ops, HS>(dpt, vf, Os, g, t);   // v dout^T
#pragma unroll
            for (int n = 0; n < MMA_COLS / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int c = n * 8 + 2 * t + (e & 1), i = i0 + c, j = key[e >> 1];
                    float pk = 0.0f, ds = 0.0f;
                    int pos = query_pos(a.q, i);
                    if (i < Tq && j < T && sees(pos, j, a.window)) {
                        float p = exp2f(st[n][e] * sl2 + slope2 * (float)(j - pos) - Ls[c]), kf = 1.0f;
                        if (a.dropout > 0.0f) kf = keep_factor(a.dropout, a.keep_scale, a.seed, drow + i, T, j);
                        pk = p * kf;
                        ds = p * (dpt[n][e] * kf - Ds[c]) * a.scale;
                    }
                    st[n][e] = pk;
                    dpt[n][e] = ds;
                }
            weighted_rows<Ops, HS>(dva, st, Os, g, t);   // dv += (P^T * K) dout
            weighted_rows<Ops, HS>(dka, dpt, Qs, g, t);  // dk += dS^T q
        }
    }
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        if (key[hr] >= T) continue;
        float *dkr = dk + kv + (size_t)key[hr] * HS, *dvr = dv + kv + (size_t)key[hr] * HS;
#pragma unroll
        for (int n = 0; n < HS / 8; n++) {
            *reinterpret_cast<float2 *>(dkr + n * 8 + 2 * t) = make_float2(dka[n][2 * hr], dka[n][2 * hr + 1]);
            *reinterpret_cast<float2 *>(dvr + n * 8 + 2 * t) = make_float2(dva[n][2 * hr], dva[n][2 * hr + 1]);
        }
    }
}

// ---- launch -----------------------------------------------------------------------------------------

template <typename K> static void allow_smem(K kernel, size_t bytes) {
    if (bytes > 48 * 1024) CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

template <int HS> static size_t tiles_bytes(int ntiles, int nfloats) {
    return (size_t)ntiles * MMA_COLS * tile_dims<HS>::pitch * 2 + (size_t)nfloats * sizeof(float);
}

template <class Ops, int HS>
static void forward_hs(float *out, float *lse, const float *q, const float *k, const float *v, int B,
                       const mma_shape &a) {
    size_t smem = tiles_bytes<HS>(2, 0);
    allow_smem(attention_mma_forward_kernel<Ops, HS>, smem);
    dim3 grid((a.q.n + MMA_ROWS - 1) / MMA_ROWS, a.NH, B);
    attention_mma_forward_kernel<Ops, HS><<<grid, MMA_WARPS * 32, smem, neox_cuda_current_stream()>>>(out, lse, q, k, v,
                                                                                                      a);
    CUDA_LAUNCHED();
}

template <class Ops, int HS>
static void backward_hs(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                        const float *v, const float *out, const float *lse, int B, const mma_shape &a) {
    cudaStream_t st = neox_cuda_current_stream();
    float *D = (float *)neox_cuda_scratch((size_t)B * a.NH * a.q.n * sizeof(float));
    size_t smem_q = tiles_bytes<HS>(2, 0), smem_kv = tiles_bytes<HS>(4, 2 * MMA_COLS);
    allow_smem(attention_mma_dq_kernel<Ops, HS>, smem_q);
    allow_smem(attention_mma_dkv_kernel<Ops, HS>, smem_kv);
    int tiles = (a.q.n + MMA_ROWS - 1) / MMA_ROWS, key_tiles = (a.T + MMA_ROWS - 1) / MMA_ROWS;
    attention_mma_dq_kernel<Ops, HS><<<dim3(tiles, a.NH, B), MMA_WARPS * 32, smem_q, st>>>(dq, D, dout, q, k, v, out,
                                                                                           lse, a);
    CUDA_LAUNCHED();
    attention_mma_dkv_kernel<Ops, HS><<<dim3(key_tiles, a.NKV, B), MMA_WARPS * 32, smem_kv, st>>>(dk, dv, dout, q, k, v,
                                                                                              lse, D, a);
    CUDA_LAUNCHED();
}

// Calls FN<Ops, HS>(args...) for the operand type and head size (a multiple of 16 up to 128).
#define DISPATCH_MMA(E, HS, FN, ...)                                                                   \
    do {                                                                                               \
        if ((E) == NEOX_ELEM_BF16) DISPATCH_MMA_HS(bf16_ops, HS, FN, __VA_ARGS__);                     \
        else DISPATCH_MMA_HS(f16_ops, HS, FN, __VA_ARGS__);                                            \
    } while (0)
#define DISPATCH_MMA_HS(OPS, HS, FN, ...)              \
    do {                                               \
        switch (HS) {                                  \
        case 16: FN<OPS, 16>(__VA_ARGS__); break;      \
        case 32: FN<OPS, 32>(__VA_ARGS__); break;      \
        case 48: FN<OPS, 48>(__VA_ARGS__); break;      \
        case 64: FN<OPS, 64>(__VA_ARGS__); break;      \
        case 80: FN<OPS, 80>(__VA_ARGS__); break;      \
        case 96: FN<OPS, 96>(__VA_ARGS__); break;      \
        case 112: FN<OPS, 112>(__VA_ARGS__); break;    \
        default: FN<OPS, 128>(__VA_ARGS__); break;     \
        }                                              \
    } while (0)

// A caller that asks for 16-bit operands at a head size neox_attention_operands would not give is a bug.
static void check_operands(neox_elem e, int HS) {
    if (neox_attention_operands(e, HS) != e || e == NEOX_ELEM_F32) {
        fprintf(stderr, "neox cuda: tensor-core attention takes bf16/fp16 operands and head sizes 16, 32, ..., 128 "
                        "(got operand type %d, head size %d)\n", (int)e, HS);
        abort();
    }
}

void neox_cuda_attention_mma_forward(float *out, float *lse, const float *q, const float *k, const float *v, int B,
                                     int T, int NH, int NKV, int HS, neox_attention_opts o) {
    check_operands(o.operands, HS);
    if (B <= 0 || T <= 0) return;
    mma_shape a = make_shape(T, NH, NKV, o);
    DISPATCH_MMA(o.operands, HS, forward_hs, out, lse, q, k, v, B, a);
}

void neox_cuda_attention_mma_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                      const float *k, const float *v, const float *out, const float *lse, int B, int T,
                                      int NH, int NKV, int HS, neox_attention_opts o) {
    check_operands(o.operands, HS);
    if (B <= 0 || T <= 0) return;
    mma_shape a = make_shape(T, NH, NKV, o);
    DISPATCH_MMA(o.operands, HS, backward_hs, dq, dk, dv, dout, q, k, v, out, lse, B, a);
}
