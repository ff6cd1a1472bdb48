"""Complementary RL, the algorithm: an actor trained with multi-turn GRPO on split advantages, co-evolving with
an experience extractor trained with CISPO on the measured utility of the lessons it writes into the bank.

Reading order: prompts -> rollout -> split_advantages / grpo_loss / cispo_loss -> extractor (distill, parse,
credit, merge, search_and_ask) -> train_step. model.py supplies the decoder and the batched KV-cache
generator, envs.py the games, bank.py the shared experience bank; train.py builds a `CRL` and calls
`train_step` / `evaluate` in a loop, under torchrun for DDP.
"""
import math
import re
import time
import warnings
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

import envs
from bank import Operation
from model import Constraint, Session, generate, token_logprobs

MODES = ("crl", "grpo", "static", "exp-only")
EVAL_SEED0 = 1_000_000_000  # evaluation seeds start here; training seeds are drawn below it


@dataclass
class CRLConfig:
    mode: str = "crl"                     # crl | grpo (no bank) | static (frozen extractor) | exp-only (frozen actor)
    group_size: int = 8                   # G rollouts per task instance, split G/2 without + G/2 with experience
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    eval_temperature: float = 1.0
    clip: float = 0.2                     # PPO clip epsilon [code]
    cispo_eps_low: float = 0.1            # CISPO IS-weight clip [code]
    cispo_eps_high: float = 0.1
    loss_agg: str = "seq-mean-token-mean"
    adv_std: bool = False                 # the authors use mean-centring only
    warmup: int = 5                       # actor waits this many iterations while the bank fills [code]
    retrieve_k: int = 1                   # entries injected into a with-experience prompt [code: top 1]
    free_text: bool = False               # actor replies free text with <answer>; else constrained to the actions
    history: int | None = None            # None: whole episode in context; h: only the last h turns (cheap tiny runs)
    instructions: bool = True             # False: no task text in the prompt (tiny: it only dilutes the observation)
    show_map: bool = True                 # False: MiniHack observations without the character map (tiny reads faster)
    max_steps: int = envs.MAX_STEPS       # actions per episode (the paper: 30); the tiny preset uses fewer
    max_reply_tokens: int = 256
    max_context: int = 8192
    max_asks: int = 2                     # search_and_ask calls per episode [code]
    extractor_free_text: bool = True      # False: operation heads constrained, bodies free (tiny extractor)
    extractor_temperature: float = 1.0
    extractor_reply_tokens: int = 512
    episode_chars: int = 6000             # the rendered episode shown to the extractor is cut to this
    distill_per_group: int = 0            # episodes per group sent to the extractor (0 = all)
    extractor_batch: int = 64             # rewarded generations buffered before a CISPO update [code]
    merge_every: int = 5                  # iterations between merge passes [code]
    merge_size: int = 5                   # entries consolidated per merge call [code]
    merge_batches: int = 2                # merge calls per task per pass
    micro_batch: int = 8                  # sequences per forward/backward
    minibatches: int = 1                  # optimizer steps per iteration (one epoch over the batch [code])
    grad_clip: float = 1.0

    @property
    def uses_bank(self):
        return self.mode != "grpo"

    @property
    def trains_actor(self):
        return self.mode != "exp-only"

    @property
    def trains_extractor(self):
        return self.mode in ("crl", "exp-only")


# ---------------------------------------------------------------------------------------------------------
# Distributed helpers (no-ops in a single process)

def world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if world() > 1 else 0


def gather_objects(obj) -> list:
    """Every rank's `obj`, in rank order, on every rank."""
    if world() == 1:
        return [obj]
    out = [None] * world()
    dist.all_gather_object(out, obj)
    return out


