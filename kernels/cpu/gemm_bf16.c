// gemm_bf16.c: bfloat16 matrix products for 16-bit precision on the CPU (gemm_bf16.h). The
// reference widens both operands to fp32 and calls sgemm. The AVX512_BF16 build packs op(B) into
// panels of 32 columns with each column's elements in pairs along K (k even, k odd: one 32-bit
// lane of vdpbf16ps), and broadcasts op(A)'s pairs, so that one instruction adds 2 products to each
// of 16 sums: a block of 8 rows x 32 columns of C stays in 16 accumulators while K streams by (about
// one vdpbf16ps a cycle, the core's rate for it). op(A) = A (M, K) with K even is read where it lies
// (each row's pairs are already together); A (K, M) (a weight gradient) is packed into blocks of 8
// rows whose pairs lie together step by step. Half the bytes of fp32 operands, twice the products
// per instruction. The threads share a product in one parallel region with no barrier inside
// (packed_product). Fewer than 8 rows against a row-major B (a decoding step) take dot products in
// place instead. neox_gemm_bf16_rounded stores the results rounded to bf16 straight from the
// registers, with the bias or the old value added there, for a linear layer under bf16 storage,
// which otherwise passes through an fp32 copy of its whole result (4096 x 50304 x 4 bytes for the
// bench's logits: fresh pages, faulted in every step).
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/scratch.h"
#include "kernels/kernels.h"

static void *scratch(size_t bytes) { return neox_cpu_scratch(bytes, "bfloat16 product scratch"); }

void neox_gemm_bf16_reference(int trans_a, int trans_b, int M, int N, int K, float alpha, const uint16_t *A, int lda,
                              const uint16_t *B, int ldb, float beta, float *C, int ldc) {
    size_t na = trans_a ? (size_t)K * lda : (size_t)M * lda, nb = trans_b ? (size_t)N * ldb : (size_t)K * ldb;
    float *a = scratch((na ? na : 1) * sizeof *a), *b = scratch((nb ? nb : 1) * sizeof *b);
    // Strided views' last rows may be short: widen only what they cover.
    size_t ea = trans_a ? (K ? (size_t)(K - 1) * lda + M : 0) : (M ? (size_t)(M - 1) * lda + K : 0);
    size_t eb = trans_b ? (N ? (size_t)(N - 1) * ldb + K : 0) : (K ? (size_t)(K - 1) * ldb + N : 0);
    neox_cast_bf16_to_f32(a, A, ea);
    neox_cast_bf16_to_f32(b, B, eb);
    neox_cpu_sgemm(trans_a, trans_b, M, N, K, alpha, a, lda, b, ldb, beta, C, ldc);
    free(a), free(b);
}

#if defined(__x86_64__)
#include <immintrin.h>

// MR rows per register block, NR columns per panel, MB rows per cache block of A, and the bytes of
// packed B one work item of a product split over columns aims for (with a block of A, in L2);
// KC pairs of K per block along K (a panel's block: KC x 128 bytes, 32 KB of the 48 KB L1).
// PREFETCH_PAIRS: how many pairs of rows ahead pack_a fetches A (K, M).
// B_IN_L2_BYTES: the most packed B a product split by rows streams again for every block of MB rows.
enum { MR = 8, NR = 32, MB = 128, KC = 256, CHUNK_BYTES = 256 * 1024, PREFETCH_PAIRS = 8, B_IN_L2_BYTES = 1024 * 1024 };

static uint16_t element(const uint16_t *X, int ld, int trans, int row, int col) {
    return trans ? X[(size_t)col * ld + row] : X[(size_t)row * ld + col];
}

// Two bfloat16 neighbours (x[0] low, x[1] high) as one 32-bit pair, wherever they lie.
static uint32_t word_at(const uint16_t *x) {
    uint32_t w;
    memcpy(&w, x, sizeof w);
    return w;
}

