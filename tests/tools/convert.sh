# tests/tools/convert.sh: neox-convert on checkpoints neox-train writes (a tiny char-level model on
# Tiny Shakespeare). Round trips are bit-exact (inspect prints a CRC-32 of every tensor's fp32 bytes):
# checkpoint -> HF -> checkpoint, tp1 -> tp2+pp2 -> tp1, dp2/ZeRO-1 -> dp1; training resumed from a
# resharded checkpoint gives the losses of a straight run; bad input (missing shard, truncated or
# corrupt HDF5 and safetensors, inconsistent metadata, a layout that does not divide the model) is a
# clear error naming the file or key; an interrupted conversion leaves nothing that looks complete.
# (Hugging Face parity of the exports and imports: tests/oracle/test_convert.py.)
source tests/lib.sh

PRE=$NEOX_BIN/neox-preprocess
need_shared "neox-convert" || exit 0
[ -f "$DATA/text/tinyshakespeare_input.txt" ] || { skip "neox-convert" "no Tiny Shakespeare in $DATA/text"; exit 0; }

head -c 100000 "$DATA/text/tinyshakespeare_input.txt" >"$T/text.txt"
$LIB paragraphs "$T/text.txt" "$T/s.jsonl"
check "preprocess (char-level)" $PRE --input "$T/s.jsonl" --output-prefix "$T/char" --tokenizer-type CharLevelTokenizer --append-eod
cat >"$T/model.yml" <<EOF
{
  "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 32, "max_position_embeddings": 32,
  "pos_emb": "rotary", "rotary_pct": 0.25, "gpt_j_residual": true, "no_weight_tying": true,
  "init_method": "small_init", "output_layer_init_method": "wang_init", "hidden_dropout": 0.1,
  "optimizer": {"type": "Adam", "params": {"lr": 0.003, "betas": [0.9, 0.95], "eps": 1.0e-8}},
  "min_lr": 0.0003, "weight_decay": 0.01, "lr_decay_style": "cosine", "warmup": 0.1,
  "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
  "train_iters": 12, "eval_interval": 4, "eval_iters": 1, "log_interval": 1,
  "data_path": "$T/char_text_document", "tokenizer_type": "CharLevelTokenizer"
}
EOF
echo "{\"log_dir\": \"$T/straight\"}" >"$T/straight.yml"
echo "{\"log_dir\": \"$T/first\", \"save\": \"$T/ckpt\", \"checkpoint_factor\": 6, \"exit_interval\": 6}" >"$T/first.yml"
check "train 12 iterations straight" $TRAIN -q "$T/model.yml" "$T/straight.yml"
check "train 6 iterations and save" $TRAIN -q "$T/model.yml" "$T/first.yml"

# tensors NAME-PATTERN CKPT: the tensor lines of inspect (name, shape, norm, CRC-32), layout-free.
tensors() { $CONVERT inspect "$2" | grep -E "^  $1" >"$3"; }

check_output "inspect: layout, iteration, tokens, model, tensors" \
    'iteration: 6.*(.|\n)*tokens seen: 1536(.|\n)*hidden 32(.|\n)*params/gpt_neox.layers.1.mlp.dense_4h_to_h.weight +32x128 +float32 norm' \
    bash -c "$CONVERT inspect $T/ckpt | tr '\n' ' '"
