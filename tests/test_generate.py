"""The batched KV-cache generator, multi-turn sessions, constraints and the training-side log-probs, checked
against transformers' greedy generate, the no-cache forward, and hand-computed truncated distributions."""
import math

import numpy as np
import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
from transformers.utils import logging as hf_logging

from model import ByteTokenizer, Session, Transformer, generate, token_logprobs
from sampling import Sampling
from small.tiny import init_weights, tiny_model
from small.grammar import Constraint

hf_logging.set_verbosity_error()
hf_logging.disable_progress_bar()
G = lambda s: torch.Generator().manual_seed(s)  # noqa: E731


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny random Qwen3 in transformers and the same weights in ours. Init std 0.3 makes the next-token
    distributions peaky, so top-k/top-p really truncate and greedy has clear winners."""
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=89, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
                      max_position_embeddings=512, eos_token_id=None, pad_token_id=0, initializer_range=0.3)
    hf = Qwen3ForCausalLM(cfg).eval()
    d = tmp_path_factory.mktemp("qwen3")
    hf.save_pretrained(d)
    return hf, Transformer.from_pretrained(d)


@pytest.fixture(scope="module")
def tiny():
    """The byte-tokenizer preset, made peakier (std 0.3) so sampled text is not uniform noise."""
    return init_weights(tiny_model(seed=1), seed=1, std=0.3)


def _prompts(n, lo, hi, V, seed):
    g = G(seed)
    return [torch.randint(1, V, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def _hf_greedy(hf, prompt, n, eos=None):
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_greedy_ragged_batch_equals_transformers(pair):
    hf, ours = pair
    prompts = _prompts(5, 1, 30, 89, seed=1)
    refs = [_hf_greedy(hf, p, 12) for p in prompts]
    out = generate(ours, prompts, 12, Sampling(0))
    assert [s.tokens for s in out] == refs
    assert all(s.finish_reason == "length" for s in out)
    # with a stop id taken from the middle of one reference: HF stops there too, token for token
    eos = refs[0][5]
    refs = [_hf_greedy(hf, p, 12, eos=eos) for p in prompts]
    out = generate(ours, prompts, 12, Sampling(0), stop=[eos])
    assert [s.tokens for s in out] == [r[:r.index(eos) + 1] if eos in r else r for r in refs]
    assert out[0].finish_reason == "stop" and out[0].tokens[-1] == eos


def test_cached_decoding_equals_no_cache_forward(pair):
    _, ours = pair
    prompts = _prompts(4, 3, 40, 89, seed=2)
    out = generate(ours, prompts, 10, Sampling(1.0), seed=0)
    for p, s in zip(prompts, out):
        seq = torch.tensor([p + s.tokens])
        with torch.no_grad():
            logp = torch.log_softmax(ours(seq)[0].float(), -1)
        ref = logp[len(p) - 1:-1].gather(-1, torch.tensor(s.tokens)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(s.logprobs), ref, atol=1e-4)


def test_session_prefill_matches_forward_on_full_history(pair):
    _, ours = pair
    s = Session(ours, max_batch=3, max_len=64)
    hist = {0: [5, 6, 7], 2: [9] * 11}
    s.prefill([0, 2], [hist[0], hist[2]])
    more = {0: [1, 2, 3, 4, 5, 6], 2: [8]}
    logits = s.prefill([2, 0], [more[2], more[0]])
    for i, r in enumerate([2, 0]):
        with torch.no_grad():
            ref = ours(torch.tensor([hist[r] + more[r]]))[0, -1]
        assert (logits[i] - ref).abs().max() < 1e-4
    assert s.length(0) == 9 and s.length(2) == 12 and s.length(1) == 0


def test_session_cache_grows_and_keeps_its_history(pair):
    """A Session starts with a short cache and doubles it when a turn needs more positions: rows that cross
    256 and then 512 positions still get the logits of a plain forward of their whole history."""
    _, ours = pair
    s = Session(ours, max_batch=2, max_len=2000)
    assert s.k.shape[3] == 256
    g = torch.Generator().manual_seed(0)
    hist = {0: [], 1: []}
    for n0, n1 in [(200, 30), (100, 5), (300, 40)]:     # row 0 needs 300 positions (512), then 600 (1024)
        chunks = {0: torch.randint(3, 89, (n0,), generator=g).tolist(),
                  1: torch.randint(3, 89, (n1,), generator=g).tolist()}
        logits = s.prefill([0, 1], [chunks[0], chunks[1]])
        for r in (0, 1):
            hist[r] += chunks[r]
            with torch.no_grad():
                ref = ours(torch.tensor([hist[r]]))[0, -1]
            assert (logits[r] - ref).abs().max() < 1e-4
    assert s.k.shape[3] == 1024 and s.length(0) == 600 and s.length(1) == 75


def test_the_cache_is_read_only_where_written_or_zeroed(pair, monkeypatch):
    """The cache grows uninitialised: a session whose fresh memory is NaN (what torch.empty may hold) samples
    what one whose fresh memory is zero samples, through ragged rows (a decode step reads every row up to the
    longest), masked prefills of rows with history, and a doubling of the cache."""
    _, ours = pair
    empty = torch.empty

    def run(fill):
        monkeypatch.setattr(torch, "empty", lambda *a, **k: empty(*a, **k).fill_(fill))
        sess = Session(ours, max_batch=3, max_len=1200)
        out = []
        for turn, lengths in enumerate([(130, 3, 40), (5, 150, 2), (1, 2, 300)]):
            prompts = _prompts(3, 1, 2, 89, seed=20 + turn)   # lengths set below; ids drawn here
            prompts = [(p * n)[:n] for p, n in zip(prompts, lengths)]
            out += generate(ours, prompts, 8, Sampling(1.0), seed=turn, session=sess, rows=[2, 0, 1])
        monkeypatch.setattr(torch, "empty", empty)
        return [(s.tokens, s.logprobs) for s in out], sess.k.shape[3]

    zeros, size = run(0.0)
    assert run(float("nan")) == (zeros, size) and size == 512
    assert not any(math.isnan(lp) for _, lps in zeros for lp in lps)


def test_prefill_of_fresh_and_mixed_rows_matches_forward(pair):
    """A prefill where every row starts empty takes the unmasked causal path, one where some row has history
    the masked path; both give each row the logits of a plain forward of its whole history."""
    _, ours = pair
    s = Session(ours, max_batch=3, max_len=64)
    first = s.prefill([0, 1], [[5, 6, 7, 8, 9, 10, 11], [3]])   # both fresh; row 1 right-padded by 6
    second = s.prefill([2, 0], [[9, 9, 9, 9], [1, 2]])          # row 2 fresh, row 0 goes on
    expect = [([5, 6, 7, 8, 9, 10, 11], first[0]), ([3], first[1]), ([9, 9, 9, 9], second[0]),
              ([5, 6, 7, 8, 9, 10, 11, 1, 2], second[1])]
    for seq, got in expect:
        with torch.no_grad():
            ref = ours(torch.tensor([seq]))[0, -1]
        assert (got - ref).abs().max() < 1e-4


def test_fresh_rows_share_their_common_prefix_and_repeated_prompts(pair, monkeypatch):
    """Rows that start empty compute the prompts' common prefix in one row and a repeated prompt once, then
    copy cache rows: each row's logits, on this turn and the next, are a plain forward's of its whole history."""
    _, ours = pair
    computed, inner = [], Session._prefill
    monkeypatch.setattr(Session, "_prefill", lambda self, rows, new: computed.append(sum(map(len, new)))
                        or inner(self, rows, new))
    stem = _prompts(1, 12, 13, 89, seed=7)[0]
    first = dict(zip([4, 0, 2, 1, 3], [stem + [4, 5], stem + [6], stem + [4, 5], stem + [7, 8, 9], stem + [4, 5]]))
    more = {0: [1], 4: [2, 3], 3: [4]}                 # row 3 was a copy of row 4; now they part
    s = Session(ours, max_batch=5, max_len=64)
    logits = dict(zip(first, s.prefill(list(first), list(first.values()))))
    assert computed == [12, 2 + 1 + 3]                 # the stem once, then the rest of each distinct prompt
    logits_more = dict(zip(more, s.prefill(list(more), list(more.values()))))
    for got, history in [(logits, first), (logits_more, {r: first[r] + x for r, x in more.items()})]:
        for r, seq in history.items():
            with torch.no_grad():
                assert (got[r] - ours(torch.tensor([seq]))[0, -1]).abs().max() < 1e-4


def test_session_turns_equal_one_shot_on_concatenated_history(pair):
    _, ours = pair
    sess = Session(ours, max_batch=4, max_len=200)
    rows = [3, 0, 1]
    first = _prompts(3, 2, 20, 89, seed=3)
    history = {r: list(p) for r, p in zip(rows, first)}
    new = dict(zip(rows, first))
    for turn in range(4):
        live = rows if turn % 2 == 0 else rows[:2]  # row 1 sits out odd turns: it costs nothing, keeps state
        out = generate(ours, [new[r] for r in live], 6, Sampling(0), session=sess, rows=live)
        for r, s in zip(live, out):
            one = generate(ours, [history[r]], 6, Sampling(0))[0]
            assert s.tokens == one.tokens
            assert np.allclose(s.logprobs, one.logprobs, atol=1e-4)
            history[r] += s.tokens
            assert sess.length(r) == len(history[r])
        obs = _prompts(3, 1, 9, 89, seed=10 + turn)
        for r, o in zip(live, obs):
            new[r] = o
            history[r] += o
    sess.release([0])
    assert sess.length(0) == 0
    out = generate(ours, [[4, 5, 6]], 5, Sampling(0), session=sess, rows=[0])
    assert out[0].tokens == generate(ours, [[4, 5, 6]], 5, Sampling(0))[0].tokens


def test_session_errors(pair):
    _, ours = pair
    sess = Session(ours, max_batch=2, max_len=20)
    with pytest.raises(ValueError, match="max_len=20"):
        generate(ours, [[1] * 15], 10, session=sess, rows=[0])
    with pytest.raises(ValueError, match="row 5 out of range"):
        generate(ours, [[1]], 2, session=sess, rows=[5])
    with pytest.raises(ValueError, match="empty prompt and no history"):
        generate(ours, [[]], 2, session=sess, rows=[1])
    with pytest.raises(ValueError, match="stop strings need tokenizer"):
        generate(ours, [[1]], 2, stop=["x"])
    with pytest.raises(ValueError, match="top_p must be in"):
        generate(ours, [[1]], 2, Sampling(top_p=0))


def test_finished_rows_leave_the_decode_batch(pair, monkeypatch):
    _, ours = pair
    prompts = _prompts(4, 2, 10, 89, seed=4)
    refs = generate(ours, prompts, 8, Sampling(0))
    eos = refs[1].tokens[2]
    sizes = []
    real = Session.decode
    monkeypatch.setattr(Session, "decode", lambda self, r, t: sizes.append(len(r)) or real(self, r, t))
    out = generate(ours, prompts, 8, Sampling(0), stop=[eos])
    assert sum(s.finish_reason == "stop" for s in out) >= 1
    # decode call j feeds token j of exactly the rows that go on to sample token j + 1
    assert sizes == [sum(len(s.tokens) >= j + 2 for s in out) for j in range(7)]
    assert sizes[-1] < 4


def test_stop_strings(tiny):
    tok = ByteTokenizer()
    prompt = tok.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
    free = generate(tiny, [prompt], 40, Sampling(0))[0]
    text = tok.decode(free.tokens)
    needle = text[6:8]
    cut = next(i for i in range(1, len(free.tokens) + 1) if needle in tok.decode(free.tokens[:i]))
    out = generate(tiny, [prompt], 40, Sampling(0), stop=[needle], tokenizer=tok)[0]
    assert out.tokens == free.tokens[:cut] and out.finish_reason == "stop"


def _recompute(model, prompts, samples, sampling, chunk_size=1024):
    """Right-padded prompt + reply, a mask on the reply, and the allowed-id dicts from Sample.allowed."""
    L = max(len(p) + len(s.tokens) for p, s in zip(prompts, samples))
    toks = torch.zeros(len(prompts), L, dtype=torch.long)
    mask = torch.zeros(len(prompts), L, dtype=torch.bool)
    allowed = []
    for b, (p, s) in enumerate(zip(prompts, samples)):
        seq = p + s.tokens
        toks[b, :len(seq)] = torch.tensor(seq)
        mask[b, len(p):len(seq)] = True
        allowed.append({len(p) + j: a for j, a in enumerate(s.allowed) if a is not None})
    return toks, mask, token_logprobs(model, toks, mask, sampling, allowed=allowed, chunk_size=chunk_size)


@pytest.mark.parametrize("sampling", [Sampling(1.0), Sampling(0.7, top_k=20, top_p=0.9), Sampling(1.3, top_k=5),
                                      Sampling(0.0)])
def test_sampled_logprobs_equal_token_logprobs(tiny, sampling):
    tok = ByteTokenizer()
    prompts = [tok.encode(t) for t in ("<|im_start|>user\nwhere?<|im_end|>\n", "go ", "a", "the map is ##")]
    cons = [Constraint.from_strings(tok, ["north", "south", "n", "ne"]), None,
            Constraint.from_strings(tok, ["add(", "update(", "none"], free_after=True), None]
    out = generate(tiny, prompts, 24, sampling, constraint=cons, seed=0)
    toks, mask, lp = _recompute(tiny, prompts, out, sampling, chunk_size=7)
    for b, (p, s) in enumerate(zip(prompts, out)):
        got = lp[b, len(p):len(p) + len(s.tokens)]
        assert torch.allclose(got, torch.tensor(s.logprobs), atol=1e-4), (b, got, s.logprobs)
        assert len(s.tokens) == len(s.logprobs) == len(s.allowed)
    assert (lp[~mask] == 0).all()
    assert out[0].allowed[0] is not None and out[1].allowed[0] is None
    assert out[2].allowed[0] is not None and out[2].allowed[-1] is None  # head, then free text


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_constrained_logprobs_are_the_softmax_over_the_allowed_ids(tiny, temperature):
    """An independent reference for the sampler's constrained log-probs: at each reply position the allowed ids
    are the next tokens of the words whose prefix matches (worked out here from the word list), and the
    log-prob is the log-softmax of the plain forward's logits over just those ids, at the temperature (greedy
    is scored at temperature 1 and takes the likeliest allowed id). A forced token has log-prob 0."""
    tok = ByteTokenizer()
    words = ["north", "northeast", "south", "n"]
    replies = [tok.encode(w) + [tok.eos_token_id] for w in words]
    prompts = [tok.encode(t) for t in ("go ", "<|im_start|>user\nwhere?<|im_end|>\n", "x", "stairs: 1 ")]
    cons = [Constraint.from_strings(tok, words)] * len(prompts)
    out = generate(tiny, prompts, 16, Sampling(temperature), constraint=cons, seed=3)
    for p, s in zip(prompts, out):
        assert s.tokens in replies
        for j, t in enumerate(s.tokens):
            allowed = sorted({r[j] for r in replies if r[:j] == s.tokens[:j] and len(r) > j})
            with torch.no_grad():
                z = tiny(torch.tensor([p + s.tokens[:j]]))[0, -1].float()[allowed]
            ref = torch.log_softmax(z / (temperature or 1.0), 0)[allowed.index(t)].item()
            assert s.logprobs[j] == pytest.approx(ref, abs=1e-4), (words, j)
            if temperature == 0:
                assert t == allowed[int(z.argmax())]


def test_token_logprobs_grad_and_chunking(tiny):
    g = G(5)
    toks = torch.randint(0, 256, (3, 30), generator=g)
    mask = torch.rand(3, 30, generator=g) < 0.7
    sampling = Sampling(0.8, top_k=30, top_p=0.95)
    a = token_logprobs(tiny, toks, mask, sampling, chunk_size=5)
    b = token_logprobs(tiny, toks, mask, sampling, chunk_size=4096)
    assert torch.allclose(a, b, atol=1e-5) and torch.isfinite(a).all()  # off-policy tokens stay finite
    # without filtering it is the plain log-softmax of the no-cache forward
    with torch.no_grad():
        ref = torch.log_softmax(tiny(toks).float(), -1)[:, :-1].gather(-1, toks[:, 1:, None])[..., 0]
    plain = token_logprobs(tiny, toks, mask)
    m = mask.clone()
    m[:, 0] = False
    assert torch.allclose(plain[:, 1:][m[:, 1:]], ref[m[:, 1:]], atol=1e-5)
    # gradients equal those of the plain formula, and with checkpointed chunks
    tiny.zero_grad()
    (plain * m).sum().backward()
    g1 = tiny.layers[0].self_attn.qkv_proj.weight.grad.clone()
    tiny.zero_grad()
    lf = torch.log_softmax(tiny(toks).float(), -1)[:, :-1].gather(-1, toks[:, 1:, None])[..., 0]
    lf[m[:, 1:]].sum().backward()
    g2 = tiny.layers[0].self_attn.qkv_proj.weight.grad.clone()
    tiny.zero_grad()
    assert torch.allclose(g1, g2, atol=1e-5, rtol=1e-4) and g1.abs().sum() > 0


def test_constraint_outputs_are_allowed_completions(tiny):
    tok = ByteTokenizer()
    words = ["n", "ne", "north", "south", "été"]
    c = Constraint.from_strings(tok, words)
    prompt = tok.encode("<|im_start|>assistant\n")
    out = generate(tiny, [prompt] * 64, 16, Sampling(1.5), constraint=[c] * 64, seed=1)
    got = set()
    for s in out:
        assert s.finish_reason == "stop" and s.tokens[-1] == tok.eos_token_id
        assert tok.decode(s.tokens[:-1]) in words
        got.add(tok.decode(s.tokens[:-1]))
    assert len(got) >= 3  # sampling really explores the trie
    heads = Constraint.from_strings(tok, ["add(", "none"], free_after=True)
    out = generate(tiny, [prompt] * 16, 12, Sampling(1.0), constraint=[heads] * 16, seed=2)
    for s in out:
        text = tok.decode(s.tokens)
        assert text.startswith("add(") or text.startswith("none")
    with pytest.raises(ValueError, match="at least one completion"):
        generate(tiny, [prompt], 4, constraint=[Constraint([])])


def test_jump_forward_skips_sampling_of_forced_tokens(tiny, monkeypatch):
    """After 'n' the constraint forces "orth": those tokens are appended with log-prob 0 and fed in one chunk,
    and a reply whose rest is forced ("east<eos>" after 'e') ends without another model call."""
    tok = ByteTokenizer()
    c = Constraint.from_strings(tok, ["northeast", "northwest", "east"])
    calls = []
    real_prefill, real_decode = Session.prefill, Session.decode
    monkeypatch.setattr(Session, "prefill", lambda self, r, new: calls.append([len(x) for x in new]) or
                        real_prefill(self, r, new))
    monkeypatch.setattr(Session, "decode", lambda self, r, t: calls.append([1] * len(r)) or real_decode(self, r, t))
    prompt = tok.encode("<|im_start|>assistant\n")
    sess = Session(tiny, 16, 64)
    out = generate(tiny, [prompt] * 16, 16, Sampling(2.0), constraint=[c] * 16, seed=3, session=sess,
                   rows=list(range(16)))
    north = [s for s in out if s.tokens[0] == ord("n")]
    assert 0 < len(north) < 16
    # the prompt, then one chunk "north" for the rows that drew 'n'; nothing else
    assert calls == [[len(prompt)] * 16, [5] * len(north)]
    for s in out:
        text = tok.decode(s.tokens[:-1])
        sampled = [0, 5] if text.startswith("north") else [0]  # the only branch points of the trie
        assert [j for j, lp in enumerate(s.logprobs) if lp != 0.0] == sampled
        assert all(s.allowed[j] == [s.tokens[j]] for j in range(len(s.tokens)) if j not in sampled)
    # the session holds every reply token (the unfed forced tail is pending) and continues like a one-shot
    monkeypatch.undo()
    nxt = tok.encode("<|im_start|>user\nok<|im_end|>\n")
    cont = generate(tiny, [nxt] * 16, 6, Sampling(0), session=sess, rows=list(range(16)))
    for r, (s, c2) in enumerate(zip(out, cont)):
        assert sess.length(r) == len(prompt) + len(s.tokens) + len(nxt) + len(c2.tokens)
        one = generate(tiny, [prompt + s.tokens + nxt], 6, Sampling(0))[0]
        assert c2.tokens == one.tokens and np.allclose(c2.logprobs, one.logprobs, atol=1e-4)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 5, 1.0), (1.0, 0, 0.7), (0.6, 8, 0.9)])
def test_top_k_top_p_match_expected_distribution(tmp_path, temperature, top_k, top_p):
    """Many one-token samples of one prompt vs the truncated distribution computed by hand from
    transformers' logits; each count within 5 sigma (binomial), and nothing outside the support."""
    torch.manual_seed(1)
    V = 16
    hf = Qwen3ForCausalLM(Qwen3Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                      initializer_range=1.0, eos_token_id=None)).eval()
    hf.save_pretrained(tmp_path)
    ours = Transformer.from_pretrained(tmp_path)
    prompt = [3, 1, 4, 1, 5]
    with torch.no_grad():
        z = hf(torch.tensor([prompt])).logits[0, -1].double().numpy() / temperature
    order = np.argsort(-z)
    p = np.exp(z - z.max())
    if top_k:
        p[order[top_k:]] = 0
    p /= p.sum()
    if top_p < 1:
        before = np.cumsum(p[order]) - p[order]
        p[order[before >= top_p]] = 0
        p /= p.sum()
    assert 2 <= (p > 0).sum() < V  # the truncation is real and leaves a choice
    N = 6000
    out = generate(ours, [prompt] * N, 1, Sampling(temperature, top_k=top_k, top_p=top_p), seed=7)
    counts = np.bincount([s.tokens[0] for s in out], minlength=V)
    assert counts[p == 0].sum() == 0
    sigma = np.sqrt(N * p * (1 - p))
    assert (np.abs(counts - N * p) <= 5 * sigma + 1).all(), (counts, N * p)
    lp = {s.tokens[0]: s.logprobs[0] for s in out}
    for t, v in lp.items():
        assert math.isclose(v, math.log(p[t]), abs_tol=1e-4)


