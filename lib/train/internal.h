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

enum { NEOX_TRAIN_COMM_GROUPS = 10 };
enum { NEOX_TRAIN_MAX_PARTS = 16 };

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

typedef struct neox_late_read neox_late_read;
typedef struct neox_step_scalars_block neox_step_scalars_block;
typedef struct neox_graph neox_graph;

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
    // precision; fp16 scales the loss with DeepSpeed's dynamic loss scaler (static 1 otherwise; the
    // loss scaler part, loss_scaler.c, reads, saves and updates it; the passes read its scale).
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
    neox_late_read *late;          // the device step's values read a step late (step.c), else NULL
    neox_step_scalars_block *scalars;  // the update's learning rate and step on be (step_scalars.c)
    neox_graph *graph;             // the captured step (graph.c: cuda_graph), else NULL
    neox_lr_schedule lr;           // the LR schedule part's (resume_schedule.c); the step reads it
    // How the gradients cross the data-parallel group (lib/gradient's exchange, made by
    // grad_exchange.c at every data-parallel size): the reducers, ZeRO-2's partition sums, sparse
    // rows, the compressors (1-bit Adam's momentum compressor among them: the optimizer borrows it)
    // and the adaptive plan, with their memory, report and checkpoint state (its part: grad_exchange.c).
    neox_grad_exchange *exchange;
    // The ZeRO stage (0 whenever data-parallel size is 1): the exchange reduces by it, and the
    // optimizer state, the weights' gathers and the checkpoint's layout are partitioned by it.
    int zero_stage;
    size_t part_begin, part_end;   // this rank's data-parallel partition of the flat buffers
    size_t state_begin, state_end; // what the optimizer updates and keeps state for
    // ZeRO-3: the fp32 master weights of the partition (the flat buffer holds only what zero3.c's
    // coordinator has gathered); NULL otherwise.
    float *param_partition;
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
    neox_prefetch *prefetch;       // num_workers >= 1: the next batch read behind the current one

    neox_metrics *metrics;
    neox_train_state state;
    // The registered parts' own state (parts.c), by their place in the table; NULL while unused.
    void *part_state[NEOX_TRAIN_MAX_PARTS];

    // Checkpoint schedule.
    const char *save_dir, *load_dir;
    int64_t *save_iters;
    int nsave_iters;
    int64_t last_saved;            // iteration of the last checkpoint written or loaded (-1: none)
    int keep_last;
};

// ---- the step (step.c) ----------------------------------------------------------------------
typedef struct neox_step_result {
    double loss;          // mean over micro-batches and data-parallel ranks
    double grad_norm;     // before clipping
    double lr;
    int skipped;          // non-finite loss or gradients: no update
    int nonfinite_loss;
    double loss_scale;    // the loss scale after this step's update (fp16; 1 otherwise)
    int64_t iteration;    // the iterations completed with this step
    int pending;          // queued with its values still on the device (the late read): the loop logs
                          // the result neox_train_take_settled gives for it instead
} neox_step_result;