def _comm_device():
    """nccl reduces CUDA tensors only; gloo takes CPU tensors."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def all_reduce_sum(x: float) -> float:
    if world() == 1:
        return x
    t = torch.tensor([float(x)], dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t)
    return float(t.item())


def all_reduce_grads(model, bucket_numel: int = 1 << 25):
    """Sum gradients over ranks (the losses are already divided by global counts), a few flat buckets at a
    time so a large model makes few collective calls without doubling its gradient memory."""
    if world() == 1:
        return
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    bucket = []
    for i, p in enumerate(params):   # same parameter order on every rank, so the buckets line up
        bucket.append(p.grad)
        last = i == len(params) - 1
        if last or sum(g.numel() for g in bucket) >= bucket_numel or params[i + 1].grad.dtype != p.grad.dtype:
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat)
            offset = 0
            for g in bucket:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
            bucket = []


def seeded_generator(device, *parts: int) -> torch.Generator:
    """A torch RNG on `device` determined by integers (seed, step, rank, purpose): a resumed run replays the
    same samples."""
    seed = int(np.random.SeedSequence(list(parts)).generate_state(1)[0])
    return torch.Generator(device=device).manual_seed(seed)


# ---------------------------------------------------------------------------------------------------------
# Prompts. The actor sees: system = task + actions + reply format (+ retrieved experience); each
# observation is a user turn; its replies are assistant turns.

def actor_system_prompt(env, experience: list[str], free_text: bool, can_ask: bool, instructions: bool = True
                        ) -> str:
    """The env's instruction names the goal and the actions (ALFWorld lists its admissible commands in each
    observation); we add the reply format and, for a with-experience episode, the retrieved lessons. Without
    `instructions` (a model trained from scratch, whose reply is constrained to the actions anyway) only the
    numbered lessons remain, possibly nothing: every constant token dilutes what a tiny model attends to."""
    lines = [env.instruction] if instructions else []
    if instructions and free_text:
        lines.append("Think briefly if it helps, then give exactly one action as <answer>ACTION</answer>.")
        if can_ask:
            lines.append("Instead of acting you may consult the experience bank with <ask>QUESTION</ask> "
                         "(at most 2 times per episode).")
    elif instructions:
        lines.append("Reply with one action.")
    if experience:
        lines += ["Knowledge from earlier episodes:"] if instructions else []
        lines += [f"{i + 1}. {text}" for i, text in enumerate(experience)]
    return "\n".join(lines)


def retrieval_query(env, first_obs: str) -> str:
    """The key of an episode: the task goal and the initial view (PAPER: retrieval)."""
    return f"{env.instruction}\n{first_obs}"


def encode_chat(tok, messages: list[dict], generation_prompt: bool = True) -> list[int]:
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    return tok.encode(text, add_special_tokens=False)


_TURN_CACHE = weakref.WeakKeyDictionary()   # tokenizer -> (text between reply and user turn, text after it)


def next_turn_tokens(tok, text: str) -> list[int]:
    """Tokens that follow an assistant reply (which ended with the eos token) to add a user turn and open
    the next assistant turn. Found by rendering the chat template around placeholders, so it works for any
    ChatML/Llama-style template without re-rendering (and re-tokenising) the whole conversation."""
    if tok not in _TURN_CACHE:
        msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                {"role": "assistant", "content": "\x02"}, {"role": "user", "content": "\x01"}]
        rendered = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        between, after = rendered[rendered.index("\x02") + 1:].split("\x01")
        eos = tok.decode([tok.eos_token_id])
        if between.startswith(eos):  # the reply's own eos token is already in the sequence
            between = between[len(eos):]
        _TURN_CACHE[tok] = (between, after)
    between, after = _TURN_CACHE[tok]
    return tok.encode(between + text + after, add_special_tokens=False)


# ---------------------------------------------------------------------------------------------------------
# Rollout

@dataclass
class Segment:
    """One trained sequence: prompt/observation tokens (mask False) and actor tokens (mask True)."""
    tokens: list[int] = field(default_factory=list)
    mask: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    allowed: dict = field(default_factory=dict)  # position -> allowed ids, where a constraint masked it
    share: float = 1.0              # this segment's share of its episode (1/number of windows)
    episode_tokens: int = 0         # actor tokens in the whole episode (0: this segment's own)

    def extend(self, tokens, mask=False, logprobs=None, allowed=None):
        start = len(self.tokens)
        self.tokens += tokens
        self.mask += [mask] * len(tokens)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(tokens)
        for i, a in enumerate(allowed or []):
            if a is not None:
                self.allowed[start + i] = a


@dataclass
class Episode:
    task: str
    seed: int
    group: int
    with_exp: bool
    query: str = ""
    instruction: str = ""
    experience: list = field(default_factory=list)   # texts injected into the prompt
    retrieved: list = field(default_factory=list)    # their entry ids
    sources: list = field(default_factory=list)      # the extractor generations credited by this episode
    segments: list = field(default_factory=list)
    transcript: list = field(default_factory=list)   # (who, text) lines for the extractor
    reward: float = 0.0
    success: bool = False
    turns: int = 0
    invalid: int = 0
    asks: int = 0
    truncated: bool = False


class EnvPool:
    """Environments are reused across iterations (MiniHack construction is the slow part). Evaluation draws
    ALFWorld games and WebShop goals from their held-out splits (envs.HELD_OUT), training from train."""

    def __init__(self, show_map: bool = True, max_steps: int = envs.MAX_STEPS):
        self.free: dict[tuple, list] = {}
        self.show_map, self.max_steps = show_map, max_steps

    def take(self, task, train=True):
        key = (task, train)
        if self.free.get(key):
            return self.free[key].pop()
        kw = dict(max_steps=self.max_steps)
        if task in envs.HELD_OUT:
            kw["split"] = "train" if train else envs.HELD_OUT[task]
        if task in envs.MINIHACK:
            kw["show_map"] = self.show_map
        return envs.make(task, **kw)

    def give(self, task, train, env):
        self.free.setdefault((task, train), []).append(env)


ASK_RE = re.compile(r"<ask>(.*?)</ask>", re.S)


def window_messages(system: str, history: list, obs: str, h: int) -> list[dict]:
    """System prompt (if any), the last h (observation, reply) turns, and the new observation."""
    msgs = [{"role": "system", "content": system}] if system else []
    for o, r in (history[-h:] if h else []):
        msgs += [{"role": "user", "content": o}, {"role": "assistant", "content": r}]
    return msgs + [{"role": "user", "content": obs}]


def rollout(crl, specs: list[tuple], generator: torch.Generator, temperature: float, train: bool = True
            ) -> list[Episode]:
    """Play every episode in `specs` ((task, seed, group, with_exp) tuples) to the end. All live episodes
    advance together: one generate() call per turn over one KV-cache session, so a turn prefills only its
    new observation tokens (with cfg.history set, a turn starts a fresh, shorter context instead)."""
    cfg, tok = crl.cfg, crl.actor_tok
    eps = [Episode(task, seed, group, with_exp) for task, seed, group, with_exp in specs]
    games = [crl.pool.take(e.task, train) for e in eps]
    t0 = time.perf_counter()
    obs = [env.reset(seed=e.seed) for env, e in zip(games, eps)]
    crl.timer["env"] += time.perf_counter() - t0
    for e, env, o in zip(eps, games, obs):
        e.instruction, e.query = env.instruction, retrieval_query(env, o)
        e.transcript.append(("environment", o))
    if cfg.uses_bank:
        retrieve(crl, [e for e in eps if e.with_exp], train=train)
    systems = [actor_system_prompt(env, e.experience, cfg.free_text, e.with_exp and cfg.uses_bank, cfg.instructions)
               for env, e in zip(games, eps)]
    pending = [encode_chat(tok, window_messages(s, [], o, 0)) for s, o in zip(systems, obs)]
    history = [[] for _ in eps]   # (observation, reply) pairs
    for e, p in zip(eps, pending):
        e.segments.append(Segment())
        e.segments[-1].extend(p)

    session = Session(crl.actor, max_batch=len(eps), max_len=cfg.max_context)

    def fits(i) -> bool:
        """Room for row i's pending tokens and a reply; if not, the episode ends as a failure."""
        if session.length(i) + len(pending[i]) + cfg.max_reply_tokens <= cfg.max_context:
            return True
        eps[i].truncated, eps[i].success = True, False
        eps[i].reward = getattr(games[i], "failure_reward", 0.0)
        session.release([i])
        return False

    done = [False] * len(eps)
    live = [i for i in range(len(eps)) if fits(i)]
    while live:
        # 1. one batched generate call for every live episode
        cons = None if cfg.free_text else [Constraint.from_strings(tok, games[i].actions) for i in live]
        t0 = time.perf_counter()
        samples = generate(crl.actor, [pending[i] for i in live], cfg.max_reply_tokens, temperature=temperature,
                           top_p=cfg.top_p, top_k=cfg.top_k, stop=[tok.eos_token_id], tokenizer=tok,
                           generator=generator, constraint=cons, session=session, rows=live)
        crl.timer["generate"] += time.perf_counter() - t0
        # 2. act: each reply steps its game, or (free text, with experience) asks the bank
        t0 = time.perf_counter()
        asks = []
        for i, s in zip(live, samples):
            e = eps[i]
            e.segments[-1].extend(s.tokens, True, s.logprobs, s.allowed)
            ended = bool(s.tokens) and s.tokens[-1] == tok.eos_token_id
            reply = tok.decode(s.tokens[:-1] if ended else s.tokens)
            e.transcript.append(("agent", reply))
            history[i].append((obs[i], reply))
            pending[i] = [] if ended else [tok.eos_token_id]   # close a reply cut by the length limit
            ask = ASK_RE.search(reply) if cfg.free_text and e.with_exp and cfg.uses_bank else None
            if ask and "<answer>" not in reply and e.asks < cfg.max_asks:
                e.asks += 1
                asks.append((i, ask.group(1).strip()))
                continue
            obs[i], reward, done[i], info = games[i].step(reply)
            e.turns += 1
            e.invalid += int(bool(info.get("invalid", False)))
            e.transcript.append(("environment", obs[i]))
            if done[i]:
                e.reward, e.success = float(reward), bool(info.get("success", False))
        crl.timer["env"] += time.perf_counter() - t0
        # 3. search_and_ask: the extractor answers all of this turn's questions in one call
        if asks:
            answers = search_and_ask(crl, [(eps[i], q) for i, q in asks], generator, record=train)
            for (i, _), answer in zip(asks, answers):
                obs[i] = "Experience bank answer: " + answer
                eps[i].transcript.append(("experience bank", answer))
        # 4. queue each live episode's next user turn
        still = []
        for i in live:
            e = eps[i]
            if done[i]:
                session.release([i])
                continue
            if cfg.history is None:
                pending[i] += next_turn_tokens(tok, obs[i])
            else:
                session.release([i])
                pending[i] = encode_chat(tok, window_messages(systems[i], history[i], obs[i], cfg.history))
            if not fits(i):
                continue
            if cfg.history is not None:
                e.segments.append(Segment())   # only now: a truncated episode leaves no empty segment
            e.segments[-1].extend(pending[i])
            still.append(i)
        live = still
    for e, env in zip(eps, games):
        crl.pool.give(e.task, train, env)
        n = sum(sum(s.mask) for s in e.segments)
        for s in e.segments:    # a windowed episode still counts as one sequence in the loss (no length bias)
            s.share, s.episode_tokens = 1.0 / len(e.segments), n
    return eps


