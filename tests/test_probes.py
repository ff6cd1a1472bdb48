"""probes/: each probe runs on a tiny setting as `python -m probes.NAME` would run it, and the two shared pieces
are checked against independent references: `probes.policy` against a softmax over the allowed ids written
here, and the lesson viewer's counts against the bank itself."""
import argparse
import json
import math
import os
import shutil
import re
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import crl
import envs
import reproduce
import train
from bank import ExperienceBank, Operation
from model import load_tokenizer
from probes import ONE_MOVE, episode, gpu_profile, judge, lesson_follow, lessons, policy, random_play
from probes.vault import cispo_vault, credit_trace, vault_controls, vault_forms, vault_lessons
from small.tiny import tiny_model
from test_train import FAST


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A finished tiny crl run of 2 iterations, evaluated after each (so bank.jsonl has two snapshots)."""
    out = str(tmp_path_factory.mktemp("probe") / "run")
    train.main(["--tasks", "room", "--mode", "crl", "--iters", "2", "--out", out, *FAST])
    return out


def test_policy_is_the_constrained_softmax():
    model, tok = tiny_model(seed=0).eval(), load_tokenizer("tiny")
    actions = ("north", "northeast", "south")            # shared prefixes: 'north' then its end or 'east'
    prompt = tok.encode("you see stairs", add_special_tokens=False)
    got = policy(model, tok, prompt, actions)
    want = []
    for a in actions:
        reply = tok.encode(a, add_special_tokens=False) + [tok.eos_token_id]
        p = 1.0
        for j, t in enumerate(reply):
            allowed = sorted({r[j] for r in (tok.encode(b, add_special_tokens=False) + [tok.eos_token_id]
                                             for b in actions) if r[:j] == reply[:j] and len(r) > j})
            with torch.no_grad():
                logits = model(torch.tensor([prompt + reply[:j]]))[0, -1].float()
            p *= torch.softmax(logits[allowed], 0)[allowed.index(t)].item()
        want.append(p)
    assert torch.allclose(got, torch.tensor(want), atol=1e-5)
    assert abs(got.sum().item() - 1) < 1e-5


def test_one_move_reads_the_words_view():
    env = envs.make("room", show_map=False, max_steps=10)
    for seed in range(200):
        obs = env.reset(seed=seed)
        m = ONE_MOVE.search(obs)
        if m:   # stepping that way wins at once
            assert env.step(m.group(1))[3]["success"]
            return
    pytest.fail("no start with the stairs one move away in 200 seeds")


def test_lesson_follow(run_dir, capsys):
    lesson_follow.main(["--run", run_dir, "--starts", "2"])
    out = capsys.readouterr().out
    assert "P(move | no lesson) 0.125" in out                # 8 moves' probabilities average 1/8 exactly
    assert sum(line.strip().split(":")[0] in envs.MOVE_OFFSETS for line in out.splitlines()) == 8


def test_lessons_viewer_counts_the_bank(run_dir, capsys):
    final = lessons.show(run_dir, top=50)
    out = capsys.readouterr().out
    bank = ExperienceBank.load(os.path.join(run_dir, "ckpt", "bank"))
    assert {t: len(rows) for t, rows in final.items()} == {t: bank.size(t) for t in bank.tasks()}
    for task in bank.tasks():
        assert f"{task}: {bank.size(task)} lessons at the last checkpoint" in out
        uses = sum(t["uses"] for _, t in lessons.by_text(final[task]))
        assert uses == sum(e.uses for e in bank.entries(task))
    snaps = [json.loads(line) for line in open(os.path.join(run_dir, "bank.jsonl"))]
    assert [s["step"] for s in snaps] == [0, 1] and "(bank.jsonl)" in out
    assert os.path.exists(os.path.join(run_dir, "lessons.png"))


def test_lessons_viewer_reads_the_final_bank_where_the_run_never_evaluated(run_dir, tmp_path, capsys):
    """--eval-every 0 leaves bank.jsonl empty: the history then comes from the final bank, by step written."""
    out = str(tmp_path / "run")
    shutil.copytree(run_dir, out)
    open(os.path.join(out, "bank.jsonl"), "w").close()
    final = lessons.show(out, top=50)
    snaps = lessons.history(out, final)
    assert snaps and sum(len(rows) for rows in snaps[-1][1].values()) == sum(map(len, final.values()))
    assert "(the final bank, by step written)" in capsys.readouterr().out


def test_judge_probe(capsys):
    """P(accept) of right and wrong lessons on room and vault: probabilities, so within [0, 1]."""
    judge.main(["--starts", "2"])
    lines = [line for line in capsys.readouterr().out.splitlines() if "P(accept)" in line]
    assert [line.split(" on ")[1].split(" ")[0] for line in lines] == ["room", "vault"]
    for line in lines:
        right, wrong = (float(line.split(f"{k} lesson ")[1].split(",")[0]) for k in ("right", "wrong"))
        assert 0 <= right <= 1 and 0 <= wrong <= 1


def test_vault_controls(capsys):
    """The oracle bank names every vault's door and is retrieved for its own vault; the shuffled one is not."""
    vault_controls.main(["--instances", "6", "--replays", "2"])
    out = capsys.readouterr().out.splitlines()
    assert len([line for line in out if "played 2 times each without experience" in line]) == 1
    assert len([line for line in out if "a play lost, each told the locked doors" in line]) in (0, 2)
    oracle, shuffled = [line for line in out if " bank (" in line]
    assert "oracle bank (1.000 of its lessons name the right door)" in oracle
    assert oracle.endswith("same-instance retrieval 1.000") and shuffled.endswith("same-instance retrieval 0.000")
    won, lost = [line for line in out if " extractor, 6 " in line]
    assert "won vault episodes" in won and "lost vault episodes" in lost


