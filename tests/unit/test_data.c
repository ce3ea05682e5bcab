// test_data.c: unit tests of lib/data: the MMIDIDX reader and writer (including malformed .idx
// files, run under ASan/UBSan), .npy files, numpy's RandomState (expected values printed by
// numpy 1.x), splits and blending, the document readers (truncated zstd/gzip, bad JSON), the
// preprocess pipeline's order for any worker count, and the batch iterator's rank slices.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "unit_util.h"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include "data.h"


static void write_file(const char *path, const void *data, size_t size) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, size, f), size);
    fclose(f);
}

// Three documents of 3, 0 and 2 tokens.
static void write_small(const char *prefix, int dtype) {
    neox_error err = {0};
    neox_indexed_writer *w = neox_indexed_writer_open(prefix, dtype, &err);
    assert_non_null(w);
    int32_t a[] = {1, 2, 65535}, b[] = {7, 8};
    assert_int_equal(neox_indexed_writer_add_item(w, a, 3, &err), 0);
    neox_indexed_writer_end_document(w);
    assert_int_equal(neox_indexed_writer_add_item(w, a, 0, &err), 0);
    neox_indexed_writer_end_document(w);
    assert_int_equal(neox_indexed_writer_add_item(w, b, 2, &err), 0);
    neox_indexed_writer_end_document(w);
    assert_int_equal(neox_indexed_writer_commit(w, &err), 0);
}

static void test_indexed_roundtrip(void **state) {
    (void)state;
    char *prefix = tmp_path("small");
    write_small(prefix, NEOX_DTYPE_U16);
    neox_error err = {0};
    neox_indexed_dataset *ds = neox_indexed_open(prefix, &err);
    assert_non_null(ds);
    assert_int_equal(ds->dtype, NEOX_DTYPE_U16);
    assert_int_equal(ds->num_items, 3);
    assert_int_equal(ds->num_doc_idx, 4);
    assert_int_equal(ds->total_tokens, 5);
    assert_int_equal(ds->pointers[2], 6);
    int32_t out[3];
    assert_int_equal(neox_indexed_get(ds, 0, 1, 2, out, &err), 2);
    assert_int_equal(out[0], 2);
    assert_int_equal(out[1], 65535);
    assert_int_equal(neox_indexed_get(ds, 2, 0, -1, out, &err), 2);
    assert_int_equal(out[1], 8);
    assert_int_equal(neox_indexed_get(ds, 0, 2, 2, out, &err), -1);
    assert_int_equal(neox_indexed_get(ds, 3, 0, 1, out, &err), -1);
    neox_indexed_close(ds);
    free(prefix);
}

static void test_writer_rejects_ids_outside_dtype(void **state) {
    (void)state;
    char *prefix = tmp_path("bad_ids");
    neox_error err = {0};
    neox_indexed_writer *w = neox_indexed_writer_open(prefix, NEOX_DTYPE_U16, &err);
    int32_t ids[] = {70000};
    assert_int_equal(neox_indexed_writer_add_item(w, ids, 1, &err), -1);
    assert_non_null(strstr(err.message, "does not fit"));
    neox_indexed_writer_abort(w);
    char *bin = neox_asprintf("%s.bin", prefix);
    assert_int_not_equal(access(bin, F_OK), 0);  // nothing left under the final name
    free(bin);
    free(prefix);
}