// Runs gradient_accumulation_steps micro-batches, reduces, clips and updates.
int neox_train_step(neox_trainer *t, neox_step_result *out, neox_error *err);
// The late read (step.c): made at the end of set-up when the step is the device step and no part
// replaces the loss or logs from the step's state (neox_train_parts_allow_late_log); freed with the trainer.
void neox_train_late_setup(neox_trainer *t);
void neox_train_late_free(neox_trainer *t);
// Where micro-batch k of the step being queued leaves its loss pair (2 doubles on be).
double *neox_train_late_loss_slot(neox_trainer *t, int micro_batch);
// Reads the queued step's values (a host_wait for their copy) and completes its result: loss, norm,
// skip, the count of updates, the parts' after_update. 0 at once when nothing is queued; -1 (err)
// when an after_update hook fails (the loss scaler at its minimum).
int neox_train_settle(neox_trainer *t, neox_error *err);
// neox_train_settle when the next backward needs the previous step's decision (a dynamic loss scale).
int neox_train_settle_before_backward(neox_trainer *t, neox_error *err);
// The settled step the loop has not logged yet, once: 1 and *out, with what that step added to the
// wall_clock_breakdown timers (kept apart, for its own log line, while the next step ran), or 0.
int neox_train_take_settled(neox_trainer *t, neox_step_result *out, neox_timer timers[NEOX_TIMER_COUNT]);
// The step's device work and decisions as neox_train_step runs them between the parts' begin_step
// and end_step (graph.c runs them eagerly, or inside a capture).
int neox_train_run_step(neox_trainer *t, neox_step_result *out, neox_error *err);
// A replayed step's result as the late read keeps it (its values wait on the device for
// neox_train_settle): what late_step records after queuing the update, without queuing anything;
// ticket: the launch's, which the settle waits for.
void neox_train_late_replayed(neox_trainer *t, neox_step_result *out, double scale, int64_t ticket);
// Mean loss over eval_iters x gradient_accumulation_steps micro-batches of `it` (dropout off).
int neox_train_evaluate(neox_trainer *t, neox_batch_iterator *it, int64_t iters, double *loss, neox_error *err);

// ---- the pipeline schedule (pipeline.c) -----------------------------------------------------
// Runs gradient_accumulation_steps micro-batches forward and backward through the stages in
// 1F1B order (one stage: forward, backward, forward, ...); *loss_sum gets the sum of the
// micro-batch losses on every rank.
int neox_train_pipeline_step(neox_trainer *t, double *loss_sum, neox_error *err);
// A captured step's inputs (graph.c): the step's micro-batches read and staged in the model's
// page-locked sets, k in set k, with their dropout rows counted, as the step's forwards would, and
// the staged step scalars written (each one's dropout row and loss gradient scale, the loss scale),
// which the capture's kernels read. One stage only.
int neox_train_pipeline_fill_inputs(neox_trainer *t, neox_error *err);
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
// Context parallelism (context_parallel.c): the context groups and the model's share of each sequence.
int neox_train_setup_context_parallel(neox_trainer *t, neox_model_desc *desc, neox_error *err);
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
// Per-tensor accumulators (SM3): this rank's tensors as the optimizer sees them (neox_calloc'ed, *n
// of them), and giving them to the made optimizer with the combination of its partial maxima
// (refused, naming the optimizer, where the tensors cannot carry them).
neox_optimizer_tensor *neox_train_optimizer_tensors(const neox_trainer *t, int *n);
int neox_train_setup_accumulators(neox_trainer *t, neox_error *err);
// Their checkpoint tensors (accumulators.c): this rank's blocks of them written, and read back
// whatever layout wrote them; nothing for an optimizer without them.
int neox_train_save_accumulators(const neox_trainer *t, neox_ckpt_writer *w, neox_error *err);
int neox_train_load_accumulators(neox_trainer *t, const neox_ckpt_reader *r, neox_error *err);
// The step scalars (step_scalars.c): made at set-up, freed with the trainer. write sets the host copy
// (lr, the 1-based update count) for the next update; send queues its one copy up and returns the
// block on be, which the update's ops read (neox_train_update does both; a replayed step only writes).
void neox_train_step_scalars_setup(neox_trainer *t);
void neox_train_step_scalars_free(neox_trainer *t);
void neox_train_step_scalars_write(neox_trainer *t, double lr, int64_t step);
const neox_step_scalars *neox_train_step_scalars_send(neox_trainer *t);
// The staged step's part, which a captured step's kernels read: set_micro writes micro-batch k's entry
// of the host copy (its first dropout row, its loss gradient's scale) and set_loss_scale the step's
// loss scale while the step is staged; send_staged queues the copy up (a capture does, as it begins,
// so every launch makes it again); dropout_row, head_scale and loss_scale are the values on be, for
// the model's dropout_row0_at and head_scale_at and the update's clip_by_norm.
void neox_train_step_scalars_set_micro(neox_trainer *t, int k, unsigned long long dropout_row0, float head_scale);
void neox_train_step_scalars_set_loss_scale(neox_trainer *t, double loss_scale);
void neox_train_step_scalars_send_staged(neox_trainer *t);
const unsigned long long *neox_train_step_scalars_dropout_row(const neox_trainer *t, int k);
const float *neox_train_step_scalars_head_scale(const neox_trainer *t, int k);
const double *neox_train_step_scalars_loss_scale(const neox_trainer *t);
// The captured step (graph.c, `cuda_graph`): set-up (the end of neox_trainer_create: refuses, naming
// the feature, where the step cannot be captured, and then trains eagerly), the step in its place, free.
int neox_train_graph_setup(neox_trainer *t, neox_error *err);
int neox_train_graph_step(neox_trainer *t, neox_step_result *out, neox_error *err);
void neox_train_graph_free(neox_trainer *t);
// Bytes of MPI's temporary for one all-gather of the updated partitions (stages 1, 2 on the host), else 0.
size_t neox_train_gather_scratch_bytes(const neox_trainer *t);
// The device step, for AdamW, SGD or Lion on one rank of a device backend (t->step_sumsq set at setup): queues the
// gradients' sum of squares into t->step_sumsq, the unscaling and clipping by it and the update
// guarded by it (skipped on the device when the norm is not finite), then reads the sum back once,
// the step's only wait for the device after its loss. Returns the sum of squares.
double neox_train_device_update(neox_trainer *t, double loss_scale, double lr, int64_t step);
// The same queued with nothing read back, for the late read: the sum of squares into sumsq (on be),
// the guard (on be) from it and the micro-batches' loss pairs loss_sums (2 x gradient_accumulation_steps
// on be), the unscaling and clipping, and the update guarded by it.
void neox_train_device_update_guarded(neox_trainer *t, double *sumsq, const double *loss_sums, double *guard,
                                      double loss_scale, double lr, int64_t step);

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
// The plan by owner: fn gets each owner's name and its bytes by region (the trainer's own buffers,
// then each part's); the plan is their sum, so a snapshot and the plan cannot disagree.
typedef void (*neox_memory_owner_fn)(void *ctx, const char *owner, const neox_memory_plan *bytes);
void neox_train_memory_owners(const neox_trainer *t, neox_memory_owner_fn fn, void *ctx);
// memory_profiling: this rank's snapshot after the step just counted, as
// DIR/memory_snapshot_rankR_iterN.json (docs/metrics.md, "Profiling a run").
int neox_train_write_memory_snapshot(const neox_trainer *t, const char *dir, neox_error *err);
// At start-up (a collective): every rank's plan, printed by rank 0 and written to log_dir/memory_plan.json.
void neox_train_report_memory_plan(const neox_trainer *t);
// At each log (a collective): the measured peaks as metrics gauges, rank 0's and the largest rank's.
void neox_train_memory_gauges(neox_trainer *t);
// At the end (a collective): every rank's measured peaks and planned total in log_dir/memory_peaks.json.
int neox_train_write_memory_peaks(const neox_trainer *t, neox_error *err);

