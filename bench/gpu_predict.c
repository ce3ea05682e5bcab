// gpu_predict.c: a GPU training step's time and MFU predicted on this machine, from the step's real
// op trace. The model (lib/model) issues one training step — zero the gradients, forward, backward,
// then the update as lib/train's device step queues it (the gradients' sum of squares, clipping,
// AdamW over every tensor behind the norm's guard) — on the dry backend (kernels/dry.c: ops that do
// nothing, allocations that are addresses only) under the per-op profile, which keeps every call with
// its cost (kernels/op_cost.c: FLOPs of the products, bytes moved). Each call is then priced as a
// roofline, max(FLOPs / the GEMM rate of its operands, bytes / copy bandwidth) + a launch overhead
// (the bytes of a pass the op runs apart from its products, such as a 16-bit bias gradient's column
// sums, priced after the max rather than inside it),
// on an H100 and an H200 (16-bit attention at its kernels' modelled share of the GEMM rate, below);
// the sum is the step, and MFU is GPT-NeoX's model FLOPs (lib/metrics/flops.c) over that time against
// the nominal dense bf16 peak the trainer's runtime/mfu uses (989 TFLOP/s).
// It prints a table by op class (so the next change can be chosen from data) and one line per model
// and GPU. The dry backend's peak is what the step's allocations hold, and picks the micro-batch.
//
// Rates (docs/cuda.md, "Predicting a step"): on the H200, bench/gpu_ops measured bf16 GEMM 692.8 and
// fp32 GEMM 51.1 TFLOP/s and a 3942 GB/s copy; the H100 SXM gets the same GEMM rates (NVIDIA's data
// sheets give both 989 TFLOP/s dense bf16 and 67 TFLOP/s fp32) and the copy scaled by the data sheets'
// memory bandwidths, 3.35 / 4.8 TB/s. gemm_tflops=, fp32_tflops=, copy_gbs= replace the measured
// GPU's (measured_on=) figures, as tests/gpu/device-check.sh does with its own bench/gpu_ops run.
//
// Usage: gpu_predict [CONFIG.yml...] [key=value...]
//   no CONFIG: GPT-NeoX 125M, 350M and 1.3B as bench/gpu_train.sh trains them (bf16, seq 2048)
//   keys: micro (0: the largest of 32, 16, 8 whose allocations fit the GPU; else the config's or this)
//         cudnn (the config's cudnn_attention, true for the built-in models; 0: attention on the own kernels)
//         cudnn_mlp (1: the MLP's first product and its GELU, and the second's input gradient with GELU's
//         backward, and the QKV product with its fp32 bias, as cuDNN graphs where the route's rules
//         allow, at the bf16 GEMM rate; 0: a host without cuDNN, the GELU passes apart, the QKV
//         product through fp32 rows)
//         vocab (50257, the tokenizer's, padded as GPT-NeoX pads it)  launch_us (4)  table (1; 2: also by op, on the H200)
//         attention_tflops (attention's FLOPs at this rate, a kernel's measured one, not the GEMM rate)
//         gemm_tflops fp32_tflops copy_gbs measured_on (H200)
//         check (0; 1: compare the dry trace of the first config with the trace of a computed step on
//         the CPU backend, call by call, and exit 1 on any difference)
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "core.h"
#include "kernels/backend.h"
#include "metrics.h"
#include "model.h"

typedef struct gpu {
    const char *name;
    double memory;        // bytes the step's allocations may hold (about what cudaMalloc can take)
    double gemm16, gemm32, copy;  // FLOP/s on 16-bit and fp32 operands, bytes/s read + written
} gpu;

// H200 as measured by bench/gpu_ops; H100 SXM from it by the data sheets' ratios (see above).
#define H100_COPY_RATIO (3.35 / 4.8)
static gpu gpus[2] = {
    {"H100", 79.1 * 1073741824.0, 692.8e12, 51.1e12, 3942e9 * H100_COPY_RATIO},
    {"H200", 139.8 * 1073741824.0, 692.8e12, 51.1e12, 3942e9},
};
#define NOMINAL_BF16_PEAK 989e12

