# tests/post_training_tool_setup.sh: what the one-process post-training tests (tests/tools/train_dpo.sh,
# train_kto.sh, train_rm.sh) share, sourced after tests/lib.sh with NAME set (and PRETRAINED, what the
# pre-trained model is called in its check: "the policy" unless set): the skips, Tiny Shakespeare's
# first 200 kB preprocessed char-level into $T/char, the small model's keys in $T/model.yml, and a
# model pre-trained 60 steps on it into $T/pre. Also sets TEXT, the whole Tiny Shakespeare, for the
# scripts' own data. (The MPI layout tests share tests/post_training_setup.sh.)
need_shared "$NAME" || exit 0
TEXT=$DATA/text/tinyshakespeare_input.txt
[ -f "$TEXT" ] || { skip "$NAME" "no Tiny Shakespeare in $DATA/text"; exit 0; }
[ -x "$PY" ] || { skip "$NAME" ".venv is missing (make deps)"; exit 0; }

head -c 200000 "$TEXT" >"$T/small.txt"
python3 tests/tools/train_lib.py paragraphs "$T/small.txt" "$T/small.jsonl"
check "preprocess (char-level)" "$NEOX_BIN/neox-preprocess" --input "$T/small.jsonl" --output-prefix "$T/char" \
    --tokenizer-type CharLevelTokenizer --append-eod

cat >"$T/model.yml" <<EOF2
{
  "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 48, "max_position_embeddings": 48,
  "pos_emb": "rotary", "rotary_pct": 0.25, "no_weight_tying": true, "tokenizer_type": "CharLevelTokenizer",
  "train_micro_batch_size_per_gpu": 8, "log_interval": 1, "eval_iters": 2
}
EOF2
echo "{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 0.003}}, \"train_iters\": 60, \"eval_interval\": 60,
  \"data_path\": \"$T/char_text_document\", \"save\": \"$T/pre\", \"checkpoint_factor\": 60}" >"$T/pre.yml"
check "pre-train ${PRETRAINED:-the policy}" "$TRAIN" -q "$T/model.yml" "$T/pre.yml"
