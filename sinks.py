"""sinks.py — metrics.jsonl's scalars, also in TensorBoard (--tensorboard: OUT/tensorboard/) or Weights & Biases
(--wandb PROJECT), written by rank 0 beside each metrics line (train.report). Both are off by default and
imported only when asked for: neither package is in requirements.txt. The x axis is the iteration number, so a
resumed run's curves continue where its checkpoint left them."""
import numbers
import os
import secrets
import sys


def load(name: str):
    """A sink's package, imported only now (an import statement, which a test can make fail)."""
    if name == "tensorboard":
        from torch.utils.tensorboard import SummaryWriter   # torch's writer; the tensorboard package is its backend
        return SummaryWriter
    import wandb
    return wandb


def missing(args) -> str | None:
    """The one-line error for a sink asked for whose package does not import (None: every one asked for does).
    Every rank can check at parse time, before a model loads."""
    for name in ("tensorboard", "wandb"):
        if getattr(args, name, None):
            try:
                load(name)
            except ImportError as err:
                return f"--{name} needs the {name} package ({err}): pip install {name}"
    return None


def scalars(metrics: dict) -> dict:
    """The numbers of a metrics row: what TensorBoard takes, NaN and infinities included (a diverged loss should
    show); strings, lists and None are no curves, and 'step' is the x axis."""
    return {k: float(v) for k, v in metrics.items() if k != "step" and isinstance(v, numbers.Real)}


class Sinks:
    """Rank 0's sinks for the run in args.out; one not asked for does nothing."""

    def __init__(self, args):
        self.tb_dir = os.path.join(args.out, "tensorboard") if args.tensorboard else None
        self.tb = self.wandb = None
        self.wandb_from = 0
        if args.wandb:
            wandb, path = load("wandb"), os.path.join(args.out, "wandb-id")
            run_id = open(path).read().strip() if os.path.exists(path) else ""
            if not run_id:   # the first start: a new run, its id kept for --resume
                run_id = secrets.token_hex(4)   # wandb's ids are 8 lowercase letters and digits
                with open(path + ".tmp", "w") as f:
                    f.write(run_id + "\n")
                os.replace(path + ".tmp", path)   # a kill leaves no id or the whole one, never a torn one
            # WANDB_MODE=offline (read by wandb.init) writes OUT/wandb/offline-run-*, for `wandb sync` later
            self.wandb = wandb.init(project=args.wandb, id=run_id, resume="allow", dir=os.path.abspath(args.out),
                                    name=os.path.basename(os.path.abspath(args.out)), config=vars(args),
                                    allow_val_change=True)   # --resume may change flags
            # a resumed online run already holds the steps before this one, and wandb drops a step below its
            # run's with a warning each: the steps a crashed run logged past its checkpoint are skipped silently
            self.wandb_from = self.wandb.step

    def log(self, metrics: dict, step: int):
        values = scalars(metrics)
        if self.tb_dir:
            if self.tb is None:   # opened at the first row: TensorBoard hides what an earlier process logged at or
                self.tb = load("tensorboard")(self.tb_dir, purge_step=step)   # past it (a crash's redone steps)
            for k, v in values.items():
                self.tb.add_scalar(k, v, step)
            self.tb.flush()   # a line a seconds-long iteration: cheap, and a live `tensorboard --logdir` is current
        if self.wandb is not None and step >= self.wandb_from:
            self.wandb.log(values, step=step)

    def close(self):
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
        self.tb_dir = self.tb = self.wandb = None


def open_sinks(args) -> Sinks:
    """Rank 0's sinks (after rundir.open_run_dir has made args.out); a missing package is a one-line exit."""
    if err := missing(args):
        sys.exit(f"error: {err}")
    return Sinks(args)
