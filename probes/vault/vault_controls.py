"""The vault's controls: does an actor use a lesson that holds the answer, and does a wrong one not help? Run:
python -m probes.vault.vault_controls [--run RUN_DIR] [--instances N] [--replays K] [--replays-only] [train.py flags]

For N held-out vaults it builds a bank with one lesson per vault, keyed by that vault's retrieval query,
written as the run's extractor writes lessons (a door word with --lesson-moves, else a sentence naming the
vault and its door):
- oracle: each vault's own secret;
- shuffled: the next vault's secret (what a wrong retrieval hands the actor; equal to the right door by chance).
Each bank is read by crl's evaluation (retrieval, judgement, rollout) and the probe reports success with and
without the lesson, how often the first door tried is the lesson's, and the retrieval's same-instance share.
Without memory the best success is 3/8 (envs.VAULT_MEMORYLESS_BEST); an actor that follows the oracle wins
every time it does. Then what a lesson written after a win can add: each vault played `--replays` times without
experience; P(a replay wins | another replay of the same vault won) near 1 means the actor wins again what it
won once, whatever a lesson says. And what one written after a loss could: the vaults a replay lost, each told
that replay's locked doors, or the doors it left. Last, the extractor's side: from scripted won and lost
episodes, how often its lesson names the door that opened (a won one), or one of the wrong doors tried (a lost one).
"""
import argparse
import collections

import crl
import envs
import metrics
import train
from bank import ExperienceBank, Operation


def lesson(cfg, name: str, door: str) -> str:
    return door if cfg.lesson_moves else f"In the {name} vault the {door} door opens."


def held_out(instances: int) -> list[int]:
    """The seeds of the held-out vaults evaluation plays (crl.held_out_specs)."""
    return envs.held_out_seeds("vault", instances, crl.EVAL_SEED0)


def vault_bank(run, instances: int, shift: int) -> tuple[ExperienceBank, dict]:
    """One lesson per held-out vault: the secret of vault (j + shift) mod N, keyed by vault j's query. Returns the
    bank and {vault seed: the door its lesson names}."""
    seeds = held_out(instances)
    origins = [seeds[(j + shift) % instances] for j in range(instances)]
    told = {seed: envs.vault_door(o) for seed, o in zip(seeds, origins)}
    texts = {seed: lesson(run.cfg, envs.vault_name(seed), door) for seed, door in told.items()}
    return bank_of(run, texts, origins), told


def bank_of(run, texts: dict, origins: list[int] | None = None) -> ExperienceBank:
    """A bank with one lesson for each vault seed in `texts`, keyed by that vault's retrieval query; its origin
    is the vault whose door it names (`origins`; default: its own)."""
    games = [envs.make("vault") for _ in texts]
    queries = [crl.retrieval_query(env, env.reset(seed=seed)) for seed, env in zip(texts, games)]
    bank = ExperienceBank(run.manager.bank.dim)
    bank.apply([Operation("add", "vault", text, key=key, origin=o)
                for text, key, o in zip(texts.values(), run.manager.embed(queries), origins or list(texts))])
    return bank


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", help="a run directory: its flags (args.json) and its trained models (ckpt/)")
    p.add_argument("--instances", type=int, default=64)
    p.add_argument("--replays", type=int, default=8, help="plays of each vault without experience (0: none)")
    p.add_argument("--replays-only", action="store_true", help="stop after the replays: the actor's habit alone")
    mine, rest = p.parse_known_args(argv)
    args = train.parse_args([*rest, "--out", mine.run, "--resume"] if mine.run else [*rest, "--tasks", "vault"])
    device = train.setup_distributed(args)
    run, _ = train.build(args, device, train.model_dtype(args, device))
    run.timer, run.counters = {}, {}
    plays = replays(run, mine.run or args.actor, mine.instances, mine.replays) if mine.replays > 1 else []
    if run.manager is None or mine.replays_only:
        print("the oracle and shuffled banks and the extractor's side are skipped: "
              + ("--replays-only" if run.manager else "no bank (grpo)"))
        return
    for name, shift in (("oracle", 0), ("shuffled", 1)):
        run.manager.bank, told = vault_bank(run, mine.instances, shift)
        specs = crl.held_out_specs(run, ["vault"], mine.instances)
        eps = crl.play_held_out(run, specs, crl.EVAL_STEP)
        exp = [e for e in eps if e.with_exp]
        first = [first_move(e).strip() for e in exp]
        follow = sum(f == told[e.seed] for f, e in zip(first, exp)) / len(exp)
        m = {**metrics.success_metrics(eps, "eval"), **metrics.same_instance(eps, "retrieval")}
        right = sum(door == envs.vault_door(seed) for seed, door in told.items()) / mine.instances
        print(f"{mine.run or args.actor}, {name} bank ({right:.3f} of its lessons name the right door), "
              f"{mine.instances} held-out vaults: success with the lesson {m['eval/vault/success_exp']:.3f}, without "
              f"{m['eval/vault/success_noexp']:.3f}; first door = the lesson's {follow:.3f}; same-instance "
              f"retrieval {m['retrieval/same_instance']:.3f}")
    if plays:
        after_a_loss(run, mine.run or args.actor, plays, mine.replays)
    extractor_check(run, mine.run or args.extractor, mine.instances)
    run.manager.close()


