"""The run directory under faults (rundir.py): a planted pickle, a full disk, a cut log line, a second process,
a changed learning rate, a directory without a checkpoint, damaged checkpoint files, and a run killed at random
moments while it saves. Each test reproduces the fault through train.main, the code path a run takes."""
import errno
import json
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

import parallel
import reproduce
import rundir
import train
from test_train import FAST, ROOT, read_metrics, strip_times

FLAGS = ["--tasks", "room", *FAST, "--eval-every", "0", "--save-every", "1"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A crl run of 2 iterations, both checkpoints kept (ckpt: step 1, ckpt.old: step 0), and its metrics."""
    out = str(tmp_path_factory.mktemp("faults") / "run")
    drop, rundir.drop_fallback = rundir.drop_fallback, lambda out: None
    try:
        train.main([*FLAGS, "--iters", "2", "--out", out])
    finally:
        rundir.drop_fallback = drop
    return out


@pytest.fixture
def run_dir(finished, tmp_path):
    out = str(tmp_path / "run")
    shutil.copytree(finished, out)
    return out


def resume(out, *flags):
    return train.main(["--out", out, "--resume", *flags])


def step_of(ckpt):
    return torch.load(os.path.join(ckpt, "state.pt"), weights_only=True)["step"]


class Payload:
    """A pickle that runs a shell command when loaded."""
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


# 1. -------------------------------------------------------------------------------------------------------
def test_planted_dcp_metadata_never_runs(tmp_path):
    """A sharded (one-rank FSDP) run's dcp/.metadata replaced by a pickle that runs a command: --resume refuses
    it naming the file, and loading the shards directly refuses it too; the command never runs."""
    import torch.distributed as dist
    out, marker = str(tmp_path / "fsdp"), tmp_path / "ran"
    try:
        run = train.main(["--tasks", "room", "--iters", "1", "--out", out, "--fsdp", *FAST, "--eval-every", "0"])
        metadata = os.path.join(out, "ckpt", "dcp", ".metadata")
        assert parallel.read_dcp_metadata(metadata).state_dict_metadata      # torch's own file reads
        pickle.dump(Payload(marker), open(metadata, "wb"))
        with pytest.raises(SystemExit, match=r"ckpt/dcp/.metadata is damaged.*posix.system"):
            resume(out, "--fsdp")
        parallel.ensure_process_group(torch.device("cpu"))
        with pytest.raises(BaseException, match="posix.system"):   # torch wraps it in a BaseException
            parallel.load_sharded(run, os.path.join(out, "ckpt", "dcp"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert not marker.exists()


# 2. -------------------------------------------------------------------------------------------------------
def test_a_full_disk_keeps_the_old_file_and_says_so(run_dir, monkeypatch):
    """args.json, final.json and the metrics rewrite go through rundir.write_file: a full disk leaves the old
    file whole (never 0 bytes) and stops with one line."""
    path = os.path.join(run_dir, "args.json")
    before = open(path).read()

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(SystemExit, match="the disk is full"):
        resume(run_dir, "--iters", "3")
    assert open(path).read() == before and not os.path.exists(path + ".tmp")
    monkeypatch.undo()
    resume(run_dir, "--iters", "3", "--final-eval-episodes", "1")
    assert json.load(open(path))["iters"] == 3 and "eval/room/success_exp" in json.load(
        open(os.path.join(run_dir, "final.json")))


# 3, 7. ----------------------------------------------------------------------------------------------------
def test_a_cut_log_line_after_the_checkpoint_is_dropped(run_dir, capsys):
    path = os.path.join(run_dir, "metrics.jsonl")
    with open(path, "a") as f:
        f.write('{"step": 2, "train/ro')                               # the disk filled mid-line
    resume(run_dir, "--iters", "3")
    assert [r["step"] for r in read_metrics(run_dir)] == [0, 1, 2]
    assert "warning" not in capsys.readouterr().err                  # step 2 ran again: nothing was lost


def test_a_cut_bank_line_is_dropped_without_a_false_warning(run_dir, capsys):
    """bank.jsonl has a line an evaluation, so a line cut after the checkpoint follows an older step's by more
    than one: it is dropped like metrics.jsonl's, with no warning of a loss."""
    path = os.path.join(run_dir, "bank.jsonl")
    open(path, "w").write(json.dumps({"step": 0, "bank": {}}) + "\n" + '{"step": 2, "ba')
    resume(run_dir, "--iters", "3")
    assert [json.loads(line)["step"] for line in open(path)] == [0]
    assert "warning" not in capsys.readouterr().err


def test_a_damaged_log_line_before_the_checkpoint_says_what_is_lost(run_dir, capsys):
    """Step 1's line damaged from outside, with step 2's line (logged, then killed before its checkpoint) after
    it: resuming from the checkpoint of step 1 keeps step 0, reruns step 2, and says step 1's record is gone."""
    path = os.path.join(run_dir, "metrics.jsonl")
    lines = open(path).read().splitlines()
    open(path, "w").write(lines[0] + "\n" + "{broken\n" + json.dumps({"step": 2}) + "\n")
    resume(run_dir, "--iters", "3")
    assert [r["step"] for r in read_metrics(run_dir)] == [0, 2]
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == [f"warning: {path} line 2 is damaged: the record of step 1, before the checkpoint, is lost "
                        f"(the run resumes after it)"]


def test_a_damaged_log_line_before_the_checkpoint_is_named(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    lines = open(path).read().splitlines()
    open(path, "w").write("{broken\n" + lines[1] + "\n")
    with pytest.raises(SystemExit, match=r"metrics.jsonl line 1 is damaged and comes before the checkpoint"):
        resume(run_dir, "--iters", "3")


def test_the_log_is_rewritten_whole_or_not_at_all(run_dir, monkeypatch):
    """A kill between truncating metrics.jsonl and writing it back left a finished run's log with two of its
    lines: the rewrite goes through a temporary file, so a kill before the rename leaves it as it was."""
    path = os.path.join(run_dir, "metrics.jsonl")
    with open(path, "a") as f:
        f.write(json.dumps({"step": 2}) + "\n")
    before = open(path).read()

    def killed(src, dst):
        raise KeyboardInterrupt   # stands for the kill: nothing after it runs
    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        rundir.open_log(train.parse_args(["--out", run_dir, "--resume"]), 2)
    assert open(path).read() == before


# 4. -------------------------------------------------------------------------------------------------------
def test_one_process_per_run_directory(run_dir, tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock = os.path.join(run_dir, "lock")
        open(lock, "w").write(f"{sleeper.pid} {__import__('socket').gethostname()}")
        with pytest.raises(SystemExit, match=f"in use by a run training now \\(pid {sleeper.pid}\\)"):
            resume(run_dir, "--iters", "3")
        assert read_metrics(run_dir)[-1]["step"] == 1                      # nothing written by the refused one
    finally:
        sleeper.kill()
        sleeper.wait()
    resume(run_dir, "--iters", "3")                                        # the pid is gone: taken over
    assert [r["step"] for r in read_metrics(run_dir)] == [0, 1, 2] and not os.path.exists(lock)
    new = str(tmp_path / "new")                                            # two new runs at the same moment:
    os.makedirs(new)
    first = rundir.Lock(new)                                              # the first holds the lock ...
    with pytest.raises(SystemExit, match="in use by a run training now"):  # ... the second cannot pass
        train.main([*FLAGS, "--iters", "1", "--out", new])
    first.release()
    assert not os.path.exists(os.path.join(new, "args.json"))


# 5. -------------------------------------------------------------------------------------------------------
def test_resume_applies_a_changed_learning_rate(run_dir, capsys):
    run = resume(run_dir, "--iters", "3", "--lr", "0.0123", "--extractor-lr", "0.0456")
    assert [g["lr"] for g in run.actor_opt.param_groups] == [0.0123]
    assert [g["lr"] for g in run.extractor_opt.param_groups] == [0.0456]
    assert "--lr 0.0123 replaces the checkpoint's" in capsys.readouterr().err


def test_an_optimizer_saved_before_the_fused_projections_is_refused_in_one_line(run_dir):
    """A checkpoint written before q/k/v and gate/up were fused holds more optimizer entries than the model has
    parameters: resuming says which commit to resume at (load_state_dict would raise a traceback)."""
    path = os.path.join(run_dir, "ckpt", "state.pt")
    state = torch.load(path, weights_only=True)
    for opt in ("actor_opt", "extractor_opt"):   # a parameter more, as q, k, v for qkv
        state[opt]["param_groups"][0]["params"].append(len(state[opt]["param_groups"][0]["params"]))
    torch.save(state, path)
    with pytest.raises(SystemExit, match=f"resume it at {rundir.FUSED_AFTER}"):
        resume(run_dir, "--iters", "3")


# 6. -------------------------------------------------------------------------------------------------------
def test_a_run_without_a_checkpoint_resumes_from_step_0(tmp_path, capsys):
    out = str(tmp_path / "typo")
    with pytest.raises(SystemExit, match="not found"):
        train.main([*FLAGS, "--iters", "1", "--out", out, "--actor", str(tmp_path / "nope")])
    assert not os.path.exists(os.path.join(out, "args.json"))             # nothing before the models load
    train.main([*FLAGS, "--iters", "1", "--out", out])                    # so a fresh start works
    shutil.rmtree(os.path.join(out, "ckpt"))                              # as if killed before its checkpoint
    resume(out)
    assert "starting the run from step 0" in capsys.readouterr().err
    assert [r["step"] for r in read_metrics(out)] == [0]


# 8, 10. ---------------------------------------------------------------------------------------------------
def cut(path):
    data = open(path, "rb").read()
    open(path, "wb").write(data[:len(data) // 2])


def empty(path):
    open(path, "wb").close()


def nan_weights(path):
    from safetensors.torch import load_file, save_file
    state = load_file(path)
    name = next(iter(state))
    state[name][0] = float("nan")
    save_file(state, path)


def wider_config(path):
    config = json.load(open(path))
    config["hidden_size"] *= 2
    json.dump(config, open(path, "w"))


def no_byte_tokenizer(path):
    os.remove(path)


def keys_nan(path):
    from safetensors.torch import load_file, save_file
    keys = load_file(path)["keys"]
    keys[0, 0] = float("inf")
    save_file({"keys": keys}, path)


@pytest.mark.parametrize("damage, file", [
    (cut, "actor/model.safetensors"), (empty, "state.pt"), (nan_weights, "extractor/model.safetensors"),
    (wider_config, "actor/config.json"), (no_byte_tokenizer, "actor/byte_tokenizer.json"),
    (keys_nan, "bank/keys.safetensors")])
def test_a_damaged_checkpoint_falls_back_to_the_one_before(run_dir, capsys, damage, file):
    ckpt = os.path.join(run_dir, "ckpt")
    damage(os.path.join(ckpt, file))
    resume(run_dir, "--iters", "3")
    err = capsys.readouterr().err
    assert "is damaged" in err and f"resuming from the checkpoint before it ({ckpt}.old)" in err
    assert os.path.join(run_dir, "ckpt", file.split("/")[0]) in err
    assert [r["step"] for r in read_metrics(run_dir)] == [0, 1, 2]         # step 1 again, from step 0's state
    assert step_of(ckpt) == 2 and os.path.isdir(ckpt + ".damaged")


def test_with_nothing_to_fall_back_on_the_error_names_the_file(run_dir):
    shutil.rmtree(os.path.join(run_dir, "ckpt.old"))
    empty(os.path.join(run_dir, "ckpt", "state.pt"))
    with pytest.raises(SystemExit) as stop:
        resume(run_dir, "--iters", "3")
    assert "ckpt/state.pt is damaged" in str(stop.value.code) and "no earlier checkpoint" in str(stop.value.code)


def test_bad_args_json_is_one_line(run_dir):
    open(os.path.join(run_dir, "args.json"), "w").write('{"tasks": ["ro')
    p = subprocess.run([sys.executable, "train.py", "--out", run_dir, "--resume"], cwd=ROOT, capture_output=True,
                       text=True)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert "args.json is damaged" in p.stderr.strip().splitlines()[-1]


def test_a_bank_snapshot_outside_the_checkpoint_is_refused(run_dir, tmp_path):
    from bank import ExperienceBank
    other = tmp_path / "other"
    shutil.copytree(os.path.join(run_dir, "ckpt", "bank"), other)
    bank = tmp_path / "bank"
    bank.mkdir()
    (bank / "CURRENT").write_text("../other")
    with pytest.raises(ValueError, match="outside"):
        ExperienceBank.load(bank)


def test_a_changed_fsdp_flag_is_refused(run_dir):
    import torch.distributed.checkpoint as dcp
    dcp.save({"x": torch.zeros(2)}, checkpoint_id=os.path.join(run_dir, "ckpt", "dcp"))   # as --fsdp saves
    with pytest.raises(SystemExit, match="trained with --fsdp; resume it with --fsdp"):
        rundir.load_trainer_state(train.build(train.parse_args(["--out", run_dir, "--resume"]),
                                              torch.device("cpu"), torch.float32)[0], os.path.join(run_dir, "ckpt"))


@pytest.mark.parametrize("flag", ["--lr", "--clip", "--temperature"])
def test_non_finite_flags_are_refused(flag, capsys):
    for value in ("inf", "nan"):
        with pytest.raises(SystemExit):
            train.parse_args([flag, value])
        assert "must be a finite number" in capsys.readouterr().err


def test_a_failed_curve_does_not_stop_training(tmp_path, monkeypatch):
    def broken(out):
        raise RuntimeError("no backend")
    monkeypatch.setattr(rundir, "draw_curve", broken)
    out = str(tmp_path / "r")
    with pytest.warns(UserWarning, match="curve.png not redrawn"):
        train.main([*FLAGS, "--iters", "1", "--out", out])
    assert [r["step"] for r in read_metrics(out)] == [0]


# 9. -------------------------------------------------------------------------------------------------------
def test_reproduce_resumes_a_cell_left_in_ckpt_old(run_dir, monkeypatch):
    os.replace(os.path.join(run_dir, "ckpt"), os.path.join(run_dir, "ckpt.keep"))
    shutil.rmtree(os.path.join(run_dir, "ckpt.old"))
    os.replace(os.path.join(run_dir, "ckpt.keep"), os.path.join(run_dir, "ckpt.old"))  # crashed between renames
    calls = []
    monkeypatch.setattr(reproduce, "run_dir", lambda *a: run_dir)
    monkeypatch.setattr(reproduce, "check_same_flags", lambda *a: None)
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    a, _ = reproduce.parse_args(["--iters", "2"])
    reproduce.run_one("room", "crl", 0, a, [])
    assert calls and calls[0][-1] == "--resume" and os.path.isdir(os.path.join(run_dir, "ckpt.old"))


# the fault script ----------------------------------------------------------------------------------------
def test_killed_at_random_moments_resumes_to_the_uninterrupted_run(tmp_path):
    """The fault script: a run killed (SIGKILL) at random moments, most while it writes a checkpoint (one every
    iteration) and some anywhere, and resumed each time, logs each step once and ends with the uninterrupted
    run's metrics, weights and bank."""
    flags = [*FLAGS, "--iters", "6", "--seed", "3"]
    full, part = str(tmp_path / "full"), str(tmp_path / "part")
    subprocess.run([sys.executable, "train.py", *flags, "--out", full], cwd=ROOT, check=True, capture_output=True)
    rng, kills, in_save, finished = random.Random(0), 0, 0, False
    while not finished:
        resuming = os.path.exists(os.path.join(part, "args.json"))
        p = subprocess.Popen([sys.executable, "train.py", *flags, "--out", part, *(["--resume"] * resuming)],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if kills < 8:
            kill_at = kill_moment(p, part, rng)
            while p.poll() is None and time.time() < kill_at:
                time.sleep(0.002)
            if p.poll() is None:
                in_save += os.path.exists(os.path.join(part, "ckpt.tmp"))
                p.send_signal(signal.SIGKILL)
                kills += 1
        out = p.communicate()[0]
        assert p.returncode in (0, -signal.SIGKILL), out[-2000:]
        finished = p.returncode == 0
    assert kills >= 4 and in_save >= 2, (kills, in_save)   # a kill can come after the run has finished
    a, b = read_metrics(full), read_metrics(part)
    assert [r["step"] for r in b] == list(range(6))
    assert [strip_times(r) for r in a] == [strip_times(r) for r in b]
    from safetensors.torch import load_file
    for name in ("actor", "extractor"):
        x, y = (load_file(os.path.join(d, "ckpt", name, "model.safetensors")) for d in (full, part))
        assert all(torch.equal(x[k], y[k]) for k in x)
    x, y = (open(os.path.join(d, "ckpt", "bank", "entries.jsonl")).read() for d in (full, part))
    assert x == y and os.listdir(part) == os.listdir(full)


def kill_moment(p, out: str, rng: random.Random) -> float:
    """Three times in four: a moment within 0.04 s after the next checkpoint write starts (ckpt.tmp appears);
    else a moment within 3 s of the start."""
    if rng.random() < 0.25:
        return time.time() + rng.uniform(0.0, 3.0)
    tmp = os.path.join(out, "ckpt.tmp")
    while p.poll() is None and not os.path.exists(tmp):
        time.sleep(0.001)
    return time.time() + rng.uniform(0.0, 0.04)   # a tiny checkpoint takes 20-50 ms to write
