"""crl.py, piece by piece, each checked by its effect, mostly paths the end-to-end runs rarely reach: an episode
cut by the context limit ends as a failure, a non-finite loss skips the update and leaves the weights, evaluation
plays held-out seeds and leaves the bank as it was, `distill_choice` alternates outcomes, the merge's rules."""
import math
import types

import numpy as np
import pytest
import torch

import crl
import envs
import metrics
import vault_study
from bank import ExperienceBank, ExperienceManager, Operation
from bank_merge import lasting
from model import load_tokenizer
from test_bank import HashEmbedder
from small.tiny import tiny_model
from update import clip_and_step


def tiny_run(manager=None, **settings) -> crl.Run:
    """A Run of the tiny actor (seed 0) and extractor (seed 1), actions constrained, no optimizers."""
    cfg = crl.CRLConfig(**{"free_text": False, "instructions": False, "show_map": False, "max_steps": 10,
                           "max_reply_tokens": 16, **settings})
    tok = load_tokenizer("tiny")
    run = crl.Run(cfg, ["room"], 0, tiny_model(seed=0), tok, None, tiny_model(seed=1), tok, None,
                  manager)
    run.timer = {"generate": 0.0, "env": 0.0, "extractor": 0.0, "extractor_update": 0.0}
    run.counters = {"parse_failures": 0, "operations": 0, "merges": 0, "discards": 0}
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
    model = tiny_model(seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    with pytest.warns(UserWarning, match="update skipped"):
        out = clip_and_step(model, opt, math.nan, 1.0)
    assert out == {"skipped": 1}
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())   # no stale gradient reaches the next step


def test_evaluation_plays_held_out_seeds_and_leaves_the_bank(monkeypatch):
    emb = HashEmbedder()
    manager = ExperienceManager(ExperienceBank(emb.dim), emb, sync=True)
    manager.apply([Operation("add", "room", f"lesson {i}", key=emb([f"start {i}"])[0], source=i) for i in range(5)])
    run = tiny_run(manager)
    part = manager.bank._parts["room"]
    state = lambda: ([(e.uses, e.successes, e.shown) for e in manager.bank.entries("room")],   # noqa: E731
                     part.shown.copy(), part.last_shown.copy())
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
    assert after[0] == before[0] and np.array_equal(after[1], before[1]) and np.array_equal(after[2], before[2])


def test_distill_choice_alternates_successes_and_failures():
    def ep(i, success):
        e = crl.Episode("room", i, 0, False)
        e.success = success
        return e

    members = [ep(0, False), ep(1, False), ep(2, True), ep(3, False), ep(4, True)]
    assert [e.seed for e in crl.distill_choice(list(members), 3)] == [2, 0, 4]
    assert [e.seed for e in crl.distill_choice(list(members), 10)] == [2, 0, 4, 1, 3]
    assert [e.seed for e in crl.distill_choice([ep(0, False), ep(1, False)], 1)] == [0]


def lesson(i: int) -> str:
    """A bank entry's text, long enough for a merge to keep (bank_merge.lasting: over 30 characters)."""
    return f"lesson {i}: try the door the last visit opened"


def merge_bank(n: int):
    """A manager whose bank holds `lesson(1)` .. `lesson(n)` for room (sources 0 .. n-1), and their ids."""
    emb = HashEmbedder()
    manager = ExperienceManager(ExperienceBank(emb.dim), emb, sync=True)
    texts = [lesson(i) for i in range(1, n + 1)]
    ids = manager.apply([Operation("add", "room", t, key=emb([t])[0], source=i) for i, t in enumerate(texts)])
    return manager, ids, emb


MERGED, CLEARER = "doors merged: try the door the lessons name", "lesson one, clearer: the door that opened"


def scripted_merge(monkeypatch, run, replies: list[tuple[int, str]]) -> list[list[str]]:
    """The extractor's merge replies, scripted; returns the lessons each call was shown, as its prompt lists them."""
    replies, shown = iter(replies), []

    def scripted(run_, prompts, tasks, rng, heads=None, record=True):
        text = run_.extractor_tok.decode(prompts[0])
        shown.append(text.split("Lessons:\n")[1].split("<|im_end|>")[0].split("\n"))
        return [next(replies)]

    monkeypatch.setattr(crl, "extractor_generate", scripted)
    return shown


