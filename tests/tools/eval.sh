# tests/tools/eval.sh: neox-eval end to end on a tiny char-level model trained here: the CLI, the
# results table and eval_results JSON file, the test-split loss equal to training's, generation
# (KV cache equal to recomputation, also when sampling; unconditional samples; interactive; a
# prompt longer than the context), and malformed task files failing with file:line.
# The numbers themselves are checked against transformers in tests/oracle/test_eval.py.
source tests/lib.sh


check_output "--help" 'generate' $EVAL --help
check_output "--version" 'neox' $EVAL --version
check_output "--print-config still works" 'eval_tasks' $EVAL --print-config configs/tiny-test.yml
check_fails "no config is a usage error" 2 'no config file' $EVAL
check_fails "unknown option" 2 'unrecognized option' $EVAL --bogus x.yml
check_fails "generate: unknown option" 2 'unrecognized option' $EVAL generate --bogus x.yml
printf 'context_parallel_size: 2\n' >"$T/cp2.yml"
check_fails "context_parallel_size refused by name" 2 "key 'context_parallel_size' 2: neox-eval scores whole" \
    $EVAL configs/tiny-test.yml "$T/cp2.yml"
# neox-eval runs itself again with a passive OpenMP wait policy unless the user chose one.
check_output "OMP_WAIT_POLICY unset: restarted once with passive" '^1$' sh -c \
    "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT NEOX_LOG_LEVEL=debug $EVAL --version 2>&1 | grep -c 'running again with OMP_WAIT_POLICY=passive'"
check_output "OMP_WAIT_POLICY set: kept" '^0$' sh -c \
    "OMP_WAIT_POLICY=active NEOX_LOG_LEVEL=debug $EVAL --version 2>&1 | grep -c 'running again' || :"
check_output "GOMP_SPINCOUNT set: kept" '^0$' sh -c \
    "env -u OMP_WAIT_POLICY GOMP_SPINCOUNT=1000 NEOX_LOG_LEVEL=debug $EVAL --version 2>&1 | grep -c 'running again' || :"

need_shared "neox-eval" || exit 0
[ -f "$DATA/text/tinyshakespeare_input.txt" ] || { skip "neox-eval" "no Tiny Shakespeare in $DATA/text"; exit 0; }

python3 tests/tools/train_lib.py paragraphs "$DATA/text/tinyshakespeare_input.txt" "$T/text.jsonl"
check "preprocess (char-level)" $NEOX_BIN/neox-preprocess --input "$T/text.jsonl" --output-prefix "$T/char" \
    --tokenizer-type CharLevelTokenizer --append-eod
cat >"$T/model.yml" <<EOF
{
  "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 48, "max_position_embeddings": 48,
  "pos_emb": "rotary", "rotary_pct": 0.5, "gpt_j_residual": true, "no_weight_tying": true,
  "optimizer": {"type": "Adam", "params": {"lr": 0.01}}, "lr_decay_style": "constant",
  "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
  "train_iters": 12, "eval_interval": 12, "eval_iters": 2, "log_interval": 4,
  "data_path": "$T/char_text_document", "tokenizer_type": "CharLevelTokenizer",
  "save": "$T/ckpt", "load": "$T/ckpt", "checkpoint_factor": 12, "log_dir": "$T/log"
}
EOF
check "train a tiny model" $NEOX_BIN/neox-train -q "$T/model.yml"

# ---- evaluation -----------------------------------------------------------------------------
check_output "valid and test perplexity table" '^\|test +\| +[0-9]+\|lm_loss +\|' \
    $EVAL -q "$T/model.yml" --results-prefix "$T/split"
