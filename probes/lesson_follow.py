"""How often an actor plays the move a lesson names, on held-out starts: the probe of whether lessons can
reach the actor at all. Run: python -m probes.lesson_follow [--run RUN_DIR] [--task TASK]
[--starts N] [--moves-before K] [train.py flags that shape the prompt: --actor, --lesson-turn, --no-map, ...,
and --lesson-prior, which first trains the actor's lesson prior (prior.py), here in fp32].

For each of N held-out starts (EVAL_SEED0...), after K random moves played in the episode's context (the
whole episode, or the --history window, as rollouts build it), it reads the actor's exact constrained
policy over the 8 moves (probes.policy) with no lesson, and with each one-move lesson `MOVE` (what
the extractor writes with --lesson-moves 1), placed where the settings put it. Reports P(move | lesson
names it) against P(move | no lesson), and per move. With --run, the run's flags and trained actor. On the
vault a move is a door. With --moved-on it also plays each lesson's move and, where the episode goes on, reads
P(a move not yet played) at the next turn, with that lesson and without one: whether the actor leaves a wrong
lesson's door once it is locked, or plays it again.
"""
import argparse
import os
import random

import torch

import crl
import envs
import train
from hf import load_tokenizer
from model import Transformer
from prior import rollout_prompt, teach_lessons
from probes import policy


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", help="a run directory: its flags (args.json) and its trained actor (ckpt/actor)")
    p.add_argument("--task", choices=[*envs.MINIHACK, "vault"], help="default: the run's first, else room")
    p.add_argument("--starts", type=int, default=24)
    p.add_argument("--moves-before", type=int, default=0, help="random moves played before the turn measured")
    p.add_argument("--moved-on", action="store_true", help="also read the turn after the lesson's move was played")
    mine, rest = p.parse_known_args(argv)
    args = train.parse_args([*rest, "--out", mine.run, "--resume"] if mine.run else rest)   # the run's flags
    cfg = train.config_from(args)
    spec = os.path.join(mine.run, "ckpt", "actor") if mine.run else args.actor
    model, tok = Transformer.from_pretrained(spec, dtype=torch.float32), load_tokenizer(spec)
    task = mine.task or (args.tasks[0] if mine.run else "room")
    if args.lesson_prior and not mine.run:
        teach_lessons(model, tok, cfg, [task], args.lesson_prior, args.seed, args.actor != "tiny")
    model.eval()
    env = envs.EnvPool(cfg.show_map, cfg.steps).take(task, train=False)
    rng, base, follow = random.Random(0), [], {a: [] for a in env.actions}
    moved = {a: ([], []) for a in env.actions}   # P(a move not yet played) at the next turn, with / without lesson
    for i in range(mine.starts):
        obs, history = env.reset(seed=crl.EVAL_SEED0 + i), []
        for _ in range(mine.moves_before):
            move = rng.choice(env.actions)
            history.append((obs, move))
            obs, _, done, _ = env.step(move)
            if done:   # a walk that ended the episode: measure from a fresh start instead
                obs, history = env.reset(seed=crl.EVAL_SEED0 + i), []
        actions = tuple(env.actions)
        base.append(policy(model, tok, rollout_prompt(tok, cfg, env, task, history, obs, []), actions))
        for j, move in enumerate(actions):
            prompt = rollout_prompt(tok, cfg, env, task, history, obs, [move])
            follow[move].append(policy(model, tok, prompt, actions)[j].item())
        for move in actions if mine.moved_on else ():
            env.reset(seed=crl.EVAL_SEED0 + i)
            for _, m in history:
                env.step(m)
            after, _, done, _ = env.step(move)
            if done:   # the lesson's move ended the episode (on the vault: the lesson was right)
                continue
            turns = history + [(obs, move)]
            fresh = [k for k, a in enumerate(actions) if a not in {m for _, m in turns}]
            for lesson, out in zip(([move], []), moved[move]):
                prompt = rollout_prompt(tok, cfg, env, task, turns, after, lesson)
                out.append(policy(model, tok, prompt, actions)[fresh].sum().item())
    base = torch.stack(base).mean(0)
    lifted = sum(sum(v) for v in follow.values()) / sum(len(v) for v in follow.values())
    print(f"{mine.run or args.actor} on {task} (lesson_turn={cfg.lesson_turn}, map={cfg.show_map}, "
          f"instructions={cfg.instructions}, history={cfg.history}, {mine.moves_before} moves before, "
          f"{mine.starts} starts): P(move | lesson names it) {lifted:.3f}, P(move | no lesson) {base.mean():.3f}")
    for j, move in enumerate(actions):
        print(f"  {move:>9}: with lesson {sum(follow[move]) / len(follow[move]):.3f}, without {base[j]:.3f}")
    if mine.moved_on:
        with_, without = ([x for a in actions for x in moved[a][k]] for k in (0, 1))
        print(f"after the lesson's move was played and the episode went on ({len(with_)} plays): P(a move not yet "
              f"played) {sum(with_) / len(with_):.3f} with the lesson, {sum(without) / len(without):.3f} without")


if __name__ == "__main__":
    main()
