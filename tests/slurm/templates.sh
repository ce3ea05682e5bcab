# tests/slurm/templates.sh: the job templates and jobs/pipeline.sh without a cluster: bad input
# gets a clear error and exit status 2 (1 for a missing result of an earlier stage), the dry run
# prints the dependent sbatch commands, and the templates run as plain scripts (what jobs/README.md
# gives as the equivalents outside SLURM): preprocess and merge skip up-to-date outputs, convert
# keeps a conversion of the same checkpoint and refuses to overwrite one of another.
source tests/lib.sh
source tests/slurm/jobs.lib
unset SLURM_JOB_ID SLURM_ARRAY_TASK_ID
export NEOX_MPIEXEC=$MPIEXEC

# ---- jobs/pipeline.sh ----
check_output "pipeline.sh --help" '^Usage: jobs/pipeline.sh' jobs/pipeline.sh --help
check_fails "pipeline.sh without a run folder" 2 'pipeline.sh: error: no run folder' jobs/pipeline.sh --input x --config y
check_fails "pipeline.sh without inputs" 2 'error: no input: give --input' jobs/pipeline.sh --run-dir "$T/r"
check_fails "pipeline.sh with an unknown option" 2 "unknown option '--nodez'" jobs/pipeline.sh --nodez 2
check_fails "pipeline.sh with an option lacking its value" 2 '--config needs a value' jobs/pipeline.sh --config
check_fails "pipeline.sh with a zero count" 2 "'0' is not a positive count" \
    jobs/pipeline.sh --run-dir "$T/r" --input configs --config configs/tiny-test.yml --nodes 0 --dry-run
check_fails "pipeline.sh with a missing config" 2 'no such config file: nope.yml' \
    jobs/pipeline.sh --run-dir "$T/r" --input configs --config nope.yml --dry-run
check_fails "pipeline.sh with a missing input" 2 'no such input: nope.jsonl' \
    jobs/pipeline.sh --run-dir "$T/r" --input nope.jsonl --config configs/tiny-test.yml --dry-run
echo '{"save": "elsewhere", "checkpoint_factor": 10}' >"$T/own-save.yml"
check_fails "pipeline.sh with configs that set save themselves (the run folder's paths.yml does)" 2 \
    "key 'save' is set twice" jobs/pipeline.sh --run-dir "$T/r" --input configs --config configs/tiny-test.yml \
    --config "$T/own-save.yml" --dry-run
echo '{"checkpoint_factor": 10}' >"$T/ckpt.yml"
mkdir -p "$T/shards" && echo '{"text": "a"}' >"$T/shards/b.jsonl" && echo '{"text": "b"}' >"$T/shards/a.jsonl"
dry_run() {
    NEOX_PARTITION=gpu jobs/pipeline.sh --run-dir "$T/dry" --input "$T/shards" --config configs/tiny-test.yml \
        --config "$T/ckpt.yml" --nodes 2 --ntasks-per-node 4 --gpus-per-node 4 --account proj --time 12:00:00 \
        --sbatch-arg=--mail-type=FAIL --dry-run >"$T/dry.out" 2>&1 || { cat "$T/dry.out"; return 1; }
    cat "$T/dry.out"
    local pre merge train evaluation convert
    pre=$(grep 'preprocess.sbatch' "$T/dry.out") merge=$(grep 'merge.sbatch' "$T/dry.out")
    train=$(grep 'train.sbatch' "$T/dry.out") evaluation=$(grep 'eval.sbatch' "$T/dry.out")
    convert=$(grep 'convert.sbatch' "$T/dry.out")
    [ "$(grep -c '^sbatch ' "$T/dry.out")" = 5 ] && grep -q -- '--array=0-1 ' <<<"$pre" &&
    grep -q -- '--dependency=afterok:1001 ' <<<"$merge" && grep -q -- '--dependency=afterok:1002 ' <<<"$train" &&
    grep -q -- '--dependency=afterok:1003 ' <<<"$evaluation" && grep -q -- '--dependency=afterok:1004 ' <<<"$convert" &&
    grep -q -- '--nodes 2 --ntasks-per-node 4 --gpus-per-node 4 --time 12:00:00' <<<"$train" &&
    [ "$(grep -c -- '--partition gpu --account proj --mail-type=FAIL' "$T/dry.out")" = 5 ] &&
    grep -q -- '--tokenizer-type CharLevelTokenizer --append-eod' <<<"$pre" &&
    [ "$(cat "$T/dry/inputs.txt")" = "$(printf '%s\n' "$T/shards/a.jsonl" "$T/shards/b.jsonl")" ] &&
    grep -q 'nothing submitted' "$T/dry.out"
}
check "pipeline.sh --dry-run: five sbatch commands chained by afterok, resources and flags passed on" dry_run

