# tests/tools/train_dpo.sh: neox-train with train_impl: dpo on pairwise data. A small model is
# pre-trained on Tiny Shakespeare, then fine-tuned with DPO on pairs built by tests/tools/dpo_pairs.py
# (a shared prompt; chosen = the true continuation, rejected = its characters shuffled), validated on
# pairs from a later part of the text. The first step, where the policy is its own reference, must
# have the loss log 2 (z = 0) and zero rewards; training must raise the held-out reward margin and
# accuracy; a run stopped and resumed (the reference read back from the checkpoint) must repeat the
# straight run bit for bit; dpo_reference_free learns as well; the checkpoint exports to Hugging Face
# with the policy's weights. Inconsistent pairwise data and unsupported combinations are refused.
source tests/lib.sh

NAME="neox-train dpo"
source tests/post_training_tool_setup.sh
check "write the training pairs" $PY tests/tools/dpo_pairs.py "$TEXT" "$T/train" 0 400 24 23 1
check "write the held-out pairs" $PY tests/tools/dpo_pairs.py "$TEXT" "$T/valid" 400000 64 24 23 2
check "write pairs whose rejected side has fewer documents" $PY tests/tools/dpo_pairs.py "$TEXT" "$T/few" 0 300 24 23 1

pairs() {  # pairs SPLIT PREFIX [NEG_PREFIX]: the four pos/neg keys of a split
    local neg=${3:-$2}
    echo "\"pos_$1_data_paths\": [\"${2}_chosen_document\"], \"neg_$1_data_paths\": [\"${neg}_rejected_document\"],
      \"pos_$1_label_data_paths\": [\"${2}_chosen_label_document\"],
      \"neg_$1_label_data_paths\": [\"${neg}_rejected_label_document\"]"
}
# dpo NAME EXTRA: $T/NAME.yml, a DPO fine-tuning of the pre-trained policy logging to $T/NAME.
dpo() {
    cat >"$T/$1.yml" <<EOF2
{"train_impl": "dpo", "dataset_impl": "pairwise", "dpo_beta": 0.1, "pack_impl": "unpacked", "allow_chopped": false,
 "optimizer": {"type": "Adam", "params": {"lr": 0.001}}, "train_iters": 30, "eval_interval": 10,
 "load": "$T/pre", "finetune": true, "log_dir": "$T/$1", $(pairs train "$T/train"), $(pairs valid "$T/valid"),
 $(pairs test "$T/valid") $2}
EOF2
}
dpo dpo ", \"save\": \"$T/dpo_ckpt\", \"checkpoint_factor\": 10"
check "DPO fine-tuning runs" "$TRAIN" -q "$T/model.yml" "$T/dpo.yml"
check "the first step compares the policy with itself: loss log 2, zero rewards and margin" $PY -c "
import json, math
r = next(r for r in map(json.loads, open('$T/dpo/metrics.jsonl')) if r.get('iteration') == 1 and 'train/lm_loss' in r)
assert abs(r['train/lm_loss'] - math.log(2)) < 1e-7, r['train/lm_loss']
for k in ('train/chosen_rewards', 'train/rejected_rewards', 'train/margins'):
    assert r[k] == 0.0, (k, r[k])
assert r['train/chosen_pos'] == r['train/ref_pos'] and r['train/chosen_neg'] == r['train/ref_neg'], r
assert r['train/chosen_pos'] < 0 and r['train/chosen_neg'] < 0, r"
check "DPO raises the held-out margin and reward accuracy, and lowers the loss" $PY -c "
import json
rs = [r for r in map(json.loads, open('$T/dpo/metrics.jsonl')) if 'validation/margins' in r]
last = rs[-1]
assert last['validation/margins'] > 0.5 and last['validation/reward_acc'] >= 0.8, last
assert last['validation/lm_loss'] < 0.5, last
train = [r['train/lm_loss'] for r in map(json.loads, open('$T/dpo/metrics.jsonl')) if 'train/lm_loss' in r]
assert sum(train[-5:]) / 5 < 0.6 * sum(train[:5]) / 5, train"
check "the log line carries the evaluation's rewards" grep -q "validation results at iteration 10 | lm_loss value: .* reward_acc value: " \
    <("$TRAIN" "$T/model.yml" "$T/dpo.yml" 2>&1)

