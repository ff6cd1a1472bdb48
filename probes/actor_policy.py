"""Probe p7: what a trained tiny actor does on held-out room starts, by what it sees. Plays EPISODES held-out
episodes (EVAL_SEED0...) with the run's actor, sampling from its constrained policy as rollouts do, and at
every turn reads that policy exactly: each valid action's probability is the product, over its tokens, of
the model's probability renormalised over the tokens the constraint allows there (what `generate` samples,
scored as the trainer scores it).

Reports: the probability of the right move when the stairs are one move away (the stairs-stepper plays it
with probability 1), and, with nothing in view, the policy's largest probability and its entropy as a share
of the uniform policy's. Run: python -m probes.actor_policy RUN_DIR [EPISODES]
"""
import collections
import math
import os
import sys

import torch

import crl
import envs
from hf import load_tokenizer
from model import Transformer
from small import presets
from probes import ONE_MOVE, policy


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    run_dir, episodes = argv[0], int(argv[1]) if len(argv) > 1 else 40
    model = Transformer.from_pretrained(os.path.join(run_dir, "ckpt", "actor"), dtype=torch.float32).eval()
    tok = load_tokenizer("tiny")
    env = envs.make("room", show_map=False, max_steps=crl.CRLConfig(max_steps=presets.TINY["max_steps"]).steps("room"))
    gen, stats, wins = torch.Generator().manual_seed(0), collections.defaultdict(list), 0
    for ep in range(episodes):
        obs, done, reward = env.reset(seed=crl.EVAL_SEED0 + ep), False, 0
        while not done:
            p = policy(model, tok, crl.encode_chat(tok, crl.window_messages("", [], obs, 0)), env.actions)
            right = ONE_MOVE.search(obs)
            if right:
                stats["stairs one move away: P(that move)"].append(p[env.actions.index(right.group(1))].item())
            elif obs.strip() == "(nothing notable in view)":
                stats["nothing in view: largest P"].append(p.max().item())
                entropy = -(p * p.log()).sum().item()
                stats["nothing in view: entropy / ln(actions)"].append(entropy / math.log(len(p)))
            obs, reward, done, _ = env.step(env.actions[torch.multinomial(p, 1, generator=gen).item()])
        wins += reward > 0
    print(f"{run_dir}: success {wins / episodes:.3f} over {episodes} held-out episodes")
    for name, values in stats.items():
        print(f"  {name}: {sum(values) / len(values):.3f} over {len(values)} turns")


if __name__ == "__main__":
    main()
