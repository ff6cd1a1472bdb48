"""A trained run plays one held-out episode, shown turn by turn: its lesson, what the actor read and replied.
Run: python -m probes.episode RUN [--task TASK] [--seed N] [--no-experience] [--among E] [train.py flags that
change the run's settings, e.g. --temperature 0]

Loads the run as --resume does (RUN/args.json; the actor, extractor and bank of RUN/ckpt; the iteration it
reached) and plays held-out instance N (the Nth of envs.held_out_seeds for 256, or E with --among E; default 0)
of TASK (default: the run's first) through crl.play_held_out, the code evaluation plays with: the same retrieval
from the read-only bank, the same judgement, prompts, context and sampling stream (seeded as at crl.EVAL_STEP).
The episode plays with experience when the run has a bank, unless --no-experience. Nothing in RUN is written.

What is printed comes from the Episode crl returns: the lessons it retrieved (and, when the actor judges them,
what its prompt kept), then each turn's tokens as the actor read them, decoded (at turn 1 the system prompt
and the first user turn; later what the turn added to the context, or the whole window where --history cuts
it), and the reply it sampled (unprintable characters escaped); then the game's last observation and the
outcome.

Evaluation plays `eval_batch` episodes at once, and the noise an episode samples depends on the others in its
batch: played alone, this is an episode evaluation could have played with these weights. --among E plays it
inside the held-out episodes crl.evaluate(run, tasks, E) plays, so it is the very episode that evaluation
scored (e.g. E = the run's --final-eval-episodes, whose result is RUN/final.json).
"""
import argparse
import itertools
import os
import textwrap

import crl
import envs
import train


def load(run_dir: str, flags: list[str] = ()) -> tuple:
    """(args, run): the run's flags (a flag in `flags` overrides the saved one) and the run they build."""
    args = train.parse_args([*flags, "--out", run_dir, "--resume"])
    return args, build(args)


def build(args) -> crl.Run:
    """The run built from its last checkpoint as `train.py --out RUN --resume` builds it, its iteration clock
    where the checkpoint left it, which evaluation's re-rank reads (crl.retrieve)."""
    device = train.setup_distributed(args)
    run, start = train.build(args, device, train.model_dtype(args, device))
    run.step = start - 1
    return run


