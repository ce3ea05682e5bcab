// finite.c: whether a model's weights (or a state tensor laid out like them: optimizer moments)
// are all finite. A diverged run (a learning rate far too high, bad data) leaves NaN or inf in
// them; such weights are never saved as a checkpoint and never evaluated, and a checkpoint holding
// them (hand-edited, or damaged in a way its CRC-32s cannot show) is refused when training resumes
// from it (docs/training.md, "Non-finite losses and weights").
#include <math.h>
#include <stdlib.h>

#include "kernels/backend.h"
#include "model.h"

enum { CHUNK_FLOATS = 1 << 16 };

// Index of the first non-finite value of buf[0, n) (on the model's device: read back chunk by
// chunk into a bounded host copy), or n when all are finite.
static size_t first_nonfinite_index(const neox_model *m, const float *buf, size_t n) {
    float *host = m->be->on_device ? neox_malloc(CHUNK_FLOATS * sizeof *host) : NULL;
    size_t found = n;
    for (size_t at = 0; at < n && found == n; at += CHUNK_FLOATS) {
        size_t len = n - at < CHUNK_FLOATS ? n - at : CHUNK_FLOATS;
        const float *v = buf + at;
        if (host) m->be->to_host(host, buf + at, len * sizeof *host), v = host;
        size_t i = 0;
        while (i < len && isfinite(v[i])) i++;
        if (i < len) found = at + i;
    }
    free(host);
    return found;
}

// The parameter holding flat element `flat` of the model's parameter layout.
static const neox_param *param_at(const neox_model *m, size_t flat) {
    for (int p = 0; p < m->nparams; p++)
        if (flat >= m->params[p].offset && flat < m->params[p].offset + m->params[p].numel) return &m->params[p];
    return NULL;
}

const neox_param *neox_model_first_nonfinite(const neox_model *m) {
    size_t at = first_nonfinite_index(m, m->param_buf, m->num_floats);
    return at < m->num_floats ? param_at(m, at) : NULL;
}

int neox_model_check_finite(const neox_model *m, const char *what, neox_error *err) {
    const neox_param *bad = neox_model_first_nonfinite(m);
    if (!bad) return 0;
    return neox_fail(err, NEOX_EXIT_FAILURE, "%s: parameter %s holds NaN or inf (the run diverged)", what, bad->name);
}

int neox_model_check_finite_state(const neox_model *m, const float *buf, size_t begin, size_t end, const char *group,
                                  neox_error *err) {
    size_t at = first_nonfinite_index(m, buf, end - begin);
    if (at == end - begin) return 0;
    const neox_param *p = param_at(m, begin + at);
    return neox_fail(err, NEOX_EXIT_FAILURE, "tensor %s/%s holds NaN or inf (element %zu of it)", group,
                     p ? p->name : "?", p ? begin + at - p->offset : begin + at);
}
