# tests/tools/train_rm.sh: neox-train with train_impl: rm on pairwise data. A small language model is
# pre-trained on Tiny Shakespeare; a reward model starts from its checkpoint (the value head new, the
# rest loaded) and trains on pairs from tests/tools/dpo_pairs.py in its reward-model form (a shared
# prompt; chosen = the true continuation, rejected = its letters replaced by random ones; only the final EOD
# labelled, as --for-rm writes data; shorter than seq_length + 1, as GPT-NeoX's pairwise index skips a
# side whose first seq_length labels are all masked), validated on pairs from a later part of the text. Training must
# start near log 2 and raise the held-out accuracy; a stopped and resumed run must repeat the straight
# run bit for bit; z_loss must shrink the rewards. The export must load in transformers as
# ...ForSequenceClassification, whose logits equal neox.c's values on the held-out sequences and rank
# them as the training did. Bad inputs and unsupported combinations are refused by name.
source tests/lib.sh

NAME="neox-train rm"
PRETRAINED="the language model"
source tests/post_training_tool_setup.sh
check "write the training pairs" $PY tests/tools/dpo_pairs.py "$TEXT" "$T/train" 0 400 24 20 1 rm
check "write the held-out pairs" $PY tests/tools/dpo_pairs.py "$TEXT" "$T/valid" 400000 64 24 20 2 rm

pairs() {  # pairs SPLIT PREFIX: the four pos/neg keys of a split
    echo "\"pos_$1_data_paths\": [\"${2}_chosen_document\"], \"neg_$1_data_paths\": [\"${2}_rejected_document\"],
      \"pos_$1_label_data_paths\": [\"${2}_chosen_label_document\"],
      \"neg_$1_label_data_paths\": [\"${2}_rejected_label_document\"]"
}
# rm NAME EXTRA: $T/NAME.yml, a reward model started from the pre-trained model, logging to $T/NAME.
rm_config() {
    cat >"$T/$1.yml" <<EOF2
{"train_impl": "rm", "dataset_impl": "pairwise", "pack_impl": "unpacked", "allow_chopped": false,
 "optimizer": {"type": "Adam", "params": {"lr": 0.001}}, "train_iters": 40, "eval_interval": 10,
 "load": "$T/pre", "finetune": true, "log_dir": "$T/$1", $(pairs train "$T/train"), $(pairs valid "$T/valid"),
 $(pairs test "$T/valid") $2}
EOF2
}
rm_config rm ", \"save\": \"$T/rm_ckpt\", \"checkpoint_factor\": 40"
check "the reward model trains" sh -c "'$TRAIN' '$T/model.yml' '$T/rm.yml' >'$T/rm.out' 2>&1"
check "it starts from the language model's checkpoint, its value head new" \
    grep -q "holds a language model: the reward model's value head (score.weight) starts from its initialisation" "$T/rm.out"
check "the reward model starts near log 2, learns, and logs GPT-NeoX's metrics" $PY -c "
import json, math
rs = list(map(json.loads, open('$T/rm/metrics.jsonl')))
train = [r for r in rs if 'train/lm_loss' in r]
assert abs(train[0]['train/lm_loss'] - math.log(2)) < 0.1, train[0]
for k in ('pos_values', 'neg_values', 'margin', 'accuracy'):
    assert all('train/' + k in r for r in train), k
    assert any('validation/' + k in r for r in rs) and any('test/' + k in r for r in rs), k
loss = [r['train/lm_loss'] for r in train]
assert sum(loss[-5:]) / 5 < 0.5 * sum(loss[:5]) / 5, loss
v = [r for r in rs if 'validation/accuracy' in r]
assert v[-1]['validation/accuracy'] >= 0.9 and v[-1]['validation/margin'] > 1.0, v[-1]"
# The same start evaluated before learning anything (one step at learning rate 0): the held-out
# accuracy and margin rise from there.
rm_config start "" && sed -i 's/"lr": 0.001/"lr": 0.0/; s/"train_iters": 40, "eval_interval": 10/"train_iters": 1, "eval_interval": 1/' "$T/start.yml"
check "the untrained reward model evaluates" "$TRAIN" -q "$T/model.yml" "$T/start.yml"
check "held-out accuracy and margin rise with training" $PY -c "
import json
start = [r for r in map(json.loads, open('$T/start/metrics.jsonl')) if 'validation/accuracy' in r][0]
end = [r for r in map(json.loads, open('$T/rm/metrics.jsonl')) if 'validation/accuracy' in r][-1]
assert start['validation/accuracy'] <= 0.75 and end['validation/accuracy'] >= start['validation/accuracy'] + 0.2, (start, end)
assert end['validation/margin'] > start['validation/margin'] + 1.0, (start, end)"
check "the log line carries the evaluation's reward metrics" \
    grep -q "validation results at iteration 10 | lm_loss value: .* pos_values value: .* accuracy value: " "$T/rm.out"