def test_vault_controls_replays_only_stops_after_the_replays(capsys):
    """--replays-only: the replays' line, then no bank and no extractor check."""
    vault_controls.main(["--instances", "3", "--replays", "2", "--replays-only"])
    out = capsys.readouterr().out
    assert "3 held-out vaults played 2 times each without experience" in out and "skipped: --replays-only" in out
    assert " bank (" not in out and " extractor, 3 " not in out


def test_win_again_counts_pairs_of_plays_of_one_vault():
    """Wins in 4 plays of 3 vaults, 4, 0 and 2: of the 6 * 3 ordered pairs whose first play won, 4 * 3 + 2 * 1
    have a winning second play; a vault never won adds no pair; no win at all gives nan."""
    assert vault_controls.win_again([4, 0, 2], 4) == (12 + 2) / 18
    assert vault_controls.win_again([1, 1], 4) == 0.0 and math.isnan(vault_controls.win_again([0, 0], 4))


def test_scripted_vault_episodes_win_and_lose_as_scripted():
    won, lost = (vault_controls.scripted_episode(crl.EVAL_SEED0, outcome) for outcome in (True, False))
    assert won.success and won.reward == 1.0 and not lost.success and lost.reward == 0.0
    assert "opens" in won.transcript[-1][1] and [who for who, _ in lost.transcript].count("agent") == 3


def test_random_scripted_vault_episodes_open_after_zero_to_two_locked_doors():
    """With an rng: a won episode tries 0-2 distinct wrong doors, then the secret; a lost one 3 distinct wrong doors;
    over 40 episodes every count of locked doors occurs and the first door tried is not always the same."""
    rng = np.random.default_rng(0)
    won = [vault_controls.scripted_episode(crl.EVAL_SEED0 + j, True, "north", rng) for j in range(40)]
    lost = [vault_controls.scripted_episode(crl.EVAL_SEED0 + j, False, "north", rng) for j in range(40)]
    secrets = [cispo_vault.secret(crl.EVAL_SEED0 + j) for j in range(40)]
    for e, lose, s in zip(won, lost, secrets):
        tried, failed = vault_controls.moves(e), vault_controls.moves(lose)
        assert e.success and tried[-1] == s and s not in tried[:-1] and len(set(tried)) == len(tried) <= 3
        assert not lose.success and len(set(failed)) == 3 and s not in failed and e.lessons == ["north"]
    assert {len(vault_controls.moves(e)) for e in won} == {1, 2, 3}
    assert len({vault_controls.moves(e)[0] for e in lost}) > 3


def test_cispo_probe_credits_each_lesson_by_its_vaults_door():
    """The follower plays a right lesson (the vault's door) and a wrong one 3 times each: with p_right 1 and
    p_wrong 0, crl credits +1 three times to the right lesson's generation and -1 (a failure) to the wrong one's."""
    args = train.parse_args(["--tasks", "vault", "--mode", "exp-only"])
    run, _ = train.build(args, torch.device("cpu"), torch.float32)
    seeds = [crl.EVAL_SEED0, crl.EVAL_SEED0 + 1]
    secrets = {s: cispo_vault.secret(s) for s in seeds}
    wrong = next(d for d in cispo_vault.DOORS if d != secrets[seeds[1]])
    run.generations = {g: crl.Generation(g, "vault", [], [], [], []) for g in (10, 11)}
    ops = [Operation("add", "vault", secrets[seeds[0]], source=10, origin=seeds[0]),
           Operation("add", "vault", wrong, source=11, origin=seeds[1])]
    assert cispo_vault.follow(run, ops, secrets, 1.0, 0.0, 3, np.random.default_rng(0)) == 0.5
    assert run.generations[10].credits == [1.0] * 3 and run.generations[11].credits == [-1.0] * 3
    e = vault_controls.scripted_episode(seeds[1], True, wrong, np.random.default_rng(0))   # the extractor sees it
    assert f"[1] {wrong}\n" in run.extractor_tok.decode(crl.extractor_prompt(run, e))
    run.manager.close()


def test_cispo_probe_follower_wins_by_the_door_a_lesson_names(monkeypatch):
    """The follower's odds: the vault's door p_right (1), a wrong door named in p_door its own (1), any other wrong
    door p_wrong (0); each lesson played `uses` (2) times, credited through crl.credit_generations."""
    from bank import Operation
    door = {s: cispo_vault.secret(s) for s in (5, 6, 7)}
    favoured = next(d for d in cispo_vault.DOORS if d not in (door[6],))
    other = next(d for d in cispo_vault.DOORS if d not in (door[7], favoured))
    ops = [Operation("add", "vault", text, source=gid, origin=seed)
           for gid, (text, seed) in enumerate(((door[5], 5), (favoured, 6), (other, 7)))]
    played = []
    monkeypatch.setattr(crl, "credit_generations", lambda run, eps: played.extend(eps))
    right = cispo_vault.follow(None, ops, door, 1.0, 0.0, 2, np.random.default_rng(0), {favoured: 1.0})
    assert right == 1 / 3 and [(e.sources[0], e.success) for e in played] == [(0, True), (0, True), (1, True),
                                                                                (1, True), (2, False), (2, False)]


