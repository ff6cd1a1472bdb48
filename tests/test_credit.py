"""The extractor's reward path against hand-computed numbers (PAPER §Extractor objective): each episode credits
the generations behind what it used (its score, 0 -> -1, shaped by the actor's verdict on the lesson: the
release's rule), a generation's reward is its mean credit (again after its update, on its new uses),
A = reward - the batch mean, a CISPO step waits for `extractor_batch` rewarded generations and trains the
`extractor_batch` credited last, beyond MAX_GENERATIONS the oldest generations that hold no credit and wrote
no live lesson are dropped, and an ask shows the re-ranked top 1, counts it, and is credited like a lesson."""
import types

import pytest
import torch

import crl
import vault_study
from bank import ExperienceBank, ExperienceManager, Operation
from test_bank import HashEmbedder
from test_crl import tiny_run


def make_run(**settings) -> crl.Run:
    emb = HashEmbedder()
    return tiny_run(ExperienceManager(ExperienceBank(emb.dim), emb, sync=True),
                    **{"extractor_batch": 3, "extractor_reply_tokens": 8, **settings})


def generation(run, gid: int, credits=()) -> crl.Generation:
    run.generations[gid] = crl.Generation(gid, "room", [1, 2, 3], [4, 5], [-1.0, -2.0], [None, None], list(credits))
    return run.generations[gid]


def episode(success: bool, sources) -> crl.Episode:
    e = crl.Episode("room", 0, 0, True)
    e.success, e.reward, e.sources, e.instruction = success, float(success), list(sources), "Find the stairs."
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

    def update(upd, segments, advantages):
        seen.update(model=upd.model, segments=segments, advantages=advantages, loss_fn=upd.loss, clip=upd.clip_range)
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
    assert sorted(run.generations) == [0, 1, 2, 3]    # [release] the trained ones stay, awaiting new uses
    assert [run.generations[g].credits for g in range(4)] == [[], [], [], []]


def test_no_step_below_the_batch_threshold(monkeypatch):
    run = make_run(extractor_batch=3)
    generation(run, 0, [1.0])
    generation(run, 1, [-1.0])
    generation(run, 2)
    monkeypatch.setattr(crl, "policy_update", lambda *a, **k: pytest.fail("a CISPO step below the threshold"))
    assert crl.extractor_update(run) == {}
    assert sorted(run.generations) == [0, 1, 2]


def test_a_step_trains_the_generations_credited_last_and_drops_the_older_credits(monkeypatch):
    """[release] Its buffer holds `extractor_batch` slots and evicts the oldest on insert: a step trains the
    generations whose credits began latest (then the higher id), the older ones lose their credits untrained.
    Batch 3. Iteration 1 credits 1 (+1), 2 and 3 (-1); iteration 2 credits 4 and 0 (+1) and 1 again (-1: its
    place stays at iteration 1). The queue, last first: 4, 0 (iteration 2), 3, 2, 1: a step on 0, 3, 4 with
    rewards +1, -1, +1, mean 1/3; 1 and 2 are evicted, and all five stay, awaiting new uses."""
    run = make_run(extractor_batch=3)
    for gid in range(5):
        generation(run, gid)
    run.step = 1
    crl.credit_generations(run, [episode(True, [1]), episode(False, [2, 3])])
    run.step = 2
    crl.credit_generations(run, [episode(True, [4, 0]), episode(False, [1])])
    assert [run.generations[g].queued for g in range(5)] == [2, 1, 1, 1, 2]
    seen = {}
    monkeypatch.setattr(crl, "policy_update", lambda upd, segments, advantages: seen.update(
        n=len(segments), advantages=advantages) or {})
    assert crl.extractor_update(run) == {"reward": pytest.approx(1 / 3), "generations": 3, "evicted": 2}
    assert seen["n"] == 3 and seen["advantages"] == pytest.approx([2 / 3, -4 / 3, 2 / 3])   # 0, 3, 4
    assert sorted(run.generations) == [0, 1, 2, 3, 4] and not any(g.credits for g in run.generations.values())


