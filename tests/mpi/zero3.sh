# tests/mpi/zero3.sh: ZeRO stage 3 (parameters partitioned over the data group) against stage 0.
# The same model and global batch train 20 steps at dp2, dp4 and dp2 x tp2; losses, evaluations and
# final parameters must equal stage 0's within 1e-5 relative, under the default stage-3 settings
# (where stage 3 must plan no more parameter bytes than stage 0 and hold no more than it plans) and
# under settings that gather one layer at a time. Each stage3_* key shows its effect in the run's
# parameter_gathers report (comm_stats.json) or the parameter bytes planned at start-up, which must
# be within 10% of the formula (tests/mpi/zero3_check.py). A vocabulary-heavy model at dp2 with
# GPT-NeoX's default zero_optimization, and with a small stage3_max_live_parameters, gathers its
# embeddings in pieces within the live bound and plans at most stage 0's parameter bytes. Checkpoints move between stage 3 and stage 1 / tp2 both ways
# and continue the straight run; untied embeddings larger than a bucket (gathered and reduced in
# pieces) train as under stage 0 and stage 2; with pipelining (dp2 x pp2) stages 2 and 3 follow stage 0
# and a checkpoint moves to stage 1 without it; the fetch-by-all-reduce keys are refused by name; a
# rank killed while the ranks gather parameters ends the job.
source tests/lib.sh

need_mpi "ZeRO stage 3" || exit 0

words_dataset 500 7

source tests/layout_config.sh  # config NAME KIND MICRO ACCUM ITERS EXTRA

# zero STAGE [STAGE3 SETTINGS]
zero() { echo ", \"zero_optimization\": {\"stage\": $1, \"overlap_comm\": true, \"reduce_bucket_size\": 3000${2:+, $2}}"; }
# One layer at a time: nothing persistent, nothing prefetched, nothing kept between uses.
ONE='"stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 0, "stage3_max_reuse_distance": 0'
NOEVAL=', "do_valid": false, "do_test": false'
TP=', "model_parallel_size": 2'

run() { train_export "$@"; }
same() { check "$2 follows $1 (losses, evaluations, final parameters within 1e-5)" \
    "$PY" tests/mpi/layouts_check.py same "$T/$1" "$T/$2"; }
z3() { "$PY" tests/mpi/zero3_check.py "$@"; }

# Equal to stage 0 at dp2 and dp4, with the default settings and one layer at a time (whose
# parameter norms, read from the gathered model, are stage 0's too).
NORMS=', "log_param_norm": true'
for dp in 2 4; do
    accum=$((4 / dp))
    config "dp${dp}s0" neox 2 "$accum" 20 "$(zero 0)$NORMS"; run "dp${dp}s0" "$dp"
    config "dp${dp}s3" neox 2 "$accum" 20 "$(zero 3)"; run "dp${dp}s3" "$dp"
    same "dp${dp}s0" "dp${dp}s3"
    config "dp${dp}one" neox 2 "$accum" 20 "$(zero 3 "$ONE")$NORMS"; run "dp${dp}one" "$dp"
    check "dp${dp}one: parameter norms equal stage 0's (within 1e-5)" z3 norms "$T/dp${dp}s0" "$T/dp${dp}one"
    same "dp${dp}s0" "dp${dp}one"
    check "dp${dp}one: planned parameter bytes per rank within 10% of 4 psi / $dp + one layer" \
        z3 planned "$T/dp${dp}one.out" "$T/dp${dp}one/hf" "$dp" one
done
check "dp2s3 (defaults): planned parameter bytes at most stage 0's; measured whole elements within the plan" \
    z3 bounded "$T/dp2s3" "$T/dp2s0" 2

# Gradients and optimizer state are partitioned as under stage 2, and gathering copies values: stage
# 3 is stage 2 bit for bit, in fp32 and in bfloat16 (whose 16-bit weight copies are made per layer
# as it is gathered).
BF16=', "precision": "bfloat16"'
config dp2s2 neox 2 2 20 "$(zero 2)$NORMS"; run dp2s2 2
check "dp2one equals stage 2 bit for bit" "$PY" tests/mpi/layouts_check.py identical "$T/dp2s2" "$T/dp2one"
config bf16s2 neox 2 2 20 "$(zero 2)$BF16"; run bf16s2 2
config bf16s3 neox 2 2 20 "$(zero 3 "$ONE")$BF16"; run bf16s3 2
check "bfloat16: stage 3 equals stage 2 bit for bit" "$PY" tests/mpi/layouts_check.py identical "$T/bf16s2" "$T/bf16s3"

