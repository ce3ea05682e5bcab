// test_qkv_views.c: attention and rotary read and written in place in the fused QKV buffer (through
// neox_qkv_fused_layout's views) equal, bit for bit, the split route they replace: qkv_split, rotary
// on the split q and k, attention, its backward, rotary backward and qkv_merge. Both fused layouts
// (GPT-NeoX's per-head interleaving and the grouped Llama one, with GQA), a window, ALiBi, dropout,
// fp32 and bf16 storage and fp32 and bf16 operands. The fused gradient buffer starts as NaN bytes,
// so a gradient the backward only accumulated into, or left unwritten, shows.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "kernels/kernels.h"

enum { VB = 2, VT = 70, VHS = 16, VR = 8 };  // T past one 64-row block; rotary on half of each head

typedef struct view_case {
    int interleaved, NH, NKV, window, alibi;
    float dropout;
    neox_elem act, operands;
} view_case;

// n random values stored as act (bf16 ones rounded from the fp32 draws).
static void *random_act(size_t n, neox_elem act, unsigned long long seed) {
    float *x = neox_malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = (float)neox_normal(seed, i);
    if (act == NEOX_ELEM_F32) return x;
    void *h = neox_malloc(n * neox_elem_size(act));
    neox_cast_f32_to_bf16(h, x, n);
    free(x);
    return h;
}

static void *copy_of(const void *x, size_t bytes) {
    void *c = neox_malloc(bytes);
    memcpy(c, x, bytes);
    return c;
}

typedef struct route_out {
    void *qkv, *out, *dqkv;  // qkv after rotary (the split route merges its rotated q, k, v back)
    float *lse;
} route_out;

static neox_attention_opts opts_of(const view_case *c, const float *slopes) {
    return (neox_attention_opts){.scale = 0.25f, .window = c->window, .dropout = c->dropout, .seed = 11,
                                 .operands = c->operands, .alibi = c->alibi ? slopes : NULL, .dropout_row0 = 2};
}

static void rotate(void *x, const float *cs, const float *sn, int H, int inverse, neox_elem act, neox_head_strides s) {
    neox_rotary_apply(x, cs, sn, VB, H, VT, VHS, VR, inverse, act, s);
}

// Today's split route, with its copies.
static route_out split_route(const view_case *c, const void *qkv_in, const void *dout, const float *cs,
                             const float *sn, const float *slopes) {
    int NH = c->NH, NKV = c->NKV;
    size_t es = neox_elem_size(c->act), W = (size_t)(NH + 2 * NKV) * VHS, nall = (size_t)VB * VT * W;
    size_t nq = (size_t)VB * NH * VT * VHS, nkv = (size_t)VB * NKV * VT * VHS;
    neox_head_strides whole = {0};
    void *q = neox_malloc(nq * es), *k = neox_malloc(nkv * es), *v = neox_malloc(nkv * es);
    void *dq = neox_malloc(nq * es), *dk = neox_malloc(nkv * es), *dv = neox_malloc(nkv * es);
    route_out r = {neox_malloc(nall * es), neox_malloc(nq * es), neox_malloc(nall * es),
                   neox_malloc((size_t)VB * NH * VT * sizeof(float))};
    neox_qkv_split(q, k, v, qkv_in, VB, VT, NH, NKV, VHS, c->interleaved, c->act);
    rotate(q, cs, sn, NH, 0, c->act, whole), rotate(k, cs, sn, NKV, 0, c->act, whole);
    neox_qkv_merge(r.qkv, q, k, v, VB, VT, NH, NKV, VHS, c->interleaved, c->act);
    neox_attention_forward(r.out, r.lse, q, k, v, VB, VT, NH, NKV, VHS, opts_of(c, slopes), c->act);
    neox_attention_backward(dq, dk, dv, dout, q, k, v, r.out, r.lse, VB, VT, NH, NKV, VHS, opts_of(c, slopes), c->act);
    rotate(dq, cs, sn, NH, 1, c->act, whole), rotate(dk, cs, sn, NKV, 1, c->act, whole);
    neox_qkv_merge(r.dqkv, dq, dk, dv, VB, VT, NH, NKV, VHS, c->interleaved, c->act);
    free(q), free(k), free(v), free(dq), free(dk), free(dv);
    return r;
}

// The fused route: everything in place in qkv and dqkv.
static route_out fused_route(const view_case *c, const void *qkv_in, const void *dout, const float *cs,
                             const float *sn, const float *slopes) {
    int NH = c->NH, NKV = c->NKV;
    size_t es = neox_elem_size(c->act), W = (size_t)(NH + 2 * NKV) * VHS, nall = (size_t)VB * VT * W;
    neox_qkv_layout l = neox_qkv_fused_layout(VT, NH, NKV, VHS, c->interleaved);
    route_out r = {copy_of(qkv_in, nall * es), neox_malloc((size_t)VB * NH * VT * VHS * es), neox_malloc(nall * es),
                   neox_malloc((size_t)VB * NH * VT * sizeof(float))};
    memset(r.dqkv, 0xff, nall * es);  // NaN everywhere: every gradient must be written whole
    char *x = r.qkv, *dx = r.dqkv;
    char *q = x + l.q_offset * es, *k = x + l.k_offset * es, *v = x + l.v_offset * es;
    char *dq = dx + l.q_offset * es, *dk = dx + l.k_offset * es, *dv = dx + l.v_offset * es;
    rotate(q, cs, sn, NH, 0, c->act, l.strides.q), rotate(k, cs, sn, NKV, 0, c->act, l.strides.k);
    neox_attention_opts o = opts_of(c, slopes);
    o.views = l.strides;
    neox_attention_forward(r.out, r.lse, q, k, v, VB, VT, NH, NKV, VHS, o, c->act);
    neox_attention_backward(dq, dk, dv, dout, q, k, v, r.out, r.lse, VB, VT, NH, NKV, VHS, o, c->act);
    rotate(dq, cs, sn, NH, 1, c->act, l.strides.q), rotate(dk, cs, sn, NKV, 1, c->act, l.strides.k);
    return r;
}