# ---- templates: bad input ----
check_fails "train.sbatch without configs" 2 'train.sbatch: error: no config files given' bash jobs/train.sbatch
check_fails "train.sbatch with a missing config" 2 'no such config file: nope.yml' bash jobs/train.sbatch nope.yml
check_fails "train.sbatch with configs that do not save" 2 "set no 'save' directory" \
    bash jobs/train.sbatch configs/tiny-test.yml
printf '{"save": "%s", "load": "%s", "checkpoint_factor": 10}\n' "$T/a" "$T/b" >"$T/load-other.yml"
check_fails "train.sbatch with configs that load another checkpoint than they save" 2 \
    'leave load out \(NEOX_INIT_CHECKPOINT=' bash jobs/train.sbatch configs/tiny-test.yml "$T/load-other.yml"
printf '{"save": "%s", "checkpoint_factor": 10, "finetune": true}\n' "$T/a" >"$T/finetune.yml"
check_fails "train.sbatch with finetune set" 2 'set finetune, so a requeued job would not resume exactly' \
    bash jobs/train.sbatch configs/tiny-test.yml "$T/finetune.yml"
check_fails "a launcher that does not exist" 2 "NEOX_LAUNCHER: 'slurm' is not srun, mpiexec or none" \
    env NEOX_LAUNCHER=slurm bash jobs/train.sbatch configs/tiny-test.yml "$T/ckpt.yml"
check_fails "NEOX_BIN without the tools" 2 "no neox-eval in $T \(NEOX_BIN\)" \
    env NEOX_BIN="$T" bash jobs/eval.sbatch configs/tiny-test.yml
check_fails "preprocess.sbatch without NEOX_INPUT_LIST" 2 'NEOX_INPUT_LIST is not set' \
    env NEOX_DATA_DIR="$T/d" bash jobs/preprocess.sbatch --tokenizer-type CharLevelTokenizer
printf '# shards\n%s\n\n%s\n' "$T/shards/a.jsonl" "$T/nope.jsonl" >"$T/list.txt"
check_fails "preprocess.sbatch names a missing input" 2 "input 1 of $T/list.txt: no such file: $T/nope.jsonl" \
    env NEOX_INPUT_LIST="$T/list.txt" NEOX_DATA_DIR="$T/d" NEOX_TASK_ID=1 bash jobs/preprocess.sbatch \
    --tokenizer-type CharLevelTokenizer
check_fails "an array task beyond the list" 2 'array task 2, but only 2 lines' \
    env NEOX_INPUT_LIST="$T/list.txt" NEOX_DATA_DIR="$T/d" NEOX_TASK_ID=2 bash jobs/preprocess.sbatch \
    --tokenizer-type CharLevelTokenizer
check_fails "sweep.sbatch without NEOX_SWEEP_DIR" 2 'NEOX_SWEEP_DIR is not set' \
    env NEOX_SWEEP_LIST="$T/list.txt" bash jobs/sweep.sbatch configs/tiny-test.yml
check_fails "convert.sbatch without an output" 2 'set NEOX_HF_OUTPUT and/or NEOX_RESHARD_OUTPUT' \
    env NEOX_CHECKPOINT="$T" bash jobs/convert.sbatch
check_fails "convert.sbatch without a checkpoint" 1 "no checkpoint in $T " \
    env NEOX_CHECKPOINT="$T" NEOX_HF_OUTPUT="$T/hf" bash jobs/convert.sbatch
