"""neox-preprocess chat against an independent writer: GPT-NeoX's build_chat rule
(tools/datasets/preprocess_data_with_chat_template.py) restated over transformers' AutoTokenizer and
apply_chat_template (jinja2, HF tokenizers), its token and label datasets written by
data_oracle.write_indexed; the .bin/.idx bytes must be equal. Conversations have several turns,
system prompts, Unicode and empty turns; every masking mode; reward datasets (--reward-key,
--binary-reward) as that script's encode takes the reward, written by numpy; and bad input is refused
naming the file, line and key."""
import json
import os
import shutil
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import data_oracle as do  # noqa: E402

TEMPLATES = os.path.join(os.path.dirname(__file__), "chat_templates")
TOKENIZER = os.path.join(do.DATA, "tokenizers", "neox", "20B_tokenizer.json")
MASKED = -100

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": "Paris."}],
    [{"role": "system", "content": "You answer in one word."}, {"role": "user", "content": "Colour of the sky?"},
     {"role": "assistant", "content": "Blue"}, {"role": "user", "content": "And grass?"},
     {"role": "assistant", "content": " Green \n"}],
    [{"role": "user", "content": "Übersetze: 你好, мир! 🙂"}, {"role": "assistant", "content": "Hallo, Welt! 👋🏽 — «ok»"}],
    [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}, {"role": "user", "content": "again"},
     {"role": "assistant", "content": "yes"}],
    [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"}, {"role": "user", "content": "three"}],
]


def build_chat(tok, chat, role, mask, only_last, for_rm):
    """GPT-NeoX's rule: each turn adds what the template renders for it, tokenized over the whole prefix."""
    if not mask:
        tokens = tok.apply_chat_template(chat)
        return tokens, list(tokens)
    if for_rm:
        tokens = tok.apply_chat_template(chat)
        return tokens + [tok.eos_token_id] * 2, [MASKED] * (len(tokens) + 1) + [tok.eos_token_id]
    tokens, labels = [], []
    for i, turn in enumerate(chat):
        last = i == len(chat) - 1
        generation = False if last else chat[i + 1]["role"] == role
        new = tok.apply_chat_template(chat[: i + 1], add_generation_prompt=generation)[len(tokens):]
        tokens += new
        learned = turn["role"] == role and (last or not only_last)
        labels += new if learned else [MASKED] * len(new)
    labels.append(tok.eos_token_id if labels[-1] != MASKED else MASKED)
    tokens.append(tok.eos_token_id)
    return tokens, labels


def tokenizer_folder(tmp_path, template_name):
    folder = tmp_path / "tok"
    folder.mkdir()
    shutil.copy(TOKENIZER, folder / "tokenizer.json")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|padding|>",
              "eos_token": {"__type": "AddedToken", "content": "<|endoftext|>", "lstrip": False, "normalized": False,
                            "rstrip": False, "single_word": False, "special": True},
              "chat_template": open(os.path.join(TEMPLATES, template_name), encoding="utf-8").read()}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def write_jsonl(path, records):
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def files_equal(a, b):
    return all(open(a + ext, "rb").read() == open(b + ext, "rb").read() for ext in (".bin", ".idx"))


@pytest.fixture(scope="module", autouse=True)
def built():
    if not os.path.exists(os.path.join(do.BIN, "neox-preprocess")):
        pytest.fail("neox-preprocess is not built (run make)")
    if not os.path.exists(TOKENIZER):
        pytest.skip(f"{TOKENIZER} is absent")


MODES = {"mask": [], "only-last": ["--only-last"], "no-mask": ["--no-mask"], "for-rm": ["--for-rm"]}


