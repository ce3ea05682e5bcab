// fuzz_state_json.c: a checkpoint's state/train.json through what reads it before a model is
// built: the padded vocabulary neox-train and neox-eval take from it, and neox-convert's opening
// of the checkpoint (the stored config it names, the model shape it records). The input is the
// state/train.json; the harness writes it into a one-shard checkpoint with a small stored model
// config, its manifest and `latest`.
#include "ckpt.h"
#include "convert.h"
#include "fuzz_util.h"
#include "checkpoint.h"

static const char model_yml[] =
    "num_layers: 2\nhidden_size: 8\nnum_attention_heads: 2\nseq_length: 16\nmax_position_embeddings: 16\n"
    "train_micro_batch_size_per_gpu: 1\ntokenizer_type: CharLevelTokenizer\n";

static int write_checkpoint(const char *save, const uint8_t *data, size_t size, neox_error *err) {
    if (neox_ckpt_make_dir(save, 0, err) != 0) return -1;
    char *dir = neox_ckpt_dir(save, 0), *shard = neox_asprintf("%s/rank_00000.h5", dir);
    neox_ckpt_manifest m = {.iteration = 0, .world_size = 1, .pipe_size = 1, .data_size = 1, .model_size = 1, .nfiles = 1};
    neox_ckpt_file_entry entry = {.name = "rank_00000.h5", .rank = 0};
    m.files = &entry;
    neox_ckpt_writer *w = neox_ckpt_writer_open(shard, err);
    int rc = w ? 0 : -1;
    if (rc == 0) rc = neox_ckpt_write_bytes(w, "state/train.json", data, size, err);
    if (rc == 0) rc = neox_ckpt_write_bytes(w, "config/input/0-run.yml", model_yml, sizeof model_yml - 1, err);
    if (rc == 0) rc = neox_ckpt_writer_close_entry(w, &entry, err);
    else if (w) neox_ckpt_writer_abort(w);
    if (rc == 0) rc = neox_ckpt_manifest_write(dir, &m, err);
    if (rc == 0) rc = neox_ckpt_mark_latest(save, 0, 0, err);
    free(shard);
    free(dir);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *save = fuzz_path("save");
    neox_error err = {0};
    if (write_checkpoint(save, data, size, &err) != 0) {
        fprintf(stderr, "cannot write the checkpoint: %s\n", err.message);
        abort();
    }
    int vocab = 0;
    neox_checkpoint_padded_vocab(save, &vocab, &err);
    neox_error open_err = {0};
    neox_cvt_ckpt c;
    if (neox_cvt_open(&c, save, &open_err) == 0) neox_cvt_close(&c);
    free(save);
    return 0;
}
