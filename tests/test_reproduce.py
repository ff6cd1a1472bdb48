"""reproduce.py: the paper-style table from a fabricated results folder (numbers worked by hand), from a small
compact record (tests/data/record), and one 2-iteration grid cell end to end through train.py (resumable, skipped
once done, compacted)."""
import json
import lzma
import math
import os
import shutil
import subprocess
import sys
import types

import pytest

import crl
import envs
import vault_study
import reproduce
import train
from rundir import read_lines

RECORD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "record")


def _run(root, mode, seed, final: dict, rows: list[dict], task="room"):
    d = os.path.join(root, task, f"{mode}-seed{seed}")
    os.makedirs(d)
    json.dump(final, open(os.path.join(d, "final.json"), "w"))
    open(os.path.join(d, "metrics.jsonl"), "w").write("".join(json.dumps(r) + "\n" for r in rows))


def test_mean_ci_by_hand():
    m, h = reproduce.mean_ci([0.5, 0.6, 0.7])      # sd 0.1, t(2 df) 4.303: 4.303 * 0.1 / sqrt(3)
    assert m == pytest.approx(0.6) and h == pytest.approx(0.248434, abs=1e-6)
    m, h = reproduce.mean_ci([0.3])
    assert m == 0.3 and math.isnan(h)


def test_table_from_fabricated_results(tmp_path):
    root = str(tmp_path)
    crl_noexp, crl_exp, grpo = [0.5, 0.6, 0.7], [0.6, 0.6, 0.9], [0.4, 0.5, 0.5]
    for s in range(3):
        rewards = [{"step": i, "extractor/reward": r, "lessons/right_written": (r + 1) / 2,
                    "lessons/right_by_chance": (r + 1) / 4, "retrieval/age": i + 1}
                   for i, r in enumerate([-0.5, -0.3, 0.1, 0.3, 0.5, 0.7])]
        evals = [{"step": 0, "eval/room/success_noexp": 0.2, "eval/room/success_exp": 0.1}]
        _run(root, "crl", s, {"eval/room/success_noexp": crl_noexp[s], "eval/room/success_exp": crl_exp[s]},
             evals + rewards)
        _run(root, "grpo", s, {"eval/room/success_noexp": grpo[s]}, [{"step": 0, "eval/room/success_noexp": 0.2}])
    for s, x in enumerate([0.5, 0.6]):    # two seeds of static, paired with GRPO's first two
        _run(root, "static", s, {"eval/room/success_noexp": x, "eval/room/success_exp": x}, [])
    text = reproduce.table(root, "room")
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in text.splitlines() if line.startswith("| ") and "mode" not in line}
    assert set(rows) == {"crl", "grpo", "static"}
    assert rows["crl"][0] == "3/3"
    assert rows["crl"][1] == "0.700 ± 0.430"    # [0.6, 0.6, 0.9]: sd 0.1732, 4.303 * 0.1732 / sqrt(3)
    assert rows["crl"][2] == "0.600 ± 0.248"
    assert rows["crl"][3] == "0.100 ± 0.248"    # paired w/ - w/o: [0.1, 0.0, 0.2]: sd 0.1, as above
    # extractor reward over the first and last third of its 6 steps: (-0.5 - 0.3) / 2 and (0.5 + 0.7) / 2
    assert rows["crl"][4] == "-0.400 ± 0.000 → 0.600 ± 0.000"
    assert rows["crl"][5] == "0.300 ± 0.000 → 0.800 ± 0.000" and rows["grpo"][5] == "—"   # (x + 1) / 2 of those
    assert rows["crl"][6] == "0.150 ± 0.000 → 0.400 ± 0.000" and rows["grpo"][6] == "—"   # (x + 1) / 4: by chance
    assert rows["crl"][7] == "1.500 ± 0.000 → 5.500 ± 0.000" and rows["grpo"][7] == "—"   # ages 1, 2 and 5, 6
    assert rows["grpo"][1] == "—" and rows["grpo"][2] == "0.467 ± 0.143"
    # CRL w/o exp - GRPO paired: [0.1, 0.1, 0.2] -> mean 0.1333, sd 0.0577, half-width 0.1434: contains zero
    assert "CRL (eval without experience) − GRPO, paired by seed: 0.133 ± 0.143 over 3 seed(s); the 95% " \
           "interval contains zero; rank test p = 0.300 (exact, 3 v 3 seeds, whose least p is 0.100)" in text
    # (the rank test: pooled mid-ranks 1 for 0.4, 3 for the three 0.5s, 5, 6; CRL's sum 3 + 5 + 6 = 14, 3.5 from its
    # mean 10.5; of the 20 splits into 3 and 3, those at 14 (5 + 6 with a 3: three) or 7 or less (1 + 3 + 3: three))
    # w/ exp - GRPO: [0.2, 0.1, 0.4] -> mean 0.2333, sd 0.1528, half-width 0.37949; every CRL seed above GRPO's:
    # of the 20 splits only CRL's and GRPO's own are as far apart, p = 2 / 20
    assert "CRL (eval with experience) − GRPO, paired by seed: 0.233 ± 0.379 over 3 seed(s); the 95% interval " \
           "contains zero; rank test p = 0.100 (exact, 3 v 3 seeds, whose least p is 0.100)" in text
    # static - GRPO on seeds 0 and 1: [0.5 - 0.4, 0.6 - 0.5] = [0.1, 0.1]: sd 0, so the interval is above zero
    assert "static (eval without experience) − GRPO, paired by seed: 0.100 ± 0.000 over 2 seed(s); the 95% " \
           "interval is above zero" in text
    reproduce.curve(root, "room")
    assert os.path.getsize(os.path.join(root, "room.png")) > 1000
    # lessons right by block of 4 iterations: steps 0-3 (0.25 + 0.35 + 0.55 + 0.65) / 4, steps 4-5 (0.75 + 0.85) / 2
    starts, means = reproduce.blocks(reproduce.read_runs(root, "room")["crl"][0]["rows"], "lessons/right_written", 4)
    assert starts == [0, 4] and means == pytest.approx([0.45, 0.8])
    assert reproduce.lessons_curve(root, "room", 4)
    assert os.path.getsize(os.path.join(root, "room-lessons.png")) > 1000
    assert not reproduce.lessons_curve(root, "maze")    # no run logs it there: no figure


