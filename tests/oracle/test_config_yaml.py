"""Oracle for the config YAML layer and key normalisation: for every GPT-NeoX reference config,
PyYAML (yaml.safe_load, the YAML 1.1 reader GPT-NeoX itself uses) must read each top-level key
(with '-' taken as '_') to exactly the value neox-train reports the file set, in its JSON print."""
import glob
import json
import math
import os
import re
import subprocess

import pytest
import yaml

CONFIGS = "../shared/reference/gpt-neox-configs"
NEOX_TRAIN = os.path.join(os.environ.get("NEOX_BIN", "build/cpu/bin"), "neox-train")


def reference_files():
    if not os.path.isdir(CONFIGS):
        return []
    return sorted(glob.glob(f"{CONFIGS}/*.yml") + glob.glob(f"{CONFIGS}/*/*.yml"))


def combination(path):
    """The files a GPT-NeoX user loads this config with (the same choice as tests/tools/config.sh)."""
    text = open(path).read()
    rel = os.path.relpath(path, CONFIGS)
    if rel == "llama/train_config.yml":
        return [f"{CONFIGS}/llama/7B.yml", path, f"{CONFIGS}/local_setup.yml"], 1
    if '"num_layers"' in text or '"num-layers"' in text:
        files = [path]
        if rel.startswith(("llama/", "llama2/", "mistral/")):
            files.append(f"{CONFIGS}/llama/train_config.yml")
        if not any(f'"{k}"' in text for k in ("data_path", "data-path", "vocab_file", "vocab-file", "save", "load",
                                              "tensorboard_dir", "tensorboard-dir")):
            files.append(f"{CONFIGS}/local_setup.yml")
        return files, 8
    return [f"{CONFIGS}/125M.yml", path], 1


def same(ours, theirs):
    """Strict equality: bools are not ints, ints are not floats, floats compare exactly."""
    if isinstance(theirs, float):
        if math.isnan(theirs):
            return ours == "nan"
        if math.isinf(theirs):
            return ours == ("inf" if theirs > 0 else "-inf")
        return type(ours) is float and ours == theirs
    if type(ours) is not type(theirs):
        return False
    if isinstance(theirs, list):
        return len(ours) == len(theirs) and all(same(a, b) for a, b in zip(ours, theirs))
    if isinstance(theirs, dict):
        return list(ours) == [str(k) for k in theirs] and all(same(ours[str(k)], v) for k, v in theirs.items())
    return ours == theirs


@pytest.mark.parametrize("path", reference_files(), ids=lambda p: os.path.relpath(p, CONFIGS))
def test_values_match_pyyaml(path):
    files, world = combination(path)
    run = subprocess.run([NEOX_TRAIN, "-q", "--world-size", str(world), "--print-config", "--print-config-format",
                          "json", *files], capture_output=True, text=True, timeout=60)
    if run.returncode != 0:
        # A refusal is a config error naming the file:line, the key (or dotted sub-key) and what neox.c does
        # not do, or a value of the wrong type (gmlp_small's optimizer.params.eps is the string "1.0e_8").
        assert run.returncode == 2, run.stderr
        assert re.search(r"^neox-train: error: \S+\.yml:\d+: (key '[\w.]+': .* not supported by neox\.c|"
                         r"key '[\w.]+': expected a number, got a string|unknown key '[\w.]+')",
                         run.stderr, re.M), run.stderr
        return
    printed = json.loads(run.stdout)
    compared = 0
    for f in files:
        with open(f) as fh:
            data = yaml.safe_load(fh)
        for key, value in data.items():
            name = key.replace("-", "_")
            assert name in printed, f"{f}: key {key} missing from the print"
            entry = printed[name]
            assert "set" in entry, f"{f}: key {key} not reported as set by the file"
            assert entry["set"]["at"].startswith(f + ":"), f"{key}: reported at {entry['set']['at']}, expected {f}"
            assert same(entry["set"]["value"], value), f"{f}: {key}: neox-train {entry['set']['value']!r} != PyYAML {value!r}"
            compared += 1
    assert compared > 0


def test_reference_configs_present():
    if not reference_files():
        pytest.skip(f"{CONFIGS} is absent")
    assert len(reference_files()) > 40


# Numbers written with an exponent but without a '.' or a sign (1e-06): YAML 1.1, so PyYAML and GPT-NeoX,
# read them as strings; GPT-NeoX's NeoXArgs.validate_types then refuses a string for a float key (it
# accepts only the declared type, or an int for a float). neox.c takes them as the number for a key
# typed as a number (YAML 1.2's and JSON's reading), keeps the string for a string key, and refuses
# them for an integer key and when quoted.
ARGS = "../shared/reference/gpt-neox-args/neox_args.py"


def gpt_neox_types():
    """Each NeoXArgs field's declared type, as source text ("float", "str", ...), read with ast."""
    import ast
    types = {}
    for node in ast.walk(ast.parse(open(ARGS).read())):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    types[item.target.id] = ast.unparse(item.annotation)
    return types


def gpt_neox_accepts(declared, value):
    """NeoXArgs.validate_types for a plain type: the declared type, or an int where a float is declared."""
    kind = {"float": float, "int": int, "str": str}[declared]
    return type(value) is kind or (type(value) is int and kind is float)


@pytest.mark.skipif(not os.path.exists(ARGS), reason="GPT-NeoX's neox_args.py is absent")
def test_exponent_without_dot(tmp_path):
    types = gpt_neox_types()
    plain = {"min_lr": "1e-06", "init_method_std": "2E-2", "rms_norm_epsilon": "1.0e5", "wandb_group": "1e-06"}
    base = "num_layers: 2\nhidden_size: 32\nnum_attention_heads: 4\nmax_position_embeddings: 16\n" \
           "train_micro_batch_size_per_gpu: 1\n"
    path = tmp_path / "plain.yml"
    path.write_text(base + "".join(f"{k}: {v}\n" for k, v in plain.items()))
    read = yaml.safe_load(path.read_text())
    run = subprocess.run([NEOX_TRAIN, "-q", "--print-config", "--print-config-format", "json", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    printed = json.loads(run.stdout)
    for key, text in plain.items():
        assert read[key] == text  # PyYAML: a string
        ours = printed[key]["set"]["value"]
        if types[key] == "float":  # GPT-NeoX refuses the string; neox.c takes the number YAML 1.2 and JSON read
            assert not gpt_neox_accepts("float", read[key])
            assert type(ours) is float and ours == float(text) == json.loads(text.lower()), (key, ours)
        else:  # a string key: the string, as PyYAML reads it and GPT-NeoX takes it
            assert types[key] == "str" and gpt_neox_accepts("str", read[key]) and ours == text, (key, ours)
    for name, line, message in [("int", "train_iters: 1e3", "key 'train_iters': expected an integer, got '1e3'"),
                                ("quoted", "min_lr: '1e-06'", "key 'min_lr': expected a number, got the string '1e-06'")]:
        bad = tmp_path / f"{name}.yml"
        bad.write_text(base + line + "\n")
        key, value = next(iter(yaml.safe_load(line).items()))
        assert not gpt_neox_accepts(types[key], value)  # GPT-NeoX refuses these too
        run = subprocess.run([NEOX_TRAIN, "-q", "--print-config", str(bad)], capture_output=True, text=True, timeout=60)
        assert run.returncode == 2 and message in run.stderr, run.stderr
