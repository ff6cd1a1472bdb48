"""sampling.py — the one definition of "the distribution sampled from", shared by model.py's generator, which
draws from it, and its training-side log-probs (token_logprobs), which recompute under it: a constraint's mask,
then temperature, top-k and top-p (`filter_logits`, held by `Sampling`), and the draw itself (`draw`); and the
log-probs under it that token_logprobs takes from a model's hidden states (`target_logprobs`); and when an
unconstrained reply ends (`Stops`)."""
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from ops import selective_log_softmax


def filter_logits(z: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                  allow: torch.Tensor | None = None, keep: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 logits [N, V] -> the logits of the distribution sampled from: constraint mask (`allow` [N, V]
    bool), then temperature, then top-k (ties with the k-th value kept), then top-p (the smallest set of most
    likely tokens whose mass reaches top_p). Dropped tokens become -inf. temperature 0 (greedy) applies only
    the mask: its log-probs are those of the temperature-1 masked distribution. `keep` [N] (token_logprobs'
    targets) is never dropped by top-k/top-p, so an off-policy token gets a finite log-prob; on-policy
    tokens are in the kept set anyway, so this changes nothing there."""
    z = z.float()
    if allow is not None:
        z = z.masked_fill(~allow, float("-inf"))
    if temperature == 0:
        return z
    if temperature != 1:
        z = z / temperature
    if (0 < top_k < z.shape[-1]) or top_p < 1:
        z = z.masked_fill(_truncated(z, top_k, top_p, keep), float("-inf"))
    return z


@torch.no_grad()
def _truncated(z: torch.Tensor, top_k: int, top_p: float, keep: torch.Tensor | None) -> torch.Tensor:
    """[N, V] bool: the tokens top-k and then top-p drop from the tempered logits z, never those in `keep`."""
    drop = torch.zeros_like(z, dtype=torch.bool)
    if 0 < top_k < z.shape[-1]:
        drop |= z < torch.topk(z, top_k, dim=-1).values[:, -1:]
    if top_p < 1:
        p = torch.softmax(z.masked_fill(drop, float("-inf")), dim=-1)
        sp, si = torch.sort(p, dim=-1, descending=True)
        before = sp.cumsum(-1) - sp  # mass of the more likely tokens
        drop |= torch.zeros_like(drop).scatter(-1, si, before >= top_p)
    if keep is not None:
        drop[torch.arange(len(keep), device=z.device), keep] = False
    return drop


@dataclass(frozen=True)
class Sampling:
    """The sampler's settings, checked once: generate draws under them, token_logprobs recomputes under them."""
    temperature: float = 1.0          # 0 = greedy
    top_k: int = 0                    # 0 = off
    top_p: float = 1.0                # 1 = off

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")

    def filter(self, z, allow=None, keep=None) -> torch.Tensor:
        return filter_logits(z, self.temperature, self.top_k, self.top_p, allow, keep)


def allow_mask(n: int, V: int, entries: list[tuple[int, list[int]]], device) -> torch.Tensor | None:
    """[n, V] bool: rows listed in `entries` may only use their ids; the other rows are unrestricted."""
    if not entries:
        return None
    m = torch.ones(n, V, dtype=torch.bool, device=device)
    r = torch.tensor([i for i, _ in entries], device=device)
    m[r] = False
    rr = torch.tensor([i for i, ids in entries for _ in ids], device=device, dtype=torch.long)
    cc = torch.tensor([t for _, ids in entries for t in ids], device=device, dtype=torch.long)
    m[rr, cc] = True
    return m


def draw(z: torch.Tensor, greedy: bool, generator=None):
    """One token per row from filtered logits z [B, V] -> (tokens [B], their log-probs [B]). Sampling is by
    inverse CDF: one uniform number per row against the cumulative probabilities, far cheaper on CPU than
    torch.multinomial or Gumbel noise over the whole vocabulary."""
    logp = torch.log_softmax(z, dim=-1)
    if greedy:
        tok = z.argmax(-1)
    else:
        cdf = logp.exp().cumsum(-1)
        u = torch.rand(z.shape[0], 1, device=z.device, generator=generator) * cdf[:, -1:]
        tok = torch.searchsorted(cdf, u, right=True)[:, 0]
        # rounding at the top end (u reached the total, tok == V): the last token with nonzero mass; below the end
        # tok <= that argmax already, so a CPU, where it is ~1 ms of a SmolLM2 step, looks only when needed
        if z.device.type != "cpu" or bool((tok == z.shape[-1]).any()):
            tok = torch.minimum(tok, cdf.argmax(-1))
    return tok, logp.gather(-1, tok[:, None])[:, 0]


def allowed_by_target(allowed: list | None, bi: list[int], ti: list[int]) -> dict[int, list[int]]:
    """{k: allowed ids of target k} for the targets (bi[k], ti[k]) that a constraint masked."""
    if allowed is None:
        return {}
    flat = {(b, t): k for k, (b, t) in enumerate(zip(bi, ti))}
    return {flat[(b, int(t))]: ids for b, d in enumerate(allowed) for t, ids in (d or {}).items()
            if (b, int(t)) in flat}


def target_logprobs(model, h, targets, where: dict, sampling: Sampling, chunk_size: int) -> torch.Tensor:
    """[N] log-probs of targets given hidden states h [N, hidden], `chunk_size` rows of lm_head at a time,
    each chunk recomputed in the backward (checkpointing) instead of keeping its logits."""
    V = model.config.vocab_size

    def chunk_lp(hc, tc, allow):
        return selective_log_softmax(sampling.filter(model.lm_head(hc).float(), allow, keep=tc), tc)

    parts = []
    for s in range(0, len(targets), chunk_size):
        e = min(s + chunk_size, len(targets))
        allow = allow_mask(e - s, V, [(k - s, ids) for k, ids in where.items() if s <= k < e], h.device)
        if torch.is_grad_enabled() and h.requires_grad:
            parts.append(checkpoint(chunk_lp, h[s:e], targets[s:e], allow, use_reentrant=False))
        else:
            parts.append(chunk_lp(h[s:e], targets[s:e], allow))
    return torch.cat(parts, -1)


@dataclass
class Stops:
    """When an unconstrained reply ends: on an id in `ids` (the config's EOS ids and the ids in stop=), or
    when a stop string appears in the decoded last `tail` tokens of the reply."""
    ids: set
    strings: list
    tokenizer: object
    tail: int

    @classmethod
    def parse(cls, config, stop, tokenizer) -> "Stops":
        stop = [stop] if isinstance(stop, (int, str)) else list(stop)
        strings = [s for s in stop if isinstance(s, str)]
        if strings and tokenizer is None:
            raise ValueError("stop strings need tokenizer= to decode the generated text")
        ids = set(config.eos_token_ids) | {int(s) for s in stop if not isinstance(s, str)}
        tail = max((len(s.encode("utf-8")) for s in strings), default=0) + 4  # tokens enough to hold a string
        return cls(ids, strings, tokenizer, tail)

    def hit(self, tokens: list[int]) -> bool:
        if tokens[-1] in self.ids:
            return True
        return bool(self.strings) and any(s in self.tokenizer.decode(tokens[-self.tail:]) for s in self.strings)
