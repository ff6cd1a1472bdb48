"""The finished vault study's code, beside crl.py as metrics.py is: what `--recipe vault-first` adds to the method
(results/vault-first/: on the vault whose lost episodes name their door, a CISPO-trained extractor becomes a
working memory of each vault, CRL − GRPO +0.542 ± 0.184 at the third held-out attempt over 8 seeds).

- `--credit lift` / `first-lift`: a lesson earns its episode's gain over the same instance played without
  experience (`episode_lift`), not its outcome: an improving actor's ±1 outcome credits every lesson it read;
  first-lift pays only a first-action win, since a wrong lesson naming the door the actor played next anyway cost
  it little, and CISPO collapsed onto such doors (results/vault-prior's credit traces);
- `--instance-visits K`: fresh instances, each played by its group K iterations and then retired (`visiting_instance`):
  an instance recurs, so its lessons can be read back, but never long enough to be learned into the weights;
- `--extractor oracle` (static mode): a script writes the door each transcript shows (`oracle_lessons`), the
  ceiling of what lessons can give;
- `--head-start N` (crl mode): the actor frozen N iterations, so the extractor learns to write before the actor
  learns an order of doors whose first door makes a lesson worthless (crl.train_step reads it);
- the study's measure of lessons, `vault_lessons`: the share that name their vault's door, against chance.
crl.py calls these at the places marked `# vault study`."""
import collections

import numpy as np

import envs
from bank import Operation
from parallel import all_reduce_sum, gather_objects

INSTANCES = 1   # crl.INSTANCES: the random stream of the instances an iteration plays


def is_vault(task: str) -> bool:
    """Whether a lesson about `task` can be checked: it knows the word a right one names (envs.Task.answer)."""
    return envs.answer(task, 0) is not None


def door(task: str, seed: int) -> str:
    """The door that opens the vault `task` plays at `seed`: what a lesson about it should name."""
    return envs.answer(task, seed)


def episode_lift(eps, first_only: bool = False) -> list[float]:
    """A with-experience episode's reward minus the mean of its group's episodes without experience: the
    lesson's effect on the same instance apart from the actor's own progress. With `first_only` an episode's
    reward counts only when its first action won (both sides alike). A group is whole on one rank; an episode
    without experience, or in a group with none, gets 0."""
    def worth(e):
        return e.reward if not first_only or e.turns <= 1 else 0.0
    without = {}
    for e in eps:
        if not e.with_exp:
            without.setdefault(e.group, []).append(worth(e))
    return [worth(e) - sum(without[e.group]) / len(without[e.group]) if e.with_exp and e.group in without else 0.0
            for e in eps]


def visiting_instance(run, step: int, g: int, below: int) -> tuple[str, int]:
    """--instance-visits K: group g plays one fresh instance for K iterations, then the next; the groups take
    turns to start theirs, so every iteration some instances are new and some are being revisited."""
    K = run.cfg.instance_visits
    life = (step + g * K // run.cfg.groups) // K
    task = run.tasks[g % len(run.tasks)]
    return task, envs.draw_training_seed(task, np.random.default_rng([run.seed, g, life, INSTANCES]), below)


def oracle_lessons(run, eps, step: int) -> list[Operation]:
    """A scripted extractor for the vault: it adds the door each episode's transcript shows to open (the opened
    one, or the one vault-reveal names after a loss) and nothing where it shows none. No generation is made, so
    nothing is credited or trained (run as static: what the actor gains when every lesson is right)."""
    doors = [envs.vault_shown_door(e.transcript) for e in eps]
    keys = run.manager.embed([e.query for e in eps])
    ops = [Operation("add", e.task, door, (), key, -1, step, origin=e.seed)
           for e, key, door in zip(eps, keys, doors) if door]
    run.counters["operations"] += len(ops)
    return ops


def first_word(text: str | None) -> str | None:
    """A lesson's or a reply's first word, lower-cased (None for no text): on the vault, the door it names."""
    return text.strip().lower().split(" ")[0] if text and text.strip() else None


def vault_lessons(eps, ops) -> dict:
    """On a vault task, where a lesson can be checked: the share of the lessons distilled this iteration that name
    the door of the vault they came from, and of the lessons read that name the reader's door (over every rank;
    a lesson's first word counts, chance 1/8; a set of several doors, `north, east`, never counts: its first word
    keeps the comma), and the success of the episodes that read a right lesson and of those that read a wrong one.
    Counted here, as the episodes end: the last bank keeps no record of a lesson an update replaced."""
    pairs = [(first_word(op.text), door(op.task, op.origin)) for op in ops
             if is_vault(op.task) and op.kind in ("add", "update")]   # (door named, door that opens)
    written = [named == opens for named, opens in pairs]
    readers = [e for e in eps if is_vault(e.task) and e.lessons]
    read = [first_word(e.lessons[0]) == door(e.task, e.seed) for e in readers]
    out = {}
    for name, marks in (("lessons/right_written", written), ("lessons/right_read", read),
                        ("lessons/won_after_right", [e.success for e, r in zip(readers, read) if r]),
                        ("lessons/won_after_wrong", [e.success for e, r in zip(readers, read) if not r])):
        n = all_reduce_sum(len(marks))
        if n:
            out[name] = all_reduce_sum(sum(marks)) / n
    return {**out, **right_by_chance(pairs)}


def right_by_chance(pairs) -> dict:
    """The share of lessons right if each named a door drawn from this iteration's written doors whatever its
    vault (sum over doors of written share times vault share, over every rank): what lessons/right_written
    reads when the extractor ignores its transcript, high when the iteration's vaults happen to open the door
    it always writes. Right above it is what the extractor read from its transcripts."""
    pairs = [p for rank_pairs in gather_objects(pairs) for p in rank_pairs]
    if not pairs:
        return {}
    written, doors = collections.Counter(w for w, _ in pairs), collections.Counter(d for _, d in pairs)
    return {"lessons/right_by_chance": sum(written[d] * doors[d] for d in written) / len(pairs) ** 2}
