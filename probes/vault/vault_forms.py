"""Can the untrained extractor read a vault's door off an episode, in any of a few prompt forms? Run:
python -m probes.vault.vault_forms [--instances N] [train.py flags: --extractor smollm2 ...]

For N held-out vaults, a scripted won and a scripted lost episode each (probes.vault.vault_controls), the extractor's
exact constrained policy over its one-move lessons (`ADD: <door>`) is read in each prompt form below, and the
probe prints the mean probability of the door that opened (won) and of a door already tried (lost, all wrong).
A reader of the outcome puts the mass on the last door of a won episode; chance is 1/8 for one door, 3/8 for
the three tried.
    crl      the run's own prompt (crl.extractor_prompt)
    ending   the same, then the last move and the observation it ended on, right before the answer
    moves    the episode as `move -> what happened` lines, the outcome and the last move named
"""
import argparse

import crl
import envs
import train
from probes import policy
from probes.vault.vault_controls import moves, scripted_episode


def outcome(e: crl.Episode) -> str:
    return "SUCCESS" if e.success else "FAILURE"


def form_prompt(run, e: crl.Episode, form: str) -> list[int]:
    if form == "crl":
        return crl.extractor_prompt(run, e)
    said = [text for who, text in e.transcript if who == "environment"]
    if form == "ending":
        user = (f"Task: {e.instruction}\nOutcome: {outcome(e)}\nLessons retrieved for the agent:\n(none)\n"
                f"Episode:\n{crl.render_episode(e, run.cfg.episode_chars)}\n"
                f"Last move: {moves(e)[-1]}. It ended: {said[-1]}")
    else:
        steps = "\n".join(f"{m} -> {o}" for m, o in zip(moves(e), said[1:]))
        user = (f"Task: {e.instruction}\nStart: {said[0]}\nMoves:\n{steps}\n"
                f"Outcome: {outcome(e)}, after the move {moves(e)[-1]}.")
    system = crl.EXTRACTOR_SYSTEM.format(max_operations=run.cfg.max_operations)
    return crl.encode_chat(run.extractor_tok, [{"role": "system", "content": system}, {"role": "user", "content": user}])


def door_mass(run, e: crl.Episode, form: str, doors: list[str]) -> float:
    """P(the lesson names one of `doors`) under the extractor's constrained one-move grammar (`ADD: <door>`)."""
    actions = tuple(f"ADD: {d}" for d in envs.Vault.actions)
    p = policy(run.extractor, run.extractor_tok, form_prompt(run, e, form), actions)
    return sum(float(q) for q, d in zip(p, envs.Vault.actions) if d in doors)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--instances", type=int, default=32)
    mine, rest = p.parse_known_args(argv)
    args = train.parse_args([*rest, "--tasks", "vault", "--mode", "static"])
    device = train.setup_distributed(args)
    run, _ = train.build(args, device, train.model_dtype(args, device))
    for form in ("crl", "ending", "moves"):
        shares = []
        for won in (True, False):
            eps = [scripted_episode(crl.EVAL_SEED0 + j, won) for j in range(mine.instances)]
            shares.append(sum(door_mass(run, e, form, moves(e)[-1:] if won else moves(e)) for e in eps) / len(eps))
        print(f"{args.extractor} extractor, {form} form, {mine.instances} vaults: P(the door that opened | won) "
              f"{shares[0]:.3f} (chance 0.125); P(a door tried | lost) {shares[1]:.3f} (chance 0.375)")
    run.manager.close()


if __name__ == "__main__":
    main()
