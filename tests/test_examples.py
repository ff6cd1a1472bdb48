"""A task of one's own (examples/parity.py, registered by envs.task) trains end to end through train.main."""
import json
import os

import train

FAST = ["--groups", "2", "--group-size", "4", "--eval-episodes", "2", "--eval-every", "1", "--max-context", "2048",
        "--warmup", "0"]


def test_the_parity_example_trains_two_iterations(tmp_path):
    """Two GRPO iterations on the tiny models: the actor's update runs (it has a loss and takes time) and
    evaluation plays the task's held-out seeds."""
    out = str(tmp_path / "parity")
    train.main(["--tasks", "examples.parity:parity", "--mode", "grpo", "--iters", "2", "--out", out, *FAST])
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [0, 1]
    assert all("actor/loss" in r and r["time/update"] > 0 for r in rows)
    assert "train/parity/success_noexp" in rows[-1] and "eval/parity/success_noexp" in rows[-1]
