"""prior.py — the tiny actor's lesson prior (train.py --lesson-prior): supervised steps that teach a fresh tiny
actor to play the first move of a lesson in its prompt, before RL. Not in the paper; for the tiny model, which
reads lessons only after it."""
import random

import torch
from tqdm import tqdm

import crl
import envs
from update import pad_segments


def teach_lessons(model, tok, cfg: crl.CRLConfig, tasks: list[str], steps: int, seed: int, batch: int = 32):
    """The tiny actor's lesson-following prior: cross-entropy on the first move of a random lesson (a plan
    of the task's action words, as --lesson-moves writes them) in prompts built exactly as rollouts build
    them, over observations of random play. It teaches no task skill: the lesson is random, so the target
    is unrelated to the game; half the prompts carry no lesson and a random move as the target, which keeps
    the lesson-free policy near uniform (the init RL explores from)."""
    rng, pool = random.Random(seed), envs.EnvPool(cfg.show_map, cfg.steps, list_actions=cfg.list_actions)
    games = {task: pool.take(task) for task in tasks}   # one env per task, reset for every example
    examples = []
    for _ in range(batch * 32):
        task = rng.choice(tasks)
        examples.append(lesson_example(tok, cfg, games[task], task, rng))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    for _ in tqdm(range(steps), desc="lesson prior", unit="step", disable=crl.rank() != 0):
        tokens, mask, _ = pad_segments(rng.sample(examples, batch), "cpu")
        logits = model(tokens[:, :-1]).float()
        loss = torch.nn.functional.cross_entropy(logits[mask[:, 1:]], tokens[:, 1:][mask[:, 1:]])
        opt.zero_grad()
        loss.backward()
        opt.step()


def lesson_example(tok, cfg: crl.CRLConfig, env, task: str, rng: random.Random) -> crl.Segment:
    """An observation after a few random moves and, half the time, a random lesson in the system prompt with
    its first move as the reply (the trained tokens); else no lesson and a random move."""
    obs = env.reset(seed=rng.randrange(crl.EVAL_SEED0))
    for _ in range(rng.randrange(cfg.steps(task))):
        obs, _, done, _ = env.step(rng.choice(env.actions))
        if done:
            obs = env.reset(seed=rng.randrange(crl.EVAL_SEED0))
    plan = [rng.choice(env.actions) for _ in range(rng.randint(1, max(1, cfg.lesson_moves)))]
    lessons = [" ".join(plan)] if rng.random() < 0.5 else []
    plan[0] = plan[0] if lessons else rng.choice(env.actions)
    system, obs = crl.actor_opening(cfg, env, lessons, obs, False)
    example = crl.Segment()
    example.extend(crl.encode_chat(tok, crl.window_messages(system, [], obs, 0)))
    example.extend(tok.encode(plan[0], add_special_tokens=False) + [tok.eos_token_id], mask=True)
    return example
