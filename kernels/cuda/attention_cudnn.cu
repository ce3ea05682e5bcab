// attention_cudnn.cu: the one owner of the choice between cuDNN's fused attention
// (kernels/cuda/cudnn_attention.cpp) and the own kernels (attention.cu; for 16-bit operands the
// pipelined attention_fa2.cu or the first attention_mma.cu), and the cuDNN route of the attention ops.
// Activations stored as bf16 go to cuDNN as they are (its bf16 results are the op's, rounded once from
// its fp32 accumulation, as the CPU's reference rounds); fp32-stored q, k, v (and for backward out and
// dout) are cast to a bf16 scratch, cuDNN runs on it, and its bf16 results are cast back. Either way
// cuDNN sees the same bf16 values, so the two storage types give the same results (widened) bit for bit.
#include <string.h>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/cudnn_attention.h"

static int g_cudnn_allowed = 1;
static int g_pipelined = -1;  // -1: not chosen yet (the environment decides on first use)

extern "C" void neox_cuda_attention_cudnn(int allow) { g_cudnn_allowed = allow != 0; }
extern "C" void neox_cuda_attention_kernels(int pipelined) { g_pipelined = pipelined != 0; }

// Says once per distinct outcome which implementation attention runs on (the first use of each).
static void notice(const char *what) {
    enum { KEEP = 8 };
    static char said[KEEP][400];  // as long as use_cudnn's lines
    static int n;
    for (int i = 0; i < n; i++)
        if (!strcmp(said[i], what)) return;
    if (n < KEEP) snprintf(said[n++], sizeof said[0], "%s", what);
    fprintf(stderr, "neox cuda: attention: %s\n", what);
}

// cuDNN's (B, heads, T, HS) strides of a view.
static void strides_of(int64_t stride[4], neox_head_strides v) {
    stride[0] = (int64_t)v.batch, stride[1] = (int64_t)v.head, stride[2] = (int64_t)v.row, stride[3] = 1;
}

static neox_cudnn_sdpa sdpa_shape(int B, int T, int NH, int NKV, int HS, const neox_attention_opts *o) {
    neox_cudnn_sdpa s;
    memset(&s, 0, sizeof s);
    s.B = B, s.H = NH, s.Hkv = NKV, s.T = T, s.HS = HS;
    s.causal = 1, s.window = o->window, s.scale = o->scale;
    // q, k, v (B, heads, T, HS) by their views (split, or in the fused QKV buffer); out (B, T, NH, HS)
    // as the ops return it
    strides_of(s.q_stride, neox_head_strides_of(o->views.q, NH, T, HS));
    strides_of(s.k_stride, neox_head_strides_of(o->views.k, NKV, T, HS));
    strides_of(s.v_stride, neox_head_strides_of(o->views.v, NKV, T, HS));
    neox_cudnn_strides_bthd(s.o_stride, NH, T, HS);
    return s;
}

// The own 16-bit kernels: the pipelined ones (attention_fa2.cu) unless NEOX_ATTENTION_KERNELS=first
// or neox_cuda_attention_kernels(0) asks for the first ones (attention_mma.cu), kept until GPU hosts
// have run the pipelined kernels. Any other value of the variable is refused, so a typo cannot run
// the kernel it meant to avoid.
int neox_cuda_attention_pipelined(void) {
    if (g_pipelined < 0) {
        const char *e = getenv("NEOX_ATTENTION_KERNELS");
        if (e && *e && strcmp(e, "first") && strcmp(e, "pipelined")) {
            fprintf(stderr, "neox cuda: NEOX_ATTENTION_KERNELS=%s: expected 'pipelined' or 'first'\n", e);
            exit(2);
        }
        g_pipelined = !(e && !strcmp(e, "first"));
    }
    notice(g_pipelined ? "own kernels: pipelined (attention_fa2.cu)" : "own kernels: first (attention_mma.cu)");
    return g_pipelined;
}

// cuDNN runs a call when: it is allowed (config key cudnn_attention), the operands are bf16 (fp16
// and fp32 stay on the own kernels), there is no attention dropout (the own kernels draw the CPU's
// masks; cuDNN's Philox masks differ) and no ALiBi, libcudnn loads, and cuDNN builds plans for the
// shape (plans and refusals are cached per shape). Forward and backward of one shape decide alike.
static int use_cudnn(const neox_cudnn_sdpa *s, const neox_attention_opts *o, size_t *fwd_ws, size_t *bwd_ws) {
    char why[320], line[400];
    const char *rule = !g_cudnn_allowed                    ? "own tensor-core kernels (cudnn_attention: false)"
                       : o->operands != NEOX_ELEM_BF16 ? "own tensor-core kernels (fp16 operands: cuDNN is used for bf16 only)"
                       : o->dropout > 0.0f             ? "own tensor-core kernels (attention dropout)"
                       : o->alibi                      ? "own tensor-core kernels (ALiBi)"
                                                       : NULL;
    if (rule) return notice(rule), 0;
    if (!neox_cudnn_sdpa_prepare(s, fwd_ws, bwd_ws, why, sizeof why)) {
        snprintf(line, sizeof line, "own tensor-core kernels (cuDNN: %s)", why);
        notice(line);
        return 0;
    }
    snprintf(line, sizeof line, "cuDNN %s fused attention (bf16, deterministic backward)", neox_cudnn_version());
    notice(line);
    return 1;
}

// Carves consecutive 256-byte-aligned pieces out of one scratch buffer.
static size_t piece(size_t *at, size_t bytes) {
    size_t start = *at;
    *at += (bytes + 255) & ~(size_t)255;
    return start;
}