def test_a_merge_reply_is_the_new_list_and_the_whole_list_rolls_on(monkeypatch):
    """[release] A reply is the full list for the lessons shown. 5 entries, chunks of 3. Call 1 (generation 100)
    sees entries 1-3 and lists `UPDATE 1` (a rewrite of 1) and `KEEP 3`: lesson 2, named by no line, is gone.
    Call 2 (101) sees entries 4 and 5, then both lessons call 1 listed; it lists 4 merged with call 1's
    rewrite, and keeps lesson 3 again (its ADD line is no merge line: a parse failure, skipped): lesson 5 and
    the rewrite on its own are gone. The pass removes all 5 entries and writes 2 lessons anew, both credited
    to call 101, whose list held them last: the merge keyed by the mean of entries 4 and 1's keys, lesson 3 by
    its own; new ids, uses, successes and showings reset, written at step 4, origin unknown."""
    manager, ids, emb = merge_bank(5)
    manager.record_use([ids[2]], True)
    manager.bank.count_shown([ids[2]], 3)
    monkeypatch.setattr(crl, "MERGE_SIZE", 3)
    run = tiny_run(manager, extractor_free_text=True)
    call_2 = f"<answer>UPDATE 1,3: {MERGED}\nKEEP 4\nADD: something new</answer>"
    shown = scripted_merge(monkeypatch, run, [(100, f"UPDATE 1: {CLEARER}\nKEEP 3"), (101, call_2)])
    ops = crl.merge_pass(run, 4, None)
    assert shown == [[f"[{i}] {lesson(i)}" for i in (1, 2, 3)],
                     [f"[1] {lesson(4)}", f"[2] {lesson(5)}", f"[3] {CLEARER}", f"[4] {lesson(3)}"]]
    assert [(op.kind, op.text, op.ids, op.source, op.step) for op in ops] == [
        ("remove", "", tuple(ids), -1, 4), ("add", MERGED, (ids[3], ids[0]), 101, 4),
        ("add", lesson(3), (ids[2],), 101, 4)]
    assert (run.counters["merges"], run.counters["discards"], run.counters["parse_failures"]) == (2, 2, 1)
    crl.apply_everywhere(run, ops)
    entries = manager.bank.entries("room")
    assert [(e.text, e.source, e.uses, e.successes, e.shown, e.created, e.origin) for e in entries] == [
        (MERGED, 101, 0, 0, 0, 4, -1), (lesson(3), 101, 0, 0, 0, 4, -1)]
    assert min(e.id for e in entries) > max(ids)
    merged = emb([lesson(4), lesson(1)]).mean(0)
    assert torch.allclose(manager.bank.key(entries[0].id), merged / merged.norm(), atol=1e-6)
    assert torch.allclose(manager.bank.key(entries[1].id), emb([lesson(3)])[0], atol=1e-6)


def test_a_failed_merge_reply_keeps_its_chunk_and_the_chain_starts_afresh(monkeypatch):
    """[release] 7 entries, chunks of 3. Call 1 (100) merges entries 1-3 into one lesson. Call 2 (101) sees
    entries 4-6 and that lesson, and answers nothing parseable: entries 4-6 stay as the bank holds them (ids,
    counts) and call 1's lesson is written as call 1 left it; call 3 sees entry 7 alone, nothing carried, and
    answers NONE: entry 7 stays. Only entries 1-3 go."""
    manager, ids, emb = merge_bank(7)
    manager.record_use([ids[4]], True)
    monkeypatch.setattr(crl, "MERGE_SIZE", 3)
    run = tiny_run(manager, extractor_free_text=True)
    shown = scripted_merge(monkeypatch, run, [(100, f"UPDATE 1,2,3: {MERGED}"), (101, "I cannot say"),
                                              (102, "NONE")])
    ops = crl.merge_pass(run, 4, None)
    assert shown == [[f"[{i}] {lesson(i)}" for i in (1, 2, 3)],
                     [f"[1] {lesson(4)}", f"[2] {lesson(5)}", f"[3] {lesson(6)}", f"[4] {MERGED}"],
                     [f"[1] {lesson(7)}"]]
    assert [(op.kind, op.text, op.ids, op.source) for op in ops] == [
        ("remove", "", tuple(ids[:3]), -1), ("add", MERGED, tuple(ids[:3]), 100)]
    assert (run.counters["merges"], run.counters["discards"], run.counters["parse_failures"]) == (1, 0, 1)
    crl.apply_everywhere(run, ops)
    assert [(e.id, e.text, e.source, e.uses) for e in manager.bank.entries("room")] == [
        (ids[3], lesson(4), 3, 0), (ids[4], lesson(5), 4, 1), (ids[5], lesson(6), 5, 0), (ids[6], lesson(7), 6, 0),
        (ids[6] + 1, MERGED, 100, 0)]
    key = emb([lesson(1), lesson(2), lesson(3)]).mean(0)
    assert torch.allclose(manager.bank.key(ids[6] + 1), key / key.norm(), atol=1e-6)


