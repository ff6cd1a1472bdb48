"""The paper's equations against hand-computed numbers: split advantages, PPO-clip (GRPO) and CISPO, their
aggregation, and which tokens carry gradient; plus the extractor's operation parser."""
import math

import pytest
import torch

import crl
from crl import aggregate, cispo_loss, grpo_loss, parse_operations, split_advantages

# ratios r = exp(logp - old_logp) with old_logp = 0; row 0 has advantage +1 (2 valid tokens), row 1 has -2
R = torch.tensor([[1.5, 0.9, 1.0], [0.7, 1.1, 1.3]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
ADV = torch.tensor([1.0, -2.0], dtype=torch.float64)


def _logp():
    return R.log().clone().requires_grad_(True)


def test_split_advantages_by_hand():
    rewards = torch.tensor([1., 0, 1, 1, 0, 0, 1, 0, 1, 1, 1, 1, 0, 0, 0, 0])
    group = torch.tensor([0] * 8 + [1] * 8)
    with_exp = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1] * 2, dtype=torch.bool)
    adv = split_advantages(rewards, group, with_exp)
    # group 0: no-exp mean 0.75, exp mean 0.25; group 1: no-exp mean 1 (all zero), exp mean 0
    expected = [0.25, -0.75, 0.25, 0.25, -0.25, -0.25, 0.75, -0.25] + [0.0] * 8
    assert torch.allclose(adv, torch.tensor(expected), atol=1e-6)
    # without the split (grpo mode: every rollout without experience) the whole group shares one mean 0.5
    adv = split_advantages(rewards[:8], group[:8], torch.zeros(8, dtype=torch.bool))
    assert torch.allclose(adv, rewards[:8] - 0.5)


def test_grpo_loss_by_hand():
    # per-token max(-A r, -A clip(r, 0.8, 1.2)):
    # row 0 (A=+1): r=1.5 -> max(-1.5, -1.2) = -1.2 (clipped); r=0.9 -> -0.9
    # row 1 (A=-2): r=0.7 -> max(1.4, 1.6) = 1.6 (clipped); r=1.1 -> 2.2; r=1.3 -> max(2.6, 2.4) = 2.6
    logp = _logp()
    loss = grpo_loss(logp, torch.zeros_like(R), ADV, MASK, clip=0.2)
    assert loss.item() == pytest.approx(((-1.2 - 0.9) / 2 + (1.6 + 2.2 + 2.6) / 3) / 2, abs=1e-9)
    loss.backward()
    # d/dlogp (-A r) = -A r, divided by the sequence's token count and the number of sequences; clipped
    # tokens (the objective is the constant bound) get none; r=1.3 with A<0 is not clipped by the max
    expected = torch.tensor([[0.0, -0.9 / 4, 0.0], [0.0, 2 * 1.1 / 6, 2 * 1.3 / 6]], dtype=torch.float64)
    assert torch.allclose(logp.grad, expected, atol=1e-9)


def test_cispo_loss_by_hand():
    # weights sg(clip(r, 0.9, 1.1)): row 0 [1.1, 0.9], row 1 [0.9, 1.1, 1.1]; per token -w A log r
    logp = _logp()
    loss = cispo_loss(logp, torch.zeros_like(R), ADV, MASK, eps_low=0.1, eps_high=0.1)
    row0 = (-1.1 * math.log(1.5) - 0.9 * math.log(0.9)) / 2
    row1 = (2 * 0.9 * math.log(0.7) + 2 * 1.1 * math.log(1.1) + 2 * 1.1 * math.log(1.3)) / 3
    assert loss.item() == pytest.approx((row0 + row1) / 2, abs=1e-9)
    loss.backward()
    # every valid token keeps a gradient -w A / (tokens * sequences), clipped ones included
    expected = torch.tensor([[-1.1 / 4, -0.9 / 4, 0.0], [2 * 0.9 / 6, 2 * 1.1 / 6, 2 * 1.1 / 6]], dtype=torch.float64)
    assert torch.allclose(logp.grad, expected, atol=1e-9)


