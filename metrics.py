"""The metrics of an iteration and of an evaluation, over every rank: success, retrieval (how often the re-rank
decides, how often a lesson comes from the same instance, how old it is), counts and timings. crl.py calls them;
they read its Episode and Run records and change nothing."""

import envs
from parallel import all_reduce_sum, gather_objects


def panel_key(task: str, seed: int) -> str:
    """A held-out instance's task in metric names, with its panel where the task has several
    (`vault-family/control`)."""
    panel = envs.panel_of(task, seed)
    return f"{task}/{panel}" if panel else task


def success_metrics(eps, prefix: str) -> dict:
    """Success rate and mean reward (WebShop's is fractional) with and without experience per task, summed
    over ranks."""
    counts = {}
    for e in eps:
        key = f"{prefix}/{panel_key(e.task, e.seed)}/{{}}_{'exp' if e.with_exp else 'noexp'}"
        n, s, r = counts.get(key, (0, 0, 0.0))
        counts[key] = (n + 1, s + int(e.success), r + e.reward)
    total = {}
    for rank_counts in gather_objects(counts):
        for k, (n, s, r) in rank_counts.items():
            tn, ts, tr = total.get(k, (0, 0, 0.0))
            total[k] = (tn + n, ts + s, tr + r)
    return {k.format(name): v / n for k, (n, s, r) in sorted(total.items())
            for name, v in (("success", s), ("reward", r))}


def paired_contrast(eps, prefix: str) -> dict:
    """Per task, the run's own contrast: success with minus without experience on the same instances (an
    instance played once each way), its mean, standard deviation and count over instances (over every rank;
    reproduce.py turns them into an interval). It needs no other run, so the lottery of which instances a run
    plays well cancels out."""
    pairs = {}   # the two plays of an instance may be on different ranks (held_out_specs deals specs in turn)
    plays = [(panel_key(e.task, e.seed), e.seed, e.with_exp, float(e.success)) for e in eps]
    for rank_plays in gather_objects(plays):
        for task, seed, with_exp, success in rank_plays:
            pairs.setdefault((task, seed), {})[with_exp] = success
    diffs = {}
    for (task, _), p in sorted(pairs.items()):
        if len(p) == 2:
            diffs.setdefault(task, []).append(p[True] - p[False])
    out = {}
    for task, d in sorted(diffs.items()):
        mean = sum(d) / len(d)
        out[f"{prefix}/{task}/contrast"] = mean
        out[f"{prefix}/{task}/contrast_sd"] = (sum((x - mean) ** 2 for x in d) / max(len(d) - 1, 1)) ** 0.5
        out[f"{prefix}/{task}/contrast_n"] = len(d)
    return out


def searches(run) -> tuple[int, int]:
    """The bank's running counts of training searches and of picks off the cosine top 1."""
    stats = run.manager.bank.stats if run.manager is not None else {}
    return stats.get("searches", 0), stats.get("off_top1", 0)


def retrieval_metrics(run, before: tuple[int, int]) -> dict:
    """The share of this iteration's retrievals whose pick is not the cosine top 1: how much the re-rank
    decides. Every rank ran every search, so the bank's counts are already global."""
    n, off = (now - then for now, then in zip(searches(run), before))
    return {"retrieval/off_top1": off / n} if n else {}


def same_instance(eps, prefix: str, written_at: int | None = None) -> dict:
    """The retrieval's precision where instances recur: the share of episodes given a lesson whose top lesson
    was distilled from this same instance (over every rank); with `written_at`, also the share whose top lesson
    is this instance's and was written at that step (evaluate_attempts: after the attempt before)."""
    given = all_reduce_sum(sum(bool(e.origins) for e in eps))
    same = [e for e in eps if e.origins and e.origins[0] == e.seed]
    out = {f"{prefix}/same_instance": all_reduce_sum(len(same)) / given} if given else {}
    if given and written_at is not None:
        out[f"{prefix}/previous_attempt"] = all_reduce_sum(sum(e.written[0] == written_at for e in same)) / given
    return out


def wrote_share(eps, ops) -> float:
    """The share of the with-experience instances whose distillation wrote a lesson (added or updated one);
    the rest answered NONE, so the next attempt reads an older lesson of theirs, if any (over every rank)."""
    wrote = {op.origin for op in ops if op.kind in ("add", "update")}
    return all_reduce_sum(len(wrote)) / all_reduce_sum(sum(e.with_exp for e in eps))


def lesson_age(eps, now: int) -> dict:
    """How old the lessons the actor read are: the mean, over episodes given one, of the iterations since its
    top lesson was written (over every rank). Small when retrieval serves what the extractor writes now."""
    ages = [now - e.written[0] for e in eps if e.written]
    n, total = all_reduce_sum(len(ages)), all_reduce_sum(sum(ages))
    return {"retrieval/age": total / n} if n else {}


def episode_metrics(run, eps) -> dict:
    """Means and counts over every rank's episodes, this iteration's counters, bank size and timings."""
    n = all_reduce_sum(len(eps))
    return {
        "reward": all_reduce_sum(sum(e.reward for e in eps)) / n,
        "turns": all_reduce_sum(sum(e.turns for e in eps)) / n,
        "invalid_actions": all_reduce_sum(sum(e.invalid for e in eps)),
        "truncated": all_reduce_sum(sum(e.truncated for e in eps)),
        "asks": all_reduce_sum(sum(e.asks for e in eps)),
        **{k: all_reduce_sum(v) for k, v in run.counters.items()},
        **same_instance(eps, "retrieval"),
        **lesson_age(eps, run.step),
        "bank_size": len(run.manager.bank) if run.manager is not None else 0,
        "generations": all_reduce_sum(len(run.generations)),   # kept for credit: alive while their lesson is
        **{f"time/{k}": v for k, v in run.timer.items()},
    }
