"""lib/torch_pt.h (neox.c's .pt reader: libzip + its own unpickler) against torch.load, on files
torch.save writes here: every dtype neox.c reads (fp32, fp16, bf16, fp64, int64, int32, int8, uint8,
bool), views (a slice's storage offset, a transpose's strides, two tensors sharing one storage),
nested dicts, OrderedDicts, lists, tuples, sets, bytes, None and numbers. The tree and every
element must come back exactly as torch.load gives them (tensors compared as raw bytes). Then
hostile files, each refused with a message naming the file and what is wrong: a pickle that calls
os.system (nothing runs: the marker file is never made), a truncated zip, a storage shorter than
its tensor, a tensor claiming 2^40 elements, a protocol-0 pickle."""
import collections
import io
import json
import os
import pickle
import subprocess
import zipfile

import pytest

torch = pytest.importorskip("torch")

from data_oracle import BIN  # noqa: E402

DRIVER = os.path.join(BIN, "..", "tests", "drivers", "pt_dump")


def dump(path):
    """pt_dump's JSON of the file (and its exit status, stderr)."""
    r = subprocess.run([DRIVER, str(path)], capture_output=True, text=True, timeout=60)
    return (json.loads(r.stdout) if r.returncode == 0 else None), r.returncode, r.stderr


def expected(obj):
    """What pt_dump prints for a value torch.load returned."""
    if isinstance(obj, torch.Tensor):
        t = obj.contiguous()
        raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
        return {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape), "hex": raw.numpy().tobytes().hex()}
    if isinstance(obj, dict):
        return {(k if isinstance(k, str) else f"<int>{k}" if isinstance(k, int) else "<other>"): expected(v)
                for k, v in obj.items()}
    if isinstance(obj, tuple):
        return {"tuple": [expected(v) for v in obj]}
    if isinstance(obj, (set, frozenset)):
        return {"set": sorted((expected(v) for v in obj), key=repr)}
    if isinstance(obj, list):
        return [expected(v) for v in obj]
    if isinstance(obj, bytes):
        return {"bytes": obj.hex()}
    return obj


def normalise_sets(tree):
    if isinstance(tree, dict):
        if set(tree) == {"set"}:
            return {"set": sorted((normalise_sets(v) for v in tree["set"]), key=repr)}
        return {k: normalise_sets(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [normalise_sets(v) for v in tree]
    return tree


def sample_checkpoint():
    g = torch.Generator().manual_seed(3)
    base = torch.randn(6, 10, generator=g)
    flat = torch.randn(40, generator=g)
    return {
        "module": collections.OrderedDict([
            ("w", base),
            ("w_t", base.t()),                       # strides (1, 10)
            ("rows", base[2:5]),                     # storage offset 20, shared storage
            ("cols", base[:, 3:7]),                  # offset and a row stride wider than the row
            ("every_other", flat[1::2]),             # stride 2
            ("flat_view", flat[8:20].view(3, 4)),    # a view of a flat buffer, as ZeRO's partitions are
        ]),
        "dtypes": {d: torch.arange(-3, 9).to(getattr(torch, d)).reshape(3, 4) for d in
                   ["float32", "float16", "bfloat16", "float64", "int64", "int32", "int8"]},
        "u8": torch.arange(0, 250, 25, dtype=torch.uint8), "mask": torch.tensor([True, False, True]),
        "bf16_values": torch.randn(5, 3, generator=g).to(torch.bfloat16),
        "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 4),
        "iteration": 17, "big": 2**40 + 3, "negative": -70000, "lr": 6e-4, "flag": True, "nothing": None,
        "name": "gpt-neox ünïcode", "raw": b"\x00\x01\xff", "shape": torch.Size([3, 4]),
        "groups": [{"lr": 1e-3, "params": [0, 1, 2], "betas": (0.9, 0.95)}],
        "ids": {0: "zero", 5: "five"}, "tags": {"a", "b"}, "frozen": frozenset([1, 2]),
        "nested": {"a": {"b": {"c": [1, (2, 3), [torch.ones(2)]]}}},
    }


def test_reads_what_torch_wrote(tmp_path):
    path = tmp_path / "mp_rank_00_model_states.pt"
    torch.save(sample_checkpoint(), path)
    got, rc, err = dump(path)
    assert rc == 0, err
    want = expected(torch.load(path))
    assert normalise_sets(got) == normalise_sets(want)


def test_reads_a_parameter_and_a_legacy_named_archive(tmp_path):
    path = tmp_path / "weird name.pt"
    torch.save({"p": torch.nn.Parameter(torch.full((2, 2), 7.0))}, path)
    got, rc, err = dump(path)
    assert rc == 0, err
    assert got == expected({"p": torch.full((2, 2), 7.0)})


def refused(path, *needles):
    got, rc, err = dump(path)
    assert rc == 1 and got is None, err
    assert str(path) in err, err
    for n in needles:
        assert n in err, err


class Evil:
    def __reduce__(self):
        return (os.system, (f"touch {Evil.marker}",))


def rewrite(src, dst, replace):
    """A copy of a torch.save archive with some entries' bytes replaced (name suffix -> bytes)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            for suffix, new in replace.items():
                if item.filename.endswith(suffix):
                    data = new(data) if callable(new) else new
            zout.writestr(item, data)


def test_refuses_a_pickle_that_runs_code(tmp_path):
    Evil.marker = tmp_path / "pwned"
    torch.save({"w": torch.ones(2)}, tmp_path / "good.pt")
    rewrite(tmp_path / "good.pt", tmp_path / "evil.pt", {"/data.pkl": pickle.dumps({"x": Evil()}, protocol=2)})
    refused(tmp_path / "evil.pt", "posix.system")
    assert not Evil.marker.exists()


def test_refuses_damaged_archives(tmp_path):
    torch.save({"w": torch.arange(100, dtype=torch.float32)}, tmp_path / "good.pt")
    whole = (tmp_path / "good.pt").read_bytes()
    (tmp_path / "truncated.pt").write_bytes(whole[: len(whole) // 2])
    refused(tmp_path / "truncated.pt", "zip")
    rewrite(tmp_path / "good.pt", tmp_path / "short.pt", {"/data/0": lambda d: d[:100]})
    refused(tmp_path / "short.pt", "storage shorter than the tensor")
    pkl = zipfile.ZipFile(tmp_path / "good.pt").read("good/data.pkl")
    huge = pkl.replace(b"Kd\x85", b"\x8a\x06\x00\x00\x00\x00\x00\x01\x85")  # size (100,) -> (2^40,)
    assert huge != pkl
    rewrite(tmp_path / "good.pt", tmp_path / "huge.pt", {"/data.pkl": huge})
    refused(tmp_path / "huge.pt", "storage shorter than the tensor")
    rewrite(tmp_path / "good.pt", tmp_path / "proto0.pt", {"/data.pkl": pickle.dumps({"a": 1}, protocol=0)})
    refused(tmp_path / "proto0.pt", "protocol")
    (tmp_path / "text.pt").write_bytes(b"not a zip at all")
    refused(tmp_path / "text.pt", "zip")
