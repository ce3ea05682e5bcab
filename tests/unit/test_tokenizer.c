// test_tokenizer.c: unit tests of lib/tokenizer — malformed vocab.json / merges.txt /
// tokenizer.json give errors naming the file and the problem (run under ASan/UBSan), refused
// types and components, GPT-NeoX's vocabulary sizes and special ids, char-level semantics,
// invalid UTF-8 and random bytes never crash, and encoding from many threads agrees with one.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "unit_util.h"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core.h"
#include "tokenizer.h"

#define SHARED "../shared/data/tokenizers"


// Writes content to tmpdir/name and returns the path (static buffer per slot).
static const char *write_tmp(int slot, const char *name, const char *content) {
    static char paths[4][512];
    snprintf(paths[slot], sizeof paths[slot], "%s/%s", tmpdir, name);
    FILE *f = fopen(paths[slot], "wb");
    assert_non_null(f);
    fputs(content, f);
    fclose(f);
    return paths[slot];
}

// A vocab.json with the 256 byte-level characters (ids 0..255) plus extra entries.
static char *byte_vocab(const char *extra) {
    char *s = neox_strdup("{");
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        static int next = 256;
        if (b == 0) next = 256;
        unsigned cp = printable ? (unsigned)b : (unsigned)next++;
        char *t = neox_asprintf("%s%s\"\\u%04x\": %d", s, b ? ", " : "", cp, b);
        free(s);
        s = t;
    }
    char *t = neox_asprintf("%s%s%s}", s, extra && *extra ? ", " : "", extra ? extra : "");
    free(s);
    return t;
}

static void expect_gpt2_error(const char *vocab, const char *merges, const char *pattern) {
    const char *v = write_tmp(0, "vocab.json", vocab);
    const char *m = write_tmp(1, "merges.txt", merges);
    neox_error err = {0};
    neox_tokenizer_options o = {"GPT2BPETokenizer", v, m};
    neox_tokenizer *tok = neox_tokenizer_load(&o, &err);
    if (tok) fail_msg("loaded, expected an error matching '%s'", pattern);
    if (!strstr(err.message, pattern)) fail_msg("error '%s' does not contain '%s'", err.message, pattern);
    if (!strstr(err.message, tmpdir)) fail_msg("error '%s' does not name the file", err.message);
    assert_int_equal(err.status, NEOX_EXIT_FAILURE);
}

static void test_malformed_vocab(void **state) {
    (void)state;
    expect_gpt2_error("{\"a\": 0, \"b\"", "#version: 0.2\n", "invalid JSON");
    expect_gpt2_error("[1, 2]", "", "is not a JSON object");
    expect_gpt2_error("{\"a\": \"x\"}", "", "is not an integer");
    expect_gpt2_error("{\"a\": 1.5}", "", "is not an integer");
    expect_gpt2_error("{\"a\": 0, \"b\": 0}", "", "id 0 is used by both");
    expect_gpt2_error("{\"a\": 0, \"a\": 1}", "", "duplicate");
    expect_gpt2_error("{\"a\": 99999999999}", "", "out of range");
    expect_gpt2_error("{\"a\": -1}", "", "out of range");
    expect_gpt2_error("", "", "invalid JSON");
}

static void test_malformed_merges(void **state) {
    (void)state;
    char *v = byte_vocab("\"ab\": 256, \"<|endoftext|>\": 257");
    expect_gpt2_error(v, "#version: 0.2\na\n", "two tokens");
    expect_gpt2_error(v, "#version: 0.2\na b c\n", "two tokens");
    expect_gpt2_error(v, "#version: 0.2\n\na b\n", "two tokens");
    expect_gpt2_error(v, "#version: 0.2\na zz\n", "merge token \"zz\" is not in the vocabulary");
    expect_gpt2_error(v, "#version: 0.2\nb c\n", "merged token \"bc\" is not in the vocabulary");
    free(v);
    v = byte_vocab("\"ab\": 256");
    expect_gpt2_error(v, "a b\n", "no <|endoftext|>");
    free(v);
    neox_error err = {0};
    neox_tokenizer_options o = {"GPT2BPETokenizer", write_tmp(0, "v.json", "{}"), "/nonexistent/merges.txt"};
    assert_null(neox_tokenizer_load(&o, &err));
    assert_non_null(strstr(err.message, "/nonexistent/merges.txt"));
}

