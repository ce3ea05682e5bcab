// internal.h: the trainer's state, shared by the files of lib/train/ (set-up, step, optimizer,
// evaluation, checkpoints, loop). Nothing here is part of the public API (lib/train.h).
#ifndef NEOX_TRAIN_INTERNAL_H
#define NEOX_TRAIN_INTERNAL_H

#include <jansson.h>
#include <signal.h>
#include <stdint.h>

#include "checkpoint.h"
#include "ckpt.h"
#include "config.h"
#include "kernels/backend.h"
#include "data.h"
#include "metrics.h"
#include "model.h"
#include "optim.h"
#include "gradient.h"
#include "tokenizer.h"
#include "train.h"


// Everything a checkpoint restores besides tensors: the run's position.
typedef struct neox_train_state {
    int64_t iteration;             // completed iterations
    int64_t optimizer_steps;       // updates applied (Adam's bias-correction step; skipped steps excluded)
    int64_t train_position;        // global micro-batches consumed from the train split
    int64_t valid_position;        // ... from the valid split
    uint64_t seed;                 // the run's seed
    int64_t dropout_rows;          // batch rows of the whole run that drew dropout masks (the RNG counter)
    int64_t skipped_total;         // steps skipped over the run
    int64_t nonfinite_in_a_row;
    int64_t overflow_skips;        // fp16 steps skipped for an overflow (the LR schedule does not advance)
} neox_train_state;

// comms_logger (DeepSpeed's keys): the end-of-run summary, per-step verbose lines, the operations shown.
typedef struct neox_comms_logger {
    int enabled, verbose, prof_all, debug;
    unsigned prof_ops;             // bit per neox_comm_op, used when prof_all is false
} neox_comms_logger;
enum { NEOX_TRAIN_COMM_GROUPS = 9 };

// train_impl: kto (kto.c): its weights and metric sums.
typedef struct neox_kto {
    neox_kto_weights w;
    double sums[NEOX_KTO_METRICS]; // metric sums over micro-batches since neox_train_dpo_begin
} neox_kto;

// Metrics a preference method logs at most (DPO's eight, KTO's nine).
enum { NEOX_PREFERENCE_MAX_METRICS = 16 };

// train_impl: dpo (preference.c), and the reference model and buffers KTO shares with it.
typedef struct neox_dpo {
    neox_kto *kto;                 // train_impl kto (the loss and metrics are kto.c's); NULL for DPO
    neox_model *reference;         // the frozen reference; NULL with dpo_reference_free
    int reference_loaded;          // its weights came from the checkpoint (a resumed DPO run)
    double beta;                   // dpo_beta
    int pairs;                     // pairs per micro-batch (the model runs 2 x pairs rows; KTO: rows)
    double *policy_lp, *ref_lp;    // (rows, T): log p(label) per position
    float *weights;                // (rows, T): the loss's gradient per token loss
    double sums[NEOX_DPO_METRICS]; // metric sums over micro-batches since neox_train_dpo_begin
    int64_t micro_batches;
} neox_dpo;   // world, pipe, data, model, embed, data_intra, data_inter

// train_impl: rm (reward_model.c).
typedef struct neox_rm {
    double z_loss;
    int pairs;                     // pairs per micro-batch (the model runs 2 x pairs rows)
    float *values, *grads;         // (2 x pairs, T): the value head's output and the loss's gradient
    double sums[NEOX_RM_METRICS];  // metric sums over micro-batches since neox_train_rm_begin
    int64_t micro_batches;
} neox_rm;

struct neox_trainer {
    const neox_config *cfg;
    neox_grid *grid;
    neox_train_options opts;
    int rank0;                     // world rank 0: prints and writes run-wide files

    neox_tokenizer *tokenizer;
    int32_t eod_id;
    neox_model *model;
    int64_t nonfinite_loss_in_a_row;  // steps ending now whose loss was NaN or inf (fp16 overflows aside)
    // Where the model, gradients and optimizer state live (`compute_backend`), and the linear layers'
    // precision; fp16 scales the loss with DeepSpeed's dynamic loss scaler (static 1 otherwise).
    const neox_backend *be;
    neox_precision precision;
    neox_loss_scaler scaler;

