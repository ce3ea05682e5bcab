// op_parity.c: the CUDA backend against the CPU backend, op by op (like ggml's test-backend-ops).
// Each check runs one op of kernels/backend.h through both tables on the same random inputs
// (including the starting contents of outputs that ops add into), copies the GPU's outputs back
// and compares every element: |gpu - cpu| <= atol + rtol * |cpu| (NaN only where the CPU has NaN).
// Shapes are odd on purpose: sizes that are not multiples of 32, T not a multiple of the attention
// tile, GQA and MQA groupings, head sizes from 16 to 256. Backward ops get the CPU forward's saved
// values as inputs, so each comparison is of one op alone. The per-op tolerances are in
// docs/cuda.md with the reasons for them. Output: TAP lines for tests/run; with no GPU, one
// "# SKIP no GPU: skipped" line.
//   op_parity [-v] [--self] [--attention]
//                             -v prints the largest error of every check, also the passing ones;
//                             --self compares the CPU backend with itself (checks the harness's own
//                             plumbing where no GPU exists; every check must pass exactly);
//                             --attention runs the pipelined attention kernels' checks only (a GPU
//                             host's first look at them), their backward as the single pass and
//                             as the two passes. NEOX_ATTENTION_KERNELS=first in the environment
//                             leaves the pipelined kernels out of the full run;
//                             NEOX_ATTENTION_BACKWARD=two-pass leaves out their single pass.
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cuda/cuda.h"

static const neox_backend *cpu, *gpu;
static int verbose, failures, checks;
static unsigned long long draw = 1;

// A tensor on both backends with identical starting contents: h on the host for the CPU op, d on
// the device for the CUDA op.
typedef struct { float *h, *d; size_t n; } pair;

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) { fprintf(stderr, "op_parity: out of memory\n"); exit(2); }
    return p;
}

static pair pair_from(const float *values, size_t n) {
    pair p = {xmalloc(n * sizeof(float)), gpu->alloc(n * sizeof(float)), n};
    memcpy(p.h, values, n * sizeof(float));
    gpu->to_device(p.d, p.h, n * sizeof(float));
    return p;
}

// Uniform in [lo, hi), from the counter-based generator (reproducible run to run).
static pair pair_uniform(size_t n, float lo, float hi) {
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * neox_uniform(12345, draw++);
    pair p = pair_from(x, n);
    free(x);
    return p;
}
static pair pair_rand(size_t n) { return pair_uniform(n, -1.0f, 1.0f); }
static pair pair_zero(size_t n) { return pair_uniform(n, 0.0f, 0.0f); }

static void pair_free(pair *p) {
    free(p->h);
    gpu->free(p->d);
}

// Integer arrays (ids, targets) on both sides.
typedef struct { int *h, *d; } ipair;
static ipair ipair_from(const int *values, size_t n) {
    ipair p = {xmalloc(n * sizeof(int)), gpu->alloc(n * sizeof(int))};
    memcpy(p.h, values, n * sizeof(int));
    gpu->to_device(p.d, p.h, n * sizeof(int));
    return p;
}
static void ipair_free(ipair *p) {
    free(p->h);
    gpu->free(p->d);
}

// Compares n values (cpu on the host, gpu copied back) and prints one TAP line.
static void compare(const char *name, const float *ref, const float *got, size_t n, double atol, double rtol) {
    double worst = 0.0, worst_abs = 0.0;
    size_t at = 0;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double r = ref[i], g = got[i];
        if (isnan(r) || isnan(g)) {
            if (!(isnan(r) && isnan(g))) { bad = 1; at = i; worst = INFINITY; }
            continue;
        }
        double err = fabs(g - r), allowed = atol + rtol * fabs(r);
        double ratio = allowed > 0 ? err / allowed : (err > 0 ? INFINITY : 0);
        if (ratio > worst) { worst = ratio; at = i; }
        if (err > worst_abs) worst_abs = err;
        if (err > allowed) bad = 1;
    }
    checks++;
    if (bad) {
        failures++;
        printf("not ok - %s\n#   element %zu: cpu %.9g gpu %.9g (max |err| %.3g; atol %.1g rtol %.1g)\n", name, at,
               (double)ref[at], (double)got[at], worst_abs, atol, rtol);
    } else if (verbose) {
        printf("ok - %s (max |err| %.3g, %.2f of the tolerance)\n", name, worst_abs, worst);
    } else {
        printf("ok - %s\n", name);
    }
}

static void check(const char *name, const pair *p, double atol, double rtol) {
    float *got = xmalloc(p->n * sizeof(float));
    gpu->to_host(got, p->d, p->n * sizeof(float));
    compare(name, p->h, got, p->n, atol, rtol);
    free(got);
}

static void checkf(double atol, double rtol, const pair *p, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void checkf(double atol, double rtol, const pair *p, const char *fmt, ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    check(name, p, atol, rtol);
}

static void compare_scalar(const char *name, double ref, double got, double rtol) {
    checks++;
    double err = fabs(got - ref);
    if (err > rtol * fabs(ref)) {
        failures++;
        printf("not ok - %s\n#   cpu %.17g gpu %.17g (rel err %.3g, rtol %.1g)\n", name, ref, got, err / fabs(ref), rtol);
    } else if (verbose) {
        printf("ok - %s (rel err %.3g)\n", name, ref != 0 ? err / fabs(ref) : err);
    } else {
        printf("ok - %s\n", name);
    }
}

// ---- linear layers and matrix products -------------------------------------------------------------

// fp32 products of K terms of size <= 1: cuBLAS sums in another order than OpenBLAS.
#define GEMM_TOL 1e-4, 1e-4

static void test_linear(int N, int IC, int OC, int pad, int with_bias, int accumulate) {
    int ldo = OC + pad;
    pair inp = pair_rand((size_t)N * IC), w = pair_rand((size_t)OC * IC), b = pair_rand(OC);
    pair out = pair_rand((size_t)N * ldo);  // the padding columns must stay as they are
    cpu->linear_forward(out.h, ldo, inp.h, w.h, with_bias ? b.h : NULL, N, IC, OC, NEOX_ELEM_F32);
    gpu->linear_forward(out.d, ldo, inp.d, w.d, with_bias ? b.d : NULL, N, IC, OC, NEOX_ELEM_F32);
    checkf(GEMM_TOL, &out, "linear_forward N=%d IC=%d OC=%d ldo=%d bias=%d", N, IC, OC, ldo, with_bias);

    pair dout = pair_rand((size_t)N * ldo), dinp = pair_rand((size_t)N * IC), dw = pair_rand((size_t)OC * IC);
    pair db = pair_rand(OC);
    cpu->linear_backward(dinp.h, dw.h, with_bias ? db.h : NULL, dout.h, ldo, inp.h, w.h, N, IC, OC, accumulate,
                         NEOX_ELEM_F32);
    gpu->linear_backward(dinp.d, dw.d, with_bias ? db.d : NULL, dout.d, ldo, inp.d, w.d, N, IC, OC, accumulate,
                         NEOX_ELEM_F32);
    checkf(GEMM_TOL, &dinp, "linear_backward dinp N=%d IC=%d OC=%d accumulate=%d", N, IC, OC, accumulate);
    checkf(GEMM_TOL, &dw, "linear_backward dweight N=%d IC=%d OC=%d", N, IC, OC);
    if (with_bias) checkf(1e-4, 1e-5, &db, "linear_backward dbias N=%d OC=%d", N, OC);
    pair *all[] = {&inp, &w, &b, &out, &dout, &dinp, &dw, &db};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(all[i]);
}

// fp32 GEMM on the TF32 tensor cores (10-bit mantissa products) against the CPU's fp32.
static void test_linear_tf32(void) {
    int N = 64, IC = 256, OC = 96;
    pair inp = pair_rand((size_t)N * IC), w = pair_rand((size_t)OC * IC), out = pair_zero((size_t)N * OC);
    if (gpu != cpu) neox_cuda_set_tf32(1);
    cpu->linear_forward(out.h, OC, inp.h, w.h, NULL, N, IC, OC, NEOX_ELEM_F32);
    gpu->linear_forward(out.d, OC, inp.d, w.d, NULL, N, IC, OC, NEOX_ELEM_F32);
    if (gpu != cpu) neox_cuda_set_tf32(0);
    checkf(5e-2, 1e-2, &out, "linear_forward TF32 N=%d IC=%d OC=%d", N, IC, OC);
    pair_free(&inp);
    pair_free(&w);
    pair_free(&out);
}

static void test_gemm16(neox_elem ab, neox_elem ce, int ta, int tb, int M, int N, int K);
static void test_bf16_linear(int N, int IC, int OC, int pad, int accumulate);

// The linear cases again on the other product path: the default runs cuBLASLt with the bias and
// bias-gradient epilogues, and this runs cuBLAS with them as separate kernels (the fallback where
// cuBLASLt has no algorithm), so both stay checked. Reports how many products each path ran.
static void test_linear_both_paths(void) {
    if (gpu == cpu) return;  // (--self: no CUDA)
    long lt0, fb0, lt1, fb1;
    neox_cuda_matmul_counts(&lt0, &fb0);
    neox_cuda_set_cublaslt(0);
    test_linear(37, 53, 71, 0, 1, 0);
    test_linear(64, 128, 96, 5, 1, 1);
    test_gemm16(NEOX_ELEM_BF16, NEOX_ELEM_BF16, 0, 0, 33, 70, 96);
    test_bf16_linear(37, 200, 96, 3, 1);  // (the bias gradient's column sums apart from the product)
    neox_cuda_set_cublaslt(1);
    neox_cuda_matmul_counts(&lt1, &fb1);
    checks++;
    if (lt1 != lt0) failures++;
    printf("%s - cuBLAS path alone while cuBLASLt is off (%ld products)\n", lt1 == lt0 ? "ok" : "not ok", fb1 - fb0);
    printf("# products so far: %ld on cuBLASLt, %ld on cuBLAS\n", lt1, fb1);
}

// The MLP's fused GELU-tanh products (cuBLASLt's GELU_AUX_BIAS and DGELU epilogues) against the
// CPU's linear then activation, on both paths: out and the kept pre-activation, then the gradient
// through it from the CPU's pre-activation.
static void test_linear_gelu(int N, int IC, int OC, int with_bias) {
    if (gpu == cpu) return;  // (--self: no CUDA)
    for (int lt = 1; lt >= 0; lt--) {
        neox_cuda_set_cublaslt(lt);
        pair inp = pair_rand((size_t)N * IC), w = pair_rand((size_t)OC * IC), b = pair_rand(OC);
        pair out = pair_zero((size_t)N * OC), pre = pair_zero((size_t)N * OC);
        cpu->linear_forward(pre.h, OC, inp.h, w.h, with_bias ? b.h : NULL, N, IC, OC, NEOX_ELEM_F32);
        cpu->activation_forward(out.h, pre.h, (size_t)N * OC, NEOX_FN_GELU_TANH, NEOX_ELEM_F32);
        neox_cuda_linear_gelu_forward(out.d, pre.d, inp.d, w.d, with_bias ? b.d : NULL, N, IC, OC);
        checkf(GEMM_TOL, &pre, "linear_gelu_forward pre-activation %s N=%d IC=%d OC=%d bias=%d",
               lt ? "cuBLASLt" : "cuBLAS", N, IC, OC, with_bias);
        checkf(GEMM_TOL, &out, "linear_gelu_forward out %s N=%d IC=%d OC=%d", lt ? "cuBLASLt" : "cuBLAS", N, IC, OC);
        // backward through a layer (OC, IC) = (C, F) whose input is the pre-activation of width IC
        pair dout = pair_rand((size_t)N * OC), x = pair_rand((size_t)N * IC), dpre = pair_zero((size_t)N * IC);
        pair dx = pair_zero((size_t)N * IC);
        cpu->linear_backward(dx.h, NULL, NULL, dout.h, OC, NULL, w.h, N, IC, OC, 0, NEOX_ELEM_F32);
        cpu->activation_backward(dpre.h, dx.h, x.h, (size_t)N * IC, NEOX_FN_GELU_TANH, NEOX_ELEM_F32);
        neox_cuda_linear_dgelu_backward(dpre.d, dout.d, w.d, x.d, N, IC, OC);
        checkf(GEMM_TOL, &dpre, "linear_dgelu_backward %s N=%d IC=%d OC=%d", lt ? "cuBLASLt" : "cuBLAS", N, IC, OC);
        pair *all[] = {&inp, &w, &b, &out, &pre, &dout, &x, &dpre, &dx};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(all[i]);
    }
    neox_cuda_set_cublaslt(1);
}

// The backend's fused linear + activation ops (kernels.h: linear_act_forward/backward) against the
// CPU's reference: GELU-tanh on the cuBLASLt epilogues (GELU_AUX_BIAS; DGELU_BGRAD with the bias
// gradient added onto its old value, DGELU without), then on the cuBLAS fallback's kernels; another
// function (exact GELU, ReLU) as the linear and activation ops in turn.
static void test_linear_act(int N, int IC, int OC, neox_act_fn fn, int with_bias) {
    for (int lt = 1; lt >= (gpu == cpu ? 1 : 0); lt--) {
        if (gpu != cpu) neox_cuda_set_cublaslt(lt);
        const char *path = gpu == cpu ? "cpu" : lt ? "cuBLASLt" : "cuBLAS";
        pair inp = pair_rand((size_t)N * IC), w = pair_rand((size_t)OC * IC), b = pair_rand(OC);
        pair out = pair_zero((size_t)N * OC), pre = pair_zero((size_t)N * OC);
        cpu->linear_act_forward(out.h, pre.h, inp.h, w.h, with_bias ? b.h : NULL, N, IC, OC, fn, NEOX_ELEM_F32);
        gpu->linear_act_forward(out.d, pre.d, inp.d, w.d, with_bias ? b.d : NULL, N, IC, OC, fn, NEOX_ELEM_F32);
        checkf(GEMM_TOL, &pre, "linear_act_forward pre-activation %s fn=%d N=%d IC=%d OC=%d bias=%d", path, (int)fn, N,
               IC, OC, with_bias);
        checkf(GEMM_TOL, &out, "linear_act_forward out %s fn=%d N=%d IC=%d OC=%d", path, (int)fn, N, IC, OC);
        // backward through a layer (OC, IC) whose input was fn(x), x of width IC
        pair dout = pair_rand((size_t)N * OC), x = pair_rand((size_t)N * IC), dpre = pair_zero((size_t)N * IC);
        pair db = pair_rand(IC);  // added to
        cpu->linear_act_backward(dpre.h, with_bias ? db.h : NULL, dout.h, w.h, x.h, N, IC, OC, fn, NEOX_ELEM_F32);
        gpu->linear_act_backward(dpre.d, with_bias ? db.d : NULL, dout.d, w.d, x.d, N, IC, OC, fn, NEOX_ELEM_F32);
        checkf(GEMM_TOL, &dpre, "linear_act_backward dpre %s fn=%d N=%d IC=%d OC=%d", path, (int)fn, N, IC, OC);
        if (with_bias) checkf(GEMM_TOL, &db, "linear_act_backward dbias %s fn=%d N=%d IC=%d OC=%d", path, (int)fn, N, IC, OC);
        pair *all[] = {&inp, &w, &b, &out, &pre, &dout, &x, &dpre, &db};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(all[i]);
    }
    if (gpu != cpu) neox_cuda_set_cublaslt(1);
}

// 16-bit values on both sides: the host's from the CPU cast, the device's a copy of the same bits.
typedef struct { uint16_t *h; void *d; size_t n; } pair16;

static pair16 pair16_cast(const pair *x, neox_elem e) {
    pair16 p = {xmalloc(x->n * 2), gpu->alloc(x->n * 2), x->n};
    if (e == NEOX_ELEM_BF16) cpu->cast_f32_to_bf16(p.h, x->h, x->n); else cpu->cast_f32_to_f16(p.h, x->h, x->n);
    gpu->to_device(p.d, p.h, x->n * 2);
    return p;
}

static void widen16(float *out, const uint16_t *x, size_t n, neox_elem e) {
    if (e == NEOX_ELEM_BF16) cpu->cast_bf16_to_f32(out, x, n); else cpu->cast_f16_to_f32(out, x, n);
}

// C = op(A) op(B) + C with 16-bit A and B, C fp32 or 16-bit; the CPU widens and uses fp32.
static void test_gemm16(neox_elem ab, neox_elem ce, int ta, int tb, int M, int N, int K) {
    const char *tn = ab == NEOX_ELEM_BF16 ? "bf16" : "f16";
    pair a32 = pair_rand((size_t)M * K), b32 = pair_rand((size_t)K * N), c32 = pair_rand((size_t)M * N);
    pair16 a = pair16_cast(&a32, ab), b = pair16_cast(&b32, ab);
    int lda = ta ? M : K, ldb = tb ? K : N;
    float *got = xmalloc((size_t)M * N * sizeof(float)), *ref = xmalloc((size_t)M * N * sizeof(float));
    char name[160];
    if (ce == NEOX_ELEM_F32) {
        cpu->gemm_ex(ta, tb, M, N, K, 0.5f, a.h, lda, b.h, ldb, ab, 1.0f, c32.h, N, ce);
        gpu->gemm_ex(ta, tb, M, N, K, 0.5f, a.d, lda, b.d, ldb, ab, 1.0f, c32.d, N, ce);
        snprintf(name, sizeof name, "gemm_ex %s->f32 %c%c M=%d N=%d K=%d", tn, ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K);
        check(name, &c32, GEMM_TOL);
    } else {  // 16-bit C: both results rounded once from fp32 sums that may differ in the last bits
        pair16 c = pair16_cast(&c32, ce);
        cpu->gemm_ex(ta, tb, M, N, K, 0.5f, a.h, lda, b.h, ldb, ab, 1.0f, c.h, N, ce);
        gpu->gemm_ex(ta, tb, M, N, K, 0.5f, a.d, lda, b.d, ldb, ab, 1.0f, c.d, N, ce);
        uint16_t *g16 = xmalloc((size_t)M * N * 2);
        gpu->to_host(g16, c.d, (size_t)M * N * 2);
        widen16(ref, c.h, (size_t)M * N, ce);
        widen16(got, g16, (size_t)M * N, ce);
        snprintf(name, sizeof name, "gemm_ex %s->%s %c%c M=%d N=%d K=%d", tn, tn, ta ? 'T' : 'N', tb ? 'T' : 'N', M, N,
                 K);
        compare(name, ref, got, (size_t)M * N, 1e-3, ce == NEOX_ELEM_BF16 ? 8e-3 : 1e-3);
        free(g16);
        free(c.h);
        gpu->free(c.d);
    }
    free(got);
    free(ref);
    free(a.h);
    free(b.h);
    gpu->free(a.d);
    gpu->free(b.d);
    pair_free(&a32);
    pair_free(&b32);
    pair_free(&c32);
}

// ---- casts ----------------------------------------------------------------------------------------

// Round-trips of values that exercise rounding ties, fp16 overflow and subnormals, infinities, NaN.
static void test_casts(void) {
    size_t n = 4099;
    pair x = pair_uniform(n, -3.0f, 3.0f);
    const float special[] = {0.0f, -0.0f, 65504.0f, 65520.0f, 1e5f, -1e5f, 6e-8f, 3e-5f, 1e-40f, INFINITY, -INFINITY,
                             NAN, 1.00390625f, 1.01171875f, 3.4e38f};
    for (size_t i = 0; i < sizeof special / sizeof *special; i++) x.h[i] = special[i];
    for (size_t i = 100; i < 200; i++) x.h[i] *= 1e4f;
    gpu->to_device(x.d, x.h, n * sizeof(float));
    neox_elem kinds[] = {NEOX_ELEM_BF16, NEOX_ELEM_F16};
    for (int k = 0; k < 2; k++) {
        uint16_t *dev16 = gpu->alloc(n * 2), *got16 = xmalloc(n * 2), *ref16 = xmalloc(n * 2);
        float *ref = xmalloc(n * sizeof(float)), *got = xmalloc(n * sizeof(float)), *back = gpu->alloc(n * sizeof(float));
        if (kinds[k] == NEOX_ELEM_BF16) {
            cpu->cast_f32_to_bf16(ref16, x.h, n);
            gpu->cast_f32_to_bf16(dev16, x.d, n);
        } else {
            cpu->cast_f32_to_f16(ref16, x.h, n);
            gpu->cast_f32_to_f16(dev16, x.d, n);
        }
        gpu->to_host(got16, dev16, n * 2);
        // Compared as the values the bits mean (NaN payloads may differ; both must be NaN).
        widen16(ref, ref16, n, kinds[k]);
        widen16(got, got16, n, kinds[k]);
        compare(kinds[k] == NEOX_ELEM_BF16 ? "cast f32->bf16" : "cast f32->f16", ref, got, n, 0, 0);
        // Back to fp32 on the GPU from the CPU's bits: exact.
        gpu->to_device(dev16, ref16, n * 2);
        if (kinds[k] == NEOX_ELEM_BF16) gpu->cast_bf16_to_f32(back, dev16, n); else gpu->cast_f16_to_f32(back, dev16, n);
        gpu->to_host(got, back, n * sizeof(float));
        compare(kinds[k] == NEOX_ELEM_BF16 ? "cast bf16->f32" : "cast f16->f32", ref, got, n, 0, 0);
        gpu->free(dev16);
        gpu->free(back);
        free(got16);
        free(ref16);
        free(ref);
        free(got);
    }
    pair_free(&x);
}

// ---- embeddings -------------------------------------------------------------------------------------

// V = 1: every token the same id (runs across every span of the sorted sequence); else ids drawn
// from [-1, V): repeats and some -1 (rows held by another tensor-parallel rank).
static void test_embedding(int B, int T, int C, int V, int with_wpe) {
    int n = B * T, *ids = xmalloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) ids[i] = V == 1 ? 0 : (int)(neox_uniform(99, draw++) * (V + 1)) - 1;
    ipair id = ipair_from(ids, n);
    pair wte = pair_rand((size_t)V * C), wpe = pair_rand((size_t)T * C), out = pair_rand((size_t)n * C);
    cpu->embedding_forward(out.h, id.h, wte.h, with_wpe ? wpe.h : NULL, B, T, C, NEOX_ELEM_F32);
    gpu->embedding_forward(out.d, id.d, wte.d, with_wpe ? wpe.d : NULL, B, T, C, NEOX_ELEM_F32);
    checkf(0, 0, &out, "embedding_forward B=%d T=%d C=%d V=%d wpe=%d", B, T, C, V, with_wpe);
    int v0 = V / 3, v1 = V / 3 + (V + 1) / 2;  // a piece of the table: the other tokens keep their rows
    cpu->embedding_rows(out.h, id.h, wte.h + (size_t)v0 * C, v0, v1, n, C, NEOX_ELEM_F32);
    gpu->embedding_rows(out.d, id.d, wte.d + (size_t)v0 * C, v0, v1, n, C, NEOX_ELEM_F32);
    checkf(0, 0, &out, "embedding_rows [%d, %d) of V=%d B=%d T=%d C=%d", v0, v1, V, B, T, C);
    pair dout = pair_rand((size_t)n * C);  // wte and wpe now serve as the gradients added to
    cpu->embedding_backward(wte.h, with_wpe ? wpe.h : NULL, dout.h, id.h, B, T, C, NEOX_ELEM_F32);
    gpu->embedding_backward(wte.d, with_wpe ? wpe.d : NULL, dout.d, id.d, B, T, C, NEOX_ELEM_F32);
    checkf(0, 0, &wte, "embedding_backward dwte B=%d T=%d C=%d V=%d (same order: exact)", B, T, C, V);
    if (with_wpe) checkf(0, 0, &wpe, "embedding_backward dwpe B=%d T=%d C=%d (exact)", B, T, C);
    pair_free(&wte);
    pair_free(&wpe);
    pair_free(&out);
    pair_free(&dout);
    ipair_free(&id);
    free(ids);
}

