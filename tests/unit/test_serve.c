// test_serve.c: neox-eval serve's request parsers under ASan/UBSan (completions and chat): every field
// of a valid request read with its value, OpenAI's defaults, each kind of bad field refused with 400
// naming it, the error
// body's shape, and the fuzzing entry point over random bytes and byte-level mutations of valid
// requests (never a crash, a leak or undefined behaviour).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

static int parse(const char *body, neox_serve_request *r, neox_serve_error *e) {
    return neox_serve_parse_request(body, strlen(body), r, e);
}

static void test_valid_request(void **state) {
    (void)state;
    neox_serve_request r;
    neox_serve_error e = {0};
    const char *body = "{\"model\": \"neox\", \"prompt\": [[5, 6, 7], \"text\"], \"max_tokens\": 3, \"temperature\": 0.5,"
                       " \"top_p\": 0.9, \"top_k\": 40, \"seed\": 11, \"stop\": [\"\\n\", \"END\"], \"echo\": true,"
                       " \"logprobs\": 2, \"n\": 2, \"stream\": false}";
    if (parse(body, &r, &e) != 0) fail_msg("%s", e.message);
    assert_string_equal(r.model, "neox");
    assert_int_equal(r.nprompts, 2);
    assert_int_equal(r.prompts[0].nids, 3);
    assert_int_equal(r.prompts[0].ids[2], 7);
    assert_null(r.prompts[0].text);
    assert_string_equal(r.prompts[1].text, "text");
    assert_int_equal(r.max_tokens, 3);
    assert_true(r.temperature == 0.5 && r.top_p == 0.9);
    assert_int_equal(r.top_k, 40);
    assert_true(r.has_seed && r.seed == 11);
    assert_int_equal(r.nstop, 2);
    assert_string_equal(r.stop[0], "\n");
    assert_true(r.echo);
    assert_int_equal(r.logprobs, 2);
    assert_int_equal(r.n, 2);
    neox_serve_request_release(&r);
}

static void test_defaults(void **state) {
    (void)state;
    neox_serve_request r;
    neox_serve_error e = {0};
    if (parse("{\"prompt\": \"hi\", \"logprobs\": null, \"stop\": null}", &r, &e) != 0) fail_msg("%s", e.message);
    assert_int_equal(r.max_tokens, 16);  // OpenAI's defaults
    assert_true(r.temperature == 1.0 && r.top_p == 1.0);
    assert_int_equal(r.logprobs, -1);
    assert_int_equal(r.n, 1);
    assert_false(r.echo || r.has_seed || r.nstop);
    assert_null(r.model);
    neox_serve_request_release(&r);
}