// Reward datasets: float32 and float64 values written and read back exactly, integers read as values,
// token reads refused on float data, integer writes of values that do not fit refused, and a float32
// index whose .bin is one value short refused naming both files.
static void test_indexed_float_values(void **state) {
    (void)state;
    char *prefix = tmp_path("rewards32"), *p64 = tmp_path("rewards64"), *pint = tmp_path("rewards_int");
    neox_error err = {0};
    double in[] = {0.75, -1.0, 1e-3, -2.5e10};
    int dtypes[] = {NEOX_DTYPE_F32, NEOX_DTYPE_F64};
    char *prefixes[] = {prefix, p64};
    for (int k = 0; k < 2; k++) {
        neox_indexed_writer *w = neox_indexed_writer_open(prefixes[k], dtypes[k], &err);
        assert_non_null(w);
        int32_t ids[] = {1};
        assert_int_equal(neox_indexed_writer_add_item(w, ids, 1, &err), -1);  // token ids are not floats
        for (int i = 0; i < 4; i++) {
            assert_int_equal(neox_indexed_writer_add_values(w, &in[i], 1, &err), 0);
            neox_indexed_writer_end_document(w);
        }
        assert_int_equal(neox_indexed_writer_commit(w, &err), 0);
        neox_indexed_dataset *ds = neox_indexed_open(prefixes[k], &err);
        assert_non_null(ds);
        assert_int_equal(ds->dtype, dtypes[k]);
        assert_int_equal(ds->num_items, 4);
        for (int i = 0; i < 4; i++) {
            double v;
            assert_int_equal(neox_indexed_get_values(ds, i, 0, 1, &v, &err), 1);
            if (k == 0) assert_true(v == (double)(float)in[i]);
            else assert_true(v == in[i]);
        }
        double v;
        assert_int_equal(neox_indexed_get_values(ds, 4, 0, 1, &v, &err), -1);
        assert_int_equal(neox_indexed_get_values(ds, 0, 1, 1, &v, &err), -1);
        int32_t tok;
        assert_int_equal(neox_indexed_get(ds, 0, 0, 1, &tok, &err), -1);
        assert_non_null(strstr(err.message, "holds no token ids"));
        neox_indexed_close(ds);
    }
    neox_indexed_writer *w = neox_indexed_writer_open(pint, NEOX_DTYPE_I32, &err);
    double ok[] = {-1.0, 1.0}, frac = 0.5, big = 4294967296.0;
    assert_int_equal(neox_indexed_writer_add_values(w, ok, 2, &err), 0);
    assert_int_equal(neox_indexed_writer_add_values(w, &frac, 1, &err), -1);
    assert_non_null(strstr(err.message, "does not fit dtype int32"));
    assert_int_equal(neox_indexed_writer_add_values(w, &big, 1, &err), -1);
    neox_indexed_writer_end_document(w);
    assert_int_equal(neox_indexed_writer_commit(w, &err), 0);
    neox_indexed_dataset *ds = neox_indexed_open(pint, &err);
    double got[2];
    assert_int_equal(neox_indexed_get_values(ds, 0, 0, -1, got, &err), 2);
    assert_true(got[0] == -1.0 && got[1] == 1.0);
    neox_indexed_close(ds);
    // A float32 .bin one value short of its index.
    char *bin = neox_asprintf("%s.bin", prefix);
    size_t size;
    char *bytes = neox_read_file(bin, &size, &err);
    write_file(bin, bytes, size - 4);
    assert_null(neox_indexed_open(prefix, &err));
    assert_non_null(strstr(err.message, "the index describes 16 bytes of tokens"));
    assert_non_null(strstr(err.message, bin));
    free(bytes);
    free(bin);
    free(prefix);
    free(p64);
    free(pint);
}

static void test_merge_keeps_doc_idx(void **state) {
    (void)state;
    char *a = tmp_path("ma"), *out = tmp_path("merged");
    write_small(a, NEOX_DTYPE_I32);
    neox_error err = {0};
    neox_indexed_dataset *ds = neox_indexed_open(a, &err);
    neox_indexed_writer *w = neox_indexed_writer_open(out, NEOX_DTYPE_I32, &err);
    assert_int_equal(neox_indexed_writer_append(w, ds, &err), 0);
    assert_int_equal(neox_indexed_writer_append(w, ds, &err), 0);
    assert_int_equal(neox_indexed_writer_commit(w, &err), 0);
    neox_indexed_close(ds);
    neox_indexed_dataset *m = neox_indexed_open(out, &err);
    assert_non_null(m);
    assert_int_equal(m->num_items, 6);
    assert_int_equal(m->num_doc_idx, 7);
    int64_t want[] = {0, 1, 2, 3, 4, 5, 6};
    for (int i = 0; i < 7; i++) assert_int_equal(m->doc_idx[i], want[i]);
    assert_int_equal(m->pointers[3], 20);
    neox_indexed_close(m);
    free(a);
    free(out);
}

// ---- malformed .idx ----------------------------------------------------------------------------