    // Sizes.
    int micro_batch, grad_accum, seq_length;
    int rows;                      // rows the model runs per micro-batch: micro_batch, or 2 x micro_batch pairs (DPO)
    int64_t train_iters, train_batch_size;

    // Optimizer: state buffers parallel to [state_begin, state_end) of the parameter buffer (fp32
    // params are the master weights): the whole buffer, or under ZeRO this rank's partition.
    neox_optimizer_settings optim;   // as the config sets it (read before the state exists)
    neox_optimizer *optimizer;     // its state covers [state_begin, state_end) of the flat buffers
    double *step_sumsq;            // the device step's sum of squares (one double on be), else NULL
    neox_lr_schedule lr;
    // How the gradients cross the data-parallel group (lib/gradient's exchange, made by
    // grad_exchange.c at every data-parallel size): the reducers, ZeRO-2's partition sums, sparse
    // rows, the compressors (1-bit Adam's momentum compressor among them: the optimizer borrows it)
    // and the adaptive plan, with their memory, report and checkpoint state.
    neox_grad_exchange *exchange;
    // The ZeRO stage (0 whenever data-parallel size is 1): the exchange reduces by it, and the
    // optimizer state, the weights' gathers and the checkpoint's layout are partitioned by it.
    int zero_stage;
    size_t part_begin, part_end;   // this rank's data-parallel partition of the flat buffers
    size_t state_begin, state_end; // what the optimizer updates and keeps state for
    // ZeRO-3 (zero3.c): the fp32 master weights of the partition, the coordinator that gathers the
    // model's units into its flat buffer, and the model's traces (0: forward, 1: forward + backward).
    float *param_partition;
    neox_param_gather *gather;
    int *trace[3], trace_len[3];   // by neox_zero3_pass (the backward trace is the end of the training one)
    // ZeRO-Offload (offload.c): the optimizer state on the host, with host copies of the weights it
    // updates and of their gradients ([state_begin, state_end)); NULL when the optimizer is not offloaded.
    struct neox_offload *offload;
    // Expert parallelism (expert_parallel.c): moe_expert_parallel_size (the exchange reduces this
    // rank's experts, the model's parameters from dense_params on, over the grid's expert_data group).
    int ep_size;

    // Pipeline (the model's activation slots hold the micro-batches in flight on this stage).
    float *pipe_grad_send;         // (B, T, C): the input gradient in flight to the previous stage

    // Data.
    neox_data_settings data_settings;
    neox_dataset *datasets[3];     // train, valid, test; NULL when a split is empty
    neox_batch_iterator train_it, valid_it;
    neox_batch *batch;             // rows: micro_batch samples x their rows (2 for pairwise data)
    neox_dpo *dpo;                 // train_impl: dpo; NULL otherwise
    neox_rm *rm;                   // train_impl: rm; NULL otherwise
    neox_prefetch *prefetch;       // num_workers >= 1: the next batch read behind the current one

    neox_metrics *metrics;
    // log_param_norm: the whole model's parameter names and, after each step, their norms
    // (norms[nnorms]: of all parameters).
    int nnorms;
    char **norm_names;
    double *norms;
    // eval_tasks: the tasks scored with each validation evaluation, and the evaluator (lib/eval)
    // over this trainer's model and tokenizer that scores them (NULL: none).
    const char *task_names[16];
    int ntasks;
    struct neox_evaluator *task_eval;
    neox_train_state state;
    neox_comms_logger comms_logger;
    neox_comm_stats comm_before[NEOX_TRAIN_COMM_GROUPS];   // each group's statistics when the step began

    // Checkpoint schedule.
    const char *save_dir, *load_dir;
    int64_t *save_iters;
    int nsave_iters;
    int64_t last_saved;            // iteration of the last checkpoint written or loaded (-1: none)
    int keep_last;
};

// ---- set-up pieces (setup.c) ----------------------------------------------------------------
int neox_train_read_schedule(const neox_config *cfg, neox_lr_schedule *lr, neox_error *err);

// ---- the step (step.c) ----------------------------------------------------------------------
typedef struct neox_step_result {
    double loss;          // mean over micro-batches and data-parallel ranks
    double grad_norm;     // before clipping
    double lr;
    int skipped;          // non-finite loss or gradients: no update
    int nonfinite_loss;
    double loss_scale;    // the loss scale after this step's update (fp16; 1 otherwise)
} neox_step_result;