// ---- normalisation ----------------------------------------------------------------------------------

static void test_layernorm(int N, int C, int with_bias) {
    pair inp = pair_uniform((size_t)N * C, -2.0f, 3.0f), w = pair_uniform(C, 0.5f, 1.5f), b = pair_rand(C);
    pair out = pair_rand((size_t)N * C), mean = pair_rand(N), rstd = pair_rand(N);
    cpu->layernorm_forward(out.h, mean.h, rstd.h, inp.h, w.h, with_bias ? b.h : NULL, N, C, 1e-5f, NEOX_ELEM_F32);
    gpu->layernorm_forward(out.d, mean.d, rstd.d, inp.d, w.d, with_bias ? b.d : NULL, N, C, 1e-5f, NEOX_ELEM_F32);
    checkf(1e-5, 1e-5, &out, "layernorm_forward N=%d C=%d bias=%d", N, C, with_bias);
    checkf(1e-6, 1e-6, &mean, "layernorm_forward mean N=%d C=%d", N, C);
    checkf(0, 1e-6, &rstd, "layernorm_forward rstd N=%d C=%d", N, C);
    // The backward takes the CPU's statistics on both sides.
    pair m = pair_from(mean.h, N), r = pair_from(rstd.h, N), dout = pair_rand((size_t)N * C);
    // (with the bias, the residual gradient's column sums too: a row-parallel bias's gradient)
    pair dinp = pair_rand((size_t)N * C), dw = pair_rand(C), db = pair_rand(C), ds = pair_rand(C);
    cpu->layernorm_backward(dinp.h, dw.h, with_bias ? db.h : NULL, with_bias ? ds.h : NULL, dout.h, inp.h, w.h, m.h,
                            r.h, N, C, NEOX_ELEM_F32);
    gpu->layernorm_backward(dinp.d, dw.d, with_bias ? db.d : NULL, with_bias ? ds.d : NULL, dout.d, inp.d, w.d, m.d,
                            r.d, N, C, NEOX_ELEM_F32);
    checkf(1e-5, 1e-5, &dinp, "layernorm_backward dinp N=%d C=%d", N, C);
    checkf(1e-4, 1e-5, &dw, "layernorm_backward dweight N=%d C=%d", N, C);
    if (with_bias) checkf(1e-4, 1e-5, &db, "layernorm_backward dbias N=%d C=%d", N, C);
    if (with_bias) checkf(1e-4, 1e-5, &ds, "layernorm_backward dsum N=%d C=%d", N, C);
    pair *all[] = {&inp, &w, &b, &out, &mean, &rstd, &m, &r, &dout, &dinp, &dw, &db, &ds};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(all[i]);
}

static void test_rmsnorm(int N, int C) {
    pair inp = pair_uniform((size_t)N * C, -2.0f, 3.0f), w = pair_uniform(C, 0.5f, 1.5f);
    pair out = pair_rand((size_t)N * C), rstd = pair_rand(N);
    cpu->rmsnorm_forward(out.h, rstd.h, inp.h, w.h, N, C, 1e-6f, NEOX_ELEM_F32);
    gpu->rmsnorm_forward(out.d, rstd.d, inp.d, w.d, N, C, 1e-6f, NEOX_ELEM_F32);
    checkf(1e-5, 1e-5, &out, "rmsnorm_forward N=%d C=%d", N, C);
    checkf(0, 1e-6, &rstd, "rmsnorm_forward rstd N=%d C=%d", N, C);
    pair r = pair_from(rstd.h, N), dout = pair_rand((size_t)N * C), dinp = pair_rand((size_t)N * C), dw = pair_rand(C);
    pair ds = pair_rand(C);
    cpu->rmsnorm_backward(dinp.h, dw.h, ds.h, dout.h, inp.h, w.h, r.h, N, C, NEOX_ELEM_F32);
    gpu->rmsnorm_backward(dinp.d, dw.d, ds.d, dout.d, inp.d, w.d, r.d, N, C, NEOX_ELEM_F32);
    checkf(1e-5, 1e-5, &dinp, "rmsnorm_backward dinp N=%d C=%d", N, C);
    checkf(1e-4, 1e-5, &dw, "rmsnorm_backward dweight N=%d C=%d", N, C);
    checkf(1e-4, 1e-5, &ds, "rmsnorm_backward dsum N=%d C=%d", N, C);
    pair *all[] = {&inp, &w, &out, &rstd, &r, &dout, &dinp, &dw, &ds};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(all[i]);
}

// ScaleNorm; eps between the rows' norms puts rows on both sides of the clamp.
static void test_scalenorm(int N, int C, float eps) {
    pair inp = pair_uniform((size_t)N * C, -2.0f, 3.0f), g = pair_uniform(1, 0.5f, 1.5f);
    pair out = pair_rand((size_t)N * C), rnorm = pair_rand(N);
    cpu->scalenorm_forward(out.h, rnorm.h, inp.h, g.h, N, C, eps, NEOX_ELEM_F32);
    gpu->scalenorm_forward(out.d, rnorm.d, inp.d, g.d, N, C, eps, NEOX_ELEM_F32);
    checkf(1e-5, 1e-5, &out, "scalenorm_forward N=%d C=%d eps=%g", N, C, eps);
    checkf(0, 1e-6, &rnorm, "scalenorm_forward rnorm N=%d C=%d eps=%g", N, C, eps);
    pair r = pair_from(rnorm.h, N), dout = pair_rand((size_t)N * C), dinp = pair_rand((size_t)N * C), dg = pair_rand(1);
    cpu->scalenorm_backward(dinp.h, dg.h, dout.h, inp.h, g.h, r.h, N, C, eps, NEOX_ELEM_F32);
    gpu->scalenorm_backward(dinp.d, dg.d, dout.d, inp.d, g.d, r.d, N, C, eps, NEOX_ELEM_F32);
    checkf(1e-5, 1e-5, &dinp, "scalenorm_backward dinp N=%d C=%d eps=%g", N, C, eps);
    checkf(1e-4, 1e-5, &dg, "scalenorm_backward dg N=%d C=%d eps=%g", N, C, eps);
    pair *all[] = {&inp, &g, &out, &rnorm, &r, &dout, &dinp, &dg};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(all[i]);
}

// use_qk_layernorm's norm of (B, H, T, HS) heads, G heads per group (rms: no mean); dinp in place.
static void test_head_norm(int B, int H, int T, int HS, int G, int rms) {
    size_t n = (size_t)B * H * T * HS, rows = (size_t)B * T * (H / G), WH = (size_t)H * HS;
    pair inp = pair_uniform(n, -2.0f, 3.0f), w = pair_uniform(WH, 0.5f, 1.5f), b = pair_rand(WH);
    pair out = pair_rand(n), mean = pair_rand(rows), rstd = pair_rand(rows);
    cpu->head_norm_forward(out.h, rms ? NULL : mean.h, rstd.h, inp.h, w.h, rms ? NULL : b.h, B, H, T, HS, G, 1e-5f,
                           NEOX_ELEM_F32);
    gpu->head_norm_forward(out.d, rms ? NULL : mean.d, rstd.d, inp.d, w.d, rms ? NULL : b.d, B, H, T, HS, G, 1e-5f,
                           NEOX_ELEM_F32);
    checkf(1e-5, 1e-5, &out, "head_norm_forward B=%d H=%d T=%d HS=%d G=%d rms=%d", B, H, T, HS, G, rms);
    checkf(0, 1e-6, &rstd, "head_norm_forward rstd G=%d rms=%d", G, rms);
    pair m = pair_from(mean.h, rows), r = pair_from(rstd.h, rows), d = pair_rand(n), dw = pair_rand(WH), db = pair_rand(WH);
    cpu->head_norm_backward(d.h, dw.h, rms ? NULL : db.h, d.h, inp.h, w.h, rms ? NULL : m.h, r.h, B, H, T, HS, G,
                            NEOX_ELEM_F32);
    gpu->head_norm_backward(d.d, dw.d, rms ? NULL : db.d, d.d, inp.d, w.d, rms ? NULL : m.d, r.d, B, H, T, HS, G,
                            NEOX_ELEM_F32);
    checkf(1e-5, 1e-5, &d, "head_norm_backward dinp G=%d rms=%d", G, rms);
    checkf(1e-4, 1e-5, &dw, "head_norm_backward dweight G=%d rms=%d", G, rms);
    if (!rms) checkf(1e-4, 1e-5, &db, "head_norm_backward dbias G=%d", G);
    pair *all[] = {&inp, &w, &b, &out, &mean, &rstd, &m, &r, &d, &dw, &db};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(all[i]);
}

// ---- Mixture of Experts ---------------------------------------------------------------------------------

// N tokens, K slots each, rows in a shuffled order; the router's jitter on n values (in place too).
static void test_moe(int N, int K, int C) {
    int NK = N * K, *slot = xmalloc((size_t)NK * sizeof(int)), *perm = xmalloc((size_t)NK * sizeof(int));
    for (int j = 0; j < NK; j++) slot[j] = j;
    for (int j = NK - 1; j > 0; j--) {  // a fixed permutation
        int i = (int)((unsigned)(j * 2654435761u) % (unsigned)(j + 1)), t = slot[i];
        slot[i] = slot[j];
        slot[j] = t;
    }
    for (int s = 0; s < NK; s++) perm[slot[s]] = s / K;
    ipair sl = ipair_from(slot, NK), pm = ipair_from(perm, NK);
    pair inp = pair_rand((size_t)N * C), rows = pair_rand((size_t)NK * C), w = pair_uniform(NK, 0.0f, 1.0f);
    pair g = pair_rand((size_t)NK * C), out = pair_rand((size_t)N * C), dout = pair_rand((size_t)N * C);
    pair drows = pair_rand((size_t)NK * C), dw = pair_rand(NK);
    cpu->gather_rows(g.h, inp.h, pm.h, NK, C, NEOX_ELEM_F32);
    gpu->gather_rows(g.d, inp.d, pm.d, NK, C, NEOX_ELEM_F32);
    checkf(0, 0, &g, "gather_rows N=%d K=%d C=%d", N, K, C);
    cpu->moe_combine(out.h, rows.h, sl.h, w.h, N, K, C, NEOX_ELEM_F32);
    gpu->moe_combine(out.d, rows.d, sl.d, w.d, N, K, C, NEOX_ELEM_F32);
    checkf(1e-6, 1e-6, &out, "moe_combine N=%d K=%d C=%d", N, K, C);
    cpu->moe_combine_backward(drows.h, dw.h, dout.h, rows.h, sl.h, w.h, N, K, C, NEOX_ELEM_F32);
    gpu->moe_combine_backward(drows.d, dw.d, dout.d, rows.d, sl.d, w.d, N, K, C, NEOX_ELEM_F32);
    checkf(0, 0, &drows, "moe_combine_backward drows N=%d K=%d C=%d", N, K, C);
    checkf(1e-5, 1e-5, &dw, "moe_combine_backward dweight N=%d K=%d C=%d", N, K, C);
    pair j = pair_rand((size_t)N * C);
    cpu->jitter(j.h, inp.h, (size_t)N * C, 0.1f, 77, NEOX_ELEM_F32);
    gpu->jitter(j.d, inp.d, (size_t)N * C, 0.1f, 77, NEOX_ELEM_F32);
    checkf(0, 0, &j, "jitter n=%d", N * C);
    cpu->jitter(j.h, j.h, (size_t)N * C, 0.3f, 78, NEOX_ELEM_F32);
    gpu->jitter(j.d, j.d, (size_t)N * C, 0.3f, 78, NEOX_ELEM_F32);
    checkf(0, 0, &j, "jitter in place n=%d", N * C);
    pair *all[] = {&inp, &rows, &w, &g, &out, &dout, &drows, &dw, &j};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(all[i]);
    ipair_free(&sl);
    ipair_free(&pm);
    free(slot);
    free(perm);
}

// The residual add fused before the norm: the sum exactly, the norm as the norm's own tolerances.
// C % 4 == 0 takes the 16-byte kernel, other widths the element-wise one; alias: sum over a (the
// residual stream updated in place); biased: b's row-parallel bias (b_bias) added first.
static void test_add_norm(int N, int C, int rms, int alias, int biased) {
    pair a = pair_uniform((size_t)N * C, -2.0f, 3.0f), b = pair_rand((size_t)N * C), w = pair_uniform(C, 0.5f, 1.5f);
    pair bias = pair_rand(C), sum = pair_rand((size_t)N * C), out = pair_rand((size_t)N * C), mean = pair_rand(N),
         rstd = pair_rand(N), bb = pair_rand(C);
    pair *s = alias ? &a : &sum;
    const float *bbh = biased ? bb.h : NULL, *bbd = biased ? bb.d : NULL;
    if (rms) {
        cpu->add_rmsnorm_forward(s->h, out.h, rstd.h, a.h, b.h, bbh, w.h, N, C, 1e-6f, NEOX_ELEM_F32);
        gpu->add_rmsnorm_forward(s->d, out.d, rstd.d, a.d, b.d, bbd, w.d, N, C, 1e-6f, NEOX_ELEM_F32);
    } else {
        cpu->add_layernorm_forward(s->h, out.h, mean.h, rstd.h, a.h, b.h, bbh, w.h, bias.h, N, C, 1e-5f, NEOX_ELEM_F32);
        gpu->add_layernorm_forward(s->d, out.d, mean.d, rstd.d, a.d, b.d, bbd, w.d, bias.d, N, C, 1e-5f, NEOX_ELEM_F32);
        checkf(1e-6, 1e-6, &mean, "add_layernorm_forward mean N=%d C=%d", N, C);
    }
    const char *op = rms ? "add_rmsnorm_forward" : "add_layernorm_forward";
    checkf(0, 0, s, "%s sum N=%d C=%d alias=%d biased=%d (exact)", op, N, C, alias, biased);
    checkf(1e-5, 1e-5, &out, "%s N=%d C=%d alias=%d biased=%d", op, N, C, alias, biased);
    checkf(0, 1e-6, &rstd, "%s rstd N=%d C=%d", op, N, C);
    pair *all[] = {&a, &b, &w, &bias, &sum, &out, &mean, &rstd, &bb};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) pair_free(all[k]);
}

// ---- attention ----------------------------------------------------------------------------------------