static void expect_open_fails(const char *prefix, const uint8_t *idx, size_t size, const char *needle) {
    char *path = neox_asprintf("%s.idx", prefix);
    write_file(path, idx, size);
    neox_error err = {0};
    neox_indexed_dataset *ds = neox_indexed_open(prefix, &err);
    if (ds) fail_msg("opened a malformed index (%s)", needle);
    if (!strstr(err.message, needle)) fail_msg("message '%s' lacks '%s'", err.message, needle);
    assert_non_null(strstr(err.message, prefix));
    free(path);
}

static void test_malformed_idx(void **state) {
    (void)state;
    char *prefix = tmp_path("mal");
    write_small(prefix, NEOX_DTYPE_U16);
    char *path = neox_asprintf("%s.idx", prefix);
    size_t size;
    neox_error err = {0};
    uint8_t *good = (uint8_t *)neox_read_file(path, &size, &err);
    assert_int_equal(size, 34 + 3 * 12 + 4 * 8);
    uint8_t *b = neox_malloc(size + 64);
    uint64_t big = UINT64_MAX / 4;
    int32_t neg = -1;
    int64_t v;

    expect_open_fails(prefix, good, 20, "magic");
    memcpy(b, good, size), b[0] = 'X';
    expect_open_fails(prefix, b, size, "magic");
    memcpy(b, good, size), b[9] = 2;
    expect_open_fails(prefix, b, size, "version");
    memcpy(b, good, size), b[17] = 42;
    expect_open_fails(prefix, b, size, "dtype");
    memcpy(b, good, size), memcpy(b + 18, &big, 8);
    expect_open_fails(prefix, b, size, "file size");
    memcpy(b, good, size), memcpy(b + 26, &big, 8);
    expect_open_fails(prefix, b, size, "file size");
    expect_open_fails(prefix, good, size - 1, "file size");
    memcpy(b, good, size), memcpy(b + 34, &neg, 4);
    expect_open_fails(prefix, b, size, "negative");
    memcpy(b, good, size), v = 4, memcpy(b + 34 + 12 + 8, &v, 8);
    expect_open_fails(prefix, b, size, "disagree");
    memcpy(b, good, size), v = 2, memcpy(b + 34 + 36 + 8, &v, 8), v = 1, memcpy(b + 34 + 36 + 16, &v, 8);
    expect_open_fails(prefix, b, size, "out of order");
    memcpy(b, good, size), v = 1, memcpy(b + 34 + 36, &v, 8);
    expect_open_fails(prefix, b, size, "start with 0");
    memcpy(b, good, size), v = 2, memcpy(b + 34 + 36 + 24, &v, 8);
    expect_open_fails(prefix, b, size, "doc_idx ends");
    // A .bin shorter than the index says.
    write_file(path, good, size);
    char *bin = neox_asprintf("%s.bin", prefix);
    write_file(bin, good, 4);
    expect_open_fails(prefix, good, size, "bytes of tokens");
    free(bin);
    free(b);
    free(good);
    free(path);
    free(prefix);
}

static void test_random_idx_garbage_never_crashes(void **state) {
    (void)state;
    char *prefix = tmp_path("garbage");
    char *bin = neox_asprintf("%s.bin", prefix);
    write_file(bin, "\0\0\0\0\0\0\0\0", 8);
    uint8_t buf[200];
    uint32_t x = 12345;
    for (int round = 0; round < 300; round++) {
        size_t n = 34 + (size_t)(round % 150);
        for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)((x = x * 1103515245 + 12345) >> 16);
        memcpy(buf, "MMIDIDX\0\0\1\0\0\0\0\0\0\0", 17);
        buf[17] = (uint8_t)(1 + round % 8);
        uint64_t items = (uint64_t)(round % 5), docs = (uint64_t)(round % 7);
        memcpy(buf + 18, &items, 8);
        memcpy(buf + 26, &docs, 8);
        char *path = neox_asprintf("%s.idx", prefix);
        write_file(path, buf, n);
        free(path);
        neox_error err = {0};
        neox_indexed_dataset *ds = neox_indexed_open(prefix, &err);
        neox_indexed_close(ds);
    }
    free(bin);
    free(prefix);
}

// ---- npy -----------------------------------------------------------------------------------------