printf '{"save": "%s", "checkpoint_factor": 10}\n' "$T/none" >"$T/none.yml"
check_fails "eval.sbatch before training" 1 "no checkpoint in $T/none" \
    bash jobs/eval.sbatch configs/tiny-test.yml "$T/none.yml"

# ---- templates as plain scripts ----
printf '%s\n' "$T/shards/a.jsonl" "$T/shards/b.jsonl" >"$T/two.txt"
plain() { env NEOX_INPUT_LIST="$T/two.txt" NEOX_DATA_DIR="$T/d2" NEOX_DATA_PREFIX="$T/d2/all" bash "$@"; }
check "preprocess.sbatch outside SLURM does every input" bash -c "$(declare -f plain); T='$T'
    plain jobs/preprocess.sbatch --tokenizer-type CharLevelTokenizer --append-eod &&
    [ -f '$T/d2/shard_00000_text_document.idx' ] && [ -f '$T/d2/shard_00001_text_document.idx' ]"
check_output "a second run keeps both shards" 'task 1: .* is up to date' \
    plain jobs/preprocess.sbatch --tokenizer-type CharLevelTokenizer --append-eod
touch -d '+1 minute' "$T/shards/b.jsonl"
check_output "a newer input is preprocessed again" "task 1: $T/shards/b.jsonl -> " \
    plain jobs/preprocess.sbatch --tokenizer-type CharLevelTokenizer --append-eod
check_output "merge.sbatch merges both, in list order" 'documents: +2$' plain jobs/merge.sbatch
check_output "and keeps a merge newer than its shards" 'is up to date with its 2 shards' plain jobs/merge.sbatch
rm "$T/d2/shard_00001_text_document.idx"
check_fails "merge.sbatch names a missing shard" 1 'shard 1 is missing' plain jobs/merge.sbatch

sed 's/"train_iters": 100,/"train_iters": 4,/' configs/tiny-test.yml >"$T/tiny4.yml"
printf '{"data_path": "%s", "save": "%s", "checkpoint_factor": 2}\n' "$T/d2/all" "$T/ck" >"$T/run.yml"
check "train.sbatch outside SLURM (mpiexec -n 1)" bash jobs/train.sbatch "$T/tiny4.yml" "$T/run.yml"
conv() { env NEOX_CHECKPOINT="$1" NEOX_HF_OUTPUT="$T/hf" NEOX_RESHARD_OUTPUT="$T/dp2" NEOX_RESHARD_ARGS="--dp 2" \
    bash jobs/convert.sbatch; }
check "convert.sbatch: HF export and reshard" bash -c "$(declare -f conv); T='$T'; conv '$T/ck' &&
    [ -f '$T/hf/model.safetensors' ] && [ -f '$T/dp2/latest' ]"
check_output "convert.sbatch again keeps both" 'to-hf conversion of .*global_step4' conv "$T/ck"
check_fails "convert.sbatch refuses to overwrite a conversion of another checkpoint" 1 \
    "$T/dp2 exists and is not a conversion of $T/ck/global_step2" conv "$T/ck/global_step2"

# ---- files the templates write ----
# neox_write_file's temporary is made by mktemp: a symlink planted at the name the shell's pid
# predicts ("PATH.tmp.$$") is neither followed nor replaced, and the file lands whole.
echo original >"$T/victim"
check "neox_write_file follows no symlink planted at a predictable temporary name" bash -c "
    source jobs/common.sh; out='$T/written.yml'; ln -s '$T/victim' \"\$out.tmp.\$\$\"
    echo 'key: value' | neox_write_file \"\$out\" && [ \"\$(cat '$T/victim')\" = original ] &&
    [ \"\$(cat \"\$out\")\" = 'key: value' ] && [ -L \"\$out.tmp.\$\$\" ] &&
    [ \"\$(find '$T' -maxdepth 1 -name 'written.yml.tmp.*' ! -type l | wc -l)\" = 0 ]"
check_fails "neox_write_file into a missing directory names the file" 1 "cannot write $T/nodir/x.yml" \
    bash -c "source jobs/common.sh; echo a | neox_write_file '$T/nodir/x.yml'"
