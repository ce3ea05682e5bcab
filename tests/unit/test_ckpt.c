// test_ckpt.c: layout-free checkpoint shards: write pieces as one layout cuts them (tensor-parallel
// blocks, ZeRO flat ranges), read any block or range back as another layout would, and reject
// missing, inconsistent and malformed shard files with errors naming the file or tensor.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "unit_util.h"
#include <hdf5.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"



// The value every element of the test tensor holds: its flat index, scaled, so any misplaced
// element is detected.
static float value_at(int64_t flat) { return 0.5f * (float)flat - 7.0f; }

// Fills a block of a row-major tensor of `shape` with value_at of each element's flat index.
static void fill_block(int ndim, const int64_t *shape, const int64_t *offset, const int64_t *count, float *out) {
    int64_t n = 1, idx[NEOX_CKPT_MAX_DIMS];
    for (int d = 0; d < ndim; d++) n *= count[d];
    for (int64_t i = 0; i < n; i++) {
        int64_t rem = i, flat = 0;
        for (int d = ndim - 1; d >= 0; d--) idx[d] = offset[d] + rem % count[d], rem /= count[d];
        for (int d = 0; d < ndim; d++) flat = flat * shape[d] + idx[d];
        out[i] = value_at(flat);
    }
}

static void assert_block_values(int ndim, const int64_t *shape, const int64_t *offset, const int64_t *count,
                                const float *got) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= count[d];
    float *want = neox_malloc(n * sizeof(float));
    fill_block(ndim, shape, offset, count, want);
    for (int64_t i = 0; i < n; i++) assert_float_equal(got[i], want[i], 0.0);
    free(want);
}

// Writes tensor "w3" (4, 6, 5) as two tensor-parallel blocks split along dimension 1 into two
// files, and "flat" (7, 9) as three ZeRO-style flat ranges that cut rows mid-way, into three files.
static void write_two_layouts(char **paths) {
    neox_error err = {0};
    const int64_t shape3[3] = {4, 6, 5}, shape2[2] = {7, 9};
    const int64_t cuts[4] = {0, 20, 41, 63};
    for (int f = 0; f < 3; f++) {
        neox_ckpt_writer *w = neox_ckpt_writer_open(paths[f], &err);
        assert_non_null(w);
        if (f < 2) {
            int64_t off[3] = {0, 3 * f, 0}, cnt[3] = {4, 3, 5};
            float buf[60];
            fill_block(3, shape3, off, cnt, buf);
            assert_int_equal(neox_ckpt_write_block(w, "params/w3", 3, shape3, off, cnt, buf, &err), 0);
        }
        float buf[63];
        for (int64_t i = cuts[f]; i < cuts[f + 1]; i++) buf[i - cuts[f]] = value_at(i);
        assert_int_equal(neox_ckpt_write_range(w, "optim/flat", 2, shape2, cuts[f], cuts[f + 1] - cuts[f], buf, &err), 0);
        if (f == 0) {
            float scalar = 42.0f;
            assert_int_equal(neox_ckpt_write_block(w, "state/scale", 0, NULL, NULL, NULL, &scalar, &err), 0);
            assert_int_equal(neox_ckpt_write_bytes(w, "state/rng", "\x01\x02\x00\x03", 4, &err), 0);
        }
        assert_int_equal(neox_ckpt_writer_close(w, &err), 0);
    }
}