// Runs gradient_accumulation_steps micro-batches, reduces, clips and updates.
int neox_train_step(neox_trainer *t, neox_step_result *out, neox_error *err);
// Mean loss over eval_iters x gradient_accumulation_steps micro-batches of `it` (dropout off).
int neox_train_evaluate(neox_trainer *t, neox_batch_iterator *it, int64_t iters, double *loss, neox_error *err);

// ---- the pipeline schedule (pipeline.c) -----------------------------------------------------
// Runs gradient_accumulation_steps micro-batches forward and backward through the stages in
// 1F1B order (one stage: forward, backward, forward, ...); *loss_sum gets the sum of the
// micro-batch losses on every rank.
int neox_train_pipeline_step(neox_trainer *t, double *loss_sum, neox_error *err);
// Forward only over count micro-batches of it; *loss_sum as above.
int neox_train_pipeline_eval(neox_trainer *t, neox_batch_iterator *it, int64_t count, double *loss_sum, neox_error *err);
// After a micro-batch's backward: the tied-embedding sum and the data-parallel reduction, when due
// (neox_grad_exchange_micro_batch said so).
void neox_train_after_backward(neox_trainer *t);
// The parameter whose gradient is summed between the first and last stage (the tied embedding,
// with pipelining), or -1: the exchange holds it back until then.
int neox_train_tied_param(const neox_trainer *t);
// Lets backward start data-parallel buckets as their gradients become final (overlap_comm).
void neox_train_install_grad_hook(neox_trainer *t);

// ---- the optimizer (optimizer.c) ------------------------------------------------------------
// Global L2 norm of the gradients over every rank (each element counted once).
double neox_train_grad_norm(const neox_trainer *t);
// Expert parallelism (expert_parallel.c). Reads moe_expert_parallel_size, refuses what it cannot
// combine with, makes the grid's expert groups and sets desc's share of the experts.
int neox_train_setup_expert_parallel(neox_trainer *t, neox_model_desc *desc, neox_error *err);
// The group ZeRO partitions the flat buffers over (and checkpoints cut them over): the data group,
// or under expert parallelism the expert-data group; and rank r's partition [*begin, *end) of it.
neox_comm *neox_train_state_group(const neox_trainer *t);
void neox_train_partition(const neox_trainer *t, int r, size_t *begin, size_t *end);
// Whether this rank writes parameter i into checkpoints as far as expert parallelism goes: experts
// always (its own), the rest on the first rank of its expert group only.
int neox_train_ep_writes(const neox_trainer *t, int i);
// Multiplies the gradients by unscale (1 / loss scale) and by DeepSpeed's clipping coefficient
// (neox_clip_coefficient of the unscaled gradients' norm); one pass.
void neox_train_clip(neox_trainer *t, double norm, double unscale);
// Applies one update of this rank's range with learning rate lr (step: the 1-based update count),
// then under ZeRO gathers the other ranks' partitions.
void neox_train_update(neox_trainer *t, double lr, int64_t step);
// Bytes of MPI's temporary for one all-gather of the updated partitions (stages 1, 2 on the host), else 0.
size_t neox_train_gather_scratch_bytes(const neox_trainer *t);
// The device step, for AdamW on one rank of a device backend (t->step_sumsq set at setup): queues the
// gradients' sum of squares into t->step_sumsq, the unscaling and clipping by it and the update
// guarded by it (skipped on the device when the norm is not finite), then reads the sum back once,
// the step's only wait for the device after its loss. Returns the sum of squares.
double neox_train_device_update(neox_trainer *t, double loss_scale, double lr, int64_t step);

