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

static int g_pipelined = -1;  // -1: not chosen yet (the environment decides on first use)
static int g_single_pass = -1;  // likewise

extern "C" void neox_cuda_attention_cudnn(int allow) { neox_attention_allow_cudnn(allow); }
extern "C" void neox_cuda_attention_kernels(int pipelined) { g_pipelined = pipelined != 0; }
extern "C" void neox_cuda_attention_backward_passes(int passes) { g_single_pass = passes ? passes == 1 : -1; }

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

// Context parallelism's query chunks (kernels.h's q_rows, q_split, q_pos0, q_pos1): a call's queries
// are one or two runs of consecutive positions; run c is n rows from row r0 at positions pos.., and
// sees keys 0 .. pos + n - 1 only, so cuDNN takes it as its own call: the last n of pos + n positions,
// causal from the bottom-right corner. Without context parallelism: one run, all T rows from 0.
typedef struct {
    int r0, n, pos;
} query_run;

static int query_runs(const neox_attention_opts *o, int T, query_run runs[2]) {
    int Tq = neox_attention_query_rows(o, T);
    if (o->q_split > 0 && o->q_split < Tq) {
        runs[0] = query_run{0, o->q_split, o->q_pos0};
        runs[1] = query_run{o->q_split, Tq - o->q_split, o->q_pos1};
        return 2;
    }
    runs[0] = query_run{0, Tq, o->q_pos0};
    return 1;
}

// cuDNN's (B, heads, T, HS) strides of a view.
static void strides_of(int64_t stride[4], neox_head_strides v) {
    stride[0] = (int64_t)v.batch, stride[1] = (int64_t)v.head, stride[2] = (int64_t)v.row, stride[3] = 1;
}

// The shape of run r of a call over T keys with Tq query rows: q (B, NH, Tq, HS), k, v (B, NKV, T,
// HS) by their views, out (B, Tq, NH, HS) as the ops return it; the run's rows are reached
// through these strides from its first row (run_offsets).
static neox_cudnn_sdpa sdpa_shape(int B, int T, int NH, int NKV, int HS, const neox_attention_opts *o, query_run r) {
    neox_cudnn_sdpa s;
    memset(&s, 0, sizeof s);
    int Tq = neox_attention_query_rows(o, T);
    s.B = B, s.H = NH, s.Hkv = NKV, s.T = r.pos + r.n, s.HS = HS, s.Tq = r.n;
    s.causal = 1, s.window = o->window, s.scale = o->scale;
    // q (B, NH, Tq, HS), k, v (B, NKV, T, HS) by their views (split, or in the fused QKV buffer; the
    // fused route never has query positions); out (B, Tq, NH, HS) as the ops return it
    strides_of(s.q_stride, neox_head_strides_of(o->views.q, NH, Tq, HS));
    strides_of(s.k_stride, neox_head_strides_of(o->views.k, NKV, T, HS));
    strides_of(s.v_stride, neox_head_strides_of(o->views.v, NKV, T, HS));
    neox_cudnn_strides_bthd(s.o_stride, NH, Tq, HS);
    return s;
}

// Element offsets of run r's first row in q (and dq, laid out alike: o.views.q, Tq rows) and in out
// (and dout). (Under context parallelism q may be a view of the fused QKV buffer, rows W apart.)
typedef struct {
    size_t q, o;
} run_offsets;
static run_offsets offsets_of(query_run r, const neox_attention_opts &o, int Tq, int NH, int HS) {
    run_offsets at = {(size_t)r.r0 * neox_head_strides_of(o.views.q, NH, Tq, HS).row, (size_t)r.r0 * NH * HS};
    return at;
}

