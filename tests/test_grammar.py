"""small/grammar.py: the small extractors' constrained replies. Every reply its heads allow parses as the
operations crl.py reads (a lesson plan of the task's action words, KEEP for a merge, NONE where the settings
open it), is never cut mid-word, and is sampled under the distribution the trainer recomputes."""
import torch

import crl
from model import load_tokenizer, token_logprobs
from sampling import Sampling
from small import grammar
from small.tiny import tiny_model


def test_lesson_grammar_parses_and_sampler_logprobs_match_trainer(monkeypatch):
    """--lesson-moves: every extractor reply is `ADD: <plan>`, `UPDATE 1: <plan>` or NONE with the plan made
    of the env's action words; it parses to that plan, and the sampler's log-probs under the grammar equal
    the trainer's recomputation (the CISPO ratio starts at 1)."""
    tok = load_tokenizer("tiny")
    extractor = tiny_model(seed=5)
    monkeypatch.setattr(crl, "EXTRACTOR_TEMPERATURE", 1.5)
    cfg = crl.CRLConfig(extractor_free_text=False, lesson_moves=2, extractor_reply_tokens=64)
    run = crl.Run(cfg, ["room"], 0, extractor, tok, None, extractor, tok, None, None)
    run.timer = {"extractor": 0.0}
    plans = grammar.task_plans(run, "room")
    assert len(plans) == 8 + 64 and "southeast east" in plans
    prompt = tok.encode("<|im_start|>user\nEpisode<|im_end|>\n<|im_start|>assistant\n")
    out = crl.extractor_generate(run, [prompt] * 24, ["room"] * 24, crl.seeded_generator("cpu", 0, 1),
                                 grammar.heads_for(run, [1] * 24, ["room"] * 24))
    kinds = set()
    for gen_id, reply in out:
        ops, bad = crl.parse_operations(reply, shown=1)
        assert bad == 0 and all(text in plans for _, _, text in ops)
        kinds.add(ops[0][0] if ops else "none")
    assert {"add", "update"} <= kinds
    with torch.no_grad():
        for g in run.generations.values():
            tokens = torch.tensor([g.prompt + g.tokens])
            mask = torch.tensor([[False] * len(g.prompt) + [True] * len(g.tokens)])
            allowed = [{len(g.prompt) + j: a for j, a in enumerate(g.allowed) if a is not None}]
            lp = token_logprobs(extractor, tokens, mask, Sampling(1.5), allowed=allowed)
            assert torch.allclose(lp[mask], torch.tensor(g.logprobs), atol=1e-4)


def test_no_extractor_none_heads_always_write_a_lesson(monkeypatch):
    """--extractor-none never: a distilling tiny extractor's head is ADD or UPDATE, never NONE, with the lesson
    grammar and with free lessons; a merge may still answer NONE (or keep one lesson: KEEP)."""
    tok = load_tokenizer("tiny")
    prompt = tok.encode("<|im_start|>user\nEpisode<|im_end|>\n<|im_start|>assistant\n")
    monkeypatch.setattr(crl, "EXTRACTOR_TEMPERATURE", 3.0)   # sampled hot
    for moves in (1, 0):
        cfg = crl.CRLConfig(extractor_free_text=False, lesson_moves=moves, extractor_none="never",
                            extractor_reply_tokens=8)
        run = crl.Run(cfg, ["room"], 0, None, tok, None, tiny_model(seed=4), tok, None, None)
        run.timer = {"extractor": 0.0}
        out = crl.extractor_generate(run, [prompt] * 32, ["room"] * 32, crl.seeded_generator("cpu", 0, 3),
                                     grammar.heads_for(run, [1] * 32, ["room"] * 32))
        heads = {reply.split(" ")[0].rstrip(":") for _, reply in out}
        assert heads == {"ADD", "UPDATE"}, heads
        merge = grammar.heads_for(run, [2], ["room"], merge=True)[0]
        merge_heads = {tok.decode(c, skip_special_tokens=True).split(" ")[0] for c in merge.completions}
        assert merge_heads == {"UPDATE", "KEEP", "NONE"}


