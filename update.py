"""update.py — the policy update both of crl's objectives share: the trained tokens' log-probs under the
distribution they were sampled from → the objective (crl.grpo_loss for the actor, crl.cispo_loss for the
extractor, each bound to its settings) → backward → clip the gradient's norm → one optimizer step.

crl.actor_update and crl.extractor_update call `policy_update` with an `Update` (model, optimizer, objective,
sampler) and a batch of segments (crl.Segment: tokens, the trained-token mask, the sampler's log-probs, allowed
ids) with their advantages. A sequence repeated with the same advantage goes through the model once, weighted by
its count. The batch is split into micro-batches of similar lengths, and each loss is divided by the global
sequence count, so the gradients summed over micro-batches and ranks are the mean over the whole batch: the same
step for any micro-batch size or number of ranks. The collectives and mixed precision it uses are parallel.py's.
"""
import math
import warnings
from dataclasses import dataclass

import torch

from model import token_logprobs
from parallel import all_reduce_grads, all_reduce_sum, autocast, is_sharded, match_microbatches
from sampling import Sampling


@dataclass
class Update:
    """A policy update's fixed parts: the model and its optimizer, the objective with its settings bound
    (`loss(logp, old_logp, adv, mask, **denominators)`: grpo_loss or cispo_loss), the ratio band its clip
    fraction counts outside, the distribution the tokens were sampled from, optimizer steps per batch, the
    micro-batch's bounds (sequences, padded tokens) and the gradient-norm clip."""
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    loss: object
    clip_range: tuple
    sampling: Sampling = Sampling()
    minibatches: int = 1
    micro_batch: int = 4
    micro_tokens: int | None = None
    grad_clip: float = 1.0


def policy_update(update: Update, segments: list, advantages: list[float]) -> dict:
    """One epoch over the batch in `update.minibatches` optimizer steps (PPO mini-batches: after the first step
    the ratio leaves 1 and the clip starts to matter). Returns the steps' mean statistics."""
    steps = []
    for k in range(update.minibatches):
        idx = list(range(k, len(segments), update.minibatches))
        steps.append(optimizer_step(update, [segments[j] for j in idx], [advantages[j] for j in idx]))
    out = {key: sum(s.get(key, 0.0) for s in steps) / len(steps) for key in steps[0] if key != "grad_norm"}
    out["skipped"] = sum(s["skipped"] for s in steps)
    out["trained_seqs"] = sum(s["trained_seqs"] for s in steps)
    norms = [s["grad_norm"] for s in steps if "grad_norm" in s]
    if norms:
        out["grad_norm"] = sum(norms) / len(norms)
    return out


def optimizer_step(update: Update, segments: list, advantages: list[float]) -> dict:
    """One optimizer step over `segments`: micro-batched, losses divided by global counts so the sum over
    micro-batches and ranks is the mean over the global batch; gradients summed over ranks."""
    model = update.model
    denoms = dict(num_seqs=all_reduce_sum(sum(s.share for s in segments)))
    # a sequence with zero advantage adds nothing to the gradient: skip its forward/backward (the global
    # denominators above still count it, so the update is exactly the same)
    trained = [j for j in range(len(segments))
               if advantages[j] != 0.0 and any(segments[j].mask[1:])]
    if all_reduce_sum(len(trained)) == 0:
        return {"loss": 0.0, "ratio": 0.0, "clipfrac": 0.0, "tokens": 0.0, "skipped": 0, "trained_seqs": 0}
    update.opt.zero_grad(set_to_none=True)
    distinct, counts = repeats(segments, advantages, trained)
    sums = backward_micro_batches(update, [segments[j] for j in distinct], [advantages[j] for j in distinct],
                                  counts, denoms)
    if not is_sharded(model):   # FSDP has reduce-scattered them already
        all_reduce_grads(model)
    loss = all_reduce_sum(sums["loss"])
    tokens = max(all_reduce_sum(sums["tokens"]), 1.0)
    out = {"loss": loss, "ratio": all_reduce_sum(sums["ratio"]) / tokens,
           "clipfrac": all_reduce_sum(sums["clipfrac"]) / tokens, "skipped": 0,
           "trained_seqs": all_reduce_sum(len(trained))}
    return {**out, **clip_and_step(model, update.opt, loss, update.grad_clip)}