# stage3_param_persistence_threshold: at its default every tensor of this model is small enough to
# be persistent (gathered after each update, never by layer), but the persistent tensors take at
# most half of what stage 0 holds beyond the partition (checked above), so the rest is gathered by
# layer; at 0 none is persistent.
check "default persistence threshold: persistent elements" z3 stat "$T/dp2s3" persistent_elements gt 0
check "default persistence threshold: the layers beyond the cap are gathered" z3 stat "$T/dp2s3" gathers gt 0
check "persistence threshold 0: layers are gathered" z3 stat "$T/dp2one" gathers gt 0
check "persistence threshold 0: nothing persistent" z3 stat "$T/dp2one" persistent_elements eq 0
# stage3_model_persistence_threshold caps the persistent elements (tensors taken in order while
# they fit), so the larger tensors are gathered by layer again.
config mpt neox 2 2 20 "$(zero 3 '"stage3_model_persistence_threshold": 2000')"; run mpt 2
same dp2s0 mpt
check "model persistence threshold 2000: at most 2000 persistent elements" z3 stat "$T/mpt" persistent_elements le 2000
check "model persistence threshold 2000: some persistent" z3 stat "$T/mpt" persistent_elements gt 0
check "model persistence threshold 2000: layers are gathered" z3 stat "$T/mpt" gathers gt 0
# Activation checkpointing recomputes each layer's forward inside its backward use.
config ckpt neox 2 2 20 "$(zero 3 "$ONE"), \"checkpoint_activations\": true"; run ckpt 2
same dp2s0 ckpt

# stage3_prefetch_bucket_size: 0 prefetches nothing; one element prefetches the next layer, which
# then is whole beside the current one.
check "prefetch 0: nothing prefetched" z3 stat "$T/dp2one" prefetched eq 0
config pre neox 2 2 20 "$(zero 3 '"stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 1, "stage3_max_reuse_distance": 0')"
run pre 2
same dp2s0 pre
check "prefetch 1: layers are gathered ahead" z3 stat "$T/pre" prefetched gt 0
check "prefetch 1: more parameters whole at the peak than without prefetch" z3 more_stat "$T/pre" "$T/dp2one" peak_live_elements
check "prefetch 1: as many gathers as without" z3 same_stat "$T/pre" "$T/dp2one" gathers
# stage3_max_live_parameters: with one element allowed there is never room to prefetch.
config live neox 2 2 20 "$(zero 3 '"stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 100000000, "stage3_max_live_parameters": 1, "stage3_max_reuse_distance": 0')"
run live 2
check "max_live_parameters 1: nothing prefetched" z3 stat "$T/live" prefetched eq 0
check "max_live_parameters 1: the peak of no prefetch" z3 same_stat "$T/live" "$T/dp2one" peak_live_elements
# stage3_max_reuse_distance: at its default a layer gathered for forward is kept for backward while
# the live bound has room for it (here two of the four layers: stage 0 holds no more), so fewer
# units are gathered again.
config reuse0 neox 2 2 20 "$(zero 3 "$ONE")$NOEVAL"; run reuse0 2
config reusebig neox 2 2 20 "$(zero 3 '"stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 0')$NOEVAL"
run reusebig 2
check "max_reuse_distance 0 gathers more than the default, which keeps units for backward" \
    z3 more_stat "$T/reuse0" "$T/reusebig" gathers
check "max_reuse_distance default: units kept within the bound (at most stage 0's parameter bytes)" \
    z3 bounded "$T/reusebig" "$T/dp2s0" 2
check "max_reuse_distance default: more parameters whole at the peak" z3 more_stat "$T/reusebig" "$T/reuse0" peak_live_elements
# The older names without the prefix are read too.
config plain neox 2 2 20 "$(zero 3 '"param_persistence_threshold": 0, "prefetch_bucket_size": 0, "max_reuse_distance": 0')"
run plain 2
check "keys without the stage3_ prefix: the same gathers" z3 same_stat "$T/plain" "$T/dp2one" gathers

# With tensor parallelism: dp2 x tp2.
config tps0 neox 2 2 20 "$(zero 0)$TP"; run tps0 4
config tps3 neox 2 2 20 "$(zero 3 "$ONE")$TP"; run tps3 4
same tps0 tps3

