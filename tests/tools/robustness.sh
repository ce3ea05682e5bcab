# tests/tools/robustness.sh: what the tools do with input that is damaged, forged or diverged:
# learning rates that cannot train, weights holding NaN (evaluation and training refuse them,
# no checkpoint is saved of them, the log shows NaN as NaN), corpus files that are empty or
# decode to more than --max-document-bytes, environment variables that cannot be honoured (an error
# naming the variable, not an exit from deep inside the library). See docs/robustness.md.
source tests/lib.sh
PRE=$NEOX_BIN/neox-preprocess TRAIN=$NEOX_BIN/neox-train EVAL=$NEOX_BIN/neox-eval CONVERT=$NEOX_BIN/neox-convert

# ---- learning rates ------------------------------------------------------------------------------
model_config() {  # model_config FILE LR
    cat >"$1" <<YML
{"num_layers": 1, "hidden_size": 16, "num_attention_heads": 2, "seq_length": 16, "max_position_embeddings": 16,
 "pos_emb": "rotary", "no_weight_tying": true, "train_micro_batch_size_per_gpu": 2, "train_iters": 4,
 "log_interval": 1, "eval_interval": 100, "eval_iters": 1,
 "optimizer": {"type": "Adam", "params": {"lr": $2}}, "tokenizer_type": "CharLevelTokenizer"}
YML
}
model_config "$T/inf.yml" .inf
check_fails "lr .inf is refused naming the key and file:line" 2 "inf.yml:[0-9]+: key 'optimizer.params.lr': .inf is out of range \(must be between 0 and 10\)" \
    "$TRAIN" --print-config "$T/inf.yml"
model_config "$T/huge.yml" 1.0e+30
check_fails "lr 1.0e+30 is refused naming the key and file:line" 2 "huge.yml:[0-9]+: key 'optimizer.params.lr': 1e\+30 is out of range \(must be between 0 and 10\)" \
    "$TRAIN" --print-config "$T/huge.yml"
echo '{"min_lr": .nan}' >"$T/min_lr.yml"
check_fails "min_lr .nan is refused naming the key" 2 "min_lr.yml:1.*min_lr.*out of range" \
    "$TRAIN" --print-config "$T/inf.yml" "$T/min_lr.yml"

# ---- the environment ------------------------------------------------------------------------------
model_config "$T/small.yml" 0.001
NEOX_CONFIG_READS=$T/missing/reads.txt check_fails "NEOX_CONFIG_READS in a missing directory is a runtime error naming it" 1 \
    "error: NEOX_CONFIG_READS=$T/missing/reads.txt: cannot append: No such file or directory" "$TRAIN" --print-config "$T/small.yml"
NEOX_RANKS_PER_NODE=two check_fails "NEOX_RANKS_PER_NODE that is no number is a usage error naming it" 2 \
    "error: NEOX_RANKS_PER_NODE=two: expected a positive number of ranks" "$TRAIN" "$T/small.yml"
NEOX_RANKS_PER_NODE=two check_fails "... in neox-eval too" 2 "error: NEOX_RANKS_PER_NODE=two: expected a positive number of ranks" \
    "$EVAL" "$T/small.yml"

# ---- corpus files ---------------------------------------------------------------------------------
: >"$T/empty.txt"
check "an empty .txt input is one empty document, skipped" "$PRE" --input "$T/empty.txt" --output-prefix "$T/empty" \
    --tokenizer-type CharLevelTokenizer
left=$(ls "$T" | grep -c '\.tmp' || true)
_report "$([ "$left" = 0 ] && echo 0 || echo 1)" "no temporary file is left beside the output ($left found)"
$PY -c 'import sys, zstandard; open(sys.argv[1], "wb").write(zstandard.ZstdCompressor(level=19).compress(
    b"{\"text\": \"short\"}\n{\"text\": \"" + b"a" * 3000000 + b"\"}\n"))' "$T/long.jsonl.zst"
check_fails "a 3 MB line of a small .jsonl.zst over --max-document-bytes names the file and line" 1 \
    "long.jsonl.zst:2: a document longer than 1000000 bytes" \
    "$PRE" --input "$T/long.jsonl.zst" --output-prefix "$T/long" --tokenizer-type CharLevelTokenizer --max-document-bytes 1000000
check "the same file under the default limit" "$PRE" --input "$T/long.jsonl.zst" --output-prefix "$T/long" \
    --tokenizer-type CharLevelTokenizer