def test_under_ddp_each_rank_trains_its_own_among_the_newest_of_all(monkeypatch):
    """Every rank orders every rank's queue the same way. This rank holds 0 (queued at iteration 2, +1), 2 and
    4 (iteration 1, -1 and +1); the other holds 1 (iteration 2, -1) and 3 (iteration 1). Batch 3, the newest
    of all: 1, 0, 4. This rank trains 0 and 4; the mean is over all three, (1 - 1 + 1) / 3."""
    run = make_run(extractor_batch=3)
    for gid, credit, queued in ((0, 1.0, 2), (2, -1.0, 1), (4, 1.0, 1)):
        generation(run, gid, [credit]).queued = queued
    monkeypatch.setattr(crl, "gather_objects", lambda mine: [mine, [(2, 1), (1, 3)]])
    monkeypatch.setattr(crl, "all_reduce_sum", lambda x: x - 1.0)   # the other rank's rewards: 1's -1
    seen = {}
    monkeypatch.setattr(crl, "policy_update", lambda upd, segments, advantages: seen.update(
        advantages=advantages) or {})
    assert crl.extractor_update(run) == {"reward": pytest.approx(1 / 3), "generations": 3, "evicted": 2}
    assert seen["advantages"] == pytest.approx([2 / 3, 2 / 3])


def test_a_generation_is_kept_while_its_lesson_lives_or_its_credits_wait(monkeypatch):
    """Beyond crl.MAX_GENERATIONS only generations that can earn nothing more go, oldest first: no credit waiting
    and no live entry naming them as its source. 0 wrote lesson A and holds a credit; 1 wrote lesson B, which a
    merge (call 4) replaced; 2 holds a credit, its lesson gone; 3 and 5 wrote NONE. Cap 4: 1 and 3 go. Then A is
    used again, B's old writer 1 earns nothing, and a step (batch 2) trains 0 and 2. Cap 1: 2 (trained, no
    lesson) and 5 go; 0 and 4 stay past the cap while their lessons live, and A's next use credits 0."""
    run = make_run(extractor_batch=3)
    monkeypatch.setattr(crl, "MAX_GENERATIONS", 4)
    key = run.manager.embed(["a", "b"])
    a, b = run.manager.apply([Operation("add", "room", "lesson A", key=key[0], source=0),
                              Operation("add", "room", "lesson B", key=key[1], source=1)])
    run.manager.apply([Operation("update", "room", "lesson B merged", ids=(b,), source=4)])
    assert [(e.text, e.source) for e in run.manager.bank.entries("room")] == [("lesson A", 0), ("lesson B merged", 4)]
    for gid in range(6):
        generation(run, gid, [1.0] if gid == 0 else [-1.0] if gid == 2 else [])
    assert crl.extractor_update(run) == {}                     # 2 credited, the batch is 3
    assert sorted(run.generations) == [0, 2, 4, 5]
    crl.credit_generations(run, [episode(True, [0]), episode(True, [1])])
    run.cfg.extractor_batch = 2
    monkeypatch.setattr(crl, "MAX_GENERATIONS", 1)
    monkeypatch.setattr(crl, "policy_update", lambda *args: {})
    assert crl.extractor_update(run) == {"reward": pytest.approx(0.0), "generations": 2, "evicted": 0}   # 1, -1
    assert sorted(run.generations) == [0, 4]
    crl.credit_generations(run, [episode(False, [0])])
    assert run.generations[0].credits == [-1.0]


def test_idle_generations_beyond_the_cap_are_dropped_oldest_first(monkeypatch):
    run = make_run(extractor_batch=100)
    monkeypatch.setattr(crl, "MAX_GENERATIONS", 2)
    for gid in (5, 3, 9, 7):
        generation(run, gid)
    assert crl.extractor_update(run) == {}
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
    e.success, e.reward = True, 1.0
    crl.credit_generations(run, [e])
    assert run.generations[gid].credits == [1.0]


