// test_op_profile.c: the op costs (kernels/op_cost.c) on shapes small enough to count by hand, the
// per-op profile's wrapper (kernels/op_profile.c: results unchanged, sums per scope, the trace), and
// the dry backend (kernels/dry.c: untouchable addresses, its peak counted afresh per set of
// allocations).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "kernels/backend.h"

static void test_gemm_costs(void **state) {
    (void)state;
    // C (2, 3) = A (2, 4) · B (4, 3) on bf16 operands: 2·2·3·4 FLOPs; A and B 2 bytes an element, C 4.
    neox_op_cost c = neox_op_cost_gemm_ex(0, 0, 2, 3, 4, 1.0f, NULL, 4, NULL, 3, NEOX_ELEM_BF16, 0.0f, NULL, 3,
                                          NEOX_ELEM_F32);
    assert_true(c.flops == 48.0 && c.bytes == 2.0 * (8 + 12) + 4.0 * 6 && c.tensor16 == 1);
    c = neox_op_cost_gemm_ex(0, 0, 2, 3, 4, 1.0f, NULL, 4, NULL, 3, NEOX_ELEM_F32, 1.0f, NULL, 3, NEOX_ELEM_F32);
    assert_true(c.bytes == 4.0 * (8 + 12) + 4.0 * 12 && c.tensor16 == 0);  // beta 1: C read and written
    float x;
    // The bias gradient alone is no product; each of dinp and dweight is 2·N·IC·OC.
    c = neox_op_cost_linear_backward(NULL, NULL, &x, NULL, 3, NULL, NULL, 5, 2, 3, 0, NEOX_ELEM_F32);
    assert_true(c.flops == 0.0 && c.bytes == 4.0 * (15 + 6));
    c = neox_op_cost_linear_backward(NULL, NULL, &x, NULL, 3, NULL, NULL, 5, 2, 3, 0, NEOX_ELEM_BF16);
    assert_true(c.bytes == 2.0 * 15 + 4.0 * 6);  // dout stored in bf16, the bias gradient fp32
    c = neox_op_cost_linear_backward(&x, &x, NULL, NULL, 3, NULL, NULL, 5, 2, 3, 0, NEOX_ELEM_F32);
    assert_true(c.flops == 2 * 2.0 * 5 * 2 * 3);
}

