// metrics.h: what neox-train reports about a run, in GPT-NeoX's forms — the rank-0 log line every
// log_interval, the wall_clock_breakdown timer line, evaluation results, the same numbers as JSONL
// in log_dir and as TensorBoard scalars (event files written natively) in tensorboard_dir, and
// GPT-NeoX's model-FLOPs formula behind TFLOP/s and MFU. Tags and line formats are GPT-NeoX's
// (megatron/logging.py, megatron/utils.py); docs/metrics.md lists them and what neox.c adds.
//
// The training loop's use:
//   neox_metrics *m = neox_metrics_open(&opts, &err);          // every rank; only rank 0 writes
//   neox_metrics_begin(m);                                     // just before the first step
//   each step:  neox_timer_start(neox_metrics_timer(m, NEOX_TIMER_FORWARD)); ... stop ...
//               neox_metrics_step(m, &(neox_step_stats){...}, &err);   // logs at log_interval
//   evaluation: neox_metrics_eval(m, "validation", "iteration 100", 100, loss, &err);
//   checkpoint: neox_metrics_flush(m, &err);                   // metrics on disk up to here
//   end:        neox_metrics_close(m, &err);
#ifndef NEOX_METRICS_H
#define NEOX_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core.h"

// ---------------------------------------------------------------------------------------------
// FLOPs. GPT-NeoX's get_flops (from Megatron-DeepSpeed, after Narayanan et al. 2021, eq. 3):
//   24 * f * B * s * l * h^2 * (1 + s / (6h) + V / (16 l h)),  f = 4 with activation
//   checkpointing (one extra forward), else 3.
// It assumes a 4h MLP and full multi-head attention: GPT-NeoX does not adjust it for swiglu,
// intermediate_size or num_kv_heads, and neither does neox.c, so numbers compare across the two.
// Per token and layer its forward is 8h^2 (attention's linears) + 16h^2 (the 4h MLP) + 4sh
// (attention's scores and values). A Mixture-of-Experts layer counts the parameters each token
// activates instead of the dense MLP: its top_k experts, 2 M h Fe for experts of M weight matrices
// (4 h Fe ungated, 6 h Fe gated), and the router, 2 h E (GPT-NeoX's get_flops counts a MoE layer as
// dense).
typedef struct neox_flops_model {
    int64_t num_layers;
    int64_t hidden_size;
    int64_t padded_vocab_size;
    int64_t seq_length;
    int64_t train_batch_size;      // global samples per iteration (all data-parallel ranks)
    int checkpoint_activations;
    int64_t moe_layers;            // layers whose MLP is a Mixture of Experts (0: none)
    int64_t moe_top_k, moe_experts, moe_ffn_size;  // experts per token, experts, expert width
    int64_t moe_expert_matrices;   // an expert's weight matrices: 2 (w1, w2; also when 0) or 3 gated (w1, w3, w2)
} neox_flops_model;

double neox_flops_per_iteration(const neox_flops_model *m);
// GPT-NeoX's human_readable_flops: "%3.1f" with FLOPS, KFLOPS, ..., ZFLOPS ("12.3TFLOPS").
const char *neox_format_flops(double flops, char *buf, size_t size);

// ---------------------------------------------------------------------------------------------
// TensorBoard event files, written without TensorFlow: TFRecord framing (length, masked CRC32C,
// data, masked CRC32C) around hand-encoded Event protobufs; the first event is the file version,
// then one scalar summary (tag, simple_value) per event. Readers (TensorBoard, tbparse) accept a
// file that is still being written, so scalars become visible at each flush.
typedef struct neox_tb_writer neox_tb_writer;

// Creates dir (and parents) and "dir/events.out.tfevents.<unix time>.<host>.<pid>.<n>".
neox_tb_writer *neox_tb_open(const char *dir, neox_error *err);
// wall_time is Unix time in seconds (neox_wall_time() for now).
int neox_tb_scalar(neox_tb_writer *w, const char *tag, int64_t step, double value, double wall_time,
                   neox_error *err);
// A text summary (TensorBoard's text plugin shows it; markdown is rendered): a scalar string tensor.
int neox_tb_text(neox_tb_writer *w, const char *tag, int64_t step, const char *text, double wall_time,
                 neox_error *err);
// Pushes buffered events to the file; with sync, also to disk (fsync).
int neox_tb_flush(neox_tb_writer *w, int sync, neox_error *err);
// Flushes, fsyncs and closes; frees w even when that fails.
int neox_tb_close(neox_tb_writer *w, neox_error *err);
const char *neox_tb_path(const neox_tb_writer *w);

double neox_wall_time(void);   // CLOCK_REALTIME in seconds (what TensorBoard and JSONL record)
int neox_mkdirs(const char *dir, neox_error *err);  // mkdir -p, for the run's log files

