# tests/mpi/adaptive_compression.sh: gradient_compression: adaptive (lib/gradient/adaptive.c,
# adaptive_run.c and exchange.c) on Tiny Shakespeare (char-level), two data-parallel ranks,
# the gradient in 7 buckets (reduce_bucket_size 8000, overlap_comm):
# - leaving a compressor hands back its error exactly (1-bit and PowerSGD, 2-4 ranks), also when
#   each bucket switches on its own and PowerSGD changes rank;
# - a measured run logs every decision with its inputs (per bucket: its share, the backward time
#   left after it was ready, the plan's predicted cost with each of its options) from
#   gradient_compression_start on, every gradient_compression_interval steps, 3 steps after a plan
#   uses a scheme never run before (which schemes it picks depends on the machine's timings, so its
#   loss is not asserted: the fixed schedule below is);
# - replaying that run's decisions file reproduces its losses bit for bit (decisions are the only
#   thing the measurements change);
# - a replayed schedule of per-bucket plans mixing every scheme and PowerSGD rank in one step (and
#   whole-gradient lines of the older format) is followed: the per-step shares in metrics.jsonl
#   and the per-bucket step counts of the comms summary agree with it; it ends within 2% of AdamW;
# - a resume in the middle of a mixed phase is bit-exact, the checkpoint naming the plan;
# - on measurements from a file (NEOX_ADAPTIVE_MEASUREMENTS), the straight run's checkpoint at 100,
#   resumed, takes the decisions of the straight run's last 100 steps, on the plans measured before
#   the checkpoint, and a checkpoint without those measurements still loads, with a notice
#   (the resumes start from the straight runs' checkpoints, so no run is repeated for them);
# - the memory plan holds the bf16 wire copy that any bucket may come to use;
# - its keys without adaptive, a malformed decisions file and one planning other buckets are
#   refused by name.
source tests/lib.sh

command -v "$MPIEXEC" >/dev/null || { skip "adaptive compression" "$MPIEXEC is not installed"; exit 0; }
export OMP_NUM_THREADS=1

for p in 2 3 4; do
    check "flushing a compressor's error restores what it owed ($p ranks)" \
        timeout 60 $MPIEXEC -n $p build/cpu/tests/drivers/compress_flush_check
done

char_shakespeare "adaptive compression" || exit 0
ITERS=200
cat >"$T/dp2.yml" <<EOF
{
  "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64, "max_position_embeddings": 64,
  "norm": "layernorm", "pos_emb": "rotary", "rotary_pct": 0.25, "gpt_j_residual": true,
  "optimizer": {"type": "Adam", "params": {"lr": 0.003, "betas": [0.9, 0.95], "eps": 1.0e-8}},
  "min_lr": 0.0003, "gradient_clipping": 1.0, "lr_decay_style": "cosine", "warmup": 0.05,
  "train_micro_batch_size_per_gpu": 8, "train_iters": $ITERS, "eval_interval": $ITERS, "eval_iters": 8,
  "log_interval": 10, "seed": 1234, "split": "949,50,1",
  "zero_optimization": {"stage": 0, "overlap_comm": true, "reduce_bucket_size": 8000},
  "data_path": "$T/char_text_document", "tokenizer_type": "CharLevelTokenizer"
}
EOF
run() {  # run NAME EXTRA_JSON: 2 ranks, log_dir $T/NAME
    echo "{\"log_dir\": \"$T/$1\" $2}" >"$T/$1.yml"
    $MPIEXEC -n 2 $TRAIN -q "$T/dp2.yml" "$T/$1.yml"
}
ADAPTIVE='"gradient_compression": "adaptive", "gradient_compression_start": 40, "gradient_compression_interval": 30'
check "AdamW, 2 ranks" run adam ""
check "adaptive, measured, 2 ranks" run measured ", $ADAPTIVE"
# The plans of the static compressors (train_iters 0: start-up only) give their buffers' bytes.
sed 's/"train_iters": [0-9]*/"train_iters": 0/' "$T/dp2.yml" >"$T/dp2-plan.yml"
plan_only() { echo "{\"log_dir\": \"$T/$1\" $2}" >"$T/$1.yml"; $MPIEXEC -n 2 $TRAIN -q "$T/dp2-plan.yml" "$T/$1.yml"; }
check "PowerSGD's plan alone" plan_only powersgd ', "gradient_compression": "powersgd"'
check "1-bit's plan alone" plan_only onebit ', "gradient_compression": "onebit"'
check "the plan holds PowerSGD's and 1-bit's buffers and the bf16 wire copy any bucket may use (2 bytes per parameter)" \
    python3 - "$T" <<'PY'
