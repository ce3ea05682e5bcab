"""TensorBoard events, JSONL records and log lines of lib/metrics, read back independently: the event
files with the `tensorboard` package (EventAccumulator, event_file_loader) plus a Python CRC32C of
the TFRecord framing, the JSONL with Python's json, and the lines against GPT-NeoX's Python format
strings. The expected values come from restating the driver's scripted run (tests/drivers/
metrics_driver.c) here, not from its output."""
import glob
import json
import math
import os
import struct
import time

import numpy as np
import pytest

from metrics_oracle import driver, gpt_neox_flops

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing import event_file_loader  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

# ---- the scripted run, restated ----------------------------------------------------------------
ITERS, LOG_INTERVAL, BATCH, SEQ, WORLD, PEAK, STEP_SECONDS = 10, 4, 8, 16, 2, 1e9, 0.25
FLOPS = gpt_neox_flops(2, 64, 512, 16, 8, 1)
TIMERS = {"forward": 0.010, "backward": 0.020, "optimizer": 0.005}   # seconds per step
SKIPPED = {3, 6}


def step(i):
    return {
        "lm_loss": float("nan") if i == 6 else 5.0 - 0.1 * i,
        "learning_rate": 1e-3 * i / 10.0,
        "grad_norm": 1.0 + 0.5 * i,
        "loss_scale": 2.0 ** (10 + i),
    }


def interval(end):
    its = range(end - LOG_INTERVAL + 1, end + 1)
    kept = [step(i)["lm_loss"] for i in its if i not in SKIPPED]
    flops_per_gpu = FLOPS / (STEP_SECONDS * WORLD)
    # GPT-NeoX averages the kept steps; neox.c reports an interval holding a NaN or inf loss as NaN.
    nonfinite = any(not math.isfinite(step(i)["lm_loss"]) for i in its)
    return {
        "train/lm_loss": float("nan") if nonfinite else sum(kept) / max(1, len(kept)),
        "train/learning_rate": step(end)["learning_rate"],
        "train/grad_norm": step(end)["grad_norm"],
        "train/loss_scale": step(end)["loss_scale"],
        "train/skipped_iterations": sum(1 for i in its if i in SKIPPED),
        "train/nan_iterations": sum(1 for i in its if i in SKIPPED and not math.isfinite(step(i)["lm_loss"])),
        "runtime/iteration_time": STEP_SECONDS,
        "runtime/samples_per_sec": BATCH / STEP_SECONDS,
        "runtime/tokens_per_sec": BATCH * SEQ / STEP_SECONDS,
        "runtime/flops_per_sec_per_gpu": flops_per_gpu,
        "runtime/mfu": flops_per_gpu / PEAK,
        **{f"timers/{k}": v for k, v in TIMERS.items()},
    }


EVALS = [("validation", 8, 4.0, "iteration 8"), ("test", 10, 3.5, "the end of training for test data")]


def expected_scalars():
    """tag -> [(step, value)] as GPT-NeoX's training_log and evaluate_and_print_results log them."""
    want = {}
    for i in range(1, ITERS + 1):
        for key, value in step(i).items():
            want.setdefault(f"train/{key}", []).append((i, value))
        if i % LOG_INTERVAL == 0:
            for key in ("runtime/samples_per_sec", "runtime/iteration_time", "runtime/tokens_per_sec",
                        "runtime/flops_per_sec_per_gpu", "runtime/mfu", *(f"timers/{k}" for k in TIMERS)):
                want.setdefault(key, []).append((i, interval(i)[key]))
    for chart, it, loss, _ in EVALS:
        want.setdefault(f"{chart}/lm_loss", []).append((it, loss))
        want.setdefault(f"{chart}/lm_loss_ppl", []).append((it, math.exp(loss)))
    return want


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("metrics")
    started = time.time()
    stdout = driver("run", root / "logs", root / "tb")
    return {"root": root, "stdout": stdout, "started": started}


# ---- TensorBoard -------------------------------------------------------------------------------
def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def event_file(run):
    files = glob.glob(str(run["root"] / "tb" / "events.out.tfevents.*"))
    assert len(files) == 1, files
    return files[0]


def test_event_file_name(run):
    name = os.path.basename(event_file(run))
    parts = name.split(".")
    assert parts[:3] == ["events", "out", "tfevents"]
    assert abs(int(parts[3]) - run["started"]) < 60
    assert parts[4]   # host name


def test_tfrecord_framing_and_crcs(run):
    data = open(event_file(run), "rb").read()
    pos = records = 0
    while pos < len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        (len_crc,) = struct.unpack_from("<I", data, pos + 8)
        assert len_crc == masked(crc32c(data[pos:pos + 8]))
        payload = data[pos + 12:pos + 12 + length]
        (data_crc,) = struct.unpack_from("<I", data, pos + 12 + length)
        assert data_crc == masked(crc32c(payload))
        pos += 16 + length
        records += 1
    assert pos == len(data)
    n_scalars = sum(len(v) for v in expected_scalars().values())
    assert records == 1 + n_scalars


