"""The run directory: what train.py keeps in OUT, written so that a kill at any moment, a full disk or a second
process on the same OUT loses nothing, and read back so that a damaged file is one line naming it.

    OUT/lock            the pid of the process training in OUT: one at a time
    OUT/args.json       the run's flags, written once its models have loaded
    OUT/metrics.jsonl   a line an iteration; OUT/bank.jsonl a line an evaluation
                        (compacted once the run is finished, each NAME.xz: reproduce.compact; `read_lines`)
    OUT/curve.png       success against iteration, redrawn as the run goes (`draw_curve`)
    OUT/ckpt/           the latest checkpoint: both models as HF directories, the bank, the trainer state
    OUT/ckpt.old/       the one before it, the fallback while the run goes on
    OUT/final.json      the final evaluation

A small file is written whole to a temporary file, flushed to disk and renamed into place (`write_file`); a
checkpoint is written to ckpt.tmp, flushed, and renamed into place the same way. A checkpoint is checked
(`verify`) before a run resumes from it; a damaged one is moved to ckpt.damaged and the run resumes from the
one before, with a message.

At the bottom, the command line: train.py's flags, one per setting of its RunConfig and crl.CRLConfig
(`add_flags`), each help naming the presets' values."""
import argparse
import contextlib
import dataclasses
import errno
import json
import lzma
import math
import os
import shutil
import signal
import socket
import sys
import threading
import time
import typing

import torch

import crl
import parallel
from small.presets import PRESETS


class Damaged(Exception):
    """A run-directory file that cannot be read back: str() names it and says why."""
    def __init__(self, path: str, why):
        super().__init__(f"{path} is damaged ({why if isinstance(why, str) else f'{type(why).__name__}: {why}'})"
                         .replace("\n", " "))


# ---------------------------------------------------------------------------------------------------------
# Small files: whole or not at all

def write_file(path: str, text: str):
    """Replace `path` with `text` atomically and durably; a full disk is a one-line error, the old file intact."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        if err.errno == errno.ENOSPC:
            sys.exit(f"error: cannot write {path}: the disk is full; free space, then run again with --resume")
        sys.exit(f"error: cannot write {path}: {err.strerror or err}")


def write_json(path: str, obj):
    write_file(path, json.dumps(obj, indent=1))


def read_json(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (ValueError, UnicodeDecodeError) as err:
        raise Damaged(path, err) from None


# ---------------------------------------------------------------------------------------------------------
# One process per run directory

class Lock:
    """OUT/lock, created exclusively and holding `pid host`, for the run's whole life. A lock left by a process
    that is gone (killed) is taken over with a message; one held by a live process is an error."""

    def __init__(self, out: str):
        self.path, self.mine = os.path.join(out, "lock"), f"{os.getpid()} {socket.gethostname()}"
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                self.take_over_if_stale()
                continue
            with os.fdopen(fd, "w") as f:
                f.write(self.mine)
            return
        sys.exit(f"error: {out} is being opened by another process at this moment; wait for it")

    def take_over_if_stale(self):
        try:
            pid, host = open(self.path).read().split()
            pid = int(pid)
        except (OSError, ValueError):
            pid, host = None, socket.gethostname()   # half-written by a process killed while taking it
        if host != socket.gethostname():
            sys.exit(f"error: {os.path.dirname(self.path)} is in use by pid {pid} on {host}; wait for it, or delete "
                     f"{self.path} if that run is not training")
        if pid is not None and alive(pid):
            sys.exit(f"error: {os.path.dirname(self.path)} is in use by a run training now (pid {pid}); wait for "
                     f"it, or choose another --out")
        print(f"taking over {self.path} from pid {pid}, which is gone", file=sys.stderr)
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path)

    def release(self):
        with contextlib.suppress(OSError):
            if open(self.path).read() == self.mine:
                os.remove(self.path)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def open_run_dir(args) -> Lock | None:
    """Rank 0 locks OUT; a new run must not overwrite another (one holds OUT/args.json); --resume continues one.
    Nothing else is written here: args.json follows once the models have loaded (`save_flags`)."""
    args.out = args.out or default_out(args)
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        sys.exit(f"error: --out {args.out} is a file; choose a directory")
    lock, refused = None, None
    if crl.rank() == 0:
        try:
            os.makedirs(args.out, exist_ok=True)
            lock = Lock(args.out)
        except SystemExit as stop:
            refused = str(stop.code)
        except OSError as err:
            refused = f"error: --out {args.out} cannot be made a run directory ({err.strerror}); choose another"
        if lock and not args.resume and os.path.exists(os.path.join(args.out, "args.json")):
            refused = f"error: {args.out} already holds a run; pass --resume to continue it, or choose another --out"
    refused = crl.gather_objects(refused)[0]   # rank 0's answer for every rank: no rank goes on alone
    if refused:
        if lock:
            lock.release()
        sys.exit(refused)
    return lock


def default_out(args) -> str:
    """runs/TASKS-MODE-TIME, the same on every rank."""
    stamp = crl.gather_objects(time.strftime("%Y%m%d-%H%M%S"))[0]
    tasks = "+".join(t.rpartition(":")[2] for t in args.tasks)
    return os.path.join("runs", f"{tasks}-{args.mode}-{stamp}")


def save_flags(args):
    """OUT/args.json: on --resume, the flags given again are the run's from now on."""
    if crl.rank() == 0:
        write_json(os.path.join(args.out, "args.json"), vars(args))


