// convert.h: what neox-convert does, as library calls — export a training checkpoint as a Hugging
// Face model folder and import one back, inspect and verify a checkpoint, and reshard it for another
// parallel layout. Checkpoints are the trainer's (docs/training.md, "Checkpoints written by
// neox-train"); every move reads tensors by intersection (lib/ckpt.h), one tensor at a time, so
// memory stays bounded by a few tensors. See docs/convert.md.
#ifndef NEOX_CONVERT_H
#define NEOX_CONVERT_H

#include <stdint.h>
#include <stdio.h>

#include "ckpt.h"
#include "config.h"
#include "core.h"
#include "model.h"

// ---- an opened checkpoint -------------------------------------------------------------------
typedef struct neox_cvt_ckpt {
    char *dir;                   // SAVE/global_stepN
    neox_ckpt_manifest manifest;
    neox_ckpt_reader *reader;    // every shard file of the manifest
    void *state;                 // state/train.json (a jansson json_t *)
    neox_config *cfg;            // the config the checkpoint was trained with (config/input/*)
    neox_model_desc desc;
} neox_cvt_ckpt;

// Opens PATH: a checkpoint directory (holding manifest.json) or a save directory (holding `latest`).
// Reads the manifest, indexes every shard, loads the stored config and derives the model from it.
int neox_cvt_open(neox_cvt_ckpt *c, const char *path, neox_error *err);
void neox_cvt_close(neox_cvt_ckpt *c);

// ---- the parameters of a model, in the trainer's buffer order (lib/model/params.c) -----------
typedef struct neox_cvt_param {
    char name[96];      // Hugging Face name
    int ndim;
    int64_t shape[2];
} neox_cvt_param;

// The parameter list of desc (malloc'ed, *count entries).
neox_cvt_param *neox_cvt_params(const neox_model_desc *desc, int *count);

// ---- parallel layouts (lib/convert/layout.c) ---------------------------------------------------
typedef struct neox_cvt_layout {
    int tp, pp, dp;     // model (tensor), pipe and data parallel sizes
    int zero;           // ZeRO stage (0..3)
    const char *pipe_partition;  // pipe_partition_method of the target run (NULL: type:transformer)
} neox_cvt_layout;
// Checks that the layout divides the model (heads % tp, kv heads % tp, MLP width, vocabulary,
// layers >= pp). The error names the size and the option.
int neox_cvt_layout_check(const neox_model_desc *desc, const neox_cvt_layout *lay, neox_error *err);

// ---- the subcommands ------------------------------------------------------------------------
typedef struct neox_to_hf_options {
    const char *dtype;          // "fp32" (default), "bf16" or "fp16"
    uint64_t max_shard_bytes;   // model.safetensors is split above this (0: NEOX_HF_SHARD_BYTES)
    // config.json's pad_token_id (a token of the padded vocabulary), replacing the tokenizer's pad
    // token; -1: the tokenizer's, if it declares one. A reward model's ...ForSequenceClassification
    // reads each row's value at its last token that is not this one.
    long long pad_token_id;
} neox_to_hf_options;
#define NEOX_HF_SHARD_BYTES (5ull << 30)  // 5 GB, as transformers' save_pretrained

int neox_convert_to_hf(const char *ckpt, const char *out_dir, const neox_to_hf_options *opts, neox_error *err);
int neox_convert_from_hf(const char *hf_dir, const char *out_save, const neox_cvt_layout *lay, neox_error *err);
// A GPT-NeoX (DeepSpeed) checkpoint (a global_stepN directory, or the save directory whose `latest`
// names one) with the run's GPT-NeoX YAML configs -> a neox.c checkpoint in out_save (docs/convert.md,
// "From a GPT-NeoX run").
int neox_convert_from_neox(const char *input, const char *const *configs, int nconfigs, const char *out_save,
                           const neox_cvt_layout *lay, neox_error *err);
// The reverse: a neox.c checkpoint of a GPT-NeoX-style model as GPT-NeoX's DeepSpeed checkpoint for
// lay->tp tensor-parallel and lay->dp data-parallel ranks at ZeRO stage lay->zero (1 when 0) in out_dir
// (docs/convert.md, "Back to GPT-NeoX").
// What GPT-NeoX version the files are for (options; NULL: the defaults).
typedef struct neox_to_neox_options {
    // The MLP's names: "dense_h_to_4h" (dense_h_to_4h/dense_4h_to_h, GPT-NeoX 2.0 until September
    // 2024; the default for GPT-NeoX-style models) or "linear1" (linear1/linear2, GPT-NeoX since then;
    // the only names a Llama-style gated MLP has); NULL: the default.
    const char *mlp_names;
    // Write each layer's attention.rotary_emb.inv_freq buffer (GPT-NeoX with rotary_save_freqs_buffer
    // true, or before March 2024: its strict module load needs them).
    int inv_freq;
} neox_to_neox_options;
int neox_convert_to_neox(const char *ckpt, const char *out_dir, const neox_cvt_layout *lay,
                         const neox_to_neox_options *opts, neox_error *err);
int neox_convert_inspect(const char *ckpt, FILE *out, neox_error *err);
// Prints a line per check; returns 0 when the checkpoint is sound, -1 (err names the first problem).
int neox_convert_verify(const char *ckpt, FILE *out, neox_error *err);
int neox_convert_reshard(const char *ckpt, const char *out_save, const neox_cvt_layout *lay, neox_error *err);

// ---- output directories that appear complete or not at all (lib/convert/outdir.c) ----------------
// Creates "<final>.tmp.<pid>" (refusing when final exists) and registers it for removal on exit.
char *neox_cvt_outdir_begin(const char *final_path, neox_error *err);
// Renames the temporary directory into place and fsyncs its parent.
int neox_cvt_outdir_commit(const char *tmp, const char *final_path, neox_error *err);
// Removes the temporary directory and everything in it.
void neox_cvt_outdir_abort(const char *tmp);

#endif
