// test_yaml.c: unit tests of lib/config/yaml.c: YAML 1.1 scalar resolution as PyYAML does it,
// positions, duplicate keys, and survival of malformed input (truncation, deep nesting, huge
// scalars, binary garbage, empty input) with clear errors. Run under ASan/UBSan by `make test`.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

static neox_value *parse(const char *text, neox_error *err) {
    neox_error_clear(err);
    return neox_yaml_parse(text, strlen(text), "t.yml", err);
}

// The value of key in a one-line mapping "key: TEXT".
static neox_value *scalar(const char *text, neox_value **root) {
    neox_error err = {0};
    char *doc = neox_asprintf("k: %s\n", text);
    *root = parse(doc, &err);
    free(doc);
    assert_non_null(*root);
    assert_int_equal((*root)->kind, NEOX_VALUE_MAP);
    return (*root)->items[0];
}

static void expect_kind(const char *text, neox_value_kind kind) {
    neox_value *root, *v = scalar(text, &root);
    if (v->kind != kind) fail_msg("'%s' resolved to kind %d, expected %d", text, v->kind, kind);
    neox_value_free(root);
}

static void expect_int(const char *text, int64_t want) {
    neox_value *root, *v = scalar(text, &root);
    if (v->kind != NEOX_VALUE_INT || v->integer != want) fail_msg("'%s' is not the integer %lld", text, (long long)want);
    assert_true(v->number == (double)want);
    neox_value_free(root);
}

static void expect_float(const char *text, double want) {
    neox_value *root, *v = scalar(text, &root);
    if (v->kind != NEOX_VALUE_FLOAT || !(v->number == want || (isnan(want) && isnan(v->number))))
        fail_msg("'%s' is not the float %g", text, want);
    neox_value_free(root);
}

static void test_bools_and_nulls(void **state) {
    (void)state;
    const char *yes[] = {"true", "True", "TRUE", "yes", "Yes", "on", "ON"};
    const char *no[] = {"false", "False", "no", "NO", "off", "Off"};
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++) {
        neox_value *root, *v = scalar(yes[i], &root);
        assert_int_equal(v->kind, NEOX_VALUE_BOOL);
        assert_true(v->boolean);
        neox_value_free(root);
    }
    for (size_t i = 0; i < sizeof no / sizeof *no; i++) {
        neox_value *root, *v = scalar(no[i], &root);
        assert_int_equal(v->kind, NEOX_VALUE_BOOL);
        assert_false(v->boolean);
        neox_value_free(root);
    }
    expect_kind("~", NEOX_VALUE_NULL);
    expect_kind("null", NEOX_VALUE_NULL);
    expect_kind("", NEOX_VALUE_NULL);
    expect_kind("tRUE", NEOX_VALUE_STRING);
    expect_kind("\"True\"", NEOX_VALUE_STRING);
    expect_kind("'null'", NEOX_VALUE_STRING);
    expect_kind("!!str 12", NEOX_VALUE_STRING);
}

static void test_numbers_as_pyyaml(void **state) {
    (void)state;
    expect_int("500000000", 500000000);
    expect_int("-12", -12);
    expect_int("+7", 7);
    expect_int("0", 0);
    expect_int("1_000", 1000);
    expect_int("0x1F", 31);
    expect_int("010", 8);
    expect_int("0b101", 5);
    expect_int("1:30", 90);
    expect_int("9223372036854775807", INT64_MAX);
    expect_int("-9223372036854775808", INT64_MIN);
    expect_float("6.0e-4", 6.0e-4);
    expect_float("0.0006", 0.0006);
    expect_float("1.", 1.0);
    expect_float(".5", 0.5);
    expect_float("-1.5e+3", -1500.0);
    expect_float("1_0.5", 10.5);
    expect_float(".inf", INFINITY);
    expect_float("-.Inf", -INFINITY);
    expect_float(".NaN", NAN);
    // YAML 1.1 wants a '.' and a signed exponent: these are strings to PyYAML, hence here too (a key
    // typed as a number takes those YAML 1.2 reads as numbers: number_text, tests/unit/test_config.c).
    expect_kind("1e-5", NEOX_VALUE_STRING);
    expect_kind("1.0e5", NEOX_VALUE_STRING);
    expect_kind("1.0e_8", NEOX_VALUE_STRING);
    expect_kind("969, 30, 1", NEOX_VALUE_STRING);
    expect_kind("0o17", NEOX_VALUE_STRING);
}

