// layout.c: the parameters of a model in the trainer's buffer order (lib/model's own layout,
// neox_model_param_list), which the data-parallel flat-range layout is cut from, and the check that
// a parallel layout divides the model. Which block of each parameter a (pipe, model) rank holds is
// lib/model's answer for that rank (output.c), so convert and trainer cut tensors one way.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert.h"

neox_cvt_param *neox_cvt_params(const neox_model_desc *d, int *count) {
    neox_error err = {0};
    int n = 0;
    neox_param *model = neox_model_param_list(d, &n, &err);
    neox_assert(model, "%s", err.message);  // desc was checked when the checkpoint was opened
    neox_cvt_param *list = neox_calloc(n ? n : 1, sizeof *list);
    for (int i = 0; i < n; i++) {
        neox_cvt_param *p = &list[i];
        snprintf(p->name, sizeof p->name, "%s", model[i].name);
        p->ndim = model[i].ndim;
        p->shape[0] = model[i].shape[0];
        p->shape[1] = model[i].ndim == 2 ? model[i].shape[1] : 0;
    }
    free(model);
    *count = n;
    return list;
}

int neox_cvt_layout_check(const neox_model_desc *d, const neox_cvt_layout *lay, neox_error *err) {
    if (lay->tp < 1 || lay->pp < 1 || lay->dp < 1)
        return neox_fail(err, NEOX_EXIT_USAGE, "--tp, --pp and --dp must be at least 1");
    if (lay->zero < 0 || lay->zero > 3) return neox_fail(err, NEOX_EXIT_USAGE, "--zero must be 0, 1, 2 or 3");
    if (d->num_heads % lay->tp != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "--tp %d does not divide num_attention_heads = %d", lay->tp, d->num_heads);
    if (d->num_kv_heads % lay->tp != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "--tp %d does not divide num_kv_heads = %d", lay->tp, d->num_kv_heads);
    if (d->ffn_size % lay->tp != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "--tp %d does not divide the MLP width (intermediate_size) %d", lay->tp,
                         d->ffn_size);
    if (d->vocab_size % lay->tp != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "--tp %d does not divide the padded vocabulary %d", lay->tp, d->vocab_size);
    if (d->num_layers < lay->pp)
        return neox_fail(err, NEOX_EXIT_USAGE, "--pp %d is more pipe stages than num_layers = %d", lay->pp, d->num_layers);
    return 0;
}