def backward_micro_batches(update: Update, segments: list, advantages: list[float], counts: list[int],
                           denoms: dict) -> dict:
    """Forward and backward in micro-batches of similar lengths (little padding); gradients accumulate. Segment
    j stands for counts[j] identical ones. Returns this rank's sums of loss, ratio, clipped tokens and tokens."""
    model, (lo, hi), sampling = update.model, update.clip_range, update.sampling
    sums = {"loss": 0.0, "ratio": 0.0, "clipfrac": 0.0, "tokens": 0.0}
    batches = micro_batches([len(s.tokens) for s in segments], update.micro_batch, update.micro_tokens)
    device = next(model.parameters()).device
    match_microbatches(model, len(batches))
    with autocast(model):   # one context for the step: each weight is cast to bf16 once, not once a micro-batch
        for idx in batches:
            batch = [segments[j] for j in idx]
            tokens, mask, old = pad_segments(batch, device)
            adv = torch.tensor([advantages[j] for j in idx], device=device)
            # a row standing for c identical sequences weighs c times: its per-sequence mean divided by tokens / c
            seq_tokens = torch.tensor([float(s.episode_tokens or max(sum(s.mask), 1)) / counts[j]
                                       for s, j in zip(batch, idx)], device=device)
            weight = torch.tensor([float(counts[j]) for j in idx], device=device)[:, None].expand_as(mask)[mask]
            logp = token_logprobs(model, tokens, mask, sampling, allowed=[s.allowed for s in batch])
            with autocast(model, enabled=False):   # the loss, the backward and the statistics in full precision
                loss = update.loss(logp, old, adv, mask, **denoms, seq_tokens=seq_tokens)
                loss.backward()
                with torch.no_grad():
                    ratio = torch.exp(logp - old)[mask]
                    sums["loss"] += loss.item()
                    sums["ratio"] += (ratio * weight).sum().item()
                    sums["clipfrac"] += (((ratio < lo) | (ratio > hi)) * weight).sum().item()
                    sums["tokens"] += weight.sum().item()
    return sums


def clip_and_step(model, opt, loss: float, grad_clip: float) -> dict:
    """Clip the summed gradient's norm and step, unless the loss or the gradient is not finite (then the
    update is skipped, identically on every rank after the reduce)."""
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    if not (math.isfinite(loss) and torch.isfinite(grad_norm)):
        warnings.warn(f"non-finite loss or gradient (loss={loss}); update skipped")
        opt.zero_grad(set_to_none=True)
        return {"skipped": 1}
    opt.step()
    return {"grad_norm": float(grad_norm)}


# the batch's layout

def pad_segments(segments: list, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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


def repeats(segments: list, advantages: list[float], chosen: list[int]) -> tuple[list[int], list[int]]:
    """The distinct (segment, advantage) pairs among `chosen`, each once, and how often each occurs: a group's
    rollouts often play alike, and n identical sequences' gradient is one's times n, for one forward/backward."""
    keep, counts = [], []
    for j in chosen:
        k = next((i for i, u in enumerate(keep) if advantages[u] == advantages[j] and segments[u] == segments[j]),
                 None)
        if k is None:
            keep.append(j)
            counts.append(1)
        else:
            counts[k] += 1
    return keep, counts


def micro_batches(lengths: list[int], size: int, tokens: int | None) -> list[list[int]]:
    """Indices in micro-batches of similar lengths (shortest first): at most `size` sequences, and at most
    `tokens` once padded to the longest (a longer sequence goes alone)."""
    out = []
    for j in sorted(range(len(lengths)), key=lambda j: lengths[j]):
        if not out or len(out[-1]) == size or (tokens and (len(out[-1]) + 1) * lengths[j] > tokens):
            out.append([])
        out[-1].append(j)
    return out