# Stopped at 10 and resumed from the reward model's own checkpoint (its value head read back).
rm_config part1 ", \"save\": \"$T/part_ckpt\", \"checkpoint_factor\": 10, \"exit_interval\": 10"
check "reward model: the first 10 steps" "$TRAIN" -q "$T/model.yml" "$T/part1.yml"
# The device path (value gradients to the device, values to the host) on the emulated device, whose
# memory faults when host code touches it: the first 10 steps equal the CPU's bit for bit.
rm_config emulated ", \"exit_interval\": 10, \"compute_backend\": \"emulated\""
check "reward model on the emulated device" "$TRAIN" -q "$T/model.yml" "$T/emulated.yml"
check "the emulated device repeats the CPU's steps bit for bit" $LIB same "$T/part1/metrics.jsonl" \
    "$T/emulated/metrics.jsonl" train/lm_loss,train/grad_norm,train/margin,validation/lm_loss,validation/accuracy

sed -e "s|\"load\": \"$T/pre\", \"finetune\": true|\"load\": \"$T/part_ckpt\"|" -e "s|, \"exit_interval\": 10||" \
    "$T/part1.yml" >"$T/part2.yml"
check "reward model: resumed for the rest" "$TRAIN" -q "$T/model.yml" "$T/part2.yml"
check "a resumed reward model repeats the straight run bit for bit (losses, metrics, evaluations)" $LIB same \
    "$T/rm/metrics.jsonl" "$T/part1/metrics.jsonl" \
    train/lm_loss,train/grad_norm,train/margin,train/pos_values,train/accuracy,validation/lm_loss,validation/margin,test/lm_loss

rm_config zloss ", \"z_loss\": 0.5, \"save\": \"$T/z_ckpt\", \"checkpoint_factor\": 40"
check "a reward model with z_loss trains" "$TRAIN" -q "$T/model.yml" "$T/zloss.yml"

# The exports, read by transformers; neox.c's values on the same sequences from the parity driver.
check "the reward model exports as ...ForSequenceClassification with a pad token" \
    "$CONVERT" to-hf --input "$T/rm_ckpt" --output "$T/hf" --pad-token-id 1
check "the z_loss reward model exports" "$CONVERT" to-hf --input "$T/z_ckpt" --output "$T/hf_z" --pad-token-id 1
check "transformers' logits are neox.c's values at the reward position, rank held-out pairs, and z_loss shrinks them" \
    env OMP_NUM_THREADS=2 $PY tests/tools/rm_export_check.py "$T/hf" "$T/hf_z" "$T/valid" "$T/check"
check_fails "from-hf refuses a ...ForSequenceClassification folder by name" 2 \
    "architectures 'GPTNeoXForSequenceClassification': from-hf imports language models" \
    "$CONVERT" from-hf --input "$T/hf" --output "$T/back"
check_fails "--pad-token-id outside the vocabulary is refused" 2 "--pad-token-id 100000 is outside the model's vocabulary" \
    "$CONVERT" to-hf --input "$T/rm_ckpt" --output "$T/hf_bad" --pad-token-id 100000
check "nothing is left of the refused export" test ! -e "$T/hf_bad"

# Refusals.
rm_config nolabels "" && $PY -c "
import json
c = json.load(open('$T/nolabels.yml'))
json.dump({k: v for k, v in c.items() if 'label_data_paths' not in k}, open('$T/nolabels.yml', 'w'))"
check_fails "a reward model without label datasets is refused" 2 "train_impl rm reads each sequence's reward at its one labelled position" \
    "$TRAIN" -q "$T/model.yml" "$T/nolabels.yml"
rm_config eodmask ", \"eod_mask_loss\": true"
check_fails "a sequence whose reward position is masked names the side and the keys" 1 \
    "train_impl rm: the chosen sequence of pair 0 of a training micro-batch at iteration 1 has 0 scored positions.*pos_\*_label_data_paths" \
    "$TRAIN" -q "$T/model.yml" "$T/eodmask.yml"
rm_config tied "" && sed -i 's/"load": "[^"]*", "finetune": true, //' "$T/tied.yml"
sed 's/"no_weight_tying": true/"no_weight_tying": false/' "$T/model.yml" >"$T/tied_model.yml"
check_fails "a tied reward model is refused" 2 "cannot be the input embedding; set no_weight_tying: true" \
    "$TRAIN" -q "$T/tied_model.yml" "$T/tied.yml"
