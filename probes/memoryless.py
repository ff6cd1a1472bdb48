"""Probe p8 (no model trained): how far above the stairs-stepper can a memoryless room policy get? Env only.

Scripted policies play the 256 held-out room starts (EVAL_SEED0..., the tiny preset's 10 actions, no map):
  - the stepper with skill q: when the stairs are one move away it steps onto them with probability q, else
    (and with nothing in view) a move from the walk. q = 1 is the README's stairs-stepper; a trained tiny
    actor's q is what probes.actor_policy reads (0.45 after 120 grpo iterations, 0.52 after 270);
  - walks for the other turns: uniform over the 8 moves, diagonals only, and a walk that repeats its last
    move with probability p (one move of memory, for contrast);
  - "toward": also steps toward stairs seen further away.
Each row is played with two random streams (1 and 2) on the same starts.  Run: python -m probes.memoryless [EVAL_STARTS]
"""
import random
import re
import sys

import crl
import envs
from small import presets
from probes import ONE_MOVE

SEEN = re.compile(r"stairs down \(>\): \d+ (\w+)", re.M)


def play(env, q: float, walk, toward: bool = False, stream: int = 1, starts: int = 256) -> float:
    """Held-out success of the policy: the stairs one move away -> that move w.p. q; stairs further and
    `toward` -> the first move toward them; else walk(rng, last move)."""
    rng, wins = random.Random(stream), 0
    for s in range(starts):
        obs, done, last, info = env.reset(seed=crl.EVAL_SEED0 + s), False, None, {}
        while not done:
            near, seen = ONE_MOVE.search(obs), SEEN.search(obs)
            move = near.group(1) if near and rng.random() < q else None
            move = move or (seen.group(1) if toward and seen and not near else walk(rng, last))
            obs, _, done, info = env.step(move)
            last = move
        wins += bool(info.get("success"))
    return wins / starts


def main(starts: int = 256):
    env = envs.make("room", max_steps=crl.CRLConfig(max_steps=presets.TINY["max_steps"]).steps("room"), show_map=False)
    moves = env.actions
    walks = {"uniform": lambda rng, last: rng.choice(moves),
             "diagonal": lambda rng, last: rng.choice([m for m in moves if len(m) > 5])}
    for p in (0.5, 0.8):
        walks[f"repeat last w.p. {p}"] = lambda rng, last, p=p: last if last and rng.random() < p else rng.choice(moves)
    for name, walk in walks.items():
        for q in (0.0, 0.5, 0.75, 0.9, 1.0):
            print(f"walk {name:20s} q {q:.2f}: held-out success "
                  f"{play(env, q, walk, starts=starts):.3f} {play(env, q, walk, stream=2, starts=starts):.3f}")
    for name in ("uniform", "diagonal"):
        print(f"walk {name:20s} q 1.00, toward stairs seen further: "
              f"{play(env, 1.0, walks[name], True, 1, starts):.3f} {play(env, 1.0, walks[name], True, 2, starts):.3f}")


if __name__ == "__main__":
    main(*map(int, sys.argv[1:2]))