// ---- profile (profile.c) -------------------------------------------------------------------------
// Around each step of the loop: the step's range, the window's capture started before its first step
// and its trace written after its last, memory_profiling's snapshots; finish writes a trace whose
// window the run ended inside.
void neox_train_profile_begin_step(neox_trainer *t);
int neox_train_profile_end_step(neox_trainer *t, neox_error *err);
int neox_train_profile_finish(neox_trainer *t, neox_error *err);

// ---- ZeRO stage 3 (zero3.c) -------------------------------------------------------------------
// (A trainer part: set-up, start, free, memory, report and the passes' begin_pass and end_pass are
// its table's; see zero3.c.)
// Ends a pass or a gather_all (its end_pass hook).
void neox_train_zero3_end(neox_trainer *t);
// The most elements of an embedding piece that ZeRO-3's live bound allows (read from the stage-3
// keys before the part is set up: the model's pieces are chosen before the gradient exchange).
size_t neox_train_zero3_piece_limit(const neox_trainer *t);
// The whole model in the flat buffer until neox_train_zero3_end (readers outside a pass).
void neox_train_zero3_gather_all(neox_trainer *t);
// The partition's initial weights from the seed (neox_train_init_weights when no checkpoint gives them).
void neox_train_zero3_init_partition(neox_trainer *t);
// After the optimizer updated the partition: the persistent tensors are gathered again.
void neox_train_zero3_after_update(neox_trainer *t);

