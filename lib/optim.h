// optim.h: what updates the parameters, stepped by the trainer once per iteration and checkpointed:
// the optimizers (AdamW, SGD, Lion, MADGRAD, 1-bit Adam) behind one interface, DeepSpeed's gradient clipping,
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

// ---- optimizers (optimizer.c; one file per optimizer: adamw.c, sgd.c, lion.c, madgrad.c, onebit_adam.c)
// An optimizer updates one contiguous range of the flat parameter buffer (all of it, or under ZeRO
// a data-parallel partition) from the same range of the gradient buffer, with fp32 state buffers
// of the same length on the parameters' backend. Adding an optimizer is one file defining its
// neox_optimizer_type and one row in optimizer.c's table.
typedef enum {
    NEOX_OPTIMIZER_ADAM, NEOX_OPTIMIZER_SGD, NEOX_OPTIMIZER_ONEBITADAM, NEOX_OPTIMIZER_LION, NEOX_OPTIMIZER_MADGRAD_WD,
    NEOX_OPTIMIZER_COUNT
} neox_optimizer_kind;
enum { NEOX_OPTIMIZER_MAX_STATE = 3 };  // the most state buffers any type keeps

typedef struct neox_optimizer_settings {
    neox_optimizer_kind kind;
    double beta1, beta2, eps;  // adam, onebitadam; lion (betas); madgrad_wd (eps)
    double momentum;           // sgd, madgrad_wd
    int64_t freeze_step;       // onebitadam: Adam warm-up steps before compression
    double weight_decay;       // (onebitadam: optimizer.params.weight_decay, as DeepSpeed takes it)
    double clip_grad;          // 0: no clipping
    int host;                  // optimizer.type cpu_adam, cpu_torch_adam: Adam (AdamW) run on the host (ZeRO-Offload)
} neox_optimizer_settings;

typedef struct neox_optimizer neox_optimizer;

typedef struct neox_optimizer_type {
    const char *name;              // optimizer.type (compared case-insensitively), as checkpoints record it
    int nstate;                    // fp32 state buffers, each as long as the range updated
    const char *state_names[NEOX_OPTIMIZER_MAX_STATE];  // their names in checkpoints
    // Whether DeepSpeed's ZeRO counts the optimizer as tested (its ZERO_SUPPORTED_OPTIMIZERS): under
    // ZeRO any other needs zero_allow_untested_optimizer.
    int zero_tested;
    int scales_grads;              // step multiplies each gradient by neox_optimizer.grad_scale as it reads it
    // Reads the optimizer's own settings from the config (the common ones are read already).
    void (*read)(const neox_config *cfg, neox_optimizer_settings *s);
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
    float *state[NEOX_OPTIMIZER_MAX_STATE];  // type->nstate buffers of n floats on be
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
    neox_optimizer_lion, neox_optimizer_madgrad_wd;
const neox_optimizer_type *neox_optimizer_type_of(neox_optimizer_kind kind);
// The type a checkpoint's run state names ("adam", "sgd", "onebitadam", "lion", "madgrad_wd"); NULL
// for another name.
const neox_optimizer_type *neox_optimizer_type_named(const char *name);

// The optimizer the config names (optimizer.type, its params and the top-level keys GPT-NeoX
// derives from them). Refuses an unknown type naming it, and under ZeRO (zero_optimization.stage
// above 0) a type DeepSpeed's ZeRO has not tested unless zero_allow_untested_optimizer is set.
int neox_optimizer_read_settings(const neox_config *cfg, neox_optimizer_settings *s, neox_error *err);
// State buffers zeroed on be for n elements.
neox_optimizer *neox_optimizer_make(const neox_optimizer_settings *s, const neox_backend *be, size_t n);
void neox_optimizer_free(neox_optimizer *o);
void neox_optimizer_step(neox_optimizer *o, float *param, const float *grad, const neox_segment *segs, int nseg,
                         double lr, int64_t step);
// Bytes of optimizer state per element updated.
size_t neox_optimizer_state_bytes_per_element(const neox_optimizer_settings *s);


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
// Records one step's outcome. Returns 1 when the step overflowed while the scale was already at
// min_scale (DeepSpeed stops the run there), else 0.
int neox_loss_scaler_update(neox_loss_scaler *s, int overflow);

#endif
