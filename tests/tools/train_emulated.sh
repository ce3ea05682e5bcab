# tests/tools/train_emulated.sh: neox-train's device paths on a machine without a GPU, through the
# emulated device (compute_backend: emulated, kernels/cpu/emulated.c): the CPU's ops on memory that
# faults when host code touches it other than through to_host/to_device. Training (fp32 with gradient
# accumulation and dropout, bfloat16, fp16 with forced overflows, SGD, Lion, madgrad_wd, SM3) must equal
# the CPU backend's bit for bit, resume must be exact, and a checkpoint must move between the two backends and continue exactly;
# so must 1-bit Adam's steps.
# AdamW's, SGD's and Lion's steps there read nothing back while they run (the late read, docs/cuda.md
# "Host waits in a step"): op_profile.json must count no blocking host wait inside any step, with every
# log line and metric still in its place (fp32 with clipping and accumulation, bf16, fp16 loss scaling
# with skips, SGD, Lion); madgrad_wd's host step still waits for its norm.
# ZeRO-Offload of the optimizer (offload_optimizer.device cpu, cpu_offload, optimizer.type cpu_adam)
# runs the optimizer on host copies of the weights and gradients: it must train bit for bit as
# without offload (so must GPT-NeoX's cpu_torch_adam, which builds the same CPU Adam), checkpoints
# must move between offloaded and not offloaded runs, and NVMe and a partial offload (ratio) are
# refused by name.
source tests/lib.sh

char_shakespeare "neox-train emulated device" || exit 0

cat >"$T/model.yml" <<EOF
{
  "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64, "max_position_embeddings": 64,
  "pos_emb": "rotary", "rotary_pct": 0.25, "gpt_j_residual": true, "no_weight_tying": true,
  "hidden_dropout": 0.1, "attention_dropout": 0.1,
  "min_lr": 0.0003, "weight_decay": 0.01, "lr_decay_style": "cosine", "warmup": 0.1, "gradient_clipping": 1.0,
  "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
  "train_iters": 20, "eval_interval": 10, "eval_iters": 2, "log_interval": 1,
  "data_path": "$T/char_text_document", "tokenizer_type": "CharLevelTokenizer"
}
EOF
PARAMS='"params": {"lr": 0.003, "betas": [0.9, 0.95], "eps": 1.0e-8}'
ADAM="\"optimizer\": {\"type\": \"Adam\", $PARAMS}"
run() {  # run NAME BACKEND JSON [OPTIMIZER]: trains model.yml on BACKEND with logs in $T/NAME (its output also in $T/NAME.out)
    echo "{\"log_dir\": \"$T/$1\", \"compute_backend\": \"$2\", ${4:-$ADAM} $3}" >"$T/$1.yml"
    $TRAIN "$T/model.yml" "$T/$1.yml" >"$T/$1.out" 2>&1
    local status=$?
    cat "$T/$1.out" >&2
    return $status
}
KEYS=train/lm_loss,train/grad_norm,train/learning_rate,validation/lm_loss,test/lm_loss
ALL_KEYS=$KEYS,train/loss_scale,train/skipped_iterations,train/nan_iterations
PROFILE=', "wall_clock_breakdown": true'
OVF=', "fp16": {"enabled": true, "initial_scale_power": 26, "loss_scale_window": 5}'
SGD='"optimizer": {"type": "SGD", "params": {"lr": 0.01, "momentum": 0.9}}'
LION='"optimizer": {"type": "lion", "params": {"lr": 0.0003, "betas": [0.9, 0.99]}}'
MADGRAD='"optimizer": {"type": "madgrad_wd", "params": {"lr": 0.01, "momentum": 0.9}}'
SM3='"optimizer": {"type": "sm3", "params": {"lr": 0.01, "momentum": 0.9, "beta": 0.5}}'
for spec in "fp32:" "bf16:, \"precision\": \"bfloat16\"" "fp16:$OVF" "sgd:" "lion:" "madgrad:" "sm3:"; do
    name=${spec%%:*} extra=${spec#*:} opt=$ADAM
    case $name in sgd) opt=$SGD ;; lion) opt=$LION ;; madgrad) opt=$MADGRAD ;; sm3) opt=$SM3 ;; esac
    check "$name: 20 steps on the CPU backend" run "cpu-$name" cpu "$extra" "$opt"
    check "$name: 20 steps on the emulated device" run "emu-$name" emulated "$extra$PROFILE" "$opt"
    check "$name: emulated device equals the CPU bit for bit" $LIB same "$T/cpu-$name/metrics.jsonl" \
        "$T/emu-$name/metrics.jsonl" "$ALL_KEYS"
