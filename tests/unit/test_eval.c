// test_eval.c: the pieces of neox-eval that need no checkpoint: the wikitext detokenizer and word
// count (expected values from the Python harness code run with CPython's re), the rolling windows,
// request tokenization, and malformed task files (bad JSON, missing or mistyped fields, labels out
// of range) failing with file:line under ASan/UBSan.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval.h"
#include "unit_util.h"

static void test_detokenizer(void **state) {
    (void)state;
    static const char *cases[][2] = {
        {" = Robert Boulter = \n Robert Boulter is an English film , television and theatre actor . He had a guest @-@ "
         "starring role on the television series The Bill in 2000 .\n = = Career = = \n",
         " = Robert Boulter =\nRobert Boulter is an English film, television and theatre actor. He had a guest-starring "
         "role on the television series The Bill in 2000 .\n== Career ==\n"},
        {"the ( 1 @,@ 000 ) men 's \" best \" work ; [ x ] { y } ' quoted ' 45 @.@ 5 \xc2\xb0 C N  /' 5/ s ' (unclosed",
         "the (1,000) men's \"best\" work; [x] {y}' quoted '45.5\xc2\xb0" "C 1  /'[0-9]/ s' (unclosed"},
        {"a \xc2\xa0( \xe2\x80\x89x\xe2\x80\x89 ) b", "a \xc2\xa0(x) b"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *got = neox_wikitext_detokenize(cases[i][0]);
        assert_string_equal(got, cases[i][1]);
        free(got);
    }
}

static void test_word_count(void **state) {
    (void)state;
    static const struct { const char *s; int64_t words; } cases[] = {
        {"a b  c", 3}, {" a", 2}, {"a\xc2\xa0" "b", 2}, {"", 1}, {"x\n\ny \xe2\x80\xa8z ", 4}, {"a\x1c" "b", 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        assert_int_equal(neox_count_words(cases[i].s, strlen(cases[i].s)), cases[i].words);
    assert_int_equal(neox_count_codepoints("h\xc3\xa9llo"), 5);
}

// Every token is predicted exactly once, in order, and each window fits max_len + 1 tokens with
// its context ending right before its continuation.
static void test_rolling_windows(void **state) {
    (void)state;
    for (int n = 1; n < 40; n++)
        for (int max_len = 1; max_len < 12; max_len++) {
            int32_t tokens[64];
            for (int i = 0; i < n; i++) tokens[i] = 100 + i;
            neox_ll_request *w;
            int64_t nw = neox_rolling_windows(tokens, n, 7, max_len, &w);
            int next = 0;
            for (int64_t k = 0; k < nw; k++) {
                assert_true(w[k].nctx >= 1 && w[k].ncont >= 1);
                assert_true(w[k].nctx + w[k].ncont <= max_len + 1);
                for (int j = 0; j < w[k].ncont; j++) assert_int_equal(w[k].cont[j], tokens[next++]);
                int32_t before = next - w[k].ncont > 0 ? tokens[next - w[k].ncont - 1] : 7;
                assert_int_equal(w[k].ctx[w[k].nctx - 1], before);
                if (k > 0) assert_int_equal(w[k].nctx + w[k].ncont, max_len + 1);
                neox_ll_request_release(&w[k]);
            }
            assert_int_equal(next, n);
            free(w);
        }
    neox_ll_request *w;
    assert_int_equal(neox_rolling_windows(NULL, 0, 7, 8, &w), 0);
}

// ---- an evaluator over a tiny random model and the char-level tokenizer --------------------------
static neox_grid grid = {.world_size = 1, .pipe_size = 1, .data_size = 1, .model_size = 1};

static neox_evaluator *tiny_evaluator(void) {
    neox_evaluator *ev = neox_calloc(1, sizeof *ev);
    neox_error err = {0};
    neox_tokenizer_options to = {"CharLevelTokenizer", NULL, NULL};
    ev->tokenizer = neox_tokenizer_load(&to, &err);
    assert_non_null(ev->tokenizer);
    ev->eod_id = neox_tokenizer_eod_id(ev->tokenizer);
    neox_model_desc d = {.vocab_size = (int)neox_tokenizer_vocab_size(ev->tokenizer), .hidden_size = 16, .num_layers = 1,
                         .num_heads = 2, .num_kv_heads = 2, .ffn_size = 32, .max_positions = 16,
                         .norm = NEOX_NORM_LAYERNORM, .norm_eps = 1e-5f, .norm_bias = 1, .pos_emb = NEOX_POS_ROTARY,
                         .rotary_dims = 4, .rotary_base = 10000, .activation = NEOX_ACT_GELU, .attn_bias = 1,
                         .mlp_bias = 1, .init_std = 0.02, .tied = 0};
    ev->model = neox_model_create(&d, &err);
    assert_non_null(ev->model);
    neox_model_init(ev->model, 3);
    ev->grid = &grid;
    ev->quiet = 1;
    ev->seq_length = 16;
    ev->micro_batch = 3;
    return ev;
}

static void test_encode_pair(void **state) {
    (void)state;
    neox_evaluator *ev = tiny_evaluator();
    neox_ll_request r;
    neox_error err = {0};
    assert_int_equal(neox_eval_encode_pair(ev, "ab  ", "c", &r, &err), 0);  // trailing spaces move over
    assert_int_equal(r.nctx, 2);
    assert_int_equal(r.ncont, 3);
    neox_ll_request_release(&r);
    assert_int_equal(neox_eval_encode_pair(ev, "", "xyz", &r, &err), 0);  // empty context: [EOD]
    assert_int_equal(r.nctx, 1);
    assert_int_equal(r.ctx[0], ev->eod_id);
    neox_ll_request_release(&r);
    assert_int_equal(neox_eval_encode_pair(ev, "abc", "", &r, &err), -1);
    assert_non_null(strstr(err.message, "no tokens"));
    neox_evaluator_free(ev);
}

static char *write_file(const char *name, const char *text) {
    char *path = tmp_path(name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static void expect_task_error(neox_evaluator *ev, const char *kind, const char *name, const char *text, const char *message) {
    char *path = write_file(name, text), *task = neox_asprintf("%s:%s", kind, path), *want = neox_asprintf("%s:%s", name, message);
    neox_task_options o = {.data_dir = tmpdir, .bootstrap_iters = 100};
    neox_task_result r;
    neox_error err = {0};
    assert_int_equal(neox_eval_task(ev, task, &o, &r, &err), -1);
    if (!strstr(err.message, want)) fail_msg("'%s' does not contain '%s'", err.message, want);
    assert_int_equal(err.status, NEOX_EXIT_USAGE);
    neox_task_result_release(&r);
    free(path);
    free(task);
    free(want);
}

// Python's generator as CPython gives it (random.Random(seed).random() after k calls, values printed
// by CPython 3.11), and the bootstrap's bookkeeping: the harness's chunking, a constant sample
// with no spread, the chunks shared out over "ranks" giving the one-rank resamples.
static void test_bootstrap(void **state) {
    (void)state;
    assert_true(neox_python_random(0, 0) == 0.8444218515250481);
    assert_true(neox_python_random(0, 1) == 0.7579544029403025);
    assert_true(neox_python_random(99, 5) == 0.2511510083752201);
    assert_true(neox_python_random(4294967297ull, 0) == 0.2309331037176915);
    assert_int_equal(neox_bootstrap_chunk(100000), 1000);
    assert_int_equal(neox_bootstrap_chunk(300), 300);
    assert_int_equal(neox_bootstrap_count(2500), 2000);
    assert_int_equal(neox_bootstrap_count(0), 0);
    double same[4] = {-2, -2, -2, -2}, rep[2000] = {0}, shared[2000] = {0};
    neox_bootstrap_perplexity(same, 4, 1000, 0, 1, rep);
    assert_true(neox_sample_stddev(rep, 1000) < 1e-12);  // exp(2) each time: no spread but rounding
    double ll[5] = {-1.5, -0.25, -3.0, -0.75, -2.0};
    neox_bootstrap_perplexity(ll, 5, 2500, 0, 1, rep);
    for (int part = 0; part < 3; part++) neox_bootstrap_perplexity(ll, 5, 2500, part, 3, shared);
    assert_memory_equal(rep, shared, sizeof rep);
    assert_true(neox_sample_stddev(rep, 2000) > 0.0);
    assert_true(isnan(neox_sample_stddev(rep, 1)));
}

static void test_malformed_task_files(void **state) {
    (void)state;
    neox_evaluator *ev = tiny_evaluator();
    const char *good = "{\"context\": \"ab\", \"choices\": [\"c\", \"dd\"], \"label\": 1}\n";
    char *twice = neox_asprintf("%s%s", good, good);
    expect_task_error(ev, "mc", "json.jsonl", "{\"context\": \"a\", \"choices\": [\"b\"", "1: ");
    expect_task_error(ev, "mc", "json2.jsonl", "{\"context\": \"a\", \"choices\": [\"b\"], \"label\": 0}\n{]\n", "2: ");
    expect_task_error(ev, "mc", "array.jsonl", "[1, 2]\n", "1: not a JSON object");
    expect_task_error(ev, "mc", "empty.jsonl", "\n", "1: empty line");
    expect_task_error(ev, "mc", "label.jsonl", "{\"context\": \"a\", \"choices\": [\"b\", \"c\"], \"label\": 2}\n", "1: label 2 is out of range");
    expect_task_error(ev, "mc", "negative.jsonl", "{\"context\": \"a\", \"choices\": [\"b\"], \"label\": -1}\n", "1: label -1");
    expect_task_error(ev, "mc", "nolabel.jsonl", "{\"context\": \"a\", \"choices\": [\"b\"]}\n", "1: field \"label\" is missing");
    expect_task_error(ev, "mc", "strlabel.jsonl", "{\"context\": \"a\", \"choices\": [\"b\"], \"label\": \"0\"}\n",
                      "1: field \"label\" is not an integer");
    expect_task_error(ev, "mc", "nochoices.jsonl", "{\"context\": \"a\", \"choices\": [], \"label\": 0}\n",
                      "1: field \"choices\" is not a non-empty list");
    expect_task_error(ev, "mc", "emptychoice.jsonl", "{\"context\": \"a\", \"choices\": [\"\"], \"label\": 0}\n", "1");
    expect_task_error(ev, "mc", "context.jsonl", "{\"context\": 3, \"choices\": [\"b\"], \"label\": 0}\n",
                      "1: field \"context\" is not a string");
    expect_task_error(ev, "loglikelihood", "ll.jsonl", "{\"context\": \"a\", \"continuation\": \"b\"}\n{\"context\": \"a\"}\n",
                      "2: missing field \"continuation\"");
    expect_task_error(ev, "rolling", "roll.jsonl", "{\"txt\": \"a\"}\n", "1: missing field \"text\"");
    // A good file scores, with a limit.
    char *path = write_file("good.jsonl", twice), *task = neox_asprintf("mc:%s", path);
    neox_task_options o = {.data_dir = tmpdir, .limit = 1, .bootstrap_iters = 100};
    neox_task_result r;
    neox_error err = {0};
    if (neox_eval_task(ev, task, &o, &r, &err) != 0) fail_msg("%s", err.message);
    assert_int_equal(r.examples, 1);
    assert_int_equal(r.nmetrics, 2);
    neox_task_result_release(&r);
    free(path);
    free(task);
    free(twice);
    neox_evaluator_free(ev);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_detokenizer),   cmocka_unit_test(test_word_count),
        cmocka_unit_test(test_rolling_windows), cmocka_unit_test(test_encode_pair),
        cmocka_unit_test(test_malformed_task_files), cmocka_unit_test(test_bootstrap),
    };
    return cmocka_run_group_tests(tests, make_tmpdir, remove_tmpdir);
}
