# tests/mpi/memory.sh: the start-up memory plan, per parameter, against the closed forms. A model
# of 8 layers, hidden 256 (6.4M parameters) starts at dp4 under ZeRO stages 0, 1, 2 and 3 in fp32,
# bfloat16 and fp16 (train_iters 0: the plan only), and rank 0's planned parameters, 16-bit copies,
# gradients and optimizer state per parameter must be 4 (stage 3: 4/D plus one layer held whole), 0
# or 2 (stage 3: of the layer), 4 (stages 0, 1) or 4/D plus two buckets (stages 2, 3), and 8 or 8/D
# (Adam's moments) bytes; at dp2 communication_data_type bf16 plans a 2-byte wire copy per
# parameter. tests/mpi/memory_check.py prints the table docs/memory.md shows. Each rank's measured
# peak resident set at the start of a stage-3 run of a larger model (25M parameters, one layer
# gathered at a time) stays within its plan plus the libraries' own memory (a small model's peak):
# the start-up initialises only the rank's partition, never the whole model. With untied 50304-row
# embeddings larger than a bucket, stages 2 and 3 at dp4 plan their gradients by the formula of
# memory_check.py split (the partition, two buckets, one product's output: no whole embedding) and
# each rank's measured peak stays within its plan plus the libraries'. The same vocabulary-heavy
# model at dp2 with GPT-NeoX's default zero_optimization, and with a small
# stage3_max_live_parameters, plans no more parameter bytes under stage 3 than under stage 0, each
# rank's peak within its plan plus the libraries'. A dp2 run's
# log_dir/memory_peaks.json holds each rank's measured peak (as the process measures it from
# outside) and planned total, and its metrics the largest rank's peak at each log. At tp2, with and
# without sequence_parallel and checkpoint_activations, memory_plan.json's activations per layer
# follow the formula of memory_check.py activations and each rank's measured peak over two steps
# stays within its plan plus the libraries'. Under context_parallel_size 2 a layer keeps half the
# sequence's activations and the plan holds the whole sequence's keys and values besides.
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
# Stage 3 gathering one layer at a time: nothing persistent, prefetched or kept between uses.
ONE='"stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 0, "stage3_max_reuse_distance": 0'
zero() { echo ", \"zero_optimization\": {\"stage\": $1, \"reduce_bucket_size\": $BUCKET${2:+, $2}}"; }
for stage in 0 1 2 3; do
    s3=""
    [ "$stage" = 3 ] && s3=$ONE
    plan "fp32-s$stage" 4 "$(zero $stage "$s3")"
    plan "bf16-s$stage" 4 "$(zero $stage "$s3"), \"precision\": \"bfloat16\""
    plan "fp16-s$stage" 4 "$(zero $stage "$s3"), \"fp16\": {\"enabled\": true}"
done
check_output "bytes per parameter of every stage and precision follow the closed forms (within 2%)" \
    "^\| 3 \| fp16 " python3 tests/mpi/memory_check.py table "$T" 4 "$BUCKET" 256
sed 's/^/# /' "$_last_out"
# (One bucket of the whole model: MPI's two temporaries of the bucket in flight, at the wire's 2 bytes, add 4.)
plan wire 2 ", \"zero_optimization\": {\"stage\": 0, \"reduce_bucket_size\": 1000000000}, \"communication_data_type\": \"bf16\""
check "communication_data_type bf16 plans a 2-byte wire copy per parameter (and 16-bit MPI temporaries)" \
    python3 tests/mpi/memory_check.py wire "$T/wire.out"

# Start-up under stage 3: each rank initialises only its partition of the weights, so its measured
# peak stays within its plan (the partition, one layer, the buckets, optimizer state, activations)
# plus what the libraries hold (a tiny model's peak), where holding the whole model once would add
# its 102 MB of fp32 weights.
# measured NAME LAYERS HIDDEN: a stage-3 plan-only run on 4 ranks with every rank's peak resident set.
measured() {
    cat >"$T/$1.yml" <<EOF2
{ "num_layers": $2, "hidden_size": $3, "num_attention_heads": 8, "seq_length": 64, "max_position_embeddings": 64,
  "train_micro_batch_size_per_gpu": 1, "train_iters": 0, "do_valid": false, "do_test": false,
  "optimizer": {"type": "Adam", "params": {"lr": 0.001}}, "data_path": "$T/docs_text_document",
  "tokenizer_type": "CharLevelTokenizer" $(zero 3 "$ONE") }
EOF2
    check "$1: plan on 4 ranks, peak resident set per rank" bash -c "'$MPIEXEC' -n 4 python3 tests/mpi/peak_rss.py \
        '$T/$1.rss' '$TRAIN' '$T/$1.yml' >'$T/$1.out' 2>&1"
}
measured small 1 64
measured big 8 512
check_output "stage 3 starts within its plan: no rank holds the whole model (25M parameters, dp4)" "^rank 3" \
    python3 tests/mpi/memory_check.py startup "$T/big" "$T/small" 4