// ---------------------------------------------------------------------------------------------
// The timers of GPT-NeoX's wall_clock_breakdown, printed and tagged ("timers/<label>") under
// GPT-NeoX's names, in this order. The loop starts and stops the ones it has; unused ones are left
// out of the output, as in GPT-NeoX.
typedef enum {
    NEOX_TIMER_FORWARD,               // "forward"
    NEOX_TIMER_BACKWARD,              // "backward"
    NEOX_TIMER_BACKWARD_BACKWARD,     // "backward-backward": the backward pass proper
    NEOX_TIMER_BACKWARD_ALLREDUCE,    // "backward-allreduce": data-parallel gradient reduction
    NEOX_TIMER_BACKWARD_MASTER_GRAD,  // "backward-master-grad"
    NEOX_TIMER_BACKWARD_CLIP_GRAD,    // "backward-clip-grad"
    NEOX_TIMER_OPTIMIZER,             // "optimizer"
    NEOX_TIMER_BATCH_GENERATOR,       // "batch generator"
    NEOX_TIMER_COUNT
} neox_timer_name;

const char *neox_timer_label(neox_timer_name t);

// ---------------------------------------------------------------------------------------------
// use_wandb (wandb.c): neox.c writes no W&B files; the run's TensorBoard events are uploaded with W&B's
// own `wandb sync --sync-tensorboard`, and the TensorBoard run carries its W&B settings as text.
typedef struct neox_wandb_settings {
    int enabled;                  // use_wandb
    const char *project, *team, *group, *run_name, *host;  // wandb_project, ...; NULL or "": unset
} neox_wandb_settings;
// The shell command that syncs the TensorBoard events in dir to W&B under w (neox_malloc'ed):
// `[WANDB_BASE_URL=HOST] [WANDB_RUN_GROUP=GROUP] [WANDB_NAME=NAME] wandb sync --sync-tensorboard
// [--project P] [--entity TEAM] DIR`, each value shell-quoted where it needs to be.
char *neox_wandb_sync_command(const neox_wandb_settings *w, const char *dir);
// The text summary wandb/run: a markdown table of the settings that are set and the sync command.
char *neox_wandb_run_text(const neox_wandb_settings *w, const char *dir);

// ---------------------------------------------------------------------------------------------
// The metrics of a run.
typedef struct neox_metrics_options {
    int rank;                      // only rank 0 prints and writes files
    int world_size;                // devices (ranks) sharing the work: FLOP/s are per device
    int64_t train_iters;           // the "/total" of the log line
    int64_t log_interval;          // a line every log_interval iterations (GPT-NeoX default 100)
    int64_t train_batch_size;      // global samples per iteration
    int64_t seq_length;            // tokens per sample
    double flops_per_iteration;    // neox_flops_per_iteration(); 0 leaves FLOP/s out
    double peak_flops_per_device;  // for MFU; 0 leaves MFU out
    int wall_clock_breakdown;      // print and tag the timers
    int fp16;                      // report the loss scale (train/loss_scale, "loss scale:")
    const char *log_dir;           // NULL: no JSONL; else LOG_DIR/metrics.jsonl (appended)
    const char *tensorboard_dir;   // NULL: no TensorBoard events
    neox_wandb_settings wandb;     // enabled: the event file starts with the text summary wandb/run at step 0
    FILE *out;                     // where the lines go; NULL means stdout
    double (*clock)(void);         // monotonic seconds; NULL means neox_now (tests use a fake)
} neox_metrics_options;

typedef struct neox_metrics neox_metrics;

// Values a step adds under tags of its own (log_grad_norm's gradient_norms/NAME, the gradient noise
// scale's train/noise_scale, ...): values[i] under tags[i].
typedef struct neox_step_series {
    char *const *tags;
    const double *values;
    int n;
} neox_step_series;
enum { NEOX_STEP_SERIES_MAX = 8 };

// What one optimizer step produced.
typedef struct neox_step_stats {
    int64_t iteration;     // the iteration just completed (1-based, as GPT-NeoX counts)
    double lm_loss;        // mean loss of the step's micro-batches
    double learning_rate;  // the rate the step used
    double grad_norm;      // global gradient norm before clipping; NAN when not computed
    double loss_scale;     // fp16 dynamic loss scale (ignored unless fp16)
    int skipped;           // the update was skipped (non-finite loss or gradients)
    // log_param_norm (NULL: not logged): the norms of the nparam_norms parameters named in
    // param_norm_names after the step, then the norm of all of them (param_norms[nparam_norms]).
    const double *param_norms;
    char *const *param_norm_names;
    int nparam_norms;
    // More per-step values (neox_metrics_step_series adds them): to TensorBoard at every step, and
    // those of an interval's last step to its JSONL record.
    neox_step_series series[NEOX_STEP_SERIES_MAX];
    int nseries;
} neox_step_stats;

