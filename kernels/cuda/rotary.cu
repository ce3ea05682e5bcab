// rotary.cu: the fused-QKV split into heads (and its inverse for the gradients) and GPT-NeoX's
// rotate-half rotary embedding, as kernels/cpu/rotary.c. The tables are computed on the host by the
// CPU code (once per run; bit-identical to it) and copied to the device. The split, merge and rotation
// are templates on the activations' storage type (common.cuh).
#include "kernels/cuda/common.cuh"

// One thread per element of q, k and v (slots 0..NH-1 of a position are q's heads, then k's, then
// v's); its place in qkv (B, T, W), W = (NH + 2 NKV) HS, is the fused layout's (kernels.h's
// neox_qkv_fused_layout, l). to_heads copies qkv -> q/k/v, else q/k/v -> qkv.
template <typename T_>
__global__ void qkv_copy_kernel(T_ *qkv, T_ *q, T_ *k, T_ *v, neox_qkv_layout l, int T, int NH, int NKV, int HS,
                                int to_heads, size_t n) {
    size_t W = (size_t)(NH + 2 * NKV) * HS;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t bt = e / W, b = bt / T, t = bt % T;
        int w = (int)(e % W), slot = w / HS, d = w % HS;
        int kind = slot < NH ? 0 : slot < NH + NKV ? 1 : 2;  // 0 q, 1 k, 2 v
        int h = kind == 0 ? slot : kind == 1 ? slot - NH : slot - NH - NKV, heads = kind == 0 ? NH : NKV;
        const neox_head_strides &s = kind == 0 ? l.strides.q : kind == 1 ? l.strides.k : l.strides.v;
        size_t at = (kind == 0 ? l.q_offset : kind == 1 ? l.k_offset : l.v_offset) + b * s.batch + h * s.head +
                    t * s.row + d;
        T_ *dst = kind == 0 ? q : kind == 1 ? k : v;
        size_t idx = (((size_t)b * heads + h) * T + t) * HS + d;
        if (to_heads) dst[idx] = qkv[at]; else qkv[at] = dst[idx];
    }
}

static void qkv_copy(void *qkv, void *q, void *k, void *v, int B, int T, int NH, int NKV, int HS, int interleaved,
                     int to_heads, neox_elem act) {
    size_t n = (size_t)B * T * (NH + 2 * NKV) * HS;
    if (n == 0) return;
    cudaStream_t st = neox_cuda_current_stream();
    neox_qkv_layout l = neox_qkv_fused_layout(T, NH, NKV, HS, interleaved);
    ACT_DISPATCH(act, E, qkv_copy_kernel<E><<<blocks_for(n, 256), 256, 0, st>>>((E *)qkv, (E *)q, (E *)k, (E *)v, l, T,
                                                                               NH, NKV, HS, to_heads, n));
    CUDA_LAUNCHED();
}

extern "C" void neox_cuda_qkv_split(void *q, void *k, void *v, const void *qkv, int B, int T, int NH, int NKV, int HS,
                                    int interleaved, neox_elem act) {
    qkv_copy((void *)qkv, q, k, v, B, T, NH, NKV, HS, interleaved, 1, act);
}

extern "C" void neox_cuda_qkv_merge(void *dqkv, const void *dq, const void *dk, const void *dv, int B, int T, int NH,
                                    int NKV, int HS, int interleaved, neox_elem act) {
    qkv_copy(dqkv, (void *)dq, (void *)dk, (void *)dv, B, T, NH, NKV, HS, interleaved, 0, act);
}

extern "C" void neox_cuda_rotary_tables(float *cos_t, float *sin_t, int T, int R, double base,
                                        neox_rope_scaling scaling) {
    size_t n = (size_t)T * (R / 2);
    float *host = (float *)malloc(2 * (n ? n : 1) * sizeof(float));
    if (!host) abort();
    neox_rotary_tables(host, host + n, T, R, base, scaling);
    neox_cuda_to_device(cos_t, host, n * sizeof(float));
    neox_cuda_to_device(sin_t, host + n, n * sizeof(float));
    free(host);
}

// x: (B, H, T, HS) at strides xs (dense, or a view of the fused QKV buffer); one thread per rotated
// pair (row, i < R/2).
template <typename E>
__global__ void rotary_kernel(E *x, neox_head_strides xs, const float *cos_t, const float *sin_t, int H, int T,
                              int half, float sign, size_t n) {
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t row = e / half, bh = row / T;
        int i = (int)(e % half), t = (int)(row % T);
        E *r = x + (bh / H) * xs.batch + (bh % H) * xs.head + (size_t)t * xs.row;
        float c = cos_t[(size_t)t * half + i], sn = sign * sin_t[(size_t)t * half + i];
        float x1 = act_load(r, i), x2 = act_load(r, i + half);
        act_store(r, i, x1 * c - x2 * sn);
        act_store(r, i + half, x2 * c + x1 * sn);
    }
}

extern "C" void neox_cuda_rotary_apply(void *x, const float *cos_t, const float *sin_t, int B, int H, int T, int HS,
                                       int R, int inverse, neox_elem act, neox_head_strides xs) {
    int half = R / 2;
    size_t n = (size_t)B * H * T * half;
    if (n == 0) return;
    cudaStream_t st = neox_cuda_current_stream();
    neox_head_strides s = neox_head_strides_of(xs, H, T, HS);
    ACT_DISPATCH(act, E, rotary_kernel<E><<<blocks_for(n, 256), 256, 0, st>>>((E *)x, s, cos_t, sin_t, H, T, half,
                                                                              inverse ? -1.0f : 1.0f, n));
    CUDA_LAUNCHED();
}