check_fails "--max-document-bytes 0 is a usage error" 2 "max-document-bytes: '0' is not an integer >= 1" \
    "$PRE" --input "$T/long.jsonl.zst" --output-prefix "$T/long" --tokenizer-type CharLevelTokenizer --max-document-bytes 0

# ---- NaN weights ----------------------------------------------------------------------------------
char_shakespeare "NaN weights" || exit 0
model_config "$T/run.yml" 0.001
echo "{\"data_path\": \"$T/char_text_document\", \"save\": \"$T/ckpt\", \"checkpoint_factor\": 4, \"log_dir\": \"$T/logs\"}" >"$T/data.yml"
check "train a tiny model" "$TRAIN" "$T/run.yml" "$T/data.yml"
check "export it" "$CONVERT" to-hf --input "$T/ckpt" --output "$T/hf"
# One weight of the exported model made NaN with the safetensors library, then imported back.
check "poison one weight (safetensors)" $PY -c '
import sys, numpy as np
from safetensors.numpy import load_file, save_file
path = sys.argv[1] + "/model.safetensors"
t = load_file(path)
w = t["gpt_neox.layers.0.mlp.dense_h_to_4h.weight"].copy()
w[3, 5] = np.nan
t["gpt_neox.layers.0.mlp.dense_h_to_4h.weight"] = w
save_file(t, path, metadata={"format": "pt"})' "$T/hf"
check "import the poisoned model" "$CONVERT" from-hf --input "$T/hf" --output "$T/nan"
echo "{\"data_path\": \"$T/char_text_document\", \"tokenizer_type\": \"CharLevelTokenizer\"}" >"$T/eval.yml"
check_fails "neox-eval refuses NaN weights, naming the parameter" 1 \
    "parameter gpt_neox.layers.0.mlp.dense_h_to_4h.weight holds NaN or inf" \
    "$EVAL" --tasks valid --results-prefix - "$T/nan/model.yml" "$T/nan/run.yml" "$T/eval.yml"
echo '{"compute_backend": "emulated"}' >"$T/emulated.yml"
check_fails "the same on the emulated device (weights read back through the backend)" 1 \
    "parameter gpt_neox.layers.0.mlp.dense_h_to_4h.weight holds NaN or inf" \
    "$EVAL" --tasks valid --results-prefix - "$T/nan/model.yml" "$T/nan/run.yml" "$T/eval.yml" "$T/emulated.yml"
echo "{\"data_path\": \"$T/char_text_document\", \"save\": \"$T/after\",
  \"checkpoint_factor\": 2, \"train_iters\": 3, \"log_interval\": 1,
  \"do_valid\": false, \"do_test\": false, \"log_dir\": \"$T/nanlogs\", \"tensorboard_dir\": \"$T/nantb\", \"tokenizer_type\": \"CharLevelTokenizer\"}" >"$T/finetune.yml"
"$TRAIN" "$T/nan/model.yml" "$T/nan/run.yml" "$T/finetune.yml" >"$T/nan.out" 2>"$T/nan.err"
status=$?
_report "$([ $status = 1 ] && echo 0 || echo 1)" "training from NaN weights exits 1 (got $status)" "$T/nan.err"
check "the error says no checkpoint is saved of them" grep -qE "iteration 2: not saving a checkpoint: parameter .* holds NaN or inf" "$T/nan.err"
check "no checkpoint was saved" test ! -e "$T/after/latest" -a ! -e "$T/after/global_step2"
check "the log line shows the loss as NAN and its grad norm as nan" grep -qE "lm_loss: NAN .* grad norm: nan .* number of nan iterations:   1" "$T/nan.out"
check "metrics.jsonl records the NaN loss as null with the nan iteration counted" $PY -c '
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if "train/lm_loss" in l]
assert recs and all(r["train/lm_loss"] is None and r["train/nan_iterations"] == 1 for r in recs), recs' "$T/nanlogs/metrics.jsonl"
echo "{\"data_path\": \"$T/char_text_document\", \"train_iters\": 100,
  \"do_valid\": false, \"do_test\": false, \"tokenizer_type\": \"CharLevelTokenizer\"}" >"$T/fifty.yml"
check_fails "50 NaN steps in a row stop the run" 1 "stopping at iteration 50: the last 50 iterations had a non-finite loss" \
    "$TRAIN" -q "$T/nan/model.yml" "$T/nan/run.yml" "$T/fifty.yml"