def retrieve(crl, eps: list[Episode], train: bool = True):
    """Top-k experience for each with-experience episode, searched by its query. Under DDP every rank runs
    the same searches (all ranks' queries, in rank order), so the re-rank state of the replicas stays
    identical; each rank keeps its own results."""
    mine = [(e.task, e.query) for e in eps]
    everyone = gather_objects(mine) if train else [mine]
    me = rank() if train else 0
    for r, queries in enumerate(everyone):
        for task in sorted({t for t, _ in queries}):
            idx = [j for j, (t, _) in enumerate(queries) if t == task]
            results = crl.manager.search(task, [queries[j][1] for j in idx], crl.cfg.retrieve_k, update=train)
            if r != me:
                continue
            for j, hits in zip(idx, results):
                eps[j].experience = [entry.text for entry, _ in hits]
                eps[j].retrieved = [entry.id for entry, _ in hits]
                eps[j].sources = [entry.source for entry, _ in hits]


# ---------------------------------------------------------------------------------------------------------
# The actor's objective: GRPO on split advantages

def split_advantages(rewards: torch.Tensor, group: torch.Tensor, with_exp: torch.Tensor, std: bool = False
                     ) -> torch.Tensor:
    """A_i = R_i - mean(R) within each (group, with/without experience) subgroup (PAPER: split advantage;
    [code] no division by the std unless `std`). Keeps a learning signal for experience-free play."""
    rewards = rewards.double()
    adv = torch.zeros_like(rewards)
    sub = group.long() * 2 + with_exp.long()
    for key in sub.unique():
        idx = sub == key
        adv[idx] = rewards[idx] - rewards[idx].mean()
        if std and idx.sum() > 1:
            adv[idx] = adv[idx] / (rewards[idx].std() + 1e-6)
    return adv.float()


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, agg: str, num_seqs: float | None = None,
              num_tokens: float | None = None, seq_tokens: torch.Tensor | None = None) -> torch.Tensor:
    """seq-mean-token-mean: mean over each sequence's tokens, then over sequences; token-mean: over all
    tokens. The denominators may be given (global counts), so micro-batches and DDP ranks sum exactly; a
    row may be one piece of a longer sequence (an episode split into windows), divided by that sequence's
    token count `seq_tokens` and counted as its share in `num_seqs`."""
    mask = mask.to(per_token.dtype)
    if agg == "seq-mean-token-mean":
        denom = seq_tokens if seq_tokens is not None else mask.sum(-1).clamp(min=1)
        per_seq = (per_token * mask).sum(-1) / denom
        return per_seq.sum() / (num_seqs if num_seqs is not None else max(per_token.shape[0], 1))
    if agg == "token-mean":
        return (per_token * mask).sum() / (num_tokens if num_tokens is not None else mask.sum().clamp(min=1))
    raise ValueError(f"unknown loss aggregation {agg!r}; use seq-mean-token-mean or token-mean")


