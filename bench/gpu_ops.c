// gpu_ops.c: speed of the CUDA ops at GPT-NeoX 125M's training shapes (B 8, T 2048, C 768, 12 heads,
// vocabulary 50304), each against a peer measured in the same run: matrix-bound ops against cuBLAS's
// fp32 GEMM rate, memory-bound ops against a device-to-device copy's bandwidth; plus the bf16 and
// TF32 GEMM rates that MFU is measured against. One line per op:
//   op  ms_per_call  achieved (TFLOP/s or GB/s)  ratio_to_peer
// Times are wall-clock over repeated calls between two synchronisations (launch overhead included,
// small at these sizes). bf16 attention runs where the CUDA backend routes it (cuDNN where it loads),
// then on the own pipelined kernels with both forms of their backward; likewise the MLP's products with
// the exact GELU (one cuDNN graph each way, then the product and GELU's pass apart). Run by
// tests/gpu/device-check.sh; needs a GPU.
//   gpu_ops [batch]     (default 8)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend.h"
#include "kernels/cuda/cuda.h"

static const neox_backend *be;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef void (*op_fn)(void *ctx);

// Seconds per call: one warm-up call, then calls until 0.3 s have passed (at least 3).
static double time_op(op_fn fn, void *ctx) {
    fn(ctx);
    be->synchronize();
    int calls = 0;
    double t0 = now(), t;
    do {
        fn(ctx);
        calls++;
        be->synchronize();
        t = now();
    } while (calls < 3 || t - t0 < 0.3);
    return (t - t0) / calls;
}

// Device buffer of n floats filled with a small pattern (the values matter little for speed; they
// are kept finite and modest so exponentials stay in range).
static float *dev_floats(size_t n, float scale) {
    float *h = malloc(n * sizeof(float)), *d = be->alloc(n * sizeof(float));
    if (!h) { fprintf(stderr, "gpu_ops: out of host memory\n"); exit(2); }
    for (size_t i = 0; i < n; i++) h[i] = scale * (neox_uniform(1, i) - 0.5f);
    be->to_device(d, h, n * sizeof(float));
    free(h);
    return d;
}

// ---- the ops timed, each a context struct and a function -------------------------------------------

typedef struct { int M, N, K; neox_elem e; void *a, *b, *c; } gemm_ctx;
static void run_gemm(void *p) {
    gemm_ctx *g = p;
    be->gemm_ex(0, 1, g->M, g->N, g->K, 1.0f, g->a, g->K, g->b, g->K, g->e, 0.0f, g->c, g->N, g->e);
}

typedef struct { size_t bytes; void *dst, *src; } copy_ctx;
static void run_copy(void *p) { copy_ctx *c = p; be->copy(c->dst, c->src, c->bytes); }

typedef struct { int B, T, NH, HS; float *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv; neox_elem e; } att_ctx;
static void run_att_fwd(void *p) {
    att_ctx *a = p;
    be->attention_forward(a->out, a->lse, a->q, a->k, a->v, a->B, a->T, a->NH, a->NH, a->HS,
                          (neox_attention_opts){.scale = 0.125f, .operands = a->e}, NEOX_ELEM_F32);
}
static void run_att_bwd(void *p) {
    att_ctx *a = p;
    be->attention_backward(a->dq, a->dk, a->dv, a->dout, a->q, a->k, a->v, a->out, a->lse, a->B, a->T, a->NH, a->NH,
                           a->HS, (neox_attention_opts){.scale = 0.125f, .operands = a->e}, NEOX_ELEM_F32);
}

// The MLP's products on bf16 storage with the exact GELU (kernels.h, linear_act_forward/backward):
// x (N, C), w1 (F, C), pre and post (N, F); dy (N, C), w2 (C, F), dpre (N, F).
typedef struct { int N, C, F; void *x, *w1, *pre, *post, *dy, *w2, *dpre; float *b1; } mlp_ctx;
static void run_mlp_fwd(void *p) {
    mlp_ctx *m = p;
    be->linear_act_forward(m->post, m->pre, m->x, m->w1, m->b1, m->N, m->C, m->F, NEOX_FN_GELU, NEOX_ELEM_BF16);
}
static void run_mlp_bwd(void *p) {
    mlp_ctx *m = p;
    be->linear_act_backward(m->dpre, NULL, m->dy, m->w2, m->pre, m->N, m->F, m->C, NEOX_FN_GELU, NEOX_ELEM_BF16);
}