// 16-bit attention is priced at the rate of the implementation the route's rule picks for the call
// (kernels/attention_route.c, recorded by op_cost as cost.cudnn), its FLOPs op_cost's (causal pairs,
// 2 products forward, 5 backward, as FlashAttention's papers count them):
// - cuDNN (bf16, no dropout, no ALiBi; cudnn_attention): the published rates of cuDNN's fused
//   attention on an H100 SXM5 at head size 64 and sequence 2k (FlashAttention-3's paper, Shah et al.
//   2024, figures 5-6): forward with the causal mask 334 TFLOP/s; backward 395 without the mask, taken
//   at the forward's causal/non-causal ratio (334/395) as 334 with it. The H200 has the same SMs and
//   clocks, and attention at this size is bound by them, so it gets the same rates.
// - the own pipelined kernels (kernels/cuda/attention_fa2.cu), a fraction of the 16-bit GEMM rate:
//   forward 0.35: FlashAttention-2, with the same techniques (mma.sync, cp.async double buffering,
//   ldmatrix, 128-query tiles), reports 50-73% of an A100's peak and about a third of an H100's
//   (no wgmma); these kernels are simpler (64-key tiles, no software pipelining of the products), so
//   35% of the GEMM rate cuBLAS reaches on the same GPU. The diagonal tiles' masked half adds about
//   80/T to the work (4% at T 2048), inside that figure. Backward 0.35 x 0.7 x 0.78: FlashAttention-2's
//   backward runs at about 0.7 of its forward's rate with the same five products in one pass; the
//   default single pass adds dq in a fixed order instead of with FlashAttention-2's fire-and-forget
//   atomics, and 0.78 is what that exposes. Per 64-query tile a block computes 5 products of 64 x 128
//   x HS (5.2 MFLOP at HS 64: about 4.1 us on one SM at 0.245 of 692.8 TFLOP/s over 132 SMs); its turn
//   then waits on an L2 load of its dq rows, the add, a fence and the counter's hand-over, about 1 us
//   not hidden (one block per SM at HS 64 and up: nothing else runs meanwhile), and the cast of the fp32
//   accumulator into dq afterwards adds about 3% (8 bytes per dq element against the products' FLOPs):
//   4.1 / (4.1 + 1 + 0.12) = 0.78. Waiting for a turn costs little: the blocks of one (batch, kv head)
//   add in descending key order and start in that order, so the block waited for is ahead of the
//   waiter by two tiles. The two passes (NEOX_ATTENTION_BACKWARD=two-pass) would be 5/7 (seven
//   products for the five counted) instead of 0.78.
// Neither is measured here yet: no GPU host has run them. attention_tflops= replaces both with a
// measured rate.
#define CUDNN_ATTENTION_FORWARD_TFLOPS 334.0
#define CUDNN_ATTENTION_BACKWARD_TFLOPS 334.0
#define ATTENTION_FORWARD_EFFICIENCY 0.35
#define ATTENTION_BACKWARD_EFFICIENCY (0.35 * 0.7 * 0.78)

typedef struct options {
    int micro, vocab, table, check;
    int cudnn;         // -1: the config's cudnn_attention (true for the built-in models); else 0 or 1
    int cudnn_mlp;     // 1: the MLP's products with their GELU as cuDNN graphs (the route's rule); 0: no cuDNN
    double launch;     // seconds per op call
    double attention;  // > 0: attention's FLOP/s (a kernel's measured rate) instead of its operands' GEMM rate
} options;

// The three models of bench/gpu_train.sh's template (its YAML, less the data keys).
static const char *const TEMPLATE =
    "{\"num_layers\": %d, \"hidden_size\": %d, \"num_attention_heads\": %d, \"seq_length\": 2048,\n"
    " \"max_position_embeddings\": 2048, \"norm\": \"layernorm\", \"pos_emb\": \"rotary\", \"no_weight_tying\": true,\n"
    " \"gpt_j_residual\": false, \"init_method\": \"small_init\", \"output_layer_init_method\": \"wang_init\",\n"
    " \"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 0.0006, \"betas\": [0.9, 0.95], \"eps\": 1.0e-8}},\n"
    " \"gradient_clipping\": 1.0, \"weight_decay\": 0.1, \"hidden_dropout\": 0.0, \"attention_dropout\": 0.0,\n"
    " \"checkpoint_activations\": false, \"precision\": \"bfloat16\", \"train_micro_batch_size_per_gpu\": 32,\n"
    " \"gradient_accumulation_steps\": 1, \"tokenizer_type\": \"GPT2BPETokenizer\"}\n";
