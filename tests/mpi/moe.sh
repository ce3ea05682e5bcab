# tests/mpi/moe.sh: Mixture of Experts under data, tensor and pipeline parallelism, experts
# replicated on every data- and tensor-parallel rank. The same model (Sinkhorn router, top 2 of 4
# experts, every layer; a topk router on every second layer) and global batch train 12 steps on one
# rank (4 micro-batches accumulated), at dp2, dp2 with ZeRO-1, dp4, tp2, pp2 and tp2 + dp2 (the same
# micro-batches, so the same routing: Sinkhorn balances over one micro-batch); losses and
# evaluations must follow one rank within 1e-5 relative. The dp2 checkpoint resumes on one rank.
source tests/lib.sh

need_mpi "MoE data parallel" || exit 0

words_dataset 400 5

source tests/moe_config.sh
config() { moe_config "$1" "$2" "$3" "$4" 2 "$5"; }  # config NAME ACCUM ROUTER INTERVAL EXTRA: top 2

for spec in "sinkhorn 1" "topk 2"; do
    set -- $spec
    router=$1 interval=$2
    config "${router}1" 4 "$router" "$interval" ""
    check "$router router (interval $interval): one rank, 4 micro-batches of 2" "$TRAIN" -q "$T/${router}1.yml"
    for layout in "dp2 2 2" "dp2zero1 2 2" "dp4 4 1" "tp2 2 4" "pp2 2 4" "tp2dp2 4 2"; do
        set -- $layout
        case $1 in
        dp2zero1) extra=', "zero_optimization": {"stage": 1}' ;;
        tp2|tp2dp2) extra=', "model_parallel_size": 2' ;;
        pp2) extra=', "pipe_parallel_size": 2' ;;
        *) extra="" ;;
        esac
        config "$router-$1" "$3" "$router" "$interval" "$extra"
        check "$router router: $1 on $2 ranks" "$MPIEXEC" -n "$2" "$TRAIN" -q "$T/$router-$1.yml"
        check "$router router: $1 follows one rank (losses, evaluations within 1e-5)" \
            "$PY" tests/mpi/layouts_check.py same_losses "$T/${router}1" "$T/$router-$1"
    done
done

echo "{\"load\": \"$T/sinkhorn-dp2/ckpt\", \"train_iters\": 13, \"override_lr_scheduler\": true, \"log_dir\": \"$T/resumed\"}" >"$T/resume.yml"
sed 's/"train_iters": 12, //; s/"log_dir": "[^"]*", "save": "[^"]*", //' "$T/sinkhorn1.yml" >"$T/one-noiters.yml"
check "one rank resumes the dp2 MoE checkpoint" bash -c \
    "$TRAIN -q '$T/one-noiters.yml' '$T/resume.yml' && grep -q '\"iteration\":13,' '$T/resumed/metrics.jsonl'"
