// test_metrics.c: unit tests of lib/metrics: CRC32C (RFC 3720 vectors), protobuf wire encoding,
// TFRecord framing of event files, GPT-NeoX's FLOPs formula, the log/timer/eval line formats, the
// interval accounting (skipped and nan steps) with a fake clock, and the error paths.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "unit_util.h"
#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "metrics.h"
#include "metrics/internal.h"


// ---- CRC32C -----------------------------------------------------------------------------------

// RFC 3720 (iSCSI) appendix B.4 test vectors, plus the common "123456789" check value.
static void test_crc32c_rfc3720_vectors(void **state) {
    (void)state;
    uint8_t buf[32];
    memset(buf, 0x00, sizeof buf);
    assert_int_equal(neox_crc32c(buf, 32), 0x8A9136AA);
    memset(buf, 0xFF, sizeof buf);
    assert_int_equal(neox_crc32c(buf, 32), 0x62A8AB43);
    for (int i = 0; i < 32; i++) buf[i] = (uint8_t)i;
    assert_int_equal(neox_crc32c(buf, 32), 0x46DD794E);
    for (int i = 0; i < 32; i++) buf[i] = (uint8_t)(31 - i);
    assert_int_equal(neox_crc32c(buf, 32), 0x113FDB5C);
    static const uint8_t iscsi_read[48] = {
        0x01, 0xC0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18,
        0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    };
    assert_int_equal(neox_crc32c(iscsi_read, sizeof iscsi_read), 0xD9963A56);
    assert_int_equal(neox_crc32c("123456789", 9), 0xE3069283);
    assert_int_equal(neox_crc32c("", 0), 0x00000000);
}

static void test_crc32c_masked(void **state) {
    (void)state;
    // ((0xE3069283 >> 15) | (0xE3069283 << 17)) + 0xa282ead8, mod 2^32
    assert_int_equal(neox_crc32c_masked("123456789", 9), 0xC78AB0E5);
}

// ---- protobuf ---------------------------------------------------------------------------------

static void assert_varint(uint64_t v, const char *hex) {
    uint8_t out[10];
    size_t n = neox_pb_varint_encode(v, out);
    char got[32] = "";
    for (size_t i = 0; i < n; i++) snprintf(got + 2 * i, sizeof got - 2 * i, "%02x", out[i]);
    assert_string_equal(got, hex);
}

static void test_varint_encoding(void **state) {
    (void)state;
    assert_varint(0, "00");
    assert_varint(1, "01");
    assert_varint(127, "7f");
    assert_varint(128, "8001");
    assert_varint(150, "9601");     // the protobuf documentation's example
    assert_varint(300, "ac02");
    assert_varint(16384, "808001");
    assert_varint(UINT32_MAX, "ffffffff0f");
    assert_varint(UINT64_MAX, "ffffffffffffffffff01");
}

static void assert_pb(const neox_pb *b, const uint8_t *want, size_t n) {
    assert_int_equal(b->len, n);
    assert_memory_equal(b->data, want, n);
}

static void test_protobuf_fields(void **state) {
    (void)state;
    neox_pb b = {0};
    neox_pb_double_field(&b, 1, 1.0);
    assert_pb(&b, (const uint8_t[]){0x09, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f}, 9);
    b.len = 0;
    neox_pb_float_field(&b, 2, 1.0f);
    assert_pb(&b, (const uint8_t[]){0x15, 0, 0, 0x80, 0x3f}, 5);
    b.len = 0;
    neox_pb_int64_field(&b, 2, 150);
    assert_pb(&b, (const uint8_t[]){0x10, 0x96, 0x01}, 3);
    b.len = 0;
    neox_pb_int64_field(&b, 2, -1);   // int64: ten bytes of two's complement
    assert_pb(&b, (const uint8_t[]){0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, 11);
    b.len = 0;
    neox_pb_bytes_field(&b, 3, "brain.Event:2", 13);
    assert_int_equal(b.len, 15);
    assert_int_equal(b.data[0], 0x1a);
    assert_int_equal(b.data[1], 13);
    assert_memory_equal(b.data + 2, "brain.Event:2", 13);
    b.len = 0;
    neox_pb_key(&b, 16, NEOX_PB_BYTES);   // field numbers >= 16 need a two-byte key
    assert_pb(&b, (const uint8_t[]){0x82, 0x01}, 2);
    neox_pb_free(&b);
}

// ---- TensorBoard event file framing ------------------------------------------------------------

static char *only_event_file(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    char *found = NULL;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strncmp(e->d_name, "events.out.tfevents.", 20) == 0) {
            assert_null(found);
            found = neox_asprintf("%s/%s", dir, e->d_name);
        }
    closedir(d);
    assert_non_null(found);
    return found;
}

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static uint32_t le32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