def test_cispo_probe_trained_actor_takes_a_lost_vaults_lesson_after_its_first_door():
    """A play that lost through north, east, south: told the doors left (west, northeast, ...) the trained actor
    tries north, west, northeast, so it wins where the vault opens by west or northeast and not by southeast; a
    lesson naming a tried door wastes a try (east, northeast: won only on the third); NONE replays the loss."""
    tried = ["north", "east", "south"]
    left = "west, northeast, southeast, southwest, northwest"
    assert cispo_vault.habit_wins(tried, left, "west") and cispo_vault.habit_wins(tried, left, "northeast")
    assert not cispo_vault.habit_wins(tried, left, "southeast")
    assert cispo_vault.habit_wins(tried, "east, northeast", "northeast")
    assert not cispo_vault.habit_wins(tried, "east, south", "northeast") and not cispo_vault.habit_wins(tried, "", "west")
    assert cispo_vault.clean(tried, left) and cispo_vault.clean(tried, "west") and not cispo_vault.clean(tried, "east, west")


def test_cispo_probe_lift_credits_a_lost_vaults_lesson_against_its_replayed_loss(monkeypatch):
    """--credit lift with --p-again 1 and --p-follow 1: a won vault's right lesson is won 2 of 2 with it and 2 of 2
    without (credit 0 each); a lost vault told the doors left, where the trained actor reaches the door, is won 2
    of 2 with it and 0 without (credit +1 each); a lost vault's lesson naming tried doors loses (-0 - 0 = 0)."""
    tried = ["north", "east", "south"]
    secrets = {1: "west", 2: "west", 3: "west"}
    ops = [Operation("add", "vault", "west", source=0, origin=1),
           Operation("add", "vault", "west, northeast, southeast, southwest, northwest", source=1, origin=2),
           Operation("add", "vault", "east, south", source=2, origin=3)]
    run = SimpleNamespace(cfg=crl.CRLConfig(credit="lift"), step=0,
                          generations={g: crl.Generation(g, "vault", [], [], [], []) for g in range(3)})
    monkeypatch.setattr(crl, "gather_objects", lambda x: [x])
    right = cispo_vault.follow(run, ops, secrets, 1.0, 0.0, 2, np.random.default_rng(0), None,
                               {2: tried, 3: tried}, 1.0, 1.0)
    assert right == 2 / 3
    assert [run.generations[g].credits for g in range(3)] == [[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]]


def test_cispo_probe_reads_a_lost_vault(monkeypatch):
    """A policy with 0.5 on `ADD: <a door the play left>` and 0.5 on NONE, on a vault lost through three doors:
    clean 0.5, the doors left 0 (five of them: no one-door lesson names them all), NONE 0.5, one door a lesson,
    and the follower's success 0.5 x p_follow where the trained actor reaches the vault's door with it."""
    monkeypatch.setattr(crl, "extractor_prompt", lambda run, e: e)
    e = vault_controls.scripted_episode(crl.EVAL_SEED0, False, "north", np.random.default_rng(1))
    tried = vault_controls.moves(e)
    door = next(d for d in cispo_vault.DOORS if d not in tried)
    monkeypatch.setattr(cispo_vault, "policy", lambda model, tok, e, completions: torch.tensor(
        [0.5 * (c in (f"ADD: {door}", "NONE")) for c in completions]))
    run = SimpleNamespace(extractor=None, extractor_tok=None, cfg=crl.CRLConfig(extractor_none="failure"))
    out = cispo_vault.evaluate_lost(run, [e], 0.8)
    wins = cispo_vault.habit_wins(tried, door, cispo_vault.secret(e.seed))
    assert out == pytest.approx({"lost_clean": 0.5, "lost_doors_left": 0.0, "lost_none": 0.5, "lost_doors": 1.0,
                                 "lost_follower": 0.4 * wins})


def test_cispo_probe_reads_the_opened_and_the_shown_door(monkeypatch):
    """A policy with 0.6 on `ADD: east` and 0.4 on `UPDATE 1: west`: on a vault won through west and shown east,
    P(opened) 0.4 and P(shown) 0.6; on one won through east and shown west, the other way round."""
    done = {}
    monkeypatch.setattr(crl, "extractor_prompt", lambda run, e: done.setdefault(id(e), e))
    def policy(model, tok, e, completions):
        return torch.tensor([0.6 * (c == "ADD: east") + 0.4 * (c == "UPDATE 1: west") for c in completions])
    monkeypatch.setattr(cispo_vault, "policy", policy)
    eps = [crl.Episode("vault", 0, 0, True, lessons=[shown], transcript=[("agent", opened), ("environment", "out")])
           for opened, shown in (("west", "east"), ("east", "west"))]
    run = SimpleNamespace(extractor=None, extractor_tok=None, cfg=crl.CRLConfig(extractor_none="never"))
    out = cispo_vault.evaluate(run, eps)
    assert out["p_opened"] == pytest.approx(0.5) and out["p_shown"] == pytest.approx(0.5)
    out = cispo_vault.evaluate(run, eps[:1])
    assert out["p_opened"] == pytest.approx(0.4) and out["p_shown"] == pytest.approx(0.6) and out["top_door"] == "east"


