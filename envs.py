"""Text environments: each class turns a game into text for the actor and the actor's reply back into a move.

What the actor reads decides what it can learn, so observations are compact (a tiny byte-level model reads
every character of a 30-turn episode), faithful (the underlying game is the real one, untouched) and
unambiguous (every symbol in view is explained once; important things get their offset from the agent in
words, e.g. `stairs down (>): 1 southeast, 1 east`).

- MiniHack (`room`, `maze`, `keyroom`, `river`): the real `minihack`/`nle` engine; we render its
  agent-centred crop, its screen descriptions (for the legend) and its message line.
- Sokoban (`sokoban`): 6x6 room, 2 boxes, written here in numpy: random-walk room, reverse-play
  generation, and a BFS solver (`solve_sokoban`) that proves every generated room solvable.
- ALFWorld (`alfworld`): the real `alfworld` + `textworld` games read from `$ALFWORLD_DATA` (else unpacked
  from the repository's data/alfworld-games.tar.xz by `alfworld_data_dir`).
- WebShop (`webshop`): the original site's pages, search and reward, rebuilt offline in webshop.py.
- Vault (`vault`, `vault-reveal`): a named vault with eight doors, one of which opens; which one is a secret of
  the name, so only memory (the experience bank) carries it from one episode to the next.
- Family vault (`vault-family`, ...): the vault, its door fixed by the family its name names, so weights can learn
  it too and a lesson carries to every vault of the family.

What a task provides, and how it is registered: `Task` (one decorator, `@task("name")`, on its class; `TASKS`
and `make()` read the registry). crl.py calls `make()` (through `EnvPool`); `python envs.py play TASK` shows a
person exactly what the actor sees.
"""
import contextlib
import functools
import hashlib
import importlib
import json
import multiprocessing
import os
import random
import re
import signal
import sys
import tarfile
import tempfile
import threading
import traceback
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import webshop
from webshop import webshop_reward, webshop_search  # noqa: F401  (the pure functions WebShop is built on)

MAX_STEPS = 30  # the paper's per-episode action limit for MiniHack, Sokoban and ALFWorld (WebShop: 10)
DATA = Path(__file__).resolve().parent / "data"

# ---------------------------------------------------------------------------------------- the task protocol

TASKS: dict[str, type] = {}   # name -> task class, filled by @task: the one place a task is registered


class Task:
    """What a task provides; the method relies on nothing else (tests/test_envs.py::test_task_protocol checks
    every registered task against it). Register a class with `@task("name")` above it (envs.py, or a module of
    your own loaded by `load_task("module:name")`); `make(name)` builds it.

    An instance, `make(name, seed=None, **kwargs)` (`seed` seeds the episode seeds reset() draws when given none):
    - `instruction`: its goal and its actions, in words; the same for every episode (retrieval keys start with it).
    - `actions`: the valid replies now (a constrained actor's reply is masked to them); may change every step.
    - `max_steps`: the episode ends at this step at the latest.
    - `reset(seed=None) -> str`: the first observation. reset(seed) replays exactly the same episode: the same
      replies give the same observations and rewards, in any process (hash with `_stable_hash`, not hash()).
    - `step(reply) -> (obs: str, reward: float, done: bool, info: dict)`. Start it with `begin_step`: the env
      keeps `done` and `steps` (a step after done raises ValueError, nothing else raises); a reply that does not
      parse to an action (`parse_action`) uses a step and leaves the game as it was (`info["invalid"]`, the
      observation `invalid_text`). `info["success"]`: the episode won. Only the last step's reward is the
      episode's (crl.record_step), within `reward_range`. The method reads `info["success"]` and
      `info["invalid"]`; `play` reads `info["steps"]`; any other key is the task's own (probes).
    Of the class, with an ordinary task's defaults:
    - `budget`: steps a run gives an episode unless told otherwise (task_steps; --max-steps overrides).
    - `failure_reward`: what an episode cut short (out of the actor's context) earns.
    - `held_out_split`: the data split evaluation plays (make(split=...); training plays "train"); None: none.
    - `options`: the pool's settings its constructor takes, from ("show_map", "list_actions").
    - `held_out_seeds(n, first)`: the instances evaluation plays; `panels(n, first)`: every held-out panel,
      {"": held_out_seeds} unless a task has more (the family vault's control); `panel_of(seed)`: its panel's name.
    - `training_seed(rng, below)`: a training instance, never a held-out one.
    - `answer(seed)`: the word a right lesson about instance `seed` names (the vault's door), None where no
      answer is known: metrics check lessons against it.
    """

    task = None   # the registered name (set by @task)
    budget = MAX_STEPS
    failure_reward = 0.0
    reward_range = (0.0, 1.0)
    held_out_split = None
    options = ()

    @classmethod
    def held_out_seeds(cls, n: int, first: int) -> tuple[int, ...]:
        return tuple(range(first, first + n))

    @classmethod
    def panels(cls, n: int, first: int) -> dict[str, tuple[int, ...]]:
        return {"": cls.held_out_seeds(n, first)}

    @classmethod
    def panel_of(cls, seed: int) -> str:
        return ""

    @classmethod
    def training_seed(cls, rng: np.random.Generator, below: int) -> int:
        return int(rng.integers(below))

    @classmethod
    def answer(cls, seed: int) -> str | None:
        return None


def task(*names: str, **attrs):
    """Register the class below as each of `names`: as a subclass with `task` = the name and `attrs` as class
    attributes, so one class makes several tasks (MiniHack's four, the vault's variants)."""
    def register(cls):
        below = {k: TASKS.pop(k) for k in [k for k, v in TASKS.items() if v.__base__ is cls]}   # stacked
        for name in names:                                     # decorators run bottom-up: keep reading order
            old = TASKS.get(name)
            if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
                raise ValueError(f"task {name!r} is registered twice: by {old.__module__} and {cls.__module__}")
            TASKS[name] = type(cls.__name__, (cls,), {**attrs, "task": name, "__module__": cls.__module__,
                                                      "__qualname__": cls.__qualname__})
        TASKS.update(below)
        return cls
    return register


def task_class(name: str) -> type:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(TASKS)} (a task is registered by "
                         "@envs.task on its class in envs.py; one in a module of your own: MODULE:NAME, e.g. "
                         "examples.parity:parity)")
    return TASKS[name]


def load_task(spec: str) -> str:
    """The task a --tasks entry names: a registered name, or MODULE:NAME for one registered by a module of your own
    (imported here: `examples.parity:parity`). Game worker processes import the class's module themselves."""
    module, _, name = spec.rpartition(":")
    if module:
        importlib.import_module(module)
    task_class(name)
    return name


def task_steps(task: str) -> int:
    """A task's own actions per episode."""
    return task_class(task).budget


def held_out_seeds(task: str, n: int, first: int) -> list[int]:
    """The instance seeds of n held-out episodes of `task` (Task.held_out_seeds)."""
    return list(task_class(task).held_out_seeds(n, first))


def held_out_panels(task: str, n: int, first: int) -> dict[str, list[int]]:
    """Every held-out panel of `task`, n seeds each: {"": held_out_seeds, and any other panel by its name}."""
    return {k: list(v) for k, v in task_class(task).panels(n, first).items()}


def panel_of(task: str, seed: int) -> str:
    """The held-out panel instance `seed` of `task` belongs to ("": the main one; the family vault's "control")."""
    return task_class(task).panel_of(seed)


