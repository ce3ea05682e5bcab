// linear.c: the model's linear layers in its precision. fp32 runs the backend's linear ops;
// bfloat16 and fp16 cast the layer's input (or output gradient) into 16-bit scratch and multiply
// it with the 16-bit copy of the weights through gemm_ex, accumulating in fp32 into fp32 results,
// so only the products' operands are rounded (as under torch.autocast) and the parameters, their
// gradients and every other activation stay fp32. fp8 runs the transformer layers' products on FP8
// operands (fp8.c) and every other product (the output layer, MoE's) as bfloat16 does.
#include <string.h>

#include "kernels/backend.h"
#include "model_internal.h"

static const char *const precision_names[] = {"fp32", "bfloat16", "fp16", "fp8"};

int neox_precision_parse(const char *name, neox_precision *out) {
    for (int p = 0; p < 4; p++)
        if (!strcmp(name, precision_names[p])) {
            *out = (neox_precision)p;
            return 0;
        }
    return -1;
}

const char *neox_precision_name(neox_precision p) { return precision_names[p]; }

neox_elem neox_model_operand_elem(const neox_model *m) {
    return m->precision == NEOX_PRECISION_BF16 || m->precision == NEOX_PRECISION_FP8 ? NEOX_ELEM_BF16
           : m->precision == NEOX_PRECISION_FP16                                      ? NEOX_ELEM_F16
                                                                                      : NEOX_ELEM_F32;
}

static neox_elem half_elem(const neox_model *m) { return neox_model_operand_elem(m); }

static void cast_half(const neox_model *m, uint16_t *out, const float *inp, size_t n) {
    if (m->precision == NEOX_PRECISION_FP16) m->be->cast_f32_to_f16(out, inp, n);
    else m->be->cast_f32_to_bf16(out, inp, n);
}

neox_elem neox_model_storage_elem(const neox_model_desc *d, neox_precision p) {
    return p == NEOX_PRECISION_BF16 && !neox_model_has_moe(d) && !d->value_head ? NEOX_ELEM_BF16 : NEOX_ELEM_F32;
}

void neox_model_set_storage(neox_model *m, neox_elem act) {
    neox_assert(act == NEOX_ELEM_F32 || m->precision == NEOX_PRECISION_BF16, "bf16 storage needs precision bfloat16");
    if (act == m->act_elem) return;
    m->act_elem = act;
    if (!m->act_buf) return;
    neox_error err = {0};  // (a plan carved for the other storage is carved again, for the same sizes)
    int planned = neox_model_plan_slots(m, m->B, m->T, m->nslots, &err);
    neox_assert(planned == 0, "%s", err.message);  // (the sizes were planned before)
}

void neox_model_set_precision(neox_model *m, neox_precision p) {
    m->precision = p;
    if (p != NEOX_PRECISION_FP8) neox_model_fp8_free(m);  // (fp8's recipe makes its state)
    if (p != NEOX_PRECISION_FP32 && !m->param16) m->param16 = m->be->alloc(m->num_floats * sizeof(uint16_t));
    m->param16_stale = 1;
    neox_elem act = neox_model_storage_elem(&m->desc, p);
    if (act != m->act_elem) neox_model_set_storage(m, act);
    else if (m->act_buf) neox_model_plan_half(m);
}

void neox_model_weights_changed(neox_model *m) { m->param16_stale = 1; }

void neox_model_refresh_weights(neox_model *m) {
    // Under ZeRO-3 param_buf holds only the gathered units: the hook's owner casts them as they arrive.
    if (m->precision == NEOX_PRECISION_FP32 || !m->param16_stale || m->weights_use) return;
    cast_half(m, m->param16, m->param_buf, m->num_floats);
    m->param16_stale = 0;
}

void neox_model_refresh_range(neox_model *m, size_t begin, size_t end) {
    if (m->precision != NEOX_PRECISION_FP32 && end > begin) cast_half(m, m->param16 + begin, m->param_buf + begin, end - begin);
}

// The weight whose gradient is dw (a view into grad_buf): the same offset in param_buf.
static const float *w_of_grad(const neox_model *m, const float *dw) { return m->param_buf + (dw - m->grad_buf); }

// The 16-bit copy of weight w (a view into param_buf).
static const uint16_t *weight16(const neox_model *m, const float *w) { return m->param16 + (w - m->param_buf); }