def test_a_merge_drops_short_items_and_stubs_and_a_reply_left_with_none_keeps_its_chunk(monkeypatch):
    """[release] A merge's item lasts only over 30 characters and when it is no template stub. 4 entries, chunks
    of 2. Call 1 (100) merges entries 1 and 2 into `north` (dropped) and keeps entry 2: entry 1 is gone, entry
    2 carried. Call 2 (101) sees entries 3 and 4 and that lesson, and lists only a stub and `east`: nothing
    lasts, so its chunk stays as the bank holds it and call 1's list is written as call 1 left it."""
    assert not lasting("north") and not lasting(" " + "x" * 30 + " ") and lasting("x" * 31)
    for stub in ("<the merged lesson goes here, in full>", "Your comprehensive knowledge of these doors",
                 "[placeholder for the merged lesson text]", "Second merged knowledge item, about doors"):
        assert len(stub) > 30 and not lasting(stub)
    manager, ids, emb = merge_bank(4)
    monkeypatch.setattr(crl, "MERGE_SIZE", 2)
    run = tiny_run(manager, extractor_free_text=True)
    scripted_merge(monkeypatch, run, [(100, "UPDATE 1,2: north\nKEEP 2"),
                                      (101, "UPDATE 1,2,3: <the merged lesson goes here, in full>\nUPDATE 1: east")])
    ops = crl.merge_pass(run, 4, None)
    assert [(op.kind, op.text, op.ids, op.source) for op in ops] == [
        ("remove", "", tuple(ids[:2]), -1), ("add", lesson(2), (ids[1],), 100)]
    assert (run.counters["merges"], run.counters["discards"]) == (1, 1)


def test_instance_visits_play_each_fresh_instance_k_iterations_in_a_row_groups_staggered():
    """--instance-visits 3 with 2 groups: group 0 starts a new instance at iterations 0, 3, 6, 9, group 1 at 2, 5,
    8 (its first lasts 2); every instance is new (never seen by another group or life), and both halves of a
    group play the group's one instance."""
    run = tiny_run(instance_visits=3, groups=2, group_size=4)
    plays = [crl.episode_specs(run, step) for step in range(12)]
    assert all(len({seed for _, seed, g, _ in p if g == group}) == 1 for p in plays for group in (0, 1))
    by_group = [[next(seed for _, seed, g, _ in p if g == group) for p in plays] for group in (0, 1)]
    starts = [[s for s in range(12) if s == 0 or seeds[s] != seeds[s - 1]] for seeds in by_group]
    assert starts == [[0, 3, 6, 9], [0, 2, 5, 8, 11]]
    assert len(set(by_group[0]) | set(by_group[1])) == 9 and max(by_group[0] + by_group[1]) < crl.EVAL_SEED0


def replies_and_prompts(run, eps):
    """Each segment of each episode: (its prompt text before the reply, the reply text)."""
    tok, out = run.actor_tok, []
    for e in eps:
        for s in e.segments:
            first = s.mask.index(True)
            out.append((tok.decode(s.tokens[:first]), e))
    return out


