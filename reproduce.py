"""Reproduce the paper's comparison: `python reproduce.py` (room by default, `--tasks` for others).

Runs the grid modes × seeds × tasks through train.py's own code path with identical budgets, one training
process at a time, and writes into --results (default runs/reproduce; the committed record is results/)
    RESULTS/TASK/MODE-seedK/            the run (metrics.jsonl, curve.png, ckpt/, final.json)
    RESULTS/TASK.md, RESULTS/TASK.png   the paper-style table and the held-out curves (mean with a band)
    RESULTS/TASK-lessons.png            where runs log it (the vault), the lessons naming the door, per seed
The grid is resumable: a run with final.json is skipped (one damaged is noted and the run goes on), a run with a
checkpoint resumes from it, so the grid accumulates across sittings. `--table` only redraws the table and
picture from what is there.

Once a cell is finished the grid compacts it into the committed record's form (`compact`; `--compact DIR` does so
to every finished cell under DIR): its logs metrics.jsonl and bank.jsonl kept as NAME.xz, which every reader opens
through rundir.read_lines, and its curve.png removed (`--draw RUN` draws it again; probes.lessons RUN, lessons.png).

Modes: the paper's four (`crl`, `grpo`, `static`, `exp-only`), `no-split`, the split-advantage ablation
(`crl` with one advantage group over all G rollouts), and `oracle` (`static` with the vault's scripted extractor,
whose every lesson is right: the ceiling of what lessons can give this actor). The table gives the final
held-out success with and without experience (mean and 95% interval over seeds, Student t), the paired
with-minus-without difference, each mode's difference from GRPO paired by seed, and the extractor's mean reward
early vs late in training (finished runs); with attempts, each run's own with - without contrast at the last, and
CRL's difference from static there; where the extractor trains, each run's CISPO steps by iteration 60 and its
lessons right by block of 30 iterations.
"""
import argparse
import collections
import json
import lzma
import math
import os
import shutil
import subprocess
import sys
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from itertools import combinations, islice

import rundir
from rundir import log_exists, read_lines

MODES = ("crl", "grpo", "static", "exp-only", "no-split", "oracle")
# every other mode is `--mode MODE`; they follow the grid's own flags (oracle's --extractor overrides the grid's)
MODE_FLAGS = {"no-split": ["--mode", "crl", "--no-split"], "oracle": ["--mode", "static", "--extractor", "oracle"]}
NAMES = {"crl": "CRL", "grpo": "GRPO"}   # as the paper writes them in the tables
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042]   # Student t 97.5% quantiles for 1..30 degrees of freedom; 1.96 beyond


# ---------------------------------------------------------------------------------------------------------
# statistics