// cuDNN takes a run's statistics dense, (B, NH, n) (before 9.26 its backward takes no other), while
// lse (B, NH, Tq) holds all runs' rows: copies between run r's rows of lse and a dense piece.
static void stats_copy(float *dst, const float *src, query_run r, int B, int NH, int Tq, int to_lse) {
    size_t run = (size_t)r.n * sizeof(float), whole = (size_t)Tq * sizeof(float);
    const float *from = to_lse ? src : src + r.r0;
    float *to = to_lse ? dst + r.r0 : dst;
    CUDA_CHECK(cudaMemcpy2DAsync(to, to_lse ? whole : run, from, to_lse ? run : whole, run, (size_t)B * NH,
                                 cudaMemcpyDeviceToDevice, neox_cuda_current_stream()));
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

// The pipelined kernels' backward: one pass over key blocks with dq added in a fixed order (the
// default) unless NEOX_ATTENTION_BACKWARD=two-pass or neox_cuda_attention_backward_passes(2) asks for
// the two passes (dq, then dk and dv), kept until GPU hosts have run the single pass. Any other value
// is refused, as NEOX_ATTENTION_KERNELS's.
int neox_cuda_attention_single_pass(void) {
    if (g_single_pass < 0) {
        const char *e = getenv("NEOX_ATTENTION_BACKWARD");
        if (e && *e && strcmp(e, "single-pass") && strcmp(e, "two-pass")) {
            fprintf(stderr, "neox cuda: NEOX_ATTENTION_BACKWARD=%s: expected 'single-pass' or 'two-pass'\n", e);
            exit(2);
        }
        g_single_pass = !(e && !strcmp(e, "two-pass"));
    }
    notice(g_single_pass ? "pipelined backward: single pass, ordered dq (attention_fa2.cu)"
                         : "pipelined backward: two passes (attention_fa2.cu)");
    return g_single_pass;
}

// cuDNN runs a call when the route's rule allows it (kernels/attention_route.c: cudnn_attention, bf16
// operands, no attention dropout, no ALiBi), libcudnn loads, and cuDNN builds plans for the shape of
// each of its query runs (plans and refusals are cached per shape). Forward and backward of one shape
// decide alike. *fwd_ws, *bwd_ws: the most workspace any run's plans need.
static int use_cudnn(const neox_cudnn_sdpa *s, int nruns, const neox_attention_opts *o, size_t *fwd_ws,
                     size_t *bwd_ws) {
    char why[320], line[400];
    const char *rule = neox_attention_own_reason(o);
    if (rule) {
        snprintf(line, sizeof line, "own tensor-core kernels (%s)", rule);
        return notice(line), 0;
    }
    *fwd_ws = *bwd_ws = 0;
    for (int r = 0; r < nruns; r++) {
        size_t fw = 0, bw = 0;
        if (!neox_cudnn_sdpa_prepare(&s[r], &fw, &bw, why, sizeof why)) {
            snprintf(line, sizeof line, "own tensor-core kernels (cuDNN%s: %s)",
                     nruns > 1 ? ", context-parallel query chunks" : "", why);
            notice(line);
            return 0;
        }
        *fwd_ws = fw > *fwd_ws ? fw : *fwd_ws;
        *bwd_ws = bw > *bwd_ws ? bw : *bwd_ws;
    }
    snprintf(line, sizeof line, "cuDNN %s fused attention (bf16, deterministic backward%s)", neox_cudnn_version(),
             nruns > 1 ? ", one call per context-parallel query chunk" : "");
    notice(line);
    return 1;
}

// The shapes of a call's query runs (query_runs); their count.
static int run_shapes(neox_cudnn_sdpa s[2], query_run runs[2], int B, int T, int NH, int NKV, int HS,
                      const neox_attention_opts *o) {
    int n = query_runs(o, T, runs);
    for (int r = 0; r < n; r++) s[r] = sdpa_shape(B, T, NH, NKV, HS, o, runs[r]);
    return n;
}

// Two query runs' key gradients into one: dk (of the later run, over keys 0 .. T_late - 1) plus part
// (of the earlier run, over keys 0 .. T_early - 1, T_early <= T_late) for j < T_early, summed in fp32
// and rounded once; zero at keys past T_late, which no query of the call sees. (B NKV, T, HS) bf16,
// dense. Deterministic: one thread per element, the same order every run.
__global__ void merge_run_grads_kernel(uint16_t *dk, const uint16_t *part, size_t n, int T, int HS, int T_early,
                                       int T_late) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int j = (int)(i / HS % T);
        __nv_bfloat16 *d = reinterpret_cast<__nv_bfloat16 *>(dk + i);
        if (j >= T_late) *d = __float2bfloat16_rn(0.0f);
        else if (j < T_early)
            *d = __float2bfloat16_rn(__bfloat162float(*d) + __bfloat162float(reinterpret_cast<const __nv_bfloat16 *>(part)[i]));
    }
}

