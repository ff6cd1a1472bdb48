"""Paths of crl.py that the end-to-end runs rarely reach, each checked by its effect: an episode cut by the
context limit ends as a failure, a non-finite loss skips the update and leaves the weights, evaluation plays
held-out seeds and leaves the bank as it was, and `distill_choice` alternates outcomes."""
import math

import numpy as np
import pytest
import torch

import crl
from bank import ExperienceBank, ExperienceManager, Operation
from model import Transformer, load_tokenizer
from test_bank import HashEmbedder


def tiny_run(manager=None, **settings) -> crl.Run:
    """A Run of the tiny actor (seed 0) and extractor (seed 1), actions constrained, no optimizers."""
    cfg = crl.CRLConfig(**{"free_text": False, "instructions": False, "show_map": False, "max_steps": 10,
                           "max_reply_tokens": 16, **settings})
    tok = load_tokenizer("tiny")
    run = crl.Run(cfg, ["room"], 0, Transformer.tiny(seed=0), tok, None, Transformer.tiny(seed=1), tok, None,
                  manager)
    run.timer = {"generate": 0.0, "env": 0.0, "extractor": 0.0, "extractor_update": 0.0}
    return run


def test_the_context_limit_ends_an_episode_as_a_failure():
    run = tiny_run(max_context=420)    # the first turn fits; a whole 10-action episode does not
    eps = crl.rollout(run, [("room", s, s, False) for s in range(4)], torch.Generator().manual_seed(0), 1.0)
    cut = [e for e in eps if e.truncated]
    assert cut, "no episode reached the context limit"
    for e in cut:
        assert e.reward == 0.0 and not e.success and 1 <= e.turns < 10
        assert sum(len(s.tokens) for s in e.segments) <= 420   # nothing beyond the limit was fed


def test_a_non_finite_loss_skips_the_update():
    model = Transformer.tiny(seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    with pytest.warns(UserWarning, match="update skipped"):
        out = crl.clip_and_step(tiny_run(), model, opt, math.nan)
    assert out == {"skipped": 1}
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())   # no stale gradient reaches the next step


def test_evaluation_plays_held_out_seeds_and_leaves_the_bank(monkeypatch):
    emb = HashEmbedder()
    manager = ExperienceManager(ExperienceBank(emb.dim), emb, sync=True)
    manager.apply([Operation("add", "room", f"lesson {i}", key=emb([f"start {i}"])[0], source=i) for i in range(5)])
    run = tiny_run(manager)
    part = manager.bank._parts["room"]
    state = lambda: ([(e.uses, e.successes) for e in manager.bank.entries("room")], part.tick,   # noqa: E731
                     part.last_hit.copy())
    before = state()
    played = []
    rollout = crl.rollout

    def spy(run_, specs, rng, temperature, train=True):
        played.extend((seed, with_exp, train) for _, seed, _, with_exp in specs)
        return rollout(run_, specs, rng, temperature, train)

    monkeypatch.setattr(crl, "rollout", spy)
    crl.evaluate(run, ["room"], 3)
    assert sorted(played) == sorted((crl.EVAL_SEED0 + j, w, False) for j in range(3) for w in (False, True))
    after = state()
    assert after[0] == before[0] and after[1] == before[1] and np.array_equal(after[2], before[2])


def test_distill_choice_alternates_successes_and_failures():
    def ep(i, success):
        e = crl.Episode("room", i, 0, False)
        e.success = success
        return e

    members = [ep(0, False), ep(1, False), ep(2, True), ep(3, False), ep(4, True)]
    assert [e.seed for e in crl.distill_choice(list(members), 3)] == [2, 0, 4]
    assert [e.seed for e in crl.distill_choice(list(members), 10)] == [2, 0, 4, 1, 3]
    assert [e.seed for e in crl.distill_choice([ep(0, False), ep(1, False)], 1)] == [0]
