// rotary.c: the fused-QKV split into heads and rotary position embeddings (GPT-NeoX rotate-half), on
// activations in their storage type (storage.h): the split and merge copy elements as they are, the
// rotation computes in fp32 and stores rounded.
#include <math.h>
#include <string.h>

#include "kernels/kernels.h"
#include "parallel.h"
#include "storage.h"

// Copies between the token-major fused layout (neox_qkv_fused_layout) and the head-major q/k/v
// layout, in either direction. es is the element size in bytes (the copy moves stored elements as
// they are).
static void qkv_copy(void *qkv_v, void *q_v, void *k_v, void *v_v, int B, int T, int NH, int NKV, int HS,
                     int interleaved, int to_heads, size_t es) {
    char *qkv = qkv_v, *q = q_v, *k = k_v, *v = v_v;
    neox_qkv_layout l = neox_qkv_fused_layout(T, NH, NKV, HS, interleaved);
    size_t W = (size_t)(NH + 2 * NKV) * HS, bytes = (size_t)HS * es;
    #pragma omp parallel for collapse(2) if ((size_t)B * T * W >= NEOX_PARALLEL_MIN_ELEMS)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            char *row = qkv + ((size_t)b * T + t) * W * es;
            for (int h = 0; h < NH; h++) {
                size_t oq = (l.q_offset + h * l.strides.q.head) * es, ok = (l.k_offset + h * l.strides.k.head) * es;
                size_t ov = (l.v_offset + h * l.strides.v.head) * es;
                char *qh = q + (((size_t)b * NH + h) * T + t) * HS * es;
                if (to_heads) memcpy(qh, row + oq, bytes); else memcpy(row + oq, qh, bytes);
                if (h >= NKV) continue;
                char *kh = k + (((size_t)b * NKV + h) * T + t) * HS * es;
                char *vh = v + (((size_t)b * NKV + h) * T + t) * HS * es;
                if (to_heads) {
                    memcpy(kh, row + ok, bytes);
                    memcpy(vh, row + ov, bytes);
                } else {
                    memcpy(row + ok, kh, bytes);
                    memcpy(row + ov, vh, bytes);
                }
            }
        }
}

void neox_qkv_split(void *q, void *k, void *v, const void *qkv, int B, int T, int NH, int NKV, int HS,
                    int interleaved, neox_elem act) {
    qkv_copy((void *)qkv, q, k, v, B, T, NH, NKV, HS, interleaved, 1, neox_elem_size(act));
}

void neox_qkv_merge(void *dqkv, const void *dq, const void *dk, const void *dv, int B, int T, int NH, int NKV,
                    int HS, int interleaved, neox_elem act) {
    qkv_copy(dqkv, (void *)dq, (void *)dk, (void *)dv, B, T, NH, NKV, HS, interleaved, 0, neox_elem_size(act));
}

// One inverse frequency after scaling, in fp32 as transformers computes it.
static float scaled_inv_freq(float inv_freq, neox_rope_scaling s) {
    float factor = (float)s.factor;
    if (s.kind == NEOX_ROPE_LINEAR) return inv_freq / factor;
    if (s.kind != NEOX_ROPE_LLAMA3) return inv_freq;
    float old = (float)s.original_max_positions, low = (float)s.low_freq_factor, high = (float)s.high_freq_factor;
    float wavelen = 2.0f * (float)M_PI / inv_freq;
    float low_freq_wavelen = old / low, high_freq_wavelen = old / high;
    if (wavelen > low_freq_wavelen) return inv_freq / factor;  // long wavelengths: interpolated
    if (wavelen < high_freq_wavelen) return inv_freq;          // short ones: kept
    float smooth = (old / wavelen - low) / (high - low);
    return (1.0f - smooth) * inv_freq / factor + smooth * inv_freq;
}

void neox_rotary_tables(float *cos_t, float *sin_t, int T, int R, double base, neox_rope_scaling scaling) {
    int half = R / 2;
    for (int i = 0; i < half; i++) {
        // Hugging Face computes the inverse frequency and the angle in fp32; do the same so the
        // tables match it to the last bit for short sequences and closely for long ones.
        float inv_freq = scaled_inv_freq((float)(1.0 / pow(base, (double)(2 * i) / R)), scaling);
        for (int t = 0; t < T; t++) {
            float angle = (float)t * inv_freq;
            cos_t[(size_t)t * half + i] = cosf(angle);
            sin_t[(size_t)t * half + i] = sinf(angle);
        }
    }
}

void neox_rotary_apply(void *x, const float *cos_t, const float *sin_t, int B, int H, int T, int HS, int R,
                       int inverse, neox_elem act, neox_head_strides xs) {
    int half = R / 2;
    float sign = inverse ? -1.0f : 1.0f;  // rotating by -angle undoes the rotation (its transpose)
    neox_head_strides st = neox_head_strides_of(xs, H, T, HS);
    #pragma omp parallel for collapse(2) if ((size_t)B * H * T * HS >= NEOX_PARALLEL_MIN_ELEMS)
    for (int bh = 0; bh < B * H; bh++)
        for (int t = 0; t < T; t++) {
            size_t row = (size_t)(bh / H) * st.batch + (size_t)(bh % H) * st.head + (size_t)t * st.row;
            const float *c = cos_t + (size_t)t * half, *s = sin_t + (size_t)t * half;
            for (int i = 0; i < half; i++) {
                float x1 = neox_act_get(x, row + i, act), x2 = neox_act_get(x, row + i + half, act), sn = sign * s[i];
                neox_act_set(x, row + i, x1 * c[i] - x2 * sn, act);
                neox_act_set(x, row + i + half, x2 * c[i] + x1 * sn, act);
            }
        }
}
