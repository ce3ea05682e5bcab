// metrics.c: the metrics of a training run — collects each step, and every log_interval turns the
// interval into GPT-NeoX's log line, TensorBoard scalars and a JSONL record (rank 0 only).
// Tags follow GPT-NeoX's training_log: per step train/learning_rate, train/lm_loss (and
// train/loss_scale under fp16); per interval runtime/samples_per_sec, runtime/iteration_time,
// runtime/flops_per_sec_per_gpu and timers/<name>; with log_param_norm, per step
// parameter_norms/<name>, and whatever series the trainer's parts add to a step (gradient_norms/<name>,
// pct_grad_zeros/<name>, optimizer_state_norms/<name>_<state>, train/noise_scale). neox.c adds
// train/grad_norm, train/param_norm, runtime/tokens_per_sec and runtime/mfu.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"
#include "metrics/internal.h"

// JSONL records are fsync'ed at most this often during training (always at evaluations,
// checkpoints and the end), so a killed job loses seconds of metrics, not hours.
#define JSONL_SYNC_SECONDS 10.0

struct neox_metrics {
    neox_metrics_options o;
    int writes;                    // rank 0: prints and owns the files
    neox_tb_writer *tb;
    neox_jsonl *jsonl;
    neox_timer timers[NEOX_TIMER_COUNT];
    // the interval being collected
    double interval_start;
    int64_t iterations, skipped, nan;
    double loss_sum, learning_rate, grad_norm, loss_scale;
    int last_nonfinite;          // the last step's loss was NaN or inf: its grad norm is shown, NaN or not
    const neox_step_stats *step;   // the step being recorded (its parameter norms)
    double last_sync;
    neox_train_summary summary;
    // caller-measured values: summed over the interval (neox_metrics_add), or the latest (a gauge,
    // neox_metrics_set)
    char **added_tag;
    double *added_sum;
    int *added_gauge;
    int nadded, added_cap;
};

// The index of a caller-measured tag, added (at 0) on first use.
static int added_index(neox_metrics *m, const char *tag, int gauge) {
    int i = 0;
    while (i < m->nadded && strcmp(m->added_tag[i], tag) != 0) i++;
    if (i == m->nadded) {
        if (m->nadded == m->added_cap) {
            m->added_cap = m->added_cap ? 2 * m->added_cap : 32;
            m->added_tag = neox_realloc(m->added_tag, (size_t)m->added_cap * sizeof *m->added_tag);
            m->added_sum = neox_realloc(m->added_sum, (size_t)m->added_cap * sizeof *m->added_sum);
            m->added_gauge = neox_realloc(m->added_gauge, (size_t)m->added_cap * sizeof *m->added_gauge);
        }
        m->added_tag[m->nadded] = neox_strdup(tag);
        m->added_gauge[m->nadded] = gauge;
        m->added_sum[m->nadded++] = 0.0;
    }
    return i;
}

// (The index first: adding a tag may move added_sum.)
void neox_metrics_add(neox_metrics *m, const char *tag, double value) {
    int i = added_index(m, tag, 0);
    m->added_sum[i] += value;
}

void neox_metrics_set(neox_metrics *m, const char *tag, double value) {
    int i = added_index(m, tag, 1);
    m->added_sum[i] = value;
}

// What a caller-measured tag reports for the interval: a sum's mean per iteration, a gauge's value.
static double added_value(const neox_metrics *m, int i, int64_t iterations) {
    return m->added_gauge[i] ? m->added_sum[i] : m->added_sum[i] / (double)iterations;
}

static void reset_interval(neox_metrics *m) {
    m->interval_start = m->o.clock();
    m->iterations = m->skipped = m->nan = 0;
    m->loss_sum = 0.0;
    for (int i = 0; i < m->nadded; i++)
        if (!m->added_gauge[i]) m->added_sum[i] = 0.0;
    for (int t = 0; t < NEOX_TIMER_COUNT; t++) neox_timer_reset(&m->timers[t]);
}

