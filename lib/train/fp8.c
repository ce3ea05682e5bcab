// fp8.c: precision fp8's delayed scaling as a trainer part. Set-up reads Transformer Engine's recipe
// from GPT-NeoX's te_fp8_* keys into the model (lib/model/fp8.c). The amaxes a training pass recorded
// are reduced with max over this stage's tensor-parallel and data-parallel groups, as TE reduces them
// over its FP8 group, so every rank of a stage holds the same scales (docs/model.md, "FP8 training",
// says how layouts compare); stages scale disjoint layers and never exchange amaxes. The scales are
// then updated as TE updates them, forward ones after each forward and backward ones after each
// backward: without pipelining once after each micro-batch's forward and backward (the same
// numbers, since the backward recasts the forward's tensors with the scales they had); under
// pipelining, where 1F1B runs other micro-batches' forwards before a backward, the forward half after
// each forward and the backward half after each backward, so each stage's forwards and its backwards
// each meet the micro-batches in the order one rank's gradient accumulation does.
// The amax histories and scales are training state: the run state's "fp8" key, the whole model's
// (every stage's columns, gathered from the stages). Every layout's output gradients are one rank's
// over the same samples (each rank's loss gradient divides by the global batch's tokens and the
// gradient exchange sums: lib/train/grad_exchange.c), so a checkpoint resumes bit for bit under
// any layout.
#include <string.h>

#include "internal.h"

typedef struct fp8_state {
    neox_fp8_recipe recipe;
    int training_pass;      // the pass in progress records amaxes
    neox_train_pass pass;   // which half it is (under pipelining)
    // The state's columns in the whole model's: this stage's FP8 linears are linears [first, first +
    // nlin) of total, layer order. Global tensor columns: 2g the input and 2g + 1 the weight of linear
    // g, 2 total + g its output gradient (as one rank's model numbers them).
    int nlin, first, total;
    // Under pipelining, on the ranks of rank 0's pipe group: the whole model's history
    // (history_len, 3 total) then scales (3 total), gathered after each step for a save.
    float *gathered;
} fp8_state;

extern const neox_train_part neox_train_fp8_part;

static fp8_state *state_of(const neox_trainer *t) { return *neox_train_part_slot(t, &neox_train_fp8_part); }

static int read_recipe(const neox_config *cfg, neox_fp8_recipe *r, neox_error *err) {
    const char *format = neox_config_str(cfg, te_fp8_format), *algo = neox_config_str(cfg, te_fp8_amax_compute_algo);
    int64_t len = neox_config_int(cfg, te_fp8_amax_history_len), margin = neox_config_int(cfg, te_fp8_margin);
    r->backward_format = format && strcmp(format, "e4m3") == 0 ? NEOX_FP8_E4M3 : NEOX_FP8_E5M2;
    r->wgrad = neox_config_bool(cfg, te_fp8_wgrad);
    if (len < 1 || len > 1 << 20)
        return neox_fail(err, NEOX_EXIT_USAGE, "te_fp8_amax_history_len: %lld is out of range (1 to 1048576)", (long long)len);
    if (!algo || (strcmp(algo, "max") != 0 && strcmp(algo, "most_recent") != 0))
        return neox_fail(err, NEOX_EXIT_USAGE, "te_fp8_amax_compute_algo: '%s' is not max or most_recent",
                         algo ? algo : "null");
    if (margin < -64 || margin > 64)
        return neox_fail(err, NEOX_EXIT_USAGE, "te_fp8_margin: %lld is out of range (-64 to 64)", (long long)margin);
    r->history_len = (int)len, r->algo_max = strcmp(algo, "max") == 0, r->margin = (int)margin;
    return 0;
}

// FP8 products need a GPU with FP8 tensor cores (compute capability 8.9: Ada, Hopper and newer).
static int check_device(const neox_trainer *t, neox_error *err) {
    if (strcmp(t->be->name, "cuda") != 0) return 0;
#ifdef NEOX_CUDA
    neox_cuda_device_info info;
    int device = neox_grid_local_rank(t->grid) % (neox_cuda_device_count() > 0 ? neox_cuda_device_count() : 1);
    if (neox_cuda_device_info_get(device, &info) != 0 || info.major * 10 + info.minor >= 89) return 0;
    return neox_fail(err, NEOX_EXIT_USAGE, "precision fp8: GPU %d (%s) is sm_%d%d; FP8 products need sm_89 or newer "
                     "(Ada, Hopper); train in bfloat16 there", device, info.name, info.major, info.minor);
#else
    (void)err;
    return 0;
#endif
}

