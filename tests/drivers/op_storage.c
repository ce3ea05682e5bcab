// op_storage.c: test driver for tests/oracle/test_op_storage.py. Runs one op of the CPU backend with
// its activations stored as bfloat16 (kernels.h, "Activation storage") on tensors read by name from a
// safetensors file, and writes the op's outputs, so the oracle can hold them against a torch
// restatement.
//   op_storage OP IN.safetensors OUT.safetensors N C [fn]
// OP: add add_bias dropout jitter activation_forward activation_backward gated_forward gated_backward
// layernorm_forward layernorm_backward rmsnorm_forward rmsnorm_backward add_layernorm_forward
// add_rmsnorm_forward qkv_split qkv_merge rotary_apply embedding_forward embedding_backward
// cross_entropy linear attention scalenorm_forward scalenorm_backward head_norm_forward
// head_norm_backward gather_rows moe_combine. Activations ("x", "y", "dout", "dinp", "sum") are BF16 of N*C elements (N*2C for
// a gated input and its gradient); parameters and statistics ("weight", "bias", "mean", "rstd", and
// the gradients "dweight", "dbias" that backward adds into) are F32. fn: the activation function's
// number (neox_act_fn). dropout uses p = 0.25, seed 7, offset 100. qkv_split/merge take N = B*T rows
// (B = 1) of C = (NH + 2 NKV) HS with NH = 4, NKV = 2, HS = C / 8, grouped ([q | k | v]): "x" the
// fused rows, "q", "k", "v" the heads (merge's inputs). rotary_apply rotates "x" (1, 1, N, C) in place
// with R = C and the F32 tables "cos", "sin" (N, C/2); fn = 1: the inverse. embedding_forward looks
// up the I32 "ids" (N, -1: no row) in the F32 "wte" (EMB_V, C) and adds "wpe" (N, C) (B = 1, T = N);
// embedding_backward adds the BF16 "dout" (N, C) into the F32 "dwte" and "dwpe". cross_entropy takes
// the BF16 "x" (N, C) as logits, the I32 "targets" (N) and the F32 "weight" (N): the F32 "losses",
// "lse", "mx" (row_max), the F64 "sumexp" (row_sumexp from mx) and "target_logit", and "dlogits"
// (BF16, in place, scale 1/N). linear takes the BF16 "x" (N, C), "w16" (LIN_OC, C), "dout" (N, LIN_OC)
// and "dinp" (N, C), the F32 "bias", "dbias" (LIN_OC) and "dweight" (LIN_OC, C): "out" (BF16), then the
// backward's "dinp" (added to when fn & 1), "dweight" and "dbias"; fn & 2: the forward without the
// bias (the output layer's case). attention: causal attention of
// the BF16 "q" (ATT_NH, N, ATT_HS), "k", "v" (ATT_NKV, N, ATT_HS) with fp32 operands and scale
// 1/sqrt(ATT_HS) (B = 1, T = N): "out" (N, ATT_NH * ATT_HS) and "lse" (F32), then the backward of the
// BF16 "dout" (N, ATT_NH * ATT_HS): "dq", "dk", "dv". jitter scales "x" with eps 0.1, seed 7.
// scalenorm_forward normalises "x" (N, C) with the F32 gain "g" (1) and eps SCALE_EPS: "out", "rnorm";
// scalenorm_backward adds into the BF16 "dinp" and the F32 "dg" from "x", "dout", "g" and the F32
// "rnorm" (N). head_norm_forward normalises "x" as (1, HN_H, N, C / HN_H) heads in place, over all
// heads with the F32 "weight" and "bias" (C) (fn = 0: LayerNorm, G = HN_H) or per head (fn = 1: RMS,
// G = 1, no bias): "out", "rstd" and (LayerNorm) "mean" (N * HN_H / G); head_norm_backward overwrites
// the BF16 "dout" in place with the input gradient from "x", "weight", "mean", "rstd", adding into
// "dweight" (and "dbias"). gather_rows gathers the N * MOE_K rows of "x" (N, C) named by the I32 "perm"
// (N * MOE_K) into "out"; moe_combine combines the BF16 "rows" (N * MOE_K, C) by the I32 "slot"
// and F32 "weight" (N * MOE_K) into "out" (N, C), then its backward of the BF16 "dout" (N, C):
// "drows" and the F32 "dweight".
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "kernels/kernels.h"
#include "safetensors.h"

