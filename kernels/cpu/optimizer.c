// optimizer.c: the optimizer's elementwise kernels: squared norms for clipping, scaling, AdamW, SGD, Lion,
// MADGRAD, SM3, 1-bit Adam.
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "kernels/kernels.h"
#include "parallel.h"
#include "scratch.h"
#include "vector_math.h"

// Squares are summed in blocks of SUMSQ_BLOCK elements, each in SUMSQ_LANES fixed accumulators
// (lane j takes elements j, j + LANES, ...), and the blocks' sums are added in order: the result
// depends on n alone, not on the thread count or on which vector build runs (each lane's sum is
// the same scalar sequence however many lanes a vector holds; products of floats are exact in
// double, and ISO C mode contracts nothing into FMAs). Vectorised, the pass is bound by memory,
// where the scalar loop it replaces waited on each addition.
#define SUMSQ_LANES 16
#define SUMSQ_BLOCK ((size_t)1 << 14)
#define SUMSQ_GROUP 256  // blocks summed in one parallel region (their sums live on the stack)

NEOX_CLONES static double block_sum_squares(const float *x, size_t n) {
    double acc[SUMSQ_LANES] = {0};
    size_t i = 0;
    for (; i + SUMSQ_LANES <= n; i += SUMSQ_LANES)
        for (int j = 0; j < SUMSQ_LANES; j++) acc[j] += (double)x[i + j] * x[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += (double)x[i] * x[i];
    for (int w = SUMSQ_LANES / 2; w > 0; w /= 2)  // pairwise, in a fixed order
        for (int j = 0; j < w; j++) acc[j] += acc[j + w];
    return acc[0];
}

double neox_sum_squares(const float *x, size_t n) {
    double sum = 0.0, part[SUMSQ_GROUP];
    for (size_t g0 = 0; g0 < n; g0 += SUMSQ_BLOCK * SUMSQ_GROUP) {
        size_t len = n - g0 < SUMSQ_BLOCK * SUMSQ_GROUP ? n - g0 : SUMSQ_BLOCK * SUMSQ_GROUP;
        int nb = (int)((len + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK);
        #pragma omp parallel for if (len >= NEOX_PARALLEL_MIN_ELEMS)
        for (int b = 0; b < nb; b++) {
            size_t lo = (size_t)b * SUMSQ_BLOCK, hi = lo + SUMSQ_BLOCK < len ? lo + SUMSQ_BLOCK : len;
            part[b] = block_sum_squares(x + g0 + lo, hi - lo);
        }
        for (int b = 0; b < nb; b++) sum += part[b];
    }
    return sum;
}

void neox_scale(float *x, size_t n, float s) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

// One block of AdamW with each gradient multiplied by gscale first (1: as it is). Square root and
// division are exactly rounded in every build (kernels/cpu is compiled without math errno, so
// sqrtf is sqrtps), so every lane equals the scalar loop, in the AVX2 and AVX-512 builds too.
NEOX_CLONES static void adamw_block(float *param, const float *grad, float *m, float *v, size_t n, float gscale,
                                    float beta1, float beta2, float decay, float step_size, float bc2_sqrt, float eps) {
    #pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * gscale;
        m[i] = beta1 * m[i] + (1.0f - beta1) * g;
        v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
        float p = param[i] * decay;
        param[i] = p - step_size * m[i] / (sqrtf(v[i]) / bc2_sqrt + eps);
    }
}

static void adamw_scaled(float *param, const float *grad, float *m, float *v, size_t n, float gscale, float lr,
                         float beta1, float beta2, float eps, float weight_decay, long step) {
    // torch.optim.AdamW: decay first (p *= 1 - lr*wd), then p -= lr * mhat / (sqrt(vhat) + eps),
    // with the bias corrections folded into the step size and the denominator as torch does.
    float bc1 = 1.0f - powf(beta1, (float)step), bc2 = 1.0f - powf(beta2, (float)step);
    float step_size = lr / bc1, bc2_sqrt = sqrtf(bc2), decay = 1.0f - lr * weight_decay;
    // Fixed blocks: which elements share a vector does not depend on the thread count.
    #pragma omp parallel for if (n >= NEOX_PARALLEL_MIN_ELEMS)
    for (size_t i0 = 0; i0 < n; i0 += 4096) {
        size_t len = n - i0 < 4096 ? n - i0 : 4096;
        adamw_block(param + i0, grad + i0, m + i0, v + i0, len, gscale, beta1, beta2, decay, step_size, bc2_sqrt, eps);
    }
}

void neox_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr, float beta1, float beta2,
                float eps, float weight_decay, long step) {
    adamw_scaled(param, grad, m, v, n, 1.0f, lr, beta1, beta2, eps, weight_decay, step);
}

