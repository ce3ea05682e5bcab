"""tests/fuzz/tokenizer_seeds.py OUT_DIR DATA_DIR: small seed files of each tokenizer kind for the
tokenizer fuzz target, trained here with HF `tokenizers` and `sentencepiece` on a little Tiny
Shakespeare: Llama-3-like, Qwen-like, SmolLM2-like and Llama-2-like tokenizer.json files, a
Metaspace/Whitespace one with subword affixes, a tiktoken rank file and SentencePiece BPE and
unigram .model files."""
import base64
import os
import sys

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

out, data = sys.argv[1], sys.argv[2]
with open(os.path.join(data, "text", "tinyshakespeare_input.txt"), encoding="utf-8") as f:
    lines = f.read()[:20000].split("\n") + ["café ½ ① 12345 — “quotes” 漢字 🙂"]
PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def byte_level(size=300):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=size, special_tokens=["<|endoftext|>", "<s>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    return tok


tok = byte_level()
tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(PATTERN), behavior="isolated"),
                                             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
tok.save(os.path.join(out, "llama3_like.json"))
tok.normalizer = normalizers.NFC()
tok.post_processor = None
tok.save(os.path.join(out, "qwen_like.json"))
tok.normalizer = None
tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                             pre_tokenizers.ByteLevel(add_prefix_space=False)])
tok.save(os.path.join(out, "smollm2_like.json"))

dec = {}
bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b), cs.append(256 + n)
        n += 1
dec = {chr(c): b for b, c in zip(bs, cs)}
with open(os.path.join(out, "tiny.tiktoken"), "w") as f:
    for t, i in sorted(tok.get_vocab(with_added_tokens=False).items(), key=lambda kv: kv[1]):
        f.write(f"{base64.b64encode(bytes(dec[c] for c in t)).decode()} {i}\n")

llama2 = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
llama2.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
llama2.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=400, limit_alphabet=60, show_progress=False,
                                                      special_tokens=["<unk>"] + [f"<0x{b:02X}>" for b in range(256)]))
llama2.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(content=" ", left=1, right=0)])
llama2.save(os.path.join(out, "llama2_like.json"))

words = Tokenizer(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##", end_of_word_suffix="</w>"))
words.normalizer = normalizers.Sequence([normalizers.NFKD(), normalizers.Lowercase(), normalizers.Strip()])
words.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation(),
                                               pre_tokenizers.Metaspace(prepend_scheme="first")])
words.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]"], show_progress=False,
                                                     continuing_subword_prefix="##", end_of_word_suffix="</w>"))
words.decoder = decoders.BPEDecoder()
words.save(os.path.join(out, "words_like.json"))

import sentencepiece as spm  # noqa: E402
spm.SentencePieceTrainer.train(sentence_iterator=iter([ln for ln in lines if ln.strip()]),
                               model_prefix=os.path.join(out, "spm_tmp"), model_type="bpe", vocab_size=400, normalization_rule_name="identity",
                               byte_fallback=True, minloglevel=2)
os.replace(os.path.join(out, "spm_tmp.model"), os.path.join(out, "spm_bpe.model"))
os.remove(os.path.join(out, "spm_tmp.vocab"))
# A unigram model with byte fallback and user-defined symbols: the lattice path of SPMTokenizer.
spm.SentencePieceTrainer.train(sentence_iterator=iter([ln for ln in lines if ln.strip()]),
                               model_prefix=os.path.join(out, "spm_tmp"), model_type="unigram", vocab_size=600,
                               byte_fallback=True, user_defined_symbols=["<|endoftext|>", "--"], normalization_rule_name="identity",
                               minloglevel=2)
os.replace(os.path.join(out, "spm_tmp.model"), os.path.join(out, "spm_unigram.model"))
os.remove(os.path.join(out, "spm_tmp.vocab"))
