# jobs/common.sh: what the job templates in jobs/ share. Sourced (not run) by preprocess.sbatch,
# merge.sbatch, train.sbatch, sweep.sbatch, eval.sbatch and convert.sbatch, under sbatch or as plain
# scripts outside SLURM. It finds the tools, launches ranks (srun --mpi=pmi2 inside a SLURM job,
# mpiexec elsewhere), forwards SLURM's warning signal to them, reads effective config values, makes a
# run resume from its own `save` directory, and turns a trainer stopped by a signal into a requeue.
#
# Environment (all optional):
#   NEOX_HOME           the neox.c checkout (default: the folder above this file)
#   NEOX_BIN            where neox-preprocess, neox-train, neox-eval and neox-convert are
#                       (default: $NEOX_HOME/bin when it holds them, else PATH)
#   NEOX_SITE           a file sourced before anything runs: module loads, spack, conda, site variables
#   NEOX_LAUNCHER       srun (default inside a SLURM job), mpiexec (default elsewhere) or none
#   NEOX_SRUN_ARGS      extra srun options, e.g. "--cpu-bind=cores --gpus-per-task=1"
#   NEOX_MPIEXEC        the mpiexec command (default: mpiexec)
#   NEOX_NPROCS         ranks for mpiexec outside SLURM (default 1; inside SLURM: $SLURM_NTASKS)
#   NEOX_REQUEUE        0: a trainer stopped by a signal exits 3 instead of requeueing the job
#   NEOX_MAX_RESTARTS   stop requeueing after this many restarts (default 50)
#   NEOX_TASK_ID        outside a job array: the one task an array template runs (default: all)
#   NEOX_INIT_CHECKPOINT  training jobs: the checkpoint a run starts from (as finetune) while its
#                       own save directory holds none; later runs resume from save

NEOX_HOME=${NEOX_HOME:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
NEOX_JOB=${NEOX_JOB:-$(basename "$0")}
[ "${SLURM_JOB_ID:-}" ] && [ "$NEOX_JOB" = slurm_script ] && NEOX_JOB=${SLURM_JOB_NAME:-job}

neox_die() {  # neox_die STATUS MESSAGE: the error on stderr, then exit STATUS
    local status=$1; shift
    echo "$NEOX_JOB: error: $*" >&2
    exit "$status"
}

neox_say() { echo "$NEOX_JOB: $*"; }

# neox_need VAR...: each variable must be set and non-empty (a usage error otherwise).
neox_need() {
    local v
    for v in "$@"; do [ -n "${!v:-}" ] || neox_die 2 "$v is not set (see the header of $NEOX_JOB)"; done
}

if [ -n "${NEOX_SITE:-}" ]; then
    [ -f "$NEOX_SITE" ] || neox_die 2 "NEOX_SITE: no such file: $NEOX_SITE"
    # shellcheck disable=SC1090
    source "$NEOX_SITE"
fi

if [ -z "${NEOX_BIN:-}" ]; then
    if [ -x "$NEOX_HOME/bin/neox-train" ]; then NEOX_BIN=$NEOX_HOME/bin
    elif command -v neox-train >/dev/null; then NEOX_BIN=$(dirname "$(command -v neox-train)")
    else neox_die 2 "neox-train not found in $NEOX_HOME/bin or PATH: run 'make' in $NEOX_HOME or set NEOX_BIN"; fi
fi

# neox_tool NAME: the path of a tool, checked.
neox_tool() {
    [ -x "$NEOX_BIN/$1" ] || neox_die 2 "no $1 in $NEOX_BIN (NEOX_BIN): run 'make' or set NEOX_BIN"
    echo "$NEOX_BIN/$1"
}

# neox_world_size: the number of ranks a launch starts.
neox_world_size() {
    if [ "$(neox_launcher)" = none ]; then echo 1
    elif [ -n "${SLURM_JOB_ID:-}" ]; then echo "${SLURM_NTASKS:-1}"
    else echo "${NEOX_NPROCS:-1}"; fi
}

neox_launcher() {
    local l=${NEOX_LAUNCHER:-}
    [ -n "$l" ] || { [ -n "${SLURM_JOB_ID:-}" ] && l=srun || l=mpiexec; }
    case $l in srun|mpiexec|none) echo "$l" ;; *) neox_die 2 "NEOX_LAUNCHER: '$l' is not srun, mpiexec or none" ;; esac
}

# Signals. SLURM's warning (#SBATCH --signal=B:USR1@120, scancel --batch --signal=USR1) or a
# preemption's SIGTERM reaches this shell; it is passed on to the ranks, which finish the step,
# save and exit 3. A signal that comes before the ranks start is remembered and honoured then.
# neox_train passes either signal on as USR1, which means the same to neox-train: mpiexec (hydra)
# treats a SIGTERM as its own end and may exit 0 although the ranks saved and exited 3.
neox_stop_signal=
neox_child=
neox_forward_as=
_neox_on_signal() {
    neox_stop_signal=$1
    [ -n "$neox_child" ] && kill "-${neox_forward_as:-$1}" "$neox_child" 2>/dev/null
    return 0
}
trap '_neox_on_signal USR1' USR1
trap '_neox_on_signal TERM' TERM

