#!/usr/bin/env python3
"""lm_eval_tasks.py DATA_DIR OUT_DIR: writes lm-evaluation-harness task files that run the harness's
own lambada_openai, piqa and wikitext definitions on local files (DATA_DIR holds lambada_test.jsonl,
piqa_valid.jsonl + piqa_valid-labels.lst and wikitext-2-raw_test_hfrows_crlf.raw, as neox-eval's
--data-dir), for machines without the Hugging Face hub. Each YAML includes the installed harness's
task file and replaces only where the documents come from; the tasks are named *_local.
Run with the Python that has lm_eval; then: lm_eval --include_path OUT_DIR --tasks lambada_openai_local,..."""
import importlib.util
import inspect
import os
import sys

# The evaluation files of a --data-dir (neox-eval's names; the oracle tests read the same).
FILES = {"lambada": "lambada_test.jsonl", "piqa": "piqa_valid.jsonl", "piqa_labels": "piqa_valid-labels.lst",
         "wikitext": "wikitext-2-raw_test_hfrows_crlf.raw"}


def wikitext_pages(path):
    """WikiText-2 test pages from the file's HF rows: a row " = Title = " (not " = = ") starts a page; rows keep "\n"."""
    with open(path, encoding="utf-8", newline="") as f:
        rows = f.read().split("\n")
    if rows and rows[-1] == "":
        rows.pop()
    pages = []
    for row in rows:
        row = row[:-1] if row.endswith("\r") else row
        if row.startswith(" = ") and not row.startswith(" = = ") and pages:
            pages.append("")
        if not pages:
            pages.append("")
        pages[-1] += row + "\n"
    return pages


def piqa_labels(path):
    """The gold answers of piqa_valid-labels.lst, one a line."""
    with open(path) as f:
        return [int(line) for line in f.read().split()]


# The generated module holds this file's own readers (their source), so both read the files alike.
UTILS = '''"""Documents for the *_local tasks from the files in {data!r}."""
import datasets

DATA = {data!r}
FILES = {files!r}


{readers}

def piqa_docs(dataset):
    """PIQA's validation questions with their labels."""
    return dataset.add_column("label", piqa_labels(f"{{DATA}}/{{FILES['piqa_labels']}}")[:len(dataset)])


def wikitext_docs(dataset):
    return datasets.Dataset.from_dict({{"page": wikitext_pages(f"{{DATA}}/{{FILES['wikitext']}}")}})
'''

TASKS = {
    "lambada_openai": ("lambada/lambada_openai.yaml", """dataset_path: json
dataset_name: null
dataset_kwargs:
  data_files:
    test: {data}/{lambada}
"""),
    "piqa": ("piqa/piqa.yaml", """dataset_path: json
dataset_name: null
dataset_kwargs:
  data_files:
    validation: {data}/{piqa}
training_split: null
process_docs: !function neox_local_docs.piqa_docs
"""),
    "wikitext": ("wikitext/wikitext.yaml", """dataset_path: text
dataset_name: null
dataset_kwargs:
  data_files:
    test: {data}/{wikitext}
training_split: null
validation_split: null
process_docs: !function neox_local_docs.wikitext_docs
"""),
}


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    data, out = os.path.abspath(sys.argv[1]), sys.argv[2]
    spec = importlib.util.find_spec("lm_eval")  # found, not imported: the task files are all we need
    if spec is None:
        sys.exit("lm_eval_tasks.py: this Python has no lm_eval (make deps installs it into .venv)")
    harness = os.path.join(os.path.dirname(spec.origin), "tasks")
    os.makedirs(out, exist_ok=True)
    for name, (included, override) in TASKS.items():
        with open(os.path.join(out, f"{name}_local.yaml"), "w") as f:
            f.write(f"include: {harness}/{included}\ntask: {name}_local\n" + override.format(data=data, **FILES))
    with open(os.path.join(out, "neox_local_docs.py"), "w") as f:
        readers = "\n\n".join(inspect.getsource(fn) for fn in (wikitext_pages, piqa_labels))
        f.write(UTILS.format(data=data, files=FILES, readers=readers))


if __name__ == "__main__":
    main()