static void merge_run_grads(uint16_t *dk, const uint16_t *part, size_t n, int T, int HS, int T_early, int T_late) {
    if (n == 0) return;
    merge_run_grads_kernel<<<blocks_for(n, 256), 256, 0, neox_cuda_current_stream()>>>(dk, part, n, T, HS, T_early,
                                                                                        T_late);
    CUDA_LAUNCHED();
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

// out: (B, Tq, NH, HS), lse: (B, NH, Tq); q: (B, NH, Tq, HS); k, v: (B, NKV, T, HS), stored as act,
// laid out by o.views (views other than contiguous ones only under bf16 storage: the copies below
// are dense); Tq = T unless o's query positions say otherwise (context parallelism: one cuDNN call
// per query run).
int neox_cuda_attention_cudnn_forward(void *out, float *lse, const void *q, const void *k, const void *v, int B,
                                      int T, int NH, int NKV, int HS, neox_attention_opts o, neox_elem act) {
    neox_cudnn_sdpa s[2];
    query_run runs[2];
    size_t fwd_ws = 0, bwd_ws = 0;
    if (B <= 0 || T <= 0) return 0;
    int nruns = run_shapes(s, runs, B, T, NH, NKV, HS, &o);
    if (!use_cudnn(s, nruns, &o, &fwd_ws, &bwd_ws)) return 0;
    int Tq = neox_attention_query_rows(&o, T);
    size_t nq = (size_t)B * NH * Tq * HS, nkv = (size_t)B * NKV * T * HS, at = 0;
    size_t pq = piece(&at, copy_bytes(nq, act)), pk = piece(&at, copy_bytes(nkv, act));
    size_t pv = piece(&at, copy_bytes(nkv, act)), po = piece(&at, copy_bytes(nq, act));
    size_t pst = piece(&at, nruns > 1 ? (size_t)B * NH * Tq * sizeof(float) : 0), pw = piece(&at, fwd_ws);
    char *base = (char *)neox_cuda_scratch(at);
    const uint16_t *q16 = bf16_view(q, nq, act, base, pq), *k16 = bf16_view(k, nkv, act, base, pk);
    const uint16_t *v16 = bf16_view(v, nkv, act, base, pv);
    uint16_t *o16 = bf16_dest(out, act, base, po);
    char why[320];
    for (int r = 0; r < nruns; r++) {
        run_offsets x = offsets_of(runs[r], o, Tq, NH, HS);
        float *stats = nruns > 1 ? (float *)(base + pst) : lse;
        check_ran(neox_cudnn_sdpa_forward(&s[r], o16 + x.o, stats, q16 + x.q, k16, v16, base + pw,
                                          neox_cuda_current_stream(), why, sizeof why),
                  "forward", why);
        if (nruns > 1) stats_copy(lse, stats, runs[r], B, NH, Tq, 1);
    }
    bf16_back(out, o16, nq, act);
    return 1;
}

// dq: (B, NH, Tq, HS), dk, dv: (B, NKV, T, HS) overwritten (through the views of q, k, v); dout,
// out: (B, Tq, NH, HS); lse from the cuDNN forward (the same log-sum-exp the own kernels keep); all
// stored as act. With two query runs the later (whose keys reach further) writes dk and dv, the
// earlier writes a copy that is added to them (merge_run_grads).
int neox_cuda_attention_cudnn_backward(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                                       const void *v, const void *out, const float *lse, int B, int T, int NH,
                                       int NKV, int HS, neox_attention_opts o, neox_elem act) {
    neox_cudnn_sdpa s[2];
    query_run runs[2];
    size_t fwd_ws = 0, bwd_ws = 0;
    if (B <= 0 || T <= 0) return 0;
    int nruns = run_shapes(s, runs, B, T, NH, NKV, HS, &o);
    if (!use_cudnn(s, nruns, &o, &fwd_ws, &bwd_ws)) return 0;
    int Tq = neox_attention_query_rows(&o, T);
    size_t nq = (size_t)B * NH * Tq * HS, nkv = (size_t)B * NKV * T * HS, at = 0;
    size_t bq = copy_bytes(nq, act), bkv = copy_bytes(nkv, act), bpart = nruns > 1 ? nkv * 2 : 0;
    size_t pq = piece(&at, bq), pk = piece(&at, bkv), pv = piece(&at, bkv), po = piece(&at, bq);
    size_t pdo = piece(&at, bq), pdq = piece(&at, bq), pdk = piece(&at, bkv), pdv = piece(&at, bkv);
    size_t pek = piece(&at, bpart), pev = piece(&at, bpart), pw = piece(&at, bwd_ws);
    size_t pst = piece(&at, nruns > 1 ? (size_t)B * NH * Tq * sizeof(float) : 0);
    char *base = (char *)neox_cuda_scratch(at);
    const uint16_t *q16 = bf16_view(q, nq, act, base, pq), *k16 = bf16_view(k, nkv, act, base, pk);
    const uint16_t *v16 = bf16_view(v, nkv, act, base, pv), *o16 = bf16_view(out, nq, act, base, po);
    const uint16_t *do16 = bf16_view(dout, nq, act, base, pdo);
    uint16_t *dq16 = bf16_dest(dq, act, base, pdq), *dk16 = bf16_dest(dk, act, base, pdk);
    uint16_t *dv16 = bf16_dest(dv, act, base, pdv);
    char why[320];
    for (int r = nruns - 1; r >= 0; r--) {  // the later run first: it writes dk and dv
        run_offsets x = offsets_of(runs[r], o, Tq, NH, HS);
        bool late = r == nruns - 1;
        uint16_t *gk = late ? dk16 : (uint16_t *)(base + pek), *gv = late ? dv16 : (uint16_t *)(base + pev);
        const float *stats = lse;
        if (nruns > 1) stats_copy((float *)(base + pst), lse, runs[r], B, NH, Tq, 0), stats = (float *)(base + pst);
        check_ran(neox_cudnn_sdpa_backward(&s[r], dq16 + x.q, gk, gv, do16 + x.o, q16 + x.q, k16, v16, o16 + x.o,
                                           stats, base + pw, neox_cuda_current_stream(), why, sizeof why),
                  "backward", why);
    }
    if (nruns > 1) {
        merge_run_grads(dk16, (const uint16_t *)(base + pek), nkv, T, HS, s[0].T, s[1].T);
        merge_run_grads(dv16, (const uint16_t *)(base + pev), nkv, T, HS, s[0].T, s[1].T);
    } else if (s[0].T < T) {  // one run ending before the last key: no query sees the rest
        merge_run_grads(dk16, dk16, nkv, T, HS, 0, s[0].T);
        merge_run_grads(dv16, dv16, nkv, T, HS, 0, s[0].T);
    }
    bf16_back(dq, dq16, nq, act);
    bf16_back(dk, dk16, nkv, act);
    bf16_back(dv, dv16, nkv, act);
    return 1;
}
