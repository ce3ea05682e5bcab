# tests/mpi/memory.sh: the start-up memory plan, per parameter, against the closed forms. A model
# of 8 layers, hidden 256 (6.4M parameters) starts at dp4 under ZeRO stages 0, 1 and 2 in fp32,
# bfloat16 and fp16 (train_iters 0: the plan only), and rank 0's planned parameters, 16-bit copies,
# gradients and optimizer state per parameter must be 4, 0 or 2, 4 (stages 0, 1) or 4/D plus two
# buckets (stage 2), and 8 or 8/D (Adam's moments) bytes; at dp2 communication_data_type bf16 plans
# a 2-byte wire copy per parameter. tests/mpi/memory_check.py prints the table docs/memory.md shows.
source tests/lib.sh

command -v "$MPIEXEC" >/dev/null || { skip "memory plan per parameter" "$MPIEXEC is not installed"; exit 0; }

words_dataset 200 7

BUCKET=300000
# plan NAME RANKS EXTRA: the start-up report of a run that plans and stops, in $T/NAME.out.
plan() {
    cat >"$T/$1.yml" <<EOF2
{ "num_layers": 8, "hidden_size": 256, "num_attention_heads": 8, "seq_length": 64, "max_position_embeddings": 64,
  "train_micro_batch_size_per_gpu": 1, "train_iters": 0, "do_valid": false, "do_test": false,
  "optimizer": {"type": "Adam", "params": {"lr": 0.001}},
  "data_path": "$T/docs_text_document", "tokenizer_type": "CharLevelTokenizer" $3 }
EOF2
    check "$1: plan on $2 ranks" bash -c "'$MPIEXEC' -n $2 '$TRAIN' '$T/$1.yml' >'$T/$1.out' 2>&1"
}
zero() { echo ", \"zero_optimization\": {\"stage\": $1, \"reduce_bucket_size\": $BUCKET}"; }
for stage in 0 1 2; do
    plan "fp32-s$stage" 4 "$(zero $stage)"
    plan "bf16-s$stage" 4 "$(zero $stage), \"precision\": \"bfloat16\""
    plan "fp16-s$stage" 4 "$(zero $stage), \"fp16\": {\"enabled\": true}"
done
check_output "bytes per parameter of every stage and precision follow the closed forms (within 2%)" \
    "^\| 2 \| fp16 " python3 tests/mpi/memory_check.py table "$T" 4 "$BUCKET"
sed 's/^/# /' "$_last_out"
plan wire 2 "$(zero 0), \"communication_data_type\": \"bf16\""
check "communication_data_type bf16 plans a 2-byte wire copy per parameter" \
    python3 tests/mpi/memory_check.py wire "$T/wire.out"