static neox_safetensors *in;

// A writable copy of tensor `name` of `count` elements of dtype (exits when it is missing or misshapen).
static void *copy_of(const char *name, const char *dtype, size_t count) {
    const neox_st_tensor *t = neox_safetensors_find(in, name);
    if (!t || strcmp(t->dtype, dtype) != 0 || (size_t)neox_st_numel(t) != count) {
        fprintf(stderr, "op_storage: %s: need %s of %zu elements\n", name, dtype, count);
        exit(2);
    }
    void *p = neox_malloc(t->size);
    memcpy(p, t->data, t->size);
    return p;
}
static uint16_t *bf16(const char *name, size_t count) { return copy_of(name, "BF16", count); }
static float *f32(const char *name, size_t count) { return copy_of(name, "F32", count); }
static int *i32(const char *name, size_t count) { return copy_of(name, "I32", count); }

enum { EMB_V = 11 };  // the embedding table's rows
enum { LIN_OC = 24 };  // the linear layer's outputs
enum { ATT_NH = 4, ATT_NKV = 2, ATT_HS = 16 };  // attention's heads (GQA groups of two) and head size
enum { HN_H = 4 };  // the query/key norm's heads
enum { MOE_K = 2 };  // expert slots per token
#define SCALE_EPS 1e-8f

typedef struct { const char *name; const char *dtype; const void *data; size_t count; } output;

static int write_outputs(const char *path, const output *outs, int n) {
    neox_st_entry e[8];
    for (int i = 0; i < n; i++)
        e[i] = (neox_st_entry){outs[i].name, outs[i].dtype, 1, {(int64_t)outs[i].count}, outs[i].data};
    neox_error err = {0};
    if (neox_safetensors_write(path, e, n, NULL, &err) != 0) {
        fprintf(stderr, "op_storage: %s\n", err.message);
        return 1;
    }
    return 0;
}

#define B NEOX_ELEM_BF16
#define OUT_B(nm, p, c) (output){nm, "BF16", p, c}
#define OUT_F(nm, p, c) (output){nm, "F32", p, c}
#define OUT_D(nm, p, c) (output){nm, "F64", p, c}

// ScaleNorm and the query/key norm (see the header for their tensors).
static int run_other_norm(const char *op, int N, int C, neox_act_fn fn, output *outs) {
    size_t n = (size_t)N * C;
    if (!strcmp(op, "scalenorm_forward")) {
        uint16_t *o = neox_malloc(n * 2);
        float *rnorm = neox_malloc(N * sizeof(float));
        neox_scalenorm_forward(o, rnorm, bf16("x", n), f32("g", 1), N, C, SCALE_EPS, B);
        return outs[0] = OUT_B("out", o, n), outs[1] = OUT_F("rnorm", rnorm, N), 2;
    }
    if (!strcmp(op, "scalenorm_backward")) {
        uint16_t *dx = bf16("dinp", n);
        float *dg = f32("dg", 1);
        neox_scalenorm_backward(dx, dg, bf16("dout", n), bf16("x", n), f32("g", 1), f32("rnorm", N), N, C, SCALE_EPS,
                                B);
        return outs[0] = OUT_B("dinp", dx, n), outs[1] = OUT_F("dg", dg, 1), 2;
    }
    int rms = fn == 1, G = rms ? 1 : HN_H, HS = C / HN_H;
    size_t rows = (size_t)N * HN_H / G;
    float *w = f32("weight", C), *bias = rms ? NULL : f32("bias", C);
    if (!strcmp(op, "head_norm_forward")) {
        uint16_t *x = bf16("x", n);
        float *mean = rms ? NULL : neox_malloc(rows * sizeof(float)), *rstd = neox_malloc(rows * sizeof(float));
        neox_head_norm_forward(x, mean, rstd, x, w, bias, 1, HN_H, N, HS, G, 1e-5f, B);
        outs[0] = OUT_B("out", x, n), outs[1] = OUT_F("rstd", rstd, rows), outs[2] = OUT_F("mean", mean, rows);
        return rms ? 2 : 3;
    }
    if (!strcmp(op, "head_norm_backward")) {
        uint16_t *d = bf16("dout", n);
        float *dw = f32("dweight", C), *db = rms ? NULL : f32("dbias", C);
        neox_head_norm_backward(d, dw, db, d, bf16("x", n), w, rms ? NULL : f32("mean", rows), f32("rstd", rows), 1,
                                HN_H, N, HS, G, B);
        outs[0] = OUT_B("dinp", d, n), outs[1] = OUT_F("dweight", dw, C), outs[2] = OUT_F("dbias", db, C);
        return rms ? 2 : 3;
    }
    return 0;
}