static void test_event_file_framing(void **state) {
    (void)state;
    neox_error err = {0};
    char *dir = neox_asprintf("%s/tb/run", tmpdir);   // parents are created
    neox_tb_writer *w = neox_tb_open(dir, &err);
    assert_non_null(w);
    assert_int_equal(neox_tb_scalar(w, "train/lm_loss", 7, 2.5, 1700000000.0, &err), 0);
    assert_int_equal(neox_tb_close(w, &err), 0);
    char *path = only_event_file(dir);
    size_t size = 0;
    uint8_t *data = (uint8_t *)neox_read_file(path, &size, &err);
    assert_non_null(data);
    size_t pos = 0;
    int records = 0;
    const uint8_t *last = NULL;
    size_t last_len = 0;
    while (pos < size) {
        assert_true(pos + 12 <= size);
        uint64_t len = le64(data + pos);
        assert_int_equal(le32(data + pos + 8), neox_crc32c_masked(data + pos, 8));
        assert_true(pos + 16 + len <= size);
        assert_int_equal(le32(data + pos + 12 + len), neox_crc32c_masked(data + pos + 12, len));
        last = data + pos + 12;
        last_len = len;
        if (records == 0) {   // wall_time (tag 0x09, 8 bytes) then file_version (tag 0x1a)
            assert_int_equal(last[0], 0x09);
            assert_int_equal(last[9], 0x1a);
            assert_memory_equal(last + 11, "brain.Event:2", 13);
        }
        pos += 16 + len;
        records++;
    }
    assert_int_equal(records, 2);
    // Event{wall_time=1.7e9, step=7, summary{value{tag="train/lm_loss", simple_value=2.5f}}}
    static const uint8_t want[] = {
        0x09, 0x00, 0x00, 0x00, 0x40, 0xfc, 0x54, 0xd9, 0x41,   // 1700000000.0 as double
        0x10, 0x07,                                             // step 7
        0x2a, 0x16,                                             // summary, 22 bytes
        0x0a, 0x14,                                             //   value, 20 bytes
        0x0a, 0x0d, 't', 'r', 'a', 'i', 'n', '/', 'l', 'm', '_', 'l', 'o', 's', 's',
        0x15, 0x00, 0x00, 0x20, 0x40,                           //     simple_value 2.5f
    };
    assert_int_equal(last_len, sizeof want);
    assert_memory_equal(last, want, sizeof want);
    free(data);
    free(path);
    free(dir);
}

static void test_event_dir_error_names_path(void **state) {
    (void)state;
    neox_error err = {0};
    char *file = neox_asprintf("%s/plain-file", tmpdir);
    assert_int_equal(neox_atomic_write(file, "x", 1, &err), 0);
    char *dir = neox_asprintf("%s/sub", file);
    assert_null(neox_tb_open(dir, &err));
    assert_int_equal(err.status, NEOX_EXIT_FAILURE);
    assert_non_null(strstr(err.message, "plain-file"));
    neox_error_clear(&err);
    assert_null(neox_jsonl_open(dir, &err));   // a file below a regular file cannot be opened
    assert_non_null(strstr(err.message, "plain-file"));
    free(dir);
    free(file);
}

// ---- FLOPs ------------------------------------------------------------------------------------