static void test_qkv(int B, int T, int NH, int NKV, int HS, int interleaved) {
    size_t W = (size_t)(NH + 2 * NKV) * HS;
    pair qkv = pair_rand((size_t)B * T * W), q = pair_rand((size_t)B * NH * T * HS);
    pair k = pair_rand((size_t)B * NKV * T * HS), v = pair_rand((size_t)B * NKV * T * HS);
    cpu->qkv_split(q.h, k.h, v.h, qkv.h, B, T, NH, NKV, HS, interleaved, NEOX_ELEM_F32);
    gpu->qkv_split(q.d, k.d, v.d, qkv.d, B, T, NH, NKV, HS, interleaved, NEOX_ELEM_F32);
    checkf(0, 0, &q, "qkv_split q NH=%d NKV=%d HS=%d interleaved=%d", NH, NKV, HS, interleaved);
    checkf(0, 0, &k, "qkv_split k NH=%d NKV=%d HS=%d interleaved=%d", NH, NKV, HS, interleaved);
    checkf(0, 0, &v, "qkv_split v NH=%d NKV=%d HS=%d interleaved=%d", NH, NKV, HS, interleaved);
    pair dq = pair_rand(q.n), dk = pair_rand(k.n), dv = pair_rand(v.n);
    cpu->qkv_merge(qkv.h, dq.h, dk.h, dv.h, B, T, NH, NKV, HS, interleaved, NEOX_ELEM_F32);
    gpu->qkv_merge(qkv.d, dq.d, dk.d, dv.d, B, T, NH, NKV, HS, interleaved, NEOX_ELEM_F32);
    checkf(0, 0, &qkv, "qkv_merge NH=%d NKV=%d HS=%d interleaved=%d", NH, NKV, HS, interleaved);
    pair *all[] = {&qkv, &q, &k, &v, &dq, &dk, &dv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(all[i]);
}

static void test_rotary(int B, int H, int T, int HS, int R) {
    size_t half = (size_t)R / 2;
    pair c = pair_zero((size_t)T * half), s = pair_zero((size_t)T * half), x = pair_rand((size_t)B * H * T * HS);
    neox_rope_scaling llama3 = {NEOX_ROPE_LLAMA3, 8.0, 1.0, 4.0, 64};
    cpu->rotary_tables(c.h, s.h, T, R, 10000.0, llama3);
    gpu->rotary_tables(c.d, s.d, T, R, 10000.0, llama3);
    checkf(0, 0, &c, "rotary_tables cos T=%d R=%d", T, R);
    checkf(0, 0, &s, "rotary_tables sin T=%d R=%d", T, R);
    for (int inverse = 0; inverse < 2; inverse++) {
        cpu->rotary_apply(x.h, c.h, s.h, B, H, T, HS, R, inverse, NEOX_ELEM_F32, (neox_head_strides){0});
        gpu->rotary_apply(x.d, c.d, s.d, B, H, T, HS, R, inverse, NEOX_ELEM_F32, (neox_head_strides){0});
        checkf(1e-6, 1e-6, &x, "rotary_apply B=%d H=%d T=%d HS=%d R=%d inverse=%d", B, H, T, HS, R, inverse);
    }
    pair_free(&c);
    pair_free(&s);
    pair_free(&x);
}

// Which implementation the CUDA table's 16-bit attention calls take, named in the checks: " own first"
// or " own pipelined" (the tensor-core kernels of attention_mma.cu or attention_fa2.cu, with
// neox_cuda_attention_cudnn(0)) or " cudnn" (cuDNN's fused attention wherever its rules allow: bf16
// without dropout or ALiBi; the notice on stderr says whether it ran).
static const char *g_att_path = "";
// Whether the pipelined kernels are checked and are the default own kernels: not when the run was
// started with NEOX_ATTENTION_KERNELS=first (tests/gpu/device-check.sh does so after they crashed).
static int g_pipelined = 1;
// The pipelined backward's forms checked: 1 (the single pass, the default) and 2 (the two passes), or
// 2 alone when the run was started with NEOX_ATTENTION_BACKWARD=two-pass (after the single pass crashed).
static int g_first_passes = 1;

// e: the operands' type (fp32: the CUDA-core kernels; bf16/fp16: the tensor-core kernels against the
// CPU reference at the same rounding points). In 16 bits the two sides round the same values, but
// their fp32 sums and exponentials differ in the last bits, so a probability or score gradient may
// round to the neighbouring 16-bit value on one side: a few units of the operand's precision.
// alibi: with GPT-NeoX's slopes for NH heads (copies on both sides).
static void test_attention_full(int B, int T, int NH, int NKV, int HS, float dropout, int window, neox_elem e,
                                int alibi) {
    size_t nq = (size_t)B * NH * T * HS, nkv = (size_t)B * NKV * T * HS;
    float scale = 1.0f / sqrtf((float)HS);
    unsigned long long seed = 4242;
    double unit = e == NEOX_ELEM_BF16 ? 1.0 / 128 : e == NEOX_ELEM_F16 ? 1.0 / 1024 : 0.0;  // 2^-(mantissa bits)
    double fwd_tol = e == NEOX_ELEM_F32 ? 2e-5 : 2 * unit, bwd_tol = e == NEOX_ELEM_F32 ? 5e-5 : 4 * unit;
    char type[32];
    snprintf(type, sizeof type, "%s%s", e == NEOX_ELEM_BF16 ? "bf16" : e == NEOX_ELEM_F16 ? "fp16" : "fp32",
             e == NEOX_ELEM_F32 ? "" : g_att_path);
    pair q = pair_uniform(nq, -2.0f, 2.0f), k = pair_uniform(nkv, -2.0f, 2.0f), v = pair_rand(nkv);
    pair out = pair_rand(nq), lse = pair_rand((size_t)B * NH * T);
    float *host_slopes = xmalloc((size_t)NH * sizeof(float));
    neox_alibi_slopes(host_slopes, NH, 0, NH);
    pair slopes = pair_from(host_slopes, NH);
    // The dropout counter of a tensor-parallel rank holding heads 1.. of NH + 3, from batch row 5.
    neox_attention_opts oc = {.scale = scale, .window = window, .dropout = dropout, .seed = seed, .operands = e,
                              .alibi = alibi ? slopes.h : NULL, .dropout_row0 = 5, .dropout_head0 = 1,
                              .dropout_heads = NH + 3};
    neox_attention_opts og = oc;
    og.alibi = alibi ? slopes.d : NULL;
    // The GPU's rows 2 + 3, the 3 read on the device (a replayed step's row): the CPU's 5.
    unsigned long long rows_at = 3, *rows_at_d = gpu->alloc(sizeof rows_at);
    gpu->to_device(rows_at_d, &rows_at, sizeof rows_at);
    og.dropout_row0 = 2, og.dropout_row0_at = rows_at_d;
    cpu->attention_forward(out.h, lse.h, q.h, k.h, v.h, B, T, NH, NKV, HS, oc, NEOX_ELEM_F32);
    gpu->attention_forward(out.d, lse.d, q.d, k.d, v.d, B, T, NH, NKV, HS, og, NEOX_ELEM_F32);
    checkf(fwd_tol, e == NEOX_ELEM_F32 ? 1e-4 : fwd_tol, &out,
           "attention_forward %s B=%d T=%d NH=%d NKV=%d HS=%d dropout=%g window=%d alibi=%d", type, B, T, NH, NKV, HS,
           dropout, window, alibi);
    checkf(e == NEOX_ELEM_F32 ? 1e-5 : 1e-4, 1e-5, &lse, "attention_forward %s lse B=%d T=%d NH=%d NKV=%d HS=%d", type,
           B, T, NH, NKV, HS);
    pair o = pair_from(out.h, nq), l = pair_from(lse.h, lse.n), dout = pair_rand(nq);
    pair dq = pair_rand(nq), dk = pair_rand(nkv), dv = pair_rand(nkv);
    cpu->attention_backward(dq.h, dk.h, dv.h, dout.h, q.h, k.h, v.h, o.h, l.h, B, T, NH, NKV, HS, oc, NEOX_ELEM_F32);
    gpu->attention_backward(dq.d, dk.d, dv.d, dout.d, q.d, k.d, v.d, o.d, l.d, B, T, NH, NKV, HS, og, NEOX_ELEM_F32);
    double rtol = e == NEOX_ELEM_F32 ? 1e-4 : bwd_tol;
    const char *fmt = "attention_backward %s %s B=%d T=%d NH=%d NKV=%d HS=%d dropout=%g window=%d alibi=%d";
    checkf(bwd_tol, rtol, &dq, fmt, type, "dq", B, T, NH, NKV, HS, dropout, window, alibi);
    checkf(bwd_tol, rtol, &dk, fmt, type, "dk", B, T, NH, NKV, HS, dropout, window, alibi);
    checkf(bwd_tol, rtol, &dv, fmt, type, "dv", B, T, NH, NKV, HS, dropout, window, alibi);
    pair_free(&slopes);
    free(host_slopes);
    gpu->free(rows_at_d);
    pair *all[] = {&q, &k, &v, &out, &lse, &o, &l, &dout, &dq, &dk, &dv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(all[i]);
}

static void test_attention_elem(int B, int T, int NH, int NKV, int HS, float dropout, int window, neox_elem e) {
    test_attention_full(B, T, NH, NKV, HS, dropout, window, e, 0);
}
static void test_attention(int B, int T, int NH, int NKV, int HS, float dropout, int window) {
    test_attention_full(B, T, NH, NKV, HS, dropout, window, NEOX_ELEM_F32, 0);
}

// Context parallelism's query positions (kernels.h: q_rows, q_split, q_pos0, q_pos1): rank `rank` of
// cp holds chunks rank and 2 cp - 1 - rank of c = T / (2 cp) positions, its 2c queries against all T
// keys (the causal mask, the window and ALiBi's j - i at the global positions). The CPU's kernel with
// the same positions is the reference (tests/unit/test_kernels.c holds it to the whole attention's
// rows). e, alibi and the tolerances as test_attention_full's; no dropout (context parallelism refuses it).
static void test_attention_cp(int B, int T, int cp, int rank, int NH, int NKV, int HS, int window, neox_elem e,
                              int alibi) {
    int c = T / (2 * cp), Tq = 2 * c;
    size_t nq = (size_t)B * NH * Tq * HS, nkv = (size_t)B * NKV * T * HS;
    double unit = e == NEOX_ELEM_BF16 ? 1.0 / 128 : e == NEOX_ELEM_F16 ? 1.0 / 1024 : 0.0;
    double fwd_tol = e == NEOX_ELEM_F32 ? 2e-5 : 2 * unit, bwd_tol = e == NEOX_ELEM_F32 ? 5e-5 : 4 * unit;
    char type[32];
    snprintf(type, sizeof type, "%s%s", e == NEOX_ELEM_BF16 ? "bf16" : e == NEOX_ELEM_F16 ? "fp16" : "fp32",
             e == NEOX_ELEM_F32 ? "" : g_att_path);
    pair q = pair_uniform(nq, -2.0f, 2.0f), k = pair_uniform(nkv, -2.0f, 2.0f), v = pair_rand(nkv);
    pair out = pair_rand(nq), lse = pair_rand((size_t)B * NH * Tq);
    float *host_slopes = xmalloc((size_t)NH * sizeof(float));
    neox_alibi_slopes(host_slopes, NH, 0, NH);
    pair slopes = pair_from(host_slopes, NH);
    neox_attention_opts oc = {.scale = 1.0f / sqrtf((float)HS), .window = window, .operands = e,
                              .alibi = alibi ? slopes.h : NULL, .q_rows = Tq, .q_split = c, .q_pos0 = rank * c,
                              .q_pos1 = (2 * cp - 1 - rank) * c}, og = oc;
    og.alibi = alibi ? slopes.d : NULL;
    const char *fmt = "attention_%s %s%s context parallel B=%d T=%d cp=%d rank=%d NH=%d NKV=%d HS=%d window=%d alibi=%d";
    cpu->attention_forward(out.h, lse.h, q.h, k.h, v.h, B, T, NH, NKV, HS, oc, NEOX_ELEM_F32);
    gpu->attention_forward(out.d, lse.d, q.d, k.d, v.d, B, T, NH, NKV, HS, og, NEOX_ELEM_F32);
    checkf(fwd_tol, e == NEOX_ELEM_F32 ? 1e-4 : fwd_tol, &out, fmt, "forward", type, "", B, T, cp, rank, NH, NKV, HS,
           window, alibi);
    checkf(e == NEOX_ELEM_F32 ? 1e-5 : 1e-4, 1e-5, &lse, fmt, "forward", type, " lse", B, T, cp, rank, NH, NKV, HS,
           window, alibi);
    pair o = pair_from(out.h, nq), l = pair_from(lse.h, lse.n), dout = pair_rand(nq);
    pair dq = pair_rand(nq), dk = pair_rand(nkv), dv = pair_rand(nkv);
    cpu->attention_backward(dq.h, dk.h, dv.h, dout.h, q.h, k.h, v.h, o.h, l.h, B, T, NH, NKV, HS, oc, NEOX_ELEM_F32);
    gpu->attention_backward(dq.d, dk.d, dv.d, dout.d, q.d, k.d, v.d, o.d, l.d, B, T, NH, NKV, HS, og, NEOX_ELEM_F32);
    double rtol = e == NEOX_ELEM_F32 ? 1e-4 : bwd_tol;
    checkf(bwd_tol, rtol, &dq, fmt, "backward", type, " dq", B, T, cp, rank, NH, NKV, HS, window, alibi);
    checkf(bwd_tol, rtol, &dk, fmt, "backward", type, " dk", B, T, cp, rank, NH, NKV, HS, window, alibi);
    checkf(bwd_tol, rtol, &dv, fmt, "backward", type, " dv", B, T, cp, rank, NH, NKV, HS, window, alibi);
    pair_free(&slopes);
    free(host_slopes);
    pair *all[] = {&q, &k, &v, &out, &lse, &o, &l, &dout, &dq, &dk, &dv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(all[i]);
}

// The pipelined kernels reading q, k and v through strides from a fused QKV buffer (GPT-NeoX's
// interleaved layout or Llama's) and writing the gradients into a buffer of the same layout, against
// the CPU's split, attention and merge (with --self: the CPU's on both sides). Tolerances as
// test_attention_full's in 16 bits.
static void test_attention_qkv(int B, int T, int NH, int NKV, int HS, int interleaved, neox_elem e, float dropout) {
    size_t nq = (size_t)B * NH * T * HS, nkv = (size_t)B * NKV * T * HS, W = (size_t)(NH + 2 * NKV) * HS;
    double unit = e == NEOX_ELEM_BF16 ? 1.0 / 128 : 1.0 / 1024, fwd_tol = 2 * unit, bwd_tol = 4 * unit;
    const char *type = e == NEOX_ELEM_BF16 ? "bf16" : "fp16";
    pair qkv = pair_uniform((size_t)B * T * W, -2.0f, 2.0f), out = pair_rand(nq), lse = pair_rand((size_t)B * NH * T);
    pair dout = pair_rand(nq), dqkv = pair_rand(qkv.n);
    float *q = xmalloc(nq * sizeof(float)), *k = xmalloc(nkv * sizeof(float)), *v = xmalloc(nkv * sizeof(float));
    float *dq = xmalloc(nq * sizeof(float)), *dk = xmalloc(nkv * sizeof(float)), *dv = xmalloc(nkv * sizeof(float));
    neox_attention_opts o = {.scale = 1.0f / sqrtf((float)HS), .dropout = dropout, .seed = 77, .operands = e};
    cpu->qkv_split(q, k, v, qkv.h, B, T, NH, NKV, HS, interleaved, NEOX_ELEM_F32);
    cpu->attention_forward(out.h, lse.h, q, k, v, B, T, NH, NKV, HS, o, NEOX_ELEM_F32);
    cpu->attention_backward(dq, dk, dv, dout.h, q, k, v, out.h, lse.h, B, T, NH, NKV, HS, o, NEOX_ELEM_F32);
    cpu->qkv_merge(dqkv.h, dq, dk, dv, B, T, NH, NKV, HS, interleaved, NEOX_ELEM_F32);
    pair o_cpu = pair_from(out.h, nq), l_cpu = pair_from(lse.h, lse.n);  // the backward's inputs, both sides
    if (gpu == cpu) {  // --self: the harness's plumbing only
        memcpy(out.d, out.h, nq * sizeof(float)), memcpy(lse.d, lse.h, lse.n * sizeof(float));
        memcpy(dqkv.d, dqkv.h, dqkv.n * sizeof(float));
    } else if (!neox_cuda_attention_fa2_forward_qkv(out.d, lse.d, qkv.d, interleaved, B, T, NH, NKV, HS, o,
                                                    NEOX_ELEM_F32) ||
               !neox_cuda_attention_fa2_backward_qkv(dqkv.d, dout.d, qkv.d, interleaved, o_cpu.d, l_cpu.d, B, T, NH,
                                                     NKV, HS, o, NEOX_ELEM_F32)) {
        printf("ok - attention fused QKV HS=%d # SKIP too little shared memory per block on this GPU\n", HS);
        dropout = -1.0f;  // (nothing to compare)
    }
    const char *fmt = "attention %s %s fused QKV interleaved=%d B=%d T=%d NH=%d NKV=%d HS=%d dropout=%g";
    if (dropout >= 0.0f) {
        checkf(fwd_tol, fwd_tol, &out, fmt, "forward", type, interleaved, B, T, NH, NKV, HS, dropout);
        checkf(1e-4, 1e-5, &lse, fmt, "forward lse", type, interleaved, B, T, NH, NKV, HS, dropout);
        checkf(bwd_tol, bwd_tol, &dqkv, fmt, "backward dqkv", type, interleaved, B, T, NH, NKV, HS, dropout);
    }
    float *host[] = {q, k, v, dq, dk, dv};
    for (size_t i = 0; i < sizeof host / sizeof *host; i++) free(host[i]);
    pair *all[] = {&qkv, &out, &lse, &dout, &dqkv, &o_cpu, &l_cpu};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(all[i]);
}

static void test_attention_cached(int S, int pos0, int NH, int NKV, int HS, int maxT, int window, int alibi) {
    pair q = pair_uniform((size_t)NH * S * HS, -2.0f, 2.0f), kc = pair_uniform((size_t)NKV * maxT * HS, -2.0f, 2.0f);
    pair vc = pair_rand((size_t)NKV * maxT * HS), out = pair_rand((size_t)S * NH * HS);
    float scale = 1.0f / sqrtf((float)HS);
    float host_slopes[64];
    neox_alibi_slopes(host_slopes, NH, 0, NH);
    pair slopes = pair_from(host_slopes, NH);
    neox_attention_opts oc = {.scale = scale, .window = window, .operands = NEOX_ELEM_F32,
                              .alibi = alibi ? slopes.h : NULL};
    neox_attention_opts og = oc;
    og.alibi = alibi ? slopes.d : NULL;
    cpu->attention_cached(out.h, q.h, kc.h, vc.h, S, pos0, NH, NKV, HS, maxT, oc);
    gpu->attention_cached(out.d, q.d, kc.d, vc.d, S, pos0, NH, NKV, HS, maxT, og);
    checkf(2e-5, 1e-4, &out, "attention_cached S=%d pos0=%d NH=%d NKV=%d HS=%d maxT=%d window=%d alibi=%d", S, pos0, NH,
           NKV, HS, maxT, window, alibi);
    pair_free(&slopes);
    pair_free(&q);
    pair_free(&kc);
    pair_free(&vc);
    pair_free(&out);
}

// ---- activations and elementwise ------------------------------------------------------------------

static void test_activations(size_t n, int N, int F) {
    pair x = pair_uniform(n, -5.0f, 5.0f), out = pair_rand(n), dout = pair_rand(n), dinp = pair_rand(n);
    pair in2 = pair_uniform((size_t)N * 2 * F, -6.0f, 6.0f), o = pair_rand((size_t)N * F), d = pair_rand((size_t)N * F);
    pair di = pair_rand((size_t)N * 2 * F);
    for (int k = NEOX_FN_GELU; k <= NEOX_FN_IDENTITY; k++) {
        neox_act_fn fn = (neox_act_fn)k;
        cpu->activation_forward(out.h, x.h, n, fn, NEOX_ELEM_F32);
        gpu->activation_forward(out.d, x.d, n, fn, NEOX_ELEM_F32);
        checkf(1e-6, 1e-5, &out, "activation_forward n=%zu fn=%d", n, k);
        cpu->activation_backward(dinp.h, dout.h, x.h, n, fn, NEOX_ELEM_F32);
        gpu->activation_backward(dinp.d, dout.d, x.d, n, fn, NEOX_ELEM_F32);
        checkf(1e-6, 1e-5, &dinp, "activation_backward n=%zu fn=%d", n, k);
        // The gated inputs reach +-6, where 1 + erf (or 1 + tanh) cancels: one float ulp of the erf
        // near -1 is 6e-8, times |x|/2 and the gate's |b| <= 6 gives errors near 2e-6 that both
        // backends are entitled to (the GPU's erff and tanhf differ from glibc's by an ulp).
        cpu->gated_forward(o.h, in2.h, N, F, fn, NEOX_ELEM_F32);
        gpu->gated_forward(o.d, in2.d, N, F, fn, NEOX_ELEM_F32);
        checkf(1e-5, 1e-5, &o, "gated_forward N=%d F=%d fn=%d", N, F, k);
        cpu->gated_backward(di.h, d.h, in2.h, N, F, fn, NEOX_ELEM_F32);
        gpu->gated_backward(di.d, d.d, in2.d, N, F, fn, NEOX_ELEM_F32);
        checkf(1e-5, 1e-5, &di, "gated_backward N=%d F=%d fn=%d", N, F, k);
    }
    pair *all[] = {&x, &out, &dout, &dinp, &in2, &o, &d, &di};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(all[i]);
}

// ---- bf16 activation storage (kernels.h, "Activation storage") --------------------------------------
// A bf16 tensor on both backends: raw 16-bit elements h on the host, d on the device.
typedef struct { uint16_t *h; void *d; size_t n; } bpair;

static bpair bpair_uniform(size_t n, float lo, float hi) {
    bpair p = {xmalloc(n * sizeof(uint16_t)), gpu->alloc(n * sizeof(uint16_t)), n};
    for (size_t i = 0; i < n; i++) p.h[i] = neox_bf16_from_f32(lo + (hi - lo) * neox_uniform(12345, draw++));
    gpu->to_device(p.d, p.h, n * sizeof(uint16_t));
    return p;
}
static bpair bpair_rand(size_t n) { return bpair_uniform(n, -1.0f, 1.0f); }

static void bpair_free(bpair *p) {
    free(p->h);
    gpu->free(p->d);
}

// Compares a bf16 result widened to fp32. Tolerances in units of bf16's rounding (2^-8 relative): an
// fp32 result of the two backends a few fp32 ulps apart may round to neighbouring bf16 values.
static void bcheckf(double atol, double rtol, const bpair *p, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void bcheckf(double atol, double rtol, const bpair *p, const char *fmt, ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    uint16_t *raw = xmalloc(p->n * sizeof(uint16_t));
    float *ref = xmalloc(p->n * sizeof(float)), *got = xmalloc(p->n * sizeof(float));
    gpu->to_host(raw, p->d, p->n * sizeof(uint16_t));
    for (size_t i = 0; i < p->n; i++) {
        ref[i] = neox_bf16_to_f32(p->h[i]);
        got[i] = neox_bf16_to_f32(raw[i]);
    }
    compare(name, ref, got, p->n, atol, rtol);
    free(raw);
    free(ref);
    free(got);
}

static const double BF16_ULP = 1.0 / 128;  // one unit in the last place of bf16, relative, at worst

// Additions, bias and dropout round once from the same fp32 value: the same bits.
static void test_bf16_elementwise(int N, int C) {
    size_t n = (size_t)N * C;
    bpair a = bpair_rand(n), b = bpair_rand(n), out = bpair_rand(n);
    pair bias = pair_rand(C);
    cpu->add(out.h, a.h, b.h, n, NEOX_ELEM_BF16);
    gpu->add(out.d, a.d, b.d, n, NEOX_ELEM_BF16);
    bcheckf(0, 0, &out, "add bf16 n=%zu", n);
    cpu->add_bias(a.h, bias.h, N, C, NEOX_ELEM_BF16);
    gpu->add_bias(a.d, bias.d, N, C, NEOX_ELEM_BF16);
    bcheckf(0, 0, &a, "add_bias bf16 N=%d C=%d", N, C);
    cpu->dropout(out.h, a.h, n, 0.1f, 77, 1000, NULL, 0, NEOX_ELEM_BF16);
    gpu->dropout(out.d, a.d, n, 0.1f, 77, 1000, NULL, 0, NEOX_ELEM_BF16);
    bcheckf(0, 0, &out, "dropout bf16 n=%zu p=0.1", n);
    cpu->jitter(out.h, a.h, n, 0.1f, 77, NEOX_ELEM_BF16);  // the CPU's expression, rounded once: the same bits
    gpu->jitter(out.d, a.d, n, 0.1f, 77, NEOX_ELEM_BF16);
    bcheckf(0, 0, &out, "jitter bf16 n=%zu", n);
    cpu->jitter(out.h, out.h, n, 0.3f, 78, NEOX_ELEM_BF16);
    gpu->jitter(out.d, out.d, n, 0.3f, 78, NEOX_ELEM_BF16);
    bcheckf(0, 0, &out, "jitter bf16 in place n=%zu", n);
    bpair_free(&a);
    bpair_free(&b);
    bpair_free(&out);
    pair_free(&bias);
}

static void test_bf16_activations(size_t n, int N, int F) {
    bpair x = bpair_uniform(n, -5.0f, 5.0f), out = bpair_rand(n), dout = bpair_rand(n), dinp = bpair_rand(n);
    bpair in2 = bpair_uniform((size_t)N * 2 * F, -6.0f, 6.0f), o = bpair_rand((size_t)N * F), d = bpair_rand((size_t)N * F);
    bpair di = bpair_rand((size_t)N * 2 * F);
    for (int k = NEOX_FN_GELU; k <= NEOX_FN_IDENTITY; k++) {
        neox_act_fn fn = (neox_act_fn)k;
        cpu->activation_forward(out.h, x.h, n, fn, NEOX_ELEM_BF16);
        gpu->activation_forward(out.d, x.d, n, fn, NEOX_ELEM_BF16);
        bcheckf(1e-5, BF16_ULP, &out, "activation_forward bf16 n=%zu fn=%d", n, k);
        cpu->activation_backward(dinp.h, dout.h, x.h, n, fn, NEOX_ELEM_BF16);
        gpu->activation_backward(dinp.d, dout.d, x.d, n, fn, NEOX_ELEM_BF16);
        bcheckf(1e-5, BF16_ULP, &dinp, "activation_backward bf16 n=%zu fn=%d", n, k);
        cpu->gated_forward(o.h, in2.h, N, F, fn, NEOX_ELEM_BF16);
        gpu->gated_forward(o.d, in2.d, N, F, fn, NEOX_ELEM_BF16);
        bcheckf(1e-5, BF16_ULP, &o, "gated_forward bf16 N=%d F=%d fn=%d", N, F, k);
        cpu->gated_backward(di.h, d.h, in2.h, N, F, fn, NEOX_ELEM_BF16);
        gpu->gated_backward(di.d, d.d, in2.d, N, F, fn, NEOX_ELEM_BF16);
        bcheckf(1e-5, BF16_ULP, &di, "gated_backward bf16 N=%d F=%d fn=%d", N, F, k);
    }
    bpair *all[] = {&x, &out, &dout, &dinp, &in2, &o, &d, &di};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) bpair_free(all[i]);
}

// The split into heads and its inverse move elements as they are; the rotation rounds once per element.
static void test_bf16_heads(int B, int T, int NH, int NKV, int HS, int interleaved) {
    size_t nq = (size_t)B * NH * T * HS, nk = (size_t)B * NKV * T * HS, nqkv = nq + 2 * nk;
    bpair qkv = bpair_rand(nqkv), q = bpair_rand(nq), k = bpair_rand(nk), v = bpair_rand(nk);
    cpu->qkv_split(q.h, k.h, v.h, qkv.h, B, T, NH, NKV, HS, interleaved, NEOX_ELEM_BF16);
    gpu->qkv_split(q.d, k.d, v.d, qkv.d, B, T, NH, NKV, HS, interleaved, NEOX_ELEM_BF16);
    bcheckf(0, 0, &q, "qkv_split bf16 q NH=%d NKV=%d HS=%d interleaved=%d", NH, NKV, HS, interleaved);
    bcheckf(0, 0, &k, "qkv_split bf16 k NH=%d NKV=%d HS=%d interleaved=%d", NH, NKV, HS, interleaved);
    bcheckf(0, 0, &v, "qkv_split bf16 v NH=%d NKV=%d HS=%d interleaved=%d", NH, NKV, HS, interleaved);
    cpu->qkv_merge(qkv.h, q.h, k.h, v.h, B, T, NH, NKV, HS, interleaved, NEOX_ELEM_BF16);
    gpu->qkv_merge(qkv.d, q.d, k.d, v.d, B, T, NH, NKV, HS, interleaved, NEOX_ELEM_BF16);
    bcheckf(0, 0, &qkv, "qkv_merge bf16 NH=%d NKV=%d HS=%d interleaved=%d", NH, NKV, HS, interleaved);
    int R = HS / 2 * 2;
    pair c = pair_rand((size_t)T * R / 2), sn = pair_rand((size_t)T * R / 2);
    for (int inverse = 0; inverse <= 1; inverse++) {
        cpu->rotary_apply(q.h, c.h, sn.h, B, NH, T, HS, R, inverse, NEOX_ELEM_BF16, (neox_head_strides){0});
        gpu->rotary_apply(q.d, c.d, sn.d, B, NH, T, HS, R, inverse, NEOX_ELEM_BF16, (neox_head_strides){0});
        bcheckf(1e-6, BF16_ULP, &q, "rotary_apply bf16 B=%d H=%d T=%d HS=%d inverse=%d", B, NH, T, HS, inverse);
    }
    bpair *all[] = {&qkv, &q, &k, &v};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) bpair_free(all[i]);
    pair_free(&c);
    pair_free(&sn);
}

// ScaleNorm in bf16 storage (rnorm and the gain's gradient fp32); eps between the rows' norms puts
// rows on both sides of the clamp.
static void test_bf16_scalenorm(int N, int C, float eps) {
    size_t n = (size_t)N * C;
    bpair inp = bpair_uniform(n, -2.0f, 3.0f), out = bpair_rand(n), dout = bpair_rand(n), dinp = bpair_rand(n);
    pair g = pair_uniform(1, 0.5f, 1.5f), rnorm = pair_rand(N), dg = pair_rand(1);
    cpu->scalenorm_forward(out.h, rnorm.h, inp.h, g.h, N, C, eps, NEOX_ELEM_BF16);
    gpu->scalenorm_forward(out.d, rnorm.d, inp.d, g.d, N, C, eps, NEOX_ELEM_BF16);
    bcheckf(1e-5, BF16_ULP, &out, "scalenorm_forward bf16 N=%d C=%d eps=%g", N, C, eps);
    checkf(0, 1e-6, &rnorm, "scalenorm_forward bf16 rnorm N=%d C=%d eps=%g", N, C, eps);
    pair r = pair_from(rnorm.h, N);
    cpu->scalenorm_backward(dinp.h, dg.h, dout.h, inp.h, g.h, r.h, N, C, eps, NEOX_ELEM_BF16);
    gpu->scalenorm_backward(dinp.d, dg.d, dout.d, inp.d, g.d, r.d, N, C, eps, NEOX_ELEM_BF16);
    bcheckf(1e-5, BF16_ULP, &dinp, "scalenorm_backward bf16 dinp N=%d C=%d eps=%g", N, C, eps);
    checkf(1e-4, 1e-5, &dg, "scalenorm_backward bf16 dg N=%d C=%d eps=%g", N, C, eps);
    bpair *b[] = {&inp, &out, &dout, &dinp};
    for (size_t i = 0; i < sizeof b / sizeof *b; i++) bpair_free(b[i]);
    pair *f[] = {&g, &rnorm, &dg, &r};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) pair_free(f[i]);
}

// The query/key norm in bf16 storage, in place as the model runs it (out = inp forward, dinp = dout
// backward); statistics and parameter gradients fp32.
static void test_bf16_head_norm(int B, int H, int T, int HS, int G, int rms) {
    size_t n = (size_t)B * H * T * HS, rows = (size_t)B * T * (H / G), WH = (size_t)H * HS;
    bpair x = bpair_uniform(n, -2.0f, 3.0f), d = bpair_rand(n);
    pair w = pair_uniform(WH, 0.5f, 1.5f), b = pair_rand(WH), mean = pair_rand(rows), rstd = pair_rand(rows);
    pair dw = pair_rand(WH), db = pair_rand(WH);
    bpair inp = bpair_rand(n);  // the input kept for backward: x before the in-place norm
    memcpy(inp.h, x.h, n * sizeof(uint16_t));
    gpu->to_device(inp.d, inp.h, n * sizeof(uint16_t));
    cpu->head_norm_forward(x.h, rms ? NULL : mean.h, rstd.h, x.h, w.h, rms ? NULL : b.h, B, H, T, HS, G, 1e-5f,
                           NEOX_ELEM_BF16);
    gpu->head_norm_forward(x.d, rms ? NULL : mean.d, rstd.d, x.d, w.d, rms ? NULL : b.d, B, H, T, HS, G, 1e-5f,
                           NEOX_ELEM_BF16);
    bcheckf(1e-5, BF16_ULP, &x, "head_norm_forward bf16 in place B=%d H=%d T=%d HS=%d G=%d rms=%d", B, H, T, HS, G, rms);
    checkf(0, 1e-6, &rstd, "head_norm_forward bf16 rstd G=%d rms=%d", G, rms);
    pair m = pair_from(mean.h, rows), r = pair_from(rstd.h, rows);
    cpu->head_norm_backward(d.h, dw.h, rms ? NULL : db.h, d.h, inp.h, w.h, rms ? NULL : m.h, r.h, B, H, T, HS, G,
                            NEOX_ELEM_BF16);
    gpu->head_norm_backward(d.d, dw.d, rms ? NULL : db.d, d.d, inp.d, w.d, rms ? NULL : m.d, r.d, B, H, T, HS, G,
                            NEOX_ELEM_BF16);
    bcheckf(1e-5, BF16_ULP, &d, "head_norm_backward bf16 dinp in place G=%d rms=%d", G, rms);
    checkf(1e-4, 1e-5, &dw, "head_norm_backward bf16 dweight G=%d rms=%d", G, rms);
    if (!rms) checkf(1e-4, 1e-5, &db, "head_norm_backward bf16 dbias G=%d", G);
    bpair *bp[] = {&x, &d, &inp};
    for (size_t i = 0; i < sizeof bp / sizeof *bp; i++) bpair_free(bp[i]);
    pair *f[] = {&w, &b, &mean, &rstd, &dw, &db, &m, &r};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) pair_free(f[i]);
}