done
# The log's lines in the same order: iterations, evaluations, the end.
log_order() { grep -o 'iteration *[0-9]*/\|validation results at [a-z0-9 ]*\|test results at [a-z ]*' "$1"; }
for name in fp32 bf16 fp16 sgd lion; do
    check "$name: no blocking host wait inside any of the 20 steps on the emulated device" python3 -c "
import json, sys
w = json.load(open(sys.argv[1]))['host_waits']
print('# host waits:', w, file=sys.stderr)
sys.exit(0 if len(w['per_step']) == 20 and w['in_steps'] == 0 and not any(w['per_step']) and w['all'] > 0 else 1)" \
        "$T/emu-$name/op_profile.json"
    check "$name: the log lines come in the CPU run's order" cmp <(log_order "$T/cpu-$name.out") <(log_order "$T/emu-$name.out")
    check "$name: every step's timer line is printed, under its own iteration" python3 -c "
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '\"train/lm_loss\"' in l]
sys.exit(0 if len(recs) == 20 and all(r.get('timers/forward', 0) > 0 and r.get('timers/optimizer', 0) > 0 for r in recs) else 1)" \
        "$T/emu-$name/metrics.jsonl"
done
check "madgrad: the host's step waits for its norm (it has no device step)" python3 -c "
import json, sys
sys.exit(0 if json.load(open(sys.argv[1]))['host_waits']['in_steps'] >= 20 else 1)" "$T/emu-madgrad/op_profile.json"
check "fp32: clipping changed some steps (gradient norm above gradient_clipping 1.0)" python3 -c "
import json, sys
norms = [json.loads(l).get('train/grad_norm', 0) for l in open(sys.argv[1])]
sys.exit(0 if max(norms) > 1.0 else 1)" "$T/emu-fp32/metrics.jsonl"
check "fp16 on the emulated device skipped overflowing steps" \
    grep -q '"train/skipped_iterations":1' "$T/emu-fp16/metrics.jsonl"

# Checkpoints: 10 steps on one backend, 10 more on the other, against the straight CPU run.
ck() { echo ", \"save\": \"$T/$1\", \"load\": \"$T/$1\", \"checkpoint_factor\": 10 $2"; }
check "emulated: 10 steps and a checkpoint" run emu-first emulated "$(ck ck1 ', "exit_interval": 10')"
check "cpu: resumes the emulated device's checkpoint for 10 more" run emu-first cpu "$(ck ck1)"
check "emulated -> cpu: bit-identical to the straight run" $LIB same "$T/cpu-fp32/metrics.jsonl" \
    "$T/emu-first/metrics.jsonl" "$KEYS"
check "cpu: 10 steps and a checkpoint" run cpu-first cpu "$(ck ck2 ', "exit_interval": 10')"
check "emulated: resumes the CPU's checkpoint for 10 more" run cpu-first emulated "$(ck ck2)"
check "cpu -> emulated: bit-identical to the straight run" $LIB same "$T/cpu-fp32/metrics.jsonl" \
    "$T/cpu-first/metrics.jsonl" "$KEYS"

# 1-bit Adam: its moments and update are the backend's ops (past freeze_step the variance frozen).
ONEBIT='"optimizer": {"type": "OneBitAdam", "params": {"lr": 0.001, "freeze_step": 3}}'
check "1-bit Adam: 8 steps on the CPU backend" run cpu-onebit cpu ', "exit_interval": 8' "$ONEBIT"
check "1-bit Adam: 8 steps on the emulated device" run emu-onebit emulated ', "exit_interval": 8' "$ONEBIT"
check "1-bit Adam: emulated device equals the CPU bit for bit" $LIB same "$T/cpu-onebit/metrics.jsonl" \
    "$T/emu-onebit/metrics.jsonl" train/lm_loss,train/grad_norm