sed 's/^/# /' "$_last_out"

# Embeddings larger than a bucket (2 layers, hidden 128, GPT-NeoX's 50304-row vocabulary pinned,
# untied: 6.4M elements, 25.8 MB each, against reduce_bucket_size 300000) under stages 2 and 3 at
# dp4, 2 steps: buckets are cut at 300000 elements and the output layer's gradient is made in pieces,
# so the planned gradients per rank are the partition, two buckets and one product's output (the
# formula of memory_check.py split, within 10%), not a whole embedding; each rank's measured peak
# stays within its plan, which counts MPI's temporaries (communication), plus the libraries'.
embeddings() {  # embeddings NAME STAGE ITERS [ZERO SETTINGS]
    cat >"$T/$1.yml" <<EOF2
{ "num_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "seq_length": 64, "max_position_embeddings": 64,
  "no_weight_tying": true, "pinned_padded_vocab_size": 50304, "train_micro_batch_size_per_gpu": 2,
  "train_iters": $3, "do_valid": false, "do_test": false, "optimizer": {"type": "Adam", "params": {"lr": 0.001}},
  "log_dir": "$T/$1/log", "data_path": "$T/docs_text_document", "tokenizer_type": "CharLevelTokenizer" $(zero "$2" "${4:-$([ "$2" = 3 ] && echo "$ONE")}") }
EOF2
    check "$1: stage $2 on 4 ranks, peak resident set per rank" bash -c "OMP_NUM_THREADS=1 '$MPIEXEC' -n 4 python3 \
        tests/mpi/peak_rss.py '$T/$1.rss' '$TRAIN' '$T/$1.yml' >'$T/$1.out' 2>&1"
}
embeddings emb-s0 0 0
# Stages 0 and 1 keep whole tensors per bucket (an embedding is one bucket of 25.8 MB), and the plan's
# communication region counts MPI's temporaries of the largest bucket: every rank's peak within its
# plan + libraries, with the buckets all started at the end of backward (stage 0) or as they become
# ready (stage 1 with overlap_comm).
for s in 0 1; do
    [ $s = 0 ] && embeddings emb-t0 0 2 || embeddings emb-t1 1 2 '"overlap_comm": true'
    check_output "stage $s, whole-tensor buckets: every rank's peak within its plan + libraries" "^rank 3" \
        python3 tests/mpi/memory_check.py startup "$T/emb-t$s" "$T/small" 4
    sed 's/^/# /' "$_last_out"
done
for stage in 2 3; do
    embeddings "emb-s$stage" "$stage" 2
    check_output "stage $stage, embeddings over the bucket size: gradients per rank planned by the formula, no whole embedding, peak within plan + libraries" \
        "^rank 3" python3 tests/mpi/memory_check.py split "$T/emb-s$stage" "$T/small" "$T/emb-s0" 4 "$BUCKET" 128 50304 128
    sed 's/^/# /' "$_last_out"
done

# A vocabulary-heavy model (the one above: its two embeddings are 97% of its 13.3M parameters) at
# dp2 with GPT-NeoX's default zero_optimization (only the stage set: reduce_bucket_size 5e8 and
# DeepSpeed's stage-3 defaults), 2 steps: stage 3 holds whole beside its partition at most what stage
# 0 holds beyond it, so it gathers the embeddings in pieces and plans no more parameter bytes than
# stage 0 (before, both embeddings whole at once: 1.5 times stage 0's); a small
# stage3_max_live_parameters (1M elements) gathers smaller pieces and plans fewer. Each rank's
# measured peak stays within its plan plus the libraries'.
vocab_heavy() {  # vocab_heavy NAME STAGE [STAGE-3 KEYS]
    cat >"$T/$1.yml" <<EOF2
{ "num_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "seq_length": 64, "max_position_embeddings": 64,
  "no_weight_tying": true, "pinned_padded_vocab_size": 50304, "train_micro_batch_size_per_gpu": 2,
  "train_iters": 2, "do_valid": false, "do_test": false, "optimizer": {"type": "Adam", "params": {"lr": 0.001}},
  "log_dir": "$T/$1/log", "data_path": "$T/docs_text_document", "tokenizer_type": "CharLevelTokenizer",
  "zero_optimization": {"stage": $2${3:+, $3}} }
EOF2
    check "$1: stage $2 on 2 ranks, peak resident set per rank" bash -c "OMP_NUM_THREADS=1 '$MPIEXEC' -n 2 python3 \
        tests/mpi/peak_rss.py '$T/$1.rss' '$TRAIN' '$T/$1.yml' >'$T/$1.out' 2>&1"
}
vocab_heavy vh-s0 0
vocab_heavy vh-s3 3
vocab_heavy vh-live 3 '"stage3_max_live_parameters": 1000000'
for run in vh-s3 vh-live; do
    check_output "$run: planned parameters per rank at most stage 0's, peak within the plan + libraries" "^rank 1" \
        python3 tests/mpi/memory_check.py bounded "$T/$run" "$T/vh-s0" "$T/small" 2
    sed 's/^/# /' "$_last_out"
