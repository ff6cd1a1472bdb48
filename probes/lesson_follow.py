"""How often an actor plays the move a lesson names, on held-out starts: the probe of whether lessons can
reach the actor at all. Run: python -m probes.lesson_follow [--run RUN_DIR] [--task TASK]
[--starts N] [--moves-before K] [train.py flags that shape the prompt: --actor, --lesson-turn, --no-map, ...,
and --lesson-prior, which first trains the actor's lesson prior (prior.py), here in fp32].

For each of N held-out starts (EVAL_SEED0...), after K random moves played in the episode's context (the
whole episode, or the --history window, as rollouts build it), it reads the actor's exact constrained
policy over the 8 moves (probes.policy) with no lesson, and with each one-move lesson `MOVE` (what
the extractor writes with --lesson-moves 1), placed where the settings put it. Reports P(move | lesson
names it) against P(move | no lesson), and per move. With --run, the run's flags and trained actor. On the
vault a move is a door.
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
from prior import teach_lessons
from probes import policy


def prompt_tokens(tok, cfg, env, task: str, history: list, obs: str, lesson: list[str]) -> list[int]:
    """The actor's context at this turn, built as crl's rollout builds it (the opening turn carries the lesson)."""
    first = history[0][0] if history else obs
    system, opened = crl.actor_opening(cfg, env, lesson, first, can_ask=False)
    if history:
        history = [(opened, history[0][1])] + history[1:]
    else:
        obs = opened
    window = cfg.window(task)
    h = len(history) if window is None else window
    return crl.encode_chat(tok, crl.window_messages(system, history, obs, h))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", help="a run directory: its flags (args.json) and its trained actor (ckpt/actor)")
    p.add_argument("--task", choices=[*envs.MINIHACK, "vault"], help="default: the run's first, else room")
    p.add_argument("--starts", type=int, default=24)
    p.add_argument("--moves-before", type=int, default=0, help="random moves played before the turn measured")
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
    for i in range(mine.starts):
        obs, history = env.reset(seed=crl.EVAL_SEED0 + i), []
        for _ in range(mine.moves_before):
            move = rng.choice(env.actions)
            history.append((obs, move))
            obs, _, done, _ = env.step(move)
            if done:   # a walk that ended the episode: measure from a fresh start instead
                obs, history = env.reset(seed=crl.EVAL_SEED0 + i), []
        actions = tuple(env.actions)
        base.append(policy(model, tok, prompt_tokens(tok, cfg, env, task, history, obs, []), actions))
        for j, move in enumerate(actions):
            prompt = prompt_tokens(tok, cfg, env, task, history, obs, [move])
            follow[move].append(policy(model, tok, prompt, actions)[j].item())
    base = torch.stack(base).mean(0)
    lifted = sum(sum(v) for v in follow.values()) / sum(len(v) for v in follow.values())
    print(f"{mine.run or args.actor} on {task} (lesson_turn={cfg.lesson_turn}, map={cfg.show_map}, "
          f"instructions={cfg.instructions}, history={cfg.history}, {mine.moves_before} moves before, "
          f"{mine.starts} starts): P(move | lesson names it) {lifted:.3f}, P(move | no lesson) {base.mean():.3f}")
    for j, move in enumerate(actions):
        print(f"  {move:>9}: with lesson {sum(follow[move]) / len(follow[move]):.3f}, without {base[j]:.3f}")


if __name__ == "__main__":
    main()