def test_history_windows():
    """--history 2: each turn is a fresh context of the system prompt, the last two (observation, reply) turns
    and the new observation."""
    run = tiny_run(history=2, max_steps=5)
    eps = crl.rollout(run, [("room", s, s, False) for s in range(3)], torch.Generator().manual_seed(1), 1.0)
    tok = run.actor_tok
    for e in eps:
        assert len(e.segments) == e.turns >= 3 and all(s.share == 1 / e.turns for s in e.segments)
        observations = [text for who, text in e.transcript if who == "environment"]
        replies = [text for who, text in e.transcript if who == "agent"]
        for k, s in enumerate(e.segments):
            turns = [{"role": "user", "content": observations[j]} if r == 0
                     else {"role": "assistant", "content": replies[j]}
                     for j in range(max(0, k - 2), k) for r in (0, 1)]
            prompt = crl.encode_chat(tok, turns + [{"role": "user", "content": observations[k]}])
            assert s.tokens[:len(prompt)] == prompt and not any(s.mask[:len(prompt)])
            assert tok.decode([t for t, m in zip(s.tokens, s.mask) if m]).rstrip("\n").removesuffix(
                tok.eos_token) == replies[k]


def test_a_fractional_webshop_reward_reaches_the_advantages(monkeypatch):
    """A scripted purchase of a product that matches a third of the goal (WebShop seed 3 of test) earns 1/3;
    the episode keeps that reward (not its failed success) and the actor's advantages centre it."""
    from small.grammar import Constraint
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
    monkeypatch.setattr(crl, "policy_update", lambda upd, segs, advs: seen.update(advs=advs) or {})
    crl.actor_update(run, eps)
    assert seen["advs"] == pytest.approx([1 / 6, 1 / 6, -1 / 6, -1 / 6])


def test_only_the_with_experience_half_is_distilled(monkeypatch):
    """[release] The extractor reads the with-experience half of each group (--distill-per-group n: n of those a
    group)."""
    monkeypatch.setattr(crl.parallel, "Distillation", lambda run, fn, chosen, step, rng: chosen)
    eps = [crl.Episode("room", g, g, j >= 2) for g in range(2) for j in range(4)]
    for i, e in enumerate(eps):
        e.success = i % 3 == 0
    def chosen(**kw):
        return [(e.group, e.with_exp) for e in crl.distill_episodes(tiny_run(**kw), eps, 0, None)]
    assert chosen() == [(0, True), (0, True), (1, True), (1, True)]
    assert chosen(distill_per_group=1) == [(0, True), (1, True)]


def test_the_warmup_retrieves_nothing_and_trains_nothing(monkeypatch):
    """[release] Before step `warmup` no episode retrieves (the with-experience half plays without a lesson) and
    neither model trains; from it on, the with-experience half retrieves and both train."""
    emb = HashEmbedder()
    manager = ExperienceManager(ExperienceBank(emb.dim), emb, sync=True)
    manager.apply([Operation("add", "room", "east", key=emb(["x"])[0], source=-1)])
    run = tiny_run(manager, warmup=2, groups=2, group_size=4, max_steps=2, extractor_free_text=False,
                   extractor_reply_tokens=4, judge="none")
    calls, played = [], []
    monkeypatch.setattr(crl, "actor_update", lambda run_, eps: calls.append("actor") or {})
    monkeypatch.setattr(crl, "extractor_update", lambda run_: calls.append("extractor") or {})
    rollout = crl.rollout
    monkeypatch.setattr(crl, "rollout", lambda *a, **k: played.append(rollout(*a, **k)) or played[-1])
    metrics = crl.train_step(run, 1)
    assert calls == [] and manager.bank.stats["searches"] == 0 and "retrieval/off_top1" not in metrics
    assert not any(e.experience or e.sources for e in played[-1]) and sum(e.with_exp for e in played[-1]) == 4
    metrics = crl.train_step(run, 2)
    assert calls == ["actor", "extractor"] and manager.bank.stats["searches"] == 4
    assert all(bool(e.experience) == e.with_exp for e in played[-1]) and "retrieval/off_top1" in metrics


def test_training_retrieval_serves_the_newest_lesson_and_logs_its_age():
    """Six lessons of one recurring instance, written at iterations 0-5, tie at cosine 1.0 with its query: at
    iteration 9 the one written at 5 is served (age 4), then, with the recency penalty, the next newest (age 5)."""
    emb = HashEmbedder()
    manager = ExperienceManager(ExperienceBank(emb.dim, dropout=0.0), emb, sync=True)
    manager.apply([Operation("add", "room", f"lesson {i}", key=emb(["the vault"])[0], step=i, origin=7)
                   for i in range(6)])
    run = tiny_run(manager)
    for step, text, age in ((9, "lesson 5", 4), (10, "lesson 4", 6)):
        run.step = step
        eps = [crl.Episode("room", 7, 0, True, query="the vault") for _ in range(2)]
        crl.retrieve(run, eps)
        assert [e.lessons for e in eps] == [[text]] * 2 and [e.written for e in eps] == [[int(text[-1])]] * 2
        assert metrics.episode_metrics(run, eps)["retrieval/age"] == age


