"""The metrics sinks (sinks.py): TensorBoard and offline wandb hold every scalar of metrics.jsonl at its step,
read back with each package's own reader; a resumed run continues them; a sink whose package is missing is a
one-line error naming it. The train.main tests need train.py's hook (RunConfig's tensorboard and wandb)."""
import builtins
import dataclasses
import glob
import json
import lzma
import math
import os
import struct
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

import sinks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMITTED = os.path.join(ROOT, "results", "default-room", "metrics.jsonl")


def committed_rows(n=5) -> list[dict]:
    """The first rows of a real run's metrics.jsonl (or of its .xz, if it has been compressed)."""
    f = open(COMMITTED) if os.path.exists(COMMITTED) else lzma.open(COMMITTED + ".xz", "rt")
    with f:
        return [json.loads(next(f)) for _ in range(n)]


def flags(out, tensorboard=False, wandb=None):
    return SimpleNamespace(out=str(out), tensorboard=tensorboard, wandb=wandb)


def log_rows(args, rows):
    s = sinks.open_sinks(args)
    for r in rows:
        s.log(r, r["step"])
    s.close()


def expected(rows) -> dict:
    """{tag: {step: value}} as TensorBoard stores it (float32) for every numeric scalar of the rows."""
    out = {}
    for r in rows:
        for k, v in r.items():
            if k != "step" and isinstance(v, (int, float)):
                out.setdefault(k, {})[r["step"]] = float(np.float32(v))
    return out


def tensorboard_scalars(logdir) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})   # 0: keep every event
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def age(logdir):
    """Rename the event files as an earlier process's: TensorBoard reads a directory's files in name order, and
    a name's time is in whole seconds, so a test's two writers may share one."""
    for path in glob.glob(os.path.join(logdir, "events.out.tfevents.*")):
        rest = os.path.basename(path).split(".", 4)[4]   # events.out.tfevents.TIME.HOST.PID.N
        os.rename(path, os.path.join(logdir, "events.out.tfevents.0000000000." + rest))


def test_tensorboard_holds_every_scalar_of_metrics_jsonl_at_its_step(tmp_path):
    pytest.importorskip("tensorboard")
    rows = committed_rows()
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4] and any("eval/room/success_exp" in r for r in rows)
    log_rows(flags(tmp_path, tensorboard=True), rows)
    assert tensorboard_scalars(tmp_path / "tensorboard") == expected(rows)


def test_tensorboard_keeps_what_it_takes_and_skips_what_is_no_number(tmp_path):
    pytest.importorskip("tensorboard")
    row = {"step": 7, "loss": float("nan"), "ratio": float("inf"), "skipped": True, "n": 3, "note": "text",
           "doors": [1, 2], "none": None, "nested": {"a": 1.0}}
    log_rows(flags(tmp_path, tensorboard=True), [row])
    got = tensorboard_scalars(tmp_path / "tensorboard")
    assert set(got) == {"loss", "ratio", "skipped", "n"}
    assert math.isnan(got["loss"][7]) and got["ratio"] == {7: math.inf} and got["skipped"] == {7: 1.0}
    assert got["n"] == {7: 3.0}


def test_tensorboard_resumed_continues_at_its_steps_and_hides_the_redone_ones(tmp_path):
    """A run logged steps 0-4 and crashed with its checkpoint at step 2: the resumed process redoes 3 and 4
    (here with other values, so it shows which are read) into a new event file in the same directory. The
    crashed one also evaluated at step 4, so a tag the redone steps lack must go too (TensorBoard's own purge
    of a tag whose steps go back would keep it)."""
    pytest.importorskip("tensorboard")
    rows = committed_rows()
    log_rows(flags(tmp_path, tensorboard=True), rows[:4] + [{**rows[4], "eval/room/success_exp": 0.5}])
    age(tmp_path / "tensorboard")
    redone = [{k: v + 1 if k != "step" else v for k, v in r.items()} for r in rows[3:]]
    log_rows(flags(tmp_path, tensorboard=True), redone)
    assert len(os.listdir(tmp_path / "tensorboard")) == 2
    assert tensorboard_scalars(tmp_path / "tensorboard") == expected(rows[:3] + redone)


@pytest.mark.parametrize("name", ["tensorboard", "wandb"])
def test_a_missing_package_is_one_line_naming_it(tmp_path, monkeypatch, name):
    real, hidden = builtins.__import__, {"tensorboard": ("tensorboard", "torch.utils.tensorboard"), "wandb": ("wandb",)}

    def without(module, *a, **kw):   # as if not installed, though a test before may have imported it
        if any(module == h or module.startswith(h + ".") for h in hidden[name]):
            raise ModuleNotFoundError(f"No module named '{name}'", name=name)
        return real(module, *a, **kw)
    monkeypatch.setattr(builtins, "__import__", without)
    args = flags(tmp_path, **{"tensorboard": True} if name == "tensorboard" else {"wandb": "crl"})
    err = sinks.missing(args)
    assert err.startswith(f"--{name} needs the {name} package") and err.endswith(f"pip install {name}")
    with pytest.raises(SystemExit) as stop:
        sinks.open_sinks(args)
    assert str(stop.value.code).startswith("error: ") and "\n" not in str(stop.value.code)
    off = sinks.open_sinks(flags(tmp_path))   # not asked for: nothing imported, nothing written
    off.log(committed_rows(1)[0], 0)
    off.close()
    assert sinks.missing(flags(tmp_path)) is None and os.listdir(tmp_path) == []


