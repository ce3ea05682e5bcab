"""tests/mpi/zero_check.py: the checks of tests/mpi/zero.sh.

  planned OUT HF D BUCKET    every rank's gradient bytes in the start-up report OUT are within 10%
                             of the ZeRO-2 formula for the model exported to HF: fp32 gradients of
                             its partition, 4 * psi / D, plus the two buckets the reduction holds at
                             a time (the one being reduced, the one backward fills), each BUCKET
                             elements (buckets are cut at BUCKET whatever the tensors), plus the
                             largest tensor, which one product writes whole besides them (this
                             model's tied embedding, made by the output layer's weight gradient).
                             D 1 and BUCKET 0: the whole model, 4 * psi (stage 0).
"""
import re
import sys

from safetensors.numpy import load_file

UNITS = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def planned(out, hf, d, bucket):
    tensors = load_file(f"{hf}/model.safetensors")
    psi = sum(t.size for t in tensors.values())
    largest = max(t.size for t in tensors.values())
    want = 4 * psi / d + (4 * (2 * min(bucket, psi) + largest) if bucket else 0)
    got = [float(v) * UNITS[u] for v, u in re.findall(r"gradients ([0-9.]+)([kMGT]?)B", open(out).read())]
    print(f"psi {psi}, largest tensor {largest}: formula {want:.0f} bytes; ranks report {got}")
    return bool(got) and all(abs(g - want) <= 0.1 * want for g in got)


if __name__ == "__main__":
    ok = planned(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])) if sys.argv[1] == "planned" else False
    sys.exit(0 if ok else 1)
