"""layers_check.py: the layer rules of docs/design.md ("Folders: what each owns and what it may call"),
checked on the source tree by reading its #include lines and calls (standard library only).

    python3 tests/tools/layers_check.py RULE     RULE: includes | kernels | core | tools | words

Prints one line per violation and exits 1 when there is any; exits 0 silently otherwise."""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SYSTEM_INCLUDE = re.compile(r'^\s*#\s*include\s+<([^>]+)>', re.M)

# Which lib/ folder each public header belongs to (lib/X.h is lib/X/'s, plus these).
HEADER_OWNER = {"safetensors.h": "ckpt", "checkpoint.h": "ckpt", "serve.h": "eval", "generate.h": "model", "version.h": "version"}
# What each folder of lib/ may include, from docs/design.md's table ("kernels" is kernels/kernels.h
# and kernels/backend.h, the only kernel headers lib/ may see).
LOWER = {
    "core": set(),
    "config": {"core"},
    "tokenizer": {"core"},
    "data": {"core", "config", "tokenizer", "ckpt"},
    "model": {"core", "config", "kernels", "parallel"},
    "optim": {"core", "config", "kernels", "parallel", "gradient"},
    "parallel": {"core", "kernels"},
    "gradient": {"core", "kernels", "parallel"},
    "ckpt": {"core", "config", "kernels", "model", "parallel"},
    "metrics": {"core"},
}
LOWER["train"] = set(LOWER) | {"kernels"}
LOWER["eval"] = {"core", "config", "tokenizer", "data", "model", "parallel", "ckpt", "kernels"}
LOWER["train"] |= {"eval", "tokenizer"}
LOWER["convert"] = {"core", "config", "tokenizer", "model", "ckpt", "kernels", "optim"}

# Libraries only the layers above lib/core may link (core is what even the smallest program links).
LIBRARY_HEADERS = {"hdf5.h", "jansson.h", "mpi.h", "yaml.h", "zstd.h", "zlib.h", "utf8proc.h", "cblas.h", "nccl.h"}
# The communication layer's calls (lib/parallel.h) a tool must not make: tools start and end the
# process grid, and the library does the talking.
COLLECTIVE = re.compile(r'\bneox_(allreduce|all_reduce|reduce_scatter|allgather|all_gather|bcast|broadcast|send|recv|'
                        r'isend|irecv|barrier|alltoall|wait|test)\w*\s*\(')
# Words about how the project was made rather than what it is (docs/design.md: the project speaks
# only of itself and its users' world).
WORDS = re.compile(r'\bissue\s*#?\d+|\(#\d+\)|\bdevice tool\b|\blent\b|\bsession with a GPU\b|\bgVisor\b|\bFirecracker\b',
                   re.I)


def sources(*folders, exts=(".c", ".h", ".cu", ".cuh")):
    for folder in folders:
        for p in sorted((ROOT / folder).rglob("*")):
            if p.suffix in exts and p.is_file():
                yield p


def owner(header):
    if header.startswith("kernels/"):
        return "kernels" if header in ("kernels/kernels.h", "kernels/backend.h") else "kernel-internal"
    if "/" in header:
        return header.split("/")[0]
    return HEADER_OWNER.get(header, header[:-2] if header.endswith(".h") else header)


def folder_of(path):
    rel = path.relative_to(ROOT / "lib")
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def check_includes():
    bad = []
    for p in sources("lib"):
        me = folder_of(p)
        if me not in LOWER:
            continue  # lib/backend.c and lib/version.c sit above the layers
        for h in INCLUDE.findall(p.read_text()):
            o = me if (p.parent / h).is_file() else owner(h)  # a folder's private header
            if o == me or o in LOWER[me]:
                continue
            bad.append(f"{p.relative_to(ROOT)}: includes {h} ({o}), which lib/{me} may not call")
    return bad


def check_kernels():
    return [f"{p.relative_to(ROOT)}: includes {h}, a backend's own header (use kernels/kernels.h or kernels/backend.h)"
            for p in sources("lib", "tools") for h in INCLUDE.findall(p.read_text())
            if h.startswith(("kernels/cpu/", "kernels/cuda/"))]


def check_core():
    return [f"{p.relative_to(ROOT)}: includes <{h}>; lib/core links no library but libc"
            for p in sources("lib/core") for h in SYSTEM_INCLUDE.findall(p.read_text()) if h in LIBRARY_HEADERS]


def check_tools():
    bad = []
    for p in sources("tools"):
        rel = str(p.relative_to(ROOT))
        text = p.read_text()
        for h in INCLUDE.findall(text):
            if "/" in h and not h.startswith("kernels/") or h.endswith("internal.h"):
                bad.append(f"{rel}: includes {h}, a library folder's private header")
        bad += [f"{rel}: calls {m.group(0)}...: communication belongs in lib/" for m in COLLECTIVE.finditer(text)]
    return bad


def check_words():
    bad = []
    files = list(sources("lib", "kernels", "tools", "tests", "bench", "scripts", "jobs", "docs", "configs",
                         exts=(".c", ".h", ".cu", ".cuh", ".sh", ".py", ".md", ".yml", ".lib")))
    files += [ROOT / "README.md", ROOT / "GNUmakefile", ROOT / "tests/run", ROOT / ".ci/run"]
    for p in files:
        if p.name == "layers_check.py":
            continue  # this file names the words it looks for
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            m = WORDS.search(line)
            if m:
                bad.append(f"{p.relative_to(ROOT)}:{n}: '{m.group(0)}'")
    return bad


RULES = {"includes": check_includes, "kernels": check_kernels, "core": check_core, "tools": check_tools,
         "words": check_words}

if __name__ == "__main__":
    problems = RULES[sys.argv[1]]()
    for line in problems:
        print(line)
    sys.exit(1 if problems else 0)