def spy_extractor(monkeypatch) -> list:
    """extractor_generate as it is, each call's (prompts, outputs) recorded."""
    calls, real = [], crl.extractor_generate

    def spy(run_, prompts, *args, **kw):
        calls.append((prompts, real(run_, prompts, *args, **kw)))
        return calls[-1][1]

    monkeypatch.setattr(crl, "extractor_generate", spy)
    return calls


def test_an_ask_shows_the_reranked_top_1_and_counts_it(monkeypatch):
    """[release] An ask is the bank's search, its top 1 after the re-rank, at the iteration under way (30). By
    cosine X, Y, Z; X was shown twice this iteration, Y once at iteration 1: on the rank scale X scores
    0 - 0.4 log 3 - 1 (recent) = -1.44, Y -1 - 0.4 log 2 = -1.28, Z -2, so the ask shows Y alone. The search
    counts nothing at once; record_outcomes counts Y as shown at 30 and credits the answer's generation."""
    run = make_run(extractor_free_text=True)
    q = "where are the stairs?"
    key = run.manager.embed([q, "y", "z"])
    keys = [key[0], torch.nn.functional.normalize(key[0] + key[1], dim=0), key[2]]
    x, y, z = run.manager.apply([Operation("add", "room", f"lesson {n}", key=k, source=-1)
                                 for n, k in zip("XYZ", keys)])
    assert float(keys[1] @ key[0]) > float(keys[2] @ key[0])   # the cosine order: X, Y, Z
    bank, run.step = run.manager.bank, 30
    bank.count_shown([x, x], 30)
    bank.count_shown([y], 1)
    calls = spy_extractor(monkeypatch)
    e = episode(False, [])
    answers = crl.search_and_ask(run, [(e, q)], torch.Generator().manual_seed(0))
    prompt = run.extractor_tok.decode(calls[0][0][0])
    assert "Lessons:\n[1] lesson Y<|im_end|>" in prompt and "lesson X" not in prompt and "lesson Z" not in prompt
    assert e.asked == [y] and e.sources == [calls[0][1][0][0]] and answers != [crl.NO_LESSONS]
    shown = lambda: [(en.id, en.shown) for en in bank.entries("room")]   # noqa: E731
    assert shown() == [(x, 2), (y, 1), (z, 0)]
    e.success, e.reward = True, 1.0
    crl.record_outcomes(run, [e])
    part = bank._parts["room"]
    assert shown() == [(x, 2), (y, 2), (z, 0)] and part.last_shown[part.row_of[y]] == 30
    assert run.generations[e.sources[0]].credits == [1.0]


def test_an_ask_where_the_task_has_no_lesson_gets_a_fixed_answer(monkeypatch):
    """[release] An ask on a task whose bank is empty finds nothing: it gets "(no lessons)", no extractor call,
    no generation and nothing to credit; the other asks of the same call are answered as usual."""
    run = make_run()
    run.manager.apply([Operation("add", "room", "go east", key=run.manager.embed(["q"])[0], source=-1)])
    calls = spy_extractor(monkeypatch)
    maze, room = crl.Episode("maze", 0, 0, True), episode(False, [])
    answers = crl.search_and_ask(run, [(maze, "where?"), (room, "where?")], torch.Generator().manual_seed(0))
    assert answers[0] == crl.NO_LESSONS and maze.sources == [] and maze.asked == []
    assert len(calls) == 1 and len(calls[0][0]) == 1 and list(run.generations) == room.sources
    assert answers[1] == (calls[0][1][0][1].split("</think>")[-1].strip() or "(no answer)")
    assert crl.search_and_ask(run, [(maze, "again?")], None) == [crl.NO_LESSONS] and len(calls) == 1