results_ok() {  # the JSON has every metric and its stderr, and test lm_loss equals training's
    python3 - "$T" <<'PY'
import glob, json, sys
t = sys.argv[1]
files = glob.glob(f"{t}/split_eval_results_*.json")
assert len(files) == 1, files
r = json.load(open(files[0]))["results"]
assert set(r) == {"validation", "test"}, r
for task in r.values():
    for k in ("lm_loss,none", "lm_loss_stderr,none", "lm_loss_ppl,none", "lm_loss_ppl_stderr,none"):
        assert k in task, (k, task)
logged = [json.loads(l) for l in open(f"{t}/log/metrics.jsonl")]
want = [x["test/lm_loss"] for x in logged if "test/lm_loss" in x][-1]
assert abs(r["test"]["lm_loss,none"] - want) <= 1e-6 * abs(want), (r["test"], want)
PY
}
check "results JSON; test loss equals training's" results_ok

# ---- checkpoints of other layouts (neox-convert reshard) give the same numbers ---------------
printf '{"context": "ROMEO: I", "choices": [" love", " hate", " am"], "label": 0}\n{"context": "KING", "choices": [" HENRY", " LEAR"], "label": 1}\n' >"$T/mc.jsonl"
printf '{"text": "First Citizen:\\nBefore we proceed any further, hear me speak. All: Speak, speak."}\n' >"$T/roll.jsonl"
LAYOUT_TASKS="test,mc:$T/mc.jsonl,rolling:$T/roll.jsonl"
check "evaluate the original checkpoint" $EVAL -q "$T/model.yml" --tasks "$LAYOUT_TASKS" --results-prefix "$T/orig"
for layout in "tp 2" "pp 2" "tp 2 --pp 2"; do
    name=$(echo "$layout" | tr -d ' -')
    check "reshard to --$layout" $NEOX_BIN/neox-convert reshard --input "$T/ckpt" --output "$T/ckpt_$name" --$layout
    sed "s|\"load\": \"$T/ckpt\"|\"load\": \"$T/ckpt_$name\"|" "$T/model.yml" >"$T/model_$name.yml"
    check "evaluate the --$layout checkpoint" $EVAL -q "$T/model_$name.yml" --tasks "$LAYOUT_TASKS" --results-prefix "$T/$name"
    check "--$layout: the same results" python3 -c '
import glob, json, sys
r = [json.load(open(glob.glob(p + "_eval_results_*.json")[0]))["results"] for p in sys.argv[1:]]
assert r[0] == r[1], r
' "$T/orig" "$T/$name"
done

# --bootstrap-iters 0, as the harness's bootstrap_iters=0: no standard error at all.
printf '{"context": "ROMEO:", "continuation": " I"}\n{"context": "KING", "continuation": " HENRY"}\n' >"$T/ll.jsonl"
check "--bootstrap-iters 0: every standard error N/A" $EVAL -q "$T/model.yml" --tasks "mc:$T/mc.jsonl,loglikelihood:$T/ll.jsonl" \
    --bootstrap-iters 0 --results-prefix "$T/noboot"
check "--bootstrap-iters 0: results" python3 -c '
import glob, json, sys
r = json.load(open(glob.glob(sys.argv[1] + "_eval_results_*.json")[0]))["results"]
se = [v for t in r.values() for k, v in t.items() if "_stderr," in k]
assert len(se) == 4 and all(v == "N/A" for v in se), r
' "$T/noboot"
check_fails "--bootstrap-iters: not a number" 2 "bootstrap-iters: 'x'" $EVAL --bootstrap-iters x "$T/model.yml"

# ---- malformed task files -------------------------------------------------------------------
printf '{"context": "a", "choices": ["b", "c"], "label": 0}\n{"context": "a", "choices": ["b"], "label": 3}\n' >"$T/bad_label.jsonl"
printf '{"context": "a", "choices": ["b", "c"], "label": 0}\n{"context": "a", "choices": \n' >"$T/bad_json.jsonl"
printf '{"context": "a", "choices": ["b", "c"], "label": 0}\n\n' >"$T/empty_line.jsonl"
printf '{"context": "a"}\n' >"$T/no_continuation.jsonl"
printf '{"context": "a", "choices": ["b", 7], "label": 0}\n' >"$T/choice_type.jsonl"
printf '{"text": 5}\n' >"$T/text_type.jsonl"
check_fails "mc: label out of range names file:line" 2 'bad_label.jsonl:2: label 3 is out of range' \
    $EVAL -q "$T/model.yml" --tasks "mc:$T/bad_label.jsonl" --results-prefix -