def test_attempts_learn_through_a_bank_of_their_own(monkeypatch):
    """evaluate_attempts on hand-worked vault episodes. A scripted actor tries the doors DOORS[(seed + 3a + k) % 8],
    k = 0, 1, 2, at attempt a, but first the door of a lesson that names its vault; a scripted extractor writes
    `ADD: <vault>: <door>` after a success. Without experience an instance succeeds at attempt a when its secret
    is among that attempt's doors; with experience also when an earlier with-experience attempt found it. The
    rounds write into a bank that starts empty (attempt 1 reads nothing, though the run's bank holds a lesson
    every query reaches): the run's bank keeps its one entry, and nothing is recorded for training. Each
    attempt's own contrast is the with-minus-without difference per instance, its mean and sd by hand."""
    import re
    import envs
    emb = HashEmbedder()
    manager = ExperienceManager(ExperienceBank(emb.dim), emb, sync=True)
    manager.apply([Operation("add", "vault", "nowhere: north", key=emb(["x"])[0], source=-1)])
    run = tiny_run(manager, judge="none")
    run.tasks, doors = ["vault"], envs.make("vault").actions

    def play(run_, specs, rng, temperature, train=True):
        eps = [crl.Episode(*spec) for spec in specs]
        games = [envs.make("vault") for _ in eps]
        for e, env in zip(eps, games):
            obs = env.reset(seed=e.seed)
            e.instruction, e.query = env.instruction, crl.retrieval_query(env, obs)
            e.transcript.append(("environment", obs))
        crl.retrieve(run_, [e for e in eps if e.with_exp], train=train)
        for e, env in zip(eps, games):
            a = attempt[0]
            told = [x.split(": ")[1] for x in e.experience if x.startswith(env.name + ": ")]
            for door in (told + [doors[(e.seed + 3 * a + k) % 8] for k in range(3)])[:3]:
                obs, reward, done, info = env.step(door)
                e.transcript += [("agent", door), ("environment", obs)]
                if done:
                    break
            e.success, e.reward = info["success"], reward
        attempt[0] += 1
        return eps

    def extractor(run_, prompts, tasks, rng, heads=None, record=True):
        assert not record
        found = [re.search(r"The (\w+) door of the (.+?) vault opens", run_.extractor_tok.decode(p)) for p in prompts]
        return [(9, f"ADD: {m.group(2)}: {m.group(1)}" if m else "NONE") for m in found]

    attempt = [1]
    monkeypatch.setattr(crl, "rollout", play)
    monkeypatch.setattr(crl, "extractor_generate", extractor)
    out = crl.evaluate_attempts(run, ["vault"], 8, 3)
    seeds = envs.held_out_seeds("vault", 8, crl.EVAL_SEED0)
    secrets = [envs.vault_door(seed) for seed in seeds]
    hit = [[s in {doors[(seed + 3 * a + k) % 8] for k in range(3)} for seed, s in zip(seeds, secrets)]
           for a in (1, 2, 3)]
    known = [[any(hit[b][j] for b in range(a + 1)) for j in range(8)] for a in range(3)]
    for a in range(3):
        assert out[f"attempts/vault/success_noexp_{a + 1}"] == sum(hit[a]) / 8
        assert out[f"attempts/vault/success_exp_{a + 1}"] == sum(known[a]) / 8
        diffs = [int(k) - int(h) for k, h in zip(known[a], hit[a])]
        mean = sum(diffs) / 8
        assert out[f"attempts/vault/contrast_{a + 1}"] == pytest.approx(mean)
        assert out[f"attempts/vault/contrast_sd_{a + 1}"] == pytest.approx(
            math.sqrt(sum((d - mean) ** 2 for d in diffs) / 7))
        assert out[f"attempts/vault/contrast_n_{a + 1}"] == 8
    assert sum(known[2]) > sum(hit[2]) and sum(known[0]) < 8        # the memory adds something, not everything
    assert "attempts/same_instance_1" not in out                    # the first attempt read no lesson at all
    assert out["attempts/same_instance_2"] == sum(known[0]) / 8
    # attempt 3 reads attempt 2's lesson (the newest of the vault's equally near ones), not attempt 1's
    assert out["attempts/previous_attempt_2"] == sum(known[0]) / 8 > 0
    assert out["attempts/previous_attempt_3"] == sum(known[1]) / 8 and "attempts/previous_attempt_1" not in out
    # the extractor wrote for each with-experience success and answered NONE for each loss; none after the last
    assert [out.get(f"attempts/wrote_{a}") for a in (1, 2, 3)] == [sum(known[0]) / 8, sum(known[1]) / 8, None]
    assert [e.text for e in manager.bank.entries("vault")] == ["nowhere: north"] and run.generations == {}