def test_events_read_by_tensorboard_loader(run):
    events = list(event_file_loader.LegacyEventFileLoader(event_file(run)).Load())
    assert events[0].file_version == "brain.Event:2"
    for e in events[1:]:
        assert len(e.summary.value) == 1
        assert e.summary.value[0].WhichOneof("value") == "simple_value"
        assert run["started"] - 5 < e.wall_time < time.time() + 5


def test_every_scalar_tag_step_value(run):
    acc = EventAccumulator(str(run["root"] / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    want = expected_scalars()
    assert sorted(acc.Tags()["scalars"]) == sorted(want)
    for tag, points in want.items():
        got = [(s.step, s.value) for s in acc.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in points], tag
        for (it, value), (_, want_value) in zip(got, points):
            want32 = float(np.float32(want_value))   # simple_value is a float32
            if math.isnan(want32):
                assert math.isnan(value), (tag, it)
            else:
                assert value == pytest.approx(want32, rel=1e-6), (tag, it)


# ---- JSONL -------------------------------------------------------------------------------------
def test_jsonl_records(run):
    lines = (run["root"] / "logs" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    train = [r for r in records if "train/lm_loss" in r]
    evals = [r for r in records if "train/lm_loss" not in r]
    assert [r["iteration"] for r in train] == [4, 8]
    for r in train:
        want = interval(r["iteration"])
        assert set(r) == {"iteration", "wall_time", *want}
        for key, value in want.items():
            if math.isnan(value):  # JSON has no NaN: null
                assert r[key] is None, key
                continue
            assert r[key] == pytest.approx(value, rel=1e-12), key
        assert run["started"] - 5 < r["wall_time"] < time.time() + 5
    assert len(evals) == len(EVALS)
    for r, (chart, it, loss, _) in zip(evals, EVALS):
        assert r["iteration"] == it
        assert r[f"{chart}/lm_loss"] == pytest.approx(loss, rel=1e-12)
        assert r[f"{chart}/lm_loss_ppl"] == pytest.approx(math.exp(loss), rel=1e-12)


def test_jsonl_appends_across_runs(tmp_path):
    driver("run", tmp_path / "logs", tmp_path / "tb")
    driver("run", tmp_path / "logs", tmp_path / "tb")
    lines = (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 * (2 + len(EVALS))
    assert len(glob.glob(str(tmp_path / "tb" / "events.out.tfevents.*"))) == 2


# ---- log lines ---------------------------------------------------------------------------------
def human_readable_flops(num):
    for unit in ["", "KFLOPS", "MFLOPS", "GFLOPS", "TFLOPS", "PFLOPS", "EFLOPS", "ZFLOPS"]:
        if abs(num) < 1000.0:
            return "%3.1f%s" % (num, unit)
        num /= 1000.0
    return "%.1f%s" % (num, "Yi")


def expected_lines():
    lines = []
    for i in range(LOG_INTERVAL, ITERS + 1, LOG_INTERVAL):
        v = interval(i)
        s = " samples/sec: {:.3f} |".format(v["runtime/samples_per_sec"])
        s += " tokens/sec: {:.1f} |".format(v["runtime/tokens_per_sec"])
        s += " iteration {:8d}/{:8d} |".format(i, ITERS)
        s += " elapsed time per iteration (ms): {:.1f} |".format(v["runtime/iteration_time"] * 1000.0)
        s += " learning rate: {:.3E} |".format(v["train/learning_rate"])
        s += f" approx flops per GPU: {human_readable_flops(v['runtime/flops_per_sec_per_gpu'])} |"
        s += " MFU: {:.2f}% |".format(v["runtime/mfu"] * 100)
        s += " lm_loss: {:.6E} |".format(v["train/lm_loss"])
        s += " loss scale: {:.1f} |".format(v["train/loss_scale"])
        s += " grad norm: {:.3f} |".format(v["train/grad_norm"])
        s += " number of skipped iterations: {:3d} |".format(v["train/skipped_iterations"])
        s += " number of nan iterations: {:3d} |".format(v["train/nan_iterations"])
        lines.append(s)
        lines.append("time (ms)" + "".join(" | {}: {:.2f}".format(k, t * 1000.0) for k, t in TIMERS.items()))
        if i == 8:
            lines += eval_block(*EVALS[0])
    lines += eval_block(*EVALS[1])
    return lines


def eval_block(chart, it, loss, prefix):
    s = f" {chart} results at {prefix} | "
    s += f"lm_loss value: {loss:.6E} | "
    s += f"lm_loss_ppl value: {math.exp(loss):.6E} | "
    return ["-" * (len(s) + 1), s, "-" * (len(s) + 1)]


def test_log_lines(run):
    assert run["stdout"].splitlines() == expected_lines()