check_fails "mc: bad JSON names file:line" 2 'bad_json.jsonl:2: ' $EVAL -q "$T/model.yml" --tasks "mc:$T/bad_json.jsonl" --results-prefix -
check_fails "mc: empty line names file:line" 2 'empty_line.jsonl:2: empty line' \
    $EVAL -q "$T/model.yml" --tasks "mc:$T/empty_line.jsonl" --results-prefix -
check_fails "loglikelihood: missing field names file:line" 2 'no_continuation.jsonl:1: missing field "continuation"' \
    $EVAL -q "$T/model.yml" --tasks "loglikelihood:$T/no_continuation.jsonl" --results-prefix -
check_fails "mc: a choice that is not text" 2 'choice_type.jsonl:1: choice 1 is not a string' \
    $EVAL -q "$T/model.yml" --tasks "mc:$T/choice_type.jsonl" --results-prefix -
check_fails "rolling: text not a string" 2 'text_type.jsonl:1: field "text" is not a string' \
    $EVAL -q "$T/model.yml" --tasks "rolling:$T/text_type.jsonl" --results-prefix -
check_fails "unknown task" 2 "unknown task 'hellaswag'" $EVAL -q "$T/model.yml" --tasks hellaswag --results-prefix -
check_fails "missing task file" 1 'nope.jsonl' $EVAL -q "$T/model.yml" --tasks "mc:$T/nope.jsonl" --results-prefix -
mkdir -p "$T/piqa"
printf '{"goal": "g", "sol1": "a", "sol2": "b"}\n{"goal": "g", "sol1": "a", "sol2": "b"}\n' >"$T/piqa/piqa_valid.jsonl"
printf '0\n2\n' >"$T/piqa/piqa_valid-labels.lst"
check_fails "piqa: bad label names file:line" 2 'piqa_valid-labels.lst:2: expected a label 0 or 1' \
    $EVAL -q "$T/model.yml" --tasks piqa --data-dir "$T/piqa" --results-prefix -
printf '0\n' >"$T/piqa/piqa_valid-labels.lst"
check_fails "piqa: too few labels" 2 'has 1 labels, 2 questions' \
    $EVAL -q "$T/model.yml" --tasks piqa --data-dir "$T/piqa" --results-prefix -