def test_curves_table_from_fabricated_evaluations_during_training(tmp_path):
    """Held-out success at each evaluation during training, per panel (a task's own and its control), each mode
    minus GRPO paired by seed at each, and the first evaluation reaching REACH (0.6), worked by hand."""
    root, panel = str(tmp_path), "t/control"

    def rows(noexp, exp=None):
        return [{"step": i, "eval/t/success_noexp": n, f"eval/{panel}/success_noexp": 0.375,
                 **({"eval/t/success_exp": exp[k], f"eval/{panel}/success_exp": 0.375} if exp else {})}
                for k, (i, n) in enumerate(zip((0, 25, 50), noexp))]
    for s, (g, gf) in enumerate((([0.3, 0.5, 0.7], 0.8), ([0.3, 0.4, 0.5], 0.6))):
        _run(root, "grpo", s, {"eval/t/success_noexp": gf, f"eval/{panel}/success_noexp": 0.375}, rows(g), "t")
    for s, (n, e, nf, ef) in enumerate((([0.3, 0.5, 0.8], [0.4, 0.7, 0.9], 0.8, 0.9),
                                        ([0.3, 0.5, 0.6], [0.2, 0.6, 0.8], 0.7, 0.7))):
        _run(root, "crl", s, {"eval/t/success_noexp": nf, "eval/t/success_exp": ef}, rows(n, e), "t")
    lines = reproduce.curves_table(reproduce.read_runs(root, "t"), "t")
    control = next(k for k, line in enumerate(lines) if f"`{panel}`" in line)   # the task's own panel first
    cells = {tuple(c.strip() for c in line.split("|")[1:3]): [c.strip() for c in line.split("|")[3:-1]]
             for line in lines[:control] if line.startswith("| ") and "mode" not in line}
    # [0.3, 0.3], [0.5, 0.4], [0.7, 0.5], final [0.8, 0.6]: sd 0.0707 or 0.1414, t(1) 12.706 / sqrt(2)
    assert cells[("grpo", "w/o exp")] == ["0.300 ± 0.000", "0.450 ± 0.635", "0.600 ± 1.271", "0.700 ± 1.271"]
    # crl w/ exp minus GRPO: [0.1, -0.1], [0.2, 0.2], [0.2, 0.3], final [0.1, 0.1]
    assert cells[("crl − grpo", "w/ exp")] == ["0.000 ± 1.271", "0.200 ± 0.000", "0.250 ± 0.635", "0.100 ± 0.000"]
    assert "crl w/ exp: first evaluation at 0.6 or more in 2/2 seeds, iteration 25 ± 0 (by seed: 25, 25).  " \
        in lines
    assert sum("first evaluation" in line for line in lines) == 3   # the task's own panel only
    assert "grpo w/o exp: first evaluation at 0.6 or more in 1/2 seeds, iteration 50 (by seed: 50, never).  " \
        in lines
    # the early budget (EARLY, iteration 50) beside the end: CRL w/ exp [0.9, 0.8] against GRPO [0.7, 0.5]; ranks 4, 3
    # against 2, 1: of the 6 splits into 2 and 2, rank sums 7 and 3 are 2 from the mean 5, p = 2 / 6
    assert reproduce.EARLY == 50
    early = "CRL (eval with experience, iteration 50) − GRPO, paired by seed: 0.250 ± 0.635 over 2 seed(s); the 95% " \
            "interval contains zero; rank test p = 0.333 (exact, 2 v 2 seeds, whose least p is 0.333).  "
    assert early in reproduce.table(root, "t")