def draw_training_seed(task: str, rng: np.random.Generator, below: int) -> int:
    """A training instance seed below `below`, never a held-out one (Task.training_seed)."""
    return task_class(task).training_seed(rng, below)


def answer(task: str, seed: int) -> str | None:
    """What a right lesson about instance `seed` of `task` names, where known (Task.answer)."""
    return task_class(task).answer(seed)


_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)


def parse_action(reply: str, actions) -> str | None:
    """The action named by a reply, or None. Accepts the bare action or the actor's `<answer>...</answer>`
    format (the last tag wins, so reasoning before it may mention other actions); case-insensitive."""
    valid = {a.lower(): a for a in actions}
    return valid.get(answer_text(reply).lower())


def answer_text(reply: str) -> str:
    """The reply's last `<answer>...</answer>` (else the whole reply), stripped."""
    found = _ANSWER.findall(reply)
    return (found[-1] if found else reply).strip()


def invalid_text(reply: str, actions) -> str:
    """The observation for an unparseable reply: says so and lists the valid actions."""
    shown = reply.strip().replace("\n", " ")
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return f"Action not understood: {shown!r}. Valid actions: {', '.join(actions)}."


def begin_step(env, reply: str, parse=parse_action) -> tuple[str | None, dict]:
    """The start of every env's step(): refuse a finished episode, count the step (an invalid reply counts
    too), parse the reply. Returns the action (None if invalid) and the info dict to fill in."""
    if env.done:
        raise ValueError("episode is over: call reset() before step()")
    env.steps += 1
    action = parse(reply, env.actions)
    return action, {"success": False, "invalid": action is None, "steps": env.steps, "action": action}


def _seed_from(rng: random.Random, seed) -> int:
    """The episode seed: the caller's when given, else the next one from the env's own generator."""
    if seed is None:
        return rng.randrange(2**63)
    if not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an int, got {seed!r}")
    return int(seed)


def offset_words(dx: int, dy: int, words=("east", "west", "south", "north"), diagonal=False) -> str:
    """An offset in moves, horizontal part first: (2, 1) -> '2 east, 1 south'. words = (+x, -x, +y, -y).
    diagonal=True (NetHack moves diagonally): diagonal moves first, named as the action is, (2, 1) ->
    '1 southeast, 1 east', so the words are a shortest path in moves."""
    parts = []
    if diagonal and dx and dy:
        n, sx, sy = min(abs(dx), abs(dy)), (1 if dx > 0 else -1), (1 if dy > 0 else -1)
        parts.append(f"{n} {words[2] if sy > 0 else words[3]}{words[0] if sx > 0 else words[1]}")
        dx, dy = dx - n * sx, dy - n * sy
    if dx:
        parts.append(f"{abs(dx)} {words[0] if dx > 0 else words[1]}")
    if dy:
        parts.append(f"{abs(dy)} {words[2] if dy > 0 else words[3]}")
    return ", ".join(parts) or "here"