static void expect_json_error(const char *json, const char *pattern) {
    const char *path = write_tmp(2, "tokenizer.json", json);
    neox_error err = {0};
    neox_tokenizer_options o = {"HFTokenizer", path, NULL};
    neox_tokenizer *tok = neox_tokenizer_load(&o, &err);
    if (tok) fail_msg("loaded, expected an error matching '%s'", pattern);
    if (!strstr(err.message, pattern)) fail_msg("error '%s' does not contain '%s'", err.message, pattern);
    if (!strstr(err.message, path)) fail_msg("error '%s' does not name the file", err.message);
}

static void test_malformed_tokenizer_json(void **state) {
    (void)state;
    char *v = byte_vocab("\"ab\": 256");
    const char *bl = "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"decoder\": {\"type\": \"ByteLevel\"}";
    char *ok_model = neox_asprintf("{\"type\": \"BPE\", \"vocab\": %s, \"merges\": [\"a b\"]}", v);
#define J(...) neox_asprintf(__VA_ARGS__)
    char *cases[][2] = {
        {J("{\"model\": %s, %s", ok_model, bl), "invalid JSON"},
        {J("[]"), "top level is not a JSON object"},
        {J("{%s}", bl), "model is missing"},
        {J("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}, %s}", bl), "model.type: \"WordPiece\" is not supported"},
        {J("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}, %s}", bl), "model.type: \"Unigram\" is not supported"},
        {J("{\"model\": %s, \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, "
           "{\"type\": \"BertNormalizer\"}]}, %s}", ok_model, bl),
         "normalizer.normalizers[1].type: \"BertNormalizer\" is not supported"},
        {J("{\"model\": %s, \"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"}}", ok_model),
         "pre_tokenizer.type: \"BertPreTokenizer\" is not supported"},
        {J("{\"model\": %s, \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"ByteLevel\"}, "
           "{\"type\": \"Digits\"}]}}", ok_model),
         "pre_tokenizer.pretokenizers[1]: a pre-tokenizer after ByteLevel is not supported"},
        {J("{\"model\": %s, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}}}", ok_model),
         "pre_tokenizer.pattern.Regex: the regular expression does not compile"},
        {J("{\"model\": %s, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, "
           "\"behavior\": \"Sideways\"}}", ok_model),
         "pre_tokenizer.behavior must be"},
        {J("{\"model\": %s, \"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"ab\"}}", ok_model),
         "pre_tokenizer.replacement must be one character"},
        {J("{\"model\": %s, %s, \"post_processor\": {\"type\": \"TemplateProcessing\"}}", ok_model, bl),
         "post_processor.single must be an array"},
        {J("{\"model\": %s, %s, \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": "
           "[{\"SpecialToken\": {\"id\": \"<s>\"}}, {\"Sequence\": {\"id\": \"A\"}}]}}", ok_model, bl),
         "special token \"<s>\" is not in special_tokens"},
        {J("{\"model\": %s, %s, \"post_processor\": {\"type\": \"RobertaProcessing\"}}", ok_model, bl),
         "post_processor.type: \"RobertaProcessing\" is not supported"},
        {J("{\"model\": %s, %s, \"truncation\": {\"max_length\": 5}}", ok_model, bl), "truncation"},
        {J("{\"model\": {\"type\": \"BPE\", \"dropout\": 0.1, \"vocab\": %s, \"merges\": []}, %s}", v, bl), "dropout"},
        {J("{\"model\": {\"type\": \"BPE\", \"vocab\": %s, \"merges\": 7}, %s}", v, bl), "model.merges must be an array"},
        {J("{\"model\": {\"type\": \"BPE\", \"vocab\": %s, \"merges\": [7]}, %s}", v, bl), "model.merges[0]"},
        {J("{\"model\": {\"type\": \"BPE\", \"vocab\": %s, \"merges\": [\"a q\"]}, %s}", v, bl), "not in the vocabulary"},
        {J("{\"model\": {\"type\": \"BPE\", \"vocab\": %s, \"merges\": [[\"a\", \"b\", \"c\"]]}, %s}", v, bl),
         "model.merges[0]"},
        {J("{\"model\": {\"type\": \"BPE\", \"vocab\": 5, \"merges\": []}, %s}", bl), "model.vocab is not a JSON object"},
        {J("{\"model\": %s, %s, \"added_tokens\": [{\"id\": 3}]}", ok_model, bl), "added_tokens[0]"},
        {J("{\"model\": %s, %s, \"added_tokens\": [{\"id\": \"x\", \"content\": \"q\"}]}", ok_model, bl),
         "added_tokens[0].id"},
        {J("{\"model\": %s, %s, \"added_tokens\": [{\"content\": \"q\", \"single_word\": true}]}", ok_model, bl),
         "single_word"},
        {J("{\"model\": %s, %s, \"added_tokens\": [{\"content\": \"q\", \"special\": 1}]}", ok_model, bl),
         "special must be true or false"},
        {J("{\"model\": %s, \"decoder\": {\"type\": \"WordPiece\"}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}", ok_model),
         "decoder.type: \"WordPiece\" is not supported"},
    };
