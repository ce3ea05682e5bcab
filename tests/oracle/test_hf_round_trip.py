"""test_hf_round_trip.py: a current Hugging Face checkpoint through neox.c and back, as a user brings one.

The checkpoint is SmolLM2-shaped: a Llama model with a StarCoder-style tokenizer.json
(`Sequence[Digits(individual_digits), ByteLevel]`), a tokenizer_config.json declaring bos / eos /
pad / unk and a ChatML chat template, and a generation_config.json. The oracles are transformers
(AutoTokenizer's special-token ids and chat template, the model's greedy continuation) and HF
`tokenizers`.

- `from-hf` imports it with its tokenizer descriptions; model.yml holds the model and tokenizer,
  run.yml the context, batch and `load`, both with absolute paths: `neox-eval generate` runs on them
  from another directory and stops at generation_config.json's eos_token_id exactly where
  transformers' greedy generation on the same weights stops.
- `to-hf` carries tokenizer_config.json (chat template included), special_tokens_map.json and
  generation_config.json back out, and config.json declares AutoTokenizer's bos / eos / pad ids.
- A tokenizer neox.c cannot read is refused at import, naming the component (exit status 2); an
  export of a checkpoint whose tokenizer cannot be read still writes the weights and copies the file.
- A tokenizer.json without <|endoftext|>: the declared eos_token is the end of document that
  `--append-eod` appends (and without one, --append-eod is refused).
"""
import json
import os
import subprocess

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
from safetensors.torch import load_file  # noqa: E402

from data_oracle import BIN  # noqa: E402

CONVERT = os.path.join(BIN, "neox-convert")
EVAL = os.path.join(BIN, "neox-eval")
PRE = os.path.join(BIN, "neox-preprocess")
TEXT = "../shared/data/text/tinyshakespeare_input.txt"
ENV = dict(os.environ, OMP_NUM_THREADS="2")
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
PROMPT = "First Citizen:\nBefore we proceed any further, hear me speak 1234."
NEW_TOKENS = 16


def run(*cmd, cwd=None, status=0):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=ENV, cwd=cwd)
    assert proc.returncode == status, f"{' '.join(map(str, cmd))}: exit {proc.returncode}\n{proc.stderr}"
    return proc


def corpus_text():
    if not os.path.exists(TEXT):
        pytest.skip(f"{TEXT} is absent")
    with open(TEXT, encoding="utf-8") as f:
        return f.read()[:40000]


def build_tokenizer(path, specials, pre_tokenizer=None):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer or pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([corpus_text()], trainer)
    tok.save(str(path))
    return tok


def llama(vocab):
    torch.manual_seed(11)
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64,
                                   tie_word_embeddings=True, rope_theta=10000.0, bos_token_id=1, eos_token_id=2,
                                   pad_token_id=2)
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_((1.0 if "norm" in n and n.endswith("weight") else 0.0) + 0.3 * torch.randn_like(p))
    return model.float().eval()


def greedy(model, ids, n, eos=()):
    """transformers' model, one greedy token at a time (the continuation, an eos id included when reached)."""
    out, seq = [], list(ids)
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax())
            out.append(nxt)
            seq.append(nxt)
            if nxt in eos:
                break
    return out


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    """The Hugging Face folder, and the token transformers' greedy continuation reaches fifth or later
    for the first time, made a stop id by generation_config.json (beside eos_token <|im_end|>, as Llama 3
    Instruct lists several), so that generation must stop there."""
    src = tmp_path_factory.mktemp("smol") / "hf"
    src.mkdir()
    tok = build_tokenizer(src / "tokenizer.json", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    model = llama(tok.get_vocab_size())
    model.save_pretrained(str(src), safe_serialization=True)
    ids = tok.encode(PROMPT).ids
    free = greedy(model, ids, NEW_TOKENS)
    k = next(i for i in range(4, NEW_TOKENS) if free[i] not in free[:i] and free[i] > 2)
    stop = free[k]
    assert 0 not in free[:k] and 2 not in free[:k], "the fixture's continuation reaches another stop id first"
    config = dict(tokenizer_class="PreTrainedTokenizerFast", bos_token="<|im_start|>", eos_token="<|im_end|>",
                  pad_token="<|im_end|>", unk_token="<|endoftext|>", chat_template=CHATML,
                  model_max_length=int(1e30),  # what save_pretrained writes when no length is set
                  clean_up_tokenization_spaces=False)
    (src / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    gen = json.loads((src / "generation_config.json").read_text())
    gen["eos_token_id"] = [2, stop]
    (src / "generation_config.json").write_text(json.dumps(gen, indent=2))
    return dict(src=src, tok=tok, model=model, ids=ids, stop=stop, expected=free[:k + 1])


def test_import_generate_export(smol, tmp_path):
    src, save, out = smol["src"], tmp_path / "ckpt", tmp_path / "hf"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run(CONVERT, "from-hf", "--input", src, "--output", "ckpt", cwd=tmp_path)
    model_yml, run_yml = (save / "model.yml").read_text(), (save / "run.yml").read_text()
    for key in ("seq_length", "load", "finetune", "train_micro_batch_size_per_gpu"):
        assert f"\n{key}:" not in model_yml, f"model.yml sets {key}, which is the run's"
    assert f'vocab_file: "{save}/tokenizer.json"' in model_yml
    assert f'load: "{save}"' in run_yml and "seq_length: 64\n" in run_yml
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (save / name).read_bytes() == (src / name).read_bytes(), name

    # Generation from another directory, on model.yml + run.yml as they are: it stops at
    # generation_config.json's stop id where transformers' greedy generation does.
    (elsewhere / "prompts.txt").write_text(PROMPT + "\n\n")
    run(EVAL, "generate", "-q", save / "model.yml", save / "run.yml", "--text-gen-type", "input-file",
        "--sample-input-file", "prompts.txt", "--prompt-end", "\n\n", "--sample-output-file", "out.jsonl",
        "--maximum-tokens", NEW_TOKENS, cwd=elsewhere)
    (record,) = [json.loads(line) for line in open(elsewhere / "out.jsonl")]
    expected = smol["expected"]
    assert record["finished"] and record["length"] == len(expected) - 1, (record, expected)
    assert record["text"] == smol["tok"].decode(expected[:-1])

    # The export carries the folder's own descriptions; config.json's ids are AutoTokenizer's.
    run(CONVERT, "to-hf", "--input", save, "--output", out)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert json.loads((out / name).read_text()) == json.loads((src / name).read_text()), name
    ref = transformers.AutoTokenizer.from_pretrained(str(src))
    exported = transformers.AutoTokenizer.from_pretrained(str(out))
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == \
        (ref.bos_token_id, ref.eos_token_id, ref.pad_token_id) == (1, 2, 2)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Speak, 12 times."}]
    assert exported.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
        ref.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    # The exported model, greedy until the exported generation_config.json's eos (transformers'
    # generate() itself needs a newer torch than the oracle environment's).
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), torch_dtype=torch.float32).eval()
    eos = transformers.GenerationConfig.from_pretrained(str(out)).eos_token_id
    assert eos == [2, smol["stop"]]
    assert greedy(hf, smol["ids"], NEW_TOKENS, eos) == expected
    weights = load_file(str(out / "model.safetensors"))
    for n, p in smol["model"].named_parameters():
        assert torch.equal(weights[n], p.detach()), n