def test_a_training_rollout_records_its_asks_and_an_evaluation_does_not(monkeypatch):
    """The path a run takes: each with-experience episode's first reply asks (scripted). Evaluation records no
    generation and counts nothing. In training each answer is a generation its episode credits; the one
    lesson, shown by the training retrieval twice, is counted twice more once the rollout is over."""
    from small.grammar import Constraint
    run = make_run(free_text=True, max_steps=2, max_reply_tokens=24, judge="none", warmup=0)
    run.manager.apply([Operation("add", "room", "go east", key=run.manager.embed(["q"])[0], source=-1)])
    real, replies = crl.generate, {}

    def first_reply_asks(model, prompts, *args, **kw):
        if kw.get("session") is not None:   # the actor's turns: row r's first reply asks, the rest act
            kw["constraint"] = [Constraint.from_strings(run.actor_tok, [
                "<answer>east</answer>" if replies.setdefault(r, []) else "<ask>where?</ask>"]) for r in kw["rows"]]
            for r in kw["rows"]:
                replies[r].append(1)
        return real(model, prompts, *args, **kw)

    monkeypatch.setattr(crl, "generate", first_reply_asks)
    specs = [("room", s, s, w) for s in (1, 2) for w in (False, True)]
    entry = run.manager.bank.entries("room")[0]
    for train in (False, True):
        run.step = 6
        replies.clear()
        eps = crl.rollout(run, specs, torch.Generator().manual_seed(0), 1.0, train=train)
        asking = [e for e in eps if e.with_exp]
        assert [e.asks for e in eps] == [0, 1, 0, 1] and all(e.asked == [entry.id] for e in asking)
        assert all(("experience bank", crl.NO_LESSONS) not in e.transcript for e in asking)
        assert [e.sources for e in asking] == [[-1, 2 * train], [-1, 2 * train + 1]]   # the lesson's, the answer's
        assert sorted(run.generations) == ([2, 3] if train else [])
    assert entry.shown == 2                           # the training retrieval's two; the asks' come later
    crl.record_outcomes(run, eps)
    assert entry.shown == 4 and [len(run.generations[g].credits) for g in (2, 3)] == [1, 1]


def credited(eps, **settings) -> list:
    """The credits generations 10-13 hold after `eps` credit them under `settings`."""
    run = make_run(**settings)
    for gid in (10, 11, 12, 13):
        generation(run, gid)
    crl.credit_generations(run, eps)
    return [run.generations[g].credits for g in (10, 11, 12, 13)]


def test_lift_credits_the_gain_over_the_group_played_without_experience():
    """--credit lift: a with-experience episode credits its reward minus the mean reward of its group's
    episodes without experience (hand numbers); episodes without experience, or groups with none, give 0."""
    def ep(group, with_exp, reward, sources=()):
        e = crl.Episode("room", group, group, with_exp)
        e.reward, e.success, e.sources = reward, reward == 1.0, list(sources)
        return e

    eps = [ep(0, False, 1.0), ep(0, False, 0.0), ep(0, True, 1.0, [10]), ep(0, True, 0.0, [11]),
           ep(1, False, 0.0), ep(1, False, 0.0), ep(1, True, 1.0, [12]), ep(2, True, 0.25, [13])]
    assert vault_study.episode_lift(eps) == [0.0, 0.0, 0.5, -0.5, 0.0, 0.0, 1.0, 0.0]

    assert credited(eps, credit="lift") == [[0.5], [-0.5], [1.0], [0.0]]
    assert credited(eps) == [[1.0], [-1.0], [1.0], [0.25]]   # the default, outcome: the score, 0 -> -1


def test_first_lift_pays_only_a_first_action_win():
    """--credit first-lift: the lift of an episode's reward where only a first-action win counts, on both sides of
    the difference (hand numbers), so two wrong lessons cost the same whichever door they named (a vault won at the
    2nd and the 3rd action)."""
    def ep(with_exp, reward, turns, sources=()):
        e = crl.Episode("vault", 0, 0, with_exp)
        e.reward, e.success, e.turns, e.sources = reward, reward == 1.0, turns, list(sources)
        return e

    eps = [ep(False, 1.0, 2), ep(False, 1.0, 1), ep(True, 1.0, 1, [10]), ep(True, 1.0, 3, [11]),
           ep(True, 0.0, 3, [12]), ep(True, 1.0, 2, [13])]
    assert vault_study.episode_lift(eps, first_only=True) == [0.0, 0.0, 0.5, -0.5, -0.5, -0.5]   # without: 0.5
    assert credited(eps, credit="first-lift") == [[0.5], [-0.5], [-0.5], [-0.5]]
    assert credited(eps, credit="lift") == [[0.0], [0.0], [-1.0], [0.0]]          # every win counts


