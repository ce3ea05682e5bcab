"""train_lib.py: small helpers for tests/tools/train*.sh (standard library only): Tiny Shakespeare as
jsonl paragraphs, the unigram entropy of a token file, a falling loss, comparisons of
metrics.jsonl files, and configs written for YAML 1.1 readers."""
import array
import json
import math
import re
import sys
from collections import Counter


def write_config(config, path):
    """Writes a config dict as JSON that YAML 1.1 (GPT-NeoX's reader and neox.c's) reads back
    the same: YAML 1.1 takes 1e-05 for a string, so floats are written 1.0e-05 (numbers only, not
    a digit and an e inside a word such as a scratch directory's random name)."""
    text = re.sub(r"(?<![\w.])([0-9]+)e(?=[-+]?[0-9])", r"\1.0e", json.dumps(config, indent=1))
    with open(path, "w") as f:
        f.write(text)


def paragraphs(text_path, out_path):
    """One jsonl document per blank-line separated paragraph (Tiny Shakespeare's speeches)."""
    text = open(text_path, encoding="utf-8").read()
    with open(out_path, "w", encoding="utf-8") as out:
        for p in text.split("\n\n"):
            if p.strip():
                out.write(json.dumps({"text": p + "\n\n"}) + "\n")


def entropy(bin_path):
    """Unigram entropy (nats) of a uint16 token file: the loss of the best context-free model."""
    tokens = array.array("H")
    with open(bin_path, "rb") as f:
        tokens.frombytes(f.read())
    counts = Counter(tokens)
    n = len(tokens)
    return -sum(c / n * math.log(c / n) for c in counts.values())


def records(path):
    return [json.loads(line) for line in open(path)]


def train_losses(path):
    return {r["iteration"]: r["train/lm_loss"] for r in records(path) if "train/lm_loss" in r}


def learned(metrics, bin_path, margin):
    """The mean training loss of the last 10 steps is below the unigram entropy by margin nats."""
    losses = train_losses(metrics)
    last = [losses[k] for k in sorted(losses)[-10:]]
    mean, h = sum(last) / len(last), entropy(bin_path)
    print(f"final loss {mean:.4f}, unigram entropy {h:.4f}, first loss {losses[min(losses)]:.4f}")
    valid = [r["validation/lm_loss"] for r in records(metrics) if "validation/lm_loss" in r]
    print(f"last validation loss {valid[-1]:.4f}" if valid else "no validation loss")
    return mean < h - margin and valid and valid[-1] < h


def same(a, b, keys, upto=None):
    """Records of a and b for the same iterations (up to `upto`) hold bit-identical values of keys."""
    def table(path):
        out = {}
        for r in records(path):
            for k in keys:
                if k in r and (upto is None or r["iteration"] <= upto):
                    out[(r["iteration"], k)] = r[k]
        return out
    ta, tb = table(a), table(b)
    if not ta or ta.keys() != tb.keys():
        print(f"different records: {sorted(set(ta) ^ set(tb))[:10]}")
        return False
    diff = [(k, ta[k], tb[k]) for k in sorted(ta) if ta[k] != tb[k]]
    for d in diff[:10]:
        print("differs:", d)
    print(f"{len(ta)} values compared, {len(diff)} differ")
    return not diff


def falls(metrics, steps, drop):
    """A run of `steps` logged training losses whose last is below its first by `drop` nats."""
    losses = [train_losses(metrics)[k] for k in sorted(train_losses(metrics))]
    print(f"{len(losses)} losses, {losses[0]:.4f} -> {losses[-1]:.4f}")
    return len(losses) == steps and losses[-1] < losses[0] - drop


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "paragraphs":
        paragraphs(sys.argv[2], sys.argv[3])
    elif cmd == "learned":
        sys.exit(0 if learned(sys.argv[2], sys.argv[3], float(sys.argv[4])) else 1)
    elif cmd == "falls":
        sys.exit(0 if falls(sys.argv[2], int(sys.argv[3]), float(sys.argv[4])) else 1)
    elif cmd == "same":
        upto = int(sys.argv[5]) if len(sys.argv) > 5 else None
        sys.exit(0 if same(sys.argv[2], sys.argv[3], sys.argv[4].split(","), upto) else 1)
    else:
        sys.exit(f"unknown command {cmd}")