def mean_ci(xs: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% interval (Student t over len(xs) - 1 degrees of freedom; nan
    half-width for a single value)."""
    n = len(xs)
    m = sum(xs) / n
    if n < 2:
        return m, math.nan
    return m, half_width(math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1)), n)


def half_width(sd: float, n: int) -> float:
    """The 95% interval's half-width of a mean of n values with standard deviation sd (Student t)."""
    return (T975[n - 2] if n - 2 < len(T975) else 1.96) * sd / math.sqrt(n)


def fmt(m: float, h: float) -> str:
    return f"{m:.3f}" if math.isnan(h) else f"{m:.3f} ± {h:.3f}"


def rank_p(a: list[float], b: list[float]) -> float:
    """The exact two-sided p of the Mann-Whitney rank test: the share of all the ways to split the pooled values
    into groups of len(a) and len(b) whose rank sum (mid-ranks for ties) is at least as far from its mean as a's.
    It asks whether one mode's seeds rank above the other's, and holds where a mean does not (bimodal seeds)."""
    pooled = sorted(a + b)
    rank = {x: pooled.index(x) + (pooled.count(x) + 1) / 2 for x in pooled}
    ranks, mean = [rank[x] for x in a + b], len(a) * (len(pooled) + 1) / 2
    far = abs(sum(ranks[:len(a)]) - mean) - 1e-9
    splits = list(combinations(ranks, len(a)))
    return sum(abs(sum(c) - mean) >= far for c in splits) / len(splits)


def paired(a: dict, b: dict) -> list[float]:
    """a[seed] - b[seed] over the seeds both have."""
    return [a[s] - b[s] for s in sorted(set(a) & set(b))]


# ---------------------------------------------------------------------------------------------------------
# reading a results folder

def run_dir(results: str, task: str, mode: str, seed: int) -> str:
    return os.path.join(results, task, f"{mode}-seed{seed}")


NOTED = set()   # damaged final.json files already noted: the table and the picture each read every cell


def read_final(out: str, task: str) -> dict | None:
    """OUT/final.json, which marks a cell finished, or None while the cell is unfinished. train.py writes it
    whole, so one that does not parse or lacks the held-out success was damaged afterwards (a copy cut short, a
    full disk, an edit): it counts as unfinished, with a note, and the grid runs the cell again (from its last
    checkpoint: only the final evaluation) instead of skipping it and failing to read it."""
    path, key = os.path.join(out, "final.json"), f"eval/{task}/success_noexp"
    if not os.path.exists(path):
        return None
    try:
        final = json.load(open(path))
        if isinstance(final, dict) and isinstance(final.get(key), (int, float)):
            return final
        why = f"no {key}"
    except (ValueError, UnicodeDecodeError) as err:
        why = f"{type(err).__name__}: {err}"
    if path not in NOTED:
        NOTED.add(path)
        print(f"note: {path} is damaged ({why}); the cell counts as unfinished and the grid runs it again",
              file=sys.stderr, flush=True)
    return None


def read_runs(results: str, task: str) -> dict:
    """{mode: {seed: {"final": final.json or None, "rows": metrics.jsonl rows}}} for every run folder."""
    runs = {}
    folder = os.path.join(results, task)
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        mode, _, seed = name.rpartition("-seed")
        if mode not in MODES or not seed.isdigit():
            continue
        path = os.path.join(folder, name)
        metrics = os.path.join(path, "metrics.jsonl")
        runs.setdefault(mode, {})[int(seed)] = {
            "final": read_final(path, task),
            "rows": [json.loads(line) for line in read_lines(metrics)] if log_exists(metrics) else []}
    return runs


def finals(runs: dict, mode: str, task: str, kind: str, attempt: int = 0) -> dict:
    """{seed: final held-out success} for kind 'exp' or 'noexp' (at `attempt` of the attempts evaluation, if
    given), finished runs only."""
    return final_values(runs, mode, f"attempts/{task}/success_{kind}_{attempt}" if attempt
                        else f"eval/{task}/success_{kind}")


def final_values(runs: dict, mode: str, key: str) -> dict:
    """{seed: final.json's `key`} over a mode's finished runs that have it."""
    return {s: r["final"][key] for s, r in runs.get(mode, {}).items() if r["final"] and key in r["final"]}


def last_attempt(runs: dict, task: str) -> int:
    """How many attempts the grid's attempts evaluation played (0: none)."""
    keys = [k for m in runs.values() for r in m.values() if r["final"] for k in r["final"]]
    return max([int(k.rsplit("_", 1)[1]) for k in keys if k.startswith(f"attempts/{task}/success_")], default=0)


def thirds(rows: list[dict], key: str) -> list[float] | None:
    """The mean of a metric over the first, the middle and the last third of the iterations that logged it (the
    extractor's reward: its CISPO steps; the vault's lessons right: the iterations that distilled); the first and
    last thirds are equal in size, the middle takes the remainder."""
    values = [r[key] for r in rows if key in r]
    if len(values) < 3:
        return None
    t = len(values) // 3
    return [sum(part) / len(part) for part in (values[:t], values[t:-t], values[-t:])]


# ---------------------------------------------------------------------------------------------------------
# the table and the picture

def table(results: str, task: str) -> str:
    """The paper-style markdown table of one task's grid."""
    runs = read_runs(results, task)
    lines = [f"### {task}", "",
             "| mode | seeds | eval w/ exp | eval w/o exp | w/ − w/o (paired) | extractor reward first → last third "
             "| lessons right (vault) first → last third | by chance first → last third "
             "| age of the lesson read (iterations) first → last third |",
             "|---|---|---|---|---|---|---|---|---|"]
    for mode in MODES:
        if mode not in runs:
            continue
        exp, noexp = finals(runs, mode, task, "exp"), finals(runs, mode, task, "noexp")
        cells = [fmt(*mean_ci(list(d.values()))) if d else "—" for d in (exp, noexp)]
        diff = paired(exp, noexp)
        trend = [first_to_last(runs[mode], key) for key in ("extractor/reward", "lessons/right_written",
                                                             "lessons/right_by_chance", "retrieval/age")]
        lines.append(f"| {mode} | {len(noexp)}/{len(runs[mode])} | {cells[0]} | {cells[1]} | "
                     f"{fmt(*mean_ci(diff)) if diff else '—'} | " + " | ".join(trend) + " |")
    lines.append("")
    lines += [line for mode in MODES if mode != "grpo" for line in versus(runs, task, mode)]
    lines += [line for mode in MODES if mode != "grpo" for line in versus(runs, task, mode, step=EARLY)]
    return "\n".join(lines + attempts_table(runs, task) + curves_table(runs, task) + extractor_races(runs, task)) + "\n"


EARLY = 50    # the early budget the modes are compared at, beside the end: the family vault was chosen as a task GRPO
              # does not solve in 50 iterations (results/family-smollm2), fixed before a held-out panel was read
REACH = 0.6   # the held-out success whose first evaluation curves_table counts: a level GRPO's training curve on the
              # family vault reached by ~150 iterations (results/family-smollm2), fixed before a held-out panel was read


def panels(runs: dict, task: str) -> list[str]:
    """The held-out panels the runs evaluated, as metric names hold them: the task's own (`eval/TASK/`) and any
    other (the family vault's control, `eval/TASK/control/`)."""
    keys = {k for m in runs.values() for r in m.values() if r["final"] for k in r["final"]}
    head, tail = f"eval/{task}/", "/success_noexp"
    return [f"{task}/"] + sorted({k[5:-len(tail) + 1] for k in keys if k.startswith(head) and k.endswith(tail)}
                                 - {f"{task}/"})


def by_step(run: dict, key: str) -> dict:
    """{iteration: `key`} over a run's metrics rows that logged it."""
    return {row["step"]: row[key] for row in run["rows"] if key in row}


def evaluations(runs: dict, mode: str, key: str) -> dict:
    """{seed: {iteration: `key`}} of every evaluation during training, finished runs only (each has them all)."""
    return {s: by_step(r, key) for s, r in runs.get(mode, {}).items() if r["final"]}


def at(curve: dict, step: int) -> dict:
    """{seed: value} at one evaluation, over the seeds of `evaluations` that have it."""
    return {s: by[step] for s, by in curve.items() if step in by}


WAYS = {"exp": "w/ exp", "noexp": "w/o exp"}


def curves_table(runs: dict, task: str) -> list[str]:
    """Where runs evaluate during training: per panel, each mode's held-out success at every evaluation with and
    without experience (mean over seeds, 95% interval) and the final evaluation's; each mode minus GRPO paired by
    seed at each; and the first evaluation at which each seed reaches REACH (how fast, not only how far)."""
    lines = []
    for panel in panels(runs, task):
        curves = {(mode, kind): evaluations(runs, mode, f"eval/{panel}success_{kind}")
                  for mode in MODES for kind in ("exp", "noexp")}
        curves = {k: v for k, v in curves.items() if any(v.values())}
        steps = sorted({i for c in curves.values() for seed in c.values() for i in seed})
        if len(steps) < 2:
            continue
        lines += ["", f"Held-out success on `{panel.rstrip('/')}` during training (each evaluation's "
                  "episodes; final: the final evaluation's), mean over finished seeds with its 95% interval:", "",
                  "| mode | eval | " + " | ".join(f"it {i}" for i in steps) + " | final |",
                  "|---|---|" + "---|" * (len(steps) + 1)]
        grpo = curves.get(("grpo", "noexp"), {})
        for (mode, kind), c in curves.items():
            final, way = final_values(runs, mode, f"eval/{panel}success_{kind}"), WAYS[kind]
            cells = [fmt(*mean_ci(list(at(c, i).values()))) if at(c, i) else "—" for i in steps]
            cells.append(fmt(*mean_ci(list(final.values()))) if final else "—")
            lines.append(f"| {mode} | {way} | {' | '.join(cells)} |")
            if mode != "grpo" and grpo:   # against GRPO without experience, as `versus`
                diffs = [paired(at(c, i), at(grpo, i)) for i in steps]
                diffs.append(paired(final, final_values(runs, "grpo", f"eval/{panel}success_noexp")))
                cells = [fmt(*mean_ci(d)) if d else "—" for d in diffs]
                lines.append(f"| {mode} − grpo | {way} | {' | '.join(cells)} |")
        lines.append("")
        for (mode, kind), c in curves.items() if panel == f"{task}/" else ():   # the control reaches no level
            first = [min((i for i, v in sorted(by.items()) if v >= REACH), default=None) for by in c.values()]
            got, when = [i for i in first if i is not None], ""
            if got:
                m, h = mean_ci(got)
                when = (f", iteration {m:.0f}" + ("" if math.isnan(h) else f" ± {h:.0f}") + " (by seed: "
                        + ", ".join("never" if i is None else str(i) for i in first) + ")")
            lines.append(f"{mode} {WAYS[kind]}: first evaluation at {REACH} or more in {len(got)}/{len(first)} "
                         f"seeds{when}.  ")
    return lines


def first_to_last(runs: dict, key: str) -> str:
    """A cell: the metric's first-third and last-third means over a mode's finished runs (95% intervals)."""
    pairs = [(x[0], x[-1]) for x in (thirds(r["rows"], key) for r in runs.values() if r["final"]) if x]
    if not pairs:
        return "—"
    return f"{fmt(*mean_ci([a for a, _ in pairs]))} → {fmt(*mean_ci([b for _, b in pairs]))}"


def attempts_table(runs: dict, task: str) -> list[str]:
    """Success at each attempt of the attempts evaluation (crl.evaluate_attempts), and each mode minus GRPO
    (CRL minus static too) at the last attempt, paired by seed."""
    k = last_attempt(runs, task)
    if not k:
        return []
    lines = ["", f"Each held-out instance played {k} times in rounds, the frozen extractor distilling each round "
             f"into a bank that starts empty (success at attempt 1 … {k}):", "",
             "| mode | eval | " + " | ".join(f"attempt {a}" for a in range(1, k + 1)) + " |",
             "|---|---|" + "---|" * k]

    def means(cells: list[dict], sep: str) -> str:   # each attempt's {seed: value}, as mean ± 95% interval
        return sep.join(fmt(*mean_ci(list(c.values()))) if c else "—" for c in cells)
    for mode in MODES:
        for kind, label in (("exp", "w/ exp"), ("noexp", "w/o exp")):
            cells = [finals(runs, mode, task, kind, a) for a in range(1, k + 1)]
            if any(cells):
                lines.append(f"| {mode} | {label} | {means(cells, ' | ')} |")
    lines.append("")
    for mode in MODES:   # what retrieval served in the evaluation: the lesson the attempt before wrote, if it wrote
        read = [final_values(runs, mode, f"attempts/previous_attempt_{a}") for a in range(2, k + 1)]
        wrote = [final_values(runs, mode, f"attempts/wrote_{a}") for a in range(1, k)]
        given = (f"; share of instances given a lesson (not NONE) after attempt 1 … {k - 1}: {means(wrote, ' / ')}"
                 if any(wrote) else "")
        if any(read):
            lines.append(f"{mode}: share of episodes that read the lesson the attempt before wrote, at attempt 2 … "
                         f"{k}: {means(read, ' / ')}{given}.  ")
    return (lines + own_contrasts(runs, task, k) + [line for mode in MODES if mode != "grpo"
                                                    for line in versus(runs, task, mode, k)]
            + versus(runs, task, "crl", k, "static"))


def own_contrasts(runs: dict, task: str, attempt: int) -> list[str]:
    """Each run's own contrast at `attempt`: with minus without experience on the same held-out instances, with
    its 95% interval over instances (metrics.paired_contrast), a line per mode."""
    lines = []
    for mode in MODES:
        cells = []
        for seed, r in sorted(runs.get(mode, {}).items()):
            f, key = r["final"] or {}, f"attempts/{task}/contrast"
            if f"{key}_{attempt}" in f:
                half = half_width(f[f"{key}_sd_{attempt}"], f[f"{key}_n_{attempt}"])
                cells.append(f"seed {seed} {f[f'{key}_{attempt}']:+.3f} ± {half:.3f}")
        if cells:
            lines.append(f"{mode}: each run's own with − without experience at attempt {attempt}, same instances "
                         f"(95% interval over instances): {', '.join(cells)}.  ")
    return [""] + lines if lines else []


def versus(runs: dict, task: str, mode: str, attempt: int = 0, base: str = "grpo",
           step: int | None = None) -> list[str]:
    """The mode's final success (with, then without experience) minus the base mode's, paired by seed (at
    `attempt` of the attempts evaluation, if given; at the evaluation during training at iteration `step`, if
    given): GRPO's success without experience, any other base's of the same kind as the mode's. Beside it, the
    rank test over the two modes' seeds (rank_p)."""
    lines, where = [], f", attempt {attempt}" if attempt else f", iteration {step}" if step is not None else ""

    def values(m: str, kind: str) -> dict:   # {seed: success} at the end (or the attempt), or at iteration `step`
        if step is None:
            return finals(runs, m, task, kind, attempt)
        return at(evaluations(runs, m, f"eval/{task}/success_{kind}"), step)

    for kind, label in (("exp", "with"), ("noexp", "without")):
        ours, theirs = values(mode, kind), values(base, "noexp" if base == "grpo" else kind)
        diff = paired(ours, theirs)
        if diff:
            m, h = mean_ci(diff)
            verdict = ("no interval from one seed" if math.isnan(h) else "the 95% interval is above zero" if m - h > 0
                       else "the 95% interval is below zero" if m + h < 0 else "the 95% interval contains zero")
            if min(len(ours), len(theirs)) > 1:
                least = 2 / math.comb(len(ours) + len(theirs), len(ours))   # every seed of one above the other's
                verdict += (f"; rank test p = {rank_p(list(ours.values()), list(theirs.values())):.3f} "
                            f"(exact, {len(ours)} v {len(theirs)} seeds, whose least p is {least:.3f})")
            lines.append(f"{NAMES.get(mode, mode)} (eval {label} experience{where}) − {NAMES.get(base, base)}, paired "
                         f"by seed: {fmt(m, h)} over {len(diff)} seed(s); {verdict}.  ")
    return lines


def extractor_races(runs: dict, task: str, size: int = 30, by: int = 60) -> list[str]:
    """For each mode whose extractor trains (CISPO steps logged), each finished run's CISPO steps by iteration
    `by` and its share of lessons written that are right (the vault) by block of `size` iterations."""
    lines = []
    for mode in MODES:
        cells = []
        for seed, r in sorted(runs.get(mode, {}).items()):
            if not r["final"] or not any("extractor/reward" in row for row in r["rows"]):
                continue
            steps = sum(1 for row in r["rows"] if "extractor/reward" in row and row["step"] < by)
            right = dict(zip(*blocks(r["rows"], "lessons/right_written", size)))
            shown = " / ".join(f"{right[b]:.2f}" if b in right else "—" for b in range(0, max(right, default=-1) + 1,
                                                                                    size))
            cells.append(f"seed {seed} {steps} steps" + (f", right {shown}" if right else ""))
        if cells:
            lines.append(f"{mode}: each run's CISPO steps by iteration {by} and lessons right by block of {size} "
                         f"iterations: {'; '.join(cells)}.  ")
    return [""] + lines if lines else []


def curve(results: str, task: str):
    """RESULTS/TASK.png: held-out success vs iteration per mode, mean over seeds with a 95% band."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = read_runs(results, task)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, kind, title in zip(axes, ("exp", "noexp"), ("eval with experience", "eval without experience")):
        for k, mode in enumerate(MODES):   # one colour per mode in both panels
            steps, means, halves = band(runs.get(mode, {}), f"eval/{task}/success_{kind}")
            if steps:
                ax.plot(steps, means, marker="o", ms=3, label=mode, color=f"C{k}")
                lo = [m - (0 if math.isnan(h) else h) for m, h in zip(means, halves)]
                hi = [m + (0 if math.isnan(h) else h) for m, h in zip(means, halves)]
                ax.fill_between(steps, lo, hi, color=f"C{k}", alpha=0.15)
        ax.set_title(f"{task}: {title}")
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
        if ax.lines:   # a grpo-only grid has nothing with experience
            ax.legend(fontsize=8)
    axes[0].set_ylabel("held-out success (mean over seeds, 95% band)")
    fig.tight_layout()
    fig.savefig(os.path.join(results, f"{task}.png"), dpi=100)
    plt.close(fig)


def lessons_curve(results: str, task: str, size: int = 10) -> bool:
    """RESULTS/TASK-lessons.png, where the runs log it (the vault): the share of lessons written that name the
    instance's own door, by block of `size` iterations, one line per seed and a panel per mode, so that an
    extractor that learns and one that collapses are told apart seed by seed. False where no run logs it."""
    runs = read_runs(results, task)
    modes = [m for m in MODES if any(blocks(r["rows"], "lessons/right_written", size)[0]
                                     for r in runs.get(m, {}).values())]
    if not modes:
        return False
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(modes), figsize=(4.5 * len(modes), 3.6), sharey=True, squeeze=False)
    for ax, mode in zip(axes[0], modes):
        for seed, run in sorted(runs[mode].items()):
            starts, means = blocks(run["rows"], "lessons/right_written", size)
            ax.plot(starts, means, marker="o", ms=2, label=f"seed {seed}", color=f"C{seed}")
        ax.set_title(mode)
        ax.set_xlabel(f"iteration (mean over blocks of {size})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("share of lessons written that are right")
    fig.suptitle(f"{task}: lessons naming the door")
    fig.tight_layout()
    fig.savefig(os.path.join(results, f"{task}-lessons.png"), dpi=100)
    plt.close(fig)
    return True


def blocks(rows: list[dict], key: str, size: int) -> tuple[list, list]:
    """A metric's mean over each block of `size` iterations where it was logged: (first iteration, mean)."""
    by_block = {}
    for r in rows:
        if key in r:
            by_block.setdefault(r["step"] // size, []).append(r[key])
    return [b * size for b in sorted(by_block)], [sum(v) / len(v) for _, v in sorted(by_block.items())]


def race(rows: list[dict], task: str, size: int = 30) -> list[str]:
    """The race between the extractor and the actor in one run's training, a markdown row per block of `size`
    iterations: CISPO steps taken in it and before its end, the share of lessons written that name their
    instance's door (the vault) and that share by chance (vault_study.right_by_chance), and the training gap with -
    without experience (success)."""
    cispo = collections.Counter(r["step"] // size * size for r in rows if "extractor/reward" in r)
    right = dict(zip(*blocks(rows, "lessons/right_written", size)))
    chance = dict(zip(*blocks(rows, "lessons/right_by_chance", size)))
    gap = dict(zip(*blocks([{**r, "gap": r[f"train/{task}/success_exp"] - r[f"train/{task}/success_noexp"]}
                            for r in rows if f"train/{task}/success_exp" in r], "gap", size)))
    lines = ["| iterations | CISPO steps (by the block's end) | lessons right | by chance | with − without "
             "(training) |", "|---|---|---|---|---|"]
    total = 0
    for b in sorted(set(gap) | set(right)):
        total += cispo.get(b, 0)
        cells = [f"{d[b]:.2f}" if b in d else "—" for d in (right, chance)]
        lines.append(f"| {b}-{b + size - 1} | {cispo.get(b, 0)} ({total}) | {' | '.join(cells)} | "
                     f"{gap.get(b, math.nan):+.3f} |")
    return lines


def chance_from_bank(out: str, rows: list[dict]) -> list[dict]:
    """Runs logged before lessons/right_by_chance: the metric rebuilt from the last bank (each lesson's door and
    iteration) and the vaults the groups played (vault_study.visiting_instance), taking each iteration's lessons as
    distill_per_group per group in group order. Only where that reading gives every logged lessons/right_written
    exactly (an ADD-only run, none replaced or evicted); otherwise the rows unchanged."""
    import types
    import crl
    import envs
    import vault_study
    a = json.load(open(os.path.join(out, "args.json")))
    if any("lessons/right_by_chance" in r for r in rows) or not a.get("instance_visits"):
        return rows
    run = types.SimpleNamespace(seed=a["seed"], tasks=a["tasks"], cfg=types.SimpleNamespace(**a))
    last = json.loads(collections.deque(read_lines(os.path.join(out, "bank.jsonl")), 1)[0])["bank"].get("vault", [])
    written = collections.defaultdict(list)
    for text, _, _, step in last:
        written[step].append(vault_study.first_word(text))
    filled = []
    for r in rows:
        doors = [envs.vault_door(vault_study.visiting_instance(run, r["step"], i // a["distill_per_group"],
                                                               crl.EVAL_SEED0)[1])
                 for i in range(len(written[r["step"]]))]
        pairs = list(zip(written[r["step"]], doors))
        if "lessons/right_written" in r and (not pairs or sum(w == d for w, d in pairs) / len(pairs) != r[
                "lessons/right_written"]):
            return rows
        filled.append({**r, **vault_study.right_by_chance(pairs)} if pairs else r)
    return filled


def band(seed_runs: dict, key: str) -> tuple[list, list, list]:
    """Steps where every seed has an evaluation, the mean over seeds there, and the 95% half-width."""
    by_seed = [d for d in (by_step(run, key) for run in seed_runs.values()) if d]
    steps = sorted(set.intersection(*(set(d) for d in by_seed))) if by_seed else []
    stats = [mean_ci([d[s] for d in by_seed]) for s in steps]
    return steps, [m for m, _ in stats], [h for _, h in stats]


# ---------------------------------------------------------------------------------------------------------
# running the grid

def train_argv(task: str, mode: str, seed: int, out: str, a, extra: list[str]) -> list[str]:
    argv = ["--tasks", task, "--seed", str(seed), "--out", out, "--iters", str(a.iters), "--final-eval-episodes",
            str(a.final_episodes)]
    return argv + extra + MODE_FLAGS.get(mode, ["--mode", mode])


def run_one(task: str, mode: str, seed: int, a, extra: list[str]):
    """Train one grid cell to its end (resuming from its checkpoint if it has one); final.json marks it done.
    Each cell is its own train.py process, so no memory or state carries over from one cell to the next."""
    out = run_dir(a.results, task, mode, seed)
    argv = train_argv(task, mode, seed, out, a, extra)
    check_same_flags(out, argv)
    if read_final(out, task) is not None:
        compact(out)   # finished in a sitting before the grid compacted its cells
        return
    # a crash between a save's two renames leaves the checkpoint in ckpt.old: train.py --resume puts it back
    resume = any(os.path.exists(os.path.join(out, c, "state.pt")) for c in ("ckpt", "ckpt.old"))
    if not resume and os.path.exists(out):
        shutil.rmtree(out)   # killed before its first checkpoint: nothing to keep
    print(f"== {task} {mode} seed {seed}: {'resuming' if resume else 'starting'} ({out})", flush=True)
    cmd = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py"), *argv,
           *(["--resume"] if resume else [])]
    if a.jobs == 1:
        rc = subprocess.run(cmd).returncode
    else:   # cells side by side: each one's progress goes to its own log, not interleaved on the terminal
        log = os.path.join(a.results, "logs", f"{task}-{mode}-seed{seed}.log")
        os.makedirs(os.path.dirname(log), exist_ok=True)
        with open(log, "a") as f:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        sys.exit(f"error: {task} {mode} seed {seed} stopped (exit {rc}); run the same command again to resume it")
    compact(out)   # the record's form from the start: a study commits its cells as they are


# flags that say where a cell is, how its work is batched and how often it is saved, not what it learns from: a
# cell trained with another --eval-batch (a preset lowered it for memory) or --save-every (a GPU's cells, saved
# once) still belongs in the grid
NOT_COMPARED = ("out", "resume", "micro_batch", "env_workers", "eval_batch", "dtype_auto", "save_every")
# asked so, the cell's own choice stands (made when it began; --resume keeps it): a number format, and where
# distillation runs (a GPU cell given --distill inline, as a CPU distils, belongs in a CPU grid)
RESOLVED = {"dtype": (None, "auto"), "distill": (None,)}


def check_same_flags(out: str, argv: list[str]):
    """A cell already in the folder was trained with the flags this grid would pass, or the grid stops: a table
    must never mix budgets (settings added since it ran are not compared)."""
    path = os.path.join(out, "args.json")
    if not os.path.exists(path):
        return
    import train   # only here: the table needs none of its flags
    saved, want = json.load(open(path)), vars(train.parse_args(argv))
    diff = [k for k in sorted(want) if k not in NOT_COMPARED and k in saved and saved[k] != want[k]
            and want[k] not in RESOLVED.get(k, ())]
    if diff:
        told = ", ".join(f"{k}: {saved[k]} here, {want[k]} asked" for k in diff)
        sys.exit(f"error: {out} was trained with other flags ({told}); give the same flags, or another --results")


# ---------------------------------------------------------------------------------------------------------
# the committed record's form: a finished cell's logs compressed, its own figures drawn on demand

def finished(out: str) -> bool:
    """Whether train.py is done with the cell OUT for good: no process holds it (OUT/lock) and its final.json is
    written or, a run without a final evaluation, its every iteration logged. Its logs take no more lines."""
    path = os.path.join(out, "args.json")
    if os.path.exists(os.path.join(out, "lock")) or not os.path.exists(path):
        return False
    if os.path.exists(os.path.join(out, "final.json")):
        return True
    a, metrics = json.load(open(path)), os.path.join(out, "metrics.jsonl")
    return (not a.get("final_eval_episodes") and bool(a.get("iters")) and log_exists(metrics)
            and sum(1 for _ in read_lines(metrics)) >= a["iters"])


def compact(out: str) -> bool:
    """A finished cell in the committed record's form, idempotently: each log (OUT/*.jsonl, *.log) as NAME.xz, xz
    at preset 9e (a bank.jsonl's snapshots repeat each other: 250 times smaller, against gzip's 16), and its own
    figures (OUT/*.png) removed, drawn again on demand (--draw). An unfinished cell is left as it is (False): train.py
    appends to its logs. A compacted cell resumed (its final.json lost) reads its logs back from the .xz and
    writes them plain, and the plain file comes first (rundir.read_lines) until it is compacted again."""
    if not finished(out):
        return False
    for name in sorted(os.listdir(out)):
        path = os.path.join(out, name)
        if name.endswith((".jsonl", ".log")):
            squeeze(path)
        elif name.endswith(".png"):
            os.remove(path)
    return True


def squeeze(path: str):
    """PATH as PATH.xz, written whole before PATH goes: a kill between leaves both, the same lines."""
    with open(path, "rb") as src, lzma.open(path + ".xz.tmp", "wb", preset=9 | lzma.PRESET_EXTREME) as dst:
        shutil.copyfileobj(src, dst)
    os.replace(path + ".xz.tmp", path + ".xz")
    os.remove(path)


def compact_all(top: str) -> tuple[list, list, list]:
    """Every run folder (one with args.json) under TOP compacted where finished, and every probe's record kept
    outside a run folder (a *.jsonl: credit_trace --trace FILE, written whole) as its .xz: (runs compacted, runs
    left as they are, records compacted)."""
    done, left, records = [], [], []
    for folder, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if not d.startswith("ckpt"))   # a checkpoint's files are not its logs
        if "args.json" in files:
            (done if compact(folder) else left).append(folder)
            continue
        for name in sorted(n for n in files if n.endswith(".jsonl")):
            squeeze(os.path.join(folder, name))
            records.append(os.path.join(folder, name))
    return done, left, records


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                epilog="Arguments after `--` go to train.py for every run (e.g. -- --lesson-moves 1).")
    p.add_argument("--tasks", default="room", help="comma-separated tasks, one grid each")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from: {', '.join(MODES)}")
    p.add_argument("--seeds", type=seed_range, default=range(3), help="seeds per mode: N for 0..N-1, or A-B for A..B "
                   "(seeds a pilot did not choose settings on)")
    p.add_argument("--results", default=os.path.join("runs", "reproduce"),
                   help="the grid's folder (default runs/reproduce, which git ignores; the committed record is "
                        "refreshed only by naming it: --results results, --results results/smollm2)")
    p.add_argument("--iters", type=int, default=120,
                   help="training iterations of every run (120: about 20 minutes for a tiny crl run on 2 cores)")
    p.add_argument("--final-episodes", type=int, default=256,
                   help="held-out episodes each way in every run's final evaluation")
    p.add_argument("--jobs", type=int, default=1,
                   help="cells trained at once, each its own process (on a GPU a small model leaves room for "
                        "several; on a 2-core CPU keep 1); their logs go to RESULTS/logs/")
    p.add_argument("--table", action="store_true", help="only redraw the tables and pictures from what is there")
    p.add_argument("--race", nargs="+", metavar="RUN", help="print, for each run directory named, its training by "
                   "block of 30 iterations (CISPO steps, lessons right, with - without experience on the run's own "
                   "task, read from its args.json), and stop")
    p.add_argument("--replay", metavar="RUN", help="train RUN's first --replay-iters iterations again from its "
                   "args.json, in a temporary folder, and compare their metrics with RUN's value for value (times "
                   "aside): how a change proves it kept behaviour; exit 1 if any differ")
    p.add_argument("--replay-iters", type=int, default=8, help="iterations --replay trains (default 8)")
    p.add_argument("--compact", metavar="DIR", help="put every finished run under DIR into the committed record's "
                   "form (its logs NAME.jsonl as NAME.jsonl.xz, its curve.png removed; what the grid does to a cell "
                   "once it finishes), and any probe's NAME.jsonl outside a run folder, and stop; a run still "
                   "training, or stopped short, is left as it is")
    p.add_argument("--draw", nargs="+", metavar="RUN", help="draw each run's curve.png again from its metrics (the "
                   "record keeps none), and stop")
    argv = sys.argv[1:] if argv is None else list(argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    a = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    a.tasks = [t for t in a.tasks.split(",") if t]
    a.modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in a.modes if m not in MODES]
    if bad:
        p.error(f"unknown mode {', '.join(bad)}; choose from: {', '.join(MODES)}")
    if not a.seeds or a.final_episodes < 1 or a.iters < 1 or a.jobs < 1:
        p.error("--seeds must name a seed, and --iters, --final-episodes and --jobs must be >= 1")
    return a, extra


