// test_ckpt_dir.c: checkpoint directories: manifest round trip and validation, checksums, the
// atomic `latest` marker and pruning to keep_last_n_checkpoints.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "unit_util.h"
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "ckpt.h"


static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static void test_manifest_round_trip(void **state) {
    (void)state;
    neox_error err = {0};
    assert_int_equal(neox_ckpt_make_dir(tmpdir, 40, &err), 0);
    assert_int_equal(neox_ckpt_make_dir(tmpdir, 40, &err), 0);  // existing is fine
    char *dir = neox_ckpt_dir(tmpdir, 40);
    char *shard = neox_asprintf("%s/rank_00001.h5", dir);
    write_text(shard, "shard bytes");
    neox_ckpt_file_entry files[2] = {{.rank = 0}, {.rank = 1}};
    neox_ckpt_shard_name(0, files[0].name, sizeof files[0].name);
    assert_string_equal(files[0].name, "rank_00000.h5");
    neox_ckpt_shard_name(1, files[1].name, sizeof files[1].name);
    assert_int_equal(neox_ckpt_file_checksum(shard, &files[1], &err), 0);
    assert_int_equal(files[1].bytes, 11);
    assert_int_equal(files[1].crc32, (uint32_t)crc32(0, (const Bytef *)"shard bytes", 11));  // zlib as oracle

    neox_ckpt_manifest m = {.iteration = 40, .world_size = 4, .pipe_size = 1, .data_size = 2, .model_size = 2,
                            .zero_stage = 1, .nfiles = 2, .files = files};
    assert_int_equal(neox_ckpt_manifest_write(dir, &m, &err), 0);
    neox_ckpt_manifest back;
    assert_int_equal(neox_ckpt_manifest_read(dir, &back, &err), 0);
    assert_int_equal(back.iteration, 40);
    assert_int_equal(back.data_size, 2);
    assert_int_equal(back.zero_stage, 1);
    assert_int_equal(back.nfiles, 2);
    assert_string_equal(back.files[1].name, "rank_00001.h5");
    assert_int_equal(back.files[1].crc32, files[1].crc32);
    assert_int_equal(back.files[1].bytes, 11);
    neox_ckpt_manifest_free(&back);
    free(shard);
    free(dir);
}

static void assert_manifest_rejected(const char *text, const char *expect) {
    neox_error err = {0};
    char *dir = neox_asprintf("%s/bad", tmpdir);
    mkdir(dir, 0777);
    char *path = neox_asprintf("%s/manifest.json", dir);
    write_text(path, text);
    neox_ckpt_manifest m;
    assert_int_equal(neox_ckpt_manifest_read(dir, &m, &err), -1);
    if (!strstr(err.message, expect)) fail_msg("'%s' lacks '%s'", err.message, expect);
    assert_non_null(strstr(err.message, "manifest.json"));
    free(path);
    free(dir);
}

static void test_bad_manifests(void **state) {
    (void)state;
    neox_error err = {0};
    neox_ckpt_manifest m;
    char *missing = neox_asprintf("%s/nowhere", tmpdir);
    assert_int_equal(neox_ckpt_manifest_read(missing, &m, &err), -1);
    assert_non_null(strstr(err.message, "the checkpoint is incomplete"));
    free(missing);
    assert_manifest_rejected("{\"format\": \"neox.c checkpoint\", \"version\": 1,", "manifest.json:1:");
    assert_manifest_rejected("[1, 2]", "not a neox.c checkpoint manifest");
    assert_manifest_rejected("{\"format\": \"neox.c checkpoint\", \"version\": 9, \"iteration\": 1}", "version 9 is not supported");
    const char *layout = "{\"format\": \"neox.c checkpoint\", \"version\": 1, \"iteration\": 3, \"layout\": "
                         "{\"world_size\": 4, \"pipe_parallel_size\": 1, \"data_parallel_size\": 3, "
                         "\"model_parallel_size\": 1, \"zero_stage\": 0}, \"files\": []}";
    assert_manifest_rejected(layout, "world_size 4 is not pipe x data x model");
    const char *escape = "{\"format\": \"neox.c checkpoint\", \"version\": 1, \"iteration\": 3, \"layout\": "
                         "{\"world_size\": 1, \"pipe_parallel_size\": 1, \"data_parallel_size\": 1, "
                         "\"model_parallel_size\": 1, \"zero_stage\": 0}, \"files\": [{\"name\": \"../x\", "
                         "\"rank\": 0, \"bytes\": 1, \"crc32\": \"0000000a\"}]}";
    assert_manifest_rejected(escape, "files[0] needs a plain 'name'");
    assert_manifest_rejected("{\"format\": \"neox.c checkpoint\", \"version\": 1, \"iteration\": -5}",
                             "'iteration' is missing or not an integer >= 0");
}

static void test_latest_and_pruning(void **state) {
    (void)state;
    neox_error err = {0};
    int64_t it;
    int found;
    char *fresh = neox_asprintf("%s/fresh", tmpdir);
    assert_int_equal(neox_ckpt_read_latest(fresh, &it, &found, &err), 0);  // nothing to resume
    assert_int_equal(found, 0);
    mkdir(fresh, 0777);
    int64_t steps[] = {10, 20, 100, 30};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(neox_ckpt_make_dir(fresh, steps[i], &err), 0);
        char *dir = neox_ckpt_dir(fresh, steps[i]), *f = neox_asprintf("%s/rank_00000.h5", dir);
        write_text(f, "x");
        free(f);
        free(dir);
    }
    // Marking 30 with keep 2 keeps 20 and 30, removes 10, and leaves the newer 100 alone.
    assert_int_equal(neox_ckpt_mark_latest(fresh, 30, 2, &err), 0);
    assert_int_equal(neox_ckpt_read_latest(fresh, &it, &found, &err), 0);
    assert_int_equal(found, 1);
    assert_int_equal(it, 30);
    char *d10 = neox_ckpt_dir(fresh, 10), *d20 = neox_ckpt_dir(fresh, 20), *d30 = neox_ckpt_dir(fresh, 30),
         *d100 = neox_ckpt_dir(fresh, 100);
    assert_false(exists(d10));
    assert_true(exists(d20) && exists(d30) && exists(d100));
    char *latest = neox_asprintf("%s/latest", fresh);
    write_text(latest, "global_stepX\n");
    assert_int_equal(neox_ckpt_read_latest(fresh, &it, &found, &err), -1);
    assert_non_null(strstr(err.message, "expected 'global_stepN', found 'global_stepX"));
    free(latest);
    free(d10), free(d20), free(d30), free(d100);
    free(fresh);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_manifest_round_trip),
        cmocka_unit_test(test_bad_manifests),
        cmocka_unit_test(test_latest_and_pruning),
    };
    return cmocka_run_group_tests_name("ckpt_dir", tests, make_tmpdir, remove_tmpdir);
}