def replays(run, name: str, instances: int, times: int):
    """Each held-out vault played `times` times without experience: how alike the plays of one vault are."""
    specs = [("vault", seed, j, False) for _ in range(times) for j, seed in enumerate(held_out(instances))]
    eps = crl.play_held_out(run, specs, crl.EVAL_STEP)
    wins = [sum(e.success for e in eps if e.group == j) for j in range(instances)]
    again = win_again(wins, times)
    first = collections.Counter(map(first_move, eps)).most_common(1)[0]
    print(f"{name} actor, {instances} held-out vaults played {times} times each without experience: success "
          f"{sum(wins) / len(eps):.3f}; P(a play wins | another play of the vault won) {again:.3f}; vaults never won "
          f"{wins.count(0) / instances:.3f}, always won {wins.count(times) / instances:.3f}; the commonest first "
          f"door {first[0]!r} in {first[1] / len(eps):.3f} of plays")
    return eps


def win_again(wins: list[int], times: int) -> float:
    """P(a play wins | another play of the same vault won), from each vault's wins in `times` plays: over the
    ordered pairs of distinct plays of one vault whose first won, the share whose second won too."""
    pairs = sum(w * (times - 1) for w in wins)
    return sum(w * (w - 1) for w in wins) / pairs if pairs else float("nan")


def after_a_loss(run, name: str, plays: list, times: int):
    """What a lesson written after a loss could tell the actor: each vault that one of `plays` lost, with that
    play's locked doors as its lesson (`locked: ...`), or the doors it did not try (`try: ...`), played `times`
    times; against the same vaults' plays without experience."""
    lost = {}
    for e in plays:
        if not e.success and e.seed not in lost:
            lost[e.seed] = list(dict.fromkeys(m for m in moves(e) if m in envs.Vault.actions))
    if not lost:
        return
    without = [e.success for e in plays if e.seed in lost]
    forms = (lambda doors: "locked: " + ", ".join(doors),
             lambda doors: "try: " + ", ".join(doors_left(doors)))
    for text in forms:
        run.manager.bank = bank_of(run, {seed: text(doors) for seed, doors in lost.items()})
        eps = crl.play_held_out(run, [("vault", s, j, True) for _ in range(times) for j, s in enumerate(lost)],
                                crl.EVAL_STEP)
        listed = sum(first_move(e) in lost[e.seed] for e in eps) / len(eps)
        print(f"{name} actor, the {len(lost)} vaults a play lost, each told the locked doors of that play as "
              f"'{text(['north', 'east', 'west'])}': success {sum(e.success for e in eps) / len(eps):.3f} "
              f"(without {sum(without) / len(without):.3f}); first door a locked one {listed:.3f}")


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


def doors_left(tried: list[str]) -> list[str]:
    """The vault's doors not among `tried`, in the env's order."""
    return [d for d in envs.Vault.actions if d not in tried]


def first_move(e: crl.Episode) -> str:
    """The first door an episode tried ("" if it tried none)."""
    return next(iter(moves(e)), "")


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
