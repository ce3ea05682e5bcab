// reshard.c: a checkpoint physically laid out for another parallel layout (output.c, layout.c).
// Every tensor of every group (parameters and optimizer state) is read by intersection from the
// source — whatever layout wrote it — and written to the ranks of the new layout, one tensor at a
// time, so memory stays at a few tensors (the tensor, the piece being written, the reader's piece
// buffer). The run state (iteration, data position, RNG, LR schedule) and the stored config are
// global and copied as they are.
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "convert_internal.h"
#include "optim.h"

// Reads tensor group/NAME of parameter i whole (each source piece once, whatever the source layout)
// into *buf, so every block of the new layout is cut from memory: cutting straight from the source
// would read a piece once per overlapping block (tp times for a whole-tensor piece).
static int read_whole(const neox_cvt_ckpt *c, const neox_cvt_out *o, const char *group, int i, float **buf,
                      size_t *cap, neox_error *err) {
    const neox_cvt_param *p = &o->params[i];
    int64_t n = p->shape[0] * (p->ndim == 2 ? p->shape[1] : 1);
    if ((size_t)n > *cap) {
        free(*buf);
        *buf = neox_malloc((size_t)n * sizeof(float));
        *cap = (size_t)n;
    }
    char name[160];
    snprintf(name, sizeof name, "%s/%s", group, p->name);
    return neox_ckpt_read_range(c->reader, name, 0, n, *buf, err);
}

static int copy_bytes(const neox_cvt_ckpt *c, neox_cvt_out *o, neox_error *err) {
    for (int i = 0; i < neox_ckpt_tensor_count(c->reader); i++) {
        const char *name = neox_ckpt_tensor_name(c->reader, i);
        if (strncmp(name, "state/", 6) != 0 && strncmp(name, "config/", 7) != 0) continue;
        void *data;
        size_t size;
        if (neox_ckpt_read_bytes(c->reader, name, &data, &size, err) != 0) return -1;
        int rc = neox_cvt_out_bytes(o, name, data, size, err);
        free(data);
        if (rc != 0) return -1;
    }
    return 0;
}

static int reshard_into(const neox_cvt_ckpt *c, const char *save, const neox_cvt_layout *lay, neox_error *err) {
    neox_cvt_out o;
    int64_t iteration = c->manifest.iteration;
    if (neox_cvt_out_open(&o, save, iteration, &c->desc, lay, err) != 0) return -1;
    const char *groups[1 + NEOX_OPTIMIZER_MAX_STATE] = {"params"};
    int ngroups = 1 + neox_cvt_optimizer_groups(c, groups + 1), rc = 0;
    neox_progress *bar = neox_progress_start("reshard", (double)o.flat_total * sizeof(float) * ngroups, "B");
    float *buf = NULL;
    size_t cap = 0;
    for (int g = 0; g < ngroups && rc == 0; g++)
        for (int i = 0; i < o.nparams && rc == 0; i++) {
            rc = read_whole(c, &o, groups[g], i, &buf, &cap, err);
            if (rc == 0) rc = neox_cvt_out_tensor(&o, groups[g], i, buf, err);
            neox_progress_update(bar, o.bytes_written, NULL);
        }
    free(buf);
    neox_progress_finish(bar, o.bytes_written, NULL);
    if (rc == 0) rc = copy_bytes(c, &o, err);
    if (rc == 0) return neox_cvt_out_finish(&o, save, iteration, err);
    neox_cvt_out_abort(&o);
    return -1;
}

int neox_convert_reshard(const char *ckpt, const char *out_save, const neox_cvt_layout *layout, neox_error *err) {
    neox_cvt_ckpt c;
    if (neox_cvt_open(&c, ckpt, err) != 0) return -1;
    neox_cvt_layout lay = *layout;  // stages cut as the run that resumes from it will cut them
    if (!lay.pipe_partition) lay.pipe_partition = neox_config_str(c.cfg, pipe_partition_method);
    int rc = neox_cvt_layout_check(&c.desc, &lay, err);
    // SM3's accumulators are cut by rows and columns, not as the parameters are: reshard carries
    // only state shaped like the parameters, and neox-train reads them into any layout itself.
    const char *optimizer = json_string_value(json_object_get((json_t *)c.state, "optimizer"));
    const neox_optimizer_type *type = neox_optimizer_type_named(optimizer);
    if (rc == 0 && type && type->per_tensor)
        rc = neox_fail(err, NEOX_EXIT_USAGE, "%s holds %s optimizer state, whose row and column accumulators reshard "
                       "does not carry: neox-train loads the checkpoint into any layout as it is", c.dir, optimizer);
    char *tmp = rc == 0 ? neox_cvt_outdir_begin(out_save, err) : NULL;
    if (tmp) rc = reshard_into(&c, tmp, &lay, err);
    else rc = -1;
    if (rc == 0) rc = neox_cvt_outdir_commit(tmp, out_save, err);
    else neox_cvt_outdir_abort(tmp);
    if (rc != 0) neox_fail_context(err, "reshard %s", c.dir);
    free(tmp);
    neox_cvt_close(&c);
    return rc;
}
