// loss_scaler.c: DeepSpeed's fp16 dynamic loss scaling rules (init 2^initial_scale_power, halve
// on overflow after `hysteresis` overflows, double after `window` clean iterations, floor at
// min_loss_scale), so fp16 runs skip exactly the steps DeepSpeed would skip.
#include <math.h>

#include "optim.h"

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
