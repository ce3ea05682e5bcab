// neox_source.h: a GPT-NeoX (DeepSpeed) checkpoint directory as `neox-convert from-neox` reads it
// (lib/convert/neox_source.c); private to lib/convert.
#ifndef NEOX_CONVERT_NEOX_SOURCE_H
#define NEOX_CONVERT_NEOX_SOURCE_H

#include "core.h"
#include "model.h"
#include "torch_pt.h"

#define NEOX_SRC_SKIP 1

typedef struct neox_source {
    char *dir;                   // global_stepN
    int tp, dp;                  // from the files' names (dp 0: no ZeRO optimizer files)
    int pp;                      // pipeline stages: mp_rank_YY files per tensor-parallel rank
    int layered;                 // the model is in layer_XX-model_YY-model_states.pt files
    int max_layer;
    int bf16_optimizer;          // DeepSpeed's bf16 optimizer or ZeRO-3 files are present
    neox_pt_file **model_files;  // mp_rank_YY_model_states.pt, YY = stage x tp + tensor-parallel rank
} neox_source;

int neox_source_open(neox_source *s, const char *path, neox_error *err);
void neox_source_close(neox_source *s);
// layer_XX-model_YY-model_states.pt (NULL when the layer has no file: it holds no parameters).
neox_pt_file *neox_source_layer_file(const neox_source *s, int layer, int tp_rank, neox_error *err);
// zero_pp_rank_D_mp_rank_YY_optim_states.pt of pipeline stage `stage`, tensor-parallel rank tp_rank.
neox_pt_file *neox_source_optim_file(const neox_source *s, int dp_rank, int stage, int tp_rank, neox_error *err);
int neox_source_split_name(const char *name, int *layer, const char **part);
int neox_source_hf_name(const neox_model_desc *d, int layer, const char *part, char *out, size_t size, neox_error *err);
int neox_source_tp_dim(const char *hf_name);
// Whether a Llama-style model has GPT-NeoX names here at tp tensor-parallel ranks (key/value heads
// whole on each rank, no query/key norm, no experts); -1 + err naming the config key that rules it out.
int neox_source_check_llama(const neox_model_desc *d, int tp, neox_error *err);
// The [q k v] row blocks of GPT-NeoX's fused QKV on one of tp tensor-parallel ranks (per head, or one
// block under grouped-query attention).
int neox_source_qkv_blocks(const neox_model_desc *d, int tp);

#endif
