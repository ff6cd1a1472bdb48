"""Can CISPO teach the extractor to name the door that opened, apart from the actor? Run:
python -m probes.cispo_vault --out results/cispo-vault/NAME [--steps 50] [--p-won 1] [--p-right 1 --p-wrong 0]
    [--p-door northeast=0.49]
    [train.py flags: --extractor-lr 1e-4 ...]
python -m probes.cispo_vault --plot results/cispo-vault      (every arm's curve: FOLDER/curve.png)

Each step: `batch` fresh vaults (new seeds every step, so no vault's name can be memorised), each a scripted
with-experience episode shown one random door as its lesson, won with probability p_won (0-2 locked doors, then the
one that opens; else three locked doors). crl.distill writes a lesson for each (the run's prompt, grammar and
sampler, recorded as generations); a scripted follower plays each lesson `uses` times (the with-experience half of
a group shares one lesson), winning with probability p_right when the lesson names the vault's door, else p_wrong;
crl.credit_generations credits those outcomes and crl.extractor_update takes its CISPO step. Nothing else of a
run: no actor, no bank, no merge.
Every `eval_every` steps, on `eval_vaults` held-out won vaults each shown a wrong door: the extractor's exact
constrained policy over its completions (ADD or UPDATE 1, each door; NONE unless --extractor-none never): P(its
lesson names the door that opened), chance 1/8, P(it names the door it was shown: a copier), the mass on NONE, and
the top door's mean mass (a collapse onto one door, which earns 1/8 on fresh vaults). `--steps 0` with `--extractor
RUN/ckpt/extractor` (and the run's extractor flags) reads a trained run's extractor. Writes OUT/curve.jsonl (the
evaluations) and OUT/steps.jsonl (each step: its lessons' share right, reward, timings).
"""
import argparse
import json
import time
from pathlib import Path

import numpy as np

import crl
import envs
import train
from probes import policy
from probes.vault_controls import scripted_episode

DOORS = envs.Vault.actions


def secret(seed: int) -> str:
    env = envs.make("vault")
    env.reset(seed=seed)
    return env.secret


def follow(run, ops: list, secrets: dict, p_right: float, p_wrong: float, uses: int, rng, p_door=None) -> float:
    """The follower plays each lesson `uses` times; crl credits the outcomes. Returns the share of right lessons.
    `p_door`: {door: success with a wrong lesson naming it} (a door the actor favours anyway costs it nothing)."""
    eps = []
    for op in ops:
        text = op.text.strip().lower()
        p = p_right if text == secrets[op.origin] else (p_door or {}).get(text, p_wrong)
        for _ in range(uses):
            won = bool(rng.random() < p)
            eps.append(crl.Episode("vault", op.origin, 0, True, sources=[op.source], reward=float(won), success=won))
    crl.credit_generations(run, eps)
    return sum(op.text.strip().lower() == secrets[op.origin] for op in ops) / max(1, len(ops))


def held_out(n: int) -> list[crl.Episode]:
    """n held-out won vaults, each shown a wrong door (copying the lesson never names the door that opened)."""
    rng = np.random.default_rng(12345)
    eps = []
    for j in range(n):
        shown = [d for d in DOORS if d != secret(crl.EVAL_SEED0 + j)][int(rng.integers(len(DOORS) - 1))]
        eps.append(scripted_episode(crl.EVAL_SEED0 + j, True, shown, rng))
    return eps


