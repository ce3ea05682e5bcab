// train_neox.c: the neox.c side of bench/train_cpu.sh. Trains a GPT-NeoX model (Pythia-70M's
// shape by default) on random token ids with lib/model and the AdamW kernel for a fixed number of
// steps and prints one JSON line with tokens/s, the time spent in forward, backward and AdamW, and
// the CPU seconds all threads used in the timed steps.
//   train_neox key=value...   keys: layers hidden heads vocab seq batch steps warmup threads checkpoint bf16
//                                   profile
//   (checkpoint=1: activation checkpointing, each layer recomputed in backward; bf16=1: precision
//   bfloat16, the linear layers' products on bfloat16 operands as neox-train runs them; profile=1:
//   the per-op profile of the timed steps on stderr, each op's wall time per step, as
//   wall_clock_breakdown records it)
// The step is the one neox-train runs: zero the gradients, forward with the fused loss (the loss and
// the output layer's backward in the forward, as lib/train/setup.c asks for it), backward, AdamW over
// every tensor (no weight decay on biases and norms).
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "core.h"
#include "kernels/backend.h"
#include "kernels/kernels.h"
#include "model.h"

typedef struct bench_opts {
    int layers, hidden, heads, vocab, seq, batch, steps, warmup, threads, checkpoint, bf16, profile;
} bench_opts;

static void parse(bench_opts *o, const char *arg) {
    struct { const char *key; int *value; } keys[] = {
        {"layers", &o->layers}, {"hidden", &o->hidden}, {"heads", &o->heads}, {"vocab", &o->vocab},
        {"seq", &o->seq}, {"batch", &o->batch}, {"steps", &o->steps}, {"warmup", &o->warmup},
        {"threads", &o->threads}, {"checkpoint", &o->checkpoint}, {"bf16", &o->bf16}, {"profile", &o->profile},
    };
    const char *eq = strchr(arg, '=');
    for (size_t i = 0; eq && i < sizeof keys / sizeof keys[0]; i++)
        if (strlen(keys[i].key) == (size_t)(eq - arg) && strncmp(arg, keys[i].key, (size_t)(eq - arg)) == 0) {
            *keys[i].value = atoi(eq + 1);
            return;
        }
    neox_die(2, "bad argument '%s' (keys: layers hidden heads vocab seq batch steps warmup threads checkpoint bf16 profile)", arg);
}

// Pythia-70M's architecture (rotary on a quarter of each head, parallel residual, exact GELU,
// untied output), which is also what the PyTorch side builds with GPTNeoXForCausalLM.
static neox_model_desc pythia_desc(const bench_opts *o) {
    return (neox_model_desc){
        .vocab_size = o->vocab, .hidden_size = o->hidden, .num_layers = o->layers, .num_heads = o->heads,
        .num_kv_heads = o->heads, .ffn_size = 4 * o->hidden, .max_positions = o->seq, .norm = NEOX_NORM_LAYERNORM,
        .norm_eps = 1e-5f, .norm_bias = 1, .pos_emb = NEOX_POS_ROTARY, .rotary_dims = o->hidden / o->heads / 4,
        .rotary_base = 10000.0, .parallel_residual = 1, .activation = NEOX_ACT_GELU, .attn_bias = 1, .mlp_bias = 1,
        .tied = 0, .init_method = NEOX_INIT_NORMAL, .output_init_method = NEOX_INIT_NORMAL, .init_std = 0.02,
        .checkpoint_activations = o->checkpoint,
    };
}

// The per-op profile of the timed steps: the class table, then every op that ran, its calls, wall
// time and achieved GFLOP/s (GEMMs) per step, summed over phases and layers, largest first.
static void print_op_profile(int steps) {
    neox_profile_print_table(stderr, steps);
    neox_op_stat ops[NEOX_OP_COUNT] = {{0}};
    double total = 0;
    for (int op = 0; op < NEOX_OP_COUNT; op++) {
        for (int phase = 0; phase < NEOX_PHASE_COUNT; phase++)
            for (int layer = -1; layer < neox_profile_layers(); layer++) {
                neox_op_stat s = neox_profile_stat((neox_phase)phase, layer, (neox_op_id)op);
                ops[op].calls += s.calls;
                ops[op].seconds += s.seconds;
                ops[op].flops += s.flops;
            }
        total += ops[op].seconds;
    }
    for (int printed = 0; printed < NEOX_OP_COUNT; printed++) {
        int top = -1;
        for (int op = 0; op < NEOX_OP_COUNT; op++)
            if (ops[op].calls && (top < 0 || ops[op].seconds > ops[top].seconds)) top = op;
        if (top < 0) break;
        neox_op_stat s = ops[top];
        fprintf(stderr, "  %-28s %6lld calls %9.1f ms %5.1f%% %8.1f GFLOP/s\n", neox_op_name((neox_op_id)top),
                (long long)(s.calls / steps), 1e3 * s.seconds / steps, 100 * s.seconds / total,
                s.seconds > 0 ? s.flops / s.seconds / 1e9 : 0.0);
        ops[top].calls = 0;
    }
}