// ---- memory (memory_report.c) -----------------------------------------------------------------
// The bytes one rank plans, by region: what the start-up "memory of rank N" line prints and the
// bytes-per-parameter table of docs/memory.md is made of.
typedef struct neox_memory_plan {
    double params;       // fp32 parameters (the master weights), DPO's and KTO's reference model's too
    double params16;     // their 16-bit copies for the products (bf16 and fp16 precision)
    double grads;        // fp32 gradients: the flat buffer's resident part, ZeRO-2's partition, the reference's
    double optimizer;    // optimizer state of the rank's partition (Adam's moments, SGD's momentum)
    double activations;  // the activation plan (every pipeline slot; the reference model's)
    double comm;         // communication: the 16-bit gradient wire copy, the pipeline's gradient send buffer,
                         // compression's error buffers
    double offloaded;    // host memory of state offloaded from the device (optimizer offload: the state and
                         // the host copies of the weights and gradients it updates)
} neox_memory_plan;
void neox_train_memory_plan(const neox_trainer *t, neox_memory_plan *p);
// At start-up (a collective): every rank's plan, printed by rank 0 and written to log_dir/memory_plan.json.
void neox_train_report_memory_plan(const neox_trainer *t);
// At each log (a collective): the measured peaks as metrics gauges, rank 0's and the largest rank's.
void neox_train_memory_gauges(neox_trainer *t);
// At the end (a collective): every rank's measured peaks and planned total in log_dir/memory_peaks.json.
int neox_train_write_memory_peaks(const neox_trainer *t, neox_error *err);

// ---- ZeRO stage 3 (zero3.c) -------------------------------------------------------------------
// After the reducer (the partition is known): refuses what stage 3 cannot serve, makes the
// partition's master weights and the parameter coordinator with the stage3_* keys.
int neox_train_setup_zero3(neox_trainer *t, neox_error *err);
void neox_train_free_zero3(neox_trainer *t);
// After the partition's weights are initialised or loaded (into t->param_partition, never whole):
// the persistent tensors are gathered and the model's weights_use hook installed.
void neox_train_zero3_take_weights(neox_trainer *t);
// Around one micro-batch's use of the model: its forward, its forward and backward as one pass, or
// (under pipelining, where 1F1B runs other micro-batches' forwards in between) its backward.
typedef enum { NEOX_ZERO3_FORWARD, NEOX_ZERO3_TRAIN, NEOX_ZERO3_BACKWARD } neox_zero3_pass;
void neox_train_zero3_begin(neox_trainer *t, neox_zero3_pass pass);
void neox_train_zero3_end(neox_trainer *t);
// The whole model in the flat buffer until neox_train_zero3_end (readers outside a pass).
void neox_train_zero3_gather_all(neox_trainer *t);
// Parameter elements a rank holds whole at most: the peak of a training pass plus the persistent tensors.
size_t neox_train_zero3_planned_elements(const neox_trainer *t);
// After the optimizer updated the partition: the persistent tensors are gathered again.
void neox_train_zero3_after_update(neox_trainer *t);

// ---- ZeRO-Offload of the optimizer (offload.c) ---------------------------------------------------
// Once [state_begin, state_end) is known, before the optimizer is made: whether its state goes to
// the host (t->offload; a notice on a host backend, where nothing moves).
int neox_train_setup_offload(neox_trainer *t, neox_error *err);
// Where the optimizer state lives: the host under offload, else the trainer's backend.
const neox_backend *neox_train_optimizer_backend(const neox_trainer *t);
// After the weights are initialised or loaded: the host copy of the range the optimizer updates.
void neox_train_offload_take_weights(neox_trainer *t);
// Host buffers page-locked (offload_optimizer.pin_memory).
int neox_train_offload_pinned(const neox_trainer *t);
// Before a step's first backward: no gradient of it is on its way to the host yet.
void neox_train_offload_begin_step(neox_trainer *t);
// Backward's hook on the step's last micro-batch: parameters [begin, end) have their final gradients.
void neox_train_offload_grads_ready(neox_trainer *t, int begin, int end);
// Clipping (and 1 / loss scale) for an optimizer that does not scale the gradients as it reads them:
// applied to the host copy once it has arrived.
void neox_train_offload_scale_grads(neox_trainer *t, double coef);
// One update on the host from the gradients of the range (device memory), queued back to the device.
void neox_train_offload_step(neox_trainer *t, const float *grads, const neox_segment *segs, int nseg, double lr,
                             int64_t step);
