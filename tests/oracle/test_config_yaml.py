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