static const struct { const char *name; int layers, hidden, heads; } BUILTIN[] = {
    {"125M", 12, 768, 12}, {"350M", 24, 1024, 16}, {"1.3B", 24, 2048, 16}};

// One model to predict: its description, precision, sequence and configured micro-batch.
typedef struct model_spec {
    char name[256];
    neox_model_desc desc;
    neox_precision precision;
    int seq, micro;
    int cudnn;  // whether bf16 attention may run on cuDNN (the route's rule, kernels/attention_route.c)
    int cudnn_mlp;  // whether the MLP's bf16 products may run as cuDNN graphs (kernels/linear_act_route.c)
} model_spec;

static void load_spec(model_spec *s, const char *name, const char *path, const options *o) {
    neox_error err = {0};
    neox_config_options co = {.world_size = 1, .quiet = 1};
    neox_config *cfg = neox_config_load(&path, 1, &co, &err);
    if (!cfg || neox_model_desc_from_config(&s->desc, cfg, o->vocab, &err) != 0 ||
        neox_precision_parse(neox_config_str(cfg, precision), &s->precision) != 0)
        neox_die(2, "%s: %s", path, err.message[0] ? err.message : "unknown precision");
    snprintf(s->name, sizeof s->name, "%s", name);
    s->seq = (int)neox_config_int(cfg, seq_length);
    s->micro = (int)neox_config_int(cfg, train_micro_batch_size_per_gpu);
    s->cudnn = o->cudnn >= 0 ? o->cudnn : neox_config_bool(cfg, cudnn_attention);
    s->cudnn_mlp = o->cudnn_mlp;
    if (s->desc.moe_experts > 1) neox_die(2, "%s: Mixture-of-Experts routing depends on the data; not predicted", path);
    neox_config_free(cfg);
}

static void builtin_spec(model_spec *s, int i, const options *o) {
    char path[] = "/tmp/gpu_predict.XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) neox_die(1, "cannot write a temporary config");
    fprintf(f, TEMPLATE, BUILTIN[i].layers, BUILTIN[i].hidden, BUILTIN[i].heads);
    fclose(f);
    load_spec(s, BUILTIN[i].name, path, o);
    unlink(path);
}

// ---- the step --------------------------------------------------------------------------------
typedef struct step_state {
    neox_model *m;
    float *mom, *vel;
    double *sumsq;
    neox_step_scalars *sc;  // the update's learning rate and step, in be's memory
    neox_segment *segs;
    int *ids;
} step_state;

// The model on be (already the profiled table), planned for (micro, seq); real weights only on a
// computing backend (a dry one has no memory to put them in).
static step_state *open_step(const model_spec *s, const neox_backend *be, int micro, int init) {
    neox_error err = {0};
    step_state *st = neox_calloc(1, sizeof *st);
    neox_model_desc d = s->desc;
    st->m = neox_model_create_on(&d, be, &err);
    if (!st->m) neox_die_error(&err);
    neox_model_set_fused_head(st->m, 1);  // as neox-train's last stage does here (lib/train/setup.c)
    if (neox_model_plan(st->m, micro, s->seq, &err) != 0) neox_die_error(&err);
    if (init) neox_model_init(st->m, 1234);
    neox_model_set_precision(st->m, s->precision);
    st->m->training = 1;
    size_t n = st->m->num_floats;
    st->mom = be->alloc(n * sizeof(float));
    st->vel = be->alloc(n * sizeof(float));
    st->sumsq = be->alloc(sizeof(double));
    st->sc = be->alloc(sizeof *st->sc);
    neox_step_scalars sc = {.lr = 6e-4f, .step = 1};
    be->to_device(st->sc, &sc, sizeof sc);
    be->memset_zero(st->mom, n * sizeof(float));
    be->memset_zero(st->vel, n * sizeof(float));
    st->segs = neox_malloc((size_t)st->m->nparams * sizeof *st->segs);
    for (int i = 0; i < st->m->nparams; i++) {
        const neox_param *p = &st->m->params[i];
        st->segs[i] = (neox_segment){p->offset, p->offset + p->numel, p->no_decay ? 0.0f : 0.1f};
    }
    size_t tokens = (size_t)micro * s->seq;
    st->ids = neox_malloc((tokens + 1) * sizeof(int));
    for (size_t i = 0; i <= tokens; i++) st->ids[i] = (int)(neox_hash64(42, i) % (unsigned long long)s->desc.vocab_size);
    return st;
}