// use_wandb: the run's W&B settings and sync command, as the event file's first summary.
static int write_wandb_text(neox_metrics *m, const neox_metrics_options *opts, neox_error *err) {
    if (!opts->wandb.enabled) return 0;
    char *text = neox_wandb_run_text(&opts->wandb, opts->tensorboard_dir);
    int rc = neox_tb_text(m->tb, "wandb/run", 0, text, neox_wall_time(), err);
    free(text);
    return rc;
}

neox_metrics *neox_metrics_open(const neox_metrics_options *opts, neox_error *err) {
    if (opts->log_interval < 1)
        return neox_fail(err, NEOX_EXIT_USAGE, "log_interval must be at least 1 (got %lld)",
                         (long long)opts->log_interval), NULL;
    neox_metrics *m = neox_calloc(1, sizeof *m);
    m->o = *opts;
    m->o.log_dir = m->o.tensorboard_dir = NULL;   // not kept: the writers hold the paths
    m->o.wandb = (neox_wandb_settings){0};        // (nor the settings: the config owns them)
    if (!m->o.clock) m->o.clock = neox_now;
    if (!m->o.out) m->o.out = stdout;
    if (m->o.world_size < 1) m->o.world_size = 1;
    m->writes = opts->rank == 0;
    m->grad_norm = NAN;
    if (m->writes && opts->log_dir) {
        char *path = neox_asprintf("%s/metrics.jsonl", opts->log_dir);
        m->jsonl = neox_jsonl_open(path, err);
        free(path);
        if (!m->jsonl) return neox_metrics_close(m, NULL), NULL;
    }
    if (m->writes && opts->tensorboard_dir) {
        m->tb = neox_tb_open(opts->tensorboard_dir, err);
        if (!m->tb || write_wandb_text(m, opts, err) != 0) return neox_metrics_close(m, NULL), NULL;
    }
    m->last_sync = neox_now();
    reset_interval(m);
    return m;
}

void neox_metrics_begin(neox_metrics *m) { reset_interval(m); }

neox_timer *neox_metrics_timer(neox_metrics *m, neox_timer_name t) { return &m->timers[t]; }

const neox_train_summary *neox_metrics_last_summary(const neox_metrics *m) { return &m->summary; }

static int tb_scalar(neox_metrics *m, const char *tag, int64_t step, double value, neox_error *err) {
    return m->tb ? neox_tb_scalar(m->tb, tag, step, value, neox_wall_time(), err) : 0;
}

void neox_metrics_step_series(neox_step_stats *s, char *const *tags, const double *values, int n) {
    neox_assert(s->nseries < NEOX_STEP_SERIES_MAX, "more than %d series in one step", NEOX_STEP_SERIES_MAX);
    s->series[s->nseries++] = (neox_step_series){tags, values, n};
}

static int log_step_scalars(neox_metrics *m, const neox_step_stats *s, neox_error *err) {
    if (tb_scalar(m, "train/learning_rate", s->iteration, s->learning_rate, err) != 0) return -1;
    if (tb_scalar(m, "train/lm_loss", s->iteration, s->lm_loss, err) != 0) return -1;
    if (m->o.fp16 && tb_scalar(m, "train/loss_scale", s->iteration, s->loss_scale, err) != 0) return -1;
    int nonfinite = !isfinite(s->lm_loss);  // its grad norm is shown, NaN or not
    if ((nonfinite || !isnan(s->grad_norm)) && tb_scalar(m, "train/grad_norm", s->iteration, s->grad_norm, err) != 0)
        return -1;
    for (int k = 0; k < s->nseries; k++)
        for (int i = 0; i < s->series[k].n; i++)
            if (tb_scalar(m, s->series[k].tags[i], s->iteration, s->series[k].values[i], err) != 0) return -1;
    if (!s->param_norms) return 0;
    if (tb_scalar(m, "train/param_norm", s->iteration, s->param_norms[s->nparam_norms], err) != 0) return -1;
    for (int i = 0; i < s->nparam_norms; i++) {
        char tag[160];
        snprintf(tag, sizeof tag, "parameter_norms/%s", s->param_norm_names[i]);
        if (tb_scalar(m, tag, s->iteration, s->param_norms[i], err) != 0) return -1;
    }
    return 0;
}

