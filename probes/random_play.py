"""A task's floor: success of a uniformly random valid action each turn on held-out instances, beside the
expert's number of actions where the game ships one (ALFWorld's walkthrough). An actor at this floor plays
no better than chance. Run: python -m probes.random_play TASK [--episodes 32] [--steps N] [--seed 0]
(evaluation's instances: game seeds crl.EVAL_SEED0 + j, its split, the run's view of ALFWorld without its list)."""
import argparse
import json
import random

import crl
import envs


def random_play(task: str, episodes: int, steps: int, seed: int = 0) -> dict:
    env = envs.EnvPool(steps=lambda _: steps, list_actions=False).take(task, train=False)
    rng, wins, expert = random.Random(seed), 0, []
    for j in range(episodes):
        env.reset(seed=crl.EVAL_SEED0 + j)
        if hasattr(env, "walkthrough"):
            expert.append(len(env.walkthrough()))
        done, info = False, {}
        while not done:
            _, _, done, info = env.step(rng.choice(env.actions))
        wins += bool(info.get("success"))
    out = {"task": task, "episodes": episodes, "steps": steps, "random_success": wins / episodes}
    return {**out, "expert_steps_mean": sum(expert) / len(expert)} if expert else out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("task", choices=envs.TASKS)
    p.add_argument("--episodes", type=int, default=32)
    p.add_argument("--steps", type=int, default=None, help="actions an episode (default: the task's own)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    print(json.dumps(random_play(a.task, a.episodes, a.steps or envs.task_steps(a.task), a.seed)))