def grpo_loss(logp, old_logp, adv, mask, clip: float = 0.2, agg: str = "seq-mean-token-mean", **denoms):
    """PPO-clip on token ratios, no KL, no entropy (PAPER: actor objective [code]). logp/old_logp/mask [B,T],
    adv [B]. A clipped token contributes no gradient."""
    ratio = torch.exp(logp - old_logp)
    a = adv[:, None]
    per_token = torch.maximum(-a * ratio, -a * ratio.clamp(1 - clip, 1 + clip))
    return aggregate(per_token, mask, agg, **denoms)


def cispo_loss(logp, old_logp, adv, mask, eps_low: float = 0.1, eps_high: float = 0.1,
               agg: str = "seq-mean-token-mean", **denoms):
    """CISPO (MiniMax-M1): -sg(clip(r, 1-eps_low, 1+eps_high)) * A * log pi. The importance weight is
    clipped, not the objective, so every token keeps its gradient (PAPER: extractor objective [code])."""
    weight = torch.exp(logp - old_logp).clamp(1 - eps_low, 1 + eps_high).detach()
    per_token = -weight * adv[:, None] * logp
    return aggregate(per_token, mask, agg, **denoms)


def pad_segments(segments: list[Segment], device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded [B, T] tokens, actor-token mask and sampler log-probs."""
    T = max(len(s.tokens) for s in segments)
    tokens = torch.zeros(len(segments), T, dtype=torch.long)
    mask = torch.zeros(len(segments), T, dtype=torch.bool)
    old = torch.zeros(len(segments), T)
    for b, s in enumerate(segments):
        tokens[b, :len(s.tokens)] = torch.tensor(s.tokens)
        mask[b, :len(s.mask)] = torch.tensor(s.mask)
        old[b, :len(s.logprobs)] = torch.tensor(s.logprobs)
    mask[:, 0] = False   # the first token has no prediction
    return tokens.to(device), mask.to(device), old.to(device)


def policy_update(crl, model, opt, segments: list[Segment], advantages: list[float], objective: str,
                  temperature: float, minibatches: int = 1) -> dict:
    """One epoch over the batch in `minibatches` optimizer steps (PPO mini-batches: after the first step the
    ratio leaves 1 and the clip starts to matter). Returns the steps' mean statistics."""
    steps = []
    for k in range(minibatches):
        idx = list(range(k, len(segments), minibatches))
        steps.append(optimizer_step(crl, model, opt, [segments[j] for j in idx], [advantages[j] for j in idx],
                                    objective, temperature))
    out = {key: sum(s.get(key, 0.0) for s in steps) / len(steps) for key in steps[0] if key != "grad_norm"}
    out["skipped"] = sum(s["skipped"] for s in steps)
    out["trained_seqs"] = sum(s["trained_seqs"] for s in steps)
    norms = [s["grad_norm"] for s in steps if "grad_norm" in s]
    if norms:
        out["grad_norm"] = sum(norms) / len(norms)
    return out


def optimizer_step(crl, model, opt, segments: list[Segment], advantages: list[float], objective: str,
                   temperature: float) -> dict:
    """One optimizer step over `segments`: micro-batched, losses divided by global counts so the sum over
    micro-batches and ranks is the mean over the global batch; gradients summed over ranks."""
    cfg = crl.cfg
    num_seqs = all_reduce_sum(sum(s.share for s in segments))
    num_tokens = all_reduce_sum(sum(sum(s.mask) for s in segments))
    # a sequence with zero advantage adds nothing to the gradient: skip its forward/backward (the global
    # denominators above still count it, so the update is exactly the same)
    live = [j for j in range(len(segments)) if advantages[j] != 0.0]
    stats = {"loss": 0.0, "ratio": 0.0, "clipfrac": 0.0, "tokens": 0.0}
    if all_reduce_sum(len(live)) == 0:
        return {**stats, "skipped": 0, "trained_seqs": 0}
    opt.zero_grad(set_to_none=True)
    order = sorted(live, key=lambda j: len(segments[j].tokens))  # similar lengths together: little padding
    device = next(model.parameters()).device
    for start in range(0, len(order), cfg.micro_batch):
        idx = order[start:start + cfg.micro_batch]
        tokens, mask, old = pad_segments([segments[j] for j in idx], device)
        adv = torch.tensor([advantages[j] for j in idx], device=device)
        seq_tokens = torch.tensor([float(segments[j].episode_tokens or max(sum(segments[j].mask), 1)) for j in idx],
                                  device=device)
        denoms = dict(num_seqs=num_seqs, num_tokens=num_tokens, seq_tokens=seq_tokens)
        logp = token_logprobs(model, tokens, mask, temperature=temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                              allowed=[segments[j].allowed for j in idx])
        if objective == "grpo":
            loss = grpo_loss(logp, old, adv, mask, cfg.clip, cfg.loss_agg, **denoms)
            lo, hi = 1 - cfg.clip, 1 + cfg.clip
        else:
            loss = cispo_loss(logp, old, adv, mask, cfg.cispo_eps_low, cfg.cispo_eps_high, cfg.loss_agg, **denoms)
            lo, hi = 1 - cfg.cispo_eps_low, 1 + cfg.cispo_eps_high
        loss.backward()
        with torch.no_grad():
            ratio = torch.exp(logp - old)[mask]
            stats["loss"] += loss.item()
            stats["ratio"] += ratio.sum().item()
            stats["clipfrac"] += ((ratio < lo) | (ratio > hi)).sum().item()
            stats["tokens"] += ratio.numel()
    all_reduce_grads(model)
    loss = all_reduce_sum(stats["loss"])
    tokens = max(all_reduce_sum(stats["tokens"]), 1.0)
    out = {"loss": loss, "ratio": all_reduce_sum(stats["ratio"]) / tokens,
           "clipfrac": all_reduce_sum(stats["clipfrac"]) / tokens, "skipped": 0,
           "trained_seqs": all_reduce_sum(len(live))}
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    if not (math.isfinite(loss) and torch.isfinite(grad_norm)):   # identical on every rank after the reduce
        warnings.warn(f"non-finite {objective} loss or gradient (loss={loss}); update skipped")
        opt.zero_grad(set_to_none=True)
        out["skipped"] = 1
        return out
    opt.step()
    out["grad_norm"] = float(grad_norm)
    return out


# ---------------------------------------------------------------------------------------------------------
# The experience extractor: distil episodes into bank operations; its reward is the outcome of the episodes
# that later retrieve what it wrote.

EXTRACTOR_SYSTEM = (
    "You keep a bank of short lessons for an agent that plays a text game. Read a finished episode and the "
    "lessons the agent was shown, then write at most 3 operations, one per line:\n"
    "ADD: <a new lesson: in which situation, what to do, and why>\n"
    "UPDATE <numbers of shown lessons, comma-separated>: <one lesson that replaces them>\n"
    "NONE\n"
    "Keep only what will help future episodes of this task.")
EXTRACTOR_FORMAT = "Reason if it helps, then put the operations inside <answer></answer>."
MERGE_SYSTEM = (
    "You keep a bank of short lessons for an agent that plays a text game. Consolidate the numbered lessons "
    "below into fewer, more general ones without losing what is useful: write lines\n"
    "UPDATE <numbers, comma-separated>: <one lesson that replaces them>\n"
    "or NONE if they are fine as they are.")
ASK_SYSTEM = ("You advise an agent that plays a text game. Answer its question in at most three sentences, "
              "using the lessons from earlier episodes where they apply.")


@dataclass
class Generation:
    """One extractor output: what to train on, and the outcomes credited to it (PAPER: extractor reward)."""
    id: int
    task: str
    prompt: list
    tokens: list
    logprobs: list
    allowed: list
    credits: list = field(default_factory=list)


def render_episode(e: Episode, limit: int) -> str:
    """Alternating environment/agent lines; a long episode keeps its beginning and end."""
    text = "\n".join(f"{who}: {line}" for who, line in e.transcript)
    if len(text) > limit:
        half = limit // 2
        text = text[:half] + "\n...\n" + text[-half:]
    return text


def shown_lessons(texts: list[str]) -> str:
    return "\n".join(f"[{i + 1}] {t}" for i, t in enumerate(texts)) or "(none)"


def extractor_prompt(crl, e: Episode) -> list[int]:
    system = EXTRACTOR_SYSTEM + ("\n" + EXTRACTOR_FORMAT if crl.cfg.extractor_free_text else "")
    user = (f"Task: {e.instruction}\nOutcome: {'SUCCESS' if e.success else 'FAILURE'}\n"
            f"Lessons shown to the agent:\n{shown_lessons(e.experience)}\n"
            f"Episode:\n{render_episode(e, crl.cfg.episode_chars)}")
    return encode_chat(crl.extractor_tok, [{"role": "system", "content": system}, {"role": "user", "content": user}])


OP_RE = re.compile(r"^(ADD|UPDATE|NONE)\b\s*([0-9][0-9,\s]*)?:?\s*(.*)$", re.I)
ANSWER_RE = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.S | re.I)


