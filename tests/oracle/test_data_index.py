"""test_data_index.py: neox.c's GPT-NeoX sample index (doc_idx / sample_idx / shuffle_idx .npy caches),
splits, blending and first training samples against the independent numpy implementation in
data_oracle.py (numpy.random.RandomState shuffles), over several seeds, splits, sequence lengths,
epoch counts and blends."""
import os

import numpy as np
import pytest

from data_oracle import (DATA, build_index, blending_indices, cache_name, get_sample, neox, normalized_weights,
                         read_indexed, split_ranges, write_indexed)


def random_docs(seed, count, max_len, vocab=50000):
    rng = np.random.default_rng(seed)
    return [list(rng.integers(0, vocab, size=int(rng.integers(1, max_len)))) for _ in range(count)]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("idx") / "corpus_text_document")
    write_indexed(prefix, random_docs(1, 300, 200), np.uint16)
    return prefix


def samples_for(train_iters, eval_interval, eval_iters, batch):
    return [train_iters * batch, (train_iters // eval_interval + 1) * eval_iters * batch, eval_iters * batch]


CASES = [  # seed, split, seq_length, train_iters, batch
    (1234, "949,50,1", 64, 20, 8),
    (7, "1,1,1", 33, 50, 4),          # several epochs of small splits
    (2**31 + 5, "80/10/10", 128, 5, 2),
    (42, "100,0,0", 8, 400, 16),      # many epochs, short sequences
    (0, "969, 30, 1", 1, 10, 3),
]


@pytest.mark.parametrize("seed,split,seq,iters,batch", CASES)
def test_index_caches_match_numpy(dataset, tmp_path, seed, split, seq, iters, batch):
    eval_interval, eval_iters = 10, 2
    r = neox("index", "--data-path", dataset, "--split", split, "--seq-length", seq, "--seed", seed, "--train-iters", iters,
             "--train-batch-size", batch, "--eval-interval", eval_interval, "--eval-iters", eval_iters)
    assert r.returncode == 0, r.stderr
    sizes, _, _, _ = read_indexed(dataset)
    ranges = split_ranges(split, len(sizes))
    counts = samples_for(iters, eval_interval, eval_iters, batch)
    for i, name in enumerate(["train", "valid", "test"]):
        base = cache_name(dataset, name, counts[i], seq, seed)
        if ranges[i + 1] <= ranges[i]:
            assert not os.path.exists(base + "_doc_idx.npy")
            continue
        documents = np.arange(ranges[i], ranges[i + 1], dtype=np.int32)
        want = build_index(sizes, documents, counts[i], seq, seed)
        for suffix, w in zip(["doc_idx", "sample_idx", "shuffle_idx"], want):
            got = np.load(base + f"_{suffix}.npy")
            assert got.dtype == w.dtype, (suffix, got.dtype, w.dtype)
            np.testing.assert_array_equal(got, w, err_msg=f"{name} {suffix}")


def test_split_rounding_half_even():
    # 2.5 rounds to 2 in Python: the split code must do the same before the last-index correction.
    for split, size in [("1,1,2", 10), ("949,50,1", 1000), ("1,1,1", 7), ("45,45,10", 5)]:
        assert split_ranges(split, size)[-1] == size


def test_first_samples_match_getitem(dataset):
    seq, seed = 48, 99
    r = neox("index", "--data-path", dataset, "--split", "949,50,1", "--seq-length", seq, "--seed", seed,
             "--train-iters", 30, "--train-batch-size", 4, "--dump-samples", 40)
    assert r.returncode == 0, r.stderr
    sizes, pointers, _, tokens = read_indexed(dataset)
    ranges = split_ranges("949,50,1", len(sizes))
    index = build_index(sizes, np.arange(ranges[0], ranges[1], dtype=np.int32), 120, seq, seed)
    got = [list(map(int, line.split())) for line in r.stdout.splitlines()]
    for k, row in enumerate(got):
        assert row == list(get_sample(tokens, pointers, 2, sizes, index, k, seq)), f"sample {k}"


def test_megatron_fixture_index():
    prefix = os.path.join(DATA, "megatron", "megatron_test_text_document")
    if not os.path.exists(prefix + ".idx"):
        pytest.skip(f"{prefix}.idx is absent")
    sizes, pointers, _, tokens = read_indexed(prefix)
    assert len(sizes) == 1000
    # The shared directory is read-only: copy the dataset so the caches can be written beside it.
    import shutil
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "m")
        shutil.copy(prefix + ".idx", copy + ".idx")
        shutil.copy(prefix + ".bin", copy + ".bin")
        r = neox("index", "--data-path", copy, "--split", "98,2,0", "--seq-length", 16, "--seed", 1234,
                 "--train-iters", 100, "--train-batch-size", 8, "--dump-samples", 5)
        assert r.returncode == 0, r.stderr
        ranges = split_ranges("98,2,0", 1000)
        index = build_index(sizes, np.arange(ranges[0], ranges[1], dtype=np.int32), 800, 16, 1234)
        got = np.load(cache_name(copy, "train", 800, 16, 1234) + "_shuffle_idx.npy")
        np.testing.assert_array_equal(got, index[2])
        rows = [list(map(int, line.split())) for line in r.stdout.splitlines()]
        for k, row in enumerate(rows):
            assert row == list(get_sample(tokens, pointers, 4, sizes, index, k, 16))


@pytest.mark.parametrize("weights,by_docs", [([1.0, 1.0], False), ([0.7, 0.2, 0.1], False), ([3, 1, 1], True)])
def test_blend_matches_numpy(tmp_path, weights, by_docs):
    n = len(weights)
    prefixes = []
    for i in range(n):
        p = str(tmp_path / f"part{i}_text_document")
        write_indexed(p, random_docs(10 + i, 40 + 30 * i, 120), np.uint16)
        prefixes.append(p)
    seq, seed, iters, batch = 32, 5, 25, 4
    args = ["index", "--train-data-paths", ",".join(prefixes), "--valid-data-paths", prefixes[0], "--test-data-paths",
            prefixes[0], "--train-data-weights", ",".join(map(str, weights)), "--seq-length", seq, "--seed", seed,
            "--train-iters", iters, "--train-batch-size", batch, "--eval-interval", 100, "--eval-iters", 1,
            "--dump-samples", 60]
    if by_docs:
        args += ["--weight-by-num-documents", "--weighted-sampler-alpha", "0.3"]
    r = neox(*args)
    assert r.returncode == 0, r.stderr
    total = iters * batch
    parts = [read_indexed(p) for p in prefixes]
    w = list(map(float, weights))
    if by_docs:
        docs = [len(p[0]) for p in parts]
        probs = [(d / sum(docs)) ** 0.3 for d in docs]
        probs = [p / sum(probs) for p in probs]
        w = [p * (1 - d / sum(docs)) for p, d in zip(probs, docs)]
        w = [x / sum(w) for x in w]
    w, counts = normalized_weights(w, total)
    indices, lengths = [], []
    for i, (sizes, pointers, _, tokens) in enumerate(parts):
        index = build_index(sizes, np.arange(len(sizes), dtype=np.int32), counts[i], seq, seed)
        indices.append(index)
        lengths.append(min(len(index[2]) - 1, len(index[1]) - 1))
        got = np.load(cache_name(prefixes[i], f"train_{i}", counts[i], seq, seed) + "_doc_idx.npy")
        np.testing.assert_array_equal(got, index[0])
    ds_index, ds_sample = blending_indices(w, sum(lengths))
    rows = [list(map(int, line.split())) for line in r.stdout.splitlines()]
    assert len(rows) == 60
    for k, row in enumerate(rows):
        d = ds_index[k]
        sizes, pointers, _, tokens = parts[d]
        want = get_sample(tokens, pointers, 2, sizes, indices[d], ds_sample[k] % lengths[d], seq)
        assert row == list(want), f"blended sample {k} (dataset {d})"



# ---- pack_until_overflow and unpacked ---------------------------------------------------------
# numpy restatements of gpt2_dataset.py's two other packing modes. GPT-NeoX takes the positions
# 0..n-1 of the split's documents as document ids (and unpacked needs a label dataset); neox.c
# offsets them by the split's first document, so both agree when the split starts at document 0
# and the offset is checked separately.

def all_masked(labels, doc, n):
    return labels is not None and bool(np.all(np.asarray(labels[doc][:n]) == -100))


def pack_until_overflow_index(sizes, first, ndocs, num_samples, seq_length, seed, allow_chopped, labels=None):
    rng = np.random.RandomState(seed=seed)
    shuffle_idx = np.arange(num_samples)
    rng.shuffle(shuffle_idx)
    sample_idx, doc_idx = [], []
    order = np.arange(ndocs)
    rng.shuffle(order)
    running, cur = 0, 0
    while len(sample_idx) < num_samples:
        doc = first + order[cur]
        if (allow_chopped or sizes[doc] <= seq_length + 1) and not all_masked(labels, doc, seq_length + 1):
            if running == 0 or running + sizes[doc] > seq_length + 1:
                sample_idx.append([len(doc_idx), 0])
                running = sizes[doc]
            else:
                running += sizes[doc]
            doc_idx.append(doc)
        cur += 1
        if cur == ndocs:
            cur = 0
            rng.shuffle(order)
    sample_idx.append([len(doc_idx), 0])
    return np.array(doc_idx, dtype=np.int64), np.array(sample_idx, dtype=np.int64), shuffle_idx


def unpacked_index(sizes, first, ndocs, num_samples, seq_length, seed, allow_chopped, labels=None):
    rng = np.random.RandomState(seed=seed)
    shuffle_idx = np.arange(num_samples)
    rng.shuffle(shuffle_idx)
    sample_idx = np.zeros((num_samples + 1, 2), dtype=np.int64)
    sample_idx[:, 0] = np.arange(num_samples + 1)
    doc_idx, d = [], 0
    while len(doc_idx) <= num_samples:
        if (allow_chopped or sizes[first + d] <= seq_length + 1) and not all_masked(labels, first + d, seq_length):
            doc_idx.append(first + d)
        d = (d + 1) % ndocs
    return np.array(doc_idx, dtype=np.int64), sample_idx, shuffle_idx


@pytest.mark.parametrize("pack,build", [("pack_until_overflow", pack_until_overflow_index), ("unpacked", unpacked_index)])
@pytest.mark.parametrize("split,chopped", [("100,0,0", True), ("100,0,0", False), ("7,3,0", True)])
def test_other_packings_match_numpy(tmp_path, pack, build, split, chopped):
    # A dataset of its own: GPT-NeoX's cache names do not include the split, so cases must not share.
    dataset = str(tmp_path / "corpus_text_document")
    write_indexed(dataset, random_docs(1, 300, 200), np.uint16)
    seq, seed, iters, batch = 64, 31, 12, 4
    args = ["index", "--data-path", dataset, "--split", split, "--seq-length", seq, "--seed", seed, "--train-iters", iters,
            "--train-batch-size", batch, "--eval-interval", 1000, "--eval-iters", 1, "--pack-impl", pack]
    r = neox(*args, *([] if chopped else ["--no-allow-chopped"]))
    assert r.returncode == 0, r.stderr
    sizes, _, _, _ = read_indexed(dataset)
    ranges = split_ranges(split, len(sizes))
    counts = samples_for(iters, 1000, 1, batch)
    for i, name in enumerate(["train", "valid"]):
        if ranges[i + 1] <= ranges[i]:
            continue
        base = cache_name(dataset, name, counts[i], seq, seed, pack, chopped)
        want = build(sizes, ranges[i], ranges[i + 1] - ranges[i], counts[i], seq, seed, chopped)
        for suffix, w in zip(["doc_idx", "sample_idx", "shuffle_idx"], want):
            got = np.load(base + f"_{suffix}.npy")
            assert got.dtype == np.int64, (suffix, got.dtype)
            np.testing.assert_array_equal(got, w, err_msg=f"{pack} {name} {suffix}")


# ---- pairwise (DPO) datasets ------------------------------------------------------------------
# numpy restatements of pairwise_dataset.py: _build_index_mappings for unpacked and
# pack_until_overflow, and __getitem__ (tokens padded with 0, the IndexError fallback included).

def pairwise_index(pos_sizes, neg_sizes, pos_labels, neg_labels, ndocs, num_samples, seq, seed, pack, chopped):
    rng = np.random.RandomState(seed=seed)

    def masked(labels, doc, n):
        return labels is not None and np.all(np.asarray(labels[doc][:n]) == -100)

    if pack == "unpacked":
        shuffle_idx = np.array([i % ndocs for i in range(num_samples)])
        rng.shuffle(shuffle_idx)
        sample_idx = np.zeros((num_samples + 1, 2), dtype=np.int64)
        sample_idx[:, 0] = np.arange(num_samples + 1)
        doc_idx, d = [], 0
        while len(doc_idx) <= num_samples:
            skip = not chopped and (pos_sizes[d] > seq + 1 or neg_sizes[d] > seq + 1)
            skip = skip or masked(pos_labels, d, seq) or masked(neg_labels, d, seq)
            if not skip:
                doc_idx.append(d)
            d = (d + 1) % ndocs
        return doc_idx, sample_idx.tolist(), shuffle_idx
    shuffle_idx = np.arange(num_samples)
    rng.shuffle(shuffle_idx)
    order = np.arange(ndocs)
    rng.shuffle(order)
    sample_idx, doc_idx, running, cur = [], [], 0, 0
    while len(sample_idx) < num_samples:
        d = order[cur]
        skip = not chopped and (pos_sizes[d] < seq + 1 or neg_sizes[d] < seq + 1)
        skip = skip or masked(pos_labels, d, seq + 1) or masked(neg_labels, d, seq + 1)
        if not skip:
            length = max(pos_sizes[d], neg_sizes[d])
            if running == 0 or running + length > seq + 1:
                sample_idx.append([len(doc_idx), 0])
                running = length
            else:
                running += length
            doc_idx.append(d)
        cur += 1
        if cur == ndocs:
            cur = 0
            rng.shuffle(order)
    sample_idx.append([len(doc_idx), 0])
    return doc_idx, sample_idx, shuffle_idx


def pairwise_item(docs_by_side, index, k, seq):
    doc_idx, sample_idx, shuffle_idx = index
    length = min(len(shuffle_idx) - 1, len(sample_idx) - 1)
    while True:
        idx = shuffle_idx[k]
        f, l = sample_idx[idx][0], sample_idx[idx + 1][0]
        if l < len(doc_idx):
            break
        k = idx % length  # __getitem__'s IndexError fallback
    rows = []
    for docs in docs_by_side:
        parts = [docs[doc_idx[f]]] + [docs[doc_idx[i]] for i in range(f + 1, l)] + [docs[doc_idx[l]][:1]]
        row = list(np.concatenate(parts))[:seq + 1]
        rows.append(row + [0] * (seq + 1 - len(row)))
    return rows


@pytest.mark.parametrize("pack", ["unpacked", "pack_until_overflow"])
@pytest.mark.parametrize("chopped,labelled", [(True, True), (False, True), (True, False)])
def test_pairwise_index_matches_numpy(tmp_path, pack, chopped, labelled):
    seq, seed, iters, batch = 40, 17, 10, 4
    pos = random_docs(2, 120, 60, vocab=500)
    neg = random_docs(3, 120, 60, vocab=500)
    rng = np.random.default_rng(5)
    # Labels mask a prompt; a few documents are masked entirely (they must be skipped).
    def labels_of(docs):
        out = []
        for i, d in enumerate(docs):
            cut = len(d) if i % 17 == 3 else int(rng.integers(0, len(d)))
            out.append([-100] * cut + d[cut:])
        return out
    pos_l, neg_l = labels_of(pos), labels_of(neg)
    prefixes = {}
    for name, docs, dtype in (("pos", pos, np.uint16), ("neg", neg, np.uint16), ("posl", pos_l, np.int32),
                              ("negl", neg_l, np.int32)):
        prefixes[name] = str(tmp_path / f"{name}_document")
        write_indexed(prefixes[name], docs, dtype)
    args = ["index", "--train-data-paths", prefixes["pos"], "--neg-train-data-paths", prefixes["neg"],
            "--valid-data-paths", prefixes["pos"], "--neg-valid-data-paths", prefixes["neg"],
            "--test-data-paths", prefixes["pos"], "--neg-test-data-paths", prefixes["neg"],
            "--seq-length", seq, "--seed", seed, "--train-iters", iters, "--train-batch-size", batch,
            "--eval-interval", 1000, "--eval-iters", 1, "--pack-impl", pack, "--dump-samples", iters * batch]
    if labelled:
        args += ["--train-label-data-paths", prefixes["posl"], "--neg-train-label-data-paths", prefixes["negl"]]
    if not chopped:
        args.append("--no-allow-chopped")
    r = neox(*args)
    assert r.returncode == 0, r.stderr
    num_samples = samples_for(iters, 1000, 1, batch)[0]
    # GPT2-style normalised weights of one dataset: ceil(n * 1.005).
    num_samples = int(np.ceil(num_samples * 1.005))
    index = pairwise_index([len(d) for d in pos], [len(d) for d in neg], pos_l if labelled else None,
                           neg_l if labelled else None, len(pos), num_samples, seq, seed, pack, chopped)
    lines = [list(map(int, line.split())) for line in r.stdout.splitlines()]
    assert len(lines) == 2 * iters * batch
    for k in range(iters * batch):
        want = pairwise_item([pos, neg], index, k, seq)
        assert lines[2 * k] == want[0], f"sample {k}: chosen row"
        assert lines[2 * k + 1] == want[1], f"sample {k}: rejected row"


@pytest.mark.parametrize("pack,build", [("pack_until_overflow", pack_until_overflow_index), ("unpacked", unpacked_index)])
def test_label_datasets_skip_masked_documents(tmp_path, pack, build):
    """With a label dataset (SFT), GPT-NeoX leaves out documents whose first labels are all -100."""
    docs = random_docs(4, 200, 120)
    labels = [[-100] * len(d) if i % 9 == 2 else [-100] * (len(d) // 2) + d[len(d) // 2:] for i, d in enumerate(docs)]
    dataset, label_prefix = str(tmp_path / "corpus_text_document"), str(tmp_path / "corpus_label_document")
    write_indexed(dataset, docs, np.uint16)
    write_indexed(label_prefix, labels, np.int32)
    seq, seed, iters, batch = 64, 23, 12, 4
    r = neox("index", "--train-data-paths", dataset, "--valid-data-paths", dataset, "--test-data-paths", dataset,
             "--train-label-data-paths", label_prefix, "--seq-length", seq, "--seed", seed, "--train-iters", iters,
             "--train-batch-size", batch, "--eval-interval", 1000, "--eval-iters", 1, "--pack-impl", pack)
    assert r.returncode == 0, r.stderr
    ns = int(np.ceil(samples_for(iters, 1000, 1, batch)[0] * 1.005))
    base = cache_name(dataset, "train_0", ns, seq, seed, pack, True)
    want = build([len(d) for d in docs], 0, len(docs), ns, seq, seed, True, labels)
    assert not any(d % 9 == 2 for d in want[0]), "the oracle must skip the masked documents"
    for suffix, w in zip(["doc_idx", "sample_idx", "shuffle_idx"], want):
        np.testing.assert_array_equal(np.load(base + f"_{suffix}.npy"), w, err_msg=f"{pack} {suffix}")


# ---- reward datasets (KTO) --------------------------------------------------------------------
# GPT2Dataset.__getitem__ with a reward dataset (unpacked only): the sample spans document
# doc_idx[i] whole and the first token of doc_idx[i + 1]; the reward row repeats each document's
# reward (the first value of its reward item) over that document's tokens in the sample, padding 0,
# then everything is cut to seq_length + 1.

def reward_item(docs, rewards, doc_idx, sample_idx, shuffle_idx, k, seq):
    i = shuffle_idx[k]
    f, l = sample_idx[i][0], sample_idx[i + 1][0]
    off_f, off_l = sample_idx[i][1], sample_idx[i + 1][1]
    parts = [docs[doc_idx[f]][off_f:]] + [docs[doc_idx[j]] for j in range(f + 1, l)] + [docs[doc_idx[l]][:off_l + 1]]
    tokens = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])
    reward = np.concatenate([np.full(len(p), rewards[doc_idx[f + j]][0], dtype=np.float32) for j, p in enumerate(parts)])
    tokens = np.pad(tokens, (0, max(0, seq + 1 - len(tokens))), constant_values=0)[:seq + 1]
    reward = np.pad(reward, (0, max(0, seq + 1 - len(reward))), constant_values=0)[:seq + 1]
    return tokens, reward


@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_reward_rows_match_getitem(tmp_path, dtype):
    docs = random_docs(6, 120, 90)
    labels = [[-100] * (len(d) // 3) + d[len(d) // 3:] for d in docs]
    g = np.random.RandomState(3)
    rewards = [[v] for v in (g.choice([-1, 1], len(docs)) if dtype is np.int32 else g.uniform(-2, 2, len(docs)))]
    prefix = str(tmp_path / "kto")
    write_indexed(prefix + "_document", docs, np.uint16)
    write_indexed(prefix + "_label_document", labels, np.int32)
    write_indexed(prefix + "_reward_document", rewards, dtype)
    seq, seed, iters, batch = 64, 5, 10, 4
    r = neox("index", "--train-data-paths", prefix + "_document", "--valid-data-paths", prefix + "_document",
             "--test-data-paths", prefix + "_document", "--train-label-data-paths", prefix + "_label_document",
             "--train-reward-data-paths", prefix + "_reward_document", "--seq-length", seq, "--seed", seed,
             "--train-iters", iters, "--train-batch-size", batch, "--eval-interval", 1000, "--eval-iters", 1,
             "--pack-impl", "unpacked", "--dump-samples", iters * batch)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().split("\n")
    assert len(lines) == 2 * iters * batch
    ns = int(np.ceil(samples_for(iters, 1000, 1, batch)[0] * 1.005))
    index = unpacked_index([len(d) for d in docs], 0, len(docs), ns, seq, seed, True, labels)
    short = 0
    for k in range(iters * batch):
        tokens, reward = reward_item(docs, [np.asarray(x, dtype) for x in rewards], *index, k, seq)
        got_tokens = np.array(lines[2 * k].split(), dtype=np.int64)
        got_reward = np.array(lines[2 * k + 1].split(), dtype=np.float32)
        # neox.c pads a plain sample's tokens with -100 (GPT2Dataset without labels); compare the ids.
        n = int(np.sum(got_tokens != -100))
        np.testing.assert_array_equal(got_tokens[:n], tokens[:n], err_msg=f"sample {k}: tokens")
        np.testing.assert_array_equal(got_reward, reward, err_msg=f"sample {k}: rewards")
        short += n < seq + 1 and reward[n - 1] != reward[0]
    assert short > 0, "some sample must end with the next document's first token and reward"