static void summarize(neox_metrics *m, int64_t iteration, double elapsed) {
    neox_train_summary *s = &m->summary;
    memset(s, 0, sizeof *s);
    s->iteration = iteration;
    s->train_iters = m->o.train_iters;
    s->iterations = m->iterations;
    // Divides by the steps actually taken: GPT-NeoX divides by log_interval, which misreports
    // the first interval after resuming from an iteration that is not a multiple of it.
    s->iteration_time = elapsed / (double)m->iterations;
    s->samples_per_sec = s->iteration_time > 0 ? (double)m->o.train_batch_size / s->iteration_time : 0.0;
    s->tokens_per_sec = s->samples_per_sec * (double)m->o.seq_length;
    s->flops_per_sec_per_device = -1.0;
    s->mfu = -1.0;
    if (m->o.flops_per_iteration > 0 && s->iteration_time > 0) {
        s->flops_per_sec_per_device = m->o.flops_per_iteration / (s->iteration_time * m->o.world_size);
        if (m->o.peak_flops_per_device > 0) s->mfu = s->flops_per_sec_per_device / m->o.peak_flops_per_device;
    }
    s->learning_rate = m->learning_rate;
    int64_t counted = m->iterations - m->skipped;
    s->lm_loss = m->loss_sum / (double)(counted > 1 ? counted : 1);
    s->grad_norm = m->grad_norm;
    // A NaN or inf loss in the interval is reported as such, not as the mean of the others (or as 0
    // when every step had one); a last step with one shows its own gradient norm, not an earlier one.
    if (m->nan > 0) s->lm_loss = NAN, s->nonfinite = m->last_nonfinite;
    s->has_param_norm = m->step && m->step->param_norms;
    if (s->has_param_norm) s->param_norm = m->step->param_norms[m->step->nparam_norms];
    s->loss_scale = m->loss_scale;
    s->fp16 = m->o.fp16;
    s->skipped = m->skipped;
    s->nan = m->nan;
}

static int log_interval_scalars(neox_metrics *m, neox_error *err) {
    const neox_train_summary *s = &m->summary;
    int64_t it = s->iteration;
    if (tb_scalar(m, "runtime/samples_per_sec", it, s->samples_per_sec, err) != 0) return -1;
    if (tb_scalar(m, "runtime/iteration_time", it, s->iteration_time, err) != 0) return -1;
    if (tb_scalar(m, "runtime/tokens_per_sec", it, s->tokens_per_sec, err) != 0) return -1;
    if (s->flops_per_sec_per_device >= 0 &&
        tb_scalar(m, "runtime/flops_per_sec_per_gpu", it, s->flops_per_sec_per_device, err) != 0)
        return -1;
    if (s->mfu >= 0 && tb_scalar(m, "runtime/mfu", it, s->mfu, err) != 0) return -1;
    for (int i = 0; i < m->nadded; i++)
        if (tb_scalar(m, m->added_tag[i], it, added_value(m, i, s->iterations), err) != 0) return -1;
    if (!m->o.wall_clock_breakdown) return 0;
    for (int t = 0; t < NEOX_TIMER_COUNT; t++) {
        if (m->timers[t].count == 0) continue;
        char tag[64];
        snprintf(tag, sizeof tag, "timers/%s", neox_timer_label(t));
        if (tb_scalar(m, tag, it, neox_timer_seconds(&m->timers[t]) / (double)s->iterations, err) != 0) return -1;
    }
    return 0;
}

