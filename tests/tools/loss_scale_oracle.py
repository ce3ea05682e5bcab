"""loss_scale_oracle.py: checks an fp16 run's metrics.jsonl (log_interval 1) against DeepSpeed's
dynamic loss scaling rules, written here from DeepSpeed's documented DynamicLossScaler: start at
2^initial_scale_power; on an overflow, absorb it while more than one hysteresis count is left,
else halve (not below min_loss_scale); after loss_scale_window iterations since the last overflow,
double and refill the hysteresis. An overflow skips the update (DeepSpeed does not step the
optimizer or the LR scheduler), so the learning rate of a step equals the reference run's at the
number of updates applied so far.

usage: loss_scale_oracle.py METRICS POWER WINDOW HYSTERESIS MIN_SCALE REFERENCE_METRICS
Prints the sequence and exits 1 on the first disagreement, or when nothing overflowed (the
check would prove nothing) or nothing was applied."""
import json
import sys


def records(path):
    return [r for r in map(json.loads, open(path)) if "train/lm_loss" in r]


def main(path, power, window, hysteresis, min_scale, reference):
    power, window, hysteresis, min_scale = int(power), int(window), int(hysteresis), float(min_scale)
    ref_lr = [r["train/learning_rate"] for r in records(reference)]
    scale, left, last_overflow = 2.0 ** power, hysteresis, -1
    overflows = applied = 0
    for i, r in enumerate(records(path)):
        overflow = r["train/skipped_iterations"] == 1
        lr_expected = ref_lr[applied]
        if overflow:
            if left == 1:
                scale = max(scale / 2, min_scale)
            else:
                left -= 1
            last_overflow = i
            overflows += 1
        else:
            if (i - last_overflow) % window == 0:
                left = hysteresis
                scale *= 2
            applied += 1
        got = r["train/loss_scale"]
        print(f"iteration {r['iteration']}: overflow {int(overflow)} scale {got:g} (expected {scale:g}) "
              f"lr {r['train/learning_rate']:.6g} (expected {lr_expected:.6g})")
        if got != scale:
            sys.exit(f"iteration {r['iteration']}: loss scale {got} != {scale}")
        if abs(r["train/learning_rate"] - lr_expected) > 1e-12 * max(1.0, lr_expected):
            sys.exit(f"iteration {r['iteration']}: learning rate {r['train/learning_rate']} != {lr_expected}")
    if overflows == 0 or applied == 0:
        sys.exit(f"{overflows} overflows and {applied} updates: the run did not exercise the scaler")
    print(f"{overflows} overflows, {applied} updates")


if __name__ == "__main__":
    main(*sys.argv[1:])