# ZeRO-Offload of the optimizer, against emu-fp32 (the same run without offload).
CPU_ADAM="\"optimizer\": {\"type\": \"cpu_adam\", $PARAMS}"
CPU_TORCH_ADAM="\"optimizer\": {\"type\": \"cpu_torch_adam\", $PARAMS}"
DEVICE=', "zero_optimization": {"offload_optimizer": {"device": "cpu", "pin_memory": true}}'
OLD=', "zero_optimization": {"cpu_offload": true}'

check "emulated without offload: the optimizer stays on the device" bash -c "grep -q 'ZeRO stage 0' '$T/emu-fp32.out' && ! grep -q 'optimizer offloaded' '$T/emu-fp32.out'"
for name in cpu_adam cpu_torch_adam device_cpu cpu_offload; do
    extra="" opt=""
    case $name in
    cpu_adam) opt=$CPU_ADAM ;; cpu_torch_adam) opt=$CPU_TORCH_ADAM ;; device_cpu) extra=$DEVICE ;; cpu_offload) extra=$OLD ;;
    esac
    check "$name: 20 steps on the emulated device" run "emu-$name" emulated "$extra" "$opt"
    check "$name: the optimizer is offloaded" grep -q "ZeRO stage 0, optimizer offloaded to the host" "$T/emu-$name.out"
    check "$name: equals the run without offload bit for bit" $LIB same "$T/emu-fp32/metrics.jsonl" \
        "$T/emu-$name/metrics.jsonl" "$KEYS"
done

check "offload_optimizer.pin_memory true: the host buffers are pinned" grep -q "optimizer offloaded to the host (pinned buffers)" "$T/emu-device_cpu.out"
check "cpu_offload (pin_memory false): the host buffers are not pinned" bash -c "! grep -q 'pinned buffers' '$T/emu-cpu_offload.out'"

# Device bytes saved: the plan moves the optimizer state (8 bytes per parameter with Adam) and the host
# copies of the weights and gradients (8 more) to "offloaded", and the emulated device's measured peak
# falls by the Adam moments (give or take a few pages: the run without offload also holds the late
# read's buffers, which an offloaded step does not use).
check "offloaded: no optimizer state on the device, planned or measured" python3 - "$T/emu-fp32" "$T/emu-device_cpu" <<'PY'
import json, sys
def peak(run):
    return [json.loads(l) for l in open(f"{run}/metrics.jsonl") if "memory/device_peak_bytes" in l][-1]["memory/device_peak_bytes"]
def plan(run):
    return json.load(open(f"{run}/memory_plan.json"))["ranks"][0]
on, off = plan(sys.argv[1]), plan(sys.argv[2])
params = on["parameters"] / 4
saved = peak(sys.argv[1]) - peak(sys.argv[2])
print(f"# params {params:.0f}; optimizer planned {on['optimizer']} -> {off['optimizer']}, offloaded {off['offloaded']}; device peak saved {saved:.0f} B", file=sys.stderr)
sys.exit(0 if on["optimizer"] == 8 * params and off["optimizer"] == 0 and off["offloaded"] >= 16 * params
         and 8 * params <= saved <= 8 * params + 4 * 4096 else 1)
PY