// A cuDNN failure after its plans were built is a bug or a lost device, like a failing kernel.
static void check_ran(int ok, const char *what, const char *why) {
    if (ok) return;
    fprintf(stderr, "neox cuda: cuDNN attention %s failed: %s\n", what, why);
    abort();
}

// A bf16 view of n elements of x stored as act: x itself under bf16, else a copy cast into the
// scratch piece at `at` of base.
static const uint16_t *bf16_view(const void *x, size_t n, neox_elem act, char *base, size_t at) {
    if (act == NEOX_ELEM_BF16) return (const uint16_t *)x;
    uint16_t *copy = (uint16_t *)(base + at);
    neox_cuda_cast_f32_to_bf16(copy, (const float *)x, n);
    return copy;
}
// Where cuDNN writes a result bound for x: x itself under bf16, else the scratch piece at `at`.
static uint16_t *bf16_dest(void *x, neox_elem act, char *base, size_t at) {
    return act == NEOX_ELEM_BF16 ? (uint16_t *)x : (uint16_t *)(base + at);
}
// Widens a result written at bf16_dest's address into fp32-stored x (nothing under bf16).
static void bf16_back(void *x, const uint16_t *vals, size_t n, neox_elem act) {
    if (act != NEOX_ELEM_BF16) neox_cuda_cast_bf16_to_f32((float *)x, vals, n);
}
// The bytes of a scratch piece for n elements: none under bf16 storage.
static size_t copy_bytes(size_t n, neox_elem act) { return act == NEOX_ELEM_BF16 ? 0 : n * 2; }

// out: (B, T, NH, HS), lse: (B, NH, T); q: (B, NH, T, HS); k, v: (B, NKV, T, HS), stored as act, laid
// out by o.views (views other than contiguous ones only under bf16 storage: the copies below are dense).
int neox_cuda_attention_cudnn_forward(void *out, float *lse, const void *q, const void *k, const void *v, int B,
                                      int T, int NH, int NKV, int HS, neox_attention_opts o, neox_elem act) {
    neox_cudnn_sdpa s = sdpa_shape(B, T, NH, NKV, HS, &o);
    size_t fwd_ws = 0, bwd_ws = 0;
    if (B <= 0 || T <= 0 || !use_cudnn(&s, &o, &fwd_ws, &bwd_ws)) return 0;
    size_t nq = (size_t)B * NH * T * HS, nkv = (size_t)B * NKV * T * HS, at = 0;
    size_t pq = piece(&at, copy_bytes(nq, act)), pk = piece(&at, copy_bytes(nkv, act));
    size_t pv = piece(&at, copy_bytes(nkv, act)), po = piece(&at, copy_bytes(nq, act));
    size_t pw = piece(&at, fwd_ws);
    char *base = (char *)neox_cuda_scratch(at);
    const uint16_t *q16 = bf16_view(q, nq, act, base, pq), *k16 = bf16_view(k, nkv, act, base, pk);
    const uint16_t *v16 = bf16_view(v, nkv, act, base, pv);
    uint16_t *o16 = bf16_dest(out, act, base, po);
    char why[320];
    check_ran(neox_cudnn_sdpa_forward(&s, o16, lse, q16, k16, v16, base + pw, neox_cuda_current_stream(), why,
                                      sizeof why),
              "forward", why);
    bf16_back(out, o16, nq, act);
    return 1;
}

// dq: (B, NH, T, HS), dk, dv: (B, NKV, T, HS) overwritten (through the views of q, k, v); dout, out:
// (B, T, NH, HS); lse from the cuDNN forward (the same log-sum-exp the own kernels keep); all stored as act.
int neox_cuda_attention_cudnn_backward(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                                       const void *v, const void *out, const float *lse, int B, int T, int NH,
                                       int NKV, int HS, neox_attention_opts o, neox_elem act) {
    neox_cudnn_sdpa s = sdpa_shape(B, T, NH, NKV, HS, &o);
    size_t fwd_ws = 0, bwd_ws = 0;
    if (B <= 0 || T <= 0 || !use_cudnn(&s, &o, &fwd_ws, &bwd_ws)) return 0;
    size_t nq = (size_t)B * NH * T * HS, nkv = (size_t)B * NKV * T * HS, at = 0;
    size_t bq = copy_bytes(nq, act), bkv = copy_bytes(nkv, act);
    size_t pq = piece(&at, bq), pk = piece(&at, bkv), pv = piece(&at, bkv), po = piece(&at, bq);
    size_t pdo = piece(&at, bq), pdq = piece(&at, bq), pdk = piece(&at, bkv), pdv = piece(&at, bkv);
    size_t pw = piece(&at, bwd_ws);
    char *base = (char *)neox_cuda_scratch(at);
    const uint16_t *q16 = bf16_view(q, nq, act, base, pq), *k16 = bf16_view(k, nkv, act, base, pk);
    const uint16_t *v16 = bf16_view(v, nkv, act, base, pv), *o16 = bf16_view(out, nq, act, base, po);
    const uint16_t *do16 = bf16_view(dout, nq, act, base, pdo);
    uint16_t *dq16 = bf16_dest(dq, act, base, pdq), *dk16 = bf16_dest(dk, act, base, pdk);
    uint16_t *dv16 = bf16_dest(dv, act, base, pdv);
    char why[320];
    check_ran(neox_cudnn_sdpa_backward(&s, dq16, dk16, dv16, do16, q16, k16, v16, o16, lse, base + pw,
                                       neox_cuda_current_stream(), why, sizeof why),
              "backward", why);
    bf16_back(dq, dq16, nq, act);
    bf16_back(dk, dk16, nkv, act);
    bf16_back(dv, dv16, nkv, act);
    return 1;
}