// The QKV projection on bf16 storage with its fp32 bias: x (N, C), w (3C, C), out (N, 3C).
typedef struct { int N, C; void *x, *w, *out; float *b; } qkv_ctx;
static void run_qkv_fwd(void *p) {
    qkv_ctx *q = p;
    be->linear_forward(q->out, 3 * q->C, q->x, q->w, q->b, q->N, q->C, 3 * q->C, NEOX_ELEM_BF16);
}

// Device bf16 buffer of n elements from dev_floats' pattern.
static void *dev_bf16(size_t n, float scale) {
    float *f = dev_floats(n, scale);
    void *h = be->alloc(n * sizeof(uint16_t));
    be->cast_f32_to_bf16(h, f, n);
    be->free(f);
    return h;
}

typedef struct { int N, C, V; float *x, *y, *w, *b, *mean, *rstd, *dx, *dw, *db, *logits, *lse, *losses; int *ids; } row_ctx;
static void run_ln_fwd(void *p) { row_ctx *r = p; be->layernorm_forward(r->y, r->mean, r->rstd, r->x, r->w, r->b, r->N, r->C, 1e-5f, NEOX_ELEM_F32); }
static void run_ln_bwd(void *p) {
    row_ctx *r = p;
    be->layernorm_backward(r->dx, r->dw, r->db, NULL, r->y, r->x, r->w, r->mean, r->rstd, r->N, r->C, NEOX_ELEM_F32);
}
static void run_add_ln(void *p) {  // sum (dx) = x + y's second quarter, then the norm into y
    row_ctx *r = p;
    be->add_layernorm_forward(r->dx, r->y, r->mean, r->rstd, r->x, r->y + (size_t)r->N * r->C, NULL, r->w, r->b, r->N,
                              r->C, 1e-5f, NEOX_ELEM_F32);
}
static void run_gelu(void *p) { row_ctx *r = p; be->activation_forward(r->y, r->x, (size_t)r->N * r->C, NEOX_FN_GELU_TANH, NEOX_ELEM_F32); }
static void run_ce_fwd(void *p) {
    row_ctx *r = p;
    be->cross_entropy_forward(r->losses, r->lse, r->logits, r->ids, r->N, r->V, NEOX_ELEM_F32);
}
static void run_ce_bwd(void *p) {
    row_ctx *r = p;
    be->cross_entropy_backward(r->logits, r->logits, r->lse, r->ids, NULL, 1.0f / r->N, NULL, r->N, r->V, NEOX_ELEM_F32);
}
static void run_ce_fused(void *p) {  // the statistics into lse (max) and x (sums, target logits, doubles)
    row_ctx *r = p;
    double *stats = (double *)r->x;
    be->cross_entropy_fused(r->logits, NEOX_ELEM_F32, r->lse, stats, stats + r->N, r->ids, NULL, 1.0f / r->N, NULL, r->N,
                            r->V, 0);
}
static void run_ce_loss(void *p) {  // (2, N) doubles read from x, mask from dx, the two sums written to y
    row_ctx *r = p;
    be->cross_entropy_loss(r->mean, (double *)r->y, r->rstd, (const double *)r->x, r->dx, r->N);
}
static void run_emb_bwd(void *p) {
    row_ctx *r = p;
    be->embedding_backward(r->dw, NULL, r->y, r->ids, 1, r->N, r->C, NEOX_ELEM_F32);
}

typedef struct { size_t n; float *p, *g, *m, *v; const neox_step_scalars *sc; } adam_ctx;
static void run_adamw(void *p) {
    adam_ctx *a = p;
    neox_segment all = {0, a->n, 0.1f};
    be->adamw_segments(a->p, a->g, a->m, a->v, &all, 1, a->sc, 0.9f, 0.95f, 1e-8f, 1.0f, NULL);
}

