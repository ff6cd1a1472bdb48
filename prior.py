"""prior.py — the actor's lesson prior (train.py --lesson-prior): supervised steps that teach the actor to play the
first move of a lesson in its prompt, and a pretrained one to move on once that move is played, before RL. Not in
the paper; for the small models, which read lessons only after it: the fresh tiny actor, and SmolLM2-135M, which on
the vault plays a one-door lesson 0.50 of the time (0.83-0.88 for the doors it opens unprompted, 0.17-0.24 for the
others) and plays the lesson's door again once it is locked 0.74 of the time.

The prior is the same for every mode of a seed (the grid's shared init), so its result is kept in a cache
($CRL_CACHE, default ~/.cache/crl/prior/), under a key of everything it is computed from: the starting weights, the
examples' tokens, its steps, batch and rate, the torch version, the device and its kernels, and the source of the
files that compute it. A run that finds its key there loads those weights, bit for bit what it would have trained
(a single process; under torchrun each rank trains its own)."""
import hashlib
import os
import random

import torch
from tqdm import tqdm

import crl
import envs
from model import token_logprobs
from update import pad_segments


def teach_lessons(model, tok, cfg: crl.CRLConfig, tasks: list[str], steps: int, seed: int, pretrained: bool):
    """The actor's lesson-following prior: cross-entropy on the first move of a random lesson (a plan of the task's
    action words, as --lesson-moves writes them; one move for a pretrained actor) in prompts built exactly as
    rollouts build them, over observations of random play. It teaches no task skill: the lesson is random, so the
    target is unrelated to the game. For the fresh tiny actor half the prompts carry no lesson and a random move as
    the target, which keeps its lesson-free policy near uniform (the init RL explores from). A pretrained actor sees
    a lesson in every opening, at a small step (random opening targets swung SmolLM2's lesson-free policy onto one
    door whatever the lesson, lr 1e-5 to 1e-4), and half its examples are later turns of the episode, built as
    rollouts build them: taught only openings, it played a wrong lesson's door again after it was locked (382 of 384
    such plays, results/vault-prior/credit-trace/)."""
    batch, lr = (16, 2e-5) if pretrained else (32, 1e-3)
    rng, pool = random.Random(seed), envs.EnvPool(cfg.show_map, cfg.steps, list_actions=cfg.list_actions)
    games = {task: pool.take(task) for task in tasks}   # one env per task, reset for every example
    examples = []
    for _ in range(batch * 32):
        task = rng.choice(tasks)
        examples.append(episode_example(tok, cfg, games[task], task, rng) if pretrained
                        else lesson_example(tok, cfg, games[task], task, rng))
    # one process only: under torchrun every rank trains its own (a sharded model's state is not one file)
    path = cached(model, examples, (steps, batch, lr, rng.getstate())) if crl.world() == 1 else None
    if path and os.path.exists(path):
        model.load_state_dict(torch.load(path, map_location=next(model.parameters()).device, weights_only=True))
        return
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    for _ in tqdm(range(steps), desc="lesson prior", unit="step", disable=crl.rank() != 0):
        tokens, mask, _ = pad_segments(rng.sample(examples, batch), next(model.parameters()).device)
        loss = -token_logprobs(model, tokens, mask)[mask].mean()   # cross-entropy on the replies' tokens
        opt.zero_grad()
        loss.backward()
        opt.step()
    if path:   # whole or not at all
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.save(model.state_dict(), path + ".tmp")
        os.replace(path + ".tmp", path)


SOURCES = ("prior.py", "model.py", "update.py", "parallel.py")   # the code the prior's computation runs