// ---- per-parameter sums however the grid holds a tensor (param_norm.c) -------------------------
// The one owner of "a statistic of a whole parameter over the grid": each tensor counted once, its
// tensor-parallel blocks summed, replicated tensors from tensor-parallel rank 0, the tied embedding
// from the first stage, a buffer every data-parallel rank holds whole from one replica, ZeRO
// partitions summed over the state group (under expert parallelism each expert from the ranks
// holding it). log_param_norm, log_grad_norm, log_grad_pct_zeros, log_optimizer_states and the
// gradient noise scale all go through it.
typedef enum { NEOX_PARAM_SUM_SQUARES, NEOX_PARAM_SUM_ZEROS } neox_param_sum;
// A flat buffer laid out as the parameters, as this rank holds it: buf[0] is element `begin` of the
// layout and [begin, end) is all it holds; partitioned: [begin, end) is this rank's ZeRO partition
// (the other ranks of the state group hold the rest), else every data-parallel rank holds the same.
typedef struct neox_flat_share {
    const neox_backend *be;   // where buf lives
    const float *buf;
    size_t begin, end;
    int partitioned;
    float *host_piece;        // counting zeros on a device backend: NEOX_FLAT_SHARE_PIECE host floats to copy through
} neox_flat_share;
enum { NEOX_FLAT_SHARE_PIECE = 1 << 18 };
// A collective over the world: sums[i] (i < nwhole, the whole model's parameter list) gets the sum
// over parameter i's elements of x^2 or of (x == 0), on every rank.
void neox_train_param_sums(const neox_trainer *t, const neox_flat_share *s, neox_param_sum what, double *sums,
                           int nwhole);
// The shares the trainer has: the weights (ZeRO-3: the partition's master weights), the reduced
// gradients of the optimizer's range (before clipping; ZeRO-2/3: the partition's sum) and
// optimizer state buffer k.
neox_flat_share neox_train_param_share(const neox_trainer *t);
neox_flat_share neox_train_grad_share(const neox_trainer *t);
neox_flat_share neox_train_optimizer_state_share(const neox_trainer *t, int k);
// The whole model's parameters (Hugging Face names, whole shapes), whatever this rank holds: neox_malloc'ed.
neox_param *neox_train_whole_params(const neox_trainer *t, int *count, neox_error *err);

// ---- ZeRO-Offload of the optimizer (offload.c) ---------------------------------------------------
// (A trainer part: set-up, start, free, memory, report, begin_step and grads_ready are its table's.)
// Its set-up decides whether the optimizer state goes to the host (a notice on a host backend).
// Whether the optimizer state (with host copies of the weights it updates and of their gradients,
// [state_begin, state_end)) lives on the host.
int neox_train_offloaded(const neox_trainer *t);
// Where the optimizer state lives: the host under offload, else the trainer's backend.
const neox_backend *neox_train_optimizer_backend(const neox_trainer *t);
// Host buffers page-locked (offload_optimizer.pin_memory).
int neox_train_offload_pinned(const neox_trainer *t);
// Clipping (and 1 / loss scale) for an optimizer that does not scale the gradients as it reads them:
// applied to the host copy once it has arrived.
void neox_train_offload_scale_grads(neox_trainer *t, double coef);
// One update on the host from the gradients of the range (device memory), queued back to the device.
void neox_train_offload_step(neox_trainer *t, const float *grads, const neox_segment *segs, int nseg, double lr,
                             int64_t step);
// Before a reader of the weights outside a forward pass: every updated unit is on the device.
void neox_train_offload_settle(neox_trainer *t);