def test_cispo_probe_runs_its_steps_and_evaluations(tmp_path):
    """A CISPO step of the tiny extractor on 3 fresh vaults (every lesson credited, so the step trains), evaluated
    before and after on 2 held-out vaults: P(opened door) and the top door's mass are probabilities, and move."""
    out = tmp_path / "probe"
    cispo_vault.main(["--out", str(out), "--steps", "1", "--batch", "3", "--eval-every", "1", "--eval-vaults", "2",
                      "--p-wrong", "0.5", "--actor", "tiny", "--extractor", "tiny", "--lesson-moves", "1",
                      "--extractor-none", "never"])
    curve = [json.loads(line) for line in open(out / "curve.jsonl")]
    steps = [json.loads(line) for line in open(out / "steps.jsonl")]
    assert [c["step"] for c in curve] == [0, 1] and all(0 <= c["p_opened"] <= 1 for c in curve)
    assert all(1 / 8 <= c["top_door_mass"] <= 1 and c["top_door"] in cispo_vault.DOORS for c in curve)
    assert [s["step"] for s in steps] == [0] and steps[0]["cispo"] and steps[0]["lessons"] == 3
    assert curve[0]["p_opened"] != curve[1]["p_opened"]          # the step changed the extractor


def test_cispo_probe_runs_on_losses(tmp_path):
    """The probe with every episode lost, the trained actor following (--p-follow) and lift credit (--p-again):
    one CISPO step, and the lost vaults' readings are probabilities that the step moves."""
    out = tmp_path / "probe"
    cispo_vault.main(["--out", str(out), "--steps", "1", "--batch", "8", "--eval-every", "1", "--eval-vaults", "1",
                      "--p-won", "0", "--p-follow", "1", "--p-again", "0.99", "--actor", "tiny", "--extractor",
                      "tiny", "--lesson-moves", "1", "--extractor-none", "never", "--credit", "lift",
                      "--extractor-lr", "1e-2"])
    curve = [json.loads(line) for line in open(out / "curve.jsonl")]
    steps = [json.loads(line) for line in open(out / "steps.jsonl")]
    assert all(0 <= c[k] <= 1 for c in curve for k in ("lost_clean", "lost_doors_left", "lost_none", "lost_follower"))
    assert all(c["lost_doors"] == pytest.approx(1) for c in curve) and steps[0]["cispo"] and steps[0]["lessons"] == 8
    assert curve[0]["lost_clean"] != curve[1]["lost_clean"]


def test_vault_lessons_success_per_use_by_kind(tmp_path):
    """A right lesson used 4 times (3 won), a door W written for two other vaults (2 of 4 uses won) and a door V
    (0 of 4): W is the commonest lesson, so the kinds are right 3/4, wrong-W 2/4, wrong-other 0/4."""
    from bank import Operation
    env = envs.make("vault")
    door = {s: (env.reset(seed=s), env.secret)[1] for s in (5, 6, 7)}
    w = next(d for d in env.actions if d not in door.values())
    v = next(d for d in env.actions if d not in (*door.values(), w))
    bank = ExperienceBank(2)
    ids = bank.apply([Operation("add", "vault", text, key=torch.tensor([1.0, 0.1 * j]), origin=seed)
                      for j, (text, seed) in enumerate(((door[5], 5), (w, 6), (w, 7), (v, 6)))])
    for eid, results in zip(ids, ([1, 1, 1, 0], [1, 0], [0, 1], [0, 0, 0, 0])):
        for won in results:
            bank.record_use([eid], bool(won))
    bank.save(tmp_path / "ckpt" / "bank")
    entries, _ = vault_lessons.lessons(str(tmp_path))
    assert vault_lessons.success_by_kind(entries) == {"right": (0.75, 4), f"wrong, {w}": (0.5, 4),
                                                      "wrong, other": (0.0, 4)}


