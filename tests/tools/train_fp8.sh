# tests/tools/train_fp8.sh: neox-train in precision fp8 (the transformer layers' linear products on
# FP8 operands with Transformer Engine's delayed scaling; docs/model.md, "FP8 training") on the CPU
# backend. It must train as closely to bfloat16 as FP8 rounding allows, yet differ from it; each
# te_fp8_* key must change the run (format, wgrad, amax history length and algorithm, margin); the
# scales and amax histories are in the checkpoint's run state and a resumed run continues bit for
# bit; the emulated device equals the CPU bit for bit; bad recipe values and te_fp8_mha are refused
# by name. (The arithmetic against a torch restatement of the recipe: tests/oracle/test_fp8.py.)
source tests/lib.sh

# One thread: a 2-layer model at hidden 64 has nothing to share between two, and a second thread's
# spinning in OpenMP's barriers cost about 20 times the work's CPU time on the loaded test machine.
export OMP_NUM_THREADS=1

char_shakespeare "neox-train precision fp8" || exit 0

cat >"$T/model.yml" <<EOF
{
  "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64, "max_position_embeddings": 64,
  "pos_emb": "rotary", "rotary_pct": 0.25, "gpt_j_residual": true, "no_weight_tying": true,
  "optimizer": {"type": "Adam", "params": {"lr": 0.003, "betas": [0.9, 0.95], "eps": 1.0e-8}},
  "min_lr": 0.0003, "weight_decay": 0.01, "lr_decay_style": "cosine", "warmup": 0.1, "gradient_clipping": 1.0,
  "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
  "train_iters": 12, "eval_interval": 12, "eval_iters": 1, "log_interval": 1,
  "data_path": "$T/char_text_document", "tokenizer_type": "CharLevelTokenizer"
}
EOF
run() {  # run NAME JSON: trains model.yml + JSON with logs in $T/NAME
    echo "{\"log_dir\": \"$T/$1\" $2}" >"$T/$1.yml"
    $TRAIN -q "$T/model.yml" "$T/$1.yml"
}
differ() {  # differ A B: the per-step losses of runs A and B are not all identical
    python3 - "$T/$1/metrics.jsonl" "$T/$2/metrics.jsonl" <<'PY'
import json, sys
a, b = ([r["train/lm_loss"] for r in map(json.loads, open(p)) if "train/lm_loss" in r] for p in sys.argv[1:])
assert len(a) == len(b) == 12, (len(a), len(b))
print(f"last losses {a[-1]:.6f} vs {b[-1]:.6f}")
assert a != b, "identical: the setting changed nothing"
PY
}
same_losses() { $LIB same "$T/$1/metrics.jsonl" "$T/$2/metrics.jsonl" train/lm_loss,train/grad_norm; }
FP8=', "precision": "fp8"'
HIST=', "te_fp8_amax_history_len": 4, "te_fp8_amax_compute_algo": "max"'

check "bfloat16: 12 steps" run bf16 ', "precision": "bfloat16"'
check "fp8 (hybrid, TE's defaults): 12 steps" run fp8 "$FP8"
check "fp8: every step's loss within 2% of bfloat16's, not identical, and learning" python3 - "$T/fp8/metrics.jsonl" "$T/bf16/metrics.jsonl" <<'PY'
import json, sys
x, y = ([r["train/lm_loss"] for r in map(json.loads, open(p)) if "train/lm_loss" in r] for p in sys.argv[1:])
worst = max(abs(u - v) / v for u, v in zip(x, y))
print(f"largest relative difference {worst:.2e}; last {x[-1]:.5f} vs {y[-1]:.5f}")
assert len(x) == len(y) == 12 and worst <= 0.02 and x != y and x[-1] < x[0] - 0.5
PY
check "te_fp8_format e4m3 (E4M3 gradients): 12 steps" run e4m3 "$FP8"', "te_fp8_format": "e4m3"'
check "te_fp8_format changes the run" differ fp8 e4m3
check "te_fp8_wgrad false (bfloat16 weight gradients): 12 steps" run nowgrad "$FP8"', "te_fp8_wgrad": false'
check "te_fp8_wgrad changes the run" differ fp8 nowgrad
check "te_fp8_margin 3: 12 steps" run margin "$FP8"', "te_fp8_margin": 3'
check "te_fp8_margin changes the run" differ fp8 margin
check "amax history 4, max: 12 steps" run hist "$FP8$HIST"
check "te_fp8_amax_history_len changes a max run (4 against 1)" differ fp8 hist
check "most_recent over 4: 12 steps" run recent "$FP8"', "te_fp8_amax_history_len": 4, "te_fp8_amax_compute_algo": "most_recent"'
check "te_fp8_amax_compute_algo changes the run (max against most_recent)" differ hist recent

CKPT=', "save": "'$T/ckpt'", "load": "'$T/ckpt'", "checkpoint_factor": 6'
check "resume: first 6 steps" run resumed "$FP8$HIST$CKPT"', "exit_interval": 6'
check "the checkpoint's run state holds the scales and amax histories" python3 - "$T/ckpt" <<'PY'
import json, sys
# state/train.json is a text dataset of rank 0's shard: decode the JSON document holding "fp8".
data = open(f"{sys.argv[1]}/global_step6/rank_00000.h5", "rb").read().decode("latin-1")
at, state = data.index('"fp8"'), None
for start in (i for i in range(at, -1, -1) if data[i] == "{"):
    try:
        doc, _ = json.JSONDecoder().raw_decode(data, start)
    except ValueError:
        continue
    if "fp8" in doc and "iteration" in doc:
        state = doc
        break
f = state["fp8"]
assert f["amax_history_len"] == 4 and f["tensors"] == 3 * 4 * 2, f  # 3 tensors of 4 linears, 2 layers
assert len(f["amax_history"]) == 4 * f["tensors"] and len(f["scale"]) == f["tensors"]
assert len(set(f["scale"])) > 3 and all(s > 0 for s in f["scale"]), f["scale"]
PY
check "resume: the rest" run resumed "$FP8$HIST$CKPT"
check "resumed run bit-identical (losses, norms)" same_losses hist resumed

check "emulated device: 12 steps" run emulated "$FP8$HIST"', "compute_backend": "emulated"'
check "emulated device equals the CPU bit for bit" same_losses hist emulated

check_fails "te_fp8_amax_compute_algo other than max or most_recent is refused" 2 \
    "te_fp8_amax_compute_algo: 'mean' is not max or most_recent" run bad_algo "$FP8"', "te_fp8_amax_compute_algo": "mean"'
check_fails "te_fp8_amax_history_len 0 is refused" 2 "te_fp8_amax_history_len: 0 is out of range" \
    run bad_len "$FP8"', "te_fp8_amax_history_len": 0'
check_fails "te_fp8_mha is refused (FP8 attention is not built)" 2 "te_fp8_mha" run mha "$FP8"', "te_fp8_mha": true'
check_fails "a resume with another te_fp8_amax_history_len is refused" 2 "te_fp8_amax_history_len: 2, but the checkpoint" \
    run other_len "$FP8$CKPT"', "te_fp8_amax_history_len": 2, "te_fp8_amax_compute_algo": "max"'
