// optim.h: what updates the parameters, stepped by the trainer once per iteration and checkpointed:
// the optimizers (AdamW, SGD, Lion, MADGRAD, SM3, 1-bit Adam) behind one interface, DeepSpeed's gradient clipping,
// GPT-NeoX's learning-rate schedule (AnnealingLR) and DeepSpeed's dynamic fp16 loss scaler.
#ifndef NEOX_OPTIM_H
#define NEOX_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "core.h"
#include "kernels/kernels.h"

// Declared here so that readers of checkpoints (neox-convert) can name optimizer state without the
// config, communication and backend headers: config.h, gradient.h and kernels/backend.h define them.
typedef struct neox_config neox_config;
typedef struct neox_onebit neox_onebit;
typedef struct neox_backend neox_backend;

// ---- optimizers (optimizer.c; one file per optimizer: adamw.c, sgd.c, lion.c, madgrad.c, sm3.c, onebit_adam.c)
// An optimizer updates one contiguous range of the flat parameter buffer (all of it, or under ZeRO
// a data-parallel partition) from the same range of the gradient buffer, with fp32 state buffers
// of the same length on the parameters' backend (SM3 keeps per-tensor accumulators besides: below). Adding an optimizer is one file defining its
// neox_optimizer_type and one row in optimizer.c's table.
typedef enum {
    NEOX_OPTIMIZER_ADAM, NEOX_OPTIMIZER_SGD, NEOX_OPTIMIZER_ONEBITADAM, NEOX_OPTIMIZER_LION, NEOX_OPTIMIZER_MADGRAD_WD,
    NEOX_OPTIMIZER_SM3,
    NEOX_OPTIMIZER_COUNT
} neox_optimizer_kind;
enum { NEOX_OPTIMIZER_MAX_STATE = 3 };  // the most state buffers any type keeps

typedef struct neox_optimizer_settings {
    neox_optimizer_kind kind;
    double beta1, beta2, eps;  // adam, onebitadam; lion (betas); madgrad_wd (eps)
    double momentum;           // sgd, madgrad_wd, sm3
    double beta;               // sm3: its accumulators' moving average (0: sums)
    int64_t freeze_step;       // onebitadam: Adam warm-up steps before compression
    double weight_decay;       // (onebitadam: optimizer.params.weight_decay, as DeepSpeed takes it)
    double clip_grad;          // 0: no clipping
    int host;                  // optimizer.type cpu_adam, cpu_torch_adam: Adam (AdamW) run on the host (ZeRO-Offload)
} neox_optimizer_settings;

typedef struct neox_optimizer neox_optimizer;

// One parameter tensor of the flat buffer, for the per-tensor accumulators of SM3: this rank's block
// of it, and whether tensor parallelism splits its rows or columns over the model group (a row's
// maximum over a matrix split by columns then combines the group's blocks; a column's likewise).
typedef struct neox_optimizer_tensor {
    size_t offset, numel;   // in the flat buffer (not relative to the range)
    int64_t rows, cols;     // this rank's block; a vector: numel x 1
    int matrix;             // two-dimensional: a row and a column accumulator; else one per element
    int rows_split, cols_split;
    size_t row_acc, col_acc;  // set by neox_optimizer_set_tensors: where its accumulators sit in acc
} neox_optimizer_tensor;

typedef struct neox_optimizer_type {
    const char *name;              // optimizer.type (compared case-insensitively), as checkpoints record it
    int nstate;                    // fp32 state buffers, each as long as the range updated (the most)
    // NULL, or how many of the nstate buffers these settings keep (SM3's momentum only with a momentum).
    int (*state_count)(const neox_optimizer_settings *s);
    // Keeps per-tensor accumulators (SM3): neox_optimizer_set_tensors comes before the first step.
    // Their groups in checkpoints: the row accumulators (a vector's, one per element) and the column ones.
    int per_tensor;
    const char *accumulator_names[2];
    const char *state_names[NEOX_OPTIMIZER_MAX_STATE];  // their names in checkpoints
    // Whether DeepSpeed's ZeRO counts the optimizer as tested (its ZERO_SUPPORTED_OPTIMIZERS): under
    // ZeRO any other needs zero_allow_untested_optimizer.
    int zero_tested;
    int scales_grads;              // step multiplies each gradient by neox_optimizer.grad_scale as it reads it
    // Reads the optimizer's own settings from the config (the common ones are read already).
    void (*read)(const neox_config *cfg, neox_optimizer_settings *s);
    // NULL, or prints the warnings a run of this type with this config deserves (rank 0 calls it).
    void (*warn)(const neox_config *cfg, const neox_optimizer_settings *s);
    // One update of param[0, n) from grad[0, n); segs: each parameter's run (relative to the range)
    // and its weight decay; step: the 1-based update count; lr: this step's learning rate.
    void (*step)(neox_optimizer *o, float *param, const float *grad, const neox_segment *segs, int nseg, double lr,
                 int64_t step);
} neox_optimizer_type;