static void test_any_region_reads_back(void **state) {
    (void)state;
    char *paths[3] = {tmp_path("a.h5"), tmp_path("b.h5"), tmp_path("c.h5")};
    write_two_layouts(paths);
    neox_error err = {0};
    neox_ckpt_reader *r = neox_ckpt_reader_open((const char *const *)paths, 3, &err);
    assert_non_null(r);
    assert_int_equal(neox_ckpt_tensor_count(r), 4);
    assert_string_equal(neox_ckpt_tensor_name(r, 0), "optim/flat");  // sorted

    int ndim;
    int64_t shape[NEOX_CKPT_MAX_DIMS];
    assert_int_equal(neox_ckpt_tensor_shape(r, "params/w3", &ndim, shape, &err), 0);
    assert_int_equal(ndim, 3);
    assert_int_equal(shape[1], 6);

    // Whole tensors, blocks cutting across the pieces, and the other kind of region.
    const int64_t shape3[3] = {4, 6, 5}, shape2[2] = {7, 9};
    float buf[200];
    int64_t whole_off[3] = {0, 0, 0};
    assert_int_equal(neox_ckpt_read_block(r, "params/w3", whole_off, shape3, buf, &err), 0);
    assert_block_values(3, shape3, whole_off, shape3, buf);
    int64_t off3[3] = {1, 2, 1}, cnt3[3] = {2, 3, 4};  // straddles the tp boundary at column 3
    assert_int_equal(neox_ckpt_read_block(r, "params/w3", off3, cnt3, buf, &err), 0);
    assert_block_values(3, shape3, off3, cnt3, buf);
    int64_t off2[2] = {1, 3}, cnt2[2] = {5, 4};  // blocks of a tensor stored as flat ranges
    assert_int_equal(neox_ckpt_read_block(r, "optim/flat", off2, cnt2, buf, &err), 0);
    assert_block_values(2, shape2, off2, cnt2, buf);
    assert_int_equal(neox_ckpt_read_range(r, "params/w3", 17, 50, buf, &err), 0);  // ranges of a block-stored tensor
    for (int i = 0; i < 50; i++) assert_float_equal(buf[i], value_at(17 + i), 0.0);
    assert_int_equal(neox_ckpt_read_range(r, "optim/flat", 15, 30, buf, &err), 0);
    for (int i = 0; i < 30; i++) assert_float_equal(buf[i], value_at(15 + i), 0.0);

    assert_int_equal(neox_ckpt_read_block(r, "state/scale", NULL, NULL, buf, &err), 0);
    assert_float_equal(buf[0], 42.0f, 0.0);
    void *bytes;
    size_t size;
    assert_int_equal(neox_ckpt_read_bytes(r, "state/rng", &bytes, &size, &err), 0);
    assert_int_equal(size, 4);
    assert_memory_equal(bytes, "\x01\x02\x00\x03", 4);
    free(bytes);

    // Out-of-range requests and unknown names are errors, not reads past the end.
    assert_int_equal(neox_ckpt_read_range(r, "optim/flat", 60, 4, buf, &err), -1);
    assert_non_null(strstr(err.message, "outside the tensor"));
    assert_int_equal(neox_ckpt_read_block(r, "params/nope", off3, cnt3, buf, &err), -1);
    assert_string_equal(err.message, "checkpoint has no tensor 'params/nope'");
    neox_ckpt_reader_close(r);
    for (int i = 0; i < 3; i++) free(paths[i]);
}

// Blocks of whole rows (tensor parallelism's column-parallel cut) read back whole, as ranges and as
// blocks; whole-tensor reads take the direct path, partial ones the staged path.
static void test_row_blocks(void **state) {
    (void)state;
    neox_error err = {0};
    const int64_t shape[2] = {6, 4};
    char *paths[2] = {tmp_path("rows0.h5"), tmp_path("rows1.h5")};
    for (int f = 0; f < 2; f++) {
        int64_t off[2] = {3 * f, 0}, cnt[2] = {3, 4};
        float buf[12];
        fill_block(2, shape, off, cnt, buf);
        neox_ckpt_writer *w = neox_ckpt_writer_open(paths[f], &err);
        assert_int_equal(neox_ckpt_write_block(w, "rows", 2, shape, off, cnt, buf, &err), 0);
        assert_int_equal(neox_ckpt_writer_close(w, &err), 0);
    }
    neox_ckpt_reader *r = neox_ckpt_reader_open((const char *const *)paths, 2, &err);
    assert_non_null(r);
    float got[24];
    const int64_t zero[2] = {0, 0};
    assert_int_equal(neox_ckpt_read_block(r, "rows", zero, shape, got, &err), 0);
    assert_block_values(2, shape, zero, shape, got);
    assert_int_equal(neox_ckpt_read_range(r, "rows", 5, 14, got, &err), 0);
    for (int i = 0; i < 14; i++) assert_float_equal(got[i], value_at(5 + i), 0.0);
    const int64_t off[2] = {2, 1}, cnt[2] = {2, 3};
    assert_int_equal(neox_ckpt_read_block(r, "rows", off, cnt, got, &err), 0);
    assert_block_values(2, shape, off, cnt, got);
    neox_ckpt_reader_close(r);
    free(paths[0]);
    free(paths[1]);
}