// dst[0..8) = pairs (lo[c], hi[c]) of 8 neighbouring columns of two rows (SSE2, part of x86-64).
static void interleave8(uint32_t *dst, const uint16_t *lo, const uint16_t *hi) {
    __m128i l = _mm_loadu_si128((const __m128i *)lo), h = _mm_loadu_si128((const __m128i *)hi);
    _mm_storeu_si128((__m128i *)dst, _mm_unpacklo_epi16(l, h));
    _mm_storeu_si128((__m128i *)(dst + 4), _mm_unpackhi_epi16(l, h));
}

// dst[k * dst_words + i] = the k-th pair of src row i (rows src_ld elements apart), i, k < 16: a 16 x
// 16 transpose of 32-bit words in four rounds of shuffles. After the two unpacks each 128-bit lane
// holds one word of 4 rows (u[4g + m], lane L: word 4L + m of rows 4g..4g+3); the two lane shuffles
// gather the 4 groups' lanes of word 4L + m into one vector.
__attribute__((target("avx512f"))) static void transpose16(uint32_t *dst, size_t dst_words, const uint16_t *src,
                                                         size_t src_ld) {
    __m512i r[16], t[16], u[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(src + (size_t)i * src_ld);
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);      // words 0, 1 of rows i, i + 1 (per lane)
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);  // words 2, 3
    }
    for (int g = 0; g < 16; g += 4) {
        u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
        u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
        u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
        u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
    }
    for (int m = 0; m < 4; m++) {
        __m512i v = _mm512_shuffle_i32x4(u[m], u[4 + m], 0x88), w = _mm512_shuffle_i32x4(u[m], u[4 + m], 0xdd);
        __m512i v2 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0x88);
        __m512i w2 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0xdd);
        _mm512_storeu_si512(dst + (size_t)m * dst_words, _mm512_shuffle_i32x4(v, v2, 0x88));
        _mm512_storeu_si512(dst + (size_t)(4 + m) * dst_words, _mm512_shuffle_i32x4(w, w2, 0x88));
        _mm512_storeu_si512(dst + (size_t)(8 + m) * dst_words, _mm512_shuffle_i32x4(v, v2, 0xdd));
        _mm512_storeu_si512(dst + (size_t)(12 + m) * dst_words, _mm512_shuffle_i32x4(w, w2, 0xdd));
    }
}

// op(B)'s panels q0..q1 into panels: panel q holds pairs p of rows 2p, 2p + 1 of its NR columns, one
// 32-bit word per column (panel[p * NR + c]: 64 bytes per pair), zero past the edges. The pairs whose
// both rows lie inside K in a full panel are copied as words (B (N, K): each column's pairs lie
// together: 16 columns x 16 pairs transposed at a time) or interleaved from two rows (B (K, N)); the
// rest element by element.
static void pack_b(uint32_t *panels, const uint16_t *B, int ldb, int trans_b, int K, int N, int q0, int q1, int KP) {
    int KF = K / 2;
    for (int q = q0; q < q1; q++) {
        uint32_t *panel = panels + (size_t)(q - q0) * KP * NR;
        int j0 = q * NR, full = j0 + NR <= N, p_edge = full ? KF : 0;
        if (full && trans_b) {
            int p16 = KF / 16 * 16;  // pairs moved 16 x 16 at a time
            for (int c = 0; c < NR; c += 16)
                for (int p = 0; p < p16; p += 16)
                    transpose16(panel + (size_t)p * NR + c, NR, B + (size_t)(j0 + c) * ldb + 2 * p, (size_t)ldb);
            for (int c = 0; c < NR; c++) {
                const uint16_t *col = B + (size_t)(j0 + c) * ldb;
                for (int p = p16; p < KF; p++) panel[(size_t)p * NR + c] = word_at(col + 2 * p);
            }
        } else if (full)
            for (int p = 0; p < KF; p++)
                for (int c = 0; c < NR; c += 8)
                    interleave8(panel + (size_t)p * NR + c, B + (size_t)2 * p * ldb + j0 + c,
                                B + (size_t)(2 * p + 1) * ldb + j0 + c);
        for (int p = p_edge; p < KP; p++)
            for (int c = 0; c < NR; c++) {
                int k = 2 * p, j = j0 + c;
                uint32_t lo = j < N ? element(B, ldb, trans_b, k, j) : 0;
                uint32_t hi = j < N && k + 1 < K ? element(B, ldb, trans_b, k + 1, j) : 0;
                panel[(size_t)p * NR + c] = lo | hi << 16;
            }
    }
}