rm_config packed ", \"pack_impl\": \"pack_until_overflow\"" && sed -i 's/"pack_impl": "unpacked", //' "$T/packed.yml"
check_fails "pack_until_overflow is refused for reward models by name" 2 "pack_impl: pack_until_overflow puts several pairs in a row" \
    "$TRAIN" -q "$T/model.yml" "$T/packed.yml"
rm_config nopair "" && sed -i 's/"dataset_impl": "pairwise", //' "$T/nopair.yml"
check_fails "train_impl rm without pairwise data is refused" 2 "train_impl rm trains on pairs: set dataset_impl: pairwise" \
    "$TRAIN" -q "$T/model.yml" "$T/nopair.yml"
rm_config resumelm "" && sed -i 's/"finetune": true/"finetune": false/' "$T/resumelm.yml"
check_fails "resuming a language model's checkpoint as a reward model needs finetune" 2 \
    "holds a language model .no value head score.weight.; start a reward model from it with finetune: true" \
    "$TRAIN" -q "$T/model.yml" "$T/resumelm.yml"
echo "{\"train_iters\": 1, \"data_path\": \"$T/char_text_document\", \"load\": \"$T/rm_ckpt\"}" >"$T/lm_from_rm.yml"
check_fails "a language model cannot be read from a reward model's checkpoint" 2 "the checkpoint holds a reward model" \
    "$TRAIN" -q "$T/model.yml" "$T/lm_from_rm.yml"
echo "{\"train_iters\": 1, \"data_path\": \"$T/char_text_document\", \"z_loss\": 0.1}" >"$T/zlm.yml"
check_fails "z_loss without train_impl rm is refused" 2 "z_loss: the penalty on squared rewards applies to train_impl rm only" \
    "$TRAIN" -q "$T/model.yml" "$T/zlm.yml"
check_fails "neox-eval refuses a reward model by name" 2 "train_impl rm: a reward model gives one value per sequence" \
    "$NEOX_BIN/neox-eval" -q --tasks valid "$T/model.yml" "$T/rm.yml"

# GPT-NeoX's own reward-model config, with a tiny model, local data and one process: 10 steps train.
POST=$SHARED/reference/gpt-neox-post-training/configs/llama3-8b-rm.yml
if [ -f "$POST" ]; then
    check "shrink GPT-NeoX's llama3-8b-rm.yml to a tiny model with local paths" $PY -c "
import sys, yaml
sys.path.insert(0, 'tests/tools')
import train_lib
c = yaml.safe_load(open('$POST'))
c.update(num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2, intermediate_size=128, mlp_multiple_of=128,
         seq_length=48, max_position_embeddings=48, model_parallel_size=1, train_micro_batch_size_per_gpu=4,
         gradient_accumulation_steps=2, train_iters=10, lr_decay_iters=10, eval_interval=5, eval_iters=1,
         attention_config=[[['flash'], 2]], tokenizer_type='CharLevelTokenizer', save='$T/llama3_ckpt', load=None,
         finetune=False, use_wandb=False, log_dir='$T/llama3')
c.pop('vocab-file')
for split, prefix in (('train', '$T/train'), ('valid', '$T/valid'), ('test', '$T/valid')):
    c[f'pos_{split}_data_paths'] = [prefix + '_chosen_document']
    c[f'neg_{split}_data_paths'] = [prefix + '_rejected_document']
    c[f'pos_{split}_label_data_paths'] = [prefix + '_chosen_label_document']
    c[f'neg_{split}_label_data_paths'] = [prefix + '_rejected_label_document']
train_lib.write_config(c, '$T/llama3-rm.yml')"
    check "the shrunk llama3-8b-rm.yml trains 10 steps (bfloat16, checkpointed activations, ZeRO-1 config)" \
        "$TRAIN" -q "$T/llama3-rm.yml"
    check "its loss starts near log 2 and its reward metrics are logged" $PY -c "
import json, math
rs = list(map(json.loads, open('$T/llama3/metrics.jsonl')))
first = next(r for r in rs if 'train/lm_loss' in r)
assert abs(first['train/lm_loss'] - math.log(2)) < 0.1, first
assert max(r['iteration'] for r in rs) == 10 and any('validation/accuracy' in r for r in rs)"
    check "its checkpoint exports as LlamaForSequenceClassification" "$CONVERT" to-hf --input "$T/llama3_ckpt" \
        --output "$T/hf_llama3" --pad-token-id 1
    check "config.json names the class, one label and the pad token" $PY -c "
import json
c = json.load(open('$T/hf_llama3/config.json'))
assert c['architectures'] == ['LlamaForSequenceClassification'] and c['id2label'] == {'0': 'LABEL_0'}, c
assert c['pad_token_id'] == 1, c"
else
    skip "GPT-NeoX's llama3-8b-rm.yml trains" "$POST is absent"
fi
