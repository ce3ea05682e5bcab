// test_model.c: the model description from a GPT-NeoX config (derived sizes), deterministic init,
// and that activation checkpointing leaves loss and gradients bit-identical; a parameter-free norm
// lays out no tensor and its model reports every gradient once.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "core.h"
#include "kernels/backend.h"
#include "model.h"

static neox_config *load_yaml(const char *text) {
    char path[] = "/tmp/neox-model-XXXXXX.yml";
    int fd = mkstemps(path, 4);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    neox_error err = {0};
    const char *paths[] = {path};
    neox_config_options opts = {.world_size = 1, .quiet = 1};
    neox_config *cfg = neox_config_load(paths, 1, &opts, &err);
    unlink(path);
    if (!cfg) fail_msg("config: %s", err.message);
    return cfg;
}

static void test_desc_from_config(void **state) {
    (void)state;
    neox_config *cfg = load_yaml("train_micro_batch_size_per_gpu: 1\nhidden_size: 512\nnum_layers: 2\nnum_attention_heads: 8\nnum_kv_heads: 2\n"
                                 "seq_length: 64\nmax_position_embeddings: 64\nnorm: rmsnorm\npos_emb: rotary\n"
                                 "rotary_pct: 0.25\nactivation: swiglu\nmlp_multiple_of: 256\nno_weight_tying: true\n"
                                 "use_bias_in_attn_linear: false\nuse_bias_in_mlp: false\n");
    neox_model_desc d;
    neox_error err = {0};
    if (neox_model_desc_from_config(&d, cfg, 50257, &err) != 0) fail_msg("%s", err.message);
    assert_int_equal(d.vocab_size, 50304);          // padded to a multiple of 128
    assert_int_equal(d.ffn_size, 768);              // 2048 * 2/3 = 1365 -> 682 per half -> 768
    assert_int_equal(d.rotary_dims, 16);            // 64 * 0.25
    assert_int_equal(d.num_kv_heads, 2);
    assert_int_equal(d.norm, NEOX_NORM_RMSNORM);
    assert_true(fabsf(d.norm_eps - 1e-8f) < 1e-12f);
    assert_int_equal(d.naming, NEOX_NAMES_LLAMA);
    assert_int_equal(d.tied, 0);
    neox_config_free(cfg);

    cfg = load_yaml("train_micro_batch_size_per_gpu: 1\nhidden_size: 64\nnum_layers: 2\nnum_attention_heads: 4\nseq_length: 32\n"
                    "max_position_embeddings: 32\npos_emb: rotary\nbias_gelu_fusion: true\ngpt_j_residual: true\n");
    if (neox_model_desc_from_config(&d, cfg, 100, &err) != 0) fail_msg("%s", err.message);
    assert_int_equal(d.ffn_size, 256);
    assert_int_equal(d.activation, NEOX_ACT_GELU_TANH);
    assert_int_equal(d.naming, NEOX_NAMES_GPT_NEOX);
    assert_int_equal(d.parallel_residual, 1);
    neox_config_free(cfg);
}

