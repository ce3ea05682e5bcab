#!/usr/bin/env bash
# bench/serve.sh: lm-evaluation-harness's wall time for lambada_openai through `neox-eval serve`
# (model local-completions) against the harness's own `hf` model (transformers) on the same
# checkpoint (one training step on Tiny Shakespeare, exported with `neox-convert to-hf`), the same
# local task file (scripts/lm_eval_tasks.py) and the same thread count. The two runs alternate,
# `rounds` times each, so that other work on the machine weighs on both alike; prints each run's
# seconds and the ratio of the medians. The server gets --context seq + 2 and the harness max_length
# seq + 2, so that it scores the windows neox-eval scores (docs/eval.md). With baseline=PATH (another
# build's neox-eval, e.g. the previous commit's) each round also runs the harness through that server,
# so that a change is measured against the one before it under the same load.
# Needs `make`, `make deps` (.venv with lm-eval) and ../shared/data.
# Usage: bench/serve.sh [key=value...]  keys: threads layers hidden heads seq batch limit rounds baseline
#        (defaults: threads=2 layers=6 hidden=512 heads=8 seq=512 batch=32 limit=0 (all 5153) rounds=2,
#        no baseline)
set -euo pipefail
cd "$(dirname "$0")/.."
bench/cpu_info.sh
DATA=../shared/data
[ -x .venv/bin/python ] || { echo "bench/serve.sh: .venv is missing (run 'make deps')" >&2; exit 1; }
[ -d $DATA/eval ] || { echo "bench/serve.sh: $DATA/eval is missing" >&2; exit 1; }
declare -A opt=([threads]=2 [layers]=6 [hidden]=512 [heads]=8 [seq]=512 [batch]=32 [limit]=0 [rounds]=2 [baseline]=)
for arg in "$@"; do
    key=${arg%%=*}
    [[ $arg == *=* && -n ${opt[$key]+x} ]] || { echo "bench/serve.sh: bad argument '$arg'" >&2; exit 2; }
    opt[$key]=${arg#*=}
done
[ -z "${opt[baseline]}" ] || [ -x "${opt[baseline]}" ] || { echo "bench/serve.sh: baseline=${opt[baseline]}: not an executable" >&2; exit 2; }
export OMP_NUM_THREADS=${opt[threads]} OPENBLAS_NUM_THREADS=${opt[threads]} MKL_NUM_THREADS=${opt[threads]}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
work=$(mktemp -d "${TMPDIR:-/tmp}/neox-servebench.XXXXXX")
server=
trap '[ -n "$server" ] && kill $server 2>/dev/null; rm -rf "$work"' EXIT
BIN=build/cpu/bin
GPT2=$DATA/tokenizers/gpt2
export HF_HOME=$work/hf_home

python3 tests/tools/train_lib.py paragraphs $DATA/text/tinyshakespeare_input.txt "$work/text.jsonl"
$BIN/neox-preprocess --input "$work/text.jsonl" --output-prefix "$work/gpt2" --append-eod \
    --tokenizer-type GPT2BPETokenizer --vocab-file $GPT2/vocab.json --merge-file $GPT2/merges.txt >/dev/null 2>&1
cat >"$work/model.yml" <<YML
{
  "num_layers": ${opt[layers]}, "hidden_size": ${opt[hidden]}, "num_attention_heads": ${opt[heads]},
  "seq_length": ${opt[seq]}, "max_position_embeddings": ${opt[seq]}, "pos_emb": "rotary", "rotary_pct": 0.25,
  "gpt_j_residual": true, "no_weight_tying": true,
  "optimizer": {"type": "Adam", "params": {"lr": 0.001}}, "lr_decay_style": "constant",
  "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "train_iters": 1,
  "eval_interval": 1000, "eval_iters": 1, "split": "90,5,5",
  "data_path": "$work/gpt2_text_document", "tokenizer_type": "GPT2BPETokenizer",
  "vocab_file": "$GPT2/vocab.json", "merge_file": "$GPT2/merges.txt",
  "save": "$work/ckpt", "load": "$work/ckpt", "checkpoint_factor": 1
}
YML
$BIN/neox-train -q "$work/model.yml"
$BIN/neox-convert to-hf --input "$work/ckpt" --output "$work/hf" >/dev/null 2>&1
.venv/bin/python scripts/lm_eval_tasks.py $DATA/eval "$work/tasks"
limit=(); [ "${opt[limit]}" != 0 ] && limit=(--limit "${opt[limit]}")

harness() {  # harness NAME MODEL MODEL_ARGS...: the harness's wall seconds, its acc into $work/NAME.acc
    local name=$1; shift
    local start end
    start=$(date +%s.%N)
    .venv/bin/python tests/oracle/lm_eval_cli.py "$@" --tasks lambada_openai_local --include_path "$work/tasks" \
        --batch_size ${opt[batch]} "${limit[@]}" --output_path "$work/$name" >"$work/$name.log" 2>&1 ||
        { tail -20 "$work/$name.log" >&2; [ "$name" = serve ] && tail -20 "$work/server.log" >&2; exit 1; }
    end=$(date +%s.%N)
    python3 -c "import glob, json; r = json.load(open(sorted(glob.glob('$work/$name/**/results_*.json', recursive=True))[-1]));
print(r['results']['lambada_openai_local']['acc,none'])" >"$work/$name.acc"
    python3 -c "print(f'{$end - $start:.1f}')"
}

# The CPU seconds (user + system) of this subshell's waited-for children so far: the harness, and
# the server once waited for. On a loaded machine they move less than wall time does.
cpu_seconds() {  # (called in the run's own shell: a subshell forked after them would count nothing)
    times >"$work/times"
    tail -1 "$work/times" | python3 -c "import re, sys
print('%.1f' % sum(float(m) * 60 + float(s) for m, s in re.findall('([0-9]+)m([0-9.]+)s', sys.stdin.read())))"
}

serve_run() {  # serve_run [NEOX_EVAL]: the harness through that binary's server (default: this build's)
    # (The server's stdout is not this function's: a server left running would hold the caller's pipe.)
    ${1:-$BIN/neox-eval} serve -q --port 0 --context $((${opt[seq]} + 2)) "$work/model.yml" >/dev/null 2>"$work/server.log" &
    server=$!
    for _ in $(seq 300); do grep -q 'listening on port' "$work/server.log" && break; sleep 0.1; done
    local port; port=$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$work/server.log")
    # timeout: the harness's per-request limit (300 s by default), which a loaded machine can pass
    # while four batches of requests queue at the server.
    local wall; wall=$(harness serve --model local-completions --model_args \
        "base_url=http://127.0.0.1:$port/v1/completions,tokenizer=$work/hf,tokenizer_backend=huggingface,max_length=$((${opt[seq]} + 2)),model=neox,num_concurrent=4,timeout=3600") ||
        { kill -TERM $server; wait $server; exit 1; }
    kill -TERM $server && wait $server
    server=
    echo -n "$wall "; cpu_seconds
}

hf_run() {
    local wall; wall=$(harness hf --model hf --model_args "pretrained=$work/hf,dtype=float32,max_length=${opt[seq]}" --device cpu)
    echo -n "$wall "; cpu_seconds
}

serve_times=() hf_times=() base_times=() serve_cpu=() hf_cpu=() base_cpu=()
for r in $(seq ${opt[rounds]}); do
    base=
    if [ -n "${opt[baseline]}" ]; then
        read -r t c < <(serve_run "${opt[baseline]}")
        base_times+=("$t") base_cpu+=("$c")
        cp "$work/serve.acc" "$work/baseline.acc"
        base=", baseline serve $t s (cpu $c s)"
    fi
    read -r t c < <(serve_run)
    serve_times+=("$t") serve_cpu+=("$c")
    read -r t c < <(hf_run)
    hf_times+=("$t") hf_cpu+=("$c")
    echo "round $r: neox-eval serve ${serve_times[-1]} s (cpu ${serve_cpu[-1]} s), hf $t s (cpu $c s)$base" \
        "(load $(cut -d' ' -f1-3 /proc/loadavg))"
done
echo "model: layers=${opt[layers]} hidden=${opt[hidden]} seq=${opt[seq]} batch=${opt[batch]} threads=${opt[threads]} limit=${opt[limit]}"
echo "acc: serve $(cat "$work/serve.acc"), hf $(cat "$work/hf.acc")${opt[baseline]:+, baseline serve $(cat "$work/baseline.acc")}"
python3 - "${serve_times[*]}" "${hf_times[*]}" "${base_times[*]}" "${serve_cpu[*]}" "${hf_cpu[*]}" "${base_cpu[*]}" <<'PY'
import statistics, sys
med = [statistics.median(float(x) for x in a.split()) if a else None for a in sys.argv[1:]]
for what, (s, h, b) in (("wall time", med[0:3]), ("cpu time (harness + server)", med[3:6])):
    print(f"median {what}: neox-eval serve {s:.1f} s, hf {h:.1f} s: serve is {h / s:.2f}x faster")
    if b:
        print(f"  baseline serve {b:.1f} s: this build is {b / s:.2f}x faster than the baseline, which is {h / b:.2f}x faster than hf")
PY