static void test_bad_requests(void **state) {
    (void)state;
    static const struct { const char *body, *param; } cases[] = {
        {"{\"prompt\": 3}", "prompt"},
        {"{\"prompt\": [[1], 2]}", "prompt"},
        {"{\"prompt\": [[]]}", "prompt"},
        {"{\"prompt\": [1, 2147483648]}", "prompt"},
        {"{\"prompt\": \"a\", \"max_tokens\": 1.5}", "max_tokens"},
        {"{\"prompt\": \"a\", \"temperature\": 101}", "temperature"},
        {"{\"prompt\": \"a\", \"top_p\": -0.1}", "top_p"},
        {"{\"prompt\": \"a\", \"n\": 17}", "n"},
        {"{\"prompt\": \"a\", \"logprobs\": true}", "logprobs"},
        {"{\"prompt\": \"a\", \"stop\": [\"\"]}", "stop"},
        {"{\"prompt\": \"a\", \"echo\": \"yes\"}", "echo"},
        {"{\"prompt\": \"a\", \"suffix\": \"b\"}", "suffix"},
        {"{\"max_tokens\": 1}", "prompt"},
        {"[\"prompt\"]", NULL},
        {"{\"prompt\": \"a\"", NULL},
        {"", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        neox_serve_request r;
        neox_serve_error e = {0};
        assert_int_equal(parse(cases[i].body, &r, &e), -1);
        assert_int_equal(e.http_status, 400);
        assert_string_equal(e.type, "invalid_request_error");
        if (cases[i].param) assert_string_equal(e.param, cases[i].param);
        else assert_string_equal(e.param, "");
        assert_true(strlen(e.message) > 0);
    }
    // Invalid UTF-8 inside a string, and many completions.
    neox_serve_request r;
    neox_serve_error e = {0};
    assert_int_equal(neox_serve_parse_request("{\"prompt\": \"\xc3\x28\"}", 15, &r, &e), -1);
    assert_int_equal(parse("{\"prompt\": [\"a\",\"b\",\"c\",\"d\",\"e\"], \"n\": 16}", &r, &e), 0);
    neox_serve_request_release(&r);
}

static int parse_chat(const char *body, neox_serve_request *r, neox_serve_error *e) {
    return neox_serve_parse_chat_request(body, strlen(body), r, e);
}

static void test_chat_request(void **state) {
    (void)state;
    neox_serve_request r;
    neox_serve_error e = {0};
    const char *body = "{\"model\": \"neox\", \"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
                       " {\"role\": \"user\", \"content\": \"Hi\", \"name\": \"ann\"}], \"max_completion_tokens\": 7,"
                       " \"temperature\": 0, \"seed\": 3, \"stop\": \"\\n\", \"logprobs\": true, \"top_logprobs\": 4, \"n\": 2}";
    if (parse_chat(body, &r, &e) != 0) fail_msg("%s", e.message);
    assert_true(r.chat);
    assert_int_equal(json_array_size(r.messages), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(r.messages, 1), "name")), "ann");
    assert_int_equal(r.nprompts, 1);  // rendered when submitted
    assert_null(r.prompts[0].text);
    assert_int_equal(r.max_tokens, 7);
    assert_int_equal(r.logprobs, 4);
    assert_true(r.temperature == 0.0 && r.has_seed && r.seed == 3 && r.nstop == 1 && r.n == 2);
    assert_false(r.echo);
    neox_serve_request_release(&r);
    // Defaults: up to the context (-1), no log-probabilities; logprobs true alone: the chosen tokens'.
    if (parse_chat("{\"messages\": [{\"role\": \"user\", \"content\": \"\"}]}", &r, &e) != 0) fail_msg("%s", e.message);
    assert_int_equal(r.max_tokens, -1);
    assert_int_equal(r.logprobs, -1);
    neox_serve_request_release(&r);
    if (parse_chat("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": true, \"max_tokens\": 2}", &r, &e) != 0)
        fail_msg("%s", e.message);
    assert_int_equal(r.logprobs, 0);
    assert_int_equal(r.max_tokens, 2);
    neox_serve_request_release(&r);
}