check_output "verify a trained checkpoint" "is sound" $CONVERT verify "$T/ckpt"
# The stored config files are loaded from a scratch directory under TMPDIR, removed afterwards.
mkdir -p "$T/scratch"
check "inspect with TMPDIR set leaves its scratch directory empty" bash -c "
    TMPDIR='$T/scratch' $CONVERT inspect '$T/ckpt' >/dev/null && [ -z \"\$(ls -A '$T/scratch')\" ]"
check_fails "a TMPDIR that does not exist is named" 1 "cannot create a temporary directory in $T/no-such-dir \\(TMPDIR\\)" \
    env TMPDIR="$T/no-such-dir" $CONVERT inspect "$T/ckpt"
tensors "(params|optimizer)/" "$T/ckpt" "$T/orig.txt"

# ---- round trips, bit-exact ----
check "reshard tp1 -> tp2 + pp2" $CONVERT reshard --input "$T/ckpt" --output "$T/tp2pp2" --tp 2 --pp 2
check_output "tp2 + pp2: four shard files, verified" "4 files match manifest.json" $CONVERT verify "$T/tp2pp2"
check "reshard tp2 + pp2 -> tp1" $CONVERT reshard --input "$T/tp2pp2" --output "$T/back1" --tp 1 --pp 1
tensors "(params|optimizer)/" "$T/back1" "$T/back1.txt"
check "tp1 -> tp2+pp2 -> tp1 is bit-exact (parameters and optimizer state)" cmp "$T/orig.txt" "$T/back1.txt"
tensors "(params|optimizer)/" "$T/tp2pp2" "$T/tp2pp2.txt"
check "the tp2+pp2 checkpoint reads back bit-exact" cmp "$T/orig.txt" "$T/tp2pp2.txt"
check "reshard -> dp2 / ZeRO-1" $CONVERT reshard --input "$T/ckpt" --output "$T/dp2" --dp 2 --zero 1
check_output "dp2 manifest records the layout" '"data_parallel_size": 2' cat "$T/dp2/global_step6/manifest.json"
check "reshard dp2 / ZeRO-1 -> dp1" $CONVERT reshard --input "$T/dp2" --output "$T/dp1" --dp 1
tensors "(params|optimizer)/" "$T/dp1" "$T/dp1.txt"
check "dp2/ZeRO-1 -> dp1 is bit-exact" cmp "$T/orig.txt" "$T/dp1.txt"
check "reshard -> tp2 + dp2 / ZeRO-1 (optimizer rows cut over data ranks)" \
    $CONVERT reshard --input "$T/ckpt" --output "$T/tp2dp2" --tp 2 --dp 2 --zero 1
tensors "(params|optimizer)/" "$T/tp2dp2" "$T/tp2dp2.txt"
check "tp2 + dp2 / ZeRO-1 reads back bit-exact" cmp "$T/orig.txt" "$T/tp2dp2.txt"
check "to-hf (fp32)" $CONVERT to-hf --input "$T/ckpt" --output "$T/hf"
check "from-hf the export at tp2" $CONVERT from-hf --input "$T/hf" --output "$T/reimported" --tp 2
tensors "params/" "$T/ckpt" "$T/params.txt"
tensors "params/" "$T/reimported" "$T/reimported.txt"
check "checkpoint -> HF -> checkpoint is bit-exact" cmp "$T/params.txt" "$T/reimported.txt"
check_output "the imported checkpoint verifies" "is sound" $CONVERT verify "$T/reimported"
# The run state's model shape: from-hf records every field neox-train records, with the same values.
model_shape() {
    python3 -c 'import glob, json, re, sys
data = open(sorted(glob.glob(sys.argv[1] + "/global_step*/rank_00000.h5"))[0], "rb").read()
print(json.dumps(json.loads(re.search(rb"\"model\": (\{[^}]*\})", data).group(1)), sort_keys=True))' "$1"
}
model_shape "$T/ckpt" >"$T/shape_trained.json"
model_shape "$T/reimported" >"$T/shape_imported.json"
check "from-hf records the whole model shape neox-train records" cmp "$T/shape_trained.json" "$T/shape_imported.json"
check_output "the shape has all 13 fields" '"activation".*"no_weight_tying".*"norm".*"pos_emb"' cat "$T/shape_trained.json"

# ---- training resumed from a resharded checkpoint continues the trajectory ----
KEYS=train/lm_loss,train/grad_norm,train/learning_rate,validation/lm_loss
for layout in tp2pp2 dp2; do
    cp "$T/first/metrics.jsonl" "$T/resumed_$layout.jsonl"
    echo "{\"log_dir\": \"$T/resumed_$layout\", \"load\": \"$T/$layout\"}" >"$T/resume_$layout.yml"
    check "resume from the $layout checkpoint" $TRAIN -q "$T/model.yml" "$T/resume_$layout.yml"
    cat "$T/resumed_$layout/metrics.jsonl" >>"$T/resumed_$layout.jsonl"
    check "$layout: 6 + reshard + 6 iterations give the straight run's losses" \
        $LIB same "$T/straight/metrics.jsonl" "$T/resumed_$layout.jsonl" $KEYS
done

# ---- bad input ----
check_fails "a layout that does not divide the heads" 2 "--tp 3 does not divide num_attention_heads = 4" \
    $CONVERT reshard --input "$T/ckpt" --output "$T/tp3" --tp 3
check "no output from the refused layout" test ! -e "$T/tp3"
check_fails "an existing output is refused" 2 "$T/hf already exists" $CONVERT to-hf --input "$T/ckpt" --output "$T/hf"
check_fails "not a checkpoint" 1 "$T/hf: not a checkpoint" $CONVERT inspect "$T/hf"
check_fails "an unknown command" 2 "unknown command 'frobnicate'" $CONVERT frobnicate
check_fails "a missing --output" 2 "--output is required" $CONVERT to-hf --input "$T/ckpt"
check_fails "an unknown --dtype" 2 "--dtype 'fp8'" $CONVERT to-hf --input "$T/ckpt" --output "$T/fp8" --dtype fp8

cp -r "$T/tp2pp2" "$T/missing"
rm "$T/missing/global_step6/rank_00001.h5"
check_fails "missing shard file" 1 "rank_00001.h5: missing shard file" $CONVERT inspect "$T/missing"
check_fails "verify: missing shard file" 1 "rank_00001.h5" $CONVERT verify "$T/missing"

cp -r "$T/ckpt" "$T/truncated"
f=$T/truncated/global_step6/rank_00000.h5
truncate -s $(( $(stat -c %s "$f") / 2 )) "$f"
check_fails "truncated HDF5 shard" 1 "rank_00000.h5" $CONVERT verify "$T/truncated"
check_fails "truncated HDF5 shard (to-hf)" 1 "rank_00000.h5" $CONVERT to-hf --input "$T/truncated" --output "$T/trunc_hf"
check "no output from the failed export" test ! -e "$T/trunc_hf"

cp -r "$T/ckpt" "$T/corrupt"
f=$T/corrupt/global_step6/rank_00000.h5
size=$(stat -c %s "$f")
printf '\x55\xaa\x55\xaa\x55\xaa\x55\xaa' | dd of="$f" bs=1 seek=$(( size - 4096 )) conv=notrunc status=none
check_fails "corrupt HDF5 shard (same size): CRC-32 mismatch" 1 "rank_00000.h5" $CONVERT verify "$T/corrupt"

cp -r "$T/ckpt" "$T/badmeta"
sed -i 's/"iteration": 6/"iteration": 7/' "$T/badmeta/global_step6/manifest.json"
check_fails "manifest and run state disagree" 1 "iteration 6 but manifest.json 7" $CONVERT verify "$T/badmeta"

cp -r "$T/hf" "$T/hf_trunc"
f=$T/hf_trunc/model.safetensors
truncate -s $(( $(stat -c %s "$f") - 100 )) "$f"
check_fails "truncated safetensors" 1 "model.safetensors" $CONVERT from-hf --input "$T/hf_trunc" --output "$T/x1"
cp -r "$T/hf" "$T/hf_corrupt"
printf 'XXXXXXXX' | dd of="$T/hf_corrupt/model.safetensors" bs=1 seek=12 conv=notrunc status=none
check_fails "corrupt safetensors header" 1 "model.safetensors" $CONVERT from-hf --input "$T/hf_corrupt" --output "$T/x2"
cp -r "$T/hf" "$T/hf_shape"
sed -i 's/"intermediate_size": 128/"intermediate_size": 64/' "$T/hf_shape/config.json"
check_fails "config.json disagrees with the tensors" 1 "tensor 'gpt_neox.layers.0.mlp.dense_h_to_4h.weight' has another shape" \
    $CONVERT from-hf --input "$T/hf_shape" --output "$T/x3"
check "no output (nor temporary) from failed imports" bash -c "! ls -d $T/x1* $T/x2* $T/x3* 2>/dev/null"
cp -r "$T/hf" "$T/hf_type"
sed -i 's/"model_type": "gpt_neox"/"model_type": "bert"/' "$T/hf_type/config.json"
check_fails "an unsupported model_type" 2 "model_type 'bert'" $CONVERT from-hf --input "$T/hf_type" --output "$T/x4"

# ---- interrupted conversions: killed at any moment, the output is either complete or absent ----
ok=1
for delay in 0.01 0.03 0.06 0.1; do
    out=$T/killed_$delay
    $CONVERT reshard --input "$T/ckpt" --output "$out" --tp 2 --pp 2 2>/dev/null &
    pid=$!
    sleep $delay
    kill -9 $pid 2>/dev/null
    wait $pid 2>/dev/null
    if [ -e "$out" ] && ! $CONVERT verify "$out" >/dev/null 2>&1; then ok=0; echo "incomplete $out" >"$_last_out"; fi
done
_report $((1 - ok)) "kill -9 during reshard leaves a complete output or none" "$_last_out"