// Rows first..first+count of op(A) (count a multiple of MR) as blocks of MR rows, each block's pairs
// along K one after the other (block[p * MR + r]: the MR words one step of the register block
// broadcasts lie together), zero past K and past row M. Full blocks copy words (A (M, K)) or
// interleave two rows of A (K, M), pair by pair down A; the rest element by element.
static void pack_a(uint32_t *packed, const uint16_t *A, int lda, int trans_a, int M, int K, int first, int count,
                   int KP) {
    int KF = K / 2, full_blocks = first + count <= M ? count / MR : (M - first) / MR;
    if (trans_a)
        for (int p = 0; p < KF; p++) {
            // The rows of A (K, M) lie lda apart, a page or more for a wide layer's gradient, where the
            // hardware's prefetchers do not follow: fetch the pair PREFETCH_PAIRS ahead in time.
            if (p + PREFETCH_PAIRS < KF)
                for (int c = 0; c < full_blocks * MR; c += 32)
                    for (int h = 0; h < 2; h++)
                        _mm_prefetch((const char *)(A + (size_t)(2 * (p + PREFETCH_PAIRS) + h) * lda + first + c),
                                     _MM_HINT_T0);
            for (int b = 0; b < full_blocks; b++)
                interleave8(packed + ((size_t)b * KP + p) * MR, A + (size_t)2 * p * lda + first + b * MR,
                            A + (size_t)(2 * p + 1) * lda + first + b * MR);
        }
    else
        for (int b = 0; b < full_blocks; b++)
            for (int r = 0; r < MR; r++) {
                const uint16_t *row = A + (size_t)(first + b * MR + r) * lda;
                uint32_t *block = packed + (size_t)b * KP * MR;
                for (int p = 0; p < KF; p++) block[(size_t)p * MR + r] = word_at(row + 2 * p);
            }
    for (int b = 0; b < count / MR; b++)
        for (int p = b < full_blocks ? KF : 0; p < KP; p++)
            for (int r = 0; r < MR; r++) {
                int i = first + b * MR + r, k = 2 * p;
                uint32_t lo = i < M ? element(A, lda, trans_a, i, k) : 0;
                uint32_t hi = i < M && k + 1 < K ? element(A, lda, trans_a, i, k + 1) : 0;
                packed[((size_t)b * KP + p) * MR + r] = lo | hi << 16;
            }
}

// Where a product's results go: fp32 C (alpha * sums + beta * C), or bf16 C16 (alpha * sums + the
// addend: bias[j], C16's old value widened, or none; each rounded once by kernels.h's
// neox_bf16_from_f32, the rounding activation storage uses).
typedef struct product_out {
    float *C;
    uint16_t *C16;
    const float *bias;
    int accumulate, ldc;
} product_out;

// alpha * sums v rounded into bf16 c16 (the lanes of m): kernels.h's neox_bf16_from_f32 on 16 lanes,
// the same integer steps (a NaN kept quiet, otherwise round to nearest even on the high half), so
// the same bits.
__attribute__((target("avx512f"))) static void store_rounded(uint16_t *c16, __m512 v, __mmask16 m) {
    __m512i bits = _mm512_castps_si512(v), high = _mm512_srli_epi32(bits, 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(high, _mm512_set1_epi32(1)));
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, bias), 16);
    __m512i quiet = _mm512_or_si512(high, _mm512_set1_epi32(0x40));
    _mm512_mask_cvtepi32_storeu_epi16(c16, m, _mm512_mask_mov_epi32(rounded, nan, quiet));
}

// One product: its operands, the pairs along K (KP) and panels of op(B), whether op(A)'s full blocks
// of rows are read in place (in_place), and where its results go.
typedef struct product {
    int trans_a, trans_b, M, N, K, KP, panels, in_place;
    float alpha, beta;
    const uint16_t *A, *B;
    int lda, ldb;
    product_out out;
} product;

