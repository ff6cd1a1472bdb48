"""Which lessons the lift credit rewarded, and which CISPO trained: a vault run's first iterations replayed with
every episode and every CISPO batch written down. Run:
python -m probes.vault.credit_trace RUN [--iters 60] [--block 30] [--trace FILE]
python -m probes.vault.credit_trace --read FILE [--block 30]     (the report on a kept trace, no replay)

Replays RUN from step 0 with its own flags (RUN/args.json, as --resume reads them) through train.iteration, and
says whether the replay's metrics equal RUN/metrics.jsonl's value for value (reproduce.replay_differs): on the
same kind of CPU they do, so what the trace shows is what the run did. It records:
- each episode (crl.credit_generations' input): its vault's door, whether it read a lesson, the lesson, the
  vault that lesson came from, its moves, success and lift (vault_study.episode_lift);
- each CISPO step (crl.extractor_update's batch, chosen as it chooses): each generation's text, mean credit and
  advantage (credit minus the batch mean), whether its lesson named its
  own vault's door, whether the episode it distilled won, the lesson that episode read, and the evicted ones.
The replay runs in a temporary directory; --trace FILE keeps the records (JSON lines). It prints, by block of
iterations: the actor's first door without a lesson; for lessons read, right and wrong, how often the actor's
first door was the lesson's (it followed) and the mean lift; the same by the door a lesson names, beside how often
the actor opens with that door unprompted; and the generations CISPO trained: right, wrong naming a door the actor
followed in under half of that door's reads in the block, and the other wrong, each with its mean credit and its
summed advantage (what CISPO pushed up or down), and split by whether the episode a generation distilled won
(after a loss the transcript shows no door: a right lesson there is a guess). A lesson the actor does not
follow has a lift near 0, and the advantage subtracts the batch's mean credit: where most lessons hurt, such a
lesson is pushed up.
"""
import argparse
import collections
import json
import os
import shutil
import tempfile

from tqdm import tqdm

import crl
import envs
import reproduce
import train
from vault_study import episode_lift, first_word
from rundir import read_lines


def trace(run_dir: str, iters: int, out: str) -> list[dict]:
    """Replay the run's first `iters` iterations in `out` (a new directory) with crl's credit and CISPO batch
    recorded; returns the records."""
    os.makedirs(out, exist_ok=True)
    shutil.copy(os.path.join(run_dir, "args.json"), os.path.join(out, "args.json"))
    args = train.parse_args(["--out", out, "--resume"])
    if args.tasks != ["vault"]:
        raise SystemExit(f"error: {run_dir} trains on {args.tasks}; this probe reads vault runs (--tasks vault)")
    device = train.setup_distributed(args)
    run, _ = train.build(args, device, train.model_dtype(args, device))
    records, credit, update, distill = [], crl.credit_generations, crl.extractor_update, crl.distill
    won, shown = {}, {}   # generation id -> whether the episode it distilled won, the lesson that episode read

    def recorded_distill(run, eps, step, rng, record=True):
        first = run.generations_made   # one process: crl.extractor_generate numbers the prompts in order from here
        ops = distill(run, eps, step, rng, record)
        if record and run.extractor is not None:
            won.update({first + i: e.success for i, e in enumerate(eps)})
            shown.update({first + i: first_word(e.lessons[0]) if e.lessons else None for i, e in enumerate(eps)})
        return ops

    def recorded_credit(run, eps):
        for e, lift in zip(eps, episode_lift(eps, first_only=run.cfg.credit == "first-lift")):
            records.append({"kind": "episode", "step": run.step, "seed": e.seed, "door": envs.vault_door(e.seed),
                            "with_exp": e.with_exp, "lesson": e.lessons[0] if e.lessons else None,
                            "origin": e.origins[0] if e.origins else None, "sources": e.sources,
                            "moves": [first_word(line) for who, line in e.transcript if who == "agent"],
                            "success": e.success, "lift": lift})
        return credit(run, eps)

    def recorded_update(run):
        ready = {gid: g for gid, g in run.generations.items() if g.credits}
        queue = sorted(((g.queued, gid) for gid, g in ready.items()), reverse=True)   # crl.extractor_update's order
        if len(queue) >= run.cfg.extractor_batch:
            origin = {s: r["origin"] for r in records if r["kind"] == "episode" for s in r["sources"]}
            rows = []
            for _, gid in queue[:run.cfg.extractor_batch]:
                text = run.extractor_tok.decode(ready[gid].tokens, skip_special_tokens=True)
                lesson = first_word(text.split(":")[-1])
                rows.append({"id": gid, "text": text, "lesson": lesson, "credit": sum(ready[gid].credits)
                             / len(ready[gid].credits), "right": lesson == envs.vault_door(origin[gid])
                             if origin.get(gid) is not None else None, "won": won.get(gid),
                             "shown": shown.get(gid)})
            mean = sum(r["credit"] for r in rows) / len(rows)
            baseline = mean   # crl.extractor_update's advantage
            for r in rows:
                r["advantage"] = r["credit"] - baseline
            records.append({"kind": "cispo", "step": run.step, "batch": rows,
                            "evicted": len(queue) - run.cfg.extractor_batch})
        return update(run)

    crl.credit_generations, crl.extractor_update, crl.distill = recorded_credit, recorded_update, recorded_distill
    metrics = []
    try:
        for step in tqdm(range(iters), desc=f"replaying {run_dir}", unit="it"):
            metrics.append(train.iteration(run, args, step))
    finally:
        crl.credit_generations, crl.extractor_update, crl.distill = credit, update, distill
        if run.manager is not None:
            run.manager.close()
    same = f"{run_dir}: its first {iters} iterations replay value for value"
    print(reproduce.replay_differs(run_dir, metrics) or same)
    return records