struct neox_optimizer {
    const neox_optimizer_type *type;
    neox_optimizer_settings s;
    const neox_backend *be;
    size_t n;                      // elements updated
    int nstate;                    // state buffers these settings keep
    float *state[NEOX_OPTIMIZER_MAX_STATE];  // nstate buffers of n floats on be
    // Per-tensor accumulators (types with per_tensor): every tensor of the flat buffer (the same
    // ones on every rank of the data group, whatever its range), their accumulators in acc (nacc
    // floats on be, whole: first the nacc_local that no other tensor-parallel rank shares, then
    // those it does) and
    // acc_next, where a step forms the new ones before they replace acc.
    neox_optimizer_tensor *tensors;
    int ntensors;
    size_t origin;                 // the flat buffer's element that is element 0 of the range
    float *acc, *acc_next;
    size_t nacc, nacc_local;
    // The trainer's: combines a step's partial maxima over the other ranks holding parts of the same
    // tensors, element-wise: over_model 0: the data-parallel ranks whose ranges split them (ZeRO);
    // 1: the tensor-parallel group (the last nacc - nacc_local). NULL: nothing to combine.
    void (*reduce_max)(void *ctx, float *buf, size_t n, int over_model);
    void *reduce_ctx;
    // 1-bit Adam under data parallelism: the compressed all-reduce that averages the momentum in the
    // compression phase (the trainer makes it; NULL on one rank).
    neox_onebit *momentum_allreduce;
    // NULL, or the gradients' sum of squares in the backend's memory: AdamW skips its update when
    // it is not finite, decided on the device (the trainer's device step; other types ignore it).
    const double *guard;
    // NULL, or this update's learning rate and step in the backend's memory (the trainer's step
    // scalars, lib/train/step_scalars.c), which AdamW's segmented update reads there: a captured step
    // replays with each step's values. NULL: AdamW takes step's arguments (on a backend whose memory
    // is the host's only: the CPU table, the offloaded optimizer).
    const neox_step_scalars *scalars;
    // Types with scales_grads: the factor the next step applies to the gradients (clipping, loss
    // scale), instead of a pass that scales them in memory first; the trainer sets it and puts it
    // back to 1 after the step.
    float grad_scale;
};

extern const neox_optimizer_type neox_optimizer_adamw, neox_optimizer_sgd, neox_optimizer_onebit_adam,
    neox_optimizer_lion, neox_optimizer_madgrad_wd, neox_optimizer_sm3;
const neox_optimizer_type *neox_optimizer_type_of(neox_optimizer_kind kind);
// The type a checkpoint's run state names ("adam", "sgd", "onebitadam", "lion", "madgrad_wd", "sm3"); NULL
// for another name.
const neox_optimizer_type *neox_optimizer_type_named(const char *name);

// The optimizer the config names (optimizer.type, its params and the top-level keys GPT-NeoX
// derives from them). Refuses an unknown type naming it, and under ZeRO (zero_optimization.stage
// above 0) a type DeepSpeed's ZeRO has not tested unless zero_allow_untested_optimizer is set.
int neox_optimizer_read_settings(const neox_config *cfg, neox_optimizer_settings *s, neox_error *err);
// The type's warnings for this config (SM3 under fp16, say), printed on the calling rank.
void neox_optimizer_warn(const neox_config *cfg, const neox_optimizer_settings *s);
// State buffers zeroed on be for n elements.
neox_optimizer *neox_optimizer_make(const neox_optimizer_settings *s, const neox_backend *be, size_t n);
void neox_optimizer_free(neox_optimizer *o);
void neox_optimizer_step(neox_optimizer *o, float *param, const float *grad, const neox_segment *segs, int nseg,
                         double lr, int64_t step);