// Adds a series to the step's values (its arrays must live until neox_metrics_step returns).
void neox_metrics_step_series(neox_step_stats *s, char *const *tags, const double *values, int n);

// One log interval, as the line reports it.
typedef struct neox_train_summary {
    int64_t iteration;
    int64_t train_iters;
    int64_t iterations;           // steps in this interval (log_interval except after a resume)
    double iteration_time;        // seconds per iteration over the interval
    double samples_per_sec;
    double tokens_per_sec;
    double flops_per_sec_per_device;   // < 0: not reported
    double mfu;                   // fraction of peak; < 0: not reported
    double learning_rate;         // of the last step
    double lm_loss;               // mean over the interval's steps that were not skipped
    double grad_norm;             // of the last step that computed one; NAN: not reported
    int has_param_norm;           // log_param_norm: param_norm is reported
    double param_norm;            // of all parameters after the last step
    double loss_scale;
    int fp16;
    int64_t skipped;              // steps skipped in the interval
    int64_t nan;                  // skipped steps whose loss was not finite
    int nonfinite;                // the last step's loss was NaN or inf: grad_norm is its own, shown NaN or not
} neox_train_summary;

// Opens the JSONL file and the TensorBoard writer on rank 0 (creating the directories).
neox_metrics *neox_metrics_open(const neox_metrics_options *opts, neox_error *err);
// Starts the first interval's clock (set-up time before it is not counted). Intervals end at
// multiples of log_interval counted from 0, as in GPT-NeoX, also after a resume.
void neox_metrics_begin(neox_metrics *m);
neox_timer *neox_metrics_timer(neox_metrics *m, neox_timer_name t);
// Records a step (per-step scalars go to TensorBoard as in GPT-NeoX); at a multiple of
// log_interval prints the line (and the timer line), writes runtime scalars and a JSONL record.
int neox_metrics_step(neox_metrics *m, const neox_step_stats *s, neox_error *err);
// The last interval's summary (valid after a step that logged); for the loop and for tests.
const neox_train_summary *neox_metrics_last_summary(const neox_metrics *m);
// Evaluation results as GPT-NeoX's evaluate_and_print_results: chart is "validation" or "test",
// prefix e.g. "iteration 100"; reports lm_loss and lm_loss_ppl = exp(lm_loss). Synced to disk.
int neox_metrics_eval(neox_metrics *m, const char *chart, const char *prefix, int64_t iteration,
                      double lm_loss, neox_error *err);
// The same with more results after lm_loss_ppl, each in the line as "NAME value: V | " and tagged
// CHART/NAME (GPT-NeoX's lm_loss_char_lvl_ppl, and eval_tasks' TASK_METRIC,none).
typedef struct neox_eval_value {
    char name[128];
    double value;
} neox_eval_value;
int neox_metrics_eval_values(neox_metrics *m, const char *chart, const char *prefix, int64_t iteration, double lm_loss,
                             const neox_eval_value *more, int nmore, neox_error *err);
// Adds a per-step value measured by the caller (communication accounting: "comm/data/all_reduce/bytes")
// to the interval. At the next log the mean per iteration of every tag added is written as a JSONL
// key and a TensorBoard scalar, and under wall_clock_breakdown printed as a line
// ("communication per iteration | tag: value | ..."), then cleared. Tags keep their first-use order.
void neox_metrics_add(neox_metrics *m, const char *tag, double value);
// Sets a value measured by the caller that is reported as it stands, not averaged (a gauge: the
// peak memory "memory/peak_rss_bytes"): at each log the latest value set is written as a JSONL key
// and a TensorBoard scalar.
void neox_metrics_set(neox_metrics *m, const char *tag, double value);
// Makes everything written so far durable (fsync); call when a checkpoint is saved.
int neox_metrics_flush(neox_metrics *m, neox_error *err);
// Flushes and closes; frees m even when that fails. NULL is allowed.
int neox_metrics_close(neox_metrics *m, neox_error *err);

// The lines themselves (NUL-terminated, no newline; truncated to size).
// " samples/sec: ... | iteration  100/ 1000 | elapsed time per iteration (ms): ... | ... |"
void neox_format_train_line(const neox_train_summary *s, char *buf, size_t size);
// "time (ms) | forward: 12.34 | backward: 5.67"; ms per iteration of the timers that ran. Returns 0
// (and an empty buf) when none ran.
int neox_format_timer_line(const neox_timer *timers, int64_t iterations, char *buf, size_t size);
// " validation results at iteration 100 | lm_loss value: ... | lm_loss_ppl value: ... | "
void neox_format_eval_line(const char *chart, const char *prefix, double lm_loss, char *buf, size_t size);
void neox_format_eval_line_values(const char *chart, const char *prefix, double lm_loss, const neox_eval_value *more,
                                  int nmore, char *buf, size_t size);

#endif
