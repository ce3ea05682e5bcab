# tests/mpi/profile.sh: profile and memory_profiling across ranks (docs/metrics.md, "Profiling a
# run"). Under dp2 (with the overlapped, bucketed gradient reduction), dp2 on the emulated device
# (the device collectives' twin) and tp2, every rank writes log_dir/trace_rankN.json: each parses,
# its ranges nest and it holds the window's two steps; the collectives on the parallel group (data
# or model) are the same operations of the same sizes in the same order on both ranks, so the ranks'
# tracks line up call for call. Each rank's memory snapshots equal its row of memory_plan.json.
source tests/lib.sh

need_mpi "profiling across ranks" || exit 0

words_dataset 200 7

# L=2 H=64, vocabulary 128 (the char tokenizer's, padded for tp2), untied.
cat >"$T/model.yml" <<YML
{
  "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32, "max_position_embeddings": 32,
  "no_weight_tying": true, "optimizer": {"type": "Adam", "params": {"lr": 0.001}},
  "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "train_iters": 3, "log_interval": 1,
  "do_valid": false, "do_test": false, "split": "100,0,0", "data_path": "$T/docs_text_document",
  "tokenizer_type": "CharLevelTokenizer", "profile": true, "profile_step_start": 1, "profile_step_stop": 3,
  "memory_profiling": true
}
YML
BUCKETS='"zero_optimization": {"stage": 0, "overlap_comm": true, "reduce_bucket_size": 20000}'
for spec in "dp2 data '$BUCKETS'" "dp2emulated data '$BUCKETS, \"compute_backend\": \"emulated\"'" \
            "tp2 model '\"model_parallel_size\": 2'"; do
    eval "set -- $spec"
    echo "{\"log_dir\": \"$T/$1\", \"memory_profiling_path\": \"$T/$1-mem\", $3}" >"$T/$1.yml"
    check "$1: trains on 2 ranks with profile and memory_profiling" \
        bash -c "'$MPIEXEC' -n 2 '$TRAIN' '$T/model.yml' '$T/$1.yml' >'$T/$1.out' 2>&1"
    check "$1: each rank's trace parses, nests and holds steps 2 and 3" \
        python3 tests/tools/profile_check.py trace "$T/$1" 2 1 3 2 0-1
    check "$1: the $2 group's collectives line up on both ranks" \
        python3 tests/tools/profile_check.py collectives "$T/$1" 2 "$2"
    check "$1: each rank's snapshots equal its row of memory_plan.json" \
        python3 tests/tools/profile_check.py memory "$T/$1-mem" "$T/$1" 2 2,3 -
done