// The fp32 values of 16 bf16 elements (lanes of m; the others zero).
__attribute__((target("avx512f,avx512bw,avx512vl"))) static __m512 widened(const uint16_t *p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

// One row of a block's sums (acc: columns j0..j0+32, cols of them in C) into bf16 row i of C16:
// alpha * sums plus the addend, rounded. vcvtne2ps2bf16 rounds 32 lanes in one instruction with the
// steps of store_rounded for every value but subnormals, which it flushes to zero; the sums never
// are (vdpbf16ps flushes them), but alpha's product or the addend's sum can be, so a row with one
// takes store_rounded. Multiplying by an alpha of 1 and adding nothing are skipped: the same bits.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"), always_inline)) static inline void
store_row_rounded(
    const product *g, const __m512 acc[2], int i, int j0, int cols) {
    product_out out = g->out;
    __m512 v[2], va = _mm512_set1_ps(g->alpha), one = _mm512_set1_ps(1.0f);
    __mmask16 m[2];
    uint16_t *c16 = out.C16 + (size_t)i * out.ldc + j0;
    __mmask16 subnormal = 0;
    for (int h = 0; h < 2; h++) {
        int n = cols - 16 * h;
        m[h] = n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
        v[h] = g->alpha == 1.0f ? acc[h] : _mm512_mul_ps(va, acc[h]);
        if (out.bias) v[h] = _mm512_fmadd_ps(one, _mm512_maskz_loadu_ps(m[h], out.bias + j0 + 16 * h), v[h]);
        else if (out.accumulate) v[h] = _mm512_fmadd_ps(one, widened(c16 + 16 * h, m[h]), v[h]);
        subnormal |= _mm512_mask_fpclass_ps_mask(m[h], v[h], 0x20);
    }
    if (subnormal) {
        for (int h = 0; h < 2; h++)
            if (m[h]) store_rounded(c16 + 16 * h, v[h], m[h]);
        return;
    }
    __mmask32 m32 = (__mmask32)m[0] | (__mmask32)m[1] << 16;
    _mm512_mask_storeu_epi16(c16, m32, (__m512i)_mm512_cvtne2ps_pbh(v[1], v[0]));
}

// C rows i0..i0+rows, panel columns j0..j0+cols: alpha * (8 x 32 block of sums) + beta * C (or the
// addend: the same fused multiply-add by 1, so the same bits as fp32 rows holding it), over pairs
// p0..p0+np of K. Each sum starts at zero and takes the pairs of K in order, whatever the blocking
// around it: a block of K that is not the first resumes the sums from part (fp32, exact), one that is
// not the last leaves them there instead of finishing them.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"), always_inline)) static inline void block_body(
    const product *g, const uint16_t *a, size_t row_step, size_t pair_step, const uint32_t *panel, int p0, int np,
    float *part, int rows, int cols, int i0, int j0) {
    __m512 acc[MR][2];
    int first = p0 == 0, last = p0 + np == g->KP;
    for (int r = 0; r < MR; r++)
        for (int h = 0; h < 2; h++) acc[r][h] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(part + (r * 2 + h) * 16);
    // The rows of C this block stores, fetched while it sums: for a wide output (the logits: 16 MB)
    // each is a miss, and waiting for it at the store costs more than the few loads now.
    if (last)
        for (int r = 0; r < rows; r++) {
            const char *c = g->out.C16 ? (const char *)(g->out.C16 + (size_t)(i0 + r) * g->out.ldc + j0)
                                       : (const char *)(g->out.C + (size_t)(i0 + r) * g->out.ldc + j0);
            _mm_prefetch(c, _MM_HINT_T0);
            _mm_prefetch(c + 64 - 1, _MM_HINT_T0);
            if (!g->out.C16) _mm_prefetch(c + 128 - 1, _MM_HINT_T0);
        }
    a += (size_t)p0 * pair_step, panel += (size_t)p0 * NR;
    for (int p = 0; p < np; p++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(panel + (size_t)p * NR);
        __m512bh b1 = (__m512bh)_mm512_loadu_si512(panel + (size_t)p * NR + 16);
        for (int r = 0; r < MR; r++) {
            __m512bh x = (__m512bh)_mm512_set1_epi32((int)word_at(a + r * row_step + (size_t)p * pair_step));
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, b0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, b1);
        }
    }
    if (!last) {
        for (int r = 0; r < MR; r++)
            for (int h = 0; h < 2; h++) _mm512_storeu_ps(part + (r * 2 + h) * 16, acc[r][h]);
        return;
    }
    product_out out = g->out;
    if (out.C16) {
        for (int r = 0; r < rows; r++) store_row_rounded(g, acc[r], i0 + r, j0, cols);
        return;
    }
    float beta = g->beta;
    __m512 va = _mm512_set1_ps(g->alpha), vb = _mm512_set1_ps(beta);
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < 2; h++) {
            int n = cols - 16 * h;
            if (n <= 0) break;
            __mmask16 m = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
            float *c = out.C + (size_t)(i0 + r) * out.ldc + j0 + 16 * h;
            __m512 v = g->alpha == 1.0f ? acc[r][h] : _mm512_mul_ps(va, acc[r][h]);
            if (beta != 0.0f) v = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m, c), v);
            _mm512_mask_storeu_ps(c, m, v);
        }
}

