// test_ckpt_dir.c: checkpoint directories: manifest round trip and validation, checksums, the
// atomic `latest` marker and pruning to keep_last_n_checkpoints; a shard's manifest entry as its
// writer computes it while writing, against zlib's CRC-32 of the finished file.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "unit_util.h"
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "checkpoint.h"
#include "ckpt.h"
#include "ckpt/shard_crc.h"


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
    assert_int_equal(neox_file_crc32(shard, &files[1].bytes, &files[1].crc32, &err), 0);
    assert_int_equal(files[1].bytes, 11);
    assert_int_equal(files[1].crc32, (uint32_t)crc32(0, (const Bytef *)"shard bytes", 11));  // zlib as oracle

    neox_ckpt_manifest m = {.iteration = 40, .world_size = 2, .pipe_size = 1, .data_size = 2, .model_size = 1,
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
    // (2^62 + 1) x 4 wraps around int64 to 4: refused, not taken as a 4-rank layout.
    const char *wraps = "{\"format\": \"neox.c checkpoint\", \"version\": 1, \"iteration\": 3, \"layout\": "
                        "{\"world_size\": 4, \"pipe_parallel_size\": 4611686018427387905, \"data_parallel_size\": 4, "
                        "\"model_parallel_size\": 1, \"zero_stage\": 0}, \"files\": []}";
    assert_manifest_rejected(wraps, "world_size 4 is not pipe x data x model (4611686018427387905 x 4 x 1)");
    const char *huge = "{\"format\": \"neox.c checkpoint\", \"version\": 1, \"iteration\": 3, \"layout\": "
                       "{\"world_size\": 33554432, \"pipe_parallel_size\": 1, \"data_parallel_size\": 33554432, "
                       "\"model_parallel_size\": 1, \"zero_stage\": 0}, \"files\": []}";
    assert_manifest_rejected(huge, "or above 16777216 ranks");
    const char *escape = "{\"format\": \"neox.c checkpoint\", \"version\": 1, \"iteration\": 3, \"layout\": "
                         "{\"world_size\": 1, \"pipe_parallel_size\": 1, \"data_parallel_size\": 1, "
                         "\"model_parallel_size\": 1, \"zero_stage\": 0}, \"files\": [{\"name\": \"../x\", "
                         "\"rank\": 0, \"bytes\": 1, \"crc32\": \"0000000a\"}]}";
    assert_manifest_rejected(escape, "files[0] needs a plain 'name'");
    // A layout of more ranks than the files listed, a rank listed twice, a rank outside the layout.
    const char *head = "{\"format\": \"neox.c checkpoint\", \"version\": 1, \"iteration\": 3, \"layout\": "
                       "{\"world_size\": 2, \"pipe_parallel_size\": 1, \"data_parallel_size\": 1, "
                       "\"model_parallel_size\": 2, \"zero_stage\": 0}, \"files\": [";
    const char *entry = "{\"name\": \"rank_%05d.h5\", \"rank\": %d, \"bytes\": 1, \"crc32\": \"0000000a\"}";
    char *one = neox_asprintf(entry, 0, 0), *dup = neox_asprintf(entry, 1, 0), *far = neox_asprintf(entry, 7, 7);
    char *text = neox_asprintf("%s%s]}", head, one);
    assert_manifest_rejected(text, "world_size is 2 but no shard file of rank 1 is listed");
    free(text);
    text = neox_asprintf("%s%s, %s]}", head, one, dup);
    assert_manifest_rejected(text, "rank 0 is listed twice");
    free(text);
    text = neox_asprintf("%s%s, %s]}", head, one, far);
    assert_manifest_rejected(text, "files[1] has rank 7, outside world_size 2");
    free(text);
    free(one);
    free(dup);
    free(far);
    assert_manifest_rejected("{\"format\": \"neox.c checkpoint\", \"version\": 1, \"iteration\": -5}",
                             "'iteration' is missing or not an integer >= 0");
}