# Embeddings larger than a bucket: untied, 512 vocabulary rows x 32 = 16384 elements each against
# reduce_bucket_size 3000. Under stages 2 and 3 the buckets are cut at 3000 elements whatever the
# tensors, the output layer is used in pieces of 93 rows (forward, and backward's gradients: each
# piece's buckets start as it is final) and so is the input embedding in forward; one bucket is in
# flight at a time; stage 3 gathers the two embeddings piece by piece and never whole (its planned
# parameters: the partition, one layer and one piece). Still stage 0's training within 1e-5, and
# stage 3 is stage 2 bit for bit, at dp2 and dp4, and in bfloat16.
UNTIED=', "no_weight_tying": true'
for dp in 2 4; do
    accum=$((4 / dp))
    VOCAB_DIVISOR=512 config "big${dp}s0" neox 2 "$accum" 20 "$(zero 0)$UNTIED"; run "big${dp}s0" "$dp"
    VOCAB_DIVISOR=512 config "big${dp}s2" neox 2 "$accum" 20 "$(zero 2)$UNTIED"; run "big${dp}s2" "$dp"
    VOCAB_DIVISOR=512 config "big${dp}s3" neox 2 "$accum" 20 "$(zero 3 "$ONE")$UNTIED"; run "big${dp}s3" "$dp"
    same "big${dp}s0" "big${dp}s2"
    same "big${dp}s0" "big${dp}s3"
    check "embeddings over the bucket size at dp$dp: stage 3 equals stage 2 bit for bit" \
        "$PY" tests/mpi/layouts_check.py identical "$T/big${dp}s2" "$T/big${dp}s3"
    check "big${dp}s3: planned parameter bytes per rank within 10% of 4 psi / $dp + one layer + one embedding piece" \
        z3 planned "$T/big${dp}s3.out" "$T/big${dp}s3/hf" "$dp" pieces:3000
done
# With tensor parallelism (dp2 x tp2) each rank's vocabulary shard is used in pieces.
VOCAB_DIVISOR=512 config bigtps0 neox 2 2 20 "$(zero 0)$UNTIED$TP"; run bigtps0 4
VOCAB_DIVISOR=512 config bigtps3 neox 2 2 20 "$(zero 3 "$ONE")$UNTIED$TP"; run bigtps3 4
same bigtps0 bigtps3
# A checkpoint of such a run (written from the partitions) resumes under stage 1, and a stage-1
# checkpoint under stage 3, each continuing the straight stage-0 run.
bigresume() {  # bigresume NAME FROM_STAGE_KEYS TO_STAGE_KEYS
    VOCAB_DIVISOR=512 config "$1-a" neox 2 2 20 "$2$UNTIED, \"exit_interval\": 10"
    VOCAB_DIVISOR=512 config "$1-b" neox 2 2 20 "$3$UNTIED, \"load\": \"$T/$1-a/ckpt\""
    check "$1: first 10 steps" "$MPIEXEC" -n 2 "$TRAIN" -q "$T/$1-a.yml"
    check "$1: resumed for 10 more" "$MPIEXEC" -n 2 "$TRAIN" -q "$T/$1-b.yml"
    check "$1: the resumed run continues stage 0's trajectory (within 1e-5)" \
        "$PY" tests/mpi/layouts_check.py resumed "$T/big2s0" "$T/$1-a" "$T/$1-b"
}
bigresume pieces-s3-to-s1 "$(zero 3 "$ONE")" "$(zero 1)"
bigresume pieces-s1-to-s3 "$(zero 1)" "$(zero 3 "$ONE")"
# stage3_max_reuse_distance holds for the pieces as for the units: at its default the output
# layer's pieces gathered for forward's end stay whole for backward's start while the live bound
# has room (the same training bit for bit, fewer gathers, more held whole at the peak, within the
# plan and stage 0's bytes); at 0 each is gathered again.
VOCAB_DIVISOR=512 config bigreuse0 neox 2 2 20 "$(zero 3 "$ONE")$UNTIED$NOEVAL"; run bigreuse0 2
VOCAB_DIVISOR=512 config bigreuse neox 2 2 20 "$(zero 3 '"stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 0')$UNTIED$NOEVAL"
run bigreuse 2
check "output layer in pieces: keeping them for backward changes no bit" \
    "$PY" tests/mpi/layouts_check.py identical "$T/bigreuse0" "$T/bigreuse"
