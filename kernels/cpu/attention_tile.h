// attention_tile.h: attention's tile products (kernels/cpu/attention.c), the score and value
// products of its 64 x 64 tiles: q k^T, p v and in the backward dO v^T, dS k, dS^T q, p^T dO; in
// bfloat16 pairs and in fp32 (the end of this file). In bfloat16 both operands come in pairs along
// the summed dimension, one 32-bit word per pair (the even element in the low half), so that on
// AVX512_BF16 one vdpbf16ps adds two exact products to each of 16 fp32 sums. The packing functions
// make those words from bf16 rows or from fp32 tiles (rounding each value once to nearest even,
// kernels.h's neox_bf16_from_f32); the product has a plain C build (the reference: the same pairs,
// products exact, sums in fp32; AVX-512, AVX2 and baseline builds) and the AVX512_BF16 one, which
// flushes subnormal inputs and results to zero as the instruction does.
#ifndef NEOX_CPU_ATTENTION_TILE_H
#define NEOX_CPU_ATTENTION_TILE_H

#include <stddef.h>
#include <stdint.h>

// C (M, N; fp32, row stride ldc) = A B, or C += A B when accumulate (the product summed first, then
// added to C: sgemm's beta 1). A: M rows of KP pair words (row i at a + i * lda); B: KP rows of N
// pair words (row p at b + p * ldb), one per column of C. Each sum starts at zero and takes the
// pairs in order, whichever rows and columns share a register block.
typedef void neox_att_tile_fn(int M, int N, int KP, const uint32_t *a, size_t lda, const uint32_t *b, size_t ldb,
                              float *c, size_t ldc, int accumulate);
neox_att_tile_fn neox_att_tile_reference, neox_att_tile_avx512;
// The AVX512_BF16 build where this CPU has the instruction, else the reference.
neox_att_tile_fn *neox_att_tile_best(void);

// Pair words of x's rows taken as columns: dst[p * ldd + t] = (x[t][2p], x[t][2p + 1]) for the
// rows t < rows and pairs p < cols / 2 (cols even). x: (rows, cols) bf16 with row stride ldx. A
// key or value block as the B of q k^T or dO v^T.
void neox_att_pack_words(uint32_t *dst, size_t ldd, const uint16_t *x, size_t ldx, int rows, int cols);
// Pairs of neighbouring rows: dst[p * ldd + d] = (x[2p][d], x[2p + 1][d]) for p < (rows + 1) / 2 and
// d < cols, zero in place of a row past `rows`. A value, key, query or dO block as the B of p v,
// dS k, dS^T q or p^T dO.
void neox_att_pack_rows(uint32_t *dst, size_t ldd, const uint16_t *x, size_t ldx, int rows, int cols);
// An fp32 tile t (nr, nc; row stride ldt) rounded to bf16 in pairs along its rows (dst[r * ldd + p]
// = (t[r][2p], t[r][2p + 1]): the A of p v or dS k) or, transposed, along its columns (dst[c * ldd
// + p] = (t[2p][c], t[2p + 1][c]): the A of dS^T q or p^T dO); zero in place of an element past the tile.
void neox_att_pack_tile(uint32_t *dst, size_t ldd, const float *t, size_t ldt, int nr, int nc);
void neox_att_pack_tile_t(uint32_t *dst, size_t ldd, const float *t, size_t ldt, int nr, int nc);

// ---- fp32 operands (fp32 precision, fp16 operands rounded in fp32 tiles) ---------------------
// C (M, N; row stride ldc) = A B, or C += A B when accumulate (the sums finished, then added to C:
// sgemm's beta 1), each sum taking k in order from zero, each step a product rounded and then a sum
// rounded (no fused multiply-add: C11 does not contract), so the AVX-512, AVX2 and baseline builds
// give the same bits, and the same as OpenBLAS's SSE3 kernels on attention's tiles. A (M, K):
// element (i, k) at a[i * a_row + k * a_col] (a_row 1 and a_col a row pitch: a tile transposed); B
// (K, N) row-major with stride ldb.
void neox_att_f32_product(int M, int N, int K, const float *a, size_t a_row, size_t a_col, const float *b, size_t ldb,
                          float *c, size_t ldc, int accumulate);
// C = A B with B given transposed, (N, K) row-major (q k^T, dO v^T): copied 64 x 64 at a time, a
// later chunk of k carrying on from the sums so far.
void neox_att_f32_product_bt(int M, int N, int K, const float *a, size_t a_row, size_t a_col, const float *b,
                             size_t ldb, float *c, size_t ldc);

#endif