# ---------------------------------------------------------------------------------------------------------
# Logs

def open_log(args, start: int, name: str = "metrics.jsonl", every_step: bool = True):
    """Rank 0's OUT/NAME (a line a step, or with every_step=False a line some steps) for appending. On --resume
    the lines of iterations after the checkpoint go (rewritten through a temporary file): the first line at or
    past `start`, or damaged (the line a crash cut), ends what is kept, and the rest is dropped; damage before a
    line older than the checkpoint is an error naming the line. Outside damage to the last lines older than the
    checkpoint passes for a crash's cut, but loses their records for good (the run will not redo those steps):
    in a line-a-step log, whose kept lines then stop short of the checkpoint's step, a warning names the line
    and the steps."""
    if crl.rank() != 0:
        return None
    path = os.path.join(args.out, name)
    if args.resume and log_exists(path):   # a compacted finished run resumed (its final.json lost): from the .xz
        lines, kept, damaged = "".join(read_lines(path, "replace")).splitlines(), None, None
        last = -1   # the last kept line's step
        for n, line in enumerate(lines):
            step = log_step(line)
            if step is None and damaged is None:
                damaged = n
            elif step is not None and step < start and damaged is not None:
                sys.exit(f"error: {path} line {damaged + 1} is damaged and comes before the checkpoint (step "
                         f"{start - 1}); delete that line, then run again with --resume")
            if kept is None and (step is None or step >= start):
                kept = n
            elif kept is None:
                last = step
        if every_step and damaged is not None and kept == damaged and last + 1 < start:
            steps = f"step {last + 1}" if last + 1 == start - 1 else f"steps {last + 1} to {start - 1}"
            say(f"warning: {path} line {damaged + 1} is damaged: the record of {steps}, before the checkpoint, is "
                f"lost (the run resumes after it)")
        write_file(path, "".join(line + "\n" for line in lines[:len(lines) if kept is None else kept]))
    return open(path, "a")


def log_step(line: str) -> int | None:
    try:
        step = json.loads(line)["step"]
        return step if isinstance(step, int) else None
    except (ValueError, KeyError, TypeError):
        return None


# ---------------------------------------------------------------------------------------------------------
# Checkpoints: OUT/ckpt is the latest, OUT/ckpt.old the one before. A new one is written to ckpt.tmp and
# flushed to disk, the older one deleted, ckpt moved to ckpt.old, the new one renamed into place and the renames
# flushed: a crash or power cut at any point leaves a complete checkpoint in ckpt or ckpt.old, and
# recover_checkpoint() puts the latter back. This is the only place that makes a checkpoint durable (the bank's
# files inside are plain).