def evaluate(run, eps: list[crl.Episode]) -> dict:
    """P(the lesson names the door that opened) and the top door's mass, under the exact constrained policy."""
    completions = tuple(f"{head} {d}" for head in ("ADD:", "UPDATE 1:") for d in DOORS)
    completions += ("NONE",) if run.cfg.extractor_none != "never" else ()
    right, shown, marginal, none = [], [], np.zeros(len(DOORS)), 0.0
    for e in eps:
        p = policy(run.extractor, run.extractor_tok, crl.extractor_prompt(run, e), completions).float().numpy()
        by_door = p[:len(DOORS)] + p[len(DOORS):2 * len(DOORS)]
        right.append(by_door[DOORS.index(e.transcript[-2][1])])
        shown.append(by_door[DOORS.index(e.lessons[0])])
        marginal += by_door / len(eps)
        none += p[2 * len(DOORS):].sum() / len(eps)
    return {"p_opened": float(np.mean(right)), "p_shown": float(np.mean(shown)),
            "top_door": DOORS[int(marginal.argmax())],
            "top_door_mass": float(marginal.max()), "none": float(none)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", help="folder for curve.jsonl and steps.jsonl")
    p.add_argument("--plot", help="draw the curves of every arm in this folder into FOLDER/curve.png, and stop")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=16, help="fresh vault episodes distilled a step")
    p.add_argument("--p-won", type=float, default=1.0, help="share of the episodes won")
    p.add_argument("--p-right", type=float, default=1.0, help="the follower's success with the vault's door")
    p.add_argument("--p-wrong", type=float, default=0.0, help="... and with another door")
    p.add_argument("--p-door", default="", help="DOOR=P: the follower's success with a wrong lesson naming DOOR "
                                                  "(e.g. northeast=0.49: the door the actor plays anyway)")
    p.add_argument("--uses", type=int, default=4, help="follower episodes a lesson")
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--eval-vaults", type=int, default=32)
    mine, rest = p.parse_known_args(argv)
    if mine.plot or not mine.out:
        return plot(Path(mine.plot)) if mine.plot else p.error("--out or --plot is needed")
    args = train.parse_args(["--actor", "smollm2", "--extractor", "smollm2", *rest, "--tasks", "vault",
                             "--mode", "exp-only", "--extractor-batch", str(mine.batch)])
    device = train.setup_distributed(args)
    run, _ = train.build(args, device, train.model_dtype(args, device))
    out = Path(mine.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "args.json").write_text(json.dumps({"probe": vars(mine), "flags": rest}, indent=1))
    tests = held_out(mine.eval_vaults)
    with open(out / "curve.jsonl", "w") as curve, open(out / "steps.jsonl", "w") as steps:
        for step in range(mine.steps + 1):
            if step % mine.eval_every == 0:
                point = {"step": step, **evaluate(run, tests)}
                curve.write(json.dumps(point) + "\n")
                curve.flush()
                print(json.dumps(point), flush=True)
            if step == mine.steps:
                break
            t0 = time.perf_counter()
            run.timer = {"extractor": 0.0, "extractor_update": 0.0}
            run.counters = {"parse_failures": 0, "operations": 0}
            rng = np.random.default_rng([run.seed, step, 99])
            seeds = [int(s) for s in rng.integers(crl.EVAL_SEED0, size=mine.batch)]
            eps = [scripted_episode(s, bool(rng.random() < mine.p_won), DOORS[int(rng.integers(8))], rng)
                   for s in seeds]
            secrets = {s: secret(s) for s in seeds}
            gen_rng = crl.seeded_generator(device, run.seed, step, 0, crl.EXTRACTOR_SAMPLING)
            ops = crl.distill(run, eps, step, gen_rng)
            p_door = {d: float(x) for d, _, x in (part.partition("=") for part in mine.p_door.split(",") if part)}
            right = follow(run, ops, secrets, mine.p_right, mine.p_wrong, mine.uses, rng, p_door)
            stats = crl.extractor_update(run)
            line = {"step": step, "lessons_right": right, "lessons": len(ops), **run.counters,
                    "reward": stats.get("reward"), "cispo": bool(stats), "seconds": time.perf_counter() - t0,
                    **{f"time/{k}": v for k, v in run.timer.items()}}
            steps.write(json.dumps(line) + "\n")
            steps.flush()
    run.manager.close()


def plot(folder: Path):
    """Each arm's P(the lesson names the opened door) (solid) and its top door's mass (dotted), by CISPO step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, arm in enumerate(sorted(d for d in folder.iterdir() if (d / "curve.jsonl").is_file())):
        rows = [json.loads(line) for line in open(arm / "curve.jsonl")]
        steps = [r["step"] for r in rows]
        line, = ax.plot(steps, [r["p_opened"] for r in rows], label=arm.name, color=f"C{i}")
        ax.plot(steps, [r["top_door_mass"] for r in rows], ":", color=line.get_color())
    ax.axhline(1 / 8, color="grey", lw=0.8)
    ax.set(xlabel="CISPO step (16 fresh vaults each)", ylim=(0, 1.02),
           ylabel="P(lesson names the opened door)\n(dotted: top door's mass)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(folder / "curve.png", dpi=110)
    print(f"wrote {folder / 'curve.png'}")


if __name__ == "__main__":
    main()