import json, sys
comm = lambda name: json.load(open(f"{sys.argv[1]}/{name}/memory_plan.json"))["ranks"][0]["communication"]
parameters = json.load(open(f"{sys.argv[1]}/adam/memory_plan.json"))["ranks"][0]["parameters"] / 4  # fp32, stage 0
extra = {n: comm(n) - comm("adam") for n in ("powersgd", "onebit", "measured")}
print("communication beyond AdamW's:", extra, "bytes;", parameters, "parameters")
assert extra["measured"] == extra["powersgd"] + extra["onebit"] + 2 * parameters
PY

check "measured: a decision with its inputs at 40, 70, ..., 190" python3 - "$T" $ITERS <<'PY'
import json, sys
t = sys.argv[1]
lines = [json.loads(l) for l in open(f"{t}/measured/gradient_compression.jsonl")]
its = [d["iteration"] for d in lines]
# every 30 steps from 40 on; a plan using a scheme for the first time is on trial: decided on again 3 steps later
want, used = [40], {"dense"}
for d in lines:
    if d["iteration"] != want[-1]:
        break
    schemes = {c.split(":")[0] for c in d["buckets"]}
    step = 3 if schemes - used else 30
    used |= schemes
    if want[-1] + step < int(sys.argv[2]):
        want.append(want[-1] + step)
assert its == want, (its, want)
options = {"dense", "bf16", "powersgd:4", "powersgd:2", "powersgd:1", "onebit"}  # gradient_compression_rank 4
for d in lines:
    assert len(d["buckets"]) == 7 and set(d["buckets"]) <= options, d
    assert d["scheme"] in ("dense", "bf16", "powersgd", "onebit", "mixed"), d
    assert d["bytes_per_s"] > 0 and d["latency_s"] >= 0 and d["backward_s"] > 0 and d["expected_exposed_s"] >= 0, d
    # the plan in use was measured, and is among the plans the decision weighed
    assert any(m["iteration"] == d["iteration"] for m in d["measured_plans"]), d
    b = d["bucket_inputs"]
    assert len(b) == 7 and abs(sum(x["share"] for x in b) - 1) < 1e-5, d
    assert all(set(x["predicted_exposed_s"]) == options and 0 <= x["hide_s"] <= d["backward_s"] for x in b), d
    # backward finishes the buckets in order: the first has the most backward left to hide behind
    assert b[0]["hide_s"] >= b[-1]["hide_s"], d
def valid(d):
    return [r["validation/lm_loss"] for r in map(json.loads, open(f"{t}/{d}/metrics.jsonl")) if "validation/lm_loss" in r][0]
adam, measured = valid("adam"), valid("measured")
print("decisions:", [(d["iteration"], d["buckets"]) for d in lines], f"validation {measured:.4f} vs AdamW {adam:.4f}")
PY

check "replaying the measured run's decisions" run replayed ", $ADAPTIVE, \"gradient_compression_replay\": \"$T/measured/gradient_compression.jsonl\""
check "the replay reproduces the measured run bit for bit" $LIB same \
    "$T/measured/metrics.jsonl" "$T/replayed/metrics.jsonl" train/lm_loss,train/grad_norm,validation/lm_loss

# Per-bucket plans (bucket 0 is the first backward finishes), with whole-gradient lines after them:
# neighbours sharing a compressor (one call), PowerSGD's rank lowered and raised, compressors left.
cat >"$T/schedule.jsonl" <<'EOF'
{"iteration": 40, "buckets": ["dense", "dense", "bf16", "powersgd:4", "powersgd:4", "powersgd:2", "onebit"]}
{"iteration": 90, "buckets": ["powersgd:1", "bf16", "dense", "onebit", "onebit", "powersgd:4", "powersgd:2"]}
{"iteration": 110, "scheme": "bf16"}
{"iteration": 140, "scheme": "dense"}
EOF
SCHEDULE="$ADAPTIVE, \"gradient_compression_replay\": \"$T/schedule.jsonl\""
# (its checkpoint at 100, in the mixed phase, is where the resume below starts)
CK="\"save\": \"$T/ckpt\", \"checkpoint_factor\": 100"
check "a schedule of per-bucket plans through every scheme and rank" run schedule ", $SCHEDULE, $CK"
check "the schedule is followed (shares per step, steps per bucket) and ends within 2% of AdamW" python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
plans = [(40, ["dense", "dense", "bf16", "powersgd:4", "powersgd:4", "powersgd:2", "onebit"]),
         (90, ["powersgd:1", "bf16", "dense", "onebit", "onebit", "powersgd:4", "powersgd:2"]),
         (110, ["bf16"] * 7), (140, ["dense"] * 7)]
def plan(n):  # the plan of a step that begins after n updates (a decision at n applies from step n + 1 on)
    p = ["dense"] * 7
    for at, q in plans:
        if n >= at:
            p = q
    return p
