"""The extractor's reward path against hand-computed numbers (PAPER §Extractor objective): each episode credits
the generations behind what it used (+1 on success, -1 on failure), a generation's reward is its mean credit,
A = reward - the batch mean, a CISPO step waits for `extractor_batch` rewarded generations, unrewarded ones
beyond `max_generations` are dropped oldest first, and an answered ask is credited like a lesson."""
import pytest
import torch

import crl
from bank import ExperienceBank, ExperienceManager, Operation
from test_bank import HashEmbedder
from test_paths import tiny_run


def make_run(**settings) -> crl.Run:
    emb = HashEmbedder()
    return tiny_run(ExperienceManager(ExperienceBank(emb.dim), emb, sync=True),
                    **{"extractor_batch": 3, "extractor_reply_tokens": 8, **settings})


def generation(run, gid: int, credits=()) -> crl.Generation:
    run.generations[gid] = crl.Generation(gid, "room", [1, 2, 3], [4, 5], [-1.0, -2.0], [None, None], list(credits))
    return run.generations[gid]


def episode(success: bool, sources) -> crl.Episode:
    e = crl.Episode("room", 0, 0, True)
    e.success, e.sources, e.instruction = success, list(sources), "Find the stairs."
    return e


def test_each_episode_credits_the_generations_it_used():
    run = make_run()
    for gid in (10, 11, 12):
        generation(run, gid)
    crl.credit_generations(run, [episode(True, [10, 11]), episode(False, [11]), episode(False, [99])])
    assert run.generations[10].credits == [1.0]
    assert run.generations[11].credits == [1.0, -1.0]
    assert run.generations[12].credits == []         # used by no episode
    assert 99 not in run.generations                 # a generation no longer kept is not resurrected


def test_reward_is_the_mean_credit_and_the_advantage_its_distance_from_the_batch_mean(monkeypatch):
    run = make_run(extractor_batch=3)
    generation(run, 0, [1.0, 1.0, -1.0])              # reward 1/3
    generation(run, 1, [-1.0])                        # -1
    generation(run, 2, [1.0, 1.0])                    # 1
    generation(run, 3)                                # no credit yet: it waits
    seen = {}

    def update(run_, model, opt, segments, advantages, loss_fn, clip_range, temperature, minibatches=1):
        seen.update(model=model, segments=segments, advantages=advantages, loss_fn=loss_fn, clip=clip_range)
        return {"loss": 0.0}

    monkeypatch.setattr(crl, "policy_update", update)
    stats = crl.extractor_update(run)
    mean = (1 / 3 - 1 + 1) / 3
    assert stats["reward"] == pytest.approx(mean) and stats["generations"] == 3
    assert seen["advantages"] == pytest.approx([1 / 3 - mean, -1 - mean, 1 - mean])
    assert seen["model"] is run.extractor and seen["loss_fn"].func is crl.cispo_loss
    assert seen["clip"] == pytest.approx((0.9, 1.1))
    s = seen["segments"][0]                           # the prompt is context, the generated tokens are trained
    assert s.tokens == [1, 2, 3, 4, 5] and s.mask == [False, False, False, True, True]
    assert s.logprobs == [0.0, 0.0, 0.0, -1.0, -2.0]   # the sampler's log-probs: the ratio's denominator
    assert sorted(run.generations) == [3]             # the trained ones leave; the uncredited one stays


def test_no_step_below_the_batch_threshold(monkeypatch):
    run = make_run(extractor_batch=3)
    generation(run, 0, [1.0])
    generation(run, 1, [-1.0])
    generation(run, 2)
    monkeypatch.setattr(crl, "policy_update", lambda *a, **k: pytest.fail("a CISPO step below the threshold"))
    assert crl.extractor_update(run) == {}
    assert sorted(run.generations) == [0, 1, 2]


def test_unrewarded_generations_beyond_the_cap_are_dropped_oldest_first():
    run = make_run(extractor_batch=100, max_generations=2)
    for gid in (5, 3, 9, 7):
        generation(run, gid)
    assert crl.extractor_step(run) == {}
    assert sorted(run.generations) == [7, 9]


@pytest.mark.parametrize("mode", ["crl", "static"])
def test_an_answered_ask_is_credited_like_a_lesson(mode):
    run = make_run(mode=mode)
    run.manager.apply([Operation("add", "room", "go east", key=run.manager.embed(["q"])[0], source=-1)])
    e = episode(False, [])
    answers = crl.search_and_ask(run, [(e, "where are the stairs?")], torch.Generator().manual_seed(0))
    assert len(answers) == 1 and len(e.sources) == 1  # the answer's generation is what the episode used
    gid = e.sources[0]
    if mode == "static":                              # a frozen extractor keeps nothing to train on
        assert gid not in run.generations
        return
    e.success = True
    crl.credit_generations(run, [e])
    assert run.generations[gid].credits == [1.0]


def test_lift_credits_the_gain_over_the_group_played_without_experience():
    """--credit lift: a with-experience episode credits its reward minus the mean reward of its group's
    episodes without experience (hand numbers); episodes without experience, or groups with none, give 0."""
    def ep(group, with_exp, reward, sources=()):
        e = crl.Episode("room", group, group, with_exp)
        e.reward, e.success, e.sources = reward, reward == 1.0, list(sources)
        return e

    eps = [ep(0, False, 1.0), ep(0, False, 0.0), ep(0, True, 1.0, [10]), ep(0, True, 0.0, [11]),
           ep(1, False, 0.0), ep(1, False, 0.0), ep(1, True, 1.0, [12]), ep(2, True, 0.25, [13])]
    assert crl.episode_lift(eps) == [0.0, 0.0, 0.5, -0.5, 0.0, 0.0, 1.0, 0.0]

    def credited(**settings):
        run = make_run(**settings)
        for gid in (10, 11, 12, 13):
            generation(run, gid)
        crl.credit_generations(run, eps)
        return [run.generations[g].credits for g in (10, 11, 12, 13)]

    assert credited(credit="lift") == [[0.5], [-0.5], [1.0], [0.0]]
    assert credited() == [[1.0], [-1.0], [1.0], [-1.0]]   # the default, outcome: ±1 on the same episodes