def save_checkpoint(run, out: str, step: int):
    """Every rank calls it: each keeps its own extractor generations, and with --fsdp each holds a
    shard of the weights (saved with torch.distributed.checkpoint under dcp/, beside the HF export)."""
    tmp, final, old = (os.path.join(out, name) for name in ("ckpt.tmp", "ckpt", "ckpt.old"))
    if crl.rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    # every rank's generations, in rank order (the gather is also the barrier after rank 0 made tmp)
    ranks = crl.gather_objects({"generations": [dataclasses.asdict(g) for g in run.generations.values()],
                                "generations_made": run.generations_made})
    parallel.save_sharded(run, os.path.join(tmp, "dcp"))
    for name, model, tok in (("actor", run.actor, run.actor_tok), ("extractor", run.extractor, run.extractor_tok)):
        if model is not None:
            parallel.save_pretrained(model, os.path.join(tmp, name))
            if crl.rank() == 0:
                tok.save_pretrained(os.path.join(tmp, name))
    if crl.rank() != 0:
        return
    if run.manager is not None:
        run.manager.bank.save(os.path.join(tmp, "bank"))
    sharded = parallel.is_sharded(run.actor)   # then the optimizers' state is in dcp/
    state = {
        "step": step,
        "actor_opt": run.actor_opt.state_dict() if run.actor_opt and not sharded else None,
        "extractor_opt": run.extractor_opt.state_dict() if run.extractor_opt and not sharded else None,
        "ranks": ranks,
    }
    torch.save(state, os.path.join(tmp, "state.pt"))
    fsync_tree(tmp)   # the other ranks' dcp shards too: dcp.save returned only once every rank had written
    if os.path.exists(final):
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    fsync(out)        # both renames on disk


def fsync_tree(top: str):
    """fsync every file under `top`, then every directory bottom-up, so that once `top` is renamed into
    place, a power cut cannot leave a name pointing at data that never reached the disk."""
    for root, _, files in os.walk(top, topdown=False):
        for name in files:
            fsync(os.path.join(root, name))
        fsync(root)


