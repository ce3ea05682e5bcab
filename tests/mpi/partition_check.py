"""tests/mpi/partition_check.py: the memory checks of tests/mpi/partition_activations.sh and
tests/tools/cpu_checkpointing.sh, from the runs' log_dir/memory_plan.json (every rank's planned bytes
by region) and the model's shape as the config states it, independent of the C planner.

  saving OFF ON CONFIG       every rank's activations fall from run OFF (checkpoints kept whole in
                             place) to run ON (partition_activations) by the formula below, exactly
  host OFF ON CONFIG         run ON (checkpoint_in_cpu) plans the device activation bytes and host
                             (offloaded) bytes of the formula below, exactly

With N = micro-batch x seq_length rows, C the hidden size, a pipeline stage of L layers holding S
micro-batches between forward and backward (S = min(pipe stages from it to the last, gradient
accumulation): 1F1B) and P tensor-parallel ranks, each rank keeps its 1/P of each layer input and
one whole layer input to gather into, and still the stage's output:

    saved bytes = 4 (S L N C (P - 1) / P - N C)

On the host (P = 1) every slot keeps only the stage's output on the device, beside the one gather
buffer, and the L inputs in host memory:

    device bytes saved = 4 (S L N C - N C),  host bytes added = 4 S L N C
"""
import json
import sys


def plan(run):
    return json.load(open(f"{run}/log/memory_plan.json"))["ranks"]


def shape(config):
    c = json.load(open(config))
    tp, pp = c.get("model_parallel_size", 1), c.get("pipe_parallel_size", 1)
    return c, tp, max(pp, 1)


def stage_of(rank, world, pp):
    return rank // (world // pp)


def ranks(off, on, config):
    """Each rank's plans without and with the switch, with the S L N C P of the formulas."""
    c, tp, pp = shape(config)
    a, b = plan(off), plan(on)
    N, C, accum = c["train_micro_batch_size_per_gpu"] * c["seq_length"], c["hidden_size"], c["gradient_accumulation_steps"]
    L = c["num_layers"] // pp
    assert len(a) == len(b) and len(a) > 0, (len(a), len(b))
    for r, (x, y) in enumerate(zip(a, b)):
        yield r, x, y, min(pp - stage_of(r, len(a), pp), accum), L, N, C, tp


def saving(off, on, config):
    ok = True
    for r, x, y, S, L, N, C, P in ranks(off, on, config):
        want = 4 * (S * L * N * C * (P - 1) // P - N * C)
        ok = ok and want > 0  # (a layout where some rank would save nothing tests nothing there)
        got = x["activations"] - y["activations"]
        print(f"rank {r}: activations {x['activations']} -> {y['activations']}: saved {got}, formula {want} "
              f"(S {S}, L {L}, N {N}, C {C}, P {P})")
        ok = ok and got == want
        others = {k: v for k, v in x.items() if k != "activations"}
        ok = ok and others == {k: v for k, v in y.items() if k != "activations"}
    return ok


def host(off, on, config):
    ok = True
    for r, x, y, S, L, N, C, _ in ranks(off, on, config):
        # the device keeps, per slot, the stage's output instead of L + 1 inputs, plus one gather buffer
        device = 4 * (S * L * N * C - N * C)
        moved = 4 * S * L * N * C
        got_device = x["activations"] - y["activations"]
        got_host = y["offloaded"] - x["offloaded"]
        print(f"rank {r}: device activations saved {got_device} (formula {device}), host holds {got_host} more "
              f"(formula {moved})")
        ok = ok and got_device == device and got_host == moved
    return ok


if __name__ == "__main__":
    fn = {"saving": saving, "host": host}[sys.argv[1]]
    sys.exit(0 if fn(*sys.argv[2:]) else 1)
