# tests/mpi/adaptive_compression.sh: gradient_compression: adaptive (lib/gradient/adaptive.c,
# lib/train/adaptive_compression.c) on Tiny Shakespeare (char-level), two data-parallel ranks:
# - leaving a compressor hands back its error exactly (1-bit and PowerSGD, 2-4 ranks);
# - a measured run logs every decision with its inputs from gradient_compression_start on, every
#   gradient_compression_interval steps, 3 steps after choosing a scheme never run before (which
#   schemes it picks depends on the machine's timings, so
#   its loss is not asserted: the fixed schedule below is);
# - replaying that run's decisions file reproduces its losses bit for bit (decisions are the only
#   thing the measurements change);
# - a replayed schedule that passes through every scheme (PowerSGD, 1-bit, bf16, dense) is
#   followed, logged per step in metrics.jsonl, and ends within 2% of AdamW;
# - a resume in the middle of its 1-bit phase is bit-exact, the checkpoint naming the scheme;
# - its keys without adaptive, and a malformed decisions file, are refused by name.
source tests/lib.sh

command -v "$MPIEXEC" >/dev/null || { skip "adaptive compression" "$MPIEXEC is not installed"; exit 0; }
export OMP_NUM_THREADS=1

for p in 2 3 4; do
    check "flushing a compressor's error restores what it owed ($p ranks)" \
        timeout 60 $MPIEXEC -n $p build/cpu/tests/drivers/compress_flush_check
done

char_shakespeare "adaptive compression" || exit 0
ITERS=300
cat >"$T/dp2.yml" <<EOF
{
  "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64, "max_position_embeddings": 64,
  "norm": "layernorm", "pos_emb": "rotary", "rotary_pct": 0.25, "gpt_j_residual": true,
  "optimizer": {"type": "Adam", "params": {"lr": 0.003, "betas": [0.9, 0.95], "eps": 1.0e-8}},
  "min_lr": 0.0003, "gradient_clipping": 1.0, "lr_decay_style": "cosine", "warmup": 0.05,
  "train_micro_batch_size_per_gpu": 8, "train_iters": $ITERS, "eval_interval": $ITERS, "eval_iters": 8,
  "log_interval": 10, "seed": 1234, "split": "949,50,1",
  "data_path": "$T/char_text_document", "tokenizer_type": "CharLevelTokenizer"
}
EOF
run() {  # run NAME EXTRA_JSON: 2 ranks, log_dir $T/NAME
    echo "{\"log_dir\": \"$T/$1\" $2}" >"$T/$1.yml"
    $MPIEXEC -n 2 $TRAIN -q "$T/dp2.yml" "$T/$1.yml"
}
ADAPTIVE='"gradient_compression": "adaptive", "gradient_compression_start": 60, "gradient_compression_interval": 40'
check "AdamW, 2 ranks" run adam ""
check "adaptive, measured, 2 ranks" run measured ", $ADAPTIVE"

check "measured: a decision with its inputs at 60, 100, ..., 260" python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
lines = [json.loads(l) for l in open(f"{t}/measured/gradient_compression.jsonl")]
its = [d["iteration"] for d in lines]
# every 40 steps from 60 on; a scheme chosen for the first time is on trial: decided on again 3 steps later
want, used = [60], {"dense"}
for d in lines:
    if d["iteration"] != want[-1]:
        break
    step = 3 if d["scheme"] not in used else 40
    used.add(d["scheme"])
    if want[-1] + step < 300:
        want.append(want[-1] + step)
assert its == want, (its, want)
for d in lines:
    assert d["scheme"] in ("dense", "bf16", "powersgd", "onebit"), d
    assert d["bytes_per_s"] > 0 and d["latency_s"] >= 0 and d["backward_s"] > 0, d
    assert set(d["predicted_exposed_s"]) == {"dense", "bf16", "powersgd", "onebit"}, d
def valid(d):
    return [r["validation/lm_loss"] for r in map(json.loads, open(f"{t}/{d}/metrics.jsonl")) if "validation/lm_loss" in r][0]
adam, measured = valid("adam"), valid("measured")
print("decisions:", [(d["iteration"], d["scheme"]) for d in lines], f"validation {measured:.4f} vs AdamW {adam:.4f}")
PY

