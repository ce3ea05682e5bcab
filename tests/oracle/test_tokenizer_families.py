"""Tokenizer families beyond GPT-2: neox.c's ids against HF `tokenizers`, `tiktoken` and
`sentencepiece` on every text in ../shared/data, the adversarial set and invalid UTF-8, for
tokenizer files this test builds with those libraries' own trainers (nothing is downloaded):
Llama-3-like (Split regex + ByteLevel, ignore_merges, a bos template), Qwen-like (its regex, NFC),
SmolLM2-like (Sequence[Digits, ByteLevel]), Llama-2-like (Prepend/Replace normalizers,
byte_fallback, the Replace/ByteFallback/Fuse/Strip decoder), Metaspace with Whitespace-family
pre-tokenizers and subword affixes, tiktoken rank files (cl100k- and o200k-style patterns) and
SentencePiece BPE models. Decoding is compared with the oracle's decode."""
import base64
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import tokenizer_corpus as tc  # noqa: E402

TRAIN_TEXT = os.path.join(tc.SHARED, "text", "tinyshakespeare_input.txt")
pytestmark = pytest.mark.skipif(not os.path.exists(TRAIN_TEXT), reason=f"{TRAIN_TEXT} is absent")

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]


def training_lines():
    """A small multilingual training set: Shakespeare, Wikipedia and Common Crawl text."""
    with open(TRAIN_TEXT, encoding="utf-8") as f:
        text = f.read()[:150000]
    docs = tc.corpus_documents()
    extra = docs["jsonl/dolma_cc_sample_697docs.jsonl.gz"][:150] + docs["vectors/llamacpp_vocab_tests.inp"]
    return text.split("\n") + [line for d in extra for line in d.split("\n")]


def write(path, tokenizer):
    tokenizer.save(str(path))
    return str(path)


def edit(path, out, change):
    """Copies a tokenizer.json with change(dict) applied."""
    with open(path, encoding="utf-8") as f:
        ob = json.load(f)
    change(ob)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(ob, f, ensure_ascii=False)
    return str(out)


def byte_level_bpe(lines, vocab_size=2000):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|begin_of_text|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def build_llama3(tmp, lines):
    from tokenizers import pre_tokenizers, processors
    tok = byte_level_bpe(lines)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(pattern=__import__("tokenizers").Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    path = write(tmp / "llama3.json", tok)
    return edit(path, tmp / "llama3.json", lambda ob: ob["model"].update(ignore_merges=True))


def build_qwen(tmp, lines):
    from tokenizers import Regex, normalizers, pre_tokenizers
    tok = byte_level_bpe(lines)
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(pattern=Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return write(tmp / "qwen.json", tok)


def build_smollm2(tmp, lines):
    from tokenizers import pre_tokenizers
    tok = byte_level_bpe(lines)
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return write(tmp / "smollm2.json", tok)


def build_llama2(tmp, lines):
    """SentencePiece-style BPE as HF's LlamaTokenizerFast writes it: ▁ for spaces by normalizers,
    no pre-tokenizer, byte fallback for characters outside a deliberately small alphabet."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=False)
    tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=1500, limit_alphabet=120, show_progress=False,
                                                       special_tokens=["<unk>", "<s>", "</s>"] + BYTE_TOKENS))
    tok.pre_tokenizer = None
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1, right=0)])
    path = write(tmp / "llama2.json", tok)
    # The byte tokens are vocabulary entries in Llama-2, not added tokens matched in text.
    return edit(path, tmp / "llama2.json",
                lambda ob: ob.update(added_tokens=[t for t in ob["added_tokens"] if t["content"] not in BYTE_TOKENS]))


def build_metaspace_words(tmp, lines):
    """Metaspace(first, split) after Whitespace-family splits, subword affixes, unknown tokens
    without byte fallback, Lowercase/Strip/NFKD normalizers, the BPEDecoder."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##", end_of_word_suffix="</w>"))
    tok.normalizer = normalizers.Sequence([normalizers.NFKD(), normalizers.Lowercase(), normalizers.Strip(),
                                           normalizers.Replace(Regex(r"[0-9]{4,}"), "#")])
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(),
                                                 pre_tokenizers.Digits(individual_digits=False)])
    tok.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=1500, limit_alphabet=150, show_progress=False, special_tokens=["[UNK]"],
        continuing_subword_prefix="##", end_of_word_suffix="</w>"))
    tok.decoder = decoders.BPEDecoder(suffix="</w>")
    return write(tmp / "words.json", tok)