static void test_integer_overflow_is_an_error(void **state) {
    (void)state;
    neox_error err = {0};
    neox_value *v = parse("k: 99999999999999999999\n", &err);
    assert_null(v);
    assert_int_equal(err.status, NEOX_EXIT_USAGE);
    assert_non_null(strstr(err.message, "t.yml:1:4: integer '99999999999999999999' is out of range"));
}

static void test_gpt_neox_style_document(void **state) {
    (void)state;
    const char *doc = "# comment\n{\n  \"pipe-parallel-size\": 1,\n  # inner comment\n  \"optimizer\": {\n"
                      "    \"type\": \"Adam\",\n    \"params\": {\"lr\": 0.0006, \"betas\": [0.9, 0.95], \"eps\": 1.0e-8,},\n"
                      "  },\n  \"attention_config\": [[[\"global\"], 12]],\n  \"flag\": True,\n}\n";
    neox_error err = {0};
    neox_value *root = parse(doc, &err);
    assert_non_null(root);
    assert_int_equal(root->count, 4);
    const neox_value *pp = neox_value_get(root, "pipe_parallel_size");  // '-' == '_'
    assert_non_null(pp);
    assert_int_equal(pp->integer, 1);
    assert_int_equal(pp->line, 3);
    assert_int_equal(pp->column, 25);
    const neox_value *params = neox_value_get(neox_value_get(root, "optimizer"), "params");
    assert_non_null(params);
    assert_int_equal(params->count, 3);
    assert_true(neox_value_get(params, "eps")->number == 1.0e-8);
    assert_int_equal(neox_value_get(params, "betas")->items[1]->kind, NEOX_VALUE_FLOAT);
    const neox_value *att = neox_value_get(root, "attention_config");
    assert_int_equal(att->items[0]->items[1]->integer, 12);
    assert_string_equal(att->items[0]->items[0]->items[0]->string, "global");
    assert_true(neox_value_get(root, "flag")->boolean);
    char buf[128];
    assert_string_equal(neox_value_format(neox_value_get(root, "optimizer"), buf, sizeof buf),
                        "{type: Adam, params: {lr: 0.0006, betas: [0.9, 0.95], eps: 1e-08}}");
    assert_string_equal(neox_value_format(att, buf, 8), "[[[g...");
    neox_value_free(root);
}

static void test_duplicate_keys_and_aliases_are_errors(void **state) {
    (void)state;
    neox_error err = {0};
    assert_null(parse("a: 1\nb: 2\na: 3\n", &err));
    assert_string_equal(err.message, "t.yml:3: duplicate key 'a' (first set at line 1)");
    assert_null(parse("a: &x 1\nb: *x\n", &err));
    assert_non_null(strstr(err.message, "t.yml:2:4: YAML aliases (*x) are not supported"));
    assert_null(parse("a: {<<: {b: 1}}\n", &err));
    assert_non_null(strstr(err.message, "merge keys"));
    assert_null(parse("a: 1\n---\nb: 2\n", &err));
    assert_non_null(strstr(err.message, "t.yml:2: a config file holds one YAML document"));
    assert_null(parse("a: !!python/tuple [1, 2]\n", &err));
    assert_non_null(strstr(err.message, "tag"));
    assert_null(parse("[1, 2]: x\n", &err));
    assert_non_null(strstr(err.message, "mapping key must be a scalar"));
}

static void test_malformed_yaml_names_line(void **state) {
    (void)state;
    neox_error err = {0};
    assert_null(parse("{\n  \"a\": 1,\n  \"b\": [1, 2\n}\n", &err));
    assert_int_equal(err.status, NEOX_EXIT_USAGE);
    assert_non_null(strstr(err.message, "t.yml:4:1: malformed YAML"));
    assert_null(parse("a: b: c\n", &err));
    assert_non_null(strstr(err.message, "t.yml:1:"));
    assert_null(parse("a:\n\t- 1\n", &err));
    assert_non_null(strstr(err.message, "t.yml:2:"));
}

static void test_empty_and_non_map(void **state) {
    (void)state;
    neox_error err = {0};
    neox_value *v = parse("", &err);
    assert_non_null(v);
    assert_int_equal(v->kind, NEOX_VALUE_NULL);
    neox_value_free(v);
    v = parse("# only a comment\n", &err);
    assert_int_equal(v->kind, NEOX_VALUE_NULL);
    neox_value_free(v);
    v = parse("- 1\n- 2\n", &err);
    assert_int_equal(v->kind, NEOX_VALUE_LIST);
    assert_int_equal(v->count, 2);
    neox_value_free(v);
    v = parse("just text", &err);
    assert_int_equal(v->kind, NEOX_VALUE_STRING);
    neox_value_free(v);
}

