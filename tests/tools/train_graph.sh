# tests/tools/train_graph.sh: the training step captured once and replayed (cuda_graph: true; docs/cuda.md,
# "CUDA graphs") on the emulated device, whose recording is the twin of a CUDA graph: a replay re-runs
# every recorded op with the arguments it was recorded with, so a per-step value passed by value would
# stay frozen. Against the CPU backend bit for bit (every metric, the checkpoints at iterations 4 and
# 8; the emulated device's eager step equals the CPU's by tests/tools/train_emulated.sh): fp32 with
# clipping, gradient accumulation, an LR warm-up and hidden and attention dropout (each micro-batch's
# masks' row), bf16 with Lion and eod_mask_loss (the micro-batches' loss-mask sums differ), fp16 with
# forced overflows (the dynamic scale moves), with AdamW and with SGD with momentum (its first update,
# which starts the buffer, decided on the device). Each run captures once: the loss scale, the mask
# sums and the dropout rows reach the replays through the step scalars, not as captured arguments.
# The test can fail: a replay that leaves the learning rate as captured (the test hook
# NEOX_TEST_GRAPH_FREEZE_LR) differs from the CPU. Where the step cannot be captured, the run says why
# (naming the feature) and trains eagerly.
source tests/lib.sh

char_shakespeare "neox-train cuda_graph" || exit 0

cat >"$T/model.yml" <<EOF2
{
  "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 32, "max_position_embeddings": 32,
  "pos_emb": "rotary", "rotary_pct": 0.25, "gpt_j_residual": true, "no_weight_tying": true,
  "min_lr": 0.0003, "weight_decay": 0.01, "lr_decay_style": "cosine", "warmup": 0.3, "gradient_clipping": 1.0,
  "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3,
  "train_iters": 8, "eval_interval": 4, "eval_iters": 1, "log_interval": 1, "checkpoint_factor": 4,
  "data_path": "$T/char_text_document", "tokenizer_type": "CharLevelTokenizer"
}
EOF2
ADAM='"optimizer": {"type": "Adam", "params": {"lr": 0.003, "betas": [0.9, 0.95], "eps": 1.0e-8}}'
run() {  # run NAME BACKEND GRAPH JSON [OPTIMIZER]: trains model.yml with logs in $T/NAME, checkpoints in $T/NAME-ckpt
    echo "{\"log_dir\": \"$T/$1\", \"save\": \"$T/$1-ckpt\", \"compute_backend\": \"$2\", \"cuda_graph\": $3, ${5:-$ADAM} $4}" >"$T/$1.yml"
    $TRAIN "$T/model.yml" "$T/$1.yml" >"$T/$1.out" 2>&1
    local status=$?
    cat "$T/$1.out" >&2
    return $status
}
same_checkpoints() {  # every tensor of every checkpoint shard of run $1 equals run $2's
    local n=0 shard
    while read -r shard; do
        h5diff --exclude-path /config "$T/$1-ckpt/$shard" "$T/$2-ckpt/$shard" >/dev/null || { echo "differs: $shard"; return 1; }
        n=$((n + 1))
    done < <(cd "$T/$1-ckpt" && find . -name '*.h5' | sort)
    echo "# $n shards equal"
    [ "$n" -ge 2 ]
}
KEYS=train/lm_loss,train/grad_norm,train/learning_rate,validation/lm_loss,test/lm_loss,train/loss_scale,train/skipped_iterations,train/nan_iterations
OVF=', "fp16": {"enabled": true, "initial_scale_power": 26, "loss_scale_window": 3}'
DROP=', "hidden_dropout": 0.1, "attention_dropout": 0.1'
SGD='"optimizer": {"type": "SGD", "params": {"lr": 0.01, "momentum": 0.9}}'
LION='"optimizer": {"type": "lion", "params": {"lr": 0.0003, "betas": [0.9, 0.99]}}'
# NAME:OPTIMIZER:EXTRA (OPTIMIZER a variable's name). SGD under fp16's first overflows: its momentum
# buffer's first step (sc->step 1, read on the device) comes once the scale is low enough.
for spec in "fp32:ADAM:$DROP" "bf16:LION:, \"precision\": \"bfloat16\", \"eod_mask_loss\": true" "fp16:ADAM:$OVF" \
    "sgd-fp16:SGD:$OVF"; do
    name=${spec%%:*} rest=${spec#*:}
    extra=${rest#*:}
    optimizer=${rest%%:*} && optimizer=${!optimizer}
    check "$name: 8 steps on the CPU backend" run "cpu-$name" cpu false "$extra" "$optimizer"
    check "$name: 8 steps on the emulated device, captured and replayed" run "graph-$name" emulated true "$extra" "$optimizer"
    check "$name: replays after the eager warm-up" grep -q "cuda_graph: [1-9][0-9]* steps replayed" "$T/graph-$name.out"
    check "$name: replayed equals the CPU bit for bit" $LIB same "$T/cpu-$name/metrics.jsonl" "$T/graph-$name/metrics.jsonl" "$KEYS"
    check "$name: replayed checkpoints equal the CPU's" same_checkpoints "cpu-$name" "graph-$name"
done
check "fp32: the learning rate changed between replays (warm-up, then cosine)" python3 -c "
import json, sys
lrs = [json.loads(l)['train/learning_rate'] for l in open(sys.argv[1]) if 'train/learning_rate' in l]
print('# learning rates:', lrs, file=sys.stderr)
sys.exit(0 if len(lrs) == 8 and len(set(lrs[3:])) >= 4 else 1)" "$T/graph-fp32/metrics.jsonl"
check "fp16: overflows skipped steps and the scale moved" python3 -c "
import json, sys
scales = [json.loads(l)['train/loss_scale'] for l in open(sys.argv[1]) if 'train/loss_scale' in l]
print('# loss scales:', scales, file=sys.stderr)
skipped = [json.loads(l).get('train/skipped_iterations', 0) for l in open(sys.argv[1])]
sys.exit(0 if len(set(scales[2:])) >= 2 and 1 in skipped else 1)" "$T/graph-fp16/metrics.jsonl"
for name in fp32 bf16 fp16 sgd-fp16; do  # the loss scale, the mask sums and the dropout rows come through memory: one capture
    check "$name: captured once, replayed since" bash -c "grep 'cuda_graph: [0-9]* steps replayed' '$T/graph-$name.out' >&2 &&
        grep -q 'cuda_graph: [1-9][0-9]* steps replayed, 1 captured' '$T/graph-$name.out'"
done

# The negative check: a learning rate frozen at the capture's (as a by-value argument would be) differs.
NEOX_TEST_GRAPH_FREEZE_LR=1 check "a frozen learning rate: 8 steps replayed" run graph-frozen emulated true "$DROP"
differs() { ! "$@"; }
check "a frozen learning rate differs from the CPU" differs $LIB same "$T/cpu-fp32/metrics.jsonl" "$T/graph-frozen/metrics.jsonl" "$KEYS"

# Refused by name, then trained eagerly (the same numbers as without the key).
check "cpu backend: not captured, says why" run graph-cpu cpu true ', "exit_interval": 1'
check "cpu backend: the notice names it" grep -q "cuda_graph: the step runs eagerly: this compute_backend" "$T/graph-cpu.out"
check "madgrad_wd: not captured, says why" run graph-madgrad emulated true ', "exit_interval": 1' \
    '"optimizer": {"type": "madgrad_wd", "params": {"lr": 0.01}}'
check "madgrad_wd: the notice names the step's reads" grep -q "cuda_graph: the step runs eagerly: the step reads values back" "$T/graph-madgrad.out"
