"""settings.py — how a setting is declared: `setting(default, help, **checks)` makes a dataclass field whose
metadata train.py turns into a documented command-line flag (rundir.add_flags); the partials below put a field
in a section of -h of its own; `per_task` parses a per-task value. crl.CRLConfig and train.RunConfig are built
from these."""
import dataclasses
import functools
from dataclasses import field

import envs


def setting(default, help: str, **checks):
    """A config field with its help text; `checks` (min, above, max, choices, flag, group: its section of -h)
    shape its command-line flag in train.py, which is generated from these fields."""
    if dataclasses.is_dataclass(default):   # a nested group of settings: each config gets its own copy
        return field(default_factory=lambda: dataclasses.replace(default), metadata={"help": help, **checks})
    return field(default=default, metadata={"help": help, **checks})


# the sections of -h beyond the method's own settings (a field made by one of these goes in its section)
batching = functools.partial(setting, group="how the work is batched (no effect on what is learned beyond float "
                                             "rounding)")
small_models = functools.partial(setting, group="for small models (the tiny and smollm2 presets; not in the paper)")
finished_study = functools.partial(setting, group="the finished vault study (results/vault-first/: a trained extractor "
                                                  "becomes a memory of each vault; --recipe vault-first sets these "
                                                  "with --credit first-lift and --bank-min-cosine; off by default)")


def per_task(text: str | None, least: int) -> dict:
    """A per-task setting: 'N', 'TASK=N,...' or both ('10,webshop=5') -> {task, or None for every other: N}."""
    out = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        task, eq, n = part.rpartition("=")
        task = task.strip()
        if (eq and not task) or (task and task not in envs.TASKS):
            raise ValueError(f"unknown task {task!r} in {text!r}; tasks: {', '.join(envs.TASKS)}")
        if not n.strip().isdigit() or int(n) < least:
            raise ValueError(f"{part!r} in {text!r} is not N or TASK=N with a whole number N >= {least}")
        out[task or None] = int(n)
    return out