def test_vault_lessons_scores_each_lesson_against_its_vaults_door(tmp_path):
    """Two lessons written at iteration 3 (one names its vault's door, one another door), one at 12 (right), and a
    merged one (no vault): 1/2 right in block 0-9, 1/1 in 10-19, 1 from merges."""
    from bank import Operation
    env = envs.make("vault")
    secrets = [(env.reset(seed=s), env.secret)[1] for s in (5, 6)]
    wrong = next(d for d in env.actions if d != secrets[1])
    bank = ExperienceBank(2)
    key = torch.tensor([1.0, 0.0])
    bank.apply([Operation("add", "vault", secrets[0], key=key, step=3, origin=5),
                Operation("add", "vault", wrong, key=key, step=3, origin=6),
                Operation("add", "vault", secrets[1], key=key, step=12, origin=6),
                Operation("add", "vault", "north", key=key, step=12)])
    bank.save(tmp_path / "ckpt" / "bank")
    shares, common, merged = vault_lessons.rightness(vault_lessons.lessons(str(tmp_path))[0])
    assert shares == {0: (0.5, 2), 10: (1.0, 1)} and merged == 1
    rows = [{"step": 0}, {"step": 1, "extractor/reward": -0.5}, {"step": 2}, {"step": 3, "extractor/reward": 0.25}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert vault_lessons.extractor_rewards(vault_lessons.metric_rows(str(tmp_path))) == [(1, -0.5), (3, 0.25)]


def test_vault_lessons_reads_success_after_a_lesson_from_the_episodes_not_the_bank(tmp_path):
    """Success after a right lesson in 6 iterations, 1 / 0 / 1 / 1 / 0.5 / 0.5: thirds 0.5 / 1.0 / 0.5; after a
    wrong one in 3, 0 / 0.5 / 1. A bank of 2 adds and an update that replaced one of them: 1/3 of its writes
    were updates, 2 lessons left."""
    from bank import Operation
    right, wrong = [1, 0, 1, 1, 0.5, 0.5], [0, 0.5, 1]
    rows = [{"step": i, "lessons/won_after_right": r, **({"lessons/won_after_wrong": wrong[i // 2]} if i % 2 else {})}
            for i, r in enumerate(right)]
    assert vault_lessons.won_after(rows) == {"right": [0.5, 1.0, 0.5], "wrong": [0.0, 0.5, 1.0]}
    assert vault_lessons.won_after([{"step": 0}]) == {}
    bank, key = ExperienceBank(2), torch.tensor([1.0, 0.0])
    ids = bank.apply([Operation("add", "vault", "north", key=key, origin=5),
                      Operation("add", "vault", "south", key=key, origin=6)])
    bank.apply([Operation("update", "vault", "east", (ids[0],), key=key, origin=5)])
    bank.save(tmp_path / "ckpt" / "bank")
    entries, updates = vault_lessons.lessons(str(tmp_path))
    assert sorted(e.text for e in entries) == ["east", "south"] and updates == 1 / 3


def test_door_shares_by_hand():
    """Lessons from 4 scripted won episodes: one names the opened door, one a wrong door tried, one a door never
    tried, one episode has no lesson: 1/4 name the opened door, 2/4 a door tried."""
    from bank import Operation
    eps = [vault_controls.scripted_episode(crl.EVAL_SEED0 + j, True) for j in range(4)]
    doors = [[t for who, t in e.transcript if who == "agent"] for e in eps]
    untried = next(d for d in envs.make("vault").actions if d not in doors[2])
    ops = [Operation("add", "vault", doors[0][-1], origin=eps[0].seed), Operation("add", "vault", doors[1][1],
           origin=eps[1].seed), Operation("add", "vault", untried, origin=eps[2].seed)]
    assert vault_controls.door_shares(eps, ops) == (0.25, 0.5)


def test_vault_forms_masses_are_a_distribution(capsys):
    """Over the eight doors the constrained lesson policy sums to one in every form, split between any set of
    doors and the rest; the probe prints one line a form."""
    args = train.parse_args(["--tasks", "vault", "--mode", "static"])
    run, _ = train.build(args, torch.device("cpu"), torch.float32)
    e = vault_controls.scripted_episode(crl.EVAL_SEED0, True)
    for form in ("crl", "ending", "moves"):
        tried = vault_forms.moves(e)
        rest = [d for d in envs.Vault.actions if d not in tried]
        assert vault_forms.door_mass(run, e, form, tried) + vault_forms.door_mass(run, e, form, rest) == \
            pytest.approx(1.0, abs=1e-5)
        assert 0 < vault_forms.door_mass(run, e, form, tried[-1:]) < vault_forms.door_mass(run, e, form, tried)
    run.manager.close()
    vault_forms.main(["--instances", "1"])
    assert len([line for line in capsys.readouterr().out.splitlines() if "form, 1 vaults" in line]) == 3


@pytest.fixture(scope="module")
def vault_run(tmp_path_factory):
    """A finished tiny crl run on the vault (3 tries: some episodes open the door, some do not), with a final
    evaluation of 4 held-out vaults each way (final.json)."""
    out = str(tmp_path_factory.mktemp("probe") / "vault")
    train.main(["--tasks", "vault", "--mode", "crl", "--iters", "2", "--out", out, *FAST, "--eval-every", "0",
                "--final-eval-episodes", "4"])
    return out


def test_credit_trace_replays_the_run_and_records_what_cispo_trained(tmp_path, capsys, monkeypatch):
    """The replay of a tiny vault run under the lift credit equals its metrics; every episode is recorded with the
    lift crl credits; each recorded CISPO batch is the one crl trained: its mean credit is the run's logged
    extractor/reward and it evicted as many as crl did (a batch of 1, so the newest is chosen among several, its
    advantage its credit minus itself); each trained generation says whether the episode it distilled won, as its
    prompt shows."""
    run = str(tmp_path / "run")
    train.main(["--tasks", "vault", "--mode", "crl", "--iters", "4", "--out", run, *FAST, "--eval-every", "0",
                "--final-eval-episodes", "0", "--credit", "lift", "--extractor-batch", "1",
                "--seed", "1"])   # seed 1: CISPO trains on a win and on losses
    prompts, generate = {}, crl.extractor_generate   # each generation's prompt, read apart from the probe

    def seen(run, prompts_in, *a, **k):
        out = generate(run, prompts_in, *a, **k)
        prompts.update({gid: run.extractor_tok.decode(p) for (gid, _), p in zip(out, prompts_in)})
        return out
    monkeypatch.setattr(crl, "extractor_generate", seen)
    records = credit_trace.trace(run, 4, str(tmp_path / "replay"))
    assert "its first 4 iterations replay value for value" in capsys.readouterr().out
    eps = [r for r in records if r["kind"] == "episode"]
    assert len(eps) == 4 * 2 * 4 and sum(r["with_exp"] for r in eps) == 16
    for step in range(4):
        group = {}
        for r in eps:
            if r["step"] == step and not r["with_exp"]:
                group.setdefault(r["seed"], []).append(r["success"])
        for r in eps:
            if r["step"] == step and r["with_exp"]:
                assert r["lift"] == r["success"] - sum(group[r["seed"]]) / len(group[r["seed"]])
    logged = {m["step"]: m for m in map(json.loads, open(os.path.join(run, "metrics.jsonl")))
              if "extractor/reward" in m}
    steps = [r for r in records if r["kind"] == "cispo"]
    assert [s["step"] for s in steps] == sorted(logged) and len(steps) >= 2
    assert any(s["evicted"] for s in steps)
    for s in steps:
        assert len(s["batch"]) == 1
        assert s["batch"][0]["credit"] == logged[s["step"]]["extractor/reward"] and s["batch"][0]["advantage"] == 0
        assert s["evicted"] == logged[s["step"]]["extractor/evicted"]
    assert any(s["batch"][0]["credit"] != 0 for s in steps)
    trained = [g for s in steps for g in s["batch"]]   # whether its episode won: the vault's opening line in its prompt
    assert [g["won"] for g in trained] == ["You are out." in prompts[g["id"]] for g in trained]
    assert {g["won"] for g in trained} == {True, False}


def test_credit_trace_summary_by_hand(tmp_path, capsys):
    """Block 0: two plays without a lesson (first doors east, west); a right lesson followed and won (lift +1), a
    wrong `north` followed and lost (lift -0.5), a wrong `north` ignored and won (lift +0.5), a wrong `south`
    ignored; two CISPO steps trained a right generation, a wrong `south` (a door followed in 0 of its reads) and two
    wrong `north` (followed in half of theirs, one distilled from a win), evicting 3; the right one's episode won."""
    def ep(door, lesson, moves, success, lift, with_exp=True):
        return {"kind": "episode", "step": 1, "door": door, "with_exp": with_exp, "lesson": lesson, "moves": moves,
                "success": success, "lift": lift}
    records = [ep("east", None, ["east"], True, 0.0, False), ep("east", None, ["west", "east"], True, 0.0, False),
               ep("east", "east", ["east"], True, 1.0), ep("east", "north", ["north", "west"], False, -0.5),
               ep("west", "north", ["west"], True, 0.5), ep("west", "south now", ["east", "west"], True, 0.0),
               {"kind": "cispo", "step": 2, "evicted": 3, "batch": [
                   {"lesson": "east", "right": True, "credit": 1.0, "advantage": 0.5, "won": True},
                   {"lesson": "south", "right": False, "credit": 0.0, "advantage": -0.5, "won": False}]},
               {"kind": "cispo", "step": 3, "evicted": 0, "batch": [
                   {"lesson": "north", "right": False, "credit": -0.5, "advantage": 0.0, "won": True},
                   {"lesson": "north", "right": False, "credit": -0.5, "advantage": 0.0, "won": False}]}]
    want = [
        "iterations 0-29:",
        "  first door without a lesson: east 0.50, west 0.50",
        "  right lessons read: 1, followed 1.00, success +1.000, lift +1.000",
        "  wrong lessons read: 3, followed 0.33, success +0.667, lift +0.000",
        "  by the door a lesson names: reads, followed, first door unprompted, lift when right / wrong",
        "    north: 2, 0.50, 0.00, - of 0 / +0.000 of 2",
        "    east: 1, 1.00, 0.50, +1.000 of 1 / - of 0",
        "    south: 1, 0.00, 0.00, - of 0 / +0.000 of 1",
        "  CISPO: 4 generations in 2 steps, mean credit +0.000; by kind (generations, mean credit, summed advantage):",
        "    right: 1, +1.000, +0.50",
        "    wrong, naming a door followed in under half its reads: 1, +0.000, -0.50",
        "    wrong, naming another door: 2, -0.500, +0.00",
        "  CISPO by the episode distilled (generations, right, mean credit, summed advantage): "
        "after a win 2, 1, +0.250, +0.50; after a loss 2, 0, -0.250, -0.50",
        "  CISPO by lesson (generations, summed advantage): north 2, +0.00; east 1, +0.50; south 1, -0.50",
        "  evicted untrained: 3"]
    assert credit_trace.summary(records, 30) == want
    (tmp_path / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    credit_trace.main(["--read", str(tmp_path / "trace.jsonl")])
    assert capsys.readouterr().out.splitlines() == want


def printed_episode(out: str) -> dict:
    """probes.episode's output read back: the lesson lines, each turn's read and reply, the outcome line."""
    lines, blocks, head = out.splitlines(), [], []
    for line in lines:
        if line.startswith("--- ") or line.startswith("outcome: "):
            blocks.append([line, []])
        elif blocks:
            blocks[-1][1].append(line[4:])
        else:
            head.append(line)
    turns = [(name, "\n".join(body)) for name, body in blocks if name.startswith("--- turn ")]
    return {"head": head, "reads": [b for n, b in turns if n.endswith("reads")],
            "replies": [b for n, b in turns if n.endswith("replies")], "outcome": blocks[-1][0]}


def shown(text: str) -> str:
    """Text as probes.episode prints it: unprintable characters escaped, checked on a hand-made case first."""
    assert episode.printable("north\x07\x01 \u00e9\n\tx") == "north\\x07\\x01 \u00e9\n\\tx"
    return episode.printable(text)


def test_episode_probe_prints_the_episode_crl_plays(vault_run, capsys):
    """What the probe prints is the episode crl.play_held_out plays from the run's checkpoint (built here as
    `train.py --resume` builds it): the lesson retrieved and in the prompt, each reply in its turn, each turn's
    observation, the outcome."""
    args = train.parse_args(["--out", vault_run, "--resume"])
    run, start = train.build(args, torch.device("cpu"), torch.float32)
    run.step = start - 1
    for instance, with_exp in ((0, True), (1, False), (2, True)):
        seed = envs.held_out_seeds("vault", 256, crl.EVAL_SEED0)[instance]
        want = crl.play_held_out(run, [("vault", seed, instance, with_exp)], crl.EVAL_STEP)[0]
        episode.main([vault_run, "--seed", str(instance), *([] if with_exp else ["--no-experience"])])
        got = printed_episode(capsys.readouterr().out)
        assert got["replies"] == [shown(text) for who, text in want.transcript if who == "agent"]
        views = [shown(text) for who, text in want.transcript if who == "environment"]
        assert len(got["reads"]) == want.turns and all(v in r for v, r in zip(views, got["reads"]))
        assert f"held-out instance {instance} (game seed {seed})" in got["head"][1]
        assert got["outcome"].startswith("outcome: ") and \
            f"success {want.success}, reward {want.reward:.3f}, {want.turns} actions" in got["outcome"]
        if with_exp:   # the tiny preset: the lesson closes the system prompt, which opens every turn's window
            lesson = f"  1. {want.lessons[0]!r} (bank entry {want.retrieved[0]},"
            assert want.lessons and got["head"][3].startswith(lesson)
            assert shown(want.lessons[0]) and all(shown(want.lessons[0]) in r for r in got["reads"])
        else:
            assert got["head"][2] == "retrieved lesson(s): none (played without experience)"
            assert not any("1. " in r for r in got["reads"])
    run.manager.close()


def test_episode_probe_among_replays_the_final_evaluation(vault_run, capsys):
    """--among E plays each held-out episode as the run's final evaluation of E episodes played it: their
    successes and rewards average to final.json's, with and without experience."""
    final = json.load(open(os.path.join(vault_run, "final.json")))
    args, run = episode.load(vault_run)
    assert run.step == final["step"]   # the re-rank's clock as the final evaluation read it (crl.retrieve)
    outcomes = []
    for with_exp, half in ((False, "noexp"), (True, "exp")):
        eps = [episode.play(run, "vault", j, with_exp, among=4) for j in range(4)]
        assert sum(e.success for e in eps) / 4 == final[f"eval/vault/success_{half}"]
        assert sum(e.reward for e in eps) / 4 == final[f"eval/vault/reward_{half}"]
        outcomes += [e.success for e in eps]
    assert 0 < sum(outcomes) < len(outcomes)   # some vaults opened, some not: the sums above can tell them apart
    run.manager.close()
    episode.main([vault_run, "--seed", "3", "--among", "4"])
    got = printed_episode(capsys.readouterr().out)
    assert got["replies"] == [shown(text) for who, text in eps[3].transcript if who == "agent"]
    assert f"success {eps[3].success}, reward {eps[3].reward:.3f}" in got["outcome"]


def test_random_play_matches_the_vaults_chance_by_hand():
    """Three tries at eight doors, each drawn uniformly (a door may be tried twice): 1 - (7/8)^3 = 0.330; over
    2,000 held-out vaults the random floor lies within 4 standard errors (0.042) of it."""
    out = random_play.random_play("vault", 2000, envs.task_steps("vault"))
    assert abs(out["random_success"] - (1 - (7 / 8) ** 3)) < 0.042 and "expert_steps_mean" not in out
    assert out["random_reward"] == out["random_success"]    # the vault pays 1 for the open door, else 0


def test_random_play_counts_an_episodes_observation_tokens():
    """One vault episode replayed here with the probe's draws: its observations' bytes are the byte tokenizer's
    token count."""
    import random
    tok = load_tokenizer("tiny")
    out = random_play.random_play("vault", 1, 3, seed=4, tokenizer=tok)
    env, rng = envs.make("vault", max_steps=3), random.Random(4)
    seen, done = [env.reset(seed=crl.EVAL_SEED0)], False
    while not done:
        obs, _, done, _ = env.step(rng.choice(env.actions))
        seen.append(obs)
    assert out["observation_tokens_mean"] == out["observation_tokens_max"] == sum(len(o.encode()) for o in seen)


def test_gpu_profile_mfu_is_the_flops_of_what_was_timed_over_its_time(tmp_path):
    """The body-alone run's MFU counts the blocks' FLOPs only (the H200 entry once divided the whole step's,
    lm_head included, by the body's time). bench.SMALL by hand: per layer q 64x64, k and v 64x32, o 64x64,
    gate, up and down 64x128 = 36,864 weights, 2 layers; causal attention 3 x 4 x layers x heads x head_dim x T/2."""
    import bench
    from model import Transformer
    bench._random_checkpoint(bench.SMALL, str(tmp_path))
    model = Transformer.from_pretrained(str(tmp_path), dtype=torch.bfloat16)
    a = argparse.Namespace(batch=2, seq=64, matmul=256)
    out = gpu_profile.training(model, a, torch.device("cpu"), lambda: None)
    body = 2 * 64 * (6 * 2 * 36864 + 3 * 4 * 2 * 4 * 16 * 32)
    assert body == 62_914_560
    head = 6 * 512 * 64 * int(bench._train_batch(512, 2, 64)[1][:, 1:].sum())
    step, blocks = out["token_logprobs forward + backward"], out["the body alone (no lm_head)"]
    assert step["flops"] == body + head and blocks["flops"] == body
    for r in (step, blocks):   # 100 / the matmul's FLOP/s, the same for both parts
        assert r["MFU % datasheet median"] is None   # no datasheet figure for a CPU
        per_peak = r["MFU % matmul median"] * r["median s"] / r["flops"]
        assert per_peak == pytest.approx(step["MFU % matmul median"] * step["median s"] / (body + head))
        assert r["MFU % matmul best"] * r["best s"] / r["flops"] == pytest.approx(per_peak)


def test_gpu_profile_runs_on_cpu_and_counts_failed_trials(capsys, monkeypatch):
    """The probe's own code on bench.py's tiny shape; then a generate that fails in the second thread must be
    counted in every trial (and shown), one that never fails in none."""
    gpu_profile.main(["--device", "cpu", "--small", "--trials", "1"])
    out = capsys.readouterr().out
    for part in (r"token_logprobs forward \+ backward", r"the body alone \(no lm_head\)"):
        assert re.search(part + r"\s+median\s+[\d.]+ ms .* MFU median / best: - / - of the datasheet, "
                         r"[\d.]+% / [\d.]+% of the matmul", out), out
    assert re.search(r"an eager step's kernels: [\d.]+ ms \(2 layers\)", out)
    assert "the other thread eager: 0 of 1 trials failed" in out
    real = gpu_profile.generate

    def fails_beside(model, prompts, *args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("capture invalidated")
        return real(model, prompts, *args, **kwargs)
    monkeypatch.setattr(gpu_profile, "generate", fails_beside)
    a = argparse.Namespace(trials=3)
    gpu_profile.threads(tiny_model(seed=0), a, torch.device("cpu"))
    out = capsys.readouterr().out
    assert "the other thread eager: 3 of 3 trials failed" in out and "capture invalidated" in out


def test_curves_pair_by_seed_and_find_the_first_evaluation_at_a_level(tmp_path):
    """probes.curves on a hand-made grid of two seeds: the curve's mean and 95% interval (t over 1 degree of freedom:
    12.706 * sd / sqrt(2)), each mode − GRPO paired by seed at the early and the last evaluation, exp − noexp, and the
    first evaluation each seed reaches the level; a panel of its own for the control."""
    from probes import curves
    vals = {("grpo", 0): [0.2, 0.5, 0.9], ("grpo", 1): [0.4, 0.5, 0.7],
            ("oracle", 0): [0.6, 1.0, 1.0], ("oracle", 1): [0.8, 0.9, 1.0]}
    for (mode, seed), xs in vals.items():
        os.makedirs(tmp_path / "vault-family" / f"{mode}-seed{seed}")
        with open(tmp_path / "vault-family" / f"{mode}-seed{seed}" / "metrics.jsonl", "w") as f:
            for step, x in zip((0, 25, 50), xs):
                f.write(json.dumps({"step": step, "eval/vault-family/success_noexp": x - 0.1,
                                    "eval/vault-family/success_exp": x,
                                    "eval/vault-family/control/success_noexp": 0.375}) + "\n")
                f.write(json.dumps({"step": step + 1, "train/vault-family/success_noexp": 0.0}) + "\n")
    text = curves.report(str(tmp_path), "vault-family", level=0.9, early=25)
    held, control = text.split("## control")
    # grpo's curve is its noexp: at 0 the mean of 0.1 and 0.3, sd 0.1414
    assert "| 0 | " in held and f"0.200 ± {12.706 * 0.1414214 / math.sqrt(2):.3f} (2)" in held
    # oracle exp − grpo: at 25 (1.0 - 0.4, 0.9 - 0.4) = 0.6, 0.5; at 50 (1.0 - 0.8, 1.0 - 0.6) = 0.2, 0.4
    diff25, diff50 = reproduce.mean_ci([0.6, 0.5]), reproduce.mean_ci([0.2, 0.4])
    assert (f"- oracle exp − grpo, paired by seed: at 25 {reproduce.fmt(*diff25)} (2 seeds); at 50 "
            f"{reproduce.fmt(*diff50)} (2 seeds)") in held
    assert "- oracle exp − noexp at 50, paired by seed: 0.100 ± 0.000 (2 seeds)" in held
    # oracle exp reaches 0.9 at 25 (seed 0: 1.0; seed 1: 0.9); grpo noexp (0.8, 0.6 at 50) never does
    assert "- oracle exp: first evaluation at ≥ 0.9: 25.000 ± 0.000 in 2 of 2 seeds" in held
    assert "- grpo noexp: first evaluation at ≥ 0.9: never, in 2 seeds" in held
    assert "| 50 | 0.375 ± 0.000 (2) |" in control
