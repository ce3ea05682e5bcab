"""Large texts cut for several threads (lib/tokenizer/cut.c): `neox-preprocess encode --threads N
--piece-bytes B` cuts every document where its tokenizer says the ids cannot change and encodes
the pieces on N threads. The joined ids must equal the independent references' ids for the whole
text — HF `tokenizers`, `tiktoken`, `sentencepiece` — on every text in ../shared/data/text (the
first CORPUS_SLICE characters of each) and on
texts built to stress the cuts (whitespace runs, CRLF, combining marks after newlines, digit runs,
added tokens next to cut points), at several thread counts and with pieces as small as one byte
(a cut at every allowed point). Tokenizers that refuse cuts must say why and still encode
correctly. neox-preprocess's datasets must be byte-identical with 1 and 2 workers on a corpus
holding one huge document, and hold the reference's ids."""
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import tokenizer_corpus as tc  # noqa: E402
import test_tokenizer_families as fam  # noqa: E402

TEXT_DIR = os.path.join(tc.SHARED, "text")
pytestmark = pytest.mark.skipif(not os.path.exists(tc.PREPROCESS), reason=f"{tc.PREPROCESS} is not built (run make)")

# (threads, piece bytes): one thread with a cut at every allowed point, two and three threads with
# small and odd piece sizes, and the library's default piece size. Texts longer than LONG (the
# corpus slices) run only at the first and last: every allowed cut, and the default; the
# settings between them differ in which cuts are taken and on which thread, which the short texts
# exercise.
SPLITS = [(1, 1), (2, 1), (3, 13), (2, 4096), (2, None)]
LONG_SPLITS = {(1, 1), (2, None)}
LONG = 30_000
# A corpus file is cut to its first CORPUS_SLICE characters, ending at a line end: more text brings
# more cut points of the kinds the slice already has (160,000 characters reached no line or branch
# of lib/tokenizer that 40,000 do not: gcc --coverage), and test_tokenizer_parity.py checks every file
# against the same references.
CORPUS_SLICE = 40_000


def cut_texts(seed=7, count=60):
    """Texts whose allowed cut points ("a| b") sit next to what could break a careless cut."""
    rng = random.Random(seed)
    hazards = ["  ", "   \t ", "\r\n", "\r\n\r\n", "\n\u0301", "\n\u0308a", "e\u0301", "\u0301", "12345678",
               "3.14", "1,000", "'s", "'S", "n't", "<|endoftext|>", "<|padding|>", "<|endoftext|> ",
               " <|endoftext|>", "\u00a0", "\u3000", "\u2028", "\ufeff", "\u03a3", "\u0391\u03a3 ", "\u1e9e",
               "\ufb01", "\u2460", "\u00bd", "\t", "\n", " ", "...", "\u2581", "\u2581a", "x" * 50]
    words = ["a", "b", "the", "Quick", "fox", "jumps", "ZZ", "over", "it", "lazy", "dog", "I", "x"]
    docs = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(5, 200)):
            parts.append(rng.choice(words))
            parts.append(" " if rng.random() < 0.7 else rng.choice(hazards))
        docs.append("".join(parts))
    # Every hazard right before and right after a cut point, and at the ends of the text.
    for h in hazards:
        docs.append(f"ab{h} cd ef{h}gh ij {h}kl m n{h}")
        docs.append(f"{h}a b{h}")
    docs += ["a b", "a  b", "a\u0301 b", "a b\u0301", "a \u0301b", "a\r\nb c", "Za zA", "I I I I"]
    return docs


@pytest.fixture(scope="module")
def texts():
    docs = []
    for name in sorted(os.listdir(TEXT_DIR)):
        with open(os.path.join(TEXT_DIR, name), "rb") as f:
            text = f.read().decode("utf-8")
        end = text.rfind("\n", 0, CORPUS_SLICE) + 1 if len(text) > CORPUS_SLICE else len(text)
        docs.append(text[:end or CORPUS_SLICE])
    docs += tc.adversarial_documents(count=100) + cut_texts()
    return [fam.stable_unicode(d) for d in docs]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cuts")
    lines = fam.training_lines()
    files = {name: fam.HF_BUILDERS[name](tmp, lines) for name in ("llama3", "qwen", "smollm2", "llama2", "words",
                                                                     "metaspace")}
    return tmp, lines, files


