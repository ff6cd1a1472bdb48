"""Held-out learning curves of a grid, panel by panel: how fast each mode gets there. Run:
python -m probes.curves RESULTS TASK [--level 0.9] [--early 50]     (writes RESULTS/TASK-curves.md and prints it)

Reads every cell RESULTS/TASK/MODE-seedN (reproduce.py's grid, plain or compact) and its evaluations during
training (`--eval-every`; each plays every held-out panel of the task with and without a lesson, the bank read-only)
and final.json. For each panel (a family vault's transfer panel, then its control):
- the curve: each mode's success with lessons (`exp`) and without (`noexp`) at each evaluation, mean over seeds
  with its 95% interval (Student t), where every seed of the mode has one;
- learning speed: each mode's success − GRPO's (GRPO's without lessons, its only policy; a mode's `exp` is what it
  deploys), paired by seed, at `--early` and at the last evaluation, and the first evaluation at which each seed
  reaches `--level` (the mean over seeds that do, and how many do);
- the better actor: each mode without lessons − GRPO at the end; the lessons' worth: exp − noexp, paired by seed.
Numbers only; what they mean is for the study's README."""
import argparse
import os

from reproduce import MODES, fmt, mean_ci, paired, read_runs


def series(run: dict, key: str) -> dict:
    """{step: value} of one cell's evaluations during training."""
    return {r["step"]: r[key] for r in run["rows"] if key in r}


def at(runs: dict, mode: str, key: str, step: int) -> dict:
    """{seed: the value at `step`} over the mode's seeds that evaluated there."""
    return {s: v[step] for s, v in ((s, series(r, key)) for s, r in runs.get(mode, {}).items()) if step in v}


def first_reaching(values: dict, level: float) -> int | None:
    return next((step for step, v in sorted(values.items()) if v >= level), None)


def panel_lines(runs: dict, key: str, modes: list[str], level: float, early: int) -> list[str]:
    """The markdown of one panel (`key` the metric's prefix, eval/TASK or eval/TASK/PANEL)."""
    steps = sorted({r["step"] for m in modes for run in runs[m].values() for r in run["rows"]
                    if f"{key}/success_noexp" in r})
    if not steps:
        return [f"no evaluation of {key} during training"]
    cols = [(m, kind) for m in modes for kind in ("exp", "noexp") if m != "grpo" or kind == "noexp"]
    lines = ["| iteration | " + " | ".join(f"{m} {kind}" for m, kind in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for step in steps:
        cells = [at(runs, m, f"{key}/success_{kind}", step) for m, kind in cols]
        lines.append(f"| {step} | " + " | ".join(fmt(*mean_ci(list(c.values()))) + f" ({len(c)})" if c else "—"
                                                   for c in cells) + " |")
    last = steps[-1]
    early = min(steps, key=lambda s: abs(s - early))
    lines.append("")
    grpo = {step: at(runs, "grpo", f"{key}/success_noexp", step) for step in (early, last)}
    for m, kind in cols:
        if m == "grpo":
            continue
        diffs = [f"at {step} {fmt(*mean_ci(d))} ({len(d)} seeds)" for step in (early, last)
                 if (d := paired(at(runs, m, f"{key}/success_{kind}", step), grpo[step]))]
        lines.append(f"- {m} {kind} − grpo, paired by seed: " + "; ".join(diffs) + "  ")
    for m in modes:
        if m != "grpo":
            d = paired(at(runs, m, f"{key}/success_exp", last), at(runs, m, f"{key}/success_noexp", last))
            if d:
                lines.append(f"- {m} exp − noexp at {last}, paired by seed: {fmt(*mean_ci(d))} ({len(d)} seeds)  ")
    for m, kind in cols:
        reached = [first_reaching(series(r, f"{key}/success_{kind}"), level) for r in runs[m].values()]
        got = [x for x in reached if x is not None]
        lines.append(f"- {m} {kind}: first evaluation at ≥ {level:g}: "
                     + (f"{fmt(*mean_ci(got))} in {len(got)} of {len(reached)} seeds" if got
                        else f"never, in {len(reached)} seeds") + "  ")
    return lines


def report(results: str, task: str, level: float, early: int) -> str:
    runs = read_runs(results, task)
    modes = [m for m in MODES if m in runs]
    if "grpo" not in modes:
        raise SystemExit(f"error: no grpo cells under {os.path.join(results, task)}: the contrasts are against grpo")
    panels = sorted({k.rsplit("/", 1)[0] for m in modes for run in runs[m].values() for r in run["rows"]
                     for k in r if k.startswith(f"eval/{task}") and k.endswith("/success_noexp")},
                    key=lambda k: (k.count("/"), k))
    lines = [f"# {task}: held-out curves by mode ({results}), mean over seeds ± 95% interval (seeds)", ""]
    for key in panels:
        lines += [f"## {key.removeprefix(f'eval/{task}').strip('/') or 'held out'} (`{key}/success_*`)", "",
                  *panel_lines(runs, key, modes, level, early), ""]
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", help="the grid's folder (reproduce.py --results)")
    p.add_argument("task", help="the task whose cells to read (a subfolder of RESULTS)")
    p.add_argument("--level", type=float, default=0.9, help="the success level whose first evaluation is reported")
    p.add_argument("--early", type=int, default=50, help="the early budget (the evaluation nearest it)")
    a = p.parse_args(argv)
    text = report(a.results, a.task, a.level, a.early)
    open(os.path.join(a.results, f"{a.task}-curves.md"), "w").write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