// rope_scaling: llama3's four numbers read, linear's factor; missing numbers and disagreeing
// spellings of the type refused by name.
static void test_desc_rope_scaling(void **state) {
    (void)state;
    neox_config *cfg = load_yaml("train_micro_batch_size_per_gpu: 1\nhidden_size: 64\nnum_layers: 1\nnum_attention_heads: 4\n"
                                 "seq_length: 16\nmax_position_embeddings: 16\nrope_scaling:\n  rope_type: llama3\n"
                                 "  factor: 8.0\n  low_freq_factor: 1.0\n  high_freq_factor: 4.0\n"
                                 "  original_max_position_embeddings: 8192\n");
    neox_model_desc d;
    neox_error err = {0};
    if (neox_model_desc_from_config(&d, cfg, 100, &err) != 0) fail_msg("%s", err.message);
    assert_int_equal(d.rope_scaling.kind, NEOX_ROPE_LLAMA3);
    assert_true(d.rope_scaling.factor == 8.0 && d.rope_scaling.low_freq_factor == 1.0 && d.rope_scaling.high_freq_factor == 4.0);
    assert_int_equal(d.rope_scaling.original_max_positions, 8192);
    neox_config_free(cfg);
    static const struct { const char *yaml, *message; } bad[] = {
        {"rope_scaling:\n  rope_type: llama3\n  factor: 8.0\n", "rope_type llama3 needs factor, low_freq_factor"},
        {"rope_scaling:\n  type: linear\n", "rope_scaling.factor is not set"},
        {"rope_scaling:\n  type: linear\n  rope_type: llama3\n  factor: 2.0\n", "rope_type 'llama3' and type 'linear' disagree"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[512];
        snprintf(text, sizeof text, "train_micro_batch_size_per_gpu: 1\nhidden_size: 64\nnum_layers: 1\n"
                 "num_attention_heads: 4\nseq_length: 16\nmax_position_embeddings: 16\n%s", bad[i].yaml);
        cfg = load_yaml(text);
        err = (neox_error){0};
        assert_int_equal(neox_model_desc_from_config(&d, cfg, 100, &err), -1);
        assert_int_equal(err.status, NEOX_EXIT_USAGE);
        if (!strstr(err.message, bad[i].message)) fail_msg("'%s' lacks '%s'", err.message, bad[i].message);
        neox_config_free(cfg);
    }
}

// use_bias_in_attn_output: false keeps q/k/v's biases and drops the output projection's (Qwen2);
// true without use_bias_in_attn_linear is refused.
static void test_desc_attn_output_bias(void **state) {
    (void)state;
    neox_config *cfg = load_yaml("train_micro_batch_size_per_gpu: 1\nhidden_size: 64\nnum_layers: 1\nnum_attention_heads: 4\n"
                                 "seq_length: 16\nmax_position_embeddings: 16\nnorm: rmsnorm\nactivation: swiglu\n"
                                 "use_bias_in_attn_linear: true\nuse_bias_in_attn_output: false\nuse_bias_in_mlp: false\n");
    neox_model_desc d;
    neox_error err = {0};
    if (neox_model_desc_from_config(&d, cfg, 100, &err) != 0) fail_msg("%s", err.message);
    int n = 0, q_bias = 0, o_bias = 0;
    neox_param *params = neox_model_param_list(&d, &n, &err);
    assert_non_null(params);
    for (int i = 0; i < n; i++) {
        q_bias += strcmp(params[i].name, "model.layers.0.self_attn.q_proj.bias") == 0;
        o_bias += strcmp(params[i].name, "model.layers.0.self_attn.o_proj.bias") == 0;
    }
    assert_int_equal(q_bias, 1);
    assert_int_equal(o_bias, 0);
    free(params);
    neox_config_free(cfg);
    cfg = load_yaml("train_micro_batch_size_per_gpu: 1\nhidden_size: 64\nnum_layers: 1\nnum_attention_heads: 4\n"
                    "seq_length: 16\nmax_position_embeddings: 16\nuse_bias_in_attn_linear: false\n"
                    "use_bias_in_attn_output: true\n");
    assert_int_equal(neox_model_desc_from_config(&d, cfg, 100, &err), -1);
    assert_int_equal(err.status, NEOX_EXIT_USAGE);
    assert_non_null(strstr(err.message, "use_bias_in_attn_output: true needs use_bias_in_attn_linear: true"));
    neox_config_free(cfg);
}

static neox_config *activation_config(const char *extra) {
    char text[512];
    snprintf(text, sizeof text, "train_micro_batch_size_per_gpu: 1\nhidden_size: 96\nnum_layers: 1\n"
             "num_attention_heads: 4\nseq_length: 16\nmax_position_embeddings: 16\nmlp_multiple_of: 16\n%s", extra);
    return load_yaml(text);
}

// GPT-NeoX's activations: gated ones size each half 2/3 of 4h (rounded to mlp_multiple_of) and take
// Llama names; gelu's variant follows onnx_safe / bias_gelu_fusion, which GPT-NeoX refuses together.
static void test_desc_activations(void **state) {
    (void)state;
    static const struct { const char *yaml; neox_activation act; int ffn; } cases[] = {
        {"activation: geglu\n", NEOX_ACT_GEGLU, 128},  // 384 * 2/3 = 256 -> 128 per half
        {"activation: reglu\n", NEOX_ACT_REGLU, 128},
        {"activation: glu\n", NEOX_ACT_GLU, 128},
        {"activation: bilinear\n", NEOX_ACT_BILINEAR, 128},
        {"activation: relu\n", NEOX_ACT_RELU, 384},
        {"activation: swish\n", NEOX_ACT_SILU, 384},
        {"activation: silu\n", NEOX_ACT_SILU, 384},
        {"activation: mish\n", NEOX_ACT_MISH, 384},
        {"activation: softsign\n", NEOX_ACT_SOFTSIGN, 384},
        {"activation: gelu\nonnx_safe: true\n", NEOX_ACT_GELU_ONNX, 384},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        neox_config *cfg = activation_config(cases[i].yaml);
        neox_model_desc d;
        neox_error err = {0};
        if (neox_model_desc_from_config(&d, cfg, 100, &err) != 0) fail_msg("%s: %s", cases[i].yaml, err.message);
        assert_int_equal(d.activation, cases[i].act);
        assert_int_equal(d.ffn_size, cases[i].ffn);
        assert_int_equal(d.naming, neox_activation_gated(d.activation) ? NEOX_NAMES_LLAMA : NEOX_NAMES_GPT_NEOX);
        neox_config_free(cfg);
    }
    neox_config *cfg = activation_config("onnx_safe: true\nbias_gelu_fusion: true\n");
    neox_model_desc d;
    neox_error err = {0};
    assert_int_equal(neox_model_desc_from_config(&d, cfg, 100, &err), -1);
    assert_int_equal(err.status, NEOX_EXIT_USAGE);
    assert_non_null(strstr(err.message, "onnx_safe and bias_gelu_fusion"));
    neox_config_free(cfg);
}

// norm: non_parametric_layernorm: layernorm_epsilon read; no norm tensor (use_qk_layernorm's either);
// backward reports every parameter of the stage exactly once to grads_ready (the empty norm groups
// cope), on the whole model and on the last of two pipeline stages.
static void count_ready(void *ctx, int begin, int end) {
    int *seen = ctx;
    for (int i = begin; i < end; i++) seen[i]++;
}

static void test_nonparametric_norm(void **state) {
    (void)state;
    neox_config *cfg = load_yaml("train_micro_batch_size_per_gpu: 1\nhidden_size: 16\nnum_layers: 2\nnum_attention_heads: 4\n"
                                 "seq_length: 8\nmax_position_embeddings: 8\nnorm: non_parametric_layernorm\n"
                                 "layernorm_epsilon: 0.001\nuse_qk_layernorm: true\n");
    neox_model_desc d;
    neox_error err = {0};
    if (neox_model_desc_from_config(&d, cfg, 40, &err) != 0) fail_msg("%s", err.message);
    neox_config_free(cfg);
    assert_int_equal(d.norm, NEOX_NORM_NONPARAMETRIC);
    assert_true(fabsf(d.norm_eps - 1e-3f) < 1e-9f);
    for (int stage = 0; stage < 2; stage++) {
        neox_model_desc s = d;
        if (stage) s.pp_size = 2, s.pp_rank = 1, s.layer_begin = 1, s.layer_end = 2;
        neox_model *m = neox_model_create(&s, &err);
        assert_non_null(m);
        for (int i = 0; i < m->nparams; i++)
            if (strstr(m->params[i].name, "norm")) fail_msg("a norm tensor: %s", m->params[i].name);
        neox_model_init(m, 42);
        assert_int_equal(neox_model_plan(m, 1, 8, &err), 0);
        int *seen = calloc((size_t)m->nparams, sizeof(int));
        m->grads_ready = count_ready;
        m->grads_ready_ctx = seen;
        int ids[8], targets[8];
        for (int i = 0; i < 8; i++) ids[i] = (i * 7) % 40, targets[i] = (i * 11 + 3) % 40;
        float x[8 * 16];
        for (int i = 0; i < 8 * 16; i++) x[i] = (float)((i * 37) % 17) / 17.0f - 0.5f;
        if (stage) memcpy(neox_model_stage_input(m), x, sizeof x);  // as the previous stage would send it
        assert_int_equal(neox_model_forward(m, ids, targets, NULL, &err), 0);
        neox_model_backward(m, 1.0f);
        for (int i = 0; i < m->nparams; i++)
            if (seen[i] != 1) fail_msg("stage %d: %s reported %d times", stage, m->params[i].name, seen[i]);
        free(seen);
        neox_model_free(m);
    }
    // Its query/key norm spans a token's heads, as LayerNorm's does: tensor parallelism would cut it.
    d.tp_size = 2;
    assert_int_equal(neox_model_desc_check(&d, &err), -1);
    assert_non_null(strstr(err.message, "use_qk_layernorm with norm: non_parametric_layernorm"));
}

static neox_model *tiny(int checkpoint) {
    neox_model_desc d = {.vocab_size = 40, .hidden_size = 16, .num_layers = 2, .num_heads = 4, .num_kv_heads = 2,
                         .ffn_size = 24, .max_positions = 16, .norm = NEOX_NORM_LAYERNORM, .norm_eps = 1e-5f,
                         .norm_bias = 1, .pos_emb = NEOX_POS_ROTARY, .rotary_dims = 2, .rotary_base = 10000,
                         .activation = NEOX_ACT_SWIGLU, .attn_bias = 1, .mlp_bias = 1, .init_std = 0.02,
                         .init_method = NEOX_INIT_NORMAL, .output_init_method = NEOX_INIT_SCALED_NORMAL,
                         .hidden_dropout = 0.1f, .attention_dropout = 0.1f, .checkpoint_activations = checkpoint};
    neox_error err = {0};
    neox_model *m = neox_model_create(&d, &err);
    assert_non_null(m);
    neox_model_init(m, 42);
    assert_int_equal(neox_model_plan(m, 2, 8, &err), 0);
    m->training = 1;
    m->dropout_seed = 7;
    return m;
}

static void test_checkpointing_is_exact(void **state) {
    (void)state;
    neox_model *a = tiny(0), *b = tiny(1);
    assert_memory_equal(a->param_buf, b->param_buf, a->num_floats * sizeof(float));  // deterministic init
    assert_true(neox_model_activation_bytes(b) < neox_model_activation_bytes(a));
    int ids[16], targets[16];
    for (int i = 0; i < 16; i++) { ids[i] = (i * 7) % 40; targets[i] = (i * 11 + 3) % 40; }
    neox_error err = {0};
    assert_int_equal(neox_model_forward(a, ids, targets, NULL, &err), 0);
    assert_int_equal(neox_model_forward(b, ids, targets, NULL, &err), 0);
    assert_true(a->loss == b->loss);
    assert_true(fabsf(a->loss - logf(40.0f)) < 0.2f);  // small init: near uniform
    neox_model_backward(a, 1.0f);
    neox_model_backward(b, 1.0f);
    assert_memory_equal(a->grad_buf, b->grad_buf, a->num_floats * sizeof(float));
    ids[3] = 40;  // out of the vocabulary
    assert_int_equal(neox_model_forward(a, ids, targets, NULL, &err), -1);
    assert_non_null(strstr(err.message, "outside the vocabulary"));
    neox_model_free(a);
    neox_model_free(b);
}

// Layer inputs kept on the host (checkpoint_in_cpu) train as kept in place, bit for bit, on the
// emulated device (device memory apart from the host's) and on the CPU; the backend's plan loses the
// inputs but the stage's output and one gather buffer, which the host holds instead. Planned twice,
// so the store is also freed and remade.
static void test_host_checkpoints_are_exact(void **state) {
    (void)state;
    int ids[16], targets[16];
    for (int i = 0; i < 16; i++) ids[i] = (i * 5) % 40, targets[i] = (i * 13 + 1) % 40;
    neox_model *ref = tiny(1);
    neox_error err = {0};
    assert_int_equal(neox_model_forward(ref, ids, targets, NULL, &err), 0);
    neox_model_backward(ref, 1.0f);
    const neox_backend *backends[] = {neox_backend_emulated(), ref->be};
    for (int k = 0; k < 2; k++) {
        neox_model_desc d = ref->desc;
        d.recompute_inputs_on_host = 1;
        neox_model *m = neox_model_create_on(&d, backends[k], &err);
        assert_non_null(m);
        neox_model_init(m, 42);
        m->training = 1, m->dropout_seed = 7;
        assert_int_equal(neox_model_plan(m, 2, 8, &err), 0);
        assert_int_equal(neox_model_plan(m, 2, 8, &err), 0);
        size_t NC = 2 * 8 * 16, L = 2;
        assert_int_equal(neox_model_host_recompute_bytes(m), L * NC * sizeof(float));
        assert_int_equal(neox_model_activation_bytes(ref) - neox_model_activation_bytes(m), (L - 1) * NC * sizeof(float));
        assert_int_equal(neox_model_forward(m, ids, targets, NULL, &err), 0);
        assert_true(m->loss == ref->loss);
        neox_model_backward(m, 1.0f);
        float *grads = malloc(m->num_floats * sizeof(float));
        m->be->to_host(grads, m->grad_buf, m->num_floats * sizeof(float));
        assert_memory_equal(grads, ref->grad_buf, m->num_floats * sizeof(float));
        free(grads);
        neox_model_free(m);
    }
    neox_model_free(ref);
}

// Max |a - b| over n values, relative to the largest |a|.
static double rel_diff(const float *a, const float *b, size_t n) {
    double d = 0, scale = 1e-30;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        scale = fmax(scale, fabs((double)a[i]));
    }
    return d / scale;
}