def test_vault_held_out_seeds_balance_doors_and_are_never_drawn_in_training():
    """256 held-out vaults: 32 of each door, 256 distinct names, every one in the held-out eighth of names; the
    training draws (fresh seeds, and every vault the --instance-visits grid's 5 seeds visit in 300 iterations)
    never name one, while plain draws would (about 1 in 8). Other tasks keep the plain seeds."""
    seeds = envs.held_out_seeds("vault", 256, crl.EVAL_SEED0)
    names = [envs.vault_name(s) for s in seeds]
    doors = [envs.vault_door(s) for s in seeds]
    assert len(set(names)) == 256 and all(map(envs.vault_held_out, names)) and min(seeds) >= crl.EVAL_SEED0
    assert sorted(doors.count(d) for d in envs._MOVES) == [32] * 8
    assert [envs.vault_door(s) for s in envs.held_out_seeds("vault", 10, crl.EVAL_SEED0)].count("north") == 2
    assert envs.held_out_seeds("room", 3, 5) == [5, 6, 7]
    rng = np.random.default_rng(0)
    drawn = {envs.vault_name(envs.draw_training_seed("vault", rng, crl.EVAL_SEED0)) for _ in range(4000)}
    plain = {envs.vault_name(int(s)) for s in np.random.default_rng(0).integers(crl.EVAL_SEED0, size=4000)}
    assert not any(map(envs.vault_held_out, drawn)) and 0.09 < sum(map(envs.vault_held_out, plain)) / 4000 < 0.16
    cfg = crl.CRLConfig(instance_visits=4, groups=4)
    run = types.SimpleNamespace(cfg=cfg, tasks=["vault"])
    for seed in range(5):
        run.seed = seed
        visited = {envs.vault_name(vault_study.visiting_instance(run, step, g, crl.EVAL_SEED0)[1])
                   for step in range(300) for g in range(4)}
        assert len(visited) >= 300 and not visited & set(names)


def test_the_oracle_writes_the_door_each_vault_episode_shows():
    """--extractor oracle: distil (with no extractor model) adds, for each episode, the door its transcript shows
    open: the opened door after a win, the revealed one after a revealed loss, nothing after a plain loss, keyed
    by the episode's query like a model's lesson, made by no generation (nothing to credit or train)."""
    emb = HashEmbedder()
    run = tiny_run(ExperienceManager(ExperienceBank(emb.dim), emb, sync=True))
    run.extractor = None
    eps = []
    for seed, replies, reveal in ((3, ["east", "north"], False), (3, ["east", "south", "west"], True),
                                  (3, ["east", "south", "west"], False)):
        env = envs.make("vault", reveal=reveal)
        e = crl.Episode("vault", seed, 0, True, query=f"vault {seed}")
        e.transcript.append(("environment", env.reset(seed)))
        for reply in replies:
            e.transcript += [("agent", reply), ("environment", env.step(reply)[0])]
        eps.append(e)
    ops = crl.distill(run, eps, 12, None)
    assert [(op.kind, op.text, op.origin, op.step, op.source) for op in ops] == [("add", "north", 3, 12, -1)] * 2
    assert torch.equal(ops[0].key, emb(["vault 3"])[0]) and run.generations == {}
    assert run.counters["operations"] == 2