#undef J
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        expect_json_error(cases[i][0], cases[i][1]);
        free(cases[i][0]);
    }
    free(ok_model);
    free(v);
}

static void test_refused_types(void **state) {
    (void)state;
    neox_error err = {0};
    neox_tokenizer_options o = {"SPMTokenizer", NULL, NULL};  // a .model file is needed
    assert_null(neox_tokenizer_load(&o, &err));
    assert_int_equal(err.status, NEOX_EXIT_USAGE);
    assert_non_null(strstr(err.message, "SPMTokenizer"));
    o = (neox_tokenizer_options){"TiktokenTokenizer", NULL, NULL};
    assert_null(neox_tokenizer_load(&o, &err));
    assert_int_equal(err.status, NEOX_EXIT_USAGE);
    assert_non_null(strstr(err.message, "TiktokenTokenizer"));
    o.type = "NoSuchTokenizer";
    assert_null(neox_tokenizer_load(&o, &err));
    assert_non_null(strstr(err.message, "NoSuchTokenizer"));
    o = (neox_tokenizer_options){"GPT2BPETokenizer", "vocab.json", NULL};
    assert_null(neox_tokenizer_load(&o, &err));
    assert_int_equal(err.status, NEOX_EXIT_USAGE);
}

// A small tokenizer of our own making: merges a+b, ab+c; encode follows the ranks.
static void expect_file_error(const char *type, const char *name, const char *content, const char *pattern) {
    const char *path = write_tmp(3, name, content);
    neox_error err = {0};
    neox_tokenizer_options o = {type, path, NULL};
    neox_tokenizer *tok = neox_tokenizer_load(&o, &err);
    if (tok) fail_msg("%s loaded, expected an error matching '%s'", name, pattern);
    if (!strstr(err.message, pattern)) fail_msg("error '%s' does not contain '%s'", err.message, pattern);
    if (!strstr(err.message, path)) fail_msg("error '%s' does not name the file", err.message);
    assert_int_equal(err.status, NEOX_EXIT_FAILURE);
}

// The 256 single bytes as a tiktoken rank file (base64 of each byte, rank = the byte), plus extra.
static char *byte_ranks(const char *extra) {
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *s = neox_strdup("");
    for (int b = 0; b < 256; b++) {
        char *t = neox_asprintf("%s%c%c== %d\n", s, b64[b >> 2], b64[(b & 3) << 4], b);
        free(s);
        s = t;
    }
    char *t = neox_asprintf("%s%s", s, extra);
    free(s);
    return t;
}

static void test_tiktoken_and_spm_files(void **state) {
    (void)state;
    expect_file_error("TiktokenTokenizer", "a.tiktoken", "YQ== 0\n", "byte 0x00 has no rank");
    expect_file_error("TiktokenTokenizer", "b.tiktoken", "Y!== 0\n", ":1: the token is not base64");
    expect_file_error("TiktokenTokenizer", "c.tiktoken", "YQ== x\n", ":1: the rank 'x' is not an integer");
    expect_file_error("TiktokenTokenizer", "d.tiktoken", "YQ==\n", ":1: expected");
    expect_file_error("TiktokenTokenizer", "e.tiktoken", "YQ== 0\nYQ== 1\n", ":2: the token is listed twice");
    expect_file_error("TiktokenTokenizer", "f.tiktoken", "", "no tokens");
    expect_file_error("SPMTokenizer", "g.model", "not a protobuf", "not a SentencePiece model");
    // A complete byte alphabet and one merged token: "ab" (rank 256) is one id, as tiktoken gives.
    char *ranks = byte_ranks("YWI= 256\n");
    const char *path = write_tmp(3, "ok.tiktoken", ranks);
    free(ranks);
    neox_error err = {0};
    neox_tokenizer_options o = {"TiktokenTokenizer", path, NULL};
    neox_tokenizer *tok = neox_tokenizer_load(&o, &err);
    assert_non_null(tok);
    assert_int_equal(neox_tokenizer_eod_id(tok), 257);  // <|endoftext|> after the last rank
    assert_int_equal(neox_tokenizer_vocab_size(tok), 258);
    int32_t *ids = NULL;
    size_t len = 0, cap = 0, size;
    assert_int_equal(neox_tokenizer_encode(tok, "abc ab", 6, &ids, &len, &cap, &err), 4);
    assert_int_equal(ids[0], 256), assert_int_equal(ids[1], 'c'), assert_int_equal(ids[2], ' ');
    assert_int_equal(ids[3], 256);
    char *text = neox_tokenizer_decode(tok, ids, len, &size, &err);
    assert_string_equal(text, "abc ab");
    free(text);
    free(ids);
    neox_tokenizer_free(tok);
}

