// test_config.c: unit tests of lib/config: the schema table, merging and its errors, validation,
// and the derived values as GPT-NeoX computes them (batch sizes, precision, ZeRO, optimizer, LR
// schedule length, attention_config expansion, padded vocabulary).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"

static char tmpdir[64];
static const char *MODEL = "num_layers: 4\nhidden_size: 64\nnum_attention_heads: 4\nmax_position_embeddings: 64\n";

static int setup(void **state) {
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/neox-config-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char *cmd = neox_asprintf("rm -rf '%s'", tmpdir);
    int rc = system(cmd);
    free(cmd);
    return rc;
}

static char *write_config(const char *name, const char *text) {
    char *path = neox_asprintf("%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

// Loads MODEL + extra (as two files) on world ranks as opts says; NULL with err filled on failure.
static neox_config *load_as(const char *extra, neox_config_options opts, neox_error *err) {
    char *a = write_config("model.yml", MODEL), *b = write_config("extra.yml", extra);
    const char *paths[] = {a, b};
    neox_error_clear(err);
    neox_config *cfg = neox_config_load(paths, 2, &opts, err);
    free(a);
    free(b);
    return cfg;
}

static neox_config *load(const char *extra, int world, neox_error *err) {
    return load_as(extra, (neox_config_options){.world_size = world, .quiet = 1}, err);
}

static void expect_error(const char *extra, int world, const char *fragment) {
    neox_error err = {0};
    neox_config *cfg = load(extra, world, &err);
    if (cfg) fail_msg("config loaded, expected an error containing '%s'", fragment);
    assert_int_equal(err.status, NEOX_EXIT_USAGE);
    if (!strstr(err.message, fragment)) fail_msg("error '%s' does not contain '%s'", err.message, fragment);
}

// A plain 1e-4 is a string to YAML 1.1 (PyYAML, GPT-NeoX); a key typed as a number takes it as the
// number (a sub-key too), a string key keeps the string, an integer key refuses it.
static void test_exponent_without_dot(void **state) {
    (void)state;
    neox_error err = {0};
    neox_config *cfg = load("train_micro_batch_size_per_gpu: 1\noptimizer: {type: adam, params: {lr: 1e-4, eps: 1E-8}}\n"
                            "min_lr: 1e-06\nlayernorm_epsilon: 1.0e5\nwandb_group: 1e-06\n", 1, &err);
    if (!cfg) fail_msg("%s", err.message);
    assert_true(neox_config_sub(cfg, optimizer__params__lr)->kind == NEOX_VALUE_FLOAT);
    assert_true(neox_config_sub(cfg, optimizer__params__lr)->number == 1e-4);
    assert_true(neox_config_sub(cfg, optimizer__params__eps)->number == 1e-8);
    assert_true(neox_config_float(cfg, min_lr) == 1e-06);
    assert_true(neox_config_float(cfg, layernorm_epsilon) == 1e5);
    assert_string_equal(neox_config_str(cfg, wandb_group), "1e-06");
    neox_config_free(cfg);
    expect_error("train_micro_batch_size_per_gpu: 1\ntrain_iters: 1e3\n", 1,
                 "key 'train_iters': expected an integer, got '1e3' (a number with an exponent");
}

static void test_schema_table(void **state) {
    (void)state;
    assert_true(neox_key_count >= 297);
    for (int i = 0; i < neox_key_count; i++) {
        const neox_key_spec *k = &neox_key_specs[i];
        assert_ptr_equal(neox_key_find(k->name), k);  // names are unique
        if (k->use == NEOX_KEY_UNSUPPORTED) assert_non_null(k->feature);
        if (k->type == NEOX_TYPE_CHOICE) assert_non_null(k->choices);
    }
    assert_non_null(neox_key_find("num-layers"));
    assert_null(neox_key_find("num_layer"));
    assert_int_equal(neox_key_find("deepspeed")->use, NEOX_KEY_IGNORED);
    assert_int_equal(neox_key_find("moe_num_experts")->use, NEOX_KEY_USED);
    assert_int_equal(neox_key_find("moe_lbl_in_fp32")->use, NEOX_KEY_IGNORED);
    assert_string_equal(neox_key_find("compute_backend")->group, "neox.c");
    // Keys GPT-NeoX's dataclasses declare that its stale key reference did not.
    assert_int_equal(neox_key_find("peak_theoretical_tflops")->use, NEOX_KEY_USED);
    assert_int_equal(neox_key_find("z_loss")->use, NEOX_KEY_USED);  // (train_impl rm; refused otherwise when set)
    assert_int_equal(neox_key_find("wandb_run_name")->use, NEOX_KEY_USED);  // (the wandb sync command, docs/metrics.md)
    assert_int_equal(neox_key_find("comet_experiment")->use, NEOX_KEY_IGNORED);
    assert_int_equal(neox_key_find("kl_impl")->use, NEOX_KEY_UNSUPPORTED);
    // The generated ids index the tables.
    assert_int_equal(NEOX_K_COUNT, neox_key_count);
    assert_int_equal(NEOX_SK_COUNT, neox_subkey_count);
    assert_string_equal(neox_key_specs[NEOX_K_seq_length].name, "seq_length");
    assert_string_equal(neox_key_specs[NEOX_K_compute_backend].name, "compute_backend");
    assert_string_equal(neox_subkey_specs[NEOX_SK_optimizer__params__lr].name, "optimizer.params.lr");
    assert_int_equal(neox_key_id_of("seq-length"), NEOX_K_seq_length);
    assert_int_equal(neox_subkey_id_of("fp16.loss_scale_window"), NEOX_SK_fp16__loss_scale_window);
}

// Every sub-key's parent is a dict of the schema (a top-level key or another sub-key) and its group is
// the top-level key; refused sub-keys name their feature.
static void test_subkey_table(void **state) {
    (void)state;
    assert_true(neox_subkey_count >= 150);
    for (int i = 0; i < neox_subkey_count; i++) {
        const neox_key_spec *k = &neox_subkey_specs[i];
        assert_ptr_equal(neox_subkey_find(k->name), k);
        if (k->use == NEOX_KEY_UNSUPPORTED) assert_non_null(k->feature);
        char parent[256];
        snprintf(parent, sizeof parent, "%s", k->name);
        *strrchr(parent, '.') = 0;
        const neox_key_spec *up = strchr(parent, '.') ? neox_subkey_find(parent) : neox_key_find(parent);
        if (!up) fail_msg("sub-key '%s' has no parent '%s' in the schema", k->name, parent);
        assert_true(up->type == NEOX_TYPE_DICT);
        assert_int_equal(strncmp(k->group, k->name, strlen(k->group)), 0);
    }
    assert_null(neox_subkey_find("fp16.loss-scale-window"));  // DeepSpeed spells sub-keys exactly
    assert_int_equal(neox_subkey_find("zero_optimization.offload_param")->use, NEOX_KEY_UNSUPPORTED);
}

// neox_config_sub: the value at a dotted path, NULL when the file does not set it.
static void test_subkey_reads(void **state) {
    (void)state;
    neox_error err = {0};
    neox_config *cfg = load("train_micro_batch_size_per_gpu: 1\nfp16: {enabled: true, loss_scale_window: 50}\n", 1, &err);
    assert_non_null(cfg);
    assert_int_equal(neox_config_sub(cfg, fp16__loss_scale_window)->integer, 50);
    assert_null(neox_config_sub(cfg, fp16__hysteresis));
    assert_null(neox_config_sub(cfg, zero_optimization__offload_optimizer__device));
    neox_config_free(cfg);
    expect_error("train_micro_batch_size_per_gpu: 1\nbf16: {enabled: true, loss_scale_windw: 5}\n", 1,
                 "unknown key 'bf16.loss_scale_windw'; did you mean 'bf16.loss_scale_window'?");
    expect_error("train_micro_batch_size_per_gpu: 1\noptimizer: {type: adam, params: {lr: 0.1, bettas: [0.9, 0.9]}}\n", 1,
                 "did you mean 'optimizer.params.betas'?");
}

static void test_padded_vocab(void **state) {
    (void)state;
    assert_int_equal(neox_padded_vocab_size(50257, 128, 1), 50304);
    assert_int_equal(neox_padded_vocab_size(50257, 128, 2), 50432);
    assert_int_equal(neox_padded_vocab_size(50304, 128, 1), 50304);
    assert_int_equal(neox_padded_vocab_size(50277, 1, 1), 50277);
    assert_int_equal(neox_padded_vocab_size(256, 128, 8), 1024);
}

static void test_defaults_sources_and_accessors(void **state) {
    (void)state;
    neox_error err = {0};
    neox_config *cfg = load("train_micro_batch_size_per_gpu: 2\nseq-length: 32\n", 1, &err);
    assert_non_null(cfg);
    char buf[512];
    assert_int_equal(neox_config_int(cfg, seq_length), 32);
    assert_non_null(strstr(neox_config_source(cfg, seq_length, buf, sizeof buf), "extra.yml:2"));
    assert_string_equal(neox_config_source(cfg, hidden_dropout, buf, sizeof buf), "default");
    assert_true(neox_config_float(cfg, layernorm_epsilon) == 1e-5);
    assert_string_equal(neox_config_str(cfg, norm), "layernorm");
    assert_string_equal(neox_config_str(cfg, compute_backend), "auto");
    assert_false(neox_config_has(cfg, num_kv_heads));
    assert_true(neox_config_bool(cfg, use_bias_in_mlp));
    assert_int_equal(neox_config_file_count(cfg), 2);
    assert_non_null(strstr(neox_config_file_path(cfg, 1), "extra.yml"));
    // Derived defaults: the default optimizer, ZeRO defaults, fp32, dynamic loss scale.
    assert_string_equal(neox_config_str(cfg, optimizer_type), "Adam");
    assert_true(neox_config_float(cfg, lr) == 0.001);
    assert_true(neox_config_float(cfg, adam_beta2) == 0.999);
    assert_int_equal(neox_config_int(cfg, zero_stage), 0);
    assert_int_equal(neox_config_int(cfg, zero_reduce_bucket_size), 500000000);
    assert_true(neox_config_bool(cfg, zero_reduce_scatter));
    assert_string_equal(neox_config_str(cfg, precision), "fp32");
    assert_true(neox_config_bool(cfg, dynamic_loss_scale));
    assert_false(neox_config_bool(cfg, is_pipe_parallel));
    assert_string_equal(neox_config_str(cfg, text_gen_type), "unconditional");
    assert_string_equal(neox_config_source(cfg, precision, buf, sizeof buf), "derived");
    neox_config_free(cfg);
}

static void test_batch_sizes(void **state) {
    (void)state;
    neox_error err = {0};
    // micro batch only: train = micro x dp, accumulation 1
    neox_config *cfg = load("train_micro_batch_size_per_gpu: 4\n", 8, &err);
    assert_int_equal(neox_config_int(cfg, train_batch_size), 32);
    assert_int_equal(neox_config_int(cfg, gradient_accumulation_steps), 1);
    assert_int_equal(neox_config_int(cfg, data_parallel_size), 8);
    assert_int_equal(neox_config_int(cfg, batch_size), 4);
    neox_config_free(cfg);
    // train + micro: accumulation derived (floor division, then checked)
    cfg = load("train_batch_size: 64\ntrain_micro_batch_size_per_gpu: 4\n", 4, &err);
    assert_int_equal(neox_config_int(cfg, gradient_accumulation_steps), 4);
    neox_config_free(cfg);
    // train + accumulation: micro derived
    cfg = load("train_batch_size: 64\ngradient_accumulation_steps: 2\n", 4, &err);
    assert_int_equal(neox_config_int(cfg, train_micro_batch_size_per_gpu), 8);
    neox_config_free(cfg);
    // train only: accumulation 1, micro = train / dp
    cfg = load("train_batch_size: 64\n", 4, &err);
    assert_int_equal(neox_config_int(cfg, train_micro_batch_size_per_gpu), 16);
    neox_config_free(cfg);
    // pipe and model parallel divide the world
    cfg = load("train_micro_batch_size_per_gpu: 1\npipe_parallel_size: 2\nmodel_parallel_size: 2\n", 8, &err);
    assert_int_equal(neox_config_int(cfg, data_parallel_size), 2);
    assert_true(neox_config_bool(cfg, is_pipe_parallel));
    assert_int_equal(neox_config_int(cfg, train_batch_size), 2);
    neox_config_free(cfg);
    expect_error("train_batch_size: 10\ntrain_micro_batch_size_per_gpu: 4\n", 1, "inconsistent batch sizes");
    expect_error("train_batch_size: 12\ntrain_micro_batch_size_per_gpu: 2\ngradient_accumulation_steps: 2\n", 2,
                 "train_batch_size 12 != train_micro_batch_size_per_gpu 2 x gradient_accumulation_steps 2 x data-parallel size 2");
    expect_error("train_batch_size: 2\n", 4, "too small");
    expect_error("seed: 1\n", 1, "set train_micro_batch_size_per_gpu or train_batch_size");
    expect_error("train_micro_batch_size_per_gpu: 1\nmodel_parallel_size: 3\n", 4, "world size 4 is not divisible");
    expect_error("train_micro_batch_size_per_gpu: 0\n", 1, "key 'train_micro_batch_size_per_gpu': 0 is out of range");
}

// neox-eval's loading: a tp2 x pp2 config (and the training job's global_num_gpus) on 1 or 3
// ranks is data parallel over those ranks; the sizes stay as the checkpoint's description.
static void test_data_parallel_only(void **state) {
    (void)state;
    neox_error err = {0};
    const char *tp_pp = "train_micro_batch_size_per_gpu: 2\npipe_parallel_size: 2\nmodel_parallel_size: 2\n"
                        "global_num_gpus: 8\n";
    for (int world = 1; world <= 3; world += 2) {
        neox_config *cfg = load_as(tp_pp, (neox_config_options){.world_size = world, .quiet = 1, .data_parallel_only = 1}, &err);
        if (!cfg) fail_msg("world %d: %s", world, err.message);
        assert_int_equal(neox_config_int(cfg, data_parallel_size), world);
        assert_int_equal(neox_config_int(cfg, train_batch_size), 2 * world);
        assert_int_equal(neox_config_int(cfg, model_parallel_size), 2);
        assert_int_equal(neox_config_int(cfg, pipe_parallel_size), 2);
        assert_int_equal(neox_config_int(cfg, global_num_gpus), 8);
        neox_config_free(cfg);
    }
    expect_error(tp_pp, 3, "world size 3 is not divisible");  // as neox-train loads it
}

static void test_precision(void **state) {
    (void)state;
    neox_error err = {0};
    neox_config *cfg = load("train_micro_batch_size_per_gpu: 1\nfp16: {enabled: true, loss_scale: 0}\n", 1, &err);
    assert_string_equal(neox_config_str(cfg, precision), "fp16");
    neox_config_free(cfg);
    cfg = load("train_micro_batch_size_per_gpu: 1\nbf16: {enabled: true}\n", 1, &err);
    assert_string_equal(neox_config_str(cfg, precision), "bfloat16");
    neox_config_free(cfg);
    cfg = load("train_micro_batch_size_per_gpu: 1\nfp16: {type: bfloat16, enabled: true}\n", 1, &err);
    assert_string_equal(neox_config_str(cfg, precision), "bfloat16");
    neox_config_free(cfg);
    cfg = load("train_micro_batch_size_per_gpu: 1\nfp16: {enabled: false}\nprecision: bfloat16\n", 1, &err);
    assert_string_equal(neox_config_str(cfg, precision), "bfloat16");
    neox_config_free(cfg);
    expect_error("train_micro_batch_size_per_gpu: 1\nfp16: {enabled: true}\nprecision: fp32\n", 1, "conflicts with the fp16 dict");
    expect_error("train_micro_batch_size_per_gpu: 1\nfp16: {enabled: true}\nbf16: {enabled: true}\n", 1, "both enabled");
}

static void test_optimizer_and_zero(void **state) {
    (void)state;
    neox_error err = {0};
    neox_config *cfg = load("train_micro_batch_size_per_gpu: 1\noptimizer: {type: Adam, params: {lr: 6.0e-4, betas: [0.9, 0.95], "
                            "eps: 1.0e-8}}\nzero_optimization: {stage: 2, contiguous_gradients: true}\n", 1, &err);
    assert_non_null(cfg);
    assert_true(neox_config_float(cfg, lr) == 6.0e-4);
    assert_true(neox_config_float(cfg, adam_beta1) == 0.9);
    assert_true(neox_config_float(cfg, adam_eps) == 1.0e-8);
    assert_int_equal(neox_config_int(cfg, zero_stage), 2);
    assert_true(neox_config_bool(cfg, zero_contiguous_gradients));
    assert_int_equal(neox_config_int(cfg, zero_allgather_bucket_size), 500000000);
    neox_config_free(cfg);
    cfg = load("train_micro_batch_size_per_gpu: 1\noptimizer: {type: sgd, params: {lr: 0.1, momentum: 0.9}}\n", 1, &err);
    assert_true(neox_config_float(cfg, sgd_momentum) == 0.9);
    neox_config_free(cfg);
    // DeepSpeed's OnebitAdam arguments as GPT-NeoX passes them; weight_decay belongs to its params.
    cfg = load("train_micro_batch_size_per_gpu: 1\noptimizer: {type: OneBitAdam, params: {lr: 0.001, betas: [0.9, 0.95], "
               "eps: 1.0e-8, weight_decay: 0.01, freeze_step: 400, cuda_aware: false, comm_backend_name: nccl}}\n", 1, &err);
    assert_non_null(cfg);
    assert_int_equal(neox_config_int(cfg, onebitadam_freeze_step), 400);
    assert_true(neox_config_float(cfg, onebitadam_weight_decay) == 0.01);
    assert_true(neox_config_float(cfg, adam_beta2) == 0.95);
    neox_config_free(cfg);
    cfg = load("train_micro_batch_size_per_gpu: 1\noptimizer: {type: onebitadam, params: {lr: 0.001}}\n", 1, &err);
    assert_int_equal(neox_config_int(cfg, onebitadam_freeze_step), 100000);
    neox_config_free(cfg);
    expect_error("train_micro_batch_size_per_gpu: 1\noptimizer: {type: onebitadam, params: {lr: 0.1, amsgrad: true}}\n", 1,
                 "does not support the AMSGrad variant");
    expect_error("train_micro_batch_size_per_gpu: 1\noptimizer: {type: onebitadam, params: {lr: 0.1, freeze_step: 1.5}}\n", 1,
                 "key 'optimizer.params.freeze_step': expected an integer, got a float (1.5)");
    expect_error("train_micro_batch_size_per_gpu: 1\noptimizer: {type: onebitadam, params: {lr: 0.1, momentum: 0.9}}\n", 1,
                 "params.momentum is not supported");
    expect_error("train_micro_batch_size_per_gpu: 1\ngradient_compression: topk\n", 1, "gradient_compression");
    cfg = load("train_micro_batch_size_per_gpu: 1\noptimizer: {type: sm3, params: {lr: 0.1}}\n", 1, &err);
    assert_true(neox_config_float(cfg, sm3_momentum) == 0.0 && neox_config_float(cfg, sm3_beta) == 0.0 &&
                neox_config_float(cfg, sm3_eps) == 1e-30);  // torch_optimizer.SM3's defaults
    neox_config_free(cfg);
    cfg = load("train_micro_batch_size_per_gpu: 1\noptimizer: {type: SM3, params: {lr: 0.1, momentum: 0.5, beta: 0.9, eps: 1.0e-8}}\n", 1, &err);
    assert_true(neox_config_float(cfg, sm3_momentum) == 0.5 && neox_config_float(cfg, sm3_beta) == 0.9 &&
                neox_config_float(cfg, sm3_eps) == 1e-8);
    neox_config_free(cfg);
    expect_error("train_micro_batch_size_per_gpu: 1\noptimizer: {type: sm3, params: {lr: 0.1, betas: [0.9, 0.99]}}\n", 1,
                 "params.betas is not supported for optimizer 'sm3'");
    expect_error("train_micro_batch_size_per_gpu: 1\noptimizer: {type: sm3, params: {lr: 0.1, beta: 1}}\n", 1,
                 "sm3 needs a beta in [0, 1)");
    expect_error("train_micro_batch_size_per_gpu: 1\noptimizer: {type: sm3, params: {lr: 0.1, momentum: 1}}\n", 1,
                 "sm3 needs a momentum in [0, 1)");
    expect_error("train_micro_batch_size_per_gpu: 1\noptimizer: {type: adam, params: {lr: 0.1, beta: 0.5}}\n", 1,
                 "params.beta is not supported for optimizer 'adam'");
    expect_error("train_micro_batch_size_per_gpu: 1\noptimizer: {type: madgrad_wd, params: {lr: 0.1, betas: [0.9, 0.99]}}\n", 1,
                 "params.betas is not supported for optimizer 'madgrad_wd'");
    expect_error("train_micro_batch_size_per_gpu: 1\noptimizer: {type: madgrad_wd, params: {lr: 0.1, momentum: 1}}\n", 1,
                 "madgrad_wd needs a momentum in [0, 1)");
    expect_error("train_micro_batch_size_per_gpu: 1\noptimizer: {type: adam}\n", 1, "must contain a mapping 'params'");
    expect_error("train_micro_batch_size_per_gpu: 1\noptimizer: {type: adam, params: {lr: '1e-4'}}\n", 1,
                 "optimizer.params.lr': expected a number, got the string '1e-4' (quoted");
    expect_error("train_micro_batch_size_per_gpu: 1\noptimizer: {type: adam, params: {lr: 0.1, weight_decay: 0.1}}\n", 1,
                 "top-level key 'weight_decay'");
    expect_error("train_micro_batch_size_per_gpu: 1\nlr: 0.5\n", 1, "optimizer.params.lr");
    expect_error("train_micro_batch_size_per_gpu: 1\nzero_optimization: {stage: 4}\n", 1, "zero_optimization.stage': 4 is out of range");
    expect_error("train_micro_batch_size_per_gpu: 1\nmin_lr: 0.1\n", 1, "must not exceed lr");
}

static void test_schedule_and_checkpoints(void **state) {
    (void)state;
    neox_error err = {0};
    neox_config *cfg = load("train_micro_batch_size_per_gpu: 1\ntrain_iters: 1000\nlr_decay_fraction: 0.333\nwarmup: 0.1\n"
                            "checkpoint_factor: 300\nextra_save_iters: [5, 300]\n", 1, &err);
    assert_non_null(cfg);
    assert_int_equal(neox_config_int(cfg, lr_decay_iters), 333);
    assert_true(neox_config_float(cfg, warmup_iters) == 0.1 * 333);
    const neox_value *save = neox_config_value(cfg, save_iters);
    assert_int_equal(save->count, 4);  // 5, 300, 600, 900
    assert_int_equal(save->items[0]->integer, 5);
    assert_int_equal(save->items[3]->integer, 900);
    neox_config_free(cfg);
    cfg = load("train_micro_batch_size_per_gpu: 1\ntrain_iters: 100\ncheckpoint_factor: 2\ncheckpoint_scale: log\n", 1, &err);
    assert_int_equal(neox_config_value(cfg, save_iters)->count, 6);  // 2 4 8 16 32 64
    neox_config_free(cfg);
    expect_error("train_micro_batch_size_per_gpu: 1\nlr_decay_iters: 10\nlr_decay_fraction: 0.5\n", 1, "not both");
    expect_error("train_micro_batch_size_per_gpu: 1\nsave: ckpt\n", 1, "checkpoint_factor or extra_save_iters must be set");
    expect_error("train_micro_batch_size_per_gpu: 1\ngradient_clipping: 0.5\nclip_grad: 1.0\n", 1, "set gradient_clipping");
}

static void test_attention_config(void **state) {
    (void)state;
    neox_error err = {0};
    neox_config *cfg = load("train_micro_batch_size_per_gpu: 1\nattention_config: [[[flash], all]]\n", 1, &err);
    const neox_value *att = neox_config_value(cfg, attention_config);
    assert_int_equal(att->count, 4);
    assert_string_equal(att->items[3]->string, "flash");
    neox_config_free(cfg);
    cfg = load("train_micro_batch_size_per_gpu: 1\nattention_config: [[[global, flash], 2]]\n", 1, &err);
    att = neox_config_value(cfg, attention_config);
    assert_int_equal(att->count, 4);
    assert_string_equal(att->items[1]->string, "flash");
    assert_string_equal(att->items[2]->string, "global");
    neox_config_free(cfg);
    expect_error("train_micro_batch_size_per_gpu: 1\nattention_config: [[[global], 3]]\n", 1, "covers 3 layers, but num_layers is 4");
    expect_error("train_micro_batch_size_per_gpu: 1\nattention_config: [[[sparse_fixed], 4]]\n", 1, "'sparse_fixed' is not supported");
    expect_error("train_micro_batch_size_per_gpu: 1\nattention_config: [[[bogus], 4]]\n", 1, "'bogus' is not recognized");
    expect_error("train_micro_batch_size_per_gpu: 1\nattention_config: [global]\n", 1, "lists 1 attention types for 4 layers");
}

static void test_validation_and_refusals(void **state) {
    (void)state;
    expect_error("train_micro_batch_size_per_gpu: 1\nnum_layers: 2\n", 1, "key 'num_layers' is set twice: first at");
    expect_error("train_micro_batch_size_per_gpu: 1\nnum_layer: 2\n", 1, "unknown key 'num_layer'; did you mean 'num_layers'?");
    expect_error("train_micro_batch_size_per_gpu: 1\nzzzzzzzzzzzz: 2\n", 1, "unknown key 'zzzzzzzzzzzz' (keys: docs/config.md)");
    expect_error("train_micro_batch_size_per_gpu: 1\nseed: 1.5\n", 1, "key 'seed': expected an integer, got a float (1.5)");
    expect_error("train_micro_batch_size_per_gpu: 1\nno_weight_tying: 1\n", 1, "expected true or false");
    expect_error("train_micro_batch_size_per_gpu: 1\nnorm: null\n", 1, "must not be null");
    expect_error("train_micro_batch_size_per_gpu: 1\npos_emb: sinusoidal\n", 1, "position embedding 'sinusoidal' is not supported by neox.c (supported: learned, rotary, none, alibi)");
    expect_error("train_micro_batch_size_per_gpu: 1\nactivation: tanh\n", 1, "key 'activation': 'tanh' is not one of");
    expect_error("train_micro_batch_size_per_gpu: 1\nuse_mup: true\n", 1, "muP is not supported");
    expect_error("train_micro_batch_size_per_gpu: 1\ntrain_impl: reinforce\n", 1, "key 'train_impl': post-training method 'reinforce' is not supported by neox.c (supported: normal, dpo, kto, rm)");
    expect_error("train_micro_batch_size_per_gpu: 1\nnum_kv_heads: 3\n", 1, "not divisible by num_kv_heads 3");
    expect_error("train_micro_batch_size_per_gpu: 1\nseq_length: 128\n", 1, "less than seq_length 128");
    expect_error("train_micro_batch_size_per_gpu: 1\nbatch_size: 4\n", 1, "derived from other keys");
    neox_error err = {0};
    // Defaults written out and switched-off feature dicts are accepted.
    neox_config *cfg = load("train_micro_batch_size_per_gpu: 1\nmoe_num_experts: 1\nNorm: LayerNorm\n", 1, &err);
    assert_null(cfg);  // keys are case-sensitive, as in GPT-NeoX
    cfg = load("train_micro_batch_size_per_gpu: 1\nmoe_num_experts: 1\nnorm: RMSNorm\nsoft_prompt_tuning: {enabled: false}\n"
               "sparsity_config: {}\n", 1, &err);
    assert_non_null(cfg);
    neox_config_free(cfg);
}

static void test_file_errors(void **state) {
    (void)state;
    neox_error err = {0};
    const char *missing[] = {"/nonexistent/neox.yml"};
    assert_null(neox_config_load(missing, 1, NULL, &err));
    assert_int_equal(err.status, NEOX_EXIT_FAILURE);
    assert_non_null(strstr(err.message, "/nonexistent/neox.yml"));
    expect_error("", 1, "extra.yml: empty config file");
    expect_error("- a\n", 1, "extra.yml:1: the top level of a config must be a mapping");
    expect_error("a: [1,\n", 1, "extra.yml:2:1: malformed YAML");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schema_table),
        cmocka_unit_test(test_exponent_without_dot),
        cmocka_unit_test(test_subkey_table),
        cmocka_unit_test(test_subkey_reads),
        cmocka_unit_test(test_padded_vocab),
        cmocka_unit_test(test_defaults_sources_and_accessors),
        cmocka_unit_test(test_batch_sizes),
        cmocka_unit_test(test_data_parallel_only),
        cmocka_unit_test(test_precision),
        cmocka_unit_test(test_optimizer_and_zero),
        cmocka_unit_test(test_schedule_and_checkpoints),
        cmocka_unit_test(test_attention_config),
        cmocka_unit_test(test_validation_and_refusals),
        cmocka_unit_test(test_file_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
