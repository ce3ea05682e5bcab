"""help_check.py: every tool's and every subcommand's --help against the option tables its parser
uses, read from the source (tools/**/*.c): --help exits 0, prints on stdout only, starts with the
usage line, names every option the table accepts, and its usage line (the "Usage:" line and its
indented continuation lines) lists them all unless it says [OPTION]... for them. Every option table
in tools/ must belong to a command below, and every neox-preprocess command of main.c's table must be
checked, so a new table or command cannot go untested. Standard library only.

    python3 tests/tools/help_check.py BIN_DIR

Prints one TAP line per command."""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
TABLE = re.compile(r'struct option (\w+)\[\] = \{(.*?)\n\s*\};', re.S)
FUNCTION = re.compile(r'^[a-z][^\n;]*?\b(\w+)\([^;{]*\)\s*\{', re.M)

# Which option tables parse each command line: "TOOL/NAME", NAME being the table's own name, or the
# function that holds it when the table is just called `options`.
COMMANDS = {
    ("neox-preprocess",): ["neox-preprocess/main", "neox-preprocess/parse_preprocess"],
    ("neox-preprocess", "encode"): ["neox-preprocess/encode_options"],
    ("neox-preprocess", "decode"): ["neox-preprocess/decode_options"],
    ("neox-preprocess", "train-tokenizer"): ["neox-preprocess/command_train_tokenizer"],
    ("neox-preprocess", "chat"): ["neox-preprocess/parse_chat"],
    ("neox-preprocess", "mask"): ["neox-preprocess/parse_preprocess"],
    ("neox-preprocess", "merge"): ["neox-preprocess/merge_main"],
    ("neox-preprocess", "info"): [],
    ("neox-preprocess", "index"): ["neox-preprocess/index_main"],
    ("neox-train",): ["neox-train/main"],
    ("neox-eval",): ["neox-eval/main"],
    ("neox-eval", "generate"): ["neox-eval/neox_generate_command"],
    ("neox-eval", "serve"): ["neox-eval/neox_serve_command"],
    ("neox-convert",): ["neox-convert/main"],
}
for sub in ("to-hf", "from-hf", "from-neox", "to-neox", "inspect", "verify", "reshard"):
    COMMANDS[("neox-convert", sub)] = ["neox-convert/parse_command"]


def option_tables():
    tables = {}
    for path in sorted((ROOT / "tools").rglob("*.c")):
        text = path.read_text()
        for m in TABLE.finditer(text):
            name = m.group(1)
            if name == "options":
                name = FUNCTION.findall(text[:m.start()])[-1]
            tables[f"{path.parent.name}/{name}"] = re.findall(r'\{"([^"]+)"', m.group(2))
    return tables


def preprocess_commands():
    text = (ROOT / "tools/neox-preprocess/main.c").read_text()
    table = re.search(r'preprocess_command commands\[\] = \{(.*?)\n\};', text, re.S).group(1)
    return re.findall(r'^\s*\{"([^"]+)"', table, re.M)


def usage_block(lines):
    block = [lines[0]]
    for line in lines[1:]:
        if not line.startswith(" "):
            break
        block.append(line)
    return "\n".join(block)


def named(option, text):
    return re.search(r'(^|[^\w-])--' + re.escape(option) + r'(?![\w-])', text) is not None


def check(bin_dir, argv, options):
    run = subprocess.run([str(pathlib.Path(bin_dir) / argv[0]), *argv[1:], "--help"], capture_output=True, text=True)
    out = run.stdout
    problems = []
    if run.returncode != 0:
        problems.append(f"exit status {run.returncode}")
    if run.stderr:
        problems.append("wrote to stderr: " + run.stderr[:200])
    lines = out.splitlines()
    if not lines or not lines[0].startswith(f"Usage: {argv[0]} "):
        return problems + ["stdout does not start with 'Usage: %s '" % argv[0]]
    problems += [f"--{o} accepted but not in the help" for o in options if not named(o, out)]
    usage = usage_block(lines)
    if "OPTION" not in usage:
        problems += [f"--{o} not in the usage line" for o in options
                     if o not in ("help", "version") and not named(o, usage)]
    return problems


def main():
    bin_dir = sys.argv[1]
    tables = option_tables()
    used = {name for names in COMMANDS.values() for name in names}
    failed = 0
    for name in sorted(set(tables) - used):
        print(f"not ok - option table {name} belongs to no command checked here (tests/tools/help_check.py)")
        failed = 1
    for command in preprocess_commands():
        if ("neox-preprocess", command) not in COMMANDS:
            print(f"not ok - neox-preprocess {command} is not checked here (tests/tools/help_check.py)")
            failed = 1
    for argv, names in COMMANDS.items():
        options = sorted({o for name in names for o in tables.get(name, [])})
        missing = [name for name in names if name not in tables]
        problems = [f"no option table {name} in tools/" for name in missing] + check(bin_dir, argv, options)
        label = " ".join(argv) + " --help: exit 0, stdout, every accepted option in the help and the usage line"
        print(("not ok - " if problems else "ok - ") + label)
        for p in problems:
            print("#   " + p)
        failed |= bool(problems)
    return failed


if __name__ == "__main__":
    sys.exit(main())