def fsync(path: str):
    """Flush a file's data, or a directory's entries, to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        if not os.path.isdir(path):
            raise   # some filesystems cannot flush a directory: its renames are then as durable as they make them
    finally:
        os.close(fd)


def recover_checkpoint(out: str):
    """A save that crashed between its two renames left the previous checkpoint in ckpt.old: restore it."""
    final, old = os.path.join(out, "ckpt"), os.path.join(out, "ckpt.old")
    if not os.path.exists(final) and os.path.exists(os.path.join(old, "state.pt")):
        os.replace(old, final)
        fsync(out)


def checkpoint_to_resume(args) -> str | None:
    """--resume: the newest checkpoint in OUT that verifies. A damaged one is moved to ckpt.damaged (so the next
    save cannot make it the fallback) and the one before it is used, with a message; none at all starts the run
    from step 0 with its saved flags. Every rank decides alike: they read the same files."""
    if not args.resume:
        return None
    final, old = os.path.join(args.out, "ckpt"), os.path.join(args.out, "ckpt.old")
    if crl.rank() == 0:
        recover_checkpoint(args.out)
    crl.gather_objects(None)   # a barrier: every rank sees the recovered directory
    if not os.path.exists(final):
        say(f"--resume: no checkpoint in {args.out} yet: starting the run from step 0 with its saved flags")
        return None
    try:
        verify(final)
        return final
    except Damaged as damaged:
        if not os.path.exists(os.path.join(old, "state.pt")):
            sys.exit(f"error: {damaged}; there is no earlier checkpoint to fall back on: start a new run, or "
                     f"restore {final} from a backup")
        try:
            verify(old)
        except Damaged as also:
            sys.exit(f"error: {damaged}, and so is the checkpoint before it: {also}; start a new run")
        say(f"warning: {damaged}; resuming from the checkpoint before it ({old}), the damaged one is kept in "
            f"{final}.damaged")
        crl.gather_objects(None)   # every rank has verified before rank 0 moves the directories
        if crl.rank() == 0:
            shutil.rmtree(final + ".damaged", ignore_errors=True)
            os.replace(final, final + ".damaged")
            os.replace(old, final)
            fsync(args.out)
        crl.gather_objects(None)
        return final


def copy_checkpoint(out: str, into: str) -> str | None:
    """A copy of OUT's newest checkpoint that verifies, its models, bank and trainer state (for --eval-only: a
    training run may replace OUT/ckpt meanwhile, so a copy that fails to verify is made again, then from ckpt.old);
    None when OUT holds none."""
    for _ in range(3):
        for name in ("ckpt", "ckpt.old"):
            src, dst = os.path.join(out, name), os.path.join(into, name)
            if not os.path.exists(os.path.join(src, "state.pt")):
                continue
            shutil.rmtree(dst, ignore_errors=True)
            try:
                shutil.copytree(src, dst, ignore=shutil.ignore_patterns("dcp"))
                verify(dst)
                return dst
            except (OSError, Damaged):
                continue
    if os.path.exists(os.path.join(out, "args.json")):
        sys.exit(f"error: --eval-only: {out} holds no checkpoint that verifies yet; wait for its first save")
    return None


def say(message: str):
    if crl.rank() == 0:
        print(message, file=sys.stderr, flush=True)


def verify(ckpt: str):
    """Read every file of a checkpoint back, raising Damaged naming the first that is not whole: the trainer
    state, both models (their config, weights, finiteness, tokenizer), the bank and the sharded metadata."""
    from bank import ExperienceBank
    from hf import load_tokenizer
    from model import Transformer
    state = os.path.join(ckpt, "state.pt")
    with reading(state):
        torch.load(state, weights_only=True, mmap=True)
    for name in ("actor", "extractor"):
        path = os.path.join(ckpt, name)
        if not os.path.isdir(path):
            continue
        with reading(os.path.join(path, "model.safetensors")):
            model = Transformer.from_pretrained(path, dtype=torch.float32, device="cpu")
        if not all(torch.isfinite(p).all() for p in model.parameters()):
            raise Damaged(os.path.join(path, "model.safetensors"), "non-finite weights")
        with reading(path):
            load_tokenizer(path)
    if os.path.isdir(os.path.join(ckpt, "bank")):
        with reading(os.path.join(ckpt, "bank")):
            ExperienceBank.load(os.path.join(ckpt, "bank"))
    metadata = os.path.join(ckpt, "dcp", ".metadata")
    if os.path.exists(metadata):
        with reading(metadata):
            parallel.read_dcp_metadata(metadata)


@contextlib.contextmanager
def reading(path: str):
    try:
        yield
    except Damaged:
        raise
    except Exception as err:   # whatever the reader raises for a cut or altered file, one line naming it
        raise Damaged(path, str(err).splitlines()[0] if str(err) else type(err).__name__) from None


def load_trainer_state(run, ckpt: str) -> int:
    """Optimizers and the extractor's generations from a checkpoint; returns the next step. A learning
    rate given again with --resume replaces the restored one (AdamW keeps its own copy in its param groups)."""
    state = torch.load(os.path.join(ckpt, "state.pt"), weights_only=True)
    for name, opt in (("actor", run.actor_opt), ("extractor", run.extractor_opt)):
        saved = state[f"{name}_opt"]
        if opt and saved:
            if len(saved["param_groups"][0]["params"]) != len(opt.param_groups[0]["params"]):
                sys.exit(f"error: --resume: the checkpoint's {name} optimizer holds q/k/v and gate/up apart, as "
                         f"the code up to {FUSED_AFTER} did: resume it at {FUSED_AFTER} (git checkout "
                         f"{FUSED_AFTER})")
            opt.load_state_dict(saved)
    ranks = state.get("ranks") or [{"generations": state["generations"],      # a checkpoint from before
                                    "generations_made": state["gen_counter"]}]  # per-rank generations
    if len(ranks) != crl.world():
        sys.exit(f"error: --resume: the checkpoint was written by {len(ranks)} ranks, this run has {crl.world()}; "
                 f"resume with torchrun --nproc_per_node {len(ranks)}")
    sharded = os.path.exists(os.path.join(ckpt, "dcp", ".metadata"))
    if sharded != parallel.is_sharded(run.actor):
        was = "with" if sharded else "without"
        sys.exit(f"error: --resume: the run was trained {was} --fsdp; resume it {was} --fsdp (the optimizers' state "
                 "is kept differently)")
    mine = ranks[crl.rank()]   # each rank takes back its own generations
    run.generations = {g["id"]: crl.Generation(**g) for g in mine["generations"]}
    run.generations_made = mine["generations_made"]
    parallel.load_sharded(run, os.path.join(ckpt, "dcp"))
    for name, opt, lr in (("--lr", run.actor_opt, run.cfg.lr), ("--extractor-lr", run.extractor_opt,
                                                                 run.cfg.extractor_lr)):
        for group in opt.param_groups if opt else ():
            if not math.isclose(group["lr"], lr, rel_tol=1e-12):
                say(f"--resume: {name} {lr:g} replaces the checkpoint's {group['lr']:g}")
                group["lr"] = lr
    return state["step"] + 1


class StopSignals:
    """SIGTERM (what clusters and torchrun send before they kill) and SIGINT (Ctrl-C) ask a training run to stop:
    the handler only notes the signal, and train.py ends the iteration under way, checkpoints it and exits, so
    --resume trains no logged step again. A second signal acts at once (the handlers are the old ones again).
    Only the main thread can install handlers; elsewhere nothing changes."""

    def __init__(self):
        self.signum, self.saved = 0, {}
        if threading.current_thread() is threading.main_thread():
            self.saved = {sig: signal.signal(sig, self.note) for sig in (signal.SIGTERM, signal.SIGINT)}

    def note(self, signum, frame):
        self.signum = signum
        self.restore()

    def restore(self):
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)
        self.saved = {}

    def requested(self) -> int:
        """The signal that asked to stop (0: none), the same on every rank: a rank stops where any rank was asked."""
        return max(crl.gather_objects(self.signum))


def drop_fallback(out: str):
    """After the last checkpoint of a finished run: once it verifies, the one before it goes (disk space)."""
    final, old = os.path.join(out, "ckpt"), os.path.join(out, "ckpt.old")
    if crl.rank() == 0 and os.path.exists(old):
        try:
            verify(final)
        except Damaged as damaged:
            say(f"warning: {damaged}; the checkpoint before it stays in {old}")
            return
        shutil.rmtree(old, ignore_errors=True)


def draw_curve(out: str):
    """Success vs iteration per task, with and without experience: held-out evaluation (bold, markers) and
    training rollouts (thin, a moving average over 5 iterations: one iteration's groups are few and noisy)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [json.loads(line) for line in read_lines(os.path.join(out, "metrics.jsonl"))]
    series = sorted({k.split("/", 1)[1] for r in rows for k in r if "/success_" in k})   # e.g. room/success_exp
    if not series:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for color, name in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"] * 4, series):
        train = [(r["step"], r["train/" + name]) for r in rows if "train/" + name in r]
        if train:
            steps, values = zip(*train)
            smooth = [sum(values[max(0, i - 4):i + 1]) / len(values[max(0, i - 4):i + 1]) for i in range(len(values))]
            ax.plot(steps, smooth, color=color, lw=1, alpha=0.6, label=f"train {name} (avg 5)")
        evals = [(r["step"], r["eval/" + name]) for r in rows if "eval/" + name in r]
        if evals:
            ax.plot(*zip(*evals), color=color, lw=2, marker="o", ms=4, label=f"eval {name}")
    ax.set_xlabel("iteration")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "curve.png.tmp"), format="png", dpi=100)
    plt.close(fig)
    os.replace(os.path.join(out, "curve.png.tmp"), os.path.join(out, "curve.png"))