def build_metaspace_first(tmp, lines):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Whitespace(),
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)])
    tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=1500, limit_alphabet=200, show_progress=False,
                                                       special_tokens=["<unk>"] + BYTE_TOKENS))
    tok.decoder = decoders.Sequence([decoders.ByteFallback(),
                                     decoders.Metaspace(replacement="▁", prepend_scheme="first", split=True)])
    return write(tmp / "metaspace.json", tok)


def split_behaviors(tmp, base):
    """The Split behaviors and invert on a Llama-3-like file."""
    out = []
    for i, (behavior, invert) in enumerate([("Removed", True), ("MergedWithPrevious", False),
                                           ("MergedWithNext", False), ("Contiguous", False)]):
        def change(ob, behavior=behavior, invert=invert):
            ob["pre_tokenizer"]["pretokenizers"][0].update(behavior=behavior, invert=invert)
            ob["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": r"\p{N}+| +|[[:punct:]]"}
        out.append(edit(base, tmp / f"split{i}.json", change))
    return out


HF_BUILDERS = {"llama3": build_llama3, "qwen": build_qwen, "smollm2": build_smollm2, "llama2": build_llama2,
               "words": build_metaspace_words, "metaspace": build_metaspace_first}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if not os.path.exists(tc.PREPROCESS):
        pytest.skip(f"{tc.PREPROCESS} is not built (run make)")
    tmp = tmp_path_factory.mktemp("families")
    lines = training_lines()
    files = {name: build(tmp, lines) for name, build in HF_BUILDERS.items()}
    for i, path in enumerate(split_behaviors(tmp, files["llama3"])):
        files[f"split{i}"] = path
    return tmp, lines, files


def stable_unicode(doc):
    """The document without the characters on which the engines' Unicode versions disagree: code
    points unassigned in Python's unicodedata (PCRE2 10.42 has the same Unicode 14 tables, HF's
    Oniguruma newer ones) and punctuation assigned after Unicode 3.2 (HF's Punctuation
    pre-tokenizer uses older tables than utf8proc's). See docs/tokenizers.md."""
    import unicodedata
    old = unicodedata.ucd_3_2_0
    return "".join(c for c in doc if unicodedata.category(c) != "Cn" and
                   not (unicodedata.category(c).startswith("P") and old.category(c) == "Cn"))


def chunks(doc, size=8192):
    """A long document cut at line ends into pieces of about size characters (all of its text),
    so that the oracles' batch encoders spread it over their threads."""
    if len(doc) <= 2 * size:
        return [doc]
    out, start = [], 0
    while start < len(doc):
        end = doc.find("\n", start + size)
        end = len(doc) if end < 0 else end + 1
        out.append(doc[start:end])
        start = end
    return out


# Per corpus file, the documents (cut at line ends) up to this many characters: every file's kind of
# text, in seconds. NEOX_FULL_CORPUS=1 checks every text of every file (minutes; docs/tokenizers.md).
CORPUS_PREFIX_CHARS = 256 * 1024


def corpus_prefix(items):
    out, size = [], 0
    for piece in (c for d in items for c in chunks(d)):
        if size >= CORPUS_PREFIX_CHARS and not os.environ.get("NEOX_FULL_CORPUS"):
            break
        out.append(piece)
        size += len(piece)
    return out


@pytest.fixture(scope="module")
def corpus():
    """The texts of every file in ../shared/data (each file's first 256K characters unless
    NEOX_FULL_CORPUS is set) and the adversarial set."""
    docs = [c for _, items in sorted(tc.corpus_documents().items()) for c in corpus_prefix(items)]
    return [stable_unicode(d) for d in docs + tc.adversarial_documents()]