# neox_run CMD...: runs CMD in the background with the signals forwarded; returns its status.
neox_run() {
    "$@" &
    neox_child=$!
    # wait returns early when a trapped signal arrives; keep waiting until CMD has really ended.
    while kill -0 "$neox_child" 2>/dev/null; do wait "$neox_child" || true; done
    local status=0
    wait "$neox_child" || status=$?
    neox_child=
    return "$status"
}

# neox_launch CMD...: CMD on every rank (srun --mpi=pmi2, mpiexec -n N, or one process).
neox_launch() {
    local -a launch
    case $(neox_launcher) in
        srun) # shellcheck disable=SC2206
              launch=(srun --mpi=pmi2 --kill-on-bad-exit=1 ${NEOX_SRUN_ARGS:-}) ;;
        mpiexec) launch=(${NEOX_MPIEXEC:-mpiexec} -n "$(neox_world_size)") ;;
        none) launch=() ;;
    esac
    neox_say "running: ${launch[*]} $*"
    neox_run "${launch[@]}" "$@"
}

# neox_read_config WORLD CONFIG...: loads the configs once, as neox-train --print-config reports
# them for WORLD ranks (a configuration error stops the script); neox_value KEY then prints the
# effective value of KEY (nothing for null). Call it outside $(...).
neox_config_text=
neox_read_config() {
    local world=$1; shift
    [ -x "$NEOX_BIN/neox-train" ] || neox_die 2 "no neox-train in $NEOX_BIN (NEOX_BIN): run 'make' or set NEOX_BIN"
    neox_config_text=$("$NEOX_BIN/neox-train" --print-config --world-size "$world" "$@") ||
        neox_die 2 "the configs do not load for $world rank(s): $*"
}
neox_value() {
    local v
    v=$(sed -n "s/^$1  *= \(.*\)  # [^#]*\$/\1/p" <<<"$neox_config_text")
    [ "$v" = null ] && v=
    v=${v#\"}
    echo "${v%\"}"
}

neox_json_string() {  # neox_json_string TEXT: TEXT as a JSON string
    local s=${1//\\/\\\\}
    printf '"%s"' "${s//\"/\\\"}"
}

# neox_write_file PATH: stdin to PATH through a temporary made by mktemp beside it (an exclusive,
# unpredictable name that follows no symlink planted there) and a rename.
neox_write_file() {
    local tmp
    tmp=$(mktemp "$1.tmp.XXXXXXXX") || neox_die 1 "cannot write $1: cannot create a temporary beside it"
    if cat >"$tmp" && chmod "$(printf '%o' $((0666 & ~0$(umask))))" "$tmp" && mv -f "$tmp" "$1"; then return 0; fi
    rm -f "$tmp"
    neox_die 1 "cannot write $1"
}

# neox_start_config SAVE: after neox_read_config, sets neox_start to a config file that makes the
# run start where it should (or to nothing when the configs already do): SAVE/resume.yml, loading
# SAVE (everything: an exact resume), when SAVE holds a checkpoint; else SAVE/init.yml, loading
# NEOX_INIT_CHECKPOINT as a fine-tuning start, when that is set. The files live in SAVE, which
# every node can read. GPT-NeoX configs refuse a key set twice, so the configs must leave `load`
# to this (or set it to SAVE itself).
neox_start=
neox_start_config() {
    local save=$1 load
    load=$(neox_value load)
    neox_start=
    if [ -f "$save/latest" ]; then
        [ -z "$load" ] || return 0
        printf '{"load": %s}\n' "$(neox_json_string "$save")" | neox_write_file "$save/resume.yml"
        neox_start=$save/resume.yml
    elif [ -n "${NEOX_INIT_CHECKPOINT:-}" ]; then
        [ -z "$load" ] || neox_die 2 "NEOX_INIT_CHECKPOINT is set but the configs set load ($load) too"
        [ -e "$NEOX_INIT_CHECKPOINT" ] || neox_die 2 "NEOX_INIT_CHECKPOINT: no such checkpoint: $NEOX_INIT_CHECKPOINT"
        printf '{"load": %s, "finetune": true}\n' "$(neox_json_string "$NEOX_INIT_CHECKPOINT")" |
            neox_write_file "$save/init.yml"
        neox_start=$save/init.yml
    fi
}

# neox_train CONFIG...: one training run, requeue-safe. Resumes from the configs' own `save`
# directory when it holds a checkpoint (a requeued or resubmitted job continues exactly); a run
# stopped by a signal (exit 3, after saving) requeues the job; any other failure is the job's exit.
neox_train() {
    [ $# -gt 0 ] || neox_die 2 "no config files given"
    local c k
    for c in "$@"; do [ -f "$c" ] || neox_die 2 "no such config file: $c"; done
    local train save load iters
    train=$(neox_tool neox-train)
    neox_read_config "$(neox_world_size)" "$@"
    save=$(neox_value save) load=$(neox_value load) iters=$(neox_value train_iters)
    [ -n "$save" ] || neox_die 2 "the configs set no 'save' directory, so a requeued job could not resume: set save and checkpoint_factor"
    [ -z "$load" ] || [ "$(realpath -m -- "$load")" = "$(realpath -m -- "$save")" ] ||
        neox_die 2 "the configs load $load but save to $save: a requeued job must load what it saved; leave load out (NEOX_INIT_CHECKPOINT=$load starts from it)"
    for k in finetune no_load_optim no_load_rng; do
        [ "$(neox_value $k)" != true ] ||
            neox_die 2 "the configs set $k, so a requeued job would not resume exactly; leave it out (NEOX_INIT_CHECKPOINT starts from another checkpoint as finetune does)"
    done
    mkdir -p "$save"
    neox_start_config "$save"
    local -a configs=("$@")
    [ -z "$neox_start" ] || configs+=("$neox_start")
    if [ -f "$save/latest" ]; then
        neox_say "resuming from $save/$(cat "$save/latest") (restart ${SLURM_RESTART_COUNT:-0})"
    fi
    local status=0
    if [ -n "$neox_stop_signal" ]; then
        neox_say "SIG$neox_stop_signal arrived before training started"
        status=3
    else
        neox_forward_as=USR1
        neox_launch "$train" "${configs[@]}" || status=$?
        neox_forward_as=
    fi
    # mpiexec (hydra) can exit 0 after passing a signal on although every rank saved and exited 3:
    # then the checkpoint says whether training had finished.
    if [ "$status" = 0 ] && [ -n "$neox_stop_signal" ]; then
        local last
        last=$(sed -n 's/^global_step\([0-9]*\)$/\1/p' "$save/latest" 2>/dev/null || true)
        [ "${last:-0}" -ge "${iters:-0}" ] || status=3
    fi
    # A signal that landed while the ranks were still starting can kill them before their handler
    # is installed; the checkpoint in SAVE is still sound, so that is a preemption too.
    if [ "$status" = 3 ] || { [ -n "$neox_stop_signal" ] && [ "$status" != 0 ]; }; then
        neox_requeue
    fi
    [ "$status" = 0 ] || neox_die "$status" "neox-train exited with status $status"
    neox_say "training finished: $save/$(cat "$save/latest" 2>/dev/null || echo '(no checkpoint)')"
}

# neox_requeue: puts this job back in the queue (it restarts from the top and resumes), or exits 3.
neox_requeue() {
    local restarts=${SLURM_RESTART_COUNT:-0} max=${NEOX_MAX_RESTARTS:-50}
    if [ -z "${SLURM_JOB_ID:-}" ] || [ "${NEOX_REQUEUE:-1}" = 0 ]; then
        neox_say "stopped by a signal after saving; run the same command again to resume"
        exit 3
    fi
    [ "$restarts" -lt "$max" ] || neox_die 3 "stopped by a signal after $restarts restarts (NEOX_MAX_RESTARTS=$max): not requeueing"
    neox_say "stopped by a signal after saving: requeueing job $SLURM_JOB_ID (restart $((restarts + 1)))"
    scontrol requeue "$SLURM_JOB_ID" || neox_die 3 "scontrol requeue $SLURM_JOB_ID failed; resubmit to resume"
    # The requeue ends this run; do not let the job look failed while SLURM stops it.
    exit 0
}

# neox_lines FILE: the non-empty lines of FILE that are not comments, one per line.
neox_lines() {
    [ -f "$1" ] || neox_die 2 "no such file: $1"
    grep -v -e '^[[:space:]]*$' -e '^[[:space:]]*#' "$1" || true
}

# neox_task_ids COUNT: the array task ids this run handles: SLURM_ARRAY_TASK_ID (or NEOX_TASK_ID),
# else every id 0..COUNT-1 in turn (a plain run outside a job array). Call it in an assignment
# (ids=$(neox_task_ids N)) so that an error stops the script.
neox_task_ids() {
    local id=${SLURM_ARRAY_TASK_ID:-${NEOX_TASK_ID:-}}
    if [ -n "$id" ]; then
        [ "$id" -lt "$1" ] || neox_die 2 "array task $id, but only $1 lines (ids 0..$(($1 - 1)))"
        echo "$id"
    else
        seq 0 $(($1 - 1))
    fi
}
