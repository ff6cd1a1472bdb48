"""What the extractor learned: a run's experience bank, per task.  Run: python -m probes.lessons RUN [--top N]

Reads the bank of the run's last checkpoint (RUN/ckpt/bank; where the run keeps none, as in the committed record,
its last snapshot in RUN/bank.jsonl) and prints, per task, its lessons grouped by text (the same lesson is often
written many times): how many entries hold it, how many episodes used it and how often those succeeded, and the
steps its entries were written at. Then how the bank changed over the run:
from RUN/bank.jsonl (train.py writes the whole bank there at each evaluation) the bank's size and its
commonest lessons at each evaluation; a run without that file shows the lessons alive at the end by the step
they were written. Draws RUN/lessons.png: for each task, the share of the bank each of the commonest lessons
held over the run.
"""
import argparse
import json
import os
from collections import Counter, defaultdict, deque

from bank import ExperienceBank
from rundir import log_exists, read_lines


def by_text(rows: list[list]) -> list[tuple[str, dict]]:
    """rows [text, uses, successes, written] -> [(text, totals)], the commonest text first."""
    out = defaultdict(lambda: {"entries": 0, "uses": 0, "successes": 0, "written": []})
    for text, uses, successes, written in rows:
        t = out[text]
        t["entries"] += 1
        t["uses"] += uses
        t["successes"] += successes
        t["written"].append(written)
    return sorted(out.items(), key=lambda kv: (-kv[1]["entries"], kv[0]))


def checkpointed(run: str) -> bool:
    return os.path.isdir(os.path.join(run, "ckpt", "bank"))


def final_bank(run: str) -> dict[str, list[list]]:
    """The last checkpoint's bank, else the last bank.jsonl snapshot (the bank at the run's last evaluation)."""
    if checkpointed(run):
        return ExperienceBank.load(os.path.join(run, "ckpt", "bank")).lessons()
    return json.loads(deque(read_lines(os.path.join(run, "bank.jsonl")), 1)[0])["bank"]


def snapshots(run: str) -> bool:
    """Whether RUN/bank.jsonl (or its .xz) holds snapshots: a run that never evaluated (--eval-every 0) leaves it
    empty."""
    path = os.path.join(run, "bank.jsonl")
    return log_exists(path) and next(read_lines(path), None) is not None


def history(run: str, final: dict) -> list[tuple[int, dict]]:
    """[(step, {task: rows})]: the snapshots of RUN/bank.jsonl, else the final bank's entries alive at each
    tenth of the run (by the step they were written: lessons removed on the way are not seen)."""
    if snapshots(run):
        return [(s["step"], s["bank"]) for s in map(json.loads, read_lines(os.path.join(run, "bank.jsonl")))]
    last = max((r[3] for rows in final.values() for r in rows), default=0)
    steps = sorted({round(last * i / 10) for i in range(1, 11)})
    return [(s, {t: [r for r in rows if r[3] <= s] for t, rows in final.items()}) for s in steps]


def show(run: str, top: int) -> dict:
    final = final_bank(run)
    snaps = history(run, final)
    where = "the last checkpoint" if checkpointed(run) else f"the last evaluation (step {snaps[-1][0]}, bank.jsonl)"
    for task, rows in final.items():
        print(f"{task}: {len(rows)} lessons at {where}")
        print(f"  {'entries':>7} {'uses':>6} {'success':>7}  written (steps)  lesson")
        for text, t in by_text(rows)[:top]:
            rate = f"{t['successes'] / t['uses']:.2f}" if t["uses"] else "-"
            steps = f"{min(t['written'])}-{max(t['written'])}"
            print(f"  {t['entries']:>7} {t['uses']:>6} {rate:>7}  {steps:>15}  {text[:100]!r}")
        source = "bank.jsonl" if snapshots(run) else "the final bank, by step written"
        print(f"  over the run ({source}):")
        for step, bank in snaps:
            rows = bank.get(task, [])
            common = Counter(r[0] for r in rows).most_common(3)
            print(f"    step {step:>5}: {len(rows):>5} lessons; " + ", ".join(f"{t[:30]!r} {n}" for t, n in common))
    draw(run, final, snaps, top)
    return final


def draw(run: str, final: dict, snaps: list, top: int):
    """RUN/lessons.png: per task, the share of the bank held by each of its final commonest lessons."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tasks = list(final)
    fig, axes = plt.subplots(1, max(len(tasks), 1), figsize=(6 * max(len(tasks), 1), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        steps = [s for s, _ in snaps]
        for text, _ in by_text(final[task])[:min(top, 8)]:
            share = [sum(r[0] == text for r in b.get(task, [])) / max(len(b.get(task, [])), 1) for _, b in snaps]
            ax.plot(steps, share, marker="o", label=text[:40] if text[:40].isprintable() else repr(text[:40]))
        ax.set(title=f"{task}: share of the bank", xlabel="step", ylabel="share of lessons", ylim=(0, 1))
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(run, "lessons.png"), dpi=100)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run", help="a run directory with a checkpoint (RUN/ckpt/bank) or a bank.jsonl")
    p.add_argument("--top", type=int, default=10, help="lessons listed per task")
    a = p.parse_args(argv)
    if not checkpointed(a.run) and not snapshots(a.run):
        p.error(f"no bank in {a.run}/ckpt nor in its bank.jsonl (a grpo run has none; is this a run directory?)")
    show(a.run, a.top)
    print(f"picture: {os.path.join(a.run, 'lessons.png')}")


if __name__ == "__main__":
    main()
