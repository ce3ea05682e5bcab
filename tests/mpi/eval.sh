# tests/mpi/eval.sh: neox-eval data parallel under mpiexec -n 2: requests are spread over the ranks
# and gathered, so every task metric equals the one-rank run; split perplexity over 2 ranks x
# micro-batch 4 equals one rank x micro-batch 8 (the same global batches). A checkpoint written by
# 2 ranks loads on 1. A tp2 x pp2 config evaluates on 1 and 3 ranks without an override file.
# Generation shares its prompts over the ranks and writes the one-rank records in input order.
# neox-eval serve on 2 and 3 ranks gives the one-rank answers (tests/mpi/serve_ranks_check.py).
source tests/lib.sh

command -v "$MPIEXEC" >/dev/null || { skip "neox-eval data parallel" "$MPIEXEC is not installed"; exit 0; }

python3 - "$T" <<'EOF'
import json, random, sys
t = sys.argv[1]
random.seed(3)
words = ["the", "king", "queen", "sword", "crown", "night", "day", "love", "war", "speak", "thou", "art"]
line = lambda n: " ".join(random.choice(words) for _ in range(n))
with open(f"{t}/docs.jsonl", "w") as f:
    for _ in range(300):
        f.write(json.dumps({"text": line(random.randint(10, 50))}) + "\n")
with open(f"{t}/mc.jsonl", "w") as f:
    for _ in range(13):
        f.write(json.dumps({"context": line(5), "choices": [" " + line(2), " " + line(3), " " + line(1)], "label": random.randint(0, 2)}) + "\n")
with open(f"{t}/ll.jsonl", "w") as f:
    for _ in range(11):
        f.write(json.dumps({"context": line(6), "continuation": " " + line(2)}) + "\n")
with open(f"{t}/roll.jsonl", "w") as f:
    for _ in range(5):
        f.write(json.dumps({"text": line(random.randint(5, 40))}) + "\n")
EOF
check "preprocess" "$NEOX_BIN/neox-preprocess" --input "$T/docs.jsonl" --output-prefix "$T/docs" \
    --tokenizer-type CharLevelTokenizer --append-eod
cat >"$T/model.yml" <<EOF
{
  "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 32, "max_position_embeddings": 32,
  "pos_emb": "rotary", "no_weight_tying": true,
  "optimizer": {"type": "Adam", "params": {"lr": 0.01}}, "lr_decay_style": "constant",
  "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "train_iters": 8,
  "eval_interval": 8, "eval_iters": 3, "log_interval": 4,
  "data_path": "$T/docs_text_document", "split": "80,10,10", "tokenizer_type": "CharLevelTokenizer",
  "save": "$T/ckpt", "load": "$T/ckpt", "checkpoint_factor": 8
}
EOF
sed 's/"train_micro_batch_size_per_gpu": 4/"train_micro_batch_size_per_gpu": 8/' "$T/model.yml" >"$T/micro8.yml"
check "train on 2 ranks" $MPIEXEC -n 2 $NEOX_BIN/neox-train -q "$T/model.yml"
TASKS="valid,test,mc:$T/mc.jsonl,loglikelihood:$T/ll.jsonl,rolling:$T/roll.jsonl"
check "evaluate on 2 ranks" $MPIEXEC -n 2 $EVAL -q "$T/model.yml" --tasks "$TASKS" --results-prefix "$T/two"
check "evaluate on 1 rank (micro-batch 8)" $EVAL -q "$T/micro8.yml" --tasks "$TASKS" --results-prefix "$T/one"
# same_results A B [subset]: every task of results A equals B's (with subset, B may have more tasks).
same_results() {
    python3 - "$T" "$@" <<'EOF'
import glob, json, sys
t, first, second = sys.argv[1:4]
load = lambda p: json.load(open(glob.glob(f"{t}/{p}_eval_results_*.json")[0]))["results"]
a, b = load(first), load(second)
assert a.keys() <= b.keys() if sys.argv[4:] == ["subset"] else a.keys() == b.keys(), (a.keys(), b.keys())
for task in a:
    for k, v in a[task].items():
        w = b[task][k]
        if isinstance(v, float) and isinstance(w, float):
            assert abs(v - w) <= 1e-5 * max(abs(v), abs(w), 1e-12), (task, k, v, w)
        else:
            assert v == w, (task, k, v, w)
EOF
}
check "2 ranks give the 1-rank results" same_results two one

