"""Games in worker processes (envs.GameWorkers, --env-workers): the same seeds and replies give the same
episodes as the games played in the trainer's process, for any number of workers, and a game that fails in
a worker fails the call with the worker's traceback."""
import random

import pytest
import torch

import crl
import envs
from test_crl import tiny_run


def play_both(task: str, seeds: list[int], workers: int, steps: int, **kw):
    """Random valid replies (plus one unparseable) played on in-process games and on worker games in
    lockstep; every result and the views the trainer reads must agree."""
    local = envs.EnvPool(workers=0)
    remote = envs.EnvPool(workers=workers)
    a = [local.take(task) for _ in seeds]
    b = [remote.take(task) for _ in seeds]
    obs = local.reset_all(a, seeds)
    assert remote.reset_all(b, seeds) == obs
    for x, y in zip(a, b):
        assert (y.instruction, y.actions, y.failure_reward) == (x.instruction, tuple(x.actions),
                                                                getattr(x, "failure_reward", 0.0))
    rng, playing, results = random.Random(0), list(range(len(seeds))), []
    for t in range(steps):
        replies = ["no such action" if t == 1 else rng.choice(list(a[i].actions)) for i in playing]
        mine = local.step_all([a[i] for i in playing], replies)
        assert remote.step_all([b[i] for i in playing], replies) == mine
        assert [b[i].actions for i in playing] == [tuple(a[i].actions) for i in playing]
        results += mine
        playing = [i for i, (_, _, done, _) in zip(playing, mine) if not done]
    return results


@pytest.mark.parametrize("task,workers", [("room", 2), ("room", 3), ("sokoban", 2), ("alfworld", 2)])
def test_worker_games_play_as_local_games(task, workers):
    play_both(task, seeds=[0, 1, 2, 5, 7], workers=workers, steps=6)


def test_worker_webshop_plays_as_local():
    results = play_both("webshop", seeds=[0, 3, 4], workers=2, steps=3)
    assert len(results) >= 7


def test_rollouts_with_workers_equal_rollouts_without():
    """The whole path through crl.rollout: tokens, rewards and transcripts equal for 0, 1 and 3 workers."""
    specs = [("room", s, s // 2, False) for s in range(6)]
    outs = []
    for workers in (0, 1, 3):
        run = tiny_run(env_workers=workers)
        eps = crl.rollout(run, specs, torch.Generator().manual_seed(3), 1.0)
        outs.append([(e.transcript, e.reward, e.success, e.turns, [s.tokens for s in e.segments]) for e in eps])
    assert any(o[1] for o in outs[0]), "no episode won: the comparison would miss the reward path"
    assert outs[1] == outs[0] and outs[2] == outs[0]


def test_a_failing_game_fails_the_call_with_the_workers_traceback():
    workers = envs.GameWorkers(2)
    with pytest.raises(ValueError, match="unknown task 'nope'"):   # refused before a worker is asked
        workers.make("nope")
    with pytest.raises(RuntimeError, match="vault needs tries >= 1"):   # raised in the worker, its traceback here
        workers.make("vault", tries=0)
    game = workers.make("sokoban")   # the workers still answer after a failure
    assert "box" in game.reset(seed=1)