def test_credit_follows_the_verdict_and_the_score_by_hand():
    """The release's mapping: accept = score + 1 (+2 on a success, +1 on a failure), refine +0.5, reject -1,
    unparsed or unjudged (an ask's answer) the score with 0 -> -1; WebShop's 0.6 stays 0.6 (+1.6 accepted)."""
    run = make_run()
    verdicts = ["accept", "refine", "reject", "unparsed", None]
    for gid in range(20):
        generation(run, gid)
    eps = []
    for k, reward in enumerate((1.0, 0.0, 0.6, -1.0)):   # success, failure, a WebShop score, ALFWorld's failure
        e = episode(reward == 1.0, [5 * k + j for j in range(5)])
        e.reward = reward
        e.verdicts = {5 * k + j: v for j, v in enumerate(verdicts) if v}
        eps.append(e)
    crl.credit_generations(run, eps)
    got = [[run.generations[5 * k + j].credits for j in range(5)] for k in range(4)]
    assert got == [[[2.0], [0.5], [-1.0], [1.0], [1.0]],
                   [[1.0], [0.5], [-1.0], [-1.0], [-1.0]],
                   [[1.6], [0.5], [-1.0], [0.6], [0.6]],
                   [[-1.0], [0.5], [-1.0], [-1.0], [-1.0]]]   # ALFWorld's -1 accepted is 0, counted as a failure


def test_judge_lessons_keeps_rewrites_and_drops(monkeypatch):
    """The actor's judgement, on scripted replies: accept keeps the lesson as the bank holds it, refine puts
    the rewrite in the prompt, reject and an unparseable reply drop it; each verdict is recorded against the
    lesson's generation and counted; the replies are judged from crl's judge prompt."""
    run = make_run(judge="accept-refine-reject", free_text=True)
    run.counters = {}
    replies = ["<answer>accept</answer>", "I think <answer>refine: go north first</answer>", "reject",
               "maybe", "<answer>refine:</answer>"]
    eps = []
    for i in range(5):
        e = episode(False, [40 + i])
        e.lessons = e.experience = [f"lesson {i}"]
        e.retrieved = [i]
        eps.append(e)
    seen = []

    def scripted(model, prompts, *a, **k):
        seen.extend(prompts)
        return [types.SimpleNamespace(tokens=run.actor_tok.encode(r, add_special_tokens=False)) for r in replies]

    monkeypatch.setattr(crl, "generate", scripted)
    crl.judge_lessons(run, [(e, f"view {i}") for i, e in enumerate(eps)], None, 1.0)
    assert [e.experience for e in eps] == [["lesson 0"], ["go north first"], [], [], []]
    assert [e.verdicts for e in eps] == [{40: "accept"}, {41: "refine"}, {42: "reject"}, {43: "unparsed"},
                                         {44: "unparsed"}]
    assert [e.lessons for e in eps] == [[f"lesson {i}"] for i in range(5)]   # as the bank holds them (extractor_view)
    assert run.counters == {"judge_accept": 1, "judge_refine": 1, "judge_reject": 1, "judge_unparsed": 2}
    assert seen[1] == crl.judge_prompt(run.actor_tok, eps[1].instruction, "view 1", "lesson 1")
    assert crl.parse_verdict("<answer>refine: x</answer>", refine=False) == ("unparsed", "")   # accept-reject only