// This stage's FP8 linears among the whole model's (every stage's counts, in stage order).
static void place_stage(neox_trainer *t, fp8_state *s) {
    neox_grid *g = t->grid;
    s->nlin = neox_model_fp8_tensors(t->model) / 3;
    s->first = 0, s->total = s->nlin;
    if (g->pipe_size == 1) return;
    int *counts = neox_calloc((size_t)g->pipe_size, sizeof *counts);
    neox_allgather(&g->pipe, &s->nlin, counts, 1, NEOX_I32);
    s->total = 0;
    for (int r = 0; r < g->pipe_size; r++) {
        if (r == g->pipe_rank) s->first = s->total;
        s->total += counts[r];
    }
    free(counts);
}

// Whether this rank gathers the stages' states for rank 0's run state: rank 0's pipe group, pipelined.
static int gathers(const neox_trainer *t) {
    return t->grid->pipe_size > 1 && t->grid->data_rank == 0 && t->grid->model_rank == 0;
}

static size_t state_floats(const fp8_state *s) { return (size_t)(s->recipe.history_len + 1) * 3 * s->total; }

// The whole model's column of this stage's column j (of 3 nlin: 2k, 2k + 1 forward, 2 nlin + k gradient).
static size_t global_column(const fp8_state *s, int j) {
    return j < 2 * s->nlin ? (size_t)(2 * s->first + j) : (size_t)(2 * s->total + s->first + (j - 2 * s->nlin));
}

static int setup_fp8(neox_trainer *t, neox_error *err) {
    if (t->precision != NEOX_PRECISION_FP8) return 0;
    fp8_state s = {0};
    if (read_recipe(t->cfg, &s.recipe, err) != 0 || check_device(t, err) != 0) return -1;
    neox_model_set_fp8_recipe(t->model, &s.recipe);
    place_stage(t, &s);
    if (gathers(t)) s.gathered = neox_calloc(state_floats(&s), sizeof(float));
    fp8_state *kept = neox_calloc(1, sizeof *kept);
    *kept = s;
    *neox_train_part_slot(t, &neox_train_fp8_part) = kept;
    return 0;
}

static void free_fp8(neox_trainer *t) {
    void **slot = neox_train_part_slot(t, &neox_train_fp8_part);
    fp8_state *s = *slot;
    if (s) free(s->gathered);
    free(*slot);
    *slot = NULL;
}

static void fp8_begin_pass(neox_trainer *t, neox_train_pass pass) {
    fp8_state *s = state_of(t);
    if (!s) return;
    s->training_pass = pass == NEOX_PASS_BACKWARD || t->model->training;  // (not an evaluation's forward)
    s->pass = pass;
}

// Row 0's amaxes of one half (gradients 0: the forward tensors', 1: the output gradients'), max-reduced
// over the stage's tensor-parallel and data-parallel groups.
static void reduce_newest(neox_trainer *t, int gradients) {
    int n;
    float *newest = neox_model_fp8_newest_amaxes(t->model, gradients, &n);
    if (n == 0) return;
    if (t->grid->model_size > 1) neox_allreduce_max(&t->grid->model, newest, (size_t)n, NEOX_F32);
    if (t->grid->data_size > 1) neox_allreduce_max(&t->grid->data, newest, (size_t)n, NEOX_F32);
}

static void fp8_end_pass(neox_trainer *t) {
    fp8_state *s = state_of(t);
    if (!s || !s->training_pass) return;
    s->training_pass = 0;
    neox_model *m = t->model;
    switch (s->pass) {
    case NEOX_PASS_TRAIN:  // forward and backward: both halves
        reduce_newest(t, 0);
        reduce_newest(t, 1);
        neox_model_fp8_update(m);
        break;
    case NEOX_PASS_FORWARD:
        reduce_newest(t, 0);
        neox_model_fp8_update_forward(m);
        break;
    case NEOX_PASS_BACKWARD:
        reduce_newest(t, 1);
        neox_model_fp8_update_backward(m);
        break;
    }
}

// This stage's state placed in the whole model's columns of history (len, 3
// total) and scale (3 total); the other stages' columns are left as they are.
static void place_columns(const neox_trainer *t, const fp8_state *s, float *history, float *scale) {
    size_t n = 3 * (size_t)s->nlin, len = (size_t)s->recipe.history_len, all = 3 * (size_t)s->total;
    float *h = neox_malloc((len * n + 1) * sizeof(float)), *sc = neox_malloc((n + 1) * sizeof(float));
    if (n) neox_model_fp8_state_get(t->model, h, sc);
    for (size_t j = 0; j < n; j++) {
        size_t c = global_column(s, (int)j);
        for (size_t r = 0; r < len; r++) history[r * all + c] = h[r * n + j];
        scale[c] = sc[j];
    }
    free(h);
    free(sc);
}