// MoE's row movement in bf16 storage: the gather moves elements as they are; the combination sums
// in fp32 and rounds once; the slot rows' gradient is one product rounded once (the same bits), the
// weights' gradient an fp32 dot product.
static void test_bf16_moe(int N, int K, int C) {
    int NK = N * K, *slot = xmalloc((size_t)NK * sizeof(int)), *perm = xmalloc((size_t)NK * sizeof(int));
    for (int j = 0; j < NK; j++) slot[j] = (j * 7 + 3) % NK;  // a permutation when gcd(7, NK) = 1
    for (int s = 0; s < NK; s++) perm[slot[s]] = s / K;
    ipair sl = ipair_from(slot, NK), pm = ipair_from(perm, NK);
    bpair inp = bpair_rand((size_t)N * C), rows = bpair_rand((size_t)NK * C), g = bpair_rand((size_t)NK * C);
    bpair out = bpair_rand((size_t)N * C), dout = bpair_rand((size_t)N * C), drows = bpair_rand((size_t)NK * C);
    pair w = pair_uniform(NK, 0.0f, 1.0f), dw = pair_rand(NK);
    cpu->gather_rows(g.h, inp.h, pm.h, NK, C, NEOX_ELEM_BF16);
    gpu->gather_rows(g.d, inp.d, pm.d, NK, C, NEOX_ELEM_BF16);
    bcheckf(0, 0, &g, "gather_rows bf16 N=%d K=%d C=%d", N, K, C);
    cpu->moe_combine(out.h, rows.h, sl.h, w.h, N, K, C, NEOX_ELEM_BF16);
    gpu->moe_combine(out.d, rows.d, sl.d, w.d, N, K, C, NEOX_ELEM_BF16);
    bcheckf(1e-6, BF16_ULP, &out, "moe_combine bf16 N=%d K=%d C=%d", N, K, C);
    cpu->moe_combine_backward(drows.h, dw.h, dout.h, rows.h, sl.h, w.h, N, K, C, NEOX_ELEM_BF16);
    gpu->moe_combine_backward(drows.d, dw.d, dout.d, rows.d, sl.d, w.d, N, K, C, NEOX_ELEM_BF16);
    bcheckf(0, 0, &drows, "moe_combine_backward bf16 drows N=%d K=%d C=%d", N, K, C);
    checkf(1e-5, 1e-5, &dw, "moe_combine_backward bf16 dweight N=%d K=%d C=%d", N, K, C);
    bpair *b[] = {&inp, &rows, &g, &out, &dout, &drows};
    for (size_t i = 0; i < sizeof b / sizeof *b; i++) bpair_free(b[i]);
    pair_free(&w);
    pair_free(&dw);
    ipair_free(&sl);
    ipair_free(&pm);
    free(slot);
    free(perm);
}

// The norms in bf16 storage, statistics and parameter gradients fp32; rms: RMSNorm, else LayerNorm.
// The fused add + norm too (under bf16 it normalises the rounded sum, as the CPU does).
// The lookup rounds wte (+ wpe) once: the same bits. The gradient sums the widened bf16 rows in the
// order kernels.h fixes: the same bits too.
static void test_bf16_embedding(int B, int T, int C, int V) {
    int n = B * T, *ids = xmalloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) ids[i] = (int)(neox_uniform(98, draw++) * (V + 1)) - 1;
    ipair id = ipair_from(ids, n);
    pair wte = pair_rand((size_t)V * C), wpe = pair_rand((size_t)T * C);
    bpair out = bpair_rand((size_t)n * C), dout = bpair_rand((size_t)n * C);
    cpu->embedding_forward(out.h, id.h, wte.h, wpe.h, B, T, C, NEOX_ELEM_BF16);
    gpu->embedding_forward(out.d, id.d, wte.d, wpe.d, B, T, C, NEOX_ELEM_BF16);
    bcheckf(0, 0, &out, "embedding_forward bf16 B=%d T=%d C=%d V=%d", B, T, C, V);
    cpu->embedding_rows(out.h, id.h, wte.h, 0, V / 2, n, C, NEOX_ELEM_BF16);
    gpu->embedding_rows(out.d, id.d, wte.d, 0, V / 2, n, C, NEOX_ELEM_BF16);
    bcheckf(0, 0, &out, "embedding_rows bf16 [0, %d) B=%d T=%d C=%d", V / 2, B, T, C);
    cpu->embedding_backward(wte.h, wpe.h, dout.h, id.h, B, T, C, NEOX_ELEM_BF16);
    gpu->embedding_backward(wte.d, wpe.d, dout.d, id.d, B, T, C, NEOX_ELEM_BF16);
    checkf(0, 0, &wte, "embedding_backward bf16 dwte B=%d T=%d C=%d V=%d (exact)", B, T, C, V);
    checkf(0, 0, &wpe, "embedding_backward bf16 dwpe B=%d T=%d C=%d (exact)", B, T, C);
    pair_free(&wte);
    pair_free(&wpe);
    bpair_free(&out);
    bpair_free(&dout);
    ipair_free(&id);
    free(ids);
}

// Logits stored in bf16: the statistics as the fp32 ops' (both widen the same elements), the gradient
// rounded once from fp32 values a few ulps apart.
static void test_bf16_cross_entropy(int N, int V) {
    bpair logits = bpair_uniform((size_t)N * V, -8.0f, 8.0f);
    pair losses = pair_rand(N), lse = pair_rand(N), mx = pair_rand(N), weight = pair_uniform(N, 0.0f, 1.0f);
    int *t = xmalloc((size_t)N * sizeof(int));
    for (int i = 0; i < N; i++) t[i] = (int)(neox_uniform(6, draw++) * V);
    t[0] = -1;  // not scored
    ipair tv = ipair_from(t, N);
    cpu->cross_entropy_forward(losses.h, lse.h, logits.h, tv.h, N, V, NEOX_ELEM_BF16);
    gpu->cross_entropy_forward(losses.d, lse.d, logits.d, tv.d, N, V, NEOX_ELEM_BF16);
    checkf(1e-5, 1e-5, &losses, "cross_entropy_forward bf16 losses N=%d V=%d", N, V);
    checkf(1e-5, 1e-6, &lse, "cross_entropy_forward bf16 lse N=%d V=%d", N, V);
    cpu->cross_entropy_row_max(mx.h, logits.h, N, V, NEOX_ELEM_BF16);
    gpu->cross_entropy_row_max(mx.d, logits.d, N, V, NEOX_ELEM_BF16);
    checkf(0, 0, &mx, "cross_entropy_row_max bf16 N=%d V=%d", N, V);
    pair l = pair_from(lse.h, N);
    cpu->cross_entropy_backward(logits.h, logits.h, l.h, tv.h, weight.h, 1.0f / N, NULL, N, V, NEOX_ELEM_BF16);
    gpu->cross_entropy_backward(logits.d, logits.d, l.d, tv.d, weight.d, 1.0f / N, NULL, N, V, NEOX_ELEM_BF16);
    bcheckf(1e-7, BF16_ULP, &logits, "cross_entropy_backward bf16 in place N=%d V=%d", N, V);
    pair *all[] = {&losses, &lse, &mx, &weight, &l};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(all[i]);
    bpair_free(&logits);
    ipair_free(&tv);
    free(t);
}

// The linear layer on bf16 activations and the weights' bf16 copy: fp32 sums in each backend's own
// order (the bias and an accumulated dinp's old value added in fp32), each result rounded once; the
// weight gradients fp32. The padding columns of out (ldo > OC) stay as they are.
static void test_bf16_linear(int N, int IC, int OC, int pad, int accumulate) {
    int ldo = OC + pad;
    bpair inp = bpair_rand((size_t)N * IC), w = bpair_rand((size_t)OC * IC), out = bpair_rand((size_t)N * ldo);
    pair b = pair_rand(OC), dw = pair_rand((size_t)OC * IC), db = pair_rand(OC);
    cpu->linear_forward(out.h, ldo, inp.h, w.h, b.h, N, IC, OC, NEOX_ELEM_BF16);
    gpu->linear_forward(out.d, ldo, inp.d, w.d, b.d, N, IC, OC, NEOX_ELEM_BF16);
    bcheckf(1e-3, BF16_ULP, &out, "linear_forward bf16 N=%d IC=%d OC=%d ldo=%d", N, IC, OC, ldo);
    bpair plain = bpair_rand((size_t)N * ldo);  // no bias: the device stores the product in bf16 itself
    cpu->linear_forward(plain.h, ldo, inp.h, w.h, NULL, N, IC, OC, NEOX_ELEM_BF16);
    gpu->linear_forward(plain.d, ldo, inp.d, w.d, NULL, N, IC, OC, NEOX_ELEM_BF16);
    bcheckf(1e-3, BF16_ULP, &plain, "linear_forward bf16 without bias N=%d IC=%d OC=%d ldo=%d", N, IC, OC, ldo);
    bpair_free(&plain);
    bpair dout = bpair_rand((size_t)N * ldo), dinp = bpair_rand((size_t)N * IC);
    cpu->linear_backward(dinp.h, dw.h, db.h, dout.h, ldo, inp.h, w.h, N, IC, OC, accumulate, NEOX_ELEM_BF16);
    gpu->linear_backward(dinp.d, dw.d, db.d, dout.d, ldo, inp.d, w.d, N, IC, OC, accumulate, NEOX_ELEM_BF16);
    bcheckf(1e-3, BF16_ULP, &dinp, "linear_backward bf16 dinp N=%d IC=%d OC=%d accumulate=%d", N, IC, OC, accumulate);
    checkf(GEMM_TOL, &dw, "linear_backward bf16 dweight N=%d IC=%d OC=%d", N, IC, OC);
    checkf(1e-4, 1e-5, &db, "linear_backward bf16 dbias N=%d OC=%d", N, OC);
    bpair *bp[] = {&inp, &w, &out, &dout, &dinp};
    for (size_t i = 0; i < sizeof bp / sizeof *bp; i++) bpair_free(bp[i]);
    pair *fp[] = {&b, &dw, &db};
    for (size_t i = 0; i < sizeof fp / sizeof *fp; i++) pair_free(fp[i]);
}

// The fused linear + activation ops on bf16 storage (kernels.h: linear_act_forward/backward), where
// the route (kernels/linear_act_route.c) sends GELU, exact or tanh, to one cuDNN graph per direction
// (the separate ops when cuDNN builds no plan; stderr says which ran) and ReLU to the separate ops,
// against the CPU's composition. cuDNN takes GELU of the fp32 pre-activation and GELU's backward of
// the fp32 product, where the CPU rounds each to bf16 first: out and dpre may differ by the rounding
// of their input carried through GELU (at most about 1.13 of a bf16 unit of it) besides their own.
static void test_bf16_linear_act(int N, int IC, int OC, neox_act_fn fn, int with_bias) {
    bpair inp = bpair_rand((size_t)N * IC), w = bpair_rand((size_t)OC * IC);
    bpair out = bpair_rand((size_t)N * OC), pre = bpair_rand((size_t)N * OC);
    pair b = pair_rand(OC), db = pair_rand(IC);  // (db is added to)
    cpu->linear_act_forward(out.h, pre.h, inp.h, w.h, with_bias ? b.h : NULL, N, IC, OC, fn, NEOX_ELEM_BF16);
    gpu->linear_act_forward(out.d, pre.d, inp.d, w.d, with_bias ? b.d : NULL, N, IC, OC, fn, NEOX_ELEM_BF16);
    bcheckf(1e-3, BF16_ULP, &pre, "linear_act_forward bf16 pre fn=%d N=%d IC=%d OC=%d bias=%d", (int)fn, N, IC, OC,
            with_bias);
    bcheckf(2e-3, 2 * BF16_ULP, &out, "linear_act_forward bf16 out fn=%d N=%d IC=%d OC=%d", (int)fn, N, IC, OC);
    // backward through a layer (OC, IC) whose input was fn(x), x of width IC
    bpair dout = bpair_rand((size_t)N * OC), x = bpair_rand((size_t)N * IC), dpre = bpair_rand((size_t)N * IC);
    cpu->linear_act_backward(dpre.h, with_bias ? db.h : NULL, dout.h, w.h, x.h, N, IC, OC, fn, NEOX_ELEM_BF16);
    gpu->linear_act_backward(dpre.d, with_bias ? db.d : NULL, dout.d, w.d, x.d, N, IC, OC, fn, NEOX_ELEM_BF16);
    bcheckf(2e-3, 2 * BF16_ULP, &dpre, "linear_act_backward bf16 dpre fn=%d N=%d IC=%d OC=%d", (int)fn, N, IC, OC);
    // (sums of N bf16 values that may each differ by a unit: sqrt(N) units of a typical |dpre|)
    if (with_bias) checkf(0.5, 1e-2, &db, "linear_act_backward bf16 dbias fn=%d N=%d IC=%d", (int)fn, N, IC);
    bpair *bp[] = {&inp, &w, &out, &pre, &dout, &x, &dpre};
    for (size_t i = 0; i < sizeof bp / sizeof *bp; i++) bpair_free(bp[i]);
    pair_free(&b);
    pair_free(&db);
}