def test_the_extractor_reads_the_whole_episode_a_scored_outcome_and_no_unparsed_lesson(monkeypatch):
    """[release] What distillation shows the extractor, at the defaults: the whole transcript (10,000
    characters, not cut), `Outcome: SUCCESS` for WebShop's 0.6, and of two retrieved lessons only the one whose
    verdict parsed (a rejected one still counts), so its `UPDATE 1` replaces that lesson's entry."""
    run = make_run()
    e = episode(False, [40, 41])
    e.reward, e.query, e.lessons, e.retrieved = 0.6, "start", ["lesson A", "lesson B"], [7, 8]
    e.verdicts = {40: "unparsed", 41: "reject"}
    e.transcript = [("environment", "x" * 5000), ("agent", "y" * 5000)]
    seen = []
    monkeypatch.setattr(crl, "extractor_generate", lambda run_, prompts, *a, **k: seen.extend(
        run_.extractor_tok.decode(p) for p in prompts) or [(50, "UPDATE 1: better B")])
    ops = crl.distill(run, [e], 3, None)
    assert [(op.kind, op.ids, op.text, op.source) for op in ops] == [("update", (8,), "better B", 50)]
    assert "Outcome: SUCCESS" in seen[0] and "[1] lesson B" in seen[0] and "lesson A" not in seen[0]
    assert seen[0].split("Episode:\n")[1].startswith(f"environment: {'x' * 5000}\nagent: {'y' * 5000}<|im_end|>")


def test_a_trained_generation_returns_with_the_mean_of_its_new_uses(monkeypatch):
    """[release] A generation stays after its CISPO step; when its lesson is used again it is trained again, on
    the mean of the new credits only."""
    run = make_run(extractor_batch=2)
    seen = []
    monkeypatch.setattr(crl, "policy_update", lambda upd, segments, advantages:
                        seen.append(len(segments)) or {"loss": 0.0})
    generation(run, 0, [1.0, -1.0, -1.0])
    generation(run, 1, [1.0])
    assert crl.extractor_update(run)["reward"] == pytest.approx((-1 / 3 + 1) / 2)
    assert sorted(run.generations) == [0, 1] and run.generations[0].credits == []
    assert crl.extractor_update(run) == {}                      # nothing new: no step
    crl.credit_generations(run, [episode(True, [0]), episode(True, [0])])
    run.cfg.extractor_batch = 1
    stats = crl.extractor_update(run)
    assert stats["reward"] == pytest.approx(1.0) and stats["generations"] == 1 and seen == [2, 1]


def test_distillation_lets_only_a_lost_episode_answer_none(monkeypatch):
    """--extractor-none failure, in the path a run takes: crl.distill gives a won episode heads without NONE
    and a lost one heads with it."""
    run = make_run(extractor_free_text=False, lesson_moves=1, extractor_none="failure")
    won, lost = episode(True, []), episode(False, [])
    for e in (won, lost):
        e.query, e.transcript = "start", [("environment", "start")]
    seen = []
    monkeypatch.setattr(crl, "extractor_generate",
                        lambda run_, prompts, tasks, rng, heads, record: seen.extend(heads) or [(1, "NONE")] * 2)
    crl.distill(run, [won, lost], 3, None)
    none = [any(run.extractor_tok.decode(c, skip_special_tokens=True).startswith("NONE") for c in h.completions)
            for h in seen]
    assert none == [False, True]


def test_the_extractor_is_shown_the_lesson_its_episode_read(monkeypatch):
    """In the path a run takes: crl.distill's prompt holds the retrieved lesson and its heads offer an UPDATE of it."""
    run = make_run(extractor_free_text=False, lesson_moves=1)
    e = episode(False, [7])
    e.query, e.transcript, e.lessons, e.retrieved = "start", [("environment", "start")], ["north"], [0]
    seen = {}
    monkeypatch.setattr(crl, "extractor_generate", lambda run_, prompts, tasks, rng, heads, record:
                        seen.update(prompt=prompts[0], heads=heads[0]) or [(1, "ADD: south")])
    crl.distill(run, [e], 3, None)
    prompt = run.extractor_tok.decode(seen["prompt"])
    update = any(run.extractor_tok.decode(c, skip_special_tokens=True).startswith("UPDATE")
                 for c in seen["heads"].completions)
    assert "[1] north" in prompt and update
    assert "agent:\n(none)" not in prompt