// The output layer in row chunks (5 rows: 16 = 5 + 5 + 5 + 1) gives the loss, the per-token
// log-probabilities and every gradient of the whole product, with a loss mask that drops and weights
// rows, in fp32 and bf16, on the CPU and on the emulated device (where it must equal the CPU's bits).
static void test_head_chunks(void **state) {
    (void)state;
    int ids[16], targets[16];
    float mask[16];
    for (int i = 0; i < 16; i++) ids[i] = (i * 7) % 40, targets[i] = (i * 11 + 3) % 40, mask[i] = (float)(i % 3);
    for (int precision = 0; precision < 2; precision++) {
        neox_model *whole = tiny(0), *chunked = tiny(0);
        neox_error err = {0};
        neox_model *dev = neox_model_create_on(&whole->desc, neox_backend_emulated(), &err);
        assert_non_null(dev);
        neox_model_init(dev, 42);
        dev->training = 1, dev->dropout_seed = 7;
        neox_model *ms[] = {whole, chunked, dev};
        for (int k = 0; k < 3; k++) {
            if (k > 0) neox_model_set_head_rows(ms[k], 5);
            if (precision) neox_model_set_precision(ms[k], NEOX_PRECISION_BF16);
            assert_int_equal(neox_model_plan(ms[k], 2, 8, &err), 0);
            assert_int_equal(ms[k]->head_rows, k > 0 ? 5 : 16);
            assert_int_equal(neox_model_forward(ms[k], ids, targets, mask, &err), 0);
            neox_model_backward(ms[k], 2.0f);
        }
        assert_true(neox_model_activation_bytes(chunked) < neox_model_activation_bytes(whole));
        assert_true(fabs(whole->loss - chunked->loss) <= 1e-6 * fabs(whole->loss));
        double lw[16], lc[16];
        neox_model_token_logprobs(whole, lw);
        neox_model_token_logprobs(chunked, lc);
        for (int i = 0; i < 16; i++) assert_true(fabs(lw[i] - lc[i]) <= 1e-6 * fabs(lw[i]));
        assert_true(rel_diff(whole->grad_buf, chunked->grad_buf, whole->num_floats) < 1e-5);
        float *dev_grads = neox_malloc(dev->num_floats * sizeof(float));
        dev->be->to_host(dev_grads, dev->grad_buf, dev->num_floats * sizeof(float));
        assert_true(dev->loss == chunked->loss);
        assert_memory_equal(dev_grads, chunked->grad_buf, dev->num_floats * sizeof(float));
        free(dev_grads);
        // The logits themselves need every row at once.
        assert_int_equal(neox_model_forward(chunked, ids, NULL, NULL, &err), -1);
        assert_non_null(strstr(err.message, "needs all 16 rows of logits"));
        for (int k = 0; k < 3; k++) neox_model_free(ms[k]);
    }
}