def refusal(args):
    r = subprocess.run([tc.PREPROCESS, "encode", "--threads", "2"] + args, input=b"a b", capture_output=True,
                       check=True)
    return r.stderr.decode()


# neox.c's ids per (command line, documents): GPT2BPETokenizer's are checked against two references
# (HF tokenizers and tiktoken), and one encoding of the texts at each setting serves both.
_encoded = {}


def neox_ids(args, docs):
    key = (tuple(args), tuple(docs))
    if key not in _encoded:
        _encoded[key] = tc.neox_encode_many(args, docs)
    return _encoded[key]


def check_cuts(args, docs, want, refused=None):
    """neox.c's split encodings of docs equal want at every SPLITS setting; `refused` is None when
    the tokenizer must cut, else a phrase its notice must hold."""
    notice = refusal(args)
    if refused is None:
        assert notice == "", notice
    else:
        assert "encoded whole" in notice and refused in notice, notice
    for threads, piece in SPLITS:
        extra = ["--threads", str(threads)] + (["--piece-bytes", str(piece)] if piece else [])
        pick = [i for i, d in enumerate(docs) if (threads, piece) in LONG_SPLITS or len(d) <= LONG]
        got = neox_ids(args + extra, [docs[i] for i in pick])
        bad = fam.first_mismatch([docs[i] for i in pick], got, [want[i] for i in pick])
        assert bad is None, f"threads={threads} piece_bytes={piece}: {bad}"


HF_GPT2_KINDS = ["GPT2BPETokenizer", "HFGPT2Tokenizer", "gpt2-json", "20B"]


@pytest.mark.parametrize("kind", HF_GPT2_KINDS)
def test_gpt2_family_cuts_match_hf(kind, texts):
    if kind == "20B":
        ref = tc.hf_from_json(tc.NEOX_JSON)
    elif kind == "gpt2-json":
        ref = tc.hf_from_json(tc.GPT2_JSON)
    else:
        ref = tc.hf_gpt2_from_files(pad=kind == "HFGPT2Tokenizer")
    want = [e.ids for e in ref.encode_batch(texts)]
    check_cuts(tc.neox_args(kind), texts, want)


def test_gpt2_cuts_match_tiktoken(texts):
    enc = tc.tiktoken_gpt2()
    check_cuts(tc.neox_args("GPT2BPETokenizer"), texts, enc.encode_ordinary_batch(texts, num_threads=2))


# name -> the phrase of its refusal (None: it cuts). Llama-2-like was trained without a
# pre-tokenizer (its vocabulary joins letters to "▁"); the Metaspace-words kind strips the left.
FAMILIES = {"llama3": None, "qwen": None, "smollm2": None, "metaspace": None,
            "llama2": "join a letter to a following space", "words": "Strip"}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_tokenizer_json_cuts_match_hf(name, built, texts):
    from tokenizers import Tokenizer
    path = built[2][name]
    want = [e.ids for e in Tokenizer.from_file(path).encode_batch(texts)]
    check_cuts(["--tokenizer-type", "HFTokenizer", "--vocab-file", path], texts, want, FAMILIES[name])


