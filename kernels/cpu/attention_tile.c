// attention_tile.c: attention's tile products (attention_tile.h), first with bfloat16 operands in pairs.
// The reference takes each pair as vdpbf16ps does, the odd element's product first and then the
// even one's, both exact in fp32, so the two builds give the same sums bit for bit where no input or
// result is subnormal; it is vectorised along the columns and built for AVX-512 and AVX2 too
// (NEOX_CLONES), the product CPUs without AVX512_BF16 run. The AVX512_BF16 build keeps a block of 4
// rows x 64 columns of C in 16 accumulators while the pairs stream by: per pair 4 broadcasts of A, 4
// loads of B and 16 vdpbf16ps, each adding 32 products.
#include <string.h>

#include "kernels/cpu/attention_tile.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/vector_math.h"
#include "kernels/kernels.h"

// The even (low) and odd (high) halves of a pair word as fp32 (exact).
static inline float low_of(uint32_t w) {
    uint32_t bits = w << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
static inline float high_of(uint32_t w) {
    uint32_t bits = w & 0xffff0000u;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint32_t pair_of(uint16_t lo, uint16_t hi) { return (uint32_t)lo | (uint32_t)hi << 16; }

// A's pair word p, read as bytes: A's rows may be bf16 tensors seen as pairs.
static inline uint32_t word_at(const uint32_t *a, int p) {
    uint32_t w;
    memcpy(&w, a + p, sizeof w);
    return w;
}

// acc: (N) row of sums; a: A's row of KP pairs; b: B (KP, N).
NEOX_CLONES static void reference_row(float *acc, int N, int KP, const uint32_t *a, const uint32_t *b, size_t ldb) {
    for (int j = 0; j < N; j++) acc[j] = 0.0f;
    for (int p = 0; p < KP; p++) {
        uint32_t w = word_at(a, p);
        float ah = high_of(w), al = low_of(w);
        const uint32_t *bp = b + (size_t)p * ldb;
        #pragma omp simd
        for (int j = 0; j < N; j++) {
            float s = acc[j] + ah * high_of(bp[j]);
            acc[j] = s + al * low_of(bp[j]);
        }
    }
}

void neox_att_tile_reference(int M, int N, int KP, const uint32_t *a, size_t lda, const uint32_t *b, size_t ldb,
                             float *c, size_t ldc, int accumulate) {
    enum { MAX_N = 256 };
    float acc[MAX_N];
    for (int j0 = 0; j0 < N; j0 += MAX_N) {
        int n = N - j0 < MAX_N ? N - j0 : MAX_N;
        for (int i = 0; i < M; i++) {
            float *ci = c + (size_t)i * ldc + j0;
            reference_row(acc, n, KP, a + (size_t)i * lda, b + j0, ldb);
            for (int j = 0; j < n; j++) ci[j] = accumulate ? ci[j] + acc[j] : acc[j];
        }
    }
}

#if defined(__x86_64__)
#include <immintrin.h>

enum { MR = 4, NV = 4 };  // rows and 16-column vectors of a register block

// Rows i0..i0+MR of C (only `rows` of them stored) over columns j0..j0+16*NV (n of them).
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static void block(int rows, int n, int KP,
                                                                                const uint32_t *a, size_t lda,
                                                                                const uint32_t *b, size_t ldb, float *c,
                                                                                size_t ldc, int accumulate) {
    __m512 acc[MR][NV];
    __mmask16 m[NV];
    const uint32_t *ar[MR];
    for (int v = 0; v < NV; v++) {
        int left = n - 16 * v;
        m[v] = left >= 16 ? (__mmask16)0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
    }
    for (int r = 0; r < MR; r++) {
        ar[r] = a + (size_t)(r < rows ? r : 0) * lda;  // rows past the block repeat its first (not stored)
        for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
    }
    for (int p = 0; p < KP; p++) {
        __m512bh bv[NV];
        for (int v = 0; v < NV; v++) bv[v] = (__m512bh)_mm512_maskz_loadu_epi32(m[v], b + (size_t)p * ldb + 16 * v);
        for (int r = 0; r < MR; r++) {
            __m512bh x = (__m512bh)_mm512_set1_epi32((int)word_at(ar[r], p));
            for (int v = 0; v < NV; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], x, bv[v]);
        }
    }
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < NV && m[v]; v++) {
            float *cv = c + (size_t)r * ldc + 16 * v;
            __m512 s = acc[r][v];
            if (accumulate) s = _mm512_add_ps(_mm512_maskz_loadu_ps(m[v], cv), s);
            _mm512_mask_storeu_ps(cv, m[v], s);
        }
}