// A tiny model like tiny()'s on a backend, tied or not, with the fused loss or not, in chunks of
// head_rows (0: whole), fp32 or bf16.
static neox_model *tiny_head(const neox_backend *be, int tied, int fused, int head_rows, int bf16) {
    neox_model *base = tiny(0);
    neox_model_desc d = base->desc;
    neox_model_free(base);
    d.tied = tied;
    neox_error err = {0};
    neox_model *m = neox_model_create_on(&d, be, &err);
    assert_non_null(m);
    neox_model_init(m, 42);
    m->training = 1, m->dropout_seed = 7;
    neox_model_set_head_rows(m, head_rows);
    neox_model_set_fused_head(m, fused);
    if (bf16) neox_model_set_precision(m, NEOX_PRECISION_BF16);
    assert_int_equal(neox_model_plan(m, 2, 8, &err), 0);
    return m;
}

// The fused loss (the output layer's backward inside the forward) gives the unfused path's loss and
// every gradient, tied and untied, whole and in chunks of 5 rows, with a weighted loss mask and a
// loss scale, in fp32 and bf16: bit for bit on the CPU, and the emulated device's equal to the CPU's.
static void test_fused_head(void **state) {
    (void)state;
    int ids[16], targets[16];
    float mask[16];
    for (int i = 0; i < 16; i++) ids[i] = (i * 7) % 40, targets[i] = (i * 11 + 3) % 40, mask[i] = (float)(i % 3) * 0.5f;
    const neox_backend *backends[] = {neox_backend_cpu(), neox_backend_emulated()};
    for (int variant = 0; variant < 8; variant++) {
        int tied = variant & 1, rows = variant & 2 ? 5 : 0, bf16 = (variant & 4) != 0;
        neox_model *ref = tiny_head(neox_backend_cpu(), tied, 0, rows, bf16);
        neox_error err = {0};
        assert_int_equal(neox_model_forward(ref, ids, targets, mask, &err), 0);
        assert_true(ref->be->sum_squares(ref->grad_buf, ref->num_floats) == 0.0);
        neox_model_backward(ref, 2.0f);
        for (int b = 0; b < 2; b++) {
            neox_model *m = tiny_head(backends[b], tied, 1, rows, bf16);
            m->head_loss_scale = 2.0f;
            assert_int_equal(neox_model_forward(m, ids, targets, mask, &err), 0);
            assert_true(m->loss == ref->loss);
            // the output layer's gradient is made already (the unfused forward leaves them all zero)
            assert_true(m->be->sum_squares(m->grad_buf, m->num_floats) > 0.0);
            neox_model_backward(m, 2.0f);
            float *grads = neox_malloc(m->num_floats * sizeof(float));
            m->be->to_host(grads, m->grad_buf, m->num_floats * sizeof(float));
            assert_memory_equal(grads, ref->grad_buf, m->num_floats * sizeof(float));
            free(grads);
            neox_model_free(m);
        }
        neox_model_free(ref);
    }
}