static void test_npy_roundtrip_and_header(void **state) {
    (void)state;
    char *path = tmp_path("a.npy");
    int32_t data[6] = {1, -2, 3, 4, 5, 6};
    int64_t shape[2] = {3, 2};
    neox_error err = {0};
    assert_int_equal(neox_npy_write(path, "<i4", 2, shape, data, &err), 0);
    size_t size;
    char *raw = neox_read_file(path, &size, &err);
    assert_int_equal((10 + (unsigned char)raw[8]) % 64, 0);  // numpy pads the header to 64 bytes
    assert_memory_equal(raw + 10, "{'descr': '<i4', 'fortran_order': False, 'shape': (3, 2), }", 59);
    free(raw);
    neox_npy a;
    assert_int_equal(neox_npy_read(path, &a, &err), 0);
    assert_int_equal(a.ndim, 2);
    assert_int_equal(a.shape[0], 3);
    int64_t *v = neox_npy_to_i64(&a);
    assert_int_equal(v[1], -2);
    free(v);
    free(a.data);
    // Truncated data and a Fortran-order header are refused.
    raw = neox_read_file(path, &size, &err);
    write_file(path, raw, size - 3);
    assert_int_equal(neox_npy_read(path, &a, &err), -1);
    assert_non_null(strstr(err.message, "truncated"));
    char *f = memmem(raw, size, "False", 5);
    assert_non_null(f);
    memcpy(f, "True ", 5);
    write_file(path, raw, size);
    assert_int_equal(neox_npy_read(path, &a, &err), -1);
    write_file(path, "\x93NUMPY\x01\x00\xff\xff{", 11);
    assert_int_equal(neox_npy_read(path, &a, &err), -1);
    free(raw);
    free(path);
}

// ---- numpy RandomState ----------------------------------------------------------------------------

