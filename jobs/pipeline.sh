#!/usr/bin/env bash
# jobs/pipeline.sh: submits the whole neox.c pipeline to SLURM as five dependent jobs, each
# starting only when the one before succeeded (--dependency=afterok):
#   preprocess (a job array, one task per input shard) -> merge -> train -> eval -> convert
# and prints their job ids. Every path and resource comes from a flag or its environment variable;
# outputs go to one run folder. `jobs/pipeline.sh --help` lists them; jobs/README.md explains.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: jobs/pipeline.sh --run-dir DIR --input PATH [--input PATH]... --config FILE [--config FILE]... [OPTION]...
Submit preprocess (job array) -> merge -> train -> eval -> convert with --dependency=afterok.

Each option can also be given by the environment variable in brackets (lists: space-separated).
Paths:
  --run-dir DIR          [NEOX_RUN_DIR] where everything goes: inputs.txt, data/, paths.yml,
                         checkpoints/, logs/, tensorboard/, eval/, hf/, resharded/, slurm/ (job logs),
                         jobs.txt (the job ids)
  --input PATH           [NEOX_INPUTS] a corpus shard (.jsonl, .jsonl.zst, .jsonl.gz, .txt), or a
                         folder whose files (sorted) are shards; one preprocess task per shard
  --config FILE          [NEOX_CONFIGS] neox-train configs (model, tokenizer, schedule, split,
                         checkpoint_factor); the pipeline sets data_path, save, log_dir and
                         tensorboard_dir (RUN/paths.yml), so the configs leave them (and load) out
  --prompts FILE         [NEOX_GENERATE_INPUT] prompts (one a line) to generate samples from in eval
  --eval-data-dir DIR    [NEOX_EVAL_DATA_DIR] task files for --eval-tasks
  --bin DIR              [NEOX_BIN] the neox.c tools (default: this checkout's bin/)
Work:
  --eval-tasks LIST      [NEOX_EVAL_TASKS] neox-eval --tasks (default valid,test)
  --eval-limit N         [NEOX_EVAL_LIMIT] examples per task
  --generate-args ARGS   [NEOX_GENERATE_ARGS] neox-eval generate options
  --reshard ARGS         [NEOX_RESHARD_ARGS] also reshard the checkpoint, e.g. "--tp 2 --pp 2"
  --hf-dtype DTYPE       [NEOX_HF_DTYPE] fp32 (default), bf16, fp16
  --no-append-eod        [NEOX_APPEND_EOD=0] no end-of-document token after each document
Resources:
  --partition P          [NEOX_PARTITION]         --account A      [NEOX_ACCOUNT]
  --qos Q                [NEOX_QOS]               --cpus-per-task N [NEOX_CPUS_PER_TASK] (every job)
  --nodes N              [NEOX_NODES] training nodes (default 1)
  --ntasks-per-node N    [NEOX_NTASKS_PER_NODE] ranks per node for train and eval (default 1)
  --gpus-per-node N      [NEOX_GPUS_PER_NODE] for train and eval
  --time T               [NEOX_TRAIN_TIME] training time limit (default: train.sbatch's)
  --signal SPEC          [NEOX_SIGNAL] warning before the limit (default: train.sbatch's B:USR1@120)
  --launcher L           [NEOX_LAUNCHER] srun (default) or mpiexec inside the allocations
  --sbatch-arg ARG       [NEOX_SBATCH_ARGS] passed to every sbatch (repeatable), e.g. --sbatch-arg=--mail-type=FAIL
  --dry-run              print the sbatch commands instead of submitting
  -h, --help             this help
EOF
}

die() { echo "pipeline.sh: error: $*" >&2; exit 2; }  # until jobs/common.sh is loaded

here=$(cd "$(dirname "$0")" && pwd)
export NEOX_HOME=${NEOX_HOME:-$(dirname "$here")}

run_dir=${NEOX_RUN_DIR:-}
read -ra inputs <<<"${NEOX_INPUTS:-}"
read -ra configs <<<"${NEOX_CONFIGS:-}"
read -ra sbatch_extra <<<"${NEOX_SBATCH_ARGS:-}"
prompts=${NEOX_GENERATE_INPUT:-} eval_data_dir=${NEOX_EVAL_DATA_DIR:-} bin=${NEOX_BIN:-}
eval_tasks=${NEOX_EVAL_TASKS:-} eval_limit=${NEOX_EVAL_LIMIT:-} generate_args=${NEOX_GENERATE_ARGS:-}
reshard=${NEOX_RESHARD_ARGS:-} hf_dtype=${NEOX_HF_DTYPE:-fp32} append_eod=${NEOX_APPEND_EOD:-1}
partition=${NEOX_PARTITION:-} account=${NEOX_ACCOUNT:-} qos=${NEOX_QOS:-} cpus=${NEOX_CPUS_PER_TASK:-}
nodes=${NEOX_NODES:-1} ntasks=${NEOX_NTASKS_PER_NODE:-1} gpus=${NEOX_GPUS_PER_NODE:-}
train_time=${NEOX_TRAIN_TIME:-} signal=${NEOX_SIGNAL:-} launcher=${NEOX_LAUNCHER:-srun} dry_run=0

while [ $# -gt 0 ]; do
    opt=$1
    case $opt in
        --*=*) set -- "${opt%%=*}" "${opt#*=}" "${@:2}"; continue ;;
        -h|--help) usage; exit 0 ;;
        --dry-run) dry_run=1; shift; continue ;;
        --no-append-eod) append_eod=0; shift; continue ;;
    esac
    [ $# -ge 2 ] || die "$opt needs a value (see --help)"
    val=$2
    case $opt in
        --run-dir) run_dir=$val ;;
        --input) inputs+=("$val") ;;
        --config) configs+=("$val") ;;
        --prompts) prompts=$val ;;
        --eval-data-dir) eval_data_dir=$val ;;
        --bin) bin=$val ;;
        --eval-tasks) eval_tasks=$val ;;
        --eval-limit) eval_limit=$val ;;
        --generate-args) generate_args=$val ;;
        --reshard) reshard=$val ;;
        --hf-dtype) hf_dtype=$val ;;
        --partition) partition=$val ;;
        --account) account=$val ;;
        --qos) qos=$val ;;
        --cpus-per-task) cpus=$val ;;
        --nodes) nodes=$val ;;
        --ntasks-per-node) ntasks=$val ;;
        --gpus-per-node) gpus=$val ;;
        --time) train_time=$val ;;
        --signal) signal=$val ;;
        --launcher) launcher=$val ;;
        --sbatch-arg) sbatch_extra+=("$val") ;;
        *) die "unknown option '$opt' (see --help)" ;;
    esac
    shift 2
