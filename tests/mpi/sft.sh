# tests/mpi/sft.sh: SFT (label datasets) under the parallel layouts. The same model trains 20 steps on
# a token dataset with a label dataset masking the first half of every document, on one rank and
# under dp2 with ZeRO-1, tp2, pp2 (4 micro-batches: only the last stage reads labels) and dp2+tp2;
# losses, evaluations and final parameters must equal the single-rank run's within 1e-5 relative.
# A run stopped at step 10 and resumed under tp2 continues the single-rank trajectory.
source tests/lib.sh

need_mpi "SFT layouts" || exit 0

words_dataset 400 5
D=$T/docs_text_document
check "write the label dataset (first half of each document masked)" $PY tests/tools/sft_labels.py prompt "$D" "$T/labels"
source tests/layout_config.sh  # config NAME KIND MICRO ACCUM ITERS EXTRA
LAYERS=2
LABELS=", \"train_data_paths\": [\"$D\"], \"valid_data_paths\": [\"$D\"], \"test_data_paths\": [\"$D\"],
  \"train_label_data_paths\": [\"$T/labels\"], \"valid_label_data_paths\": [\"$T/labels\"],
  \"test_label_data_paths\": [\"$T/labels\"], \"pack_impl\": \"unpacked\""
sft() {  # sft NAME RANKS MICRO ACCUM EXTRA
    config "$1" neox "$3" "$4" 20 "$LABELS $5"
    sed -i 's|"data_path": "[^"]*", ||' "$T/$1.yml"
    local launch=()
    [ "$2" -gt 1 ] && launch=("$MPIEXEC" -n "$2")
    check "SFT $1: train on $2 rank(s)" "${launch[@]}" "$TRAIN" -q "$T/$1.yml"
    check "SFT $1: export" "$CONVERT" to-hf --input "$T/$1/ckpt" --output "$T/$1/hf"
}
sft one 1 2 4 ""
for spec in "dp2z1 2 2 2 ', \"zero_optimization\": {\"stage\": 1}'" "tp2 2 2 4 ', \"model_parallel_size\": 2'" \
            "pp2 2 2 4 ', \"pipe_parallel_size\": 2'" "dp2tp2 4 2 2 ', \"model_parallel_size\": 2'"; do
    eval "set -- $spec"
    sft "$1" "$2" "$3" "$4" "$5"
    check "SFT $1 follows the single-rank run (losses, evaluations, final parameters within 1e-5)" \
        $PY tests/mpi/layouts_check.py same "$T/one" "$T/$1"
done
# Resumed: steps 1-10 on one rank, 11-20 under tp2 from its checkpoint.
config first neox 2 4 20 "$LABELS, \"exit_interval\": 10"
sed -i 's|"data_path": "[^"]*", ||' "$T/first.yml"
check "SFT: steps 1-10 on one rank" "$TRAIN" -q "$T/first.yml"
config second neox 2 4 20 "$LABELS, \"model_parallel_size\": 2, \"load\": \"$T/first/ckpt\""
sed -i 's|"data_path": "[^"]*", ||' "$T/second.yml"
check "SFT: steps 11-20 under tp2 from that checkpoint" "$MPIEXEC" -n 2 "$TRAIN" -q "$T/second.yml"
check "SFT: the resumed run continues the single-rank trajectory" \
    $PY tests/mpi/layouts_check.py resumed "$T/one" "$T/first" "$T/second"
