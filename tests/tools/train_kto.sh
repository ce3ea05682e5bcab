# tests/tools/train_kto.sh: neox-train with train_impl: kto on reward datasets. A small model is
# pre-trained on Tiny Shakespeare, then fine-tuned with KTO on unpaired examples built by
# tests/tools/kto_data.py (a prompt and either its true continuation, reward 1, or the continuation
# shuffled, reward -1), validated on examples from a later part of the text. The first step, where
# the policy is its own reference, must have GPT-NeoX's loss 0.5 (sigmoid(0) = 1/2 on every row, unit
# weights), a zero KL estimate and zero policy rewards; training must raise the held-out desirable
# log-ratio above the undesirable one; a run stopped and resumed (the reference read back from the
# checkpoint) must repeat the straight run bit for bit. Inconsistent reward data and unsupported
# combinations are refused naming the files and keys; the checkpoint exports the trained policy to
# Hugging Face. GPT-NeoX's llama3-8b-kto.yml, shrunk, trains.
source tests/lib.sh

NAME="neox-train kto"
source tests/post_training_tool_setup.sh
check "write the training examples" $PY tests/tools/kto_data.py "$TEXT" "$T/train" 0 400 24 23 1
check "write the held-out examples" $PY tests/tools/kto_data.py "$TEXT" "$T/valid" 400000 64 24 23 2
check "write a smaller set, for a reward dataset of other length" $PY tests/tools/kto_data.py "$TEXT" "$T/few" 0 300 24 23 1

split() {  # split SPLIT PREFIX [REWARD_PREFIX]: the three keys of a split
    echo "\"$1_data_paths\": [\"${2}_messages_document\"], \"$1_label_data_paths\": [\"${2}_messages_label_document\"],
      \"$1_reward_data_paths\": [\"${3:-$2}_messages_reward_document\"]"
}
# kto NAME EXTRA: $T/NAME.yml, a KTO fine-tuning of the pre-trained policy logging to $T/NAME.
kto() {
    cat >"$T/$1.yml" <<EOF2
{"train_impl": "kto", "kto_beta": 1.0, "pack_impl": "unpacked", "allow_chopped": false,
 "optimizer": {"type": "Adam", "params": {"lr": 0.001}}, "train_iters": 30, "eval_interval": 10,
 "load": "$T/pre", "finetune": true, "log_dir": "$T/$1", $(split train "$T/train"), $(split valid "$T/valid"),
 $(split test "$T/valid") $2}
EOF2
}
kto kto ", \"save\": \"$T/kto_ckpt\", \"checkpoint_factor\": 10"
check "KTO fine-tuning runs" "$TRAIN" -q "$T/model.yml" "$T/kto.yml"
check "the first step compares the policy with itself: loss 0.5, zero KL and policy rewards" $PY -c "
import json
r = next(r for r in map(json.loads, open('$T/kto/metrics.jsonl')) if r.get('iteration') == 1 and 'train/lm_loss' in r)
assert abs(r['train/lm_loss'] - 0.5) < 1e-7, r['train/lm_loss']
assert r['train/kl'] == 0.0 and r['train/policy_rewards'] == 0.0 and r['train/reward_acc'] == 0.0, r
assert r['train/policy_logp'] == r['train/ref_logp'] < 0, r
assert r['train/pos_policy_logp'] == r['train/pos_ref_logp'] < 0 and r['train/neg_policy_logp'] == r['train/neg_ref_logp'] < 0, r
assert abs(r['train/pos_ref_logp'] + r['train/neg_ref_logp'] - r['train/ref_logp']) < 1e-9 * abs(r['train/ref_logp']), r"
check "KTO raises the held-out desirable log-ratio above the undesirable one, and lowers the loss" $PY -c "
import json
rs = [r for r in map(json.loads, open('$T/kto/metrics.jsonl')) if 'validation/kl' in r]
def ratio(r, side):  # mean over rows of the side's log-ratio (policy - reference), held out
    return r[f'validation/{side}_policy_logp'] - r[f'validation/{side}_ref_logp']
