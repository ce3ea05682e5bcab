// test_convert.c: lib/convert under ASan/UBSan — the Megatron-style block convention of layout.c
// (which block of each Hugging Face tensor a (pipe, model) rank holds), and from-hf on malformed
// Hugging Face folders (config.json, model.safetensors.index.json and safetensors content), each
// refused with an error naming the file and key or tensor, leaving no output behind.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "unit_util.h"
#include <glob.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "convert.h"
#include "safetensors.h"

// ---- layout -----------------------------------------------------------------------------------
static neox_model_desc tiny_neox(void) {
    neox_model_desc d = {.vocab_size = 16, .hidden_size = 8, .num_layers = 4, .num_heads = 2, .ffn_size = 32,
                         .max_positions = 16, .norm = NEOX_NORM_LAYERNORM, .norm_eps = 1e-5f, .norm_bias = 1,
                         .pos_emb = NEOX_POS_ROTARY, .rotary_dims = 2, .rotary_base = 10000, .activation = NEOX_ACT_GELU,
                         .attn_bias = 1, .mlp_bias = 1};
    neox_error err = {0};
    assert_int_equal(neox_model_desc_check(&d, &err), 0);
    return d;
}

static const neox_cvt_param *find(const neox_cvt_param *ps, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(ps[i].name, name)) return &ps[i];
    fail_msg("no parameter %s", name);
    return NULL;
}

// The block lib/model gives the (pipe, model) rank of a tp x pp layout (type:transformer stages),
// which is what reshard writes for that rank. held: the rank has the parameter at all; replicated
// tensors (split NONE) are held whole by every model rank (reshard writes model rank 0's).
static void expect_block(const neox_model_desc *whole, const neox_cvt_param *p, const neox_cvt_layout *lay, int pipe,
                         int model, int held, int64_t off0, int64_t cnt0, int64_t off1, int64_t cnt1) {
    neox_model_desc d = *whole;
    int bounds[8], n;
    neox_error err = {0};
    assert_int_equal(neox_model_pipe_partition(&d, lay->pp, NULL, bounds, &err), 0);
    d.tp_size = lay->tp, d.tp_rank = model, d.pp_size = lay->pp, d.pp_rank = pipe;
    d.layer_begin = bounds[pipe], d.layer_end = bounds[pipe + 1];
    neox_param *list = neox_model_param_list(&d, &n, &err);
    assert_non_null(list);
    const neox_param *b = NULL;
    for (int i = 0; i < n; i++)
        if (!strcmp(list[i].name, p->name) && !list[i].tied_copy) b = &list[i];
    assert_int_equal(b != NULL, held);
    if (b) {
        assert_int_equal(b->block_offset[0], off0);
        assert_int_equal(b->shape[0], cnt0);
        if (p->ndim == 2) {
            assert_int_equal(b->block_offset[1], off1);
            assert_int_equal(b->shape[1], cnt1);
        }
    }
    free(list);
}

static void test_layout_blocks(void **state) {
    (void)state;
    neox_model_desc d = tiny_neox();
    int n;
    neox_cvt_param *ps = neox_cvt_params(&d, &n);
    neox_cvt_layout lay = {.tp = 2, .pp = 2, .dp = 1};
    // Column-parallel: fused QKV rows by heads (each head's q, k, v rows are adjacent).
    const neox_cvt_param *qkv = find(ps, n, "gpt_neox.layers.0.attention.query_key_value.weight");
    expect_block(&d, qkv, &lay, 0, 1, 1, 12, 12, 0, 8);
    expect_block(&d, qkv, &lay, 1, 1, 0, 0, 0, 0, 0);  // layer 0 is on stage 0
    // Row-parallel weight by columns; its bias replicated (whole on every model rank).
    const neox_cvt_param *dense = find(ps, n, "gpt_neox.layers.3.attention.dense.weight");
    expect_block(&d, dense, &lay, 1, 1, 1, 0, 8, 4, 4);
    const neox_cvt_param *dense_b = find(ps, n, "gpt_neox.layers.3.mlp.dense_4h_to_h.bias");
    expect_block(&d, dense_b, &lay, 1, 0, 1, 0, 8, 0, 0);
    expect_block(&d, dense_b, &lay, 1, 1, 1, 0, 8, 0, 0);
    const neox_cvt_param *fc2 = find(ps, n, "gpt_neox.layers.2.mlp.dense_4h_to_h.weight");
    expect_block(&d, fc2, &lay, 1, 1, 1, 0, 8, 16, 16);
    const neox_cvt_param *fc_b = find(ps, n, "gpt_neox.layers.1.mlp.dense_h_to_4h.bias");
    expect_block(&d, fc_b, &lay, 0, 1, 1, 16, 16, 0, 0);
    // Vocabulary-parallel embedding on the first stage, output layer and final norm on the last.
    expect_block(&d, find(ps, n, "gpt_neox.embed_in.weight"), &lay, 0, 1, 1, 8, 8, 0, 8);
    expect_block(&d, find(ps, n, "gpt_neox.embed_in.weight"), &lay, 1, 1, 0, 0, 0, 0, 0);
    expect_block(&d, find(ps, n, "embed_out.weight"), &lay, 1, 0, 1, 0, 8, 0, 8);
    expect_block(&d, find(ps, n, "gpt_neox.final_layer_norm.weight"), &lay, 1, 0, 1, 0, 8, 0, 0);
    expect_block(&d, find(ps, n, "gpt_neox.final_layer_norm.weight"), &lay, 0, 0, 0, 0, 0, 0, 0);
    free(ps);
}

