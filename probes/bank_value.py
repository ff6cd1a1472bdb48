"""Probe p5 (no model trained): is "the first move of a successful episode from the most similar start" a
lesson worth retrieving in room? Env and embedder only, so it measures the information a bank of such
lessons carries, independent of whether a tiny extractor can learn to write them or a tiny actor to read them.

Training side: the memoryless stairs-stepper (step onto the stairs when they are one move away, else a
random move) plays TRAIN_STARTS training starts; each success stores its first move under the run's
retrieval key (instruction + first view with the map, crl's --query-map) embedded by the default
all-MiniLM-L6-v2.
Held-out side: the 256 evaluation starts (EVAL_SEED0...), each played by the stepper whose first move is the
top-1 retrieved lesson with probability FOLLOW. The same per-start random stream drives every arm, so the
arms differ only where the lesson is followed.  Run: python -m probes.bank_value [TRAIN_STARTS] [EVAL_STARTS]
"""
import collections
import random
import sys

import torch

import crl
import envs
from hf import Embedder
from small import presets
from probes import ONE_MOVE

STEPS = crl.CRLConfig(max_steps=presets.TINY["max_steps"]).steps("room")


def stepper_move(obs: str, rng: random.Random, actions) -> str:
    m = ONE_MOVE.search(obs)
    return m.group(1) if m else rng.choice(actions)


def play(env, seed: int, rng: random.Random, plan=(), follow: float = 1.0) -> tuple[str, tuple, str, bool]:
    """(retrieval key, start position, first move, success) of one stepper episode. Its first len(plan)
    moves are the plan's, each with probability `follow`, unless the stairs are one move away."""
    obs = env.reset(seed=seed)
    key, pos = crl.retrieval_query(env, env.map_view()), env.pos
    move0, done, info, t = None, False, {}, 0
    while not done:
        move = stepper_move(obs, rng, env.actions)
        if t < len(plan) and not ONE_MOVE.search(obs) and rng.random() < follow:
            move = plan[t]
        move0, t = move0 or move, t + 1
        obs, _, done, info = env.step(move)
    return key, pos, move0, bool(info.get("success"))


def inward(pos: tuple, centre: list) -> list[str]:
    """The moves from pos to the room's centre (diagonal first), as a --lesson-moves plan would write them."""
    dx, dy = round(centre[0] - pos[0]), round(centre[1] - pos[1])
    path, moves = envs.offset_words(dx, dy, diagonal=True), []
    for part in [] if path == "here" else path.split(", "):   # '1 southeast, 1 east'
        count, word = part.split()
        moves += [word] * int(count)
    return moves


def main(train_starts: int = 2048, evals: int = 256):
    torch.set_num_threads(1)
    env = envs.make("room", max_steps=STEPS, show_map=False)
    lessons, keys, by_pos, train_pos = [], [], {}, []
    for s in range(train_starts):
        key, pos, move, ok = play(env, s, random.Random(s))
        if ok:
            keys.append(key)
            lessons.append(move)
            train_pos.append(pos)
            by_pos.setdefault(pos, collections.Counter())[move] += 1
    embed = Embedder()
    bank_vecs = embed(keys)
    no_lesson = [play(env, crl.EVAL_SEED0 + s, random.Random(-s - 1)) for s in range(evals)]
    print(f"no lesson (the stepper): held-out success {sum(r[3] for r in no_lesson) / evals:.3f}")
    print(f"{len(lessons)} lessons from {train_starts} training starts "
          f"(stepper success {len(lessons) / train_starts:.3f})")
    starts = [r[:2] for r in no_lesson]
    top1 = (embed([k for k, _ in starts]) @ bank_vecs.T).argmax(-1).tolist()
    centre = [sum(c) / len(c) for c in zip(*train_pos)]   # the mean start of the successes
    arms = {"first move of the top-1 (MiniLM key) success": [[lessons[i]] for i in top1],
            "commonest first move of successes at the same start (oracle key)":
                [[by_pos[p].most_common(1)[0][0]] if p in by_pos else [] for _, p in starts],
            "moves to the centre from the top-1 (MiniLM key) start": [inward(train_pos[i], centre) for i in top1],
            "moves to the centre from the true start (oracle)": [inward(p, centre) for _, p in starts]}
    for name, plans in arms.items():
        for follow in (0.5, 1.0):
            wins = sum(play(env, crl.EVAL_SEED0 + s, random.Random(-s - 1), plans[s], follow)[3] for s in range(evals))
            print(f"{name}, follow {follow:.1f}: held-out success {wins / evals:.3f}")


if __name__ == "__main__":
    main(*map(int, sys.argv[1:3]))