done

[ -n "$run_dir" ] || die "no run folder: give --run-dir DIR (or NEOX_RUN_DIR)"
[ ${#inputs[@]} -gt 0 ] || die "no input: give --input PATH (or NEOX_INPUTS)"
[ ${#configs[@]} -gt 0 ] || die "no config: give --config FILE (or NEOX_CONFIGS)"
for n in "$nodes" "$ntasks" ${gpus:+"$gpus"} ${cpus:+"$cpus"} ${eval_limit:+"$eval_limit"}; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || die "'$n' is not a positive count"
done
case $launcher in srun|mpiexec) ;; *) die "--launcher: '$launcher' is not srun or mpiexec" ;; esac
case $hf_dtype in fp32|bf16|fp16) ;; *) die "--hf-dtype: '$hf_dtype' is not fp32, bf16 or fp16" ;; esac
[ "$dry_run" = 1 ] || command -v sbatch >/dev/null || die "sbatch not found: is this a SLURM login node? (--dry-run prints the commands)"

abs() { realpath -m -- "$1"; }
for i in "${!configs[@]}"; do
    [ -f "${configs[$i]}" ] || die "no such config file: ${configs[$i]}"
    configs[$i]=$(abs "${configs[$i]}")
done
[ -z "$prompts" ] || { [ -f "$prompts" ] || die "no such prompt file: $prompts"; prompts=$(abs "$prompts"); }
[ -z "$eval_data_dir" ] || { [ -d "$eval_data_dir" ] || die "no such folder: $eval_data_dir"; eval_data_dir=$(abs "$eval_data_dir"); }
if [ -n "$bin" ]; then bin=$(abs "$bin"); else bin=$NEOX_HOME/bin; fi
[ -x "$bin/neox-train" ] || die "no neox-train in $bin: run 'make' in $NEOX_HOME, or give --bin DIR"
NEOX_BIN=$bin
# shellcheck source=jobs/common.sh
source "$here/common.sh"
run_dir=$(abs "$run_dir")