def test_prepend_is_not_repeated_at_cuts(built, texts):
    """A Llama-2-style Prepend("▁") + Replace(" ", "▁") normalizer over a vocabulary trained with
    words kept apart: cuts are allowed, and only the text's first split gets the prefix."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers
    tmp, lines, _ = built
    tok = fam.byte_level_bpe(lines)
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    path = fam.write(tmp / "prepend.json", tok)
    path = fam.edit(path, tmp / "prepend.json", lambda ob: ob.update(
        normalizer={"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "_"},
                                                        {"type": "Replace", "pattern": {"String": " "},
                                                         "content": "_"}]},
        pre_tokenizer={"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}))
    want = [e.ids for e in Tokenizer.from_file(path).encode_batch(texts)]
    check_cuts(["--tokenizer-type", "HFTokenizer", "--vocab-file", path], texts, want)


@pytest.mark.parametrize("style", ["tiny", "tiny_o200k_base"])
def test_tiktoken_cuts_match_tiktoken(style, built, texts):
    import tiktoken
    tmp, lines, _ = built
    path = str(tmp / f"{style}.tiktoken")
    ranks = fam.write_rank_file(path, fam.byte_level_bpe(lines))
    pattern = fam.O200K_PATTERN if "o200k" in style else fam.CL100K_PATTERN
    eot = 199999 if "o200k" in style else len(ranks)
    enc = tiktoken.Encoding(name=style, pat_str=pattern, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": eot})
    check_cuts(["--tokenizer-type", "TiktokenTokenizer", "--vocab-file", path], texts,
               enc.encode_ordinary_batch(texts, num_threads=2))


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_sentencepiece_cuts_match_sentencepiece(model_type, built, texts):
    """BPE models cut; unigram models refuse (their path scores are float sums of the whole text)."""
    import sentencepiece as spm
    tmp, lines, _ = built
    prefix = str(tmp / f"cut_spm_{model_type}")
    spm.SentencePieceTrainer.train(sentence_iterator=iter([ln for ln in lines if ln.strip()]), model_prefix=prefix,
                                   model_type=model_type, vocab_size=1200, byte_fallback=True, minloglevel=2,
                                   num_threads=2)
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    docs = [d for d in texts if "\0" not in d]
    check_cuts(["--tokenizer-type", "SPMTokenizer", "--vocab-file", prefix + ".model"], docs,
               sp.encode(docs, num_threads=2), None if model_type == "bpe" else "not BPE")


def test_sentencepiece_bpe_with_unused_pieces_refuses(built, texts, tmp_path):
    """Unused pieces are split back by the pair sentencepiece recorded over the whole text: no cut."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as model_pb2
    tmp, lines, _ = built
    prefix = str(tmp / "cut_spm_unused_base")
    spm.SentencePieceTrainer.train(sentence_iterator=iter([ln for ln in lines if ln.strip()]), model_prefix=prefix,
                                   model_type="bpe", vocab_size=800, minloglevel=2, num_threads=2)
    proto = model_pb2.ModelProto()
    with open(prefix + ".model", "rb") as f:
        proto.ParseFromString(f.read())
    for p in proto.pieces[10::4]:
        if p.type == p.NORMAL and len(p.piece) >= 2:
            p.type = p.UNUSED
    path = str(tmp_path / "unused.model")
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())
    sp = spm.SentencePieceProcessor(model_file=path)
    docs = [d for d in texts if "\0" not in d][:200]
    check_cuts(["--tokenizer-type", "SPMTokenizer", "--vocab-file", path], docs, sp.encode(docs), "unused pieces")


def read_dataset(prefix):
    """The documents of a Megatron .bin/.idx pair (numpy, from the index's own layout)."""
    with open(prefix + ".idx", "rb") as f:
        idx = f.read()
    assert idx[:9] == b"MMIDIDX\x00\x00"
    dtype = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
             8: np.uint16}[idx[17]]
    n = int(np.frombuffer(idx, np.int64, 1, 18)[0])
    sizes = np.frombuffer(idx, np.int32, n, 34)
    pointers = np.frombuffer(idx, np.int64, n, 34 + 4 * n)
    data = np.fromfile(prefix + ".bin", dtype)
    size = np.dtype(dtype).itemsize
    return [data[p // size:p // size + s].tolist() for p, s in zip(pointers, sizes)]


def test_preprocess_huge_document_is_identical_for_1_and_2_workers(tmp_path):
    """A corpus holding one 3.3 MB document among small ones: the worker holding it shares its
    pieces; the datasets are byte-identical with 1 and 2 workers and hold HF's ids."""
    with open(os.path.join(TEXT_DIR, "tinyshakespeare_input.txt"), encoding="utf-8") as f:
        shakespeare = f.read()
    docs = ["small one"] + [shakespeare * 3] + [f"doc {i} " + shakespeare[i * 997:(i + 1) * 997] for i in range(40)]
    src = tmp_path / "corpus.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    out = {}
    for workers in (1, 2):
        prefix = str(tmp_path / f"w{workers}")
        subprocess.run([tc.PREPROCESS, "--input", str(src), "--output-prefix", prefix] + tc.neox_args("20B") +
                       ["--append-eod", "--workers", str(workers)], check=True, capture_output=True)
        out[workers] = [open(f"{prefix}_text_document.{ext}", "rb").read() for ext in ("bin", "idx")]
    assert out[1] == out[2]
    ref = tc.hf_from_json(tc.NEOX_JSON)
    eod = ref.token_to_id("<|endoftext|>")
    want = [e.ids + [eod] for e in ref.encode_batch(docs)]
    got = read_dataset(str(tmp_path / "w2_text_document"))
    assert len(got) == len(want) and all(g == w for g, w in zip(got, want))
