"""Do a vault run's lessons name the right door? Run: python -m probes.vault.vault_lessons RUN_DIR [RUN_DIR ...]

Reads the bank of a run's last checkpoint (RUN/ckpt/bank): every lesson distilled from an episode remembers
the vault it came from (Entry.origin), whose door envs.vault_door gives. Prints the share of lessons whose text is
that door, by the iteration they were written in (chance: 1/8), the commonest lessons, what the actor made of
each kind of lesson it read (success per use of the right ones, of wrong ones naming the commonest lesson's door,
and of the other wrong ones: which lesson the outcome credit favours), and the extractor's reward at each of its
CISPO steps (RUN/metrics.jsonl; none for a frozen extractor).

The use counts are the last bank's, and an update takes the uses of the lessons it replaces with it: an extractor
that updates after a win and answers NONE after a loss leaves mostly the lost uses. The share of writes that were
updates is printed beside them, and for runs that logged it, the success after a right and after a wrong lesson
counted as the episodes ended (RUN/metrics.jsonl), which loses nothing.
"""
import collections
import json
import os
import sys

import envs
import reproduce
from bank import ExperienceBank
from rundir import read_lines


def lessons(run: str) -> tuple[list, float]:
    """The vault lessons of the run's last checkpoint, read once for every reading below, and the share of its
    writes that were updates: an update replaces the lessons it names, and their uses go with them."""
    bank = ExperienceBank.load(f"{run}/ckpt/bank")
    writes = bank.stats.get("added", 0) + bank.stats.get("updated", 0)
    return bank.entries("vault"), bank.stats.get("updated", 0) / max(1, writes)


def rightness(entries: list) -> tuple[dict, list, int]:
    """{first iteration of a block of 10: (share right, lessons)}, the commonest texts, lessons of no vault."""
    by_block = collections.defaultdict(list)
    for e in entries:
        if e.origin >= 0:
            by_block[e.created // 10 * 10].append(e.text.strip().lower() == envs.vault_door(e.origin))
    shares = {b: (sum(v) / len(v), len(v)) for b, v in sorted(by_block.items())}
    return shares, collections.Counter(e.text for e in entries).most_common(5), sum(e.origin < 0 for e in entries)


def success_by_kind(entries: list) -> dict:
    """{kind: (success per use, uses)} over the lessons the actor read: right, wrong naming the commonest lesson
    (a door the lesson names whatever the vault), other wrong."""
    entries = [e for e in entries if e.origin >= 0]
    common = collections.Counter(e.text.strip().lower() for e in entries).most_common(1)[0][0] if entries else None
    uses, wins = collections.Counter(), collections.Counter()
    for e in entries:
        text = e.text.strip().lower()
        right = text == envs.vault_door(e.origin)
        kind = "right" if right else f"wrong, {common}" if text == common else "wrong, other"
        uses[kind] += e.uses
        wins[kind] += e.successes
    return {k: (wins[k] / uses[k], uses[k]) for k in ("right", f"wrong, {common}", "wrong, other") if uses[k]}


def metric_rows(run: str) -> list[dict]:
    return [json.loads(line) for line in read_lines(os.path.join(run, "metrics.jsonl")) if line.strip()]


def extractor_rewards(rows: list[dict]) -> list[tuple[int, float]]:
    """(iteration, the extractor's reward) at each iteration that took a CISPO step."""
    return [(r["step"], r["extractor/reward"]) for r in rows if "extractor/reward" in r]


def won_after(rows: list[dict]) -> dict:
    """{right, wrong: success of the episodes that read such a lesson, by third of the run}: the mean over the
    iterations that had such readers; counted as the episodes ended (metrics.vault_lessons), so unlike the last
    bank's use counts it misses nothing an update replaced. Empty for runs logged before it was counted, or with
    fewer than three such iterations."""
    by_kind = {kind: reproduce.thirds(rows, f"lessons/won_after_{kind}") for kind in ("right", "wrong")}
    return {kind: means for kind, means in by_kind.items() if means}


def main(runs: list[str]):
    for run in runs:
        (entries, updates), rows = lessons(run), metric_rows(run)
        shares, common, merged = rightness(entries)
        right = sum(s * n for s, n in shares.values()) / max(1, sum(n for _, n in shares.values()))
        print(f"{run}: {right:.3f} of lessons name their vault's door (chance 0.125); {merged} from merges")
        print("  by iteration written: " + ", ".join(f"{b}-{b + 9}: {s:.2f} of {n}" for b, (s, n) in shares.items()))
        print("  commonest: " + ", ".join(f"{text!r} {n}" for text, n in common))
        print("  success per use, from the last bank: " + ", ".join(
            f"{k} {s:.3f} of {n}" for k, (s, n) in success_by_kind(entries).items()) +
            f" ({updates:.2f} of the writes were updates, whose replaced lessons' uses are not counted)")
        after = won_after(rows)
        if after:
            print("  success after reading a lesson, by third of the run: " + ", ".join(
                f"{k} " + " / ".join(f"{x:.3f}" for x in v) for k, v in after.items()))
        print("  extractor reward by CISPO step: " + (", ".join(f"{t}: {r:+.2f}" for t, r in extractor_rewards(rows))
                                                       or "none (frozen)"))


if __name__ == "__main__":
    main(sys.argv[1:])