def mean(xs) -> str:
    xs = list(xs)
    return f"{sum(xs) / len(xs):+.3f}" if xs else "-"


def summary(records: list[dict], block: int) -> list[str]:
    """The printed report, one block of iterations after another (see the module's docstring)."""
    lines = []
    for start in sorted({r["step"] // block * block for r in records}):
        rs = [r for r in records if start <= r["step"] < start + block]
        eps = [r for r in rs if r["kind"] == "episode"]
        lines.append(f"iterations {start}-{start + block - 1}:")
        first = collections.Counter(r["moves"][0] for r in eps if not r["with_exp"] and r["moves"])
        total = sum(first.values()) or 1
        lines.append("  first door without a lesson: " + ", ".join(f"{d} {n / total:.2f}" for d, n in
                                                                   first.most_common(4)))
        read = [r for r in eps if r["lesson"]]
        for kind in ("right", "wrong"):
            rows = [r for r in read if (first_word(r["lesson"]) == r["door"]) == (kind == "right")]
            lines.append(f"  {kind} lessons read: {len(rows)}, followed {followed(rows)}, "
                         f"success {mean(r['success'] for r in rows)}, lift {mean(r['lift'] for r in rows)}")
        named = collections.defaultdict(list)
        for r in read:
            named[first_word(r["lesson"])].append(r)
        lines.append("  by the door a lesson names: reads, followed, first door unprompted, lift when right / wrong")
        for d, rows in sorted(named.items(), key=lambda kv: -len(kv[1])):
            right = [r["lift"] for r in rows if r["door"] == d]
            wrong = [r["lift"] for r in rows if r["door"] != d]
            lines.append(f"    {d}: {len(rows)}, {followed(rows)}, {first[d] / total:.2f}, "
                         f"{mean(right)} of {len(right)} / {mean(wrong)} of {len(wrong)}")
        steps = [r for r in rs if r["kind"] == "cispo"]
        trained = [g for s in steps for g in s["batch"]]
        seldom = {d for d, rows in named.items() if share_followed(rows) < 0.5}
        lines.append(f"  CISPO: {len(trained)} generations in {len(steps)} steps, mean credit "
                     f"{mean(g['credit'] for g in trained)}; by kind (generations, mean credit, summed advantage):")
        for kind, gs in (("right", [g for g in trained if g["right"]]),
                         ("wrong, naming a door followed in under half its reads",
                          [g for g in trained if g["right"] is False and g["lesson"] in seldom]),
                         ("wrong, naming another door", [g for g in trained if g["right"] is False
                                                         and g["lesson"] not in seldom])):
            lines.append(f"    {kind}: {len(gs)}, {mean(g['credit'] for g in gs)}, "
                         f"{sum(g['advantage'] for g in gs):+.2f}")
        by_outcome = (("win", [g for g in trained if g.get("won") is True]),   # None: a trace made before `won`
                      ("loss", [g for g in trained if g.get("won") is False]))
        lines.append("  CISPO by the episode distilled (generations, right, mean credit, summed advantage): "
                     + "; ".join(f"after a {name} {len(gs)}, {sum(bool(g['right']) for g in gs)}, "
                                 f"{mean(g['credit'] for g in gs)}, {sum(g['advantage'] for g in gs):+.2f}"
                                 for name, gs in by_outcome))
        if any("shown" in g for g in trained):   # a trace made before `shown` has none
            by_shown = (("copied it", [g for g in trained if g.get("shown") and g["lesson"] == g["shown"]]),
                        ("another door", [g for g in trained if g.get("shown") and g["lesson"] != g["shown"]]),
                        ("none shown", [g for g in trained if not g.get("shown")]))
            lines.append("  CISPO against the lesson its episode read (generations, right, summed advantage): "
                         + "; ".join(f"{name} {len(gs)}, {sum(bool(g['right']) for g in gs)}, "
                                     f"{sum(g['advantage'] for g in gs):+.2f}" for name, gs in by_shown))
        by_door = collections.defaultdict(list)
        for g in trained:
            by_door[g["lesson"]].append(g["advantage"])
        lines.append("  CISPO by lesson (generations, summed advantage): " + "; ".join(
            f"{d} {len(a)}, {sum(a):+.2f}" for d, a in sorted(by_door.items(), key=lambda kv: -len(kv[1]))))
        lines.append(f"  evicted untrained: {sum(s['evicted'] for s in steps)}")
    return lines


def share_followed(rows: list[dict]) -> float:
    """The share of episodes whose first door was the one their lesson names (nan: none moved)."""
    rows = [r for r in rows if r["moves"]]
    return sum(r["moves"][0] == first_word(r["lesson"]) for r in rows) / len(rows) if rows else float("nan")


def followed(rows: list[dict]) -> str:
    share = share_followed(rows)
    return "-" if share != share else f"{share:.2f}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run", nargs="?", help="a vault run's directory (its args.json and metrics.jsonl)")
    p.add_argument("--iters", type=int, default=60, help="iterations to replay from step 0")
    p.add_argument("--block", type=int, default=30, help="iterations a block of the report")
    p.add_argument("--trace", default=None, help="a file to keep the records in (JSON lines)")
    p.add_argument("--read", default=None, help="report on the records of an earlier --trace FILE (or of FILE.xz, as "
                   "the committed record keeps it); no replay")
    a = p.parse_args(argv)
    if a.read:
        records = [json.loads(line) for line in read_lines(a.read)]   # FILE, or the record's FILE.xz
    elif a.run:
        with tempfile.TemporaryDirectory() as out:
            records = trace(a.run, a.iters, out)
        if a.trace:
            with open(a.trace, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)
    else:
        p.error("give a run directory to replay, or --read FILE")
    print("\n".join(summary(records, a.block)))


if __name__ == "__main__":
    main()