# ---- a tensor- and pipeline-parallel config evaluates on any number of ranks, no override file --
# This model's vocabulary pads the same at model_parallel_size 1 and 2, so the tp2 x pp2 config
# describes the resharded checkpoint of the same model.
check "reshard to tp2 x pp2" $NEOX_BIN/neox-convert reshard --input "$T/ckpt" --output "$T/ckpt_tp2pp2" --tp 2 --pp 2
sed "s|\"load\": \"$T/ckpt\"|\"load\": \"$T/ckpt_tp2pp2\", \"model_parallel_size\": 2, \"pipe_parallel_size\": 2|" \
    "$T/model.yml" >"$T/tp2pp2.yml"
REQUEST_TASKS="mc:$T/mc.jsonl,loglikelihood:$T/ll.jsonl,rolling:$T/roll.jsonl"
check_output "tp2 x pp2 config on 3 ranks: data parallel, with a notice" \
    'model_parallel_size 2: neox-eval runs data parallel over all 3 ranks' \
    sh -c "$MPIEXEC -n 3 $EVAL '$T/tp2pp2.yml' --tasks 'valid,$REQUEST_TASKS' --results-prefix '$T/tp2pp2_3' 2>&1"
check "tp2 x pp2 config on 1 rank" $EVAL -q "$T/tp2pp2.yml" --tasks "$REQUEST_TASKS" --results-prefix "$T/tp2pp2_1"
check "tp2 x pp2 config, 1 rank: the tp1 results" same_results tp2pp2_1 one subset
check "tp2 x pp2 config, 3 ranks: the tp1 results" same_results tp2pp2_1 tp2pp2_3 subset

# ---- generation shared over the data-parallel ranks: the one-rank records, in input order -------
printf 'the king\nthou art\nspeak\nthe night\nlove\n' >"$T/prompts.txt"
GEN=(generate -q "$T/model.yml" --maximum-tokens 12 --temperature 0.9 --top-k 8 --seed 3)
check "generate input-file on 1 rank" $EVAL "${GEN[@]}" --text-gen-type input-file --sample-input-file "$T/prompts.txt" \
    --sample-output-file "$T/gen1.jsonl"
check_output "generate input-file on 3 ranks: each makes its share" '^2 2 1$' sh -c "NEOX_LOG_LEVEL=debug $MPIEXEC -n 3 \
    $EVAL ${GEN[*]} --text-gen-type input-file --sample-input-file '$T/prompts.txt' --sample-output-file '$T/gen3.jsonl' 2>&1 |
    sed -n 's/.*rank \([0-9]\)\].*generating: made \([0-9]*\) of the 5 records.*/\1 \2/p' | sort | cut -d' ' -f2 | tr '\n' ' ' | sed 's/ $//'"
check "generate unconditional on 1 and 2 ranks" sh -c "$EVAL ${GEN[*]} --text-gen-type unconditional --num-samples 3 \
    --sample-output-file '$T/unc1.jsonl' && $MPIEXEC -n 2 $EVAL ${GEN[*]} --text-gen-type unconditional --num-samples 3 \
    --sample-output-file '$T/unc2.jsonl'"
same_records() {
    python3 - "$1" "$2" <<'PY'
import json, sys
strip = lambda p: [{k: v for k, v in json.loads(l).items() if k != "duration_seconds"} for l in open(p)]
a, b = strip(sys.argv[1]), strip(sys.argv[2])
assert a == b and len(a) > 1, (a, b)
assert len({r["text"] for r in a}) > 1, a  # each completion draws from its own seed
PY
}
check "3 ranks: the 1-rank records, in input order" same_records "$T/gen1.jsonl" "$T/gen3.jsonl"
check "unconditional, 2 ranks: the 1-rank samples" same_records "$T/unc1.jsonl" "$T/unc2.jsonl"
check_output "interactive on 2 ranks: rank 0 reads the prompts" '^2$' sh -c \
    "printf 'the king\nlove\nexit\n' | $MPIEXEC -n 2 $EVAL ${GEN[*]} --text-gen-type interactive --sample-output-file '$T/i.jsonl' >/dev/null && wc -l <'$T/i.jsonl'"
check_fails "a prompt too long on one rank fails every rank" 2 'the prompt has' sh -c \
    "python3 -c 'print(\"short\"); print(\"x \" * 40)' >'$T/long.txt' && $MPIEXEC -n 2 $EVAL ${GEN[*]} --text-gen-type input-file \
    --sample-input-file '$T/long.txt' --sample-output-file '$T/long.jsonl'"
# Serving over data-parallel ranks: rank 0 answers HTTP, every rank computes a share of each batch.
[ -x "$PY" ] || PY=python3
"$PY" tests/mpi/serve_ranks_check.py "$MPIEXEC" "$EVAL" "$T/model.yml" "$T" ||
    _report 1 "serve on 1, 2 and 3 ranks: every case (logs: serve1.log ... in the test directory)"