def test_seed_and_generator_reproducible(tiny):
    prompts = [[1, 2, 3], [4, 5]]
    a = generate(tiny, prompts, 10, seed=3)
    b = generate(tiny, prompts, 10, generator=torch.Generator().manual_seed(3))
    c = generate(tiny, prompts, 10, seed=4)
    assert [s.tokens for s in a] == [s.tokens for s in b]
    assert [s.tokens for s in a] != [s.tokens for s in c]


# ---------------------------------------------------------------- decode graphs (cudagraphs.py)
def graph_vs_eager(model, tol=1e-4):
    """One multi-turn script through a Session that replays decode graphs and one that decodes eagerly, each
    turn's replies compared: batches of 7 (padded to 8; one row stops early), 3 with a row joining, then 20 of a 20-row session
    (padded to 32) whose long prompts grow the cache (the graphs are dropped and captured again); greedy and
    seeded sampling; constrained rows that jump forward (a step with a jump is a prefill) and leave early. Then the caches: live rows equal, rows never fed
    still empty, the scratch row's length 0. Returns (the graph session, decode steps, captures)."""
    tok, dev = ByteTokenizer(), model.device
    cons = Constraint.from_strings(tok, ["north", "northeast", "south"])
    graph, eager = Session(model, 20, 1200, graphs=True), Session(model, 20, 1200, graphs=False)
    calls = {"decode": 0, "capture": 0}

    def counting(name, fn):
        return lambda *a: calls.__setitem__(name, calls[name] + 1) or fn(*a)
    eager.decode = counting("decode", eager.decode)
    graph.graphs.capture = counting("capture", graph.graphs.capture)
    turns = [(list(range(7)), 10, 0.0, 8, False), ([2, 7, 0], 12, 1.0, 14, True),
             (list(range(20)), 9, 0.0, 300, False), (list(range(20)), 6, 1.0, 5, True)]
    for t, (rows, n, temperature, longest, constrained) in enumerate(turns):
        prompts = _prompts(len(rows), 1, longest + 1, 250, seed=40 + t)
        kw = dict(sampling=Sampling(temperature), rows=rows,
                  constraint=[cons if constrained and r % 3 == 1 else None for r in rows])
        if t == 0:   # a stop id that ends row 0 early: the batch shrinks inside its bucket
            kw["stop"] = [generate(model, prompts, n, Sampling(0))[0].tokens[2]]
        a = generate(model, prompts, n, session=graph, generator=torch.Generator(dev).manual_seed(t), **kw)
        b = generate(model, prompts, n, session=eager, generator=torch.Generator(dev).manual_seed(t), **kw)
        assert [s.tokens for s in a] == [s.tokens for s in b], f"turn {t}"
        assert [s.finish_reason for s in a] == [s.finish_reason for s in b]
        for x, y in zip(a, b):
            assert np.allclose(x.logprobs, y.logprobs, atol=tol), f"turn {t}"
    assert graph.k.shape[3] > 256 and graph.k.shape[1] == 21 and eager.k.shape[1] == 20
    assert torch.equal(graph.lengths[:20], eager.lengths) and graph.lengths[20] == 0
    assert graph.clean == eager.clean   # beyond it, positions never reserved: uninitialised memory
    for cg, ce in ((graph.k, eager.k), (graph.v, eager.v)):
        torch.testing.assert_close(cg[:, :20, :, :eager.clean].float(), ce[..., :eager.clean, :].float(), rtol=0,
                                   atol=tol * 10)
    return graph, calls["decode"], calls["capture"]


