"""Train Complementary RL: `torchrun [--nproc_per_node N] train.py --tasks room` (or plain `python train.py`).

Builds the actor and the extractor (the embedded `tiny` preset, or HF checkpoint directories), the
embedder and the experience bank, then runs crl.train_step in a loop with periodic evaluation, logging to
OUT/metrics.jsonl, a learning-curve picture OUT/curve.png, and checkpoints in OUT/ckpt (both models as HF
directories, the bank, the trainer state). DDP: gloo on CPU, nccl on CUDA; every rank plays its share of
the groups and holds an identical bank replica (see crl.py).
"""
import argparse
import json
import os
import shutil
import sys
import time
import warnings
from dataclasses import asdict

import torch
import torch.distributed as dist
from tqdm import tqdm

import crl
import envs
from bank import Embedder, ExperienceBank, ExperienceManager
from model import Transformer, load_tokenizer

# The embedded default is sized for a 2-core CPU (about 5 s an iteration, under 30 minutes a run); real
# checkpoints follow the authors' setup.
TINY = dict(lr=3e-4, extractor_lr=1e-3, groups=8, group_size=8, warmup=2, history=0, max_reply_tokens=16,
            max_context=6144, extractor_reply_tokens=24, episode_chars=400, distill_per_group=2,
            extractor_batch=32, micro_batch=16, eval_episodes=64, eval_every=30, merge_every=5, iters=270,
            minibatches=1, instructions=False, map=False, max_steps=10)
REAL = dict(lr=1e-6, extractor_lr=1e-6, groups=16, group_size=8, warmup=5, history=None, max_reply_tokens=512,
            max_context=16384, extractor_reply_tokens=1024, episode_chars=6000, distill_per_group=0,
            extractor_batch=64, micro_batch=4, eval_episodes=64, eval_every=10, merge_every=5, iters=512,
            minibatches=1, instructions=True, map=True, max_steps=envs.MAX_STEPS)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", default="room", help=f"comma-separated, from: {', '.join(envs.TASKS)}")
    p.add_argument("--actor", default="tiny", help="'tiny' or a HF checkpoint directory")
    p.add_argument("--extractor", default="tiny", help="'tiny' or a HF checkpoint directory")
    p.add_argument("--embedder", default=None, help="embedder directory (default: the packaged all-MiniLM-L6-v2)")
    p.add_argument("--mode", default="crl", choices=crl.MODES)
    p.add_argument("--out", default=None, help="run directory (default: runs/TASKS-MODE-TIME)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16"], help="default: bf16 on cuda, fp32 on cpu")
    p.add_argument("--save-every", type=int, default=None, help="checkpoint every N iterations (default: at evals)")
    p.add_argument("--free-text", action="store_true", default=None,
                   help="actor replies free text with <answer> (default for HF checkpoints) instead of constrained")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--instructions", action=argparse.BooleanOptionalAction, default=None,
                   help="put the task instruction and reply format in the actor's prompt (default: not for tiny)")
    p.add_argument("--map", action=argparse.BooleanOptionalAction, default=None,
                   help="show MiniHack's character map to the actor; without it, only positions in words and "
                        "the message line (default: not for tiny)")
    # preset-dependent (None = the tiny or the real default)
    for name in ["iters", "groups", "group_size", "warmup", "history", "max_reply_tokens", "max_context",
                 "extractor_reply_tokens", "episode_chars", "distill_per_group", "extractor_batch",
                 "micro_batch", "eval_episodes", "eval_every", "merge_every", "minibatches", "max_steps"]:
        p.add_argument("--" + name.replace("_", "-"), type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--extractor-lr", type=float, default=None)
    args = p.parse_args(argv)
    preset = TINY if args.actor == "tiny" else REAL
    for k, v in preset.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.history is not None and args.history < 0:
        args.history = None
    if args.free_text is None:
        args.free_text = args.actor != "tiny"
    args.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in args.tasks if t not in envs.TASKS]
    if unknown or not args.tasks:
        p.error(f"unknown task {', '.join(unknown) or '(none)'}; choose from: {', '.join(envs.TASKS)}")
    if args.max_steps < 1:
        p.error("--max-steps must be >= 1 (actions per episode)")
    if args.group_size < 2 or args.group_size % 2:
        p.error("--group-size must be an even number >= 2 (half the group plays without experience)")
    return args