void neox_att_tile_avx512(int M, int N, int KP, const uint32_t *a, size_t lda, const uint32_t *b, size_t ldb, float *c,
                          size_t ldc, int accumulate) {
    for (int j0 = 0; j0 < N; j0 += 16 * NV)
        for (int i0 = 0; i0 < M; i0 += MR)
            block(M - i0 < MR ? M - i0 : MR, N - j0, KP, a + (size_t)i0 * lda, lda, b + j0, ldb,
                  c + (size_t)i0 * ldc + j0, ldc, accumulate);
}

neox_att_tile_fn *neox_att_tile_best(void) {
    return neox_cpu_has_avx512_bf16() ? neox_att_tile_avx512 : neox_att_tile_reference;
}
#else
void neox_att_tile_avx512(int M, int N, int KP, const uint32_t *a, size_t lda, const uint32_t *b, size_t ldb, float *c,
                          size_t ldc, int accumulate) {
    neox_att_tile_reference(M, N, KP, a, lda, b, ldb, c, ldc, accumulate);
}
neox_att_tile_fn *neox_att_tile_best(void) { return neox_att_tile_reference; }
#endif

void neox_att_pack_words(uint32_t *dst, size_t ldd, const uint16_t *x, size_t ldx, int rows, int cols) {
    for (int t = 0; t < rows; t++) {
        const uint16_t *row = x + (size_t)t * ldx;
        for (int p = 0; p < cols / 2; p++) dst[(size_t)p * ldd + t] = pair_of(row[2 * p], row[2 * p + 1]);
    }
}

NEOX_CLONES void neox_att_pack_rows(uint32_t *dst, size_t ldd, const uint16_t *x, size_t ldx, int rows, int cols) {
    for (int p = 0; p < (rows + 1) / 2; p++) {
        const uint16_t *lo = x + (size_t)2 * p * ldx, *hi = lo + ldx;
        uint32_t *d = dst + (size_t)p * ldd;
        if (2 * p + 1 < rows)
            for (int c = 0; c < cols; c++) d[c] = pair_of(lo[c], hi[c]);
        else
            for (int c = 0; c < cols; c++) d[c] = pair_of(lo[c], 0);
    }
}

NEOX_CLONES void neox_att_pack_tile(uint32_t *dst, size_t ldd, const float *t, size_t ldt, int nr, int nc) {
    for (int r = 0; r < nr; r++) {
        const float *tr = t + (size_t)r * ldt;
        uint32_t *d = dst + (size_t)r * ldd;
        for (int p = 0; p < nc / 2; p++)
            d[p] = pair_of(neox_bf16_from_f32(tr[2 * p]), neox_bf16_from_f32(tr[2 * p + 1]));
        if (nc % 2) d[nc / 2] = pair_of(neox_bf16_from_f32(tr[nc - 1]), 0);
    }
}

NEOX_CLONES void neox_att_pack_tile_t(uint32_t *dst, size_t ldd, const float *t, size_t ldt, int nr, int nc) {
    for (int p = 0; p < (nr + 1) / 2; p++) {
        const float *lo = t + (size_t)2 * p * ldt, *hi = lo + ldt;
        int has_hi = 2 * p + 1 < nr;
        for (int c = 0; c < nc; c++)
            dst[(size_t)c * ldd + p] = pair_of(neox_bf16_from_f32(lo[c]), has_hi ? neox_bf16_from_f32(hi[c]) : 0);
    }
}

// ---- fp32 operands ---------------------------------------------------------------------------
// A block of 4 rows x 16 columns of C stays in registers (4 zmm, 8 ymm: GCC's vector types, which
// each build lowers to its widest registers) while k streams by: per k one row of B and 4 elements
// of A. Rows past M repeat row 0 (not stored); columns past the last 16 take the tail loop, which
// sums in the same order.
enum { FR = 4, FC = 16 };
typedef float f32x16 __attribute__((vector_size(64)));
typedef float f32x16u __attribute__((vector_size(64), aligned(4), may_alias));  // at any float's address
#define LOAD16(p) (*(const f32x16u *)(p))
#define STORE16(p, v) (*(f32x16u *)(p) = (v))

// How a product meets C's old values: not at all (SET), added once to the finished sums (ADD:
// sgemm's beta 1), or as the sums' starting values (CARRY: a later chunk of k).
enum { SET, ADD, CARRY };

