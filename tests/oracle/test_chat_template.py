"""Chat templates: lib/tokenizer's renderer (through tests/drivers/chat_template_driver) against
transformers' apply_chat_template (jinja2, trim_blocks and lstrip_blocks as transformers sets them) on
the chat templates of Llama 3, ChatML/Qwen2, Zephyr and Mistral (tests/oracle/chat_templates/, as their
models' tokenizer_config.json carry them) and a template using every supported construct, over
conversations with several turns, system prompts, Unicode, empty and whitespace-padded turns; and the
refusal, by name and line, of Jinja features outside the subset."""
import json
import os
import subprocess

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DRIVER = os.path.join(ROOT, os.environ.get("NEOX_DRIVERS", "build/cpu/tests/drivers"), "chat_template_driver")
TEMPLATES = os.path.join(os.path.dirname(__file__), "chat_templates")
TOKENIZER = os.path.join(ROOT, "..", "shared", "data", "tokenizers", "neox", "20B_tokenizer.json")
BOS, EOS = "<|begin_of_text|>", "</s>"

CONVERSATIONS = [
    [{"role": "user", "content": "Hello"}],
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"},
     {"role": "user", "content": "And 3+3?"}, {"role": "assistant", "content": "6, of course."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "  padded\n question \t"},
     {"role": "assistant", "content": "\n answer with spaces \u3000"}],
    [{"role": "user", "content": "Grüße, 世界! 🙂 — «quotes» and 'apostrophes' \"double\""},
     {"role": "assistant", "content": "Ünïcödé réply: 你好 👋🏽"}],
    [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}],
    [{"role": "system", "content": "sys"}, {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
     {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}, {"role": "user", "content": "e"}],
    [{"role": "user", "content": "x"}, {"role": "user", "content": "two users in a row"}],
    [{"role": "tool", "content": "a role no template expects"}],
]


def hf_tokenizer(template):
    from transformers import PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast(tokenizer_file=TOKENIZER, bos_token=BOS, eos_token=EOS)
    tok.chat_template = template
    return tok


def reference(tok, messages, generation):
    import jinja2
    try:
        return {"text": tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)}
    except (jinja2.TemplateError, IndexError, TypeError) as e:
        return {"error": str(e)}


def run_driver(tmp_path, template_path, cases):
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases))
    return subprocess.run([DRIVER, template_path, str(path)], capture_output=True, text=True)


@pytest.fixture(scope="module", autouse=True)
def built():
    if not os.path.exists(DRIVER):
        pytest.fail(f"{DRIVER} is missing (run 'make test-drivers')")
    if not os.path.exists(TOKENIZER):
        pytest.skip(f"{TOKENIZER} is absent")


@pytest.mark.parametrize("name", sorted(os.listdir(TEMPLATES)))
def test_render_matches_apply_chat_template(name, tmp_path):
    template_path = os.path.join(TEMPLATES, name)
    tok = hf_tokenizer(open(template_path, encoding="utf-8").read())
    cases = [{"messages": m, "add_generation_prompt": g, "bos_token": BOS, "eos_token": EOS}
             for m in CONVERSATIONS for g in (False, True)]
    proc = run_driver(tmp_path, template_path, cases)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    rendered = 0
    for case, g in zip(cases, got):
        want = reference(tok, case["messages"], case["add_generation_prompt"])
        if "error" in want:
            # Our message names the line and quotes raise_exception's text; jinja2 raises on the same input.
            assert "error" in g, f"{name} {case}: rendered {g.get('text')!r} where jinja2 raised {want['error']!r}"
            if "raise_exception" in open(template_path).read() and "must alternate" in want["error"]:
                assert want["error"] in g["error"], (g, want)
        else:
            assert g == want, f"{name} {case}"
            rendered += 1
    assert rendered >= len(cases) // 2


REFUSED = [
    ("{% macro m() %}x{% endmacro %}", "unsupported Jinja statement 'macro'", 1),
    ("a\n{{ messages | tojson }}", "unsupported Jinja filter 'tojson'", 2),
    ("\n\n{{ x.strip() }}", "method call '.strip()'", 3),
    ("{{ strftime_now('%Y') }}", "unsupported Jinja function 'strftime_now'", 1),
    ("{% for m in messages %}{% break %}{% endfor %}", "unsupported Jinja statement 'break'", 1),
    ("{% for m in messages if m.role %}{% endfor %}", "unsupported Jinja feature: 'if' here", 1),
    ("{% set ns = namespace(a=1) %}", "unsupported Jinja function 'namespace'", 1),
    ("{{ {'a': 1} }}", "dict literals", 1),
    ("{{ 1.5 }}", "unsupported number literal", 1),
    ("{{ 4 / 2 }}", "unsupported Jinja operator '/'", 1),
    ("{% if x %}\nno end", "missing '{% endif %}'", 1),
    ("{{ x is sameas y }}", "unsupported Jinja test 'sameas'", 1),
    ("{{ 'abc", "unclosed '{{'", 1),
    ("{% for a, b in x %}{% endfor %}", "unpacking in 'for'", 1),
    ("{% generation %}x{% endgeneration %}", "unsupported Jinja statement 'generation'", 1),
    ("{{ " + "(" * 300 + "1" + ")" * 300 + " }}", "nested more than 200 deep", 1),
    ("{% if 1 %}" * 300, "nested more than 200 deep", 1),
]


@pytest.mark.parametrize("source,message,line", REFUSED)
def test_unsupported_feature_is_refused_by_name(source, message, line, tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text(source)
    proc = run_driver(tmp_path, str(path), [])
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert f"{path}: line {line}: " in proc.stderr and message in proc.stderr, proc.stderr