def test_vault_lessons_count_the_lessons_that_name_their_vaults_door():
    """Of 3 lessons distilled from vault seeds 5, 6, 7 (two naming the door, one not; a room lesson and a NONE
    ignored) 2/3 are right; of 2 episodes reading a lesson, the one whose lesson names its own vault's door
    counts, the one reading vault 6's door in vault 5 does not (unless the doors agree)."""
    door = {s: envs.vault_secret(envs.vault_name(s)) for s in (5, 6, 7)}
    wrong = next(d for d in envs.Vault.actions if d != door[7])
    ops = [Operation("add", "vault", door[5], (), None, 1, 0, origin=5),
           Operation("update", "vault", f"{door[6].upper()} ", (3,), None, 2, 0, origin=6),
           Operation("add", "vault", wrong, (), None, 3, 0, origin=7),
           Operation("add", "room", "north", (), None, 4, 0, origin=5), Operation("none", "vault", "", origin=5)]
    eps = [crl.Episode("vault", 5, 0, True, lessons=[door[5]]), crl.Episode("vault", 5, 0, True, lessons=[door[6]]),
           crl.Episode("vault", 5, 0, False)]
    out = vault_study.vault_lessons(eps, ops)
    assert out["lessons/right_written"] == 2 / 3 and out["lessons/right_read"] == (1 + (door[6] == door[5])) / 2
    # success after a right and after a wrong lesson: the right reader won, another right reader lost, the wrong lost
    wrong5 = next(d for d in envs.Vault.actions if d != door[5])
    eps = [crl.Episode("vault", 5, 0, True, lessons=[door[5]], success=True),
           crl.Episode("vault", 5, 0, True, lessons=[door[5]]), crl.Episode("vault", 5, 0, True, lessons=[wrong5]),
           crl.Episode("vault", 5, 0, False, success=True)]
    out = vault_study.vault_lessons(eps, [])
    assert out == {"lessons/right_read": 2 / 3, "lessons/won_after_right": 1 / 2, "lessons/won_after_wrong": 0.0}


def test_lessons_right_by_chance_is_what_the_written_doors_score_whatever_their_vaults():
    """Three lessons naming A, A, B from vaults opening A, C, B: right 2/3; by chance (written share times vault
    share, summed over doors) 2/3 * 1/3 + 1/3 * 1/3 = 1/3. An extractor writing A for vaults A, A, C: right 2/3 and
    by chance 2/3 too (it read nothing)."""
    seeds = {}
    for s in range(200):
        seeds.setdefault(envs.vault_door(s), s)
    (a, sa), (b, sb), (c, sc) = list(seeds.items())[:3]
    ops = [Operation("add", "vault", text, (), None, i, 0, origin=o) for i, (text, o) in enumerate(
        [(a, sa), (a, sc), (b, sb)])]
    out = vault_study.vault_lessons([], ops)
    assert out["lessons/right_written"] == 2 / 3 and abs(out["lessons/right_by_chance"] - 1 / 3) < 1e-12
    ops = [Operation("add", "vault", a, (), None, i, 0, origin=o) for i, o in enumerate([sa, sa, sc])]
    out = vault_study.vault_lessons([], ops)
    assert out["lessons/right_written"] == out["lessons/right_by_chance"] == 2 / 3


def test_the_contrast_pairs_an_instances_plays_across_ranks(monkeypatch):
    """Two ranks as held_out_specs deals them (every play without experience on one, with on the other): the
    contrast still pairs each instance's two plays, [1 - 0, 1 - 1, 0 - 1] = mean 0, sd 1, n 3."""
    plays = [crl.Episode("vault", s, j, w, success=won) for j, (s, w, won) in enumerate(
        [(5, False, False), (6, False, True), (7, False, True), (5, True, True), (6, True, True), (7, True, False)])]
    sent = []   # what rank 1 contributes to the gather, then rank 0's view of the gather
    monkeypatch.setattr(metrics, "gather_objects", lambda obj: sent.append(obj) or [obj])
    metrics.paired_contrast(plays[3:], "attempts")
    monkeypatch.setattr(metrics, "gather_objects", lambda obj: [obj, sent[0]])
    out = metrics.paired_contrast(plays[:3], "attempts")
    assert (out["attempts/vault/contrast"], out["attempts/vault/contrast_n"]) == (0.0, 3)
    assert out["attempts/vault/contrast_sd"] == pytest.approx(1.0)
