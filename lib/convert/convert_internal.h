// convert_internal.h: what the files of lib/convert share and nothing outside uses.
#ifndef NEOX_CONVERT_INTERNAL_H
#define NEOX_CONVERT_INTERNAL_H

#include "convert.h"

// config.json for the Hugging Face class of the model (NULL + err when no class can hold it);
// bos/eos < 0 are left out. malloc'ed text.
// The special token ids an export declares (-1: none): config.json's and generation_config.json's.
typedef struct neox_cvt_token_ids {
    int bos, eos, pad;
} neox_cvt_token_ids;
char *neox_cvt_hf_config_json(const neox_model_desc *d, const char *dtype, neox_cvt_token_ids ids, neox_error *err);
char *neox_cvt_generation_config_json(neox_cvt_token_ids ids);
// The hidden_act of an activation (NULL when transformers has none), and the activation a
// hidden_act names for an ungated (GPTNeoXForCausalLM) or gated (LlamaForCausalLM) MLP (-1: none).
const char *neox_cvt_hf_act_name(neox_activation a);
int neox_cvt_activation_of_hf(const char *hf, int gated, neox_activation *out);
// The optimizer state groups ("optimizer/exp_avg", ...) of the run state; returns how many.
int neox_cvt_optimizer_groups(const neox_cvt_ckpt *c, const char **groups);
// Writes text to dir/name (the output directory is renamed into place as a whole at the end).
int neox_cvt_write_text(const char *dir, const char *name, const char *text, neox_error *err);
// Copies a file into dir under name.
int neox_cvt_copy_file(const char *src, const char *dir, const char *name, neox_error *err);

#endif

// The checkpoint directory PATH names: PATH itself when it holds manifest.json, else the one its
// `latest` names (malloc'ed; NULL + err when neither).
char *neox_cvt_resolve(const char *path, neox_error *err);

// ---- writing a checkpoint in a layout (lib/convert/output.c) ----------------------------------
typedef struct neox_cvt_out {
    char *dir;                  // SAVE/global_stepN being written
    neox_cvt_layout lay;
    int world;
    neox_ckpt_writer **writers; // one per world rank: (pipe * dp + data) * tp + model
    const neox_model_desc *desc;
    neox_cvt_param *params;
    int nparams;
    int64_t *flat_offset;       // each parameter's offset in the trainer's flat buffer
    int64_t flat_total;
    double bytes_written;
    float *buf;                 // a block of columns being written
    size_t buf_floats;
    // For each (pipe, model) rank, pipe * tp + model: the block of each parameter (indexed as
    // params) that lib/model gives that rank, or NULL when the rank does not store it.
    const neox_param ***blocks;
    neox_param **rank_params;   // the lists the blocks point into
} neox_cvt_out;

// Creates SAVE/global_stepN and one shard writer per rank of the layout.
int neox_cvt_out_open(neox_cvt_out *o, const char *save, int64_t iteration, const neox_model_desc *desc,
                      const neox_cvt_layout *lay, neox_error *err);
// Writes parameter i of group ("params", "optimizer/exp_avg", ...), given whole (row-major, fp32),
// in the layout (memory: at most one piece besides whole).
int neox_cvt_out_tensor(neox_cvt_out *o, const char *group, int i, const float *whole, neox_error *err);
// A byte string, written once by rank 0.
int neox_cvt_out_bytes(neox_cvt_out *o, const char *name, const void *data, size_t size, neox_error *err);
// Closes every shard, writes manifest.json and points SAVE/latest at the checkpoint.
int neox_cvt_out_finish(neox_cvt_out *o, const char *save, int64_t iteration, neox_error *err);
void neox_cvt_out_abort(neox_cvt_out *o);