def parse_operations(reply: str, shown: int, max_ops: int = 3) -> tuple[list[tuple], int]:
    """Reply -> ([(kind, targets, text)], parse failures). Accepts `ADD: text`, `UPDATE 1,2: text` (targets
    are 1-based indices of the shown lessons) and `NONE`, inside <answer> when present. A line that is none
    of these, or names a lesson that was not shown, is a failure: counted, skipped, never fatal."""
    m = ANSWER_RE.search(reply.split("</think>")[-1])
    tagged = m is not None
    region = m.group(1) if tagged else reply.split("</think>")[-1]
    ops, bad = [], 0
    for line in region.splitlines():
        line = line.strip().strip("-*").strip()
        if not line:
            continue
        op = OP_RE.match(line)
        kind = op.group(1).upper() if op else None
        targets = [int(t) for t in re.findall(r"\d+", op.group(2) or "")] if op else []
        body = op.group(3).strip() if op else ""
        if kind == "NONE":
            ops.append(("none", (), ""))
        elif kind == "ADD" and body and not targets:
            ops.append(("add", (), body))
        elif kind == "UPDATE" and body and targets and all(1 <= t <= shown for t in targets):
            ops.append(("update", tuple(sorted(set(targets))), body))
        else:
            bad += 1
    if not tagged and ops:
        bad = 0          # free reasoning around untagged operations is not a failure
    if not ops and not bad:
        bad = 1          # an empty reply
    return [o for o in ops if o[0] != "none"][:max_ops], bad