def setup_distributed():
    """torchrun sets RANK/WORLD_SIZE; plain `python train.py` is world size 1."""
    if "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return 0, torch.device("cuda" if torch.cuda.is_available() else "cpu")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        dist.init_process_group("nccl")
        return local, torch.device("cuda", local)
    dist.init_process_group("gloo")
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    return local, torch.device("cpu")


def model_dtype(args, device) -> torch.dtype:
    """--dtype, else bf16 on CUDA and fp32 on CPU."""
    return getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))


def load_model(spec: str, seed: int, device, dtype):
    if spec == "tiny":
        return Transformer.tiny(seed=seed).to(device=device, dtype=dtype), load_tokenizer("tiny")
    if not os.path.isdir(spec):
        sys.exit(f"error: checkpoint directory {spec!r} not found; pass 'tiny' or a local HF checkpoint directory")
    try:
        return Transformer.from_pretrained(spec, dtype=dtype, device=device), load_tokenizer(spec)
    except (ValueError, FileNotFoundError, OSError) as err:
        sys.exit(f"error: cannot load checkpoint {spec!r}: {err}")


def save_checkpoint(run: crl.CRL, out: str, step: int, args):
    """OUT/ckpt holds the latest checkpoint, replaced atomically (written beside it, then renamed)."""
    tmp, final = os.path.join(out, "ckpt.tmp"), os.path.join(out, "ckpt")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for name, model, tok in (("actor", run.actor, run.actor_tok), ("extractor", run.extractor, run.extractor_tok)):
        if model is not None:
            model.save_pretrained(os.path.join(tmp, name))
            tok.save_pretrained(os.path.join(tmp, name))
    if run.manager is not None:
        run.manager.bank.save(os.path.join(tmp, "bank"))
    state = {
        "step": step,
        "actor_opt": run.actor_opt.state_dict() if run.actor_opt else None,
        "extractor_opt": run.extractor_opt.state_dict() if run.extractor_opt else None,
        "generations": [asdict(g) for g in run.generations.values()],
        "gen_counter": run.gen_counter,
    }
    torch.save(state, os.path.join(tmp, "state.pt"))
    if os.path.exists(final):
        shutil.rmtree(final)
    os.replace(tmp, final)


def build(args, device, dtype) -> tuple[crl.CRL, int]:
    """The run from parsed flags: actor, extractor, embedder, bank and optimizers, or with --resume their
    state from OUT/ckpt. Returns the `crl.CRL` and the first iteration to run (bench.py reuses this)."""
    ckpt = os.path.join(args.out, "ckpt") if args.resume else None
    world = crl.world()
    torch.manual_seed(args.seed)
    actor_src = os.path.join(ckpt, "actor") if args.resume else args.actor
    actor, actor_tok = load_model(actor_src, args.seed, device, dtype)
    cfg = crl.CRLConfig(
        mode=args.mode, group_size=args.group_size, temperature=args.temperature, eval_temperature=args.temperature,
        warmup=args.warmup, free_text=args.free_text, history=args.history, instructions=args.instructions,
        show_map=args.map, max_steps=args.max_steps,
        max_reply_tokens=args.max_reply_tokens, max_context=args.max_context,
        extractor_free_text=args.extractor != "tiny", extractor_reply_tokens=args.extractor_reply_tokens,
        episode_chars=args.episode_chars, distill_per_group=args.distill_per_group,
        extractor_batch=args.extractor_batch, micro_batch=args.micro_batch, merge_every=args.merge_every,
        minibatches=args.minibatches)
    extractor = extractor_tok = manager = None
    if cfg.uses_bank:
        extractor, extractor_tok = load_model(os.path.join(ckpt, "extractor") if args.resume else args.extractor,
                                              args.seed + 1, device, dtype)
        try:
            embedder = Embedder(args.embedder, device=device)
        except (ValueError, FileNotFoundError, OSError) as err:
            sys.exit(f"error: cannot load the embedder: {err}")
        bank = ExperienceBank.load(os.path.join(ckpt, "bank")) if args.resume else ExperienceBank(embedder.dim)
        # inline under DDP (every rank applies the same operations in the same order) and on CPU, where a
        # background thread only fights the actor's matmuls for the same cores (1.8x slower iterations)
        manager = ExperienceManager(bank, embedder, sync=world > 1 or device.type == "cpu")
    actor_opt = torch.optim.AdamW(actor.parameters(), lr=args.lr, weight_decay=0.0) if cfg.trains_actor else None
    extractor_opt = (torch.optim.AdamW(extractor.parameters(), lr=args.extractor_lr, weight_decay=0.0)
                     if cfg.trains_extractor else None)
    run = crl.CRL(cfg, args.tasks, args.groups, args.seed, actor, actor_tok, actor_opt,
                  extractor, extractor_tok, extractor_opt, manager)
    start = 0
    if args.resume:
        state = torch.load(os.path.join(ckpt, "state.pt"), weights_only=True)
        start = state["step"] + 1
        if actor_opt and state["actor_opt"]:
            actor_opt.load_state_dict(state["actor_opt"])
        if extractor_opt and state["extractor_opt"]:
            extractor_opt.load_state_dict(state["extractor_opt"])
        run.generations = {g["id"]: crl.Generation(**g) for g in state["generations"]}
        run.gen_counter = state["gen_counter"]
    return run, start