// SentencePiece models cut short and with bytes changed: each either loads (and then encodes and
// decodes) or fails with an error naming the file, and nothing it allocated outlives it (the
// sanitizer build's leak check at exit).
static void load_spm_variant(const uint8_t *bytes, size_t size) {
    char *path = tmp_path("variant.model");
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, size, f), size);
    fclose(f);
    neox_error err = {0};
    neox_tokenizer_options o = {"SPMTokenizer", path, NULL};
    neox_tokenizer *tok = neox_tokenizer_load(&o, &err);
    if (!tok) {
        if (!strstr(err.message, path)) fail_msg("error '%s' does not name the file", err.message);
        assert_int_equal(err.status, NEOX_EXIT_FAILURE);
    } else {
        int32_t *ids = NULL;
        size_t len = 0, cap = 0, out;
        const char *text = "Hello world, \xc3\xa9t\xc3\xa9";
        if (neox_tokenizer_encode(tok, text, strlen(text), &ids, &len, &cap, &err) >= 0)
            free(neox_tokenizer_decode(tok, ids, len, &out, &err));
        free(ids);
        neox_tokenizer_free(tok);
    }
    free(path);
}

static void test_spm_damaged_models(void **state) {
    (void)state;
    static const char *const models[] = {"tests/fuzz/corpus/tokenizer_json/spm_unigram.model",
                                         "tests/fuzz/corpus/tokenizer_json/spm_bpe.model"};
    for (size_t m = 0; m < sizeof models / sizeof *models; m++) {
        neox_error err = {0};
        size_t size;
        uint8_t *model = (uint8_t *)neox_read_file(models[m], &size, &err);
        if (!model) fail_msg("%s", err.message);
        for (size_t cut = 0; cut < size; cut += 97) load_spm_variant(model, cut);
        for (size_t at = 3; at < size; at += 211) {  // one byte changed at a time
            uint8_t was = model[at];
            model[at] ^= 0x5A;
            load_spm_variant(model, size);
            model[at] = was;
        }
        free(model);
    }
    // A piece starting with a NUL byte makes the library's trie throw while it builds the model: the
    // load fails with the library's message, and the half-built model is freed.
    const char *nul_piece = "tests/fuzz/corpus/tokenizer_json/regress_spm_nul_piece.model";
    neox_error err = {0};
    neox_tokenizer_options o = {"SPMTokenizer", nul_piece, NULL};
    assert_null(neox_tokenizer_load(&o, &err));
    if (!strstr(err.message, "not a SentencePiece model") || !strstr(err.message, nul_piece))
        fail_msg("unexpected error: %s", err.message);
}