// Bytes of optimizer state per element updated (the buffers as long as the range).
size_t neox_optimizer_state_bytes_per_element(const neox_optimizer_settings *s);
// The state buffers these settings keep (of the type's nstate).
int neox_optimizer_state_count(const neox_optimizer_settings *s);
// Per-tensor accumulators: lays them out for these tensors (copied; each tensor's row_acc and
// col_acc filled) of the range starting at the flat buffer's element origin, zeroed, with the step's
// second set. Nothing for a type without them.
void neox_optimizer_set_tensors(neox_optimizer *o, size_t origin, const neox_optimizer_tensor *tensors, int n);
// The floats of the accumulators (one set) these tensors need: 0 for a type without them.
size_t neox_optimizer_accumulator_floats(const neox_optimizer_settings *s, const neox_optimizer_tensor *tensors,
                                         int n);


// ---- learning-rate schedule -------------------------------------------------------------------
typedef enum { NEOX_LR_CONSTANT, NEOX_LR_LINEAR, NEOX_LR_COSINE, NEOX_LR_EXPONENTIAL } neox_lr_style;

typedef struct neox_lr_schedule {
    double start_lr;      // the optimizer's lr
    double min_lr;        // floor
    double warmup_iters;  // warmup fraction x decay iterations; GPT-NeoX keeps it fractional
    int64_t decay_iters;  // lr_decay_iters, else floor(train_iters x lr_decay_fraction), else train_iters; >= 1
    neox_lr_style style;
} neox_lr_schedule;

// Parses "constant" | "linear" | "cosine" | "exponential"; -1 when unknown.
int neox_lr_style_parse(const char *name, neox_lr_style *style);
const char *neox_lr_style_name(neox_lr_style style);
// The schedule GPT-NeoX builds from its config values (decay_iters below 1 becomes 1).
neox_lr_schedule neox_lr_schedule_make(double lr, double min_lr, double warmup_fraction, int64_t decay_iters,
                                       neox_lr_style style);
// The learning rate at `iteration` (GPT-NeoX's scheduler iteration count; see docs/training.md).
double neox_lr_at(const neox_lr_schedule *s, int64_t iteration);

// ---- fp16 loss scaling ------------------------------------------------------------------------
// DeepSpeed's DynamicLossScaler: on an overflow the scale is divided by 2 (not below min_scale)
// once `hysteresis` overflows have been absorbed; after `window` iterations without an overflow it
// doubles. A scaler with window 0 is static (fp16 with a fixed loss_scale, or bf16/fp32 with 1).
typedef struct neox_loss_scaler {
    double scale;
    double min_scale;
    int64_t window;              // loss_scale_window; 0 = static
    int hysteresis;              // delayed shift
    int hysteresis_left;         // overflows still absorbed before the next halving
    int consecutive_hysteresis;  // refill hysteresis on every clean step instead of at growth
    int64_t iteration;           // updates seen
    int64_t last_overflow;       // iteration of the last overflow, -1 before any
} neox_loss_scaler;

neox_loss_scaler neox_loss_scaler_dynamic(int initial_scale_power, int64_t window, int hysteresis, double min_scale,
                                          int consecutive_hysteresis);
neox_loss_scaler neox_loss_scaler_static(double scale);
// An fp16 run's scaler from the config's fp16 dict, with DeepSpeed's defaults: loss_scale 0
// (dynamic), initial_scale_power 16, loss_scale_window 1000, hysteresis 2, min_loss_scale 1,
// consecutive_hysteresis false; a positive loss_scale is a static scaler. -1 + err on a bad value.
int neox_loss_scaler_fp16_from_config(const neox_config *cfg, neox_loss_scaler *out, neox_error *err);
// Records one step's outcome. Returns 1 when the step overflowed while the scale was already at
// min_scale (DeepSpeed stops the run there), else 0.
int neox_loss_scaler_update(neox_loss_scaler *s, int overflow);

#endif
