// optimizer.c: the update as GPT-NeoX makes it — the global gradient norm, clipping by it
// (DeepSpeed's coefficient clip_grad / (norm + 1e-6), applied only when below 1), and either
// AdamW (decoupled weight decay, bias-corrected moments) or torch's SGD (weight decay added to
// the gradient, heavy-ball momentum), with no weight decay on biases and norm weights.
#include <math.h>

#include "kernels/kernels.h"
#include "internal.h"

double neox_train_grad_norm(const neox_trainer *t) {
    return sqrt(neox_sum_squares(t->model->grad_buf, t->model->num_floats));
}

void neox_train_clip(neox_trainer *t, double norm) {
    if (t->optim.clip_grad <= 0) return;
    double coef = t->optim.clip_grad / (norm + 1e-6);
    if (coef < 1.0) neox_scale(t->model->grad_buf, t->model->num_floats, (float)coef);
}

// torch.optim.SGD: d = g + wd * p; with momentum, buf = d on the first step, else
// momentum * buf + d; p -= lr * buf (no dampening, no Nesterov, as GPT-NeoX configures it).
static void sgd_update(float *param, const float *grad, float *buf, size_t n, float lr, float momentum,
                       float weight_decay, int first) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float d = grad[i] + weight_decay * param[i];
        if (momentum != 0.0f) {
            buf[i] = first ? d : momentum * buf[i] + d;
            d = buf[i];
        }
        param[i] -= lr * d;
    }
}

void neox_train_update(neox_trainer *t, double lr, int64_t step) {
    neox_model *m = t->model;
    const neox_optimizer_settings *o = &t->optim;
    for (int i = 0; i < m->nparams; i++) {
        const neox_param *p = &m->params[i];
        float wd = p->no_decay ? 0.0f : (float)o->weight_decay;
        float *param = m->param_buf + p->offset;
        const float *grad = m->grad_buf + p->offset;
        if (o->kind == NEOX_OPTIMIZER_ADAM)
            neox_adamw(param, grad, t->exp_avg + p->offset, t->exp_avg_sq + p->offset, p->numel, (float)lr,
                       (float)o->beta1, (float)o->beta2, (float)o->eps, wd, (long)step);
        else
            sgd_update(param, grad, t->exp_avg + p->offset, p->numel, (float)lr, (float)o->momentum, wd, step == 1);
    }
}
