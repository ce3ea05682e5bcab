// fp8.c: precision fp8's delayed scaling as a trainer part. Set-up reads Transformer Engine's recipe
// from GPT-NeoX's te_fp8_* keys into the model (lib/model/fp8.c); after each training pass (a
// micro-batch's forward and backward) the amaxes it recorded are reduced with max over the
// tensor-parallel and data-parallel groups, as TE reduces them over its FP8 group, so every rank
// holds the same scales (docs/model.md, "FP8 training", says how layouts compare), and the scales are
// updated (TE updates its forward scales after each forward and its
// backward ones after each backward: with the forward's FP8 tensors reused by the backward, updating
// both after the pass gives the same numbers). The amax histories and scales are training state:
// the run state's "fp8" key (global: every rank holds the same), kept in one rank's units (a
// data-parallel rank's output gradients are the data-parallel size times one rank's, and so are
// their amaxes) so that a checkpoint resumes bit for bit under any layout with a power-of-two
// data-parallel size.
#include <string.h>

#include "internal.h"

typedef struct fp8_state {
    neox_fp8_recipe recipe;
    int training_pass;  // the pass in progress runs a backward (records amaxes)
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

static int setup_fp8(neox_trainer *t, neox_error *err) {
    if (t->precision != NEOX_PRECISION_FP8) return 0;
    fp8_state s = {0};
    if (read_recipe(t->cfg, &s.recipe, err) != 0 || check_device(t, err) != 0) return -1;
    s.recipe.grad_multiple = t->grid->data_size;  // each rank's loss is the mean over its own micro-batch
    if (t->grid->pipe_size > 1)  // (1F1B runs other micro-batches' forwards between a forward and its backward)
        return neox_fail(err, NEOX_EXIT_USAGE, "precision fp8 with pipe_parallel_size %d: FP8 training runs without "
                         "pipeline parallelism (set pipe_parallel_size to 1)", t->grid->pipe_size);
    neox_model_set_fp8_recipe(t->model, &s.recipe);
    fp8_state *kept = neox_calloc(1, sizeof *kept);
    *kept = s;
    *neox_train_part_slot(t, &neox_train_fp8_part) = kept;
    return 0;
}

static void free_fp8(neox_trainer *t) {
    void **slot = neox_train_part_slot(t, &neox_train_fp8_part);
    free(*slot);
    *slot = NULL;
}

static void fp8_begin_pass(neox_trainer *t, neox_train_pass pass) {
    fp8_state *s = state_of(t);
    if (s) s->training_pass = pass == NEOX_PASS_TRAIN && t->model->training;
}

static void fp8_end_pass(neox_trainer *t) {
    fp8_state *s = state_of(t);
    if (!s || !s->training_pass) return;
    s->training_pass = 0;
    int n = neox_model_fp8_tensors(t->model);
    float *newest = neox_model_fp8_history(t->model);  // row 0: this pass's amaxes
    if (t->grid->model_size > 1) neox_allreduce_max(&t->grid->model, newest, (size_t)n, NEOX_F32);
    if (t->grid->data_size > 1) neox_allreduce_max(&t->grid->data, newest, (size_t)n, NEOX_F32);
    neox_model_fp8_update(t->model);
}

// The scaling state (in one rank's units: neox_model_fp8_state_get) as JSON arrays of its floats
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
    size_t n = (size_t)neox_model_fp8_tensors(t->model), len = (size_t)s->recipe.history_len;
    float *history = neox_malloc((len * n + 1) * sizeof(float)), *scale = neox_malloc((n + 1) * sizeof(float));
    neox_model_fp8_state_get(t->model, history, scale);
    json_t *o = json_pack("{s:I, s:I}", "amax_history_len", (json_int_t)len, "tensors", (json_int_t)n);
    json_object_set_new(o, "amax_history", floats_json(history, len * n));
    json_object_set_new(o, "scale", floats_json(scale, n));
    json_object_set_new(run_state, "fp8", o);
    free(history);
    free(scale);
    return 0;
}

// A checkpoint of an fp8 run continues its scaling; one without (another precision's, or finetune)
// starts it afresh, as Transformer Engine starts a model.
static int load_fp8(neox_trainer *t, const neox_part_loading *from, neox_error *err) {
    fp8_state *s = state_of(t);
    json_t *o = json_object_get(from->state, "fp8");
    if (!s || from->finetune || !json_is_object(o)) return 0;
    size_t n = (size_t)neox_model_fp8_tensors(t->model), len = (size_t)s->recipe.history_len;
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
    if (rc == 0) neox_model_fp8_state_set(t->model, history, scale);
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
    .begin_pass = fp8_begin_pass,
    .end_pass = fp8_end_pass,
};