def play(run, task: str, instance: int, with_exp: bool, among: int = 0) -> crl.Episode:
    """Held-out instance `instance` of `task`, played by crl.play_held_out alone, or with `among` inside the
    batches of crl.evaluate(run, run.tasks, among) up to the one that holds it."""
    n = among or max(256, instance + 1)   # the vault's held-out set depends on its size (its doors balanced)
    spec = (task, envs.held_out_seeds(task, n, crl.EVAL_SEED0)[instance], instance, with_exp)
    if not among:
        return crl.play_held_out(run, [spec], crl.EVAL_STEP)[0]
    specs = crl.held_out_specs(run, run.tasks, among)
    i, n = specs.index(spec), run.cfg.eval_batch
    return crl.play_held_out(run, specs[:(i // n + 1) * n], crl.EVAL_STEP)[i]


def turns(tok, e: crl.Episode) -> list[list]:
    """[what the actor read, its reply] for each turn, from the episode's token segments: every run of context
    tokens and the run of sampled tokens after it, decoded (a reply without its end token, as crl reads it;
    None where the context filled before a reply)."""
    out = []
    for s in e.segments:
        for sampled, group in itertools.groupby(zip(s.tokens, s.mask), key=lambda pair: pair[1]):
            ids = [t for t, _ in group]
            if not sampled:
                out.append([tok.decode(ids), None])
                continue
            out[-1][1] = tok.decode(ids[:-1] if ids[-1] == tok.eos_token_id else ids)
    return out


def printable(text: str) -> str:
    """The text with each unprintable character but the newline written as its escape (a tiny extractor's
    lessons are bytes that a terminal would act on)."""
    return "".join(c if c.isprintable() or c == "\n" else repr(c)[1:-1] for c in text)


def lesson_lines(run, e: crl.Episode) -> list[str]:
    if not e.with_exp:
        return ["retrieved lesson(s): none (played without experience)"]
    if not e.retrieved:
        return [f"retrieved lesson(s): none (the bank holds no {e.task} lesson)"]
    lines = ["retrieved lesson(s):"]
    for k, (text, entry, origin) in enumerate(zip(e.lessons, e.retrieved, e.origins)):
        source = f"distilled from seed {origin}" if origin >= 0 else "origin unknown"
        lines.append(f"  {k + 1}. {text!r} (bank entry {entry}, {source})")
    if run.cfg.judge != "none":
        verdicts = ", ".join(e.verdicts.get(s, "?") for s in e.sources)
        lines.append(f"the actor's judgement: {verdicts}; its prompt holds: {e.experience!r}")
    return lines


def outcome_line(e: crl.Episode, budget: int) -> str:
    if e.truncated:
        how = "the context filled (truncated)"
    elif e.success:
        how = "success"
    else:
        how = "failure" + (" (the action budget ran out)" if e.turns >= budget else "")
    return (f"outcome: {how}; success {e.success}, reward {e.reward:.3f}, {e.turns} actions "
            f"(budget {budget}), {e.invalid} invalid, {e.asks} asks")


def show(run, e: crl.Episode) -> str:
    """The episode as text."""
    indent = lambda text: textwrap.indent(printable(text), "    ", lambda line: True)
    how = "with experience" if e.with_exp else "without experience"
    lines = [f"{e.task}, held-out instance {e.group} (game seed {e.seed}), {how}",
             *lesson_lines(run, e)]
    for k, (read, reply) in enumerate(turns(run.actor_tok, e)):
        lines += [f"--- turn {k + 1}: the actor reads", indent(read.strip("\n"))]
        lines += [f"--- turn {k + 1}: the actor replies", indent(reply if reply is not None else "(no reply)")]
    if e.transcript and e.transcript[-1][0] == "environment" and e.turns:
        lines += ["--- the game's last observation", indent(e.transcript[-1][1])]
    lines.append(outcome_line(e, run.cfg.steps(e.task)))
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("run", help="a run directory with a checkpoint (RUN/args.json, RUN/ckpt)")
    p.add_argument("--task", help="one of the run's tasks (default: its first)")
    p.add_argument("--seed", type=int, default=0, metavar="N",
                   help="held-out instance N: the Nth of envs.held_out_seeds (default 0)")
    p.add_argument("--no-experience", action="store_true",
                   help="play without a lesson (default: with one when the run has a bank)")
    p.add_argument("--among", type=int, default=0, metavar="E",
                   help="play it inside the held-out episodes crl.evaluate(run, tasks, E) plays, so it is the "
                        "episode that evaluation scored (default 0: alone)")
    mine, rest = p.parse_known_args(argv)
    if not os.path.exists(os.path.join(mine.run, "ckpt", "state.pt")):
        p.error(f"no checkpoint in {mine.run}/ckpt (is this a run directory?)")
    args = train.parse_args([*rest, "--out", mine.run, "--resume"])
    task = mine.task or args.tasks[0]
    if task not in args.tasks:
        p.error(f"--task {task}: the run trained on {', '.join(args.tasks)}")
    if mine.seed < 0 or (mine.among and mine.seed >= mine.among):
        p.error(f"--seed {mine.seed}: a held-out instance is 0..{mine.among - 1 if mine.among else 'N'}")
    run = build(args)
    with_exp = run.cfg.uses_bank and not mine.no_experience
    try:
        e = play(run, task, mine.seed, with_exp, mine.among)
        how = (f"among the {mine.among} held-out episodes a task each way that crl.evaluate plays" if mine.among
               else "alone (evaluation plays it in a batch, with other noise: --among E replays the one it scored)")
        print(f"{mine.run}: {args.mode} run, actor and bank of iteration {run.step}; played {how}")
        print(show(run, e))
    finally:
        if run.manager is not None:
            run.manager.close()


if __name__ == "__main__":
    main()
