// optimizer.c: the optimizer's elementwise kernels: squared norms for clipping, scaling, AdamW, SGD, 1-bit Adam.
#include <math.h>
#include <stddef.h>

#include "kernels/kernels.h"

double neox_sum_squares(const float *x, size_t n) {
    double sum = 0.0;
    #pragma omp parallel for reduction(+ : sum)
    for (size_t i = 0; i < n; i++) sum += (double)x[i] * x[i];
    return sum;
}

void neox_scale(float *x, size_t n, float s) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

void neox_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr, float beta1, float beta2,
                float eps, float weight_decay, long step) {
    // torch.optim.AdamW: decay first (p *= 1 - lr*wd), then p -= lr * mhat / (sqrt(vhat) + eps),
    // with the bias corrections folded into the step size and the denominator as torch does.
    float bc1 = 1.0f - powf(beta1, (float)step), bc2 = 1.0f - powf(beta2, (float)step);
    float step_size = lr / bc1, bc2_sqrt = sqrtf(bc2);
    // Fixed blocks, vectorised inside (sqrtf becomes sqrtps: kernels/cpu is built without math
    // errno); square root and division are exactly rounded either way, so lanes equal the scalar.
    #pragma omp parallel for
    for (size_t i0 = 0; i0 < n; i0 += 4096) {
        size_t i1 = n - i0 < 4096 ? n : i0 + 4096;
        #pragma omp simd
        for (size_t i = i0; i < i1; i++) {
            float g = grad[i];
            m[i] = beta1 * m[i] + (1.0f - beta1) * g;
            v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
            float p = param[i] * (1.0f - lr * weight_decay);
            param[i] = p - step_size * m[i] / (sqrtf(v[i]) / bc2_sqrt + eps);
        }
    }
}

void neox_adamw_segments(float *param, const float *grad, float *m, float *v, const neox_segment *segs, int nseg,
                         float lr, float beta1, float beta2, float eps, long step, const double *guard) {
    if (guard && !isfinite(*guard)) return;
    for (int s = 0; s < nseg; s++) {
        size_t b = segs[s].begin, n = segs[s].end - segs[s].begin;
        neox_adamw(param + b, grad + b, m + b, v + b, n, lr, beta1, beta2, eps, segs[s].weight_decay, step);
    }
}

void neox_sgd_segments(float *param, const float *grad, float *buf, const neox_segment *segs, int nseg, float lr,
                       float momentum, int first) {
    for (int s = 0; s < nseg; s++) {
        float wd = segs[s].weight_decay;
        #pragma omp parallel for
        for (size_t i = segs[s].begin; i < segs[s].end; i++) {
            float d = grad[i] + wd * param[i];
            if (momentum != 0.0f) {
                buf[i] = first ? d : momentum * buf[i] + d;
                d = buf[i];
            }
            param[i] -= lr * d;
        }
    }
}

double neox_sum_squares_segments(const float *x, const neox_segment *segs, int nseg) {
    double sum = 0.0;
    for (int s = 0; s < nseg; s++) sum += neox_sum_squares(x + segs[s].begin, segs[s].end - segs[s].begin);
    return sum;
}

void neox_adam_moments(float *m, float *v, const float *grad, size_t n, float beta1, float beta2) {
    #pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) {
        float g = grad[i];
        m[i] = beta1 * m[i] + (1.0f - beta1) * g;
        if (v) v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
    }
}

void neox_onebit_adam_apply(float *param, const float *m, const float *v, size_t n, float lr, float eps,
                            float weight_decay) {
    // As torch evaluates update = m / (v.sqrt() + eps); update += wd * p; p.add_(-lr * update).
    #pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) {
        float update = m[i] / (sqrtf(v[i]) + eps);
        if (weight_decay > 0.0f) update += weight_decay * param[i];
        param[i] += -lr * update;
    }
}

void neox_sum_squares_segments_into(double *sumsq, const float *x, const neox_segment *segs, int nseg) {
    *sumsq = neox_sum_squares_segments(x, segs, nseg);
}

void neox_clip_by_norm(float *x, size_t n, const double *sumsq, double loss_scale, double clip_grad) {
    double norm = sqrt(*sumsq) / loss_scale, coef = 1.0 / loss_scale * neox_clip_coefficient(clip_grad, norm);
    if (isfinite(norm) && coef != 1.0) neox_scale(x, n, (float)coef);
}