// The fused linear + activation: its route (kernels/linear_act_route.c) and what each route moves.
// N 5, IC 2, OC 3: inp 10 elements, weight 6, pre and out 15 each; backward dout 15, pre and dpre 10.
static void test_linear_act_costs(void **state) {
    (void)state;
    float x;
    assert_int_equal(neox_linear_act_route(NEOX_FN_GELU, NEOX_ELEM_BF16), NEOX_EPILOGUE_CUDNN);
    assert_int_equal(neox_linear_act_route(NEOX_FN_GELU_TANH, NEOX_ELEM_BF16), NEOX_EPILOGUE_CUDNN);
    assert_int_equal(neox_linear_act_route(NEOX_FN_GELU_TANH, NEOX_ELEM_F32), NEOX_EPILOGUE_CUBLASLT);
    assert_int_equal(neox_linear_act_route(NEOX_FN_GELU, NEOX_ELEM_F32), NEOX_EPILOGUE_NONE);
    assert_int_equal(neox_linear_act_route(NEOX_FN_RELU, NEOX_ELEM_BF16), NEOX_EPILOGUE_NONE);
    // cuDNN's graph: inp, weight read, pre and out written once (bf16), the fp32 bias read.
    neox_op_cost c = neox_op_cost_linear_act_forward(NULL, NULL, NULL, NULL, &x, 5, 2, 3, NEOX_FN_GELU, NEOX_ELEM_BF16);
    assert_true(c.flops == 60.0 && c.bytes == 2.0 * (10 + 6 + 30) + 4.0 * 3 && c.tensor16 == 1);
    assert_true(c.after_bytes == 0.0 && c.after_calls == 0);
    // Its backward: dout, weight, pre read, dpre written; the bias gradient a column-sum pass after it.
    c = neox_op_cost_linear_act_backward(NULL, NULL, NULL, NULL, NULL, 5, 2, 3, NEOX_FN_GELU, NEOX_ELEM_BF16);
    assert_true(c.flops == 60.0 && c.bytes == 2.0 * (15 + 6 + 20) && c.after_calls == 0);
    c = neox_op_cost_linear_act_backward(NULL, &x, NULL, NULL, NULL, 5, 2, 3, NEOX_FN_GELU, NEOX_ELEM_BF16);
    assert_true(c.after_bytes == 2.0 * 10 + 4.0 * 2 * 2 && c.after_calls == 1);
    assert_true(c.bytes == 2.0 * (15 + 6 + 20) + c.after_bytes);
    // Without cuDNN: the product writes pre, then GELU's pass reads it and writes out.
    neox_linear_act_allow_cudnn(0);
    assert_int_equal(neox_linear_act_route(NEOX_FN_GELU, NEOX_ELEM_BF16), NEOX_EPILOGUE_NONE);
    c = neox_op_cost_linear_act_forward(NULL, NULL, NULL, NULL, &x, 5, 2, 3, NEOX_FN_GELU, NEOX_ELEM_BF16);
    assert_true(c.after_bytes == 2.0 * 30 && c.after_calls == 1);
    assert_true(c.bytes == 2.0 * (10 + 6 + 15) + 4.0 * 3 + c.after_bytes);
    // ... and the product writes the activation's gradient; GELU's backward reads it and pre, writes dpre.
    c = neox_op_cost_linear_act_backward(NULL, NULL, NULL, NULL, NULL, 5, 2, 3, NEOX_FN_GELU, NEOX_ELEM_BF16);
    assert_true(c.after_bytes == 2.0 * 30 && c.after_calls == 1 && c.bytes == 2.0 * (15 + 6 + 10) + c.after_bytes);
    neox_linear_act_allow_cudnn(1);
    // fp32, GELU-tanh: cuBLASLt's epilogues; DGELU_BGRAD writes the sums, then they are added.
    c = neox_op_cost_linear_act_forward(NULL, NULL, NULL, NULL, NULL, 5, 2, 3, NEOX_FN_GELU_TANH, NEOX_ELEM_F32);
    assert_true(c.bytes == 4.0 * (10 + 6 + 30) && c.tensor16 == 0 && c.after_calls == 0);
    c = neox_op_cost_linear_act_backward(NULL, &x, NULL, NULL, NULL, 5, 2, 3, NEOX_FN_GELU_TANH, NEOX_ELEM_F32);
    assert_true(c.bytes == 4.0 * (15 + 6 + 20 + 2) + 4.0 * 3 * 2 && c.after_calls == 1);
}

static void test_attention_costs(void **state) {
    (void)state;
    neox_attention_opts o = {.operands = NEOX_ELEM_BF16};
    // T = 4, causal: 1 + 2 + 3 + 4 = 10 pairs; window 2: 1 + 2 + 2 + 2 = 7. B 2, NH 4 (NKV 2), HS 8.
    neox_op_cost f = neox_op_cost_attention_forward(NULL, NULL, NULL, NULL, NULL, 2, 4, 4, 2, 8, o, NEOX_ELEM_F32);
    assert_true(f.flops == 4.0 * 2 * 4 * 10 * 8 && f.tensor16 == 1);
    assert_true(f.bytes == 4.0 * (2 * (2 * 4 * 4 * 8) + 2 * (2 * 2 * 4 * 8) + 2 * 4 * 4));
    // bf16 storage: q, k, v and out 2 bytes an element, lse 4
    f = neox_op_cost_attention_forward(NULL, NULL, NULL, NULL, NULL, 2, 4, 4, 2, 8, o, NEOX_ELEM_BF16);
    assert_true(f.bytes == 2.0 * (2 * (2 * 4 * 4 * 8) + 2 * (2 * 2 * 4 * 8)) + 4.0 * 2 * 4 * 4);
    o.window = 2;
    o.operands = NEOX_ELEM_F32;
    neox_op_cost b = neox_op_cost_attention_backward(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 2, 4, 4, 2,
                                                     8, o, NEOX_ELEM_F32);
    assert_true(b.flops == 10.0 * 2 * 4 * 7 * 8 && b.tensor16 == 0);
    // Cached: 2 new queries at positions 3 and 4 see 4 and 5 keys.
    o.window = 0;
    neox_op_cost g = neox_op_cost_attention_cached(NULL, NULL, NULL, NULL, 2, 3, 4, 2, 8, 16, o);
    assert_true(g.flops == 4.0 * 4 * (4 + 5) * 8);
}