// CPU seconds used so far by every thread of the process (user + system).
static double cpu_seconds(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + (double)u.ru_stime.tv_sec + u.ru_stime.tv_usec * 1e-6;
}

int main(int argc, char **argv) {
    neox_set_progname(argv[0]);
    bench_opts o = {.layers = 6, .hidden = 512, .heads = 8, .vocab = 50304, .seq = 512, .batch = 8, .steps = 3,
                    .warmup = 1, .threads = 2};
    for (int i = 1; i < argc; i++) parse(&o, argv[i]);
    omp_set_num_threads(o.threads);  // the kernels run OpenBLAS single-threaded on OpenMP's threads

    neox_error err = {0};
    neox_model_desc d = pythia_desc(&o);
    // profile=1: the per-op profile's table over the CPU backend (wall time around each op).
    neox_model *m = o.profile ? neox_model_create_on(&d, neox_profile_install(neox_backend_cpu(), 0), &err)
                              : neox_model_create(&d, &err);
    if (!m) neox_die_error(&err);
    neox_model_set_fused_head(m, 1);  // (head_loss_scale: backward's loss scale, 1)
    m->head_loss_scale = 1.0f;
    if (neox_model_plan(m, o.batch, o.seq, &err) != 0) neox_die_error(&err);
    neox_model_init(m, 1234);
    if (o.bf16) neox_model_set_precision(m, NEOX_PRECISION_BF16);
    m->training = 1;
    float *mom = neox_calloc(m->num_floats, sizeof(float)), *vel = neox_calloc(m->num_floats, sizeof(float));
    size_t n = (size_t)o.batch * o.seq;
    int *ids = neox_malloc((n + 1) * sizeof(int));
    for (size_t i = 0; i <= n; i++) ids[i] = (int)(neox_hash64(42, i) % (unsigned long long)o.vocab);

    double t_fwd = 0, t_bwd = 0, t_opt = 0, first_loss = 0, last_loss = 0, cpu = 0;
    for (int s = 0; s < o.warmup + o.steps; s++) {
        if (s == o.warmup) {
            cpu = cpu_seconds();
            if (o.profile) neox_profile_reset();
        }
        double t0 = neox_now();
        neox_model_zero_grad(m);
        if (neox_model_forward(m, ids, ids + 1, NULL, &err) != 0) neox_die_error(&err);
        double t1 = neox_now();
        neox_model_backward(m, 1.0f);
        double t2 = neox_now();
        for (int i = 0; i < m->nparams; i++) {
            const neox_param *p = &m->params[i];
            neox_adamw(m->param_buf + p->offset, m->grad_buf + p->offset, mom + p->offset, vel + p->offset, p->numel,
                       6e-4f, 0.9f, 0.95f, 1e-8f, p->no_decay ? 0.0f : 0.1f, s + 1);
        }
        neox_model_weights_changed(m);  // the 16-bit copy is cast again in the next forward
        double t3 = neox_now();
        if (s == 0) first_loss = m->loss;
        last_loss = m->loss;
        if (s < o.warmup) continue;
        t_fwd += t1 - t0;
        t_bwd += t2 - t1;
        t_opt += t3 - t2;
    }
    cpu = cpu_seconds() - cpu;
    double total = t_fwd + t_bwd + t_opt;
    printf("{\"impl\": \"neox.c\", \"precision\": \"%s\", \"params\": %zu, \"tokens_per_step\": %zu, \"steps\": %d, \"seconds\": %.4f, "
           "\"tokens_per_s\": %.2f, \"forward_s\": %.4f, \"backward_s\": %.4f, \"adamw_s\": %.4f, "
           "\"cpu_s\": %.4f, \"first_loss\": %.4f, \"last_loss\": %.4f, \"activation_bytes\": %zu}\n",
           o.bf16 ? "bfloat16" : "fp32", m->num_floats, n, o.steps, total, (double)n * o.steps / total, t_fwd / o.steps, t_bwd / o.steps,
           t_opt / o.steps, cpu, first_loss, last_loss, neox_model_activation_bytes(m));
    if (o.profile) print_op_profile(o.steps);
    free(ids); free(mom); free(vel);
    neox_model_free(m);
    return 0;
}
