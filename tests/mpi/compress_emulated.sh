# tests/mpi/compress_emulated.sh: the compressed and sparse gradient exchanges on the emulated device
# (their compute as backend ops, their messages through the emulated twin of the device collectives)
# on two data-parallel ranks, each equal bit for bit to the same run on CPU ranks: 1-bit Adam past
# its freeze step, gradient_compression onebit and powersgd, adaptive (a replayed schedule switching
# from PowerSGD to 1-bit, which hands PowerSGD's error back), sparse_gradients; and PowerSGD's error
# and Q through a checkpoint written and resumed on the emulated device. A tiny model, 6 steps each.
source tests/lib.sh

command -v "$MPIEXEC" >/dev/null || { skip "compressed exchanges on the emulated device" "$MPIEXEC is not installed"; exit 0; }
export OMP_NUM_THREADS=1
char_shakespeare "compressed exchanges on the emulated device" || exit 0

cat >"$T/tiny.yml" <<EOF
{
  "num_layers": 1, "hidden_size": 32, "num_attention_heads": 2, "seq_length": 32, "max_position_embeddings": 32,
  "pos_emb": "rotary", "no_weight_tying": true, "gradient_clipping": 1.0,
  "train_micro_batch_size_per_gpu": 2, "train_iters": 6, "eval_interval": 100, "eval_iters": 1,
  "log_interval": 1, "seed": 1234, "lr_decay_style": "constant",
  "data_path": "$T/char_text_document", "tokenizer_type": "CharLevelTokenizer"
}
EOF
ADAM='"optimizer": {"type": "Adam", "params": {"lr": 0.003, "betas": [0.9, 0.95], "eps": 1.0e-8}}'
run() {  # run NAME BACKEND EXTRA_JSON: 2 ranks, log_dir $T/NAME-BACKEND
    echo "{\"log_dir\": \"$T/$1-$2\", \"compute_backend\": \"$2\", $3}" >"$T/$1-$2.yml"
    timeout 120 $MPIEXEC -n 2 $TRAIN -q "$T/tiny.yml" "$T/$1-$2.yml"
}
same() {  # same NAME: the emulated ranks' metrics equal the CPU ranks'
    $LIB same "$T/$1-cpu/metrics.jsonl" "$T/$1-emulated/metrics.jsonl" train/lm_loss,train/grad_norm,test/lm_loss
}

echo '{"iteration": 2, "scheme": "powersgd"}' >"$T/schedule.jsonl"
echo '{"iteration": 4, "scheme": "onebit"}' >>"$T/schedule.jsonl"
declare -A CASES=(
    [onebitadam]='"optimizer": {"type": "OneBitAdam", "params": {"lr": 0.003, "freeze_step": 2}}'
    [onebit]="$ADAM, \"gradient_compression\": \"onebit\""
    [powersgd]="$ADAM, \"gradient_compression\": \"powersgd\", \"gradient_compression_rank\": 2"
    [adaptive]="$ADAM, \"gradient_compression\": \"adaptive\", \"gradient_compression_start\": 2, \"gradient_compression_interval\": 2, \"gradient_compression_replay\": \"$T/schedule.jsonl\""
    [sparse]="$ADAM, \"sparse_gradients\": true"
)
for name in onebitadam onebit powersgd adaptive sparse; do
    check "$name: 2 CPU ranks" run "$name" cpu "${CASES[$name]}"
    check "$name: 2 emulated ranks" run "$name" emulated "${CASES[$name]}"
    check "$name: the emulated ranks equal the CPU ranks bit for bit" same "$name"
done

CK=", \"save\": \"$T/ck\", \"load\": \"$T/ck\", \"checkpoint_factor\": 3"
check "powersgd: 3 steps and a checkpoint on the emulated ranks" run resumed emulated "${CASES[powersgd]}$CK, \"exit_interval\": 3"
check "powersgd: resumed on the emulated ranks for 3 more" run resumed emulated "${CASES[powersgd]}$CK"
check "powersgd: the resumed run equals the straight CPU run bit for bit" \
    $LIB same "$T/powersgd-cpu/metrics.jsonl" "$T/resumed-emulated/metrics.jsonl" train/lm_loss,train/grad_norm
