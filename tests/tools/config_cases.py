#!/usr/bin/env python3
"""config_cases.py MODE NEOX_TRAIN SCHEMA_C TMPDIR: runs `neox-train --print-config` on one small config
per case, derived from the schema table, and prints a TAP line per case.
  typos:    in every dict with sub-keys, its longest sub-key misspelt (one letter dropped) is an error
            naming FILE:LINE and the dotted path, suggesting the sub-key.
  refusals: every refused key and sub-key set to a value other than its default, and every key with
            refused values set to one of them, is an error (exit 2) naming FILE:LINE, the key and
            "is not supported by neox.c"."""
import json
import os
import re
import subprocess
import sys

ENTRY = re.compile(
    r'\{\.name = "(?P<name>[^"]+)", \.type = NEOX_TYPE_(?P<type>\w+), \.default_text = (?P<default>NULL|"(?:[^"\\]|\\.)*"), '
    r'\.choices = (?P<choices>NULL|"[^"]*"), \.supported = (?P<supported>NULL|"[^"]*"),\s*'
    r'\.feature = (?P<feature>NULL|"(?:[^"\\]|\\.)*"), \.group = "[^"]*", \.use = NEOX_KEY_(?P<use>\w+), '
    r'\.nullable = \d, \.derived = (?P<derived>\d),\s*\.min = (?P<min>[^,]+), \.max = (?P<max>[^}]+)\}')

# A model that loads, with none of the dicts set.
BASE = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 64,
        "train_micro_batch_size_per_gpu": 1}


def c_string(text):
    return None if text == "NULL" else json.loads(text)  # C and JSON escapes agree on these strings


def yaml_scalar(text):
    """A default's YAML text: JSON for the generated ones, a plain word for neox.c's own (auto, none)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def read_schema(path):
    entries = []
    for m in ENTRY.finditer(open(path).read()):
        e = {k: m.group(k) for k in ("name", "type", "use")}
        default_text = c_string(m.group("default"))
        e["default"] = None if default_text is None else yaml_scalar(default_text)
        for k in ("choices", "supported", "feature"):
            text = c_string(m.group(k))
            e[k] = text.split("|") if text is not None and k != "feature" else text
        lo, hi = (float("inf") if x.strip() == "INFINITY" else float(x) for x in (m.group("min"), m.group("max")))
        e["range"] = (lo, hi) if lo <= hi else None
        e["derived"] = m.group("derived") == "1"
        entries.append(e)
    if len(entries) < 400:
        sys.exit(f"{path}: only {len(entries)} schema entries parsed")
    return entries


def children(entries, path):
    return [e for e in entries if e["name"].startswith(path + ".") and "." not in e["name"][len(path) + 1:]]


def other_value(e, entries):
    """A value of e's type, in range, that is not e's default (and not one of its supported values)."""
    d, t = e["default"], e["type"]
    if e["choices"]:
        avoid = [x.lower() for x in (e["supported"] or [])] + [str(d).lower()]
        return next(c for c in e["choices"] if c.lower() not in avoid)
    if e["supported"]:  # an integer key with refused values
        lo, hi = e["range"]
        return next(i for i in range(int(lo), int(hi) + 1) if str(i) not in e["supported"])
    if t == "BOOL":
        return not d if d is not None else True
    if t in ("INT", "FLOAT"):
        x = (d or 0) + (1 if t == "INT" else 0.5)
        lo, hi = e["range"] or (-float("inf"), float("inf"))
        return x if lo <= x <= hi else (lo + hi) / 2 if t == "FLOAT" else int(lo) + 1
    if t == "STR":
        return "x"
    if t == "LIST":
        return ["x"]
    if t == "DICT":
        kids = children(entries, e["name"])
        return {kids[0]["name"].rsplit(".", 1)[1]: other_value(kids[0], entries)} if kids else {"enabled": True}
    return 1


def nest(path, value):
    for part in reversed(path.split(".")[1:]):
        value = {part: value}
    return {path.split(".")[0]: value}


def edit_distance(a, b):
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def typo_cases(entries):
    dicts = sorted({e["name"].rsplit(".", 1)[0] for e in entries if "." in e["name"]})
    for path in dicts:
        names = [k["name"].rsplit(".", 1)[1] for k in children(entries, path)]
        for name in sorted(names, key=len, reverse=True):
            typo = name[:len(name) // 2] + name[len(name) // 2 + 1:]
            if all(edit_distance(typo, other) > 1 for other in names if other != name):
                break
        else:
            sys.exit(f"no unambiguous misspelling for a sub-key of {path}")
        pattern = rf"cases\.yml:[0-9]+: unknown key '{re.escape(path)}\.{typo}'; did you mean '{re.escape(path)}\.{name}'\?"
        yield f"misspelt sub-key {path}.{typo} suggests {name}", nest(f"{path}.{typo}", 1), pattern


def refusal_cases(entries):
    for e in entries:
        if e["derived"] or not (e["use"] == "UNSUPPORTED" or e["supported"]):
            continue
        value = other_value(e, entries)
        # (a dict refused as a whole is named by the sub-key that switches it on, e.g. amp.enabled)
        pattern = rf"cases\.yml:[0-9]+: key '{re.escape(e['name'])}(\.[a-z_.]+)?': .*is not supported by neox\.c"
        yield f"refused {e['name']} = {json.dumps(value)} names the key", nest(e["name"], value), pattern


def main():
    mode, train, schema, tmp = sys.argv[1:5]
    entries = read_schema(schema)
    cases = list(typo_cases(entries) if mode == "typos" else refusal_cases(entries))
    path = os.path.join(tmp, "cases.yml")
    for name, extra, pattern in cases:
        with open(path, "w") as f:
            json.dump({**BASE, **extra}, f, indent=1)
        r = subprocess.run([train, "-q", "--print-config", path], capture_output=True, text=True)
        good = r.returncode == 2 and re.search(pattern, r.stderr)
        print(f"{'ok' if good else 'not ok'} - {name}")
        if not good:
            print(f"#   exit status {r.returncode}; stderr: {r.stderr.strip()[:400]}\n#   expected: {pattern}")
    print(f"# {len(cases)} {mode} cases")


if __name__ == "__main__":
    main()