buckets = json.load(open(f"{t}/schedule/comm_stats.json"))["gradient_compression_buckets"]
elements = [b["elements"] for b in buckets]
total = sum(elements)
rows = [r for r in map(json.loads, open(f"{t}/schedule/metrics.jsonl")) if "comm/adaptive/dense" in r]
assert len(rows) == 20, len(rows)
for r in rows:  # each record: the 10 steps ending at its iteration
    steps = range(r["iteration"] - 9, r["iteration"] + 1)
    for s in ("dense", "bf16", "powersgd", "onebit"):
        share = sum(e for i in steps for c, e in zip(plan(i - 1), elements) if c.split(":")[0] == s) / total / 10
        assert abs(r[f"comm/adaptive/{s}"] - share) < 1e-9, (r["iteration"], s, r[f"comm/adaptive/{s}"], share)
for b, got in enumerate(buckets):  # the comms summary: steps per option, per bucket
    want = {}
    for i in range(1, 201):
        want[plan(i - 1)[b]] = want.get(plan(i - 1)[b], 0) + 1
    assert got["steps"] == want, (b, got, want)
log = [json.loads(l) for l in open(f"{t}/schedule/gradient_compression.jsonl")]
assert [(d["iteration"], d["buckets"], d.get("replayed")) for d in log] == [(at, q, True) for at, q in plans], log
assert [d["scheme"] for d in log] == ["mixed", "mixed", "bf16", "dense"], log
valid = lambda d: [r["validation/lm_loss"] for r in map(json.loads, open(f"{t}/{d}/metrics.jsonl")) if "validation/lm_loss" in r][0]
print(f"{len(rows)} records follow the schedule; validation {valid('schedule'):.4f} vs AdamW {valid('adam'):.4f}")
sys.exit(0 if valid("schedule") <= 1.02 * valid("adam") else 1)
PY

# after100 METRICS: the records after iteration 100 of a straight run, in METRICS-after100.
after100() {
    python3 -c 'import json, sys
for l in open(sys.argv[1]):
    if json.loads(l).get("iteration", 0) > 100: print(l, end="")' "$1" >"$1-after100"
}
check_output "the checkpoint names the plan in use and when it was chosen" \
    '"buckets": \["powersgd:1", "bf16", "dense", "onebit", "onebit", "powersgd:4", "powersgd:2"\], "decided_at": 90, "powersgd_ranks": \[1, 4, 4, 4, 4, 4, 2\], "scheme": "mixed"' \
    python3 - "$T/ckpt/global_step100/rank_00000.h5" <<'PY'
import json, re, sys
data = open(sys.argv[1], "rb").read().decode("latin-1")
m = re.search(r'"gradient_compression":\s*', data)
state, _ = json.JSONDecoder().raw_decode(data, m.end())
print(json.dumps({k: state[k] for k in ("buckets", "decided_at", "powersgd_ranks", "scheme")}, sort_keys=True))
PY
printf 'global_step100\n' >"$T/ckpt/latest"
check "the schedule: resumed at 100 for 100 more" run resumed ", $SCHEDULE, \"load\": \"$T/ckpt\""
after100 "$T/schedule/metrics.jsonl"
check "resumed in the mixed phase: bit-identical to the straight run" $LIB same \
    "$T/schedule/metrics.jsonl-after100" "$T/resumed/metrics.jsonl" train/lm_loss,train/grad_norm,validation/lm_loss

# Decisions on measurements from a file (NEOX_ADAPTIVE_MEASUREMENTS, the same on every run): a
# straight run against its checkpoint at 100 resumed. The resumed run must decide as the
# straight one did, on the plans it measured before the interruption (kept in the checkpoint), not
# start its memory and trials afresh.
python3 - "$T/fixed.jsonl" <<'PY'
import json, random, sys
rng = random.Random(7)
with open(sys.argv[1], "w") as f:
    for it in range(301):  # a link of about 1.5 Gbit/s, an exposure that moves from window to window
        small = 2e-4 + rng.uniform(0, 1e-4)
        f.write(json.dumps({"iteration": it, "probe_s": [small, small + rng.uniform(2e-3, 3e-3)], "backward_s": 0.05,
                            "step_s": 0.1, "exposed_s": rng.uniform(0.0, 0.02), "slack_s": [0.05 - 0.007 * i for i in range(7)],
                            "onebit_s_per_element": rng.uniform(1e-9, 1e-8),
                            "powersgd_s_per_madd": rng.uniform(1e-10, 1e-9)}) + "\n")
PY
export NEOX_ADAPTIVE_MEASUREMENTS=$T/fixed.jsonl
check "measurements from a file: straight, checkpoint at 100" run fixed ", $ADAPTIVE, \"save\": \"$T/ckpt2\", \"checkpoint_factor\": 100"
printf 'global_step100\n' >"$T/ckpt2/latest"
check "measurements from a file: resumed at 100 for 100 more" run fixed_resumed ", $ADAPTIVE, \"load\": \"$T/ckpt2\""
check "resumed: the same decisions on the same inputs, among them plans measured before the interruption" \
    python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
