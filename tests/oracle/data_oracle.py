"""data_oracle.py: an independent numpy implementation of GPT-NeoX's data formats and indices,
written from GPT-NeoX's documented behaviour (megatron/data/indexed_dataset.py, gpt2_dataset.py,
helpers.cpp, data_utils.py, blendable_dataset.py) for the data oracle tests. Never imports neox.c."""
import math
import os
import struct
import subprocess

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("NEOX_BIN", os.path.join(ROOT, "build/cpu/bin"))
DATA = os.path.join(ROOT, "..", "shared", "data")
DTYPE_CODES = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5, np.float32: 6, np.float64: 7, np.uint16: 8}
CODE_DTYPES = {v: k for k, v in DTYPE_CODES.items()}


def neox(*args, **kw):
    return subprocess.run([os.path.join(BIN, "neox-preprocess"), *map(str, args)], capture_output=True, text=True, **kw)


def write_indexed(prefix, docs, dtype):
    """MMIDIDX: magic, <Q version 1, <B dtype, <Q items, <Q doc_idx entries, i32 sizes, i64 pointers, i64 doc_idx."""
    sizes = np.array([len(d) for d in docs], dtype=np.int32)
    itemsize = np.dtype(dtype).itemsize
    pointers = np.zeros(len(docs), dtype=np.int64)
    if len(docs) > 1:
        pointers[1:] = np.cumsum(sizes[:-1].astype(np.int64) * itemsize)
    doc_idx = np.arange(len(docs) + 1, dtype=np.int64)
    with open(prefix + ".bin", "wb") as f:
        for d in docs:
            f.write(np.array(d, dtype=dtype).tobytes(order="C"))
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", DTYPE_CODES[dtype]))
        f.write(struct.pack("<Q", len(sizes)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(sizes.tobytes())
        f.write(pointers.tobytes())
        f.write(doc_idx.tobytes())


def read_indexed(prefix):
    with open(prefix + ".idx", "rb") as f:
        buf = f.read()
    assert buf[:9] == b"MMIDIDX\x00\x00"
    (version,) = struct.unpack("<Q", buf[9:17])
    assert version == 1
    dtype = CODE_DTYPES[buf[17]]
    n, d = struct.unpack("<QQ", buf[18:34])
    sizes = np.frombuffer(buf, dtype=np.int32, count=n, offset=34)
    pointers = np.frombuffer(buf, dtype=np.int64, count=n, offset=34 + 4 * n)
    doc_idx = np.frombuffer(buf, dtype=np.int64, count=d, offset=34 + 12 * n)
    tokens = np.fromfile(prefix + ".bin", dtype=dtype)
    return sizes, pointers, doc_idx, tokens


# ---- GPT2Dataset index -----------------------------------------------------------------------

def num_epochs(tokens_per_epoch, seq_length, num_samples):
    epochs, total = 0, 0
    while True:
        epochs += 1
        total += tokens_per_epoch
        if (total - 1) // seq_length >= num_samples:
            return epochs


def build_doc_idx(documents, epochs, rng):
    doc_idx = np.tile(np.asarray(documents, dtype=np.int32), epochs)
    rng.shuffle(doc_idx)
    return doc_idx


def build_sample_idx(sizes, doc_idx, seq_length, epochs, tokens_per_epoch):
    n = (epochs * tokens_per_epoch - 1) // seq_length
    out = np.zeros((n + 1, 2), dtype=np.int32)
    pos, offset = 0, 0
    for s in range(1, n + 1):
        need = seq_length + 1
        while need:
            avail = int(sizes[doc_idx[pos]]) - offset
            if avail >= need:
                offset += need - 1  # the last token starts the next sample
                need = 0
            else:
                need -= avail
                pos += 1
                offset = 0
        out[s] = (pos, offset)
    return out


def build_index(sizes, documents, num_samples, seq_length, seed):
    tokens = int(np.sum(sizes[documents]))
    epochs = num_epochs(tokens, seq_length, num_samples)
    rng = np.random.RandomState(seed=seed)
    doc_idx = build_doc_idx(documents, epochs, rng)
    sample_idx = build_sample_idx(sizes, doc_idx, seq_length, epochs, tokens)
    shuffle_idx = np.arange(sample_idx.shape[0] - 1, dtype=np.uint32)
    rng.shuffle(shuffle_idx)
    return doc_idx, sample_idx, shuffle_idx


def cache_name(prefix, name, num_samples, seq_length, seed, pack="packed", chopped=True):
    return f"{prefix}_{name}_indexmap_{num_samples}ns_{seq_length}sl_{seed}s_{pack}pi" + ("_ac" if chopped else "")


def get_sample(tokens, pointers, itemsize, sizes, index, idx, seq_length):
    doc_idx, sample_idx, shuffle_idx = index
    i = shuffle_idx[idx]
    f, l = sample_idx[i][0], sample_idx[i + 1][0]
    of, ol = sample_idx[i][1], sample_idx[i + 1][1]

    def get(doc, offset=0, length=None):
        start = pointers[doc] // itemsize + offset
        end = pointers[doc] // itemsize + (sizes[doc] if length is None else offset + length)
        return tokens[start:end]

    if f == l:
        out = get(doc_idx[f], of, ol - of + 1)
    else:
        parts = [get(doc_idx[f], of)] + [get(doc_idx[d]) for d in range(f + 1, l)] + [get(doc_idx[l], 0, ol + 1)]
        out = np.concatenate(parts)
    return np.array(out, dtype=np.int64)


# ---- splits, weights, blending ----------------------------------------------------------------

def split_ranges(splits_string, size):
    sep = "," if "," in splits_string else "/" if "/" in splits_string else None
    parts = [float(s) for s in (splits_string.split(sep) if sep else [splits_string])]
    parts = (parts + [0.0, 0.0, 0.0])[:3]
    total = sum(parts)
    index = [0]
    for p in parts:
        index.append(index[-1] + int(round(p / total * float(size))))
    diff = index[-1] - size
    return [index[0]] + [x - diff for x in index[1:]]


def normalized_weights(weights, num_samples):
    total = sum(weights)
    w = [x / total for x in weights]
    return w, [int(math.ceil(num_samples * x * 1.005)) for x in w]


def blending_indices(weights, size):
    weights = np.array(weights, dtype=np.float64)
    weights /= weights.sum()
    taken = [0] * len(weights)
    ds_index = np.zeros(size, dtype=np.uint8)
    ds_sample = np.zeros(size, dtype=np.int64)
    for s in range(size):
        at = max(float(s), 1.0)
        errors = [weights[d] * at - taken[d] for d in range(len(weights))]
        best = int(np.argmax(errors))  # first maximum, as the strict '>' scan
        ds_index[s] = best
        ds_sample[s] = taken[best]
        taken[best] += 1
    return ds_index, ds_sample