@pytest.fixture(scope="module")
def hard_corpus():
    """The hostile part: the adversarial set, the naughty strings, llama.cpp's and ggml's inputs."""
    docs = tc.corpus_documents()
    hard = (docs.get("jsonl/lmd_blns.jsonl.zst", []) + docs["vectors/llamacpp_vocab_tests.inp"] +
            docs["vectors/ggml_prompts_test-cases.txt"] + docs["text/enwik8_first100.txt"])
    return [stable_unicode(c) for d in hard + tc.adversarial_documents() for c in chunks(d)]


def first_mismatch(docs, got, want):
    for d, g, w in zip(docs, got, want):
        if g != w:
            i = next((k for k in range(min(len(g), len(w))) if g[k] != w[k]), min(len(g), len(w)))
            return f"{d[:120]!r}...: first difference at id {i}: neox.c {g[i:i+8]} vs reference {w[i:i+8]}"
    return None


def neox_decode_many(args, id_lists):
    text = "".join(" ".join(map(str, ids)) + "\n" for ids in id_lists).encode()
    res = subprocess.run([tc.PREPROCESS, "decode", "--null"] + args, input=text, capture_output=True, check=True)
    return res.stdout.decode("utf-8").split("\0")[:-1]


def check_encode_decode(args, docs, encode_batch, decode_batch):
    """Encodes docs and the invalid-UTF-8 set (the oracle gets Python's replacement decoding) and
    decodes the oracle's ids, asserting both equal the oracle's."""
    want = encode_batch(docs)
    got = tc.neox_encode_many(args, docs)
    assert first_mismatch(docs, got, want) is None, first_mismatch(docs, got, want)
    raw = tc.invalid_utf8_documents()
    texts = [b.decode("utf-8", "replace") for b in raw]
    got, want = tc.neox_encode_many(args, raw), encode_batch(texts)
    assert first_mismatch(texts, got, want) is None, first_mismatch(texts, got, want)
    plain = [d for d in docs if "\0" not in d]
    ids = encode_batch(plain)
    got, want = neox_decode_many(args, ids), decode_batch(ids)
    bad = [(d, g, w) for d, g, w in zip(plain, got, want) if g != w]
    assert len(got) == len(want) and not bad, f"{len(bad)} decodes differ; first: {bad[:1]!r}"[:2000]


def check_hf(path, docs):
    from tokenizers import Tokenizer
    ref = Tokenizer.from_file(path)
    args = ["--tokenizer-type", "HFTokenizer", "--vocab-file", path]
    check_encode_decode(args, docs, lambda ds: [e.ids for e in ref.encode_batch(ds)],
                        lambda ids: ref.decode_batch(ids))


@pytest.mark.parametrize("name", sorted(HF_BUILDERS))
def test_hf_tokenizer_json_matches_hf(name, built, corpus):
    check_hf(built[2][name], corpus)


@pytest.mark.parametrize("name", [f"split{i}" for i in range(4)])
def test_split_behaviors_match_hf(name, built, hard_corpus):
    check_hf(built[2][name], hard_corpus)


def test_llama3_template_puts_bos_first(built):
    from tokenizers import Tokenizer
    ref = Tokenizer.from_file(built[2]["llama3"])
    got = tc.neox_encode_many(["--tokenizer-type", "HFTokenizer", "--vocab-file", built[2]["llama3"]], ["hi"])[0]
    assert got[0] == ref.token_to_id("<|begin_of_text|>") and len(got) > 1


# ---------------------------------------------------------------------------------------------
# tiktoken.
def write_rank_file(path, tok):
    """A tiktoken rank file from a trained byte-level BPE: each token's bytes, ranked by its id."""
    dec = tc.bytelevel_decoder_map()
    vocab = tok.get_vocab(with_added_tokens=False)
    ranks = {bytes(dec[c] for c in t): i for t, i in vocab.items()}
    with open(path, "w") as f:
        for b, r in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(f"{base64.b64encode(b).decode()} {r}\n")
    return ranks


