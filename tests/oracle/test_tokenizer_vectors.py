"""Published tokenizer test vectors (ggml prompts, llama.cpp vocab tests) with their expected ids,
for GPT-2 and GPT-NeoX-20B, encoded by `neox-preprocess encode`. The expected ids come from those
projects' files, not from neox.c."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import tokenizer_corpus as tc  # noqa: E402

VEC = os.path.join(tc.SHARED, "vectors")
pytestmark = pytest.mark.skipif(not os.path.isdir(VEC), reason=f"{VEC} is absent")


def ggml_cases(name):
    cases = []
    with open(os.path.join(VEC, name), encoding="utf-8") as f:
        for line in f.read().split("\n"):
            if " => " not in line:
                continue
            text, ids = line.rsplit(" => ", 1)
            cases.append((text, [int(x) for x in ids.split(",") if x]))
    return cases


def llamacpp_cases(out_name):
    with open(os.path.join(VEC, "llamacpp_vocab_tests.inp"), encoding="utf-8") as f:
        texts = f.read().split("\n__ggml_vocab_test__\n")[:-1]
    with open(os.path.join(VEC, out_name), encoding="utf-8") as f:
        ids = [[int(x) for x in line.split()] for line in f.read().split("\n")[: len(texts)]]
    assert len(texts) == len(ids) == 46
    return list(zip(texts, ids))


VECTORS = [
    ("GPT2BPETokenizer", "ggml_prompts_gpt-2.txt", ggml_cases),
    ("gpt2-json", "ggml_prompts_gpt-2.txt", ggml_cases),
    ("20B", "ggml_prompts_gpt-neox.txt", ggml_cases),
    ("GPT2BPETokenizer", "llamacpp_gpt-2.out", llamacpp_cases),
    ("gpt2-json", "llamacpp_gpt-2.out", llamacpp_cases),
    ("20B", "llamacpp_mpt_neox20b.out", llamacpp_cases),
]


@pytest.mark.parametrize("kind,name,reader", VECTORS, ids=[f"{k}-{n}" for k, n, _ in VECTORS])
def test_vectors(kind, name, reader):
    if not os.path.exists(tc.PREPROCESS):
        pytest.skip(f"{tc.PREPROCESS} is not built")
    cases = reader(name)
    got = tc.neox_encode_many(tc.neox_args(kind), [t for t, _ in cases])
    bad = [(t, g, w) for (t, w), g in zip(cases, got) if g != w]
    assert not bad, f"{len(bad)} of {len(cases)} differ; first: {bad[0]!r}"
