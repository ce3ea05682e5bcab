// lr_schedule.c: GPT-NeoX's AnnealingLR. Linear warmup from 0 over a (possibly fractional)
// number of iterations, then constant, linear, cosine or exponential decay relative to the decay
// iterations, floored at min_lr. One deliberate difference: GPT-NeoX's cosine never reaches min_lr
// (its iteration is clamped at decay - warmup, and older versions were not clamped at all and rose
// again past the end); here, past decay_iters a cosine schedule is at min_lr (docs/training.md).
#include <math.h>
#include <string.h>

#include "optim.h"

int neox_lr_style_parse(const char *name, neox_lr_style *style) {
    static const struct { const char *name; neox_lr_style style; } styles[] = {
        {"constant", NEOX_LR_CONSTANT}, {"linear", NEOX_LR_LINEAR},
        {"cosine", NEOX_LR_COSINE},     {"exponential", NEOX_LR_EXPONENTIAL},
    };
    for (size_t i = 0; i < sizeof styles / sizeof *styles; i++)
        if (!strcmp(name, styles[i].name)) {
            *style = styles[i].style;
            return 0;
        }
    return -1;
}

const char *neox_lr_style_name(neox_lr_style style) {
    static const char *names[] = {"constant", "linear", "cosine", "exponential"};
    return names[style];
}

neox_lr_schedule neox_lr_schedule_make(double lr, double min_lr, double warmup_fraction, int64_t decay_iters,
                                       neox_lr_style style) {
    if (decay_iters < 1) decay_iters = 1;
    return (neox_lr_schedule){lr, min_lr, warmup_fraction * (double)decay_iters, decay_iters, style};
}

double neox_lr_at(const neox_lr_schedule *s, int64_t iteration) {
    double it = (double)iteration, end = (double)s->decay_iters, warm = s->warmup_iters;
    if (warm > 0 && it <= warm) return s->start_lr * fmin(it, end - warm) / warm;
    if (s->style == NEOX_LR_COSINE && it > end) return s->min_lr;
    // GPT-NeoX clamps the iteration at end - warmup before removing the warmup part.
    double t = fmin(it, end - warm) - warm, lr;
    switch (s->style) {
    case NEOX_LR_LINEAR: lr = s->start_lr * (end - t) / end; break;
    case NEOX_LR_COSINE: lr = s->start_lr / 2.0 * (cos(M_PI * t / end) + 1.0); break;
    case NEOX_LR_EXPONENTIAL: lr = s->start_lr * exp(-0.693 * t / end); break;
    default: lr = s->start_lr; break;
    }
    return fmax(lr, s->min_lr);
}