def seed_range(text: str) -> range:
    """--seeds: N, seeds 0..N-1, or A-B, seeds A..B."""
    first, _, last = text.partition("-")
    try:
        return range(int(first), int(last) + 1) if last else range(int(first))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a count (3: seeds 0, 1, 2) or a range (1-5)")


def main(argv=None):
    a, extra = parse_args(argv)
    if a.replay:
        sys.exit(0 if replay(a.replay, a.replay_iters) else 1)
    if a.compact:
        done, left, records = compact_all(a.compact)
        print("\n".join([f"{len(done)} finished runs under {a.compact} in the compact form, {len(records)} probe "
                         f"records compacted; runs left as they are (unfinished, or not train.py's): {len(left)}",
                          *left]))
        return
    if a.draw:
        for out in a.draw:
            rundir.draw_curve(out)   # draws nothing where no success is logged
            path = os.path.join(out, "curve.png")
            print(path if os.path.exists(path) else f"{out}: no success logged, no curve")
        return
    if a.race:
        for out in a.race:
            rows = chance_from_bank(out, [json.loads(line) for line in read_lines(os.path.join(out, "metrics.jsonl"))])
            task = json.load(open(os.path.join(out, "args.json")))["tasks"][0]   # the run's own, whatever --tasks says
            print("\n".join([f"{out} ({len(rows)} iterations):", "", *race(rows, task), ""]))
        return
    for task in a.tasks:
        if not a.table:
            # seeds outermost: every mode gets its first seed early
            cells = [(task, mode, seed) for seed in a.seeds for mode in a.modes]
            with ThreadPoolExecutor(a.jobs) as pool:   # at most a.jobs cells in flight, so one that stops
                todo, running = iter(cells), set()       # stops the grid before another starts
                while True:
                    running |= {pool.submit(run_one, *cell, a, extra) for cell in islice(todo, a.jobs - len(running))}
                    if not running:
                        break
                    done, running = wait(running, return_when=FIRST_COMPLETED)
                    for cell in done:
                        cell.result()   # a cell that stopped: its message ends the grid
                        report(a.results, task)
        report(a.results, task)


