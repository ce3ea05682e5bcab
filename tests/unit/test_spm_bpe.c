// test_spm_bpe.c: unit tests of the SentencePiece BPE encoder (lib/tokenizer/spm_bpe.c) on small
// hand-made vocabularies — the rules of sentencepiece's bpe_model.cc worked out by hand: ties go
// to the leftmost pair, unused pieces are formed then split back, user-defined pieces are never
// merged, unknown runs merge or fall back to bytes — and a vocabulary with piece types and byte
// pieces no trainer writes, fed arbitrary bytes, never read out of bounds (ASan). The oracle tests
// (tests/oracle/test_tokenizer_spm_bpe.py) check trained models against sentencepiece itself.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "tokenizer/spm.h"

// <unk>, a, b, c, aa (-1), ab (-2, unused), bc (-3), abc (-4), [u] (user-defined), <0x78>, <0x79>.
enum { UNK, A, B, C, AA, AB, BC, ABC, USER, X78, X79, N_PIECES };
static const char *const pieces[N_PIECES] = {"<unk>", "a", "b", "c", "aa", "ab", "bc", "abc", "[u]", "<0x78>",
                                             "<0x79>"};
static const float scores[N_PIECES] = {0, -10, -10, -10, -1, -2, -3, -4, 0, 0, 0};

static spm_bpe_model *model(bool byte_fallback, bool ab_unused) {
    uint8_t types[N_PIECES] = {SPM_PIECE_UNKNOWN, SPM_PIECE_NORMAL, SPM_PIECE_NORMAL, SPM_PIECE_NORMAL,
                               SPM_PIECE_NORMAL, SPM_PIECE_NORMAL, SPM_PIECE_NORMAL, SPM_PIECE_NORMAL,
                               SPM_PIECE_USER_DEFINED, SPM_PIECE_BYTE, SPM_PIECE_BYTE};
    if (ab_unused) types[AB] = SPM_PIECE_UNUSED;
    return spm_bpe_new(pieces, scores, types, N_PIECES, UNK, byte_fallback, true);
}

static void expect_ids(const spm_bpe_model *b, const char *text, const int32_t *want, size_t n_want) {
    int32_t *ids = NULL;
    size_t len = 0, cap = 0;
    spm_bpe_encode(b, text, strlen(text), &ids, &len, &cap);
    assert_int_equal(len, n_want);
    for (size_t i = 0; i < n_want; i++) assert_int_equal(ids[i], want[i]);
    free(ids);
}

static void test_merge_rules(void **state) {
    (void)state;
    spm_bpe_model *b = model(false, false);
    expect_ids(b, "aaa", (const int32_t[]){AA, A}, 2);      // two "aa" pairs tie: the leftmost merges
    expect_ids(b, "abc", (const int32_t[]){ABC}, 1);        // ab (-2) before bc (-3), then ab+c
    expect_ids(b, "aabc", (const int32_t[]){AA, BC}, 2);    // aa (-1) takes the a that ab wanted
    expect_ids(b, "a[u]b", (const int32_t[]){A, USER, B}, 3);
    expect_ids(b, "[u]bc", (const int32_t[]){USER, BC}, 2);
    expect_ids(b, "xyzb", (const int32_t[]){UNK, B}, 2);    // a run of unknown characters: one id
    expect_ids(b, "x\xc3\xa9", (const int32_t[]){UNK}, 1);  // unknown characters of 1 and 2 bytes
    expect_ids(b, "", NULL, 0);
    spm_bpe_free(b);
    b = model(true, true);
    expect_ids(b, "ab", (const int32_t[]){A, B}, 2);        // unused: formed, then split back
    expect_ids(b, "abc", (const int32_t[]){ABC}, 1);        // ... and still merged further
    expect_ids(b, "xyz", (const int32_t[]){X78, X79, UNK}, 3);  // bytes; <unk> for a byte without a piece
    spm_bpe_free(b);
}

// Piece types outside the proto's enum, byte pieces with names out of range, empty and repeated
// pieces: nothing a library-checked model holds, but the encoder must stay within its arrays.
static void test_odd_vocabulary_stays_in_bounds(void **state) {
    (void)state;
    const char *const odd[] = {"<unk>", "a", "", "a", "\xe2\x96\x81", "\xe2\x96\x81" "a", "<0x100>", "<0xZZ>",
                               "\xff\xfe", "a\xe2\x96\x81" "b", "bb", "b"};
    const float s[] = {0, -1, -2, -3, -4, -5, -6, -7, -8, -9, -10, -11};
    const uint8_t types[] = {SPM_PIECE_UNKNOWN, SPM_PIECE_NORMAL, SPM_PIECE_NORMAL, 0, SPM_PIECE_NORMAL,
                             SPM_PIECE_UNUSED, SPM_PIECE_BYTE, SPM_PIECE_BYTE, 200, SPM_PIECE_NORMAL,
                             SPM_PIECE_NORMAL, SPM_PIECE_USER_DEFINED};
    int32_t n = (int32_t)(sizeof s / sizeof s[0]);
    srand(7);
    for (int escape = 0; escape < 2; escape++) {
        spm_bpe_model *b = spm_bpe_new(odd, s, types, n, 0, escape, escape);
        for (int round = 0; round < 2000; round++) {
            char text[64];
            size_t len = (size_t)(rand() % 64);
            for (size_t i = 0; i < len; i++) text[i] = "ab\xe2\x96\x81\xff\xc3 x"[rand() % 9];
            int32_t *ids = NULL;
            size_t got = 0, cap = 0;
            spm_bpe_encode(b, text, len, &ids, &got, &cap);
            for (size_t i = 0; i < got; i++) assert_true(ids[i] >= 0 && ids[i] < n);
            free(ids);
        }
        spm_bpe_free(b);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merge_rules),
        cmocka_unit_test(test_odd_vocabulary_stays_in_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
