# tests/mpi/grad_stats.sh: log_grad_norm, log_grad_pct_zeros, log_optimizer_states and
# log_gradient_noise_scale under parallel layouts. A sharded tensor reports its whole norm (tensor
# parallelism's blocks summed, the tied embedding counted once across pipeline stages, ZeRO
# partitions summed), so tp2, pp2 and dp2 under ZeRO stages 1, 2 and 3 log every per-parameter
# statistic of one rank training the same global batch within 1e-6 relative, and its noise scale
# within 1e-5 (a ratio of differences of nearly equal squared norms, which magnifies the layouts'
# reordered sums), at every step (tests/mpi/grad_stats_check.py). The emulated device (whose memory
# the host reads only by copies) with gradient_noise_scale_cpu_offload, which sums the large batch
# in host memory, logs one CPU rank's values too.
source tests/lib.sh

need_mpi "gradient statistics under parallel layouts" || exit 0

words_dataset 300 3

source tests/layout_config.sh  # config NAME KIND MICRO ACCUM ITERS EXTRA

STATS=', "log_grad_norm": true, "log_grad_pct_zeros": true, "log_optimizer_states": true,
         "log_gradient_noise_scale": true, "gradient_noise_scale_n_batches": 2, "do_valid": false, "do_test": false'
zero() { echo ", \"zero_optimization\": {\"stage\": $1, \"reduce_bucket_size\": 3000}"; }

config one neox 2 2 4 "$STATS"
train_layout one 1
config tp2 neox 2 2 4 "$STATS, \"model_parallel_size\": 2"
train_layout tp2 2
config pp2 neox 2 2 4 "$STATS, \"pipe_parallel_size\": 2"
train_layout pp2 2
for stage in 1 2 3; do
    config "dp2z$stage" neox 2 1 4 "$STATS$(zero "$stage")"
    train_layout "dp2z$stage" 2
done

config emulated neox 2 2 4 "$STATS, \"compute_backend\": \"emulated\", \"gradient_noise_scale_cpu_offload\": true"
train_layout emulated 1

for run in tp2 pp2 dp2z1 dp2z2 dp2z3 emulated; do
    check "$run: every per-parameter statistic (within 1e-6) and the noise scale (1e-5) equal one rank's" \
        "$PY" tests/mpi/grad_stats_check.py "$T/one" "$T/$run" 1e-6 1e-5
done
