// gemm_bf16.c: bfloat16 matrix products for 16-bit precision on the CPU (gemm_bf16.h). The
// reference widens both operands to fp32 and calls sgemm. The AVX512_BF16 build packs op(B) into
// panels of 32 columns with each column's elements in pairs along K (k even, k odd: one 32-bit
// lane of vdpbf16ps), and op(A) into rows of such pairs, so that one instruction adds 2 products to
// each of 16 sums: a block of 8 rows x 32 columns of C stays in 16 accumulators while K streams by.
// Half the bytes of fp32 operands, twice the products per instruction. Fewer than 8 rows against a
// row-major B (a decoding step) take dot products in place instead. neox_gemm_bf16_rounded stores
// the results rounded to bf16 straight from the registers, for a linear layer without bias under
// bf16 storage (the output layer's logits), which otherwise passes through an fp32 copy of its whole
// result (4096 x 50304 x 4 bytes on the bench's model: fresh pages, faulted in every step).
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

enum { MR = 8, NR = 32, MB = 128 };  // rows per register block, columns per panel, rows per cache block

static uint16_t element(const uint16_t *X, int ld, int trans, int row, int col) {
    return trans ? X[(size_t)col * ld + row] : X[(size_t)row * ld + col];
}

// op(B)'s panel q: pairs p of rows 2p, 2p + 1 of its 32 columns, 64 bytes per pair; zero past the edges.
static void pack_b(uint16_t *panel, const uint16_t *B, int ldb, int trans_b, int K, int N, int q, int KP) {
    int j0 = q * NR;
    for (int p = 0; p < KP; p++)
        for (int jj = 0; jj < NR; jj++)
            for (int t = 0; t < 2; t++) {
                int k = 2 * p + t, j = j0 + jj;
                panel[(size_t)p * 2 * NR + 2 * jj + t] = k < K && j < N ? element(B, ldb, trans_b, k, j) : 0;
            }
}

static uint32_t pair_of(const uint16_t *A, int lda, int trans_a, int M, int K, int i, int p) {
    uint32_t lo = i < M ? element(A, lda, trans_a, i, 2 * p) : 0;
    uint32_t hi = i < M && 2 * p + 1 < K ? element(A, lda, trans_a, i, 2 * p + 1) : 0;
    return lo | hi << 16;
}

// Rows first..first+count of op(A) as pairs along K (32 bits each), zero past K and past row M; a
// transposed A (op(A)'s rows are its columns) is read in tiles of 64 rows x 16 pairs so that reads
// and writes both stay in cache.
static void pack_a(uint32_t *packed, const uint16_t *A, int lda, int trans_a, int M, int K, int first, int count,
                   int KP) {
    enum { TI = 64, TP = 16 };
    int ti = trans_a ? TI : 1, tp = trans_a ? TP : KP;
    for (int i0 = 0; i0 < count; i0 += ti)
        for (int p0 = 0; p0 < KP; p0 += tp)
            for (int i = i0; i < i0 + ti && i < count; i++)
                for (int p = p0; p < p0 + tp && p < KP; p++)
                    packed[(size_t)i * KP + p] = pair_of(A, lda, trans_a, M, K, first + i, p);
}

// Where a product's results go: fp32 C (alpha * sums + beta * C), or bf16 C16 (alpha * sums, each
// rounded once by kernels.h's neox_bf16_from_f32, the rounding activation storage uses).
typedef struct product_out {
    float *C;
    uint16_t *C16;
    int ldc;
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

// C rows i0..i0+rows, panel columns j0..j0+cols: alpha * (8 x 32 block of sums) + beta * C.
__attribute__((target("avx512f,avx512bf16"))) static void block(const uint32_t *a, const uint16_t *panel, int KP,
                                                               int rows, int cols, int j0, float alpha, float beta,
                                                               product_out out, int i0) {
    __m512 acc[MR][2];
    for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int p = 0; p < KP; p++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(panel + (size_t)p * 2 * NR);
        __m512bh b1 = (__m512bh)_mm512_loadu_si512(panel + (size_t)p * 2 * NR + NR);
        for (int r = 0; r < MR; r++) {
            __m512bh x = (__m512bh)_mm512_set1_epi32((int)a[(size_t)r * KP + p]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, b0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, b1);
        }
    }
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < 2; h++) {
            int n = cols - 16 * h;
            if (n <= 0) break;
            __mmask16 m = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
            size_t at = (size_t)(i0 + r) * out.ldc + j0 + 16 * h;
            __m512 v = _mm512_mul_ps(va, acc[r][h]);
            if (out.C16) {
                store_rounded(out.C16 + at, v, m);
                continue;
            }
            float *c = out.C + at;
            if (beta != 0.0f) v = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m, c), v);
            _mm512_mask_storeu_ps(c, m, v);
        }
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