static json_t *interval_record(const neox_metrics *m) {
    const neox_train_summary *s = &m->summary;
    json_t *o = json_object();
    json_object_set_new(o, "iteration", json_integer(s->iteration));
    json_object_set_new(o, "wall_time", json_real(neox_wall_time()));
    json_object_set_new(o, "train/lm_loss", neox_json_number(s->lm_loss));
    json_object_set_new(o, "train/learning_rate", neox_json_number(s->learning_rate));
    if (!isnan(s->grad_norm) || s->nonfinite) json_object_set_new(o, "train/grad_norm", neox_json_number(s->grad_norm));
    if (s->has_param_norm) {
        json_object_set_new(o, "train/param_norm", neox_json_number(s->param_norm));
        for (int i = 0; i < m->step->nparam_norms; i++) {
            char key[160];
            snprintf(key, sizeof key, "parameter_norms/%s", m->step->param_norm_names[i]);
            json_object_set_new(o, key, neox_json_number(m->step->param_norms[i]));
        }
    }
    for (int k = 0; m->step && k < m->step->nseries; k++)
        for (int i = 0; i < m->step->series[k].n; i++)
            json_object_set_new(o, m->step->series[k].tags[i], neox_json_number(m->step->series[k].values[i]));
    if (s->fp16) json_object_set_new(o, "train/loss_scale", neox_json_number(s->loss_scale));
    json_object_set_new(o, "train/skipped_iterations", json_integer(s->skipped));
    json_object_set_new(o, "train/nan_iterations", json_integer(s->nan));
    json_object_set_new(o, "runtime/iteration_time", neox_json_number(s->iteration_time));
    json_object_set_new(o, "runtime/samples_per_sec", neox_json_number(s->samples_per_sec));
    json_object_set_new(o, "runtime/tokens_per_sec", neox_json_number(s->tokens_per_sec));
    if (s->flops_per_sec_per_device >= 0)
        json_object_set_new(o, "runtime/flops_per_sec_per_gpu", neox_json_number(s->flops_per_sec_per_device));
    if (s->mfu >= 0) json_object_set_new(o, "runtime/mfu", neox_json_number(s->mfu));
    for (int i = 0; i < m->nadded; i++)
        json_object_set_new(o, m->added_tag[i], neox_json_number(added_value(m, i, s->iterations)));
    if (m->o.wall_clock_breakdown) {
        for (int t = 0; t < NEOX_TIMER_COUNT; t++) {
            if (m->timers[t].count == 0) continue;
            char key[64];
            snprintf(key, sizeof key, "timers/%s", neox_timer_label(t));
            json_object_set_new(o, key, neox_json_number(neox_timer_seconds(&m->timers[t]) / (double)s->iterations));
        }
    }
    return o;
}

static int append_record(neox_metrics *m, json_t *record, int force_sync, neox_error *err) {
    int rc = 0;
    if (m->jsonl) {
        int sync = force_sync || neox_now() - m->last_sync >= JSONL_SYNC_SECONDS;
        rc = neox_jsonl_append(m->jsonl, record, sync, err);
        if (rc == 0 && sync) m->last_sync = neox_now();
    }
    json_decref(record);
    return rc;
}

static void print_line(neox_metrics *m, const char *line) {
    fprintf(m->o.out, "%s\n", line);
    fflush(m->o.out);
}

// "communication per iteration | comm/data/all_reduce/bytes: 531464 | ..." (the summed added values).
static void print_added_line(neox_metrics *m) {
    int nsums = 0;
    for (int i = 0; i < m->nadded; i++) nsums += !m->added_gauge[i];
    if (nsums == 0) return;
    fprintf(m->o.out, "communication per iteration");
    for (int i = 0; i < m->nadded; i++)
        if (!m->added_gauge[i]) fprintf(m->o.out, " | %s: %.6g", m->added_tag[i], added_value(m, i, m->iterations));
    fprintf(m->o.out, "\n");
    fflush(m->o.out);
}

