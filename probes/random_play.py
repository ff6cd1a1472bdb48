"""A task's floor: success and end reward of a uniformly random valid action each turn on held-out instances,
beside the expert's number of actions where the game ships one (ALFWorld's walkthrough). An actor at this floor
plays no better than chance. Run: python -m probes.random_play TASK [--episodes 32] [--steps N] [--seed 0]
[--tokenizer smollm2] [--list-actions] (evaluation's instances: game seeds crl.EVAL_SEED0 + j, its split; the
observations without their action lists unless --list-actions; with a tokenizer, the tokens an episode's
observations take)."""
import argparse
import json
import random

import crl
import envs
from model import load_tokenizer


def random_play(task: str, episodes: int, steps: int, seed: int = 0, tokenizer=None, list_actions=False) -> dict:
    """Success and the reward an episode ends with, the expert's actions where known, and with a tokenizer the
    tokens an episode's observations take (mean and most: what the context must hold)."""
    env = envs.EnvPool(steps=lambda _: steps, list_actions=list_actions).take(task, train=False)
    rng, wins, rewards, expert, tokens = random.Random(seed), 0, [], [], []
    for j in range(episodes):
        seen = [env.reset(seed=crl.EVAL_SEED0 + j)]
        if hasattr(env, "walkthrough"):
            expert.append(len(env.walkthrough()))
        done, info, reward = False, {}, 0.0
        while not done:
            obs, reward, done, info = env.step(rng.choice(env.actions))
            seen.append(obs)
        wins += bool(info.get("success"))
        rewards.append(reward)
        if tokenizer is not None:
            tokens.append(sum(len(tokenizer.encode(o)) for o in seen))
    out = {"task": task, "episodes": episodes, "steps": steps, "random_success": wins / episodes,
           "random_reward": sum(rewards) / episodes}
    if tokens:
        out.update(observation_tokens_mean=sum(tokens) / len(tokens), observation_tokens_max=max(tokens))
    return {**out, "expert_steps_mean": sum(expert) / len(expert)} if expert else out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("task", choices=envs.TASKS)
    p.add_argument("--episodes", type=int, default=32)
    p.add_argument("--steps", type=int, default=None, help="actions an episode (default: the task's own)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer", default=None, help="count each episode's observation tokens with this "
                                                     "checkpoint's tokenizer (e.g. smollm2)")
    p.add_argument("--list-actions", action="store_true", help="observations with their list of valid actions")
    a = p.parse_args()
    tok = load_tokenizer(a.tokenizer) if a.tokenizer else None
    print(json.dumps(random_play(a.task, a.episodes, a.steps or envs.task_steps(a.task), a.seed, tok,
                                 a.list_actions)))