// ---- the gradient exchange (grad_exchange.c) ----------------------------------------------------
// Reads the exchange's keys (communication_data_type, overlap_comm, comm_progress_thread_us,
// sparse_gradients, gradient_compression and its keys, 1-bit Adam's freeze_step), refuses the
// combinations it cannot serve and makes t->exchange (after the model and t->zero_stage; at every
// data-parallel size).
int neox_train_setup_exchange(neox_trainer *t, neox_error *err);

// ---- activation recompute (recompute.c) ------------------------------------------------------
// Reads partition_activations and checkpoint_in_cpu (both spellings) into desc (its layout and
// checkpoint_activations set; needs t->be), with a notice for each set where it does nothing.
void neox_train_setup_recompute(neox_trainer *t, neox_model_desc *desc);
// Reads sequence_parallel into desc (after neox_train_setup_recompute: it takes the place of
// partition_activations), refusing what it cannot do by name; a notice where it does nothing.
int neox_train_setup_sequence_parallel(neox_trainer *t, neox_model_desc *desc, neox_error *err);

// ---- sparse_gradients (sparse_embedding.c) ---------------------------------------------------
// Refuses combinations it cannot serve; sets the exchange's sparse rows for an untied input
// embedding (needs the model, the grid and t->zero_stage).
int neox_train_sparse_settings(const neox_trainer *t, neox_grad_exchange_settings *s, neox_error *err);

// ---- evaluations (evaluation.c) ------------------------------------------------------------
// Evaluates eval_iters x accumulation micro-batches of it and logs the results under chart
// ("validation" or "test") with prefix ("iteration 100"): lm_loss, lm_loss_ppl, with
// char_level_ppl lm_loss_char_lvl_ppl, with with_tasks the eval_tasks scores.
int neox_train_evaluate_and_log(neox_trainer *t, neox_batch_iterator *it, const char *chart, const char *prefix,
                                int with_tasks, neox_error *err);

// ---- DPO (preference.c) -----------------------------------------------------------------------
// (A trainer part: its set-up checks train_impl against dataset_impl and, for dpo and kto, makes
// the reference model and checks the reward datasets; start, free, save, load, memory, begin_step,
// log, the reference model of the passes and the loss are its table's.)
int neox_train_rows_per_sample(const neox_config *cfg);  // 2 for train_impl dpo, else 1
// The part's state: NULL unless train_impl is dpo or kto; make_dpo creates it (KTO's set-up).
neox_dpo *neox_train_dpo_of(const neox_trainer *t);
neox_dpo *neox_train_make_dpo(neox_trainer *t);
// The metrics since the step or evaluation began (a collective over the data-parallel group);
// returns how many.
void neox_train_dpo_begin(neox_trainer *t);
int neox_train_dpo_metrics(neox_trainer *t, neox_eval_value *out);
// The reference model and the buffers of the part's neox_dpo (rows x seq_length), after the policy exists.
int neox_train_make_reference(neox_trainer *t, neox_error *err);
// KTO (kto.c): the set-up and the reward datasets' check (called by the preference part's set-up),
// the loss of a micro-batch and the metrics (called by the DPO entry points for KTO).
int neox_train_is_kto(const neox_config *cfg);
int neox_train_setup_kto(neox_trainer *t, neox_error *err);
int neox_train_check_kto_data(const neox_trainer *t, neox_error *err);
int neox_train_kto_loss(neox_trainer *t, const neox_batch *b, double *loss);
int neox_train_kto_metrics(neox_trainer *t, neox_eval_value *out);

// ---- reward models (reward_model.c) ---------------------------------------------------------
int neox_train_is_rm(const neox_config *cfg);
neox_rm *neox_train_rm_of(const neox_trainer *t);  // the part's state: NULL unless train_impl rm
// (A trainer part: its set-up checks the keys of train_impl rm, z_loss refused without it, and makes
// its buffers; free, begin_step, log and the loss are its table's. Its loss: after the forward of
// batch b (last stage), the metrics accumulated and, when training, the value gradients of its
// backward set; a sequence without exactly one scored position is an error.)
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

