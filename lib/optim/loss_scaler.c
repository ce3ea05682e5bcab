// loss_scaler.c: DeepSpeed's fp16 dynamic loss scaling rules (init 2^initial_scale_power, halve
// on overflow after `hysteresis` overflows, double after `window` clean iterations, floor at
// min_loss_scale), so fp16 runs skip exactly the steps DeepSpeed would skip.
#include <math.h>

#include "config.h"
#include "optim.h"

static double number_or(const neox_value *v, double fallback) {
    if (v && v->kind == NEOX_VALUE_INT) return (double)v->integer;
    if (v && v->kind == NEOX_VALUE_FLOAT) return v->number;
    return fallback;
}

int neox_loss_scaler_fp16_from_config(const neox_config *c, neox_loss_scaler *out, neox_error *err) {
    double fixed = number_or(neox_config_sub(c, fp16__loss_scale), 0.0);
    if (fixed < 0) return neox_fail(err, NEOX_EXIT_USAGE, "fp16.loss_scale: %g is negative (0 = dynamic)", fixed);
    if (fixed > 0) {
        *out = neox_loss_scaler_static(fixed);
        return 0;
    }
    double power = number_or(neox_config_sub(c, fp16__initial_scale_power), 16);
    double window = number_or(neox_config_sub(c, fp16__loss_scale_window), 1000);
    double hysteresis = number_or(neox_config_sub(c, fp16__hysteresis), 2);
    double min_scale = number_or(neox_config_sub(c, fp16__min_loss_scale), 1);
    const neox_value *consecutive = neox_config_sub(c, fp16__consecutive_hysteresis);
    // (types and ranges are the sub-key schema's; it allows a zero min_loss_scale, the scaler does not)
    if (min_scale <= 0) return neox_fail(err, NEOX_EXIT_USAGE, "fp16.min_loss_scale: %g must be positive", min_scale);
    *out = neox_loss_scaler_dynamic((int)power, (int64_t)window, (int)hysteresis, min_scale,
                                    consecutive && consecutive->kind == NEOX_VALUE_BOOL && consecutive->boolean);
    return 0;
}

neox_loss_scaler neox_loss_scaler_dynamic(int initial_scale_power, int64_t window, int hysteresis, double min_scale,
                                          int consecutive_hysteresis) {
    if (hysteresis < 1) hysteresis = 1;
    return (neox_loss_scaler){ldexp(1.0, initial_scale_power), min_scale, window, hysteresis, hysteresis,
                              consecutive_hysteresis, 0, -1};
}

neox_loss_scaler neox_loss_scaler_static(double scale) {
    return (neox_loss_scaler){scale, scale, 0, 1, 1, 0, 0, -1};
}

int neox_loss_scaler_update(neox_loss_scaler *s, int overflow) {
    int stuck = 0;
    if (s->window <= 0) {  // static: nothing adapts, but an overflow is still reported
        s->iteration++;
        return 0;
    }
    if (overflow) {
        if (s->hysteresis == 1 || s->hysteresis_left == 1) {
            stuck = s->scale <= s->min_scale;
            s->scale = fmax(s->scale / 2.0, s->min_scale);
        } else {
            s->hysteresis_left--;
        }
        s->last_overflow = s->iteration;
    } else {
        if (s->consecutive_hysteresis) s->hysteresis_left = s->hysteresis;
        if ((s->iteration - s->last_overflow) % s->window == 0) {
            if (!s->consecutive_hysteresis) s->hysteresis_left = s->hysteresis;
            s->scale *= 2.0;
        }
    }
    s->iteration++;
    return stuck;
}