gaps = [ratio(r, 'pos') - ratio(r, 'neg') for r in rs]
assert len(rs) == 4 and min(gaps) > 0 and gaps[-1] > 1.5, gaps
last = rs[-1]
assert ratio(last, 'pos') > 0 > ratio(last, 'neg'), last
assert last['validation/reward_acc'] >= 0.75 and last['validation/lm_loss'] < 0.3, last
train = [r['train/lm_loss'] for r in map(json.loads, open('$T/kto/metrics.jsonl')) if 'train/lm_loss' in r]
assert sum(train[-10:]) / 10 < 0.8 * sum(train[:10]) / 10, train"
kto logline ""
check "the log line carries the evaluation's KTO metrics" grep -q "validation results at iteration 10 | lm_loss value: .* kl value: .* policy_rewards value: " \
    <("$TRAIN" "$T/model.yml" "$T/logline.yml" 2>&1)

# Stopped at 10 and resumed: the second part loads the KTO checkpoint (not a fine-tuning start), so
# the reference must come from the checkpoint's reference/ group for the losses to repeat.
kto part1 ", \"save\": \"$T/part_ckpt\", \"checkpoint_factor\": 10, \"exit_interval\": 10"
check "KTO: the first 10 steps" "$TRAIN" -q "$T/model.yml" "$T/part1.yml"
sed -e "s|\"load\": \"$T/pre\", \"finetune\": true|\"load\": \"$T/part_ckpt\"|" \
    -e "s|, \"exit_interval\": 10||" "$T/part1.yml" >"$T/part2.yml"
check "KTO: resumed for the rest" "$TRAIN" -q "$T/model.yml" "$T/part2.yml"
check "a resumed KTO run repeats the straight run bit for bit (losses, metrics, evaluations)" $LIB same \
    "$T/kto/metrics.jsonl" "$T/part1/metrics.jsonl" \
    train/lm_loss,train/grad_norm,train/kl,train/ref_logp,train/policy_rewards,validation/lm_loss,validation/kl,test/lm_loss

check "a KTO checkpoint exports to Hugging Face" "$NEOX_BIN/neox-convert" to-hf --input "$T/kto_ckpt" --output "$T/hf"
check "the export holds the trained policy, not the reference (the pre-trained weights)" $PY -c "
import subprocess
from safetensors.numpy import load_file
subprocess.run(['$NEOX_BIN/neox-convert', 'to-hf', '--input', '$T/pre', '--output', '$T/hf_pre'], check=True, capture_output=True)
a, b = load_file('$T/hf/model.safetensors'), load_file('$T/hf_pre/model.safetensors')
assert a.keys() == b.keys()
assert sum(float(abs(a[k] - b[k]).max()) > 0 for k in a) >= len(a) - 2, 'the export is the starting weights'"

kto weighted ", \"kto_undesirable_weight\": 0.0"
check "KTO with kto_undesirable_weight 0 runs" "$TRAIN" -q "$T/model.yml" "$T/weighted.yml"
check "kto_undesirable_weight 0 leaves the desirable rows' loss only: a first loss below 0.5, desirable rows learned" $PY -c "
import json
rs = list(map(json.loads, open('$T/weighted/metrics.jsonl')))
first = next(r['train/lm_loss'] for r in rs if 'train/lm_loss' in r)
assert 0.1 < first < 0.45, first  # 0.25 (S_1 + S_2): S_h the fraction of desirable rows in half h
v = [r for r in rs if 'validation/kl' in r][-1]
assert v['validation/pos_policy_logp'] > v['validation/pos_ref_logp'], v"

kto nolabels "" && sed -i -e 's/"[a-z]*_label_data_paths": \[[^]]*\],//g' -e 's/"train_iters": 30/"train_iters": 2/' "$T/nolabels.yml"
check "KTO without label datasets runs: every token of the documents scored, first loss 0.5" bash -c "
    '$TRAIN' -q '$T/model.yml' '$T/nolabels.yml' && ! grep -q label_data_paths '$T/nolabels.yml' && $PY -c \"
