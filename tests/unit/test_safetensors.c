// test_safetensors.c: safetensors round trip and malformed headers (each must fail with a message
// naming the problem, never crash; run under ASan/UBSan).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core.h"
#include "safetensors.h"

// Builds a file image: 8-byte length, header text, then data_size bytes of data.
static unsigned char *image(const char *header, size_t data_size, size_t *size) {
    size_t h = strlen(header);
    *size = 8 + h + data_size;
    unsigned char *buf = neox_calloc(*size + 1, 1);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)h >> (8 * i));
    memcpy(buf + 8, header, h);
    return buf;
}

static void expect_error(const char *header, size_t data_size, const char *needle) {
    size_t size;
    unsigned char *buf = image(header, data_size, &size);
    neox_error err = {0};
    neox_safetensors *st = neox_safetensors_parse(buf, size, "bad.safetensors", &err);
    if (st) fail_msg("accepted: %s", header);
    if (!strstr(err.message, needle)) fail_msg("message '%s' does not mention '%s'", err.message, needle);
    assert_non_null(strstr(err.message, "bad.safetensors"));
}

static void test_round_trip(void **state) {
    (void)state;
    char path[] = "/tmp/neox-st-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    float a[6] = {1, 2, 3, 4, 5, 6};
    int64_t ids[2] = {7, -8};
    neox_st_entry e[] = {{"w.weight", "F32", 2, {2, 3}, a}, {"ids", "I64", 1, {2}, ids}, {"empty", "F32", 1, {0}, NULL}};
    neox_error err = {0};
    assert_int_equal(neox_safetensors_write(path, e, 3, "{\"format\": \"pt\"}", &err), 0);
    neox_safetensors *st = neox_safetensors_open(path, &err);
    assert_non_null(st);
    assert_int_equal(st->count, 3);
    const neox_st_tensor *t = neox_safetensors_find(st, "w.weight");
    assert_non_null(t);
    assert_string_equal(t->dtype, "F32");
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[1], 3);
    assert_memory_equal(t->data, a, sizeof a);
    t = neox_safetensors_find(st, "ids");
    assert_memory_equal(t->data, ids, sizeof ids);
    assert_int_equal(((uintptr_t)t->data - (uintptr_t)st->file) % 8, 0);  // data section 8-byte aligned
    assert_null(neox_safetensors_find(st, "missing"));
    neox_safetensors_close(st);
    unlink(path);
}

// The streamed writer: tensors put in pieces and through a reserved region read back as written;
// more or fewer bytes than the header announces is an error and publishes nothing.
static void test_streamed_writer(void **state) {
    (void)state;
    char path[] = "/tmp/neox-st-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    unlink(path);
    float a[6] = {1, 2, 3, 4, 5, 6}, b[3] = {-1, -2, -3};
    neox_st_entry e[] = {{"a", "F32", 2, {2, 3}, NULL}, {"b", "F32", 1, {3}, NULL}};
    neox_error err = {0};
    neox_st_writer *w = neox_st_writer_open(path, e, 2, NULL, &err);
    assert_non_null(w);
    assert_int_equal(neox_st_writer_put(w, a, 8, &err), 0);
    assert_int_equal(neox_st_writer_put(w, a + 2, 16, &err), 0);
    int out;
    int64_t at;
    assert_int_equal(neox_st_writer_reserve(w, sizeof b, &out, &at, &err), 0);
    assert_int_equal(pwrite(out, b, sizeof b, at), (ssize_t)sizeof b);
    neox_st_writer_written(w);
    assert_int_equal(neox_st_writer_put(w, b, 4, &err), -1);
    assert_non_null(strstr(err.message, "more tensor data than the header announces"));
    assert_int_equal(neox_st_writer_commit(w, &err), 0);
    neox_safetensors *st = neox_safetensors_open(path, &err);
    assert_non_null(st);
    assert_memory_equal(neox_safetensors_find(st, "a")->data, a, sizeof a);
    assert_memory_equal(neox_safetensors_find(st, "b")->data, b, sizeof b);
    neox_safetensors_close(st);
    unlink(path);

    w = neox_st_writer_open(path, e, 2, NULL, &err);
    assert_int_equal(neox_st_writer_put(w, a, sizeof a, &err), 0);
    assert_int_equal(neox_st_writer_commit(w, &err), -1);
    assert_non_null(strstr(err.message, "24 bytes of tensor data written, the header announces 36"));
    assert_int_equal(access(path, F_OK), -1);  // nothing published
}

static void test_malformed(void **state) {
    (void)state;
    size_t size;
    neox_error err = {0};
    unsigned char *tiny = neox_calloc(4, 1);
    assert_null(neox_safetensors_parse(tiny, 4, "bad.safetensors", &err));
    assert_non_null(strstr(err.message, "too short"));
    unsigned char *huge = image("{}", 0, &size);
    huge[7] = 0x7f;  // header length far beyond the file
    assert_null(neox_safetensors_parse(huge, size, "bad.safetensors", &err));
    assert_non_null(strstr(err.message, "header length"));
    expect_error("{\"a\": ", 0, "header");
    expect_error("[1, 2]", 0, "not a JSON object");
    expect_error("{\"a\": 5}", 0, "not an object");
    expect_error("{\"a\": {\"dtype\": \"F33\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4, "dtype");
    expect_error("{\"a\": {\"dtype\": \"F32\", \"shape\": 1, \"data_offsets\": [0, 4]}}", 4, "shape");
    expect_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", 4, "shape[0]");
    expect_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 4]}}", 4, "shape");
    expect_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", 4, "data_offsets");
    expect_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 8]}}", 4, "outside");
    expect_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 0]}}", 4, "outside");
    expect_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4]}}", 4, "need 8");
    expect_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [4611686018427387904, 4611686018427387904], "
                 "\"data_offsets\": [0, 4]}}", 4, "too large");
    expect_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
                 "\"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 8, "overlap");
    expect_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 8, "hole");
    expect_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 12, "cover");
    expect_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
                 "\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 8, "duplicate");
    expect_error("{\"__metadata__\": {\"k\": 1}}", 0, "__metadata__");
}

// Files are mapped by open: a malformed or empty file fails with the file named and is unmapped
// (ASan reports a leak or a bad free otherwise).
static void test_malformed_files(void **state) {
    (void)state;
    char path[] = "/tmp/neox-st-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    neox_error err = {0};
    assert_null(neox_safetensors_open(path, &err));  // empty
    assert_non_null(strstr(err.message, "too short"));
    assert_non_null(strstr(err.message, path));
    size_t size;
    unsigned char *buf = image("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 4, &size);
    FILE *f = fopen(path, "wb");
    fwrite(buf, 1, size, f);
    fclose(f);
    free(buf);
    assert_null(neox_safetensors_open(path, &err));  // truncated data
    assert_non_null(strstr(err.message, "outside"));
    assert_null(neox_safetensors_open("/nonexistent/x.safetensors", &err));
    assert_non_null(strstr(err.message, "/nonexistent/x.safetensors"));
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_streamed_writer),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_malformed_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