static void test_missing_shard_is_named(void **state) {
    (void)state;
    char *paths[3] = {tmp_path("m1.h5"), tmp_path("m2.h5"), tmp_path("m3.h5")};
    write_two_layouts(paths);
    neox_error err = {0};
    const char *present[2] = {paths[0], paths[2]};  // the file holding the second tp block is gone
    neox_ckpt_reader *r = neox_ckpt_reader_open(present, 2, &err);
    if (!r) fail_msg("%s", err.message);
    const int64_t off[3] = {0, 0, 0}, shape3[3] = {4, 6, 5};
    float buf[120];
    assert_int_equal(neox_ckpt_read_block(r, "params/w3", off, shape3, buf, &err), -1);
    assert_non_null(strstr(err.message, "'params/w3'"));
    assert_non_null(strstr(err.message, "a shard is missing"));
    // The part the remaining file holds still reads.
    const int64_t cnt[3] = {4, 3, 5};
    assert_int_equal(neox_ckpt_read_block(r, "params/w3", off, cnt, buf, &err), 0);
    assert_int_equal(neox_ckpt_read_range(r, "optim/flat", 25, 10, buf, &err), -1);  // [20, 41) was in m2
    neox_ckpt_reader_close(r);
    for (int i = 0; i < 3; i++) free(paths[i]);
}

// Copies [start, start + n) of a tensor into a file at byte `at` and checks the bytes there, and
// that the bytes before `at` were left alone.
static void assert_copy(neox_ckpt_reader *r, const char *name, int64_t start, int64_t n, const char *path) {
    neox_error err = {0};
    const int64_t at = 12;
    FILE *fp = fopen(path, "w+b");
    assert_non_null(fp);
    assert_int_equal(fwrite("header bytes", 1, (size_t)at, fp), (size_t)at);
    fflush(fp);
    assert_int_equal(neox_ckpt_copy_range_to_fd(r, name, start, n, fileno(fp), at, &err), 0);
    float got[200];
    char head[12];
    rewind(fp);
    assert_int_equal(fread(head, 1, sizeof head, fp), sizeof head);
    assert_memory_equal(head, "header bytes", sizeof head);
    assert_int_equal(fread(got, sizeof(float), (size_t)n, fp), (size_t)n);
    for (int64_t i = 0; i < n; i++) assert_float_equal(got[i], value_at(start + i), 0.0);
    fclose(fp);
}

// Copying ranges straight into a file: pieces stored as runs (flat ranges, whole-row blocks) are
// copied file to file, column blocks through memory; a missing shard is an error, as for reads.
static void test_copy_range_to_file(void **state) {
    (void)state;
    char *paths[3] = {tmp_path("k1.h5"), tmp_path("k2.h5"), tmp_path("k3.h5")};
    char *out = tmp_path("copy.bin");
    write_two_layouts(paths);
    neox_error err = {0};
    neox_ckpt_reader *r = neox_ckpt_reader_open((const char *const *)paths, 3, &err);
    assert_non_null(r);
    assert_copy(r, "optim/flat", 0, 63, out);   // three range pieces, whole
    assert_copy(r, "optim/flat", 15, 30, out);  // across piece boundaries
    assert_copy(r, "params/w3", 0, 120, out);   // column blocks: through memory
    assert_copy(r, "params/w3", 17, 50, out);
    int fd = open(out, O_WRONLY);
    assert_int_equal(neox_ckpt_copy_range_to_fd(r, "optim/flat", 60, 4, fd, 0, &err), -1);
    assert_non_null(strstr(err.message, "outside the tensor"));
    neox_ckpt_reader_close(r);
    const char *present[2] = {paths[0], paths[2]};
    r = neox_ckpt_reader_open(present, 2, &err);
    assert_int_equal(neox_ckpt_copy_range_to_fd(r, "optim/flat", 0, 63, fd, 0, &err), -1);
    assert_non_null(strstr(err.message, "element 20 of the requested range is in no shard file"));
    neox_ckpt_reader_close(r);
    close(fd);

    // Blocks of whole rows are runs too.
    const int64_t shape[2] = {6, 4};
    char *rows[2] = {tmp_path("krows0.h5"), tmp_path("krows1.h5")};
    for (int f = 0; f < 2; f++) {
        int64_t off[2] = {3 * f, 0}, cnt[2] = {3, 4};
        float block[12];
        fill_block(2, shape, off, cnt, block);
        neox_ckpt_writer *w = neox_ckpt_writer_open(rows[f], &err);
        assert_int_equal(neox_ckpt_write_block(w, "rows", 2, shape, off, cnt, block, &err), 0);
        assert_int_equal(neox_ckpt_writer_close(w, &err), 0);
    }
    r = neox_ckpt_reader_open((const char *const *)rows, 2, &err);
    assert_copy(r, "rows", 0, 24, out);
    assert_copy(r, "rows", 5, 14, out);
    neox_ckpt_reader_close(r);
    for (int i = 0; i < 3; i++) free(paths[i]);
    free(rows[0]);
    free(rows[1]);
    free(out);
}

