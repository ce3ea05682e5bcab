// test_spm_unigram.c: unit tests of the SentencePiece unigram parts of lib/tokenizer — the
// ModelProto field reader refuses every malformed byte string (truncated varints and lengths,
// groups, field 0) and merges repeated trainer_spec messages as protobuf does; the lattice follows
// sentencepiece 0.2.3's rules on small hand-made vocabularies (ties go to the earlier start,
// unknown runs merge or fall back to bytes, user-defined pieces win, unused pieces are never
// chosen); the normalizer's whitespace rules without a character map, and a damaged map never
// read out of bounds (ASan). The oracle tests (tests/oracle/test_tokenizer_unigram.py) check
// whole models.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "tokenizer/spm.h"

static void expect_malformed(const uint8_t *bytes, size_t n) {
    spm_proto_fields f;
    assert_int_equal(spm_proto_read(bytes, n, &f), -1);
    assert_null(f.types);
}

static void test_proto_refuses_malformed(void **state) {
    (void)state;
    expect_malformed((const uint8_t[]){0x0A}, 1);                    // pieces: no length
    expect_malformed((const uint8_t[]){0x0A, 0x05, 0x08}, 3);        // pieces: 5 bytes announced, 1 there
    expect_malformed((const uint8_t[]){0x0B}, 1);                    // a group
    expect_malformed((const uint8_t[]){0x02, 0x00}, 2);              // field 0
    expect_malformed((const uint8_t[]){0x0A, 0x02, 0x18, 0x80}, 4);  // a piece's type: a cut varint
    expect_malformed((const uint8_t[]){0x12, 0x01, 0x1D}, 3);        // trainer_spec: a cut fixed32
    expect_malformed((const uint8_t[]){0x08, 0x01}, 2);              // pieces as a varint
    expect_malformed((const uint8_t[]){0x0A, 0x02, 0x1A, 0x00}, 4);  // a piece's type as bytes
    expect_malformed((const uint8_t[]){0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}, 11);
}

static void test_proto_reads_types_and_merges_trainer_spec(void **state) {
    (void)state;
    const uint8_t bytes[] = {
        0x0A, 0x08, 0x0A, 0x01, 'a', 0x15, 0x00, 0x00, 0x80, 0xBF,  // piece "a", score -1, type NORMAL (default)
        0x0A, 0x02, 0x18, 0x04,                                     // a USER_DEFINED piece
        0x22, 0x00,                                                 // normalizer_spec (skipped)
        0x12, 0x02, 0x18, 0x02,                                     // trainer_spec {model_type: BPE}
        0x0A, 0x02, 0x18, 0x06,                                     // a BYTE piece
        0x12, 0x03, 0x98, 0x02, 0x01,                               // trainer_spec {byte_fallback: true}
    };
    spm_proto_fields f;
    assert_int_equal(spm_proto_read(bytes, sizeof bytes, &f), 0);
    assert_int_equal(f.n_pieces, 3);
    assert_int_equal(f.types[0], SPM_PIECE_NORMAL);
    assert_int_equal(f.types[1], SPM_PIECE_USER_DEFINED);
    assert_int_equal(f.types[2], SPM_PIECE_BYTE);
    assert_int_equal(f.model_type, SPM_MODEL_BPE);  // the first trainer_spec's field survives the second
    assert_true(f.byte_fallback);
    assert_true(f.add_dummy_prefix && f.remove_extra_whitespaces && f.escape_whitespaces);  // defaults
    assert_null(f.charsmap);
    spm_proto_fields_free(&f);
    const uint8_t spec[] = {
        0x1A, 0x0B, 0x12, 0x05, 1, 2, 3, 4, 5,  // normalizer_spec {precompiled_charsmap: 5 bytes,
        0x18, 0x00, 0x20, 0x00,                 //   add_dummy_prefix: false, remove_extra_whitespaces: false}
        0x12, 0x03, 0xC0, 0x01, 0x01,           // trainer_spec {treat_whitespace_as_suffix: true}
    };
    assert_int_equal(spm_proto_read(spec, sizeof spec, &f), 0);
    assert_int_equal(f.charsmap_size, 5);
    assert_int_equal(f.charsmap[4], 5);
    assert_false(f.add_dummy_prefix || f.remove_extra_whitespaces);
    assert_true(f.escape_whitespaces && f.treat_whitespace_as_suffix);
    spm_proto_fields_free(&f);
    spm_proto_fields empty;
    assert_int_equal(spm_proto_read(bytes, 0, &empty), 0);
    assert_int_equal(empty.model_type, SPM_MODEL_UNIGRAM);  // the proto's default
    spm_proto_fields_free(&empty);
}

// A vocabulary: <unk>, a (-1), aa (-2), b (-3), ab (user-defined), bb (unused), <0x78>, <0x79>.
enum { UNK, A, AA, B, AB, BB, X78, X79, N_PIECES };
static const char *const pieces[N_PIECES] = {"<unk>", "a", "aa", "b", "ab", "bb", "<0x78>", "<0x79>"};
static const float scores[N_PIECES] = {0, -1, -2, -3, 0, 5, 0, 0};

