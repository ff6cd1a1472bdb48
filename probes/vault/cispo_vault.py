"""Can CISPO teach the extractor to name the door that opened, apart from the actor? Run:
python -m probes.vault.cispo_vault --out results/cispo-vault/NAME [--steps 50] [--p-won 1] [--p-right 1 --p-wrong 0]
    [--p-door northeast=0.49]
    [train.py flags: --extractor-lr 1e-4 ...]
python -m probes.vault.cispo_vault --plot results/cispo-vault      (every arm's curve: FOLDER/curve.png)

Each step: `batch` fresh vaults (new seeds every step, so no vault's name can be memorised), each a scripted
with-experience episode shown one random door as its lesson, won with probability p_won (0-2 locked doors, then the
one that opens; else three locked doors). crl.distill writes a lesson for each (the run's prompt, grammar and
sampler, recorded as generations); a scripted follower plays each lesson `uses` times (the with-experience half of
a group shares one lesson), winning with probability p_right when the lesson names the vault's door, else p_wrong;
crl.credit_generations credits those outcomes and crl.extractor_update takes its CISPO step. Nothing else of a
run: no actor, no bank, no merge. With --p-follow the lessons after a loss are played as a trained actor would
play them (`habit_wins`), and with
--p-again each vault is also played without its lesson, so that --credit lift has its baseline.
Every `eval_every` steps, on `eval_vaults` held-out won vaults each shown a wrong door: the extractor's exact
constrained policy over its completions (ADD or UPDATE 1, each lesson of its grammar; NONE with --extractor-none
always): P(its lesson names the door that opened), chance 1/8, P(it names the door it was shown: a copier), the
mass on NONE, and the top lesson's mean mass (a collapse onto one door, which earns 1/8 on fresh vaults) (not
with --p-won 0); with --p-follow, on as many held-out lost vaults, `evaluate_lost`. With --reveal the vaults are
played as under --vault-reveal by an actor that follows its lesson (`revealed_episode`): a lost one ends naming its
door, a lesson after a loss is right when it names that door, and the evaluation adds P(the revealed door) on as
many held-out lost vaults, each shown a wrong door (`p_revealed`, with the top lesson's mass there). `--steps 0`
with `--extractor RUN/ckpt/extractor` (and the run's extractor flags) reads a trained run's extractor. Writes
OUT/curve.jsonl (the evaluations) and OUT/steps.jsonl (each step: its lessons' share right, reward, timings).
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
from probes.vault.vault_controls import doors_left, moves, scripted_episode
from small import grammar

DOORS = envs.Vault.actions


def secret(seed: int) -> str:
    env = envs.make("vault")
    env.reset(seed=seed)
    return env.secret


def follow(run, ops: list, secrets: dict, p_right: float, p_wrong: float, uses: int, rng, p_door=None,
           lost=None, p_follow: float = 1.0, p_again: float | None = None, p_alone: float | None = None) -> float:
    """The follower plays each lesson `uses` times; crl credits the outcomes. Returns the share of right lessons.
    `p_door`: {door: success with a wrong lesson naming it} (a door the actor favours anyway costs it nothing).
    `lost`: {vault: the doors its play tried} for the lost plays, whose lessons the trained actor follows instead
    (`habit_wins`, with probability p_follow; right: a lesson naming only doors the play left untried).
    `p_again`: each lesson's vault is also played `uses` times without it, as a group's other half is (what
    --credit lift measures a lesson against): won p_again, the trained actor's win-again rate, if the play won,
    else never (it replays its loss); `p_alone` instead: won with this probability whatever the play did (a
    frozen actor that samples)."""
    lost, eps, right = lost or {}, [], 0
    for i, op in enumerate(ops):
        text = op.text.strip().lower()
        if op.origin in lost:
            p = p_follow * habit_wins(lost[op.origin], text, secrets[op.origin])
            right += clean(lost[op.origin], text)
        else:
            p = p_right if text == secrets[op.origin] else (p_door or {}).get(text, p_wrong)
            right += text == secrets[op.origin]
        for _ in range(uses):
            won = bool(rng.random() < p)
            eps.append(crl.Episode("vault", op.origin, i, True, sources=[op.source], reward=float(won), success=won))
        for _ in range(uses if p_again is not None or p_alone is not None else 0):
            won = (bool(rng.random() < p_alone) if p_alone is not None
                   else op.origin not in lost and bool(rng.random() < p_again))
            eps.append(crl.Episode("vault", op.origin, i, False, reward=float(won), success=won))
    crl.credit_generations(run, eps)
    return right / max(1, len(ops))


def habit_wins(tried: list[str], lesson: str, secret: str) -> bool:
    """A trained actor on a vault it lost, told `lesson`: it opens with the door it opened with before, then takes
    the lesson's doors in their order, then its old order again; it wins if the vault's door comes within its 3
    tries (results/vault-clean/controls: the crl actor, told the doors left, wins 0.29 of the vaults it lost)."""
    order = list(dict.fromkeys([tried[0], *(d for d in lesson.split(", ") if d in DOORS), *tried[1:]]))
    return secret in order[:3]


def clean(tried: list[str], lesson: str) -> bool:
    """A lesson after a loss that names doors, none of them one the play tried."""
    named = lesson.split(", ")
    return all(d in DOORS for d in named) and not set(named) & set(tried)


def held_out(n: int, won: bool = True) -> list[crl.Episode]:
    """n held-out vaults, won (or lost: other vaults), each shown a wrong door (copying the lesson never names the
    door that opened)."""
    rng = np.random.default_rng(12345 if won else 54321)
    eps = []
    for j in range(n) if won else range(n, 2 * n):
        shown = [d for d in DOORS if d != secret(crl.EVAL_SEED0 + j)][int(rng.integers(len(DOORS) - 1))]
        eps.append(scripted_episode(crl.EVAL_SEED0 + j, won, shown, rng))
    return eps


def revealed_episode(seed: int, shown: str, p_won: float, rng) -> crl.Episode:
    """A vault played under --vault-reveal by an actor that follows its lesson (the lesson prior's): the shown door
    first; if it is locked, the vault's door within the next two tries with probability p_won (else two more locked
    doors, and the last observation names the door)."""
    env, e = envs.make("vault", reveal=True), crl.Episode("vault", seed, 0, True)
    obs = env.reset(seed=seed)
    e.instruction, e.query = env.instruction, crl.retrieval_query(env, obs)
    e.lessons, e.retrieved, e.sources = [shown], [0], [-1]
    e.transcript.append(("environment", obs))
    wrong = [d for d in rng.permutation(DOORS) if d not in (env.secret, shown)]
    order = [shown] + (wrong[:2] if shown == env.secret or rng.random() >= p_won
                       else [wrong[0], env.secret] if rng.random() < 0.5 else [env.secret])
    for door in order:
        obs, e.reward, done, info = env.step(str(door))
        e.transcript += [("agent", str(door)), ("environment", obs)]
        if done:
            break
    e.success = info["success"]
    return e


def held_out_revealed(n: int) -> list[crl.Episode]:
    """n held-out vaults (after held_out's won and lost ones) lost under the reveal, each shown a wrong door."""
    rng = np.random.default_rng(777)
    eps = []
    for j in range(2 * n, 3 * n):
        shown = [d for d in DOORS if d != secret(crl.EVAL_SEED0 + j)][int(rng.integers(len(DOORS) - 1))]
        eps.append(revealed_episode(crl.EVAL_SEED0 + j, shown, 0.0, rng))
    return eps


def evaluate_revealed(run, eps: list[crl.Episode]) -> dict:
    """On lost vaults under the reveal: P(the lesson names the revealed door), P(the door shown), the top lesson's
    mass."""
    right, shown, marginal = [], [], 0.0
    for e in eps:
        lessons, p, _ = lesson_policy(run, e, grammar.may_answer_none(run.cfg, won=False))
        right.append(p[lessons.index(secret(e.seed))])
        shown.append(p[lessons.index(e.lessons[0])])
        marginal = marginal + p / len(eps)
    return {"p_revealed": float(np.mean(right)), "p_shown_lost": float(np.mean(shown)),
            "top_door_lost": lessons[int(marginal.argmax())], "top_door_mass_lost": float(marginal.max())}


def lesson_policy(run, e: crl.Episode, none: bool) -> tuple[tuple, np.ndarray, float]:
    """The extractor's exact constrained policy on episode e: each lesson of its grammar (one door) with its
    probability, ADD and UPDATE 1 summed, and the mass on NONE."""
    lessons = DOORS
    heads = ("ADD:", "UPDATE 1:")
    completions = tuple(f"{head} {x}" for head in heads for x in lessons) + (("NONE",) if none else ())
    p = policy(run.extractor, run.extractor_tok, crl.extractor_prompt(run, e), completions).float().numpy()
    n = len(heads) * len(lessons)
    return lessons, p[:n].reshape(len(heads), -1).sum(0), float(p[n:].sum())


def evaluate(run, eps: list[crl.Episode]) -> dict:
    """On won vaults: P(the lesson names the door that opened) and the top lesson's mass, under the exact
    constrained policy."""
    none = grammar.may_answer_none(run.cfg, won=True)
    right, shown, marginal, mass_none = [], [], 0.0, 0.0
    for e in eps:
        lessons, p, p_none = lesson_policy(run, e, none)
        right.append(p[lessons.index(e.transcript[-2][1])])
        shown.append(p[lessons.index(e.lessons[0])])
        marginal, mass_none = marginal + p / len(eps), mass_none + p_none / len(eps)
    return {"p_opened": float(np.mean(right)), "p_shown": float(np.mean(shown)),
            "top_door": lessons[int(marginal.argmax())],
            "top_door_mass": float(marginal.max()), "none": float(mass_none)}


def evaluate_lost(run, eps: list[crl.Episode], p_follow: float) -> dict:
    """On lost vaults: P(a clean lesson: doors the play left untried), P(exactly the doors left), P(NONE), the
    doors a lesson names (mean), and the trained actor's success told it (`habit_wins` x p_follow)."""
    none = grammar.may_answer_none(run.cfg, won=False)
    out = {"lost_clean": 0.0, "lost_doors_left": 0.0, "lost_none": 0.0, "lost_doors": 0.0, "lost_follower": 0.0}
    for e in eps:
        lessons, p, p_none = lesson_policy(run, e, none)
        tried = moves(e)
        left = ", ".join(doors_left(tried))
        out["lost_clean"] += sum(q for x, q in zip(lessons, p) if clean(tried, x)) / len(eps)
        out["lost_doors_left"] += p[lessons.index(left)] / len(eps) if left in lessons else 0.0
        out["lost_none"] += p_none / len(eps)
        out["lost_doors"] += sum(q * len(x.split(", ")) for x, q in zip(lessons, p)) / max(1e-9, p.sum()) / len(eps)
        out["lost_follower"] += p_follow * sum(q for x, q in zip(lessons, p)
                                               if habit_wins(tried, x, secret(e.seed))) / len(eps)
    return {k: float(v) for k, v in out.items()}


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
    p.add_argument("--p-follow", type=float, default=None,
                   help="the lessons after a loss are played by a trained actor (habit_wins), which follows one "
                        "with this probability (0.73: the crl actor's 0.29 with the doors left, against 0.4 by "
                        "the rule); else they are played like the lessons after a win")
    p.add_argument("--p-again", type=float, default=None,
                   help="each vault is also played without its lesson (for --credit lift): a won vault is won "
                        "again with this probability (0.99: the trained actors' rate), a lost one never")
    p.add_argument("--p-alone", type=float, default=None,
                   help="each vault is also played without its lesson (for --credit lift), won with this "
                        "probability whatever the play did (a frozen actor that samples: 0.3)")
    p.add_argument("--reveal", action="store_true",
                   help="the vaults are played under --vault-reveal by an actor that follows its lesson and then "
                        "searches (revealed_episode); --p-won is then its success after a wrong lesson (0.25)")
    p.add_argument("--recur", type=int, default=0,
                   help="each vault recurs in this many consecutive steps (staggered), and from its second visit "
                        "on it is shown the lesson the extractor wrote at its last visit, as the bank shows it "
                        "(0: fresh vaults every step, each shown a random door)")
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
    lost_tests = held_out(mine.eval_vaults, won=False) if mine.p_follow is not None else []
    revealed_tests = held_out_revealed(mine.eval_vaults) if mine.reveal else []
    own = {}   # with --recur: vault seed -> the door its last lesson named
    with open(out / "curve.jsonl", "w") as curve, open(out / "steps.jsonl", "w") as steps:
        for step in range(mine.steps + 1):
            if step % mine.eval_every == 0:
                point = {"step": step, **(evaluate(run, tests) if mine.p_won > 0 else {}),
                         **(evaluate_lost(run, lost_tests, mine.p_follow) if lost_tests else {}),
                         **(evaluate_revealed(run, revealed_tests) if revealed_tests else {})}
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
            if mine.recur:   # slot i's vault changes every `recur` steps, staggered, as --instance-visits plays them
                seeds = [int(np.random.default_rng([run.seed, i, (step + i) // mine.recur, 98]).integers(
                    crl.EVAL_SEED0)) for i in range(mine.batch)]

            def shown(s):   # drawn where the arms before --recur drew it, so they replay
                return own.get(s) or DOORS[int(rng.integers(8))]
            eps = [revealed_episode(s, shown(s), mine.p_won, rng) if mine.reveal else
                   scripted_episode(s, bool(rng.random() < mine.p_won), shown(s), rng) for s in seeds]
            secrets = {s: secret(s) for s in seeds}
            gen_rng = crl.seeded_generator(device, run.seed, step, 0, crl.EXTRACTOR_SAMPLING)
            ops = crl.distill(run, eps, step, gen_rng)
            if mine.recur:   # the vault's next visit is shown the lesson written now, as the bank would show it
                own.update({op.origin: op.text.strip().lower() for op in ops if op.text.strip().lower() in DOORS})
            p_door = {d: float(x) for d, _, x in (part.partition("=") for part in mine.p_door.split(",") if part)}
            lost = {e.seed: moves(e) for e in eps if not e.success} if mine.p_follow is not None else {}
            right = follow(run, ops, secrets, mine.p_right, mine.p_wrong, mine.uses, rng, p_door, lost,
                           mine.p_follow or 0.0, mine.p_again, mine.p_alone)
            stats = crl.extractor_update(run)
            line = {"step": step, "lessons_right": right, "lessons": len(ops), **run.counters,
                    "reward": stats.get("reward"), "cispo": bool(stats), "seconds": time.perf_counter() - t0,
                    **{f"time/{k}": v for k, v in run.timer.items()}}
            steps.write(json.dumps(line) + "\n")
            steps.flush()
    run.manager.close()


def plot(folder: Path):
    """Each arm's P(the lesson names the opened door) (solid) and its top lesson's mass (dotted), by CISPO step;
    beside them, where an arm read lost vaults (--p-follow), P(a clean lesson) (solid) and the trained actor's
    success told it (dashed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    arms = sorted(d for d in folder.iterdir() if (d / "curve.jsonl").is_file())
    curves = {arm.name: [json.loads(line) for line in open(arm / "curve.jsonl")] for arm in arms}
    lost = any("lost_clean" in rows[0] for rows in curves.values())
    fig, axes = plt.subplots(1, 1 + lost, figsize=(8 + 5 * lost, 4.5), squeeze=False)
    ax, ax_lost = axes[0][0], axes[0][-1]
    for i, (name, rows) in enumerate(curves.items()):
        steps = [r["step"] for r in rows]
        if "p_opened" in rows[0]:
            ax.plot(steps, [r["p_opened"] for r in rows], label=name, color=f"C{i}")
            ax.plot(steps, [r["top_door_mass"] for r in rows], ":", color=f"C{i}")
        if lost and "lost_clean" in rows[0]:
            ax_lost.plot(steps, [r["lost_clean"] for r in rows], label=name, color=f"C{i}")
            ax_lost.plot(steps, [r["lost_follower"] for r in rows], "--", color=f"C{i}")
    ax.axhline(1 / 8, color="grey", lw=0.8)
    ax.set(xlabel="probe step (16 fresh vaults each; a CISPO step once 16 are credited)", ylim=(0, 1.02),
           ylabel="won vaults: P(lesson names the opened door)\n(dotted: top lesson's mass)")
    ax.legend(fontsize=7, ncol=2)
    if lost:
        ax_lost.set(xlabel="probe step (16 fresh vaults each; a CISPO step once 16 are credited)", ylim=(0, 1.02),
                    ylabel="lost vaults: P(lesson names only untried doors)\n(dashed: the trained actor's success)")
        ax_lost.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "curve.png", dpi=110)
    print(f"wrote {folder / 'curve.png'}")


if __name__ == "__main__":
    main()