static void test_layout_check(void **state) {
    (void)state;
    neox_model_desc d = tiny_neox();
    neox_error err = {0};
    neox_cvt_layout lay = {.tp = 4, .pp = 1, .dp = 1};
    assert_int_equal(neox_cvt_layout_check(&d, &lay, &err), -1);
    assert_int_equal(err.status, NEOX_EXIT_USAGE);
    assert_non_null(strstr(err.message, "--tp 4 does not divide num_attention_heads = 2"));
    lay = (neox_cvt_layout){.tp = 1, .pp = 5, .dp = 1};
    assert_int_equal(neox_cvt_layout_check(&d, &lay, &err), -1);
    assert_non_null(strstr(err.message, "--pp 5"));
}

// ---- from-hf on malformed folders ---------------------------------------------------------------
static const char good_config[] =
    "{\"model_type\": \"gpt_neox\", \"vocab_size\": 16, \"hidden_size\": 8, \"num_hidden_layers\": 4,"
    " \"num_attention_heads\": 2, \"intermediate_size\": 32, \"max_position_embeddings\": 16, \"rotary_pct\": 0.5,"
    " \"hidden_act\": \"gelu\", \"use_parallel_residual\": true, \"tie_word_embeddings\": false}";

static void write_text(const char *dir, const char *name, const char *text) {
    char *path = neox_asprintf("%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    free(path);
}

// Writes the tiny model's tensors into dir/file; skip (if not NULL) is left out, extra added, and
// the first tensor gets dtype first_dtype.
static void write_weights(const char *dir, const char *file, const char *skip, const char *extra, const char *first_dtype) {
    neox_model_desc d = tiny_neox();
    int n;
    neox_cvt_param *ps = neox_cvt_params(&d, &n);
    neox_st_entry *e = calloc((size_t)n + 1, sizeof *e);
    float *data = calloc(16 * 32, sizeof(float));
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (skip && !strcmp(ps[i].name, skip)) continue;
        const char *dtype = k == 0 && first_dtype ? first_dtype : "F32";
        e[k] = (neox_st_entry){ps[i].name, dtype, ps[i].ndim, {ps[i].shape[0], ps[i].shape[1]}, data};
        k++;
    }
    if (extra) e[k++] = (neox_st_entry){extra, "F32", 1, {4}, data};
    char *path = neox_asprintf("%s/%s", dir, file);
    neox_error err = {0};
    assert_int_equal(neox_safetensors_write(path, e, k, NULL, &err), 0);
    free(path);
    free(e);
    free(data);
    free(ps);
}

// A fresh folder holding config (NULL: the good one) and the model's weights.
static char *folder(const char *name, const char *config) {
    char *dir = tmp_path(name);
    assert_int_equal(mkdir(dir, 0777), 0);
    write_text(dir, "config.json", config ? config : good_config);
    write_weights(dir, "model.safetensors", NULL, NULL, NULL);
    return dir;
}

// Whether a temporary of path ("<path>.tmp.*") is in its directory.
static int temporary_beside(const char *path) {
    char *pattern = neox_asprintf("%s.tmp.*", path);
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g), found = rc == 0 && g.gl_pathc > 0;
    if (rc == 0) globfree(&g);
    free(pattern);
    return found;
}

static void expect_import_error(const char *dir, int status, const char *message) {
    char *out = neox_asprintf("%s.out", dir);
    neox_cvt_layout lay = {1, 1, 1, 0, NULL};
    neox_error err = {0};
    assert_int_equal(neox_convert_from_hf(dir, out, &lay, &err), -1);
    if (!strstr(err.message, message)) fail_msg("error '%s' does not contain '%s'", err.message, message);
    assert_int_equal(err.status, status);
    struct stat st;
    assert_int_not_equal(stat(out, &st), 0);  // nothing that looks complete
    assert_false(temporary_beside(out));  // and no temporary left
    free(out);
}