check "max_reuse_distance 0 gathers more than the default, which keeps layers and pieces for backward" \
    z3 more_stat "$T/bigreuse0" "$T/bigreuse" gathers
check "max_reuse_distance default with pieces: kept within the bound (at most stage 0's parameter bytes)" \
    z3 bounded "$T/bigreuse" "$T/big2s0" 2
check "max_reuse_distance default: the kept pieces hold more whole at the peak" \
    z3 more_stat "$T/bigreuse" "$T/bigreuse0" peak_live_elements
# stage3_prefetch_bucket_size holds for the pieces as for the units: while one piece of the input
# embedding or output layer is used, the next is gathered (bit for bit the same training, as many
# gathers, one piece more whole at the peak); at 0 none is.
VOCAB_DIVISOR=512 config bigpre neox 2 2 20 "$(zero 3 '"stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 1, "stage3_max_reuse_distance": 0')$UNTIED$NOEVAL"
run bigpre 2
check "pieces gathered ahead change no bit" "$PY" tests/mpi/layouts_check.py identical "$T/bigreuse0" "$T/bigpre"
check "prefetch 1: pieces gathered ahead" z3 stat "$T/bigpre" pieces_prefetched gt 0
check "prefetch 0: no piece gathered ahead" z3 stat "$T/bigreuse0" pieces_prefetched eq 0
check "prefetch 1 with pieces: as many gathers as without" z3 same_stat "$T/bigpre" "$T/bigreuse0" gathers
check "prefetch 1 with pieces: more whole at the peak" z3 more_stat "$T/bigpre" "$T/bigreuse0" peak_live_elements
VOCAB_DIVISOR=512 config bigbf16s2 neox 2 2 20 "$(zero 2)$UNTIED$BF16"; run bigbf16s2 2
VOCAB_DIVISOR=512 config bigbf16s3 neox 2 2 20 "$(zero 3 "$ONE")$UNTIED$BF16"; run bigbf16s3 2
check "embeddings over the bucket size, bfloat16: stage 3 equals stage 2 bit for bit" \
    "$PY" tests/mpi/layouts_check.py identical "$T/bigbf16s2" "$T/bigbf16s3"
# Learned positions: the pieces' lookup, then the positions added, train as stage 0's whole lookup
# (every step's loss within 1e-5; no Hugging Face export has a learned position table).
for s in 0 3; do
    keys="$(zero $s)"; [ $s = 3 ] && keys="$(zero 3 "$ONE")"
    POS_EMB=learned VOCAB_DIVISOR=512 config "bigwpes$s" neox 2 2 20 "$keys$UNTIED$NOEVAL"
    check "bigwpes$s: train on 2 ranks" "$MPIEXEC" -n 2 "$TRAIN" -q "$T/bigwpes$s.yml"
done
check "embeddings over the bucket size, learned positions: stage 3 follows stage 0 (losses within 1e-5)" \
    "$PY" tests/mpi/layouts_check.py same_losses "$T/bigwpes0" "$T/bigwpes3"

# A vocabulary-heavy model (untied 2048-row embeddings of 65536 elements each, 72% of its
# parameters) at dp2 with GPT-NeoX's default zero_optimization (only the stage set:
# reduce_bucket_size 5e8, DeepSpeed's stage-3 defaults): stage 3 gathers the embeddings in pieces
# of at most a quarter of what stage 0 holds beyond the partition, so it plans no more parameter
# bytes than stage 0 (before, both embeddings were whole at once: 1.5 times stage 0's) and holds
# no more than it plans; a small stage3_max_live_parameters (20000 elements) makes the pieces
# smaller still and bounds what is whole at once. Both train as stage 0 (within 1e-5).
gptneox_zero() { echo ", \"zero_optimization\": {\"stage\": $1${2:+, $2}}$UNTIED"; }
VOCAB_DIVISOR=2048 config vocab0 neox 2 2 20 "$(gptneox_zero 0)"; run vocab0 2
VOCAB_DIVISOR=2048 config vocab3 neox 2 2 20 "$(gptneox_zero 3)"; run vocab3 2
VOCAB_DIVISOR=2048 config vocablive neox 2 2 20 "$(gptneox_zero 3 '"stage3_max_live_parameters": 20000')"; run vocablive 2
same vocab0 vocab3
same vocab0 vocablive
check "vocabulary-heavy, GPT-NeoX defaults: stage 3 plans at most stage 0's parameter bytes, holds at most its plan" \
    z3 bounded "$T/vocab3" "$T/vocab0" 2