@pytest.mark.parametrize("damage", ['{"step": 1, "eval/room/succ', "[]", '{"step": 1}'])
def test_a_damaged_final_json_is_an_unfinished_cell(tmp_path, monkeypatch, capsys, damage):
    """final.json cut short, or whole but without the held-out success: the cell is not done, so it resumes from
    its checkpoint (whose final evaluation rewrites the file), and meanwhile the table counts it unfinished
    instead of failing; one note names the file."""
    out = tmp_path / "room" / "crl-seed0"
    (out / "ckpt").mkdir(parents=True)
    (out / "ckpt" / "state.pt").write_bytes(b"")
    (out / "final.json").write_text(damage)
    _run(str(tmp_path), "crl", 1, {"eval/room/success_noexp": 0.5}, [])
    calls = []
    monkeypatch.setattr(reproduce, "check_same_flags", lambda *a: None)
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    a, _ = reproduce.parse_args(["--results", str(tmp_path), "--iters", "2"])
    reproduce.run_one("room", "crl", 0, a, [])
    assert len(calls) == 1 and calls[0][-1] == "--resume"
    assert "| crl | 1/2 | — | 0.500 |" in reproduce.table(str(tmp_path), "room")
    notes = [line for line in capsys.readouterr().err.splitlines() if "final.json" in line]
    assert len(notes) == 1 and notes[0].startswith(f"note: {out / 'final.json'} is damaged (")
    assert notes[0].endswith("the cell counts as unfinished and the grid runs it again")


def test_bad_mode_is_one_line_error():
    with pytest.raises(SystemExit):
        reproduce.parse_args(["--modes", "crl,nope"])