// out (N, OC, rows ldo apart) = inp (N, IC) @ w^T (OC, IC) (+ bias (OC), only with ldo == OC); half:
// room for inp's 16-bit copy.
static void linear_forward_ld(neox_model *m, uint16_t *half, float *out, int ldo, const float *inp, const float *w,
                              const float *bias, int N, int IC, int OC, neox_elem act) {
    const neox_backend *be = m->be;
    if (act == NEOX_ELEM_BF16) {  // bf16 storage: the operands are bf16 already, the result rounded once
        be->linear_forward(out, ldo, inp, weight16(m, w), bias, N, IC, OC, NEOX_ELEM_BF16);
        return;
    }
    if (m->precision == NEOX_PRECISION_FP32) {
        be->linear_forward(out, ldo, inp, w, bias, N, IC, OC, NEOX_ELEM_F32);
        return;
    }
    int fp8 = ldo == OC && half == m->half_in ? neox_model_fp8_linear(m, w) : -1;
    if (fp8 >= 0) {
        neox_model_fp8_forward(m, fp8, out, inp, w, bias, N, IC, OC);
        return;
    }
    cast_half(m, half, inp, (size_t)N * IC);
    be->gemm_ex(0, 1, N, OC, IC, 1.0f, half, IC, weight16(m, w), IC, half_elem(m), 0.0f, out, ldo, NEOX_ELEM_F32);
    if (bias) be->add_bias(out, bias, N, OC, NEOX_ELEM_F32);
}

// out (N, OC) = inp (N, IC) @ w^T (OC, IC) (+ bias (OC)).
void neox_model_linear_forward(neox_model *m, float *out, const float *inp, const float *w, const float *bias, int N,
                               int IC, int OC) {
    linear_forward_ld(m, m->half_in, out, OC, inp, w, bias, N, IC, OC, m->act_elem);
}

void neox_model_linear_forward_scratch(neox_model *m, uint16_t *half, float *out, const float *inp, const float *w,
                                       const float *bias, int N, int IC, int OC) {
    linear_forward_ld(m, half, out, OC, inp, w, bias, N, IC, OC, NEOX_ELEM_F32);
}

void neox_model_linear_team(neox_model *m, uint16_t *half, float *out, const float *inp, const float *w,
                            const float *bias, int N, int IC, int OC) {
    const neox_backend *be = m->be;
    if (!half) {
        be->team_linear(out, inp, w, bias, N, IC, OC, NEOX_ELEM_F32);
        return;
    }
    cast_half(m, half, inp, (size_t)N * IC);
    be->team_linear(out, half, weight16(m, w), bias, N, IC, OC, half_elem(m));
}

void neox_model_linear_forward_cols(neox_model *m, float *out, int ldo, const float *inp, const float *w, int N, int IC,
                                    int OC) {
    linear_forward_ld(m, m->half_in, out, ldo, inp, w, NULL, N, IC, OC, m->act_elem);
}

// dw (OC, IC) += dout^T (OC, N) @ inp (N, IC); db (OC, or NULL) += column sums of dout (N, OC).
// In 16-bit precision it leaves dout's 16-bit copy for neox_model_linear_backward_input.
void neox_model_linear_backward_weights(neox_model *m, float *dw, float *db, const float *dout, const float *inp, int N,
                                        int IC, int OC) {
    const neox_backend *be = m->be;
    if (m->precision == NEOX_PRECISION_FP32 || m->act_elem == NEOX_ELEM_BF16) {
        be->linear_backward(NULL, dw, db, dout, OC, inp, NULL, N, IC, OC, 0, m->act_elem);
        return;
    }
    int fp8 = neox_model_fp8_linear(m, w_of_grad(m, dw));
    if (fp8 >= 0) {
        neox_model_fp8_backward_weights(m, fp8, dw, db, dout, inp, N, IC, OC);
        return;
    }
    cast_half(m, m->half_out, dout, (size_t)N * OC);
    cast_half(m, m->half_in, inp, (size_t)N * IC);
    be->gemm_ex(1, 0, OC, IC, N, 1.0f, m->half_out, OC, m->half_in, IC, half_elem(m), 1.0f, dw, IC, NEOX_ELEM_F32);
    if (db) be->linear_backward(NULL, NULL, db, dout, OC, NULL, NULL, N, IC, OC, 0, NEOX_ELEM_F32);
}

void neox_model_linear_backward_weight_rows(neox_model *m, float *dw, const float *dout, const float *inp, int N,
                                            int IC, int OC, int o0, int o1, int cast) {
    const neox_backend *be = m->be;
    float *rows = dw + (size_t)o0 * IC;
    if (m->precision == NEOX_PRECISION_FP32 || m->act_elem == NEOX_ELEM_BF16) {
        be->linear_backward(NULL, rows, NULL, neox_act_at(m, dout, (size_t)o0), OC, inp, NULL, N, IC, o1 - o0, 0,
                            m->act_elem);
        return;
    }
    if (cast) {
        cast_half(m, m->half_out, dout, (size_t)N * OC);
        cast_half(m, m->half_in, inp, (size_t)N * IC);
    }
    be->gemm_ex(1, 0, o1 - o0, IC, N, 1.0f, m->half_out + o0, OC, m->half_in, IC, half_elem(m), 1.0f, rows, IC,
                NEOX_ELEM_F32);
}

