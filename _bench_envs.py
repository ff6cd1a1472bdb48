"""Benchmark for envs.py (merged into bench.py as `bench.py env`): steps per second of our text wrapper
beside the raw MiniHack gymnasium env it drives, measured in the same run with the same seeds and random
actions, so the ratio is the cost of rendering text; plus Sokoban steps/s (numpy only, no reference)."""
import random
import sys
import time

import envs


def _rate(reset, step, n_actions, steps, seed=0):
    """Steps per second of random play over `steps` steps, resetting (untimed) whenever an episode ends."""
    rng = random.Random(seed)
    episode = 0
    reset(episode)
    spent = 0.0
    for _ in range(steps):
        a = rng.randrange(n_actions)
        t = time.perf_counter()
        done = step(a)
        spent += time.perf_counter() - t
        if done:
            episode += 1
            reset(episode)
    return steps / spent


def bench_minihack(task, steps):
    ours = envs.make(task, max_steps=10**6)
    raw = envs.make_minihack_raw(task)  # same engine, same observation keys, no text

    def raw_reset(seed):
        envs.seed_minihack(raw, seed)
        raw.reset()

    def raw_step(a):
        _, _, term, trunc, _ = raw.step(ours.action_index[ours.actions[a]])
        return term or trunc

    def our_reset(seed):
        ours.reset(seed)

    def our_step(a):
        return ours.step(ours.actions[a])[2]

    raw_rate = _rate(raw_reset, raw_step, len(ours.actions), steps)
    our_rate = _rate(our_reset, our_step, len(ours.actions), steps)
    return our_rate, raw_rate


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    steps = int(argv[0]) if argv else 2000
    print(f"env stepping, random actions, {steps} steps each (steps/s; higher is better)")
    print(f"{'task':10s} {'ours':>10s} {'raw gym':>10s} {'ours/raw':>9s}")
    for task in envs.MINIHACK:
        ours, raw = bench_minihack(task, steps)
        print(f"{task:10s} {ours:10.0f} {raw:10.0f} {ours / raw:9.2f}")
    soko = envs.make("sokoban", max_steps=10**6)
    rate = _rate(soko.reset, lambda a: soko.step(soko.actions[a])[2], 4, steps)
    t = time.perf_counter()
    for s in range(50):
        soko.reset(10_000 + s)
    gen = (time.perf_counter() - t) / 50
    print(f"{'sokoban':10s} {rate:10.0f} {'-':>10s} {'-':>9s}   (room generation {gen * 1e3:.1f} ms/reset)")


if __name__ == "__main__":
    main()
