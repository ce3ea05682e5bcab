// optim.h: optimizer-side state machines the trainer steps once per iteration and checkpoints:
// GPT-NeoX's learning-rate schedule (AnnealingLR) and DeepSpeed's dynamic fp16 loss scaler.
#ifndef NEOX_OPTIM_H
#define NEOX_OPTIM_H

#include <stdint.h>

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