// dinp (N, IC) = dout (N, OC) @ w (OC, IC), overwritten; right after the weights' backward of the
// same dout.
void neox_model_linear_backward_input(neox_model *m, float *dinp, const float *dout, const float *w, int N, int IC,
                                      int OC) {
    const neox_backend *be = m->be;
    if (m->precision == NEOX_PRECISION_FP32) {
        be->linear_backward(dinp, NULL, NULL, dout, OC, NULL, w, N, IC, OC, 0, NEOX_ELEM_F32);
        return;
    }
    if (m->act_elem == NEOX_ELEM_BF16) {
        be->linear_backward(dinp, NULL, NULL, dout, OC, NULL, weight16(m, w), N, IC, OC, 0, NEOX_ELEM_BF16);
        return;
    }
    int fp8 = neox_model_fp8_linear(m, w);
    if (fp8 >= 0) {
        neox_model_fp8_backward_input(m, fp8, dinp, w, N, IC, OC);
        return;
    }
    be->gemm_ex(0, 0, N, IC, OC, 1.0f, m->half_out, OC, weight16(m, w), IC, half_elem(m), 0.0f, dinp, IC,
                NEOX_ELEM_F32);
}

void neox_model_linear_backward_input_rows(neox_model *m, float *dinp, const float *dout, const float *w, int N, int IC,
                                           int OC, int o0, int o1) {
    const neox_backend *be = m->be;
    const float *rows = w + (size_t)o0 * IC;
    if (m->precision == NEOX_PRECISION_FP32 || m->act_elem == NEOX_ELEM_BF16) {
        const float *w_rows = m->act_elem == NEOX_ELEM_BF16 ? (const float *)weight16(m, rows) : rows;
        be->linear_backward(dinp, NULL, NULL, neox_act_at(m, dout, (size_t)o0), OC, NULL, w_rows, N, IC, o1 - o0, o0 > 0,
                            m->act_elem);
        return;
    }
    be->gemm_ex(0, 0, N, IC, o1 - o0, 1.0f, m->half_out + o0, OC, weight16(m, rows), IC, half_elem(m),
                o0 > 0 ? 1.0f : 0.0f, dinp, IC, NEOX_ELEM_F32);
}

// Whether the MLP's first projection and its activation run as the backend's fused op: an ungated
// activation on fp32 products with fp32 activations, or on bf16 storage (the op takes both as they
// are; fp16 and FP8 products, which cast operands into scratch, and gated activations run as before).
// The one place the model decides it; where a device then fuses the function into the product is the
// route's (kernels.h, neox_linear_act_route).
static int mlp_fused(const neox_model *m) {
    if (neox_activation_gated(m->desc.activation)) return 0;
    return (m->precision == NEOX_PRECISION_FP32 && m->act_elem == NEOX_ELEM_F32) || m->act_elem == NEOX_ELEM_BF16;
}

// The weight operand of the fused ops: the fp32 weight, or under bf16 storage its bf16 copy.
static const void *fused_weight(const neox_model *m, const float *w) {
    return m->act_elem == NEOX_ELEM_BF16 ? (const void *)weight16(m, w) : (const void *)w;
}

void neox_model_mlp_forward_in(neox_model *m, float *act, float *fc, const float *inp, const float *w,
                               const float *bias, int N, int C, int F) {
    const neox_backend *be = m->be;
    neox_act_fn fn = neox_activation_function(m->desc.activation);
    int gated = neox_activation_gated(m->desc.activation);
    if (mlp_fused(m)) {
        be->linear_act_forward(act, fc, inp, fused_weight(m, w), bias, N, C, F, fn, m->act_elem);
        return;
    }
    neox_model_linear_forward(m, fc, inp, w, bias, N, C, gated ? 2 * F : F);
    if (gated) be->gated_forward(act, fc, N, F, fn, m->act_elem);
    else be->activation_forward(act, fc, (size_t)N * F, fn, m->act_elem);
}

float *neox_model_mlp_backward_act(neox_model *m, float *dfc, float *dact, float *db, const float *dout,
                                   const float *w2, const float *fc, int N, int F, int C) {
    const neox_backend *be = m->be;
    neox_act_fn fn = neox_activation_function(m->desc.activation);
    if (mlp_fused(m)) {
        // The bias gradient goes into the op only where the device sums it in the product's own pass
        // (cuBLASLt's DGELU_BGRAD); else the first projection's weight backward sums it (BGRADB on
        // fp32 products, column sums on bf16), as without the fusion. (On the CPU both are the same
        // column sums of the same dfc.)
        int in_op = neox_linear_act_route(fn, m->act_elem) == NEOX_EPILOGUE_CUBLASLT;
        be->linear_act_backward(dfc, in_op ? db : NULL, dout, fused_weight(m, w2), fc, N, F, C, fn, m->act_elem);
        return in_op ? NULL : db;
    }
    neox_model_linear_backward_input(m, dact, dout, w2, N, F, C);
    if (neox_activation_gated(m->desc.activation)) be->gated_backward(dfc, dact, fc, N, F, fn, m->act_elem);
    else be->activation_backward(dfc, dact, fc, (size_t)N * F, fn, m->act_elem);
    return db;
}
