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
    run.counters = {"parse_failures": 0, "operations": 0, "merges": 0}
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


def test_merge_pass_updates_the_batches_it_drew(monkeypatch):
    """Anchors drawn from (seed, step, MERGE_PICKS); each batch is the anchor and its nearest entries, shown
    numbered to the extractor; `UPDATE i,j: text` replaces entries i and j of that batch, NONE changes
    nothing; applied, the bank loses the merged entries and gains the merged lesson."""
    emb = HashEmbedder()
    manager = ExperienceManager(ExperienceBank(emb.dim), emb, sync=True)
    texts = [f"go {w} at the {p}" for w in ("north", "south", "east") for p in ("door", "wall")]
    manager.apply([Operation("add", "room", t, key=emb([t])[0], source=i) for i, t in enumerate(texts)])
    run = tiny_run(manager, merge_size=3, merge_batches=2)
    entries = manager.bank.entries("room")
    picker = np.random.default_rng([run.seed, 4, crl.MERGE_PICKS])
    batches = [manager.bank.neighbours(entries[int(picker.integers(len(entries)))].id, 3) for _ in range(2)]
    shown = []

    def scripted(run_, prompts, tasks, rng, heads=None, record=True):
        shown.extend(run_.extractor_tok.decode(p) for p in prompts)
        return [(100, "UPDATE 1,3: go north, then east"), (101, "NONE")]

    monkeypatch.setattr(crl, "extractor_generate", scripted)
    ops = crl.merge_pass(run, 4, None)
    for text, batch in zip(shown, batches):
        assert all(f"[{k + 1}] {e.text}" in text for k, e in enumerate(batch))
    (op,) = ops
    assert (op.kind, op.text, op.ids, op.source, op.step) == ("update", "go north, then east",
                                                               (batches[0][0].id, batches[0][2].id), 100, 4)
    assert run.counters["merges"] == 1
    crl.apply_everywhere(run, ops)
    now = {e.text for e in manager.bank.entries("room")}
    assert now == set(texts) - {batches[0][0].text, batches[0][2].text} | {"go north, then east"}


def test_train_instances_draw_from_a_fixed_pool():
    """--train-instances N: every training group plays one of the seeds 0..N-1; without it, seeds spread."""
    pooled, fresh = tiny_run(train_instances=3, groups=8), tiny_run(groups=8)
    seeds = lambda run: {seed for step in range(6) for _, seed, _, _ in crl.episode_specs(run, step)}  # noqa: E731
    assert seeds(pooled) == {0, 1, 2}
    assert len(seeds(fresh)) == 48 and max(seeds(fresh)) < crl.EVAL_SEED0


def replies_and_prompts(run, eps):
    """Each segment of each episode: (its prompt text before the reply, the reply text)."""
    tok, out = run.actor_tok, []
    for e in eps:
        for s in e.segments:
            first = s.mask.index(True)
            out.append((tok.decode(s.tokens[:first]), e))
    return out


def test_history_windows_and_recent_moves():
    """--history 2: each turn is a fresh context of the system prompt, the last two (observation, reply) turns
    and the new observation; --recent-moves 2 ends each observation after the first with the last two
    replies, in the actor's view only (the transcript the extractor reads has none)."""
    run = tiny_run(history=2, recent_moves=2, max_steps=5)
    eps = crl.rollout(run, [("room", s, s, False) for s in range(3)], torch.Generator().manual_seed(1), 1.0)
    tok = run.actor_tok
    for e in eps:
        assert len(e.segments) == e.turns >= 3 and all(s.share == 1 / e.turns for s in e.segments)
        observations = [text for who, text in e.transcript if who == "environment"]
        replies = [text for who, text in e.transcript if who == "agent"]
        assert not any("last moves" in o for o in observations)
        seen = [observations[0]] + [o + "\nlast moves: " + " ".join(replies[max(0, k - 1):k + 1])
                                    for k, o in enumerate(observations[1:])]
        for k, s in enumerate(e.segments):
            turns = [{"role": "user", "content": seen[j]} if r == 0 else {"role": "assistant", "content": replies[j]}
                     for j in range(max(0, k - 2), k) for r in (0, 1)]
            prompt = crl.encode_chat(tok, turns + [{"role": "user", "content": seen[k]}])
            assert s.tokens[:len(prompt)] == prompt and not any(s.mask[:len(prompt)])
            assert tok.decode([t for t, m in zip(s.tokens, s.mask) if m]).rstrip("\n").removesuffix(
                tok.eos_token) == replies[k]


def test_query_map_keys_retrieval_by_the_map():
    """--query-map: with the map hidden from the actor, the retrieval query and the first view the extractor
    reads are the map view; without it, the actor's own first observation."""
    import envs
    specs = [("room", s, s, False) for s in (3, 4)]
    for query_map in (True, False):
        run = tiny_run(query_map=query_map, max_steps=1)
        eps = crl.rollout(run, specs, torch.Generator().manual_seed(0), 1.0)
        for e in eps:
            env = envs.make("room", show_map=False)
            first = env.reset(seed=e.seed)
            view = env.map_view() if query_map else first
            assert view != first or not query_map
            assert e.query == f"{env.instruction}\n{view}" and e.transcript[0] == ("environment", view)


def test_a_fractional_webshop_reward_reaches_the_advantages(monkeypatch):
    """A scripted purchase of a product that matches a third of the goal (WebShop seed 3 of test) earns 1/3;
    the episode keeps that reward (not its failed success) and the actor's advantages centre it."""
    from model import Constraint
    buy = ["search[remote for rca wi-fi streaming media player dsb772e]", "click[b00r249c5g]", "click[buy now]"]
    script = {0: buy, 1: buy, 2: ["click[next >]"] * 3, 3: ["click[next >]"] * 3}
    turn, real = {}, crl.generate

    def scripted(model, prompts, *args, **kw):
        kw["constraint"] = [Constraint.from_strings(run.actor_tok, [f"<answer>{script[r][turn.get(r, 0)]}</answer>"])
                            for r in kw["rows"]]
        for r in kw["rows"]:
            turn[r] = turn.get(r, 0) + 1
        return real(model, prompts, *args, **kw)

    monkeypatch.setattr(crl, "generate", scripted)
    run = tiny_run(free_text=True, max_steps=3, max_reply_tokens=128, mode="grpo")
    eps = crl.rollout(run, [("webshop", 3, 0, False)] * 4, torch.Generator().manual_seed(0), 1.0, train=False)
    assert [e.reward for e in eps] == pytest.approx([1 / 3, 1 / 3, 0, 0]) and not any(e.success for e in eps)
    seen = {}
    monkeypatch.setattr(crl, "policy_update", lambda run_, model, opt, segs, advs, *a: seen.update(advs=advs) or {})
    crl.actor_update(run, eps)
    assert seen["advs"] == pytest.approx([1 / 6, 1 / 6, -1 / 6, -1 / 6])
