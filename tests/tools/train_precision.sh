# tests/tools/train_precision.sh: neox-train in bfloat16 and fp16 (the linear layers' operands in 16
# bits, fp32 master weights) on the CPU backend. Each must train as closely to the fp32 run as 16-bit
# rounding allows, yet differ from it (the rounding happens); fp16 with a loss scale that overflows
# must skip steps and move the scale exactly as DeepSpeed's dynamic loss scaler does (an independent
# Python statement of its rules, tests/tools/loss_scale_oracle.py), hold the LR schedule over skipped
# steps, and resume bit-exactly mid-adjustment. Bad settings and an unavailable backend are refused.
source tests/lib.sh

char_shakespeare "neox-train precision" || exit 0

cat >"$T/model.yml" <<EOF
{
  "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64, "max_position_embeddings": 64,
  "pos_emb": "rotary", "rotary_pct": 0.25, "gpt_j_residual": true, "no_weight_tying": true,
  "optimizer": {"type": "Adam", "params": {"lr": 0.003, "betas": [0.9, 0.95], "eps": 1.0e-8}},
  "min_lr": 0.0003, "weight_decay": 0.01, "lr_decay_style": "cosine", "warmup": 0.1, "gradient_clipping": 1.0,
  "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
  "train_iters": 30, "eval_interval": 10, "eval_iters": 2, "log_interval": 1,
  "data_path": "$T/char_text_document", "tokenizer_type": "CharLevelTokenizer"
}
EOF
run() {  # run NAME JSON: trains model.yml + JSON with logs in $T/NAME
    echo "{\"log_dir\": \"$T/$1\" $2}" >"$T/$1.yml"
    $TRAIN -q "$T/model.yml" "$T/$1.yml"
}
# Per-step training losses of A within REL of B's (relative), and not all identical.
close_losses() {
    python3 - "$@" <<'PY'
import json, sys
a, b, rel = sys.argv[1], sys.argv[2], float(sys.argv[3])
def losses(p): return [r["train/lm_loss"] for r in map(json.loads, open(p)) if "train/lm_loss" in r]
x, y = losses(a), losses(b)
assert len(x) == len(y) == 30, (len(x), len(y))
worst = max(abs(u - v) / v for u, v in zip(x, y))
print(f"largest relative difference {worst:.2e} (first losses {x[0]:.5f} vs {y[0]:.5f}, last {x[-1]:.5f} vs {y[-1]:.5f})")
assert worst <= rel, f"{worst} > {rel}"
assert x != y, "identical to fp32: no 16-bit rounding happened"
assert y[-1] < y[0] - 0.5 and x[-1] < x[0] - 0.5, "did not learn"
PY
}

check "fp32: 30 steps" run fp32 ''
check "bfloat16: 30 steps" run bf16 ', "precision": "bfloat16"'
check "bfloat16: every step's loss within 2% of fp32, not identical" close_losses "$T/bf16/metrics.jsonl" "$T/fp32/metrics.jsonl" 0.02
check "bf16 dict selects bfloat16" run bf16dict ', "bf16": {"enabled": true}'
check "bf16 dict: same losses as precision bfloat16" $LIB same "$T/bf16/metrics.jsonl" "$T/bf16dict/metrics.jsonl" \
    train/lm_loss,train/grad_norm
check "fp16 (initial_scale_power 12): 30 steps" run fp16 ', "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12}'
check "fp16: every step's loss within 1% of fp32, not identical" close_losses "$T/fp16/metrics.jsonl" "$T/fp32/metrics.jsonl" 0.01

# Forced overflow: 2^26 x dlogits (about 1/256 each) exceeds fp16's 65504 at once.
OVF='"fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 26, "loss_scale_window": 5, "hysteresis": 2, "min_loss_scale": 1}'
check "fp16 forced overflow: 30 steps" run overflow ", $OVF"
check "fp16 forced overflow: skips, scale and LR follow DeepSpeed's rules" python3 tests/tools/loss_scale_oracle.py \
    "$T/overflow/metrics.jsonl" 26 5 2 1 "$T/fp32/metrics.jsonl"
check "fp16 forced overflow: resume, first 12 steps" run ovf_resumed ", $OVF, \"save\": \"$T/ovf_ckpt\", \"load\": \"$T/ovf_ckpt\", \"checkpoint_factor\": 12, \"exit_interval\": 12"
check "fp16 forced overflow: resume for the rest" run ovf_resumed ", $OVF, \"save\": \"$T/ovf_ckpt\", \"load\": \"$T/ovf_ckpt\", \"checkpoint_factor\": 12"
check "fp16 forced overflow: resumed run bit-identical (losses, norms, LRs, loss scales)" $LIB same \
    "$T/overflow/metrics.jsonl" "$T/ovf_resumed/metrics.jsonl" train/lm_loss,train/grad_norm,train/learning_rate,train/loss_scale

check_fails "fp16.initial_scale_power out of range is refused, naming the key" 2 "fp16.initial_scale_power': 200 is out of range" \
    run bad_power ', "fp16": {"enabled": true, "initial_scale_power": 200}'
check_fails "fp16.hysteresis 0 is refused, naming the key" 2 "key 'fp16.hysteresis': 0 is out of range \(must be >= 1\)" \
    run bad_hyst ', "fp16": {"enabled": true, "hysteresis": 0}'
if [ "$(basename "$(dirname "$(readlink -f "$NEOX_BIN")")")" = cpu ]; then
    check_fails "compute_backend cuda in a CPU build is refused" 2 'compute_backend: .*no CUDA backend' \
        run no_cuda ', "compute_backend": "cuda"'
fi