static int log_interval(neox_metrics *m, int64_t iteration, neox_error *err) {
    summarize(m, iteration, m->o.clock() - m->interval_start);
    if (m->writes) {
        char line[1024];
        neox_format_train_line(&m->summary, line, sizeof line);
        print_line(m, line);
        if (m->o.wall_clock_breakdown && neox_format_timer_line(m->timers, m->iterations, line, sizeof line))
            print_line(m, line);
        if (m->o.wall_clock_breakdown) print_added_line(m);
        if (log_interval_scalars(m, err) != 0) return -1;
        if (append_record(m, interval_record(m), 0, err) != 0) return -1;
        if (m->tb && neox_tb_flush(m->tb, 0, err) != 0) return -1;
    }
    reset_interval(m);
    return 0;
}

int neox_metrics_step(neox_metrics *m, const neox_step_stats *s, neox_error *err) {
    m->iterations++;
    if (s->skipped) {
        m->skipped++;
        if (!isfinite(s->lm_loss)) m->nan++;
    } else {
        m->loss_sum += s->lm_loss;
    }
    m->learning_rate = s->learning_rate;
    m->last_nonfinite = !isfinite(s->lm_loss);
    if (!isnan(s->grad_norm) || m->last_nonfinite) m->grad_norm = s->grad_norm;
    m->loss_scale = s->loss_scale;
    if (m->writes && log_step_scalars(m, s, err) != 0) return -1;
    m->step = s;
    int rc = s->iteration % m->o.log_interval == 0 ? log_interval(m, s->iteration, err) : 0;
    m->step = NULL;
    return rc;
}

int neox_metrics_eval_values(neox_metrics *m, const char *chart, const char *prefix, int64_t iteration, double lm_loss,
                             const neox_eval_value *more, int nmore, neox_error *err) {
    if (!m->writes) return 0;
    char line[4096], rule[4096];
    neox_format_eval_line_values(chart, prefix, lm_loss, more, nmore, line, sizeof line);
    size_t width = strlen(line) + 1;   // GPT-NeoX frames the line with dashes one longer than it
    if (width > sizeof rule - 1) width = sizeof rule - 1;
    memset(rule, '-', width);
    rule[width] = '\0';
    print_line(m, rule);
    print_line(m, line);
    print_line(m, rule);
    json_t *o = json_object();
    json_object_set_new(o, "iteration", json_integer(iteration));
    json_object_set_new(o, "wall_time", json_real(neox_wall_time()));
    int rc = 0;
    for (int i = -2; rc == 0 && i < nmore; i++) {
        const char *name = i == -2 ? "lm_loss" : i == -1 ? "lm_loss_ppl" : more[i].name;
        double value = i == -2 ? lm_loss : i == -1 ? exp(lm_loss) : more[i].value;
        char tag[256];
        snprintf(tag, sizeof tag, "%s/%s", chart, name);
        rc = tb_scalar(m, tag, iteration, value, err);
        json_object_set_new(o, tag, neox_json_number(value));
    }
    if (rc == 0 && m->tb) rc = neox_tb_flush(m->tb, 1, err);
    if (rc != 0) {
        json_decref(o);
        return -1;
    }
    return append_record(m, o, 1, err);
}

int neox_metrics_eval(neox_metrics *m, const char *chart, const char *prefix, int64_t iteration,
                      double lm_loss, neox_error *err) {
    return neox_metrics_eval_values(m, chart, prefix, iteration, lm_loss, NULL, 0, err);
}

int neox_metrics_flush(neox_metrics *m, neox_error *err) {
    if (m->tb && neox_tb_flush(m->tb, 1, err) != 0) return -1;
    if (m->jsonl && neox_jsonl_sync(m->jsonl, err) != 0) return -1;
    m->last_sync = neox_now();
    return 0;
}

int neox_metrics_close(neox_metrics *m, neox_error *err) {
    if (!m) return 0;
    int rc = 0;
    if (neox_tb_close(m->tb, err) != 0) rc = -1;
    if (neox_jsonl_close(m->jsonl, rc == 0 ? err : NULL) != 0) rc = -1;
    for (int i = 0; i < m->nadded; i++) free(m->added_tag[i]);
    free(m->added_tag);
    free(m->added_sum);
    free(m->added_gauge);
    free(m);
    return rc;
}