check "TensorBoard has the NaN loss and the NaN grad norm of each step (tensorboard's reader)" $PY -c '
import math, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
for tag in ("train/lm_loss", "train/grad_norm"):
    values = [(s.step, s.value) for s in acc.Scalars(tag)]
    assert [s for s, _ in values] == [1, 2] and all(math.isnan(v) for _, v in values), (tag, values)' "$T/nantb"

# ---- resuming from NaN or inf in a checkpoint whose CRC-32s are valid -----------------------------
# poison_shard SRC DST TENSOR VALUE: copies checkpoint SRC to DST with element 3 of TENSOR set to
# VALUE, found through h5dump (HDF5's own tool: the dataset's contiguous storage offset), and the
# manifest's CRC-32 and size recomputed with zlib, so only the finiteness check can refuse it.
poison_shard() {
    rm -rf "$2"; cp -r "$1" "$2"
    local step; step=$(cat "$2/latest")
    local shard=$2/$step/rank_00000.h5
    local offset; offset=$(h5dump -p -H -d "$3" "$shard" | sed -n 's/.*OFFSET \([0-9]*\).*/\1/p')
    [ -n "$offset" ] || { echo "no contiguous storage offset for $3 in $shard"; return 1; }
    $PY -c '
import json, struct, sys, zlib
shard, offset, value, manifest = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
data = bytearray(open(shard, "rb").read())
data[offset + 12:offset + 16] = struct.pack("<f", value)
open(shard, "wb").write(data)
m = json.load(open(manifest))
m["files"][0].update(crc32="%08x" % zlib.crc32(data), bytes=len(data))
json.dump(m, open(manifest, "w"))' "$shard" "$offset" "$4" "$2/$step/manifest.json"
}
echo "{\"data_path\": \"$T/char_text_document\", \"load\": \"$T/poisoned\", \"save\": \"$T/poisoned_out\",
  \"checkpoint_factor\": 1, \"do_valid\": false, \"do_test\": false}" >"$T/resume.yml"