// The run state check (lib/checkpoint/run_state.c) on a state as the trainer writes it, then with one
// field spoiled at a time: each is refused naming the field.
static const char good_state[] =
    "{\"config_files\": [\"config/input/0-model.yml\"], \"dropout_rows\": 6, \"iteration\": 6,"
    " \"loss_scaler\": {\"hysteresis_left\": 1, \"iteration\": 0, \"last_overflow\": -1, \"scale\": 1.0},"
    " \"lr_schedule\": {\"decay_iters\": 6, \"lr\": 0.003, \"min_lr\": 0.0, \"num_iters\": 6, \"style\": \"linear\","
    " \"warmup_iters\": 0.06}, \"model\": {\"activation\": 0, \"hidden_size\": 32, \"intermediate_size\": 128,"
    " \"num_attention_heads\": 4, \"num_kv_heads\": 4, \"num_layers\": 2, \"padded_vocab_size\": 512, \"norm\": 0},"
    " \"nonfinite_in_a_row\": 0, \"optimizer\": \"adam\", \"optimizer_steps\": 6, \"overflow_skips\": 0,"
    " \"seed\": 1234, \"skipped_total\": 0, \"train_position\": 6, \"train_samples\": 24, \"valid_position\": 0}";

static void expect_state_error(const char *object, const char *key, json_t *value, const char *message) {
    json_t *state = json_loads(good_state, 0, NULL);
    assert_non_null(state);
    json_t *where = object ? json_object_get(state, object) : state;
    if (value) json_object_set_new(where, key, value);
    else json_object_del(where, key);
    neox_error err = {0};
    assert_int_equal(neox_ckpt_check_run_state(state, "ck: state/train.json", &err), -1);
    if (!strstr(err.message, message)) fail_msg("'%s' lacks '%s'", err.message, message);
    json_decref(state);
}

static void test_run_state_fields_checked(void **state) {
    (void)state;
    json_t *good = json_loads(good_state, 0, NULL);
    neox_error err = {0};
    if (neox_ckpt_check_run_state(good, "ck: state/train.json", &err) != 0) fail_msg("%s", err.message);
    json_decref(good);
    expect_state_error(NULL, "optimizer_steps", json_integer(-1), "ck: state/train.json: optimizer_steps = -1 must be >= 0");
    expect_state_error(NULL, "seed", json_string("1234"), "seed must be an integer");
    expect_state_error(NULL, "iteration", NULL, "iteration is missing");  // seed may be absent (no_save_rng)
    expect_state_error(NULL, "train_position", json_real(6.0), "train_position must be an integer");
    expect_state_error(NULL, "optimizer", json_string("rmsprop"), "optimizer 'rmsprop' is not one this version writes");
    expect_state_error(NULL, "config_files", json_array(), "config_files is empty");
    expect_state_error(NULL, "config_files", json_pack("[i]", 3), "config_files[0] must be a string");
    expect_state_error(NULL, "lr_schedule", json_string("cosine"), "lr_schedule must be an object");
    expect_state_error("lr_schedule", "lr", json_real(-0.5), "lr_schedule.lr = -0.5 must be >= 0");
    expect_state_error("lr_schedule", "style", json_string("zigzag"), "lr_schedule.style 'zigzag'");
    expect_state_error("loss_scaler", "last_overflow", json_integer(-2), "loss_scaler.last_overflow = -2 must be >= -1");
    expect_state_error("model", "hidden_size", json_integer(0), "model.hidden_size = 0 must be >= 1");
    expect_state_error("model", "norm", json_integer(-3), "model.norm must be an integer in [0, 2^30]");
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

// The oracle: zlib's CRC-32 over the whole file, read here with stdio.
static void file_crc(const char *path, uint64_t *bytes, uint32_t *crc) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    unsigned char buf[4096];
    uLong c = crc32(0L, Z_NULL, 0);
    size_t n;
    *bytes = 0;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) c = crc32(c, buf, (uInt)n), *bytes += n;
    fclose(f);
    *crc = (uint32_t)c;
}