static void test_small_bpe(void **state) {
    (void)state;
    char *v = byte_vocab("\"ab\": 256, \"abc\": 257, \"\\u0120a\": 258, \"<|endoftext|>\": 259");
    const char *vp = write_tmp(0, "vocab.json", v);
    const char *mp = write_tmp(1, "merges.txt", "#version: 0.2\na b\nab c\n\xc4\xa0 a\n");
    free(v);
    neox_error err = {0};
    neox_tokenizer_options o = {"GPT2BPETokenizer", vp, mp};
    neox_tokenizer *tok = neox_tokenizer_load(&o, &err);
    if (!tok) fail_msg("%s", err.message);
    assert_int_equal(neox_tokenizer_vocab_size(tok), 260);
    assert_int_equal(neox_tokenizer_eod_id(tok), 259);
    assert_int_equal(neox_tokenizer_pad_id(tok), -1);
    int32_t *ids = NULL;
    size_t len = 0, cap = 0;
    assert_int_equal(neox_tokenizer_encode(tok, "abcab a", 7, &ids, &len, &cap, &err), 3);
    assert_int_equal(ids[0], 257);
    assert_int_equal(ids[1], 256);
    assert_int_equal(ids[2], 258);
    size_t size;
    char *text = neox_tokenizer_decode(tok, ids, len, &size, &err);
    assert_string_equal(text, "abcab a");
    free(text);
    int32_t bad = 100000;
    assert_null(neox_tokenizer_decode(tok, &bad, 1, &size, &err));
    assert_non_null(strstr(err.message, "100000"));
    assert_string_equal(neox_tokenizer_id_to_token(tok, 256), "ab");
    assert_null(neox_tokenizer_id_to_token(tok, -1));
    free(ids);
    neox_tokenizer_free(tok);
}

static void test_char_level(void **state) {
    (void)state;
    neox_error err = {0};
    neox_tokenizer_options o = {"CharLevelTokenizer", NULL, NULL};
    neox_tokenizer *tok = neox_tokenizer_load(&o, &err);
    assert_non_null(tok);
    assert_int_equal(neox_tokenizer_vocab_size(tok), 512);
    assert_int_equal(neox_tokenizer_eod_id(tok), 0);
    assert_int_equal(neox_tokenizer_pad_id(tok), 1);
    int32_t *ids = NULL;
    size_t len = 0, cap = 0;
    assert_int_equal(neox_tokenizer_encode(tok, "h\xc3\xa9\n", 4, &ids, &len, &cap, &err), 4);
    assert_int_equal(ids[0], 'h');
    assert_int_equal(ids[1], 0xC3);
    assert_int_equal(ids[2], 0xA9);
    size_t size;
    char *text = neox_tokenizer_decode(tok, ids, len, &size, &err);
    // GPT-NeoX decodes each id as chr(max(32, min(id, 512))): é's bytes become "Ã©", '\n' a space.
    assert_string_equal(text, "h\xc3\x83\xc2\xa9 ");
    free(text);
    free(ids);
    neox_tokenizer_free(tok);
}

static neox_tokenizer *load_shared(const char *type, const char *vocab, const char *merges) {
    if (access(vocab, R_OK) != 0) return NULL;
    neox_error err = {0};
    neox_tokenizer_options o = {type, vocab, merges};
    neox_tokenizer *tok = neox_tokenizer_load(&o, &err);
    if (!tok) fail_msg("%s", err.message);
    return tok;
}

static void test_gpt_neox_sizes_and_ids(void **state) {
    (void)state;
    struct { const char *type, *vocab, *merges; int64_t size; int32_t eod, pad; } cases[] = {
        {"GPT2BPETokenizer", SHARED "/gpt2/vocab.json", SHARED "/gpt2/merges.txt", 50257, 50256, -1},
        {"HFGPT2Tokenizer", SHARED "/gpt2/vocab.json", SHARED "/gpt2/merges.txt", 50258, 50256, 50257},
        {"HFTokenizer", SHARED "/gpt2/gpt2_tokenizer.json", NULL, 50257, 50256, -1},
        {"HFTokenizer", SHARED "/neox/20B_tokenizer.json", NULL, 50277, 0, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        neox_tokenizer *tok = load_shared(cases[i].type, cases[i].vocab, cases[i].merges);
        if (!tok) { skip(); return; }
        assert_int_equal(neox_tokenizer_vocab_size(tok), cases[i].size);
        assert_int_equal(neox_tokenizer_eod_id(tok), cases[i].eod);
        assert_int_equal(neox_tokenizer_pad_id(tok), cases[i].pad);
        neox_tokenizer_free(tok);
    }
}

// Random bytes (mostly invalid UTF-8) through every stage: no crash, no sanitizer report, and the
// ids decode back to text.
static void test_random_bytes_never_crash(void **state) {
    (void)state;
    neox_tokenizer *tok = load_shared("HFTokenizer", SHARED "/neox/20B_tokenizer.json", NULL);
    if (!tok) { skip(); return; }
    uint64_t x = 88172645463325252ull;
    int32_t *ids = NULL;
    size_t cap = 0;
    neox_error err = {0};
    for (int round = 0; round < 300; round++) {
        uint8_t buf[257];
        size_t n = (size_t)(round % 257);
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            // Bias toward bytes that make UTF-8 lead/continuation and whitespace edge cases.
            uint8_t b = (uint8_t)x;
            buf[i] = (x >> 8) % 3 == 0 ? (uint8_t)(0x80 | (b & 0x7F)) : (x >> 8) % 3 == 1 ? (uint8_t)(b % 64 + 0x20) : b;
        }
        size_t len = 0;
        assert_true(neox_tokenizer_encode(tok, (const char *)buf, n, &ids, &len, &cap, &err) >= 0);
        size_t size;
        char *text = neox_tokenizer_decode(tok, ids, len, &size, &err);
        assert_non_null(text);
        free(text);
    }
    free(ids);
    neox_tokenizer_free(tok);
}