def test_import_refuses_unreadable_tokenizer(smol, tmp_path):
    src = tmp_path / "hf"
    src.mkdir()
    for f in smol["src"].iterdir():
        (src / f.name).write_bytes(f.read_bytes())
    tj = json.loads((src / "tokenizer.json").read_text())
    tj["pre_tokenizer"]["pretokenizers"][0] = {"type": "UnicodeScripts"}
    (src / "tokenizer.json").write_text(json.dumps(tj))
    proc = run(CONVERT, "from-hf", "--input", src, "--output", tmp_path / "out", status=2)
    assert "pre_tokenizer.pretokenizers[0]" in proc.stderr and "UnicodeScripts" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_export_copies_unreadable_tokenizer(smol, tmp_path):
    save, out = tmp_path / "ckpt", tmp_path / "hf"
    run(CONVERT, "from-hf", "--input", smol["src"], "--output", save)
    tj = json.loads((save / "tokenizer.json").read_text())
    tj["pre_tokenizer"]["pretokenizers"][0] = {"type": "UnicodeScripts"}
    (save / "tokenizer.json").write_text(json.dumps(tj))
    proc = run(CONVERT, "to-hf", "--input", save, "--output", out)
    assert "cannot be read here" in proc.stderr and "UnicodeScripts" in proc.stderr, proc.stderr
    assert (out / "tokenizer.json").read_bytes() == (save / "tokenizer.json").read_bytes()
    assert (out / "tokenizer_config.json").read_bytes() == (save / "tokenizer_config.json").read_bytes()
    weights = load_file(str(out / "model.safetensors"))
    for n, p in smol["model"].named_parameters():
        assert torch.equal(weights[n], p.detach()), n


def test_declared_eos_ends_documents(tmp_path):
    """A Llama-3-style tokenizer.json (no <|endoftext|>): --append-eod appends AutoTokenizer's eos id."""
    folder = tmp_path / "tok"
    folder.mkdir()
    build_tokenizer(folder / "tokenizer.json", ["<|begin_of_text|>", "<|end_of_text|>"])
    (tmp_path / "docs.jsonl").write_text(json.dumps({"text": "Speak, speak."}) + "\n")
    args = ["--input", tmp_path / "docs.jsonl", "--tokenizer-type", "HFTokenizer", "--vocab-file",
            folder / "tokenizer.json", "--append-eod"]
    proc = run(PRE, *args, "--output-prefix", tmp_path / "none", status=2)
    assert "no end-of-document token" in proc.stderr, proc.stderr
    assert not (tmp_path / "none_text_document.bin").exists()
    (folder / "tokenizer_config.json").write_text(json.dumps(
        dict(tokenizer_class="PreTrainedTokenizerFast", bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>")))
    run(PRE, *args, "--output-prefix", tmp_path / "eos")
    ref = transformers.AutoTokenizer.from_pretrained(str(folder))
    import numpy as np
    ids = np.fromfile(tmp_path / "eos_text_document.bin", dtype=np.uint16).tolist()
    assert ids == ref.encode("Speak, speak.", add_special_tokens=False) + [ref.eos_token_id]


def test_bad_generation_config_is_named(smol, tmp_path):
    save = tmp_path / "ckpt"
    run(CONVERT, "from-hf", "--input", smol["src"], "--output", save)
    (tmp_path / "prompts.txt").write_text(PROMPT + "\n\n")
    args = [EVAL, "generate", "-q", save / "model.yml", save / "run.yml", "--text-gen-type", "input-file",
            "--sample-input-file", tmp_path / "prompts.txt", "--sample-output-file", tmp_path / "out.jsonl"]
    for bad in ('{"eos_token_id": [2, 100000]}', '{"eos_token_id": "x"}', '{"eos_token_id": [2,'):
        (save / "generation_config.json").write_text(bad)
        proc = run(*args, status=1)
        assert f"{save}/generation_config.json" in proc.stderr, proc.stderr
        assert not (tmp_path / "out.jsonl").exists()