// Under the fused loss the automatic chunks hold at most NEOX_MODEL_HEAD_FUSED_ELEMS logits, and
// the activation plan is smaller by the logits no longer held (planned on the dry backend, which
// commits no memory: 2048 rows of a 65536-word vocabulary are 2^27 logits, between the limits).
static void test_fused_head_plan(void **state) {
    (void)state;
    neox_model *base = tiny(0);
    neox_model_desc d = base->desc;
    neox_model_free(base);
    d.vocab_size = 65536, d.max_positions = 256;
    size_t bytes[2];
    for (int fused = 0; fused < 2; fused++) {
        neox_error err = {0};
        neox_model *m = neox_model_create_on(&d, neox_backend_dry(), &err);
        assert_non_null(m);
        neox_model_set_head_rows(m, NEOX_MODEL_HEAD_AUTO);
        neox_model_set_fused_head(m, fused);
        assert_int_equal(neox_model_plan(m, 8, 256, &err), 0);
        assert_int_equal(m->head_rows, fused ? (int)(NEOX_MODEL_HEAD_FUSED_ELEMS / 65536) : 2048);
        bytes[fused] = neox_model_activation_bytes(m);
        neox_model_free(m);
    }
    assert_int_equal(bytes[0] - bytes[1], (size_t)(2048 - 1024) * 65536 * sizeof(float));
}