NEOX_CLONES static void f32_block(int rows, int K, const float *a, size_t a_row, size_t a_col, const float *b,
                                  size_t ldb, float *c, size_t ldc, int mode) {
    const float *a0 = a, *a1 = a + (rows > 1 ? a_row : 0), *a2 = a + (rows > 2 ? 2 * a_row : 0),
                *a3 = a + (rows > 3 ? 3 * a_row : 0);
    f32x16 zero = {0}, s0 = zero, s1 = zero, s2 = zero, s3 = zero;
    if (mode == CARRY) {
        s0 = LOAD16(c);
        if (rows > 1) s1 = LOAD16(c + ldc);
        if (rows > 2) s2 = LOAD16(c + 2 * ldc);
        if (rows > 3) s3 = LOAD16(c + 3 * ldc);
    }
    for (int k = 0; k < K; k++) {
        f32x16 bk = LOAD16(b + (size_t)k * ldb);
        size_t o = (size_t)k * a_col;
        s0 += a0[o] * bk, s1 += a1[o] * bk, s2 += a2[o] * bk, s3 += a3[o] * bk;
    }
    if (mode == ADD) {
        s0 += LOAD16(c);
        if (rows > 1) s1 += LOAD16(c + ldc);
        if (rows > 2) s2 += LOAD16(c + 2 * ldc);
        if (rows > 3) s3 += LOAD16(c + 3 * ldc);
    }
    STORE16(c, s0);
    if (rows > 1) STORE16(c + ldc, s1);
    if (rows > 2) STORE16(c + 2 * ldc, s2);
    if (rows > 3) STORE16(c + 3 * ldc, s3);
}

// Columns j0..N of C (fewer than FC), one row at a time, with the same sums.
NEOX_CLONES static void f32_tail(int M, int n, int K, const float *a, size_t a_row, size_t a_col, const float *b,
                                 size_t ldb, float *c, size_t ldc, int mode) {
    for (int i = 0; i < M; i++) {
        float acc[FC];
        for (int j = 0; j < n; j++) acc[j] = mode == CARRY ? c[(size_t)i * ldc + j] : 0.0f;
        for (int k = 0; k < K; k++) {
            float x = a[(size_t)i * a_row + (size_t)k * a_col];
            for (int j = 0; j < n; j++) acc[j] += x * b[(size_t)k * ldb + j];
        }
        for (int j = 0; j < n; j++) c[(size_t)i * ldc + j] = mode == ADD ? c[(size_t)i * ldc + j] + acc[j] : acc[j];
    }
}

static void f32_product(int M, int N, int K, const float *a, size_t a_row, size_t a_col, const float *b, size_t ldb,
                        float *c, size_t ldc, int mode) {
    int full = N / FC * FC;
    for (int j0 = 0; j0 < full; j0 += FC)
        for (int i0 = 0; i0 < M; i0 += FR)
            f32_block(M - i0 < FR ? M - i0 : FR, K, a + (size_t)i0 * a_row, a_row, a_col, b + j0, ldb,
                      c + (size_t)i0 * ldc + j0, ldc, mode);
    if (full < N) f32_tail(M, N - full, K, a, a_row, a_col, b + full, ldb, c + full, ldc, mode);
}

void neox_att_f32_product(int M, int N, int K, const float *a, size_t a_row, size_t a_col, const float *b, size_t ldb,
                          float *c, size_t ldc, int accumulate) {
    f32_product(M, N, K, a, a_row, a_col, b, ldb, c, ldc, accumulate ? ADD : SET);
}

void neox_att_f32_product_bt(int M, int N, int K, const float *a, size_t a_row, size_t a_col, const float *b,
                             size_t ldb, float *c, size_t ldc) {
    enum { CH = 64 };
    float bt[CH * CH];  // B's chunk (k0.., j0..) as (k, j) rows
    for (int j0 = 0; j0 < N; j0 += CH) {
        int nj = N - j0 < CH ? N - j0 : CH;
        for (int k0 = 0; k0 < K; k0 += CH) {
            int nk = K - k0 < CH ? K - k0 : CH;
            for (int j = 0; j < nj; j++)
                for (int k = 0; k < nk; k++) bt[k * CH + j] = b[(size_t)(j0 + j) * ldb + k0 + k];
            // Later chunks of k carry on from the sums so far: each sum still takes k in order.
            f32_product(M, nj, nk, a + (size_t)k0 * a_col, a_row, a_col, bt, CH, c + j0, ldc,
                        k0 > 0 ? CARRY : SET);
        }
    }
}