def replay(run: str, iters: int) -> bool:
    """Train a committed run's first `iters` iterations again with its saved flags (its args.json in a fresh
    folder, then train.py --resume, which finds no checkpoint and starts from step 0; no final evaluation) and
    compare each iteration's metrics with the run's, times aside. Every draw is seeded by (seed, step, stream),
    so on the same kind of CPU an unchanged computation gives the same values."""
    import tempfile
    want = recorded_rows(run, iters)
    with tempfile.TemporaryDirectory() as out:
        shutil.copy(os.path.join(run, "args.json"), out)
        cmd = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py"), "--out", out,
               "--resume", "--iters", str(len(want)), "--final-eval-episodes", "0", "--final-attempts", "0"]
        if subprocess.run(cmd).returncode != 0:
            sys.exit(f"error: the replay of {run} stopped; its output is above")
        got = [json.loads(line) for line in read_lines(os.path.join(out, "metrics.jsonl"))]
    if got and len(got) == len(want):   # a run evaluates at its last iteration, which the recorded one did not end at
        got[-1] = {k: v for k, v in got[-1].items() if not k.startswith("eval/") or k in want[-1]}
    differs = replay_differs(run, got)
    print(differs or f"{run}: its first {len(got)} iterations replay value for value")
    return not differs and len(got) == len(want)


