"""Probes: small measurements that ask why a run did what it did. Each is a module run from the repository
root with `python -m probes.NAME ...`; tests/test_probes.py runs each on a tiny setting. Their findings are
in results/README.md and results/probes.md. The closed probes p5-p8 (actor_policy, bank_value, memoryless,
pool_lessons) were retired after f2e927f: their records rebuild from that commit.

    episode         a trained run plays one held-out episode: its lesson, each turn read and replied, the outcome
    lesson_follow   P(move | a one-move lesson names it): does a lesson reach the actor?
    lessons         a run's bank: each lesson, its uses and success when used, and how the bank grew
    judge           P(accept) of right and wrong lessons: can an actor judge a lesson? (each preset's --judge)
    merge_cost      one whole-bank merge pass at a run's bank size, timed
    random_play     a task's floor: success of a random valid action each turn on held-out instances
    gpu_profile     where a GPU's time goes: the training and decode steps kernel by kernel; two threads decoding
    retrieval       retrieval precision before any RL: does the bank serve a vault a lesson of its family?
    curves          a grid's held-out curves by mode and panel: how fast each mode gets there, paired by seed

The finished vault study's probes are in probes/vault/ (`python -m probes.vault.NAME`, listed there; before
2026-12-01 they were `probes.NAME`).

Shared here: reading the words view (`ONE_MOVE`) and an actor's exact constrained policy (`policy`).
"""
import math
import re

import torch

from model import Session

ONE_MOVE = re.compile(r"stairs down \(>\): 1 (\w+)$", re.M)   # the stairs one move away, in the words view


def policy(model, tok, prompt: list[int], actions: tuple) -> torch.Tensor:
    """The constrained policy over `actions` after the prompt tokens, exactly: the product, over a reply's tokens,
    of each token's probability among the tokens the actions allow after its prefix (what `generate` samples
    from; a forced token counts 1). The logits are read only where the actions branch (`after_prompt`): the 16
    one-door lessons of the vault branch 3 times."""
    replies = [tok.encode(a, add_special_tokens=False) + [tok.eos_token_id] for a in actions]
    after = {}      # prefix -> the ids the replies allow after it
    for reply in replies:
        for j in range(len(reply)):
            after.setdefault(tuple(reply[:j]), set()).add(reply[j])
    branches = {p: sorted(ids) for p, ids in after.items() if len(ids) > 1}   # where there is a choice
    logp = {}
    if branches:
        for (p, allowed), logits in zip(branches.items(), after_prompt(model, prompt, list(branches))):
            logp[p] = dict(zip(allowed, torch.log_softmax(logits[allowed], 0).tolist()))
    return torch.tensor([math.exp(sum(logp[tuple(r[:j])][r[j]] for j in range(len(r)) if tuple(r[:j]) in logp))
                         for r in replies])


@torch.no_grad()
def after_prompt(model, prompt: list[int], prefixes: list[tuple], rows: int = 64) -> list[torch.Tensor]:
    """The next-token logits after prompt + each prefix: the prompt's k/v are computed once (cache row 0) and
    copied into `rows` rows at a time, which then read only their prefixes (a set grammar branches 500 times)."""
    session = Session(model, max_batch=rows + 1, max_len=len(prompt) + max(map(len, prefixes)) + 1, graphs=False)
    out = {(): session.prefill([0], [prompt])[0]}
    longer = sorted((p for p in prefixes if p), key=len)   # a chunk of like lengths pads little
    n = len(prompt)
    for i in range(0, len(longer), rows):
        chunk = longer[i:i + rows]
        session.k[:, 1:, :, :n] = session.k[:, :1, :, :n]
        session.v[:, 1:, :, :n] = session.v[:, :1, :, :n]
        session.lengths[1:] = n
        out.update(zip(chunk, session.prefill(list(range(1, len(chunk) + 1)), [list(p) for p in chunk])))
    return [out[tuple(p)] for p in prefixes]