// The block on MR rows of op(A) packed (block[p * MR + r], pack_a) or read in place: rows of A (M, K)
// lda apart, whose pairs along K already lie together. The 8 rows' words are the same either way, so
// are the sums; in place spares the packing's pass over A (the input gradient of the output layer
// reads a 1024 x 8192 A once per product, and packing it was a tenth of that product's time).
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"))) static void block_packed(
    const product *g, const uint32_t *a, const uint32_t *panel, int p0, int np, float *part, int rows, int cols, int i0,
    int j0) {
    block_body(g, (const uint16_t *)a, 2, 2 * MR, panel, p0, np, part, rows, cols, i0, j0);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"))) static void block_in_place(
    const product *g, const uint16_t *a, const uint32_t *panel, int p0, int np, float *part, int cols, int i0, int j0) {
    block_body(g, a, (size_t)g->lda, 2, panel, p0, np, part, MR, cols, i0, j0);
}

// A few rows against B (N, K) row-major, as a decoding step multiplies: packing B would read and
// write all of it for a handful of dot products, so each C[i][j] is a dot product of A's row i and
// B's row j read where they lie (their elements already pair along K), 32 at a time.
// (The vector code is a function of its own: clang does not carry a target attribute into the
// OpenMP region's outlined body.)
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static float dot_bf16(const uint16_t *a, const uint16_t *b, int K) {
    __m512 acc = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 32) {
        __mmask32 m = K - k >= 32 ? 0xffffffffu : (__mmask32)((1u << (K - k)) - 1);
        acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_maskz_loadu_epi16(m, a + k), (__m512bh)_mm512_maskz_loadu_epi16(m, b + k));
    }
    return _mm512_reduce_add_ps(acc);
}

static void few_rows(int M, int N, int K, float alpha, const uint16_t *A, int lda, const uint16_t *B, int ldb, float beta,
                     float *C, int ldc) {
    #pragma omp parallel for schedule(static)
    for (int j = 0; j < N; j++)
        for (int i = 0; i < M; i++) {
            float *c = C + (size_t)i * ldc + j, dot = dot_bf16(A + (size_t)i * lda, B + (size_t)j * ldb, K);
            *c = alpha * dot + (beta != 0.0f ? beta * *c : 0.0f);
        }
}

// Each thread's packed operands, kept between calls: the output layer's are MBs, and a fresh
// allocation of that size each call costs as much in page faults as the packing itself.
// (kept_part: the sums carried from one block of K to the next, fp32, 4 bytes a word like the others.)
static _Thread_local uint32_t *kept_a, *kept_b, *kept_part;
static _Thread_local size_t kept_a_words, kept_b_words, kept_part_words;