def wandb_history(out) -> dict:
    """{offline run dir: [(step, {key: value})]} from the run-ID.wandb files of OUT/wandb/offline-run-*: wandb has
    no reader of its own for them, and they are LevelDB-style logs (7-byte header ':W&B' + magic + version, then
    32 KiB blocks of records: crc32, length, type; a record split over blocks is FIRST, MIDDLE..., LAST) of
    protobuf Records. wandb's service process writes them, and run.finish() can return before it has: it is
    shut down first, as a process's exit does (the next wandb.init starts another)."""
    import wandb
    from wandb.proto import wandb_internal_pb2
    wandb.teardown()
    out_runs = {}
    for path in sorted(glob.glob(os.path.join(out, "wandb", "offline-run-*", "run-*.wandb"))):
        data, pos, part, history = open(path, "rb").read(), 7, b"", []
        assert data[:4] == b":W&B"
        while pos + 7 <= len(data):
            if 32768 - pos % 32768 < 7:   # a block's tail too short for a header is padding
                pos += 32768 - pos % 32768
                continue
            _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
            part, pos = part + data[pos + 7:pos + 7 + n], pos + 7 + n
            if kind in (1, 4):   # FULL or LAST: a whole record
                record = wandb_internal_pb2.Record()
                record.ParseFromString(part)
                part = b""
                if record.WhichOneof("record_type") == "history":
                    items = {i.key or ".".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                    history.append((items.pop("_step"), {k: v for k, v in items.items() if not k.startswith("_")}))
        out_runs[os.path.basename(os.path.dirname(path))] = history
    return out_runs


def test_wandb_offline_holds_every_scalar_and_a_resumed_run_keeps_its_id(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")   # no network, no account
    rows = committed_rows()
    log_rows(flags(tmp_path, wandb="crl-test"), rows[:3])
    run_id = open(tmp_path / "wandb-id").read().strip()
    log_rows(flags(tmp_path, wandb="crl-test"), rows[3:])   # resumed: the same id, a second offline run dir
    assert open(tmp_path / "wandb-id").read().strip() == run_id
    runs = wandb_history(tmp_path)
    assert len(runs) == 2 and all(d.endswith("-" + run_id) for d in runs)
    # in step order: the dirs are named by the second they began in, one maybe with a -1 after
    got = sorted((h for history in runs.values() for h in history), key=lambda h: h[0])
    assert got == [(r["step"], {k: float(v) for k, v in r.items() if k != "step"}) for r in rows]   # float64: exact


# ---------------------------------------------------------------------------------------------------------
# Through train.main: these need train.py's hook

def hooked():
    """train.py with the hook, imported only here: the tests above need no more than sinks.py."""
    import train
    names = {f.name for f in dataclasses.fields(train.RunConfig)}
    assert {"tensorboard", "wandb"} <= names, ("train.py has no sinks hook yet: RunConfig needs the tensorboard and "
                                               "wandb fields and train/report/finish the sinks calls (sinks.py)")
    return train


def test_train_main_tensorboard_matches_metrics_jsonl_and_resumes(tmp_path):
    """A run's event files hold metrics.jsonl's scalars; resumed after a crash that logged a step past its
    checkpoint, the redone step's scalars are the ones read, and the resumed steps continue the curves."""
    pytest.importorskip("tensorboard")
    train = hooked()
    from test_train import FAST, read_metrics
    out = str(tmp_path / "run")
    train.main(["--tasks", "room", "--mode", "crl", *FAST, "--iters", "2", "--out", out, "--tensorboard"])
    logdir = os.path.join(out, "tensorboard")
    assert tensorboard_scalars(logdir) == expected(read_metrics(out))
    from torch.utils.tensorboard import SummaryWriter
    with SummaryWriter(logdir) as stale:   # the crashed process logged step 2 past its checkpoint (step 1)
        stale.add_scalar("reward", -1.0, 2)
    age(logdir)
    saved = json.load(open(os.path.join(out, "args.json")))
    json.dump({**saved, "iters": 3}, open(os.path.join(out, "args.json"), "w"))   # as if started with 3
    train.main(["--out", out, "--resume"])   # --tensorboard comes back with the saved flags
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2] and tensorboard_scalars(logdir) == expected(rows)


def test_train_main_wandb_offline_matches_metrics_jsonl(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    train = hooked()
    from test_train import FAST, read_metrics
    monkeypatch.setenv("WANDB_MODE", "offline")
    out = str(tmp_path / "run")
    train.main(["--tasks", "room", "--mode", "crl", *FAST, "--iters", "2", "--out", out, "--wandb", "crl-test"])
    (history,) = wandb_history(out).values()
    assert history == [(r["step"], {k: float(v) for k, v in r.items() if k != "step"}) for r in read_metrics(out)]


def test_train_main_missing_sink_package_is_one_line_before_anything_runs(tmp_path):
    """Seen from the command line: a tensorboard package that fails to import (shadowed on PYTHONPATH)."""
    hooked()
    shadow = tmp_path / "shadow" / "tensorboard"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'tensorboard'\", "
                                        "name='tensorboard')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "shadow")}
    p = subprocess.run([sys.executable, "train.py", "--tensorboard", "--out", str(tmp_path / "a")], cwd=ROOT,
                       env=env, capture_output=True, text=True)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1].endswith("pip install tensorboard")
    assert not os.path.exists(tmp_path / "a" / "args.json")