# Stopped at 10 and resumed: the second part loads the DPO checkpoint (not a fine-tuning start), so
# the reference must come from the checkpoint's reference/ group for the losses to repeat.
dpo part1 ", \"save\": \"$T/part_ckpt\", \"checkpoint_factor\": 10, \"exit_interval\": 10"
check "DPO: the first 10 steps" "$TRAIN" -q "$T/model.yml" "$T/part1.yml"
sed -e "s|\"load\": \"$T/pre\", \"finetune\": true|\"load\": \"$T/part_ckpt\"|" -e "s|$T/part1|$T/part1|" \
    -e "s|, \"exit_interval\": 10||" "$T/part1.yml" >"$T/part2.yml"
check "DPO: resumed for the rest" "$TRAIN" -q "$T/model.yml" "$T/part2.yml"
check "a resumed DPO run repeats the straight run bit for bit (losses, rewards, evaluations)" $LIB same \
    "$T/dpo/metrics.jsonl" "$T/part1/metrics.jsonl" \
    train/lm_loss,train/grad_norm,train/margins,train/ref_pos,validation/lm_loss,validation/margins,test/lm_loss

dpo free ", \"dpo_reference_free\": true"
check "reference-free DPO runs" "$TRAIN" -q "$T/model.yml" "$T/free.yml"
check "reference-free DPO learns the preference and logs no reference metrics" $PY -c "
import json
rs = list(map(json.loads, open('$T/free/metrics.jsonl')))
assert not any('train/ref_pos' in r or 'train/margins' in r for r in rs)
v = [r for r in rs if 'validation/chosen_pos' in r][-1]
assert v['validation/chosen_pos'] - v['validation/chosen_neg'] > 0, v"

check "a DPO checkpoint exports to Hugging Face" "$CONVERT" to-hf --input "$T/dpo_ckpt" --output "$T/hf"
check "the export holds the trained policy, not the reference (the pre-trained weights)" $PY -c "
import subprocess
from safetensors.numpy import load_file
subprocess.run(['$CONVERT', 'to-hf', '--input', '$T/pre', '--output', '$T/hf_pre'], check=True, capture_output=True)
a, b = load_file('$T/hf/model.safetensors'), load_file('$T/hf_pre/model.safetensors')
assert a.keys() == b.keys() and len(a) > 5, sorted(a)
assert all(a[k].shape == b[k].shape for k in a)
assert sum(float(abs(a[k] - b[k]).max()) > 0 for k in a) >= len(a) - 2, 'the export is the starting weights'"

# Refusals.
dpo fewer "" && sed -i "s|\"neg_train_data_paths\": \[\"$T/train_rejected_document\"\]|\"neg_train_data_paths\": [\"$T/few_rejected_document\"]|" "$T/fewer.yml"
sed -i "s|\"neg_train_label_data_paths\": \[\"$T/train_rejected_label_document\"\]|\"neg_train_label_data_paths\": [\"$T/few_rejected_label_document\"]|" "$T/fewer.yml"
check_fails "chosen and rejected datasets of different sizes are refused, naming both" 2 \
    "train_chosen_document.idx has 400 documents but the rejected dataset .*few_rejected_document.idx has 300" \
    "$TRAIN" -q "$T/model.yml" "$T/fewer.yml"
dpo badlabel "" && sed -i "s|\"neg_train_label_data_paths\": \[\"$T/train_rejected_label_document\"\]|\"neg_train_label_data_paths\": [\"$T/few_rejected_label_document\"]|" "$T/badlabel.yml"
check_fails "a label dataset whose documents differ from its token dataset's names both files" 1 \
    "few_rejected_label_document.idx: has 300 documents, but its token dataset .*train_rejected_document.idx has 400" \
    "$TRAIN" -q "$T/model.yml" "$T/badlabel.yml"