check "replaying the measured run's decisions" run replayed ", $ADAPTIVE, \"gradient_compression_replay\": \"$T/measured/gradient_compression.jsonl\""
check "the replay reproduces the measured run bit for bit" $LIB same \
    "$T/measured/metrics.jsonl" "$T/replayed/metrics.jsonl" train/lm_loss,train/grad_norm,validation/lm_loss

printf '%s\n' '{"iteration": 60, "scheme": "powersgd"}' '{"iteration": 140, "scheme": "onebit"}' \
    '{"iteration": 170, "scheme": "bf16"}' '{"iteration": 220, "scheme": "dense"}' >"$T/schedule.jsonl"
SCHEDULE="$ADAPTIVE, \"gradient_compression_replay\": \"$T/schedule.jsonl\""
check "a schedule through every scheme" run schedule ", $SCHEDULE"
check "the schedule is followed (per-step shares in metrics.jsonl) and ends within 2% of AdamW" python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
rows = [r for r in map(json.loads, open(f"{t}/schedule/metrics.jsonl")) if "comm/adaptive/dense" in r]
# the scheme of a step that begins after n updates (a decision at n applies from step n + 1 on)
want = lambda n: "dense" if n < 60 else "powersgd" if n < 140 else "onebit" if n < 170 else "bf16" if n < 220 else "dense"
for r in rows:  # each record: the 10 steps ending at its iteration
    steps = range(r["iteration"] - 9, r["iteration"] + 1)
    for s in ("dense", "bf16", "powersgd", "onebit"):
        share = sum(want(i - 1) == s for i in steps) / 10
        assert abs(r[f"comm/adaptive/{s}"] - share) < 1e-9, (r["iteration"], s, r[f"comm/adaptive/{s}"], share)
log = [json.loads(l) for l in open(f"{t}/schedule/gradient_compression.jsonl")]
assert [(d["iteration"], d["scheme"], d.get("replayed")) for d in log] == [
    (60, "powersgd", True), (140, "onebit", True), (170, "bf16", True), (220, "dense", True)], log
valid = lambda d: [r["validation/lm_loss"] for r in map(json.loads, open(f"{t}/{d}/metrics.jsonl")) if "validation/lm_loss" in r][0]
print(f"{len(rows)} records follow the schedule; validation {valid('schedule'):.4f} vs AdamW {valid('adam'):.4f}")
sys.exit(0 if valid("schedule") <= 1.02 * valid("adam") else 1)
PY

CK="\"save\": \"$T/ckpt\", \"load\": \"$T/ckpt\", \"checkpoint_factor\": 150"
check "the schedule: 150 steps, checkpoint in the 1-bit phase" run resumed ", $SCHEDULE, $CK, \"exit_interval\": 150"
check_output "the checkpoint names the scheme in use and when it was chosen" '"decided_at": 140, "scheme": "onebit"' \
    python3 -c "import json, re; m = re.search(rb'\"gradient_compression\":\s*(\{[^}]*\})', open('$T/ckpt/global_step150/rank_00000.h5', 'rb').read()); print(json.dumps(json.loads(m.group(1)), sort_keys=True))"
check "the schedule: resumed for 150 more" run resumed ", $SCHEDULE, $CK"
check "resumed in the 1-bit phase: bit-identical to the straight run" $LIB same \
    "$T/schedule/metrics.jsonl" "$T/resumed/metrics.jsonl" train/lm_loss,train/grad_norm,validation/lm_loss

echo '{"log_dir": "'"$T/x"'", "gradient_compression": "powersgd", "gradient_compression_interval": 5}' >"$T/bad1.yml"
check_fails "gradient_compression_interval without adaptive is refused by name" 2 \
    "gradient_compression_interval: only gradient_compression: adaptive" $MPIEXEC -n 2 $TRAIN -q "$T/dp2.yml" "$T/bad1.yml"
printf '%s\n' '{"iteration": 60, "scheme": "powersgd"}' '{"iteration": 50, "scheme": "fp8"}' >"$T/bad.jsonl"
echo "{\"log_dir\": \"$T/x\", $ADAPTIVE, \"gradient_compression_replay\": \"$T/bad.jsonl\"}" >"$T/bad2.yml"
check_fails "a malformed decisions file is refused naming the file and line" 2 \
    "gradient_compression_replay: .*bad.jsonl line 2" $MPIEXEC -n 2 $TRAIN -q "$T/dp2.yml" "$T/bad2.yml"