// ---- communication accounting (comm_log.c) ----------------------------------------------------
// Group i of the grid (0 world, 1 pipe, 2 data, 3 model, 4 embed, 5 data_intra, 6 data_inter) and its name.
neox_comm *neox_train_comm_group(neox_grid *g, int i, const char **name);
// (comms_logger is a trainer part: its set-up reads the keys; around each step the difference of
// every group's statistics goes to the metrics.)
// Rank 0, with comms_logger.enabled: prints its summary and writes log_dir/comms_summary.txt from
// every rank's statistics (NEOX_TRAIN_COMM_GROUPS per rank, rank-major).
int neox_train_write_comms_summary(neox_trainer *t, const neox_comm_stats *stats, neox_error *err);

// ---- communication report (comm_report.c) ---------------------------------------------------
// Gathers every rank's communicator statistics and writes log_dir/comm_stats.json (rank 0).
int neox_train_write_comm_report(neox_trainer *t, neox_error *err);

// ---- trainer parts (parts.c) ------------------------------------------------------------------
// A feature of the trainer registers itself as a part: a table of hooks, every one optional,
// that the trainer calls at fixed points without naming the feature. The table of parts is
// parts.c's; each part keeps its state behind its own slot (neox_train_part_slot).

// When a part's set-up runs in neox_trainer_create.
typedef enum {
    NEOX_PART_AFTER_PRECISION,  // the precision is known; no backend or model yet
    NEOX_PART_AFTER_MODEL,      // the model exists; no data-parallel reduction yet
    NEOX_PART_AFTER_PARTITION,  // [state_begin, state_end) is known; the optimizer is not made yet
    NEOX_PART_AFTER_LOAD,       // the weights are loaded; the metrics are not open yet
} neox_part_stage;

// What a part's load hook is given: the checkpoint being loaded and what the config lets it restore.
typedef struct neox_part_loading {
    const neox_ckpt_reader *reader;
    json_t *state;          // the run state (state/train.json)
    const char *dir;
    int optimizer;          // the optimizer state is restored (not with finetune or no_load_optim, and stored)
    int finetune;           // finetune: the weights only
} neox_part_loading;

// A pass of the model over one micro-batch: its forward, its forward and backward as one pass, or
// (under pipelining, where 1F1B runs other micro-batches' forwards in between) its backward.
typedef enum { NEOX_PASS_FORWARD, NEOX_PASS_TRAIN, NEOX_PASS_BACKWARD } neox_train_pass;

typedef struct neox_train_part {
    const char *name;
    neox_part_stage stage;
    int (*setup)(neox_trainer *t, neox_error *err);
    // Once the datasets exist (before loading): refuses data the part cannot train on.
    int (*check_data)(const neox_trainer *t, neox_error *err);
    // After the weights are initialised or loaded, before the first step.
    void (*start)(neox_trainer *t);
    void (*free)(neox_trainer *t);
    // Checkpoints: save writes the part's tensors into this rank's shard and, where run_state is not
    // NULL (rank 0), its keys of the run state; load restores both.
    int (*save)(const neox_trainer *t, neox_ckpt_writer *w, json_t *run_state, neox_error *err);
    int (*load)(neox_trainer *t, const neox_part_loading *from, neox_error *err);
    // Adds the part's bytes to the rank's memory plan.
    void (*memory)(const neox_trainer *t, neox_memory_plan *plan);
    // At the run's end (a collective): the part's numbers into comm_stats.json, doc on rank 0 with
    // log_dir set ({"ranks": [...], ...}), NULL elsewhere.
    void (*report)(neox_trainer *t, json_t *doc);
    // The step, in order: begin_step before the gradients are zeroed; begin_micro_batches after;
    // end_micro_batches after the last backward and its reduction; after_update once the update is
    // applied or skipped (it may skip it); end_step once the iteration is counted; log when the step
    // is recorded (a collective: metrics and the log line's fields).
    void (*begin_step)(neox_trainer *t);
    void (*begin_micro_batches)(neox_trainer *t);
    void (*end_micro_batches)(neox_trainer *t);
    int (*after_update)(neox_trainer *t, neox_step_result *r, neox_error *err);
    void (*end_step)(neox_trainer *t);
    void (*log)(neox_trainer *t, neox_step_stats *stats);
    // The passes (pipeline.c), in order: reference_model before a micro-batch's forward: a frozen
    // model this stage runs on the same micro-batch just before the policy (NULL: none), and where
    // the last stage keeps its label log-probabilities; begin_pass and end_pass around each pass;
    // after the forward on the last stage, the loss of the part whose replaces_loss is true (at
    // most one: checked at set-up) in place of the language-model loss (*loss holds that on entry);
    // grads_ready during the backward that completes the step's gradients: parameters [begin, end)
    // have their final gradients (before the gradient exchange is told).
    neox_model *(*reference_model)(const neox_trainer *t, double **token_logprobs);
    void (*begin_pass)(neox_trainer *t, neox_train_pass pass);
    void (*end_pass)(neox_trainer *t);
    int (*replaces_loss)(const neox_trainer *t);
    int (*loss)(neox_trainer *t, const neox_batch *b, int training, double *loss, neox_error *err);
    void (*grads_ready)(neox_trainer *t, int begin, int end);
} neox_train_part;

