# tests/norm_config.sh: the small model of the norm tests (tests/tools/train_scalenorm.sh,
# tests/tools/train_nonparametric_norm.sh), trained on Tiny Shakespeare at sequence length 64.
# model NAME NORM_KEYS writes $T/NAME.yml with those norm keys; train_model MODEL NAME JSON trains
# $T/MODEL.yml + JSON with logs in $T/NAME; run NAME JSON trains $T/model.yml (as
# check_resume_and_emulated calls it).
source tests/small_model.sh
model() { small_model "$1" "$2, \"pos_emb\": \"rotary\", \"rotary_pct\": 0.5, \"no_weight_tying\": true"; }
train_model() {
    echo "{\"log_dir\": \"$T/$2\", \"seq_length\": 64, \"max_position_embeddings\": 64 $3}" >"$T/$2.yml"
    $TRAIN -q "$T/$1.yml" "$T/$2.yml"
}
run() { train_model model "$@"; }