# ---------------------------------------------------------------------------------------------------------
# the command line: one flag per setting of train.RunConfig and crl.CRLConfig

def flat_fields(cls, prefix=""):
    """(dest, field) for every setting of `cls`; a nested config's fields get its name as prefix."""
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.type):
            yield from flat_fields(f.type, prefix + f.name + "_")
        else:
            yield prefix + f.name, f


def flag_name(dest: str, f) -> str:
    return "--" + dest.replace(f.name, f.metadata.get("flag", f.name)).replace("_", "-")


def value_type(f) -> tuple[type, bool]:
    """(the value's type, whether it may be None) of a field typed X or X | None."""
    args = [a for a in typing.get_args(f.type) if a is not type(None)]
    return (args[0], True) if args else (f.type, False)


def text_parser(kind: type, optional: bool):
    def parse(text):
        return None if optional and text.lower() == "none" else kind(text)
    parse.__name__ = kind.__name__ + (" or none" if optional else "")   # argparse names it in its errors
    return parse


# options of closed studies, retired with their study: option -> (its old default, the last commit that has it). A
# run that set one away from its default resumes only in a checkout of that commit (its runs/ script names it)
RETIRED = {**{k: (old, "beda864") for k, old in (("distill_from", "exp"), ("merge_chunks", 0), ("recent_moves", 0),
                                                   ("query_map", False), ("lesson_sets", False))},
           **{k: (old, "08588c7") for k, old in (
               ("extractor_baseline", "batch"), ("extractor_blind", False), ("extractor_entropy", 0.0),
               ("train_instances", 0), ("max_generations", 4096), ("max_asks", 2), ("merge_size", 5),
               ("extractor_temperature", 1.0), ("master_dtype", "float32"), ("bank_candidates", 16),
               ("bank_search_batch", 32), ("credit_discount", 1.0))}}