// peer: the peer's rate in the same unit; peer_name says which peer it is.
static void report_vs(const char *name, double sec, double work, const char *unit, double peer, const char *peer_name) {
    double rate = work / sec / 1e12;  // TFLOP/s, or TB/s shown as GB/s below
    if (unit[0] == 'G') rate *= 1000;
    printf("%-28s %9.3f ms  %9.1f %s  %6.3f of %s\n", name, sec * 1e3, rate, unit, peer > 0 ? rate / peer : 0,
           peer_name);
}
static void report(const char *name, double sec, double work, const char *unit, double peer) {
    report_vs(name, sec, work, unit, peer, unit[0] == 'G' ? "copy" : "fp32 GEMM");
}

int main(int argc, char **argv) {
    be = neox_backend_cuda();
    if (!be) { printf("gpu_ops: no GPU: skipped\n"); return 0; }
    int B = argc > 1 ? atoi(argv[1]) : 8, T = 2048, C = 768, NH = 12, HS = 64, V = 50304, N = B * T;
    printf("# %s; B=%d T=%d C=%d NH=%d V=%d\n", neox_backends_description(), B, T, C, NH, V);

    // Peers: GEMM rates (fp32, TF32, bf16) and copy bandwidth.
    int G = 8192;
    gemm_ctx g = {G, G, G, NEOX_ELEM_F32, dev_floats((size_t)G * G, 1), dev_floats((size_t)G * G, 1),
                  dev_floats((size_t)G * G, 1)};
    double flops = 2.0 * G * G * G, fp32 = flops / time_op(run_gemm, &g) / 1e12;
    report("gemm fp32 8192^3", flops / fp32 / 1e12, flops, "TFLOP/s", fp32);
    neox_cuda_set_tf32(1);
    double t = time_op(run_gemm, &g);
    neox_cuda_set_tf32(0);
    report("gemm tf32 8192^3", t, flops, "TFLOP/s", fp32);
    // The bf16 operands are the fp32 ones' finite values rounded, in buffers of their own: tensor-core
    // rates depend on the data (NaN, infinities and denormals change them), and this rate is MFU's.
    size_t half_bytes = (size_t)G * G * sizeof(uint16_t);
    gemm_ctx h = {G, G, G, NEOX_ELEM_BF16, be->alloc(half_bytes), be->alloc(half_bytes), be->alloc(half_bytes)};
    be->cast_f32_to_bf16(h.a, g.a, (size_t)G * G);
    be->cast_f32_to_bf16(h.b, g.b, (size_t)G * G);
    double bf16_sec = time_op(run_gemm, &h), bf16 = flops / bf16_sec / 1e12;
    report("gemm bf16 8192^3", bf16_sec, flops, "TFLOP/s", fp32);
    be->free(h.a), be->free(h.b), be->free(h.c);
    size_t cbytes = (size_t)G * G * sizeof(float);
    copy_ctx cp = {cbytes, g.a, g.c};
    double copy = 2.0 * cbytes / time_op(run_copy, &cp) / 1e9;  // bytes read + written
    printf("%-28s %9.3f ms  %9.1f GB/s (read + written)\n", "copy 256 MiB", 2.0 * cbytes / copy / 1e6, copy);

    // Attention at the model's shape: causal FLOPs = 2 products of 2 T^2 HS / 2 per head forward.
    att_ctx a = {B, T, NH, HS, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NEOX_ELEM_F32};
    size_t nq = (size_t)B * NH * T * HS;
    a.q = dev_floats(nq, 2); a.k = dev_floats(nq, 2); a.v = dev_floats(nq, 2); a.out = dev_floats(nq, 1);
    a.lse = dev_floats((size_t)B * NH * T, 1); a.dout = dev_floats(nq, 1);
    a.dq = dev_floats(nq, 1); a.dk = dev_floats(nq, 1); a.dv = dev_floats(nq, 1);
    double att = 2.0 * B * NH * (double)T * T * HS;  // causal half of 4 B NH T^2 HS
    report("attention forward fp32", time_op(run_att_fwd, &a), att, "TFLOP/s", fp32);
    report("attention backward fp32", time_op(run_att_bwd, &a), 2.5 * att, "TFLOP/s", fp32);
    // The tensor-core kernels the model runs in bf16 precision, against the bf16 GEMM rate.
    a.e = neox_attention_operands(NEOX_ELEM_BF16, HS);
    report_vs("attention forward bf16", time_op(run_att_fwd, &a), att, "TFLOP/s", bf16, "bf16 GEMM");
    report_vs("attention backward bf16", time_op(run_att_bwd, &a), 2.5 * att, "TFLOP/s", bf16, "bf16 GEMM");
    // The own pipelined kernels, which run what cuDNN does not (dropout, ALiBi, fp16, no libcudnn): the
    // forward, and the backward as the single pass and as the two passes (NEOX_ATTENTION_BACKWARD).
    neox_cuda_attention_cudnn(0);
    neox_cuda_attention_kernels(1);
    report_vs("attention forward bf16 own", time_op(run_att_fwd, &a), att, "TFLOP/s", bf16, "bf16 GEMM");
    const char *passes = getenv("NEOX_ATTENTION_BACKWARD");  // two-pass: the single pass failed its checks
    if (passes && !strcmp(passes, "two-pass")) {
        printf("%-28s not run (NEOX_ATTENTION_BACKWARD=two-pass)\n", "attention backward bf16 own 1-pass");
    } else {
        neox_cuda_attention_backward_passes(1);
        report_vs("attention backward bf16 own 1-pass", time_op(run_att_bwd, &a), 2.5 * att, "TFLOP/s", bf16,
                  "bf16 GEMM");
    }
    neox_cuda_attention_backward_passes(2);
    report_vs("attention backward bf16 own 2-pass", time_op(run_att_bwd, &a), 2.5 * att, "TFLOP/s", bf16, "bf16 GEMM");
    neox_cuda_attention_backward_passes(0);
    neox_cuda_attention_cudnn(1);

    // The MLP's products with the exact GELU on bf16 storage, where the route sends them (one cuDNN
    // graph each way where cuDNN loads and plans the shape; stderr says which ran), then as cuBLASLt's
    // product with GELU as its own pass (the route without cuDNN): gpu_predict prices the first at the
    // bf16 GEMM rate, an assumption this line checks (docs/cuda.md, "Predicting a step").
    int F = 4 * C;
    mlp_ctx m = {N, C, F, dev_bf16((size_t)N * C, 2), dev_bf16((size_t)F * C, 0.1f), dev_bf16((size_t)N * F, 1),
                 dev_bf16((size_t)N * F, 1), dev_bf16((size_t)N * C, 1), dev_bf16((size_t)C * F, 0.1f),
                 dev_bf16((size_t)N * F, 1), dev_floats(F, 0.1f)};
    double mlp = 2.0 * N * C * F;
    double fused_fwd = time_op(run_mlp_fwd, &m), fused_bwd = time_op(run_mlp_bwd, &m);
    neox_linear_act_allow_cudnn(0);
    double apart_fwd = time_op(run_mlp_fwd, &m), apart_bwd = time_op(run_mlp_bwd, &m);
    neox_linear_act_allow_cudnn(1);
    report_vs("mlp h->4h + gelu bf16 fused", fused_fwd, mlp, "TFLOP/s", bf16, "bf16 GEMM");
    report_vs("mlp h->4h, gelu pass apart", apart_fwd, mlp, "TFLOP/s", bf16, "bf16 GEMM");
    report_vs("mlp 4h->h dgrad x gelu' fused", fused_bwd, mlp, "TFLOP/s", bf16, "bf16 GEMM");
    report_vs("mlp 4h->h dgrad, gelu' apart", apart_bwd, mlp, "TFLOP/s", bf16, "bf16 GEMM");
    printf("%-28s %9.3f (forward) %9.3f (backward): fused time / apart time\n", "mlp gelu fusion", fused_fwd / apart_fwd,
           fused_bwd / apart_bwd);

    // The QKV product with its fp32 bias: one cuDNN graph where the route sends it, then cuBLASLt
    // into fp32 rows and a rounding pass (the route without cuDNN); priced alike by gpu_predict.
    qkv_ctx qk = {N, C, dev_bf16((size_t)N * C, 2), dev_bf16((size_t)3 * C * C, 0.1f), dev_bf16((size_t)N * 3 * C, 1),
                  dev_floats(3 * C, 0.1f)};
    double qkv = 2.0 * N * C * 3 * C, graph = time_op(run_qkv_fwd, &qk);
    neox_linear_act_allow_cudnn(0);
    double rows = time_op(run_qkv_fwd, &qk);
    neox_linear_act_allow_cudnn(1);
    report_vs("qkv + bias bf16, cuDNN graph", graph, qkv, "TFLOP/s", bf16, "bf16 GEMM");
    report_vs("qkv + bias bf16, fp32 rows", rows, qkv, "TFLOP/s", bf16, "bf16 GEMM");
    printf("%-28s %9.3f: graph time / rows time\n", "qkv bias graph", graph / rows);

    // Row ops at (N, C) and the loss at (N', V) with N' rows limited to fit a few GB.
    row_ctx r = {N, C, V, dev_floats((size_t)N * 4 * C, 4), dev_floats((size_t)N * 4 * C, 1), dev_floats(C, 1),
                 dev_floats(C, 1), dev_floats(N, 1), dev_floats(N, 1), dev_floats((size_t)N * C, 1),
                 dev_floats((size_t)V * C, 1), dev_floats(C, 1), NULL, NULL, NULL, NULL};
    double nc = (double)N * C * sizeof(float);
    report("layernorm forward", time_op(run_ln_fwd, &r), 2 * nc, "GB/s", copy);
    report("layernorm backward", time_op(run_ln_bwd, &r), 5 * nc, "GB/s", copy);
    report("add + layernorm forward", time_op(run_add_ln, &r), 4 * nc, "GB/s", copy);  // a, b in; sum, out
    row_ctx r4 = r;
    r4.C = 4 * C;
    report("gelu forward (N x 4C)", time_op(run_gelu, &r4), 2 * 4 * nc, "GB/s", copy);
    int *ids = malloc((size_t)N * sizeof(int));
    for (int i = 0; i < N; i++) ids[i] = (int)(neox_uniform(3, i) * V);
    r.ids = be->alloc((size_t)N * sizeof(int));
    be->to_device(r.ids, ids, (size_t)N * sizeof(int));
    report("embedding backward", time_op(run_emb_bwd, &r), 3 * nc, "GB/s", copy);
    // The worst case of per-id chains: every token the same id (the spans make it as fast as above).
    for (int i = 0; i < N; i++) ids[i] = 50256;
    be->to_device(r.ids, ids, (size_t)N * sizeof(int));
    report("embedding backward 1 id", time_op(run_emb_bwd, &r), 3 * nc, "GB/s", copy);
    for (int i = 0; i < N; i++) ids[i] = (int)(neox_uniform(3, i) * V);
    be->to_device(r.ids, ids, (size_t)N * sizeof(int));
    row_ctx ce = r;
    ce.N = N < 4096 ? N : 4096;
    ce.logits = dev_floats((size_t)ce.N * V, 8);
    ce.lse = dev_floats(ce.N, 1);
    ce.losses = dev_floats(ce.N, 1);
    double lv = (double)ce.N * V * sizeof(float);
    report("cross-entropy forward", time_op(run_ce_fwd, &ce), lv, "GB/s", copy);
    report("cross-entropy backward", time_op(run_ce_bwd, &ce), 2 * lv, "GB/s", copy);
    report("cross-entropy fused (loss and dlogits)", time_op(run_ce_fused, &ce), 2 * lv, "GB/s", copy);
    // The loss from the (N) statistics: lse and mask (floats), the sums and target logits (doubles).
    report("cross-entropy loss (N rows)", time_op(run_ce_loss, &r), (double)N * (3 * 4 + 2 * 8), "GB/s", copy);

    size_t np = 125000000;
    neox_step_scalars sc = {.lr = 1e-4f, .step = 10}, *dsc = be->alloc(sizeof sc);
    be->to_device(dsc, &sc, sizeof sc);
    adam_ctx ad = {np, dev_floats(np, 1), dev_floats(np, 1), dev_floats(np, 0.01f), dev_floats(np, 0), dsc};
    report("adamw 125M", time_op(run_adamw, &ad), 7.0 * np * sizeof(float), "GB/s", copy);
    free(ids);
    return 0;  // device memory goes with the process
}
