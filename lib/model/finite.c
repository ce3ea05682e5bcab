// finite.c: whether a model's weights are all finite. A diverged run (a learning rate far too
// high, bad data) leaves NaN or inf in them; such weights are never saved as a checkpoint and
// never evaluated (docs/training.md, "Non-finite losses and weights").
#include <math.h>
#include <stdlib.h>

#include "kernels/backend.h"
#include "model.h"

enum { CHUNK_FLOATS = 1 << 16 };

// The first non-finite value's parameter, scanning a host copy of param_buf chunk by chunk.
const neox_param *neox_model_first_nonfinite(const neox_model *m) {
    float *host = m->be->on_device ? neox_malloc(CHUNK_FLOATS * sizeof *host) : NULL;
    const neox_param *bad = NULL;
    for (size_t at = 0; at < m->num_floats && !bad; at += CHUNK_FLOATS) {
        size_t n = m->num_floats - at < CHUNK_FLOATS ? m->num_floats - at : CHUNK_FLOATS;
        const float *v = m->param_buf + at;
        if (host) m->be->to_host(host, m->param_buf + at, n * sizeof *host), v = host;
        size_t i = 0;
        while (i < n && isfinite(v[i])) i++;
        if (i == n) continue;
        for (int p = 0; p < m->nparams && !bad; p++)
            if (at + i >= m->params[p].offset && at + i < m->params[p].offset + m->params[p].numel) bad = &m->params[p];
    }
    free(host);
    return bad;
}

int neox_model_check_finite(const neox_model *m, const char *what, neox_error *err) {
    const neox_param *bad = neox_model_first_nonfinite(m);
    if (!bad) return 0;
    return neox_fail(err, NEOX_EXIT_FAILURE, "%s: parameter %s holds NaN or inf (the run diverged)", what, bad->name);
}
