// offload.c: ZeRO-Offload of the optimizer (DeepSpeed's zero_optimization.offload_optimizer with
// device cpu, its older cpu_offload: true, and GPT-NeoX's optimizer.type cpu_adam). On a device
// backend the optimizer state and an fp32 copy of the weights it updates (this rank's range
// [state_begin, state_end): its ZeRO partition, or all of it) live in host memory; every update
// copies the (reduced) gradients of the range to the host (clipped there as the update reads them), runs the optimizer there, and
// copies the updated weights back. On the CPU backend everything already is host memory: a notice
// says that the keys change nothing.
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal.h"

static int asks_offload(const neox_trainer *t) {
    const neox_value *dict = neox_config_sub(t->cfg, zero_optimization__offload_optimizer);
    const neox_value *dev = dict ? neox_config_sub(t->cfg, zero_optimization__offload_optimizer__device) : NULL;
    const neox_value *old = neox_config_sub(t->cfg, zero_optimization__cpu_offload);
    return t->optim.host || (dev && dev->kind == NEOX_VALUE_STRING && !strcasecmp(dev->string, "cpu")) ||
           (old && old->kind == NEOX_VALUE_BOOL && old->boolean);
}

int neox_train_setup_offload(neox_trainer *t, neox_error *err) {
    (void)err;
    if (!asks_offload(t)) return 0;
    if (!t->be->on_device) {
        if (t->rank0 && !t->opts.quiet)
            neox_notice("optimizer offload (cpu_adam, offload_optimizer.device cpu or cpu_offload): nothing to move, "
                        "compute_backend %s keeps the optimizer in host memory already", t->be->name);
        return 0;
    }
    size_t n = t->state_end - t->state_begin;
    t->offload = 1;
    t->host_params = neox_malloc((n + 1) * sizeof(float));
    t->host_grads = neox_malloc((n + 1) * sizeof(float));
    return 0;
}

const neox_backend *neox_train_optimizer_backend(const neox_trainer *t) { return t->offload ? neox_backend_cpu() : t->be; }

void neox_train_offload_take_weights(neox_trainer *t) {
    if (!t->offload) return;
    size_t n = t->state_end - t->state_begin;
    t->be->to_host(t->host_params, t->model->param_buf + t->state_begin, n * sizeof(float));
}

void neox_train_offload_step(neox_trainer *t, const float *grads, const neox_segment *segs, int nseg, double lr,
                             int64_t step) {
    size_t bytes = (t->state_end - t->state_begin) * sizeof(float);
    t->be->to_host(t->host_grads, grads, bytes);
    neox_optimizer_step(t->optimizer, t->host_params, t->host_grads, segs, nseg, lr, step);
    t->be->to_device(t->model->param_buf + t->state_begin, t->host_params, bytes);
}

void neox_train_free_offload(neox_trainer *t) {
    free(t->host_params);
    free(t->host_grads);
}