check "vocabulary-heavy, GPT-NeoX defaults: the embeddings are gathered in pieces" z3 stat "$T/vocab3" pieces_prefetched gt 0
check "stage3_max_live_parameters 20000: at most 20000 elements whole at once, within the plan" \
    z3 bounded "$T/vocablive" "$T/vocab0" 2 20000
check "stage3_max_live_parameters 20000: smaller pieces, more gathers" z3 more_stat "$T/vocablive" "$T/vocab3" gathers

# Checkpoints: 10 steps at stage 3, 10 more at stage 1 with tp2, and the reverse.
resume() {  # resume NAME FROM_RANKS FROM_EXTRA TO_RANKS TO_EXTRA
    config "$1-a" neox 2 2 20 "$3, \"exit_interval\": 10"
    config "$1-b" neox 2 2 20 "$5, \"load\": \"$T/$1-a/ckpt\""
    check "$1: first 10 steps" "$MPIEXEC" -n "$2" "$TRAIN" -q "$T/$1-a.yml"
    check "$1: resume for 10 more under the other layout" "$MPIEXEC" -n "$4" "$TRAIN" -q "$T/$1-b.yml"
    check "$1: the resumed run continues the straight run's trajectory (within 1e-5)" \
        "$PY" tests/mpi/layouts_check.py resumed "$T/dp2s0" "$T/$1-a" "$T/$1-b"
}
resume s3-to-s1tp2 2 "$(zero 3 "$ONE")" 4 "$(zero 1)$TP"
resume s1tp2-to-s3 4 "$(zero 1)$TP" 2 "$(zero 3 "$ONE")"

# With pipelining (dp2 x pp2): 1F1B runs other micro-batches' forwards between a micro-batch's
# forward and its backward, so each is a pass of its own. The embedding is tied across the stages
# and larger than a bucket (its last-stage copy's gradient, made in pieces, is summed with the first
# stage's before it is reduced). Stages 2 and 3 follow stage 0, stage 3 is stage 2 bit for bit, and
# a stage-3 pipelined checkpoint resumes at stage 1 without pipelining.
PP=', "pipe_parallel_size": 2'
config pps0 neox 2 2 20 "$(zero 0)$PP"; run pps0 4
config pps2 neox 2 2 20 "$(zero 2)$PP"; run pps2 4
config pps3 neox 2 2 20 "$(zero 3 "$ONE")$PP"; run pps3 4
same pps0 pps2
same pps0 pps3
check "pp2: stage 3 equals stage 2 bit for bit" "$PY" tests/mpi/layouts_check.py identical "$T/pps2" "$T/pps3"
check "pp2 stage 3: layers are gathered" z3 stat "$T/pps3" gathers gt 0
resume s3pp2-to-s1 4 "$(zero 3 "$ONE")$PP" 2 "$(zero 1)"

# Refused by name.
config allred neox 2 2 20 "$(zero 3 '"stage3_use_all_reduce_for_fetch_params": true')"
check_fails "stage3_use_all_reduce_for_fetch_params is refused" 2 "stage3_use_all_reduce_for_fetch_params" \
    "$MPIEXEC" -n 2 "$TRAIN" -q "$T/allred.yml"
config below neox 2 2 20 "$(zero 2 '"stage3_max_live_parameters": 5')"
check_fails "stage3 keys below stage 3 are named in a notice" 0 \
    "no effect below zero_optimization.stage 3.*stage3_max_live_parameters" "$TRAIN" --print-config "$T/below.yml"

config agb neox 2 2 20 "$(zero 3 '"allgather_bucket_size": 1000')"
check_fails "allgather_bucket_size at stage 3 is named in a notice" 0 \
    "no effect at zero_optimization.stage 3.*allgather_bucket_size" "$TRAIN" --print-config "$T/agb.yml"

# A rank killed while the ranks gather layers ends the job.
CKPT_FACTOR=5 config kill neox 2 2 100000 "$(zero 3 "$ONE")"
kill_rank_mid_run kill
check "killing rank 1 mid-run ends the stage-3 job with a failure status within 15 s (${KILL_TOOK} s)" \
    test -n "$KILL_VICTIM" -a "$KILL_STATUS" -ne 0 -a "$KILL_TOOK" -lt 15
