# tests/tools/config.sh: the config loader through `neox-train --print-config`: every GPT-NeoX
# reference config loads or is refused naming the unsupported feature (never a crash or hang), the
# named model configs load, each error class has its message and exit status, and derived values.
source tests/lib.sh
T=$NEOX_BIN/neox-train
TINY=configs/tiny-test.yml

# ---- the reference configs -----------------------------------------------------------------------
# Model configs (those setting num_layers) are merged with local_setup.yml, as GPT-NeoX users run
# them. Exceptions, each as deepy.py would also need them:
#  - llama/* and llama2/* hold only the model; they are merged with llama/train_config.yml (optimizer,
#    batch size) as llama/README.md shows.
#  - configs that already set local_setup.yml's keys (data and checkpoint paths: 20B, pythia/14M, ...)
#    are loaded alone, since merging would set those keys twice (an error in GPT-NeoX too).
#  - setup fragments (local_setup*, slurm_local, eleutherai_cluster, docker/pythia-paths, prof,
#    sparse, text_generation, cpu_mock_config, llama/train_config) are not models; they are
#    merged with 125M.yml instead, and local_setup-like ones that clash with nothing must load.
# --world-size 8 gives every layout in these configs (model x pipe parallel up to 8) whole ranks.
POST_CONFIGS=$SHARED/reference/gpt-neox-post-training/configs
MUST_LOAD="19M 49M 125M 350M 760M 800M 1-3B 1-3B-transformer-engine 2-7B 6-7B 13B 20B 175B"
REFUSE_PATTERN="is not supported by neox.c|unknown key|cannot be set|expected a number, got a string"

load_reference() {  # load_reference WORLD_SIZE FILES...: exit status of neox-train, stderr in err.txt
    local world=$1; shift
    timeout 20 "$T" -q --world-size "$world" --print-config "$@" >"$TEST_TMP/out.txt" 2>"$TEST_TMP/err.txt"
}