def test_grid_cell_end_to_end(tmp_path, capsys):
    """A 2-iteration no-split cell: trained through train.py, final.json written, skipped when done, and
    resumed from its checkpoint when the final evaluation is missing."""
    tiny = ["--iters", "2", "--eval-every", "1", "--eval-episodes", "2", "--max-steps", "3", "--groups", "2",
            "--extractor-batch", "4", "--warmup", "0"]
    argv = ["--modes", "no-split", "--seeds", "1", "--final-episodes", "3", "--results", str(tmp_path), "--", *tiny]
    reproduce.main(argv)
    out = tmp_path / "room" / "no-split-seed0"
    final = json.load(open(out / "final.json"))
    assert final["episodes"] == 3 and 0 <= final["eval/room/success_noexp"] <= 1
    args = json.load(open(out / "args.json"))
    assert args["mode"] == "crl" and args["split"] is False
    assert "| no-split | 1/1 |" in (tmp_path / "room.md").read_text()
    assert (tmp_path / "room.png").exists()
    logs = {"metrics.jsonl.xz", "bank.jsonl.xz"}           # compacted once finished: no plain log, no curve.png
    assert logs <= set(os.listdir(out)) and not {"metrics.jsonl", "bank.jsonl", "curve.png"} & set(os.listdir(out))
    stamp = os.path.getmtime(out / "metrics.jsonl.xz")
    reproduce.main(argv)                                   # done: skipped
    assert os.path.getmtime(out / "metrics.jsonl.xz") == stamp
    os.remove(out / "final.json")                          # killed during the final evaluation: resumed
    reproduce.main(argv)
    assert json.load(open(out / "final.json")) == final    # the same held-out seeds and sampling noise
    for name in ("metrics.jsonl", "bank.jsonl"):           # the resumed run read its logs back from the .xz
        assert [json.loads(line)["step"] for line in read_lines(str(out / name))] == [0, 1]
    assert logs <= set(os.listdir(out)) and "metrics.jsonl" not in os.listdir(out)
    assert "resuming" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="iters: 2 here, 3 asked"):   # never mixed into a grid of another budget
        reproduce.main([*argv[:argv.index("--")], "--", *tiny, "--iters", "3"])
    reproduce.main([*argv, "--eval-batch", "2"])           # how evaluation is batched is not a budget: skipped
    reproduce.main([*argv, "--save-every", "1"])           # nor how often a checkpoint is written
    assert json.load(open(out / "final.json")) == final
    saved = json.load(open(out / "args.json"))             # a cell that chose where it distils (a GPU's, inline)
    json.dump({**saved, "distill": "inline"}, open(out / "args.json", "w"))
    reproduce.main(argv)                                   # belongs to a grid that left it to the machine: skipped
    with pytest.raises(SystemExit, match="distill: inline here, background asked"):
        reproduce.main([*argv, "--distill", "background"])


def test_cells_side_by_side_equal_cells_one_at_a_time(tmp_path):
    """--jobs 2 trains two cells as concurrent processes, each logging to RESULTS/logs/; every cell ends as
    it does when the cells run one after another."""
    tiny = ["--iters", "2", "--eval-every", "0", "--max-steps", "3", "--groups", "2"]
    finals = {}
    for jobs in (1, 2):
        results = tmp_path / f"jobs{jobs}"
        reproduce.main(["--modes", "grpo", "--seeds", "2", "--final-episodes", "4", "--jobs", str(jobs),
                        "--results", str(results), "--", *tiny])
        finals[jobs] = [json.load(open(results / "room" / f"grpo-seed{s}" / "final.json")) for s in (0, 1)]
    assert finals[1] == finals[2]
    assert sorted(os.listdir(tmp_path / "jobs2" / "logs")) == ["room-grpo-seed0.log", "room-grpo-seed1.log"]
    assert not (tmp_path / "jobs1" / "logs").exists()


def test_a_cell_that_stops_stops_the_grid(tmp_path, monkeypatch):
    started = []

    def stops(task, mode, seed, a, extra):
        started.append((mode, seed))
        sys.exit(f"error: {task} {mode} seed {seed} stopped")

    monkeypatch.setattr(reproduce, "run_one", stops)
    with pytest.raises(SystemExit, match="grpo seed 0 stopped"):
        reproduce.main(["--modes", "grpo,crl", "--seeds", "2", "--results", str(tmp_path)])
    assert started == [("grpo", 0)]   # no other cell was started after it


def test_seeds_a_to_b_runs_those_seeds_seed_by_seed(tmp_path, monkeypatch, capsys):
    """--seeds 1-2 trains seeds 1 and 2 (a grid leaving out the seed its pilots chose on), every mode of a seed
    before the next; a range that names no seed is a one-line error."""
    started = []
    monkeypatch.setattr(reproduce, "run_one", lambda task, mode, seed, a, extra: started.append((mode, seed)))
    monkeypatch.setattr(reproduce, "report", lambda results, task: None)
    reproduce.main(["--modes", "grpo,crl", "--seeds", "1-2", "--results", str(tmp_path)])
    assert started == [("grpo", 1), ("crl", 1), ("grpo", 2), ("crl", 2)]
    for bad in ("3-1", "one"):
        with pytest.raises(SystemExit):
            reproduce.parse_args(["--seeds", bad])
    assert "--seeds" in capsys.readouterr().err


