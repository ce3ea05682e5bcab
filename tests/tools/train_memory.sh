# tests/tools/train_memory.sh: the start-up memory report counts each optimizer's own state: two
# fp32 buffers per parameter for AdamW, cpu_torch_adam and 1-bit Adam (the moments), one for SGD
# and Lion (the momentum), three for madgrad_wd, i.e. optimizer bytes = 2x, 1x or 3x the fp32
# parameter bytes; SM3 keeps only a row and a column accumulator per matrix (one per element of a
# vector), twice (the step forms the new ones beside the old): under 5% of AdamW's even at hidden size 64, and
# exactly the accumulators its checkpoint holds, plus one buffer with a momentum (and under fp16 it
# warns, as GPT-NeoX documents SM3 unsuited to fp16). Its regions add up to its
# total and bfloat16 adds 2 bytes of 16-bit copies per parameter (the per-parameter table of each
# ZeRO stage is tests/mpi/memory.sh's). Every log interval metrics.jsonl and TensorBoard carry the measured peak memory:
# the resident set on the CPU (at least the planned parameters and at most a sane bound), and on a
# device backend (the emulated one) also the device's peak, at least the planned backend regions.
source tests/lib.sh

char_shakespeare "neox-train memory report" || exit 0
cat >"$T/model.yml" <<EOF
{ "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64, "max_position_embeddings": 64,
  "train_micro_batch_size_per_gpu": 2, "train_iters": 3, "eval_iters": 0, "log_interval": 1,
  "data_path": "$T/char_text_document", "tokenizer_type": "CharLevelTokenizer" }
EOF
# ratio NAME WANT OPTIMIZER_JSON: optimizer bytes / parameter bytes in the report equals WANT (the
# report prints 3 significant figures, so within 1%).
ratio() {
    echo "{\"optimizer\": $3}" >"$T/$1.yml"
    $TRAIN "$T/model.yml" "$T/$1.yml" >"$T/$1.log" 2>&1 || { cat "$T/$1.log"; return 1; }
    python3 - "$T/$1.log" "$2" <<'PY'
import re, sys
units = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
line = next(l for l in open(sys.argv[1]) if "memory of rank 0" in l)
def size(what):
    m = re.search(what + r" ([0-9.]+)\s*([kKMGT]?)B", line)
    return float(m.group(1)) * units[m.group(2)]
got = size("optimizer") / size("parameters")
print(line.strip(), f"-> ratio {got:.3f}")
assert abs(got - float(sys.argv[2])) <= 0.01 * float(sys.argv[2]), got
PY
}
check "AdamW: optimizer state is two fp32 buffers per parameter" \
    ratio adam 2 '{"type": "Adam", "params": {"lr": 0.001}}'
check "1-bit Adam: two buffers too (momentum and frozen variance)" \
    ratio onebit 2 '{"type": "OneBitAdam", "params": {"lr": 0.001, "freeze_step": 1}}'
check "SGD with momentum: one buffer" \
    ratio sgd 1 '{"type": "sgd", "params": {"lr": 0.01, "momentum": 0.9}}'
check "Lion: one buffer (the momentum)" \
    ratio lion 1 '{"type": "lion", "params": {"lr": 0.0001, "betas": [0.9, 0.99]}}'
check "madgrad_wd: three buffers (sum of squares, sum of gradients, x0)" \
    ratio madgrad 3 '{"type": "madgrad_wd", "params": {"lr": 0.01, "momentum": 0.9}}'
check "cpu_torch_adam: AdamW's two buffers, on the host" \
    ratio cpu_torch_adam 2 '{"type": "cpu_torch_adam", "params": {"lr": 0.001}}'

# optimizer_bytes NAME OPTIMIZER_JSON [MORE]: trains model.yml with it (log_dir and save $T/NAME) and
# prints the optimizer bytes of rank 0's memory_plan.json.
optimizer_bytes() {
    echo "{\"optimizer\": $2, \"log_dir\": \"$T/$1/log\", \"save\": \"$T/$1/ckpt\", \"checkpoint_factor\": 3 ${3:-}}" >"$T/$1.yml"
    $TRAIN -q "$T/model.yml" "$T/$1.yml" >"$T/$1.log" 2>&1 || { cat "$T/$1.log" >&2; return 1; }
    python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["ranks"][0]["optimizer"])' "$T/$1/log/memory_plan.json"
}
sm3_memory() {
    local adam sm3 sm3m params
    adam=$(optimizer_bytes adam-plan '{"type": "Adam", "params": {"lr": 0.001}}') || return 1
    sm3=$(optimizer_bytes sm3-plan '{"type": "sm3", "params": {"lr": 0.01}}') || return 1
    sm3m=$(optimizer_bytes sm3m-plan '{"type": "sm3", "params": {"lr": 0.01, "momentum": 0.9}}') || return 1
    params=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["ranks"][0]["parameters"])' "$T/sm3-plan/log/memory_plan.json")
    # The accumulators the checkpoint holds (their element counts from h5ls), two sets of fp32.
    local held
    held=$(h5ls -r "$T/sm3-plan/ckpt/global_step3/rank_00000.h5" | python3 -c '
import re, sys
print(sum(int(m.group(1)) for l in sys.stdin if "/optimizer/sm3_" in l for m in [re.search(r"Dataset \{(\d+)\}", l)] if m))')
    echo "AdamW $adam B, SM3 $sm3 B (the checkpoint holds $held accumulators), with momentum $sm3m B, parameters $params B"
    [ "$adam" = $((2 * params)) ] && [ "$sm3" -gt 0 ] && [ $((sm3 * 20)) -lt "$adam" ] && [ "$sm3" = $((2 * 4 * held)) ] &&
        [ "$sm3m" = $((sm3 + params)) ]
}
if command -v h5ls >/dev/null; then
    check "SM3: optimizer state is the accumulators its checkpoint holds, twice, under 5% of AdamW's (memory_plan.json)" sm3_memory