def test_on_policy_ratio_one_gives_plain_policy_gradient():
    # at r = 1 both objectives reduce to -A * logp's gradient: -A / tokens / sequences per token
    logp = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    g = []
    for fn in (grpo_loss, cispo_loss):
        logp.grad = None
        fn(logp, torch.zeros(2, 3, dtype=torch.float64), ADV, MASK).backward()
        g.append(logp.grad.clone())
    expected = torch.tensor([[-1 / 4, -1 / 4, 0], [2 / 6, 2 / 6, 2 / 6]], dtype=torch.float64)
    assert torch.allclose(g[0], expected) and torch.allclose(g[1], expected)


def test_aggregate_global_denominators_sum_over_micro_batches():
    per_token = torch.tensor([[1.0, 2.0, 0.0], [3.0, 4.0, 5.0]])
    full = aggregate(per_token, MASK)
    parts = sum(aggregate(per_token[i:i + 1], MASK[i:i + 1], num_seqs=2) for i in range(2))
    assert full.item() == pytest.approx(parts.item()) == pytest.approx((1.5 + 4.0) / 2)


def test_parse_operations():
    ops, bad = parse_operations("ADD: keep to the walls\nUPDATE 1,2: avoid the water\nNONE", shown=2)
    assert ops == [("add", (), "keep to the walls"), ("update", (1, 2), "avoid the water")] and bad == 0
    # reasoning outside the answer tag is fine; inside it, a malformed line is counted and skipped
    ops, bad = parse_operations("<think>hmm</think>I think so.\n<answer>\nADD: go east\nfoo bar\n</answer>", 1)
    assert ops == [("add", (), "go east")] and bad == 1
    ops, bad = parse_operations("UPDATE 3: refers to a lesson that was not shown", shown=1)
    assert ops == [] and bad == 1
    ops, bad = parse_operations("", shown=0)
    assert ops == [] and bad == 1
    ops, bad = parse_operations("NONE", shown=0)
    assert ops == [] and bad == 0
    ops, bad = parse_operations("\n".join(f"ADD: lesson {i}" for i in range(5)), shown=0)
    assert [o[2] for o in ops] == ["lesson 0", "lesson 1", "lesson 2"] and bad == 0   # at most 3


def test_windowed_episode_counts_as_one_sequence():
    # an episode of 3 actor tokens split into two windows (2 + 1 tokens) weighs what the whole sequence
    # weighs: each window divides by the episode's 3 tokens, and the two halves make one sequence
    whole = aggregate(torch.tensor([[1.0, 2.0, 3.0]]), torch.ones(1, 3, dtype=torch.bool))
    windows = aggregate(torch.tensor([[1.0, 2.0], [3.0, 0.0]]), torch.tensor([[1, 1], [1, 0]], dtype=torch.bool),
                        num_seqs=1.0, seq_tokens=torch.tensor([3.0, 3.0]))
    assert whole.item() == pytest.approx(2.0) and windows.item() == pytest.approx(2.0)


@pytest.mark.parametrize("split", [True, False])
def test_the_run_splits_advantages_by_experience(monkeypatch, split):
    """actor_update as train_step calls it: two instances of four rollouts, the last two of each with
    experience. Split, each half is centred on its own mean; --no-split, the whole group on one mean."""
    from types import SimpleNamespace
    seen = {}
    monkeypatch.setattr(crl, "policy_update", lambda upd, segments, adv: seen.setdefault("adv", adv)
                        and {})
    rewards = [1, 0, 1, 1, 0, 0, 1, 0]
    eps = [crl.Episode("room", 0, i // 4, i % 4 >= 2, reward=r, segments=[crl.Segment()])
           for i, r in enumerate(rewards)]
    run = SimpleNamespace(cfg=crl.CRLConfig(split=split), actor=None, actor_opt=None, timer={})
    crl.actor_update(run, eps)
    # by hand: split, group 0 without (1, 0) -> +-0.5, with (1, 1) -> 0; group 1 without (0, 0) -> 0, with (1, 0)
    # -> +-0.5; one group of four: group 0 mean 0.75, group 1 mean 0.25
    want = ([0.5, -0.5, 0, 0, 0, 0, 0.5, -0.5] if split else
            [0.25, -0.75, 0.25, 0.25, -0.25, -0.25, 0.75, -0.25])
    assert seen["adv"] == pytest.approx(want)
