"""End to end: train.py on tiny models in every mode, --resume, bad input, DDP with torchrun, and free-text
mode on HF checkpoints (written with transformers) including search_and_ask."""
import copy
import functools
import json
import os
import subprocess
import sys
import time

import pytest
import torch

import crl
import parallel
import prior
import rundir
import train
import update
from model import token_logprobs
from sampling import Sampling
from small import presets
from small.tiny import tiny_model
from update import micro_batches, pad_segments

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = ["--groups", "2", "--group-size", "4", "--eval-episodes", "2", "--eval-every", "1", "--extractor-batch", "2",
        "--max-context", "2048", "--merge-every", "1", "--warmup", "0", "--distill-per-group", "2", "--max-steps", "3"]


def read_metrics(out):
    return [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]


def strip_times(m):
    return {k: v for k, v in m.items() if not k.startswith("time/")}


@pytest.mark.parametrize("mode", crl.MODES)
def test_two_iterations_every_mode(tmp_path, mode):
    out = str(tmp_path / mode)
    run = train.main(["--tasks", "room", "--mode", mode, "--iters", "2", "--out", out, *FAST])
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [0, 1]
    halves = {"noexp": 8} if mode == "grpo" else {"noexp": 4, "exp": 4}   # FAST: 2 groups of 4 episodes
    for r in rows:
        assert {k for k in r if k.startswith("train/room/success")} == {f"train/room/success_{h}" for h in halves}
        wins = {h: r[f"train/room/success_{h}"] * n for h, n in halves.items()}
        assert all(w == round(w) for w in wins.values()) and "eval/room/success_noexp" in r
        if not any(wins.values()):   # no episode won: each played all of --max-steps 3
            assert r["turns"] == 3
        assert 0 < r["time/generate"] <= r["time/iteration"]
    assert os.path.exists(os.path.join(out, "curve.png"))
    if mode == "grpo":   # a bank mode logs its whole bank at each evaluation (python -m probes.lessons reads it)
        assert not os.path.exists(os.path.join(out, "bank.jsonl"))
    else:
        snaps = [json.loads(line) for line in open(os.path.join(out, "bank.jsonl"))]
        assert [s["step"] for s in snaps] == [0, 1]
        assert sum(map(len, snaps[-1]["bank"].values())) == len(run.manager.bank)
    ckpt = os.path.join(out, "ckpt")
    assert os.path.exists(os.path.join(ckpt, "actor", "config.json")) and os.path.exists(os.path.join(ckpt, "state.pt"))
    if mode == "grpo":
        assert run.manager is None and not os.path.exists(os.path.join(ckpt, "bank"))
    else:
        assert os.path.exists(os.path.join(ckpt, "extractor", "config.json"))
        assert rows[-1]["bank_size"] == len(run.manager.bank) > 0   # the tiny extractor wrote entries
        assert sum(r["operations"] for r in rows) > 0
    if mode in ("crl", "grpo", "static"):
        assert "actor/loss" in rows[-1]
        if rows[-1]["actor/trained_seqs"]:
            assert rows[-1]["actor/ratio"] == pytest.approx(1.0, abs=1e-3)
    else:
        assert "actor/loss" not in rows[-1]   # exp-only: the actor is frozen


def test_first_ratio_is_one_on_policy():
    """Sampler log-probs (constrained to the actions, temperature 0.8, top-k 5) equal the trainer's
    recomputation on the episodes' full multi-turn token sequences."""
    from model import load_tokenizer
    actor = tiny_model(seed=3)
    cfg = crl.CRLConfig(mode="grpo", groups=2, temperature=0.8, top_k=5, free_text=False, max_reply_tokens=16,
                        max_context=4096)
    run = crl.Run(cfg, ["room"], 0, actor, load_tokenizer("tiny"), None, None, None, None, None)
    run.timer = {"generate": 0.0, "env": 0.0}
    eps = crl.rollout(run, crl.episode_specs(run, 0)[:6], crl.seeded_generator("cpu", 0, 0, 0, 1), cfg.temperature)
    segs = [s for e in eps for s in e.segments]
    assert all(e.turns >= 1 for e in eps) and sum(sum(s.mask) for s in segs) > 6
    with torch.no_grad():
        for s in segs:
            mask = torch.tensor([s.mask])
            lp = token_logprobs(actor, torch.tensor([s.tokens]), mask, Sampling(0.8, top_k=5), allowed=[s.allowed])
            assert torch.allclose(lp[mask], torch.tensor(s.logprobs)[mask[0]], atol=1e-4)


def test_constrained_reply_fits_the_longest_action():
    """The tiny preset's 16-token replies still hold WebShop's 17-byte `click[<asin>]`: a constrained reply
    gets at least the longest valid action, so no reply is cut into an invalid action."""
    from model import load_tokenizer
    cfg = crl.CRLConfig(mode="grpo", groups=1, group_size=4, free_text=False, max_reply_tokens=16,
                        max_context=8192, max_steps=4)
    run = crl.Run(cfg, ["webshop"], 0, tiny_model(seed=0), load_tokenizer("tiny"), None, None, None, None, None)
    run.timer = {"generate": 0.0, "env": 0.0}
    eps = crl.rollout(run, crl.episode_specs(run, 0), crl.seeded_generator("cpu", 0, 0, 0, 1), 1.0)
    assert sum(e.turns for e in eps) >= 8 and sum(e.invalid for e in eps) == 0


# A setting where rewards vary and both models step (measured: the actor trains on 16-46 sequences in each of
# 3 iterations and the extractor takes a CISPO step on 3 generations at the third), unlike FAST, where every
# reward is 0.
STEPPING = ["--tasks", "room", "--groups", "4", "--group-size", "4", "--max-steps", "10", "--eval-every", "0",
            "--warmup", "0", "--extractor-batch", "2", "--merge-every", "2", "--distill-per-group", "2"]


def moved(model, seed: int) -> bool:
    """Whether the model's weights left the tiny init of `seed` (train.py: actor seed, extractor seed + 1)."""
    init = tiny_model(seed=seed).state_dict()
    return any(not torch.equal(v.float(), init[k]) for k, v in model.state_dict().items())


