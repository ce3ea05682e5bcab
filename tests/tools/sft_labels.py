"""sft_labels.py: label datasets for tests/tools/train_sft.sh, written with numpy by the independent
MMIDIDX writer of tests/oracle/data_oracle.py from a token dataset: `copy` (labels = tokens),
`prompt` (the first half of each document masked with -100), `short` (the last document dropped)."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "oracle"))
from data_oracle import read_indexed, write_indexed  # noqa: E402


def main(mode, tokens_prefix, out_prefix):
    sizes, pointers, _, tokens = read_indexed(tokens_prefix)
    step = tokens.dtype.itemsize
    docs = [[int(t) for t in tokens[p // step:p // step + n]] for n, p in zip(sizes, pointers)]
    if mode == "prompt":
        docs = [[-100] * (len(d) // 2) + d[len(d) // 2:] for d in docs]
    elif mode == "short":
        docs = docs[:-1]
    write_indexed(out_prefix, docs, np.int32)


if __name__ == "__main__":
    main(*sys.argv[1:])