static void test_flops_formula(void **state) {
    (void)state;
    // 24 * 3 * 4 * 32 * 2 * 64^2 * (1 + 32/384 + 128/2048) = 86507520, by hand
    neox_flops_model m = {.num_layers = 2, .hidden_size = 64, .padded_vocab_size = 128, .seq_length = 32,
                          .train_batch_size = 4, .checkpoint_activations = 0};
    assert_true(fabs(neox_flops_per_iteration(&m) - 86507520.0) < 1e-6);
    m.checkpoint_activations = 1;   // four passes instead of three
    assert_true(fabs(neox_flops_per_iteration(&m) - 115343360.0) < 1e-6);
    m.num_layers = 0;
    assert_true(neox_flops_per_iteration(&m) == 0.0);
}

static void test_format_flops(void **state) {
    (void)state;
    char buf[32];
    assert_string_equal(neox_format_flops(0.0, buf, sizeof buf), "0.0");
    assert_string_equal(neox_format_flops(999.0, buf, sizeof buf), "999.0");
    assert_string_equal(neox_format_flops(1234.0, buf, sizeof buf), "1.2KFLOPS");
    assert_string_equal(neox_format_flops(123.45e12, buf, sizeof buf), "123.5TFLOPS");
    assert_string_equal(neox_format_flops(2.0e24, buf, sizeof buf), "2.0Yi");
}

// ---- lines ------------------------------------------------------------------------------------

static void test_train_line_format(void **state) {
    (void)state;
    neox_train_summary s = {
        .iteration = 100, .train_iters = 320000, .iterations = 100, .iteration_time = 0.12345,
        .samples_per_sec = 259.2, .tokens_per_sec = 530841.6, .flops_per_sec_per_device = 1.5e14,
        .mfu = 0.4807, .learning_rate = 6e-4, .lm_loss = 7.123456789, .grad_norm = 1.25,
        .loss_scale = 65536.0, .fp16 = 1, .skipped = 2, .nan = 1,
    };
    char line[1024];
    neox_format_train_line(&s, line, sizeof line);
    assert_string_equal(line,
        " samples/sec: 259.200 | tokens/sec: 530841.6 | iteration      100/  320000 |"
        " elapsed time per iteration (ms): 123.5 | learning rate: 6.000E-04 |"
        " approx flops per GPU: 150.0TFLOPS | MFU: 48.07% | lm_loss: 7.123457E+00 |"
        " loss scale: 65536.0 | grad norm: 1.250 | number of skipped iterations:   2 |"
        " number of nan iterations:   1 |");
    // Without fp16, peak FLOP/s, FLOPs and a grad norm those fields are left out.
    s.fp16 = 0;
    s.mfu = -1;
    s.flops_per_sec_per_device = -1;
    s.grad_norm = NAN;
    neox_format_train_line(&s, line, sizeof line);
    assert_string_equal(line,
        " samples/sec: 259.200 | tokens/sec: 530841.6 | iteration      100/  320000 |"
        " elapsed time per iteration (ms): 123.5 | learning rate: 6.000E-04 | lm_loss: 7.123457E+00 |"
        " number of skipped iterations:   2 | number of nan iterations:   1 |");
    // log_param_norm adds the norm of all parameters after the grad norm's place.
    s.has_param_norm = 1;
    s.param_norm = 12.3456;
    neox_format_train_line(&s, line, sizeof line);
    assert_non_null(strstr(line, " lm_loss: 7.123457E+00 | param norm: 12.346 | number of skipped"));
    // A NaN with its sign bit set (as 0 * inf and inf - inf give on x86) prints as nan, not -nan.
    s.lm_loss = -NAN;
    s.grad_norm = -NAN;
    s.nonfinite = 1;
    neox_format_train_line(&s, line, sizeof line);
    assert_non_null(strstr(line, " lm_loss: NAN | grad norm: nan | param norm"));
    // A short buffer truncates without overrunning.
    char small[20];
    neox_format_train_line(&s, small, sizeof small);
    assert_int_equal(strlen(small), sizeof small - 1);
}