def test_attempts_table_takes_the_last_attempt(tmp_path):
    """With an attempts evaluation in final.json: success at each attempt per mode, and each mode minus GRPO at
    the last attempt, paired by seed (hand numbers)."""
    root = str(tmp_path)
    for s, (a1, a3) in enumerate([(0.3, 0.6), (0.4, 0.8)]):
        crl = {"eval/vault/success_exp": 0.3, "eval/vault/success_noexp": 0.3}
        crl.update({f"attempts/vault/success_exp_{a}": x for a, x in ((1, a1), (2, (a1 + a3) / 2), (3, a3))})
        crl.update({f"attempts/vault/success_noexp_{a}": 0.35 for a in (1, 2, 3)})
        crl.update({"attempts/previous_attempt_2": 1.0, "attempts/previous_attempt_3": 0.5 + s / 4})
        crl.update({"attempts/wrote_1": 0.5, **({"attempts/wrote_2": 0.25} if s else {})})   # seed 0 ran without it
        crl.update({"attempts/vault/contrast_3": a3 - 0.35, "attempts/vault/contrast_sd_3": 0.5,
                    "attempts/vault/contrast_n_3": 256 if s else 3})
        _run(root, "crl", s, crl, [], "vault")
        _run(root, "grpo", s, {"eval/vault/success_noexp": 0.4, **{f"attempts/vault/success_noexp_{a}": 0.4 + s / 10
                                                                  for a in (1, 2, 3)}}, [], "vault")
    text = reproduce.table(root, "vault")
    # t(1 df) 12.706 * sd / sqrt 2
    assert "| crl | w/ exp | 0.350 ± 0.635 | 0.525 ± 0.953 | 0.700 ± 1.271 |" in text
    assert "| grpo | w/o exp | 0.450 ± 0.635 | 0.450 ± 0.635 | 0.450 ± 0.635 |" in text
    # attempt 3, with experience: [0.6 - 0.4, 0.8 - 0.5] = [0.2, 0.3]: mean 0.25, sd 0.0707, 12.706 * 0.05 = 0.635
    assert "CRL (eval with experience, attempt 3) − GRPO, paired by seed: 0.250 ± 0.635 over 2 seed(s)" in text
    assert "CRL (eval with experience) − GRPO, paired by seed: -0.100 ± 0.000" in text   # the plain evaluation too
    # the previous attempt's lesson read: 1.0 at attempt 2; [0.5, 0.75] at 3: sd 0.1768, 12.706 * 0.125 = 1.588
    assert "crl: share of episodes that read the lesson the attempt before wrote, at attempt 2 … 3: 1.000 ± 0.000 " \
           "/ 0.625 ± 1.588; share of instances given a lesson (not NONE) after attempt 1 … 2: 0.500 ± 0.000 / " \
           "0.250." in text and "grpo: share" not in text
    # each run's own contrast at attempt 3: 0.5 * t / sqrt(n): 4.303 * 0.5 / sqrt 3 = 1.242; 1.96 * 0.5 / 16 = 0.061
    assert "crl: each run's own with − without experience at attempt 3, same instances (95% interval over " \
           "instances): seed 0 +0.250 ± 1.242, seed 1 +0.450 ± 0.061." in text and "grpo: each" not in text
    assert "− static" not in text   # no static runs: no line
    for s, x in enumerate([0.5, 0.9]):   # static at attempt 3: with experience 0.5, 0.9; without 0.35, 0.25
        _run(root, "static", s, {"eval/vault/success_noexp": 0.3, "attempts/vault/success_exp_3": x,
                                 "attempts/vault/success_noexp_3": 0.35 - s / 10}, [], "vault")
    text = reproduce.table(root, "vault")
    # CRL − static at attempt 3, each against static's own kind: with [0.6 - 0.5, 0.8 - 0.9] = [0.1, -0.1]: mean 0,
    # sd 0.1414, 12.706 * 0.1 = 1.271; without [0.35 - 0.35, 0.35 - 0.25] = [0, 0.1]: 12.706 * 0.05 = 0.635
    assert "CRL (eval with experience, attempt 3) − static, paired by seed: 0.000 ± 1.271 over 2 seed(s); the 95% " \
           "interval contains zero" in text
    assert "CRL (eval without experience, attempt 3) − static, paired by seed: 0.050 ± 0.635 over 2 seed(s)" in text


