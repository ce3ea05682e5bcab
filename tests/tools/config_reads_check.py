#!/usr/bin/env python3
"""config_reads_check.py SCHEMA_C READS...: every key and sub-key lib/config/schema_gen.c marks used must
appear in the union of the NEOX_CONFIG_READS records READS (one key or dotted sub-key path a line),
apart from the exemptions below. Prints the used keys nothing read and exits 1 when there are any."""
import re
import sys

# Keys no code needs to read: every value the schema accepts selects what neox.c always does (it
# refuses the others), e.g. data_impl infer and mmap both read the mmap format.
ONE_BEHAVIOUR = {"data_impl", "output_layer_parallelism"}

# Derived values GPT-NeoX computes that --print-config shows; the code computes them where it needs
# them (the grid its data-parallel size, the schedule its warmup), and a file cannot set them.
DISPLAY_ONLY = {"is_pipe_parallel", "batch_size", "dynamic_loss_scale", "data_parallel_size", "warmup_iters",
                "zero_contiguous_gradients"}

ENTRY = re.compile(r'\{\.name = "([^"]+)", .*?\.use = NEOX_KEY_(\w+),', re.S)


def used_keys(schema_path):
    """The names (top-level and dotted sub-keys) the schema marks used, in schema order."""
    return [name for name, use in ENTRY.findall(open(schema_path).read()) if use == "USED"]


def main():
    schema, reads = sys.argv[1], sys.argv[2:]
    read = set()
    for path in reads:
        read.update(line.strip() for line in open(path) if line.strip())
    used = used_keys(schema)
    if len(used) < 100:
        sys.exit(f"{schema}: only {len(used)} used keys found; is this the schema?")
    unread = [k for k in used if k not in read and k not in ONE_BEHAVIOUR | DISPLAY_ONLY]
    for k in unread:
        print(f"used in the schema but read by no run: {k}")
    print(f"{len(used)} used keys, {len(read)} read, {len(unread)} unread")
    sys.exit(1 if unread else 0)

if __name__ == "__main__":
    main()
