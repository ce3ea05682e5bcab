// format.c: the text lines of a run in GPT-NeoX's layout (megatron/logging.py training_log,
// megatron/utils.py Timers.log, megatron/training.py evaluate_and_print_results), so scripts that
// parse GPT-NeoX logs parse neox.c's. neox.c adds "tokens/sec", "MFU", "grad norm" and "param norm" fields in
// the same " name: value |" form.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#include "metrics.h"

static const char *timer_labels[NEOX_TIMER_COUNT] = {
    [NEOX_TIMER_FORWARD] = "forward",
    [NEOX_TIMER_BACKWARD] = "backward",
    [NEOX_TIMER_BACKWARD_BACKWARD] = "backward-backward",
    [NEOX_TIMER_BACKWARD_ALLREDUCE] = "backward-allreduce",
    [NEOX_TIMER_BACKWARD_MASTER_GRAD] = "backward-master-grad",
    [NEOX_TIMER_BACKWARD_CLIP_GRAD] = "backward-clip-grad",
    [NEOX_TIMER_OPTIMIZER] = "optimizer",
    [NEOX_TIMER_BATCH_GENERATOR] = "batch generator",
};

const char *neox_timer_label(neox_timer_name t) {
    return (t >= 0 && t < NEOX_TIMER_COUNT) ? timer_labels[t] : "?";
}

// Appends to buf at *used, keeping it NUL-terminated when the text does not fit.
static void append(char *buf, size_t size, size_t *used, const char *fmt, ...) {
    if (*used >= size) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *used, size - *used, fmt, ap);
    va_end(ap);
    if (n > 0) *used += (size_t)n < size - *used ? (size_t)n : size - *used - 1;
}

// NaN without its sign: printf writes "-nan" for a NaN whose sign bit is set, which is still not a number.
static double unsigned_nan(double x) { return isnan(x) ? fabs(x) : x; }

void neox_format_train_line(const neox_train_summary *s, char *buf, size_t size) {
    size_t used = 0;
    if (size == 0) return;
    buf[0] = '\0';
    append(buf, size, &used, " samples/sec: %.3f |", s->samples_per_sec);
    append(buf, size, &used, " tokens/sec: %.1f |", s->tokens_per_sec);
    append(buf, size, &used, " iteration %8lld/%8lld |", (long long)s->iteration, (long long)s->train_iters);
    append(buf, size, &used, " elapsed time per iteration (ms): %.1f |", s->iteration_time * 1000.0);
    append(buf, size, &used, " learning rate: %.3E |", s->learning_rate);
    if (s->flops_per_sec_per_device >= 0) {
        char flops[32];
        append(buf, size, &used, " approx flops per GPU: %s |",
               neox_format_flops(s->flops_per_sec_per_device, flops, sizeof flops));
    }
    if (s->mfu >= 0) append(buf, size, &used, " MFU: %.2f%% |", s->mfu * 100.0);
    append(buf, size, &used, " lm_loss: %.6E |", unsigned_nan(s->lm_loss));
    if (s->fp16) append(buf, size, &used, " loss scale: %.1f |", s->loss_scale);
    if (!isnan(s->grad_norm) || s->nonfinite) append(buf, size, &used, " grad norm: %.3f |", unsigned_nan(s->grad_norm));
    if (s->has_param_norm) append(buf, size, &used, " param norm: %.3f |", unsigned_nan(s->param_norm));
    append(buf, size, &used, " number of skipped iterations: %3lld |", (long long)s->skipped);
    append(buf, size, &used, " number of nan iterations: %3lld |", (long long)s->nan);
}

int neox_format_timer_line(const neox_timer *timers, int64_t iterations, char *buf, size_t size) {
    size_t used = 0;
    int shown = 0;
    if (size == 0) return 0;
    buf[0] = '\0';
    if (iterations < 1) iterations = 1;
    append(buf, size, &used, "time (ms)");
    for (int t = 0; t < NEOX_TIMER_COUNT; t++) {
        if (timers[t].count == 0) continue;   // a timer the loop never ran is not reported
        append(buf, size, &used, " | %s: %.2f", timer_labels[t], neox_timer_seconds(&timers[t]) * 1000.0 / iterations);
        shown++;
    }
    if (!shown) buf[0] = '\0';
    return shown;
}

void neox_format_eval_line_values(const char *chart, const char *prefix, double lm_loss, const neox_eval_value *more,
                                  int nmore, char *buf, size_t size) {
    size_t used = 0;
    if (size == 0) return;
    buf[0] = '\0';
    append(buf, size, &used, " %s results at %s | ", chart, prefix);
    append(buf, size, &used, "lm_loss value: %.6E | ", lm_loss);
    append(buf, size, &used, "lm_loss_ppl value: %.6E | ", exp(lm_loss));
    for (int i = 0; i < nmore; i++) append(buf, size, &used, "%s value: %.6E | ", more[i].name, more[i].value);
}

void neox_format_eval_line(const char *chart, const char *prefix, double lm_loss, char *buf, size_t size) {
    neox_format_eval_line_values(chart, prefix, lm_loss, NULL, 0, buf, size);
}