// The packed op(B) of the calling thread, kept between calls: the output layer's is tens of MB, and a
// fresh allocation of that size each call costs as much in page faults as the packing itself.
static _Thread_local uint16_t *packed_b;
static _Thread_local size_t packed_b_size;

// The packed product of at least MR rows into out.
static void packed_product(int trans_a, int trans_b, int M, int N, int K, float alpha, const uint16_t *A, int lda,
                           const uint16_t *B, int ldb, float beta, product_out out) {
    int KP = (K + 1) / 2, MP = (M + MR - 1) / MR * MR, panels = (N + NR - 1) / NR, mblocks = (MP + MB - 1) / MB;
    size_t b_size = (size_t)panels * KP * 2 * NR;
    if (b_size > packed_b_size) {
        free(packed_b);
        packed_b = scratch(b_size * sizeof *packed_b);
        packed_b_size = b_size;
    }
    uint16_t *b = packed_b;
    #pragma omp parallel for schedule(static)
    for (int q = 0; q < panels; q++) pack_b(b + (size_t)q * KP * 2 * NR, B, ldb, trans_b, K, N, q, KP);
    // Each thread packs one block of MB rows of op(A) at a time (its own buffer, allocated once per
    // call) and runs it against every panel, which stay in the shared cache.
    #pragma omp parallel
    {
        uint32_t *a = scratch((size_t)MB * (KP ? KP : 1) * sizeof *a);
        #pragma omp for schedule(dynamic, 1)
        for (int mb = 0; mb < mblocks; mb++) {
            int first = mb * MB, rows_here = MP - first < MB ? MP - first : MB;
            pack_a(a, A, lda, trans_a, M, K, first, rows_here, KP);
            for (int q = 0; q < panels; q++) {
                int cols = N - q * NR < NR ? N - q * NR : NR;
                for (int i0 = 0; i0 < rows_here && first + i0 < M; i0 += MR) {
                    int rows = M - first - i0 < MR ? M - first - i0 : MR;
                    block(a + (size_t)i0 * KP, b + (size_t)q * KP * 2 * NR, KP, rows, cols, q * NR, alpha, beta, out,
                          first + i0);
                }
            }
        }
        free(a);
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

int neox_gemm_bf16_rounded(int M, int N, int K, float alpha, const uint16_t *A, int lda, const uint16_t *B, int ldb,
                           uint16_t *C, int ldc) {
    // Fewer rows go to the decoding products (neox_gemm_ex), whose fp32 results the caller rounds.
    if (M <= NEOX_DECODE_MAX_ROWS || N <= 0 || K <= 0 || !neox_cpu_has_avx512_bf16()) return 0;
    packed_product(0, 1, M, N, K, alpha, A, lda, B, ldb, 0.0f, (product_out){.C16 = C, .ldc = ldc});
    return 1;
}

int neox_cpu_has_avx512_bf16(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512bf16");
}

#else  // not x86-64: the reference stands in for the vector build, which never runs here

void neox_gemm_bf16_avx512(int trans_a, int trans_b, int M, int N, int K, float alpha, const uint16_t *A, int lda,
                           const uint16_t *B, int ldb, float beta, float *C, int ldc) {
    neox_gemm_bf16_reference(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
int neox_cpu_has_avx512_bf16(void) { return 0; }
int neox_gemm_bf16_rounded(int M, int N, int K, float alpha, const uint16_t *A, int lda, const uint16_t *B, int ldb,
                           uint16_t *C, int ldc) {
    (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb, (void)C, (void)ldc;
    return 0;
}

#endif

neox_gemm_bf16_fn *neox_gemm_bf16_best(void) {
    return neox_cpu_has_avx512_bf16() ? neox_gemm_bf16_avx512 : neox_gemm_bf16_reference;
}