// Attention on bf16 q, k, v, out, dout and gradients, with bf16 operands (the model's bf16 precision:
// the tensor-core kernels or cuDNN against the CPU reference): the tolerances of the bf16-operand
// fp32-stored case (test_attention_full) plus the final rounding's unit.
static void test_bf16_attention(int B, int T, int NH, int NKV, int HS) {
    size_t nq = (size_t)B * NH * T * HS, nkv = (size_t)B * NKV * T * HS;
    bpair q = bpair_uniform(nq, -2.0f, 2.0f), k = bpair_uniform(nkv, -2.0f, 2.0f), v = bpair_rand(nkv);
    bpair out = bpair_rand(nq), dout = bpair_rand(nq), dq = bpair_rand(nq), dk = bpair_rand(nkv), dv = bpair_rand(nkv);
    pair lse = pair_rand((size_t)B * NH * T);
    neox_attention_opts o = {.scale = 1.0f / sqrtf((float)HS), .operands = NEOX_ELEM_BF16};
    cpu->attention_forward(out.h, lse.h, q.h, k.h, v.h, B, T, NH, NKV, HS, o, NEOX_ELEM_BF16);
    gpu->attention_forward(out.d, lse.d, q.d, k.d, v.d, B, T, NH, NKV, HS, o, NEOX_ELEM_BF16);
    bcheckf(3 * BF16_ULP, 3 * BF16_ULP, &out, "attention_forward bf16 storage%s B=%d T=%d NH=%d NKV=%d HS=%d",
            g_att_path, B, T, NH, NKV, HS);
    checkf(1e-4, 1e-5, &lse, "attention_forward bf16 storage%s lse B=%d T=%d NH=%d NKV=%d HS=%d", g_att_path, B, T, NH,
           NKV, HS);
    gpu->to_device(out.d, out.h, nq * sizeof(uint16_t));  // both backwards from the CPU's out and lse
    gpu->to_device(lse.d, lse.h, lse.n * sizeof(float));
    neox_elem e = NEOX_ELEM_BF16;
    cpu->attention_backward(dq.h, dk.h, dv.h, dout.h, q.h, k.h, v.h, out.h, lse.h, B, T, NH, NKV, HS, o, e);
    gpu->attention_backward(dq.d, dk.d, dv.d, dout.d, q.d, k.d, v.d, out.d, lse.d, B, T, NH, NKV, HS, o, e);
    const char *fmt = "attention_backward bf16 storage%s %s B=%d T=%d NH=%d NKV=%d HS=%d";
    bcheckf(5 * BF16_ULP, 5 * BF16_ULP, &dq, fmt, g_att_path, "dq", B, T, NH, NKV, HS);
    bcheckf(5 * BF16_ULP, 5 * BF16_ULP, &dk, fmt, g_att_path, "dk", B, T, NH, NKV, HS);
    bcheckf(5 * BF16_ULP, 5 * BF16_ULP, &dv, fmt, g_att_path, "dv", B, T, NH, NKV, HS);
    bpair *all[] = {&q, &k, &v, &out, &dout, &dq, &dk, &dv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) bpair_free(all[i]);
    pair_free(&lse);
}

// The model's fused route through the op table: rotary in place on q and k in the fused QKV buffer,
// attention reading q, k, v through its views (opts.views from neox_qkv_fused_layout), its backward
// writing dq, dk, dv into dqkv's views (every element: dqkv starts as other values on each side),
// rotary backward in place. GPU against the CPU on the same views (the CPU's views equal its split
// route bit for bit: tests/unit/test_qkv_views.c). act: fp32 or bf16 storage of qkv, out, dout, dqkv;
// the backwards both start from the CPU's out and lse. Which GPU kernels run follows the entry's rule
// (kernels/cuda/attention.cu): cuDNN or the pipelined kernels in place when the storage is the operand
// type, else a split into scratch.
typedef struct views_case {
    int B, T, NH, NKV, HS, interleaved;
    float dropout;
    neox_elem act, operands;
} views_case;

static void run_views_forward(const neox_backend *be, void *qkv, void *out, float *lse, const float *cs,
                              const float *sn, const views_case *c, neox_attention_opts o) {
    size_t es = neox_elem_size(c->act);
    neox_qkv_layout l = neox_qkv_fused_layout(c->T, c->NH, c->NKV, c->HS, c->interleaved);
    char *x = qkv, *q = x + l.q_offset * es, *k = x + l.k_offset * es, *v = x + l.v_offset * es;
    be->rotary_apply(q, cs, sn, c->B, c->NH, c->T, c->HS, c->HS / 2, 0, c->act, l.strides.q);
    be->rotary_apply(k, cs, sn, c->B, c->NKV, c->T, c->HS, c->HS / 2, 0, c->act, l.strides.k);
    be->attention_forward(out, lse, q, k, v, c->B, c->T, c->NH, c->NKV, c->HS, o, c->act);
}

static void run_views_backward(const neox_backend *be, void *dqkv, const void *qkv, const void *dout, const void *out,
                               const float *lse, const float *cs, const float *sn, const views_case *c,
                               neox_attention_opts o) {
    size_t es = neox_elem_size(c->act);
    neox_qkv_layout l = neox_qkv_fused_layout(c->T, c->NH, c->NKV, c->HS, c->interleaved);
    const char *x = qkv;
    char *d = dqkv, *dq = d + l.q_offset * es, *dk = d + l.k_offset * es, *dv = d + l.v_offset * es;
    be->attention_backward(dq, dk, dv, dout, x + l.q_offset * es, x + l.k_offset * es, x + l.v_offset * es, out, lse,
                           c->B, c->T, c->NH, c->NKV, c->HS, o, c->act);
    be->rotary_apply(dq, cs, sn, c->B, c->NH, c->T, c->HS, c->HS / 2, 1, c->act, l.strides.q);
    be->rotary_apply(dk, cs, sn, c->B, c->NKV, c->T, c->HS, c->HS / 2, 1, c->act, l.strides.k);
}

// One device tensor of n values stored as act, the same values on the host (fp32 or bf16 bits).
typedef struct { void *h, *d; size_t n; neox_elem act; } apair;
static apair apair_uniform(size_t n, float lo, float hi, neox_elem act) {
    pair p = pair_uniform(n, lo, hi);
    apair a = {p.h, gpu->alloc(n * neox_elem_size(act)), n, act};
    if (act == NEOX_ELEM_BF16) {
        a.h = xmalloc(n * sizeof(uint16_t));
        neox_cast_f32_to_bf16(a.h, p.h, n);
        free(p.h);
    }
    gpu->to_device(a.d, a.h, n * neox_elem_size(act));
    gpu->free(p.d);
    return a;
}
static void apair_free(apair *a) { free(a->h), gpu->free(a->d); }
// The device values against the host's, within atol + rtol |host| (both widened to fp32).
static void acheck(double atol, double rtol, const apair *a, const char *what, const views_case *c) {
    float *want = xmalloc(a->n * sizeof(float)), *got = xmalloc(a->n * sizeof(float));
    void *dev = xmalloc(a->n * neox_elem_size(a->act));
    gpu->to_host(dev, a->d, a->n * neox_elem_size(a->act));
    if (a->act == NEOX_ELEM_BF16) neox_cast_bf16_to_f32(want, a->h, a->n), neox_cast_bf16_to_f32(got, dev, a->n);
    else memcpy(want, a->h, a->n * sizeof(float)), memcpy(got, dev, a->n * sizeof(float));
    char name[200];
    snprintf(name, sizeof name, "attention views %s interleaved=%d B=%d T=%d NH=%d NKV=%d HS=%d dropout=%g act=%d "
             "operands=%d", what, c->interleaved, c->B, c->T, c->NH, c->NKV, c->HS, c->dropout, c->act, c->operands);
    compare(name, want, got, a->n, atol, rtol);
    free(want), free(got), free(dev);
}

static void test_attention_views(views_case c) {
    size_t nq = (size_t)c.B * c.NH * c.T * c.HS, nall = (size_t)c.B * c.T * (c.NH + 2 * c.NKV) * c.HS;
    size_t es = neox_elem_size(c.act);
    int half = c.HS / 4;  // rotary on half of each head
    double unit = c.operands == NEOX_ELEM_F32 ? 1e-5 : c.operands == NEOX_ELEM_BF16 ? 1.0 / 128 : 1.0 / 1024;
    double store = c.act == NEOX_ELEM_BF16 ? BF16_ULP : 0.0, fwd = 3 * unit + store, bwd = 5 * unit + store;
    apair qkv = apair_uniform(nall, -2.0f, 2.0f, c.act), out = apair_uniform(nq, -1.0f, 1.0f, c.act);
    apair dout = apair_uniform(nq, -1.0f, 1.0f, c.act), dqkv = apair_uniform(nall, -1.0f, 1.0f, c.act);
    pair lse = pair_rand((size_t)c.B * c.NH * c.T), cs = pair_rand((size_t)c.T * half), sn = pair_rand(cs.n);
    cpu->rotary_tables(cs.h, sn.h, c.T, 2 * half, 10000.0, (neox_rope_scaling){.kind = NEOX_ROPE_DEFAULT});
    gpu->to_device(cs.d, cs.h, cs.n * sizeof(float)), gpu->to_device(sn.d, sn.h, sn.n * sizeof(float));
    neox_attention_opts o = {.scale = 1.0f / sqrtf((float)c.HS), .dropout = c.dropout, .seed = 77,
                             .operands = c.operands};
    o.views = neox_qkv_fused_layout(c.T, c.NH, c.NKV, c.HS, c.interleaved).strides;
    run_views_forward(cpu, qkv.h, out.h, lse.h, cs.h, sn.h, &c, o);
    run_views_forward(gpu, qkv.d, out.d, lse.d, cs.d, sn.d, &c, o);
    acheck(1e-5 + store, 1e-5 + store, &qkv, "rotary in place", &c);
    acheck(fwd, fwd, &out, "forward", &c);
    checkf(1e-4, 1e-5, &lse, "attention views forward lse B=%d T=%d NH=%d NKV=%d HS=%d", c.B, c.T, c.NH, c.NKV, c.HS);
    gpu->to_device(qkv.d, qkv.h, nall * es);  // the backwards from the CPU's rotated qkv, out and lse
    gpu->to_device(out.d, out.h, nq * es), gpu->to_device(lse.d, lse.h, lse.n * sizeof(float));
    run_views_backward(cpu, dqkv.h, qkv.h, dout.h, out.h, lse.h, cs.h, sn.h, &c, o);
    run_views_backward(gpu, dqkv.d, qkv.d, dout.d, out.d, lse.d, cs.d, sn.d, &c, o);
    acheck(bwd, bwd, &dqkv, "backward dqkv", &c);
    apair *all[] = {&qkv, &out, &dout, &dqkv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) apair_free(all[i]);
    pair_free(&lse), pair_free(&cs), pair_free(&sn);
}

// The fused views on every route: in place (bf16 storage, bf16 operands: cuDNN without dropout, the
// pipelined kernels with it), split into scratch (fp32 storage with 16-bit or fp32 operands), GQA, MQA.
static void attention_views_cases(void) {
    const neox_elem F32 = NEOX_ELEM_F32, BF16 = NEOX_ELEM_BF16;
    test_attention_views((views_case){2, 150, 4, 4, 64, 1, 0.0f, BF16, BF16});   // GPT-NeoX's layout, in place
    test_attention_views((views_case){1, 200, 6, 2, 128, 0, 0.0f, BF16, BF16});  // Llama's layout, GQA
    test_attention_views((views_case){1, 130, 4, 4, 64, 1, 0.1f, BF16, BF16});   // dropout: own kernels in place
    test_attention_views((views_case){1, 97, 4, 1, 32, 0, 0.0f, F32, BF16});     // fp32 storage: split, MQA
    test_attention_views((views_case){2, 70, 4, 2, 16, 0, 0.1f, F32, F32});      // fp32 kernels: split
}

static void test_bf16_norm(int N, int C, int rms) {
    const char *name = rms ? "rmsnorm" : "layernorm";
    bpair inp = bpair_uniform((size_t)N * C, -2.0f, 3.0f), out = bpair_rand((size_t)N * C);
    pair w = pair_uniform(C, 0.5f, 1.5f), b = pair_rand(C), mean = pair_rand(N), rstd = pair_rand(N);
    if (rms) {
        cpu->rmsnorm_forward(out.h, rstd.h, inp.h, w.h, N, C, 1e-6f, NEOX_ELEM_BF16);
        gpu->rmsnorm_forward(out.d, rstd.d, inp.d, w.d, N, C, 1e-6f, NEOX_ELEM_BF16);
    } else {
        cpu->layernorm_forward(out.h, mean.h, rstd.h, inp.h, w.h, b.h, N, C, 1e-5f, NEOX_ELEM_BF16);
        gpu->layernorm_forward(out.d, mean.d, rstd.d, inp.d, w.d, b.d, N, C, 1e-5f, NEOX_ELEM_BF16);
        checkf(1e-6, 1e-6, &mean, "layernorm_forward bf16 mean N=%d C=%d", N, C);
    }
    bcheckf(1e-5, BF16_ULP, &out, "%s_forward bf16 N=%d C=%d", name, N, C);
    checkf(0, 1e-6, &rstd, "%s_forward bf16 rstd N=%d C=%d", name, N, C);
    pair m = pair_from(mean.h, N), r = pair_from(rstd.h, N), dw = pair_rand(C), db = pair_rand(C), ds = pair_rand(C);
    bpair dout = bpair_rand((size_t)N * C), dinp = bpair_rand((size_t)N * C);
    float *ds0 = xmalloc((size_t)C * sizeof(float));
    memcpy(ds0, ds.h, (size_t)C * sizeof(float));
    if (rms) {
        cpu->rmsnorm_backward(dinp.h, dw.h, ds.h, dout.h, inp.h, w.h, r.h, N, C, NEOX_ELEM_BF16);
        gpu->rmsnorm_backward(dinp.d, dw.d, ds.d, dout.d, inp.d, w.d, r.d, N, C, NEOX_ELEM_BF16);
    } else {
        cpu->layernorm_backward(dinp.h, dw.h, db.h, ds.h, dout.h, inp.h, w.h, m.h, r.h, N, C, NEOX_ELEM_BF16);
        gpu->layernorm_backward(dinp.d, dw.d, db.d, ds.d, dout.d, inp.d, w.d, m.d, r.d, N, C, NEOX_ELEM_BF16);
        checkf(1e-4, 1e-5, &db, "layernorm_backward bf16 dbias N=%d C=%d", N, C);
    }
    bcheckf(1e-4, BF16_ULP, &dinp, "%s_backward bf16 dinp N=%d C=%d", name, N, C);
    checkf(1e-4, 1e-5, &dw, "%s_backward bf16 dweight N=%d C=%d", name, N, C);
    // dsum against the column sums of the device's own dinp as stored (the two backends' dinp may be
    // a bf16 ulp apart), from the value both started at, by the linear layer's bias gradient.
    uint16_t *got = xmalloc((size_t)N * C * sizeof(uint16_t));
    gpu->to_host(got, dinp.d, (size_t)N * C * sizeof(uint16_t));
    memcpy(ds.h, ds0, (size_t)C * sizeof(float));
    cpu->linear_backward(NULL, NULL, ds.h, got, C, NULL, NULL, N, C, C, 0, NEOX_ELEM_BF16);
    checkf(1e-5, 1e-5, &ds, "%s_backward bf16 dsum N=%d C=%d", name, N, C);
    free(got);
    free(ds0);
    // The add with b's bias (b_bias), then the same with the sum alone (out NULL).
    bpair a = bpair_rand((size_t)N * C), sum = bpair_rand((size_t)N * C), sum2 = bpair_rand((size_t)N * C);
    if (rms) {
        cpu->add_rmsnorm_forward(sum.h, out.h, rstd.h, a.h, inp.h, b.h, w.h, N, C, 1e-6f, NEOX_ELEM_BF16);
        gpu->add_rmsnorm_forward(sum.d, out.d, rstd.d, a.d, inp.d, b.d, w.d, N, C, 1e-6f, NEOX_ELEM_BF16);
        cpu->add_rmsnorm_forward(sum2.h, NULL, NULL, a.h, inp.h, b.h, NULL, N, C, 1e-6f, NEOX_ELEM_BF16);
        gpu->add_rmsnorm_forward(sum2.d, NULL, NULL, a.d, inp.d, b.d, NULL, N, C, 1e-6f, NEOX_ELEM_BF16);
    } else {
        cpu->add_layernorm_forward(sum.h, out.h, mean.h, rstd.h, a.h, inp.h, b.h, w.h, b.h, N, C, 1e-5f, NEOX_ELEM_BF16);
        gpu->add_layernorm_forward(sum.d, out.d, mean.d, rstd.d, a.d, inp.d, b.d, w.d, b.d, N, C, 1e-5f, NEOX_ELEM_BF16);
        cpu->add_layernorm_forward(sum2.h, NULL, NULL, NULL, a.h, inp.h, b.h, NULL, NULL, N, C, 1e-5f, NEOX_ELEM_BF16);
        gpu->add_layernorm_forward(sum2.d, NULL, NULL, NULL, a.d, inp.d, b.d, NULL, NULL, N, C, 1e-5f, NEOX_ELEM_BF16);
    }
    bcheckf(0, 0, &sum, "add_%s_forward bf16 sum N=%d C=%d", name, N, C);
    bcheckf(1e-5, BF16_ULP, &out, "add_%s_forward bf16 out N=%d C=%d", name, N, C);
    bcheckf(0, 0, &sum2, "add_%s_forward bf16 sum alone N=%d C=%d", name, N, C);
    bpair *bf[] = {&inp, &out, &dout, &dinp, &a, &sum, &sum2};
    for (size_t i = 0; i < sizeof bf / sizeof *bf; i++) bpair_free(bf[i]);
    pair *all[] = {&w, &b, &mean, &rstd, &m, &r, &dw, &db, &ds};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(all[i]);
}

// One rounding each (or none): the GPU must give the CPU's bits.
static void test_elementwise(int N, int C) {
    size_t n = (size_t)N * C;
    pair a = pair_rand(n), b = pair_rand(n), out = pair_rand(n), bias = pair_rand(C);
    cpu->add(out.h, a.h, b.h, n, NEOX_ELEM_F32);
    gpu->add(out.d, a.d, b.d, n, NEOX_ELEM_F32);
    checkf(0, 0, &out, "add n=%zu", n);
    cpu->add_inplace(a.h, b.h, n);
    gpu->add_inplace(a.d, b.d, n);
    checkf(0, 0, &a, "add_inplace n=%zu", n);
    cpu->add_bias(a.h, bias.h, N, C, NEOX_ELEM_F32);
    gpu->add_bias(a.d, bias.d, N, C, NEOX_ELEM_F32);
    checkf(0, 0, &a, "add_bias N=%d C=%d", N, C);
    cpu->dropout(out.h, a.h, n, 0.1f, 77, 1000, NULL, 0, NEOX_ELEM_F32);
    gpu->dropout(out.d, a.d, n, 0.1f, 77, 1000, NULL, 0, NEOX_ELEM_F32);
    checkf(0, 0, &out, "dropout n=%zu p=0.1 (the same mask)", n);
    unsigned long long row = 2, *row_d = gpu->alloc(sizeof row);  // the row read on the device (a replayed step's)
    gpu->to_device(row_d, &row, sizeof row);
    cpu->dropout(out.h, a.h, n, 0.1f, 77, 400, &row, 300, NEOX_ELEM_F32);
    gpu->dropout(out.d, a.d, n, 0.1f, 77, 400, row_d, 300, NEOX_ELEM_F32);
    checkf(0, 0, &out, "dropout n=%zu p=0.1, its row read on the device", n);
    gpu->free(row_d);
    cpu->dropout(a.h, a.h, n, 0.5f, 78, 0, NULL, 0, NEOX_ELEM_F32);  // in place, as the backward uses it
    gpu->dropout(a.d, a.d, n, 0.5f, 78, 0, NULL, 0, NEOX_ELEM_F32);
    checkf(0, 0, &a, "dropout in place n=%zu p=0.5", n);
    cpu->scale(b.h, n, 0.37f);
    gpu->scale(b.d, n, 0.37f);
    checkf(0, 0, &b, "scale n=%zu", n);
    pair *all[] = {&a, &b, &out, &bias};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(all[i]);
}

// ---- loss ----------------------------------------------------------------------------------------------

static void test_cross_entropy(int N, int V) {
    pair logits = pair_uniform((size_t)N * V, -8.0f, 8.0f), losses = pair_rand(N), lse = pair_rand(N);
    pair mx = pair_rand(N), weight = pair_uniform(N, 0.0f, 1.0f);
    int *t = xmalloc((size_t)N * sizeof(int));
    for (int i = 0; i < N; i++) t[i] = (int)(neox_uniform(5, draw++) * V);
    t[0] = -1;                 // positions that are not scored: loss 0 on both
    if (N > 2) t[N / 2] = V;
    ipair tv = ipair_from(t, N);
    cpu->cross_entropy_forward(losses.h, lse.h, logits.h, tv.h, N, V, NEOX_ELEM_F32);
    gpu->cross_entropy_forward(losses.d, lse.d, logits.d, tv.d, N, V, NEOX_ELEM_F32);
    checkf(1e-5, 1e-5, &losses, "cross_entropy_forward losses N=%d V=%d", N, V);
    checkf(1e-5, 1e-6, &lse, "cross_entropy_forward lse N=%d V=%d", N, V);
    cpu->cross_entropy_row_max(mx.h, logits.h, N, V, NEOX_ELEM_F32);
    gpu->cross_entropy_row_max(mx.d, logits.d, N, V, NEOX_ELEM_F32);
    checkf(0, 0, &mx, "cross_entropy_row_max N=%d V=%d", N, V);
    double *sh = xmalloc((size_t)N * sizeof(double)), *sd = gpu->alloc((size_t)N * sizeof(double));
    double *sg = xmalloc((size_t)N * sizeof(double));
    cpu->cross_entropy_row_sumexp(sh, logits.h, mx.h, N, V, NEOX_ELEM_F32);
    gpu->cross_entropy_row_sumexp(sd, logits.d, mx.d, N, V, NEOX_ELEM_F32);
    gpu->to_host(sg, sd, (size_t)N * sizeof(double));
    float *sumh = xmalloc((size_t)N * sizeof(float)), *sumg = xmalloc((size_t)N * sizeof(float));
    for (int i = 0; i < N; i++) {
        sumh[i] = (float)sh[i];
        sumg[i] = (float)sg[i];
    }
    char name[96];
    snprintf(name, sizeof name, "cross_entropy_row_sumexp N=%d V=%d", N, V);
    compare(name, sumh, sumg, N, 0, 1e-6);  // expf differs by ulps per term; sums in double
    free(sumh);
    free(sumg);
    // Backward in place (dlogits = logits) with a loss mask and targets on other ranks (-1, V + 2).
    t[0] = -1;
    if (N > 1) t[N - 1] = V + 2;
    ipair tb = ipair_from(t, N);
    pair l = pair_from(lse.h, N);
    weight.h[N / 2] = 0.0f;
    gpu->to_device(weight.d, weight.h, (size_t)N * sizeof(float));
    cpu->cross_entropy_backward(logits.h, logits.h, l.h, tb.h, weight.h, 1.0f / N, NULL, N, V, NEOX_ELEM_F32);
    gpu->cross_entropy_backward(logits.d, logits.d, l.d, tb.d, weight.d, 1.0f / N, NULL, N, V, NEOX_ELEM_F32);
    checkf(1e-7, 1e-5, &logits, "cross_entropy_backward in place, masked, targets off-rank N=%d V=%d", N, V);
    pair *all[] = {&logits, &losses, &lse, &mx, &weight, &l};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(all[i]);
    ipair_free(&tv);
    ipair_free(&tb);
    free(t);
    free(sh);
    free(sg);
    gpu->free(sd);
}

