"""Constrained replies: a small model replies with one of a set of strings (the valid actions, a constrained
extractor's operation heads and lesson plans) instead of free text it cannot yet format.

model.generate reaches a constraint through a small protocol: `constraint.start()` gives a cursor per reply;
`cursor.choices()` lists the ids allowed next, `cursor.advance(id)` takes one, `cursor.forced()` is the one id
that must come next (jump-forward: appended with log-prob 0, no sampling step), and `cursor.complete` says a
whole completion has been read (which ends the reply, or, with `free_after`, hands it back to free text).
model.py records each step's allowed ids, so the PPO/CISPO ratio is taken under the same mask.
"""
import functools
import itertools
from dataclasses import dataclass

_END = -1  # trie key marking "a completion ends here" (token ids are >= 0)


@dataclass
class Constraint:
    completions: list[list[int]]      # allowed token sequences (canonical tokenisation of each string)
    free_after: bool = False          # False: the reply is exactly one completion; True: a completion is a head,
                                      # after which generation continues unconstrained (normal stop rules)

    @classmethod
    def from_strings(cls, tokenizer, strings, free_after=False, end=True) -> "Constraint":
        """end=True appends the tokenizer's EOS to each completion (only when free_after is False), so the
        reply ends with the stop token and a completion that prefixes another ("n" vs "ne") stays reachable."""
        comps = []
        for s in strings:
            ids = list(tokenizer.encode(s, add_special_tokens=False))
            if end and not free_after:
                ids.append(tokenizer.eos_token_id)
            comps.append(ids)
        return cls(comps, free_after)

    @property
    def longest(self) -> int:
        """Tokens of the longest whole reply it allows (0 when free text follows a head)."""
        return 0 if self.free_after else max(map(len, self.completions))

    @staticmethod
    def budget(max_new_tokens: int, constraint: list | None) -> int:
        """max_new_tokens, raised to the longest whole reply any of these constraints allows: a smaller
        budget would cut a valid reply."""
        return max([max_new_tokens] + [c.longest for c in constraint or () if c is not None])

    @functools.cached_property
    def trie(self) -> dict:
        """Nested dicts token -> child; key _END marks a complete completion. Reaching a complete completion
        ends the constraint (free_after) or the reply, even if a longer completion continues it: use end=True
        when completions prefix each other. Built once per Constraint."""
        if not self.completions or any(len(c) == 0 for c in self.completions):
            raise ValueError("Constraint needs at least one completion and no empty completion")
        root = {}
        for comp in self.completions:
            node = root
            for t in comp:
                node = node.setdefault(int(t), {})
            node[_END] = True
        return root

    def start(self) -> "Cursor":
        return Cursor(self.trie)


class Cursor:
    """One reply's place in its constraint's trie."""

    def __init__(self, node: dict):
        self.node = node

    def choices(self) -> list[int]:
        return [t for t in self.node if t != _END]

    def advance(self, token: int):
        self.node = self.node[token]

    def forced(self) -> int | None:
        """The only id allowed next, when exactly one is and no completion ends here."""
        return next(iter(self.node)) if len(self.node) == 1 and _END not in self.node else None

    @property
    def complete(self) -> bool:
        return _END in self.node

# ---------------------------------------------------------------------------------------------------------
# A constrained extractor's replies

@functools.lru_cache(maxsize=64)   # the lesson grammar's constraint is thousands of strings: build it once
def operation_heads(tok, shown: int, merge: bool = False, plans: tuple = (), none: bool = True) -> Constraint:
    """For a tiny extractor: the operation head is constrained; the lesson after it is free text, or, given
    `plans` (the lesson grammar, see `lesson_plans`), exactly one of them and the end of the reply. A merge's
    reply is the new list of one lesson (bank_merge.MergeChain): all shown merged into one (`UPDATE 1,...,n: `), or
    one of them kept as it is (`KEEP i`, the rest dropped), or NONE (all left as they are)."""
    heads = [] if merge else ["ADD: "]
    if shown:
        heads.append("UPDATE " + ",".join(str(i + 1) for i in range(shown)) + ": ")
    whole = [f"KEEP {i + 1}" for i in range(shown)] if merge else []   # whole replies: no lesson follows
    whole += ["NONE"] if none or not heads else []
    if plans:   # each string and the end of the reply
        return Constraint.from_strings(tok, [h + p for h in heads for p in plans] + whole)
    completions = [tok.encode(h, add_special_tokens=False) for h in heads]
    completions += [tok.encode(w, add_special_tokens=False) + [tok.eos_token_id] for w in whole]
    return Constraint(completions, free_after=True)


@functools.lru_cache(maxsize=16)
def lesson_plans(actions: tuple, n: int) -> tuple[str, ...]:
    """The lesson grammar: every plan of 1..n of the env's own action words, `southeast east`."""
    return tuple(" ".join(p) for k in range(1, n + 1) for p in itertools.product(actions, repeat=k))


def heads_for(run, shown: list[int], tasks: list[str], merge: bool = False,
              won: list[bool] | None = None) -> list | None:
    """A run's extractor constraints, one per prompt: None when it writes free text (crl.Run: cfg, pool,
    extractor_tok). `won`: whether each distilled episode succeeded (cfg.extractor_none "failure" reads it)."""
    if run.cfg.extractor_free_text:
        return None
    won = won or [False] * len(shown)
    return [operation_heads(run.extractor_tok, n, merge, task_plans(run, task), may_answer_none(run.cfg, w, merge))
            for n, task, w in zip(shown, tasks, won)]


def may_answer_none(cfg, won: bool, merge: bool = False) -> bool:
    """Whether the constrained extractor may answer NONE (cfg.extractor_none) distilling an episode that was or
    was not won; a merge may always leave its lessons as they are."""
    return merge or cfg.extractor_none == "always" or (cfg.extractor_none == "failure" and not won)


def task_plans(run, task: str) -> tuple[str, ...]:
    """The lesson grammar of `task` (empty without cfg.lesson_moves), from one of its envs' actions."""
    if not run.cfg.lesson_moves:
        return ()
    env = run.pool.take(task)
    run.pool.give(task, True, env)
    return lesson_plans(tuple(env.actions), run.cfg.lesson_moves)