def test_the_oracle_mode_overrides_the_grids_extractor():
    """A cell's mode flags follow the grid's own: `oracle` runs static with the scripted extractor even where the
    grid names a model extractor (train.py rejects the oracle outside static)."""
    a = reproduce.parse_args(["--iters", "5"])[0]
    argv = reproduce.train_argv("vault", "oracle", 2, "out", a, ["--extractor", "smollm2", "--merge-every", "0"])
    args = train.parse_args([*argv, "--actor", "tiny", "--no-free-text"])
    assert (args.mode, args.extractor, args.seed, args.iters) == ("static", "oracle", 2, 5)
    with pytest.raises(SystemExit):
        train.parse_args(["--extractor", "oracle", "--mode", "crl", "--merge-every", "0", "--no-free-text"])


def test_race_counts_cispo_steps_lessons_and_the_gap_by_block():
    """Hand rows over 4 iterations in blocks of 2: CISPO steps at 1 and 2 (one a block, 1 then 2 by the block's
    end), lessons right 0.5 and (1 + 0) / 2, the gap (0.5 - 0.25 + 0.25 - 0.25) / 2 = 0.125 then -0.5 / 1."""
    rows = [{"step": 0, "train/vault/success_exp": 0.5, "train/vault/success_noexp": 0.25,
             "lessons/right_written": 0.5},
            {"step": 1, "train/vault/success_exp": 0.25, "train/vault/success_noexp": 0.25, "extractor/reward": 0.1},
            {"step": 2, "extractor/reward": 0.3, "lessons/right_written": 1.0, "lessons/right_by_chance": 0.25},
            {"step": 3, "train/vault/success_exp": 0.0, "train/vault/success_noexp": 0.5, "lessons/right_written": 0.0,
             "lessons/right_by_chance": 0.5}]
    assert reproduce.race(rows, "vault", 2)[2:] == ["| 0-1 | 1 (1) | 0.50 | — | +0.125 |",
                                                   "| 2-3 | 1 (2) | 0.50 | 0.38 | -0.500 |"]


def test_race_reads_the_runs_own_task_whatever_tasks_says(tmp_path, capsys):
    """`--race RUN` on a vault run without `--tasks vault` (the default is room): the gap column is the vault's,
    read through the run's args.json, as the hand rows above give it, not nan."""
    rows = [{"step": 0, "train/vault/success_exp": 0.5, "train/vault/success_noexp": 0.25,
             "lessons/right_written": 0.5, "lessons/right_by_chance": 0.25}]
    (tmp_path / "args.json").write_text(json.dumps({"tasks": ["vault"], "instance_visits": 4}))
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    reproduce.main(["--race", str(tmp_path)])
    assert "| 0-29 | 0 (0) | 0.50 | 0.25 | +0.250 |" in capsys.readouterr().out