static void test_import_good_folder(void **state) {
    (void)state;
    char *dir = folder("good", NULL), *out = neox_asprintf("%s.out", dir);
    neox_cvt_layout lay = {2, 2, 1, 0, NULL};
    neox_error err = {0};
    if (neox_convert_from_hf(dir, out, &lay, &err) != 0) fail_msg("%s", err.message);
    assert_int_equal(neox_convert_verify(out, stdout, &err), 0);
    free(out);
    free(dir);
}

static void test_import_bad_config(void **state) {
    (void)state;
    struct {
        const char *name, *config, *message;
        int status;
    } cases[] = {
        {"notjson", "{\"model_type\": ", "config.json:1:", 1},
        {"array", "[1, 2]", "config.json: not a JSON object", 1},
        {"type", "{\"model_type\": \"bert\"}", "model_type 'bert'", 2},
        {"hidden", "{\"model_type\": \"gpt_neox\", \"hidden_size\": \"8\"}", "'hidden_size' is not a non-negative integer", 2},
        {"layers", "{\"model_type\": \"gpt_neox\", \"hidden_size\": 8}", "'num_hidden_layers' is missing", 2},
        {"heads", "{\"model_type\": \"gpt_neox\", \"hidden_size\": 8, \"num_hidden_layers\": 1, \"num_attention_heads\": 0,"
                  " \"vocab_size\": 16}", "hidden_size is not divisible by num_attention_heads", 2},
        {"act", "{\"model_type\": \"gpt_neox\", \"hidden_size\": 8, \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
                " \"vocab_size\": 16, \"hidden_act\": \"tanh\"}", "hidden_act 'tanh'", 2},
        {"theta", "{\"model_type\": \"llama\", \"hidden_size\": 8, \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
                  " \"vocab_size\": 16, \"intermediate_size\": 8, \"rope_theta\": 10.5}", "rope_theta 10.5", 2},
        {"scaling", "{\"model_type\": \"llama\", \"hidden_size\": 8, \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
                    " \"vocab_size\": 16, \"intermediate_size\": 8, \"rope_scaling\": {\"type\": \"linear\"}}",
         "rope_scaling", 2},
        {"shape", "{\"model_type\": \"gpt_neox\", \"vocab_size\": 16, \"hidden_size\": 8, \"num_hidden_layers\": 4,"
                  " \"num_attention_heads\": 2, \"intermediate_size\": 64, \"rotary_pct\": 0.5}",
         "tensor 'gpt_neox.layers.0.mlp.dense_h_to_4h.weight' has another shape", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *dir = folder(cases[i].name, cases[i].config);
        expect_import_error(dir, cases[i].status, cases[i].message);
        free(dir);
    }
}

static void test_import_bad_weights(void **state) {
    (void)state;
    char *dir = folder("missing", NULL);
    write_weights(dir, "model.safetensors", "gpt_neox.layers.2.attention.dense.bias", NULL, NULL);
    expect_import_error(dir, 1, "tensor 'gpt_neox.layers.2.attention.dense.bias' is missing");
    free(dir);
    dir = folder("extra", NULL);
    write_weights(dir, "model.safetensors", NULL, "gpt_neox.layers.9.mystery", NULL);
    expect_import_error(dir, 1, "tensor 'gpt_neox.layers.9.mystery' is not a parameter");
    free(dir);
    dir = folder("dtype", NULL);
    write_weights(dir, "model.safetensors", NULL, NULL, "I32");
    expect_import_error(dir, 1, "is I32 (F32, BF16 or F16 expected)");
    free(dir);
    dir = folder("garbage", NULL);
    write_text(dir, "model.safetensors", "not a safetensors file at all");
    expect_import_error(dir, 1, "model.safetensors");
    free(dir);
}

static void test_import_bad_index(void **state) {
    (void)state;
    char *dir = folder("index_outside", NULL);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {\"gpt_neox.embed_in.weight\": \"../x.safetensors\"}}");
    expect_import_error(dir, 1, "outside the folder");
    free(dir);
    dir = folder("index_nomap", NULL);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": [1]}");
    expect_import_error(dir, 1, "no weight_map object");
    free(dir);
    dir = folder("index_partial", NULL);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {\"gpt_neox.embed_in.weight\": \"model.safetensors\"}}");
    expect_import_error(dir, 1, "no entry for tensor");
    free(dir);
    dir = folder("index_json", NULL);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": ");
    expect_import_error(dir, 1, "model.safetensors.index.json:1:");
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_blocks),       cmocka_unit_test(test_layout_check),
        cmocka_unit_test(test_import_good_folder),  cmocka_unit_test(test_import_bad_config),
        cmocka_unit_test(test_import_bad_weights),  cmocka_unit_test(test_import_bad_index),
    };
    neox_progress_set_enabled(0);
    return cmocka_run_group_tests(tests, make_tmpdir, remove_tmpdir);
}