def cached(model, examples: list, schedule: tuple) -> str:
    """Where the prior of this model on these examples is kept: a hash of the starting weights, every example's
    tokens and trained positions, the schedule (steps, batch, rate, the sampler's state), the torch version, the
    device (a CPU's vector width and threads choose its kernels' rounding), and the source of the code that computes
    it, so any change to what it would compute is a new key."""
    device = next(model.parameters()).device
    h = hashlib.sha256(repr((schedule, torch.__version__, str(device), torch.backends.cpu.get_cpu_capability(),
                             torch.get_num_threads(), torch.cuda.get_device_name(device) if device.type == "cuda"
                             else "")).encode())
    for name, p in model.state_dict().items():
        raw = p.detach().cpu().contiguous().flatten().view(torch.uint8)   # any dtype, bf16 too, as its bytes
        h.update(name.encode() + str(p.dtype).encode() + raw.numpy().tobytes())
    for e in examples:
        h.update(repr((e.tokens, e.mask)).encode())
    here = os.path.dirname(os.path.abspath(__file__))
    for f in SOURCES:
        h.update(open(os.path.join(here, f), "rb").read())
    root = os.environ.get("CRL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "crl")
    return os.path.join(root, "prior", h.hexdigest()[:32] + ".pt")


def lesson_example(tok, cfg: crl.CRLConfig, env, task: str, rng: random.Random) -> crl.Segment:
    """The tiny actor's example: an observation after a few random moves and, half the time, a random lesson in
    the prompt with its first move as the reply (the trained tokens); else no lesson and a random move."""
    obs = env.reset(seed=rng.randrange(crl.EVAL_SEED0))
    for _ in range(rng.randrange(cfg.steps(task))):
        obs, _, done, _ = env.step(rng.choice(env.actions))
        if done:
            obs = env.reset(seed=rng.randrange(crl.EVAL_SEED0))
    plan = [rng.choice(env.actions) for _ in range(rng.randint(1, max(1, cfg.lesson_moves)))]
    lessons = [" ".join(plan)] if rng.random() < 0.5 else []
    plan[0] = plan[0] if lessons else rng.choice(env.actions)
    return taught(tok, rollout_prompt(tok, cfg, env, task, [], obs, lessons), plan[0])


def episode_example(tok, cfg: crl.CRLConfig, env, task: str, rng: random.Random) -> crl.Segment:
    """A pretrained actor's example, its prompt as a rollout builds it: a random one-move lesson opens the
    episode; at the opening the target is the lesson's move, at a later turn (half the examples), after the
    lesson's move and up to one other were played, a move the episode has not played yet (on the vault, a door
    not yet tried), with the lesson in the opening or, for half of them, none."""
    obs = env.reset(seed=rng.randrange(crl.EVAL_SEED0))
    lesson, history = rng.choice(env.actions), []
    if rng.random() < 0.5:
        played = [lesson, *rng.sample([a for a in env.actions if a != lesson], rng.randint(0, 1))]
        for move in played:
            history.append((obs, move))
            obs, _, done, _ = env.step(move)
            if done:   # the lesson was right, or the game ended: teach the opening instead
                return episode_example(tok, cfg, env, task, rng)
        target = rng.choice([a for a in env.actions if a not in played])
        lessons = [lesson] if rng.random() < 0.5 else []
    else:
        target, lessons = lesson, [lesson]
    return taught(tok, rollout_prompt(tok, cfg, env, task, history, obs, lessons), target)


def taught(tok, prompt: list[int], move: str) -> crl.Segment:
    """A prompt and the move taught as its reply: only the reply's tokens are trained."""
    example = crl.Segment()
    example.extend(prompt)
    example.extend(tok.encode(move, add_special_tokens=False) + [tok.eos_token_id], mask=True)
    return example


def rollout_prompt(tok, cfg: crl.CRLConfig, env, task: str, history: list, obs: str, lessons: list[str]) -> list[int]:
    """The actor's context at this turn as crl's rollout builds it: the opening carries the lessons, then the
    (observation, reply) turns within the history window, then the new observation."""
    first = history[0][0] if history else obs
    system, opened = crl.actor_opening(cfg, env, lessons, first, can_ask=False)
    if history:
        history = [(opened, history[0][1])] + history[1:]
    else:
        obs = opened
    window = cfg.window(task)
    return crl.encode_chat(tok, crl.window_messages(system, history, obs, len(history) if window is None else window))