// Pieces of every kind and size, many small ones among them (HDF5 interleaves their metadata with
// the data), an empty one, and a block above the size at which writeback starts early.
static void write_varied_shard(neox_ckpt_writer *w) {
    neox_error err = {0};
    int64_t n = 1 << 20;
    float *data = neox_malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) data[i] = (float)i * 0.25f - 7.0f;
    int64_t big[2] = {1024, 1024}, off[2] = {0, 0}, cnt[2] = {1024, 1024};
    assert_int_equal(neox_ckpt_write_block(w, "params/big", 2, big, off, cnt, data, &err), 0);
    int64_t shape[2] = {300, 257}, boff[2] = {100, 3}, bcnt[2] = {50, 200};
    assert_int_equal(neox_ckpt_write_block(w, "params/block", 2, shape, boff, bcnt, data + 5, &err), 0);
    int64_t empty[2] = {0, 0};
    assert_int_equal(neox_ckpt_write_block(w, "params/empty", 2, shape, off, empty, data, &err), 0);
    for (int i = 0; i < 600; i++) {
        char name[64];
        snprintf(name, sizeof name, "optimizer/exp_avg/t%d", i);
        int64_t len = 1 + i % 37, vshape[1] = {1000};
        assert_int_equal(neox_ckpt_write_range(w, name, 1, vshape, i % 900, len, data + i, &err), 0);
    }
    assert_int_equal(neox_ckpt_write_bytes(w, "state/train.json", "{\"iteration\": 7}", 17, &err), 0);
    free(data);
}

static void test_writer_entry_equals_file_crc(void **state) {
    (void)state;
    neox_error err = {0};
    char *path = tmp_path("entry.h5");
    neox_ckpt_writer *w = neox_ckpt_writer_open(path, &err);
    assert_non_null(w);
    write_varied_shard(w);
    neox_ckpt_file_entry e = {.name = "kept", .rank = 3};
    assert_int_equal(neox_ckpt_writer_close_entry(w, &e, &err), 0);
    uint64_t bytes;
    uint32_t crc;
    file_crc(path, &bytes, &crc);
    assert_true(bytes > (4u << 20));
    assert_int_equal(e.bytes, bytes);
    assert_int_equal(e.crc32, crc);
    assert_string_equal(e.name, "kept");
    assert_int_equal(e.rank, 3);
    free(path);
}

// Extents are trusted where they fit the file (a wrong CRC shows that they are not re-read); an
// overlap or an extent past the end makes the whole file be read instead.
static void test_extents_and_fallback(void **state) {
    (void)state;
    neox_error err = {0};
    char *path = tmp_path("extents.bin");
    const char *text = "0123456789abcdefghij";
    write_text(path, text);
    uint64_t bytes;
    uint32_t crc;
    file_crc(path, &bytes, &crc);
    neox_ckpt_file_entry e;
    neox_crc_extents x = {0};
    neox_crc_extents_add(&x, 12, text + 12, 5);
    neox_crc_extents_add(&x, 2, text + 2, 4);
    assert_int_equal(neox_crc_extents_file(&x, path, &e, &err), 0);
    assert_int_equal(e.bytes, 20);
    assert_int_equal(e.crc32, crc);
    neox_crc_extents_add(&x, 7, "XY", 2);  // bytes the file does not hold there
    assert_int_equal(neox_crc_extents_file(&x, path, &e, &err), 0);
    assert_int_not_equal(e.crc32, crc);
    neox_crc_extents_free(&x);
    const uint64_t bad[][2] = {{3, 5}, {18, 4}};  // overlapping {2,4}; past the end
    for (int i = 0; i < 2; i++) {
        neox_crc_extents_add(&x, 2, "??", 2);
        neox_crc_extents_add(&x, bad[i][0], "????", bad[i][1]);
        e.crc32 = 0;
        assert_int_equal(neox_crc_extents_file(&x, path, &e, &err), 0);
        assert_int_equal(e.crc32, crc);
        neox_crc_extents_free(&x);
    }
    free(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_manifest_round_trip),
        cmocka_unit_test(test_bad_manifests),
        cmocka_unit_test(test_run_state_fields_checked),
        cmocka_unit_test(test_latest_and_pruning),
        cmocka_unit_test(test_writer_entry_equals_file_crc),
        cmocka_unit_test(test_extents_and_fallback),
    };
    return cmocka_run_group_tests_name("ckpt_dir", tests, make_tmpdir, remove_tmpdir);
}
