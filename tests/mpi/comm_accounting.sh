# tests/mpi/comm_accounting.sh: communication accounting. Under dp2 (ZeRO 0 and 1) and tp2 every
# logged record's per-step bytes of each group and operation (metrics.jsonl, comm/<group>/<op>/bytes)
# equal the analytical per-step volume that tests/mpi/layouts.sh checks comm_stats.json against; the
# comms_logger summary (log_dir/comms_summary.txt) has comm_stats.json's calls, bytes and time per
# rank, group and operation, obeys prof_all/prof_ops, and rank 0 prints it; wall_clock_breakdown
# prints the per-step communication line; verbose logs each step's operations on rank 0; a bad
# prof_ops entry is refused.
source tests/lib.sh

need_mpi "communication accounting" || exit 0

words_dataset 500 7
source tests/layout_config.sh

LOGGER=', "comms_logger": {"enabled": true, "verbose": false, "prof_all": true, "debug": false}'
Z1=', "zero_optimization": {"stage": 1, "overlap_comm": true, "reduce_bucket_size": 3000}'
TP=', "model_parallel_size": 2'
QUIET=', "do_valid": false, "do_test": false, "wall_clock_breakdown": true'
for spec in "dp2 2 2 '$LOGGER'" "dp2z1 2 2 '$LOGGER$Z1'" "tp2 2 4 '$LOGGER$TP'"; do
    eval "set -- $spec"
    config "$1" neox 2 "$3" 5 "$QUIET$4"
    check_output "$1: 5 steps, the summary printed by rank 0" "Total Latency\(ms\)" "$MPIEXEC" -n 2 "$TRAIN" "$T/$1.yml"
    cp "$_last_out" "$T/$1.out"
    check "$1: export" "$CONVERT" to-hf --input "$T/$1/ckpt" --output "$T/$1/hf"
    check "$1: logged bytes per step of every group equal the analytical count" \
        "$PY" tests/mpi/comm_accounting_check.py logged "$1" "$T/$1/hf/config.json" 2 "$3" "$T/$1"
    check "$1: the comms_logger summary's totals equal comm_stats.json's" \
        "$PY" tests/mpi/comm_accounting_check.py summary "$T/$1"
    check "$1: wall_clock_breakdown prints communication per iteration" \
        grep -q "^communication per iteration | comm/" "$T/$1.out"
done

config ops neox 2 2 3 "$QUIET"', "comms_logger": {"enabled": true, "prof_all": false, "prof_ops": ["all_gather_into_tensor", "reduce_scatter"]}'"$Z1"
check "prof_all false: a run" "$MPIEXEC" -n 2 "$TRAIN" -q "$T/ops.yml"
check "prof_all false: the summary holds only prof_ops' operations (DeepSpeed's names accepted)" \
    "$PY" tests/mpi/comm_accounting_check.py summary "$T/ops" all_gather,reduce_scatter
config verbose neox 2 2 2 "$QUIET"', "comms_logger": {"enabled": false, "verbose": true}'
check "verbose: a run" sh -c "'$MPIEXEC' -n 2 '$TRAIN' '$T/verbose.yml' >'$T/verbose.out' 2>&1"
check "verbose: rank 0 (only) logs each step's operations" \
    test "$(grep -c 'comm op: all_reduce | group: data | iteration 2 | calls: 2 |' "$T/verbose.out")" = 1
config extra neox 2 2 2 "$QUIET"', "deepspeed_extra_args": {"comms_logger": {"enabled": true}}'
check "comms_logger inside deepspeed_extra_args (as GPT-NeoX's configs pass it): a run" "$MPIEXEC" -n 2 "$TRAIN" -q "$T/extra.yml"
check "comms_logger inside deepspeed_extra_args: the summary's totals equal comm_stats.json's" \
    "$PY" tests/mpi/comm_accounting_check.py summary "$T/extra"
config off neox 2 2 2 ', "do_valid": false, "do_test": false'
check "without comms_logger: a run" "$MPIEXEC" -n 2 "$TRAIN" -q "$T/off.yml"
check "without comms_logger: no summary file" test ! -e "$T/off/log/comms_summary.txt"
config badops neox 2 2 2 ', "comms_logger": {"enabled": true, "prof_ops": ["all_reduce", "allreduce"]}'
check_fails "an unknown prof_ops entry is refused, naming the key" 2 "comms_logger.prof_ops: item 1" \
    "$TRAIN" -q "$T/badops.yml"