// A long document encoded inside an OpenMP team is cut into word blocks that the team encodes as
// tasks: the ids equal those of one thread, on the GPT-2 fast path and the general pipeline.
static void test_long_document_split_across_team(void **state) {
    (void)state;
    size_t size;
    neox_error err = {0};
    char *text = neox_read_file("../shared/data/text/tinyshakespeare_input.txt", &size, &err);
    if (!text) { skip(); return; }
    struct { const char *type, *vocab, *merges; } cases[] = {
        {"GPT2BPETokenizer", SHARED "/gpt2/vocab.json", SHARED "/gpt2/merges.txt"},
        {"HFTokenizer", SHARED "/neox/20B_tokenizer.json", NULL},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        neox_tokenizer *tok = load_shared(cases[c].type, cases[c].vocab, cases[c].merges);
        if (!tok) { free(text); skip(); return; }
        int32_t *one = NULL, *team = NULL;
        size_t one_len = 0, one_cap = 0, team_len = 0, team_cap = 0;
        assert_true(neox_tokenizer_encode(tok, text, size, &one, &one_len, &one_cap, &err) > 100000);
        int64_t got = -1;
#pragma omp parallel num_threads(3)
#pragma omp single
        got = neox_tokenizer_encode(tok, text, size, &team, &team_len, &team_cap, &err);
        assert_int_equal(got, (int64_t)one_len);
        assert_memory_equal(team, one, one_len * sizeof *one);
        free(one), free(team);
        neox_tokenizer_free(tok);
    }
    free(text);
}

// Encoding the lines of a text from many threads gives the same ids as one thread.
static void test_threads_agree(void **state) {
    (void)state;
    neox_tokenizer *tok = load_shared("GPT2BPETokenizer", SHARED "/gpt2/vocab.json", SHARED "/gpt2/merges.txt");
    if (!tok) { skip(); return; }
    size_t size;
    neox_error err = {0};
    char *text = neox_read_file("../shared/data/text/enwik8_first100.txt", &size, &err);
    if (!text) { neox_tokenizer_free(tok); skip(); return; }
    enum { N = 64 };
    int32_t *one = NULL;
    size_t one_len = 0, one_cap = 0;
    neox_tokenizer_encode(tok, text, size, &one, &one_len, &one_cap, &err);
    int ok[N] = {0};
#pragma omp parallel for num_threads(4)
    for (int i = 0; i < N; i++) {
        int32_t *ids = NULL;
        size_t len = 0, cap = 0;
        neox_error e = {0};
        neox_tokenizer_encode(tok, text, size, &ids, &len, &cap, &e);
        ok[i] = len == one_len && !memcmp(ids, one, len * sizeof *ids);
        free(ids);
    }
    for (int i = 0; i < N; i++) assert_true(ok[i]);
    free(one);
    free(text);
    neox_tokenizer_free(tok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malformed_vocab),
        cmocka_unit_test(test_malformed_merges),
        cmocka_unit_test(test_malformed_tokenizer_json),
        cmocka_unit_test(test_refused_types),
        cmocka_unit_test(test_tiktoken_and_spm_files),
        cmocka_unit_test(test_small_bpe),
        cmocka_unit_test(test_spm_damaged_models),
        cmocka_unit_test(test_char_level),
        cmocka_unit_test(test_gpt_neox_sizes_and_ids),
        cmocka_unit_test(test_random_bytes_never_crash),
        cmocka_unit_test(test_threads_agree),
        cmocka_unit_test(test_long_document_split_across_team),
    };
    return cmocka_run_group_tests(tests, make_tmpdir, remove_tmpdir);
}