// Under pipelining, rank 0's pipe group sums the stages' columns (each column is one stage's, zero
// elsewhere: the sum is exact) into the whole model's state, after each step, for a save to write
// without a collective of its own (a save's failure on one rank must not leave the others waiting).
static void gather_stages(neox_trainer *t) {
    fp8_state *s = state_of(t);
    if (!s || !s->gathered) return;
    size_t hist = (size_t)s->recipe.history_len * 3 * s->total;
    memset(s->gathered, 0, state_floats(s) * sizeof(float));
    place_columns(t, s, s->gathered, s->gathered + hist);
    neox_allreduce_sum(&t->grid->pipe, s->gathered, state_floats(s), NEOX_F32);
}

// The scaling state (neox_model_fp8_state_get) as JSON arrays of its floats
// (doubles hold them exactly), and back.
static json_t *floats_json(const float *v, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_real(v[i]));
    return a;
}

static int json_floats(float *v, const json_t *a, size_t n, const char *what, neox_error *err) {
    if (!json_is_array(a) || json_array_size(a) != n)
        return neox_fail(err, NEOX_EXIT_FAILURE, "the checkpoint's fp8.%s is not an array of %zu numbers", what, n);
    for (size_t i = 0; i < n; i++) v[i] = (float)json_number_value(json_array_get(a, i));
    return 0;
}

static int save_fp8(const neox_trainer *t, neox_ckpt_writer *w, json_t *run_state, neox_error *err) {
    (void)w, (void)err;
    fp8_state *s = state_of(t);
    if (!s || !run_state) return 0;
    size_t n = 3 * (size_t)s->total, len = (size_t)s->recipe.history_len;
    float *history = neox_malloc((len * n + 1) * sizeof(float)), *scale = neox_malloc((n + 1) * sizeof(float));
    if (s->gathered) {
        memcpy(history, s->gathered, len * n * sizeof(float));
        memcpy(scale, s->gathered + len * n, n * sizeof(float));
    } else {
        place_columns(t, s, history, scale);
    }
    json_t *o = json_pack("{s:I, s:I}", "amax_history_len", (json_int_t)len, "tensors", (json_int_t)n);
    json_object_set_new(o, "amax_history", floats_json(history, len * n));
    json_object_set_new(o, "scale", floats_json(scale, n));
    json_object_set_new(run_state, "fp8", o);
    free(history);
    free(scale);
    return 0;
}

// This stage's columns of the whole model's history (len, 3 total) and scale (3 total) into the model.
static void set_stage(neox_trainer *t, const fp8_state *s, const float *history, const float *scale) {
    size_t n = 3 * (size_t)s->nlin, len = (size_t)s->recipe.history_len, all = 3 * (size_t)s->total;
    if (n == 0) return;
    float *h = neox_malloc(len * n * sizeof(float)), *sc = neox_malloc(n * sizeof(float));
    for (size_t j = 0; j < n; j++) {
        size_t c = global_column(s, (int)j);
        for (size_t r = 0; r < len; r++) h[r * n + j] = history[r * all + c];
        sc[j] = scale[c];
    }
    neox_model_fp8_state_set(t->model, h, sc);
    free(h);
    free(sc);
}

// A checkpoint of an fp8 run continues its scaling; one without (another precision's, or finetune)
// starts it afresh, as Transformer Engine starts a model.
static int load_fp8(neox_trainer *t, const neox_part_loading *from, neox_error *err) {
    fp8_state *s = state_of(t);
    json_t *o = json_object_get(from->state, "fp8");
    if (!s || from->finetune || !json_is_object(o)) return 0;
    size_t n = 3 * (size_t)s->total, len = (size_t)s->recipe.history_len;
    size_t had_len = (size_t)json_integer_value(json_object_get(o, "amax_history_len"));
    size_t had_n = (size_t)json_integer_value(json_object_get(o, "tensors"));
    if (had_n != n)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: the checkpoint scales %zu FP8 tensors, this model %zu", from->dir,
                         had_n, n);
    if (had_len != len)
        return neox_fail(err, NEOX_EXIT_USAGE, "te_fp8_amax_history_len: %zu, but the checkpoint in %s kept %zu amaxes "
                         "per tensor; resume with the same length", len, from->dir, had_len);
    float *history = neox_malloc((len * n + 1) * sizeof(float)), *scale = neox_malloc((n + 1) * sizeof(float));
    int rc = json_floats(history, json_object_get(o, "amax_history"), len * n, "amax_history", err) != 0 ||
                     json_floats(scale, json_object_get(o, "scale"), n, "scale", err) != 0
                 ? -1
                 : 0;
    if (rc == 0) set_stage(t, s, history, scale);
    free(history);
    free(scale);
    return rc;
}

const neox_train_part neox_train_fp8_part = {
    .name = "fp8 scaling",
    .stage = NEOX_PART_AFTER_MODEL,
    .setup = setup_fp8,
    .free = free_fp8,
    .save = save_fp8,
    .load = load_fp8,
    .start = gather_stages,  // (a save before the first step writes what was initialised or loaded)
    .end_step = gather_stages,
    .begin_pass = fp8_begin_pass,
    .end_pass = fp8_end_pass,
};