// Before a reader of the weights outside a forward pass: every updated unit is on the device.
void neox_train_offload_settle(neox_trainer *t);
// What the copies did over the run (comm_stats.json's "offload").
typedef struct neox_offload_stats {
    int64_t steps;                  // updates on the host
    int64_t grad_bytes;             // gradient bytes copied to the host
    int64_t grad_bytes_in_backward; // of them, queued while backward ran
    int64_t units_copied;           // units' updated weights queued back to the device
    int64_t units_waited_by_forward;  // of them, waited for by the next forward just before it read them
} neox_offload_stats;
neox_offload_stats neox_train_offload_stats(const neox_trainer *t);
void neox_train_free_offload(neox_trainer *t);

// ---- the gradient exchange (grad_exchange.c) ----------------------------------------------------
// Reads the exchange's keys (communication_data_type, overlap_comm, comm_progress_thread_us,
// sparse_gradients, gradient_compression and its keys, 1-bit Adam's freeze_step), refuses the
// combinations it cannot serve and makes t->exchange (after the model and t->zero_stage; at every
// data-parallel size).
int neox_train_setup_exchange(neox_trainer *t, neox_error *err);
// The exchange's checkpoint state, shaped as a checkpoint part: with w, this rank's compressor
// buffers as tensors NAME/rank_RRRRR of its shard; with state, train.json's "gradient_compression".
int neox_train_exchange_save(const neox_trainer *t, neox_ckpt_writer *w, json_t *state, neox_error *err);
// Its load: with r, the buffers (when the checkpoint's layout is this run's, else they start from
// zero with a notice); with state (train.json), the adaptive plan. dir names the checkpoint.
int neox_train_exchange_load(neox_trainer *t, const neox_ckpt_reader *r, json_t *state, const char *dir,
                             neox_error *err);

// ---- activation recompute (recompute.c) ------------------------------------------------------
// Reads partition_activations and checkpoint_in_cpu (both spellings) into desc (its layout and
// checkpoint_activations set; needs t->be), with a notice for each set where it does nothing.
void neox_train_setup_recompute(neox_trainer *t, neox_model_desc *desc);

// ---- sparse_gradients (sparse_embedding.c) ---------------------------------------------------
// Refuses combinations it cannot serve; sets the exchange's sparse rows for an untied input
// embedding (needs the model, the grid and t->zero_stage).
int neox_train_sparse_settings(const neox_trainer *t, neox_grad_exchange_settings *s, neox_error *err);

// ---- evaluations (evaluation.c) ------------------------------------------------------------
int neox_train_setup_eval_tasks(neox_trainer *t, neox_error *err);  // (nothing unless eval_tasks)
void neox_train_free_eval_tasks(neox_trainer *t);
// Evaluates eval_iters x accumulation micro-batches of it and logs the results under chart
// ("validation" or "test") with prefix ("iteration 100"): lm_loss, lm_loss_ppl, with
// char_level_ppl lm_loss_char_lvl_ppl, with with_tasks the eval_tasks scores.
int neox_train_evaluate_and_log(neox_trainer *t, neox_batch_iterator *it, const char *chart, const char *prefix,
                                int with_tasks, neox_error *err);

// ---- log_param_norm (param_norm.c) ---------------------------------------------------------
int neox_train_setup_param_norms(neox_trainer *t, neox_error *err);  // (nothing unless log_param_norm)
void neox_train_free_param_norms(neox_trainer *t);
// Fills t->norms after a step; a collective over the world.
void neox_train_param_norms(neox_trainer *t);

// ---- DPO (preference.c) -----------------------------------------------------------------------
// Checks train_impl against dataset_impl and, for dpo, makes the reference model (after the model).
int neox_train_setup_dpo(neox_trainer *t, neox_error *err);
int neox_train_rows_per_sample(const neox_config *cfg);  // 2 for train_impl dpo, else 1
void neox_train_free_dpo(neox_trainer *t);
void neox_train_dpo_start(neox_trainer *t);  // after loading: the reference takes the starting weights
int neox_train_dpo_save(const neox_trainer *t, neox_ckpt_writer *w, neox_error *err);
int neox_train_dpo_load(neox_trainer *t, const neox_ckpt_reader *r, neox_error *err);
// After the reference's and the policy's forward of batch b (last stage): the DPO loss of the
// micro-batch into *loss, the token weights of its backward set, the metrics accumulated.
int neox_train_dpo_loss(neox_trainer *t, const neox_batch *b, double *loss);
void neox_train_dpo_begin(neox_trainer *t);
// The metrics since begin (a collective over the data-parallel group); returns how many.
int neox_train_dpo_metrics(neox_trainer *t, neox_eval_value *out);
// The reference model and the buffers of t->dpo (rows x seq_length), after the policy exists.
int neox_train_make_reference(neox_trainer *t, neox_error *err);
// KTO (kto.c): the set-up (called by neox_train_setup_dpo), the reward datasets' check (after the
// datasets), the loss of a micro-batch and the metrics (called by the DPO entry points for KTO).
int neox_train_is_kto(const neox_config *cfg);
int neox_train_setup_kto(neox_trainer *t, neox_error *err);
int neox_train_check_kto_data(const neox_trainer *t, neox_error *err);
int neox_train_kto_loss(neox_trainer *t, const neox_batch *b, double *loss);
int neox_train_kto_metrics(neox_trainer *t, neox_eval_value *out);