static void test_profile_wraps(void **state) {
    (void)state;
    const neox_backend *cpu = neox_backend_cpu();
    const neox_backend *be = neox_profile_install(cpu, 1);
    assert_string_equal(be->name, "cpu");
    assert_ptr_equal(neox_profile_inner(), cpu);
    float a[5] = {1, 2, 3, 4, 5}, b[5] = {10, 20, 30, 40, 50}, out[5];
    neox_profile_scope(NEOX_PHASE_FORWARD, 1);
    be->add(out, a, b, 5, NEOX_ELEM_F32);
    assert_true(out[0] == 11 && out[4] == 55);
    neox_profile_scope(NEOX_PHASE_OPTIMIZER, -1);
    assert_true(be->sum_squares(a, 5) == 55.0);  // a host value passes through
    neox_op_stat s = neox_profile_stat(NEOX_PHASE_FORWARD, 1, NEOX_OP_add);
    assert_true(s.calls == 1 && s.bytes == 4.0 * 15 && s.flops == 0.0 && s.seconds >= 0.0);
    assert_int_equal(neox_profile_stat(NEOX_PHASE_FORWARD, 0, NEOX_OP_add).calls, 0);
    assert_int_equal(neox_profile_stat(NEOX_PHASE_OPTIMIZER, -1, NEOX_OP_sum_squares).calls, 1);
    assert_int_equal(neox_profile_layers(), 2);
    size_t n;
    const neox_op_call *calls = neox_profile_trace(&n);
    assert_int_equal(n, 2);
    assert_true(calls[0].op == NEOX_OP_add && calls[0].layer == 1 && calls[1].op == NEOX_OP_sum_squares &&
                calls[1].layer == -1 && calls[1].phase == NEOX_PHASE_OPTIMIZER);
    assert_string_equal(neox_op_class_name(neox_op_class_of(NEOX_OP_gemm_ex)), "gemm");
    assert_string_equal(neox_op_class_name(neox_op_class_of(NEOX_OP_cast_f32_to_bf16)), "cast");
    neox_profile_reset();
    assert_int_equal(neox_profile_stat(NEOX_PHASE_FORWARD, 1, NEOX_OP_add).calls, 0);
    neox_profile_trace(&n);
    assert_int_equal(n, 0);
}

static void test_dry_backend(void **state) {
    (void)state;
    const neox_backend *dry = neox_backend_dry();
    assert_true(dry->on_device);
    void *p = dry->alloc(1000), *q = dry->alloc(1ull << 40);  // a TiB: an address only
    assert_non_null(p);
    assert_true(q != p);
    dry->add(p, p, p, 1u << 30, NEOX_ELEM_F32);  // does nothing, touches nothing
    double host[2] = {1, 2};
    dry->to_host(host, p, sizeof host);
    assert_true(host[0] == 0 && host[1] == 0 && dry->sum_squares(p, 10) == 0.0);
    assert_true(dry->peak_bytes() == 1024 + (1ull << 40));
    dry->free(q), dry->free(p);
    dry->alloc(10);
    assert_true(dry->peak_bytes() == 256);  // a new set of allocations
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_costs), cmocka_unit_test(test_linear_act_costs), cmocka_unit_test(test_attention_costs),
        cmocka_unit_test(test_profile_wraps), cmocka_unit_test(test_dry_backend),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