static void test_inconsistent_global_shapes_rejected(void **state) {
    (void)state;
    neox_error err = {0};
    char *p1 = tmp_path("s1.h5"), *p2 = tmp_path("s2.h5");
    const int64_t a[2] = {4, 4}, b[2] = {4, 8}, off[2] = {0, 0}, cnt[2] = {2, 2};
    float buf[4] = {0};
    neox_ckpt_writer *w = neox_ckpt_writer_open(p1, &err);
    assert_int_equal(neox_ckpt_write_block(w, "t", 2, a, off, cnt, buf, &err), 0);
    assert_int_equal(neox_ckpt_writer_close(w, &err), 0);
    w = neox_ckpt_writer_open(p2, &err);
    assert_int_equal(neox_ckpt_write_block(w, "t", 2, b, off, cnt, buf, &err), 0);
    assert_int_equal(neox_ckpt_writer_close(w, &err), 0);
    const char *paths[2] = {p1, p2};
    assert_null(neox_ckpt_reader_open(paths, 2, &err));
    assert_non_null(strstr(err.message, "s2.h5: 't': global shape differs from the one in "));
    free(p1);
    free(p2);
}

static void test_writer_is_atomic(void **state) {
    (void)state;
    neox_error err = {0};
    char *p = tmp_path("atomic.h5");
    struct stat st;
    neox_ckpt_writer *w = neox_ckpt_writer_open(p, &err);
    float x = 1;
    const int64_t one[1] = {1}, zero[1] = {0};
    assert_int_equal(neox_ckpt_write_block(w, "x", 1, one, zero, one, &x, &err), 0);
    assert_int_not_equal(stat(p, &st), 0);  // nothing under the final name before close
    neox_ckpt_writer_abort(w);
    assert_int_not_equal(stat(p, &st), 0);
    w = neox_ckpt_writer_open(p, &err);
    // A block that does not fit the tensor is refused before anything is written.
    const int64_t two[1] = {2};
    assert_int_equal(neox_ckpt_write_block(w, "x", 1, one, zero, two, &x, &err), -1);
    assert_non_null(strstr(err.message, "block outside the tensor"));
    assert_int_equal(neox_ckpt_writer_close(w, &err), 0);
    assert_int_equal(stat(p, &st), 0);
    free(p);
}

// The directory entries of dir other than "." and "..": how many, and the last one's name.
static int entries_of(const char *dir, char *last, size_t size) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++, snprintf(last, size, "%s", e->d_name);
    closedir(d);
    return n;
}