// ---- reward models (reward_model.c) ---------------------------------------------------------
int neox_train_is_rm(const neox_config *cfg);
// Checks the keys of train_impl rm (z_loss is refused without it) and makes its buffers.
int neox_train_setup_rm(neox_trainer *t, neox_error *err);
void neox_train_free_rm(neox_trainer *t);
// After the forward of batch b (last stage): the loss into *loss, the metrics accumulated and, when
// training, the value gradients of its backward set. A sequence without exactly one scored
// position is an error.
int neox_train_rm_loss(neox_trainer *t, const neox_batch *b, int training, double *loss, neox_error *err);
void neox_train_rm_begin(neox_trainer *t);
int neox_train_rm_metrics(neox_trainer *t, neox_eval_value *out);  // a collective; returns how many

// ---- checkpoints (checkpoint.c) -------------------------------------------------------------
// Writes this rank's data-parallel share of a flat buffer laid out as the model's parameters
// (buf[0] is element base) as blocks of the global tensors GROUP/NAME.
int neox_train_write_share_of(const neox_trainer *t, neox_ckpt_writer *w, const char *group, const float *buf,
                              size_t base, neox_error *err);
int neox_train_save(neox_trainer *t, neox_error *err);
// Loads SAVE/latest of load_dir (when there is one) as the config's load options say.
int neox_train_load(neox_trainer *t, neox_error *err);
// The weights from the seed (GPT-NeoX's init methods): what neox_train_load runs when no checkpoint
// supplies them.
void neox_train_init_weights(neox_trainer *t);

// ---- the LR schedule on resume (resume_schedule.c) ------------------------------------------
// Refuses override_lr_scheduler together with use_checkpoint_lr_scheduler (at set-up).
int neox_train_check_schedule_keys(const neox_config *cfg, neox_error *err);
// Applies a checkpoint's stored lr_schedule (a JSON object; NULL: none stored) to t->lr as the two
// keys say; with neither, a schedule that differs from the config's is an error naming the value.
int neox_train_resume_schedule(neox_trainer *t, json_t *saved, neox_error *err);

// ---- communication accounting (comm_log.c) ----------------------------------------------------
// Group i of the grid (0 world, 1 pipe, 2 data, 3 model, 4 embed, 5 data_intra, 6 data_inter) and its name.
neox_comm *neox_train_comm_group(neox_grid *g, int i, const char **name);
int neox_train_read_comms_logger(const neox_config *cfg, neox_comms_logger *out, neox_error *err);
// Around each step: the difference of every group's statistics goes to the metrics.
void neox_train_comm_step_begin(neox_trainer *t);
void neox_train_comm_step_end(neox_trainer *t);
// Rank 0, with comms_logger.enabled: prints its summary and writes log_dir/comms_summary.txt from
// every rank's statistics (NEOX_TRAIN_COMM_GROUPS per rank, rank-major).
int neox_train_write_comms_summary(neox_trainer *t, const neox_comm_stats *stats, neox_error *err);

// ---- communication report (comm_report.c) ---------------------------------------------------
// Gathers every rank's communicator statistics and writes log_dir/comm_stats.json (rank 0).
int neox_train_write_comm_report(neox_trainer *t, neox_error *err);

// ---- signals (loop.c) -----------------------------------------------------------------------
extern volatile sig_atomic_t neox_train_stop_signal;

#endif
