// attention_fa2.cu: the pipelined tensor-core attention kernels (FlashAttention-2's techniques on
// mma.sync m16n8k16, sm_80 and later): exact causal attention with bf16 or fp16 operands, the same
// shapes, options and rounding points as attention_mma.cu (the first tensor-core kernels, kept as
// the fallback: attention_cudnn.cu owns the choice) and kernels/cpu/attention.c, its reference.
//
// What is new against attention_mma.cu:
// - 16-bit operands are read from memory as they are, through (batch, head, token) element strides:
//   bf16-stored q, k, v straight from the model's tensors or from a fused QKV GEMM output (GPT-NeoX's
//   interleaved or Llama's layout), so no split or cast pass runs; fp32-stored tensors are rounded
//   once into a 16-bit scratch (the values the first kernels rounded at every tile load).
// - cp.async copies the next key/value (or query/dout) tile into shared memory while the warps
//   compute on the current one (two stages), and ldmatrix (.trans for the operands read along their
//   rows, v in P v) loads the fragments: four 8x8 matrices per instruction instead of eight 32-bit reads.
// - The forward and the dq pass own 128 query rows per block (8 warps of 16 rows), so each key/value
//   tile loaded into shared memory serves twice the rows; the dk/dv pass owns 128 keys.
// - Masks are applied on the tiles that cross the causal diagonal or the window's edge only; a
//   warp's tile that is entirely visible takes a path without per-element tests, and one it cannot
//   see at all is skipped.
// - Backward, deterministic, in one pass: FlashAttention-2's five products per key block (S, dP, dV,
//   dK and dq's contribution dS k), but where it adds dq across key blocks with fp32 atomics, whose
//   order changes from run to run (so would dq's bits), the blocks here add into an fp32 accumulator
//   in a fixed order, handed on by per-tile counters (the single pass, below, with its deadlock
//   argument), and a last pass casts it into dq. The two passes of attention_mma.cu's scheme (dq: S,
//   dP, dQ per key tile; dk, dv: S, dP, dV, dK per query tile; seven products for the five) stay
//   selectable: attention_cudnn.cu owns the choice (NEOX_ATTENTION_BACKWARD).
//
// Tiles in shared memory are row-major in the operand type with a pitch of HS + 8 elements: a row is
// a multiple of 16 bytes (cp.async and ldmatrix need 16-byte rows) and the 8 rows an ldmatrix phase
// reads start 4 banks apart, so they hit 32 different banks. Fragments: attention_mma.cuh.
#include <string.h>

#include <type_traits>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/cudnn_attention.h"

enum {
    FA_WARPS = 8,               // warps per block
    FA_ROWS = FA_WARPS * 16,    // a block's own rows (queries, or keys in the dk/dv pass)
    FA_COLS = 64,               // the streamed tile's rows: keys (forward, dq) or queries (dk/dv)
    FA_THREADS = FA_WARPS * 32,
};
// The CPU reference rounds probability tiles under the running max of 64-key tiles (attention.c's
// ATT_BLOCK); streaming 64 keys at a time keeps that rounding point.
static_assert(FA_COLS == 64, "the probability tiles must be the CPU reference's 64 keys");
static_assert(FA_ROWS % FA_COLS == 0, "a block's rows must start on a streamed tile's boundary");
static_assert(FA_COLS % 16 == 0 && FA_ROWS % 16 == 0, "tiles are whole m16n8k16 steps");

template <int HS> struct fa_dims {
    static_assert(HS % 16 == 0 && HS >= 16 && HS <= 128, "head sizes 16, 32, ..., 128");
    static const int pitch = HS + 8;   // elements per shared row (16 bytes of padding)
    static const int chunks = HS / 8;  // 16-byte pieces per row
};

// Element strides of a tensor addressed as (B, heads, T, HS), the HS elements of a row contiguous.
struct fa_strides {
    long long sb, sh, st;  // batch, head, token
    __device__ __forceinline__ size_t at(int b, int h, int t) const { return b * sb + h * sh + (long long)t * st; }
};

// A 16-bit tensor addressed as (B, heads, T, HS) by element strides; the HS elements of a row are
// contiguous and start on 16 bytes (strides and base multiples of 8 elements).
template <class E> struct fa_view {
    const E *p;
    long long sb, sh, st;  // batch, head, token strides (elements)
    __device__ __forceinline__ const E *row(int b, int h, int t) const {
        return p + b * sb + h * sh + (long long)t * st;
    }
};

// ---- cp.async and ldmatrix (sm_80) -----------------------------------------------------------------