def test_decode_graphs_pad_replay_and_recapture_like_eager(tiny, monkeypatch):
    """On CPU a stand-in replays the captured step eagerly on the same fixed buffers, and fails if the cache it
    was captured on has been replaced (as a real graph would write freed memory); tests/test_gpu.py runs the
    same script on real CUDA graphs."""
    import cudagraphs

    def capture(self, size, device):
        rows = torch.full((size,), self.scratch, dtype=torch.long)
        tokens = torch.zeros(size, dtype=torch.long)
        session, hidden = self.body.__self__, self.body(rows, tokens)
        captured_on = session.k

        class Replay:
            def replay(_):
                assert session.k is captured_on, "replayed a graph captured on a cache that has since grown"
                hidden.copy_(self.body(rows, tokens))
        return Replay(), rows, tokens, hidden
    monkeypatch.setattr(cudagraphs.DecodeGraphs, "capture", capture)
    graph, decodes, captures = graph_vs_eager(tiny)
    assert graph.graphs.replays == decodes == 31   # every decode step replayed a graph, none ran eager
    assert captures == 4 and sorted(graph.graphs.graphs) == [16, 32]   # 8, 2; after the cache grew 32, 16
    assert [cudagraphs.bucket(n) for n in (1, 2, 3, 5, 8, 9, 16, 17, 20, 33)] == [1, 2, 4, 8, 8, 16, 16, 32, 32, 48]