done

# Every rank's measured peak as the trainer reports it: log_dir/memory_peaks.json at the end (each
# rank's peak resident set beside its planned total), and the largest rank's peak as a gauge at each
# log, against the wrapper's measure of each process.
cat >"$T/peaks.yml" <<EOF2
{ "num_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "seq_length": 64, "max_position_embeddings": 64,
  "train_micro_batch_size_per_gpu": 2, "train_iters": 4, "log_interval": 2, "eval_interval": 100, "eval_iters": 1,
  "optimizer": {"type": "Adam", "params": {"lr": 0.001}}, "data_path": "$T/docs_text_document",
  "tokenizer_type": "CharLevelTokenizer", "log_dir": "$T/peaks/log" $(zero 1) }
EOF2
check "a dp2 run with the peak resident set of each rank measured outside" bash -c "'$MPIEXEC' -n 2 python3 \
    tests/mpi/peak_rss.py '$T/peaks.rss' '$TRAIN' '$T/peaks.yml' >'$T/peaks.out' 2>&1"
check_output "memory_peaks.json holds every rank's peak and plan; the metrics carry the largest rank's peak" "^rank 1" \
    python3 tests/mpi/memory_check.py peaks "$T/peaks" 2
sed 's/^/# /' "$_last_out"

# Activations per layer at tp2 (4 layers, hidden 256, 8 heads, sequence 256, micro-batch 2), with and
# without sequence_parallel and checkpoint_activations, 2 steps each: the plan by layer against the
# formula, and each rank's measured peak within its plan plus the libraries' (a tiny tp2 run's peak).
# act NAME ITERS EXTRA: a tp2 run of that model with every rank's peak resident set.
act() {
    cat >"$T/$1.yml" <<EOF2
{ "num_layers": ${LAYERS:-4}, "hidden_size": ${HIDDEN:-256}, "num_attention_heads": 8, "seq_length": ${SEQ:-256},
  "max_position_embeddings": 256, "train_micro_batch_size_per_gpu": ${MICRO:-2}, "train_iters": $2, "do_valid": false,
  "do_test": false, "log_dir": "$T/$1/log", "optimizer": {"type": "Adam", "params": {"lr": 0.001}},
  "model_parallel_size": ${MP:-2}, "data_path": "$T/docs_text_document", "tokenizer_type": "CharLevelTokenizer" $3 }
EOF2
    check "$1: 2 ranks, peak resident set per rank" bash -c "'$MPIEXEC' -n 2 python3 tests/mpi/peak_rss.py \
        '$T/$1.rss' '$TRAIN' '$T/$1.yml' >'$T/$1.out' 2>&1"
}
SP=', "sequence_parallel": true' CK=', "checkpoint_activations": true'
LAYERS=1 HIDDEN=64 SEQ=64 MICRO=1 act tp2tiny 2 ""
PA=', "partition_activations": true'  # (sequence parallelism keeps each rank's rows already: a notice says so)
for spec in "tp2 ''" "tp2sp '$SP'" "tp2ck '$CK'" "tp2spck '$SP$CK$PA'"; do
    eval "set -- $spec"
    act "$1" 2 "$2"
    check_output "$1: each rank's measured peak within its plan plus the libraries'" "^rank 1" \
        python3 tests/mpi/memory_check.py startup "$T/$1" "$T/tp2tiny" 2
    sed 's/^/# /' "$_last_out"
done
check "sequence_parallel says partition_activations has no effect beside it" \
    grep -q "no effect in this run: partition_activations (sequence_parallel" "$T/tp2spck.out"
check_output "activations per layer follow the formula at tp2, with and without sequence_parallel" "saved" \
    python3 tests/mpi/memory_check.py activations "$T" 2 2 256 256 8 tp2 tp2sp tp2ck tp2spck
sed 's/^/# /' "$_last_out"
# Context parallelism (cp2 on the same two ranks, no tensor parallelism, rotary positions): each layer keeps the
# activations of half the sequence (the formula at seq/2, attention reading q, k, v in the QKV output
# as on one rank), and the plan's shared part holds the whole sequence's keys and values (2 of B x seq
# x C floats) and their gradients' room, shared with the MLP's backward scratch; each rank's measured
# peak stays within its plan plus the libraries'.
MP=1 act cp2 2 ', "context_parallel_size": 2, "pos_emb": "rotary"'
check_output "cp2: each rank's measured peak within its plan plus the libraries'" "^rank 1" \
    python3 tests/mpi/memory_check.py startup "$T/cp2" "$T/tp2tiny" 2
sed 's/^/# /' "$_last_out"
check_output "cp2: activations per layer follow the formula at half the sequence, the gathered keys and values planned" \
    "gathered" python3 tests/mpi/memory_check.py context "$T/cp2" 2 2 256 256 8 2
sed 's/^/# /' "$_last_out"