static void test_timer_line_format(void **state) {
    (void)state;
    neox_timer timers[NEOX_TIMER_COUNT];
    for (int t = 0; t < NEOX_TIMER_COUNT; t++) neox_timer_reset(&timers[t]);
    char line[512];
    assert_int_equal(neox_format_timer_line(timers, 10, line, sizeof line), 0);
    assert_string_equal(line, "");
    timers[NEOX_TIMER_FORWARD].elapsed = 1.0;
    timers[NEOX_TIMER_FORWARD].count = 10;
    timers[NEOX_TIMER_OPTIMIZER].elapsed = 0.05;
    timers[NEOX_TIMER_OPTIMIZER].count = 10;
    timers[NEOX_TIMER_BATCH_GENERATOR].elapsed = 0.0123;
    timers[NEOX_TIMER_BATCH_GENERATOR].count = 10;
    assert_int_equal(neox_format_timer_line(timers, 10, line, sizeof line), 3);
    assert_string_equal(line, "time (ms) | forward: 100.00 | optimizer: 5.00 | batch generator: 1.23");
    assert_string_equal(neox_timer_label(NEOX_TIMER_BACKWARD_ALLREDUCE), "backward-allreduce");
}

static void test_eval_line_format(void **state) {
    (void)state;
    char line[512];
    neox_format_eval_line("validation", "iteration 1000", 2.0, line, sizeof line);
    assert_string_equal(line, " validation results at iteration 1000 | lm_loss value: 2.000000E+00 |"
                              " lm_loss_ppl value: 7.389056E+00 | ");
    // More results follow in order, in the same form (char_level_ppl, eval_tasks).
    neox_eval_value more[2] = {{"lm_loss_char_lvl_ppl", 1.5}, {"piqa_acc,none", 0.25}};
    neox_format_eval_line_values("validation", "iteration 1000", 2.0, more, 2, line, sizeof line);
    assert_string_equal(line, " validation results at iteration 1000 | lm_loss value: 2.000000E+00 |"
                              " lm_loss_ppl value: 7.389056E+00 | lm_loss_char_lvl_ppl value: 1.500000E+00 |"
                              " piqa_acc,none value: 2.500000E-01 | ");
}

// ---- the metrics object -----------------------------------------------------------------------

static double fake_time;
static double fake_clock(void) { return fake_time; }

// Runs the steps with the lines going to a memory stream; *text stays valid until o->out is closed
// (then the caller frees it).
static void run_steps(neox_metrics_options *o, const neox_step_stats *steps, int n, double seconds_per_step,
                      neox_metrics **out_m, char **text, size_t *size) {
    o->out = open_memstream(text, size);
    o->clock = fake_clock;
    fake_time = 100.0;
    neox_error err = {0};
    neox_metrics *m = neox_metrics_open(o, &err);
    assert_non_null(m);
    neox_metrics_begin(m);
    for (int i = 0; i < n; i++) {
        fake_time += seconds_per_step;
        assert_int_equal(neox_metrics_step(m, &steps[i], &err), 0);
    }
    *out_m = m;
    fflush(o->out);
}