static void test_random_matches_numpy(void **state) {
    (void)state;
    neox_random_state rs;
    // np.random.RandomState(5489).randint(0, 2**32, size=3, dtype=np.uint64)
    neox_random_seed(&rs, 5489);
    assert_int_equal(neox_random_uint32(&rs), 3499211612U);
    assert_int_equal(neox_random_uint32(&rs), 581869302U);
    assert_int_equal(neox_random_uint32(&rs), 3890346734U);
    // a = np.arange(10, dtype=np.int32); np.random.RandomState(1234).shuffle(a)
    int32_t a[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, want_a[10] = {7, 2, 9, 1, 0, 8, 4, 5, 6, 3};
    neox_random_seed(&rs, 1234);
    neox_random_shuffle(&rs, a, 10, 4);
    assert_memory_equal(a, want_a, sizeof a);
    // np.random.RandomState(0).permutation(20)
    int64_t p[20], want_p[20] = {18, 1, 19, 8, 10, 17, 6, 13, 4, 2, 5, 14, 9, 7, 16, 11, 3, 0, 15, 12};
    for (int i = 0; i < 20; i++) p[i] = i;
    neox_random_seed(&rs, 0);
    neox_random_shuffle(&rs, p, 20, 8);
    assert_memory_equal(p, want_p, sizeof p);
    // a = np.arange(7, dtype=np.uint32); np.random.RandomState(4294967295).shuffle(a)
    uint32_t u[7] = {0, 1, 2, 3, 4, 5, 6}, want_u[7] = {1, 5, 0, 6, 4, 2, 3};
    neox_random_seed(&rs, 4294967295U);
    neox_random_shuffle(&rs, u, 7, 4);
    assert_memory_equal(u, want_u, sizeof u);
    // Bounds above 2^32 use 64-bit draws: np.random.RandomState(1234).randint(0, 2**40 + 1, size=6)
    uint64_t want_w[6] = {878802328948ULL, 656147994617ULL, 617876871857ULL, 662277595166ULL, 737940505758ULL,
                          1014294388604ULL};
    neox_random_seed(&rs, 1234);
    for (int i = 0; i < 6; i++) assert_true(neox_random_interval(&rs, 1ULL << 40) == want_w[i]);
}

// ---- splits, weights, blending --------------------------------------------------------------------

static void test_splits(void **state) {
    (void)state;
    int64_t idx[4];
    neox_error err = {0};
    assert_int_equal(neox_split_ranges("949,50,1", 1000, idx, &err), 0);
    assert_int_equal(idx[1], 949), assert_int_equal(idx[2], 999), assert_int_equal(idx[3], 1000);
    // 1/4 of 10 = 2.5 rounds to 2 (half to even), 3/4 -> 7.5 -> 8; sum 10.
    assert_int_equal(neox_split_ranges("1/3", 10, idx, &err), 0);
    assert_int_equal(idx[1], 2), assert_int_equal(idx[2], 10), assert_int_equal(idx[3], 10);
    // 1,1,1 of 7: 2.333 -> 2 each: index 0,2,4,6 then the correction moves all by -1: 0,3,5,7.
    assert_int_equal(neox_split_ranges("1,1,1", 7, idx, &err), 0);
    assert_int_equal(idx[1], 3), assert_int_equal(idx[2], 5), assert_int_equal(idx[3], 7);
    assert_int_equal(neox_split_ranges("a,b", 7, idx, &err), -1);
    assert_int_equal(err.status, NEOX_EXIT_USAGE);
    assert_int_equal(neox_split_ranges("0,0,0", 7, idx, &err), -1);
}

static void test_weights_and_blending(void **state) {
    (void)state;
    double w[2] = {3, 1}, nw[2];
    int64_t ns[2];
    neox_normalized_weights(w, 2, 1000, nw, ns);
    assert_true(nw[0] == 0.75);
    assert_int_equal(ns[0], 754);  // ceil(1000 * 0.75 * 1.005) = ceil(753.75)
    assert_int_equal(ns[1], 252);
    uint8_t di[8];
    int64_t dsi[8];
    neox_blending_indices(nw, 2, 8, di, dsi);
    uint8_t want[8] = {0, 1, 0, 0, 0, 1, 0, 0};
    assert_memory_equal(di, want, 8);
    assert_int_equal(dsi[7], 5);
    int64_t docs[2] = {100, 100};
    neox_weights_by_num_docs(docs, 2, 0.3, nw);
    assert_true(nw[0] == 0.5 && nw[1] == 0.5);
    int64_t s[3];
    neox_train_valid_test_samples(100, 30, 5, 8, s);
    assert_int_equal(s[0], 800), assert_int_equal(s[1], 160), assert_int_equal(s[2], 40);
    assert_int_equal(neox_num_epochs(100, 10, 9), 1);
    assert_int_equal(neox_num_epochs(100, 10, 10), 2);  // (100 - 1) / 10 = 9 samples per epoch
}

// ---- documents -------------------------------------------------------------------------------------

static int read_all_records(const char *path, neox_record *recs, int max, neox_error *err) {
    neox_doc_reader *r = neox_doc_reader_open(&path, 1, err);
    if (!r) return -1;
    int total = 0, n;
    neox_record chunk[8];
    static char store[8][256];
    while ((n = neox_doc_reader_next(r, chunk, 8, 1 << 20, err)) > 0)
        for (int i = 0; i < n && total < max; i++, total++) {
            snprintf(store[total], sizeof store[total], "%.*s", (int)chunk[i].size, chunk[i].data);
            recs[total] = chunk[i];
            recs[total].data = store[total];
            recs[total].file = "";
        }
    neox_doc_reader_close(r);
    return n < 0 ? -1 : total;
}

static const char JSONL[] = "{\"text\": \"hello\"}\n\n{\"text\": [\"a\", \"b\"], \"x\": 1}\r\n{\"text\": \"\"}\n{\"y\": 2}\n"
                            "{\"text\": \"bad\" \"x\"}\n{\"text\": 5}";

static void test_jsonl_records_and_text(void **state) {
    (void)state;
    char *path = tmp_path("in.jsonl");
    write_file(path, JSONL, sizeof JSONL - 1);
    neox_record recs[8];
    neox_error err = {0};
    assert_int_equal(read_all_records(path, recs, 8, &err), 6);
    assert_int_equal(recs[1].line, 3);  // the blank line 2 is skipped but counted
    size_t n;
    char *t = neox_record_text(&recs[0], "text", &n, &err);
    assert_string_equal(t, "hello");
    free(t);
    recs[1].file = "in.jsonl";
    t = neox_record_text(&recs[1], "text", &n, &err);
    assert_string_equal(t, "a\n\nb");  // lm_dataformat joins a list with blank lines
    free(t);
    t = neox_record_text(&recs[2], "text", &n, &err);
    assert_int_equal(n, 0);
    free(t);
    recs[3].file = recs[4].file = recs[5].file = "in.jsonl";
    assert_null(neox_record_text(&recs[3], "text", &n, &err));
    assert_string_equal(err.message, "in.jsonl:5: no key 'text'");
    assert_null(neox_record_text(&recs[4], "text", &n, &err));
    if (!strstr(err.message, "in.jsonl:6:18: invalid JSON")) fail_msg("%s", err.message);
    assert_null(neox_record_text(&recs[5], "text", &n, &err));
    assert_non_null(strstr(err.message, "not a string"));
    free(path);
}

static void test_compressed_inputs_and_truncation(void **state) {
    (void)state;
    char *z = tmp_path("in.jsonl.zst"), *g = tmp_path("in.jsonl.gz");
    size_t cap = ZSTD_compressBound(sizeof JSONL);
    char *zbuf = neox_malloc(cap);
    size_t zn = ZSTD_compress(zbuf, cap, JSONL, sizeof JSONL - 1, 3);
    write_file(z, zbuf, zn);
    neox_record recs[8];
    neox_error err = {0};
    assert_int_equal(read_all_records(z, recs, 8, &err), 6);
    assert_string_equal(recs[0].data, "{\"text\": \"hello\"}");
    write_file(z, zbuf, zn - 5);
    assert_int_equal(read_all_records(z, recs, 8, &err), -1);
    assert_non_null(strstr(err.message, "truncated zstd"));
    assert_non_null(strstr(err.message, z));
    gzFile gz = gzopen(g, "wb");
    gzwrite(gz, JSONL, sizeof JSONL - 1);
    gzclose(gz);
    assert_int_equal(read_all_records(g, recs, 8, &err), 6);
    size_t gn;
    char *graw = neox_read_file(g, &gn, &err);
    write_file(g, graw, gn - 6);
    assert_int_equal(read_all_records(g, recs, 8, &err), -1);
    assert_non_null(strstr(err.message, "truncated gzip"));
    free(graw);
    free(zbuf);
    free(z);
    free(g);
}

static void test_missing_input_is_an_error(void **state) {
    (void)state;
    const char *path = "/nonexistent/x.jsonl";
    neox_error err = {0};
    assert_null(neox_doc_reader_open(&path, 1, &err));
    assert_non_null(strstr(err.message, path));
}

// ---- pipeline --------------------------------------------------------------------------------------

// A stand-in tokenizer: one id per byte.
static int64_t byte_encode(void *ctx, const char *text, size_t size, int32_t **ids, size_t *len, size_t *cap,
                           neox_error *err) {
    (void)ctx, (void)err;
    if (*len + size > *cap) *ids = neox_realloc(*ids, (*cap = (*len + size) * 2) * sizeof **ids);
    for (size_t i = 0; i < size; i++) (*ids)[(*len)++] = (unsigned char)text[i];
    return (int64_t)size;
}

static char *run_pipeline(const char *input, int workers, int skip_invalid, int expect_rc, neox_preprocess_stats *st) {
    char name[32];
    snprintf(name, sizeof name, "pp%d_%d", workers, skip_invalid);
    char *prefix = tmp_path(name);
    const char *keys[] = {"text"};
    neox_preprocess_options o = {.inputs = &input, .ninputs = 1, .keys = keys, .nkeys = 1, .output_prefix = prefix,
                                 .encode = byte_encode, .vocab_size = 256, .eod_id = 0, .append_eod = 1,
                                 .workers = workers, .skip_invalid = skip_invalid, .log_interval = 100};
    neox_error err = {0};
    neox_progress_set_enabled(0);
    assert_int_equal(neox_preprocess_run(&o, st, &err), expect_rc);
    return prefix;
}

static void test_pipeline_order_for_any_workers(void **state) {
    (void)state;
    char *path = tmp_path("many.jsonl");
    FILE *f = fopen(path, "w");
    for (int i = 0; i < 3000; i++) fprintf(f, "{\"text\": \"doc %d %.*s\"}\n", i, i % 50, "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx");
    fclose(f);
    neox_preprocess_stats st;
    char *one = run_pipeline(path, 1, 0, 0, &st);
    assert_int_equal(st.documents, 3000);
    char *four = run_pipeline(path, 4, 0, 0, &st);
    neox_error err = {0};
    for (int k = 0; k < 2; k++) {
        char *a = neox_asprintf("%s_text_document.%s", one, k ? "idx" : "bin");
        char *b = neox_asprintf("%s_text_document.%s", four, k ? "idx" : "bin");
        size_t na, nb;
        char *da = neox_read_file(a, &na, &err), *db = neox_read_file(b, &nb, &err);
        assert_int_equal(na, nb);
        assert_memory_equal(da, db, na);
        free(da), free(db), free(a), free(b);
    }
    char *p = neox_asprintf("%s_text_document", four);
    neox_indexed_dataset *ds = neox_indexed_open(p, &err);
    int32_t out[16];
    neox_indexed_get(ds, 2999, 0, 8, out, &err);
    assert_int_equal(out[4], '2'), assert_int_equal(out[5], '9');
    assert_int_equal(ds->sizes[0], 7);  // "doc 0 " + EOD
    neox_indexed_close(ds);
    free(p), free(one), free(four), free(path);
}

static void test_pipeline_bad_record(void **state) {
    (void)state;
    char *path = tmp_path("bad.jsonl");
    write_file(path, JSONL, sizeof JSONL - 1);
    neox_preprocess_stats st;
    char *prefix = run_pipeline(path, 2, 0, -1, &st);
    char *idx = neox_asprintf("%s_text_document.idx", prefix);
    assert_int_not_equal(access(idx, F_OK), 0);  // a failed run leaves no dataset
    free(idx), free(prefix);
    prefix = run_pipeline(path, 2, 1, 0, &st);
    assert_int_equal(st.documents, 2);
    assert_int_equal(st.skipped_empty, 1);
    assert_int_equal(st.skipped_invalid, 3);
    free(prefix), free(path);
}

// ---- sample index and batches ----------------------------------------------------------------------

static void test_batches_slice_by_rank(void **state) {
    (void)state;
    char *prefix = tmp_path("batch");
    neox_error err = {0};
    neox_indexed_writer *w = neox_indexed_writer_open(prefix, NEOX_DTYPE_U16, &err);
    for (int d = 0; d < 50; d++) {
        int32_t ids[7];
        for (int t = 0; t < 7; t++) ids[t] = d * 10 + t;
        neox_indexed_writer_add_item(w, ids, 7, &err);
        neox_indexed_writer_end_document(w);
    }
    assert_int_equal(neox_indexed_writer_commit(w, &err), 0);
    neox_data_settings s = {.data_path = prefix, .split = "1,0,0", .seq_length = 4, .seed = 3, .train_iters = 10,
                            .eval_interval = 10, .eval_iters = 0, .train_batch_size = 4, .allow_chopped = 1};
    neox_dataset *sets[3];
    assert_int_equal(neox_build_datasets(&s, sets, &err), 0);
    assert_non_null(sets[0]);
    assert_null(sets[1]);
    neox_batch_iterator whole, r1;
    neox_batch_iterator_init(&whole, sets[0], 4, 1, 0, 3, 1);
    neox_batch_iterator_init(&r1, sets[0], 2, 2, 1, 3, 1);
    neox_batch *bw = neox_batch_alloc(4, 4), *b1 = neox_batch_alloc(2, 4);
    for (int step = 0; step < 3; step++) {
        assert_int_equal(neox_batch_next(&whole, bw, &err), 0);
        assert_int_equal(neox_batch_next(&r1, b1, &err), 0);
        // rank 1 of 2 gets samples 2 and 3 of each global batch
        assert_memory_equal(b1->tokens, bw->tokens + 2 * 4, 2 * 4 * sizeof(int32_t));
        assert_memory_equal(b1->labels, bw->labels + 2 * 4, 2 * 4 * sizeof(int32_t));
    }
    // Resume: a fresh iterator seeked to the saved position continues identically.
    neox_batch_iterator again;
    neox_batch_iterator_init(&again, sets[0], 4, 1, 0, 3, 1);
    neox_batch_iterator_seek(&again, 2);
    neox_batch *b2 = neox_batch_alloc(4, 4);
    assert_int_equal(neox_batch_next(&again, b2, &err), 0);
    assert_memory_equal(b2->tokens, bw->tokens, 16 * sizeof(int32_t));
    for (int i = 0; i < 16; i++) {
        assert_int_equal(bw->labels[i], i % 4 == 3 ? bw->labels[i] : bw->tokens[i + 1]);
        if (bw->tokens[i] == 3) assert_true(bw->loss_mask[i] == 0.0f);  // eod_mask_loss with eod 3
    }
    neox_batch_free(bw), neox_batch_free(b1), neox_batch_free(b2);
    for (int i = 0; i < 3; i++) neox_dataset_free(sets[i]);
    free(prefix);
}

// num_workers: the prefetching reader gives the synchronous reader's batches in any order of
// requests (the same iterator, another iterator in between, a seek back), and its errors.
static void test_prefetch_matches_synchronous(void **state) {
    (void)state;
    char *prefix = tmp_path("prefetch");
    neox_error err = {0};
    neox_indexed_writer *w = neox_indexed_writer_open(prefix, NEOX_DTYPE_U16, &err);
    for (int d = 0; d < 40; d++) {
        int32_t ids[9];
        for (int t = 0; t < 9; t++) ids[t] = (d * 13 + t * 7) % 500;
        neox_indexed_writer_add_item(w, ids, 9 - d % 4, &err);
        neox_indexed_writer_end_document(w);
    }
    assert_int_equal(neox_indexed_writer_commit(w, &err), 0);
    neox_data_settings s = {.data_path = prefix, .split = "8,2,0", .seq_length = 5, .seed = 7, .train_iters = 20,
                            .eval_interval = 5, .eval_iters = 2, .train_batch_size = 2, .allow_chopped = 1};
    neox_dataset *sets[3];
    assert_int_equal(neox_build_datasets(&s, sets, &err), 0);
    neox_batch_iterator train, valid, want_train, want_valid;
    neox_batch_iterator_init(&train, sets[0], 2, 1, 0, 3, 1);
    neox_batch_iterator_init(&valid, sets[1], 2, 1, 0, 3, 1);
    want_train = train, want_valid = valid;
    neox_prefetch *p = neox_prefetch_start(2, 5);
    neox_batch *b = neox_batch_alloc(2, 5), *want = neox_batch_alloc(2, 5);
    for (int step = 0; step < 30; step++) {
        int eval = step % 7 == 6, seek = step == 20;
        if (seek) neox_batch_iterator_seek(&train, 3), neox_batch_iterator_seek(&want_train, 3);
        assert_int_equal(neox_prefetch_next(p, eval ? &valid : &train, &b, &err), 0);
        assert_int_equal(neox_batch_next(eval ? &want_valid : &want_train, want, &err), 0);
        assert_memory_equal(b->tokens, want->tokens, 10 * sizeof(int32_t));
        assert_memory_equal(b->labels, want->labels, 10 * sizeof(int32_t));
        assert_memory_equal(b->loss_mask, want->loss_mask, 10 * sizeof(float));
        assert_int_equal(train.position, want_train.position);
    }
    neox_batch_iterator too_big;  // fewer samples than one global batch
    neox_batch_iterator_init(&too_big, sets[0], 2, 1000, 0, 3, 1);
    neox_error sync_err = {0};
    assert_int_equal(neox_prefetch_next(p, &too_big, &b, &err), -1);
    assert_int_equal(neox_batch_next(&too_big, want, &sync_err), -1);
    assert_string_equal(err.message, sync_err.message);
    neox_prefetch_free(p);
    neox_batch_free(b), neox_batch_free(want);
    for (int i = 0; i < 3; i++) neox_dataset_free(sets[i]);
    free(prefix);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_indexed_roundtrip),
        cmocka_unit_test(test_indexed_float_values),
        cmocka_unit_test(test_writer_rejects_ids_outside_dtype),
        cmocka_unit_test(test_merge_keeps_doc_idx),
        cmocka_unit_test(test_malformed_idx),
        cmocka_unit_test(test_random_idx_garbage_never_crashes),
        cmocka_unit_test(test_npy_roundtrip_and_header),
        cmocka_unit_test(test_random_matches_numpy),
        cmocka_unit_test(test_splits),
        cmocka_unit_test(test_weights_and_blending),
        cmocka_unit_test(test_jsonl_records_and_text),
        cmocka_unit_test(test_compressed_inputs_and_truncation),
        cmocka_unit_test(test_missing_input_is_an_error),
        cmocka_unit_test(test_pipeline_order_for_any_workers),
        cmocka_unit_test(test_pipeline_bad_record),
        cmocka_unit_test(test_batches_slice_by_rank),
        cmocka_unit_test(test_prefetch_matches_synchronous),
    };
    return cmocka_run_group_tests(tests, make_tmpdir, remove_tmpdir);
}
