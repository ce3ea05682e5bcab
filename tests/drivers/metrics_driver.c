// metrics_driver.c: drives lib/metrics for tests/oracle/test_metrics_*.py, which check its output
// with independent readers (the tensorboard package, Python's json, a Python FLOPs formula).
//   metrics_driver flops LAYERS HIDDEN VOCAB SEQ BATCH CKPT [MOE_LAYERS TOP_K EXPERTS WIDTH [MATRICES]]
//                                                               prints FLOPs per iteration (%.17g)
//   metrics_driver run LOG_DIR TB_DIR                           a scripted 10-step run, lines on stdout
// The run uses a fake clock (0.25 s per step) and sets the timers directly, so every logged value
// is known exactly from the script below; the Python test restates the script, not these numbers.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"

static double fake_now;
static double fake_clock(void) { return fake_now; }

static int flops(int argc, char **argv) {
    neox_flops_model m = {.num_layers = atoll(argv[0]), .hidden_size = atoll(argv[1]),
                          .padded_vocab_size = atoll(argv[2]), .seq_length = atoll(argv[3]),
                          .train_batch_size = atoll(argv[4]), .checkpoint_activations = atoi(argv[5])};
    if (argc >= 10)
        m.moe_layers = atoll(argv[6]), m.moe_top_k = atoll(argv[7]), m.moe_experts = atoll(argv[8]),
        m.moe_ffn_size = atoll(argv[9]);
    if (argc >= 11) m.moe_expert_matrices = atoll(argv[10]);
    printf("%.17g\n", neox_flops_per_iteration(&m));
    return 0;
}

static void add_time(neox_metrics *m, neox_timer_name t, double seconds) {
    neox_timer *timer = neox_metrics_timer(m, t);
    timer->elapsed += seconds;
    timer->count++;
}

static int run(const char *log_dir, const char *tb_dir) {
    neox_flops_model model = {.num_layers = 2, .hidden_size = 64, .padded_vocab_size = 512, .seq_length = 16,
                              .train_batch_size = 8, .checkpoint_activations = 1};
    neox_metrics_options o = {
        .rank = 0, .world_size = 2, .train_iters = 10, .log_interval = 4, .train_batch_size = 8,
        .seq_length = 16, .flops_per_iteration = neox_flops_per_iteration(&model),
        .peak_flops_per_device = 1e9, .wall_clock_breakdown = 1, .fp16 = 1,
        .log_dir = log_dir, .tensorboard_dir = tb_dir, .clock = fake_clock,
    };
    neox_error err = {0};
    neox_metrics *m = neox_metrics_open(&o, &err);
    if (!m) goto fail;
    neox_metrics_begin(m);
    for (int i = 1; i <= 10; i++) {
        fake_now += 0.25;
        add_time(m, NEOX_TIMER_FORWARD, 0.010);
        add_time(m, NEOX_TIMER_BACKWARD, 0.020);
        add_time(m, NEOX_TIMER_OPTIMIZER, 0.005);
        neox_step_stats s = {.iteration = i, .lm_loss = 5.0 - 0.1 * i, .learning_rate = 1e-3 * i / 10.0,
                             .grad_norm = 1.0 + 0.5 * i, .loss_scale = ldexp(1.0, 10 + i)};
        if (i == 3) s.skipped = 1;                          // skipped with a finite loss
        if (i == 6) s.skipped = 1, s.lm_loss = NAN;         // skipped with a nan loss
        if (neox_metrics_step(m, &s, &err) != 0) goto fail;
        if (i == 8 && neox_metrics_eval(m, "validation", "iteration 8", 8, 4.0, &err) != 0) goto fail;
    }
    if (neox_metrics_eval(m, "test", "the end of training for test data", 10, 3.5, &err) != 0) goto fail;
    if (neox_metrics_close(m, &err) != 0) {
        m = NULL;
        goto fail;
    }
    return 0;
fail:
    neox_metrics_close(m, NULL);
    fprintf(stderr, "metrics_driver: error: %s\n", err.message);
    return 1;
}

int main(int argc, char **argv) {
    if ((argc == 8 || argc == 12 || argc == 13) && strcmp(argv[1], "flops") == 0) return flops(argc - 2, argv + 2);
    if (argc == 4 && strcmp(argv[1], "run") == 0) return run(argv[2], argv[3]);
    fprintf(stderr, "usage: metrics_driver flops LAYERS HIDDEN VOCAB SEQ BATCH CKPT [MOE_LAYERS TOP_K EXPERTS WIDTH [MATRICES]] | run LOG_DIR TB_DIR\n");
    return 2;
}