def test_each_update_recomputes_under_the_distribution_its_model_sampled_from(tmp_path, monkeypatch):
    """The actor's and the extractor's updates take log-probs at their own temperatures (the extractor's is
    crl.EXTRACTOR_TEMPERATURE) and the shared top-k, as their samplers drew: recomputed before any step, every
    trained token's log-prob is the sampler's."""
    gaps = {}

    def check(update, segments, advantages):
        tokens, mask, old = pad_segments(segments, "cpu")
        logp = token_logprobs(update.model, tokens, mask, update.sampling, allowed=[seg.allowed for seg in segments])
        who = "actor" if update.sampling.temperature == 0.7 else "extractor"
        gaps[who] = max(gaps.get(who, 0.0), (logp - old)[mask].abs().max().item())
        return {}
    monkeypatch.setattr(crl, "policy_update", check)
    train.main([*STEPPING, "--mode", "crl", "--iters", "3", "--temperature", "0.7", "--top-k", "3",
                "--out", str(tmp_path)])
    assert set(gaps) == {"actor", "extractor"} and max(gaps.values()) < 1e-4, gaps


@pytest.mark.parametrize("mode", ["crl", "static", "exp-only"])
def test_each_mode_trains_what_it_should(tmp_path, mode):
    """crl steps both models; static never changes the extractor; exp-only never changes the actor. Where the
    actor trains, every iteration runs its update (an iteration whose subgroups all tie trains no sequence: no
    advantage), the first trains sequences, and it is on-policy (ratio 1)."""
    run = train.main([*STEPPING, "--mode", mode, "--iters", "3", "--out", str(tmp_path / mode)])
    rows = read_metrics(str(tmp_path / mode))
    assert moved(run.actor, 0) == (mode != "exp-only")
    assert moved(run.extractor, 1) == (mode != "static")
    if mode != "exp-only":
        assert all("actor/trained_seqs" in r for r in rows) and rows[0]["actor/trained_seqs"] > 0
        assert rows[0]["actor/ratio"] == pytest.approx(1.0, abs=1e-3)
    else:
        assert not any("actor/loss" in r for r in rows)
    assert any("extractor/generations" in r for r in rows) == (mode != "static")


def test_a_head_start_is_exp_only_until_the_actor_starts(tmp_path):
    """--head-start 2: the first two iterations are an exp-only run's, value for value (the actor frozen, the
    extractor trained on the same draws); from the third the actor trains."""
    head = train.main([*STEPPING, "--mode", "crl", "--head-start", "2", "--iters", "3", "--out", str(tmp_path / "h")])
    train.main([*STEPPING, "--mode", "exp-only", "--iters", "2", "--out", str(tmp_path / "e")])
    rows, frozen = read_metrics(str(tmp_path / "h")), read_metrics(str(tmp_path / "e"))
    assert [strip_times(r) for r in rows[:2]] == [strip_times(r) for r in frozen]
    assert "actor/trained_seqs" in rows[2] and moved(head.actor, 0)


def test_the_actor_waits_out_the_warm_up(tmp_path):
    run = train.main([*STEPPING, "--mode", "crl", "--warmup", "2", "--iters", "2", "--out", str(tmp_path / "w")])
    assert not moved(run.actor, 0)
    assert not any("actor/loss" in r for r in read_metrics(str(tmp_path / "w")))


def test_resume_after_real_updates_is_exact(tmp_path):
    """After real steps of both models, a run that crashed between its checkpoint's two renames (the checkpoint
    left in ckpt.old) and after writing a metrics line past it, resumed with a bare --resume, ends with the
    uninterrupted run's metrics and weights: AdamW state, the extractor's generations and the bank come back."""
    full, part = str(tmp_path / "full"), str(tmp_path / "part")
    flags = [*STEPPING, "--mode", "crl", "--minibatches", "2"]
    a = train.main([*flags, "--iters", "4", "--out", full])
    train.main([*flags, "--iters", "2", "--out", part])
    saved = json.load(open(os.path.join(part, "args.json")))
    json.dump({**saved, "iters": 4}, open(os.path.join(part, "args.json"), "w"))    # as if started with 4
    os.replace(os.path.join(part, "ckpt"), os.path.join(part, "ckpt.old"))          # crashed between renames
    with open(os.path.join(part, "metrics.jsonl"), "a") as f:                          # and after a line past it
        f.write(json.dumps({"step": 2, "stale": True}) + "\n")
    assert train.parse_args(["--out", part, "--resume"]).iters == 4   # fails fast, before a run of the default length
    b = train.main(["--out", part, "--resume"])
    rows_a, rows_b = read_metrics(full), read_metrics(part)
    assert [r["step"] for r in rows_b] == [0, 1, 2, 3]
    assert [strip_times(r) for r in rows_a] == [strip_times(r) for r in rows_b]
    assert any("extractor/generations" in r for r in rows_b[2:])                     # both models stepped after
    assert all(r["actor/trained_seqs"] > 0 for r in rows_b[2:])
    for x, y in ((a.actor, b.actor), (a.extractor, b.extractor)):
        assert all(torch.equal(p, q) for p, q in zip(x.state_dict().values(), y.state_dict().values()))


def test_resume_gives_the_same_metrics(tmp_path):
    full, part = str(tmp_path / "full"), str(tmp_path / "part")
    args = ["--tasks", "room", "--mode", "crl", *FAST, "--minibatches", "2"]
    train.main([*args, "--iters", "2", "--out", full])
    train.main([*args, "--iters", "1", "--out", part])
    saved = json.load(open(os.path.join(part, "args.json")))
    json.dump({**saved, "iters": 2}, open(os.path.join(part, "args.json"), "w"))   # as if stopped after step 0
    assert train.parse_args(["--out", part, "--resume"]).iters == 2              # a bare --resume keeps every flag
    train.main(["--out", part, "--resume"])
    a, b = read_metrics(full), read_metrics(part)
    assert [r["step"] for r in b] == [0, 1]
    assert strip_times(a[1]) == strip_times(b[1])


def test_bad_input_is_one_clear_line(tmp_path):
    def run(*argv):
        p = subprocess.run([sys.executable, "train.py", *argv], cwd=ROOT, capture_output=True, text=True)
        assert p.returncode != 0 and "Traceback" not in p.stderr
        return p.stderr.strip().splitlines()[-1]
    assert "unknown task 'nethack'" in run("--tasks", "nethack") and "room" in run("--tasks", "nethack")
    assert "not found" in run("--actor", str(tmp_path / "nope"), "--out", str(tmp_path / "a"))
    out = tmp_path / "b"
    out.mkdir()
    (out / "args.json").write_text("{}")
    assert "--resume" in run("--out", str(out))
    assert "no checkpoint" in run("--out", str(tmp_path / "c"), "--resume")