def test_chance_from_bank_rebuilds_lessons_right_by_chance_from_the_bank_and_the_vaults_played(tmp_path):
    """A run of 2 iterations, 2 groups, 2 lessons a group, logged before the metric: iteration 0's lessons name
    group 0's door twice and group 1's door then another, so right 3/4 and by chance what vault_study.right_by_chance
    gives those pairs; iteration 1's lessons all name group 0's door. One lesson changed so that right_written
    no longer matches: the rows come back unchanged."""
    a = {"seed": 3, "tasks": ["vault"], "instance_visits": 4, "groups": 2, "distill_per_group": 2}
    run = types.SimpleNamespace(seed=3, tasks=["vault"], cfg=types.SimpleNamespace(**a))
    door = {(t, g): envs.vault_door(vault_study.visiting_instance(run, t, g, crl.EVAL_SEED0)[1])
            for t in (0, 1) for g in (0, 1)}
    other = next(d for d in envs.Vault.actions if d != door[0, 1])
    bank = [[door[0, 0], 0, 0, 0], [door[0, 0], 0, 0, 0], [door[0, 1], 0, 0, 0], [other, 0, 0, 0]] + \
        [[door[1, 0], 0, 0, 1]] * 4
    pairs = {0: [(door[0, 0], door[0, 0])] * 2 + [(door[0, 1], door[0, 1]), (other, door[0, 1])],
             1: [(door[1, 0], door[1, 0])] * 2 + [(door[1, 0], door[1, 1])] * 2}
    rows = [{"step": t, "lessons/right_written": sum(w == d for w, d in pairs[t]) / 4} for t in (0, 1)]
    (tmp_path / "args.json").write_text(json.dumps(a))
    (tmp_path / "bank.jsonl").write_text(json.dumps({"step": 1, "bank": {"vault": bank}}) + "\n")
    filled = reproduce.chance_from_bank(str(tmp_path), rows)
    assert [r["lessons/right_by_chance"] for r in filled] == [
        vault_study.right_by_chance(pairs[t])["lessons/right_by_chance"] for t in (0, 1)]
    assert rows[0]["lessons/right_written"] == 0.75
    bank[3] = [door[0, 1], 0, 0, 0]
    (tmp_path / "bank.jsonl").write_text(json.dumps({"step": 1, "bank": {"vault": bank}}) + "\n")
    assert reproduce.chance_from_bank(str(tmp_path), rows) == rows


def test_extractor_races_count_cispo_steps_by_iteration_60_and_lessons_right_by_block(tmp_path):
    """Hand rows: CISPO steps (rows with an extractor reward) at iterations 10, 59, 60 and 70 are 2 by iteration
    60; lessons right 0.2 and 0.4 in iterations 0-29, none in 30-59, 1.0 in 60-89: 0.30 / — / 1.00. A run still
    training and GRPO, which trains no extractor, give no line."""
    root = str(tmp_path)
    rows = [{"step": 10, "extractor/reward": 0.1, "lessons/right_written": 0.2},
            {"step": 20, "lessons/right_written": 0.4},
            {"step": 59, "extractor/reward": 0.2}, {"step": 60, "extractor/reward": 0.3, "lessons/right_written": 1.0},
            {"step": 70, "extractor/reward": 0.4}]
    _run(root, "crl", 0, {"eval/vault/success_noexp": 0.3}, rows, "vault")
    _run(root, "crl", 1, {"eval/vault/success_noexp": 0.3}, rows[:2], "vault")   # seed 1: 1 step, right 0.30
    _run(root, "grpo", 0, {"eval/vault/success_noexp": 0.3}, [{"step": 10}], "vault")
    os.makedirs(os.path.join(root, "vault", "exp-only-seed0"))   # started, not finished: no final.json
    open(os.path.join(root, "vault", "exp-only-seed0", "metrics.jsonl"), "w").write(json.dumps(rows[0]) + "\n")
    text = reproduce.table(root, "vault")
    assert "crl: each run's CISPO steps by iteration 60 and lessons right by block of 30 iterations: seed 0 2 steps, " \
           "right 0.30 / — / 1.00; seed 1 1 steps, right 0.30." in text
    assert "grpo: each run's CISPO" not in text and "exp-only: each run's CISPO" not in text


def test_replay_trains_a_runs_first_iterations_again_and_finds_a_changed_value(tmp_path, capsys):
    """--replay: a recorded 3-iteration crl run (evaluated at iterations 0 and 2) replays its first 2 iterations
    value for value, the replay's own evaluation at its last iteration aside; one recorded value changed in the
    second iteration, and the replay names that step and key. A key only the replay has is not a difference."""
    run = tmp_path / "run"
    train.main(["--tasks", "room", "--iters", "3", "--eval-every", "2", "--eval-episodes", "2", "--max-steps", "3",
                "--groups", "2", "--extractor-batch", "2", "--warmup", "0", "--out", str(run)])
    assert reproduce.replay(str(run), 2)
    assert "first 2 iterations replay value for value" in capsys.readouterr().out
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    assert "eval/room/success_noexp" in rows[0] and "eval/room/success_noexp" not in rows[1]
    rows[1]["reward"] += 0.125
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert not reproduce.replay(str(run), 2)
    assert "step 1 differs" in capsys.readouterr().out
    # a metric the run did not log yet (added since) is no difference; one it logged and the replay lacks is
    newer = [{**r, "lessons/right_by_chance": 0.5} for r in rows[:2]]
    assert reproduce.replay_differs(str(run), newer) is None
    assert "step 0 differs" in reproduce.replay_differs(str(run), [{k: v for k, v in rows[0].items() if k != "turns"}])