FUSED_AFTER = "cfe6db7"   # the last commit whose optimizers hold HF's separate projections (model.Fused)


def retired_flags(saved: dict) -> tuple[str, str] | None:
    """(the retired options a run's saved flags set away from their old defaults, as flags; the commit to resume it
    at), or None."""
    used = [(k, commit) for k, (old, commit) in RETIRED.items() if saved.get(k, old) != old]
    return (", ".join("--" + k.replace("_", "-") for k, _ in used), used[0][1]) if used else None


def migrate(saved: dict) -> dict:
    """A run's flags from before the vault study closed (08588c7), in today's terms: --vault-reveal is the task
    vault-reveal (a per-task value for vault applies to it too), --credit-discount 0 with --credit lift is
    --credit first-lift. Anything else it set that is retired stays, for retired_flags to refuse."""
    saved = dict(saved)
    if saved.pop("vault_reveal", False):
        saved["tasks"] = ["vault-reveal" if t == "vault" else t for t in saved["tasks"]]
        for key in ("max_steps", "history"):
            if isinstance(saved.get(key), str) and "vault=" in saved[key]:
                n = saved[key].split("vault=")[1].split(",")[0]
                saved[key] += f",vault-reveal={n}"
    if saved.get("credit_discount") == 0.0 and saved.get("credit") == "lift":
        saved["credit"], saved["credit_discount"] = "first-lift", 1.0
    return saved


def renamed_task(saved: dict, key: str) -> str:
    """A metrics key of a run that migrate() renamed a task of, in today's name (vault/... -> vault-reveal/...)."""
    if saved.get("vault_reveal"):
        return key.replace("/vault/", "/vault-reveal/")
    return key


def add_flags(p, classes, first: tuple = ()):
    """One flag per field of each class of `classes`: the `first` ones in a section of their own, in that order,
    then each class's in a help section of its own (a field whose metadata names a `group`: in that group's section,
    after them); unset flags stay out of the namespace."""
    fields = dict(item for cls in classes for item in flat_fields(cls))
    top = p.add_argument_group("the settings a run changes first")
    groups = {cls: p.add_argument_group(cls.__name__, cls.__doc__.split("\n")[0]) for cls in classes}
    for dest in first:
        add_flag(top, dest, fields[dest])
    for cls in classes:
        for dest, f in flat_fields(cls):
            if dest in first:
                continue
            name = f.metadata.get("group")
            add_flag(groups.get(name) or groups.setdefault(name, p.add_argument_group(name)) if name else groups[cls],
                     dest, f)


def add_flag(group, dest: str, f):
    """The flag of one setting: its help with its default and each preset's value."""
    kind, optional = value_type(f)
    shown = [] if f.default is None else [f"default: {f.default}"]   # a None default's help says what it means
    for name, (as_actor, as_extractor) in PRESETS.items():
        preset = {**as_actor, **as_extractor}
        if dest in preset:
            shown.append(f"{name}: {'none' if preset[dest] is None else preset[dest]}")
    text = f.metadata["help"] + (f" ({'; '.join(shown)})" if shown else "")
    kw = dict(dest=dest, default=argparse.SUPPRESS, help=text.replace("%", "%%"))
    if kind is bool:
        kw["action"] = argparse.BooleanOptionalAction
    else:
        kw["type"] = text_parser(kind, optional)
        choices = f.metadata.get("choices")
        kw["metavar"] = "{" + ",".join(choices) + "}" if choices else kind.__name__.upper()
    group.add_argument(flag_name(dest, f), **kw)


# ---------------------------------------------------------------------------------------------------------
# Reading a log back, plain or compact: a finished cell of the committed record keeps NAME.jsonl as NAME.jsonl.xz
# (reproduce.compact); the plain file, where train.py writes, comes first

def read_lines(path: str, errors: str = "strict"):
    """The lines of the log `path`, else of `path`.xz, as open() gives them; neither is a one-line error."""
    for name, opener in ((path, open), (path + ".xz", lzma.open)):
        if os.path.exists(name):
            with opener(name, "rt", encoding="utf-8", errors=errors) as f:
                yield from f
            return
    raise FileNotFoundError(f"neither {path} nor {path}.xz exists")


def log_exists(path: str) -> bool:
    return os.path.exists(path) or os.path.exists(path + ".xz")