static void test_bad_chat_requests(void **state) {
    (void)state;
#define USER "{\"role\": \"user\", \"content\": \"x\"}"
    static const struct { const char *body, *param; } cases[] = {
        {"{\"max_tokens\": 3}", "messages"},
        {"{\"messages\": []}", "messages"},
        {"{\"messages\": \"hi\"}", "messages"},
        {"{\"messages\": [3]}", "messages"},
        {"{\"messages\": [{\"content\": \"x\"}]}", "messages"},
        {"{\"messages\": [{\"role\": \"user\"}]}", "messages"},
        {"{\"messages\": [{\"role\": \"\", \"content\": \"x\"}]}", "messages"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"x\"}]}]}", "messages"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": null}]}", "messages"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\", \"tool_calls\": []}]}", "messages"},
        {"{\"messages\": [" USER "], \"prompt\": \"x\"}", "prompt"},
        {"{\"messages\": [" USER "], \"echo\": true}", "echo"},
        {"{\"messages\": [" USER "], \"logprobs\": 2}", "logprobs"},
        {"{\"messages\": [" USER "], \"top_logprobs\": 2}", "top_logprobs"},
        {"{\"messages\": [" USER "], \"logprobs\": true, \"top_logprobs\": 21}", "top_logprobs"},
        {"{\"messages\": [" USER "], \"max_tokens\": 0}", "max_tokens"},
        {"{\"messages\": [" USER "], \"max_tokens\": 2, \"max_completion_tokens\": 2}", "max_completion_tokens"},
        {"{\"messages\": [" USER "], \"frequency_penalty\": 1}", "frequency_penalty"},
        {"{\"messages\": [" USER "], \"stream\": true}", "stream"},
        {"{\"messages\": [" USER "], \"n\": 0}", "n"},
        {"[" USER "]", NULL},
        {"{\"messages\": [" USER "]", NULL},
    };
#undef USER
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        neox_serve_request r;
        neox_serve_error e = {0};
        if (parse_chat(cases[i].body, &r, &e) != -1) fail_msg("accepted: %s", cases[i].body);
        assert_int_equal(e.http_status, 400);
        if (cases[i].param) assert_string_equal(e.param, cases[i].param);
        else assert_string_equal(e.param, "");
        assert_true(strlen(e.message) > 0);
    }
}

static void test_error_body(void **state) {
    (void)state;
    neox_serve_error e;
    neox_serve_error_set(&e, 400, "invalid_request_error", "top_p", "top_p: %g is outside [0, 1]", 2.0);
    char *body = neox_serve_error_body(&e);
    json_error_t jerr;
    json_t *root = json_loads(body, 0, &jerr);
    assert_non_null(root);
    json_t *err = json_object_get(root, "error");
    assert_string_equal(json_string_value(json_object_get(err, "message")), "top_p: 2 is outside [0, 1]");
    assert_string_equal(json_string_value(json_object_get(err, "type")), "invalid_request_error");
    assert_string_equal(json_string_value(json_object_get(err, "param")), "top_p");
    assert_true(json_is_null(json_object_get(err, "code")));
    json_decref(root);
    free(body);
}

// A small deterministic generator (xorshift) for the fuzz inputs.
static uint64_t next_random(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void test_fuzz_entry(void **state) {
    (void)state;
    static const char *seeds[] = {
        "{\"prompt\": [[1, 2], [3]], \"max_tokens\": 1, \"echo\": true, \"logprobs\": 1, \"temperature\": 0}",
        "{\"prompt\": \"hello\", \"stop\": [\"a\", \"b\"], \"n\": 2, \"seed\": 5, \"top_k\": -1, \"top_p\": 0.5}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"logprobs\": true, \"top_logprobs\": 2}",
    };
    uint64_t s = 0x9e3779b97f4a7c15ULL;
    uint8_t buf[512];
    for (int iter = 0; iter < 20000; iter++) {
        const char *seed = seeds[iter % 3];
        size_t n = strlen(seed);
        memcpy(buf, seed, n);
        if (iter % 5 == 0) {  // random bytes
            n = next_random(&s) % sizeof buf;
            for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)next_random(&s);
        } else {  // a few byte flips, insertions of JSON's punctuation, or a cut
            for (int m = 0; m < 1 + (int)(next_random(&s) % 4); m++) {
                size_t at = next_random(&s) % n;
                static const char punct[] = "{}[]\",:0-e.\\tfn";
                buf[at] = next_random(&s) % 2 ? (uint8_t)next_random(&s) : (uint8_t)punct[next_random(&s) % (sizeof punct - 1)];
            }
            if (next_random(&s) % 4 == 0) n = next_random(&s) % n;
        }
        assert_int_equal(neox_serve_fuzz_request(buf, n), 0);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_request), cmocka_unit_test(test_defaults),   cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_chat_request),  cmocka_unit_test(test_bad_chat_requests),
        cmocka_unit_test(test_error_body),    cmocka_unit_test(test_fuzz_entry),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
