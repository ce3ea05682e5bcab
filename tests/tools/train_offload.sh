# tests/tools/train_offload.sh: ZeRO-Offload of the optimizer (offload_optimizer.device cpu,
# cpu_offload, optimizer.type cpu_adam) on the emulated device, whose memory faults when host code
# touches it: the optimizer then runs on host copies of the weights and gradients, and training must
# equal the run without offload bit for bit (the same ops). Checkpoints move between offloaded and
# not offloaded runs and continue exactly; on the CPU backend a notice says that nothing moves; NVMe,
# a partial offload (ratio) and cpu_torch_adam are refused by name.
source tests/lib.sh

TRAIN=$NEOX_BIN/neox-train
LIB="python3 tests/tools/train_lib.py"
T=$TEST_TMP
char_shakespeare "neox-train optimizer offload" || exit 0

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
CPU_ADAM="\"optimizer\": {\"type\": \"cpu_adam\", $PARAMS}"
run() {  # run NAME BACKEND JSON [OPTIMIZER]: trains model.yml on BACKEND with logs in $T/NAME (its output also in $T/NAME.out)
    echo "{\"log_dir\": \"$T/$1\", \"compute_backend\": \"$2\", ${4:-$ADAM} $3}" >"$T/$1.yml"
    $TRAIN "$T/model.yml" "$T/$1.yml" >"$T/$1.out" 2>&1
    local status=$?
    cat "$T/$1.out" >&2
    return $status
}
KEYS=train/lm_loss,train/grad_norm,train/learning_rate,validation/lm_loss,test/lm_loss
DEVICE=', "zero_optimization": {"offload_optimizer": {"device": "cpu", "pin_memory": true}}'
OLD=', "zero_optimization": {"cpu_offload": true}'

check "emulated, no offload: 20 steps" run emu emulated ""
check "emulated without offload: the optimizer stays on the device" bash -c "grep -q 'ZeRO stage 0' '$T/emu.out' && ! grep -q offloaded '$T/emu.out'"
for name in cpu_adam device_cpu cpu_offload; do
    extra="" opt=""
    case $name in cpu_adam) opt=$CPU_ADAM ;; device_cpu) extra=$DEVICE ;; cpu_offload) extra=$OLD ;; esac
    check "$name: 20 steps on the emulated device" run "emu-$name" emulated "$extra" "$opt"
    check "$name: the optimizer is offloaded" grep -q "ZeRO stage 0, optimizer offloaded to the host" "$T/emu-$name.out"
    check "$name: equals the run without offload bit for bit" $LIB same "$T/emu/metrics.jsonl" \
        "$T/emu-$name/metrics.jsonl" "$KEYS"
done

# Checkpoints: 10 steps offloaded, 10 more without, and the reverse, against the straight run.
ck() { echo ", \"save\": \"$T/$1\", \"load\": \"$T/$1\", \"checkpoint_factor\": 10 $2"; }
check "offloaded: 10 steps and a checkpoint" run off-first emulated "$(ck ck1 ", \"exit_interval\": 10$DEVICE")"
check "not offloaded: resumes for 10 more" run off-first emulated "$(ck ck1)"
check "offloaded -> not: bit-identical to the straight run" $LIB same "$T/emu/metrics.jsonl" \
    "$T/off-first/metrics.jsonl" "$KEYS"
check "not offloaded: 10 steps and a checkpoint" run on-first emulated "$(ck ck2 ', "exit_interval": 10')"
check "offloaded: resumes for 10 more" run on-first emulated "$(ck ck2 "$DEVICE")"
check "not -> offloaded: bit-identical to the straight run" $LIB same "$T/emu/metrics.jsonl" \
    "$T/on-first/metrics.jsonl" "$KEYS"

check_fails "cpu backend: a notice says the optimizer is in host memory already" 0 \
    "nothing to move, compute_backend cpu keeps the optimizer in host memory already" run cpu cpu "" "$CPU_ADAM"
check_fails "offload to NVMe is refused by name" 2 "zero_optimization.offload_optimizer.device': ZeRO optimizer-state offload to NVMe 'nvme' is not supported" \
    run nvme emulated ', "zero_optimization": {"offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}}'
check_fails "a partial offload (ratio) is refused by name" 2 "zero_optimization.offload_optimizer.ratio': partial ZeRO optimizer offload" \
    run ratio emulated ', "zero_optimization": {"offload_optimizer": {"device": "cpu", "ratio": 0.5}}'
check_fails "cpu_torch_adam is refused by name" 2 "optimizer 'cpu_torch_adam' is not supported by neox.c" \
    run torch emulated "" "\"optimizer\": {\"type\": \"cpu_torch_adam\", $PARAMS}"