// Expert parallelism's exchange plan, on the second of two ranks holding two experts each. The
// expected counts, displacements and row orders are worked out by hand from the rule: a rank's rows
// leave sorted by expert, arrive source-major, and its GEMMs read them expert-major.
static void test_moe_exchange_plan(void **state) {
    (void)state;
    neox_moe_exchange *x = neox_moe_exchange_new(2, 2, 6);
    int count[4] = {1, 0, 2, 3};  // this rank's rows for experts 0..3
    int from[4] = {1, 2, 2, 1};   // rank 0 sends 1 row for local expert 0, 2 for 1; rank 1 sends 2 and 1
    neox_error err = {0};
    assert_int_equal(neox_moe_exchange_plan(x, count, from, &err), 0);
    int send_count[2] = {1, 5}, send_displ[2] = {0, 1}, recv_count[2] = {3, 3}, recv_displ[2] = {0, 3};
    assert_memory_equal(x->send_count, send_count, sizeof send_count);
    assert_memory_equal(x->send_displ, send_displ, sizeof send_displ);
    assert_memory_equal(x->recv_count, recv_count, sizeof recv_count);
    assert_memory_equal(x->recv_displ, recv_displ, sizeof recv_displ);
    assert_int_equal(x->received, 6);
    int local[2] = {3, 3};
    assert_memory_equal(x->local_count, local, sizeof local);
    // Source-major rows: [r0 e0, r0 e1, r0 e1, r1 e0, r1 e0, r1 e1]; expert-major: e0's (0, 3, 4), e1's (1, 2, 5).
    int to_expert[6] = {0, 3, 4, 1, 2, 5}, to_source[6] = {0, 3, 4, 1, 2, 5};
    assert_memory_equal(x->to_expert, to_expert, sizeof to_expert);
    assert_memory_equal(x->to_source, to_source, sizeof to_source);
    neox_moe_exchange_free(x);
    // More rows than the buffers were planned for is an error, not an overrun.
    x = neox_moe_exchange_new(2, 2, 5);
    assert_int_equal(neox_moe_exchange_plan(x, count, from, &err), -1);
    assert_non_null(strstr(err.message, "6 rows received, buffers planned for 5"));
    neox_moe_exchange_free(x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_desc_from_config),
        cmocka_unit_test(test_desc_activations),
        cmocka_unit_test(test_desc_rope_scaling),
        cmocka_unit_test(test_desc_attn_output_bias),
        cmocka_unit_test(test_checkpointing_is_exact),
        cmocka_unit_test(test_host_checkpoints_are_exact),
        cmocka_unit_test(test_head_chunks),
        cmocka_unit_test(test_fused_head),
        cmocka_unit_test(test_fused_head_plan),
        cmocka_unit_test(test_moe_exchange_plan),
        cmocka_unit_test(test_nonparametric_norm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