def test_every_setting_is_a_documented_flag():
    """The command line is generated from CRLConfig (the bank's settings included) and RunConfig: each field
    has a flag with help; a preset fills what the command line leaves out, an explicit flag wins."""
    import argparse
    parser = argparse.ArgumentParser()
    train.add_flags(parser, (train.RunConfig, crl.CRLConfig), train.FIRST)
    seen = {a.dest: a for a in parser._actions if a.dest != "help"}
    fields = [dest for cls in (train.RunConfig, crl.CRLConfig) for dest, _ in train.flat_fields(cls)]
    assert "bank_use_penalty" in fields and "clip" in fields and "retrieve_k" in fields
    assert sorted(seen) == sorted(fields) and all(a.help for a in seen.values())
    tiny = train.parse_args([])
    assert tiny.groups == presets.TINY["groups"] and tiny.show_map is False and tiny.history == 0
    assert tiny.clip == crl.CRLConfig.clip and tiny.extractor_free_text is False
    explicit = train.parse_args(["--groups", "3", "--map", "--history", "none", "--bank-use-penalty", "0"])
    assert explicit.groups == 3 and explicit.show_map is True and explicit.history is None
    cfg = train.config_from(explicit)
    assert cfg.groups == 3 and cfg.bank.use_penalty == 0.0 and cfg.bank.recency_window == 1
    real = train.parse_args(["--actor", "/some/ckpt", "--extractor", "/other"])
    assert real.groups == crl.CRLConfig.groups and real.free_text and real.extractor_free_text
    assert real.lr == 1e-6 and real.iters == train.RunConfig.iters


@pytest.mark.parametrize("argv, message", [
    (["--iters", "-5"], "--iters must be >= 1"), (["--groups", "0"], "--groups must be >= 1"),
    (["--group-size", "3"], "--group-size must be an even number"), (["--top-p", "0"], "--top-p must be > 0"),
    (["--history", "-1"], "--history: '-1' in '-1' is not N or TASK=N"), (["--groups", "x"], "invalid int value"),
    (["--mode", "ppo"], "--mode must be one of crl"), (["--eval-every", "-1"], "--eval-every must be >= 0"),
    (["--device", "nope"], "is not a device"), (["--judge", "maybe"], "--judge must be one of"),
    (["--save-every", "0"], "--save-every must be >= 1"), (["--micro-batch", "0"], "--micro-batch must be >= 1")])
def test_bad_flag_values_are_one_line_errors(capsys, argv, message):
    with pytest.raises(SystemExit) as exit:
        train.parse_args(argv)
    assert exit.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_evaluation_plays_at_most_eval_batch_episodes_at_once(tmp_path, monkeypatch):
    sizes, real = [], crl.rollout

    def spy(run, specs, rng, temperature, train=True):
        if not train:
            sizes.append(len(specs))
        return real(run, specs, rng, temperature, train)

    monkeypatch.setattr(crl, "rollout", spy)
    out = str(tmp_path / "run")
    train.main(["--tasks", "room", "--iters", "1", "--out", out, *FAST, "--eval-episodes", "5", "--eval-batch", "4"])
    assert sizes == [4, 4, 2]   # 5 held-out episodes each way, 4 at a time
    assert "eval/room/success_exp" in read_metrics(out)[0]


def test_no_evaluation_runs_and_checkpoints_at_the_end(tmp_path):
    out = str(tmp_path / "noeval")
    train.main(["--tasks", "room", "--iters", "2", "--out", out, *FAST, "--eval-every", "0"])
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [0, 1] and not any(k.startswith("eval/") for r in rows for k in r)
    assert torch.load(os.path.join(out, "ckpt", "state.pt"), weights_only=True)["step"] == 1


def test_a_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    from model import load_tokenizer
    actor = tiny_model(seed=0)
    run = crl.Run(crl.CRLConfig(mode="grpo"), ["room"], 0, actor, load_tokenizer("tiny"),
                  torch.optim.AdamW(actor.parameters()), None, None, None, None)
    out = str(tmp_path)
    rundir.save_checkpoint(run, out, 4)
    step = lambda: torch.load(os.path.join(out, "ckpt", "state.pt"), weights_only=True)["step"]  # noqa: E731
    real_save = torch.save

    def fail(*a, **kw):
        raise OSError("disk full")
    monkeypatch.setattr(torch, "save", fail)               # the new checkpoint fails halfway through
    with pytest.raises(OSError):
        rundir.save_checkpoint(run, out, 5)
    assert step() == 4
    monkeypatch.setattr(torch, "save", real_save)
    real_replace, calls = os.replace, []

    def crash_on_second(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError("killed")
        real_replace(src, dst)
    monkeypatch.setattr(os, "replace", crash_on_second)    # the crash between moving the old one aside and
    with pytest.raises(OSError):                          # renaming the new one into place
        rundir.save_checkpoint(run, out, 6)
    monkeypatch.setattr(os, "replace", real_replace)
    assert not os.path.exists(os.path.join(out, "ckpt"))
    rundir.recover_checkpoint(out)
    assert step() == 4
    rundir.save_checkpoint(run, out, 7)
    assert step() == 7 and sorted(os.listdir(out)) == ["ckpt", "ckpt.old"]   # the one before: the fallback


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(*argv, timeout=600, worker="ddp_worker.py"):
    # a fresh port per launch: reusing one fixed port right after the previous launch can fail to bind
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_free_port()),
           os.path.join(ROOT, "tests", worker), *argv]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"})
    assert p.returncode == 0, p.stderr[-3000:]


