// train.h: the training loop of neox-train. From a loaded GPT-NeoX config it sets up the
// tokenizer (for the vocabulary size), the model, the data iterators, the optimizer state, the
// metrics and the data-parallel gradient reducer; then it trains: micro-batches with gradient
// accumulation, clipping by global norm, AdamW or SGD with GPT-NeoX's AnnealingLR, skipped
// non-finite steps, evaluation on the valid and test splits, checkpoints saved and resumed
// bit-exactly, exit_interval and SIGTERM/SIGUSR1 handling. docs/training.md describes it.
#ifndef NEOX_TRAIN_H
#define NEOX_TRAIN_H

#include <stdint.h>

#include "config.h"
#include "core.h"
#include "parallel.h"

// neox-train's exit status after SIGTERM or SIGUSR1: the step in flight finished, a checkpoint
// was saved (when `save` is set) and the run can be resumed with the same command.
#define NEOX_TRAIN_EXIT_INTERRUPTED 3

// GPT-NeoX stops when this many steps in a row had a non-finite loss or gradient.
#define NEOX_TRAIN_MAX_NONFINITE_IN_A_ROW 50

typedef struct neox_trainer neox_trainer;

typedef struct neox_train_options {
    int quiet;   // no notices or progress
} neox_train_options;

// Builds everything the run needs from cfg (which must outlive the trainer) on the ranks of grid,
// and loads the checkpoint `load` names (when set and present). Errors name the config key.
neox_trainer *neox_trainer_create(const neox_config *cfg, neox_grid *grid, const neox_train_options *opts,
                                  neox_error *err);
void neox_trainer_free(neox_trainer *t);

// Trains to train_iters (or exit_interval, or a signal), evaluating and saving as configured.
// Returns the exit status (0, or NEOX_TRAIN_EXIT_INTERRUPTED), or -1 with err set.
int neox_trainer_run(neox_trainer *t, neox_error *err);

// The completed iteration count (after a resume: the checkpoint's iteration).
int64_t neox_trainer_iteration(const neox_trainer *t);

// Makes SIGTERM and SIGUSR1 request a stop after the current step (neox_trainer_run then saves
// and returns NEOX_TRAIN_EXIT_INTERRUPTED). Installed before anything else claims the signals.
void neox_train_install_signal_handlers(void);

// DPO's loss (lib/train/preference.c) for B pairs of sequences of T positions: rows [0, B) chosen,
// [B, 2B) rejected; policy_lp and ref_lp (2B, T) the log-probabilities of the labels, mask (2B, T)
// the scored positions. Returns the mean over pairs of -log sigmoid(beta * z); weights (2B, T) gets
// the loss's gradient with respect to each token's loss (-log p), metrics GPT-NeoX's eight (the
// means over pairs of ref_neg, ref_pos, chosen_neg, chosen_pos, chosen_rewards, rejected_rewards,
// reward_acc, margins).
enum { NEOX_DPO_METRICS = 8 };
double neox_dpo_loss(const double *policy_lp, const double *ref_lp, const float *mask, int B, int T, double beta,
                     float *weights, double *metrics);

// A reward model's loss (lib/train/reward_model.c) for B pairs of T positions: values (2B, T) the
// value head's output, rows [0, B) chosen and [B, 2B) rejected; mask (2B, T) the scored positions,
// exactly one per row (the reward). Returns the mean over pairs of -log sigmoid(pos - neg) +
// z_loss * (pos^2 + neg^2), with grads (2B, T) its gradient with respect to each value and metrics
// GPT-NeoX's four (means over pairs of pos_values, neg_values, margin = pos - neg, accuracy =
// [margin > 0]); *bad_row is -1, or the first row without exactly one scored position (the
// return value is then NaN).
enum { NEOX_RM_METRICS = 4 };
double neox_rm_loss(const float *values, const float *mask, int B, int T, double z_loss, float *grads, double *metrics,
                    int *bad_row);
// KTO's loss (lib/train/kto.c) for B sequences (B even) of T positions: policy_lp and ref_lp (B, T)
// the log-probabilities of the labels, mask (B, T) the scored positions, rewards (B, T) each
// position's reward (GPT-NeoX's reward[:, :-1]). Returns GPT-NeoX's loss (rows [0, B/2) and
// [B/2, B) the two halves, each the other's KL baseline); weights (B, T) gets its gradient with
// respect to each token's loss (-log p); metrics (may be NULL) GPT-NeoX's nine: ref_logp,
// policy_logp, pos_ref_logp, neg_ref_logp, pos_policy_logp, neg_policy_logp, kl, reward_acc,
// policy_rewards.
enum { NEOX_KTO_METRICS = 9 };
typedef struct neox_kto_weights {
    double beta;          // kto_beta
    double desirable;     // kto_desirable_weight
    double undesirable;   // kto_undesirable_weight
} neox_kto_weights;
double neox_kto_loss(const double *policy_lp, const double *ref_lp, const float *mask, const float *rewards, int B,
                     int T, const neox_kto_weights *w, float *weights, double *metrics);

#endif