// Runs op; fills outs and returns their number (0: unknown op).
static int run(const char *op, int N, int C, neox_act_fn fn, output *outs) {
    size_t n = (size_t)N * C;
    if (!strcmp(op, "add")) {
        uint16_t *x = bf16("x", n), *y = bf16("y", n), *o = neox_malloc(n * 2);
        neox_add(o, x, y, n, B);
        return outs[0] = OUT_B("out", o, n), 1;
    }
    if (!strcmp(op, "add_bias")) {
        uint16_t *x = bf16("x", n);
        neox_add_bias(x, f32("bias", C), N, C, B);
        return outs[0] = OUT_B("out", x, n), 1;
    }
    if (!strcmp(op, "dropout")) {
        uint16_t *x = bf16("x", n), *o = neox_malloc(n * 2);
        neox_dropout(o, x, n, 0.25f, 7, 100, NULL, 0, B);
        return outs[0] = OUT_B("out", o, n), 1;
    }
    if (!strcmp(op, "jitter")) {
        uint16_t *x = bf16("x", n), *o = neox_malloc(n * 2);
        neox_jitter(o, x, n, 0.1f, 7, B);
        return outs[0] = OUT_B("out", o, n), 1;
    }
    if (!strncmp(op, "scalenorm_", 10) || !strncmp(op, "head_norm_", 10)) return run_other_norm(op, N, C, fn, outs);
    if (!strcmp(op, "gather_rows")) {
        uint16_t *o = neox_malloc((size_t)MOE_K * n * 2);
        neox_gather_rows(o, bf16("x", n), i32("perm", (size_t)N * MOE_K), N * MOE_K, C, B);
        return outs[0] = OUT_B("out", o, (size_t)MOE_K * n), 1;
    }
    if (!strcmp(op, "moe_combine")) {
        size_t nk = (size_t)N * MOE_K;
        uint16_t *rows = bf16("rows", nk * C), *o = neox_malloc(n * 2), *dr = neox_malloc(nk * C * 2);
        int *slot = i32("slot", nk);
        float *w = f32("weight", nk), *dw = neox_malloc(nk * sizeof(float));
        neox_moe_combine(o, rows, slot, w, N, MOE_K, C, B);
        neox_moe_combine_backward(dr, dw, bf16("dout", n), rows, slot, w, N, MOE_K, C, B);
        outs[0] = OUT_B("out", o, n), outs[1] = OUT_B("drows", dr, nk * C), outs[2] = OUT_F("dweight", dw, nk);
        return 3;
    }
    if (!strcmp(op, "activation_forward") || !strcmp(op, "activation_backward")) {
        uint16_t *x = bf16("x", n), *o = neox_malloc(n * 2);
        if (op[11] == 'f') neox_activation_forward(o, x, n, fn, B);
        else neox_activation_backward(o, bf16("dout", n), x, n, fn, B);
        return outs[0] = OUT_B("out", o, n), 1;
    }
    if (!strcmp(op, "gated_forward")) {
        uint16_t *x = bf16("x", 2 * n), *o = neox_malloc(n * 2);
        neox_gated_forward(o, x, N, C, fn, B);
        return outs[0] = OUT_B("out", o, n), 1;
    }
    if (!strcmp(op, "gated_backward")) {
        uint16_t *x = bf16("x", 2 * n), *o = neox_malloc(2 * n * 2);
        neox_gated_backward(o, bf16("dout", n), x, N, C, fn, B);
        return outs[0] = OUT_B("out", o, 2 * n), 1;
    }
    if (!strcmp(op, "qkv_split") || !strcmp(op, "qkv_merge")) {
        int HS = C / 8;
        size_t nq = (size_t)N * 4 * HS, nk = (size_t)N * 2 * HS;
        if (op[4] == 's') {
            uint16_t *q = neox_malloc(nq * 2), *k = neox_malloc(nk * 2), *v = neox_malloc(nk * 2);
            neox_qkv_split(q, k, v, bf16("x", n), 1, N, 4, 2, HS, 0, B);
            outs[0] = OUT_B("q", q, nq), outs[1] = OUT_B("k", k, nk), outs[2] = OUT_B("v", v, nk);
            return 3;
        }
        uint16_t *x = neox_malloc(n * 2);
        neox_qkv_merge(x, bf16("q", nq), bf16("k", nk), bf16("v", nk), 1, N, 4, 2, HS, 0, B);
        return outs[0] = OUT_B("out", x, n), 1;
    }
    if (!strcmp(op, "embedding_forward")) {
        uint16_t *o = neox_malloc(n * 2);
        neox_embedding_forward(o, i32("ids", N), f32("wte", (size_t)EMB_V * C), f32("wpe", n), 1, N, C, B);
        return outs[0] = OUT_B("out", o, n), 1;
    }
    if (!strcmp(op, "embedding_backward")) {
        float *dwte = f32("dwte", (size_t)EMB_V * C), *dwpe = f32("dwpe", n);
        neox_embedding_backward(dwte, dwpe, bf16("dout", n), i32("ids", N), 1, N, C, B);
        outs[0] = OUT_F("dwte", dwte, (size_t)EMB_V * C), outs[1] = OUT_F("dwpe", dwpe, n);
        return 2;
    }
    if (!strcmp(op, "cross_entropy")) {
        uint16_t *x = bf16("x", n);
        int *t = i32("targets", N);
        float *losses = neox_malloc(N * sizeof(float)), *lse = neox_malloc(N * sizeof(float));
        float *mx = neox_malloc(N * sizeof(float));
        double *sum = neox_malloc(N * sizeof(double)), *tl = neox_malloc(N * sizeof(double));
        neox_cross_entropy_forward(losses, lse, x, t, N, C, B);
        neox_cross_entropy_row_max(mx, x, N, C, B);
        neox_cross_entropy_row_sumexp(sum, x, mx, N, C, B);
        neox_cross_entropy_target_logit(tl, x, t, N, C, B);
        neox_cross_entropy_backward(x, x, lse, t, f32("weight", N), 1.0f / N, NULL, N, C, B);
        outs[0] = OUT_F("losses", losses, N), outs[1] = OUT_F("lse", lse, N), outs[2] = OUT_F("mx", mx, N);
        outs[3] = OUT_D("sumexp", sum, N), outs[4] = OUT_D("target_logit", tl, N), outs[5] = OUT_B("dlogits", x, n);
        return 6;
    }
    if (!strcmp(op, "linear")) {
        size_t no = (size_t)N * LIN_OC, nw = (size_t)LIN_OC * C;
        uint16_t *x = bf16("x", n), *w = bf16("w16", nw), *o = neox_malloc(no * 2), *dx = bf16("dinp", n);
        float *dw = f32("dweight", nw), *db = f32("dbias", LIN_OC);
        neox_linear_forward(o, LIN_OC, x, w, fn & 2 ? NULL : f32("bias", LIN_OC), N, C, LIN_OC, B);
        neox_linear_backward(dx, dw, db, bf16("dout", no), LIN_OC, x, w, N, C, LIN_OC, fn & 1, B);
        outs[0] = OUT_B("out", o, no), outs[1] = OUT_B("dinp", dx, n), outs[2] = OUT_F("dweight", dw, nw);
        outs[3] = OUT_F("dbias", db, LIN_OC);
        return 4;
    }
    if (!strcmp(op, "attention")) {
        size_t nq = (size_t)ATT_NH * N * ATT_HS, nkv = (size_t)ATT_NKV * N * ATT_HS;
        uint16_t *q = bf16("q", nq), *k = bf16("k", nkv), *v = bf16("v", nkv), *o = neox_malloc(nq * 2);
        uint16_t *dq = neox_malloc(nq * 2), *dk = neox_malloc(nkv * 2), *dv = neox_malloc(nkv * 2);
        float *lse = neox_malloc((size_t)ATT_NH * N * sizeof(float));
        neox_attention_opts ao = {.scale = 0.25f, .operands = NEOX_ELEM_F32};
        neox_attention_forward(o, lse, q, k, v, 1, N, ATT_NH, ATT_NKV, ATT_HS, ao, B);
        neox_attention_backward(dq, dk, dv, bf16("dout", nq), q, k, v, o, lse, 1, N, ATT_NH, ATT_NKV, ATT_HS, ao, B);
        outs[0] = OUT_B("out", o, nq), outs[1] = OUT_F("lse", lse, (size_t)ATT_NH * N), outs[2] = OUT_B("dq", dq, nq);
        outs[3] = OUT_B("dk", dk, nkv), outs[4] = OUT_B("dv", dv, nkv);
        return 5;
    }
    if (!strcmp(op, "rotary_apply")) {
        uint16_t *x = bf16("x", n);
        neox_rotary_apply(x, f32("cos", n / 2), f32("sin", n / 2), 1, 1, N, C, C, fn == 1, B,
                          (neox_head_strides){0});
        return outs[0] = OUT_B("out", x, n), 1;
    }
    int rms = !strncmp(op, "rms", 3) || !strncmp(op, "add_rms", 7);
    float *w = f32("weight", C), *bias = rms ? NULL : f32("bias", C);
    float *mean = neox_malloc(N * sizeof(float)), *rstd = neox_malloc(N * sizeof(float));
    if (!strcmp(op, "layernorm_forward") || !strcmp(op, "rmsnorm_forward")) {
        uint16_t *x = bf16("x", n), *o = neox_malloc(n * 2);
        if (rms) neox_rmsnorm_forward(o, rstd, x, w, N, C, 1e-5f, B);
        else neox_layernorm_forward(o, mean, rstd, x, w, bias, N, C, 1e-5f, B);
        outs[0] = OUT_B("out", o, n), outs[1] = OUT_F("rstd", rstd, N), outs[2] = OUT_F("mean", mean, N);
        return rms ? 2 : 3;
    }
    if (!strcmp(op, "add_layernorm_forward") || !strcmp(op, "add_rmsnorm_forward")) {
        uint16_t *x = bf16("x", n), *y = bf16("y", n), *s = neox_malloc(n * 2), *o = neox_malloc(n * 2);
        if (rms) neox_add_rmsnorm_forward(s, o, rstd, x, y, NULL, w, N, C, 1e-5f, B);
        else neox_add_layernorm_forward(s, o, mean, rstd, x, y, NULL, w, bias, N, C, 1e-5f, B);
        outs[0] = OUT_B("sum", s, n), outs[1] = OUT_B("out", o, n), outs[2] = OUT_F("rstd", rstd, N);
        outs[3] = OUT_F("mean", mean, N);
        return rms ? 3 : 4;
    }
    if (!strcmp(op, "layernorm_backward") || !strcmp(op, "rmsnorm_backward")) {
        uint16_t *x = bf16("x", n), *d = bf16("dout", n), *dx = bf16("dinp", n);
        float *dw = f32("dweight", C), *db = rms ? NULL : f32("dbias", C);
        if (rms) neox_rmsnorm_backward(dx, dw, NULL, d, x, w, f32("rstd", N), N, C, B);
        else neox_layernorm_backward(dx, dw, db, NULL, d, x, w, f32("mean", N), f32("rstd", N), N, C, B);
        outs[0] = OUT_B("dinp", dx, n), outs[1] = OUT_F("dweight", dw, C), outs[2] = OUT_F("dbias", db, C);
        return rms ? 2 : 3;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: op_storage OP IN.safetensors OUT.safetensors N C [fn]\n");
        return 2;
    }
    neox_error err = {0};
    in = neox_safetensors_open(argv[2], &err);
    if (!in) {
        fprintf(stderr, "op_storage: %s\n", err.message);
        return 1;
    }
    output outs[8];
    int n = run(argv[1], atoi(argv[4]), atoi(argv[5]), argc > 6 ? (neox_act_fn)atoi(argv[6]) : NEOX_FN_GELU, outs);
    if (!n) {
        fprintf(stderr, "op_storage: unknown op %s\n", argv[1]);
        return 2;
    }
    return write_outputs(argv[3], outs, n);  // (the process's memory is left to its exit)
}