def operation_heads(tok, shown: int, merge: bool = False) -> Constraint:
    """For a tiny extractor: the operation head is constrained, the lesson after it is free text."""
    heads = [] if merge else ["ADD: "]
    if shown:
        heads.append("UPDATE " + ",".join(str(i + 1) for i in range(shown)) + ": ")
    completions = [tok.encode(h, add_special_tokens=False) for h in heads]
    completions.append(tok.encode("NONE", add_special_tokens=False) + [tok.eos_token_id])
    return Constraint(completions, free_after=True)


def extractor_generate(crl, prompts: list[list[int]], tasks: list[str], generator, heads: list | None = None,
                       record: bool = True) -> list[tuple[int, str]]:
    """One batched extractor call; each output becomes a Generation (when the extractor is trained)."""
    cfg, tok = crl.cfg, crl.extractor_tok
    t0 = time.perf_counter()
    samples = generate(crl.extractor, prompts, cfg.extractor_reply_tokens, temperature=cfg.extractor_temperature,
                       top_p=cfg.top_p, top_k=cfg.top_k, stop=[tok.eos_token_id], tokenizer=tok,
                       generator=generator, constraint=heads)
    crl.timer["extractor"] += time.perf_counter() - t0
    out = []
    for prompt, task, s in zip(prompts, tasks, samples):
        gen_id = crl.gen_counter * world() + rank()        # unique across ranks
        crl.gen_counter += 1
        if record and cfg.trains_extractor:
            crl.generations[gen_id] = Generation(gen_id, task, prompt, s.tokens, s.logprobs, s.allowed)
        ended = bool(s.tokens) and s.tokens[-1] == tok.eos_token_id
        # special tokens never enter a lesson: injected into a prompt they would break its chat format
        out.append((gen_id, tok.decode(s.tokens[:-1] if ended else s.tokens, skip_special_tokens=True)))
    return out


def heads_for(crl, shown: list[int], merge: bool = False) -> list | None:
    if crl.cfg.extractor_free_text:
        return None
    return [operation_heads(crl.extractor_tok, n, merge) for n in shown]


def distill(crl, eps: list[Episode], step: int, generator) -> list[Operation]:
    """Finished episodes -> bank operations (PAPER: add / update / none). New entries are keyed by the
    embedding of the episode's retrieval query; an update replaces the shown entries it names."""
    if not eps:
        return []
    prompts = [extractor_prompt(crl, e) for e in eps]
    outputs = extractor_generate(crl, prompts, [e.task for e in eps], generator,
                                 heads_for(crl, [len(e.retrieved) for e in eps]))
    keys = crl.manager.embed([e.query for e in eps])
    ops = []
    for e, key, (gen_id, reply) in zip(eps, keys, outputs):
        if not crl.cfg.extractor_free_text:
            reply = reply.replace("\n", " ")    # a tiny extractor writes one operation: head + free body
        parsed, bad = parse_operations(reply, len(e.retrieved))
        crl.counters["parse_failures"] += bad
        crl.counters["operations"] += len(parsed)
        for kind, targets, text in parsed:
            ids = tuple(e.retrieved[t - 1] for t in targets)
            ops.append(Operation(kind, e.task, text, ids, key, gen_id, step))
    return ops


def search_and_ask(crl, questions: list[tuple[Episode, str]], generator, record: bool = True) -> list[str]:
    """The actor's tool (PAPER: search_and_ask): retrieve lessons for its question, let the extractor answer.
    The answer is a generation like any other: the asking episode's outcome is its reward. Searches here
    leave the re-rank state alone so DDP replicas stay identical."""
    prompts, lessons = [], []
    for e, q in questions:
        hits = crl.manager.search(e.task, [q], 3, update=False)[0]
        lessons.append([entry.text for entry, _ in hits])
        user = f"Task: {e.instruction}\nQuestion: {q}\nLessons:\n{shown_lessons(lessons[-1])}"
        prompts.append(encode_chat(crl.extractor_tok, [{"role": "system", "content": ASK_SYSTEM},
                                                       {"role": "user", "content": user}]))
    outputs = extractor_generate(crl, prompts, [e.task for e, _ in questions], generator, record=record)
    answers = []
    for (e, _), (gen_id, reply) in zip(questions, outputs):
        e.sources.append(gen_id)
        answers.append(reply.split("</think>")[-1].strip() or "(no answer)")
    return answers


