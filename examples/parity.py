"""A task of your own: the digits of a number are shown; reply `even` or `odd`, the parity of their sum (reward 1
if right). All a task needs is what envs.Task states. Train it: python train.py --tasks examples.parity:parity;
play it: python envs.py play examples.parity:parity."""
import random

from envs import Task, begin_step, invalid_text, task


@task("parity")
class Parity(Task):
    instruction = "Add up the digits shown. Reply even if their sum is even, odd if it is odd. Actions: even, odd."
    actions = ("even", "odd")
    budget = 3   # an invalid reply uses a step: two more tries to reply even or odd

    def __init__(self, seed=None, max_steps: int = budget, digits: int = 6):
        self.max_steps, self.digits = max_steps, digits
        self._rng, self.done = random.Random(seed), True

    def reset(self, seed=None) -> str:
        seed = self._rng.randrange(2**63) if seed is None else seed   # reset(seed): the same number every time
        self.number = str(random.Random(seed).randrange(10**self.digits)).zfill(self.digits)
        self.steps, self.done = 0, False
        return f"Digits: {' '.join(self.number)}."

    def step(self, reply: str):
        action, info = begin_step(self, reply)   # refuses a finished episode, counts the step, parses the reply
        right = "odd" if sum(map(int, self.number)) % 2 else "even"
        info["success"] = action == right
        self.done = action is not None or self.steps >= self.max_steps
        obs = invalid_text(reply, self.actions) if action is None else f"The sum is {right}."
        return obs, float(info["success"]), self.done, info