def recorded_rows(run: str, iters: int) -> list[dict]:
    """RUN's first `iters` metrics rows, times aside, each key in today's names (a task renamed since RUN ran, as
    rundir.migrate reads its flags: vault/... under --vault-reveal is vault-reveal/...)."""
    saved = json.load(open(os.path.join(run, "args.json")))
    return [{rundir.renamed_task(saved, k): v for k, v in strip_times(json.loads(line)).items()}
            for line in islice(read_lines(os.path.join(run, "metrics.jsonl")), iters)]


def strip_times(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith("time/")}


def replay_differs(run: str, got: list[dict]) -> str | None:
    """None when a replay's metrics rows equal RUN's first ones, times aside; else its first difference. A key
    only the replay has is a metric added since RUN was recorded, not a difference."""
    for w, g in zip(recorded_rows(run, len(got)), map(strip_times, got)):
        g = {k: v for k, v in g.items() if k in w}
        if w != g:
            diff = {k: (w[k], g.get(k)) for k in sorted(w) if w[k] != g.get(k)}
            return f"{run}: step {w.get('step')} differs (recorded, replayed): {diff}"
    return None


def report(results: str, task: str):
    text = table(results, task)
    os.makedirs(results, exist_ok=True)
    open(os.path.join(results, f"{task}.md"), "w").write(text)
    curve(results, task)
    lessons_curve(results, task)
    print(text, flush=True)


if __name__ == "__main__":
    main()
