# tests/mpi/commtopo.sh: sparse_gradients and the hierarchical data-parallel all-reduce.
# - The primitives (tests/drivers/commtopo_check.c): row-sparse reduction against the dense
#   all-reduce on 2-4 ranks (bit for bit at 2), hierarchical against flat with NEOX_RANKS_PER_NODE
#   pretending nodes, and the bytes each counts.
# - Training: sparse_gradients on an untied (Llama-style) model gives bit for bit the dense results
#   at dp2 (with overlapped buckets) and dp2 x tp2 (vocab-parallel embedding), and within 1e-5 at
#   dp4; a tied model falls back to dense (identical); ZeRO-1 is refused by name. The data group's
#   bytes per step drop by the embedding's all-reduce. The hierarchical all-reduce (dp4 as 2 nodes
#   of 2) follows the flat run within 1e-5, with the intra/inter bytes of the analysis.
source tests/lib.sh

DRIVER=build/cpu/tests/drivers/commtopo_check
need_mpi "communication topology" || exit 0

for p in 2 3 4; do
    check_output "sparse rows vs dense all-reduce on $p ranks" "^ok" $MPIEXEC -n $p $DRIVER sparse
    ! grep -q "^not ok" "$_last_out" || _report 1 "sparse rows on $p ranks: every case" "$_last_out"
done
check_output "one host, no override: the flat all-reduce" "^ok .*finds 0 node" $MPIEXEC -n 4 $DRIVER hier 0
for spec in "4 2 2" "6 2 3" "4 3 2"; do
    set -- $spec
    NEOX_RANKS_PER_NODE=$2 check "hierarchical all-reduce, $1 ranks in nodes of $2" $MPIEXEC -n $1 $DRIVER hier $3
    ! grep -q "^not ok" "$_last_out" || _report 1 "hierarchical ($1 ranks, nodes of $2): every case" "$_last_out"
done

words_dataset 500 7

LAYERS=2
source tests/layout_config.sh  # config NAME KIND MICRO ACCUM ITERS EXTRA

run() {  # run NAME RANKS
    check "$1: train on $2 ranks" "$MPIEXEC" -n "$2" "$TRAIN" -q "$T/$1.yml"
    check "$1: export" "$CONVERT" to-hf --input "$T/$1/ckpt" --output "$T/$1/hf"
}

SP=', "sparse_gradients": true' TP=', "model_parallel_size": 2'
ZO=', "zero_optimization": {"stage": 0, "overlap_comm": true, "reduce_bucket_size": 3000}'
Z1=', "zero_optimization": {"stage": 1}'
# NAME KIND RANKS MICRO ACCUM EXTRA, then the same with sparse_gradients; compare: identical | same
pair() {
    config "$1-dense" "$2" "$4" "$5" 20 "$6"
    config "$1-sparse" "$2" "$4" "$5" 20 "$6$SP"
    run "$1-dense" "$3"
    run "$1-sparse" "$3"
    if [ "$7" = identical ]; then
        check "$1: sparse_gradients gives bit for bit the dense results" \
            "$PY" tests/mpi/layouts_check.py identical "$T/$1-dense" "$T/$1-sparse"
    else
        check "$1: sparse_gradients follows the dense run within 1e-5" \
            "$PY" tests/mpi/layouts_check.py same "$T/$1-dense" "$T/$1-sparse"
        "$PY" tests/mpi/layouts_check.py identical "$T/$1-dense" "$T/$1-sparse" | sed 's/^/# (information) bit for bit? /'
    fi
}
pair dp2 llama 2 2 2 "$ZO" identical
pair dp2tp2 llama 4 2 2 "$TP" identical
pair dp4 llama 4 2 1 "" same
pair dp2tied neox 2 2 2 "" identical

config z1sparse llama 2 2 20 "$Z1$SP"
check_fails "sparse_gradients with ZeRO-1 is refused by name" 2 "zero_optimization.stage 1: sparse_gradients needs stage 0" \
    "$MPIEXEC" -n 2 "$TRAIN" -q "$T/z1sparse.yml"

# Bytes per step (6-step run minus 4-step run).
volume() {  # volume NAME KIND RANKS EXTRA CHECK ARG (ENV: NEOX_RANKS_PER_NODE)
    for n in 4 6; do
        config "$1-$n" "$2" 2 2 "$n" "$4, \"do_valid\": false, \"do_test\": false"
        check "$1: $n steps" "$MPIEXEC" -n "$3" "$TRAIN" -q "$T/$1-$n.yml"
    done
}
volume vsparse llama 2 "$SP"
volume vdense llama 2 ""
check "sparse_gradients: the embedding leaves the all-reduce; the all-gathers carry touched rows only" \
    "$PY" tests/mpi/commtopo_check.py sparse "$T/dp2-sparse/hf/config.json" "$T/vdense-4" "$T/vdense-6" \
    "$T/vsparse-4" "$T/vsparse-6" $((2 * 2 * 32))

config dp4flat neox 2 1 20 "$ZO"
run dp4flat 4
export NEOX_RANKS_PER_NODE=2
config dp4-hier neox 2 1 20 "$ZO"
run dp4-hier 4
check "hierarchical (2 nodes of 2): follows the flat dp4 run within 1e-5" \
    "$PY" tests/mpi/layouts_check.py same "$T/dp4flat" "$T/dp4-hier"
"$PY" tests/mpi/layouts_check.py identical "$T/dp4flat" "$T/dp4-hier" | sed 's/^/# (information) bit for bit? /'
# The same buckets reduced at the end of backward (no overlap): the chains are the same collectives
# in the same order, started later.
config dp4-hier-late neox 2 1 20 ', "zero_optimization": {"stage": 0, "overlap_comm": false, "reduce_bucket_size": 3000}'
run dp4-hier-late 4
check "hierarchical: overlapped chains give bit for bit the end-of-backward ones" \
    "$PY" tests/mpi/layouts_check.py identical "$T/dp4-hier" "$T/dp4-hier-late"
volume vhier neox 4 ""
check "hierarchical: intra-node reduce + broadcast, leader-only inter-node all-reduce bytes" \
    "$PY" tests/mpi/commtopo_check.py hier "$T/dp2tied-dense/hf/config.json" "$T/vhier-4" "$T/vhier-6" 2
unset NEOX_RANKS_PER_NODE