import json
rs = list(map(json.loads, open('$T/nolabels/metrics.jsonl')))
r = next(r for r in rs if 'train/lm_loss' in r)
w = next(r for r in map(json.loads, open('$T/kto/metrics.jsonl')) if 'train/lm_loss' in r)
assert abs(r['train/lm_loss'] - 0.5) < 1e-7, r
assert r['train/ref_logp'] < w['train/ref_logp'] < 0, (r, w)  # the prompts are scored too\""

# Refusals.
kto fewer "" && sed -i "s|\"train_reward_data_paths\": \[\"$T/train_messages_reward_document\"\]|\"train_reward_data_paths\": [\"$T/few_messages_reward_document\"]|" "$T/fewer.yml"
check_fails "a reward dataset whose length differs from its token dataset's is refused, naming both files" 1 \
    "few_messages_reward_document.idx: has 300 rewards in 300 documents, but its token dataset .*train_messages_document.idx has 400 items in 400 documents" \
    "$TRAIN" -q "$T/model.yml" "$T/fewer.yml"
check "write a reward dataset with an empty item" $PY -c "
import sys; sys.path.insert(0, 'tests/oracle')
import numpy as np
from data_oracle import write_indexed
write_indexed('$T/empty_messages_reward_document', [[1]] * 399 + [[]], np.int32)"
kto empty "" && sed -i "s|\"train_reward_data_paths\": \[\"$T/train_messages_reward_document\"\]|\"train_reward_data_paths\": [\"$T/empty_messages_reward_document\"]|" "$T/empty.yml"
check_fails "a reward dataset with an empty item is refused, naming it and the token dataset" 1 \
    "empty_messages_reward_document.idx: item 399 holds no reward \\(document 399 of .*train_messages_document.idx\\)" \
    "$TRAIN" -q "$T/model.yml" "$T/empty.yml"
kto pairwise ", \"dataset_impl\": \"pairwise\""
check_fails "KTO on pairwise data is refused" 2 "dataset_impl pairwise is preference data: set train_impl: dpo or rm" \
    "$TRAIN" -q "$T/model.yml" "$T/pairwise.yml"
kto norewards "" && sed -i 's/"valid_reward_data_paths": \[[^]]*\],//' "$T/norewards.yml"
check_fails "KTO without a split's reward datasets is refused, naming the key" 2 \
    "train_impl kto needs valid_reward_data_paths beside valid_data_paths" "$TRAIN" -q "$T/model.yml" "$T/norewards.yml"
kto normal "" && sed -i 's/"train_impl": "kto", //' "$T/normal.yml"
check_fails "reward datasets without train_impl kto are refused" 2 \
    "train_reward_data_paths: reward datasets are read by train_impl kto only" "$TRAIN" -q "$T/model.yml" "$T/normal.yml"
kto packed "" && sed -i 's/"pack_impl": "unpacked"/"pack_impl": "packed"/' "$T/packed.yml"
check_fails "reward datasets with pack_impl packed are refused" 2 \
    "reward datasets are read with pack_impl: unpacked only .* not packed" "$TRAIN" -q "$T/model.yml" "$T/packed.yml"
kto odd "" && sed 's/"train_micro_batch_size_per_gpu": 8/"train_micro_batch_size_per_gpu": 3/' "$T/model.yml" >"$T/model3.yml"
check_fails "an odd micro-batch is refused (KTO splits it into halves)" 2 \
    "train_micro_batch_size_per_gpu: train_impl kto splits each micro-batch into two halves.*it is 3" \
    "$TRAIN" -q "$T/model3.yml" "$T/odd.yml"
kto charppl ", \"char_level_ppl\": true"
check_fails "char_level_ppl is refused for KTO, naming the key" 2 "char_level_ppl: unset it for train_impl kto" \
    "$TRAIN" -q "$T/model.yml" "$T/charppl.yml"

# From chat jsonl to KTO: neox-preprocess chat --reward-key --binary-reward writes the three datasets a
# KTO run reads (GPT-NeoX's 20B tokenizer with a ChatML template); a tiny model trains on them.
TOK=$DATA/tokenizers/neox/20B_tokenizer.json
if [ -f "$TOK" ]; then
    mkdir -p "$T/tok" && cp "$TOK" "$T/tok/tokenizer.json"
    $PY -c "
