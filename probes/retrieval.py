"""Retrieval precision before any RL: is a vault served a lesson that holds its door? Run:
python -m probes.retrieval [--tasks vault-family,vault-family16,vault] [--lessons 64] [--queries 256] [--iters 20]

For each task, a bank of one lesson (its door, as --extractor oracle writes it) for each of `--lessons` training
vaults, drawn as training draws them, keyed and added as training adds them (the embedding of
crl.retrieval_query(env, first observation), an "add" Operation through ExperienceManager.apply), default bank
settings (BankConfig: the re-rank, no cosine floor). Then it is read by crl.retrieve, top 1:
- held out: each held-out panel's vaults (Task.panels: the family vault's transfer and control), as evaluation
  reads (the bank read-only);
- training: `--iters` iterations of fresh training vaults, as training reads (shows counted, the re-rank's
  penalties and its top-1 dropout at work).
Printed per task and panel: `family`, the share of served lessons written in a vault of the reader's family
(the family vault's retrieval precision), and `door`, the share that name the reader's door (on the plain vault,
whose doors no two names share, ~1/8 by construction; on the control, where no lesson can be right, about its
share of the nearest seen family's door).
"""
import argparse
import dataclasses
import json
from types import SimpleNamespace

import numpy as np

import crl
import envs
from bank import ExperienceBank, ExperienceManager, Operation
from embedder import Embedder


def family(task: str, seed: int) -> str | None:
    name = envs.TASKS[task].name_of(seed)
    return envs.vault_family(name) if issubclass(envs.TASKS[task], envs.VaultFamily) else None


def episodes(task: str, seeds) -> list:
    """With-experience episodes of these vaults, their queries as a rollout keys them."""
    env, eps = envs.make(task), []
    for seed in seeds:
        eps.append(crl.Episode(task, seed, 0, True, query=crl.retrieval_query(env, env.reset(seed))))
    return eps


def filled_bank(run, task: str, n: int):
    rng = np.random.default_rng([run.seed, crl.INSTANCES])
    eps = episodes(task, [envs.draw_training_seed(task, rng, crl.EVAL_SEED0) for _ in range(n)])
    keys = run.manager.embed([e.query for e in eps])
    run.manager.apply([Operation("add", task, envs.answer(task, e.seed), (), key, -1, 0, origin=e.seed)
                       for e, key in zip(eps, keys)])


def precision(task: str, eps) -> dict:
    served = [(e.seed, e.origins[0]) for e in eps if e.origins]
    return {"family": np.mean([family(task, s) == family(task, o) for s, o in served]) if family(task, 0) else None,
            "door": np.mean([envs.answer(task, s) == envs.answer(task, o) for s, o in served]),
            "served": len(served) / len(eps)}


def probe(task: str, embedder, lessons: int, queries: int, iters: int, seed: int = 0) -> dict:
    cfg = crl.CRLConfig()
    bank = ExperienceBank(embedder.dim, **dataclasses.asdict(cfg.bank))
    run = SimpleNamespace(cfg=cfg, manager=ExperienceManager(bank, embedder, sync=True), seed=seed, step=0)
    filled_bank(run, task, lessons)
    out = {}
    for panel, seeds in envs.held_out_panels(task, queries, crl.EVAL_SEED0).items():
        eps = episodes(task, seeds)
        crl.retrieve(run, eps, train=False)
        out[f"held_out{'/' + panel if panel else ''}"] = precision(task, eps)
    rng, trained = np.random.default_rng([seed, 1, crl.INSTANCES]), []
    for run.step in range(iters):
        eps = episodes(task, [envs.draw_training_seed(task, rng, crl.EVAL_SEED0) for _ in range(lessons // 4)])
        crl.retrieve(run, eps, train=True)
        trained += eps
    out["training"] = precision(task, trained)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", default="vault-family,vault-family16,vault")
    p.add_argument("--lessons", type=int, default=64, help="training vaults with a lesson in the bank")
    p.add_argument("--queries", type=int, default=256, help="held-out vaults per panel")
    p.add_argument("--iters", type=int, default=20, help="training iterations read, --lessons/4 vaults each")
    p.add_argument("--embedder", default=None, help="default: the bundled all-MiniLM-L6-v2")
    a = p.parse_args(argv)
    embedder = Embedder(a.embedder)
    for task in a.tasks.split(","):
        for where, m in probe(envs.load_task(task), embedder, a.lessons, a.queries, a.iters).items():
            print(json.dumps({"task": task, "read": where, **{k: None if v is None else round(float(v), 3)
                                                              for k, v in m.items()}}))


if __name__ == "__main__":
    main()
