# tests/tools/train_sft.sh: neox-train on label datasets (train/valid/test_label_data_paths), the
# SFT data of GPT-NeoX. A label dataset equal to its token dataset must give the losses of no label
# dataset, bit for bit (labels are shifted as tokens are); masking the first half of each document
# must change the losses and still learn; a label dataset with a document missing is an error
# naming both files and the document. GPT-NeoX's llama3-8b-sft.yml, shrunk, trains.
source tests/lib.sh

PRE=$NEOX_BIN/neox-preprocess
LABELS=".venv/bin/python tests/tools/sft_labels.py"
need_shared "neox-train sft" || exit 0
[ -f "$DATA/text/tinyshakespeare_input.txt" ] || { skip "neox-train sft" "no Tiny Shakespeare in $DATA/text"; exit 0; }

head -c 60000 "$DATA/text/tinyshakespeare_input.txt" >"$T/small.txt"
python3 tests/tools/train_lib.py paragraphs "$T/small.txt" "$T/small.jsonl"
check "preprocess (char-level)" $PRE --input "$T/small.jsonl" --output-prefix "$T/char" \
    --tokenizer-type CharLevelTokenizer --append-eod
D=$T/char_text_document
for mode in copy prompt short; do
    check "write the $mode label dataset" $LABELS $mode "$D" "$T/label_$mode"
done

cat >"$T/model.yml" <<EOF2
{
  "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64, "max_position_embeddings": 64,
  "pos_emb": "rotary", "rotary_pct": 0.25, "no_weight_tying": true,
  "optimizer": {"type": "Adam", "params": {"lr": 0.003, "betas": [0.9, 0.95], "eps": 1.0e-8}},
  "train_micro_batch_size_per_gpu": 4, "train_iters": 30, "eval_interval": 10, "eval_iters": 2, "log_interval": 1,
  "train_data_paths": ["$D"], "valid_data_paths": ["$D"], "test_data_paths": ["$D"],
  "tokenizer_type": "CharLevelTokenizer"
}
EOF2
labels() {  # labels NAME LABEL_PREFIX
    echo "{\"log_dir\": \"$T/$1\", \"train_label_data_paths\": [\"$2\"], \"valid_label_data_paths\": [\"$2\"],
      \"test_label_data_paths\": [\"$2\"]}" >"$T/$1.yml"
}
echo "{\"log_dir\": \"$T/plain\"}" >"$T/plain.yml"
labels copy "$T/label_copy"
labels prompt "$T/label_prompt"
labels short "$T/label_short"
KEYS=train/lm_loss,train/grad_norm,validation/lm_loss,test/lm_loss
check "train without labels" $TRAIN -q "$T/model.yml" "$T/plain.yml"
check "train on labels equal to the tokens" $TRAIN -q "$T/model.yml" "$T/copy.yml"
check "labels equal to the tokens give the losses of no labels, bit for bit" \
    python3 tests/tools/train_lib.py same "$T/plain/metrics.jsonl" "$T/copy/metrics.jsonl" $KEYS
check "train with the first half of each document masked" $TRAIN -q "$T/model.yml" "$T/prompt.yml"
check "masked labels change the losses" \
    bash -c "! python3 tests/tools/train_lib.py same '$T/plain/metrics.jsonl' '$T/prompt/metrics.jsonl' train/lm_loss"
check "SFT lowers the label-token loss" python3 -c "
import json
l = [r['train/lm_loss'] for r in map(json.loads, open('$T/prompt/metrics.jsonl')) if 'train/lm_loss' in r]
assert sum(l[-5:]) / 5 < sum(l[:5]) / 5 - 0.5, l"
check_fails "a label dataset with a document missing names both files and the document" 1 \
    "label_short.idx: has [0-9]* documents, but its token dataset .*char_text_document.idx has" \
    $TRAIN -q "$T/model.yml" "$T/short.yml"
echo "{\"log_dir\": \"$T/two\", \"train_label_data_paths\": [\"$T/label_copy\", \"$T/label_copy\"]}" >"$T/two.yml"
check_fails "a label list longer than its data list is a usage error naming the key" 2 \
    "train_label_data_paths: has 2 paths but the matching \*_data_paths has 1" $TRAIN -q "$T/model.yml" "$T/two.yml"

# GPT-NeoX's own SFT config, with a tiny model, local data and one process: 10 steps train.
POST=$SHARED/reference/gpt-neox-post-training/configs/llama3-8b-sft.yml
if [ -f "$POST" ]; then
    check "shrink GPT-NeoX's llama3-8b-sft.yml to a tiny model with local paths" .venv/bin/python -c "
import sys, yaml
sys.path.insert(0, 'tests/tools')
import train_lib
c = yaml.safe_load(open('$POST'))
c.update(num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2, intermediate_size=128, mlp_multiple_of=128,
         seq_length=48, max_position_embeddings=48, model_parallel_size=1, train_micro_batch_size_per_gpu=4,
         gradient_accumulation_steps=2, train_iters=10, lr_decay_iters=10, eval_interval=5, eval_iters=1,
         attention_config=[[['flash'], 2]], tokenizer_type='CharLevelTokenizer', save='$T/llama3_ckpt', load=None,
         finetune=False, use_wandb=False, log_dir='$T/llama3')
c.pop('vocab-file', None)
for split in ('train', 'valid', 'test'):
    c[f'{split}_data_paths'] = ['$D']
    c[f'{split}_label_data_paths'] = ['$T/label_prompt']
train_lib.write_config(c, '$T/llama3-sft.yml')"
    check "the shrunk llama3-8b-sft.yml trains 10 steps on label datasets" $TRAIN -q "$T/llama3-sft.yml"
    check "its loss is logged, finite, for every step (its learning rate, 1e-5 scale, barely moves it in 10)" \
        .venv/bin/python -c "
import json, math
l = [r['train/lm_loss'] for r in map(json.loads, open('$T/llama3/metrics.jsonl')) if 'train/lm_loss' in r]
assert len(l) == 10 and all(math.isfinite(x) for x in l), l"
else
    skip "GPT-NeoX's llama3-8b-sft.yml trains" "$POST is absent"
fi