else skip "SM3's optimizer state" "h5ls is missing"; fi
echo '{"optimizer": {"type": "sm3", "params": {"lr": 0.01}}, "precision": "fp16", "weight_decay": 0.1}' >"$T/sm3-fp16.yml"
check "SM3 under fp16 trains, warning as GPT-NeoX documents, and names the weight_decay it cannot apply" bash -c \
    "'$TRAIN' '$T/model.yml' '$T/sm3-fp16.yml' 2>'$T/sm3-fp16.err' >/dev/null &&
     grep -q 'warning: optimizer.type sm3 with precision fp16: GPT-NeoX documents that SM3 does not work well' '$T/sm3-fp16.err' &&
     grep -q 'sm3-fp16.yml:1: weight_decay 0.1 has no effect with optimizer.type sm3' '$T/sm3-fp16.err'"

# planned NAME CHECK: runs model.yml + NAME.yml (3 steps, logs and TensorBoard in $T/NAME) and checks
# the python expression CHECK over p (the planned regions) and r (the last metrics.jsonl record).
planned() {
    local name=$1 expr=$2
    $TRAIN "$T/model.yml" "$T/$name.yml" >"$T/$name.log" 2>&1 || { tail -20 "$T/$name.log"; return 1; }
    python3 tests/mpi/memory_check.py regions "$T/$name.log" >"$T/$name.json" || return 1
    python3 - "$T/$name.json" "$T/$name/log/metrics.jsonl" "$expr" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
records = [json.loads(l) for l in open(sys.argv[2])]
r = [x for x in records if "train/lm_loss" in x][-1]
print(p, {k: v for k, v in r.items() if k.startswith("memory/")})
assert eval(sys.argv[3]), sys.argv[3]
PY
}
logs() { echo '{"log_dir": "'"$T/$1"'/log", "tensorboard_dir": "'"$T/$1"'/tb"'"$2"'}' >"$T/$1.yml"; }
logs fp32 ''
check "the memory line's regions add up to its total (within its 3 significant figures)" \
    planned fp32 'abs(sum(v for k, v in p.items() if k != "total") - p["total"]) <= 0.01 * p["total"] and len(p) == 8'
check "fp32: no 16-bit copies, no communication buffers, nothing offloaded" \
    planned fp32 'p["16-bit copies"] == 0 and p["communication"] == 0 and p["offloaded"] == 0'
check "metrics.jsonl: the peak resident set is at least the planned parameters, below 4 GB" \
    planned fp32 'p["parameters"] <= r["memory/peak_rss_bytes"] < 4e9 and "memory/device_peak_bytes" not in r'
tb_memory() {
    .venv/bin/python - "$T/fp32" <<'PY'
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(f"{sys.argv[1]}/tb", size_guidance={"scalars": 0})
acc.Reload()
tb = {e.step: e.value for e in acc.Scalars("memory/peak_rss_bytes")}
jsonl = {r["iteration"]: r["memory/peak_rss_bytes"] for r in map(json.loads, open(f"{sys.argv[1]}/log/metrics.jsonl"))
         if "memory/peak_rss_bytes" in r}
print(tb, jsonl)
assert sorted(tb) == [1, 2, 3] and all(abs(tb[i] - jsonl[i]) <= 1e-6 * jsonl[i] for i in tb)  # float32 in TensorBoard
PY
}
if [ -x .venv/bin/python ]; then check "TensorBoard carries memory/peak_rss_bytes at every log, as metrics.jsonl" tb_memory
else skip "TensorBoard memory/peak_rss_bytes" ".venv is missing"; fi
logs bf16 ', "precision": "bfloat16"'
check "bfloat16: 16-bit copies are 2 bytes per parameter (half the fp32 parameters)" \
    planned bf16 'abs(p["16-bit copies"] - p["parameters"] / 2) <= 0.01 * p["parameters"]'
logs emulated ', "compute_backend": "emulated"'
check "emulated device: its peak holds the planned backend regions, and at most twice the plan" \
    planned emulated 'p["parameters"] + p["gradients"] + p["optimizer"] + p["activations"] <= r["memory/device_peak_bytes"] <= 2 * p["total"]'
# bfloat16 stores the activations in bf16 (docs/model.md, "Activation storage"): the plan is about half
# fp32's (the norms' and the loss's statistics stay fp32, and bfloat16 plans no 16-bit GEMM copies of
# them), and a device's measured peak holds it
check "bfloat16: activations planned at about half fp32's" python3 -c '
import json, sys
a, b = (json.load(open(f))["activations"] for f in sys.argv[1:])
print(f"fp32 {a} bf16 {b}: {b / a:.3f}")
assert 0.45 * a <= b <= 0.6 * a' "$T/fp32.json" "$T/bf16.json"
logs emubf16 ', "compute_backend": "emulated", "precision": "bfloat16"'
check "emulated device, bfloat16: its peak holds the planned regions (bf16 activations), at most twice the plan" \
    planned emubf16 'p["parameters"] + p["gradients"] + p["optimizer"] + p["activations"] <= r["memory/device_peak_bytes"] <= 2 * p["total"]'