// Doubles compared as floats (the statistics in double: their sums' order differs).
static void compare_doubles(const char *name, const double *ref, const double *got_d, int n, double rtol) {
    double *got = xmalloc((size_t)n * sizeof(double));
    float *rf = xmalloc((size_t)n * sizeof(float)), *gf = xmalloc((size_t)n * sizeof(float));
    gpu->to_host(got, got_d, (size_t)n * sizeof(double));
    for (int i = 0; i < n; i++) rf[i] = (float)ref[i], gf[i] = (float)got[i];
    compare(name, rf, gf, n, 0, rtol);
    free(got), free(rf), free(gf);
}

// The fused loss and gradient in one pass, with fp32, bf16 or fp16 logits (rounded by each side's own
// cast), a weighted mask and targets off the vocabulary: the statistics as the separate ops', dlogits
// to a unit of the logits' precision; then the vocab-parallel second phase from the CPU's statistics.
// V = 50304 holds the row in shared memory on an H100 (fp32: 196 KiB), 300000 does not (re-read).
static void test_cross_entropy_fused(int N, int V, neox_elem e) {
    size_t n = (size_t)N * V, bytes = n * (e == NEOX_ELEM_F32 ? 4 : 2);
    const char *tn = e == NEOX_ELEM_F32 ? "fp32" : e == NEOX_ELEM_BF16 ? "bf16" : "fp16";
    pair logits = pair_uniform(n, -8.0f, 8.0f), weight = pair_uniform(N, 0.0f, 1.0f), mx = pair_rand(N);
    weight.h[0] = 0.0f;
    gpu->to_device(weight.d, weight.h, (size_t)N * sizeof(float));
    int *t = xmalloc((size_t)N * sizeof(int));
    for (int i = 0; i < N; i++) t[i] = (int)(neox_uniform(6, draw++) * V);
    if (N > 1) t[1] = -1, t[N - 1] = V + 2;
    ipair tv = ipair_from(t, N);
    void *zh = xmalloc(bytes), *zd = gpu->alloc(bytes);
    double *stats = xmalloc(2 * (size_t)N * sizeof(double)), *sd = gpu->alloc(2 * (size_t)N * sizeof(double));
    float scale = 0.5f / N, *scale_d = gpu->alloc(sizeof scale);  // the GPU's read on the device (a replayed step's)
    gpu->to_device(scale_d, &scale, sizeof scale);
    for (int phase = 0; phase < 2; phase++) {
        if (e == NEOX_ELEM_F32) memcpy(zh, logits.h, bytes), gpu->copy(zd, logits.d, bytes);
        else if (e == NEOX_ELEM_BF16) cpu->cast_f32_to_bf16(zh, logits.h, n), gpu->cast_f32_to_bf16(zd, logits.d, n);
        else cpu->cast_f32_to_f16(zh, logits.h, n), gpu->cast_f32_to_f16(zd, logits.d, n);
        if (phase == 1) {  // the CPU's statistics as the reduced inputs of both
            gpu->to_device(mx.d, mx.h, (size_t)N * sizeof(float));
            gpu->to_device(sd, stats, (size_t)N * sizeof(double));
        }
        cpu->cross_entropy_fused(zh, e, mx.h, stats, stats + N, tv.h, weight.h, 0.5f / N, NULL, N, V, phase);
        gpu->cross_entropy_fused(zd, e, mx.d, sd, sd + N, tv.d, weight.d, -1.0f, scale_d, N, V, phase);
        char name[128];
        if (phase == 0) {
            checkf(0, 0, &mx, "cross_entropy_fused row max %s N=%d V=%d", tn, N, V);
            snprintf(name, sizeof name, "cross_entropy_fused sums of exponentials %s N=%d V=%d", tn, N, V);
            compare_doubles(name, stats, sd, N, 1e-6);
            snprintf(name, sizeof name, "cross_entropy_fused target logits %s N=%d V=%d", tn, N, V);
            compare_doubles(name, stats + N, sd + N, N, 0);
        }
        pair d = pair_zero(n);  // dlogits widened to fp32 on both sides
        if (e == NEOX_ELEM_F32) memcpy(d.h, zh, bytes), gpu->copy(d.d, zd, bytes);
        else if (e == NEOX_ELEM_BF16) cpu->cast_bf16_to_f32(d.h, zh, n), gpu->cast_bf16_to_f32(d.d, zd, n);
        else cpu->cast_f16_to_f32(d.h, zh, n), gpu->cast_f16_to_f32(d.d, zd, n);
        double rtol = e == NEOX_ELEM_F32 ? 1e-5 : e == NEOX_ELEM_BF16 ? 1.0 / 128 : 1.0 / 1024;
        checkf(1e-9, rtol, &d, "cross_entropy_fused dlogits %s%s N=%d V=%d", tn, phase ? " (stats given)" : "", N, V);
        pair_free(&d);
    }
    pair *all[] = {&logits, &weight, &mx};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(all[i]);
    ipair_free(&tv);
    free(t), free(zh), free(stats);
    gpu->free(zd), gpu->free(sd), gpu->free(scale_d);
}

// The loss assembled on the device from the same row maxima and (2, N) statistics on both sides, with
// a loss mask of zeros and fractions: lse to log's ulps, the two double sums to their order.
static void test_cross_entropy_loss(int N) {
    pair mx = pair_uniform(N, -3.0f, 8.0f), mask = pair_uniform(N, 0.0f, 1.0f), lse = pair_rand(N);
    mask.h[0] = 0.0f;
    gpu->to_device(mask.d, mask.h, (size_t)N * sizeof(float));
    double *stats = xmalloc(2 * (size_t)N * sizeof(double)), *sd = gpu->alloc(2 * (size_t)N * sizeof(double));
    for (int i = 0; i < N; i++) {
        stats[i] = 1.0 + 5e4 * neox_uniform(21, draw++);         // a sum of exponentials: at least the max's 1
        stats[N + i] = mx.h[i] - 12.0 * neox_uniform(22, draw++);  // a target logit below the max
    }
    gpu->to_device(sd, stats, 2 * (size_t)N * sizeof(double));
    double want[2], got[2], *ld = gpu->alloc(sizeof got);
    cpu->cross_entropy_loss(lse.h, want, mx.h, stats, mask.h, N);
    gpu->cross_entropy_loss(lse.d, ld, mx.d, sd, mask.d, N);
    gpu->to_host(got, ld, sizeof got);
    checkf(1e-6, 1e-6, &lse, "cross_entropy_loss lse N=%d", N);
    compare_scalar("cross_entropy_loss masked sum", want[0], got[0], 1e-12);
    compare_scalar("cross_entropy_loss mask sum", want[1], got[1], 1e-12);
    gpu->free(sd);
    gpu->free(ld);
    free(stats);
    pair *all[] = {&mx, &mask, &lse};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(all[i]);
}

// ---- optimizer --------------------------------------------------------------------------------------

static const neox_step_scalars *scalars_on(const neox_backend *be, float lr, long step);

// Lion and SGD (explicitly rounded in the CPU's order: bit-exact expected; the learning rate, SGD's
// first step and the guard read on the device) and MADGRAD (powf's cube root is not exactly rounded on
// either side: 1e-5) over segments with gaps, 3 steps each; MADGRAD with and without momentum (x0
// stored by the first step, or unused).
static void test_lion_madgrad(size_t n, const neox_segment *segs, int nseg) {
    pair p = pair_rand(n), g = pair_rand(n), m = pair_uniform(n, -0.1f, 0.1f);
    double finite = 1.0, inf = INFINITY, *guard = gpu->alloc(sizeof(double));
    gpu->to_device(guard, &finite, sizeof finite);
    for (int step = 1; step <= 3; step++) {
        cpu->lion_segments(p.h, g.h, m.h, segs, nseg, scalars_on(cpu, 1e-4f * step, step), 0.9f, 0.99f, &finite);
        gpu->lion_segments(p.d, g.d, m.d, segs, nseg, scalars_on(gpu, 1e-4f * step, step), 0.9f, 0.99f, guard);
    }
    checkf(0, 1e-6, &p, "lion_segments param (%d segments, gaps untouched)", nseg);
    checkf(0, 1e-6, &m, "lion_segments exp_avg");
    for (int step = 1; step <= 3; step++) {  // SGD with momentum: the buffer starts as the first step's d
        cpu->sgd_segments(p.h, g.h, m.h, segs, nseg, scalars_on(cpu, 1e-3f * step, step), 0.9f, NULL);
        gpu->sgd_segments(p.d, g.d, m.d, segs, nseg, scalars_on(gpu, 1e-3f * step, step), 0.9f, guard);
    }
    checkf(0, 0, &p, "sgd_segments param (%d segments, momentum, guard finite)", nseg);
    checkf(0, 0, &m, "sgd_segments momentum buffer");
    gpu->to_device(guard, &inf, sizeof inf);  // an overflow's guard: neither touches anything
    gpu->sgd_segments(p.d, g.d, m.d, segs, nseg, scalars_on(gpu, 1e-3f, 4), 0.9f, guard);
    gpu->lion_segments(p.d, g.d, m.d, segs, nseg, scalars_on(gpu, 1e-4f, 4), 0.9f, 0.99f, guard);
    checkf(0, 0, &p, "sgd_segments and lion_segments guard inf: param untouched");
    checkf(0, 0, &m, "sgd_segments and lion_segments guard inf: state untouched");
    gpu->free(guard);
    for (int with_momentum = 1; with_momentum >= 0; with_momentum--) {
        pair sq = pair_zero(n), s = pair_zero(n), x0 = pair_zero(n);
        float momentum = with_momentum ? 0.9f : 0.0f;
        for (int step = 1; step <= 3; step++) {
            float lr_eps = 1e-2f + 1e-6f, lamb = lr_eps * sqrtf((float)step);
            cpu->madgrad_segments(p.h, g.h, sq.h, s.h, x0.h, segs, nseg, lr_eps, lamb, momentum, 1e-6f, step == 1);
            gpu->madgrad_segments(p.d, g.d, sq.d, s.d, x0.d, segs, nseg, lr_eps, lamb, momentum, 1e-6f, step == 1);
        }
        checkf(0, 1e-5, &p, "madgrad_segments param, momentum %g", momentum);
        checkf(0, 1e-5, &sq, "madgrad_segments grad_sum_sq");
        checkf(0, 1e-5, &s, "madgrad_segments s");
        checkf(0, 1e-6, &x0, "madgrad_segments x0");
        pair *state[] = {&sq, &s, &x0};
        for (size_t i = 0; i < 3; i++) pair_free(state[i]);
    }
    pair *all[] = {&p, &g, &m};
    for (size_t i = 0; i < 3; i++) pair_free(all[i]);
}

// SM3 over a matrix (40 x 37) whole, a vector (200) from its element 20, and a matrix (64 x 100)
// from the middle of its row 3: 3 steps, the accumulators' maxima formed in acc_next (zeroed for
// sums, a copy of acc with beta) and swapped in, as lib/optim/sm3.c steps them. The GPU takes its
// maxima with atomics and may contract into FMAs: 1e-5.
static void test_sm3(void) {
    enum { N = 8080, NACC = 441 };
    neox_sm3_segment segs[] = {
        {.begin = 0, .end = 1480, .first = 0, .cols = 37, .row_acc = 0, .col_acc = 40},
        {.begin = 1500, .end = 1680, .first = 20, .cols = 1, .row_acc = 77, .col_acc = NEOX_SM3_NO_COLS},
        {.begin = 2000, .end = 8080, .first = 320, .cols = 100, .row_acc = 277, .col_acc = 341},
    };
    float settings[2][2] = {{0.0f, 0.0f}, {0.9f, 0.5f}};  // momentum, beta
    for (int k = 0; k < 2; k++) {
        float momentum = settings[k][0], beta = settings[k][1];
        pair p = pair_rand(N), g = pair_rand(N), m = pair_zero(N), acc = pair_zero(NACC), next = pair_zero(NACC);
        for (int step = 1; step <= 3; step++) {
            if (beta > 0.0f) {
                cpu->copy(next.h, acc.h, NACC * sizeof(float));
                gpu->copy(next.d, acc.d, NACC * sizeof(float));
            } else {
                cpu->memset_zero(next.h, NACC * sizeof(float));
                gpu->memset_zero(next.d, NACC * sizeof(float));
            }
            cpu->sm3_segments(p.h, g.h, m.h, acc.h, next.h, segs, 3, 1e-2f * step, momentum, beta, 1e-30f);
            gpu->sm3_segments(p.d, g.d, m.d, acc.d, next.d, segs, 3, 1e-2f * step, momentum, beta, 1e-30f);
            pair old = acc;
            acc = next, next = old;
        }
        checkf(0, 1e-5, &p, "sm3_segments param, momentum %g, beta %g (gaps untouched)", momentum, beta);
        checkf(0, 1e-5, &m, "sm3_segments momentum_buffer");
        checkf(0, 1e-5, &acc, "sm3_segments row and column accumulators");
        pair *all[] = {&p, &g, &m, &acc, &next};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(all[i]);
    }
}