static void test_interval_accounting(void **state) {
    (void)state;
    neox_metrics_options o = {.rank = 0, .world_size = 2, .train_iters = 8, .log_interval = 4,
                              .train_batch_size = 8, .seq_length = 16, .flops_per_iteration = 1e12,
                              .peak_flops_per_device = 4e12};
    neox_step_stats steps[8];
    for (int i = 0; i < 8; i++)
        steps[i] = (neox_step_stats){.iteration = i + 1, .lm_loss = 4.0 + i, .learning_rate = 1e-4 * (i + 1),
                                     .grad_norm = NAN};
    steps[5].skipped = 1;                 // skipped, loss finite: skipped but not nan
    steps[6].skipped = 1;
    steps[6].lm_loss = INFINITY;          // skipped with a non-finite loss: also counted as nan
    steps[7].grad_norm = 3.5;
    neox_metrics *m;
    char *text = NULL;
    size_t size = 0;
    run_steps(&o, steps, 8, 0.5, &m, &text, &size);
    const neox_train_summary *s = neox_metrics_last_summary(m);
    assert_int_equal(s->iteration, 8);
    assert_int_equal(s->iterations, 4);
    assert_true(fabs(s->iteration_time - 0.5) < 1e-12);
    assert_true(fabs(s->samples_per_sec - 16.0) < 1e-12);
    assert_true(fabs(s->tokens_per_sec - 256.0) < 1e-12);
    assert_true(fabs(s->flops_per_sec_per_device - 1e12) < 1e-3);   // 1e12 / (0.5 s * 2 ranks)
    assert_true(fabs(s->mfu - 0.25) < 1e-12);
    // Step 7's loss was not finite: the interval reports NaN, not the mean of the others; step 8
    // (finite) gives the grad norm.
    assert_true(isnan(s->lm_loss));
    assert_int_equal(s->nonfinite, 0);
    assert_int_equal(s->skipped, 2);
    assert_int_equal(s->nan, 1);
    assert_true(fabs(s->grad_norm - 3.5) < 1e-12);
    assert_non_null(strstr(text, " lm_loss: NAN |"));
    assert_non_null(strstr(text, " grad norm: 3.500 |"));
    // Two lines, at iterations 4 and 8.
    assert_non_null(strstr(text, "iteration        4/       8 |"));
    assert_non_null(strstr(text, "iteration        8/       8 |"));
    assert_non_null(strstr(text, " lm_loss: 5.500000E+00 |"));   // (4+5+6+7)/4
    assert_non_null(strstr(text, " number of skipped iterations:   2 | number of nan iterations:   1 |"));
    assert_null(strstr(text, "time (ms)"));   // wall_clock_breakdown off
    neox_error err = {0};
    assert_int_equal(neox_metrics_close(m, &err), 0);
    fclose(o.out);
    free(text);

    // A last step with a NaN loss shows its own grad norm (NaN), not step 3's finite one.
    neox_metrics_options o2 = {.rank = 0, .world_size = 1, .train_iters = 4, .log_interval = 4, .train_batch_size = 1,
                               .seq_length = 4};
    for (int i = 0; i < 4; i++) steps[i] = (neox_step_stats){.iteration = i + 1, .lm_loss = 4.0, .grad_norm = 2.0};
    steps[3] = (neox_step_stats){.iteration = 4, .lm_loss = NAN, .grad_norm = NAN, .skipped = 1};
    text = NULL;
    run_steps(&o2, steps, 4, 0.5, &m, &text, &size);
    s = neox_metrics_last_summary(m);
    assert_true(isnan(s->lm_loss) && isnan(s->grad_norm));
    assert_int_equal(s->nonfinite, 1);
    assert_non_null(strstr(text, " lm_loss: NAN | grad norm: nan |"));
    assert_int_equal(neox_metrics_close(m, &err), 0);
    fclose(o2.out);
    free(text);
}

// A step skipped with a finite loss (an fp16 overflow) leaves the interval's mean to the others.
static void test_skipped_finite_loss_keeps_the_mean(void **state) {
    (void)state;
    neox_metrics_options o = {.rank = 0, .world_size = 1, .train_iters = 4, .log_interval = 4, .train_batch_size = 1,
                              .seq_length = 4};
    neox_step_stats steps[4];
    for (int i = 0; i < 4; i++) steps[i] = (neox_step_stats){.iteration = i + 1, .lm_loss = 4.0 + i, .grad_norm = 2.0};
    steps[1].skipped = 1, steps[1].grad_norm = INFINITY;
    steps[3].grad_norm = 3.5;
    neox_metrics *m;
    char *text = NULL;
    size_t size = 0;
    run_steps(&o, steps, 4, 0.5, &m, &text, &size);
    const neox_train_summary *s = neox_metrics_last_summary(m);
    assert_true(fabs(s->lm_loss - (4.0 + 6.0 + 7.0) / 3) < 1e-12);
    assert_int_equal(s->nonfinite, 0);
    assert_int_equal(s->skipped, 1);
    assert_int_equal(s->nan, 0);
    assert_true(fabs(s->grad_norm - 3.5) < 1e-12);
    neox_error err = {0};
    assert_int_equal(neox_metrics_close(m, &err), 0);
    fclose(o.out);
    free(text);
}

