# tests/post_training_setup.sh: what the post-training layout tests (tests/mpi/dpo.sh, kto.sh, rm.sh) share,
# sourced after tests/lib.sh with NAME set: the tools, the skips, Tiny Shakespeare's first 100 kB
# preprocessed char-level into $T/char, the tiny model's keys in MODEL, and a policy pre-trained
# 20 steps into $T/pre. Also sets TEXT, the whole Tiny Shakespeare, for the scripts' own data.
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
TRAIN=$NEOX_BIN/neox-train
CONVERT=$NEOX_BIN/neox-convert
T=$TEST_TMP
PY=.venv/bin/python
command -v "$MPIEXEC" >/dev/null || { skip "$NAME" "$MPIEXEC is not installed"; exit 0; }
[ -x "$PY" ] || { skip "$NAME" ".venv is missing (make deps)"; exit 0; }
need_shared "$NAME" || exit 0
TEXT=$DATA/text/tinyshakespeare_input.txt
[ -f "$TEXT" ] || { skip "$NAME" "no Tiny Shakespeare in $DATA/text"; exit 0; }

head -c 100000 "$TEXT" >"$T/small.txt"
python3 tests/tools/train_lib.py paragraphs "$T/small.txt" "$T/small.jsonl"
check "preprocess (char-level)" "$NEOX_BIN/neox-preprocess" --input "$T/small.jsonl" --output-prefix "$T/char" \
    --tokenizer-type CharLevelTokenizer --append-eod
MODEL='"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 32, "max_position_embeddings": 32,
  "pos_emb": "rotary", "rotary_pct": 0.5, "no_weight_tying": true, "tokenizer_type": "CharLevelTokenizer",
  "log_interval": 1, "eval_iters": 1'
echo "{$MODEL, \"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 0.003}}, \"train_iters\": 20,
  \"eval_interval\": 20, \"train_micro_batch_size_per_gpu\": 8, \"data_path\": \"$T/char_text_document\",
  \"save\": \"$T/pre\", \"checkpoint_factor\": 20}" >"$T/pre.yml"
check "pre-train the policy" "$TRAIN" -q "$T/pre.yml"