# The shards, one preprocess task each, in the order given (folders: their files, sorted).
shards=()
for p in "${inputs[@]}"; do
    if [ -d "$p" ]; then
        mapfile -t found < <(find "$p" -mindepth 1 -maxdepth 1 -type f ! -name '.*' | LC_ALL=C sort)
        [ ${#found[@]} -gt 0 ] || die "folder $p holds no file"
        for f in "${found[@]}"; do shards+=("$(abs "$f")"); done
    elif [ -f "$p" ]; then shards+=("$(abs "$p")")
    else die "no such input: $p"; fi
done

mkdir -p "$run_dir"/{data,slurm,eval}
printf '%s\n' "${shards[@]}" >"$run_dir/inputs.txt"
data_prefix=$run_dir/data/corpus_text_document
cat >"$run_dir/paths.yml" <<EOF
# Written by jobs/pipeline.sh: the run folder's paths, given after the user's configs.
{
  "data_path": $(neox_json_string "$data_prefix"),
  "save": $(neox_json_string "$run_dir/checkpoints"),
  "log_dir": $(neox_json_string "$run_dir/logs"),
  "tensorboard_dir": $(neox_json_string "$run_dir/tensorboard")
}
EOF
train_configs=("${configs[@]}" "$run_dir/paths.yml")

# The configs must load for the training world size now, not hours later in the queue; the
# tokenizer they name is the one preprocessing uses.
neox_read_config $((nodes * ntasks)) "${train_configs[@]}"
tokenizer=$(neox_value tokenizer_type) vocab=$(neox_value vocab_file) merges=$(neox_value merge_file)
[ -n "$tokenizer" ] || neox_die 2 "the configs set no tokenizer_type"
pre_args=(--tokenizer-type "$tokenizer")
[ -z "$vocab" ] || pre_args+=(--vocab-file "$vocab")
[ -z "$merges" ] || pre_args+=(--merge-file "$merges")
[ "$append_eod" = 0 ] || pre_args+=(--append-eod)

common=(--parsable --chdir "$PWD" --kill-on-invalid-dep=yes)
[ -z "$partition" ] || common+=(--partition "$partition")
[ -z "$account" ] || common+=(--account "$account")
[ -z "$qos" ] || common+=(--qos "$qos")
[ -z "$cpus" ] || common+=(--cpus-per-task "$cpus")
common+=("${sbatch_extra[@]}")
ranks=(--ntasks-per-node "$ntasks")
[ -z "$gpus" ] || ranks+=(--gpus-per-node "$gpus")

export NEOX_BIN=$bin NEOX_LAUNCHER=$launcher NEOX_INPUT_LIST=$run_dir/inputs.txt NEOX_DATA_DIR=$run_dir/data
export NEOX_DATA_PREFIX=${data_prefix} NEOX_EVAL_TASKS=$eval_tasks NEOX_EVAL_DATA_DIR=$eval_data_dir
export NEOX_EVAL_LIMIT=$eval_limit NEOX_RESULTS_PREFIX=$run_dir/eval/results NEOX_GENERATE_INPUT=$prompts
export NEOX_GENERATE_OUTPUT=$run_dir/eval/samples.jsonl NEOX_GENERATE_ARGS=$generate_args
export NEOX_CHECKPOINT=$run_dir/checkpoints NEOX_HF_OUTPUT=$run_dir/hf NEOX_HF_DTYPE=$hf_dtype
export NEOX_RESHARD_ARGS=$reshard NEOX_RESHARD_OUTPUT=${reshard:+$run_dir/resharded}

# submit SBATCH-ARGS... SCRIPT ARGS...: sets job_id (a made-up one in a dry run).
job_id=1000 submitted=()
submit() {
    local out
    if [ "$dry_run" = 1 ]; then
        printf '%q ' sbatch "$@"; echo
        job_id=$((job_id + 1))
        return
    fi
    out=$(sbatch "$@") || neox_die 1 "sbatch failed: sbatch $*${submitted[*]:+ (already submitted: ${submitted[*]}; scancel them)}"
    job_id=${out%%;*}
    submitted+=("$job_id")
}
log=$run_dir/slurm
n=${#shards[@]}
submit "${common[@]}" --array=0-$((n - 1)) -o "$log/%x-%A_%a.out" "$here/preprocess.sbatch" "${pre_args[@]}"
pre=$job_id
submit "${common[@]}" --dependency=afterok:"$pre" -o "$log/%x-%j.out" "$here/merge.sbatch"
merge=$job_id
train_res=(--nodes "$nodes" "${ranks[@]}")
[ -z "$train_time" ] || train_res+=(--time "$train_time")
[ -z "$signal" ] || train_res+=(--signal "$signal")
submit "${common[@]}" "${train_res[@]}" --dependency=afterok:"$merge" -o "$log/%x-%j.out" \
    "$here/train.sbatch" "${train_configs[@]}"
train=$job_id
submit "${common[@]}" --nodes 1 "${ranks[@]}" --dependency=afterok:"$train" -o "$log/%x-%j.out" \
    "$here/eval.sbatch" "${train_configs[@]}"
evaluation=$job_id
submit "${common[@]}" --dependency=afterok:"$evaluation" -o "$log/%x-%j.out" "$here/convert.sbatch"
conv=$job_id

{
    echo "preprocess $pre"
    echo "merge $merge"
    echo "train $train"
    echo "eval $evaluation"
    echo "convert $conv"
} >"$run_dir/jobs.txt"
[ "$dry_run" = 0 ] || { echo "dry run: nothing submitted"; exit 0; }
cat <<EOF
preprocess  $pre   job array 0-$((n - 1)), one task per shard ($n)
merge       $merge   after preprocess -> $data_prefix.bin/.idx
train       $train   after merge, $nodes node(s) x $ntasks rank(s) -> $run_dir/checkpoints
eval        $evaluation   after train -> $run_dir/eval/
convert     $conv   after eval -> $run_dir/hf/${reshard:+ and $run_dir/resharded/}
job ids: $run_dir/jobs.txt; job logs: $log/; watch with: squeue -j $pre,$merge,$train,$evaluation,$conv
EOF