static void test_other_ranks_stay_silent(void **state) {
    (void)state;
    neox_metrics_options o = {.rank = 1, .world_size = 2, .train_iters = 2, .log_interval = 1,
                              .train_batch_size = 1, .seq_length = 4, .log_dir = tmpdir, .tensorboard_dir = tmpdir};
    neox_step_stats steps[2] = {{.iteration = 1, .lm_loss = 1, .grad_norm = NAN},
                                {.iteration = 2, .lm_loss = 1, .grad_norm = NAN}};
    neox_metrics *m;
    char *text = NULL;
    size_t size = 0;
    run_steps(&o, steps, 2, 1.0, &m, &text, &size);
    assert_string_equal(text, "");
    neox_error err = {0};
    assert_int_equal(neox_metrics_eval(m, "validation", "iteration 2", 2, 1.0, &err), 0);
    assert_int_equal(neox_metrics_close(m, &err), 0);
    fclose(o.out);
    char *path = neox_asprintf("%s/metrics.jsonl", tmpdir);
    assert_int_not_equal(access(path, F_OK), 0);   // no file from rank 1
    free(path);
    free(text);
}

static void test_timer_line_printed_with_breakdown(void **state) {
    (void)state;
    neox_metrics_options o = {.rank = 0, .world_size = 1, .train_iters = 2, .log_interval = 2,
                              .train_batch_size = 1, .seq_length = 4, .wall_clock_breakdown = 1};
    char *text = NULL;
    size_t size = 0;
    o.out = open_memstream(&text, &size);
    o.clock = fake_clock;
    neox_error err = {0};
    neox_metrics *m = neox_metrics_open(&o, &err);
    assert_non_null(m);
    for (int i = 1; i <= 2; i++) {
        neox_timer *t = neox_metrics_timer(m, NEOX_TIMER_BACKWARD);
        t->elapsed += 0.004;
        t->count++;
        fake_time += 1.0;
        assert_int_equal(neox_metrics_step(m, &(neox_step_stats){.iteration = i, .lm_loss = 2.0, .grad_norm = NAN}, &err), 0);
    }
    fflush(o.out);
    assert_non_null(strstr(text, "\ntime (ms) | backward: 4.00\n"));
    assert_int_equal(neox_metrics_timer(m, NEOX_TIMER_BACKWARD)->count, 0);   // reset after logging
    assert_int_equal(neox_metrics_close(m, &err), 0);
    fclose(o.out);
    free(text);
}