def render_grid(rows, name_of, center, terrain, words=("east", "west", "south", "north"), max_listed=3, few=(),
                show_map=True, diagonal=False):
    """Map rows, a legend line and one position line per important kind of thing (show_map=False: the
    position lines alone).

    rows: list of equal-length strings; name_of(r, c): the name of a (non-blank) cell;
    center: (row, col) of the agent. Blank border rows/columns are trimmed (they carry no information),
    each row is right-stripped. Things whose name is not in `terrain` are listed with their offset from
    the agent, nearest first (at most `max_listed` per kind; only the nearest one for kinds in `few`,
    such as water, whose extent the map already shows)."""
    occupied = [(r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch != " "]  # ' ' = unseen
    if not occupied:  # e.g. NetHack's screen after the game ended
        return ["(nothing in view)"]
    r0, r1 = min(r for r, _ in occupied), max(r for r, _ in occupied)
    c0, c1 = min(c for _, c in occupied), max(c for _, c in occupied)
    lines = [rows[r][c0:c1 + 1].rstrip() for r in range(r0, r1 + 1)]
    legend, things = {}, {}
    ar, ac = center
    for r, c in sorted(occupied, key=lambda rc: (rc != center, rc)):  # the agent first, then reading order
        ch, name = rows[r][c], name_of(r, c)
        legend.setdefault((ch, name), None)
        if name not in terrain:
            things.setdefault((name, ch), []).append((c - ac, r - ar))
    out = lines + ["legend: " + ", ".join(f"{ch}={name}" for ch, name in legend)] if show_map else []
    for (name, ch), offs in things.items():
        offs.sort(key=lambda d: (max(abs(d[0]), abs(d[1])), abs(d[0]) + abs(d[1])))
        k = 1 if name in few else max_listed
        shown = "; ".join(offset_words(dx, dy, words, diagonal) for dx, dy in offs[:k])
        more = f"; +{len(offs) - k} more" if len(offs) > k else ""
        out.append(f"{name} ({ch}): {shown}{more}")
    return out


# ---------------------------------------------------------------------------------------------- MiniHack

@dataclass(frozen=True)
class MiniHackSpec:
    env_id: str
    instruction: str
    crop: int = 9  # side of MiniHack's agent-centred crop (odd; MiniHack's crop is only right when square)
    keys: bool = False  # KeyRoom adds pickup and apply


_MOVES = ("north", "east", "south", "west", "northeast", "southeast", "southwest", "northwest")
MOVE_OFFSETS = {"north": (0, -1), "south": (0, 1), "east": (1, 0), "west": (-1, 0), "northeast": (1, -1),
                "northwest": (-1, -1), "southeast": (1, 1), "southwest": (-1, 1)}   # (dx, dy) on NetHack's map
_MOVE_HELP = "Actions: north, south, east, west, northeast, northwest, southeast, southwest."
MINIHACK = {
    "room": MiniHackSpec(
        "MiniHack-Room-Ultimate-5x5-v0",
        "Find the stairs down (>) in a dark 5x5 room and step onto them. You see only next to you; "
        "a monster and a trap may be there. " + _MOVE_HELP),
    "maze": MiniHackSpec(
        "MiniHack-MazeWalk-9x9-v0",
        "Find the stairs down (>) in a dark maze and step onto them. Walls block you. " + _MOVE_HELP),
    "keyroom": MiniHackSpec(
        "MiniHack-KeyRoom-S5-v0",
        "Reach the stairs down (>) behind a locked door (+). Walk onto the key ((), pickup, go next to "
        "the door, apply to unlock it, then walk through. " + _MOVE_HELP + " Also: pickup, apply.",
        keys=True),
    "river": MiniHackSpec(
        "MiniHack-River-Narrow-v0",
        "Reach the stairs down (>) across the river to the east. Water (}) drowns you: push boulders (`) "
        "into it by walking into them; each fills one water square. " + _MOVE_HELP,
        crop=21),
}
# NLE's screen descriptions are long; these short names keep the legend compact. Unknown ones pass through.
_SHORT_NAMES = {
    "human rogue called Agent": "you", "floor of a room": "floor", "dark part of a room": "floor",
    "staircase down": "stairs down", "staircase up": "stairs up", "doorway": "doorway",
}
_TERRAIN = {"you", "floor", "wall", "corridor", "stairs up"}  # in the legend, but not located in words
_GREETINGS = re.compile(r"(Hello Agent, welcome to NetHack!\s+You are a [^.]*\.|"
                        r"Be careful!\s+New moon tonight\.|You are lucky!\s+Full moon tonight\.)\s*")


@functools.lru_cache(maxsize=4096)
def short_name(raw: bytes) -> str:
    """A compact name for an NLE screen description (raw NUL-padded bytes, cached: the same few recur
    every step): 'a key named The Master Key of Thievery' -> 'key'."""
    desc = raw.replace(b"\0", b"").decode("latin-1")
    if desc in _SHORT_NAMES:
        return _SHORT_NAMES[desc]
    desc = re.sub(r"^(a|an|the) ", "", desc)
    return re.split(r" (named|called) ", desc)[0]


_QUIET_LOCK = threading.Lock()


@contextlib.contextmanager
def _quiet():
    """Silence stdout/stderr at the file-descriptor level while building or resetting an engine:
    MiniHack's level compiler (a subprocess) and warnings would otherwise print into the actor's terminal
    or a piped `play` session. Serialised by a lock: two threads swapping fd 1 at once could leave it
    pointing at /dev/null. Steps do not print, so they run without it."""
    with _QUIET_LOCK, _silenced():
        yield


@contextlib.contextmanager
def _silenced():
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(os.devnull, "w") as null, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        os.dup2(null.fileno(), 1)
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def make_minihack_raw(task: str, max_steps: int = MAX_STEPS):
    """The raw MiniHack env (unwrapped gymnasium env) exactly as our wrapper drives it; tests and the
    benchmark compare against this. No ttyrecs or stat files are written (savedir=None)."""
    spec = MINIHACK[task]
    with _quiet():
        import gymnasium as gym
        import minihack  # noqa: F401  (registers the MiniHack env ids)
        kwargs = dict(observation_keys=("chars_crop", "screen_descriptions_crop", "blstats", "message"),
                      obs_crop_h=spec.crop, obs_crop_w=spec.crop, savedir=None, save_ttyrec_every=0,
                      fix_moon_phase=True)
        env = gym.make(spec.env_id, **kwargs).unwrapped
        if env._max_episode_steps < max_steps:
            env._max_episode_steps = max_steps
    return env


def seed_minihack(env, seed: int):
    """Fix NetHack's two RNGs (core and display) for the next reset; reseed=False keeps the whole
    episode, not just the level, reproducible. (gymnasium's reset(seed=) does not reach NetHack.)"""
    s = int(seed) % (2**63)
    env.seed(s, s, reseed=False)


@task(*MINIHACK)
class MiniHackEnv(Task):
    """One MiniHack task (`task`, a key of MINIHACK) as text. The gym env is built once and reused across resets
    (building it compiles the level description, which is the slow part)."""

    options = ("show_map",)

    def __init__(self, seed=None, max_steps: int = MAX_STEPS, show_map: bool = True):
        from nle import nethack
        self.spec, self.max_steps, self.show_map = MINIHACK[self.task], max_steps, show_map
        self.instruction = self.spec.instruction
        self.actions = _MOVES + (("pickup", "apply") if self.spec.keys else ())
        self.env = make_minihack_raw(self.task, max_steps)
        cmd = {"pickup": nethack.Command.PICKUP, "apply": nethack.Command.APPLY}
        cmd.update({m: d for m, d in zip(_MOVES, (nethack.CompassDirection.N, nethack.CompassDirection.E,
                                                  nethack.CompassDirection.S, nethack.CompassDirection.W,
                                                  nethack.CompassDirection.NE, nethack.CompassDirection.SE,
                                                  nethack.CompassDirection.SW, nethack.CompassDirection.NW))})
        self.action_index = {a: self.env.actions.index(cmd[a]) for a in self.actions}
        self._rng = random.Random(seed)
        self.steps, self.done, self.obs = 0, True, None
        self._success_status = self.env.StepStatus.TASK_SUCCESSFUL

    def reset(self, seed=None) -> str:
        self.episode_seed = _seed_from(self._rng, seed)
        seed_minihack(self.env, self.episode_seed)
        with _quiet():
            raw, _ = self.env.reset()
        self.steps, self.done = 0, False
        self.obs = self.render(raw, first=True)
        self.raw = raw
        return self.obs

    @property
    def pos(self) -> tuple:
        """The agent's (x, y) on NetHack's map, from blstats (also in every step's info)."""
        return tuple(int(v) for v in self.raw["blstats"][:2])

    def step(self, reply: str):
        action, info = begin_step(self, reply)
        if action is None:
            obs, reward, game_over = invalid_text(reply, self.actions), 0.0, False
        else:
            raw, _, term, trunc, ginfo = self.env.step(self.action_index[action])
            self.raw = raw
            info["success"] = ginfo["end_status"] == self._success_status
            game_over = bool(term or trunc)
            reward = 1.0 if info["success"] else 0.0
            if info["success"]:  # NetHack's screen is blank once the game has ended
                obs = "You reached the stairs down (>): task complete."
            elif game_over:
                obs = f"The game is over ({ginfo['end_status'].name.lower()}): task failed."
            else:
                obs = self.render(raw)
            self.obs = obs
        info["pos"] = self.pos
        self.done = info["success"] or game_over or self.steps >= self.max_steps
        return obs, reward, self.done, info

    def render(self, raw, first=False) -> str:
        """The actor's view: MiniHack's crop, a legend from NLE's screen descriptions, positions of
        non-terrain things relative to the agent, and the message line (startup greetings dropped).
        show_map=False keeps only the positions and the message: a from-scratch tiny model learns to read
        those in a few dozen updates, a character map in hundreds (measured by imitation on room)."""
        chars, descs = raw["chars_crop"], raw["screen_descriptions_crop"]
        rows = [row.tobytes().decode("latin-1") for row in np.where(chars == 0, 32, chars).astype(np.uint8)]
        mid = self.spec.crop // 2
        lines = render_grid(rows, lambda r, c: short_name(descs[r, c].tobytes()), (mid, mid), _TERRAIN,
                            few=("water",), show_map=self.show_map, diagonal=True)
        message = bytes(raw["message"]).split(b"\0")[0].decode("latin-1")
        message = " ".join(_GREETINGS.sub("", message).split()) if first else " ".join(message.split())
        if message:
            lines.append("message: " + message)
        return "\n".join(lines) or "(nothing notable in view)"


# ----------------------------------------------------------------------------------------------- Sokoban

_DIRS = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
_SOKO_NAMES = {"#": "wall", ".": "floor", "o": "target", "B": "box", "X": "box on target", "@": "you",
               "+": "you on target"}


@task("sokoban")
class Sokoban(Task):
    """Sokoban on a 6x6 board (outer wall included), 2 boxes, 2 targets. Boxes can be pushed, never pulled;
    a move into a wall or a blocked box leaves the board unchanged but uses up a step.

    Rooms come from reverse play (as in gym-sokoban): carve a room by a random walk, put the boxes on the
    targets, then walk the player backwards, pulling boxes. Every reverse pull is a forward push, so the
    room is solvable; we also keep only rooms where all boxes left their targets and the BFS solution
    fits in the step limit."""

    instruction = ("Push both boxes (B) onto the targets (o). Walk into a box to push it; boxes cannot be "
                   "pulled, and a box against a wall can get stuck. Actions: up, down, left, right.")
    actions = ("up", "down", "left", "right")

    def __init__(self, seed=None, max_steps: int = MAX_STEPS, size: int = 6, n_boxes: int = 2):
        if size < 4 or n_boxes < 1:
            raise ValueError(f"sokoban needs size >= 4 and n_boxes >= 1, got size={size}, n_boxes={n_boxes}")
        self.max_steps, self.size, self.n_boxes = max_steps, size, n_boxes
        self._rng = random.Random(seed)
        self.done = True

    @classmethod
    def from_text(cls, board: str, max_steps: int = MAX_STEPS):
        """A hand-built board: '#' wall, '.' floor, 'o' target, 'B' box, 'X' box on target, '@' you,
        '+' you on target."""
        rows = board.strip("\n").split("\n")
        if len({len(r) for r in rows}) != 1:
            raise ValueError("sokoban board rows must all have the same length")
        env = cls(max_steps=max_steps)
        grid = np.array([list(r) for r in rows])
        bad = set(grid.ravel()) - set(_SOKO_NAMES)
        if bad:
            raise ValueError(f"unknown sokoban symbols {sorted(bad)}; use one of {''.join(_SOKO_NAMES)}")
        env.walls, env.targets = grid == "#", np.isin(grid, ["o", "X", "+"])
        env.boxes = np.isin(grid, ["B", "X"])
        players = np.argwhere(np.isin(grid, ["@", "+"]))
        if len(players) != 1 or env.boxes.sum() != env.targets.sum():
            raise ValueError("a sokoban board needs exactly one player and as many boxes as targets")
        env.player = tuple(int(v) for v in players[0])
        env.size, env.n_boxes = len(rows), int(env.boxes.sum())
        env.steps, env.done, env.episode_seed = 0, False, None
        return env

    def reset(self, seed=None) -> str:
        self.episode_seed = _seed_from(self._rng, seed)
        self.walls, self.targets, self.boxes, self.player = generate_sokoban(
            self.episode_seed, self.size, self.n_boxes, self.max_steps)
        self.steps, self.done = 0, False
        return self.render()

    def step(self, reply: str):
        action, info = begin_step(self, reply)
        if action is None:
            obs = invalid_text(reply, self.actions)
        else:
            moved = self.move(action)
            info["success"] = self.solved()
            obs = self.render(None if moved else "That way is blocked.")
        info["pos"] = self.player
        self.done = info["success"] or self.steps >= self.max_steps
        return obs, float(info["success"]), self.done, info

    def move(self, action: str) -> bool:
        """Apply one move; returns whether anything moved."""
        dr, dc = _DIRS[action]
        r, c = self.player
        n1, n2 = (r + dr, c + dc), (r + 2 * dr, c + 2 * dc)
        if self.walls[n1]:
            return False
        if self.boxes[n1]:
            inside = 0 <= n2[0] < self.walls.shape[0] and 0 <= n2[1] < self.walls.shape[1]
            if not inside or self.walls[n2] or self.boxes[n2]:
                return False
            self.boxes[n1], self.boxes[n2] = False, True
        self.player = n1
        return True

    def solved(self) -> bool:
        return bool((self.boxes == self.targets).all())

    def grid(self) -> list[str]:
        g = np.full(self.walls.shape, ".")
        g[self.targets] = "o"
        g[self.boxes] = "B"
        g[self.boxes & self.targets] = "X"
        g[self.walls] = "#"
        g[self.player] = "+" if self.targets[self.player] else "@"
        return ["".join(row) for row in g]

    def render(self, message=None) -> str:
        rows = self.grid()
        lines = render_grid(rows, lambda r, c: _SOKO_NAMES[rows[r][c]], self.player,
                            {"wall", "floor", "you", "you on target"}, words=("right", "left", "down", "up"))
        return "\n".join(lines + ([f"message: {message}"] if message else []))


def _random_room(rng: np.random.Generator, size: int) -> np.ndarray:
    """Floor mask carved by a random walk inside the outer wall (turns with probability 0.35)."""
    floor = np.zeros((size, size), bool)
    pos = np.array(rng.integers(1, size - 1, 2))
    d = np.array(list(_DIRS.values())[rng.integers(4)])
    for _ in range(3 * size):
        floor[tuple(pos)] = True
        if rng.random() < 0.35:
            d = np.array(list(_DIRS.values())[rng.integers(4)])
        nxt = pos + d
        if (1 <= nxt).all() and (nxt <= size - 2).all():
            pos = nxt
    return floor


def generate_sokoban(seed: int, size: int = 6, n_boxes: int = 2, max_steps: int = MAX_STEPS):
    """(walls, targets, boxes, player) of a solvable room, a pure function of seed."""
    rng = np.random.default_rng(int(seed) % 2**64)
    for _ in range(10_000):
        floor = _random_room(rng, size)
        cells = [tuple(int(v) for v in p) for p in np.argwhere(floor)]
        if len(cells) < n_boxes + 4:
            continue
        picks = rng.choice(len(cells), n_boxes + 1, replace=False)
        targets = np.zeros_like(floor)
        for i in picks[:-1]:
            targets[cells[i]] = True
        for _walk in range(5):
            boxes, player = targets.copy(), cells[picks[-1]]
            for _ in range(int(rng.integers(10, 40))):
                dr, dc = list(_DIRS.values())[rng.integers(4)]
                nxt, behind = (player[0] + dr, player[1] + dc), (player[0] - dr, player[1] - dc)
                if not floor[nxt] or boxes[nxt]:
                    continue
                if boxes[behind] and rng.random() < 0.8:  # pull: the box follows the player
                    boxes[behind], boxes[player] = False, True
                player = nxt
            if (boxes & targets).any():
                continue
            walls = ~floor
            solution = solve_sokoban(walls, targets, boxes, player, max_depth=max_steps)
            if solution is not None:
                return walls, targets, boxes, player
    raise RuntimeError(f"could not generate a sokoban room for seed {seed}")


def solve_sokoban(walls, targets, boxes, player, max_depth: int = 200):
    """Shortest action list that puts every box on a target (BFS over (player, boxes) states), or None
    if there is none within max_depth moves."""
    goal = frozenset(map(tuple, np.argwhere(targets)))
    start = (tuple(player), frozenset(map(tuple, np.argwhere(boxes))))
    prev = {start: None}
    frontier = [start]
    for _depth in range(max_depth + 1):
        nxt_frontier = []
        for state in frontier:
            p, bx = state
            if bx == goal:
                path = []
                while prev[state] is not None:
                    state, a = prev[state]
                    path.append(a)
                return path[::-1]
            for a, (dr, dc) in _DIRS.items():
                n1 = (p[0] + dr, p[1] + dc)
                if walls[n1]:
                    continue
                nb = bx
                if n1 in bx:
                    n2 = (n1[0] + dr, n1[1] + dc)
                    if walls[n2] or n2 in bx:
                        continue
                    nb = (bx - {n1}) | {n2}
                s = (n1, nb)
                if s not in prev:
                    prev[s] = (state, a)
                    nxt_frontier.append(s)
        frontier = nxt_frontier
    return None


# ---------------------------------------------------------------------------------------------- ALFWorld

ALFWORLD_TARBALL = DATA / "alfworld-games.tar.xz"
_ALFWORLD_SPLITS = ("train", "valid_seen", "valid_unseen", "valid_train")


def alfworld_data_dir(split: str = "valid_unseen") -> Path:
    """The ALFWorld data root ($ALFWORLD_DATA, else ~/.cache/crl/alfworld) with `json_2.1.1/<split>`
    present: unpacks that split from the tarball ($CRL_ALFWORLD_TAR, else the repository's data/) on first use.
    A split is unpacked into a temporary folder and renamed into place, so an interrupted unpack leaves
    nothing half-written."""
    if split not in _ALFWORLD_SPLITS:
        raise ValueError(f"unknown ALFWorld split {split!r}; choose from {', '.join(_ALFWORLD_SPLITS)}")
    root = Path(os.environ.get("ALFWORLD_DATA") or Path.home() / ".cache" / "crl" / "alfworld")
    target = root / "json_2.1.1" / split
    if target.is_dir():
        return root
    tarball = Path(os.environ.get("CRL_ALFWORLD_TAR") or ALFWORLD_TARBALL)
    if not tarball.is_file():
        raise FileNotFoundError(
            f"ALFWorld games not found: no {target} and no tarball at {tarball}. Set ALFWORLD_DATA to a folder "
            f"holding json_2.1.1/{split}/ (alfworld-download fetches it) or CRL_ALFWORLD_TAR to "
            "alfworld-games.tar.xz.")
    target.parent.mkdir(parents=True, exist_ok=True)
    prefix = f"json_2.1.1/{split}/"
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{split}-") as tmp:
        with tarfile.open(tarball, "r:xz") as tar:
            members = [m for m in tar if m.name.startswith(prefix) and (m.isfile() or m.isdir())]
            tar.extractall(tmp, members=members, filter="data")
        try:
            os.rename(Path(tmp) / "json_2.1.1" / split, target)
        except OSError:
            if not target.is_dir():  # another process won the race: fine; anything else: re-raise
                raise
    return root


def alfworld_games(split: str = "valid_unseen") -> list[Path]:
    """The split's game files, in a fixed shuffled order (so consecutive seeds mix task types)."""
    root = alfworld_data_dir(split) / "json_2.1.1" / split
    files = sorted(root.glob("*/*/game.tw-pddl"))
    if not files:
        raise FileNotFoundError(f"no game.tw-pddl files under {root}; re-unpack or fix $ALFWORLD_DATA")
    random.Random(0).shuffle(files)
    return files


@task("alfworld")
class ALFWorld(Task):
    """ALFWorld household tasks through the real textworld engine. Seed s plays game s mod N of the split
    (a fixed permutation): seeds 0..133 of valid_unseen are its 134 games. The observation is the game's
    feedback followed by the admissible commands, which are the valid actions (without `list_actions`, the
    feedback alone: about 350 tokens a turn fewer, for an actor whose replies are constrained to them anyway).
    Reward 1 on success, -1 when the step limit ends the episode first (the paper's choice)."""

    failure_reward = -1.0   # what an episode cut short (e.g. out of the actor's context) earns
    reward_range = (-1.0, 1.0)
    held_out_split = "valid_unseen"
    options = ("list_actions",)

    def __init__(self, seed=None, split: str = "train", max_steps: int = MAX_STEPS, list_actions: bool = True):
        try:
            import textworld  # noqa: F401
            from alfworld.agents.environment.alfred_tw_env import AlfredDemangler  # noqa: F401
        except ImportError as e:
            raise ImportError(f"alfworld needs `pip install alfworld==0.4.2 \"textworld[pddl]\"` ({e})") from None
        alfworld_data_dir(split)  # fail early, with the message that says how to get the data
        self.split, self.max_steps, self.list_actions = split, max_steps, list_actions
        self.instruction = ("You are in a household. Complete the task given in the first observation. Each turn, "
                            "reply with exactly one " + ("of the listed admissible actions." if list_actions else
                                                         "action, e.g. 'go to desk 1' or 'take pen 1 from desk 1'."))
        self._rng = random.Random(seed)
        self._games = None
        self.actions, self.done, self.tw = (), True, None

    def reset(self, seed=None) -> str:
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
        if self._games is None:
            self._games = alfworld_games(self.split)
        self.episode_seed = _seed_from(self._rng, seed)
        self.game_file = self._games[self.episode_seed % len(self._games)]
        if self.tw is not None:
            self.tw.close()
        infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
        with _quiet():
            self.tw = textworld.start(str(self.game_file), request_infos=infos,
                                      wrappers=[AlfredDemangler(), AlfredInfos])
            state = self.tw.reset()
        self.steps, self.done = 0, False
        text = state.feedback.replace("-= Welcome to TextWorld, ALFRED! =-", "").strip()
        self.task = text.split("Your task is to: ")[-1].strip()
        return self._render(text, state)

    def walkthrough(self) -> list[str]:
        """The expert action list shipped with the current game (a test oracle and a baseline)."""
        return json.loads(self.game_file.read_text())["walkthrough"]

    def _render(self, text: str, state) -> str:
        self.actions = tuple(c for c in state["admissible_commands"] if c not in ("help",))
        listed = "\nAdmissible actions: " + ", ".join(self.actions) + "." if self.list_actions else ""
        return " ".join(text.split()) + listed

    def step(self, reply: str):
        action, info = begin_step(self, reply)
        if action is None:
            obs, over = invalid_text(reply, self.actions), False
        else:
            state, _, over = self.tw.step(action)
            info["success"] = bool(state["won"])
            obs = self._render(state.feedback, state)
        self.done = info["success"] or over or self.steps >= self.max_steps
        reward = 1.0 if info["success"] else (-1.0 if self.done else 0.0)
        return obs, reward, self.done, info


# ----------------------------------------------------------------------------------------------- WebShop

_PRICE_CLAUSE = re.compile(r", and price lower than [\d.]+ dollars$")
_OPTION_CLAUSE = re.compile(r" with [^,:]+: .*$")


def shop_queries(instruction: str) -> tuple[str, ...]:
    """The tiny actor's searches, from the instruction: without its price clause (the goal's product is on
    the first results page for ~91% of goals), the product description alone (without "find me" and the
    options), and that description's words before the first "with"/"for"."""
    text = _PRICE_CLAUSE.sub("", instruction.lower())
    product = _OPTION_CLAUSE.sub("", text).removeprefix("find me ")
    head = re.split(r" with | for ", product)[0]
    return tuple(dict.fromkeys(f"search[{q}]" for q in (text, product, head) if q))


@task("webshop")
class WebShop(Task):
    """WebShop's small setting (webshop.py: the original's pages, search and reward). The observation is the
    page in the original's `text` mode and the available actions (as ROLL, whose setup the authors use,
    shows them); any `search[...]` and the page's `click[...]` act, anything else changes nothing. Reward
    at `buy now` in [0, 1]; success is reward 1. `.actions` is what a constrained (tiny) actor may reply:
    the page's clicks, or on the search page the queries of `shop_queries`. Goals: seed s plays goal
    s mod N of the split, test = the first 500 goals of the original order, train = the other 6,410."""

    instruction = ("You are shopping on a website for the product described after 'Instruction:'. Reply "
                   "search[QUERY] on the search page, or click[BUTTON] with one of the available buttons (a "
                   "product ID, an option, description, features, reviews, < prev, next >, back to search, "
                   "buy now). Buy the product that matches the instruction, with the requested options.")
    budget = webshop.MAX_STEPS   # [release: 10]
    held_out_split = "test"
    options = ("list_actions",)

    def __init__(self, seed=None, split: str = "train", max_steps: int = MAX_STEPS,
                 build_seed: int = webshop.BUILD_SEED, list_actions: bool = True):
        if split not in ("train", "test"):
            raise ValueError(f"unknown WebShop split {split!r}; choose train or test")
        self.list_actions = list_actions   # False: the page alone (a constrained reply is masked to its clicks)
        self.shop = webshop.build_shop(build_seed)
        held_out = webshop.TEST_GOALS
        self.goals = self.shop.goals[:held_out] if split == "test" else self.shop.goals[held_out:]
        self.max_steps = min(max_steps, webshop.MAX_STEPS)  # the authors' 10; a smaller limit still applies
        self._rng = random.Random(seed)
        self.actions, self.done = (), True

    def reset(self, seed=None) -> str:
        self.episode_seed = _seed_from(self._rng, seed)
        self.goal = self.goals[self.episode_seed % len(self.goals)]
        self.site = webshop.Site(self.shop, self.goal, random.Random(self.episode_seed))
        self.steps, self.done = 0, False
        return self.render()

    def render(self) -> str:
        clicks = [f"click[{c}]" for c in self.site.clickables() if c != "search"]
        search = self.site.page == "search"
        self.actions = shop_queries(self.goal["instruction_text"]) if search else tuple(clicks)
        shown = (["search[<your query>]"] if search else clicks) if self.list_actions else []
        return self.site.text() + ("\nAvailable actions: " + ", ".join(shown) if shown else "")

    def parse(self, reply: str, actions=None):
        """The reply's action as the site parses it ((name, argument)), or None where it would do nothing."""
        return self.site.parse(answer_text(reply))

    def step(self, reply: str):
        action, info = begin_step(self, reply, self.parse)
        if action is not None:
            self.site.act(*action)
            info["action"] = f"{action[0]}[{action[1]}]"
        reward = self.site.reward or 0.0
        info["success"] = reward == 1.0
        obs = self.render()
        self.done = self.site.page == "done" or self.steps >= self.max_steps
        return obs, reward, self.done, info


# ------------------------------------------------------------------------------------------------- Vault

_VAULT_WORDS = (   # no word holds a door word ("beast" would hold "east"), so a name never names a door
    ("amber azure beige black blue bronze brown coral cream crimson cyan ebony emerald gold green grey indigo "
     "ivory jade khaki lemon lilac lime magenta maroon mauve mint navy ochre olive orange peach pearl pink "
     "plum purple red rose ruby rust saffron sage scarlet silver tan teal violet white").split(),
    ("granite marble copper iron oak cedar glass velvet silk stone brass clay steel tin wool linen slate "
     "chalk flint quartz cobalt pewter birch maple pine willow bamboo cotton leather paper porcelain crystal "
     "basalt timber canvas wicker ancient quiet hollow silent frozen gentle hidden narrow rusty sunken misty "
     "humble").split(),
    ("heron otter badger falcon fox hare lynx moth newt owl raven salmon seal swan tiger wolf yak zebra bison "
     "camel crane deer eagle ferret gecko ibis koala lark llama mole panda pike quail robin shark sparrow toad "
     "trout viper walrus wren anchor lantern kettle compass bell harp crown").split(),
)
VAULT_MEMORYLESS_BEST = 3 / 8   # three distinct doors of eight, the secret uniform: the best without memory


def _stable_hash(text: str) -> int:
    """64 bits of blake2b: the same in every process (Python's hash() of a str is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def vault_name(seed: int) -> str:
    """The vault a seed plays: three words, one from each vocabulary (seed 3: 'peach misty newt'). There are
    48**3 names, so a few seeds share one, and with it the vault."""
    h, words = _stable_hash(f"vault name {int(seed)}"), []
    for vocab in _VAULT_WORDS:
        h, i = divmod(h, len(vocab))
        words.append(vocab[i])
    return " ".join(words)


def vault_secret(name: str) -> str:
    """The door that opens a vault: a function of the name alone (two seeds with one name are one vault),
    drawn by a hash, so no rule shared across vaults (no word, no seed arithmetic) predicts it."""
    return _MOVES[_stable_hash(f"vault door {name}") % len(_MOVES)]


def vault_door(seed: int) -> str:
    """The door that opens the vault episode seed `seed` plays: what a lesson about that vault should name."""
    return vault_secret(vault_name(seed))


def vault_held_out(name: str) -> bool:
    """Whether a vault name is in the held-out eighth of names: evaluation plays only these, training draws
    none of them (draw_training_seed), so no held-out vault was ever seen in training, under any seed."""
    return _stable_hash(f"vault split {name}") % 8 == 0


@functools.lru_cache(maxsize=32)
def balanced_seeds(n: int, first: int, name_of, kind_of, kinds: tuple, split: bool) -> tuple[int, ...]:
    """The first n seeds from `first` up whose vaults are of `kinds` (and, with `split`, held-out names), with
    distinct names and balanced kinds (each kind n // len(kinds) of them, the first n % len(kinds) one more)."""
    quota = {kind: n // len(kinds) + (i < n % len(kinds)) for i, kind in enumerate(kinds)}
    seeds, names, seed = [], set(), first
    while len(seeds) < n:
        name = name_of(seed)
        kind = kind_of(name)
        if quota.get(kind) and name not in names and (not split or vault_held_out(name)):
            quota[kind] -= 1
            names.add(name)
            seeds.append(seed)
        seed += 1
    return tuple(seeds)


def vault_held_out_seeds(n: int, first: int) -> tuple[int, ...]:
    """The first n seeds from `first` up whose vaults are held out, with distinct names and balanced doors (each
    door opens n // 8 of them, the first n % 8 doors one more): an actor that plays a fixed order of doors then
    scores the same whichever doors it plays, so the evaluation is no lottery over its door order."""
    return balanced_seeds(n, first, vault_name, vault_secret, _MOVES, True)


SHOWN_DOOR_RE = re.compile(r"The (\w+) door (?:of the [\w ]+ vault opens|would have opened)")


def vault_shown_door(transcript: list[tuple[str, str]]) -> str | None:
    """The door a vault episode's transcript shows to open (the opened one, or the one a reveal names), if any:
    what an oracle extractor writes (--extractor oracle)."""
    for who, text in transcript:
        found = SHOWN_DOOR_RE.search(text) if who == "environment" else None
        if found:
            return found.group(1)
    return None


@task("vault")
@task("vault-reveal", reveal=True)
class Vault(Task):
    """A vault with eight doors, one of which opens. The vault's name, shown in the first observation, is
    all that tells vaults apart; its open door is `vault_secret(name)` and is shown by nothing until it
    opens. So the task is pure memory: the best an actor without memory can do is try three distinct doors,
    success 3/8 (`VAULT_MEMORYLESS_BEST`; guessing uniformly with repeats: 1 - (7/8)**3 = 0.33), while an
    actor that remembers this vault's door (from the experience bank) opens it at the first try.

    Reward 1 when the door opens; 0 when `tries` doors turned out locked (a repeated door uses a try too) or
    the step limit came first. An invalid reply uses a step but not a try. A locked door's observation lists
    every door tried so far, so an actor that reads only the last observation can still avoid repeats.

    `vault-reveal` (reveal=True): a lost episode's last observation names the door that would have opened, so
    a loss's transcript holds the answer as a win's does: every episode can teach, not only a won one.
    Held out: the held-out eighth of names (vault_held_out), doors balanced; training draws none of them."""

    actions = _MOVES
    reveal = False
    name_of = staticmethod(vault_name)       # the vault a seed plays
    door_of = staticmethod(vault_secret)     # the door that opens a named vault

    @classmethod
    def held_out(cls, name: str) -> bool:
        """Whether training never draws the vault `name`."""
        return vault_held_out(name)

    @classmethod
    def held_out_seeds(cls, n: int, first: int) -> tuple[int, ...]:
        return vault_held_out_seeds(n, first)

    @classmethod
    def training_seed(cls, rng: np.random.Generator, below: int) -> int:
        """rng.integers(below), drawn again while it is a held-out vault's."""
        for _ in range(1000):
            seed = int(rng.integers(below))
            if not cls.held_out(cls.name_of(seed)):
                return seed
        raise ValueError(f"every vault among training seeds below {below} is held out: use a larger "
                         "--train-instances")

    @classmethod
    def answer(cls, seed: int) -> str:
        return cls.door_of(cls.name_of(seed))

    def __init__(self, seed=None, max_steps: int = MAX_STEPS, tries: int = 3, reveal: bool | None = None):
        if tries < 1:
            raise ValueError(f"vault needs tries >= 1, got {tries}")
        self.max_steps, self.tries = max_steps, tries
        self.reveal = self.reveal if reveal is None else reveal
        self.instruction = (f"You are in a vault with eight doors. One door opens; the others are locked. You "
                            f"have {tries} tries. The same vault (same name) always opens by the same door. "
                            f"Actions: {', '.join(_MOVES)}.")
        self._rng = random.Random(seed)
        self.done = True

    def reset(self, seed=None) -> str:
        self.episode_seed = _seed_from(self._rng, seed)
        self.name = self.name_of(self.episode_seed)
        self.secret = self.door_of(self.name)
        self.steps, self.done, self.tried = 0, False, []
        return (f"You are in the {self.name} vault. Eight doors lead out; one of them opens. "
                f"Tries left: {self.tries}.")

    def step(self, reply: str):
        action, info = begin_step(self, reply)
        if action is None:
            obs = invalid_text(reply, self.actions)
        elif action == self.secret:
            info["success"] = True
            obs = f"The {action} door of the {self.name} vault opens. You are out."
        else:
            self.tried.append(action)
            left = self.tries - len(self.tried)
            obs = (f"The {action} door is locked. Locked doors: {', '.join(dict.fromkeys(self.tried))}. "
                   + (f"Tries left: {left}." if left else "No tries left: the vault stays shut."))
        info["tries_used"] = len(self.tried) + info["success"]
        self.done = info["success"] or len(self.tried) >= self.tries or self.steps >= self.max_steps
        if self.done and not info["success"] and self.reveal:
            obs += f" The {self.secret} door would have opened."
        return obs, float(info["success"]), self.done, info


# The family vault's families. Seen, with their doors: in the order the variants take them (vault-familyF trains on
# the first F), so the seen doors are balanced for F = 2, 4, 6, 8, 16 (distinct up to 8, each twice at 16). Control:
# never drawn in training, each vault's door its name's own secret (vault_secret), so nothing, in weights or in a
# lesson of the seen family a control name resembles, tells it (fixed doors made a served lesson right 0.4% to 12%
# of the time, by which seen family was nearest). Words chosen greedily for the least cosine between families'
# retrieval queries under all-MiniLM-L6-v2 (probes/retrieval.py), none holding a door word.
VAULT_FAMILIES = {
    "volleyball": "north", "telescope": "south", "samurai": "east", "penguin": "west",
    "saxophone": "northeast", "tornado": "southwest", "popcorn": "southeast", "vampire": "northwest",
    "jellyfish": "north", "dinosaur": "south", "cobra": "east", "tractor": "west",
    "igloo": "northeast", "cactus": "southwest", "lemon": "southeast", "robot": "northwest",
}
VAULT_CONTROL = ("zombie", "submarine", "meteor", "spider", "hamburger", "carnival", "pirate", "waterfall")
_ALL_FAMILIES = (*VAULT_FAMILIES, *VAULT_CONTROL)


def family_vault_name(seed: int) -> str:
    """The family vault a seed plays: its family's word, then a serial number (seed 3: 'carnival 3050'): the number
    embeds weakly, so the family dominates the retrieval query. 24 families x 9000 numbers, a function of the seed
    alone (the same in every variant)."""
    h, k = divmod(_stable_hash(f"vault family {int(seed)}"), len(_ALL_FAMILIES))
    return f"{_ALL_FAMILIES[k]} {1000 + h % 9000}"


def vault_family(name: str) -> str:
    return name.split(" ")[0]


def family_door(name: str) -> str:
    """The door of a family vault: a seen family's, a control vault's own (vault_secret)."""
    return VAULT_FAMILIES.get(vault_family(name)) or vault_secret(name)


def control_door(name: str) -> str | None:
    """A control vault's door; None for a seen family's (balanced_seeds then skips it)."""
    return vault_secret(name) if vault_family(name) in VAULT_CONTROL else None


@task("vault-family", families=8)
@task("vault-family2", families=2)
@task("vault-family4", families=4)
@task("vault-family6", families=6)
@task("vault-family6-reveal", families=6, reveal=True)
@task("vault-family16", families=16)
class VaultFamily(Vault):
    """The vault, each named by one of 24 families and a serial number; a seen family fixes the door (a control
    vault's is its own name's, see VAULT_CONTROL). Training draws
    vaults of the first `families` (F) of VAULT_FAMILIES only, never a held-out name, so a memoryless learner can
    learn family -> door in its weights and a lesson written in one vault helps every vault of its family.
    Held out, two panels of distinct names, doors balanced (by family) in each: transfer (held_out_seeds), the
    held-out names of the F seen families; control (control_seeds), vaults of VAULT_CONTROL's eight families, doors
    balanced, which nothing carries to: the memoryless best there is 3/8. The text is the vault's, the instruction
    too: the family's rule is for the learner to find (told, it would be false on the control).
    `vault-family6-reveal`: F = 6 with the reveal (a lost episode's last observation names its door, as
    `vault-reveal`), so a family's first lesson can come from a loss: without it a family whose episodes with lessons
    were all served another family's door and lost never got a lesson of its own (results/family-smollm2/). An actor
    without a bank plays it token for token as `vault-family6`: the reveal comes after its last move."""

    families = 8
    name_of = staticmethod(family_vault_name)
    door_of = staticmethod(family_door)

    @classmethod
    def seen(cls) -> tuple[str, ...]:
        return tuple(VAULT_FAMILIES)[:cls.families]

    @classmethod
    def held_out(cls, name: str) -> bool:
        return vault_family(name) not in cls.seen() or vault_held_out(name)

    @classmethod
    def held_out_seeds(cls, n: int, first: int) -> tuple[int, ...]:
        return balanced_seeds(n, first, cls.name_of, vault_family, cls.seen(), True)

    @classmethod
    def control_seeds(cls, n: int, first: int) -> tuple[int, ...]:
        return balanced_seeds(n, first, cls.name_of, control_door, _MOVES, False)

    @classmethod
    def panels(cls, n: int, first: int) -> dict[str, tuple[int, ...]]:
        return {"": cls.held_out_seeds(n, first), "control": cls.control_seeds(n, first)}

    @classmethod
    def panel_of(cls, seed: int) -> str:
        return "control" if vault_family(cls.name_of(seed)) in VAULT_CONTROL else ""


# -------------------------------------------------------------------------------------------------- make

def make(task: str, seed=None, **kwargs):
    """The env of a registered task (TASKS). `seed` seeds the env's own generator of episode seeds, used when
    reset() is called without one; reset(seed) always replays that exact episode."""
    return task_class(task)(seed=seed, **kwargs)


# ------------------------------------------------------------------------------------------- the pool

class EnvPool:
    """Environments are reused across iterations (MiniHack construction is the slow part). Evaluation draws
    ALFWorld games and WebShop goals from their held-out splits (Task.held_out_split), training from train.
    Each task gets the settings among show_map and list_actions it takes (Task.options)."""

    def __init__(self, show_map: bool = True, steps=task_steps, workers: int = 0, list_actions: bool = True):
        self.free: dict[tuple, list] = {}
        self.show_map, self.steps, self.list_actions = show_map, steps, list_actions   # steps(task): its actions
        self.workers = GameWorkers(workers) if workers else None

    def take(self, task, train=True):
        key = (task, train)
        if self.free.get(key):
            return self.free[key].pop()
        cls = task_class(task)
        kw = {"max_steps": self.steps(task), **{option: getattr(self, option) for option in cls.options}}
        if cls.held_out_split:
            kw["split"] = "train" if train else cls.held_out_split
        return self.workers.make(task, **kw) if self.workers else make(task, **kw)

    def give(self, task, train, env):
        self.free.setdefault((task, train), []).append(env)

    def reset_all(self, games: list, seeds: list) -> list[str]:
        if self.workers:
            return self.workers.call("reset", games, seeds)
        return [game.reset(seed=seed) for game, seed in zip(games, seeds)]

    def step_all(self, games: list, replies: list[str]) -> list[tuple]:
        if self.workers:
            return self.workers.call("step", games, replies)
        return [game.step(reply) for game, reply in zip(games, replies)]


# ------------------------------------------------------------------------------------------ worker processes

class GameWorkers:
    """Games in worker processes, so that slow engines (ALFWorld's resets, NLE's steps, WebShop's search) run
    side by side. Game k lives in worker k mod n for its whole life, and one message per worker carries all of
    a call's resets or steps. An episode depends only on its game's seed and the replies, so the results do
    not depend on the number of workers."""

    def __init__(self, n: int):
        ctx = multiprocessing.get_context("spawn")   # fork beside torch's threads is unsafe; macOS spawns anyway
        self.conns, self.procs, self.made = [], [], 0
        for _ in range(n):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=serve_games, args=(child,), daemon=True)
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)
        weakref.finalize(self, GameWorkers.stop, self.conns, self.procs)

    def make(self, task: str, **kwargs) -> "RemoteGame":
        game = RemoteGame(self, self.made)
        self.made += 1
        self.call("make", [game], [(task_class(task).__module__, task, kwargs)])
        return game

    def call(self, op: str, games: list, args: list) -> list:
        """`op` ("make", "reset" or "step") on each game with its argument, all workers at once: the results
        in the games' order. Each game's view (RemoteGame) is refreshed from its worker."""
        jobs = [[] for _ in self.conns]
        for game, arg in zip(games, args):
            jobs[game.gid % len(jobs)].append((game.gid, arg))
        busy = [(conn, js) for conn, js in zip(self.conns, jobs) if js]
        for conn, js in busy:
            conn.send((op, js))
        answers, errors = {}, []
        for conn, js in busy:   # read every answer before raising, so no worker is left out of step
            status, out = conn.recv()
            if status == "error":
                errors.append(out)
            else:
                answers.update(zip((gid for gid, _ in js), out))
        if errors:
            raise RuntimeError("a game worker failed:\n" + errors[0])
        results = []
        for game in games:
            result, game.view = answers[game.gid]
            results.append(result)
        return results

    @staticmethod
    def stop(conns, procs):
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        for proc in procs:
            proc.join(timeout=5)


class RemoteGame:
    """A game in a GameWorkers process, seen as of its last call: what the trainer reads of a game, and reset
    and step one at a time (GameWorkers.call does many at once)."""

    def __init__(self, workers: GameWorkers, gid: int):
        self.workers, self.gid, self.view = workers, gid, {}

    instruction = property(lambda self: self.view["instruction"])
    actions = property(lambda self: self.view["actions"])
    failure_reward = property(lambda self: self.view["failure_reward"])

    def reset(self, seed=None) -> str:
        return self.workers.call("reset", [self], [seed])[0]

    def step(self, reply: str):
        return self.workers.call("step", [self], [reply])[0]


def serve_games(conn):
    """A worker's loop: it owns its games by id and answers each job with the game's result and its view."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the trainer's to handle; it stops us
    games = {}
    with contextlib.suppress(EOFError):            # the trainer is gone
        for op, jobs in iter(conn.recv, None):
            try:
                conn.send(("ok", [play_job(games, op, gid, arg) for gid, arg in jobs]))
            except Exception:
                conn.send(("error", traceback.format_exc()))


def play_job(games: dict, op: str, gid: int, arg):
    if op == "make":
        module, task, kwargs = arg
        if module != "__main__":    # a task of the trainer's own script registers itself there under spawn
            importlib.import_module(module)
        games[gid] = make(task, **kwargs)
        result = None
    else:
        result = getattr(games[gid], op)(arg)      # reset(seed) or step(reply)
    game = games[gid]
    view = {"instruction": game.instruction, "actions": tuple(game.actions),
            "failure_reward": getattr(game, "failure_reward", 0.0)}
    return result, view


def play(task: str, seed=None, inp=sys.stdin, out=sys.stdout, **kwargs):
    """Play in the terminal, seeing exactly what the actor sees; one action per input line."""
    env = make(task, **kwargs)
    obs = env.reset(seed)
    print(f"TASK {task}: {env.instruction}\n", file=out)
    total = 0.0
    while True:
        print(obs, file=out)
        if len(env.actions) <= 12:
            print(f"[actions: {', '.join(env.actions)}]", file=out)
        print("> ", end="", file=out, flush=True)
        line = inp.readline()
        if not line:
            print("\n(end of input)", file=out)
            break
        obs, reward, done, info = env.step(line.strip())
        total += reward
        if done:
            print(obs, file=out)
            print(f"episode over after {info['steps']} steps: success={info['success']} return={total:g}",
                  file=out)
            break
    return total


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("play", help="play a task in the terminal as the actor sees it")
    p.add_argument("task", help=f"one of {', '.join(TASKS)}, or MODULE:NAME (a task of your own)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--split", default=None, help="alfworld split (default train); webshop: train or test")
    p.add_argument("--no-map", action="store_true", help="MiniHack without the character map (the tiny actor's view)")
    d = sub.add_parser("alfworld-data", help="unpack the ALFWorld games into $ALFWORLD_DATA or the cache")
    d.add_argument("--split", action="append", choices=_ALFWORLD_SPLITS,
                   help="split(s) to unpack (repeatable; default all)")
    args = ap.parse_args(argv)
    if args.cmd == "play":
        cls = task_class(load_task(args.task))
        extra = {"split": args.split} if cls.held_out_split and args.split else {}
        if args.no_map:
            if "show_map" not in cls.options:
                sys.exit(f"error: --no-map applies to the MiniHack tasks ({', '.join(MINIHACK)}), not {args.task}")
            extra["show_map"] = False
        play(cls.task, args.seed, **extra)
    else:
        for split in args.split or _ALFWORLD_SPLITS:
            root = alfworld_data_dir(split)
        print(f"ALFWorld games ready under {root}")


if __name__ == "__main__":
    import envs   # the registry a task of your own registers in is envs's, not this __main__ copy's
    try:
        envs.main()
    except (ValueError, FileNotFoundError, ImportError) as e:
        sys.exit(f"error: {e}")