static unigram_model *model(bool byte_fallback, bool ab_user_defined) {
    uint8_t types[N_PIECES] = {SPM_PIECE_UNKNOWN, SPM_PIECE_NORMAL, SPM_PIECE_NORMAL, SPM_PIECE_NORMAL,
                               SPM_PIECE_USER_DEFINED, SPM_PIECE_UNUSED, SPM_PIECE_BYTE, SPM_PIECE_BYTE};
    if (!ab_user_defined) types[AB] = SPM_PIECE_CONTROL;  // then never matched in text
    return unigram_new(pieces, scores, types, N_PIECES, UNK, byte_fallback);
}

static void expect_ids(const unigram_model *u, const char *text, const int32_t *want, size_t n_want) {
    int32_t *ids = NULL;
    size_t len = 0, cap = 0;
    unigram_encode(u, text, strlen(text), &ids, &len, &cap);
    assert_int_equal(len, n_want);
    for (size_t i = 0; i < n_want; i++) assert_int_equal(ids[i], want[i]);
    free(ids);
}

static void test_lattice_rules(void **state) {
    (void)state;
    unigram_model *u = model(false, true);
    // "aaa": a+aa, aa+a and a+a+a all score -3; the path whose last piece starts earliest wins.
    expect_ids(u, "aaa", (const int32_t[]){A, AA}, 2);
    expect_ids(u, "ab", (const int32_t[]){AB}, 1);           // user-defined: 0.1 beats a+b's -4
    expect_ids(u, "bb", (const int32_t[]){B, B}, 2);         // unused: found but never chosen
    expect_ids(u, "xyzb", (const int32_t[]){UNK, B}, 2);     // a run of unknown characters: one id
    expect_ids(u, "x\xc3\xa9", (const int32_t[]){UNK}, 1);   // unknown characters of 1 and 2 bytes
    expect_ids(u, "", NULL, 0);
    unigram_free(u);
    u = model(true, false);
    // Byte fallback: each byte of an unknown character, <unk> for bytes without a piece.
    expect_ids(u, "xyz", (const int32_t[]){X78, X79, UNK}, 3);
    expect_ids(u, "ab", (const int32_t[]){A, B}, 2);  // "ab" is a control piece now: not in text
    unigram_free(u);
}

static void expect_normalized(const spm_normalizer *n, const char *text, const char *want) {
    size_t size;
    char *got = spm_normalize(n, text, strlen(text), &size);
    assert_int_equal(size, strlen(want));
    assert_string_equal(got, want);
    free(got);
}

#define SP "\xe2\x96\x81"  // U+2581, the escaped space

static void test_normalizer_whitespace_rules(void **state) {
    (void)state;
    spm_proto_fields f = {.add_dummy_prefix = true, .remove_extra_whitespaces = true, .escape_whitespaces = true};
    unigram_model *u = model(false, true);  // "ab" is a user-defined symbol
    spm_normalizer *n = spm_normalizer_new(&f, u);
    expect_normalized(n, "  a   b  ", SP "a" SP "b");  // trimmed, runs collapsed, a dummy prefix
    expect_normalized(n, "   ", "");
    expect_normalized(n, "xab ab", SP "xab" SP "ab");
    spm_normalizer_free(n);
    f.remove_extra_whitespaces = false, f.treat_whitespace_as_suffix = true;
    n = spm_normalizer_new(&f, u);
    expect_normalized(n, " a  b", SP "a" SP SP "b" SP);  // spaces kept, the dummy space at the end
    spm_normalizer_free(n);
    f.escape_whitespaces = false, f.add_dummy_prefix = false;
    n = spm_normalizer_new(&f, NULL);
    expect_normalized(n, " a  b", " a  b");
    spm_normalizer_free(n);
    unigram_free(u);
}

static void test_damaged_charsmap_stays_in_bounds(void **state) {
    (void)state;
    uint64_t x = 88172645463325252ull;
    for (int round = 0; round < 200; round++) {
        uint8_t map[64];
        for (size_t i = 0; i < sizeof map; i++) x ^= x << 13, x ^= x >> 7, x ^= x << 17, map[i] = (uint8_t)x;
        map[0] = (uint8_t)(4 + 4 * (round % 12)), map[1] = map[2] = map[3] = 0;  // a trie of 1 to 12 units
        spm_proto_fields f = {.charsmap = map, .charsmap_size = sizeof map, .remove_extra_whitespaces = round & 1};
        spm_normalizer *n = spm_normalizer_new(&f, NULL);
        char text[32];
        for (size_t i = 0; i < sizeof text - 1; i++)
            x ^= x << 13, x ^= x >> 7, x ^= x << 17, text[i] = (char)(x & 0x7F);
        size_t size;
        free(spm_normalize(n, text, sizeof text - 1, &size));
        spm_normalizer_free(n);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_proto_refuses_malformed),
        cmocka_unit_test(test_proto_reads_types_and_merges_trainer_spec),
        cmocka_unit_test(test_lattice_rules),
        cmocka_unit_test(test_normalizer_whitespace_rules),
        cmocka_unit_test(test_damaged_charsmap_stays_in_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