static void close_step(step_state *st) {
    const neox_backend *be = st->m->be;
    be->free(st->mom), be->free(st->vel), be->free(st->sumsq), be->free(st->sc);
    neox_model_free(st->m);
    free(st->segs), free(st->ids), free(st);
}

// One training step as neox-train issues it on one GPU (lib/train/step.c, device_step).
static void issue_step(step_state *st) {
    neox_model *m = st->m;
    const neox_backend *be = m->be;
    neox_error err = {0};
    neox_model_zero_grad(m);
    m->head_loss_scale = 1.0f;  // the backward's loss scale (bf16: none), which the fused loss applies
    if (neox_model_forward(m, st->ids, st->ids + 1, NULL, &err) != 0) neox_die_error(&err);
    neox_model_backward(m, 1.0f);
    be->sum_squares_segments_into(st->sumsq, m->grad_buf, st->segs, m->nparams);
    be->clip_by_norm(m->grad_buf, m->num_floats, st->sumsq, 1.0, NULL, 1.0);
    be->adamw_segments(m->param_buf, m->grad_buf, st->mom, st->vel, st->segs, m->nparams, st->sc, 0.9f, 0.95f, 1e-8f,
                       1.0f, st->sumsq);
    neox_model_weights_changed(m);
}

// The trace of one step on inner (a copy the caller frees); *peak: inner's peak allocation.
static neox_op_call *trace_step(const model_spec *s, const neox_backend *inner, int micro, size_t *ncalls,
                                double *peak) {
    const neox_backend *be = neox_profile_install(inner, 1);
    neox_attention_allow_cudnn(s->cudnn);  // (op_cost records the route each attention call takes)
    neox_linear_act_allow_cudnn(s->cudnn_mlp);  // (and prices each linear_act call by its route)
    step_state *st = open_step(s, be, micro, strcmp(inner->name, "dry") != 0);
    neox_profile_reset();  // (the set-up's ops are not the step's)
    issue_step(st);
    be->synchronize();
    const neox_op_call *calls = neox_profile_trace(ncalls);
    neox_op_call *copy = neox_malloc((*ncalls ? *ncalls : 1) * sizeof *copy);
    memcpy(copy, calls, *ncalls * sizeof *copy);
    if (peak) *peak = (double)inner->peak_bytes();
    close_step(st);
    return copy;
}

// ---- the roofline ------------------------------------------------------------------------------
static double call_seconds(const neox_op_call *c, const gpu *g, const options *o) {
    double rate = c->cost.tensor16 ? g->gemm16 : g->gemm32;
    int attention = neox_op_class_of(c->op) == NEOX_CLASS_ATTENTION;
    int backward = c->op == NEOX_OP_attention_backward;
    if (attention && c->cost.cudnn)
        rate = (backward ? CUDNN_ATTENTION_BACKWARD_TFLOPS : CUDNN_ATTENTION_FORWARD_TFLOPS) * 1e12;
    else if (attention && c->cost.tensor16)
        rate *= backward ? ATTENTION_BACKWARD_EFFICIENCY : ATTENTION_FORWARD_EFFICIENCY;
    if (attention && o->attention > 0) rate = o->attention;
    double compute = c->cost.flops / rate;
    double memory = (c->cost.bytes - c->cost.after_bytes) / g->copy;  // (the passes after the product: below)
    return (compute > memory ? compute : memory) + o->launch + c->cost.after_bytes / g->copy +
           c->cost.after_calls * o->launch;
}

typedef struct class_sum {
    int64_t calls;
    double flops, bytes, seconds[2];
} class_sum;

// table=2: the H200's time by op inside each class, largest first, after the class table.
static void print_ops(const neox_op_call *calls, size_t n, const gpu *g, const options *o, double step) {
    class_sum ops[NEOX_OP_COUNT];
    memset(ops, 0, sizeof ops);
    for (size_t i = 0; i < n; i++) {
        class_sum *x = &ops[calls[i].op];
        x->calls++, x->flops += calls[i].cost.flops, x->bytes += calls[i].cost.bytes;
        x->seconds[0] += call_seconds(&calls[i], g, o);
    }
    printf("  %-34s %7s %10s %9s %11s %6s\n", "op", "calls", "GFLOP", "GB", g->name, "share");
    for (;;) {
        int best = -1;
        for (int k = 0; k < NEOX_OP_COUNT; k++)
            if (ops[k].calls && (best < 0 || ops[k].seconds[0] > ops[best].seconds[0])) best = k;
        if (best < 0) break;
        class_sum *x = &ops[best];
        printf("  %-34s %7lld %10.1f %9.2f %8.2f ms %5.1f%%\n", neox_op_name((neox_op_id)best), (long long)x->calls,
               x->flops * 1e-9, x->bytes * 1e-9, x->seconds[0] * 1e3, 100 * x->seconds[0] / step);
        x->calls = 0;
    }
}