void neox_adamw_segments(float *param, const float *grad, float *m, float *v, const neox_segment *segs, int nseg,
                         const neox_step_scalars *sc, float beta1, float beta2, float eps, float grad_scale,
                         const double *guard) {
    if (guard && !isfinite(*guard)) return;
    float lr = sc->lr;
    long step = (long)sc->step;
    for (int s = 0; s < nseg; s++) {
        size_t b = segs[s].begin, n = segs[s].end - segs[s].begin;
        adamw_scaled(param + b, grad + b, m + b, v + b, n, grad_scale, lr, beta1, beta2, eps, segs[s].weight_decay,
                     step);
    }
}

void neox_sgd_segments(float *param, const float *grad, float *buf, const neox_segment *segs, int nseg,
                       const neox_step_scalars *sc, float momentum, const double *guard) {
    if (guard && !isfinite(*guard)) return;
    float lr = sc->lr;
    int first = sc->step == 1;
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

// The decay factor 1 - lr * wd as torch forms it: in double, then rounded to the tensor's float.
static float decay_factor(float lr, float weight_decay) { return (float)(1.0 - (double)lr * weight_decay); }

void neox_lion_segments(float *param, const float *grad, float *m, const neox_segment *segs, int nseg,
                        const neox_step_scalars *sc, float beta1, float beta2, const double *guard) {
    if (guard && !isfinite(*guard)) return;
    float lr = sc->lr;
    float omb1 = 1.0f - beta1, omb2 = 1.0f - beta2;
    for (int s = 0; s < nseg; s++) {
        float decay = decay_factor(lr, segs[s].weight_decay);
        #pragma omp parallel for simd if (segs[s].end - segs[s].begin >= NEOX_PARALLEL_MIN_ELEMS)
        for (size_t i = segs[s].begin; i < segs[s].end; i++) {
            float c = beta1 * m[i] + omb1 * grad[i];
            float sign = (float)((c > 0.0f) - (c < 0.0f));
            param[i] = param[i] * decay + -lr * sign;
            m[i] = beta2 * m[i] + omb2 * grad[i];
        }
    }
}

// The denominator of MADGRAD's step: the cube root as torch's pow(x, 1/3) takes it (the exponent
// rounded to float), plus eps.
static inline float madgrad_rms(float sum_sq, float eps) { return powf(sum_sq, 1.0f / 3.0f) + eps; }

static void madgrad_segment(float *param, const float *grad, float *sum_sq, float *s, float *x0, size_t begin,
                            size_t end, float decay, float lamb, float momentum, float eps, int first) {
    float ck = (float)(1.0 - (double)momentum);
    #pragma omp parallel for if (end - begin >= NEOX_PARALLEL_MIN_ELEMS)
    for (size_t i = begin; i < end; i++) {
        if (momentum != 0.0f && first) x0[i] = param[i];  // (before the decay, as madgrad_wd clones it)
        float p = decay != 1.0f ? param[i] * decay : param[i], g = grad[i];
        float origin = momentum != 0.0f ? x0[i] : p + s[i] / madgrad_rms(sum_sq[i], eps);
        sum_sq[i] = sum_sq[i] + lamb * g * g;
        s[i] = s[i] + lamb * g;
        float z = origin + -s[i] / madgrad_rms(sum_sq[i], eps);
        param[i] = momentum != 0.0f ? p * momentum + ck * z : z;
    }
}

void neox_madgrad_segments(float *param, const float *grad, float *sum_sq, float *s, float *x0,
                           const neox_segment *segs, int nseg, float lr_eps, float lamb, float momentum, float eps,
                           int first) {
    for (int k = 0; k < nseg; k++) {
        float wd = segs[k].weight_decay, decay = wd != 0.0f ? decay_factor(lr_eps, wd) : 1.0f;
        madgrad_segment(param, grad, sum_sq, s, x0, segs[k].begin, segs[k].end, decay, lamb, momentum, eps, first);
    }
}

// One run of SM3 within a row: elements [lo, hi) of param, grad, m, whose columns' accumulators are
// cols[0, hi - lo) (NULL for a vector, whose elements' own are row_acc[0, hi - lo)) and whose row's
// is row_acc[0]. Folds each nu into *row_max and col_max[0, hi - lo) (a vector's: its elements' own).
static void sm3_run(float *param, const float *grad, float *m, const float *row_acc, const float *cols,
                    float *row_max, float *col_max, size_t lo, size_t hi, float lr, float momentum, float beta,
                    float eps) {
    float rmax = *row_max;
    for (size_t i = lo, j = 0; i < hi; i++, j++) {
        float a = cols ? (cols[j] < row_acc[0] ? cols[j] : row_acc[0]) : row_acc[j];
        float nu = neox_sm3_nu(a, grad[i], beta), u = neox_sm3_update(nu, grad[i], eps);
        if (momentum > 0.0f) m[i] = u = u * (1.0f - momentum) + momentum * m[i];
        param[i] = param[i] - lr * u;
        rmax = nu > rmax ? nu : rmax;
        col_max[j] = nu > col_max[j] ? nu : col_max[j];
    }
    *row_max = rmax;
}

// A matrix's part: rows shared out over the threads, each taking its rows' maxima whole and its
// own column maxima, which are merged at the end (maxima do not depend on the order).
static void sm3_matrix(float *param, const float *grad, float *m, const float *acc, float *acc_next,
                       const neox_sm3_segment *sg, float lr, float momentum, float beta, float eps) {
    size_t n = sg->end - sg->begin, C = sg->cols;
    size_t r0 = sg->first / C, r1 = (sg->first + n - 1) / C + 1;
    #pragma omp parallel if (n >= NEOX_PARALLEL_MIN_ELEMS)
    {
        float *col_max = neox_cpu_scratch(C * sizeof(float), "SM3's column maxima");
        memset(col_max, 0, C * sizeof(float));  // (nu is never negative: 0 is no maximum yet)
        #pragma omp for schedule(static)
        for (size_t r = r0; r < r1; r++) {
            size_t t0 = r * C > sg->first ? r * C : sg->first, t1 = (r + 1) * C < sg->first + n ? (r + 1) * C : sg->first + n;
            size_t c0 = t0 - r * C, lo = t0 - sg->first + sg->begin, hi = t1 - sg->first + sg->begin;
            float row_max = acc_next[sg->row_acc + r];
            sm3_run(param, grad, m, acc + sg->row_acc + r, acc + sg->col_acc + c0, &row_max, col_max + c0, lo, hi, lr,
                    momentum, beta, eps);
            acc_next[sg->row_acc + r] = row_max;
        }
        #pragma omp critical
        for (size_t c = 0; c < C; c++)
            acc_next[sg->col_acc + c] = col_max[c] > acc_next[sg->col_acc + c] ? col_max[c] : acc_next[sg->col_acc + c];
        free(col_max);
    }
}

// A vector's part: every element its own accumulator.
static void sm3_vector(float *param, const float *grad, float *m, const float *acc, float *acc_next,
                       const neox_sm3_segment *sg, float lr, float momentum, float beta, float eps) {
    size_t n = sg->end - sg->begin, block = 4096;
    #pragma omp parallel for if (n >= NEOX_PARALLEL_MIN_ELEMS)
    for (size_t b = 0; b < n; b += block) {
        size_t len = n - b < block ? n - b : block, at = sg->row_acc + sg->first + b;
        float unused = 0.0f;
        sm3_run(param, grad, m, acc + at, NULL, &unused, acc_next + at, sg->begin + b, sg->begin + b + len, lr, momentum,
                beta, eps);
    }
}

void neox_sm3_segments(float *param, const float *grad, float *m, const float *acc, float *acc_next,
                       const neox_sm3_segment *segs, int nseg, float lr, float momentum, float beta, float eps) {
    for (int s = 0; s < nseg; s++) {
        if (segs[s].end <= segs[s].begin) continue;
        if (segs[s].col_acc != NEOX_SM3_NO_COLS) sm3_matrix(param, grad, m, acc, acc_next, &segs[s], lr, momentum, beta, eps);
        else sm3_vector(param, grad, m, acc, acc_next, &segs[s], lr, momentum, beta, eps);
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

void neox_clip_by_norm(float *x, size_t n, const double *sumsq, double loss_scale, const double *loss_scale_at,
                       double clip_grad) {
    if (loss_scale_at) loss_scale = *loss_scale_at;
    double norm = sqrt(*sumsq) / loss_scale, coef = 1.0 / loss_scale * neox_clip_coefficient(clip_grad, norm);
    if (isfinite(norm) && coef != 1.0) neox_scale(x, n, (float)coef);
}

void neox_loss_guard(double *guard, const double *sumsq, const double *loss_sums, int n) {
    double g = *sumsq;
    for (int i = 0; i < n; i++)
        if (!isfinite(neox_mean_loss(loss_sums[2 * i], loss_sums[2 * i + 1]))) g = NAN;
    *guard = g;
}
