// attention_mma.cuh: what the two tensor-core attention files share (attention_mma.cu, the first
// kernels, and attention_fa2.cu, the pipelined ones): the 16-bit operand types with their mma.sync
// m16n8k16, the accumulator-to-operand rounding, the row reductions of a fragment, and the shape and
// options every kernel takes (dropout's counter, ALiBi's slopes).
//
// Fragments (PTX ISA, mma.m16n8k16 with 16-bit A/B): g = lane / 4, t = lane % 4.
//   A (16 x 16, row-major): a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
//   B (16 x 8, k x n):      b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]
//   C (16 x 8, fp32):       c0, c1 = C[g][2t..2t+1], c2, c3 = C[g+8][2t..2t+1]
#ifndef NEOX_CUDA_ATTENTION_MMA_CUH
#define NEOX_CUDA_ATTENTION_MMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/cuda/attention.cuh"

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

// ---- 16-bit operand types -------------------------------------------------------------------------

struct bf16_ops {
    typedef __nv_bfloat16 elem;
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low half
        return *reinterpret_cast<uint32_t *>(&v);
    }
    static __device__ __forceinline__ elem from(float x) { return __float2bfloat16_rn(x); }
    static __device__ __forceinline__ void mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

struct f16_ops {
    typedef __half elem;
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        __half2 v = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&v);
    }
    static __device__ __forceinline__ elem from(float x) { return __float2half_rn(x); }
    static __device__ __forceinline__ void mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

// The A fragment of k-step s (columns 16 s..) of a 16 x 64 tile held as 8 accumulator fragments,
// rounded: n-tiles 2s and 2s + 1 are its left and right halves.
template <class Ops> __device__ __forceinline__ void a_from_acc(uint32_t *a, const float (*acc)[4], int s) {
    a[0] = Ops::pack(acc[2 * s][0], acc[2 * s][1]);
    a[1] = Ops::pack(acc[2 * s][2], acc[2 * s][3]);
    a[2] = Ops::pack(acc[2 * s + 1][0], acc[2 * s + 1][1]);
    a[3] = Ops::pack(acc[2 * s + 1][2], acc[2 * s + 1][3]);
}

// Sum and max over the 4 threads holding one accumulator row.
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

struct mma_shape {
    int T, NH, NKV, window;  // T: key rows per kv head
    att_queries q;           // the query rows per head and their positions
    float scale, dropout, keep_scale;
    unsigned long long seed, drop_row0;  // dropout: the counter's first row and heads (kernels.h)
    const unsigned long long *drop_row0_at;  // NULL, or a row on the device added to drop_row0 (a replayed step's)
    int drop_head0, drop_heads;
    const float *alibi;  // (NH) slopes on the device, or NULL
};

// The first dropout counter row of head h of micro-batch row b (the CPU's).
__device__ __forceinline__ unsigned long long dropout_row(const mma_shape &a, int b, int h) {
    return neox_attention_dropout_row(neox_attention_dropout_first_row(a.drop_row0, a.drop_row0_at), a.drop_head0,
                                      a.drop_heads, a.NH, b, h, a.T);
}

// Head h's ALiBi slope in the base-2 units of the scores (0 without ALiBi).
__device__ __forceinline__ float slope2_of(const mma_shape &a, int h) { return a.alibi ? a.alibi[h] * LOG2E : 0.0f; }

static inline mma_shape make_shape(int T, int NH, int NKV, const neox_attention_opts &o) {
    mma_shape a;
    a.T = T, a.NH = NH, a.NKV = NKV, a.window = o.window;
    a.q = att_queries_of(o, T);
    a.scale = o.scale, a.dropout = o.dropout, a.seed = o.seed, a.alibi = o.alibi;
    a.drop_row0 = o.dropout_row0, a.drop_head0 = o.dropout_head0, a.drop_heads = o.dropout_heads;
    a.drop_row0_at = o.dropout_row0_at;
    a.keep_scale = o.dropout > 0.0f ? 1.0f / (1.0f - o.dropout) : 1.0f;  // the CPU's keep factor
    return a;
}

#endif