def test_the_reader_reads_xz_and_plain_alike(tmp_path):
    """rundir.read_lines gives a log's lines as open() does, from NAME or from NAME.xz (squeeze's), the plain one
    first where both are (a compacted run resumed writes it); neither is one error naming both."""
    lines = ['{"step": 0}\n', '{"step": 1, "lesson": "north é"}\n', '{"step": 2}\n']
    plain, packed = str(tmp_path / "plain.jsonl"), str(tmp_path / "packed.jsonl")
    for path in (plain, packed):
        open(path, "w", encoding="utf-8").write("".join(lines))
    reproduce.squeeze(packed)
    assert not os.path.exists(packed) and os.path.exists(packed + ".xz")
    assert list(read_lines(plain)) == list(read_lines(packed)) == lines
    open(packed, "w").write(lines[0])
    assert list(read_lines(packed)) == lines[:1]
    with pytest.raises(FileNotFoundError, match=r"neither \S*none.jsonl nor \S*none.jsonl.xz exists"):
        list(read_lines(str(tmp_path / "none.jsonl")))


def test_a_compact_record_regenerates_its_table():
    """tests/data/record: results/vault-first's crl and grpo seeds 0 and 1, each cut to its first 60 metrics rows
    and 3 bank snapshots, then compacted (`--compact`). Its vault.md is the table reproduce.py made from the plain
    cells before they were compacted: read through the .xz, the record gives it back exactly."""
    assert not any(name.endswith(".jsonl") for _, _, files in os.walk(RECORD) for name in files)
    assert reproduce.table(RECORD, "vault") == open(os.path.join(RECORD, "vault.md"), encoding="utf-8").read()


def test_compact_keeps_every_line_drops_the_figures_and_leaves_unfinished_runs(tmp_path):
    """The record expanded to plain logs, with a curve.png, and an unfinished run beside it (2 of its 300
    iterations, no final.json): `--compact` makes each log its .xz byte for byte, removes the figure, leaves the
    unfinished run plain, and the table is as committed; a second pass changes nothing; --draw draws the curve."""
    root = tmp_path / "record"
    shutil.copytree(RECORD, root)
    plain = {}
    for xz in sorted(root.rglob("*.xz")):
        plain[xz] = lzma.decompress(xz.read_bytes())
        xz.with_suffix("").write_bytes(plain[xz])
        xz.unlink()
    (root / "vault" / "crl-seed0" / "curve.png").write_bytes(b"a figure")
    unfinished = root / "pilot" / "crl-seed0"
    unfinished.mkdir(parents=True)
    shutil.copy(root / "vault" / "crl-seed0" / "args.json", unfinished)
    (unfinished / "metrics.jsonl").write_bytes(b"".join(plain[root / "vault" / "crl-seed0" / "metrics.jsonl.xz"]
                                                        .splitlines(True)[:2]))
    reproduce.main(["--compact", str(root)])
    assert {xz: lzma.decompress(xz.read_bytes()) for xz in plain} == plain
    assert not [p for p in root.rglob("*") if p.suffix in (".jsonl", ".png") and p.parent != unfinished]
    assert sorted(os.listdir(unfinished)) == ["args.json", "metrics.jsonl"]
    stamps = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    reproduce.main(["--compact", str(root)])
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == stamps
    assert reproduce.table(str(root), "vault") == (root / "vault.md").read_text(encoding="utf-8")
    reproduce.main(["--draw", str(root / "vault" / "crl-seed0")])   # its curve, drawn again from the .xz
    assert (root / "vault" / "crl-seed0" / "curve.png").stat().st_size > 1000