def test_extractor_none_after_failure_only(monkeypatch):
    """--extractor-none failure: after a won episode the head is ADD or UPDATE, after a lost one NONE is open
    too (and, sampled hot, taken); `always` opens NONE after both; the old boolean reads as always / never."""
    tok = load_tokenizer("tiny")
    prompt = tok.encode("<|im_start|>user\nEpisode<|im_end|>\n<|im_start|>assistant\n")
    won = [True] * 32 + [False] * 32
    heads = {}
    monkeypatch.setattr(crl, "EXTRACTOR_TEMPERATURE", 3.0)
    for none in ("failure", "always"):
        cfg = crl.CRLConfig(extractor_free_text=False, lesson_moves=1, extractor_none=none,
                            extractor_reply_tokens=8)
        run = crl.Run(cfg, ["room"], 0, None, tok, None, tiny_model(seed=4), tok, None, None)
        run.timer = {"extractor": 0.0}
        out = crl.extractor_generate(run, [prompt] * 64, ["room"] * 64, crl.seeded_generator("cpu", 0, 3),
                                     grammar.heads_for(run, [1] * 64, ["room"] * 64, won=won))
        heads[none] = [reply.split(" ")[0].rstrip(":") for _, reply in out]
    assert "NONE" not in heads["failure"][:32] and "NONE" in heads["failure"][32:]
    assert "NONE" in heads["always"][:32] and "NONE" in heads["always"][32:]
    assert crl.CRLConfig(extractor_none=False).extractor_none == "never"
    assert crl.CRLConfig(extractor_none=True).extractor_none == "always"


def test_lesson_grammar_reply_is_never_cut():
    """A merge reply under the grammar (`UPDATE 1,2,3,4,5: southeast east`) is longer than a small
    --extractor-reply-tokens: it still ends as a whole plan, never a cut word such as `southe` (or is `KEEP i`)."""
    tok = load_tokenizer("tiny")
    cfg = crl.CRLConfig(extractor_free_text=False, lesson_moves=2, extractor_reply_tokens=4)
    run = crl.Run(cfg, ["room"], 0, None, tok, None, tiny_model(seed=3), tok, None, None)
    run.timer = {"extractor": 0.0}
    plans = set(grammar.task_plans(run, "room"))
    prompt = tok.encode("<|im_start|>user\nMerge<|im_end|>\n<|im_start|>assistant\n")
    out = crl.extractor_generate(run, [prompt] * 16, ["room"] * 16, crl.seeded_generator("cpu", 0, 2),
                                 grammar.heads_for(run, [5] * 16, ["room"] * 16, merge=True))
    replies = [reply for _, reply in out]
    whole = {"NONE"} | {f"KEEP {i}" for i in range(1, 6)}
    assert all(r in whole or (r.startswith("UPDATE 1,2,3,4,5: ") and r.split(": ", 1)[1] in plans) for r in replies)
    assert any(r.startswith("UPDATE") for r in replies)


def test_a_constrained_merge_lists_one_lesson_or_none():
    """A small extractor's merge heads (small/grammar.py) under the lesson grammar: every whole reply it can
    write is a list bank_merge.MergeChain reads: all shown merged into one plan, one shown lesson kept, or NONE."""
    tok = load_tokenizer("tiny")
    heads = grammar.operation_heads(tok, 3, merge=True, plans=("east", "west"))
    replies = {tok.decode(c, skip_special_tokens=True) for c in heads.completions}
    assert replies == {"UPDATE 1,2,3: east", "UPDATE 1,2,3: west", "KEEP 1", "KEEP 2", "KEEP 3", "NONE"}
    lists = {r: crl.parse_operations(r, 3, 3, merge=True) for r in replies}
    assert lists["KEEP 2"] == ([("keep", (2,), "")], 0) and lists["NONE"] == ([], 0)
    assert lists["UPDATE 1,2,3: west"] == ([("update", (1, 2, 3), "west")], 0)