def credit_generations(crl, eps: list[Episode]):
    """Each episode credits the generations behind what it used: +1 on success, -1 on failure [code]. Credits
    from every rank reach the rank that owns the generation (PAPER: reward attribution)."""
    credits = [(src, 1.0 if e.success else -1.0) for e in eps for src in e.sources]
    for rank_credits in gather_objects(credits):
        for src, c in rank_credits:
            if src in crl.generations:
                crl.generations[src].credits.append(c)


def extractor_update(crl) -> dict:
    """Once enough generations have rewards (over all ranks), one CISPO step with A = reward - batch mean."""
    cfg = crl.cfg
    ready = [g for g in crl.generations.values() if g.credits]
    total = all_reduce_sum(len(ready))
    if total < cfg.extractor_batch:
        return {}
    rewards = [sum(g.credits) / len(g.credits) for g in ready]
    mean = all_reduce_sum(sum(rewards)) / total
    segments = []
    for g in ready:
        s = Segment()
        s.extend(g.prompt)
        s.extend(g.tokens, True, g.logprobs, g.allowed)
        segments.append(s)
    t0 = time.perf_counter()
    stats = policy_update(crl, crl.extractor, crl.extractor_opt, segments, [r - mean for r in rewards], "cispo",
                          cfg.extractor_temperature)
    crl.timer["extractor_update"] += time.perf_counter() - t0
    for g in ready:
        del crl.generations[g.id]
    stats["reward"] = mean
    stats["generations"] = total
    return stats


def merge_pass(crl, step: int, generator) -> list[Operation]:
    """Consolidate small batches (merge_size) of similar entries of one task into fewer, more general ones
    (PAPER: merge). Every rank picks the same batches from its identical replica; rank r writes batch r mod W."""
    cfg, bank = crl.cfg, crl.manager.bank
    rng = np.random.default_rng([crl.seed, step, 3])
    batches = []
    for task in sorted(bank.tasks()):
        entries = bank.entries(task)
        if len(entries) < 2:
            continue
        for _ in range(cfg.merge_batches):
            anchor = entries[int(rng.integers(len(entries)))]
            batches.append((task, bank.neighbours(anchor.id, cfg.merge_size)))
    mine = batches[rank()::world()]
    if not mine:
        return []
    prompts = []
    for task, group in mine:
        user = f"Task: {task}\nLessons:\n{shown_lessons([x.text for x in group])}"
        prompts.append(encode_chat(crl.extractor_tok, [{"role": "system", "content": MERGE_SYSTEM},
                                                       {"role": "user", "content": user}]))
    outputs = extractor_generate(crl, prompts, [t for t, _ in mine], generator,
                                 heads_for(crl, [len(g) for _, g in mine], merge=True))
    ops = []
    for (task, group), (gen_id, reply) in zip(mine, outputs):
        parsed, bad = parse_operations(reply, len(group))
        crl.counters["parse_failures"] += bad
        for kind, targets, text in parsed:
            if kind != "update":
                continue
            ids = tuple(group[t - 1].id for t in targets)   # key None: the bank uses the mean of their keys
            ops.append(Operation("update", task, text, ids, None, gen_id, step))
    crl.counters["merges"] += len(ops)
    return ops


def apply_everywhere(crl, ops: list[Operation]):
    """Every rank applies every rank's operations in rank order: the bank replicas stay identical."""
    for rank_ops in gather_objects(ops):
        crl.manager.apply(rank_ops)


# ---------------------------------------------------------------------------------------------------------
# One co-evolution iteration (DESIGN: data flow of one training iteration)

@dataclass
class CRL:
    """Everything a run holds: both models with their tokenizers and optimizers, the bank's manager, the
    environment pool, the extractor's unrewarded generations, and counters. Built by train.py."""
    cfg: CRLConfig
    tasks: list
    groups: int                 # task instances per iteration, over all ranks
    seed: int
    actor: torch.nn.Module
    actor_tok: object
    actor_opt: torch.optim.Optimizer | None
    extractor: torch.nn.Module | None
    extractor_tok: object
    extractor_opt: torch.optim.Optimizer | None
    manager: object | None
    pool: EnvPool | None = None
    generations: dict = field(default_factory=dict)
    gen_counter: int = 0
    counters: dict = field(default_factory=dict)
    timer: dict = field(default_factory=dict)
    max_generations: int = 4096  # unrewarded generations kept (oldest dropped): NONE outputs never earn credit

    def __post_init__(self):
        self.pool = self.pool or EnvPool(self.cfg.show_map, self.cfg.max_steps)