import json
template = open('tests/oracle/chat_templates/chatml-qwen2.jinja').read()
json.dump({'eos_token': '<|endoftext|>', 'chat_template': template}, open('$T/tok/tokenizer_config.json', 'w'))
with open('$T/chat.jsonl', 'w') as f:
    for i in range(24):
        q = ' '.join(['word%d' % (i * 7 % 13)] * (1 + i % 4))
        good = i % 3 != 1
        answer = q.upper() if good else 'no'
        f.write(json.dumps({'messages': [{'role': 'user', 'content': q}, {'role': 'assistant', 'content': answer}],
                            'label': good}) + '\\n')"
    check "neox-preprocess chat --reward-key label --binary-reward" "$NEOX_BIN/neox-preprocess" chat --input "$T/chat.jsonl" \
        --output-prefix "$T/chat" --tokenizer-type HFTokenizer --vocab-file "$T/tok/tokenizer.json" --jsonl-keys messages \
        --reward-key label --binary-reward
    C=$T/chat_messages
    cat >"$T/chat_kto.yml" <<EOF2
{"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 64, "max_position_embeddings": 64,
 "tokenizer_type": "HFTokenizer", "vocab_file": "$T/tok/tokenizer.json", "train_micro_batch_size_per_gpu": 4,
 "train_impl": "kto", "pack_impl": "unpacked", "optimizer": {"type": "Adam", "params": {"lr": 0.001}},
 "train_iters": 3, "eval_interval": 3, "eval_iters": 1, "log_interval": 1, "log_dir": "$T/chat_log",
 "train_data_paths": ["${C}_document"], "train_label_data_paths": ["${C}_label_document"],
 "train_reward_data_paths": ["${C}_reward_document"], "valid_data_paths": ["${C}_document"],
 "valid_label_data_paths": ["${C}_label_document"], "valid_reward_data_paths": ["${C}_reward_document"],
 "test_data_paths": ["${C}_document"], "test_label_data_paths": ["${C}_label_document"],
 "test_reward_data_paths": ["${C}_reward_document"]}
EOF2
    check "KTO trains on the preprocessed chat datasets (first loss 0.5: policy = reference, every row rewarded)" \
        bash -c "'$TRAIN' -q '$T/chat_kto.yml' && $PY -c \"
import json
r = next(r for r in map(json.loads, open('$T/chat_log/metrics.jsonl')) if 'train/lm_loss' in r)
assert abs(r['train/lm_loss'] - 0.5) < 1e-7 and r['train/neg_ref_logp'] < 0 and r['train/pos_ref_logp'] < 0, r\""
else
    skip "KTO on preprocessed chat data" "$TOK is absent"
fi

# GPT-NeoX's own KTO config, with a tiny model, local data and one process: 10 steps train.
POST=$SHARED/reference/gpt-neox-post-training/configs/llama3-8b-kto.yml
if [ -f "$POST" ]; then
    check "shrink GPT-NeoX's llama3-8b-kto.yml to a tiny model with local paths" $PY -c "
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
    c[f'{split}_data_paths'] = [prefix + '_messages_document']
    c[f'{split}_label_data_paths'] = [prefix + '_messages_label_document']
    c[f'{split}_reward_data_paths'] = [prefix + '_messages_reward_document']
train_lib.write_config(c, '$T/llama3-kto.yml')"
    check "the shrunk llama3-8b-kto.yml trains 10 steps (bfloat16, checkpointed activations, ZeRO-1)" \
        "$TRAIN" -q "$T/llama3-kto.yml"
    check "its KTO loss starts at 0.5 and its metrics are logged" $PY -c "
import json
rs = list(map(json.loads, open('$T/llama3/metrics.jsonl')))
first = next(r for r in rs if 'train/lm_loss' in r)
assert abs(first['train/lm_loss'] - 0.5) < 1e-6, first
assert max(r['iteration'] for r in rs) == 10 and any('validation/policy_rewards' in r for r in rs)"
else
    skip "GPT-NeoX's llama3-8b-kto.yml trains" "$POST is absent"
fi