straight, resumed = ([json.loads(l) for l in open(f"{t}/{d}/gradient_compression.jsonl")] for d in ("fixed", "fixed_resumed"))
assert len(straight) > 4 and len({json.dumps(d["buckets"]) for d in straight}) > 1, straight  # the plans change
tail = [d for d in straight if d["iteration"] > 100]  # the decisions after the checkpoint
assert resumed == tail, [(a["iteration"], b["iteration"]) for a, b in zip(tail, resumed) if a != b][:3]
assert any(m["iteration"] < 100 for d in resumed for m in d["measured_plans"]), resumed
print("decisions:", [(d["iteration"], d["buckets"]) for d in straight])
PY
after100 "$T/fixed/metrics.jsonl"
check "resumed: bit-identical to the straight run" $LIB same \
    "$T/fixed/metrics.jsonl-after100" "$T/fixed_resumed/metrics.jsonl" train/lm_loss,train/grad_norm,validation/lm_loss
# A checkpoint written before the measurements were kept (the key renamed away) still loads, with a notice.
mkdir -p "$T/ckpt_old" && cp -r "$T/ckpt2/global_step100" "$T/ckpt_old/" && printf "global_step100\n" >"$T/ckpt_old/latest"
check "a checkpoint without the measurements (as written before they were kept)" python3 - "$T/ckpt_old/global_step100" <<'PY'
import json, sys, zlib
d = sys.argv[1]
m = json.load(open(f"{d}/manifest.json"))
edited = 0
for f in m["files"]:
    data = open(f"{d}/{f['name']}", "rb").read()
    if data.count(b'"measurements"') != 1:
        continue
    data = data.replace(b'"measurements"', b'"xeasurements"')
    open(f"{d}/{f['name']}", "wb").write(data)
    f["bytes"], f["crc32"] = len(data), "%08x" % zlib.crc32(data)
    edited += 1
json.dump(m, open(f"{d}/manifest.json", "w"), indent=2)
assert edited >= 1
PY
echo "{\"log_dir\": \"$T/old\", $ADAPTIVE, \"load\": \"$T/ckpt_old\", \"exit_interval\": 110}" >"$T/old.yml"
check "... loads and trains on" bash -c "$MPIEXEC -n 2 $TRAIN '$T/dp2.yml' '$T/old.yml' >'$T/old.out' 2>&1"
check "... with a notice naming what is missing" grep -q 'gradient_compression has no measurements' "$T/old.out"
unset NEOX_ADAPTIVE_MEASUREMENTS

echo '{"log_dir": "'"$T/x"'", "gradient_compression": "powersgd", "gradient_compression_interval": 5}' >"$T/bad1.yml"
check_fails "gradient_compression_interval without adaptive is refused by name" 2 \
    "gradient_compression_interval: only gradient_compression: adaptive" $MPIEXEC -n 2 $TRAIN -q "$T/dp2.yml" "$T/bad1.yml"
printf '%s\n' '{"iteration": 40, "scheme": "powersgd"}' '{"iteration": 30, "scheme": "fp8"}' >"$T/bad.jsonl"
echo "{\"log_dir\": \"$T/x\", $ADAPTIVE, \"gradient_compression_replay\": \"$T/bad.jsonl\"}" >"$T/bad2.yml"
check_fails "a malformed decisions file is refused naming the file and line" 2 \
    "gradient_compression_replay: .*bad.jsonl line 2" $MPIEXEC -n 2 $TRAIN -q "$T/dp2.yml" "$T/bad2.yml"
echo '{"iteration": 60, "buckets": ["dense", "onebit"]}' >"$T/bad3.jsonl"
echo "{\"log_dir\": \"$T/x\", $ADAPTIVE, \"gradient_compression_replay\": \"$T/bad3.jsonl\"}" >"$T/bad3.yml"
check_fails "a decisions file planning other buckets is refused" 2 \
    "gradient_compression_replay: .*bad3.jsonl plans 2 buckets; this run's gradients are in 7" \
    $MPIEXEC -n 2 $TRAIN -q "$T/dp2.yml" "$T/bad3.yml"
echo '{"iteration": 60, "buckets": ["dense", "powersgd:8"]}' >"$T/bad4.jsonl"
echo "{\"log_dir\": \"$T/x\", $ADAPTIVE, \"gradient_compression_replay\": \"$T/bad4.jsonl\"}" >"$T/bad4.yml"
check_fails "a PowerSGD rank above gradient_compression_rank is refused naming the file and line" 2 \
    "gradient_compression_replay: .*bad4.jsonl line 1" $MPIEXEC -n 2 $TRAIN -q "$T/dp2.yml" "$T/bad4.yml"
