"""Probe p6's reading of a finished run on a finite room pool (`--train-instances N --query-map`): training
success with minus without experience over each half of the run, the extractor's reward; and for each
pool instance, where its stairs are from the start, and which lessons of the run's final bank sit under that
instance's retrieval key, with how often they were used and how often that use succeeded.

    python -m probes.pool_lessons results/probe-p6/learn [N]

The dark room hides the stairs from the start, so they are found by random walks from the same seeded start
(the episode is reproducible: the step onto the stairs gives their position). Env and embedder only.
"""
import json
import os
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import torch

import crl
import envs
import reproduce
from bank import ExperienceBank
from hf import Embedder

def find_stairs(env, seed: int, rng, walks: int = 300) -> tuple | None:
    """The stairs' (x, y): random walks from the seeded start until one steps onto them."""
    for _ in range(walks):
        env.reset(seed=seed)
        for _ in range(env.max_steps):
            move = env.actions[rng.integers(len(env.actions))]
            x, y = env.pos
            _, _, done, info = env.step(move)
            if info["success"]:
                return x + envs.MOVE_OFFSETS[move][0], y + envs.MOVE_OFFSETS[move][1]
            if done:
                break
    return None


def halves(run: Path):
    """With − without experience per iteration (paired within its groups), mean ± 95% t over each half."""
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    half = len(rows) // 2
    for part, name in ((rows[:half], "first half"), (rows[half:], "second half")):
        w, wo = ([r[f"train/room/success_{k}"] for r in part] for k in ("exp", "noexp"))
        gap = reproduce.fmt(*reproduce.mean_ci([a - b for a, b in zip(w, wo)]))
        print(f"{name}: without {sum(wo) / len(wo):.3f}, with {sum(w) / len(w):.3f}, with − without {gap}")
    first, _, last = reproduce.thirds(rows, "extractor/reward") or (float("nan"),) * 3
    print(f"extractor reward, first → last third of its CISPO steps: {first:.2f} → {last:.2f}")


def main(run: Path, n: int):
    halves(run)
    bank = ExperienceBank.load(run / "ckpt" / "bank")
    entries = bank.entries("room")
    keys = torch.stack([bank.key(e.id) for e in entries])
    env, rng, queries, stairs = envs.make("room", show_map=False), np.random.default_rng(0), [], []
    for seed in range(n):
        env.reset(seed=seed)
        queries.append(crl.retrieval_query(env, env.map_view()))
        (x, y), found = env.pos, find_stairs(env, seed, rng)
        stairs.append(envs.offset_words(found[0] - x, found[1] - y, diagonal=True) if found else "not found")
    owners = (keys @ Embedder(None)(queries).float().T).argmax(1).tolist()
    print(f"{run}: {len(entries)} lessons in the final bank")
    for seed in range(n):
        mine = [e for e, o in zip(entries, owners) if o == seed]
        uses = sum(e.uses for e in mine)
        print(f"seed {seed}: stairs {stairs[seed]}; lessons {dict(Counter(e.text for e in mine).most_common(4))}; "
              f"used {uses}, success {sum(e.successes for e in mine) / max(uses, 1):.2f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 8)