static void free_route(route_out r) { free(r.qkv), free(r.out), free(r.dqkv), free(r.lse); }

static void check_case(const view_case *c) {
    int NH = c->NH, NKV = c->NKV;
    size_t es = neox_elem_size(c->act), nall = (size_t)VB * VT * (NH + 2 * NKV) * VHS;
    size_t nout = (size_t)VB * VT * NH * VHS;
    float *cs = neox_malloc((size_t)VT * VR / 2 * sizeof *cs), *sn = neox_malloc((size_t)VT * VR / 2 * sizeof *sn);
    float slopes[8];
    neox_rotary_tables(cs, sn, VT, VR, 10000.0, (neox_rope_scaling){.kind = NEOX_ROPE_DEFAULT});
    neox_alibi_slopes(slopes, NH, 0, NH);
    void *qkv = random_act(nall, c->act, 3), *dout = random_act(nout, c->act, 4);
    route_out s = split_route(c, qkv, dout, cs, sn, slopes), f = fused_route(c, qkv, dout, cs, sn, slopes);
    const char *what = memcmp(s.qkv, f.qkv, nall * es)                      ? "rotated qkv"
                       : memcmp(s.out, f.out, nout * es)                    ? "attention output"
                       : memcmp(s.lse, f.lse, (size_t)VB * NH * VT * 4)     ? "log-sum-exp"
                       : memcmp(s.dqkv, f.dqkv, nall * es)                  ? "dqkv"
                                                                            : NULL;
    if (what)
        fail_msg("%s differs: interleaved %d NH %d NKV %d window %d alibi %d dropout %g act %d operands %d", what,
                 c->interleaved, NH, NKV, c->window, c->alibi, c->dropout, c->act, c->operands);
    free_route(s), free_route(f), free(qkv), free(dout), free(cs), free(sn);
}

static void test_fused_views_equal_split(void **state) {
    (void)state;
    const neox_elem F32 = NEOX_ELEM_F32, BF16 = NEOX_ELEM_BF16;
    const view_case cases[] = {
        {1, 4, 4, 0, 0, 0.0f, F32, F32},   {0, 4, 4, 0, 0, 0.0f, F32, F32},    // both layouts
        {0, 4, 2, 0, 0, 0.0f, F32, F32},   {0, 4, 1, 0, 0, 0.0f, BF16, BF16},  // GQA, MQA
        {1, 4, 4, 20, 0, 0.0f, F32, F32},  {0, 6, 2, 0, 1, 0.0f, F32, F32},    // window, ALiBi
        {1, 4, 4, 0, 0, 0.25f, F32, F32},  {0, 4, 2, 0, 0, 0.25f, BF16, F32},  // dropout
        {1, 4, 4, 0, 0, 0.0f, BF16, BF16}, {1, 4, 4, 0, 0, 0.0f, F32, BF16},   // bf16 storage, operands
        {0, 4, 2, 24, 1, 0.1f, BF16, BF16},                                     // all at once
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i]);
}

// The strides the fused layouts give, written out: GPT-NeoX's [q0 k0 v0 | q1 k1 v1 | ...] and the
// grouped [q0 q1 .. | k0 .. | v0 ..], and all-zero strides standing for contiguous heads.
static void test_fused_layout_offsets(void **state) {
    (void)state;
    int T = 5, NH = 4, NKV = 2, HS = 8;
    neox_qkv_layout il = neox_qkv_fused_layout(T, NH, NH, HS, 1), gl = neox_qkv_fused_layout(T, NH, NKV, HS, 0);
    size_t Wi = (size_t)3 * NH * HS, Wg = (size_t)(NH + 2 * NKV) * HS;
    assert_int_equal(il.k_offset, HS), assert_int_equal(il.v_offset, 2 * HS);
    assert_int_equal(il.strides.q.head, 3 * HS), assert_int_equal(il.strides.v.row, Wi);
    assert_int_equal(il.strides.k.batch, T * Wi);
    assert_int_equal(gl.k_offset, NH * HS), assert_int_equal(gl.v_offset, (NH + NKV) * HS);
    assert_int_equal(gl.strides.k.head, HS), assert_int_equal(gl.strides.q.row, Wg);
    neox_head_strides c = neox_head_strides_of((neox_head_strides){0}, NKV, T, HS);
    assert_int_equal(c.batch, NKV * T * HS), assert_int_equal(c.head, T * HS), assert_int_equal(c.row, HS);
    assert_true(neox_head_strides_is_contiguous((neox_head_strides){0}, NH, T, HS));
    assert_false(neox_head_strides_is_contiguous(gl.strides.q, NH, T, HS));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fused_layout_offsets),
        cmocka_unit_test(test_fused_views_equal_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