# Offload with bfloat16 (the 16-bit copies remade per unit as forward waits for its weights), fp16
# (overflowing steps skipped while gradients were on their way) and SGD (clipped on the host copy).
for spec in "bf16:, \"precision\": \"bfloat16\"" "fp16:$OVF" "sgd:"; do
    name=${spec%%:*} extra=${spec#*:} opt=$ADAM
    [ "$name" = sgd ] && opt=$SGD
    check "$name offloaded: 20 steps on the emulated device" run "off-$name" emulated "$extra$DEVICE" "$opt"
    check "$name offloaded: equals the run without offload bit for bit" $LIB same "$T/emu-$name/metrics.jsonl" \
        "$T/off-$name/metrics.jsonl" "$KEYS"
done
check "sgd: clipping changed some steps (gradient norm above gradient_clipping 1.0)" python3 -c "
import json, sys
norms = [json.loads(l).get('train/grad_norm', 0) for l in open(sys.argv[1])]
sys.exit(0 if max(norms) > 1.0 else 1)" "$T/off-sgd/metrics.jsonl"

# What the copies did (comm_stats.json): with pinned buffers every gradient queued to the host while
# backward ran (one rank: each parameter's gradient is final when backward reports it), every unit (embedding, 2
# layers, head) queued back after each update, and waited for by the forward that read it next.
offload_stats() {  # offload_stats RUN SKIPS: checks RUN's comm_stats.json "offload" entry (SKIPS 1: it skipped steps)
    python3 - "$T/$1/comm_stats.json" "$T/$1/metrics.jsonl" "$2" <<'PY'
import json, sys
o = json.load(open(sys.argv[1]))["ranks"][0]["offload"]
skipped = sum(json.loads(l).get("train/skipped_iterations", 0) for l in open(sys.argv[2]))
updates = 20 - skipped
print(o, "skipped:", skipped, file=sys.stderr)
ok = ((skipped > 0) == (sys.argv[3] == "1") and o["steps"] == updates and o["units_copied"] == 4 * updates and o["grad_bytes"] > 0
      and o["grad_bytes_in_backward"] > 0 and o["grad_bytes"] % 20 == 0
      and 0 < o["units_waited_by_forward"] <= o["units_copied"])
sys.exit(0 if ok else 1)
PY
}
check "fp32 offloaded: gradients streamed in backward, each unit's weights waited for by forward" offload_stats emu-device_cpu 0
check "fp16 offloaded: a skipped step updates and copies no weights" offload_stats off-fp16 1
check "fp32 offloaded: every gradient byte went to the host during backward" python3 -c "
import json, sys
o = json.load(open(sys.argv[1]))['ranks'][0]['offload']
sys.exit(0 if o['grad_bytes_in_backward'] == o['grad_bytes'] else 1)" "$T/emu-device_cpu/comm_stats.json"
check "cpu_offload (pageable host memory): the gradients go to the host at the step, none during backward" python3 -c "
import json, sys
o = json.load(open(sys.argv[1]))['ranks'][0]['offload']
sys.exit(0 if o['grad_bytes_in_backward'] == 0 < o['grad_bytes'] else 1)" "$T/emu-cpu_offload/comm_stats.json"

# Checkpoints: 10 steps offloaded, 10 more without, and the reverse, against the straight run.
check "offloaded: 10 steps and a checkpoint" run off-first emulated "$(ck ck3 ", \"exit_interval\": 10$DEVICE")"
check "not offloaded: resumes for 10 more" run off-first emulated "$(ck ck3)"
check "offloaded -> not: bit-identical to the straight run" $LIB same "$T/emu-fp32/metrics.jsonl" \
    "$T/off-first/metrics.jsonl" "$KEYS"
check "not offloaded: 10 steps and a checkpoint" run on-first emulated "$(ck ck4 ', "exit_interval": 10')"
check "offloaded: resumes for 10 more" run on-first emulated "$(ck ck4 "$DEVICE")"
check "not -> offloaded: bit-identical to the straight run" $LIB same "$T/emu-fp32/metrics.jsonl" \
    "$T/on-first/metrics.jsonl" "$KEYS"

check_fails "cpu backend: a notice says the optimizer is in host memory already" 0 \
    "nothing to move, compute_backend cpu keeps the optimizer in host memory already" run cpu cpu "" "$CPU_ADAM"
check_fails "offload to NVMe is refused by name" 2 "zero_optimization.offload_optimizer.device': ZeRO optimizer-state offload to NVMe 'nvme' is not supported" \
    run nvme emulated ', "zero_optimization": {"offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}}'
check_fails "a partial offload (ratio) is refused by name" 2 "zero_optimization.offload_optimizer.ratio': partial ZeRO optimizer offload" \
    run ratio emulated ', "zero_optimization": {"offload_optimizer": {"device": "cpu", "ratio": 0.5}}'