# ---- generation -----------------------------------------------------------------------------
printf 'ROMEO:\nFirst Citizen:\n\nKING\n' >"$T/prompts.txt"
gen() {  # gen OUT [OPTIONS]
    local out=$1; shift
    $EVAL generate -q "$T/model.yml" ${GEN_EXTRA:-} --text-gen-type input-file --sample-input-file "$T/prompts.txt" \
        --sample-output-file "$out" --maximum-tokens 30 "$@"
}
same_text() { python3 -c '
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
assert len(a) == len(b) == int(sys.argv[3]), (len(a), len(b))
for x, y in zip(a, b):
    assert (x["context"], x["text"], x["length"], x["finished"]) == (y["context"], y["text"], y["length"], y["finished"]), (x, y)
' "$@"; }
check "greedy with the KV cache" gen "$T/greedy.jsonl"
check "greedy recomputing" gen "$T/greedy_re.jsonl" --recompute
check "greedy: KV cache equals recompute" same_text "$T/greedy.jsonl" "$T/greedy_re.jsonl" 3
SAMPLE=(--temperature 0.9 --top-k 20 --top-p 0.95 --seed 7)
check "sampling with the KV cache" gen "$T/sample.jsonl" "${SAMPLE[@]}"
check "sampling recomputing" gen "$T/sample_re.jsonl" "${SAMPLE[@]}" --recompute
check "sampling: KV cache equals recompute" same_text "$T/sample.jsonl" "$T/sample_re.jsonl" 3

# ---- on the emulated device (compute_backend: emulated: the device paths, memory the host must not
# touch directly): the CPU's results exactly ---------------------------------------------------------
echo '{"compute_backend": "emulated"}' >"$T/emu.yml"
check "emulated device: perplexity and tasks" $EVAL -q "$T/model.yml" "$T/emu.yml" --tasks "$LAYOUT_TASKS" \
    --results-prefix "$T/emu"
check "emulated device: the CPU's results exactly" python3 -c '
import glob, json, sys
r = [json.load(open(glob.glob(p + "_eval_results_*.json")[0]))["results"] for p in sys.argv[1:]]
assert r[0] == r[1], r
' "$T/orig" "$T/emu"
GEN_EXTRA=$T/emu.yml check "emulated device: greedy with the KV cache" gen "$T/emu_greedy.jsonl"
check "emulated device: the CPU's greedy text" same_text "$T/greedy.jsonl" "$T/emu_greedy.jsonl" 3
GEN_EXTRA=$T/emu.yml check "emulated device: sampling recomputing" gen "$T/emu_sample_re.jsonl" "${SAMPLE[@]}" --recompute
check "emulated device: the CPU's sampled text" same_text "$T/sample.jsonl" "$T/emu_sample_re.jsonl" 3
fields_ok() { python3 -c '
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
for r in recs:
    assert set(r) >= {"context", "text", "length", "finished", "duration_seconds"}, r
    assert isinstance(r["finished"], bool) and r["length"] <= 30 and r["duration_seconds"] >= 0
assert [r["context"] for r in recs] == ["ROMEO:", "First Citizen:", "KING"], recs
' "$1"; }
check "jsonl fields as GPT-NeoX writes them" fields_ok "$T/greedy.jsonl"
stop_ok() {  # --stop-token ID stops right after that token: the text is the greedy text up to it
    local c id
    c=$(python3 -c 'import json,sys; t=json.loads(open(sys.argv[1]).readline())["text"]; print([x for x in t[2:] if not x.isspace()][0])' "$T/greedy.jsonl")
    id=$(printf '%s' "$c" | $NEOX_BIN/neox-preprocess encode --tokenizer-type CharLevelTokenizer | tr -d ' \n')
    gen "$T/stop.jsonl" --stop-token "$id" || return 1
    python3 -c '
import json, sys
a, b = (json.loads(open(p).readline()) for p in sys.argv[1:3])
c = [x for x in a["text"][2:] if not x.isspace()][0]
want = a["text"][:a["text"].index(c)]
assert b["text"] == want and b["finished"] is True and b["length"] == len(want), (a, b)
' "$T/greedy.jsonl" "$T/stop.jsonl"
}
check "--stop-token stops there" stop_ok
check_output "unconditional: num_samples records" '^3$' sh -c \
    "$EVAL generate -q '$T/model.yml' --text-gen-type unconditional --num-samples 3 --temperature 1 --sample-output-file '$T/u.jsonl' && wc -l <'$T/u.jsonl'"
check_output "interactive: one completion per line, 'exit' stops" '^2$' sh -c \
    "printf 'ROMEO:\nJULIET:\nexit\nKING:\n' | $EVAL generate -q '$T/model.yml' --text-gen-type interactive --maximum-tokens 5 --sample-output-file '$T/i.jsonl' >/dev/null && wc -l <'$T/i.jsonl'"
python3 -c 'print("x" * 200)' >"$T/long.txt"
check_fails "a prompt longer than the context is an error" 2 'the prompt has 200 tokens; the context holds 48' \
    $EVAL generate -q "$T/model.yml" ${GEN_EXTRA:-} --text-gen-type input-file --sample-input-file "$T/long.txt" --sample-output-file "$T/l.jsonl"
check_fails "input-file without sample_input_file" 2 'sample_input_file: not set' \
    $EVAL generate -q "$T/model.yml" ${GEN_EXTRA:-} --text-gen-type input-file
check_fails "unknown text_gen_type" 2 "text_gen_type: 'precompute'" $EVAL generate -q "$T/model.yml" --text-gen-type precompute
