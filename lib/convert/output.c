// output.c: writing a checkpoint laid out for a parallel layout (the conventions are in layout.c).
// With tp = pp = 1 every tensor group is the trainer's flat-range layout: the flat buffer, in the
// trainer's parameter order, cut evenly over the data-parallel ranks (lib/train/checkpoint.c), so
// a resharded checkpoint is exactly what a run with that many data ranks would have saved. With
// tp or pp > 1 tensors are Megatron-style blocks, exactly those lib/model gives each (pipe, model)
// rank of the layout (its pipe partition included); replicated tensors are written once, by model
// rank 0, and the last stage's copy of a tied embedding not at all. Parameters are written by data
// rank 0, and with ZeRO (stage >= 1) and dp > 1 each optimizer block is cut further over the data
// ranks by rows (its first dimension), as ZeRO partitions optimizer state over data ranks.
#include <stdlib.h>
#include <string.h>

#include "convert_internal.h"

static int rank_of(const neox_cvt_layout *l, int pipe, int data, int model) { return (pipe * l->dp + data) * l->tp + model; }

// Each (pipe, model) rank's parameter list from lib/model, and where each parameter's block is in it.
static int plan_blocks(neox_cvt_out *o, neox_error *err) {
    const neox_cvt_layout *l = &o->lay;
    int *bounds = neox_calloc((size_t)l->pp + 1, sizeof *bounds), rc = 0;
    if (neox_model_pipe_partition(o->desc, l->pp, l->pipe_partition, bounds, err) != 0) return free(bounds), -1;
    o->blocks = neox_calloc((size_t)(l->pp * l->tp), sizeof *o->blocks);
    o->rank_params = neox_calloc((size_t)(l->pp * l->tp), sizeof *o->rank_params);
    for (int r = 0; r < l->pp * l->tp && rc == 0; r++) {
        int pipe = r / l->tp, model = r % l->tp, n;
        neox_model_desc d = *o->desc;
        d.tp_size = l->tp, d.tp_rank = model, d.pp_size = l->pp, d.pp_rank = pipe;
        d.layer_begin = bounds[pipe], d.layer_end = bounds[pipe + 1];
        neox_param *list = o->rank_params[r] = neox_model_param_list(&d, &n, err);
        if (!list) rc = -1;
        o->blocks[r] = neox_calloc((size_t)o->nparams, sizeof **o->blocks);
        for (int k = 0; k < n && rc == 0; k++) {
            const neox_param *q = &list[k];
            if (q->index < 0 || q->index >= o->nparams || strcmp(q->name, o->params[q->index].name) != 0)
                rc = neox_fail(err, NEOX_EXIT_FAILURE, "internal: rank %d's parameter %s is not the model's", r, q->name);
            else if (!q->tied_copy && (q->split != NEOX_SPLIT_NONE || model == 0)) o->blocks[r][q->index] = q;
        }
    }
    free(bounds);
    return rc;
}

int neox_cvt_out_open(neox_cvt_out *o, const char *save, int64_t iteration, const neox_model_desc *desc,
                      const neox_cvt_layout *lay, neox_error *err) {
    memset(o, 0, sizeof *o);
    if (neox_cvt_layout_check(desc, lay, err) != 0) return -1;
    if (neox_ckpt_make_dir(save, iteration, err) != 0) return -1;
    o->dir = neox_ckpt_dir(save, iteration);
    o->lay = *lay;
    o->world = lay->tp * lay->pp * lay->dp;
    o->desc = desc;
    o->params = neox_cvt_params(desc, &o->nparams);
    o->flat_offset = neox_calloc((size_t)o->nparams, sizeof *o->flat_offset);
    for (int i = 0; i < o->nparams; i++) {
        o->flat_offset[i] = o->flat_total;
        o->flat_total += o->params[i].shape[0] * (o->params[i].ndim == 2 ? o->params[i].shape[1] : 1);
    }
    o->writers = neox_calloc((size_t)o->world, sizeof *o->writers);
    if (plan_blocks(o, err) != 0) {
        neox_cvt_out_abort(o);
        return -1;
    }
    for (int r = 0; r < o->world; r++) {
        char name[32];
        neox_ckpt_shard_name(r, name, sizeof name);
        char *path = neox_asprintf("%s/%s", o->dir, name);
        o->writers[r] = neox_ckpt_writer_open(path, err);
        free(path);
        if (!o->writers[r]) {
            neox_cvt_out_abort(o);
            return -1;
        }
    }
    return 0;
}

// The piece buffer, kept across tensors: a fresh large allocation per piece would be page-faulted in
// every time.
static float *piece_buffer(neox_cvt_out *o, int64_t n) {
    if ((size_t)n > o->buf_floats) {
        free(o->buf);
        o->buf = neox_malloc((size_t)n * sizeof(float));
        o->buf_floats = (size_t)n;
    }
    return o->buf;
}

static int64_t numel_of(const neox_cvt_param *p) { return p->shape[0] * (p->ndim == 2 ? p->shape[1] : 1); }