@pytest.mark.parametrize("template", ["llama3.jinja", "chatml-qwen2.jinja", "zephyr.jinja", "mistral-v0.3.jinja"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_datasets_equal_the_reference_writer(template, mode, tmp_path):
    from transformers import AutoTokenizer
    folder = tokenizer_folder(tmp_path, template)
    tok = AutoTokenizer.from_pretrained(str(folder))
    records = [{"messages": c, "other": [m for m in c if m["role"] != "system"][:2]} for c in CONVERSATIONS]
    write_jsonl(tmp_path / "chat.jsonl", records)
    flags = MODES[mode]
    proc = do.neox("chat", "--input", tmp_path / "chat.jsonl", "--output-prefix", tmp_path / "out",
                   "--tokenizer-type", "HFTokenizer", "--vocab-file", folder / "tokenizer.json",
                   "--jsonl-keys", "messages", "other", *flags)
    assert proc.returncode == 0, proc.stderr
    for key in ("messages", "other"):
        pairs = [build_chat(tok, r[key], "assistant", mode != "no-mask", mode == "only-last", mode == "for-rm")
                 for r in records]
        assert any(MASKED in labels for _, labels in pairs) == (mode != "no-mask")
        do.write_indexed(str(tmp_path / f"ref_{key}_document"), [t for t, _ in pairs], np.int32)
        do.write_indexed(str(tmp_path / f"ref_{key}_label_document"), [l for _, l in pairs], np.int32)
        for suffix in ("document", "label_document"):
            assert files_equal(str(tmp_path / f"out_{key}_{suffix}"), str(tmp_path / f"ref_{key}_{suffix}")), (key, suffix)


def test_chat_template_file_replaces_the_config(tmp_path):
    from transformers import AutoTokenizer
    folder = tokenizer_folder(tmp_path, "llama3.jinja")
    tok = AutoTokenizer.from_pretrained(str(folder))
    tok.chat_template = open(os.path.join(TEMPLATES, "chatml-qwen2.jinja"), encoding="utf-8").read()
    write_jsonl(tmp_path / "chat.jsonl", [{"conversation": c} for c in CONVERSATIONS])
    proc = do.neox("chat", "--input", tmp_path / "chat.jsonl", "--output-prefix", tmp_path / "out",
                   "--tokenizer-type", "HFTokenizer", "--vocab-file", folder / "tokenizer.json",
                   "--chat-template", os.path.join(TEMPLATES, "chatml-qwen2.jinja"))
    assert proc.returncode == 0, proc.stderr
    pairs = [build_chat(tok, c, "assistant", True, False, False) for c in CONVERSATIONS]
    do.write_indexed(str(tmp_path / "ref_label"), [l for _, l in pairs], np.int32)
    assert files_equal(str(tmp_path / "out_conversation_label_document"), str(tmp_path / "ref_label"))


BAD = [
    ('{"messages": [{"role": "user", "content": "only a question"}]}', 1, "no 'assistant' turn"),
    ('{"messages": [{"role": "user", "content": "q"}, "not a message"]}', 1, "message 1 is not an object"),
    ('{"messages": "text, not a list"}', 1, "not a list of messages"),
    ('{"messages": []}', 1, "has no messages"),
    ('{"messages": [{"content": "no role"}, {"role": "assistant", "content": "a"}]}', 1, "message 0 has no \"role\""),
    ('{"text": "no messages key"}', 1, 'no key "messages"'),
    ('{"messages": [', 1, ""),
]


@pytest.mark.parametrize("line,status,message", BAD)
def test_bad_conversation_names_file_line_and_key(line, status, message, tmp_path):
    folder = tokenizer_folder(tmp_path, "chatml-qwen2.jinja")
    good = json.dumps({"messages": CONVERSATIONS[0]})
    (tmp_path / "bad.jsonl").write_text(good + "\n" + line + "\n")
    proc = do.neox("chat", "--input", tmp_path / "bad.jsonl", "--output-prefix", tmp_path / "out",
                   "--tokenizer-type", "HFTokenizer", "--vocab-file", folder / "tokenizer.json", "--jsonl-keys", "messages")
    assert proc.returncode == status, proc.stderr
    assert f"{tmp_path / 'bad.jsonl'}:2" in proc.stderr and message in proc.stderr, proc.stderr
    assert not list(tmp_path.glob("out_*")), "no partial dataset may be left"


def test_template_errors_are_configuration_errors(tmp_path):
    folder = tokenizer_folder(tmp_path, "chatml-qwen2.jinja")
    write_jsonl(tmp_path / "chat.jsonl", [{"conversation": CONVERSATIONS[0]}])
    (tmp_path / "bad.jinja").write_text("{% for m in messages %}\n{{ m.content | upper }}{% endfor %}")
    args = ["chat", "--input", tmp_path / "chat.jsonl", "--output-prefix", tmp_path / "out",
            "--tokenizer-type", "HFTokenizer", "--vocab-file", folder / "tokenizer.json"]
    proc = do.neox(*args, "--chat-template", tmp_path / "bad.jinja")
    assert proc.returncode == 2 and f"{tmp_path / 'bad.jinja'}: line 2: unsupported Jinja filter 'upper'" in proc.stderr, proc.stderr
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    proc = do.neox(*args)
    assert proc.returncode == 2 and "tokenizer_config.json: no chat_template" in proc.stderr, proc.stderr
    proc = do.neox(*args, "--ftfy")
    assert proc.returncode == 2 and "--ftfy is not supported" in proc.stderr, proc.stderr


def gpt_neox_reward(value, binary):
    """preprocess_data_with_chat_template.py's encode: the reward item of one record."""
    if binary:
        return [1] if value else [-1]
    return [value] if type(value) is float else value


REWARDS = {
    # GPT-NeoX's own reward data (llama_data.py): +1 desirable, -1 undesirable; JSON integers and booleans.
    "integers": ([1, -1, 1, True, 0], [], np.int32),
    # Any JSON value read as true or false.
    "binary": ([True, False, 0.0, "yes", None], ["--binary-reward"], np.int32),
    # A fractional reward keeps its value as float32 (GPT-NeoX's int32 builder would truncate it to 0).
    "fractional": ([0.75, -1, 2.5, -0.125, 1.0], [], np.float32),
}


@pytest.mark.parametrize("case", sorted(REWARDS))
def test_reward_datasets_equal_the_reference_writer(case, tmp_path):
    values, flags, dtype = REWARDS[case]
    folder = tokenizer_folder(tmp_path, "llama3.jinja")
    records = [{"messages": c, "score": v} for c, v in zip(CONVERSATIONS, values)]
    write_jsonl(tmp_path / "chat.jsonl", records)
    proc = do.neox("chat", "--input", tmp_path / "chat.jsonl", "--output-prefix", tmp_path / "out",
                   "--tokenizer-type", "HFTokenizer", "--vocab-file", folder / "tokenizer.json",
                   "--jsonl-keys", "messages", "--reward-key", "score", *flags)
    assert proc.returncode == 0, proc.stderr
    items = [np.array(gpt_neox_reward(v, bool(flags)), dtype=dtype).reshape(-1) for v in values]
    do.write_indexed(str(tmp_path / "ref_reward"), items, dtype)
    assert files_equal(str(tmp_path / "out_messages_reward_document"), str(tmp_path / "ref_reward"))
    if dtype is np.float32:
        assert [float(i[0]) for i in items] == [0.75, -1.0, 2.5, -0.125, 1.0]
    # The token and label datasets are those of a run without rewards.
    proc = do.neox("chat", "--input", tmp_path / "chat.jsonl", "--output-prefix", tmp_path / "plain",
                   "--tokenizer-type", "HFTokenizer", "--vocab-file", folder / "tokenizer.json", "--jsonl-keys", "messages")
    assert proc.returncode == 0, proc.stderr
    for suffix in ("document", "label_document"):
        assert files_equal(str(tmp_path / f"out_messages_{suffix}"), str(tmp_path / f"plain_messages_{suffix}"))


BAD_REWARDS = [
    ('{"messages": MSG}', [], 'no key "score" (--reward-key)'),
    ('{"messages": MSG, "score": "good"}', [], '"score": the reward must be a number or a boolean'),
    ('{"messages": MSG, "score": [1]}', [], '"score": the reward must be a number or a boolean'),
    ('{"messages": MSG, "score": 4294967296}', [], '"score": reward 4294967296 does not fit int32'),
    ('{"messages_reward": MSG, "messages": MSG, "score": 1}', ["--jsonl-keys", "messages", "messages_reward"],
     "'messages_reward' is the reward dataset of 'messages'"),
]


@pytest.mark.parametrize("line,flags,message", BAD_REWARDS)
def test_bad_rewards_name_file_line_and_key(line, flags, message, tmp_path):
    folder = tokenizer_folder(tmp_path, "chatml-qwen2.jinja")
    good = json.dumps({"messages": CONVERSATIONS[0], "score": 1})
    (tmp_path / "bad.jsonl").write_text(good + "\n" + line.replace("MSG", json.dumps(CONVERSATIONS[0])) + "\n")
    proc = do.neox("chat", "--input", tmp_path / "bad.jsonl", "--output-prefix", tmp_path / "out",
                   "--tokenizer-type", "HFTokenizer", "--vocab-file", folder / "tokenizer.json",
                   "--jsonl-keys", "messages", "--reward-key", "score", *flags)
    assert proc.returncode in (1, 2) and message in proc.stderr, proc.stderr
    if not flags:
        assert proc.returncode == 1 and f"{tmp_path / 'bad.jsonl'}:2" in proc.stderr, proc.stderr
    assert not list(tmp_path.glob("out_*")), "no partial dataset may be left"


def test_binary_reward_needs_a_reward_key(tmp_path):
    proc = do.neox("chat", "--input", tmp_path / "x.jsonl", "--output-prefix", tmp_path / "out",
                   "--tokenizer-type", "HFTokenizer", "--vocab-file", TOKENIZER, "--binary-reward")
    assert proc.returncode == 2 and "--binary-reward reads the --reward-key field" in proc.stderr, proc.stderr
