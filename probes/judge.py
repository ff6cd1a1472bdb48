"""Can an actor judge a lesson? The probe behind each preset's --judge. Run: python -m probes.judge
[--run RUN_DIR] [--starts N] [--samples K] [train.py flags: --actor ...].

The release has the actor accept, refine or reject a retrieved lesson before it acts (crl.judge_lessons).
Here the actor judges lessons whose worth is known, from crl's own judge prompt:
- room: held-out starts whose stairs are one move away in the words view; the right lesson is that move,
  the wrong one a move away from it;
- vault: held-out vaults; the right lesson names this vault and its door, the wrong one another vault and
  that vault's door (what an imprecise retrieval hands the actor).
It reports P(accept) under the two-word constrained judgement (exact, probes.policy), for right and wrong
lessons: a judge worth having accepts the right ones more. With --samples K it also samples K free-text
judgements per lesson and reports how many parse, and the verdicts.
"""
import argparse
import os
import random

import torch

import crl
import envs
import train
from model import generate
from sampling import Sampling
from probes import ONE_MOVE, policy


def room_cases(cfg, starts: int, rng: random.Random) -> list[tuple]:
    """(instruction, first view, right lesson, wrong lesson) for held-out room starts with the stairs in reach."""
    env, cases, seed = envs.make("room", show_map=False, max_steps=cfg.steps("room")), [], crl.EVAL_SEED0
    while len(cases) < starts:
        obs, seed = env.reset(seed=seed), seed + 1
        near = ONE_MOVE.search(obs)
        if near:
            right = near.group(1)
            cases.append((env.instruction, obs, right, rng.choice([a for a in env.actions if a != right])))
    return cases


def vault_cases(starts: int) -> list[tuple]:
    env, cases = envs.make("vault"), []
    for i in range(starts):
        other = envs.make("vault")
        obs, _ = env.reset(seed=crl.EVAL_SEED0 + i), other.reset(seed=crl.EVAL_SEED0 + starts + i)
        lesson = "In the {} vault the {} door opens."
        right, wrong = lesson.format(env.name, env.secret), lesson.format(other.name, other.secret)
        cases.append((env.instruction, obs, right, wrong))
    return cases


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", help="a run directory: its flags (args.json) and its trained actor (ckpt/actor)")
    p.add_argument("--starts", type=int, default=32)
    p.add_argument("--samples", type=int, default=0, help="free-text judgements sampled per lesson (0: none)")
    p.add_argument("--reply-tokens", type=int, default=48, help="tokens per free-text judgement")
    mine, rest = p.parse_known_args(argv)
    args = train.parse_args([*rest, "--out", mine.run, "--resume"] if mine.run else rest)
    cfg = train.config_from(args)
    spec = os.path.join(mine.run, "ckpt", "actor") if mine.run else args.actor
    model, tok = train.load_model(spec, args.seed, torch.device("cpu"), torch.float32, args)
    model.eval()
    rng = random.Random(0)
    for task, cases in (("room", room_cases(cfg, mine.starts, rng)), ("vault", vault_cases(mine.starts))):
        accept = {"right": [], "wrong": []}
        verdicts = {"right": {}, "wrong": {}}
        for instruction, obs, right, wrong in cases:
            for kind, lesson in (("right", right), ("wrong", wrong)):
                prompt = crl.judge_prompt(tok, instruction, obs, lesson)
                accept[kind].append(policy(model, tok, prompt, ("accept", "reject"))[0].item())
                if mine.samples:
                    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
                    for s in generate(model, [prompt] * mine.samples, mine.reply_tokens, Sampling(1.0),
                                      stop=[tok.eos_token_id], tokenizer=tok, generator=g):
                        verdict, _ = crl.parse_verdict(tok.decode(s.tokens, skip_special_tokens=True), refine=True)
                        verdicts[kind][verdict] = verdicts[kind].get(verdict, 0) + 1
        mean = {k: sum(v) / len(v) for k, v in accept.items()}
        print(f"{mine.run or args.actor} on {task} ({len(cases)} held-out starts): P(accept) right lesson "
              f"{mean['right']:.3f}, wrong lesson {mean['wrong']:.3f}, difference {mean['right'] - mean['wrong']:+.3f}")
        for kind in ("right", "wrong") if mine.samples else ():
            n = sum(verdicts[kind].values())
            print(f"  free text, {kind} lessons ({n} samples): " +
                  ", ".join(f"{v} {c / n:.3f}" for v, c in sorted(verdicts[kind].items())))


if __name__ == "__main__":
    main()
