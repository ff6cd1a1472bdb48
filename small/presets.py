"""The small models' settings and the tiny actor's lesson prior: what a 2-core CPU needs to run the method at
all, apart from the method itself. train.py applies a preset where the command line does not set a value."""
import random

import torch
from tqdm import tqdm

import crl
import envs
import parallel

# Presets: settings that differ from the defaults of train.RunConfig and crl.CRLConfig (the authors' setup for real
# checkpoints), applied where the command line does not set them, chosen by the model named. TINY (--actor tiny)
# is sized for a 2-core CPU: about 5 s an iteration, under 30 minutes a run. The warm-up, the CISPO batch and the
# distillation of every with-experience episode are the release's (5, 64, all): nothing measured favoured the 2,
# 32 and 2 a group the earlier runs used.
TINY = dict(lr=3e-4, extractor_lr=1e-3, groups=8, free_text=False, history=0, max_reply_tokens=16,
            max_context=6144, extractor_reply_tokens=24, episode_chars=400,
            micro_batch=16, eval_every=30, iters=270, instructions=False, show_map=False,
            max_steps="room=10,maze=10", judge="none",   # a model trained from scratch never learns to judge: no verdict is trained
            dtype=None)   # not auto: fp32 on any CPU (the tiny results are fp32 runs), bf16 on CUDA
TINY_EXTRACTOR = dict(extractor_free_text=False)   # --extractor tiny
# SMOLLM2 (--actor smollm2, the 135M instruct model), each value measured on a 2-core CPU (results/smollm2/): the
# lesson as a tip opening the first user turn, without the task text (followed 0.51 of the time against 0.18 at
# the end of the system prompt; chance 0.125), replies constrained to the actions, lr 1e-5 (tuned on the GRPO
# baseline's training success; 1e-4 collapsed), a budget a CPU grid cell can afford, and 64
# evaluation episodes at once (256 peaked at 20 GB and were killed inside a trained run; 64: 7 GB, and faster).
# MiniHack's map stays in the view and the warm-up is 5, as in the release: the first-turn tip was followed 0.533
# of the time with the map and 0.514 with the words view the earlier runs used (12 starts, within the 0.04 of two
# runs of one setting), and nothing measured the warm-up. No judgement of lessons (probes/judge.py, 32 held-out
# room starts and 32 vaults): constrained to accept/reject it accepts 0.02-0.04 of lessons, right or wrong alike
# (differences -0.003, +0.001), and free text never parses as a verdict (0 of 512), so either way it would drop
# nearly every lesson. The compute dtype is --dtype auto's: the
# preset's bf16 was measured on an AVX-512 BF16 CPU, where it is faster; on an AVX2 one it trains ~6x slower.
# Per task: the room, maze and vault grids ran 10 actions (every other task plays its own budget); the whole
# episode stays in context, KV cache kept, up to SmolLM2's own 8,192 positions. ALFWorld's and WebShop's
# observations go without their list of valid actions (the replies are constrained to it anyway): with it 30
# ALFWorld actions outgrew 8,192 positions (350 tokens a turn) and 10 WebShop pages did (a random walk's
# observations: 4,180 tokens on average, 10,850 at most; without it 3,254 and 6,530), and WebShop kept only its
# last 2 turns, re-read every turn (564 s an iteration; whole episodes without the list: 189-206 s, none cut); a
# micro-batch holds at most 8,192 padded tokens (eight 30-action Sokoban episodes in one took 19 GB and were killed).
SMOLLM2 = dict(lr=1e-5, extractor_lr=1e-5, groups=2, group_size=8, free_text=False, lesson_turn=True,
               instructions=False, list_actions=False, max_steps="room=10,maze=10,vault=10",
               max_context=8192, micro_batch=8, micro_tokens=8192, eval_every=10, eval_episodes=32,
               eval_batch=64, iters=60, judge="none")
# --extractor smollm2: free text fails its format (hundreds of parse failures an iteration), so the heads are
# constrained, a lesson is one move word (which the actor above follows), and it must write one (a NONE is never
# credited: --extractor-none never). A CISPO step waits for 16 credited generations, not the release's 64: the
# vault runs credit 1.55-1.95 generations an iteration (results/smollm2-vault), so at 64 a 60-iteration run takes
# one step, and the CISPO probe needs 20-70 steps of 16 (results/cispo-vault)
SMOLLM2_EXTRACTOR = dict(extractor_free_text=False, lesson_moves=1, extractor_none="never", extractor_reply_tokens=16,
                         episode_chars=1500, distill_per_group=4, extractor_batch=16)
PRESETS = {"tiny": (TINY, TINY_EXTRACTOR), "smollm2": (SMOLLM2, SMOLLM2_EXTRACTOR)}   # name: (actor, extractor)


# ---------------------------------------------------------------------------------------------------------
# The tiny actor's lesson prior (--lesson-prior)

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
        tokens, mask, _ = parallel.pad_segments(rng.sample(examples, batch), "cpu")
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
