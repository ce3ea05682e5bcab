// checkpoint.h: the training checkpoint as the model sees it (lib/checkpoint/): the model shape a
// checkpoint records in state/train.json, the run state's common part and its one reader
// (run_state.c), opening a checkpoint directory (every shard checked against its manifest first),
// and reading a model's parameters or optimizer state out of it by intersection, whatever layout
// wrote it (model_io.c). neox-train (resume), neox-eval and neox-convert all call these; the shard
// format underneath, which knows nothing of models, is ckpt.h (lib/ckpt/).
#ifndef NEOX_CHECKPOINT_H
#define NEOX_CHECKPOINT_H

#include <stdint.h>

#include "ckpt.h"
#include "model.h"

// Reads the parameters of a neox-train checkpoint into m (created from the same config): the
// checkpoint of `iteration` under load_dir, or the one load_dir/latest names when iteration <= 0.
// Any parallel layout may have written it; a different model shape is an error naming the key.
// *loaded (may be NULL) gets the iteration read.
int neox_load_model_params(neox_model *m, const char *load_dir, int64_t iteration, int64_t *loaded, neox_error *err);

// The padded vocabulary of the newest checkpoint in load_dir, into *vocab (left as it is when
// there is no checkpoint): the model's size, which a different tensor-parallel size would pad
// differently.
int neox_checkpoint_padded_vocab(const char *load_dir, int *vocab, neox_error *err);

// One entry of the model shape stored in state/train.json, named as the GPT-NeoX key that sets it.
typedef struct neox_shape_field {
    const char *name;
    int value;
} neox_shape_field;
enum { NEOX_SHAPE_FIELDS = 32 };
int neox_ckpt_model_shape(const neox_model_desc *d, neox_shape_field *f);  // fills up to NEOX_SHAPE_FIELDS
typedef struct json_t json_t;
// The "model" object of state/train.json: every shape field of d (new reference).
json_t *neox_ckpt_model_shape_json(const neox_model_desc *d);
// The counters of a run state (state/train.json); a fresh run's are all 0 but the seed.
typedef struct neox_run_counters {
    int64_t iteration, optimizer_steps, train_samples, train_position, valid_position;
    int64_t skipped_total, nonfinite_in_a_row, overflow_skips;
    int64_t seed, dropout_rows;
    int has_rng;  // seed and dropout_rows stored (not with no_save_rng)
} neox_run_counters;
// state/train.json's common part (lib/checkpoint/run_state.c, whose reader checks it): the counters, the
// model shape of d and the stored config files (a json array, stolen). The trainer adds the sections
// only a running trainer has (optimizer, LR schedule, loss scaler). New reference.
json_t *neox_ckpt_run_state_json(const neox_run_counters *c, const neox_model_desc *d, json_t *config_files);
// The run state of a checkpoint (state/train.json: iteration, optimizer steps, data positions,
// seed, LR schedule, loss scaler, model shape, stored config files), parsed and every field checked
// for its type and range; the error names the directory, the file and the field. *state is the
// caller's to json_decref.
int neox_ckpt_read_run_state(const neox_ckpt_reader *r, const char *dir, json_t **state, neox_error *err);
// The checks alone, on a parsed state; file names it in errors.
int neox_ckpt_check_run_state(json_t *state, const char *file, neox_error *err);
// Opens every shard file the manifest of checkpoint directory dir lists, each checked against it
// first (neox_ckpt_open_dir).
neox_ckpt_reader *neox_ckpt_open_checkpoint(const char *dir, neox_error *err);
// Fails naming the key when the stored shape differs from d (status: NEOX_EXIT_USAGE when d comes from
// the user's config, NEOX_EXIT_FAILURE when from the checkpoint's own stored config).
int neox_ckpt_check_model_shape(const neox_model_desc *d, json_t *state, const char *dir, int status, neox_error *err);
// Reads the whole tensors group/NAME of every parameter into buf at the parameter's offset
// (this rank's block of each: the intersection of the checkpoint's pieces with it). buf and dst
// below are memory of the model's backend (staged through the host on a device).
int neox_ckpt_read_model_tensors(const neox_model *m, const neox_ckpt_reader *r, const char *group, float *buf, neox_error *err);
// The same for elements [begin, end) of the flat buffer only; dst[0] is element begin.
int neox_ckpt_read_model_range(const neox_model *m, const neox_ckpt_reader *r, const char *group, size_t begin, size_t end,
                          float *dst, neox_error *err);

#endif
