# tests/tools/robustness.sh: what the tools do with input that is damaged, forged or diverged:
# learning rates that cannot train, weights holding NaN (evaluation and training refuse them,
# no checkpoint is saved of them, the log shows NaN as NaN), corpus files that are empty or
# decode to more than --max-document-bytes. See docs/robustness.md.
source tests/lib.sh
PRE=$NEOX_BIN/neox-preprocess TRAIN=$NEOX_BIN/neox-train EVAL=$NEOX_BIN/neox-eval CONVERT=$NEOX_BIN/neox-convert
T=$TEST_TMP
PY=.venv/bin/python

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
check_fails "lr .inf is refused naming the key and file:line" 2 "inf.yml:[0-9]+.*'optimizer'.*params.lr = inf is out of range \[0, 10\]" \
    "$TRAIN" --print-config "$T/inf.yml"
model_config "$T/huge.yml" 1.0e+30
check_fails "lr 1.0e+30 is refused naming the key and file:line" 2 "huge.yml:[0-9]+.*params.lr = 1e\+30 is out of range \[0, 10\]" \
    "$TRAIN" --print-config "$T/huge.yml"
echo '{"min_lr": .nan}' >"$T/min_lr.yml"
check_fails "min_lr .nan is refused naming the key" 2 "min_lr.yml:1.*min_lr.*out of range" \
    "$TRAIN" --print-config "$T/inf.yml" "$T/min_lr.yml"

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
check_fails "--max-document-bytes 0 is a usage error" 2 "max-document-bytes: expected an integer >= 1" \
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
echo "{\"data_path\": \"$T/char_text_document\", \"tokenizer_type\": \"CharLevelTokenizer\", \"train_micro_batch_size_per_gpu\": 2}" >"$T/eval.yml"
check_fails "neox-eval refuses NaN weights, naming the parameter" 1 \
    "parameter gpt_neox.layers.0.mlp.dense_h_to_4h.weight holds NaN or inf" \
    "$EVAL" --tasks valid --results-prefix - "$T/nan/model.yml" "$T/eval.yml"
echo "{\"data_path\": \"$T/char_text_document\", \"save\": \"$T/after\",
  \"checkpoint_factor\": 2, \"train_iters\": 3, \"log_interval\": 1, \"train_micro_batch_size_per_gpu\": 2,
  \"do_valid\": false, \"do_test\": false, \"log_dir\": \"$T/nanlogs\", \"tokenizer_type\": \"CharLevelTokenizer\"}" >"$T/finetune.yml"
"$TRAIN" "$T/nan/model.yml" "$T/finetune.yml" >"$T/nan.out" 2>"$T/nan.err"
status=$?
_report "$([ $status = 1 ] && echo 0 || echo 1)" "training from NaN weights exits 1 (got $status)" "$T/nan.err"
check "the error says no checkpoint is saved of them" grep -qE "iteration 2: not saving a checkpoint: parameter .* holds NaN or inf" "$T/nan.err"
check "no checkpoint was saved" test ! -e "$T/after/latest" -a ! -e "$T/after/global_step2"
check "the log line shows the loss as NAN and its grad norm as nan" grep -qE "lm_loss: NAN .* grad norm: nan .* number of nan iterations:   1" "$T/nan.out"
check "metrics.jsonl records the NaN loss as null with the nan iteration counted" $PY -c '
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if "train/lm_loss" in l]
assert recs and all(r["train/lm_loss"] is None and r["train/nan_iterations"] == 1 for r in recs), recs' "$T/nanlogs/metrics.jsonl"