if [ -d "$CONFIGS" ]; then
    for f in "$CONFIGS"/*.yml "$CONFIGS"/*/*.yml; do
        rel=${f#$CONFIGS/}; name=${rel%.yml}
        if grep -qE '"num[-_]layers"' "$f"; then
            files=("$f") world=8
            case $rel in llama/*|llama2/*|mistral/*) files+=("$CONFIGS/llama/train_config.yml") ;; esac
            if grep -qE '"(data[-_]path|vocab[-_]file|save|load|tensorboard[-_]dir)"' "$f"; then mode=alone; else files+=("$CONFIGS/local_setup.yml"); mode="with local_setup"; fi
        else
            files=("$CONFIGS/125M.yml" "$f") world=1; mode="with 125M"
            [ "$rel" = llama/train_config.yml ] && files=("$CONFIGS/llama/7B.yml" "$f" "$CONFIGS/local_setup.yml") world=1 mode="with llama/7B and local_setup"
        fi
        load_reference $world "${files[@]}"; status=$?
        must=0
        case " $MUST_LOAD " in *" $name "*) must=1 ;; esac
        case $rel in pythia/*|llama/*|llama2/*|mistral/*) must=1 ;; esac
        if [ $status = 0 ]; then
            _report 0 "reference $rel ($mode) loads"
        elif [ $status = 2 ] && [ $must = 0 ] && grep -qE "$REFUSE_PATTERN|set twice" "$TEST_TMP/err.txt"; then
            echo "# $rel: $(tail -n 1 "$TEST_TMP/err.txt")"
            _report 0 "reference $rel ($mode) refused with a reason"
        else
            echo "exit status $status" >>"$TEST_TMP/err.txt"
            _report 1 "reference $rel ($mode) $([ $must = 1 ] && echo loads || echo 'loads or is refused')" "$TEST_TMP/err.txt"
        fi
    done
    check_output "reference: 125M-dmoe.yml loads with its 8 experts" "^moe_num_experts += 8  # .*125M-dmoe.yml" \
        "$T" -q --print-config "$CONFIGS/125M-dmoe.yml" "$CONFIGS/local_setup.yml"
    # mamba and rwkv are refused for their layer type, before their activation or init methods.
    for f in "$CONFIGS"/mamba/*.yml "$CONFIGS"/rwkv/*.yml; do
        kind=$(basename "$(dirname "$f")")
        check_fails "reference: ${f#$CONFIGS/} refused for its layer type $kind" 2 \
            "key 'attention_config': layer type '$kind' .* is not supported by neox.c" \
            "$T" --print-config "$f" "$CONFIGS/local_setup.yml"
    done
    check_output "reference: 1-3B-transformer-engine.yml loads with te_mha (tests/tools/train_te.sh trains it)" \
        "^te_mha += true  # .*1-3B-transformer-engine.yml:24$" \
        "$T" -q --world-size 8 --print-config "$CONFIGS/1-3B-transformer-engine.yml" "$CONFIGS/local_setup.yml"
    check_output "reference: mistral/7B.yml loads with its sliding window" \
        "^sliding_window_width += 4096  # .*mistral/7B.yml:15$" \
        "$T" -q --world-size 8 --print-config "$CONFIGS/mistral/7B.yml" "$CONFIGS/llama/train_config.yml" "$CONFIGS/local_setup.yml"
    # Post-training configs set their own paths and load alone. SFT (label datasets, unpacked
    # samples) loads with its label paths, DPO and the reward model with their pairwise data, KTO with
    # its reward datasets; the DPO benchmarking configs stop at bf16 gradient accumulation; REINFORCE
    # is refused naming post-training until neox.c implements it.
    check_output "post-training llama3-8b-sft.yml loads with its label datasets" \
        '^train_label_data_paths += \[.*llama3_train_messages_label_document' \
        "$T" -q --world-size 8 --print-config "$POST_CONFIGS/llama3-8b-sft.yml"
    check_output "post-training llama3-8b-dpo.yml loads with its pairwise data" \
        '^neg_train_label_data_paths += \[.*llama3_dpo_train_rejected_label_document' \
        "$T" -q --world-size 8 --print-config "$POST_CONFIGS/llama3-8b-dpo.yml"
    check_output "post-training llama3-8b-rm.yml loads as a reward model with its pairwise data" \
        '^neg_train_label_data_paths += \[.*llama3_rm_train_rejected_label_document' \
        "$T" -q --world-size 8 --print-config "$POST_CONFIGS/llama3-8b-rm.yml"
    for f in "$POST_CONFIGS"/benchmarking/*.yml; do
        check_fails "post-training ${f#$POST_CONFIGS/} refused at its bf16 gradient accumulation" 2 \
            "key 'data_types.grad_accum_dtype': gradient accumulation type 'bf16' is not supported" \
            "$T" -q --world-size 8 --print-config "$f"
    done
    check_output "post-training llama3-8b-kto.yml loads with its reward datasets" \
        '^train_reward_data_paths += \[.*llama3_train_messages_reward_document' \
        "$T" -q --world-size 8 --print-config "$POST_CONFIGS/llama3-8b-kto.yml"
    for f in "$POST_CONFIGS"/llama3-8b-reinforce.yml; do
        check_fails "post-training ${f#$POST_CONFIGS/} refused naming post-training" 2 \
            "key '[a-z_]+': post-training.* is not supported by neox.c" "$T" -q --world-size 8 --print-config "$f"
    done
    check_output "reference: 125M prints key, value and file:line" \
        "^num_layers += 12  # .*125M.yml:9$" "$T" -q --print-config "$CONFIGS/125M.yml" "$CONFIGS/local_setup.yml"
else
    skip "reference configs" "$CONFIGS is absent"
fi

# rope_scaling: transformers' kinds other than linear and llama3 are refused by name.
printf 'rope_scaling:\n  rope_type: yarn\n  factor: 4.0\n' >"$TEST_TMP/yarn.yml"
check_fails "rope_scaling: yarn refused naming the sub-key" 2 "rope_scaling.rope_type.*yarn.*not supported" \
    "$T" --print-config $TINY "$TEST_TMP/yarn.yml"
printf 'rope_scaling:\n  rope_type: linear\n  factor: 0.5\n' >"$TEST_TMP/factor.yml"
check_fails "rope_scaling: a factor below 1 refused naming it" 2 "rope_scaling.factor" \
    "$T" --print-config $TINY "$TEST_TMP/factor.yml"

# context_parallel_size (our key) must divide the data-parallel ranks: one rank cannot hold two ways.
check_fails "context_parallel_size: more ways than data-parallel ranks refused naming it" 2 \
    "key 'context_parallel_size': 2 does not divide the 1 ranks of the data-parallel dimension" \
    "$T" --print-config $TINY "$(printf 'context_parallel_size: 2\n' >"$TEST_TMP/cp.yml"; echo "$TEST_TMP/cp.yml")"

# ---- printing and derived values -------------------------------------------------------------------
check_output "print: defaults and derived values are labelled" "^hidden_dropout += 0.0  # default$" \
    "$T" -q --print-config $TINY
check_output "print: batch size derived" "^train_batch_size += 8  # derived$" "$T" -q --print-config $TINY
check_output "print: data-parallel size from --world-size" "^data_parallel_size += 4  # derived$" \
    "$T" -q --world-size 4 --print-config $TINY
check_output "print: train batch with 4 ranks" "^train_batch_size += 32  # derived$" \
    "$T" -q --world-size 4 --print-config $TINY
check_output "print: lr from the optimizer dict" "^lr += 0.001  # derived$" "$T" -q --print-config $TINY
check_output "print: betas from the optimizer dict" "^adam_beta2 += 0.95  # derived$" "$T" -q --print-config $TINY
check_output "print: zero stage from zero_optimization" "^zero_stage += 1  # derived$" "$T" -q --print-config $TINY
check_output "print: lr_decay_iters defaults to train_iters" "^lr_decay_iters += 100  # derived$" "$T" -q --print-config $TINY
check_output "print: warmup iters = warmup x lr_decay_iters" "^warmup_iters += 10.0  # derived$" "$T" -q --print-config $TINY
check_output "print: precision fp32 without fp16/bf16 dicts" "^precision += fp32  # derived$" "$T" -q --print-config $TINY
check_output "print: attention_config expanded per layer" "^attention_config += \[global, global\]  # derived$" \
    "$T" -q --print-config $TINY
check_output "print: own key compute_backend" "^compute_backend += cpu  # configs/tiny-test.yml:" "$T" -q --print-config $TINY
check_output "print: json format" '"train_batch_size": \{' "$T" -q --print-config --print-config-format json $TINY
check_output "neox-eval --print-config uses the same loader" "^train_batch_size += 8  # derived$" \
    "$NEOX_BIN/neox-eval" --print-config $TINY
check_output "neox-convert --print-config uses the same loader" "^train_batch_size += 8  # derived$" \
    "$NEOX_BIN/neox-convert" --print-config $TINY
check_fails "ignored keys listed in one notice" 0 "notice: .*no effect.*steps_per_print, hostfile" \
    bash -c "printf '{steps_per_print: 5, hostfile: /x}\n' >$TEST_TMP/ign.yml && $T --print-config $TINY $TEST_TMP/ign.yml"

# ---- error classes ------------------------------------------------------------------------------------
cfg() { printf '%s\n' "$2" >"$TEST_TMP/$1.yml"; echo "$TEST_TMP/$1.yml"; }
MODEL='num_layers: 2, hidden_size: 64, num_attention_heads: 4, max_position_embeddings: 64, train_micro_batch_size_per_gpu: 1' 

check_fails "error: unknown key with suggestion" 2 "unk.yml:1: unknown key 'hiden_size'; did you mean 'hidden_size'\?" \
    "$T" --print-config $TINY "$(cfg unk '{"hiden_size": 64}')"
check_fails "error: dashes and underscores are one key (duplicate across files)" 2 \
    "dup.yml:2: key 'num_layers' is set twice: first at configs/tiny-test.yml:6" \
    "$T" --print-config $TINY "$(cfg dup $'# again\nnum-layers: 4')"
check_fails "error: duplicate key within one file" 2 "dup1.yml:2: duplicate key 'seed' \(first set at line 1\)" \
    "$T" --print-config $TINY "$(cfg dup1 $'seed: 1\nseed: 2')"
check_fails "error: wrong type" 2 "type.yml:1: key 'eval_iters': expected an integer, got a string \(abc\)" \
    "$T" --print-config $TINY "$(cfg type 'eval_iters: abc')"
check_output "a number key takes a float written without a dot (a string to YAML 1.1) as the number" \
    "init_method_std += 0\.02 +# .*float\.yml:1" "$T" --print-config $TINY "$(cfg float 'init_method_std: 2e-2')"
check_fails "error: quoted, it is a string" 2 "key 'init_method_std': expected a number, got the string '2e-2' \(quoted" \
    "$T" --print-config $TINY "$(cfg quoted "init_method_std: '2e-2'")"
check_fails "error: out of range" 2 "range.yml:1: key 'hidden_dropout': 1.5 is out of range \(must be between 0 and 1\)" \
    "$T" --print-config $TINY "$(cfg range 'hidden_dropout: 1.5')"
check_fails "error: bad choice" 2 "choice.yml:1: key 'checkpoint_scale': 'sawtooth' is not one of: linear, log" \
    "$T" --print-config $TINY "$(cfg choice 'checkpoint_scale: sawtooth')"
check_fails "error: inconsistent batch sizes" 2 "key 'train_batch_size': inconsistent batch sizes: train_batch_size 10 != train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 2 x data-parallel size 1" \
    "$T" --print-config $TINY "$(cfg batch 'train_batch_size: 10')"
check_fails "error: world size not divisible" 2 "world size 3 is not divisible by pipe_parallel_size x model_parallel_size \(1 x 2\)" \
    "$T" --world-size 3 --print-config "$(cfg mp $'{num_layers: 2, hidden_size: 64, num_attention_heads: 4, max_position_embeddings: 64,\n model_parallel_size: 2, train_micro_batch_size_per_gpu: 1}')"
check_fails "error: unsupported feature (rpe)" 2 "rpe.yml:1: key 'pos_emb': position embedding 'rpe' is not supported by neox.c" \
    "$T" --print-config "$(cfg rpe "{pos_emb: rpe, $MODEL}")"
check "pos_emb: alibi loads" "$T" --print-config "$(cfg alibi "{pos_emb: alibi, $MODEL}")"
check_fails "rotary keys beside pos_emb alibi are named in a notice" 0 \
    "notice: config keys with no effect with pos_emb alibi \(they configure rotary embeddings\): rotary_pct, rotary_emb_base" \
    "$T" --print-config "$(cfg alibirot "{pos_emb: alibi, rotary_pct: 0.5, rotary_emb_base: 500, $MODEL}")"
check "with pos_emb rotary they are not" bash -c \
    "! '$T' --print-config '$(cfg rot "{pos_emb: rotary, rotary_pct: 0.5, $MODEL}")' 2>&1 >/dev/null | grep -q 'they configure rotary'"
check_fails "error: SM3 refuses a beta of 1, naming it" 2 "params.beta = 1: sm3 needs a beta in \\[0, 1\\)" \
    "$T" --print-config "$(cfg sm3 $'{num_layers: 2, hidden_size: 64, num_attention_heads: 4, max_position_embeddings: 64,\n train_micro_batch_size_per_gpu: 1, optimizer: {type: SM3, params: {lr: 0.001, beta: 1}}}')"
check_fails "error: unsupported attention type" 2 "attention type 'local' is not supported by neox.c" \
    "$T" --print-config $TINY "$(cfg local 'attention_config: [[[global, local], 1]]')"
check_fails "error: attention_config counts must sum to num_layers" 2 "key .attention_config.: covers more than num_layers \\(2\\) layers" \
    "$T" --print-config $TINY "$(cfg att3 'attention_config: [[[global], 3]]')"
check_fails "error: derived key cannot be set" 2 "key 'zero_stage' is derived from other keys" \
    "$T" --print-config $TINY "$(cfg derived 'zero_stage: 2')"
check_fails "error: malformed YAML names the line" 2 "bad.yml:4:1: malformed YAML: did not find expected ',' or ']' \\(while parsing a flow sequence at line 3\\)" \
    "$T" --print-config $TINY "$(cfg bad $'{\n  "seed": 1,\n  "x": [1, 2\n}')"
check_fails "error: empty file" 2 "empty.yml: empty config file" "$T" --print-config $TINY "$(cfg empty '')"
check_fails "error: top level not a mapping" 2 "list.yml:1: the top level of a config must be a mapping" \
    "$T" --print-config $TINY "$(cfg list '[1, 2]')"
check_fails "error: missing file (exit 1, an I/O failure)" 1 "no-such-file.yml" "$T" --print-config "$TEST_TMP/no-such-file.yml"
check_fails "error: unknown --print-config-format" 2 "not 'text' or 'json'" "$T" --print-config --print-config-format xml $TINY

# ---- dict sub-keys, refusals, values parsed at load ---------------------------------------------------
# Every dict with sub-keys: its longest sub-key misspelt is an error suggesting it; every refused key and
# sub-key (and every refused value of a key) is an error naming it (cases generated from the schema).
for mode in typos refusals; do
    python3 tests/tools/config_cases.py $mode "$T" lib/config/schema_gen.c "$TEST_TMP" || _report 1 "config cases: $mode ran"
done
check_fails "sub-key: misspelt fp16 key names the path, file:line and the key meant" 2 \
    "sub.yml:1: unknown key 'fp16.loss_scale_windw'; did you mean 'fp16.loss_scale_window'\?" \
    "$T" --print-config "$(cfg sub "{fp16: {enabled: true, loss_scale_windw: 500}, $MODEL}")"
check_fails "sub-key: unknown zero_optimization.foo is an error" 2 "unknown key 'zero_optimization.foo'" \
    "$T" --print-config "$(cfg zfoo "{zero_optimization: {stage: 1, foo: 1}, $MODEL}")"
check_fails "sub-key: dashes are not underscores inside DeepSpeed's dicts" 2 \
    "unknown key 'fp16.loss-scale-window'; did you mean 'fp16.loss_scale_window'\?" \
    "$T" --print-config "$(cfg dash "{fp16: {enabled: true, loss-scale-window: 500}, $MODEL}")"
check_fails "sub-key: value type-checked with file:line" 2 "subt.yml:2: key 'zero_optimization.overlap_comm': expected true or false" \
    "$T" --print-config "$(cfg subt $'{'"$MODEL"$',\n zero_optimization: {overlap_comm: 3}}')"
check_fails "sub-key: value range-checked" 2 "key 'zero_optimization.reduce_bucket_size': 0 is out of range" \
    "$T" --print-config "$(cfg subr "{zero_optimization: {reduce_bucket_size: 0}, $MODEL}")"
check "ZeRO stage 3 loads" "$T" --print-config "$(cfg z3 "{zero_optimization: {stage: 3}, $MODEL}")"
check_fails "ZeRO stage 4 is out of range" 2 "key 'zero_optimization.stage': 4 is out of range" \
    "$T" --print-config "$(cfg z4 "{zero_optimization: {stage: 4}, $MODEL}")"
check "zero_optimization.cpu_offload: true loads (optimizer offload)" \
    "$T" --print-config "$(cfg coff "{zero_optimization: {stage: 2, cpu_offload: true}, $MODEL}")"
check "offload_optimizer to cpu loads" \
    "$T" --print-config "$(cfg ooff "{zero_optimization: {stage: 2, offload_optimizer: {device: cpu, pin_memory: true}}, $MODEL}")"
check_fails "offload_param to cpu refused by name" 2 "key 'zero_optimization.offload_param.device': ZeRO parameter offload is not supported" \
    "$T" --print-config "$(cfg poff "{zero_optimization: {stage: 3, offload_param: {device: cpu}}, $MODEL}")"
check_output "offload_optimizer with device none loads (switched off)" "^zero_stage += 2  # derived$" \
    "$T" -q --print-config "$(cfg onone "{zero_optimization: {stage: 2, offload_optimizer: {device: none, pin_memory: true}}, $MODEL}")"
check_output "optimizer cpu_torch_adam loads with Adam's parameters" "^adam_beta2 += 0.95  # derived$" \
    "$T" -q --print-config "$(cfg cta "{optimizer: {type: cpu_torch_adam, params: {lr: 0.001, betas: [0.9, 0.95]}}, $MODEL}")"
check_output "optimizer lion loads with its betas (default 0.9, 0.99)" "^lion_beta2 += 0.99  # derived$" \
    "$T" -q --print-config "$(cfg lionok "{optimizer: {type: lion, params: {lr: 0.0001}}, $MODEL}")"
check_output "optimizer madgrad_wd loads with its momentum and eps" "^madgrad_eps += 1e-05  # derived$" \
    "$T" -q --print-config "$(cfg mgw "{optimizer: {type: madgrad_wd, params: {lr: 0.01, momentum: 0.5, eps: 1.0e-5}}, $MODEL}")"
check_output "optimizer SM3 loads with torch_optimizer's defaults (momentum 0, beta 0, eps 1e-30)" "^sm3_eps += 1e-30  # derived$" \
    "$T" -q --print-config "$(cfg sm3ok "{optimizer: {type: SM3, params: {lr: 0.01}}, $MODEL}")"
check_fails "lion refuses a param it does not take, naming it" 2 "params.momentum is not supported for optimizer 'lion'" \
    "$T" --print-config "$(cfg lionmom "{optimizer: {type: lion, params: {lr: 0.0001, momentum: 0.9}}, $MODEL}")"
check_fails "zero_allow_untested_optimizer must be a boolean" 2 "zero_allow_untested_optimizer" \
    "$T" --print-config "$(cfg untested "{deepspeed_extra_args: {zero_allow_untested_optimizer: maybe}, $MODEL}")"
check_output "cpu_offload: false (as GPT-NeoX's configs write it) loads" "^zero_stage += 1  # derived$" \
    "$T" -q --print-config "$(cfg cofff "{zero_optimization: {stage: 1, cpu_offload: false}, $MODEL}")"
check_fails "split is parsed when the config loads (--print-config fails, file:line)" 2 \
    "split.yml:1: key 'split': split 'a,b': expected up to three numbers" \
    "$T" --print-config $TINY "$(cfg split 'split: "a,b"')"
check_output "pack_impl unpacked loads (implemented by the data layer)" "^pack_impl += unpacked  # " \
    "$T" -q --print-config $TINY "$(cfg pack 'pack_impl: unpacked')"
check_fails "communication_data_type checked when the config loads" 2 "key 'communication_data_type': 'fp8' is not one of: fp32, fp16, bf16" \
    "$T" --print-config $TINY "$(cfg cdt 'communication_data_type: fp8')"
check_fails "padded_vocab_size that the tokenizer contradicts is refused, file:line" 2 \
    "pvs.yml:1: key 'padded_vocab_size': 1000 does not match the tokenizer's vocabulary padded to 512" \
    "$T" -q $TINY "$(cfg pvs 'padded_vocab_size: 1000')"
check_output "ignored keys at every depth listed once each" '^1 1 1 1 0$' bash -c \
    "$T --print-config $TINY '$(cfg ign2 '{fp16: {enabled: true, fp16: true}, bf16: {loss_scale_window: 5}, flops_profiler: {enabled: false, profile_step: 1}, steps_per_print: 3}')' 2>&1 >/dev/null |
     grep 'no effect' | python3 -c 'import sys; t = sys.stdin.read().split(\"settings): \")[1].strip().split(\", \"); print(*[t.count(k) for k in (\"fp16.fp16\", \"bf16.loss_scale_window\", \"flops_profiler\", \"steps_per_print\", \"flops_profiler.profile_step\")])'"
check_fails "a top-level key GPT-NeoX owns is refused inside deepspeed_extra_args" 2 \
    "key 'deepspeed_extra_args.zero_optimization': deepspeed_extra_args overriding GPT-NeoX's own key \(set the top-level key 'zero_optimization'\)" \
    "$T" --print-config "$(cfg dsx "{deepspeed_extra_args: {zero_optimization: {stage: 3}}, $MODEL}")"
check_output "new GPT-NeoX keys (neox_args.py) are known: wandb_run_name and comet_experiment accepted, peak_theoretical_tflops used" "^peak_theoretical_tflops += 989.0  # " \
    "$T" -q --print-config "$(cfg newkeys "{wandb_run_name: run1, comet_experiment: x, z_loss: 0.1, peak_theoretical_tflops: 989.0, $MODEL}")"

# (That the generated key table is exactly the generator's output: tests/tools/generated.sh.)
# Keys are identifiers checked by the compiler: a misspelt key does not build, a right one does.
printf '#include "config.h"\nlong f(const neox_config *c) { return (long)neox_config_int(c, %s); }\n' seq_length >"$TEST_TMP/key_ok.c"
printf '#include "config.h"\nlong f(const neox_config *c) { return (long)neox_config_int(c, %s); }\n' seq_lenght >"$TEST_TMP/key_typo.c"
check "a key of the schema compiles" cc -std=c11 -Wall -Werror -Ilib -c "$TEST_TMP/key_ok.c" -o "$TEST_TMP/key_ok.o"
check_fails "a misspelt key fails to compile, naming it" 1 "NEOX_K_seq_lenght" \
    cc -std=c11 -Wall -Werror -Ilib -c "$TEST_TMP/key_typo.c" -o "$TEST_TMP/key_typo.o"