// The calls priced on g, in column column of the classes' seconds (the counts are added with column 0);
// returns the step's time.
static double predict(const neox_op_call *calls, size_t n, const gpu *g, const options *o, class_sum *classes,
                      int column) {
    double total = 0.0;
    for (size_t i = 0; i < n; i++) {
        double t = call_seconds(&calls[i], g, o);
        class_sum *c = &classes[neox_op_class_of(calls[i].op)];
        if (column == 0) c->calls++, c->flops += calls[i].cost.flops, c->bytes += calls[i].cost.bytes;
        c->seconds[column] += t;
        total += t;
    }
    return total;
}

static double model_flops(const model_spec *s, int micro) {
    const neox_model_desc *d = &s->desc;
    neox_flops_model fm = {.num_layers = d->num_layers, .hidden_size = d->hidden_size,
                           .padded_vocab_size = d->vocab_size, .seq_length = s->seq, .train_batch_size = micro,
                           .checkpoint_activations = d->checkpoint_activations};
    return neox_flops_per_iteration(&fm);
}

static void print_table(const class_sum *classes, const double *step) {
    printf("  %-12s %7s %10s %9s %11s %6s %11s %6s\n", "class", "calls", "GFLOP", "GB", "H100 ms", "share", "H200 ms", "share");
    for (int c = 0; c < NEOX_CLASS_COUNT; c++) {
        const class_sum *x = &classes[c];
        if (!x->calls) continue;
        printf("  %-12s %7lld %10.1f %9.2f %11.2f %5.1f%% %11.2f %5.1f%%\n", neox_op_class_name((neox_op_class)c),
               (long long)x->calls, x->flops * 1e-9, x->bytes * 1e-9, x->seconds[0] * 1e3, 100 * x->seconds[0] / step[0],
               x->seconds[1] * 1e3, 100 * x->seconds[1] / step[1]);
    }
}

// The micro-batch: the option's, else the config's when the model's own, else the largest of 32, 16,
// 8 whose dry allocations fit g (the smallest when none does).
static int pick_micro(const model_spec *s, const gpu *g, const options *o, int configured) {
    if (o->micro > 0) return o->micro;
    if (configured) return s->micro;
    static const int tries[] = {32, 16, 8};
    for (int i = 0; i < 3; i++) {
        size_t n;
        double peak;
        free(trace_step(s, neox_backend_dry(), tries[i], &n, &peak));
        if (peak <= g->memory) return tries[i];
    }
    return 8;
}

static void print_line(const model_spec *s, const gpu *g, int micro, double seconds, double op_flops) {
    double flops = model_flops(s, micro);
    printf("predict: %s %s micro-batch %d: %.4g ms per step, %.0f tokens/s, %.4g model TFLOP/s, MFU %.3g%% of %.0f "
           "TFLOP/s (%.3g%% of the bf16 GEMM rate); model FLOPs %.4g (GPT-NeoX's formula), op FLOPs %.4g\n",
           g->name, s->name, micro, seconds * 1e3, micro * (double)s->seq / seconds, flops / seconds * 1e-12,
           100 * flops / seconds / NOMINAL_BF16_PEAK, NOMINAL_BF16_PEAK * 1e-12, 100 * flops / seconds / g->gemm16,
           flops, op_flops);
}