// The trainer's flat layout: data rank r holds [total*r/dp, total*(r+1)/dp) of the flat buffer.
static int write_flat(neox_cvt_out *o, const char *name, int i, const float *whole, neox_error *err) {
    const neox_cvt_param *p = &o->params[i];
    int64_t begin = o->flat_offset[i], end = begin + numel_of(p);
    for (int d = 0; d < o->lay.dp; d++) {
        size_t share_lo, share_hi, lo, hi;
        neox_even_share((size_t)o->flat_total, d, o->lay.dp, &share_lo, &share_hi);
        if (!neox_overlap(share_lo, share_hi, (size_t)begin, (size_t)end, &lo, &hi)) continue;
        int64_t start = (int64_t)lo - begin, n = (int64_t)(hi - lo);
        if (neox_ckpt_write_range(o->writers[rank_of(&o->lay, 0, d, 0)], name, p->ndim, p->shape, start, n, whole + start,
                                  err) != 0)
            return -1;
        o->bytes_written += (double)n * sizeof(float);
    }
    return 0;
}

// A block of whole rows is contiguous in the tensor and written in place; a block of columns is
// gathered into the piece buffer first.
static int write_block(neox_cvt_out *o, const char *name, const neox_cvt_param *p, int rank, const int64_t *offset,
                       const int64_t *count, const float *whole, neox_error *err) {
    int64_t cols = p->ndim == 2 ? p->shape[1] : 1, ccount = p->ndim == 2 ? count[1] : 1, coff = p->ndim == 2 ? offset[1] : 0;
    int64_t n = count[0] * ccount;
    if (n == 0) return 0;
    const float *src = whole + offset[0] * cols;
    if (ccount != cols) {
        float *buf = piece_buffer(o, n);
        for (int64_t r = 0; r < count[0]; r++)
            memcpy(buf + r * ccount, whole + (offset[0] + r) * cols + coff, (size_t)ccount * sizeof(float));
        src = buf;
    }
    o->bytes_written += (double)n * sizeof(float);
    return neox_ckpt_write_block(o->writers[rank], name, p->ndim, p->shape, offset, count, src, err);
}

int neox_cvt_out_tensor(neox_cvt_out *o, const char *group, int i, const float *whole, neox_error *err) {
    const neox_cvt_param *p = &o->params[i];
    char name[160];
    snprintf(name, sizeof name, "%s/%s", group, p->name);
    int rc = 0;
    if (o->lay.tp == 1 && o->lay.pp == 1) return write_flat(o, name, i, whole, err);
    int zero_cut = o->lay.zero >= 1 && o->lay.dp > 1 && strcmp(group, "params") != 0;
    for (int pipe = 0; pipe < o->lay.pp && rc == 0; pipe++) {
        for (int model = 0; model < o->lay.tp && rc == 0; model++) {
            const neox_param *b = o->blocks[pipe * o->lay.tp + model][i];
            if (!b) continue;
            int64_t offset[2] = {b->block_offset[0], b->block_offset[1]}, count[2] = {b->shape[0], b->shape[1]};
            if (!zero_cut) {
                rc = write_block(o, name, p, rank_of(&o->lay, pipe, 0, model), offset, count, whole, err);
                continue;
            }
            int64_t rows = count[0], first = offset[0];
            for (int d = 0; d < o->lay.dp && rc == 0; d++) {
                size_t lo, hi;  // ZeRO's rows of this data rank
                neox_even_share((size_t)rows, d, o->lay.dp, &lo, &hi);
                offset[0] = first + (int64_t)lo;
                count[0] = (int64_t)(hi - lo);
                rc = write_block(o, name, p, rank_of(&o->lay, pipe, d, model), offset, count, whole, err);
            }
        }
    }
    return rc;
}

int neox_cvt_out_bytes(neox_cvt_out *o, const char *name, const void *data, size_t size, neox_error *err) {
    return neox_ckpt_write_bytes(o->writers[0], name, data, size, err);
}

// Each shard's manifest entry comes from its writer as it closes (no shard is read back).
int neox_cvt_out_finish(neox_cvt_out *o, const char *save, int64_t iteration, neox_error *err) {
    neox_ckpt_manifest m = {.iteration = iteration, .world_size = o->world, .pipe_size = o->lay.pp,
                            .data_size = o->lay.dp, .model_size = o->lay.tp, .zero_stage = o->lay.zero,
                            .nfiles = o->world};
    m.files = neox_calloc((size_t)m.nfiles, sizeof *m.files);
    int rc = 0;
    for (int r = 0; r < o->world; r++) {
        neox_ckpt_writer *w = o->writers[r];
        o->writers[r] = NULL;
        neox_ckpt_shard_name(r, m.files[r].name, sizeof m.files[r].name);
        m.files[r].rank = r;
        if (rc == 0) rc = neox_ckpt_writer_close_entry(w, &m.files[r], err);
        else neox_ckpt_writer_abort(w);
    }
    if (rc == 0) rc = neox_ckpt_manifest_write(o->dir, &m, err);
    if (rc == 0) rc = neox_ckpt_mark_latest(save, iteration, 0, err);
    free(m.files);
    neox_cvt_out_abort(o);
    return rc;
}

void neox_cvt_out_abort(neox_cvt_out *o) {
    for (int r = 0; o->writers && r < o->world; r++)
        if (o->writers[r]) neox_ckpt_writer_abort(o->writers[r]);
    free(o->writers);
    for (int r = 0; o->blocks && r < o->lay.pp * o->lay.tp; r++) {
        free(o->blocks[r]);
        free(o->rank_params[r]);
    }
    free(o->blocks);
    free(o->rank_params);
    free(o->params);
    free(o->flat_offset);
    free(o->buf);
    free(o->dir);
    memset(o, 0, sizeof *o);
}