__device__ __forceinline__ unsigned smem_addr(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

// 16 bytes from global to shared without passing through registers; valid == false writes 16 zero bytes
// (src-size 0: nothing is read, but src must still be a mapped address).
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Four 8x8 matrices of 16-bit elements: lane l gives the address of row l % 8 of matrix l / 8 and gets,
// of each matrix m, r[m] = M[l / 4][2 (l % 4) .. +1] (.trans: M[2 (l % 4) .. +1][l / 4]).
__device__ __forceinline__ void ldsm_x4(uint32_t *r, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t *r, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// A fragment (16 x 16) of rows r0.., columns k0.. of a row-major shared tile X: matrices (r0, k0),
// (r0 + 8, k0), (r0, k0 + 8), (r0 + 8, k0 + 8) are a0..a3, so lane l points at row r0 + l % 16,
// column k0 + 8 (l / 16).
template <class E, int HS> __device__ __forceinline__ void lda(uint32_t *a, const E *X, int r0, int k0, int lane) {
    ldsm_x4(a, X + (r0 + (lane & 15)) * fa_dims<HS>::pitch + k0 + (lane >> 4) * 8);
}

// B fragments of two n8 steps, n0 and n0 + 8, for k0.., where B = X^T and X is a shared tile indexed
// [n][k] (k, q, v or dout rows by dims): b[0], b[1] for n0, b[2], b[3] for n0 + 8. Matrices (n0, k0),
// (n0, k0 + 8), (n0 + 8, k0), (n0 + 8, k0 + 8): lane l points at row n0 + l % 8 + 8 (l / 16), column
// k0 + 8 ((l / 8) % 2).
template <class E, int HS> __device__ __forceinline__ void ldb_t(uint32_t *b, const E *X, int k0, int n0, int lane) {
    ldsm_x4(b, X + (n0 + (lane & 7) + (lane >> 4) * 8) * fa_dims<HS>::pitch + k0 + ((lane >> 3) & 1) * 8);
}

// B fragments of n0 and n0 + 8 for k0.., where B = X itself indexed [k][n] (v, k, q or dout rows by
// dims as the second operand of P v, dS k, P^T dout, dS^T q): transposed loads of matrices (k0, n0),
// (k0 + 8, n0), (k0, n0 + 8), (k0 + 8, n0 + 8): lane l points at row k0 + l % 16, column n0 + 8 (l / 16).
template <class E, int HS> __device__ __forceinline__ void ldb(uint32_t *b, const E *X, int k0, int n0, int lane) {
    ldsm_x4_trans(b, X + (k0 + (lane & 15)) * fa_dims<HS>::pitch + n0 + (lane >> 4) * 8);
}

// Copies rows r0 .. r0 + ROWS - 1 of a head (row(b, h, r)) into tile[ROWS][HS + 8] with cp.async,
// one 16-byte chunk per thread and step; rows at or past T are zero (masked products then add 0,
// never 0 * NaN). The caller commits the group.
template <int ROWS, int HS, class E>
__device__ __forceinline__ void issue_tile(E *tile, const fa_view<E> &x, int b, int h, int r0, int T) {
    const int C = fa_dims<HS>::chunks;
    for (int e = threadIdx.x; e < ROWS * C; e += FA_THREADS) {
        int r = e / C, c = (e % C) * 8;  // tile row, first element of the chunk
        bool valid = r0 + r < T;
        cp_async16(tile + r * fa_dims<HS>::pitch + c, x.row(b, h, valid ? r0 + r : 0) + c, valid);
    }
}

// ---- products ------------------------------------------------------------------------------------

// acc (16 x 64 per warp, 8 n8 fragments) = A (the warp's 16 rows, from registers) x X^T, X a shared
// tile of 64 rows by HS: scores q k^T, dout v^T. afr[kk]: the A fragment of dims 16 kk...
template <class Ops, int HS>
__device__ __forceinline__ void rows_by_tile(float (*acc)[4], const uint32_t (*afr)[4], const typename Ops::elem *X,
                                             int lane) {
#pragma unroll
    for (int n = 0; n < FA_COLS / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++)
#pragma unroll
        for (int n = 0; n < FA_COLS / 8; n += 2) {
            uint32_t bf[4];
            ldb_t<typename Ops::elem, HS>(bf, X, kk * 16, n * 8, lane);
            Ops::mma(acc[n], afr[kk], bf[0], bf[1]);
            Ops::mma(acc[n + 1], afr[kk], bf[2], bf[3]);
        }
}

// As rows_by_tile with the A rows read from a shared tile too (rows r0.. of Y), one k-step's fragment
// at a time: the backward's products, where holding two operands' fragments in registers would spill.
template <class Ops, int HS>
__device__ __forceinline__ void shared_rows_by_tile(float (*acc)[4], const typename Ops::elem *Y, int r0,
                                                    const typename Ops::elem *X, int lane) {
#pragma unroll
    for (int n = 0; n < FA_COLS / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) {
        uint32_t a[4];
        lda<typename Ops::elem, HS>(a, Y, r0, kk * 16, lane);
#pragma unroll
        for (int n = 0; n < FA_COLS / 8; n += 2) {
            uint32_t bf[4];
            ldb_t<typename Ops::elem, HS>(bf, X, kk * 16, n * 8, lane);
            Ops::mma(acc[n], a, bf[0], bf[1]);
            Ops::mma(acc[n + 1], a, bf[2], bf[3]);
        }
    }
}

// out (16 x HS per warp) += W (16 x 64 in accumulator fragments, rounded here to the operand type) x
// X (a shared tile of 64 rows by HS): P v, dS k, P^T dout, dS^T q.
template <class Ops, int HS>
__device__ __forceinline__ void weights_by_tile(float (*out)[4], const float (*w)[4], const typename Ops::elem *X,
                                                int lane) {
#pragma unroll
    for (int s = 0; s < FA_COLS / 16; s++) {
        uint32_t a[4];
        a_from_acc<Ops>(a, w, s);
#pragma unroll
        for (int n = 0; n < HS / 8; n += 2) {
            uint32_t bf[4];
            ldb<typename Ops::elem, HS>(bf, X, s * 16, n * 8, lane);
            Ops::mma(out[n], a, bf[0], bf[1]);
            Ops::mma(out[n + 1], a, bf[2], bf[3]);
        }
    }
}

// ---- which (row, column) pairs of a warp's tile are visible --------------------------------------

enum tile_kind { TILE_NONE, TILE_FULL, TILE_MASKED };

// Query rows r0 .. r0 + nr - 1 (at positions p0 .. p1, rising, not always consecutive under context
// parallelism) against keys j0 .. j1: which pairs are visible (window as sees()). Rows past the
// queries, or keys past the T keys, make a tile masked at best.
__device__ __forceinline__ tile_kind tile_kind_of(const att_queries &qr, int r0, int nr, int j0, int j1, int T,
                                                  int window) {
    if (r0 >= qr.n || j0 >= T) return TILE_NONE;
    const int last = min(r0 + nr, qr.n) - 1, p0 = query_pos(qr, r0), p1 = query_pos(qr, last);
    if (j0 > p1 || (window > 0 && j1 <= p0 - window)) return TILE_NONE;  // nothing visible
    if (j1 <= p0 && r0 + nr <= qr.n && j1 < T && (window == 0 || j0 > p1 - window)) return TILE_FULL;  // all visible
    return TILE_MASKED;
}
// A warp's 16 queries r0.. against keys j0 .. j0 + 63.
__device__ __forceinline__ tile_kind query_tile_kind(const mma_shape &a, int r0, int j0) {
    return tile_kind_of(a.q, r0, 16, j0, j0 + FA_COLS - 1, a.T, a.window);
}
// A warp's 16 keys j0.. against queries i0 .. i0 + 63.
__device__ __forceinline__ tile_kind key_tile_kind(const mma_shape &a, int j0, int i0) {
    return tile_kind_of(a.q, i0, FA_COLS, j0, j0 + 15, a.T, a.window);
}

// The first key tile (of 64) a block whose first query row is i0 needs: keys before the window of
// its first query are seen by none of its rows.
__device__ __forceinline__ int key_tiles_begin(const mma_shape &a, int i0) {
    const int p0 = query_pos(a.q, i0);
    return a.window > 0 && p0 - a.window + 1 > 0 ? (p0 - a.window + 1) / FA_COLS * FA_COLS : 0;
}

// ---- forward ---------------------------------------------------------------------------------------

// One key tile of the online softmax for a warp's rows (row[0] = g, row[1] = g + 8 of its 16, at
// positions pos[]): s holds q k^T for keys j0 + 8 n + 2 t + c in s[n][2 hr + c]; on return it holds
// the (dropped, unrounded) probabilities under the new running max m, alpha the factor on the
// earlier sums.
template <bool MASKED>
__device__ __forceinline__ void softmax_tile(float (*s)[4], float *m, float *l, float *alpha, const int *row,
                                             const int *pos, int j0,
                                             int t, const mma_shape &a, float sl2, float slope2,
                                             unsigned long long drow) {
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {  // the thread's rows g (hr 0) and g + 8 (hr 1)
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < FA_COLS / 8; n++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                int j = j0 + n * 8 + 2 * t + c;
                float x = s[n][2 * hr + c] * sl2 + slope2 * (float)(j - pos[hr]);
                if (MASKED && !(row[hr] < a.q.n && sees(pos[hr], j, a.window))) x = -INFINITY;
                s[n][2 * hr + c] = x;
                mx = fmaxf(mx, x);
            }
        float m_new = fmaxf(m[hr], quad_max(mx));
        // Masked tiles only: nothing visible to this row yet (before its window, or a row past Tq).
        bool empty = MASKED && m_new == -INFINITY;
        alpha[hr] = empty ? 1.0f : exp2f(m[hr] - m_new);
        float rs = 0.0f;
#pragma unroll
        for (int n = 0; n < FA_COLS / 8; n++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                float p = empty ? 0.0f : exp2f(s[n][2 * hr + c] - m_new);
                rs += p;  // the sum is of the undropped, unrounded probabilities
                if (a.dropout > 0.0f && p != 0.0f)
                    p *= keep_factor(a.dropout, a.keep_scale, a.seed, drow + row[hr], a.T, j0 + n * 8 + 2 * t + c);
                s[n][2 * hr + c] = p;
            }
        l[hr] = l[hr] * alpha[hr] + rs;  // a partial sum: this thread's columns only
        m[hr] = m_new;
    }
}

// Grid (query tiles, NH, B), the heaviest (last) query tiles first; 8 warps, warp w owns queries
// i0 + 16 w... q: view (B, NH, Tq, HS); k, v: views (B, NKV, T, HS); out: (B, Tq, NH, HS) stored as
// S; lse: (B, NH, Tq). Shared: Qs[128][P], then two stages of Ks[64][P], Vs[64][P].
template <class Ops, int HS, class S>
__global__ void __launch_bounds__(FA_THREADS)
attention_fa2_forward_kernel(S *out, float *lse, fa_view<typename Ops::elem> q, fa_view<typename Ops::elem> k,
                             fa_view<typename Ops::elem> v, mma_shape a) {
    typedef typename Ops::elem E;
    const int P = fa_dims<HS>::pitch, T = a.T, Tq = a.q.n;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    E *Qs = reinterpret_cast<E *>(smem_raw), *KV = Qs + FA_ROWS * P;  // stage s: Ks = KV + 2 s 64 P, Vs = Ks + 64 P
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int b = blockIdx.z, h = blockIdx.y, kvh = h / (a.NH / a.NKV);
    const int i0 = (gridDim.x - 1 - blockIdx.x) * FA_ROWS, r0 = i0 + warp * 16;  // block's and warp's first query
    const unsigned long long drow = dropout_row(a, b, h);  // dropout's counter row of (b, h, 0)
    const float sl2 = a.scale * LOG2E, slope2 = slope2_of(a, h);
    const int row[2] = {r0 + g, r0 + g + 8}, pos[2] = {query_pos(a.q, row[0]), query_pos(a.q, row[1])};
    // Key tiles [jbeg, kend): from the first a window lets any of the block's queries see to the diagonal.
    const int jbeg = key_tiles_begin(a, i0), kend = query_pos(a.q, min(i0 + FA_ROWS, Tq) - 1) + 1;
    const int ntiles = (kend - jbeg + FA_COLS - 1) / FA_COLS;

    issue_tile<FA_ROWS, HS>(Qs, q, b, h, i0, Tq);
    issue_tile<FA_COLS, HS>(KV, k, b, kvh, jbeg, T);
    issue_tile<FA_COLS, HS>(KV + FA_COLS * P, v, b, kvh, jbeg, T);
    cp_async_commit();  // group 0: q and the first key/value tile

    uint32_t qf[HS / 16][4];
    float o[HS / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < HS / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

    for (int it = 0; it < ntiles; it++) {
        const int j0 = jbeg + it * FA_COLS;
        if (it + 1 < ntiles) {  // prefetch the next tile into the other stage (consumed before the last sync)
            E *next = KV + ((it + 1) & 1) * 2 * FA_COLS * P;
            issue_tile<FA_COLS, HS>(next, k, b, kvh, j0 + FA_COLS, T);
            issue_tile<FA_COLS, HS>(next + FA_COLS * P, v, b, kvh, j0 + FA_COLS, T);
            cp_async_commit();
            cp_async_wait<1>();  // this tile's group has landed (the next may still fly)
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // every thread's copies of this tile are visible
        if (it == 0) {
#pragma unroll
            for (int kk = 0; kk < HS / 16; kk++) lda<E, HS>(qf[kk], Qs, warp * 16, kk * 16, lane);
        }
        const E *Ks = KV + (it & 1) * 2 * FA_COLS * P, *Vs = Ks + FA_COLS * P;
        const tile_kind kind = query_tile_kind(a, r0, j0);  // warp-uniform
        if (kind != TILE_NONE) {
            float s[FA_COLS / 8][4], alpha[2];
            rows_by_tile<Ops, HS>(s, qf, Ks, lane);  // s = q k^T
            if (kind == TILE_FULL) softmax_tile<false>(s, m, l, alpha, row, pos, j0, t, a, sl2, slope2, drow);
            else softmax_tile<true>(s, m, l, alpha, row, pos, j0, t, a, sl2, slope2, drow);
#pragma unroll
            for (int n = 0; n < HS / 8; n++) {
                o[n][0] *= alpha[0], o[n][1] *= alpha[0];
                o[n][2] *= alpha[1], o[n][3] *= alpha[1];
            }
            weights_by_tile<Ops, HS>(o, s, Vs, lane);  // o += P v
        }
        __syncthreads();  // this stage is consumed before the next iteration's prefetch overwrites it
    }
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        float sum = quad_sum(l[hr]);
        if (row[hr] >= Tq) continue;
        float inv = 1.0f / sum;
        const size_t orow = (((size_t)b * Tq + row[hr]) * a.NH + h) * HS;  // out[b][row][h][.]
#pragma unroll
        for (int n = 0; n < HS / 8; n++) {
            act_store(out, orow + n * 8 + 2 * t, o[n][2 * hr] * inv);
            act_store(out, orow + n * 8 + 2 * t + 1, o[n][2 * hr + 1] * inv);
        }
        if (t == 0) lse[((size_t)b * a.NH + h) * Tq + row[hr]] = m[hr] * LN2 + logf(sum);
    }
}

// ---- backward: D -------------------------------------------------------------------------------------

// D (B, NH, T) = dout . out (T: the query rows) per query row in fp32 from the stored (unrounded) values; one warp per row.
template <class S>
__global__ void attention_fa2_d_kernel(float *D, const S *dout, const S *out, int B, int T, int NH, int HS) {
    const int lane = threadIdx.x & 31;
    const size_t rows = (size_t)B * NH * T;
    for (size_t r = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5; r < rows;
         r += ((size_t)gridDim.x * blockDim.x) >> 5) {
        size_t b = r / ((size_t)NH * T), h = r / T % NH, i = r % T;
        size_t at = ((b * T + i) * NH + h) * HS;  // dout[b][i][h][.], out likewise
        float sum = 0.0f;
        for (int d = lane; d < HS; d += 32) sum += act_load(dout, at + d) * act_load(out, at + d);
        sum = warp_sum(sum);
        if (lane == 0) D[r] = sum;
    }
}

// ---- backward: dq ------------------------------------------------------------------------------------

// dq (B, NH, Tq, HS) overwritten through its strides dqs, stored as S. Grid as the forward's. Per key tile: S = q k^T,
// dP = dout v^T, dS = P (dP K - D) scale, dq += dS k. Shared: Qs, Os (dout) [128][P], then two stages
// of Ks, Vs [64][P]. q's and dout's fragments are loaded from shared memory for every tile: holding
// both in registers, with dq's accumulators and the two score tiles, spills at head size 128.
template <class Ops, int HS, class S>
__global__ void __launch_bounds__(FA_THREADS)
attention_fa2_dq_kernel(S *dq, fa_strides dqs, const float *D, fa_view<typename Ops::elem> dout,
                        fa_view<typename Ops::elem> q, fa_view<typename Ops::elem> k, fa_view<typename Ops::elem> v,
                        const float *lse, mma_shape a) {
    typedef typename Ops::elem E;
    const int P = fa_dims<HS>::pitch, T = a.T, Tq = a.q.n;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    E *Qs = reinterpret_cast<E *>(smem_raw), *Os = Qs + FA_ROWS * P, *KV = Os + FA_ROWS * P;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int b = blockIdx.z, h = blockIdx.y, kvh = h / (a.NH / a.NKV);
    const int i0 = (gridDim.x - 1 - blockIdx.x) * FA_ROWS, r0 = i0 + warp * 16;
    const size_t head = (size_t)b * a.NH + h;
    const unsigned long long drow = dropout_row(a, b, h);
    const float sl2 = a.scale * LOG2E, slope2 = slope2_of(a, h);
    const int row[2] = {r0 + g, r0 + g + 8}, pos[2] = {query_pos(a.q, row[0]), query_pos(a.q, row[1])};
    const int jbeg = key_tiles_begin(a, i0), kend = query_pos(a.q, min(i0 + FA_ROWS, Tq) - 1) + 1;
    const int ntiles = (kend - jbeg + FA_COLS - 1) / FA_COLS;

    issue_tile<FA_ROWS, HS>(Qs, q, b, h, i0, Tq);
    issue_tile<FA_ROWS, HS>(Os, dout, b, h, i0, Tq);
    issue_tile<FA_COLS, HS>(KV, k, b, kvh, jbeg, T);
    issue_tile<FA_COLS, HS>(KV + FA_COLS * P, v, b, kvh, jbeg, T);
    cp_async_commit();

    // D and the log-sum-exp (in base-2 units of the scaled score) of the thread's two rows.
    float Dr[2], L[2];
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        Dr[hr] = row[hr] < Tq ? D[head * Tq + row[hr]] : 0.0f;
        L[hr] = row[hr] < Tq ? lse[head * Tq + row[hr]] * LOG2E : 0.0f;
    }
    float acc[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

    for (int it = 0; it < ntiles; it++) {
        const int j0 = jbeg + it * FA_COLS;
        if (it + 1 < ntiles) {
            E *next = KV + ((it + 1) & 1) * 2 * FA_COLS * P;
            issue_tile<FA_COLS, HS>(next, k, b, kvh, j0 + FA_COLS, T);
            issue_tile<FA_COLS, HS>(next + FA_COLS * P, v, b, kvh, j0 + FA_COLS, T);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const E *Ks = KV + (it & 1) * 2 * FA_COLS * P, *Vs = Ks + FA_COLS * P;
        const tile_kind kind = query_tile_kind(a, r0, j0);
        if (kind != TILE_NONE) {
            float s[FA_COLS / 8][4], dp[FA_COLS / 8][4];
            shared_rows_by_tile<Ops, HS>(s, Qs, warp * 16, Ks, lane);   // q k^T
            shared_rows_by_tile<Ops, HS>(dp, Os, warp * 16, Vs, lane);  // dout v^T
#pragma unroll
            for (int n = 0; n < FA_COLS / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int hr = e >> 1, j = j0 + n * 8 + 2 * t + (e & 1);  // s[n][e]: row[hr], key j
                    float ds = 0.0f;
                    if (kind == TILE_FULL || (row[hr] < Tq && sees(pos[hr], j, a.window))) {
                        float p = exp2f(s[n][e] * sl2 + slope2 * (float)(j - pos[hr]) - L[hr]), d = dp[n][e];
                        if (a.dropout > 0.0f) d *= keep_factor(a.dropout, a.keep_scale, a.seed, drow + row[hr], T, j);
                        ds = p * (d - Dr[hr]) * a.scale;
                    }
                    s[n][e] = ds;
                }
            weights_by_tile<Ops, HS>(acc, s, Ks, lane);  // dq += dS k
        }
        __syncthreads();
    }
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        if (row[hr] >= Tq) continue;
        const size_t at = dqs.at(b, h, row[hr]);  // dq[b][h][row][.]
#pragma unroll
        for (int n = 0; n < HS / 8; n++) {
            act_store(dq, at + n * 8 + 2 * t, acc[n][2 * hr]);
            act_store(dq, at + n * 8 + 2 * t + 1, acc[n][2 * hr + 1]);
        }
    }
}

// ---- backward: dk, dv --------------------------------------------------------------------------------

// dk, dv (B, NKV, T, HS) overwritten through their strides dkvs, stored as S. Grid (key tiles of 128,
// NKV, B): warp w owns keys j0 + 16 w.. and sums over the query heads of its group and the 64-query
// tiles that see them (q, dout, lse and D with Tq rows), in transposed form: S^T = k q^T, dP^T = v dout^T, dv += (P^T * K) dout,
// dk += dS^T q. Shared: Ks, Vs [128][P], then two stages of Qs, Os [64][P] and their rows'
// log-sum-exp and D (64 floats each).
template <class Ops, int HS, class S>
__global__ void __launch_bounds__(FA_THREADS)
attention_fa2_dkv_kernel(S *dk, S *dv, fa_strides dkvs, fa_view<typename Ops::elem> dout, fa_view<typename Ops::elem> q,
                         fa_view<typename Ops::elem> k, fa_view<typename Ops::elem> v, const float *lse,
                         const float *D, mma_shape a) {
    typedef typename Ops::elem E;
    const int P = fa_dims<HS>::pitch, T = a.T, Tq = a.q.n, STAGE = 2 * FA_COLS * P;  // a stage: Qs then Os
    extern __shared__ __align__(16) unsigned char smem_raw[];
    E *Ks = reinterpret_cast<E *>(smem_raw), *Vs = Ks + FA_ROWS * P, *QO = Vs + FA_ROWS * P;
    float *LD = reinterpret_cast<float *>(QO + 2 * STAGE);  // stage s: L = LD + 128 s, D = L + 64
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int b = blockIdx.z, kvh = blockIdx.y, group = a.NH / a.NKV;
    const int j0 = blockIdx.x * FA_ROWS, jw = j0 + warp * 16;  // the block's and the warp's first key
    const float sl2 = a.scale * LOG2E;
    const int key[2] = {jw + g, jw + g + 8};
    // Query tiles [i_first, i_end) of each head: queries before the block's first key, and after the
    // window of its last, see none (under context parallelism possibly no query at all: ntiles 0).
    const int i_first = rows_before(a.q, j0);
    const int i_end = a.window > 0 ? rows_before(a.q, j0 + FA_ROWS - 1 + a.window) : Tq;
    const int per_head = max(0, (i_end - i_first + FA_COLS - 1) / FA_COLS), ntiles = group * per_head;

    // Query tile n of the sequence: head kvh * group + n / per_head, queries i_first + 64 (n % per_head)...
    auto issue = [&](int n) {
        const int h = kvh * group + n / per_head, i0 = i_first + (n % per_head) * FA_COLS;
        E *Qs = QO + (n & 1) * STAGE;
        float *Ls = LD + (n & 1) * 2 * FA_COLS;
        issue_tile<FA_COLS, HS>(Qs, q, b, h, i0, Tq);
        issue_tile<FA_COLS, HS>(Qs + FA_COLS * P, dout, b, h, i0, Tq);
        // (plain stores: the other warps read this stage only after the sync that follows its wait)
        if (threadIdx.x < FA_COLS) {
            const size_t at = ((size_t)b * a.NH + h) * Tq + i0 + threadIdx.x;
            const bool in = i0 + (int)threadIdx.x < Tq;
            Ls[threadIdx.x] = in ? lse[at] * LOG2E : 0.0f;
            Ls[FA_COLS + threadIdx.x] = in ? D[at] : 0.0f;
        }
    };
    issue_tile<FA_ROWS, HS>(Ks, k, b, kvh, j0, T);
    issue_tile<FA_ROWS, HS>(Vs, v, b, kvh, j0, T);
    if (ntiles > 0) issue(0);
    cp_async_commit();

    float dka[HS / 8][4], dva[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dka[n][e] = dva[n][e] = 0.0f;

    for (int it = 0; it < ntiles; it++) {
        if (it + 1 < ntiles) {
            issue(it + 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const int h = kvh * group + it / per_head, i0 = i_first + (it % per_head) * FA_COLS;
        const E *Qs = QO + (it & 1) * STAGE, *Os = Qs + FA_COLS * P;
        const float *Ls = LD + (it & 1) * 2 * FA_COLS, *Ds = Ls + FA_COLS;
        const tile_kind kind = key_tile_kind(a, jw, i0);
        if (kind != TILE_NONE) {
            const unsigned long long drow = dropout_row(a, b, h);
            const float slope2 = slope2_of(a, h);
            float st[FA_COLS / 8][4], dpt[FA_COLS / 8][4];
            shared_rows_by_tile<Ops, HS>(st, Ks, warp * 16, Qs, lane);   // k q^T
            shared_rows_by_tile<Ops, HS>(dpt, Vs, warp * 16, Os, lane);  // v dout^T
#pragma unroll
            for (int n = 0; n < FA_COLS / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int c = n * 8 + 2 * t + (e & 1), i = i0 + c, j = key[e >> 1];  // st[n][e]: key j, query i
                    float pk = 0.0f, ds = 0.0f;
                    const int pos = query_pos(a.q, i);
                    if (kind == TILE_FULL || (i < Tq && j < T && sees(pos, j, a.window))) {
                        float p = exp2f(st[n][e] * sl2 + slope2 * (float)(j - pos) - Ls[c]), kf = 1.0f;
                        if (a.dropout > 0.0f) kf = keep_factor(a.dropout, a.keep_scale, a.seed, drow + i, T, j);
                        pk = p * kf;
                        ds = p * (dpt[n][e] * kf - Ds[c]) * a.scale;
                    }
                    st[n][e] = pk;
                    dpt[n][e] = ds;
                }
            weights_by_tile<Ops, HS>(dva, st, Os, lane);   // dv += (P^T * K) dout
            weights_by_tile<Ops, HS>(dka, dpt, Qs, lane);  // dk += dS^T q
        }
        __syncthreads();
    }
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        if (key[hr] >= T) continue;
        const size_t at = dkvs.at(b, kvh, key[hr]);  // dk[b][kvh][key][.], dv likewise
#pragma unroll
        for (int n = 0; n < HS / 8; n++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                act_store(dk, at + n * 8 + 2 * t + c, dka[n][2 * hr + c]);
                act_store(dv, at + n * 8 + 2 * t + c, dva[n][2 * hr + c]);
            }
    }
}

// ---- backward: one pass (dk, dv and dq's contributions per key block) --------------------------------

// A fragment (16 x 16) of rows r0.., columns k0.. of a row-major shared tile with PITCH elements a row.
template <int PITCH, class E> __device__ __forceinline__ void lda_pitch(uint32_t *a, const E *X, int r0, int k0, int lane) {
    ldsm_x4(a, X + (r0 + (lane & 15)) * PITCH + k0 + (lane >> 4) * 8);
}

// The single pass keeps a 64-query by 128-key tile of dS (rounded to the operand type, queries along
// the rows) for dq's product; its pitch is the keys plus 16 bytes, as the other tiles'.
enum { FA_DS_PITCH = FA_ROWS + 8 };
// Whether dS fits where the current stage's q and dout tiles were (they are consumed by then): head
// sizes from 64 on; below, it has shared memory of its own.
template <int HS> struct fa_ds_in_stage {
    static const bool value = 2 * fa_dims<HS>::pitch >= FA_DS_PITCH;
};

// The n8 fragment pairs (16 columns each) of dq's HS columns that warp `half` (0 or 1) of a row group
// owns in the dq product: the first (HS / 16 + 1) / 2 pairs, or the rest.
template <int HS> struct fa_dq_split {
    static const int pairs = HS / 16, per_half = (pairs + 1) / 2;
};

// dq's contribution of this block's 128 keys to 16 queries (rows q0.. of dS) over the warp's column
// pairs: acc = dS (16 x 128, shared) x k (Ks, 128 x HS); pair p of the warp is pair0 + p of the head.
template <class Ops, int HS>
__device__ __forceinline__ void dq_contribution(float (*acc)[4], const typename Ops::elem *dSs, int q0,
                                                const typename Ops::elem *Ks, int pair0, int lane) {
    const int PER = fa_dq_split<HS>::per_half;
#pragma unroll
    for (int n = 0; n < 2 * PER; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
    for (int s = 0; s < FA_ROWS / 16; s++) {
        uint32_t a[4];
        lda_pitch<FA_DS_PITCH>(a, dSs, q0, s * 16, lane);
#pragma unroll
        for (int p = 0; p < PER; p++)
            if (pair0 + p < fa_dq_split<HS>::pairs) {  // not past the last pair (the second half of an odd count)
                uint32_t bf[4];
                ldb<typename Ops::elem, HS>(bf, Ks, s * 16, (pair0 + p) * 16, lane);
                Ops::mma(acc[2 * p], a, bf[0], bf[1]);
                Ops::mma(acc[2 * p + 1], a, bf[2], bf[3]);
            }
    }
}

// ---- the ordered dq accumulation ----
//
// dq of a 64-query tile is the sum of the contributions of the key blocks that see it: blocks
// first .. last = i0 / 128 (first > 0 under a sliding window). They add into an fp32 accumulator in
// global memory in a fixed order, last block first (it stores rather than adds), then last - 1, ...:
// a per-(batch, head, tile) counter in global memory says how many have added, and block jb waits for
// last - jb. Descending order because each block walks its query tiles upwards from its own keys: block
// jb reaches tile i0 after i0 / 64 - 2 jb tiles of work, the blocks after it sooner, so the one it
// waits for is usually done (ascending order would make block jb wait for block 0's first 2 jb tiles).
//
// Deadlock freedom: a block waits only for blocks with higher key indices of the same (batch, kv
// head). Blocks do not take their key block from blockIdx, whose dispatch order CUDA does not promise,
// but from a ticket drawn from a global counter as they start: tickets are handed out in the order the
// blocks start running, and ticket n's key block follows those of tickets < n in the waiting order (the
// highest keys of a (batch, kv head) get the lowest tickets). So every block a waiter waits for has
// started: it is resident or finished, never queued behind the waiter. Among the resident unfinished
// blocks, the one with the lowest ticket waits for nobody unfinished, so it finishes; by induction all do.

// Acquire and release at the GPU's scope (sm_70 and later): the counter's reader then sees the
// accumulator stores the writer made before its release.
__device__ __forceinline__ unsigned load_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void store_release(unsigned *p, unsigned v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// The block waits until `turn` blocks have added into the counter's tile.
__device__ __forceinline__ void wait_turn(const unsigned *counter, unsigned turn) {
    if (threadIdx.x == 0)
        while (load_acquire(counter) != turn) __nanosleep(64);
    __syncthreads();
}
// After every thread's accumulator stores: the next block may add.
__device__ __forceinline__ void pass_turn(unsigned *counter, unsigned turn) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) store_release(counter, turn + 1);
}

// Adds (or, first, stores) a warp's dq contribution into the fp32 accumulator rows (B, NH, T, HS) of
// head row `head`: rows i0 + q0 + g (+ 8), the warp's column pairs. L2 loads and stores (.cg): the
// accumulator is written by other blocks, and an L1 line of it could be stale.
template <int HS>
__device__ __forceinline__ void add_dq(float *acc_rows, const float (*c)[4], int i0, int q0, int T, int pair0,
                                       bool first, int lane) {
    const int g = lane >> 2, t = lane & 3, PER = fa_dq_split<HS>::per_half;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int i = i0 + q0 + g + 8 * hr;
        if (i >= T) continue;
#pragma unroll
        for (int p = 0; p < PER; p++) {
            if (pair0 + p >= fa_dq_split<HS>::pairs) continue;
#pragma unroll
            for (int h8 = 0; h8 < 2; h8++) {
                float2 *at = reinterpret_cast<float2 *>(acc_rows + (size_t)i * HS + (pair0 + p) * 16 + h8 * 8 + 2 * t);
                float2 x = make_float2(c[2 * p + h8][2 * hr], c[2 * p + h8][2 * hr + 1]);
                if (!first) {
                    float2 old = __ldcg(at);
                    x.x += old.x, x.y += old.y;
                }
                __stcg(at, x);
            }
        }
    }
}

// The tickets (element 0) and the per-tile counters (B, NH, ceil(T / 64)) of the single pass, zeroed
// before each call.
__device__ __forceinline__ unsigned *tile_counter(unsigned *counters, int b, int h, int i0, const mma_shape &a) {
    const int tiles = (a.T + FA_COLS - 1) / FA_COLS;
    return counters + 1 + ((size_t)b * a.NH + h) * tiles + i0 / FA_COLS;
}

// dk, dv (B, NKV, T, HS) overwritten through dkvs as the dk/dv pass does, and dq's fp32 accumulator
// dqacc (B, NH, T, HS) written whole (every row < T: the last block seeing a tile stores it). Grid
// (key blocks of 128, NKV, B) in count only: each block draws its (key block, kv head, batch) from a
// ticket (above). Per query tile of each head of the GQA group: S^T = k q^T, dP^T = v dout^T,
// dv += (P^T * K) dout, dk += dS^T q as the dk/dv pass, then dS into shared memory (queries along its
// rows) and dq's contribution dS k, added in its turn. Shared: as the dk/dv pass, plus dS [64][136]
// where the consumed stage's q and dout were (head sizes 64..128) or after the statistics (below 64).
template <class Ops, int HS, class S>
__global__ void __launch_bounds__(FA_THREADS)
attention_fa2_single_kernel(S *dk, S *dv, fa_strides dkvs, float *dqacc, unsigned *counters,
                            fa_view<typename Ops::elem> dout, fa_view<typename Ops::elem> q,
                            fa_view<typename Ops::elem> k, fa_view<typename Ops::elem> v, const float *lse,
                            const float *D, mma_shape a) {
    typedef typename Ops::elem E;
    const int P = fa_dims<HS>::pitch, T = a.T, STAGE = 2 * FA_COLS * P;  // a stage: Qs then Os
    extern __shared__ __align__(16) unsigned char smem_raw[];
    E *Ks = reinterpret_cast<E *>(smem_raw), *Vs = Ks + FA_ROWS * P, *QO = Vs + FA_ROWS * P;
    float *LD = reinterpret_cast<float *>(QO + 2 * STAGE);  // stage s: L = LD + 128 s, D = L + 64
    E *dS_own = reinterpret_cast<E *>(LD + 2 * 2 * FA_COLS);  // (head sizes below 64)
    __shared__ unsigned ticket;
    if (threadIdx.x == 0) ticket = atomicAdd(counters, 1u);
    __syncthreads();
    const int nkb = gridDim.x, kb = nkb - 1 - (int)(ticket % nkb);  // highest keys first
    const int kvh = (int)(ticket / nkb % a.NKV), b = (int)(ticket / nkb / a.NKV);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int group = a.NH / a.NKV;
    const int j0 = kb * FA_ROWS, jw = j0 + warp * 16;  // the block's and the warp's first key
    const float sl2 = a.scale * LOG2E;
    const int key[2] = {jw + g, jw + g + 8};
    const int i_end = a.window > 0 ? min(T, j0 + FA_ROWS - 1 + a.window) : T;
    const int per_head = (i_end - j0 + FA_COLS - 1) / FA_COLS, ntiles = group * per_head;
    // dq's product: warp w takes queries 16 (w % 4).. of the tile and half w / 4 of the column pairs.
    const int dq_q0 = (warp & 3) * 16, dq_pair0 = (warp >> 2) * fa_dq_split<HS>::per_half;

    auto issue = [&](int n) {
        const int h = kvh * group + n / per_head, i0 = j0 + (n % per_head) * FA_COLS;
        E *Qs = QO + (n & 1) * STAGE;
        float *Ls = LD + (n & 1) * 2 * FA_COLS;
        issue_tile<FA_COLS, HS>(Qs, q, b, h, i0, T);
        issue_tile<FA_COLS, HS>(Qs + FA_COLS * P, dout, b, h, i0, T);
        if (threadIdx.x < FA_COLS) {
            const size_t at = ((size_t)b * a.NH + h) * T + i0 + threadIdx.x;
            const bool in = i0 + (int)threadIdx.x < T;
            Ls[threadIdx.x] = in ? lse[at] * LOG2E : 0.0f;
            Ls[FA_COLS + threadIdx.x] = in ? D[at] : 0.0f;
        }
    };
    issue_tile<FA_ROWS, HS>(Ks, k, b, kvh, j0, T);
    issue_tile<FA_ROWS, HS>(Vs, v, b, kvh, j0, T);
    issue(0);
    cp_async_commit();

    float dka[HS / 8][4], dva[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dka[n][e] = dva[n][e] = 0.0f;

    for (int it = 0; it < ntiles; it++) {
        if (it + 1 < ntiles) {
            issue(it + 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const int h = kvh * group + it / per_head, i0 = j0 + (it % per_head) * FA_COLS;
        E *Qs = QO + (it & 1) * STAGE, *Os = Qs + FA_COLS * P;
        const float *Ls = LD + (it & 1) * 2 * FA_COLS, *Ds = Ls + FA_COLS;
        const tile_kind kind = key_tile_kind(a, jw, i0);
        float dpt[FA_COLS / 8][4];
        if (kind != TILE_NONE) {
            const unsigned long long drow = dropout_row(a, b, h);
            const float slope2 = slope2_of(a, h);
            float st[FA_COLS / 8][4];
            shared_rows_by_tile<Ops, HS>(st, Ks, warp * 16, Qs, lane);   // k q^T
            shared_rows_by_tile<Ops, HS>(dpt, Vs, warp * 16, Os, lane);  // v dout^T
#pragma unroll
            for (int n = 0; n < FA_COLS / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int c = n * 8 + 2 * t + (e & 1), i = i0 + c, j = key[e >> 1];  // st[n][e]: key j, query i
                    float pk = 0.0f, ds = 0.0f;
                    if (kind == TILE_FULL || (i < T && j < T && sees(i, j, a.window))) {
                        float p = exp2f(st[n][e] * sl2 + slope2 * (float)(j - i) - Ls[c]), kf = 1.0f;
                        if (a.dropout > 0.0f) kf = keep_factor(a.dropout, a.keep_scale, a.seed, drow + i, T, j);
                        pk = p * kf;
                        ds = p * (dpt[n][e] * kf - Ds[c]) * a.scale;
                    }
                    st[n][e] = pk;
                    dpt[n][e] = ds;
                }
            weights_by_tile<Ops, HS>(dva, st, Os, lane);   // dv += (P^T * K) dout
            weights_by_tile<Ops, HS>(dka, dpt, Qs, lane);  // dk += dS^T q
        } else {
#pragma unroll
            for (int n = 0; n < FA_COLS / 8; n++) dpt[n][0] = dpt[n][1] = dpt[n][2] = dpt[n][3] = 0.0f;
        }
        // dS, rounded as dk's product rounded it, into shared memory as (query, key): the stage's q and
        // dout once every warp is done with them.
        E *dSs = fa_ds_in_stage<HS>::value ? Qs : dS_own;
        if (fa_ds_in_stage<HS>::value) __syncthreads();
#pragma unroll
        for (int n = 0; n < FA_COLS / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                dSs[(n * 8 + 2 * t + (e & 1)) * FA_DS_PITCH + warp * 16 + g + 8 * (e >> 1)] = Ops::from(dpt[n][e]);
        __syncthreads();
        float dqc[2 * fa_dq_split<HS>::per_half][4];
        dq_contribution<Ops, HS>(dqc, dSs, dq_q0, Ks, dq_pair0, lane);
        unsigned *counter = tile_counter(counters, b, h, i0, a);
        const unsigned turn = (unsigned)(i0 / FA_ROWS - kb);  // key blocks after this one that see the tile
        wait_turn(counter, turn);
        add_dq<HS>(dqacc + ((size_t)b * a.NH + h) * T * HS, dqc, i0, dq_q0, T, dq_pair0, turn == 0, lane);
        pass_turn(counter, turn);  // (its barrier also keeps this stage until every warp has read dS)
    }
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        if (key[hr] >= T) continue;
        const size_t at = dkvs.at(b, kvh, key[hr]);
#pragma unroll
        for (int n = 0; n < HS / 8; n++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                act_store(dk, at + n * 8 + 2 * t + c, dka[n][2 * hr + c]);
                act_store(dv, at + n * 8 + 2 * t + c, dva[n][2 * hr + c]);
            }
    }
}

// dq (B, NH, T, HS) through its strides dqs, stored as S, from the single pass's fp32 accumulator.
template <class S>
__global__ void attention_fa2_dq_store_kernel(S *dq, fa_strides dqs, const float *dqacc, int B, int NH, int T, int HS) {
    const size_t n = (size_t)B * NH * T * HS;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        const size_t row = e / HS, d = e % HS;
        const int i = (int)(row % T), h = (int)(row / T % NH), b = (int)(row / T / NH);
        act_store(dq, dqs.at(b, h, i) + d, __ldcg(dqacc + e));
    }
}

// ---- launch ------------------------------------------------------------------------------------------

template <typename K> static void fa_allow_smem(K kernel, size_t bytes) {
    if (bytes > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}
// Shared bytes of `rows` tile rows of head size HS plus `floats` floats.
template <int HS> static size_t fa_smem(int rows, int floats) {
    return (size_t)rows * fa_dims<HS>::pitch * 2 + (size_t)floats * sizeof(float);
}

// The (B, heads, T, HS) views of one call's 16-bit operands.
template <class E> struct fa_views {
    fa_view<E> q, k, v, dout;
};

template <class Ops, int HS, class S>
static void fa_forward_hs(S *out, float *lse, const fa_views<typename Ops::elem> &x, int B, const mma_shape &a) {
    size_t smem = fa_smem<HS>(FA_ROWS + 4 * FA_COLS, 0);  // q, two stages of k and v
    fa_allow_smem(attention_fa2_forward_kernel<Ops, HS, S>, smem);
    dim3 grid((a.q.n + FA_ROWS - 1) / FA_ROWS, a.NH, B);
    attention_fa2_forward_kernel<Ops, HS, S><<<grid, FA_THREADS, smem, neox_cuda_current_stream()>>>(out, lse, x.q, x.k,
                                                                                                     x.v, a);
    CUDA_LAUNCHED();
}

// Shared bytes of the single pass at head size HS: the dk/dv pass's, plus dS's tile below head size 64.
template <int HS> static size_t fa_single_smem() {
    return fa_smem<HS>(2 * FA_ROWS + 4 * FA_COLS, 2 * 2 * FA_COLS) +
           (fa_ds_in_stage<HS>::value ? 0 : (size_t)FA_COLS * FA_DS_PITCH * 2);
}

// The two passes: dq, then dk and dv.
template <class Ops, int HS, class S>
static void fa_backward_two_pass(S *dq, S *dk, S *dv, const fa_strides &dqs, const fa_strides &dkvs, const float *D,
                                 const float *lse, const fa_views<typename Ops::elem> &x, int B, const mma_shape &a) {
    cudaStream_t st = neox_cuda_current_stream();
    size_t smem_q = fa_smem<HS>(2 * FA_ROWS + 4 * FA_COLS, 0);                   // q, dout, two stages of k, v
    size_t smem_kv = fa_smem<HS>(2 * FA_ROWS + 4 * FA_COLS, 2 * 2 * FA_COLS);  // k, v, two stages of q, dout, L, D
    fa_allow_smem(attention_fa2_dq_kernel<Ops, HS, S>, smem_q);
    fa_allow_smem(attention_fa2_dkv_kernel<Ops, HS, S>, smem_kv);
    int tiles = (a.q.n + FA_ROWS - 1) / FA_ROWS, key_tiles = (a.T + FA_ROWS - 1) / FA_ROWS;
    attention_fa2_dq_kernel<Ops, HS, S>
        <<<dim3(tiles, a.NH, B), FA_THREADS, smem_q, st>>>(dq, dqs, D, x.dout, x.q, x.k, x.v, lse, a);
    CUDA_LAUNCHED();
    attention_fa2_dkv_kernel<Ops, HS, S>
        <<<dim3(key_tiles, a.NKV, B), FA_THREADS, smem_kv, st>>>(dk, dv, dkvs, x.dout, x.q, x.k, x.v, lse, D, a);
    CUDA_LAUNCHED();
}

// Scratch of the single pass: dq's fp32 accumulator (B, NH, T, HS), then the ticket and the per-tile
// counters (fa_single_counters of them).
static size_t fa_single_counters(int B, int NH, int T) { return 1 + (size_t)B * NH * ((T + FA_COLS - 1) / FA_COLS); }

// The single pass (the counters zeroed first, so that tickets and turns start at 0), then dq cast from
// its accumulator into place.
template <class Ops, int HS, class S>
static void fa_backward_single(S *dq, S *dk, S *dv, const fa_strides &dqs, const fa_strides &dkvs, const float *D,
                               const float *lse, float *dqacc, unsigned *counters,
                               const fa_views<typename Ops::elem> &x, int B, const mma_shape &a) {
    cudaStream_t st = neox_cuda_current_stream();
    size_t smem = fa_single_smem<HS>();
    fa_allow_smem(attention_fa2_single_kernel<Ops, HS, S>, smem);
    CUDA_CHECK(cudaMemsetAsync(counters, 0, fa_single_counters(B, a.NH, a.T) * sizeof(unsigned), st));
    int tiles = (a.T + FA_ROWS - 1) / FA_ROWS;
    attention_fa2_single_kernel<Ops, HS, S><<<dim3(tiles, a.NKV, B), FA_THREADS, smem, st>>>(
        dk, dv, dkvs, dqacc, counters, x.dout, x.q, x.k, x.v, lse, D, a);
    CUDA_LAUNCHED();
    size_t n = (size_t)B * a.NH * a.T * HS;
    attention_fa2_dq_store_kernel<S><<<blocks_for(n, 256), 256, 0, st>>>(dq, dqs, dqacc, B, a.NH, a.T, HS);
    CUDA_LAUNCHED();
}

// Calls FN<Ops, HS, S>(args...) for the operand type, head size (16, 32, ..., 128) and storage type.
#define FA_DISPATCH(E, HS, ACT, FN, ...)                                                                    \
    do {                                                                                                    \
        if ((ACT) == NEOX_ELEM_BF16) FA_DISPATCH_OPS(E, HS, __nv_bfloat16, FN, __VA_ARGS__);               \
        else FA_DISPATCH_OPS(E, HS, float, FN, __VA_ARGS__);                                                \
    } while (0)
#define FA_DISPATCH_OPS(E, HS, S, FN, ...)                                                                  \
    do {                                                                                                    \
        if ((E) == NEOX_ELEM_BF16) FA_DISPATCH_HS(bf16_ops, HS, S, FN, __VA_ARGS__);                        \
        else FA_DISPATCH_HS(f16_ops, HS, S, FN, __VA_ARGS__);                                               \
    } while (0)
#define FA_DISPATCH_HS(OPS, HS, S, FN, ...)                 \
    do {                                                    \
        switch (HS) {                                       \
        case 16: FN<OPS, 16, S>(__VA_ARGS__); break;        \
        case 32: FN<OPS, 32, S>(__VA_ARGS__); break;        \
        case 48: FN<OPS, 48, S>(__VA_ARGS__); break;        \
        case 64: FN<OPS, 64, S>(__VA_ARGS__); break;        \
        case 80: FN<OPS, 80, S>(__VA_ARGS__); break;        \
        case 96: FN<OPS, 96, S>(__VA_ARGS__); break;        \
        case 112: FN<OPS, 112, S>(__VA_ARGS__); break;      \
        default: FN<OPS, 128, S>(__VA_ARGS__); break;       \
        }                                                   \
    } while (0)

// ---- operands: 16-bit views of the stored tensors -------------------------------------------------

// n elements stored as S rounded to the operand type E (to nearest even, as the CPU reference rounds).
template <class Ops, class S> __global__ void fa_round_kernel(typename Ops::elem *dst, const S *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = Ops::from(act_load(src, i));
}

// Carves consecutive 256-byte-aligned pieces out of one scratch buffer.
static size_t fa_piece(size_t *at, size_t bytes) {
    size_t start = *at;
    *at += (bytes + 255) & ~(size_t)255;
    return start;
}

// Element strides (batch, head, token) of a dense (B, heads, T, HS) tensor, or (B, T, heads, HS).
static fa_strides dense_strides(int heads, int T, int HS, bool bthd) {
    fa_strides x;
    x.sb = (long long)heads * T * HS;
    x.sh = bthd ? HS : (long long)T * HS;
    x.st = bthd ? (long long)heads * HS : HS;
    return x;
}
template <class E> static fa_view<E> view_of(const E *p, fa_strides s) {
    fa_view<E> x;
    x.p = p, x.sb = s.sb, x.sh = s.sh, x.st = s.st;
    return x;
}

// The operand-type values of n elements stored as S: x itself when it is stored in the operand type
// (bf16 storage, bf16 operands), else a copy rounded into the scratch piece.
template <class Ops, class S> static const typename Ops::elem *operands_of(const S *x, size_t n, char *piece) {
    typedef typename Ops::elem E;
    if (std::is_same<E, S>::value) return reinterpret_cast<const E *>(x);
    if (n) {
        fa_round_kernel<Ops, S><<<blocks_for(n, 256), 256, 0, neox_cuda_current_stream()>>>((E *)piece, x, n);
        CUDA_LAUNCHED();
    }
    return (const E *)piece;
}
// Scratch bytes operands_of needs for n elements.
template <class Ops, class S> static size_t operand_bytes(size_t n) {
    return std::is_same<typename Ops::elem, S>::value ? 0 : n * sizeof(typename Ops::elem);
}

// Where one call's tensors are. q, k, v (and the fused buffer they may share) and dout are stored as
// S; qkv_n > 0: q, k, v are views into one fused buffer of qkv_n elements at q (offsets k_off, v_off).
struct fa_call {
    const void *q, *k, *v, *dout;
    size_t qkv_n;
    long long k_off, v_off;
    fa_strides qs, ks, vs;  // (B, heads, Tq or T, HS) strides of q, k, v
    int B, T, Tq, NH, NKV, HS;  // Tq: the query rows (T but under context parallelism)
};

// The 16-bit views of q, k, v (and dout when asked), rounding into scratch from `at` on what is not
// stored in the operand type; *at advances past the pieces used.
template <class Ops, class S>
static fa_views<typename Ops::elem> views_of(const fa_call &c, bool with_dout, char *base, size_t *at) {
    typedef typename Ops::elem E;
    fa_views<E> x;
    size_t nq = (size_t)c.B * c.NH * c.Tq * c.HS, nkv = (size_t)c.B * c.NKV * c.T * c.HS;
    if (c.qkv_n) {
        const E *all = operands_of<Ops>((const S *)c.q, c.qkv_n, base + fa_piece(at, operand_bytes<Ops, S>(c.qkv_n)));
        x.q = view_of(all, c.qs), x.k = view_of(all + c.k_off, c.ks), x.v = view_of(all + c.v_off, c.vs);
    } else {
        x.q = view_of(operands_of<Ops>((const S *)c.q, nq, base + fa_piece(at, operand_bytes<Ops, S>(nq))), c.qs);
        x.k = view_of(operands_of<Ops>((const S *)c.k, nkv, base + fa_piece(at, operand_bytes<Ops, S>(nkv))), c.ks);
        x.v = view_of(operands_of<Ops>((const S *)c.v, nkv, base + fa_piece(at, operand_bytes<Ops, S>(nkv))), c.vs);
    }
    x.dout.p = NULL;
    if (with_dout)
        x.dout = view_of(operands_of<Ops>((const S *)c.dout, nq, base + fa_piece(at, operand_bytes<Ops, S>(nq))),
                         dense_strides(c.NH, c.Tq, c.HS, true));
    return x;
}

// Scratch bytes views_of needs.
template <class Ops, class S> static size_t views_bytes(const fa_call &c, bool with_dout) {
    size_t nq = (size_t)c.B * c.NH * c.Tq * c.HS, nkv = (size_t)c.B * c.NKV * c.T * c.HS, at = 0;
    if (c.qkv_n) fa_piece(&at, operand_bytes<Ops, S>(c.qkv_n));
    else fa_piece(&at, operand_bytes<Ops, S>(nq)), fa_piece(&at, operand_bytes<Ops, S>(nkv)),
         fa_piece(&at, operand_bytes<Ops, S>(nkv));
    if (with_dout) fa_piece(&at, operand_bytes<Ops, S>(nq));
    return at;
}

template <class Ops, int HS, class S>
static void fa_forward_call(void *out, float *lse, const fa_call &c, const mma_shape &a) {
    char *base = (char *)neox_cuda_scratch(views_bytes<Ops, S>(c, false) + 256);
    size_t at = 0;
    fa_views<typename Ops::elem> x = views_of<Ops, S>(c, false, base, &at);
    fa_forward_hs<Ops, HS, S>((S *)out, lse, x, c.B, a);
}

// D (fp32, from the stored out and dout), then the single pass (single) or the two passes.
template <class Ops, int HS, class S>
static void fa_backward_call(void *dq, void *dk, void *dv, const fa_strides &dqs, const fa_strides &dkvs,
                             const void *out, const float *lse, const fa_call &c, const mma_shape &a, bool single) {
    size_t rows = (size_t)c.B * c.NH * c.Tq, at = 0, pd = fa_piece(&at, rows * sizeof(float)), pacc = 0, pcount = 0;
    if (single) {
        pacc = fa_piece(&at, rows * c.HS * sizeof(float));
        pcount = fa_piece(&at, fa_single_counters(c.B, c.NH, c.T) * sizeof(unsigned));
    }
    char *base = (char *)neox_cuda_scratch(at + views_bytes<Ops, S>(c, true) + 256);
    float *D = (float *)(base + pd);
    attention_fa2_d_kernel<S><<<blocks_for(rows * 32, 256), 256, 0, neox_cuda_current_stream()>>>(
        D, (const S *)c.dout, (const S *)out, c.B, c.Tq, c.NH, c.HS);
    CUDA_LAUNCHED();
    fa_views<typename Ops::elem> x = views_of<Ops, S>(c, true, base, &at);
    if (single)
        fa_backward_single<Ops, HS, S>((S *)dq, (S *)dk, (S *)dv, dqs, dkvs, D, lse, (float *)(base + pacc),
                                       (unsigned *)(base + pcount), x, c.B, a);
    else
        fa_backward_two_pass<Ops, HS, S>((S *)dq, (S *)dk, (S *)dv, dqs, dkvs, D, lse, x, c.B, a);
}

static fa_strides strides_of(neox_head_strides v) {
    fa_strides x;
    x.sb = (long long)v.batch, x.sh = (long long)v.head, x.st = (long long)v.row;
    return x;
}

// q (Tq query rows), k, v (T rows) by their views (kernels.h's opts.views: dense, or views into the fused QKV buffer, which
// the kernels read in place when it is stored in the operand type; fa_check refuses other storage).
static fa_call views_call(const void *q, const void *k, const void *v, const void *dout, int B, int T, int Tq,
                          int NH, int NKV, int HS, const neox_qkv_strides &views) {
    fa_call c;
    c.q = q, c.k = k, c.v = v, c.dout = dout, c.qkv_n = 0, c.k_off = c.v_off = 0;
    c.qs = strides_of(neox_head_strides_of(views.q, NH, Tq, HS));
    c.ks = strides_of(neox_head_strides_of(views.k, NKV, T, HS));
    c.vs = strides_of(neox_head_strides_of(views.v, NKV, T, HS));
    c.B = B, c.T = T, c.Tq = Tq, c.NH = NH, c.NKV = NKV, c.HS = HS;
    return c;
}

// q, k, v as views of a fused QKV buffer (B, T, (NH + 2 NKV) HS): the layouts and offsets are
// kernels.h's neox_qkv_fused_layout (the one owner of the fused layouts, the model's and cuDNN's too).
static fa_call fused_call(const void *qkv, int interleaved, const void *dout, int B, int T, int NH, int NKV, int HS) {
    neox_qkv_layout l = neox_qkv_fused_layout(T, NH, NKV, HS, interleaved);
    fa_call c;
    c.q = c.k = c.v = qkv, c.dout = dout, c.qkv_n = (size_t)B * l.strides.q.batch;
    c.k_off = (long long)l.k_offset, c.v_off = (long long)l.v_offset;
    c.qs = strides_of(l.strides.q), c.ks = strides_of(l.strides.k), c.vs = strides_of(l.strides.v);
    c.B = B, c.T = c.Tq = T, c.NH = NH, c.NKV = NKV, c.HS = HS;
    return c;
}

// Views other than dense ones are read in place, so only in the operand type; and the backward
// writes dk and dv by one set of strides.
static void check_views(const neox_attention_opts &o, int T, int NH, int NKV, int HS, neox_elem act) {
    neox_head_strides k = neox_head_strides_of(o.views.k, NKV, T, HS), v = neox_head_strides_of(o.views.v, NKV, T, HS);
    bool dense = neox_head_strides_is_contiguous(o.views.q, NH, T, HS) &&
                 neox_head_strides_is_contiguous(o.views.k, NKV, T, HS) &&
                 neox_head_strides_is_contiguous(o.views.v, NKV, T, HS);
    if (dense) return;
    if (act != o.operands || k.batch != v.batch || k.head != v.head || k.row != v.row) {
        fprintf(stderr, "neox cuda: pipelined attention reads strided q, k, v only stored in the operand type, with "
                        "k and v laid out alike (kernels/cuda/attention.cu splits the others first)\n");
        abort();
    }
}

// Shared bytes of the largest of the forward's (false) or the backward's (true) kernels at head size HS
// (the fa_smem sums of fa_forward_hs and fa_backward_two_pass; the single pass's are fa_single_smem's:
// the same from head size 64 on, dS's tile more below, where the total stays under 99 KB).
static size_t fa_smem_needed(int HS, bool backward, bool single) {
    int rows = backward ? 2 * FA_ROWS + 4 * FA_COLS : FA_ROWS + 4 * FA_COLS;
    size_t ds = backward && single && 2 * (HS + 8) < FA_DS_PITCH ? (size_t)FA_COLS * FA_DS_PITCH * 2 : 0;
    return (size_t)rows * (HS + 8) * 2 + (backward ? 2 * 2 * FA_COLS * sizeof(float) : 0) + ds;
}

// Whether this GPU gives a block that much shared memory: sm_80 163 KB and sm_90 227 KB always do;
// a GPU with 99 KB (sm_86, sm_89) does not for the backward above head size 64, and the call then goes
// to the first kernels (said once on stderr).
static bool fa_smem_fits(size_t bytes) {
    static int optin = -1;
    if (optin < 0) {
        int dev;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    }
    if (bytes <= (size_t)optin) return true;
    static int said;
    if (!said++)
        fprintf(stderr, "neox cuda: attention: pipelined kernels need %zu bytes of shared memory per block, this GPU "
                        "gives %d: the first kernels run\n", bytes, optin);
    return false;
}

// A caller that asks for 16-bit operands at a head size neox_attention_operands would not give is a
// bug; so is a fused GPT-NeoX layout with GQA (its heads interleave q, k and v one for one), and a
// fused buffer with context parallelism's query positions (its queries and keys are the same rows).
static void fa_check(neox_elem e, int HS, neox_elem act) {
    if (neox_attention_operands(e, HS) != e || e == NEOX_ELEM_F32 || (act != NEOX_ELEM_F32 && act != NEOX_ELEM_BF16)) {
        fprintf(stderr, "neox cuda: pipelined attention takes bf16/fp16 operands, head sizes 16, 32, ..., 128 and "
                        "fp32 or bf16 storage (got operands %d, head size %d, storage %d)\n", (int)e, HS, (int)act);
        abort();
    }
}

static void fa_check_fused(int interleaved, int NH, int NKV, const neox_attention_opts &o) {
    if (interleaved && NH != NKV) {
        fprintf(stderr, "neox cuda: the interleaved QKV layout has as many key/value heads as query heads\n");
        abort();
    }
    if (o.q_rows > 0 || o.q_split > 0 || o.q_pos0 != 0) {
        fprintf(stderr, "neox cuda: a fused QKV buffer's queries sit at its own rows (no query positions)\n");
        abort();
    }
}

// The single pass orders dq's additions by key block over queries at their own rows (a tile's turn is
// i0 / 128 - key block, its counters T / 64 per head): context parallelism's query positions break that
// numbering, so a call with them (q_rows, q_split or q_pos0 set) runs the two passes, said once on
// stderr, until the single pass takes positions.
static bool fa_single_pass(const neox_attention_opts &o) {
    if (!neox_cuda_attention_single_pass()) return false;
    if (o.q_rows <= 0 && o.q_split <= 0 && o.q_pos0 == 0) return true;
    static int said;
    if (!said++)
        fprintf(stderr, "neox cuda: attention: pipelined backward: two passes for context parallelism's query "
                        "positions (the single pass takes none yet)\n");
    return false;
}

int neox_cuda_attention_fa2_forward(void *out, float *lse, const void *q, const void *k, const void *v, int B, int T,
                                     int NH, int NKV, int HS, neox_attention_opts o, neox_elem act) {
    fa_check(o.operands, HS, act);
    if (B <= 0 || T <= 0) return 1;
    check_views(o, T, NH, NKV, HS, act);
    if (!fa_smem_fits(fa_smem_needed(HS, false, false))) return 0;
    fa_call c = views_call(q, k, v, NULL, B, T, neox_attention_query_rows(&o, T), NH, NKV, HS, o.views);
    mma_shape a = make_shape(T, NH, NKV, o);
    FA_DISPATCH(o.operands, HS, act, fa_forward_call, out, lse, c, a);
    return 1;
}

int neox_cuda_attention_fa2_backward(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                                      const void *v, const void *out, const float *lse, int B, int T, int NH, int NKV,
                                      int HS, neox_attention_opts o, neox_elem act) {
    fa_check(o.operands, HS, act);
    if (B <= 0 || T <= 0) return 1;
    check_views(o, T, NH, NKV, HS, act);
    const bool single = fa_single_pass(o);
    if (!fa_smem_fits(fa_smem_needed(HS, true, single))) return 0;
    fa_call c = views_call(q, k, v, dout, B, T, neox_attention_query_rows(&o, T), NH, NKV, HS, o.views);
    mma_shape a = make_shape(T, NH, NKV, o);
    FA_DISPATCH(o.operands, HS, act, fa_backward_call, dq, dk, dv, c.qs, c.ks, out, lse, c, a, single);
    return 1;
}

int neox_cuda_attention_fa2_forward_qkv(void *out, float *lse, const void *qkv, int interleaved, int B, int T, int NH,
                                         int NKV, int HS, neox_attention_opts o, neox_elem act) {
    fa_check(o.operands, HS, act);
    fa_check_fused(interleaved, NH, NKV, o);
    if (B <= 0 || T <= 0) return 1;
    if (!fa_smem_fits(fa_smem_needed(HS, false, false))) return 0;
    fa_call c = fused_call(qkv, interleaved, NULL, B, T, NH, NKV, HS);
    mma_shape a = make_shape(T, NH, NKV, o);
    FA_DISPATCH(o.operands, HS, act, fa_forward_call, out, lse, c, a);
    return 1;
}

int neox_cuda_attention_fa2_backward_qkv(void *dqkv, const void *dout, const void *qkv, int interleaved,
                                          const void *out, const float *lse, int B, int T, int NH, int NKV, int HS,
                                          neox_attention_opts o, neox_elem act) {
    fa_check(o.operands, HS, act);
    fa_check_fused(interleaved, NH, NKV, o);
    if (B <= 0 || T <= 0) return 1;
    const bool single = fa_single_pass(o);
    if (!fa_smem_fits(fa_smem_needed(HS, true, single))) return 0;
    fa_call c = fused_call(qkv, interleaved, dout, B, T, NH, NKV, HS);
    mma_shape a = make_shape(T, NH, NKV, o);
    // The gradients land in dqkv's own q, k and v places (the fused buffer's layout): no merge pass.
    size_t es = act == NEOX_ELEM_BF16 ? 2 : 4;
    char *d = (char *)dqkv;
    FA_DISPATCH(o.operands, HS, act, fa_backward_call, d, d + c.k_off * es, d + c.v_off * es, c.qs, c.ks, out, lse, c,
                a, single);
    return 1;
}