def fixed_segments(model, n=6, seed=0):
    """Synthetic episodes: random tokens, actor tokens at the end, old log-probs near the current ones."""
    g = torch.Generator().manual_seed(seed)
    segs, advs = [], []
    for i in range(n):
        T = 10 + 3 * i
        toks = torch.randint(0, 256, (T,), generator=g).tolist()
        s = crl.Segment()
        s.extend(toks[:T // 2])
        with torch.no_grad():
            lp = token_logprobs(model, torch.tensor([toks]), torch.tensor([[False] * (T // 2) + [True] * (T - T // 2)]))
        noise = 0.3 * torch.randn(T - T // 2, generator=g)
        s.extend(toks[T // 2:], True, (lp[0, T // 2:] + noise).tolist())
        segs.append(s)
        advs.append(float(torch.randn(1, generator=g)))
    return segs, advs


def bound_loss(name: str, cfg=crl.CRLConfig()) -> tuple:
    """(loss_fn, clip_range) bound as actor_update (grpo) or extractor_update (cispo) binds them."""
    if name == "grpo":
        return functools.partial(crl.grpo_loss, clip=cfg.clip), (1 - cfg.clip, 1 + cfg.clip)
    return (functools.partial(crl.cispo_loss, eps_low=cfg.cispo_eps_low, eps_high=cfg.cispo_eps_high),
            (1 - cfg.cispo_eps_low, 1 + cfg.cispo_eps_high))


def single_process_update(objective):
    model = tiny_model(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)  # SGD: Adam would turn float noise into lr-sized steps
    segs, advs = fixed_segments(model)
    crl.policy_update(crl.Update(model, opt, *bound_loss(objective), micro_batch=2), segs, advs)
    return model


@pytest.mark.parametrize("objective", ["grpo", "cispo"])
def test_ddp_update_equals_single_process(tmp_path, objective):
    _torchrun("update", str(tmp_path), objective)
    ddp = torch.load(os.path.join(str(tmp_path), "update.pt"), weights_only=True)
    ref = single_process_update(objective).state_dict()
    start = tiny_model(seed=0).state_dict()
    assert any(not torch.equal(ref[k], start[k]) for k in ref)   # the update did something
    for k in ref:
        assert torch.allclose(ddp[k], ref[k], atol=1e-6), k


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_hf_checkpoint(path, seed, **shape):
    """A tiny random Qwen3 written by transformers, with a byte-level BPE tokenizer and a ChatML template
    (`shape` overrides the config's sizes)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  additional_special_tokens=["<|im_start|>"])
    tok.chat_template = CHATML
    tok.save_pretrained(path)
    torch.manual_seed(seed)
    sizes = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, tie_word_embeddings=True)
    cfg = Qwen3Config(vocab_size=len(tok), eos_token_id=tok.eos_token_id, **{**sizes, **shape})
    Qwen3ForCausalLM(cfg).save_pretrained(path)
    return tok


def test_free_text_hf_checkpoints_with_search_and_ask(tmp_path, monkeypatch):
    actor_dir, extractor_dir = str(tmp_path / "actor"), str(tmp_path / "extractor")
    tok = write_hf_checkpoint(actor_dir, 0)
    write_hf_checkpoint(extractor_dir, 1)
    # a random model almost never writes <ask>, so its first reply is constrained to a question: the
    # rest (retrieval, the answer, the tool turn, training on it) is the real path; the bank is still empty
    # then, so the answer is crl.NO_LESSONS (test_credit.py has the extractor's answers)
    from small.grammar import Constraint
    real, calls = crl.generate, []

    def first_reply_asks(model, prompts, *args, **kw):
        if kw.get("session") is not None and not calls:
            calls.append(1)
            kw["constraint"] = [Constraint.from_strings(tok, ["<ask>where are the stairs?</ask>"])] * len(prompts)
        return real(model, prompts, *args, **kw)

    monkeypatch.setattr(crl, "generate", first_reply_asks)
    out = str(tmp_path / "run")
    run = train.main(["--tasks", "room", "--actor", actor_dir, "--extractor", extractor_dir, "--iters", "2",
                      "--out", out, "--max-reply-tokens", "40", "--extractor-reply-tokens", "16", *FAST])
    rows = read_metrics(out)
    assert rows[0]["asks"] == 4                         # the with-experience half of 2 groups of 4
    assert rows[0]["invalid_actions"] >= 2              # the others' <ask> is not an action
    assert "actor/loss" in rows[1]
    assert os.path.exists(os.path.join(out, "ckpt", "actor", "tokenizer.json"))
    assert run.cfg.free_text and run.cfg.extractor_free_text


def test_lesson_prior_teaches_the_tiny_actor_to_play_the_lessons_move():
    """--lesson-prior: after 100 supervised steps the fresh tiny actor plays the first move of the lesson in
    its prompt far above chance (1/8), while without a lesson its moves stay spread out (no move taught)."""
    import envs
    from model import load_tokenizer
    tok, env = load_tokenizer("tiny"), envs.make("room", max_steps=10, show_map=False)
    cfg = crl.CRLConfig(**{k: v for k, v in presets.TINY.items() if hasattr(crl.CRLConfig, k)})
    model = tiny_model(seed=0)

    def move_probs(obs, lessons):   # P(reply = each action), from the rollout's own prompt
        system = crl.actor_system_prompt(env, lessons, False, False, False)
        feed = crl.encode_chat(tok, crl.window_messages(system, [], obs, 0))
        logps = []
        for a in env.actions:
            reply = tok.encode(a, add_special_tokens=False) + [tok.eos_token_id]
            with torch.no_grad():
                lp = torch.log_softmax(model(torch.tensor([feed + reply])).float()[0], -1)
            logps.append(sum(lp[len(feed) - 1 + j, t] for j, t in enumerate(reply)))
        return torch.stack(logps).softmax(0)

    def follow_rate():
        obs = [env.reset(seed=crl.EVAL_SEED0 + s) for s in range(4)]
        return sum(move_probs(o, [a])[j] for o in obs for j, a in enumerate(env.actions)).item() / (4 * 8), obs

    before, _ = follow_rate()
    prior.teach_lessons(model, tok, cfg, ["room"], 100, seed=0, pretrained=False)
    after, obs = follow_rate()
    assert before < 0.2 and after > 0.3
    assert max(move_probs(o, []).max().item() for o in obs) < 0.5


def test_a_cached_lesson_prior_is_the_one_the_run_would_train_and_only_for_its_own_seed(tmp_path, monkeypatch):
    """The prior's cache: a second run of the same seed loads, without a training step, bit for bit the weights
    the first trained; another seed from the same checkpoint (so only its examples differ) gets its own prior,
    equal to one trained with no cache at all."""
    hf = str(tmp_path / "hf")
    tiny_model(seed=0).save_pretrained(hf)
    from model import ByteTokenizer
    ByteTokenizer().save_pretrained(hf)

    def actor(seed: int, cache: str):
        monkeypatch.setenv("CRL_CACHE", str(tmp_path / cache))
        flags = [*STEPPING, "--mode", "grpo", "--max-reply-tokens", "4", "--actor", hf, "--lesson-prior", "2",
                 "--seed", str(seed)]
        return train.build(train.parse_args(flags), torch.device("cpu"), torch.float32)[0].actor.state_dict()

    def same(a, b):
        return all(torch.equal(p, b[k]) for k, p in a.items())
    trained = actor(0, "cache")
    assert len(os.listdir(tmp_path / "cache" / "prior")) == 1
    with monkeypatch.context() as m:   # a hit takes no training step
        m.setattr(prior, "token_logprobs", lambda *a: pytest.fail("the cached prior was trained again"))
        assert same(actor(0, "cache"), trained)
    other = actor(1, "cache")
    assert len(os.listdir(tmp_path / "cache" / "prior")) == 2 and not same(other, trained)
    assert same(other, actor(1, "fresh"))


def test_a_pretrained_actors_lesson_prior_trains_it_before_rl_and_not_again_on_resume(tmp_path):
    """--lesson-prior with a pretrained checkpoint (the tiny model saved as one, so a run takes that path): the
    loaded actor leaves its weights before RL, and a resumed run starts from its checkpoint, not a second prior."""
    from model import ByteTokenizer, Transformer
    hf, out = str(tmp_path / "hf"), str(tmp_path / "run")
    tiny_model(seed=0).save_pretrained(hf)
    ByteTokenizer().save_pretrained(hf)
    flags = [*STEPPING, "--mode", "grpo", "--max-steps", "1", "--max-reply-tokens", "4", "--actor", hf,
             "--lesson-prior", "2", "--iters", "1", "--out", out]   # free text: the tiny presets are for "tiny"

    def same(model, path):
        ref = Transformer.from_pretrained(path, dtype=torch.float32).state_dict()
        return all(torch.equal(p, ref[k]) for k, p in model.state_dict().items())
    built, _ = train.build(train.parse_args(flags), torch.device("cpu"), torch.float32)
    assert not same(built.actor, hf)
    train.main(flags)
    resumed, start = train.build(train.parse_args(["--out", out, "--resume"]), torch.device("cpu"), torch.float32)
    assert start == 1 and same(resumed.actor, os.path.join(out, "ckpt", "actor"))


def test_ddp_updates_equal_one_process_on_the_same_episodes(tmp_path):
    """2 ranks against 1: every update of a 2-rank run in which both models really step (STEPPING), redone in
    one process on both ranks' episodes (actor) or generations (extractor), from the same weights and AdamW
    state, ends at the same weights; the replicas of both models and of the bank agree throughout."""
    out = str(tmp_path / "ddp")
    _torchrun("train", out, *STEPPING, "--iters", "3")
    r0, r1 = (torch.load(os.path.join(out, f"rank{r}.pt"), weights_only=False) for r in (0, 1))
    for name in ("actor", "extractor"):
        assert all(torch.equal(v, r1[name][k]) for k, v in r0[name].items())
    assert r0["bank"] == r1["bank"] and len(r0["bank"]) > 0 and torch.equal(r0["keys"], r1["keys"])
    assert [r["step"] for r in read_metrics(out)] == [0, 1, 2]
    ranks = [r0["calls"], r1["calls"]]
    assert [c["update"] for c in ranks[0]] == [c["update"] for c in ranks[1]]
    from model import load_tokenizer
    tok, stepped = load_tokenizer("tiny"), []
    for c0, c1 in zip(*ranks):
        for when in ("before", "after"):
            assert all(torch.equal(v, c1[when][0][k]) for k, v in c0[when][0].items())
        if not c0["stats"]:
            continue   # the extractor still waits for a full batch of rewarded generations
        model = tiny_model(seed=0)
        model.load_state_dict(c0["before"][0])
        opt = torch.optim.AdamW(model.parameters(), weight_decay=0.0)
        opt.load_state_dict(c0["before"][1])
        run = crl.Run(c0["cfg"], ["room"], 0, model, tok, opt, model, tok, opt, None)
        run.timer = {"update": 0.0, "extractor_update": 0.0}
        if c0["update"] == "actor_update":
            stats = crl.actor_update(run, c0["inputs"] + c1["inputs"])
            assert stats["actor/trained_seqs"] == c0["stats"]["actor/trained_seqs"] > 0
        else:
            run.generations = {**c0["inputs"], **c1["inputs"]}
            credited = lambda: sum(bool(g.credits) for g in run.generations.values())   # noqa: E731
            waiting = credited()
            stats = crl.extractor_update(run)   # the newest batch of all ranks' credited ones, the rest evicted
            assert stats["generations"] == c0["stats"]["generations"] == c0["cfg"].extractor_batch
            assert stats["generations"] + stats["evicted"] == waiting and credited() == 0
        assert stats == pytest.approx(c0["stats"], rel=1e-5, abs=1e-6)   # loss, grad norm, ratio, reward: global
        for k, v in model.state_dict().items():   # AdamW's first step turns float noise in a near-zero gradient
            assert torch.allclose(v, c0["after"][0][k], atol=1e-5), (c0["update"], k)   # into ~1e-6 (lr 1e-3)
        if stats["actor/trained_seqs" if c0["update"] == "actor_update" else "trained_seqs"] == 0:
            continue   # every reward equal: no advantage, nothing moves (checked above against the run)
        assert any(not torch.equal(v, c0["before"][0][k]) for k, v in model.state_dict().items())
        stepped.append(c0["update"])
    assert "actor_update" in stepped and "extractor_update" in stepped, stepped


def test_each_task_plays_its_own_action_budget(tmp_path, monkeypatch):
    """A mixed-task run gives each task its own budget: the release's (30, WebShop 10) unless a preset or
    --max-steps names the task; --history likewise per task."""
    cfg = crl.CRLConfig()
    assert [cfg.steps(t) for t in ("room", "sokoban", "alfworld", "webshop")] == [30, 30, 30, 10]
    cfg = crl.CRLConfig(max_steps="7,webshop=3", history="alfworld=2")
    assert [cfg.steps(t) for t in ("room", "webshop")] == [7, 3]
    assert [cfg.window(t) for t in ("room", "alfworld")] == [None, 2]
    assert train.config_from(train.parse_args([])).steps("sokoban") == 30            # not in the tiny preset
    assert train.config_from(train.parse_args([])).steps("room") == 10
    turns = {}
    real = crl.rollout

    def spy(run, specs, rng, temperature, train=True):
        eps = real(run, specs, rng, temperature, train)
        for e in eps:
            turns.setdefault(e.task, []).append((e.turns, len(e.segments)))
        return eps
    monkeypatch.setattr(crl, "rollout", spy)
    train.main(["--tasks", "room,maze", *FAST, "--max-steps", "room=2,maze=5", "--history", "room=1",
                "--iters", "2", "--eval-every", "0", "--out", str(tmp_path / "mixed")])
    assert max(turns["room"])[0] == 2 and max(turns["maze"])[0] == 5   # an untrained actor plays to the limit
    assert all(n == t for t, n in turns["room"]) and all(n == 1 for _, n in turns["maze"])  # room: a window a turn


@pytest.mark.parametrize("value", ["room=0", "nethack=3", "room=x", "3,,=4"])
def test_bad_per_task_values_are_one_line_errors(capsys, value):
    with pytest.raises(SystemExit):
        train.parse_args(["--max-steps", value])
    assert "--max-steps" in capsys.readouterr().err.strip().splitlines()[-1]


def test_micro_batches_bound_sequences_and_padded_tokens():
    lengths = [30, 10, 20, 25, 5, 40]                 # sorted: 5, 10, 20, 25, 30, 40 (indices 4, 1, 2, 3, 0, 5)
    assert micro_batches(lengths, 4, None) == [[4, 1, 2, 3], [0, 5]]
    assert micro_batches(lengths, 4, 60) == [[4, 1, 2], [3, 0], [5]]   # 3 x 20 = 60; 2 x 30; 40 alone
    assert micro_batches([20] * 4, 4, 60) == [[0, 1, 2], [3]]          # a fourth would pad to 80
    assert micro_batches([100], 4, 50) == [[0]]                        # longer than the budget: alone


def test_a_token_budget_leaves_the_update_unchanged():
    """The update is a sum over micro-batches of losses with global denominators: how the batch is cut
    changes nothing but float rounding."""
    def update(**cfg):
        model = tiny_model(seed=0)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        segs, advs = fixed_segments(model)
        crl.policy_update(crl.Update(model, opt, *bound_loss("grpo"), **cfg), segs, advs)
        return model.state_dict()
    a, b = update(micro_batch=6), update(micro_batch=6, micro_tokens=40)   # lengths 10-25: batches of 1-4
    assert any(not torch.equal(a[k], tiny_model(seed=0).state_dict()[k]) for k in a)
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


@pytest.mark.parametrize("objective", ["grpo", "cispo"])
def test_repeated_sequences_run_once_and_weigh_as_often_as_they_occur(objective, monkeypatch):
    """Sequences that repeat with the same advantage (a group's rollouts often play alike) go through the model
    once: the step and its statistics equal those with every copy a row of its own; a copy whose advantage
    differs stays a row of its own."""
    segs, advs = fixed_segments(tiny_model(seed=0))
    order = [0, 1, 1, 2, 3, 3, 3, 4, 5, 2]
    segs, advs = [copy.deepcopy(segs[j]) for j in order], [advs[j] for j in order]
    advs[-1] += 0.5
    rows, logprobs = [], update.token_logprobs
    monkeypatch.setattr(update, "token_logprobs", lambda m, tokens, *a, **k: rows.append(len(tokens))
                        or logprobs(m, tokens, *a, **k))

    def step():
        model = tiny_model(seed=0)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        stats = crl.policy_update(crl.Update(model, opt, *bound_loss(objective), micro_batch=3), segs, advs)
        return model.state_dict(), stats
    once, once_stats = step()
    assert sum(rows) == 7                               # 10 sequences, 7 distinct (segment, advantage) pairs
    monkeypatch.setattr(update, "repeats", lambda segments, advantages, chosen: (chosen, [1] * len(chosen)))
    each, each_stats = step()
    assert sum(rows) == 7 + 10
    assert all(torch.allclose(once[k], each[k], atol=1e-6) for k in once)
    assert any(not torch.equal(once[k], tiny_model(seed=0).state_dict()[k]) for k in once)
    assert once_stats.keys() == each_stats.keys()
    assert once_stats == pytest.approx(each_stats, rel=1e-5)


# --dtype auto: bf16 where the CPU computes it natively, measured by parallel.choose_dtype's matmul probe

def fake_probe(monkeypatch, fp32=None, bf16=None):
    """parallel.matmul_seconds answering these seconds for fp32 and bf16; with none given, a probe fails the test."""
    def seconds(dtypes, **kw):
        assert fp32 is not None, "the matmul probe ran"
        return [{torch.float32: fp32, torch.bfloat16: bf16}[d] for d in dtypes]
    monkeypatch.setattr(parallel, "matmul_seconds", seconds)


@pytest.mark.parametrize("bf16, chosen", [(0.1, "bfloat16"), (0.75, "bfloat16"), (0.9, "float32"), (6.0, "float32")])
def test_dtype_auto_takes_bf16_where_its_matmul_measures_faster(monkeypatch, bf16, chosen):
    """The default for a real checkpoint on a CPU: bf16 where its matmul takes at most 1 / BF16_SPEEDUP (0.8) of
    fp32's time (native bf16: AVX-512 BF16, AMX), else fp32 (bf16 emulated, or a near tie); written back into
    args, which args.json records."""
    fake_probe(monkeypatch, 1.0, bf16)
    args = train.parse_args(["--actor", "/some/ckpt"])
    assert train.model_dtype(args, torch.device("cpu")) == getattr(torch, chosen) and args.dtype == chosen


@pytest.mark.parametrize("argv, device, chosen", [
    (["--actor", "/ckpt"], "cuda", "bfloat16"),                       # auto on CUDA: bf16, nothing measured
    (["--actor", "/ckpt", "--dtype", "float32"], "cpu", "float32"),    # an explicit flag wins
    (["--actor", "/ckpt", "--dtype", "bfloat16"], "cpu", "bfloat16"),
    (["--actor", "/ckpt", "--dtype", "float32"], "cuda", "float32"),
    ([], "cpu", "float32"), ([], "cuda", "bfloat16")])                 # the tiny preset: fp32 on CPU as its results
def test_cuda_an_explicit_dtype_and_tiny_choose_without_the_probe(monkeypatch, argv, device, chosen):
    fake_probe(monkeypatch)
    args = train.parse_args(argv)
    assert train.model_dtype(args, torch.device(device)) == getattr(torch, chosen) and args.dtype == chosen


def test_auto_dtype_is_stated_recorded_and_kept_on_resume(tmp_path, monkeypatch, capsys):
    """A run says what auto chose and why, args.json records it, and --resume on a machine whose probe would
    choose otherwise keeps the run's dtype with a one-line warning."""
    actor, out = str(tmp_path / "actor"), str(tmp_path / "run")
    write_hf_checkpoint(actor, 0)
    fake_probe(monkeypatch, 1.0, 0.1)
    run = train.main(["--tasks", "room", "--mode", "grpo", "--actor", actor, "--iters", "1", "--out", out,
                      "--max-reply-tokens", "8", *FAST, "--eval-every", "0"])
    assert parallel.compute_dtype(run.actor) == torch.bfloat16
    assert "--dtype auto: bfloat16 (" in capsys.readouterr().out
    saved = json.load(open(os.path.join(out, "args.json")))
    assert saved["dtype"] == "bfloat16"
    json.dump({**saved, "iters": 2}, open(os.path.join(out, "args.json"), "w"))
    fake_probe(monkeypatch, 1.0, 6.0)   # resumed where bf16 is emulated
    with pytest.warns(UserWarning, match="the run computes in bfloat16, as it began; --dtype auto here would "
                                         r"choose float32 \(.*\); --dtype float32 switches"):
        run = train.main(["--out", out, "--resume"])
    assert parallel.compute_dtype(run.actor) == torch.bfloat16
    assert json.load(open(os.path.join(out, "args.json")))["dtype"] == "bfloat16"
    assert [r["step"] for r in read_metrics(out)] == [0, 1]


def test_the_real_probe_is_quick_and_chooses_a_dtype():
    start = time.perf_counter()
    dtype, why = parallel.choose_dtype(torch.device("cpu"))
    assert dtype in ("float32", "bfloat16") and "ms" in why and time.perf_counter() - start < 2


def _wait_for_lines(path: str, n: int, proc, timeout: float = 300):
    """Until `path` holds n lines (the run logged n steps) or the process ended."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        if os.path.exists(path) and sum(1 for _ in open(path)) >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} did not reach {n} lines (exit {proc.poll()})")


def _stopped_then_resumed(command, out: str, stops: list[tuple], iters: int) -> list[int]:
    """Start `command()`; for each (signal, one_rank) in `stops`, send the signal at a random moment after 1-3
    more steps (one_rank: to one of torchrun's ranks, drawn at random, not to torchrun), check the run stopped at a
    checkpoint of the last step it logged and said so, and start it again with --resume; the last start runs to
    the end: every step logged exactly once. Returns the stopped runs' exit codes."""
    import random
    import signal as signals
    rng, codes, logged = random.Random(), [], 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for sig, one_rank in stops:
        p = subprocess.Popen(command() + ["--resume"] * (logged > 0), cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
        _wait_for_lines(os.path.join(out, "metrics.jsonl"), logged + rng.randint(1, 3), p)
        time.sleep(rng.uniform(0, 0.5))
        if one_rank:
            ranks = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
            assert len(ranks) == 2, ranks
            os.kill(int(rng.choice(ranks)), sig)
        else:
            p.send_signal(sig)
        stdout, stderr = p.communicate(timeout=300)
        steps = [r["step"] for r in read_metrics(out)]
        last = steps[-1]
        assert f"stopped by {signals.Signals(sig).name} after step {last}: checkpoint in" in stdout, stderr[-2000:]
        assert steps == list(range(last + 1)) and last < iters - 1
        assert torch.load(os.path.join(out, "ckpt", "state.pt"), weights_only=False)["step"] == last
        codes.append(p.returncode)
        logged = last + 1
    q = subprocess.run(command() + ["--resume"], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert q.returncode == 0, q.stderr[-2000:]
    assert [r["step"] for r in read_metrics(out)] == list(range(iters))   # no logged step trained again
    return codes


def test_a_signal_stops_the_run_at_a_checkpoint_and_resume_trains_no_step_again(tmp_path):
    """SIGTERM (a cluster's or torchrun's notice) at a random moment, and SIGINT at another after the resume: each
    time the iteration under way ends and is checkpointed (no periodic checkpoint is due: --eval-every 0 saves only
    after the last step), one line says so, the exit code is 128 + the signal's; --resume continues from the next
    step."""
    import signal as signals
    out, iters = str(tmp_path / "run"), 12
    cmd = [sys.executable, "train.py", "--tasks", "room", "--mode", "crl", *FAST, "--eval-every", "0",
           "--iters", str(iters), "--out", out]
    stops = [(signals.SIGTERM, False), (signals.SIGINT, False)]
    assert _stopped_then_resumed(lambda: cmd, out, stops, iters) == [128 + sig for sig, _ in stops]


def test_sigterm_under_torchrun_stops_every_rank_at_the_same_step(tmp_path):
    """torchrun with 2 ranks, SIGTERM at a random moment to torchrun (which passes it to both ranks), and at
    another after the resume to one rank alone: both ranks stop after the same iteration (the last one logged),
    checkpoint it together, and resume from the next."""
    import signal as signals
    out, iters = str(tmp_path / "run"), 12
    cmd = lambda: [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",  # noqa: E731
                   "--master_port", str(_free_port()), "train.py", "--tasks", "room", "--mode", "crl", *FAST,
                   "--eval-every", "0", "--iters", str(iters), "--out", out]   # a fresh port per launch
    _stopped_then_resumed(cmd, out, [(signals.SIGTERM, False), (signals.SIGTERM, True)], iters)


def test_a_run_that_used_a_retired_option_resumes_only_at_its_commit(tmp_path, capsys):
    """A closed study's run (args.json with --lesson-sets on) is told, in one line, the commit to resume it at;
    a run that left the retired options at their defaults resumes here."""
    out = tmp_path / "old"
    out.mkdir()
    (out / "args.json").write_text(json.dumps({"tasks": ["vault"], "lesson_sets": True, "distill_from": "exp"}))
    with pytest.raises(SystemExit):
        train.parse_args(["--out", str(out), "--resume"])
    assert "the run used --lesson-sets, retired after beda864" in capsys.readouterr().err
    (out / "args.json").write_text(json.dumps({"tasks": ["vault"], "extractor_blind": True}))
    with pytest.raises(SystemExit):
        train.parse_args(["--out", str(out), "--resume"])
    assert "the run used --extractor-blind, retired after 08588c7" in capsys.readouterr().err
    (out / "args.json").write_text(json.dumps({"tasks": ["vault"], "lesson_sets": False, "distill_from": "exp",
                                               "extractor_blind": False, "max_asks": 2}))
    assert train.parse_args(["--out", str(out), "--resume"]).tasks == ["vault"]


def test_a_vault_first_run_resumes_as_its_recipe(tmp_path, capsys):
    """A run of the finished study (--vault-reveal, --credit lift with --credit-discount 0) reads as the task
    vault-reveal with --credit first-lift, its per-task budget carried to the new task's name; its flags are the
    recipe's, and --recipe vault-first given again with another of its values is a one-line error."""
    out = tmp_path / "old"
    out.mkdir()
    saved = {**train.RECIPES["vault-first"], "tasks": ["vault"], "vault_reveal": True, "credit": "lift",
             "credit_discount": 0.0, "max_steps": "room=10,maze=10,vault=10", "mode": "crl"}
    (out / "args.json").write_text(json.dumps(saved))
    args = train.parse_args(["--out", str(out), "--resume"])
    assert args.tasks == ["vault-reveal"] and args.credit == "first-lift"
    assert train.config_from(args).steps("vault-reveal") == 10
    fresh = train.parse_args(["--recipe", "vault-first", "--mode", "crl"])
    assert all(getattr(fresh, k) == getattr(args, k) for k in train.RECIPES["vault-first"] if k != "tasks")
    assert train.parse_args(["--out", str(out), "--resume", "--recipe", "vault-first"]).head_start == 150
    (out / "args.json").write_text(json.dumps({**saved, "head_start": 90}))
    with pytest.raises(SystemExit):
        train.parse_args(["--out", str(out), "--resume", "--recipe", "vault-first"])
    err = capsys.readouterr().err
    assert "--recipe vault-first: the run in" in err and "other values of --head-start;" in err
    with pytest.raises(SystemExit):
        train.parse_args(["--recipe", "vault-last"])
    assert "'vault-last' is not a recipe; recipes (recipes.py): vault-first" in capsys.readouterr().err


def test_eval_only_repeats_the_final_evaluation_value_for_value(tmp_path, capsys):
    """--eval-only on a finished run's directory plays the held-out evaluation final.json holds (with and without
    lessons, and at each attempt), from a copy of the checkpoint: the same values, written to OUT/eval-STEP.json;
    metrics.jsonl and the checkpoint untouched; on a directory with no run, the --actor model with an empty bank."""
    out = str(tmp_path / "run")
    train.main(["--tasks", "vault-reveal", "--mode", "crl", *FAST, "--iters", "2", "--out", out,
                "--final-eval-episodes", "8", "--final-attempts", "2"])
    final = json.load(open(os.path.join(out, "final.json")))
    before = {name: os.path.getmtime(os.path.join(out, name)) for name in ("metrics.jsonl", "ckpt", "args.json")}
    got = train.main(["--out", out, "--eval-only", "--final-eval-episodes", "8", "--final-attempts", "2"])
    assert got == final and json.load(open(os.path.join(out, "eval-1.json"))) == final
    assert "attempts/vault-reveal/success_exp_2" in final
    assert before == {name: os.path.getmtime(os.path.join(out, name)) for name in before}
    fresh = train.main(["--tasks", "room", "--eval-only", "--final-eval-episodes", "4", "--out", str(tmp_path / "new")])
    assert set(fresh) >= {"eval/room/success_exp", "eval/room/success_noexp"} and fresh["step"] == -1


def test_the_recipe_dry_run_prints_the_committed_headline_cell(capsys):
    """`--recipe vault-first --mode crl --seed 0 --dry-run` prints the args.json of results/vault-first's crl seed 0
    cell as today's flags read it (rundir.migrate): every setting equal, bar where the run was written and the
    options since retired at their defaults."""
    here = os.path.dirname(os.path.abspath(__file__))
    cell = os.path.join(here, "..", "results", "vault-first", "vault", "crl-seed0")
    train.main(["--recipe", "vault-first", "--mode", "crl", "--seed", "0", "--dry-run", "--out", cell])
    printed = json.loads(capsys.readouterr().out.split("\n", 1)[1])   # after the --dtype auto line
    saved = rundir.migrate(json.load(open(os.path.join(cell, "args.json"))))
    bookkeeping = {"out", "resume", "recipe", "dry_run", "eval_only", "tensorboard", "wandb", "dtype", "dtype_auto"}
    differ = {k for k in (set(printed) | set(saved)) - bookkeeping if printed.get(k) != saved.get(k)}
    assert differ == {k for k, (old, _) in rundir.RETIRED.items() if saved.get(k) == old}, differ


@pytest.mark.parametrize("mode", [["crl"], ["grpo"], ["static"], ["static", "--extractor", "oracle"]])
def test_the_family_recipe_dry_run_prints_each_committed_grid_cells_flags(capsys, mode):
    """`--recipe family --mode MODE --seed 1 --dry-run` prints the args.json of results/family's seed-1 cell of that
    mode, every setting equal (the number format too) bar where the run was written: the recipe alone rebuilds it."""
    name = "oracle" if "oracle" in mode else mode[0]
    cell = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "results", "family", "vault-family6-reveal",
                        f"{name}-seed1")
    train.main(["--recipe", "family", "--mode", *mode, "--seed", "1", "--dry-run", "--out", cell])
    out = capsys.readouterr().out
    printed, saved = json.loads(out[out.index("{"):]), json.load(open(os.path.join(cell, "args.json")))
    differ = {k for k in set(printed) | set(saved) if printed.get(k) != saved.get(k)}
    assert differ <= {"out", "resume", "dry_run"} and printed["dtype"] == "float32", differ


def test_an_actor_without_a_bank_plays_the_revealing_family_vault_as_the_plain_one(tmp_path):
    """GRPO on vault-family6-reveal is GRPO on vault-family6 value for value (the task's name apart): the reveal
    comes after the last move, so no token an actor without a bank samples or trains on can see it; the GRPO pilot
    on vault-family6 is then that task's too (results/family-smollm2/)."""
    runs = {}
    for task in ("vault-family6", "vault-family6-reveal"):
        out = str(tmp_path / task)
        train.main(["--tasks", task, "--mode", "grpo", *FAST, "--iters", "3", "--eval-every", "0",
                    "--final-eval-episodes", "0", "--out", out])
        runs[task] = [{k.replace(task, "TASK"): v for k, v in strip_times(m).items()} for m in read_metrics(out)]
    assert runs["vault-family6"] == runs["vault-family6-reveal"] and len(runs["vault-family6"]) == 3
    assert any(m["train/TASK/success_noexp"] < 1 for m in runs["vault-family6"])   # a loss, so a reveal, was played
