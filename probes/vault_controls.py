"""The vault's controls: does an actor use a lesson that holds the answer, and does a wrong one not help? Run:
python -m probes.vault_controls [--run RUN_DIR] [--instances N] [train.py flags: --actor smollm2 ...]

For N held-out vaults it builds a bank with one lesson per vault, keyed by that vault's retrieval query,
written as the run's extractor writes lessons (a door word with --lesson-moves, else a sentence naming the
vault and its door):
- oracle: each vault's own secret;
- shuffled: the next vault's secret (what a wrong retrieval hands the actor; equal to the right door by chance).
Each bank is read by crl's evaluation (retrieval, judgement, rollout) and the probe reports success with and
without the lesson, how often the first door tried is the lesson's, and the retrieval's same-instance share.
Without memory the best success is 3/8 (envs.VAULT_MEMORYLESS_BEST); an actor that follows the oracle wins
every time it does. Last, the extractor's side: from scripted won and lost episodes, how often its lesson names
the door that opened (a won one), or one of the wrong doors tried (a lost one).
"""
import argparse

import crl
import envs
import metrics
import train
from bank import ExperienceBank, Operation


def lesson(cfg, env, door: str) -> str:
    return door if cfg.lesson_moves else f"In the {env.name} vault the {door} door opens."


def vault_bank(run, instances: int, shift: int) -> tuple[ExperienceBank, list[str]]:
    """One lesson per held-out vault: the secret of vault (j + shift) mod N, keyed by vault j's query."""
    games = [envs.make("vault") for _ in range(instances)]
    queries = [crl.retrieval_query(env, env.reset(seed=crl.EVAL_SEED0 + j)) for j, env in enumerate(games)]
    bank = ExperienceBank(run.manager.bank.dim)
    keys = run.manager.embed(queries)
    bank.apply([Operation("add", "vault", lesson(run.cfg, games[j], games[(j + shift) % instances].secret),
                          key=keys[j], origin=crl.EVAL_SEED0 + (j + shift) % instances) for j in range(instances)])
    return bank, [games[(j + shift) % instances].secret for j in range(instances)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", help="a run directory: its flags (args.json) and its trained models (ckpt/)")
    p.add_argument("--instances", type=int, default=64)
    mine, rest = p.parse_known_args(argv)
    args = train.parse_args([*rest, "--out", mine.run, "--resume"] if mine.run else [*rest, "--tasks", "vault"])
    device = train.setup_distributed(args)
    run, _ = train.build(args, device, train.model_dtype(args, device))
    if run.manager is None:
        raise SystemExit("vault_controls needs a run with a bank: --mode crl, static or exp-only")
    run.timer, run.counters = {}, {}
    secrets = [(env.reset(seed=crl.EVAL_SEED0 + j), env.secret)[1] for j, env in
               enumerate(envs.make("vault") for _ in range(mine.instances))]
    for name, shift in (("oracle", 0), ("shuffled", 1)):
        run.manager.bank, told = vault_bank(run, mine.instances, shift)
        specs = crl.held_out_specs(run, ["vault"], mine.instances)
        eps = crl.play_held_out(run, specs, crl.EVAL_STEP)
        exp = [e for e in eps if e.with_exp]
        first = [next((text for who, text in e.transcript if who == "agent"), "").strip() for e in exp]
        follow = sum(f == told[e.seed - crl.EVAL_SEED0] for f, e in zip(first, exp)) / len(exp)
        m = {**metrics.success_metrics(eps, "eval"), **metrics.same_instance(eps, "retrieval")}
        right = sum(told[j] == secrets[j] for j in range(mine.instances)) / mine.instances
        print(f"{mine.run or args.actor}, {name} bank ({right:.3f} of its lessons name the right door), "
              f"{mine.instances} held-out vaults: success with the lesson {m['eval/vault/success_exp']:.3f}, without "
              f"{m['eval/vault/success_noexp']:.3f}; first door = the lesson's {follow:.3f}; same-instance "
              f"retrieval {m['retrieval/same_instance']:.3f}")
    extractor_check(run, mine.run or args.extractor, mine.instances)
    run.manager.close()


def scripted_episode(seed: int, won: bool, shown: str | None = None, rng=None) -> crl.Episode:
    """A with-experience vault episode played by script: two wrong doors, then the right one (won) or a third
    wrong one (lost). With a numpy `rng` the wrong doors are drawn at random and a won episode opens after 0-2 of
    them (no door order for a reader to learn); `shown` is the lesson it was shown."""
    env, e = envs.make("vault"), crl.Episode("vault", seed, 0, True)
    obs = env.reset(seed=seed)
    e.instruction, e.query = env.instruction, crl.retrieval_query(env, obs)
    if shown is not None:   # as crl.retrieve records a lesson: its text, entry id and source generation
        e.lessons, e.retrieved, e.sources = [shown], [0], [-1]
    e.transcript.append(("environment", obs))
    order = rng.permutation(len(env.actions)) if rng is not None else range(len(env.actions))
    wrong = [env.actions[i] for i in order if env.actions[i] != env.secret]
    locked = int(rng.integers(3)) if rng is not None and won else 2
    for door in wrong[:locked] + [env.secret] if won else wrong[:3]:
        obs, e.reward, _, info = env.step(door)
        e.transcript += [("agent", door), ("environment", obs)]
    e.success = info["success"]
    return e


def moves(e: crl.Episode) -> list[str]:
    """The doors an episode tried, in order."""
    return [text for who, text in e.transcript if who == "agent"]


def door_shares(eps: list[crl.Episode], ops: list) -> tuple[float, float]:
    """Of the episodes, the shares whose lesson (the operation distilled from it) is the last door tried (the
    one that opened, in a won episode), and is any door tried."""
    by_seed = {op.origin: op.text.strip().lower() for op in ops}
    tried = [moves(e) for e in eps]
    last = sum(by_seed.get(e.seed) == doors[-1] for e, doors in zip(eps, tried)) / len(eps)
    return last, sum(by_seed.get(e.seed) in doors for e, doors in zip(eps, tried)) / len(eps)


def extractor_check(run, name: str, instances: int):
    """What the extractor writes from a won and from a lost vault episode (crl.distill, the run's prompt and
    grammar): the share of lessons that name the door that opened, and after a loss one of the doors tried."""
    rng = crl.seeded_generator(run.extractor.device, run.seed, crl.EVAL_STEP, 0, crl.EXTRACTOR_SAMPLING)
    run.counters = {"parse_failures": 0, "operations": 0}
    run.timer = {"extractor": 0.0}
    for won in (True, False):
        eps = [scripted_episode(crl.EVAL_SEED0 + j, won) for j in range(instances)]
        ops = crl.distill(run, eps, 0, rng, record=False)
        named, wrong = door_shares(eps, ops)
        print(f"{name} extractor, {instances} {'won' if won else 'lost'} vault episodes: {len(ops)} lessons; "
              + (f"{named:.3f} name the door that opened" if won else f"{wrong:.3f} name a door tried (all wrong)"))


if __name__ == "__main__":
    main()
