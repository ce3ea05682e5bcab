# tests/mpi/dropout.sh: dropout masks do not depend on the layout. With attention_dropout and
# hidden_dropout 0.1, the same model, global batch and seed train 20 steps on one rank and under
# dp2 (micro-batches of 4, and of 2 with 2 accumulation steps), tp2, pp2 (4 micro-batches), tp2+pp2
# and dp2+tp2; a Llama-style model (GQA) under tp2. Losses and evaluations must equal the single-rank
# run's within 1e-5 relative: each mask is drawn from the sample's row in the run, the position, the
# channel and the global head, whichever rank computes it. A run stopped under dp2 and resumed on one
# rank continues the straight run. Without dropout the losses differ (the masks reach the model).
source tests/lib.sh

need_mpi "dropout under every layout" || exit 0

words_dataset 500 7

source tests/layout_config.sh  # config NAME KIND MICRO ACCUM ITERS EXTRA


DROP=', "attention_dropout": 0.1, "hidden_dropout": 0.1'
TP=', "model_parallel_size": 2' PP=', "pipe_parallel_size": 2'
config one neox 2 4 20 "$DROP"
train_layout one 1
config plain neox 2 4 20 ""
train_layout plain 1
check "dropout changes the losses" bash -c "! $PY tests/mpi/layouts_check.py same_losses '$T/plain' '$T/one' >/dev/null"
for spec in "dp2 2 4 1 '$DROP'" "dp2accum 2 2 2 '$DROP'" "tp2 2 2 4 '$DROP$TP'" "pp2 2 2 4 '$DROP$PP'" \
            "tp2pp2 4 2 4 '$DROP$TP$PP'" "dp2tp2 4 2 2 '$DROP$TP'"; do
    eval "set -- $spec"
    config "$1" neox "$3" "$4" 20 "$5"
    train_layout "$1" "$2"
    check "$1 with dropout follows the single-rank run (losses, evaluations within 1e-5)" \
        "$PY" tests/mpi/layouts_check.py same_losses "$T/one" "$T/$1"
done

config llama1 llama 2 4 20 "$DROP"
train_layout llama1 1
config llamatp2 llama 2 4 20 "$DROP$TP"
train_layout llamatp2 2
check "llamatp2 (GQA) with dropout follows the single-rank run (losses, evaluations within 1e-5)" \
    "$PY" tests/mpi/layouts_check.py same_losses "$T/llama1" "$T/llamatp2"

# 10 steps on dp2, 10 more on one rank: the dropout counter moves with the checkpoint.
config dp2-a neox 2 2 20 "$DROP, \"exit_interval\": 10"
config dp2-b neox 2 4 20 "$DROP, \"load\": \"$T/dp2-a/ckpt\""
train_layout dp2-a 2
train_layout dp2-b 1
check "dp2 -> one rank: the resumed run continues the straight dropout run (within 1e-5)" \
    "$PY" tests/mpi/layouts_check.py resumed "$T/one" "$T/dp2-a" "$T/dp2-b"
