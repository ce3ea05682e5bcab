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
HEADER_OWNER = {"safetensors.h": "ckpt", "torch_pt.h": "ckpt", "serve.h": "eval", "generate.h": "model", "version.h": "version",
                "config_keys_gen.h": "config"}
DESIGN = ROOT / "docs/design.md"
# The libraries the table's last column may name, with the header that shows a file calls each.
LIBRARIES = {"libc": None, "HDF5": "hdf5.h", "jansson": "jansson.h", "MPI": "mpi.h", "libyaml": "yaml.h",
             "zstd": "zstd.h", "zlib": "zlib.h", "libzip": "zip.h", "utf8proc": "utf8proc.h", "OpenBLAS": "cblas.h", "NCCL": "nccl.h",
             "cuBLAS": None, "the CUDA runtime": None}
LIBRARY_HEADERS = {h for h in LIBRARIES.values() if h}


def table_rows(text):
    """The rows of design.md's folder table as (folder, may-call cell), in the table's order."""
    section = text.split("## Folders: what each owns and what it may call", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            rows.append((cells[0], cells[2]))
    return rows


def row_folder(cell):
    """lib/X/ -> X; the kernel interface -> "kernels"; other rows (backends, tools, tests) -> None."""
    if cell.startswith("`kernels/kernels.h`"):
        return "kernels"
    if cell.startswith("`lib/") and cell.endswith("/`"):
        return cell[len("`lib/"):-2]
    return None


def called_names(cell):
    """The names in a may-call cell, with the explanations in parentheses dropped."""
    depth, plain = 0, ""
    for ch in cell:
        depth += ch == "("
        if depth == 0:
            plain += ch
        depth -= ch == ")"
    return [w.strip() for w in plain.split(",") if w.strip() not in ("", "—")]


def read_table():
    """What each lib/ folder may include and which libraries each row names, both exactly as docs/design.md's
    table says, and the table's own faults (a call to a row below, a name that is no folder or library)."""
    lower, libraries, faults, above = {}, {}, [], []
    for cell, calls in table_rows(DESIGN.read_text()):
        me = row_folder(cell)
        if me is None:
            continue  # the backends, tools and tests: checked by the other rules
        allowed, libs = set(), set()
        for name in called_names(calls):
            if name == "everything above":
                allowed |= set(above)
            elif name in LIBRARIES:
                libs.add(name)
            elif name in above:
                allowed.add(name)
            else:
                faults.append(f"docs/design.md: {cell} may call '{name}', which is no folder above it and no library")
        lower[me], libraries[me] = allowed, libs
        above.append(me)
    return lower, libraries, faults


LOWER, TABLE_LIBRARIES, TABLE_FAULTS = read_table()
# Libraries only the layers above lib/core may link (core is what even the smallest program links),
# less those the table names for core.
CORE_FORBIDDEN = LIBRARY_HEADERS - {LIBRARIES[n] for n in TABLE_LIBRARIES.get("core", ())}
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


def lib_folders():
    return sorted(p.name for p in (ROOT / "lib").iterdir() if p.is_dir())


def folder_of(path):
    """The folder a file of lib/ belongs to: its own, or for a public header lib/X.h the folder it is the
    interface of."""
    rel = path.relative_to(ROOT / "lib")
    if len(rel.parts) > 1:
        return rel.parts[0]
    return owner(rel.name) if rel.suffix == ".h" else rel.stem


def check_includes():
    bad = list(TABLE_FAULTS)
    bad += [f"lib/{d}/: a folder the table in docs/design.md does not list" for d in lib_folders() if d not in LOWER]
    for p in sources("lib"):
        me = folder_of(p)
        if me in ("backend", "op_profile", "version"):
            continue  # lib/backend.c, lib/op_profile.c and lib/version.c sit above the layers
        for h in INCLUDE.findall(p.read_text()):
            private = p.parent != ROOT / "lib" and (p.parent / h).is_file()  # a folder's private header
            o = me if private else owner(h)
            if o == me or o in LOWER.get(me, ()):
                continue
            bad.append(f"{p.relative_to(ROOT)}: includes {h} ({o}), which lib/{me} may not call")
    return bad


def check_kernels():
    return [f"{p.relative_to(ROOT)}: includes {h}, a backend's own header (use kernels/kernels.h or kernels/backend.h)"
            for p in sources("lib", "tools") for h in INCLUDE.findall(p.read_text())
            if h.startswith(("kernels/cpu/", "kernels/cuda/"))]


def check_core():
    named = ", ".join(sorted(TABLE_LIBRARIES.get("core", ()))) or "nothing"
    return [f"{p.relative_to(ROOT)}: includes <{h}>; lib/core links only what docs/design.md's table names ({named})"
            for p in sources("lib/core") for h in SYSTEM_INCLUDE.findall(p.read_text()) if h in CORE_FORBIDDEN]


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