static uint32_t *kept(uint32_t **buf, size_t *words, size_t need) {
    if (need > *words) {
        free(*buf);
        *buf = scratch(need * sizeof **buf);
        *words = need;
    }
    return *buf;
}

// The partial sums of up to rows rows x panels panels (none needed when K fits one block).
static float *partial_sums(int KP, int rows, int panels) {
    if (KP <= KC) return NULL;
    return (float *)kept(&kept_part, &kept_part_words, (size_t)rows * panels * NR);
}

// Rows first..first+rows of C against panels q0..q1 (packed in b), in blocks of KC pairs along K (a
// block of a panel stays in L1 while the rows' blocks stream past it), the sums between them in part
// (MR x NR floats per register block). op(A)'s rows are packed in a, MR rows a block, or read in
// place (g->in_place), all but a last block of fewer than MR rows, which a holds packed.
static void run_blocks(const product *g, const uint32_t *a, int first, int rows, const uint32_t *b, int q0, int q1,
                       float *part) {
    for (int p0 = 0; p0 < g->KP || p0 == 0; p0 += KC) {
        int np = g->KP - p0 < KC ? g->KP - p0 : KC;
        for (int q = q0; q < q1; q++) {
            int cols = g->N - q * NR < NR ? g->N - q * NR : NR;
            const uint32_t *panel = b + (size_t)(q - q0) * g->KP * NR;
            for (int i0 = 0; i0 < rows && first + i0 < g->M; i0 += MR) {
                int n = g->M - first - i0 < MR ? g->M - first - i0 : MR;
                float *sums = part ? part + ((size_t)(q - q0) * (rows / MR) + i0 / MR) * MR * NR : NULL;
                if (g->in_place && n == MR)
                    block_in_place(g, g->A + (size_t)(first + i0) * g->lda, panel, p0, np, sums, cols, first + i0,
                                   q * NR);
                else
                    block_packed(g, g->in_place ? a : a + (size_t)i0 * g->KP, panel, p0, np, sums, n, cols,
                                 first + i0, q * NR);
            }
        }
    }
}

// The packed product of at least MR rows into out, split over the larger of M and N: the work items
// are blocks of MB rows (M >= N) or chunks of panels, taken by the threads one at a time (a thread
// that other work slows takes fewer), each packed by the thread that takes it. Each thread packs
// the other operand whole for itself on its first item, so no thread ever waits for another's
// packing: one parallel region, no barrier inside it. op(A) = A (M, K) with K even is read in place
// but for its last rows if fewer than MR (packed once per thread, zero past M).
static void packed_product(int trans_a, int trans_b, int M, int N, int K, float alpha, const uint16_t *A, int lda,
                           const uint16_t *B, int ldb, float beta, product_out out) {
    int KP = (K + 1) / 2, MP = (M + MR - 1) / MR * MR, panels = (N + NR - 1) / NR, in_place = !trans_a && K % 2 == 0;
    product g = {trans_a, trans_b, M, N, K, KP, panels, in_place, alpha, beta, A, B, lda, ldb, out};
    size_t panel_words = (size_t)(KP ? KP : 1) * NR;
    int by_rows = M >= N, threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    // Panels per chunk: CHUNK_BYTES of them, fewer where that would leave under 4 chunks a thread.
    int chunk = (int)(CHUNK_BYTES / (panel_words * 4));
    if (chunk > panels / (4 * threads)) chunk = panels / (4 * threads);
    if (chunk < 1) chunk = 1;
    // Rows per item split by rows: MB, or twice that where the packed B outgrows L2 (the output
    // layer's input gradient: 4 MB) and there are rows for 2 such items a thread: every item streams
    // all of B again from L3, which the two cores share. (More rows than that, and the items' partial
    // sums and rows of A no longer stay in L2 beside a block of B.)
    int mb = by_rows && (size_t)panels * panel_words * 4 > B_IN_L2_BYTES && MP >= 4 * threads * MB ? 2 * MB : MB;
    int items = by_rows ? (MP + mb - 1) / mb : (panels + chunk - 1) / chunk;
    #pragma omp parallel
    {
        uint32_t *whole = NULL;  // the operand this thread packs whole (B by rows, A by columns)
        uint32_t *edge = NULL;   // in place: A's last block of fewer than MR rows, packed
        if (in_place && M % MR) {
            edge = kept(&kept_a, &kept_a_words, panel_words / NR * MR);
            pack_a(edge, A, lda, 0, M, K, M / MR * MR, MR, KP);
        }
        #pragma omp for schedule(dynamic, 1)
        for (int item = 0; item < items; item++) {
            if (by_rows) {
                if (!whole) {
                    whole = kept(&kept_b, &kept_b_words, (size_t)panels * panel_words);
                    pack_b(whole, B, ldb, trans_b, K, N, 0, panels, KP);
                }
                int first = item * mb, rows = MP - first < mb ? MP - first : mb;
                uint32_t *a = edge;
                if (!in_place) {
                    a = kept(&kept_a, &kept_a_words, (size_t)mb * panel_words / NR);
                    pack_a(a, A, lda, trans_a, M, K, first, rows, KP);
                }
                run_blocks(&g, a, first, rows, whole, 0, panels, partial_sums(KP, mb, panels));
            } else {
                if (!whole && !in_place) {
                    whole = kept(&kept_a, &kept_a_words, (size_t)MP * panel_words / NR);
                    pack_a(whole, A, lda, trans_a, M, K, 0, MP, KP);
                }
                int q0 = item * chunk, q1 = q0 + chunk < panels ? q0 + chunk : panels;
                uint32_t *b = kept(&kept_b, &kept_b_words, (size_t)chunk * panel_words);
                pack_b(b, B, ldb, trans_b, K, N, q0, q1, KP);
                for (int first = 0; first < MP; first += MB)
                    run_blocks(&g, in_place ? edge : whole + (size_t)first * KP, first,
                               MP - first < MB ? MP - first : MB, b, q0, q1, partial_sums(KP, MB, q1 - q0));
            }
        }
    }
}