# tiktoken's own patterns (tiktoken_ext/openai_public.py), written out: its functions fetch files.
CL100K_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$"""
                  r"""|\s*[\r\n]|\s+(?!\S)|\s""")
O200K_PATTERN = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""", r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""", r"""\s*[\r\n]+""", r"""\s+(?!\S)""", r"""\s+"""])


@pytest.mark.parametrize("style", ["tiny", "tiny_o200k_base"])
def test_tiktoken_rank_file_matches_tiktoken(style, built, corpus):
    import tiktoken
    tmp, lines, _ = built
    path = str(tmp / f"{style}.tiktoken")
    ranks = write_rank_file(path, byte_level_bpe(lines))
    pattern = O200K_PATTERN if "o200k" in style else CL100K_PATTERN
    eot = 199999 if "o200k" in style else len(ranks)
    enc = tiktoken.Encoding(name=style, pat_str=pattern, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": eot})
    args = ["--tokenizer-type", "TiktokenTokenizer", "--vocab-file", path]
    check_encode_decode(args, corpus, lambda ds: enc.encode_ordinary_batch(ds, num_threads=2),
                        lambda ids: [enc.decode(i) for i in ids])


# ---------------------------------------------------------------------------------------------
# SentencePiece.
@pytest.mark.parametrize("model_type,byte_fallback", [("bpe", True), ("bpe", False)])
def test_sentencepiece_model_matches_sentencepiece(model_type, byte_fallback, built, corpus):
    import sentencepiece as spm
    tmp, lines, _ = built
    prefix = str(tmp / f"spm_{model_type}_{int(byte_fallback)}")
    spm.SentencePieceTrainer.train(sentence_iterator=iter([ln for ln in lines if ln.strip()]), model_prefix=prefix,
                                   model_type=model_type, vocab_size=1200, byte_fallback=byte_fallback,
                                   character_coverage=0.995, minloglevel=2, num_threads=2)
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    args = ["--tokenizer-type", "SPMTokenizer", "--vocab-file", prefix + ".model"]
    check_encode_decode(args, corpus, lambda ds: sp.encode(ds), lambda ids: sp.decode(ids))


# ---------------------------------------------------------------------------------------------
# Refusals: the component that is not supported is named, by its path in the file; exit status 2.
REFUSALS = [
    (lambda ob: ob["pre_tokenizer"]["pretokenizers"].insert(1, {"type": "Foo"}),
     'pre_tokenizer.pretokenizers[1].type: "Foo" is not supported'),
    (lambda ob: ob.update(normalizer={"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "BertNormalizer"}]}),
     'normalizer.normalizers[1].type: "BertNormalizer" is not supported'),
    (lambda ob: ob.update(decoder={"type": "Sequence", "decoders": [{"type": "CTC"}]}),
     'decoder.decoders[0].type: "CTC" is not supported'),
    (lambda ob: ob.update(post_processor={"type": "RobertaProcessing"}),
     'post_processor.type: "RobertaProcessing" is not supported'),
    (lambda ob: ob["model"].update(dropout=0.1), "model.dropout: BPE dropout is not supported"),
]
LLAMA3_REFUSALS = [
    (lambda ob: ob["pre_tokenizer"]["pretokenizers"][0].update(pattern={"Regex": "(unclosed"}),
     "pre_tokenizer.pretokenizers[0].pattern.Regex: the regular expression does not compile"),
]


@pytest.mark.parametrize("case", range(len(REFUSALS) + len(LLAMA3_REFUSALS)))
def test_unsupported_component_is_refused_by_name(case, built):
    tmp, _, files = built
    base = files["smollm2"] if case < len(REFUSALS) else files["llama3"]
    change, message = (REFUSALS + LLAMA3_REFUSALS)[case]
    path = edit(base, tmp / f"refused{case}.json", change)
    res = subprocess.run([tc.PREPROCESS, "encode", "--tokenizer-type", "HFTokenizer", "--vocab-file", path],
                         input=b"x", capture_output=True)
    assert res.returncode == 2, res.stderr
    assert message in res.stderr.decode(), res.stderr