def test_a_failed_capture_decodes_eagerly_says_so_once_and_later_sessions_skip_graphs(tiny, monkeypatch, capsys):
    """A capture the driver refuses must not end a run: the Session decodes eagerly (the same tokens as an eager
    Session), one line says so, and every Session made afterwards in the process decodes eagerly from the start."""
    import cudagraphs
    tries = []

    def capture(self, size, device):
        tries.append(size)
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")
    monkeypatch.setattr(cudagraphs, "capture_failed", False)
    monkeypatch.setattr(cudagraphs.DecodeGraphs, "capture", capture)
    graph, decodes, _ = graph_vs_eager(tiny)
    assert tries == [8] and graph.graphs.replays == 0 and graph.graphs.eager   # tried once, then eager
    err = capsys.readouterr().err
    assert err.count("warning: a CUDA graph capture failed (operation not permitted") == 1 and "more detail" not in err
    assert not cudagraphs.default_on(torch.device("cuda"))


def test_decode_graphs_default_to_cuda_and_the_main_thread():
    """A Session replays graphs unless told otherwise only on CUDA and in the main thread; the background
    distillation's thread decodes eagerly."""
    import threading
    from cudagraphs import default_on
    cuda, seen = torch.device("cuda"), []
    thread = threading.Thread(target=lambda: seen.append(default_on(cuda)))
    thread.start()
    thread.join()
    assert default_on(cuda) and not default_on(torch.device("cpu")) and seen == [False]


def test_draw_at_the_top_end_takes_the_last_token_with_mass(monkeypatch):
    """A uniform number that rounds up to the total mass finds no cumulative probability above it: the draw
    takes the last token with nonzero mass, not one past the vocabulary (on a CPU it looks for that case only
    when it happens); below the end the draw is untouched."""
    import sampling
    z = torch.tensor([[0.0, 0.0, float("-inf"), float("-inf")], [0.0, float("-inf"), 0.0, float("-inf")]])
    monkeypatch.setattr(sampling.torch, "rand", lambda n, _, **k: torch.tensor([[1.0], [0.25]]))
    tok, logp = sampling.draw(z, greedy=False)
    assert tok.tolist() == [1, 0] and logp.tolist() == pytest.approx([math.log(0.5)] * 2)