dpo nopair ", \"dataset_impl\": \"gpt2\"" && sed -i 's/"dataset_impl": "pairwise", //' "$T/nopair.yml"
check_fails "train_impl dpo without pairwise data is refused" 2 "train_impl dpo trains on pairs: set dataset_impl: pairwise" \
    "$TRAIN" -q "$T/model.yml" "$T/nopair.yml"
dpo packed ", \"pack_impl\": \"packed\"" && sed -i 's/"pack_impl": "unpacked", //' "$T/packed.yml"
check_fails "pack_impl packed is refused for pairwise data" 2 "pack_impl: packed is not supported for dataset_impl pairwise" \
    "$TRAIN" -q "$T/model.yml" "$T/packed.yml"
dpo onelabel "" && sed -i 's/"neg_train_label_data_paths": \[[^]]*\],//' "$T/onelabel.yml"
check_fails "labels on one side only are refused, naming both keys" 2 \
    "pos_train_label_data_paths and neg_train_label_data_paths: set both label lists or neither" \
    "$TRAIN" -q "$T/model.yml" "$T/onelabel.yml"
dpo charppl ", \"char_level_ppl\": true"
check_fails "char_level_ppl is refused for DPO, naming the key" 2 "char_level_ppl: a character-level perplexity of preference pairs" \
    "$TRAIN" -q "$T/model.yml" "$T/charppl.yml"
dpo precomputed ", \"precompute_model_name\": \"ref\""
check_fails "precompute_model_name is refused by name" 2 "key 'precompute_model_name'" \
    "$TRAIN" -q "$T/model.yml" "$T/precomputed.yml"

# GPT-NeoX's own DPO config, with a tiny model, local data and one process: 10 steps train.
POST=$SHARED/reference/gpt-neox-post-training/configs/llama3-8b-dpo.yml
if [ -f "$POST" ]; then
    check "shrink GPT-NeoX's llama3-8b-dpo.yml to a tiny model with local paths" $PY -c "
import sys, yaml
sys.path.insert(0, 'tests/tools')
import train_lib
c = yaml.safe_load(open('$POST'))
c.update(num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2, intermediate_size=128, mlp_multiple_of=128,
         seq_length=48, max_position_embeddings=48, model_parallel_size=1, train_micro_batch_size_per_gpu=4,
         gradient_accumulation_steps=2, train_iters=10, lr_decay_iters=10, eval_interval=5, eval_iters=1,
         attention_config=[[['flash'], 2]], tokenizer_type='CharLevelTokenizer', save='$T/llama3_ckpt', load=None, finetune=False, use_wandb=False,
         log_dir='$T/llama3')
c.pop('vocab-file')
for split, prefix in (('train', '$T/train'), ('valid', '$T/valid'), ('test', '$T/valid')):
    c[f'pos_{split}_data_paths'] = [prefix + '_chosen_document']
    c[f'neg_{split}_data_paths'] = [prefix + '_rejected_document']
    c[f'pos_{split}_label_data_paths'] = [prefix + '_chosen_label_document']
    c[f'neg_{split}_label_data_paths'] = [prefix + '_rejected_label_document']
train_lib.write_config(c, '$T/llama3-dpo.yml')"
    check "the shrunk llama3-8b-dpo.yml trains 10 steps (bfloat16, checkpointed activations)" \
        "$TRAIN" -q "$T/llama3-dpo.yml"
    check "its DPO loss starts at log 2 and its metrics are logged" $PY -c "
import json, math
rs = list(map(json.loads, open('$T/llama3/metrics.jsonl')))
first = next(r for r in rs if 'train/lm_loss' in r)
assert abs(first['train/lm_loss'] - math.log(2)) < 1e-6, first
assert max(r['iteration'] for r in rs) == 10 and any('validation/reward_acc' in r for r in rs)"
else
    skip "GPT-NeoX's llama3-8b-dpo.yml trains" "$POST is absent"
fi
