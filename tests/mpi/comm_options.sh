# tests/mpi/comm_options.sh: the communication options on dp2 (the model of tests/mpi/layouts.sh).
# Options that only change how the same sums travel leave results bit-identical: reduce_bucket_size
# (ZeRO 0), allgather_bucket_size (ZeRO-1's parameter all-gather in buckets: ceil(n / bucket) calls,
# same bytes), reduce_scatter false under ZeRO-1 and -2 (all-reduce, keep the partition; with 2
# ranks each element is one addition a + b either way; on 4 ranks within 1e-5), fp32_allreduce and communication_data_type
# fp32. communication_data_type bf16 halves the gradient bytes and keeps the 10 steps' losses within 1e-4
# relative (docs/communication.md); fp16 likewise. A bad type, or bf16 with fp32_allreduce, is refused.
source tests/lib.sh

need_mpi "communication options" || exit 0

words_dataset 500 7
source tests/layout_config.sh

run() {  # run NAME EXTRA: 10 steps on dp2 and the export
    config "$1" neox 2 2 10 "$2"
    check "$1: train on 2 ranks" "$MPIEXEC" -n 2 "$TRAIN" -q "$T/$1.yml"
    check "$1: export" "$CONVERT" to-hf --input "$T/$1/ckpt" --output "$T/$1/hf"
}
identical() {  # identical A B WHAT
    check "$3 gives bit for bit the same losses, evaluations and parameters" \
        "$PY" tests/mpi/layouts_check.py identical "$T/$1" "$T/$2"
}
zero() { echo ", \"zero_optimization\": {\"stage\": $1, \"overlap_comm\": true $2}"; }

run dp2 ""
run dp2b "$(zero 0 ', "reduce_bucket_size": 3000')"
identical dp2 dp2b "reduce_bucket_size 3000 (ZeRO 0, several buckets)"
run fp32 ', "fp32_allreduce": true, "communication_data_type": "FP32"'
identical dp2 fp32 "fp32_allreduce and communication_data_type fp32"

run z1 "$(zero 1 ', "reduce_bucket_size": 3000')"
# The "nothing to partition" notice belongs to one data-parallel rank only: ZeRO-1 on 2 ranks partitions.
config znotice neox 2 2 2 "$(zero 1 '')"
config znotice1 neox 2 2 2 "$(zero 1 "")"
check "ZeRO-1 on 2 data-parallel ranks: trains (notices on)" sh -c "'$MPIEXEC' -n 2 '$TRAIN' '$T/znotice.yml' 2>'$T/znotice.err'"
check_output "ZeRO-1 on 2 data-parallel ranks: no 'nothing to partition' notice" '^0$' sh -c "grep -c 'nothing to partition' '$T/znotice.err' || :"
check_fails "ZeRO-1 on 1 rank: the notice says nothing is partitioned" 0 'zero_optimization.stage 1: nothing to partition at data-parallel size 1' \
    "$TRAIN" "$T/znotice1.yml"
run z1g "$(zero 1 ', "reduce_bucket_size": 3000, "allgather_bucket_size": 1000')"
identical z1 z1g "allgather_bucket_size 1000 (ZeRO-1)"
check "allgather_bucket_size 1000: ceil(n/1000) all-gathers per step, the same bytes" \
    "$PY" tests/mpi/comm_accounting_check.py gather_calls "$T/z1/hf/config.json" "$T/z1g" 1000
run z1ar "$(zero 1 ', "reduce_bucket_size": 3000, "reduce_scatter": false')"
identical z1 z1ar "reduce_scatter false (ZeRO-1)"
check "reduce_scatter false: the gradient is all-reduced (the logged bytes per step)" \
    "$PY" tests/mpi/comm_accounting_check.py logged dp2z1ar "$T/z1/hf/config.json" 2 2 "$T/z1ar"
run z2 "$(zero 2 ', "reduce_bucket_size": 3000')"
run z2ar "$(zero 2 ', "reduce_bucket_size": 3000, "reduce_scatter": false')"
identical z2 z2ar "reduce_scatter false (ZeRO-2)"

# On 4 ranks MPICH's reduce-scatter and all-reduce associate the four addends differently: equal
# within rounding (measured: final parameters 8e-8 relative L2 apart after 10 steps), not bit for bit.
for name in z1dp4 z1dp4ar; do
    extra=$(zero 1 ', "reduce_bucket_size": 3000')
    [ "$name" = z1dp4ar ] && extra=$(zero 1 ', "reduce_bucket_size": 3000, "reduce_scatter": false')
    config "$name" neox 2 1 10 "$extra"
    check "$name: train on 4 ranks" "$MPIEXEC" -n 4 "$TRAIN" -q "$T/$name.yml"
    check "$name: export" "$CONVERT" to-hf --input "$T/$name/ckpt" --output "$T/$name/hf"
done
check "reduce_scatter false on 4 ranks (ZeRO-1): losses, evaluations and parameters within 1e-5" \
    "$PY" tests/mpi/layouts_check.py same "$T/z1dp4" "$T/z1dp4ar"

run bf16 ', "communication_data_type": "bf16"'
check "communication_data_type bf16: the gradient's bytes per step are half of fp32's" \
    "$PY" tests/mpi/comm_accounting_check.py logged dp2bf16 "$T/dp2/hf/config.json" 2 2 "$T/bf16"
check "communication_data_type bf16: losses within 1e-4 relative of fp32 communication" \
    "$PY" tests/mpi/comm_accounting_check.py losses "$T/dp2" "$T/bf16" 1e-4
run fp16 ', "communication_data_type": "fp16"'
check "communication_data_type fp16: losses within 1e-4 relative of fp32 communication" \
    "$PY" tests/mpi/comm_accounting_check.py losses "$T/dp2" "$T/fp16" 1e-4

config bad neox 2 2 2 ', "communication_data_type": "int8"'
check_fails "communication_data_type int8 is refused, naming the key" 2 "key 'communication_data_type': 'int8' is not one of: fp32, fp16, bf16" \
    "$TRAIN" -q "$T/bad.yml"
config both neox 2 2 2 ', "communication_data_type": "bf16", "fp32_allreduce": true'
check_fails "communication_data_type bf16 with fp32_allreduce true is refused" 2 "contradicts fp32_allreduce" \
    "$TRAIN" -q "$T/both.yml"