// HDF5 opens its file by name, so the name must lie where nobody else can swap it for a symlink
// between its creation and HDF5's open: in a fresh directory only this user may enter, holding
// the shard as a regular file; closing leaves only the shard, aborting leaves nothing.
static void test_writer_temporary_is_private(void **state) {
    (void)state;
    neox_error err = {0};
    char *dir = tmp_path("private"), name[256];
    assert_int_equal(mkdir(dir, 0777), 0);
    char *p = neox_asprintf("%s/shard.h5", dir);
    neox_ckpt_writer *w = neox_ckpt_writer_open(p, &err);
    assert_non_null(w);
    assert_int_equal(entries_of(dir, name, sizeof name), 1);
    assert_non_null(strstr(name, "shard.h5.tmp."));
    char *inner = neox_asprintf("%s/%s", dir, name), *file = neox_asprintf("%s/shard.h5", inner);
    struct stat st;
    assert_int_equal(lstat(inner, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0700);
    assert_int_equal(st.st_uid, getuid());
    assert_int_equal(lstat(file, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    neox_ckpt_writer_abort(w);
    assert_int_equal(entries_of(dir, name, sizeof name), 0);
    w = neox_ckpt_writer_open(p, &err);
    assert_non_null(w);
    assert_int_equal(neox_ckpt_writer_close(w, &err), 0);
    assert_int_equal(entries_of(dir, name, sizeof name), 1);
    assert_string_equal(name, "shard.h5");
    free(file);
    free(inner);
    free(p);
    free(dir);
}

// ---- malformed files --------------------------------------------------------------------------

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n) assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static void assert_open_fails(const char *path, const char *expect) {
    neox_error err = {0};
    const char *paths[1] = {path};
    neox_ckpt_reader *r = neox_ckpt_reader_open(paths, 1, &err);
    if (r) neox_ckpt_reader_close(r);
    if (r) fail_msg("%s opened; expected: %s", path, expect);
    assert_non_null(strstr(err.message, path));
    if (!strstr(err.message, expect)) fail_msg("message '%s' lacks '%s'", err.message, expect);
}

// A symlink planted at the temporary name a shard writer used before names became unpredictable
// ("<path>.tmp.<pid>") does not redirect the write: its target keeps its bytes.
static void test_writer_ignores_planted_symlink(void **state) {
    (void)state;
    neox_error err = {0};
    char *p = tmp_path("planted.h5"), *target = tmp_path("precious.bin");
    char *planted = neox_asprintf("%s.tmp.%ld", p, (long)getpid());
    write_bytes(target, "precious", 8);
    assert_int_equal(symlink(target, planted), 0);
    neox_ckpt_writer *w = neox_ckpt_writer_open(p, &err);
    assert_non_null(w);
    float x = 3;
    const int64_t one[1] = {1}, zero[1] = {0};
    assert_int_equal(neox_ckpt_write_block(w, "x", 1, one, zero, one, &x, &err), 0);
    assert_int_equal(neox_ckpt_writer_close(w, &err), 0);
    struct stat st;
    assert_int_equal(stat(target, &st), 0);
    assert_int_equal(st.st_size, 8);
    const char *paths[1] = {p};
    neox_ckpt_reader *r = neox_ckpt_reader_open(paths, 1, &err);
    assert_non_null(r);
    float back = 0;
    assert_int_equal(neox_ckpt_read_range(r, "x", 0, 1, &back, &err), 0);
    assert_float_equal(back, 3, 0);
    neox_ckpt_reader_close(r);
    unlink(planted);
    free(planted);
    free(target);
    free(p);
}

static void test_garbage_and_truncated_files(void **state) {
    (void)state;
    char *p = tmp_path("bad.h5");
    write_bytes(p, "", 0);
    assert_open_fails(p, "not a readable checkpoint shard");
    unsigned char noise[4096];
    srand(7);
    for (size_t i = 0; i < sizeof noise; i++) noise[i] = (unsigned char)rand();
    write_bytes(p, noise, sizeof noise);
    assert_open_fails(p, "not a readable checkpoint shard");

    // A real shard cut short at several lengths: each must fail cleanly (or, when the cut keeps
    // everything the index needs, open), never crash.
    char *good[3] = {tmp_path("t1.h5"), tmp_path("t2.h5"), tmp_path("t3.h5")};
    write_two_layouts(good);
    neox_error err = {0};
    size_t size;
    char *data = neox_read_file(good[0], &size, &err);
    assert_non_null(data);
    for (size_t cut = 8; cut < size; cut += size / 13 + 1) {
        write_bytes(p, data, cut);
        const char *paths[1] = {p};
        neox_ckpt_reader *r = neox_ckpt_reader_open(paths, 1, &err);
        if (!r) {
            assert_non_null(strstr(err.message, p));
            continue;
        }
        float buf[120];
        const int64_t off[3] = {0, 0, 0}, cnt[3] = {4, 3, 5};
        if (neox_ckpt_read_block(r, "params/w3", off, cnt, buf, &err) < 0) assert_true(strlen(err.message) > 0);
        neox_ckpt_reader_close(r);
    }
    free(data);
    for (int i = 0; i < 3; i++) free(good[i]);
    free(p);
}

// HDF5 files that are valid HDF5 but not valid shards: untagged datasets, wrong attributes.
static void test_wrong_tags_rejected(void **state) {
    (void)state;
    char *p = tmp_path("tags.h5");
    hsize_t dims[1] = {4};
    float data[4] = {0};
    hid_t file = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t space = H5Screate_simple(1, dims, NULL);
    hid_t dset = H5Dcreate2(file, "untagged", H5T_NATIVE_FLOAT, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(dset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
    H5Dclose(dset);
    H5Sclose(space);
    H5Fclose(file);
    assert_open_fails(p, "dataset 'untagged' has no valid 'neox_piece' attribute");

    // A block whose offset puts it outside its global shape.
    neox_error err = {0};
    neox_ckpt_writer *w = neox_ckpt_writer_open(p, &err);
    const int64_t shape[1] = {4}, off[1] = {0}, cnt[1] = {4};
    assert_int_equal(neox_ckpt_write_block(w, "v", 1, shape, off, cnt, data, &err), 0);
    assert_int_equal(neox_ckpt_writer_close(w, &err), 0);
    file = H5Fopen(p, H5F_ACC_RDWR, H5P_DEFAULT);
    dset = H5Dopen2(file, "v", H5P_DEFAULT);
    hid_t attr = H5Aopen(dset, "offset", H5P_DEFAULT);
    int64_t bad = 3;
    H5Awrite(attr, H5T_NATIVE_INT64, &bad);
    H5Aclose(attr);
    H5Dclose(dset);
    H5Fclose(file);
    assert_open_fails(p, "'v': block outside global_shape in dimension 0");
    free(p);
}

// Extents and shapes a small file cannot hold: a byte string claiming 2 GB with no storage
// written, and a global shape far beyond its pieces, are refused at open, before any allocation.
static void test_claims_beyond_the_file_rejected(void **state) {
    (void)state;
    char *p = tmp_path("claims.h5");
    hsize_t dims[1] = {(hsize_t)2 << 30};
    hid_t file = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t space = H5Screate_simple(1, dims, NULL);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hid_t dset = H5Dcreate2(file, "state/train.json", H5T_NATIVE_UCHAR, space, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    H5Pclose(lcpl);
    hid_t type = H5Tcopy(H5T_C_S1), scalar = H5Screate(H5S_SCALAR);
    H5Tset_size(type, 5);
    hid_t attr = H5Acreate2(dset, "neox_piece", type, scalar, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(attr, type, "bytes");
    H5Aclose(attr);
    H5Sclose(scalar);
    H5Tclose(type);
    H5Dclose(dset);
    H5Sclose(space);
    H5Fclose(file);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_true(st.st_size < 16384);
    assert_open_fails(p, "dataset 'state/train.json' claims 2147483648 elements but the file stores 0 bytes of it");

    neox_error err = {0};
    float data[4] = {1, 2, 3, 4};
    neox_ckpt_writer *w = neox_ckpt_writer_open(p, &err);
    const int64_t shape[2] = {(int64_t)1 << 32, 4}, off[2] = {0, 0}, cnt[2] = {1, 4};
    assert_int_equal(neox_ckpt_write_block(w, "params/embed", 2, shape, off, cnt, data, &err), 0);
    assert_int_equal(neox_ckpt_writer_close(w, &err), 0);
    assert_open_fails(p, "tensor 'params/embed' claims 17179869184 elements, more than the shards store in all (16 bytes)");

    // Beyond 2^48 elements (where byte counts would near int64_t) the shape itself is refused.
    w = neox_ckpt_writer_open(p, &err);
    const int64_t huge[3] = {(int64_t)1 << 20, (int64_t)1 << 20, (int64_t)1 << 20}, off3[3] = {0}, cnt3[3] = {1, 1, 4};
    assert_int_equal(neox_ckpt_write_block(w, "params/huge", 3, huge, off3, cnt3, data, &err), 0);
    assert_int_equal(neox_ckpt_writer_close(w, &err), 0);
    assert_open_fails(p, "'params/huge': global_shape is negative or has more than 281474976710656 elements");
    free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_any_region_reads_back),
        cmocka_unit_test(test_row_blocks),
        cmocka_unit_test(test_missing_shard_is_named),
        cmocka_unit_test(test_copy_range_to_file),
        cmocka_unit_test(test_inconsistent_global_shapes_rejected),
        cmocka_unit_test(test_writer_is_atomic),
        cmocka_unit_test(test_writer_ignores_planted_symlink),
        cmocka_unit_test(test_writer_temporary_is_private),
        cmocka_unit_test(test_garbage_and_truncated_files),
        cmocka_unit_test(test_wrong_tags_rejected),
        cmocka_unit_test(test_claims_beyond_the_file_rejected),
    };
    return cmocka_run_group_tests_name("ckpt", tests, make_tmpdir, remove_tmpdir);
}