// The step of s on each GPU at the micro-batch it takes there, with the table by op class of the
// H200's micro-batch priced on both.
static void predict_model(const model_spec *s, const options *o, int configured) {
    const neox_model_desc *d = &s->desc;
    int micro[2] = {pick_micro(s, &gpus[0], o, configured), pick_micro(s, &gpus[1], o, configured)};
    double seconds[2], op_flops[2], peak[2];
    for (int k = 1; k >= 0; k--) {
        size_t n;
        neox_op_call *calls = trace_step(s, neox_backend_dry(), micro[k], &n, &peak[k]);
        class_sum classes[NEOX_CLASS_COUNT];
        memset(classes, 0, sizeof classes);
        double both[2];
        for (int j = 0; j < 2; j++) both[j] = predict(calls, n, &gpus[j], o, classes, j);
        seconds[k] = both[k];
        op_flops[k] = 0.0;
        for (int c = 0; c < NEOX_CLASS_COUNT; c++) op_flops[k] += classes[c].flops;
        if (k == 0) {
            free(calls);
            continue;
        }
        printf("# %s: %d layers, hidden %d, %d heads, seq %d, vocab %d, %s; micro-batch %d, allocations %.1f GB, "
               "%zu op calls per step\n", s->name, d->num_layers, d->hidden_size, d->num_heads, s->seq, d->vocab_size,
               neox_precision_name(s->precision), micro[1], peak[1] * 1e-9, n);
        if (o->table) print_table(classes, both);
        if (o->table > 1) print_ops(calls, n, &gpus[1], o, both[1]);
        free(calls);
    }
    if (micro[0] != micro[1]) printf("# H100: micro-batch %d (allocations %.1f GB)\n", micro[0], peak[0] * 1e-9);
    for (int k = 0; k < 2; k++) print_line(s, &gpus[k], micro[k], seconds[k], op_flops[k]);
}

// ---- the trace check ---------------------------------------------------------------------------
// The dry trace against a computed one (the CPU backend, real weights and data) on the same model:
// the same calls in the same order, in the same scopes, at the same costs (which are functions of the
// shapes). Returns the number of differences (the first few printed).
static int check_trace(const model_spec *s, int micro) {
    size_t nd, nc;
    neox_op_call *dry = trace_step(s, neox_backend_dry(), micro, &nd, NULL);
    neox_op_call *cpu = trace_step(s, neox_backend_cpu(), micro, &nc, NULL);
    int bad = nd != nc;
    if (bad) printf("trace check: %zu calls dry, %zu computed\n", nd, nc);
    for (size_t i = 0; i < nd && i < nc; i++) {
        const neox_op_call *a = &dry[i], *b = &cpu[i];
        if (a->op == b->op && a->phase == b->phase && a->layer == b->layer && a->cost.flops == b->cost.flops &&
            a->cost.bytes == b->cost.bytes && a->cost.after_bytes == b->cost.after_bytes &&
            a->cost.after_calls == b->cost.after_calls &&
            a->cost.tensor16 == b->cost.tensor16)
            continue;
        if (bad++ < 5)
            printf("trace check: call %zu: dry %s (%s, layer %d, %.6g FLOPs, %.6g bytes), computed %s (%s, layer %d, "
                   "%.6g FLOPs, %.6g bytes)\n", i, neox_op_name(a->op), neox_phase_name(a->phase), a->layer,
                   a->cost.flops, a->cost.bytes, neox_op_name(b->op), neox_phase_name(b->phase), b->layer,
                   b->cost.flops, b->cost.bytes);
    }
    printf("trace check: %s: %zu calls dry, %zu computed on the cpu backend, micro-batch %d: %s\n", s->name, nd, nc,
           micro, bad ? "DIFFERENT" : "the same ops, order, scopes and costs");
    free(dry), free(cpu);
    return bad;
}

// ---- options -----------------------------------------------------------------------------------
static double number(const char *arg, const char *value) {
    char *end;
    double x = strtod(value, &end);
    if (end == value || *end || !(x >= 0)) neox_die(2, "bad number in '%s'", arg);
    return x;
}