// Values added per step (communication accounting) are reported as the interval's mean per
// iteration: in the JSONL record, and as a line under wall_clock_breakdown; cleared after a log.
// A value set (a gauge: the peak memory) is reported as it stands, and not in that line.
static void test_added_values(void **state) {
    (void)state;
    char *dir = neox_asprintf("%s/added", tmpdir);
    neox_metrics_options o = {.rank = 0, .world_size = 2, .train_iters = 4, .log_interval = 2,
                              .train_batch_size = 1, .seq_length = 4, .wall_clock_breakdown = 1, .log_dir = dir};
    char *text = NULL;
    size_t size = 0;
    o.out = open_memstream(&text, &size);
    o.clock = fake_clock;
    neox_error err = {0};
    neox_metrics *m = neox_metrics_open(&o, &err);
    assert_non_null(m);
    for (int i = 1; i <= 4; i++) {
        neox_metrics_add(m, "comm/data/all_reduce/bytes", 100.0 * i);   // 150 then 350 per iteration
        if (i <= 2) neox_metrics_add(m, "comm/bytes", 10.0);
        neox_metrics_set(m, "memory/peak_rss_bytes", 1000.0 * i);   // a gauge: the latest, not a mean
        fake_time += 1.0;
        assert_int_equal(neox_metrics_step(m, &(neox_step_stats){.iteration = i, .lm_loss = 2.0, .grad_norm = NAN}, &err), 0);
    }
    fflush(o.out);
    assert_non_null(strstr(text, "\ncommunication per iteration | comm/data/all_reduce/bytes: 150 | comm/bytes: 10\n"));
    assert_non_null(strstr(text, "\ncommunication per iteration | comm/data/all_reduce/bytes: 350 | comm/bytes: 0\n"));
    assert_int_equal(neox_metrics_close(m, &err), 0);
    fclose(o.out);
    char *path = neox_asprintf("%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[4096];
    assert_non_null(fgets(line, sizeof line, f));
    assert_non_null(strstr(line, "\"comm/data/all_reduce/bytes\":150.0"));
    assert_non_null(strstr(line, "\"memory/peak_rss_bytes\":2000.0"));
    assert_non_null(fgets(line, sizeof line, f));
    assert_non_null(strstr(line, "\"comm/data/all_reduce/bytes\":350.0"));
    assert_non_null(strstr(line, "\"memory/peak_rss_bytes\":4000.0"));
    fclose(f);
    free(path);
    free(dir);
    free(text);
}

static void test_eval_block(void **state) {
    (void)state;
    neox_metrics_options o = {.rank = 0, .world_size = 1, .train_iters = 2, .log_interval = 1};
    char *text = NULL;
    size_t size = 0;
    o.out = open_memstream(&text, &size);
    neox_error err = {0};
    neox_metrics *m = neox_metrics_open(&o, &err);
    assert_non_null(m);
    assert_int_equal(neox_metrics_eval(m, "test", "the end of training for test data", 2, 0.0, &err), 0);
    assert_int_equal(neox_metrics_close(m, &err), 0);
    fclose(o.out);
    const char *line = " test results at the end of training for test data | lm_loss value: 0.000000E+00 |"
                       " lm_loss_ppl value: 1.000000E+00 | ";
    size_t width = strlen(line) + 1;
    char *want = neox_malloc(3 * width + 8);
    char *rule = neox_malloc(width + 1);
    memset(rule, '-', width);
    rule[width] = '\0';
    sprintf(want, "%s\n%s\n%s\n", rule, line, rule);
    assert_string_equal(text, want);
    free(want);
    free(rule);
    free(text);
}

static void test_bad_log_interval(void **state) {
    (void)state;
    neox_metrics_options o = {.log_interval = 0};
    neox_error err = {0};
    assert_null(neox_metrics_open(&o, &err));
    assert_int_equal(err.status, NEOX_EXIT_USAGE);
    assert_non_null(strstr(err.message, "log_interval"));
    assert_int_equal(neox_metrics_close(NULL, &err), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c_rfc3720_vectors),
        cmocka_unit_test(test_crc32c_masked),
        cmocka_unit_test(test_varint_encoding),
        cmocka_unit_test(test_protobuf_fields),
        cmocka_unit_test(test_event_file_framing),
        cmocka_unit_test(test_event_dir_error_names_path),
        cmocka_unit_test(test_flops_formula),
        cmocka_unit_test(test_format_flops),
        cmocka_unit_test(test_train_line_format),
        cmocka_unit_test(test_timer_line_format),
        cmocka_unit_test(test_eval_line_format),
        cmocka_unit_test(test_interval_accounting),
        cmocka_unit_test(test_skipped_finite_loss_keeps_the_mean),
        cmocka_unit_test(test_other_ranks_stay_silent),
        cmocka_unit_test(test_timer_line_printed_with_breakdown),
        cmocka_unit_test(test_added_values),
        cmocka_unit_test(test_eval_block),
        cmocka_unit_test(test_bad_log_interval),
    };
    return cmocka_run_group_tests(tests, make_tmpdir, remove_tmpdir);
}