static void test_deep_nesting_is_bounded(void **state) {
    (void)state;
    size_t n = 100000;
    char *deep = neox_malloc(n + 1);
    memset(deep, '[', n);
    deep[n] = 0;
    neox_error err = {0};
    assert_null(neox_yaml_parse(deep, n, "deep.yml", &err));
    assert_int_equal(err.status, NEOX_EXIT_USAGE);
    assert_non_null(strstr(err.message, "nested deeper than"));
    for (size_t i = 0; i < n; i++) deep[i] = i % 2 ? ' ' : '{';  // mappings, and block nesting below
    assert_null(neox_yaml_parse(deep, n, "deep.yml", &err));
    free(deep);
    // Exactly at the limit is fine.
    char ok[2 * 64 + 1];
    memset(ok, '[', 64);
    memset(ok + 64, ']', 64);
    ok[128] = 0;
    neox_value *v = neox_yaml_parse(ok, 128, "ok.yml", &err);
    assert_non_null(v);
    neox_value_free(v);
}

static void test_huge_scalar(void **state) {
    (void)state;
    size_t n = 8 << 20;
    char *doc = neox_malloc(n + 16);
    memcpy(doc, "k: ", 3);
    memset(doc + 3, 'x', n);
    strcpy(doc + 3 + n, "\n");
    neox_error err = {0};
    neox_value *v = neox_yaml_parse(doc, n + 4, "huge.yml", &err);
    assert_non_null(v);
    assert_int_equal(strlen(v->items[0]->string), n);
    char buf[32];
    assert_string_equal(neox_value_format(v, buf, sizeof buf), "{k: xxxxxxxxxxxxxxxxxxxxxxxx...");
    neox_value_free(v);
    free(doc);
}

static const char SAMPLE[] =
    "# GPT-NeoX style\n{\n  \"num_layers\": 2,\n  \"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 6.0e-4,\n"
    "    \"betas\": [0.9, 0.95]}},\n  \"split\": \"969, 30, 1\",\n  'attention_config': [[[\"flash\"], \"all\"]],\n"
    "  block:\n    - a\n    - {b: c}\n  text: |\n    multi\n    line\n}\n";

static void test_every_truncation(void **state) {
    (void)state;
    size_t n = strlen(SAMPLE);
    for (size_t len = 0; len <= n; len++) {
        char *copy = neox_malloc(len + 1);  // exact size: ASan catches any read past len
        memcpy(copy, SAMPLE, len);
        copy[len] = 0;
        neox_error err = {0};
        neox_value *v = neox_yaml_parse(copy, len, "trunc.yml", &err);
        if (!v) assert_non_null(strstr(err.message, "trunc.yml"));
        neox_value_free(v);
        free(copy);
    }
}

static void test_binary_garbage(void **state) {
    (void)state;
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    for (int round = 0; round < 300; round++) {
        size_t len = (size_t)(round * 37 % 2048);
        unsigned char *buf = neox_malloc(len + 1);
        for (size_t i = 0; i < len; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            unsigned char byte = (unsigned char)(seed >> 56);
            // Half of the rounds draw from YAML's own punctuation, so the parser gets further in.
            static const char punctuation[] = "[]{},:-#&*!|>'\"%@ \n\tab01.eE";
            if (round % 2) byte = (unsigned char)punctuation[byte % (sizeof punctuation - 1)];
            buf[i] = byte;
        }
        buf[len] = 0;
        neox_error err = {0};
        neox_value *v = neox_yaml_parse((const char *)buf, len, "garbage.yml", &err);
        if (!v) {
            assert_true(err.status == NEOX_EXIT_USAGE || err.status == NEOX_EXIT_FAILURE);
            assert_non_null(strstr(err.message, "garbage.yml"));
        }
        neox_value_free(v);
        free(buf);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bools_and_nulls),
        cmocka_unit_test(test_numbers_as_pyyaml),
        cmocka_unit_test(test_integer_overflow_is_an_error),
        cmocka_unit_test(test_gpt_neox_style_document),
        cmocka_unit_test(test_duplicate_keys_and_aliases_are_errors),
        cmocka_unit_test(test_malformed_yaml_names_line),
        cmocka_unit_test(test_empty_and_non_map),
        cmocka_unit_test(test_deep_nesting_is_bounded),
        cmocka_unit_test(test_huge_scalar),
        cmocka_unit_test(test_every_truncation),
        cmocka_unit_test(test_binary_garbage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