// AdamW's learning rate and step as the segmented update reads them: in the backend's memory (the
// GPU's one block, rewritten by each call; the ops before have read it, in stream order).
static const neox_step_scalars *scalars_on(const neox_backend *be, float lr, long step) {
    static neox_step_scalars host, *dev;
    host = (neox_step_scalars){.lr = lr, .step = step};
    if (!be->on_device) return &host;
    if (!dev) dev = be->alloc(sizeof *dev);
    be->to_device(dev, &host, sizeof host);
    return dev;
}
static void test_optimizer(size_t n) {
    pair x = pair_rand(n);
    compare_scalar("sum_squares", cpu->sum_squares(x.h, n), gpu->sum_squares(x.d, n), 1e-10);
    // Segments with gaps (elements outside every segment must not change) and an empty one.
    neox_segment segs[] = {{0, 100, 0.0f}, {150, 5000, 0.1f}, {5000, 5000, 0.1f}, {5001, 6000, 0.0f}, {6100, n, 0.01f}};
    int nseg = sizeof segs / sizeof *segs;
    compare_scalar("sum_squares_segments", cpu->sum_squares_segments(x.h, segs, nseg),
                   gpu->sum_squares_segments(x.d, segs, nseg), 1e-10);
    pair p = pair_rand(n), g = pair_rand(n), m = pair_uniform(n, -0.1f, 0.1f), v = pair_uniform(n, 0.0f, 0.01f);
    for (long step = 1; step <= 2; step++) {
        cpu->adamw(p.h, g.h, m.h, v.h, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
        gpu->adamw(p.d, g.d, m.d, v.d, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
    }
    // Explicitly rounded, in the CPU's order: expected bit-exact; 1e-6 leaves room for one ulp.
    checkf(0, 1e-6, &p, "adamw param n=%zu, 2 steps", n);
    checkf(0, 1e-6, &m, "adamw exp_avg n=%zu", n);
    checkf(0, 1e-6, &v, "adamw exp_avg_sq n=%zu", n);
    cpu->adamw_segments(p.h, g.h, m.h, v.h, segs, nseg, scalars_on(cpu, 3e-4f, 7), 0.9f, 0.999f, 1e-6f, 1.0f, NULL);
    gpu->adamw_segments(p.d, g.d, m.d, v.d, segs, nseg, scalars_on(gpu, 3e-4f, 7), 0.9f, 0.999f, 1e-6f, 1.0f, NULL);
    checkf(0, 1e-6, &p, "adamw_segments param (%d segments, gaps untouched)", nseg);
    checkf(0, 1e-6, &m, "adamw_segments exp_avg");
    checkf(0, 1e-6, &v, "adamw_segments exp_avg_sq");
    // 1-bit Adam: moments (then the compression phase's frozen variance, v NULL) and the update.
    cpu->adam_moments(m.h, v.h, g.h, n, 0.9f, 0.95f);
    gpu->adam_moments(m.d, v.d, g.d, n, 0.9f, 0.95f);
    cpu->adam_moments(m.h, NULL, x.h, n, 0.9f, 0.95f);
    gpu->adam_moments(m.d, NULL, x.d, n, 0.9f, 0.95f);
    checkf(0, 1e-6, &m, "adam_moments exp_avg (then v frozen)");
    checkf(0, 1e-6, &v, "adam_moments exp_avg_sq");
    cpu->onebit_adam_apply(p.h, m.h, v.h, n, 1e-3f, 1e-8f, 0.01f);
    gpu->onebit_adam_apply(p.d, m.d, v.d, n, 1e-3f, 1e-8f, 0.01f);
    checkf(0, 1e-6, &p, "onebit_adam_apply param");
    pair *all[] = {&x, &p, &g, &m, &v};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(all[i]);
    test_lion_madgrad(n, segs, nseg);
    test_sm3();
}

// ---- run-to-run determinism -----------------------------------------------------------------------

// The ops that reduce (sums over rows, tokens, queries) are written without atomics so that a GPU
// run repeats itself bit for bit (a bit-exact resume on the GPU needs it): each runs twice on the same
// inputs and the two results must be identical. outs are reset to their starting values before each run.
typedef void (*gpu_op)(void *ctx);

static void check_repeats(const char *name, gpu_op op, void *ctx, pair **outs, int nout) {
    float *first[8];
    for (int k = 0; k < nout; k++) first[k] = xmalloc(outs[k]->n * sizeof(float));
    for (int run = 0; run < 2; run++) {
        for (int k = 0; k < nout; k++) gpu->to_device(outs[k]->d, outs[k]->h, outs[k]->n * sizeof(float));
        op(ctx);
        for (int k = 0; k < nout; k++) {
            if (run == 0) { gpu->to_host(first[k], outs[k]->d, outs[k]->n * sizeof(float)); continue; }
            float *second = xmalloc(outs[k]->n * sizeof(float));
            gpu->to_host(second, outs[k]->d, outs[k]->n * sizeof(float));
            char full[160];
            snprintf(full, sizeof full, "repeatable: %s output %d", name, k);
            compare(full, first[k], second, outs[k]->n, 0, 0);
            free(second);
        }
    }
    for (int k = 0; k < nout; k++) free(first[k]);
}

// Context of the repeated ops: their shapes, inputs (in) and outputs (out).
typedef struct { int B, T, NH, NKV, HS, N, C; pair *in, *out; int *ids; neox_elem operands; float dropout; } rep_ctx;

static void rep_attention(void *p) {
    rep_ctx *c = p;
    pair *i = c->in, *o = c->out;  // in: q k v out lse dout; out: dq dk dv
    gpu->attention_backward(o[0].d, o[1].d, o[2].d, i[5].d, i[0].d, i[1].d, i[2].d, i[3].d, i[4].d, c->B, c->T, c->NH,
                            c->NKV, c->HS, (neox_attention_opts){.scale = 0.125f, .dropout = c->dropout, .seed = 9,
                                                  .operands = c->operands},
                            NEOX_ELEM_F32);
}
static void rep_layernorm(void *p) {  // in: dout x w mean rstd; out: dx dw db
    rep_ctx *c = p;
    pair *i = c->in, *o = c->out;
    gpu->layernorm_backward(o[0].d, o[1].d, o[2].d, NULL, i[0].d, i[1].d, i[2].d, i[3].d, i[4].d, c->N, c->C, NEOX_ELEM_F32);
}
static void rep_linear(void *p) {  // in: dout x w; out: dx dw db (square C x C weight)
    rep_ctx *c = p;
    pair *i = c->in, *o = c->out;
    gpu->linear_backward(o[0].d, o[1].d, o[2].d, i[0].d, c->C, i[1].d, i[2].d, c->N, c->C, c->C, 0, NEOX_ELEM_F32);
}
static void rep_embedding(void *p) {  // in: dout; out: dwte dwpe
    rep_ctx *c = p;
    gpu->embedding_backward(c->out[0].d, c->out[1].d, c->in[0].d, c->ids, c->B, c->T, c->C, NEOX_ELEM_F32);
}

static void free_pairs(pair *p, int n) {
    for (int i = 0; i < n; i++) pair_free(&p[i]);
}

// The attention backward's repeats: fp32 (with_rest), then bf16 with dropout on the own kernels (the
// first ones when with_rest, then the pipelined ones unless told not to, their backward as the single
// pass (its dq added by several key blocks in turn: T 300) and as the two passes), then bf16 without
// dropout on cuDNN (with_rest). GQA, T off the tiles.
static void test_attention_repeats(int with_rest) {
    rep_ctx c = {.B = 2, .T = 300, .NH = 6, .NKV = 2, .HS = 64};
    size_t nq = (size_t)c.B * c.NH * c.T * c.HS, nkv = (size_t)c.B * c.NKV * c.T * c.HS, nl = (size_t)c.B * c.NH * c.T;
    pair ai[6] = {pair_rand(nq), pair_rand(nkv), pair_rand(nkv), pair_rand(nq), pair_rand(nl), pair_rand(nq)};
    cpu->attention_forward(ai[3].h, ai[4].h, ai[0].h, ai[1].h, ai[2].h, c.B, c.T, c.NH, c.NKV, c.HS,
                           (neox_attention_opts){.scale = 0.125f, .dropout = 0.1f, .seed = 9, .operands = NEOX_ELEM_F32},
                           NEOX_ELEM_F32);
    gpu->to_device(ai[3].d, ai[3].h, nq * sizeof(float));
    gpu->to_device(ai[4].d, ai[4].h, nl * sizeof(float));
    pair ao[3] = {pair_rand(nq), pair_rand(nkv), pair_rand(nkv)};
    c.in = ai;
    c.out = ao;
    c.operands = NEOX_ELEM_F32;
    c.dropout = 0.1f;
    if (with_rest)
        check_repeats("attention_backward (GQA, dropout)", rep_attention, &c, (pair *[]){&ao[0], &ao[1], &ao[2]}, 3);
    neox_cuda_attention_cudnn(0);
    c.operands = NEOX_ELEM_BF16;
    if (with_rest) {
        neox_cuda_attention_kernels(0);
        check_repeats("attention_backward bf16 own first (GQA, dropout)", rep_attention, &c,
                      (pair *[]){&ao[0], &ao[1], &ao[2]}, 3);
    }
    for (int passes = g_first_passes; g_pipelined && passes <= 2; passes++) {
        neox_cuda_attention_kernels(1);
        neox_cuda_attention_backward_passes(passes);
        check_repeats(passes == 1 ? "attention_backward bf16 own pipelined single-pass (GQA, dropout)"
                                  : "attention_backward bf16 own pipelined two-pass (GQA, dropout)",
                      rep_attention, &c, (pair *[]){&ao[0], &ao[1], &ao[2]}, 3);
    }
    neox_cuda_attention_kernels(g_pipelined);
    neox_cuda_attention_backward_passes(g_first_passes);
    neox_cuda_attention_cudnn(1);
    c.dropout = 0.0f;  // cuDNN's deterministic backward (when cuDNN loads: the notice on stderr)
    if (with_rest)
        check_repeats("attention_backward bf16 cudnn (GQA)", rep_attention, &c, (pair *[]){&ao[0], &ao[1], &ao[2]}, 3);
    free_pairs(ai, 6);
    free_pairs(ao, 3);
}

static void test_determinism(void) {
    test_attention_repeats(1);
    rep_ctx c = {.B = 2, .T = 97, .NH = 6, .NKV = 2, .HS = 64, .N = 1000, .C = 96};

    size_t nc = (size_t)c.N * c.C;
    pair li[5] = {pair_rand(nc), pair_rand(nc), pair_rand(c.C), pair_rand(c.N), pair_uniform(c.N, 0.5f, 2.0f)};
    pair lo[3] = {pair_rand(nc), pair_rand(c.C), pair_rand(c.C)};
    c.in = li;
    c.out = lo;
    check_repeats("layernorm_backward", rep_layernorm, &c, (pair *[]){&lo[0], &lo[1], &lo[2]}, 3);
    pair wi[3] = {pair_rand(nc), pair_rand(nc), pair_rand((size_t)c.C * c.C)};
    pair wo[3] = {pair_rand(nc), pair_rand((size_t)c.C * c.C), pair_rand(c.C)};
    c.in = wi;
    c.out = wo;
    check_repeats("linear_backward (cuBLAS)", rep_linear, &c, (pair *[]){&wo[0], &wo[1], &wo[2]}, 3);

    int V = 50, *ids = xmalloc((size_t)c.B * c.T * sizeof(int));
    for (int i = 0; i < c.B * c.T; i++) ids[i] = (int)(neox_uniform(11, i) * V);
    ipair id = ipair_from(ids, (size_t)c.B * c.T);
    pair ei[1] = {pair_rand((size_t)c.B * c.T * c.C)}, eo[2] = {pair_rand((size_t)V * c.C), pair_rand((size_t)c.T * c.C)};
    c.in = ei;
    c.out = eo;
    c.ids = id.d;
    check_repeats("embedding_backward", rep_embedding, &c, (pair *[]){&eo[0], &eo[1]}, 2);

    double s1 = gpu->sum_squares(li[0].d, nc), s2 = gpu->sum_squares(li[0].d, nc);
    compare_scalar("repeatable: sum_squares", s1, s2, 0);
    free_pairs(li, 5);
    free_pairs(lo, 3);
    free_pairs(wi, 3);
    free_pairs(wo, 3);
    free_pairs(ei, 1);
    free_pairs(eo, 2);
    ipair_free(&id);
    free(ids);
}

// The device step's ops: the sum of squares into device memory, clipping from it (both sides given
// the CPU's sum, so the factor is the same double), AdamW run and then skipped by the guard.
static void test_device_step(size_t n) {
    pair g = pair_rand(n), p = pair_rand(n), m = pair_uniform(n, -0.1f, 0.1f), v = pair_uniform(n, 0.0f, 0.01f);
    neox_segment segs[] = {{0, 100, 0.0f}, {150, 5000, 0.1f}, {5001, n, 0.01f}};
    double host, got, *dev = gpu->alloc(sizeof(double));
    cpu->sum_squares_segments_into(&host, g.h, segs, 3);
    gpu->sum_squares_segments_into(dev, g.d, segs, 3);
    gpu->to_host(&got, dev, sizeof got);
    compare_scalar("sum_squares_segments_into", host, got, 1e-10);
    gpu->to_device(dev, &host, sizeof host);
    double scale_at = 1024.0, *scale_at_d = gpu->alloc(sizeof scale_at);  // (a replayed step's scale)
    gpu->to_device(scale_at_d, &scale_at, sizeof scale_at);
    cpu->clip_by_norm(g.h, n, &host, 1024.0, NULL, 1e-3);
    gpu->clip_by_norm(g.d, n, dev, 1.0, scale_at_d, 1e-3);
    checkf(0, 0, &g, "clip_by_norm n=%zu (loss scale 1024 read on the device, clipped)", n);
    gpu->free(scale_at_d);
    cpu->adamw_segments(p.h, g.h, m.h, v.h, segs, 3, scalars_on(cpu, 3e-4f, 3), 0.9f, 0.999f, 1e-6f, 1.0f, &host);
    gpu->adamw_segments(p.d, g.d, m.d, v.d, segs, 3, scalars_on(gpu, 3e-4f, 3), 0.9f, 0.999f, 1e-6f, 1.0f, dev);
    checkf(0, 1e-6, &p, "adamw_segments guard finite: updated");
    double inf = INFINITY;
    gpu->to_device(dev, &inf, sizeof inf);
    gpu->adamw_segments(p.d, g.d, m.d, v.d, segs, 3, scalars_on(gpu, 3e-4f, 4), 0.9f, 0.999f, 1e-6f, 1.0f, dev);
    gpu->clip_by_norm(g.d, n, dev, 1.0, NULL, 1e-3);
    checkf(0, 1e-6, &p, "adamw_segments guard inf: skipped");
    checkf(0, 1e-6, &m, "adamw_segments guard inf: exp_avg untouched");
    checkf(0, 0, &g, "clip_by_norm inf: untouched");
    // loss_guard: the sum through while every mean loss is finite (a zero mask's pair counts as 0,
    // whatever its sum), NaN once one is not; the same answer as the CPU's each time.
    double sums[3][6] = {{2.5, 4.0, 1e30, 0.0, NAN, 0.0}, {2.5, 4.0, INFINITY, 3.0, 1.0, 1.0}, {NAN, 2.0, 1.0, 1.0, 0.0, 0.0}};
    double *dsums = gpu->alloc(sizeof sums[0]), *dguard = gpu->alloc(sizeof(double));
    for (int k = 0; k < 3; k++) {
        double want, got_guard;
        cpu->loss_guard(&want, &host, sums[k], 3);
        gpu->to_device(dev, &host, sizeof host);
        gpu->to_device(dsums, sums[k], sizeof sums[k]);
        gpu->loss_guard(dguard, dev, dsums, 3);
        gpu->to_host(&got_guard, dguard, sizeof got_guard);
        int ok = (isnan(want) && isnan(got_guard)) || want == got_guard;
        ok = ok && (k == 0 ? want == host : isnan(want));
        checks++;
        printf("%s - loss_guard case %d: cpu %g, cuda %g\n", ok ? "ok" : "not ok", k, want, got_guard);
        if (!ok) failures++;
    }
    gpu->free(dsums);
    gpu->free(dguard);
    gpu->free(dev);
    pair *all[] = {&g, &p, &m, &v};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(all[i]);
}

// ---- memory entry points -------------------------------------------------------------------------

static void test_memory(void) {
    size_t n = 1000;
    pair a = pair_rand(n), b = pair_zero(n);
    gpu->copy(b.d, a.d, n * sizeof(float));
    memcpy(b.h, a.h, n * sizeof(float));
    gpu->memset_zero(a.d, 10 * sizeof(float));
    memset(a.h, 0, 10 * sizeof(float));
    gpu->synchronize();
    check("memory: copy", &b, 0, 0);
    check("memory: memset_zero", &a, 0, 0);
    pair_free(&a);
    pair_free(&b);
}

// The copy queue: device -> page-locked host -> another device buffer, each waited for as the table
// says (host_wait before the host reads, device_wait before an op reads), against the values sent.
static void test_async_copies(void) {
    size_t n = 100003;
    pair a = pair_rand(n), b = pair_zero(n);
    float *pinned = gpu->host_alloc(n * sizeof(float));
    gpu->host_wait(gpu->to_host_async(pinned, a.d, n * sizeof(float)));
    gpu->device_wait(gpu->to_device_async(b.d, pinned, n * sizeof(float)));
    gpu->scale(b.d, n, 2.0f);  // queued after the wait: reads what arrived
    for (size_t i = 0; i < n; i++) b.h[i] = a.h[i] * 2.0f;
    gpu->synchronize();
    check("memory: asynchronous copies through page-locked memory", &b, 0, 0);
    gpu->host_free(pinned);
    pair_free(&a);
    pair_free(&b);
}

// Giving memory back (kernels/cuda/vmm.cu; host pages with --self): a block of 8 granules whose middle
// 6 are released takes no more memory when a block of 6 granules is allocated next; the 2 granules
// committed again hold what is written to them, and what lies outside the released range keeps its
// contents (inside it they are undefined). The released granules are not read: on a GPU they are
// unmapped.
static void test_release_commit(void) {
    size_t g = gpu->release_granularity(), per = g / sizeof(float);
    if (!gpu->releases || g == 0) {
        printf("# memory: this device gives nothing back (no virtual memory management): release not checked\n");
        return;
    }
    pair a = pair_rand(10 * per);  // 8 granules from the first granule boundary in it (a device's block starts on one)
    size_t o = (size_t)(((uintptr_t)a.d + g - 1) / g * g - (uintptr_t)a.d) / sizeof(float);
    float *d = a.d + o, *h = a.h + o;
    gpu->synchronize();
    size_t peak = gpu->peak_bytes();
    compare_scalar("memory: release gives back the 6 whole granules inside its range", 6.0 * (double)g,
                   (double)gpu->release(d + per / 2, 7 * g), 0);
    gpu->synchronize();  // the release settles at the next memory entry once the stream has passed it
    float *b = gpu->alloc(6 * g);
    compare_scalar("memory: a 6-granule block after the release leaves the peak where it was", (double)peak,
                   (double)gpu->peak_bytes(), 0);
    compare_scalar("memory: commit maps the 2 granules its range touches (host pages: none, they return when written)",
                   gpu->on_device ? 2.0 * (double)g : 0.0, (double)gpu->commit(d + per + 1, g), 0);
    for (size_t i = per; i < 3 * per; i++) h[i] = (float)i;
    gpu->to_device(d + per, h + per, 2 * g);
    float *back = xmalloc(3 * g);
    gpu->to_host(back, d, 3 * g);
    compare("memory: the committed granules hold what was written", h + per, back + per, 2 * per, 0, 0);
    compare("memory: what precedes the released range kept its contents", h, back, per / 2, 0, 0);
    gpu->to_host(back, d + 7 * per + per / 2, g / 2);
    compare("memory: what follows the released range kept its contents", h + 7 * per + per / 2, back, per / 2, 0, 0);
    free(back);
    gpu->free(b);
    pair_free(&a);
}

// The tensor-core kernels, the first (attention_mma.cu) or the pipelined (attention_fa2.cu) with their
// backward in `passes` (1: the single pass, 2: the two passes): T off and on the 64-row and 128-row
// tiles, GQA and MQA, head sizes 16..128, windows whose edge crosses a block's tiles (so a block has
// tiles without masks, with masks and skipped; in the single pass, query tiles whose dq comes from
// several key blocks, and under a window from a range of them not starting at 0), dropout, ALiBi,
// context parallelism's query positions.
static void attention_16bit_own(int pipelined, int passes) {
    neox_cuda_attention_cudnn(0);
    neox_cuda_attention_kernels(pipelined);
    neox_cuda_attention_backward_passes(passes);
    g_att_path = !pipelined ? " own first" : passes == 1 ? " own pipelined single-pass" : " own pipelined two-pass";
    test_attention_elem(2, 37, 4, 4, 16, 0.0f, 0, NEOX_ELEM_BF16);
    test_attention_elem(1, 64, 4, 2, 64, 0.0f, 0, NEOX_ELEM_BF16);
    test_attention_elem(2, 200, 6, 2, 64, 0.0f, 0, NEOX_ELEM_BF16);    // GQA, a partial last tile
    test_attention_elem(1, 130, 4, 1, 128, 0.0f, 0, NEOX_ELEM_BF16);   // MQA
    test_attention_elem(1, 97, 2, 2, 80, 0.1f, 0, NEOX_ELEM_BF16);     // dropout
    test_attention_elem(2, 150, 4, 2, 64, 0.0f, 40, NEOX_ELEM_BF16);   // sliding window across tiles
    test_attention_elem(1, 97, 2, 1, 96, 0.2f, 1, NEOX_ELEM_BF16);     // a window of one key, dropout
    test_attention_elem(1, 300, 4, 2, 112, 0.0f, 0, NEOX_ELEM_F16);
    test_attention_elem(1, 129, 2, 2, 32, 0.1f, 0, NEOX_ELEM_F16);
    test_attention_elem(1, 2048, 2, 2, 128, 0.0f, 0, NEOX_ELEM_BF16);  // a training length
    // ALiBi's biases (12 heads: slopes from two sequences), both kernels.
    test_attention_full(1, 150, 12, 4, 64, 0.0f, 0, NEOX_ELEM_F32, 1);
    test_attention_full(1, 97, 12, 12, 40, 0.1f, 30, NEOX_ELEM_F32, 1);
    test_attention_full(2, 150, 12, 4, 64, 0.0f, 0, NEOX_ELEM_BF16, 1);
    test_attention_full(1, 97, 12, 6, 128, 0.1f, 30, NEOX_ELEM_BF16, 1);
    test_attention_elem(1, 256, 4, 2, 64, 0.0f, 0, NEOX_ELEM_BF16);    // T on the 128-row tiles, GQA
    test_attention_elem(2, 128, 4, 1, 128, 0.0f, 0, NEOX_ELEM_BF16);   // one block, MQA, HS 128
    test_attention_elem(1, 300, 4, 4, 64, 0.0f, 100, NEOX_ELEM_BF16);  // a window across 128-row blocks
    test_attention_elem(1, 257, 2, 2, 128, 0.1f, 70, NEOX_ELEM_F16);   // fp16, dropout, window, one row past
    test_attention_elem(1, 640, 4, 2, 128, 0.0f, 0, NEOX_ELEM_BF16);   // many full (mask-free) tiles
    test_attention_elem(3, 700, 2, 1, 48, 0.0f, 200, NEOX_ELEM_F16);   // a window: late tiles' dq from blocks 3..5
    // Context parallelism's query positions: chunks that end inside a warp's 16 rows and a block's
    // tiles, keys no query of the rank sees (rank 1's last), a window reaching back across chunks.
    // The single pass takes no query positions (such calls run the two passes), so the pipelined
    // kernels check them in the two-pass form alone (under --self, in the one form run).
    if (!pipelined || passes == 2 || gpu == cpu) {
        test_attention_cp(2, 200, 2, 0, 6, 2, 64, 0, NEOX_ELEM_BF16, 0);    // chunks of 50, GQA
        test_attention_cp(2, 200, 2, 1, 6, 2, 64, 0, NEOX_ELEM_BF16, 0);
        test_attention_cp(1, 520, 2, 1, 4, 4, 128, 0, NEOX_ELEM_BF16, 0);   // chunks of 130 across 128-row blocks
        test_attention_cp(1, 304, 4, 3, 4, 2, 64, 40, NEOX_ELEM_BF16, 0);   // cp 4, chunks of 38, a window
        test_attention_cp(1, 160, 2, 0, 12, 6, 64, 0, NEOX_ELEM_F16, 1);    // fp16, ALiBi
    }
    g_att_path = "";
    neox_cuda_attention_kernels(g_pipelined);
    neox_cuda_attention_backward_passes(g_first_passes);
    neox_cuda_attention_cudnn(1);
}

// The pipelined kernels' own entry points and storage: q, k, v read from a fused QKV buffer (both
// layouts), and bf16-stored tensors read and written as they are (no widening pass).
static void attention_pipelined_layouts(int passes) {
    neox_cuda_attention_cudnn(0);
    neox_cuda_attention_kernels(1);
    neox_cuda_attention_backward_passes(passes);
    g_att_path = passes == 1 ? " own pipelined single-pass" : " own pipelined two-pass";
    test_attention_qkv(2, 150, 4, 4, 64, 1, NEOX_ELEM_BF16, 0.0f);   // GPT-NeoX's interleaved heads
    test_attention_qkv(1, 200, 6, 2, 128, 0, NEOX_ELEM_BF16, 0.1f);  // Llama's layout, GQA, dropout
    test_attention_qkv(1, 97, 4, 1, 32, 0, NEOX_ELEM_F16, 0.0f);     // fp16, MQA
    test_bf16_attention(2, 130, 4, 2, 64);
    test_bf16_attention(1, 256, 4, 1, 128);
    g_att_path = "";
    neox_cuda_attention_kernels(g_pipelined);
    neox_cuda_attention_backward_passes(g_first_passes);
    neox_cuda_attention_cudnn(1);
}

// The pipelined kernels' checks with their backward in each form from first_passes (1: the single
// pass, then the two passes; 2: the two passes alone). --self runs one form: the CPU has no forms.
static void attention_pipelined(int first_passes) {
    if (first_passes == 2) printf("# the single-pass attention backward's checks skipped (NEOX_ATTENTION_BACKWARD=two-pass)\n");
    for (int passes = first_passes; passes <= (gpu == cpu ? first_passes : 2); passes++)
        attention_16bit_own(1, passes), attention_pipelined_layouts(passes);
}

// cuDNN's fused attention against the same CPU reference and tolerances (its probabilities round to
// bf16 at its own tile boundaries, not the reference's): the shapes it takes (bf16, no dropout or
// ALiBi), GQA, MQA, windows, a partial tile, the 125M benchmark's heads at a training length.
static void attention_16bit_cudnn(void) {
    neox_cuda_attention_cudnn(1);
    g_att_path = " cudnn";
    test_attention_elem(2, 37, 4, 4, 16, 0.0f, 0, NEOX_ELEM_BF16);
    test_attention_elem(2, 200, 6, 2, 64, 0.0f, 0, NEOX_ELEM_BF16);    // GQA, a partial last tile
    test_attention_elem(1, 130, 4, 1, 128, 0.0f, 0, NEOX_ELEM_BF16);   // MQA
    test_attention_elem(2, 150, 4, 2, 64, 0.0f, 40, NEOX_ELEM_BF16);   // sliding window across tiles
    test_attention_elem(1, 97, 2, 1, 80, 0.0f, 1, NEOX_ELEM_BF16);     // a window of one key
    test_attention_elem(1, 2048, 12, 12, 64, 0.0f, 0, NEOX_ELEM_BF16); // 125M's heads, sequence 2048
    // Context parallelism: one call per chunk (bottom-right causal over the keys up to its end).
    test_attention_cp(2, 200, 2, 0, 6, 2, 64, 0, NEOX_ELEM_BF16, 0);
    test_attention_cp(2, 200, 2, 1, 6, 2, 64, 0, NEOX_ELEM_BF16, 0);
    test_attention_cp(1, 304, 4, 2, 4, 2, 64, 40, NEOX_ELEM_BF16, 0);   // cp 4, a window
    test_attention_cp(1, 2048, 2, 1, 12, 12, 64, 0, NEOX_ELEM_BF16, 0); // 125M's heads
    g_att_path = "";
}

// ---- compressed and sparse gradient exchanges ------------------------------------------------------

// Bytes on both sides, compared as values (exactly: they are signs and copies).
typedef struct { uint8_t *h; void *d; size_t n; } bytepair;
static bytepair bytepair_from(const uint8_t *values, size_t n) {
    bytepair p = {xmalloc(n), gpu->alloc(n ? n : 1), n};
    memcpy(p.h, values, n);
    gpu->to_device(p.d, p.h, n);
    return p;
}
static void check_bytes(const char *name, const bytepair *p) {
    uint8_t *got = xmalloc(p->n);
    gpu->to_host(got, p->d, p->n);
    float *a = xmalloc(p->n * sizeof(float)), *b = xmalloc(p->n * sizeof(float));
    for (size_t i = 0; i < p->n; i++) a[i] = p->h[i], b[i] = got[i];
    compare(name, a, b, p->n, 0, 0);
    free(got), free(a), free(b);
}
static void bytepair_free(bytepair *p) {
    free(p->h);
    gpu->free(p->d);
}

// ---- FP8 (precision fp8) -----------------------------------------------------------------------------
// One float in backend memory on both sides (a scale, an amax).
static pair pair_scalar(float v) {
    pair p = pair_zero(1);
    p.h[0] = v;
    gpu->to_device(p.d, p.h, sizeof(float));
    return p;
}

// The scaled cast: the same bytes (both use kernels.h's encoder) and the same amax, over values that
// saturate, round to subnormals, tie and are NaN.
static void test_fp8_cast(neox_fp8_format fmt, float scale, size_t n) {
    pair x = pair_uniform(n, -3.0f, 3.0f), amax = pair_scalar(0.5f), s = pair_scalar(scale);
    const float special[] = {0.0f, -0.0f, 1e6f, -1e6f, INFINITY, -INFINITY, NAN, 1e-7f, 1.0625f, 1.1875f, 3e-3f};
    for (size_t i = 0; i < sizeof special / sizeof *special && i < n; i++) x.h[i] = special[i];
    gpu->to_device(x.d, x.h, n * sizeof(float));
    uint8_t *zero = calloc(n, 1);
    bytepair out = bytepair_from(zero, n);
    cpu->fp8_cast(out.h, amax.h, x.h, n, s.h, fmt);
    gpu->fp8_cast(out.d, amax.d, x.d, n, s.d, fmt);
    char name[128];
    snprintf(name, sizeof name, "fp8_cast %s scale %g n=%zu", fmt == NEOX_FP8_E4M3 ? "e4m3" : "e5m2", scale, n);
    check_bytes(name, &out);
    float got;
    gpu->to_host(&got, amax.d, sizeof got);
    snprintf(name, sizeof name, "fp8_cast amax %s n=%zu", fmt == NEOX_FP8_E4M3 ? "e4m3" : "e5m2", n);
    compare_scalar(name, amax.h[0], got, 0.0);
    free(zero);
    bytepair_free(&out);
    pair_free(&x), pair_free(&amax), pair_free(&s);
}

// FP8 bytes of n random values under scale s (the CPU's cast), on both sides.
static bytepair fp8_operand(size_t n, neox_fp8_format fmt, float scale) {
    pair x = pair_rand(n), s = pair_scalar(scale);
    uint8_t *bytes = xmalloc(n);
    cpu->fp8_cast(bytes, NULL, x.h, n, s.h, fmt);
    bytepair p = bytepair_from(bytes, n);
    free(bytes);
    pair_free(&x), pair_free(&s);
    return p;
}

// C = sa sb op(A) op(B) + C: cuBLASLt's FP8 GEMM where the layout and sizes allow (TN directly, the
// others through transposed copies), the widened fallback elsewhere (odd sizes); fp32 sums in other
// orders than the CPU's bfloat16 GEMM.
static void test_gemm_fp8(int ta, int tb, int M, int N, int K, neox_fp8_format fa, neox_fp8_format fb) {
    bytepair a = fp8_operand((size_t)M * K, fa, 200.0f), b = fp8_operand((size_t)K * N, fb, 100.0f);
    pair sa = pair_scalar(1.0f / 200.0f), sb = pair_scalar(1.0f / 100.0f), c = pair_rand((size_t)M * N);
    int lda = ta ? M : K, ldb = tb ? K : N;
    cpu->gemm_fp8(ta, tb, M, N, K, a.h, lda, fa, sa.h, b.h, ldb, fb, sb.h, 1.0f, c.h, N);
    gpu->gemm_fp8(ta, tb, M, N, K, a.d, lda, fa, sa.d, b.d, ldb, fb, sb.d, 1.0f, c.d, N);
    checkf(GEMM_TOL, &c, "gemm_fp8 %s x %s %c%c M=%d N=%d K=%d", fa == NEOX_FP8_E4M3 ? "e4m3" : "e5m2",
           fb == NEOX_FP8_E4M3 ? "e4m3" : "e5m2", ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K);
    bytepair_free(&a), bytepair_free(&b);
    pair_free(&sa), pair_free(&sb), pair_free(&c);
}

// Delayed scaling's update: the same history, scales and inverses (one rounding each).
static void test_fp8_update(int len, int n, int algo_max) {
    pair hist = pair_uniform((size_t)len * n, 0.0f, 50.0f), scale = pair_uniform((size_t)n, 0.5f, 2.0f);
    pair inv = pair_zero((size_t)n);
    hist.h[1] = 0.0f, hist.h[2] = INFINITY;  // kept scales
    gpu->to_device(hist.d, hist.h, hist.n * sizeof(float));
    cpu->fp8_update_scales(hist.h, scale.h, inv.h, len, n, n, NEOX_FP8_E5M2, 1, algo_max);
    gpu->fp8_update_scales(hist.d, scale.d, inv.d, len, n, n, NEOX_FP8_E5M2, 1, algo_max);
    checkf(0, 0, &hist, "fp8_update_scales history len=%d n=%d %s", len, n, algo_max ? "max" : "most_recent");
    checkf(0, 0, &scale, "fp8_update_scales scale len=%d n=%d", len, n);
    checkf(0, 0, &inv, "fp8_update_scales scale_inv len=%d n=%d", len, n);
    pair_free(&hist), pair_free(&scale), pair_free(&inv);
}

// The scale's bytes sit at unaligned offsets of a block (the wire's layout): offsets 1 and 7.
static void test_onebit(size_t n, size_t padded, int chunks) {
    size_t block = 5 + padded / (size_t)chunks / 8 + 3, signs_at = 5, scale_at = 1;
    uint8_t *zero = calloc((size_t)chunks * block, 1);
    bytepair wire = bytepair_from(zero, (size_t)chunks * block);
    pair error = pair_rand(padded), x = pair_rand(n);
    cpu->onebit_compress(wire.h + signs_at, block, wire.h + scale_at, block, error.h, x.h, n, padded, chunks);
    gpu->onebit_compress((uint8_t *)wire.d + signs_at, block, (uint8_t *)wire.d + scale_at, block, error.d, x.d, n,
                         padded, chunks);
    // The signs are of the same compensated values; the scale's double sum is in another order.
    uint8_t *got = xmalloc(wire.n);
    gpu->to_host(got, wire.d, wire.n);
    float ref_scale, gpu_scale;
    memcpy(&ref_scale, wire.h + scale_at, 4), memcpy(&gpu_scale, got + scale_at, 4);
    char name[128];
    snprintf(name, sizeof name, "onebit_compress scale n=%zu padded=%zu chunks=%d", n, padded, chunks);
    compare_scalar(name, ref_scale, gpu_scale, 1e-6);
    for (int c = 0; c < chunks; c++) memcpy(got + (size_t)c * block + scale_at, wire.h + (size_t)c * block + scale_at, 4);
    gpu->to_device(wire.d, got, wire.n);
    snprintf(name, sizeof name, "onebit_compress signs n=%zu padded=%zu chunks=%d", n, padded, chunks);
    check_bytes(name, &wire);
    checkf(1e-6, 1e-6, &error, "onebit_compress error n=%zu padded=%zu chunks=%d", n, padded, chunks);
    gpu->to_device(wire.d, wire.h, wire.n);  // the CPU's scales on both sides for the decompressions
    size_t chunk = padded / (size_t)chunks;
    pair avg = pair_rand(chunk), full = pair_rand(n);
    cpu->onebit_average(avg.h, wire.h, block, signs_at, scale_at, chunk, chunks);
    gpu->onebit_average(avg.d, wire.d, block, signs_at, scale_at, chunk, chunks);
    checkf(0, 0, &avg, "onebit_average chunk=%zu p=%d", chunk, chunks);
    cpu->onebit_decompress(full.h, wire.h, block, signs_at, scale_at, chunk, n);
    gpu->onebit_decompress(full.d, wire.d, block, signs_at, scale_at, chunk, n);
    checkf(0, 0, &full, "onebit_decompress chunk=%zu n=%zu", chunk, n);
    free(zero), free(got);
    bytepair_free(&wire);
    pair *all[] = {&error, &x, &avg, &full};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(all[i]);
}

static void test_powersgd_ops(int n, int r, int cols) {
    pair P = pair_rand((size_t)n * r), acc = pair_rand((size_t)n * cols), x = pair_rand((size_t)n * cols);
    cpu->orthonormalise_columns(P.h, n, r);
    gpu->orthonormalise_columns(P.d, n, r);
    checkf(1e-5, 1e-5, &P, "orthonormalise_columns n=%d r=%d", n, r);
    cpu->add_scaled(acc.h, x.h, acc.n, -3.0f);
    gpu->add_scaled(acc.d, x.d, acc.n, -3.0f);
    checkf(0, 0, &acc, "add_scaled n=%zu", acc.n);
    pair wide = pair_rand((size_t)n * (cols + 3));  // the strided copy leaves the columns past cols
    cpu->copy_matrix(wide.h, cols + 3, x.h, cols, n, cols - 1);
    gpu->copy_matrix(wide.d, cols + 3, x.d, cols, n, cols - 1);
    checkf(0, 0, &wide, "copy_matrix rows=%d cols=%d", n, cols - 1);
    pair *all[] = {&P, &acc, &x, &wide};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pair_free(all[i]);
}

// Ids repeat (rows summed in list order) and skip rows (left as they are).
static void test_sparse_rows(int V, int n, int C) {
    int *ids = xmalloc((size_t)n * sizeof(int)), *distinct = xmalloc((size_t)V * sizeof(int)), nd = 0;
    for (int i = 0; i < n; i++) ids[i] = (int)((unsigned)(i * 7 + i / 3) % (unsigned)(V - 1));
    for (int v = 0; v < V; v += 2) distinct[nd++] = v;
    ipair id = ipair_from(ids, (size_t)n), dist = ipair_from(distinct, (size_t)nd);
    pair grad = pair_rand((size_t)V * C), rows = pair_rand((size_t)n * C);
    cpu->rows_sum_by_id(grad.h, rows.h, id.h, n, C);
    gpu->rows_sum_by_id(grad.d, rows.d, id.d, n, C);
    checkf(0, 0, &grad, "rows_sum_by_id V=%d n=%d C=%d", V, n, C);
    cpu->scale_rows(grad.h, dist.h, nd, C, 0.25f);
    gpu->scale_rows(grad.d, dist.d, nd, C, 0.25f);
    checkf(0, 0, &grad, "scale_rows V=%d n=%d C=%d", V, nd, C);
    free(ids), free(distinct);
    ipair_free(&id), ipair_free(&dist);
    pair_free(&grad), pair_free(&rows);
}

int main(int argc, char **argv) {
    int self = 0, attention_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-v")) verbose = 1;
        else if (!strcmp(argv[i], "--self")) self = 1;
        else if (!strcmp(argv[i], "--attention")) attention_only = 1;
        else { fprintf(stderr, "usage: op_parity [-v] [--self] [--attention]\n"); return 2; }
    }
    const char *kernels = getenv("NEOX_ATTENTION_KERNELS"), *passes = getenv("NEOX_ATTENTION_BACKWARD");
    g_pipelined = !(kernels && !strcmp(kernels, "first"));
    g_first_passes = passes && !strcmp(passes, "two-pass") ? 2 : 1;
    setvbuf(stdout, NULL, _IOLBF, 0);  // lines so far survive an abort inside an op
    cpu = neox_backend_cpu();
    gpu = self ? cpu : neox_backend_cuda();
    if (!gpu) {
        printf("ok - op parity # SKIP no GPU: skipped (%s)\n", neox_backends_description());
        return 0;
    }
    printf("# %s\n", neox_backends_description());
    neox_cuda_attention_kernels(g_pipelined);
    neox_cuda_attention_backward_passes(g_first_passes);
    if (attention_only) {  // the pipelined attention kernels alone, first on a GPU host (seconds)
        g_pipelined = 1;
        attention_pipelined(g_first_passes);
        attention_views_cases();
        test_attention_repeats(0);
        printf("# %d checks, %d failed\n", checks, failures);
        return failures ? 1 : 0;
    }
    test_memory();
    test_async_copies();
    test_release_commit();
    test_linear(37, 53, 71, 0, 1, 0);
    test_linear(64, 128, 96, 5, 1, 1);  // ldo > OC: a projection writing into a wider row
    test_linear(1, 77, 33, 0, 0, 1);    // one row (decoding)
    test_linear(300, 129, 250, 0, 1, 0);
    test_linear_tf32();
    test_gemm16(NEOX_ELEM_BF16, NEOX_ELEM_F32, 0, 1, 67, 45, 131);
    test_gemm16(NEOX_ELEM_BF16, NEOX_ELEM_F32, 1, 0, 40, 64, 77);
    test_gemm16(NEOX_ELEM_BF16, NEOX_ELEM_BF16, 0, 0, 33, 70, 96);
    test_gemm16(NEOX_ELEM_F16, NEOX_ELEM_F32, 0, 1, 50, 31, 64);
    test_gemm16(NEOX_ELEM_F16, NEOX_ELEM_F16, 1, 1, 24, 40, 56);
    test_linear_both_paths();
    test_linear_gelu(37, 64, 96, 1);
    test_linear_gelu(128, 768, 3072, 1);  // a 125M MLP's first projection (8 rows of 16)
    test_linear_gelu(9, 40, 24, 0);
    test_linear_act(37, 64, 96, NEOX_FN_GELU_TANH, 1);
    test_linear_act(128, 768, 3072, NEOX_FN_GELU_TANH, 1);  // a 125M MLP's first projection
    test_linear_act(9, 40, 24, NEOX_FN_GELU_TANH, 0);
    test_linear_act(33, 48, 80, NEOX_FN_GELU, 1);  // exact GELU: not fused
    test_linear_act(20, 32, 40, NEOX_FN_RELU, 1);
    test_casts();
    test_fp8_cast(NEOX_FP8_E4M3, 37.5f, 100003);
    test_fp8_cast(NEOX_FP8_E5M2, 0.001f, 4099);
    test_gemm_fp8(0, 1, 64, 96, 128, NEOX_FP8_E4M3, NEOX_FP8_E4M3);   // the forward's TN: cuBLASLt directly
    test_gemm_fp8(0, 0, 48, 80, 64, NEOX_FP8_E5M2, NEOX_FP8_E4M3);    // the input gradient's NN
    test_gemm_fp8(1, 0, 96, 64, 256, NEOX_FP8_E5M2, NEOX_FP8_E4M3);   // the weight gradient's TN of A^T
    test_gemm_fp8(0, 1, 37, 45, 53, NEOX_FP8_E4M3, NEOX_FP8_E4M3);    // odd sizes: the widened fallback
    test_gemm_fp8(0, 1, 32, 32, 32, NEOX_FP8_E5M2, NEOX_FP8_E5M2);    // both E5M2: the fallback
    test_fp8_update(4, 70, 1);
    test_fp8_update(1, 33, 0);
    test_embedding(2, 19, 37, 7, 1);
    test_embedding(3, 300, 64, 1000, 0);
    test_embedding(2, 1000, 96, 1, 1);      // one id: 2000 tokens in 8 spans, the last partial
    test_embedding(2, 777, 130, 5, 0);      // runs crossing span ends, channels past a 128 block
    test_embedding(4, 2048, 768, 50304, 1); // a training batch
    test_layernorm(37, 200, 1);
    test_layernorm(5, 1001, 0);
    test_layernorm(300, 64, 1);
    test_layernorm(4096, 768, 1);  // a training shape: the fused backward's 256 row chunks
    test_rmsnorm(37, 200);
    test_rmsnorm(3, 4097);         // wider than 1024: the row kernel and the column sums apart
    test_rmsnorm(2048, 1024);      // the fused backward's widest rows
    test_scalenorm(37, 200, 1e-8f);
    test_scalenorm(300, 3, 3.0f);  // rows of 3 values in [-2, 3): norms on both sides of 3
    test_add_norm(300, 768, 0, 0, 1);  // 16-byte rows, b's bias added first
    test_add_norm(37, 200, 0, 1, 0);
    test_add_norm(5, 1001, 0, 0, 1);   // an odd width: the element-wise kernel
    test_add_norm(64, 4096, 1, 1, 1);
    test_add_norm(9, 90, 1, 0, 0);     // 90 % 4 != 0
    test_head_norm(2, 4, 37, 16, 4, 0);
    test_head_norm(3, 6, 20, 64, 1, 1);
    test_moe(37, 2, 96);
    test_moe(300, 1, 768);
    test_qkv(2, 11, 4, 4, 24, 1);
    test_qkv(2, 11, 6, 2, 24, 0);
    test_rotary(2, 3, 45, 24, 16);
    test_rotary(1, 4, 33, 64, 64);
    test_attention(2, 37, 4, 4, 16, 0.0f, 0);
    test_attention(1, 70, 6, 2, 40, 0.0f, 0);   // GQA
    test_attention(2, 33, 4, 1, 64, 0.0f, 0);   // MQA
    test_attention(1, 65, 2, 2, 128, 0.1f, 0);  // dropout
    test_attention(1, 40, 2, 1, 200, 0.0f, 0);  // 7 registers per lane, shared memory above 48 KB
    test_attention(1, 129, 4, 2, 64, 0.2f, 0);
    test_attention(1, 300, 2, 2, 256, 0.0f, 0);
    test_attention(2, 150, 4, 2, 64, 0.0f, 40);   // sliding window across tiles
    test_attention(1, 97, 2, 1, 80, 0.1f, 1);     // a window of one key, dropout
    test_attention_cp(2, 80, 2, 0, 4, 2, 32, 0, NEOX_ELEM_F32, 0);     // chunks of 20 inside 8-row blocks, GQA
    test_attention_cp(2, 80, 2, 1, 4, 2, 32, 0, NEOX_ELEM_F32, 0);
    test_attention_cp(1, 200, 4, 2, 4, 1, 64, 30, NEOX_ELEM_F32, 0);   // cp 4, chunks of 25, a window, MQA
    test_attention_cp(1, 120, 2, 0, 12, 4, 64, 0, NEOX_ELEM_F32, 1);   // ALiBi
    attention_16bit_own(0, 2);
    if (g_pipelined) attention_pipelined(g_first_passes);
    else printf("# the pipelined attention kernels' checks skipped (NEOX_ATTENTION_KERNELS=first)\n");
    attention_16bit_cudnn();
    attention_views_cases();
    test_attention_cached(5, 17, 4, 2, 48, 50, 0, 0);
    test_attention_cached(1, 0, 4, 4, 64, 8, 0, 0);
    test_attention_cached(9, 0, 2, 1, 128, 9, 0, 0);
    test_attention_cached(1, 99, 6, 2, 80, 128, 0, 1);  // ALiBi
    test_attention_cached(5, 60, 4, 2, 64, 80, 16, 0);  // sliding window
    test_activations(10007, 13, 77);
    test_elementwise(37, 129);
    test_bf16_elementwise(37, 129);
    test_bf16_activations(10007, 13, 77);
    test_bf16_embedding(2, 300, 130, 7);  // runs crossing span ends, channels past a 128 block
    test_bf16_cross_entropy(37, 1000);
    test_bf16_linear(37, 200, 96, 0, 0);
    test_bf16_attention(2, 130, 4, 2, 64);  // GQA, a partial last tile
    test_bf16_linear(64, 768, 2304, 5, 1);  // a fused QKV's shape, padded rows, dinp accumulated
    test_bf16_linear_act(37, 64, 96, NEOX_FN_GELU, 1);
    test_bf16_linear_act(128, 768, 3072, NEOX_FN_GELU, 1);  // a 125M MLP's first projection (cuDNN's graphs)
    test_bf16_linear_act(9, 40, 24, NEOX_FN_GELU, 0);
    test_bf16_linear_act(33, 48, 80, NEOX_FN_GELU_TANH, 1);
    test_bf16_linear_act(20, 32, 40, NEOX_FN_RELU, 1);  // not fused: the separate ops
    test_bf16_cross_entropy(8, 50304);
    test_bf16_norm(37, 200, 0);
    test_bf16_norm(300, 64, 1);
    test_bf16_norm(3, 1500, 0);    // wider than 1024: the row kernel and the column sums apart
    test_bf16_norm(4096, 768, 0);  // a training shape
    test_bf16_heads(2, 37, 4, 4, 40, 1);
    test_bf16_heads(2, 33, 8, 2, 64, 0);
    test_bf16_scalenorm(37, 200, 1e-8f);
    test_bf16_moe(37, 2, 200);  // NK = 74: 7 is coprime to it
    test_bf16_scalenorm(300, 3, 3.0f);
    test_bf16_head_norm(2, 4, 37, 16, 4, 0);
    test_bf16_head_norm(3, 6, 20, 64, 1, 1);
    test_cross_entropy(9, 1001);
    test_cross_entropy(3, 50304);
    test_cross_entropy_loss(37);
    test_cross_entropy_loss(65536);  // 125M's micro-batch 32 at sequence 2048
    test_cross_entropy_fused(9, 1001, NEOX_ELEM_F32);
    test_cross_entropy_fused(5, 50304, NEOX_ELEM_F32);
    test_cross_entropy_fused(5, 50304, NEOX_ELEM_BF16);
    test_cross_entropy_fused(3, 300000, NEOX_ELEM_F32);
    test_cross_entropy_fused(4, 32000, NEOX_ELEM_F16);
    test_optimizer(100003);
    test_device_step(100003);
    test_determinism();
    test_onebit(1000, 1024, 2);
    test_onebit(70001, 70016, 8);  // several blocks of threads per chunk
    test_onebit(48, 48, 1);        // the server's re-compression: one chunk, no padding
    test_powersgd_ops(300, 4, 37);
    test_powersgd_ops(4097, 1, 9);
    test_sparse_rows(101, 300, 37);
    test_sparse_rows(5000, 64, 768);
    printf("# %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