for case in "params/gpt_neox.layers.0.attention.dense.weight|nan" "optimizer/exp_avg_sq/gpt_neox.final_layer_norm.bias|inf" \
            "optimizer/exp_avg/gpt_neox.embed_in.weight|-inf"; do
    tensor=${case%|*} value=${case#*|}
    check "$value written into $tensor (valid CRC-32)" poison_shard "$T/ckpt" "$T/poisoned" "$tensor" "$value"
    check "... its sizes and CRC-32s match the manifest" bash -c \
        "'$CONVERT' verify '$T/poisoned' 2>/dev/null | grep -q 'ok: 1 files match manifest.json'"
    check_fails "... verify refuses it, naming the tensor" 1 "poisoned/global_step4: tensor $tensor holds NaN or Inf" \
        "$CONVERT" verify "$T/poisoned"
    check_fails "... resuming from it is refused at load, naming the tensor and element" 1 \
        "loading checkpoint .*poisoned/global_step4: tensor $tensor holds NaN or inf \(element 3 of it\)" \
        "$TRAIN" "$T/run.yml" "$T/resume.yml"
done
check "... and nothing was saved" test ! -e "$T/poisoned_out"

# ---- from-hf: config.json values named by their Hugging Face keys ----------------------------------
hf_case() {  # hf_case NAME KEY JSON_VALUE PATTERN
    rm -rf "$T/hfbad" "$T/hfout"; mkdir -p "$T/hfbad"
    $PY -c 'import json, sys; c = json.load(open(sys.argv[1])); c[sys.argv[2]] = json.loads(sys.argv[3])
json.dump(c, open(sys.argv[4], "w"))' "$T/hf/config.json" "$2" "$3" "$T/hfbad/config.json"
    cp "$T/hf/model.safetensors" "$T/hfbad/"
    check_fails "from-hf: $1" 2 "$4" "$CONVERT" from-hf --input "$T/hfbad" --output "$T/hfout"
}
hf_case "an oversized max_position_embeddings is named as too large" max_position_embeddings 99999999999 \
    "hfbad/config.json: 'max_position_embeddings' = 99999999999 is larger than 2147483647"
hf_case "rotary_pct out of range names config.json and rotary_pct" rotary_pct 7.5 "hfbad/config.json: 'rotary_pct' = 7.5 is outside \[0, 1\]"
hf_case "a negative layer_norm_eps names config.json and layer_norm_eps" layer_norm_eps -1 "hfbad/config.json: 'layer_norm_eps' = -1 is outside \[0, 1\]"
hf_case "layer_norm_eps as a string is refused, not defaulted" layer_norm_eps '"1e-5"' "hfbad/config.json: 'layer_norm_eps' is not a number"
hf_case "eos_token_id outside the vocabulary is refused" eos_token_id 100000 "hfbad/config.json: 'eos_token_id' is not a token id of the vocabulary \(vocab_size [0-9]+\)"
hf_case "an eos_token_id list with an id outside the vocabulary is refused" eos_token_id '[0, 100000]' "'eos_token_id' is not a token id"
hf_case "a model the config cannot describe names config.json" rotary_pct 0.125 "hfbad/config.json: the model it describes: rotary_pct"

# ---- token ids outside the model's vocabulary ---------------------------------------------------------
head -n 20 "$T/shakespeare.jsonl" >"$T/few.jsonl"
check "preprocess with the GPT-2 tokenizer" "$PRE" --input "$T/few.jsonl" --output-prefix "$T/gpt2" --tokenizer-type GPT2BPETokenizer \
    --vocab-file "$DATA/tokenizers/gpt2/vocab.json" --merge-file "$DATA/tokenizers/gpt2/merges.txt" --append-eod
echo "{\"data_path\": \"$T/gpt2_text_document\"}" >"$T/gpt2data.yml"
check_fails "a char-level model on GPT-2 ids names the dataset and the sample" 1 \
    "gpt2_text_document.bin: sample [0-9]+ \([0-9]+ of this dataset\) holds token id [0-9]+ at position [0-9]+, outside the model's vocabulary of 512" \
    "$TRAIN" "$T/run.yml" "$T/gpt2data.yml"

# ---- sample-index caches tied to their dataset ------------------------------------------------------
mkdir -p "$T/cachecase"
head -n 60 "$T/shakespeare.jsonl" >"$T/cachecase/a.jsonl"
tail -n 60 "$T/shakespeare.jsonl" >"$T/cachecase/b.jsonl"
P=$T/cachecase/corpus
check "preprocess corpus A" "$PRE" --input "$T/cachecase/a.jsonl" --output-prefix "$P" --tokenizer-type CharLevelTokenizer --append-eod
model_config "$T/cachecase/run.yml" 0.001
echo "{\"data_path\": \"${P}_text_document\", \"do_valid\": false, \"do_test\": false}" >"$T/cachecase/data.yml"
check "train on A builds the caches" "$TRAIN" "$T/cachecase/run.yml" "$T/cachecase/data.yml"
id=$(ls "$T/cachecase"/corpus_text_document_train_indexmap_*_identity.json 2>/dev/null | head -n 1)
check "an identity file is written beside the caches" test -s "$id"
check "it records the .idx's size and CRC-32 (zlib) and the document count" $PY -c '
import json, os, sys, zlib
rec, idx = json.load(open(sys.argv[1])), sys.argv[2] + ".idx"
data = open(idx, "rb").read()
assert rec["idx_bytes"] == len(data) and rec["idx_crc32"] == zlib.crc32(data), rec
assert rec["bin_bytes"] == os.path.getsize(sys.argv[2] + ".bin") and rec["documents"] == 60, rec' "$id" "${P}_text_document"
# sample_idx depends on every document's length (doc_idx only on their count, the same here).
sample_idx=${id%_identity.json}_sample_idx.npy
cp "$sample_idx" "$T/cachecase/sample_idx_of_a.npy"
check "preprocess corpus B under the same prefix" "$PRE" --input "$T/cachecase/b.jsonl" --output-prefix "$P" \
    --tokenizer-type CharLevelTokenizer --append-eod
check_output "training on B rebuilds the stale caches with a notice" "" "$TRAIN" "$T/cachecase/run.yml" "$T/cachecase/data.yml"
check "the notice names the cache and the dataset" grep -qE "indexmap.*_\*\.npy: built from another dataset than .*corpus_text_document.idx.*rebuilding" "$TEST_TMP/.stderr"
mkdir -p "$T/cachecase/fresh"
echo "{\"data_cache_dir\": \"$T/cachecase/fresh\"}" >"$T/cachecase/fresh.yml"
check "a fresh build of B's caches in data_cache_dir" "$TRAIN" "$T/cachecase/run.yml" "$T/cachecase/data.yml" "$T/cachecase/fresh.yml"
check "the rebuilt caches are B's (byte-identical to the fresh build)" cmp "$sample_idx" "$T/cachecase/fresh/$(basename "$sample_idx")"
check "and not A's" $PY -c 'import sys; a, b = (open(p, "rb").read() for p in sys.argv[1:]); assert a != b' \
    "$sample_idx" "$T/cachecase/sample_idx_of_a.npy"
check "data_cache_dir holds the train split's three caches and its identity file" test \
    "$(ls "$T/cachecase/fresh" | grep -c 'train_indexmap_.*\(doc_idx.npy\|sample_idx.npy\|shuffle_idx.npy\|identity.json\)$')" = 4

# ---- outputs written in place follow no symlink ---------------------------------------------------
mkdir -p "$T/symlog"
echo precious >"$T/precious.txt"
ln -s "$T/precious.txt" "$T/symlog/metrics.jsonl"
echo "{\"log_dir\": \"$T/symlog\"}" >"$T/symlog.yml"
check_fails "a symlink planted at metrics.jsonl is refused, naming it" 1 \
    "$T/symlog/metrics.jsonl: is a symbolic link; refusing to write through it" \
    "$TRAIN" "$T/cachecase/run.yml" "$T/cachecase/data.yml" "$T/symlog.yml"
check "... and its target is untouched" test "$(cat "$T/precious.txt")" = precious

# ---- a read-only data directory -------------------------------------------------------------------
# A tmpfs remounted read-only is read-only for root too (a chmod is not).
R=$T/rodata
mount_tmpfs "$R" 4m "a read-only data directory" || exit 0
echo "{\"data_path\": \"$R/c_text_document\", \"do_valid\": false, \"do_test\": false}" >"$T/rodata.yml"
check "preprocess corpus A into the data directory" "$PRE" --input "$T/cachecase/a.jsonl" --output-prefix "$R/c" \
    --tokenizer-type CharLevelTokenizer --append-eod
check "train there builds its caches" "$TRAIN" "$T/cachecase/run.yml" "$T/rodata.yml"
mount -o remount,ro "$R"
check "read-only: caches that match their dataset are loaded" "$TRAIN" "$T/cachecase/run.yml" "$T/rodata.yml"
echo "{\"seed\": 7}" >"$T/rodata_other.yml"  # another seed: other cache names
check_fails "read-only: caches it lacks are refused, naming the directory and data_cache_dir" 1 \
    "$R: cannot write the index caches there; set data_cache_dir to a writable directory" \
    "$TRAIN" "$T/cachecase/run.yml" "$T/rodata.yml" "$T/rodata_other.yml"
echo "{\"data_cache_dir\": \"$T/rocache\"}" >"$T/rocache.yml"
check "read-only: data_cache_dir elsewhere builds them there" "$TRAIN" "$T/cachecase/run.yml" "$T/rodata.yml" \
    "$T/rodata_other.yml" "$T/rocache.yml"
check "... (the caches and their identity file are in data_cache_dir)" test \
    "$(ls "$T/rocache" | grep -c '^c_text_document_train_indexmap_.*\(doc_idx.npy\|sample_idx.npy\|shuffle_idx.npy\|identity.json\)$')" = 4
echo "{\"data_cache_dir\": \"$R/caches\"}" >"$T/rocache_inside.yml"
check_fails "a data_cache_dir that cannot be created is refused, naming it" 1 \
    "data_cache_dir $R/caches: Read-only file system" \
    "$TRAIN" "$T/cachecase/run.yml" "$T/rodata.yml" "$T/rodata_other.yml" "$T/rocache_inside.yml"
mount -o remount,rw "$R"
check "preprocess corpus B under the same prefix" "$PRE" --input "$T/cachecase/b.jsonl" --output-prefix "$R/c" \
    --tokenizer-type CharLevelTokenizer --append-eod
mount -o remount,ro "$R"
check_fails "read-only: stale caches are refused (not reused), naming the identity file and data_cache_dir" 1 \
    "c_text_document_train_indexmap_.*_\*\.npy: the index caches were built from another dataset than .*c_text_document.idx .*is not writable; set data_cache_dir" \
    "$TRAIN" "$T/cachecase/run.yml" "$T/rodata.yml"
umount "$R"