def main(argv=None):
    args = parse_args(argv)
    local, device = setup_distributed()
    if args.device and crl.world() == 1:
        device = torch.device(args.device)
    rank, world = crl.rank(), crl.world()
    dtype = model_dtype(args, device)

    # the run directory: a new run must not overwrite another; --resume continues it with its saved flags
    if args.out is None:
        stamp = crl.gather_objects(time.strftime("%Y%m%d-%H%M%S"))[0]
        args.out = os.path.join("runs", f"{'+'.join(args.tasks)}-{args.mode}-{stamp}")
    ckpt = os.path.join(args.out, "ckpt")
    if args.resume:
        if not os.path.exists(os.path.join(ckpt, "state.pt")):
            sys.exit(f"error: --resume: no checkpoint in {ckpt}; run without --resume to start a new run")
        saved = json.load(open(os.path.join(args.out, "args.json")))
        for k, v in saved.items():
            if k not in ("iters", "resume", "out", "device"):
                setattr(args, k, v)
    elif crl.gather_objects(os.path.exists(os.path.join(args.out, "args.json")))[0]:
        # rank 0's answer for every rank (collected before rank 0 writes args.json below): no race under DDP
        sys.exit(f"error: {args.out} already holds a run; pass --resume to continue it, or choose another --out")
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        if not args.resume:
            json.dump(vars(args), open(os.path.join(args.out, "args.json"), "w"), indent=1)

    run, start = build(args, device, dtype)
    if args.resume and rank == 0:   # drop log lines of iterations after the checkpoint, then append from there
        lines = open(os.path.join(args.out, "metrics.jsonl")).read().splitlines()
        kept = [line for line in lines if json.loads(line)["step"] < start]
        open(os.path.join(args.out, "metrics.jsonl"), "w").write("".join(line + "\n" for line in kept))

    log = open(os.path.join(args.out, "metrics.jsonl"), "a") if rank == 0 else None
    save_every = args.save_every or args.eval_every
    bar = range(start, args.iters)
    if rank == 0:
        bar = tqdm(bar, initial=start, total=args.iters, desc=f"{args.mode} {','.join(args.tasks)}", unit="it")
    for step in bar:
        t0 = time.perf_counter()
        metrics = crl.train_step(run, step)
        metrics["time/iteration"] = time.perf_counter() - t0
        last = step == args.iters - 1
        if args.eval_every and (step % args.eval_every == 0 or last):
            t1 = time.perf_counter()
            metrics.update(crl.evaluate(run, args.tasks, args.eval_episodes))
            metrics["time/eval"] = time.perf_counter() - t1
        for k in ("actor/skipped", "extractor/skipped"):
            if metrics.get(k):
                warnings.warn(f"step {step}: {k} (non-finite loss); counted in metrics.jsonl")
        if rank == 0:
            log.write(json.dumps(metrics) + "\n")
            log.flush()
            draw_curve(args.out)
            bar.set_postfix({k.split("/", 1)[1]: f"{v:.2f}" for k, v in metrics.items()
                             if k.startswith("train/") and isinstance(v, float)})
        if (step + 1) % save_every == 0 or last:
            if rank == 0:
                save_checkpoint(run, args.out, step, args)
            if world > 1:
                dist.barrier()
    if run.manager is not None:
        run.manager.close()
    if rank == 0:
        print(f"done: {args.out}/metrics.jsonl, {args.out}/curve.png, checkpoint in {ckpt}")
    if world > 1:
        dist.barrier()  # leave together: gloo can abort a rank whose peer is still finishing its last write
        dist.destroy_process_group()
    return run


def draw_curve(out: str):
    """Success vs iteration per task, with and without experience: held-out evaluation (bold, markers) and
    training rollouts (thin, a moving average over 5 iterations: one iteration's groups are few and noisy)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
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


if __name__ == "__main__":
    main()