// The part's state slot in t (NULL until its set-up fills it).
void **neox_train_part_slot(const neox_trainer *t, const neox_train_part *part);
// The walks over the table, in its order (free: in reverse).
int neox_train_parts_setup(neox_trainer *t, neox_part_stage stage, neox_error *err);
int neox_train_parts_check_data(const neox_trainer *t, neox_error *err);
void neox_train_parts_start(neox_trainer *t);
void neox_train_parts_free(neox_trainer *t);
int neox_train_parts_save(const neox_trainer *t, neox_ckpt_writer *w, json_t *run_state, neox_error *err);
int neox_train_parts_load(neox_trainer *t, const neox_part_loading *from, neox_error *err);
// Each part's bytes in the memory plan, one call of fn per part with a memory hook (its name, and what
// the hook adds to each region: a part may move bytes between regions, so an entry may be negative).
void neox_train_parts_memory(const neox_trainer *t, neox_memory_owner_fn fn, void *ctx);
void neox_train_parts_report(neox_trainer *t, json_t *doc);
// A report hook's per-rank numbers (a collective over the world): every rank's `size` bytes of mine,
// rank-major (the caller frees), and doc's "ranks" array on rank 0 (NULL elsewhere).
void *neox_train_gather_rank_stats(neox_trainer *t, const void *mine, size_t size, json_t *doc, json_t **ranks);
void neox_train_parts_begin_step(neox_trainer *t);
void neox_train_parts_begin_micro_batches(neox_trainer *t);
void neox_train_parts_end_micro_batches(neox_trainer *t);
int neox_train_parts_after_update(neox_trainer *t, neox_step_result *r, neox_error *err);
void neox_train_parts_end_step(neox_trainer *t);
void neox_train_parts_log(neox_trainer *t, neox_step_stats *stats);
neox_model *neox_train_parts_reference_model(const neox_trainer *t, double **token_logprobs);  // the first part's
void neox_train_parts_begin_pass(neox_trainer *t, neox_train_pass pass);
void neox_train_parts_end_pass(neox_trainer *t);  // (in reverse)
int neox_train_parts_loss(neox_trainer *t, const neox_batch *b, int training, double *loss, neox_error *err);
int neox_train_parts_replace_loss(const neox_trainer *t);  // whether a part's loss replaces the model's
// Whether a step's values may reach the log a step late: no part replaces the loss (a part's loss is
// the host's at once) and none in use logs (its hook reads the state the step left, at the log point).
int neox_train_parts_allow_late_log(const neox_trainer *t);
void neox_train_parts_grads_ready(neox_trainer *t, int begin, int end);


// ---- the loop (loop.c) ------------------------------------------------------------------------
// A part's log hook: values as the step's metrics train/NAME.
void neox_train_add_step_metrics(neox_trainer *t, const neox_eval_value *values, int n);

// ---- signals (loop.c) -----------------------------------------------------------------------
extern volatile sig_atomic_t neox_train_stop_signal;

#endif