void neox_gemm_bf16_avx512(int trans_a, int trans_b, int M, int N, int K, float alpha, const uint16_t *A, int lda,
                           const uint16_t *B, int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (M < MR && !trans_a && trans_b) {
        few_rows(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    packed_product(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, (product_out){.C = C, .ldc = ldc});
}

int neox_gemm_bf16_rounded(int trans_a, int trans_b, int M, int N, int K, float alpha, const uint16_t *A, int lda,
                           const uint16_t *B, int ldb, const float *bias, int accumulate, uint16_t *C, int ldc) {
    // A decoding step's few rows go to neox_gemm_ex's dot products, whose fp32 results the caller rounds.
    int decoding = !trans_a && trans_b && M <= NEOX_DECODE_MAX_ROWS;
    if (decoding || M <= 0 || N <= 0 || K <= 0 || (bias && accumulate) || !neox_cpu_has_avx512_bf16()) return 0;
    packed_product(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, 0.0f,
                   (product_out){.C16 = C, .bias = bias, .accumulate = accumulate, .ldc = ldc});
    return 1;
}

int neox_cpu_has_avx512_bf16(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bf16");
}

#else  // not x86-64: the reference stands in for the vector build, which never runs here

void neox_gemm_bf16_avx512(int trans_a, int trans_b, int M, int N, int K, float alpha, const uint16_t *A, int lda,
                           const uint16_t *B, int ldb, float beta, float *C, int ldc) {
    neox_gemm_bf16_reference(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
int neox_cpu_has_avx512_bf16(void) { return 0; }
int neox_gemm_bf16_rounded(int trans_a, int trans_b, int M, int N, int K, float alpha, const uint16_t *A, int lda,
                           const uint16_t *B, int ldb, const float *bias, int accumulate, uint16_t *C, int ldc) {
    (void)trans_a, (void)trans_b, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb;
    (void)bias, (void)accumulate, (void)C, (void)ldc;
    return 0;
}

#endif

neox_gemm_bf16_fn *neox_gemm_bf16_best(void) {
    return neox_cpu_has_avx512_bf16() ? neox_gemm_bf16_avx512 : neox_gemm_bf16_reference;
}