def episode_specs(crl, step: int) -> list[tuple]:
    """This rank's episodes: `groups` task instances (tasks in turn, seeds drawn from (seed, step)), each
    played G times, G/2 without and G/2 with experience (all G without in grpo mode)."""
    rng = np.random.default_rng([crl.seed, step, 1])
    G = crl.cfg.group_size
    specs = []
    for g in range(crl.groups):
        task = crl.tasks[(step * crl.groups + g) % len(crl.tasks)]
        seed = int(rng.integers(EVAL_SEED0))
        if g % world() != rank():
            continue
        for j in range(G):
            specs.append((task, seed, g, crl.cfg.uses_bank and j >= G // 2))
    return specs


def success_metrics(eps: list[Episode], prefix: str) -> dict:
    """Success rate and mean reward (WebShop's is fractional) with and without experience per task, summed
    over ranks."""
    counts = {}
    for e in eps:
        key = f"{prefix}/{e.task}/{{}}_{'exp' if e.with_exp else 'noexp'}"
        n, s, r = counts.get(key, (0, 0, 0.0))
        counts[key] = (n + 1, s + int(e.success), r + e.reward)
    total = {}
    for rank_counts in gather_objects(counts):
        for k, (n, s, r) in rank_counts.items():
            tn, ts, tr = total.get(k, (0, 0, 0.0))
            total[k] = (tn + n, ts + s, tr + r)
    return {k.format(name): v / n for k, (n, s, r) in sorted(total.items())
            for name, v in (("success", s), ("reward", r))}


def train_step(crl, step: int) -> dict:
    """Rollout -> bank bookkeeping -> distillation (background) -> actor GRPO update -> extractor CISPO update
    -> merge pass. Returns this iteration's metrics (identical on every rank)."""
    cfg = crl.cfg
    crl.timer = {k: 0.0 for k in ("generate", "env", "update", "extractor", "extractor_update")}
    crl.counters = {k: 0 for k in ("parse_failures", "operations", "merges")}
    gen = seeded_generator(crl.actor.device, crl.seed, step, rank(), 1)
    ext_gen = seeded_generator(crl.extractor.device, crl.seed, step, rank(), 2) if crl.extractor else None

    # 1-2. play G rollouts of each task instance
    eps = rollout(crl, episode_specs(crl, step), gen, cfg.temperature)
    metrics = {"step": step, **success_metrics(eps, "train")}

    # bank usage and extractor credit, from every rank's episodes in rank order
    if cfg.uses_bank:
        for rank_uses in gather_objects([(e.retrieved, e.success) for e in eps if e.retrieved]):
            for ids, success in rank_uses:
                crl.manager.record_use(ids, success)
        credit_generations(crl, eps)

    # 5. distil episodes into bank operations: in the background while the actor trains (one GPU process), or
    # inline (CPU; DDP, gathered and applied in rank order so every replica stays identical)
    if cfg.uses_bank:
        chosen = eps
        if cfg.distill_per_group:
            by_group = {}
            for e in eps:
                by_group.setdefault(e.group, []).append(e)
            chosen = [e for g in sorted(by_group) for e in distill_choice(by_group[g], cfg.distill_per_group)]
        if world() == 1:
            crl.manager.submit(distill, crl, chosen, step, ext_gen)
        else:
            apply_everywhere(crl, distill(crl, chosen, step, ext_gen))

    # 3-4. the actor: split advantages, GRPO (after a warm-up that lets the bank fill)
    if cfg.trains_actor and (step >= cfg.warmup or not cfg.uses_bank):
        adv = split_advantages(torch.tensor([e.reward for e in eps]), torch.tensor([e.group for e in eps]),
                               torch.tensor([e.with_exp for e in eps]), cfg.adv_std)
        segments = [s for e in eps for s in e.segments]
        seg_adv = [float(a) for e, a in zip(eps, adv) for _ in e.segments]
        t0 = time.perf_counter()
        stats = policy_update(crl, crl.actor, crl.actor_opt, segments, seg_adv, "grpo", cfg.temperature,
                              cfg.minibatches)
        crl.timer["update"] = time.perf_counter() - t0
        metrics.update({f"actor/{k}": v for k, v in stats.items()})
    if crl.manager is not None:
        crl.manager.flush()

    # 6. the extractor: CISPO once enough of its generations have been judged by the actor's outcomes
    if cfg.trains_extractor:
        metrics.update({f"extractor/{k}": v for k, v in extractor_update(crl).items()})
        for old in sorted(crl.generations)[:max(0, len(crl.generations) - crl.max_generations)]:
            del crl.generations[old]

    # 7. merge pass every few iterations
    if cfg.uses_bank and cfg.merge_every and (step + 1) % cfg.merge_every == 0:
        apply_everywhere(crl, merge_pass(crl, step, ext_gen))

    n = all_reduce_sum(len(eps))
    metrics.update({
        "reward": all_reduce_sum(sum(e.reward for e in eps)) / n,
        "turns": all_reduce_sum(sum(e.turns for e in eps)) / n,
        "invalid_actions": all_reduce_sum(sum(e.invalid for e in eps)),
        "truncated": all_reduce_sum(sum(e.truncated for e in eps)),
        "asks": all_reduce_sum(sum(e.asks for e in eps)),
        **{k: all_reduce_sum(v) for k, v in crl.counters.items()},
        "bank_size": len(crl.manager.bank) if crl.manager is not None else 0,
        **{f"time/{k}": v for k, v in crl.timer.items()},
    })
    return metrics


def distill_choice(group: list[Episode], n: int) -> list[Episode]:
    """Which episodes of a group to distil when not all: alternate successes and failures, so the extractor
    sees both outcomes."""
    wins = [e for e in group if e.success]
    losses = [e for e in group if not e.success]
    out = []
    while len(out) < n and (wins or losses):
        for pool in (wins, losses):
            if pool and len(out) < n:
                out.append(pool.pop(0))
    return out


def evaluate(crl, tasks: list[str], episodes: int) -> dict:
    """Success on held-out seeds (disjoint from training seeds), with and without experience, the bank
    read-only. The sampling noise is fixed, so evaluations at different steps are comparable."""
    specs = []
    for task in tasks:
        for j in range(episodes):
            specs.append((task, EVAL_SEED0 + j, j, False))
            if crl.cfg.uses_bank:
                specs.append((task, EVAL_SEED0 + j, j, True))
    mine = specs[rank()::world()]
    timer = crl.timer
    crl.timer = {k: 0.0 for k in ("generate", "env", "extractor")}
    gen = seeded_generator(crl.actor.device, crl.seed, 7, rank(), 3)
    eps = rollout(crl, mine, gen, crl.cfg.eval_temperature, train=False)
    crl.timer = timer
    return success_metrics(eps, "eval")