// Applies key=value; returns 0 when arg is not one (a config path).
static int parse_option(options *o, const char *arg) {
    const char *eq = strchr(arg, '=');
    if (!eq) return 0;
    size_t len = (size_t)(eq - arg);
    const char *v = eq + 1;
    static gpu *measured = &gpus[1];
    if (len == 5 && !strncmp(arg, "micro", len)) o->micro = (int)number(arg, v);
    else if (len == 5 && !strncmp(arg, "vocab", len)) o->vocab = (int)number(arg, v);
    else if (len == 5 && !strncmp(arg, "table", len)) o->table = (int)number(arg, v);
    else if (len == 5 && !strncmp(arg, "check", len)) o->check = (int)number(arg, v);
    else if (len == 5 && !strncmp(arg, "cudnn", len)) o->cudnn = number(arg, v) != 0;
    else if (len == 9 && !strncmp(arg, "cudnn_mlp", len)) o->cudnn_mlp = number(arg, v) != 0;
    else if (len == 9 && !strncmp(arg, "launch_us", len)) o->launch = number(arg, v) * 1e-6;
    else if (len == 16 && !strncmp(arg, "attention_tflops", len)) o->attention = number(arg, v) * 1e12;
    else if (len == 11 && !strncmp(arg, "measured_on", len)) {
        if (strcmp(v, "H100") && strcmp(v, "H200")) neox_die(2, "measured_on: H100 or H200, not '%s'", v);
        measured = &gpus[!strcmp(v, "H200")];
    } else if (len == 11 && !strncmp(arg, "gemm_tflops", len)) measured->gemm16 = number(arg, v) * 1e12;
    else if (len == 11 && !strncmp(arg, "fp32_tflops", len)) measured->gemm32 = number(arg, v) * 1e12;
    else if (len == 8 && !strncmp(arg, "copy_gbs", len)) measured->copy = number(arg, v) * 1e9;
    else neox_die(2, "unknown key in '%s' (keys: micro vocab table check cudnn cudnn_mlp launch_us attention_tflops measured_on "
                  "gemm_tflops fp32_tflops copy_gbs)", arg);
    // The other GPU follows the measured one by the data sheets' ratios.
    gpu *other = &gpus[measured == &gpus[0]];
    double ratio = measured == &gpus[1] ? H100_COPY_RATIO : 1.0 / H100_COPY_RATIO;
    other->gemm16 = measured->gemm16, other->gemm32 = measured->gemm32, other->copy = measured->copy * ratio;
    return 1;
}

int main(int argc, char **argv) {
    neox_set_progname("gpu_predict");
    options o = {.vocab = 50257, .table = 1, .launch = 4e-6, .cudnn = -1, .cudnn_mlp = 1};
    const char *paths[64];
    int npaths = 0;
    for (int i = 1; i < argc; i++)
        if (!parse_option(&o, argv[i])) {
            if (npaths == 64) neox_die(2, "at most 64 configs");
            paths[npaths++] = argv[i];
        }
    printf("# roofline per op: max(FLOPs / GEMM rate of its operands, bytes / copy bandwidth) + a pass of its own's "
           "bytes / copy bandwidth + %.1f us per call\n",
           o.launch * 1e6);
    if (o.attention > 0) printf("# attention's FLOPs at %.1f TFLOP/s\n", o.attention * 1e-12);
    else
        printf("# bf16 attention on cuDNN (by the route's rule) at %.0f (forward) and %.0f (backward) TFLOP/s, its "
               "published H100 rates; the own tensor-core kernels at %.3g (forward) and %.3g (backward) of the 16-bit "
               "GEMM rate, their model\n", CUDNN_ATTENTION_FORWARD_TFLOPS, CUDNN_ATTENTION_BACKWARD_TFLOPS,
               ATTENTION_FORWARD_EFFICIENCY, ATTENTION_BACKWARD_EFFICIENCY);
    // (an assumption until a GPU host measures it: tests/gpu/device-check.sh's bench/gpu_ops run does)
    printf(o.cudnn_mlp ? "# bf16 MLP products with their GELU fused as cuDNN graphs (by the route's rule), at the bf16 "
                         "GEMM rate, not measured\n"
                       : "# bf16 MLP products without cuDNN: GELU and its backward as passes of their own\n");
    for (int k = 0; k < 2; k++)
        printf("# %s: bf16 GEMM %.1f TFLOP/s, fp32 GEMM %.1f TFLOP/s, copy %.0f GB/s, memory %.1f GiB\n", gpus[k].name,
               gpus[k].gemm16 * 1e-12, gpus[k].gemm32 * 1e-12, gpus[k].copy * 1e-9, gpus[k].memory / 1073741824.0);
    int nmodels = npaths ? npaths : (int)(sizeof BUILTIN / sizeof BUILTIN[0]);
    int bad = 0;
    for (int i = 0; i < nmodels; i++) {
        model_spec s;
        if (npaths) load_spec(&s, paths[i], paths[i], &o);
        else builtin_spec(&s, i, &o);
        if (o.check && i == 0) bad += check_trace(&s, o.micro > 0 ? o.micro : s.micro);
        predict_model(&s, &o, npaths > 0);
    }
    return bad ? 1 : 0;
}
