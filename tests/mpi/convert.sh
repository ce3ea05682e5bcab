# tests/mpi/convert.sh: neox-convert reshard --dp 2 writes exactly the shards neox-train writes when it
# runs data parallel on 2 ranks (same datasets, attributes and values: h5diff), and a 2-rank checkpoint
# resharded to one rank verifies and holds the same tensors (inspect's CRC-32s).
source tests/lib.sh

command -v "$MPIEXEC" >/dev/null || { skip "neox-convert vs 2-rank neox-train" "$MPIEXEC is not installed"; exit 0; }
command -v h5diff >/dev/null || { skip "neox-convert vs 2-rank neox-train" "h5diff (hdf5-tools) is not installed"; exit 0; }

python3 - "$T/docs.jsonl" <<'PY'
import json, random, sys
random.seed(7)
words = ["the", "king", "queen", "sword", "crown", "night", "day", "love", "war", "speak", "thou", "art"]
with open(sys.argv[1], "w") as f:
    for _ in range(300):
        f.write(json.dumps({"text": " ".join(random.choice(words) for _ in range(random.randint(10, 60)))}) + "\n")
PY
check "preprocess" "$NEOX_BIN/neox-preprocess" --input "$T/docs.jsonl" --output-prefix "$T/docs" \
    --tokenizer-type CharLevelTokenizer --append-eod
cat >"$T/model.yml" <<EOF
{
  "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 32, "max_position_embeddings": 32,
  "pos_emb": "rotary", "rotary_pct": 0.25, "no_weight_tying": true,
  "optimizer": {"type": "Adam", "params": {"lr": 0.003}}, "lr_decay_style": "constant",
  "train_micro_batch_size_per_gpu": 2, "train_iters": 3, "eval_interval": 1000,
  "data_path": "$T/docs_text_document", "tokenizer_type": "CharLevelTokenizer",
  "save": "$T/ckpt", "checkpoint_factor": 3, "log_dir": "$T/log"
}
EOF
check "train 3 iterations on 2 ranks" "$MPIEXEC" -n 2 "$NEOX_BIN/neox-train" -q "$T/model.yml"
check "reshard the 2-rank checkpoint to 1 rank" $CONVERT reshard --input "$T/ckpt" --output "$T/dp1"
check_output "the 1-rank checkpoint verifies" "is sound" $CONVERT verify "$T/dp1"
$CONVERT inspect "$T/ckpt" | grep -E '^  (params|optimizer)/' >"$T/dp2.txt"
$CONVERT inspect "$T/dp1" | grep -E '^  (params|optimizer)/' >"$T/dp1.txt"
check "dp2 -> dp1 holds the same tensors" cmp "$T/dp2.txt" "$T/dp1.txt"
check "reshard back to --dp 2" $CONVERT reshard --input "$T/dp1" --output "$T/dp2" --dp 2
for r in 0 1; do
    check "rank $r: reshard --dp 2 writes the trainer's own shard (h5diff)" \
        h5diff -c "$T/ckpt/global_step3/rank_0000$r.h5" "$T/dp2/global_step3/rank_0000$r.h5"
done

# tp2 x pp2 with 3 layers and the "parameters" partition (stages not a plain split of the layers):
# reshard --tp 2 --pp 2 puts on every rank the same tensors, with the same element counts, as the
# trainer's own shard of that rank; replicated tensors and the tied embedding are stored once.
sed -e 's/"num_layers": 2/"num_layers": 3, "model_parallel_size": 2, "pipe_parallel_size": 2, "pipe_partition_method": "parameters"/' \
    -e 's/"no_weight_tying": true/"no_weight_tying": false/' -e "s|$T/ckpt|$T/tp2pp2|" \
    -e 's/"gradient_accumulation_steps": 1, //' "$T/model.yml" >"$T/tp2pp2.yml"
check "train 3 iterations at tp2 x pp2" "$MPIEXEC" -n 4 "$NEOX_BIN/neox-train" -q "$T/tp2pp2.yml"
check "reshard the tp2 x pp2 checkpoint to one rank" $CONVERT reshard --input "$T/tp2pp2" --output "$T/tp1"
check "reshard it back to --tp 2 --pp 2" $CONVERT reshard --input "$T/tp1" --output "$T/again" --tp 2 --pp 2
# Each params dataset of a shard with its element count (a range stores n, a block r x c).
params_of() {
    h5ls -r "$1" | awk '$1 ~ /^\/params\// { dims = ""; for (i = 3; i <= NF; i++) dims = dims $i
        gsub(/[{} ]/, "", dims); n = 1; k = split(dims, d, ","); for (i = 1; i <= k; i++) n *= d[i]; print $1, n }' | sort
}
for r in 0 1 2 3; do
    params_of "$T/tp2pp2/global_step3/rank_0000$r.h5" >"$T/trainer$r.txt"
    params_of "$T/again/global_step3/rank_0000$r.h5" >"$T/convert$r.txt"
    check "rank $r: reshard --tp 2 --pp 2 stores the trainer's tensors and sizes" cmp "$T/trainer$r.txt" "$T/convert$r.txt"
done
check "the trainer's ranks hold tensors at all" test -s "$T/trainer3.txt"
