"""Tests for envs.py against the real engines: MiniHack/NLE (positions from blstats of a raw env driven in
lockstep), hand-built Sokoban boards with hand-worked outcomes plus an independent BFS, and the real
ALFWorld games replayed from their shipped walkthroughs, and the vault's hand-worked episodes and statistics."""
import io
import json
import random
import re
import subprocess
import sys
from collections import deque
from pathlib import Path

import numpy as np
import pytest

import envs
import examples.parity  # noqa: F401  (a task of one's own, registered like the others: the protocol test plays it)
from envs import MOVE_OFFSETS

ROOT = Path(__file__).resolve().parent.parent
MINIHACK_TASKS = ["room", "maze", "keyroom", "river"]


# ------------------------------------------------------------------------------------------ shared parts

def test_make_unknown_task_lists_valid_names():
    with pytest.raises(ValueError) as e:
        envs.make("nethack-full")
    for name in ("room", "maze", "keyroom", "river", "sokoban", "alfworld", "webshop", "vault", "vault-reveal"):
        assert name in str(e.value)
    assert "@envs.task" in str(e.value) and "MODULE:NAME" in str(e.value)


MALFORMED = ["", "\x00\xff\ufffd garbage \x1b[2J", "x" * 20_000, "<answer></answer>", "<answer>", "\n\n", "🙂" * 50]


def _protocol_replies(env, rng):
    """A reply for the env as it is now: a valid action, a malformed one, or a valid one with extra text."""
    roll = rng.random()
    if roll < 0.25:
        return rng.choice(MALFORMED)
    action = rng.choice(env.actions) if env.actions else "look"
    return f"{action} {rng.choice(['please', 'now!', 'and then north'])}" if roll < 0.4 else action


def _protocol_episode(env, seed, malformed=False):
    """reset(seed), then random valid and malformed replies (drawn from `seed`; only malformed ones with
    `malformed`) to the end: what it saw."""
    rng, seen = random.Random(seed), [env.reset(seed)]
    assert isinstance(seen[0], str)
    for t in range(1, env.max_steps + 1):
        reply = rng.choice(MALFORMED) if malformed else _protocol_replies(env, rng)
        obs, reward, done, info = env.step(reply)
        seen.append((reply, obs, reward, done, info["success"], info["invalid"]))
        assert isinstance(obs, str) and isinstance(done, bool) and np.isfinite(reward)
        assert info["steps"] == t and isinstance(info["success"], bool) and isinstance(info["invalid"], bool)
        assert reply.strip() or info["invalid"]       # an empty reply names no action
        if done:
            return seen
    raise AssertionError(f"not done after max_steps={env.max_steps} steps")


@pytest.mark.parametrize("task", list(envs.TASKS))
def test_task_protocol(task):
    """Every registered task keeps envs.Task's protocol: random valid and malformed replies (empty, garbage,
    20,000 bytes, an action with extra text) never raise and end within max_steps; observations are text, the
    final reward finite and within reward_range; the same seed replays the same episode; a finished episode
    refuses a step; nothing but malformed replies ends at the step limit; held-out and training seeds are apart."""
    cls = envs.TASKS[task]
    kw = {"split": cls.held_out_split} if cls.held_out_split else {}   # alfworld: valid_unseen, as its tests play
    env = envs.make(task, max_steps=min(cls.budget, 10), **kw)     # 10: alfworld's 30 steps take 10 s an episode
    assert isinstance(env, envs.Task) and env.task == task and isinstance(env.instruction, str) and env.instruction
    assert env.max_steps == min(cls.budget, 10) and set(cls.options) <= {"show_map", "list_actions"}
    low, high = cls.reward_range
    first = _protocol_episode(env, 1_000_000_003)
    assert low <= first[-1][2] <= high
    assert _protocol_episode(env, 1_000_000_003) == first     # reset(seed) replays it exactly, after an episode
    with pytest.raises(ValueError, match="reset"):
        env.step(env.actions[0] if env.actions else "look")
    junk = _protocol_episode(env, 5, malformed=True)   # nothing but invalid replies: the step limit ends it
    assert len(junk) == env.max_steps + 1 and all(invalid for *_, invalid in junk[1:])
    assert low <= junk[-1][2] <= high and not any(success for *_, success, _ in junk[1:])
    held = envs.held_out_seeds(task, 4, 1_000_000_000)
    rng = np.random.default_rng(0)
    drawn = {envs.draw_training_seed(task, rng, 1_000_000_000) for _ in range(20)}
    assert len(set(held)) == 4 and not drawn & set(held)
    assert envs.held_out_panels(task, 4, 1_000_000_000)[""] == held and envs.task_steps(task) == cls.budget
    assert all(envs.panel_of(task, s) == k for k, seeds in envs.held_out_panels(task, 4, 10**9).items() for s in seeds)


def test_a_task_registers_once_by_its_class():
    """@task registers one class as several tasks; make(), TASKS and load_task read that registry; another class
    taking a registered name is refused."""
    assert envs.TASKS["vault-reveal"].reveal and not envs.TASKS["vault"].reveal
    assert {t for t, c in envs.TASKS.items() if issubclass(c, envs.MiniHackEnv)} == set(envs.MINIHACK)
    assert envs.load_task("vault") == "vault" and envs.load_task("examples.parity:parity") == "parity"
    with pytest.raises(ValueError, match="registered twice"):
        envs.task("vault")(type("Other", (envs.Task,), {}))
    with pytest.raises(ValueError, match="unknown task"):
        envs.load_task("examples.parity:nope")
    with pytest.raises(ModuleNotFoundError):
        envs.load_task("no_such_module:parity")


def test_a_task_of_ones_own_plays_in_game_workers():
    """A game worker process imports the module that registered its task: the parity task plays there as here."""
    pool = envs.EnvPool(workers=1)
    game, here = pool.take("parity"), envs.make("parity")
    assert pool.reset_all([game], [5]) == [here.reset(5)]
    assert pool.step_all([game], ["odd"]) == [here.step("odd")]


def test_parse_action_formats():
    acts = ("north", "south", "pickup")
    assert envs.parse_action("north", acts) == "north"
    assert envs.parse_action("  NORTH \n", acts) == "north"
    assert envs.parse_action("<answer>South</answer>", acts) == "south"
    assert envs.parse_action("I think north. <answer> pickup </answer>", acts) == "pickup"
    assert envs.parse_action("<answer>north</answer> then <answer>south</answer>", acts) == "south"
    assert envs.parse_action("go north", acts) is None
    assert envs.parse_action("<answer>up</answer>", acts) is None
    assert envs.parse_action("", acts) is None


# --------------------------------------------------------------------------------------------- MiniHack

def _raw_env(task):
    """The engine built directly with gymnasium (not through envs.py), same level and crop size."""
    import gymnasium as gym
    import minihack  # noqa: F401
    spec = envs.MINIHACK[task]
    return gym.make(spec.env_id, observation_keys=("chars_crop", "blstats", "message"),
                    obs_crop_h=spec.crop, obs_crop_w=spec.crop, fix_moon_phase=True).unwrapped


def _raw_action(env, name):
    from nle import nethack
    cmd = {"north": nethack.CompassDirection.N, "south": nethack.CompassDirection.S,
           "east": nethack.CompassDirection.E, "west": nethack.CompassDirection.W,
           "northeast": nethack.CompassDirection.NE, "northwest": nethack.CompassDirection.NW,
           "southeast": nethack.CompassDirection.SE, "southwest": nethack.CompassDirection.SW,
           "pickup": nethack.Command.PICKUP, "apply": nethack.Command.APPLY}[name]
    return env.actions.index(cmd)


def _crop_rows(raw):
    rows = ["".join(chr(c) if c else " " for c in row) for row in raw["chars_crop"]]
    keep = [r for r in range(len(rows)) if rows[r].strip()]
    cols = [c for c in range(len(rows[0])) if any(row[c] != " " for row in rows)]
    return [rows[r][cols[0]:cols[-1] + 1].rstrip() for r in range(keep[0], keep[-1] + 1)]


@pytest.fixture(scope="module")
def mh():
    """One wrapper and one raw env per task, reused (as the wrapper itself reuses its engine)."""
    return {t: (envs.make(t), _raw_env(t)) for t in MINIHACK_TASKS}


@pytest.mark.parametrize("task", MINIHACK_TASKS)
def test_minihack_moves_like_raw_env(mh, task):
    """Same seed, same actions: the agent's position (blstats) and the cropped map match the raw engine
    at every step; invalid replies in between leave the game where it was."""
    env, raw = mh[task]
    rng = random.Random(task)
    for seed in (3, 11):
        obs = env.reset(seed)
        raw.seed(seed, seed, reseed=False)
        robs, _ = raw.reset()
        assert obs.split("\n")[:len(_crop_rows(robs))] == _crop_rows(robs)
        for t in range(25):
            if t % 7 == 3:
                obs, reward, done, info = env.step("do a little dance")
                assert info["invalid"] and reward == 0 and not done
                assert info["pos"] == tuple(int(v) for v in robs["blstats"][:2])
                assert "not understood" in obs and "north" in obs
                continue
            name = rng.choice(env.actions)
            obs, reward, done, info = env.step(f"<answer>{name}</answer>" if t % 2 else name.upper())
            robs, rreward, term, trunc, rinfo = raw.step(_raw_action(raw, name))
            assert not info["invalid"]
            assert info["pos"] == tuple(int(v) for v in robs["blstats"][:2])
            assert info["success"] == (rinfo["end_status"] == raw.StepStatus.TASK_SUCCESSFUL)
            if term or trunc:
                assert done
                break
            assert obs.split("\n")[:len(_crop_rows(robs))] == _crop_rows(robs)
            if done:
                break


@pytest.mark.parametrize("task", MINIHACK_TASKS)
def test_minihack_observation_text(mh, task):
    """The agent is drawn, every symbol in the map is in the legend, and things that are neither floor
    nor wall are located relative to the agent exactly where the raw crop has them."""
    env, raw = mh[task]
    saw_thing = False
    for seed in range(8):
        obs = env.reset(seed)
        raw.seed(seed, seed, reseed=False)
        robs, _ = raw.reset()
        lines = obs.split("\n")
        k = next(i for i, line in enumerate(lines) if line.startswith("legend: "))
        assert "@" in "".join(lines[:k]) and "@=you" in lines[k]
        assert "Hello Agent" not in obs
        legend_syms = {entry.split("=")[0] for entry in lines[k][len("legend: "):].split(", ")}
        assert set("".join(lines[:k])) - {" "} <= legend_syms
        raw_chars = robs["chars_crop"]
        mid = raw_chars.shape[0] // 2
        for sym, word in ((">", "stairs down"), ("(", "key"), ("`", "boulder"), ("}", "water")):
            where = np.argwhere(raw_chars == ord(sym))
            if len(where) == 0:
                continue
            saw_thing = True
            line = next(line for line in lines if line.startswith(f"{word} ({sym}): "))
            r, c = min(where.tolist(), key=lambda rc: (max(abs(rc[0] - mid), abs(rc[1] - mid)),
                                                      abs(rc[0] - mid) + abs(rc[1] - mid)))
            dx, dy = c - mid, r - mid
            n = min(abs(dx), abs(dy))  # diagonal moves first, then the straight rest
            expect = ", ".join(p for p in (
                f"{n} {'south' if dy > 0 else 'north'}{'east' if dx > 0 else 'west'}" if n else "",
                f"{abs(dx) - n} {'east' if dx > 0 else 'west'}" if abs(dx) > n else "",
                f"{abs(dy) - n} {'south' if dy > 0 else 'north'}" if abs(dy) > n else "") if p)
            assert line.split(": ")[1].split("; ")[0] == expect
        assert len(obs) < (350 if task == "river" else 250), obs
    assert saw_thing or task == "room"


@pytest.mark.parametrize("task", ["room", "keyroom"])
def test_minihack_without_map_is_the_full_view_less_map_and_legend(mh, task):
    """show_map=False (the tiny preset's view) plays the same game and shows exactly the position and
    message lines of the full view, which the test above checks against the raw crop."""
    full, _ = mh[task]
    bare = envs.make(task, show_map=False)
    rng = random.Random(7)
    seen = set()
    for seed in range(4):
        a, b = full.reset(seed), bare.reset(seed)
        for _ in range(30):
            lines = a.split("\n")
            k = next((i for i, line in enumerate(lines) if line.startswith("legend: ")), -1)
            assert b == ("\n".join(lines[k + 1:]) or "(nothing notable in view)")
            assert "legend" not in b and "@" not in b
            seen.add(b.split(":")[0].split(" (")[0])
            action = rng.choice(full.actions)
            (a, _, done, info), (b, _, done_b, info_b) = full.step(action), bare.step(action)
            assert (done, info["pos"], info["success"]) == (done_b, info_b["pos"], info_b["success"])
            if done:
                break
    assert {"room": {"stairs down", "message"}, "keyroom": {"key", "closed door"}}[task] <= seen


class MapAgent:
    """Scripted baseline for room, maze and keyroom that reads only the text the actor reads: it keeps the
    cells it has seen (anchored by info['pos']), walks by BFS to the stairs when known, otherwise to the
    nearest unexplored edge; in keyroom it first fetches the key and unlocks the door."""

    def __init__(self):
        self.cells, self.special, self.has_key = {}, {}, False
        self._rng = random.Random(0)  # only for the rare dead end; keeps the baseline reproducible

    def observe(self, obs: str, info: dict):
        lines = obs.split("\n")
        k = next(i for i, line in enumerate(lines) if line.startswith("legend: "))
        grid = lines[:k]
        ar, ac = next((r, row.index("@")) for r, row in enumerate(grid) if "@" in row)
        x, y = info["pos"]
        for r, row in enumerate(grid):
            for c, ch in enumerate(row):
                if ch != " ":
                    self.cells[(x + c - ac, y + r - ar)] = ch
        for line in lines[k + 1:]:
            m = re.match(r"(.+) \((.)\): (.+)$", line)
            if not m or line.startswith("message: "):
                continue
            for part in m.group(3).split("; "):
                if part.startswith("+"):
                    continue
                dx = dy = 0
                for n, w in re.findall(r"(\d+) (\w+)", part):
                    dx, dy = dx + int(n) * MOVE_OFFSETS[w][0], dy + int(n) * MOVE_OFFSETS[w][1]
                self.special[(x + dx, y + dy)] = m.group(1)
        for dx, dy in MOVE_OFFSETS.values():  # NetHack always shows adjacent squares: blank there = rock
            self.cells.setdefault((x + dx, y + dy), "#")
        self.pos = (x, y)
        if re.search(r"^message: \w - .*key", obs, re.M):  # NetHack's pickup line: "h - a key named ..."
            self.has_key = True

    def _passable(self, p):
        ch, name = self.cells.get(p, " "), self.special.get(p, "")
        if ch in " -|+`}#" and name not in ("open door", "doorway", "broken door"):
            return False
        return name not in ("closed door",)

    def _bfs(self, goal_fn):
        """First move of a shortest path to a cell satisfying goal_fn (None if unreachable)."""
        start = self.pos
        prev = {start: None}
        queue = deque([start])
        while queue:
            p = queue.popleft()
            if p != start and goal_fn(p):
                while prev[p] != start:
                    p = prev[p]
                d = (p[0] - start[0], p[1] - start[1])
                return next(a for a, s in MOVE_OFFSETS.items() if s == d)
            for a, (dx, dy) in MOVE_OFFSETS.items():
                q = (p[0] + dx, p[1] + dy)
                doorish = "door" in self.special.get(q, "") or "door" in self.special.get(p, "")
                if q in prev or not self._passable(q) or (dx and dy and doorish):
                    continue
                if not goal_fn(q) and q not in self.cells:
                    continue
                prev[q] = p
                queue.append(q)
        return None

    def _frontier(self, p):
        return p in self.cells and self._passable(p) and any(
            (p[0] + dx, p[1] + dy) not in self.cells for dx, dy in MOVE_OFFSETS.values())

    def act(self, obs: str, info: dict) -> str:
        self.observe(obs, info)
        where = {name: [p for p, n in self.special.items() if n == name] for name in set(self.special.values())}
        if where.get("stairs down"):
            move = self._bfs(lambda p: p in where["stairs down"])
            if move:
                return move
        if where.get("key") and not self.has_key:
            if self.pos in where["key"] or "You see here a key" in obs:
                self.has_key = True
                return "pickup"
            move = self._bfs(lambda p: p in where["key"])
            if move:
                return move
        doors = where.get("closed door", [])
        if self.has_key and doors:
            if any(max(abs(d[0] - self.pos[0]), abs(d[1] - self.pos[1])) == 1 for d in doors):
                return "apply"
            move = self._bfs(lambda p: self._passable(p) and any(
                max(abs(d[0] - p[0]), abs(d[1] - p[1])) == 1 for d in doors))
            if move:
                return move
        return self._bfs(self._frontier) or self._rng.choice(list(MOVE_OFFSETS))


@pytest.mark.parametrize("task", ["room", "maze", "keyroom"])
def test_minihack_scripted_agent_reaches_goal(mh, task):
    """The text interface is enough to win: a BFS agent reading only the observations reaches the stairs
    (keyroom: fetches the key, unlocks the door with apply) on each of 6 seeds (the sweep is deterministic).
    Success gives reward 1 and ends the episode."""
    env, _ = mh[task]
    lost = []
    for seed in range(6):
        obs = env.reset(seed)
        agent, info, done = MapAgent(), {"pos": env.pos}, False
        while not done:
            obs, reward, done, info = env.step(agent.act(obs, info))
            assert reward == (1.0 if info["success"] else 0.0)
        if not info["success"]:
            lost.append(seed)
        assert ("task complete" in obs) == info["success"]
        if task == "keyroom" and info["success"]:
            assert info["steps"] >= 4  # walked, picked up, applied, walked on
    assert lost == []



def test_a_river_episode_is_won_through_the_text_interface():
    """River seed 0, a 13-move win found by random play and then shortened: the real engine pushes a boulder
    into the water, the agent crosses, and stepping onto the stairs ends the episode with reward 1."""
    env = envs.make("river")
    env.reset(seed=0)
    moves = ["east"] * 3 + ["west"] + ["east"] * 7 + ["northeast", "north"]
    outcomes = [env.step(move) for move in moves]
    assert "You push the boulder into the water. Now you can cross it!" in outcomes[5][0]
    assert [(reward, done) for _, reward, done, _ in outcomes[:-1]] == [(0.0, False)] * 12
    obs, reward, done, info = outcomes[-1]
    assert (reward, done, info["success"], info["steps"]) == (1.0, True, True, 13) and "task complete" in obs

def test_minihack_step_limit_and_done(mh):
    env, _ = mh["room"]
    env.reset(5)
    for t in range(1, env.max_steps + 1):
        obs, reward, done, info = env.step("wait")
        assert info["steps"] == t and info["invalid"] and reward == 0
        assert done == (t == env.max_steps)
    assert not info["success"]
    with pytest.raises(ValueError, match="reset"):
        env.step("north")


@pytest.mark.parametrize("task", ["room", "river"])
def test_minihack_seeded_determinism(task):
    def episode(env, seed):
        out = [env.reset(seed)]
        rng = random.Random(0)
        for _ in range(15):
            obs, r, done, info = env.step(rng.choice(env.actions))
            out.append(obs)
            if done:
                break
        return out
    a, b = envs.make(task), envs.make(task)
    assert episode(a, 7) == episode(b, 7)
    assert episode(a, 7) == episode(a, 7)  # reusing the engine across resets changes nothing
    assert len({envs.make(task).reset(s) for s in range(6)}) > 1
    # make(seed=) seeds the generator of episode seeds: fresh envs built with the same seed agree
    assert envs.make(task, seed=4).reset() == envs.make(task, seed=4).reset()


def test_minihack_quiet_and_writes_no_files(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    env = envs.make("keyroom")
    env.reset(1)
    for a in ("north", "pickup", "apply", "bogus", "east"):
        env.step(a)
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    assert list(tmp_path.iterdir()) == []


def test_play_in_process():
    """`play` prints what the actor sees and ends the episode when input ends or the game is over."""
    out = io.StringIO()
    envs.play("room", seed=2, inp=io.StringIO("east\nwest\n"), out=out)
    text = out.getvalue()
    assert "TASK room" in text and "legend: @=you" in text and "[actions: north" in text


# ---------------------------------------------------------------------------------------------- Sokoban

BOARD = """
######
#@.o.#
#.B..#
#.oB.#
#....#
######
"""


def test_sokoban_board_roundtrip_and_legend():
    env = envs.Sokoban.from_text(BOARD)
    obs = env.render()
    assert obs.split("\n")[:6] == BOARD.strip().split("\n")
    assert "legend: @=you, #=wall, .=floor, o=target, B=box" in obs
    assert "box (B): 1 right, 1 down; 2 right, 2 down" in obs
    assert "target (o): 2 right; 1 right, 2 down" in obs


def test_sokoban_moves_pushes_and_walls():
    env = envs.Sokoban.from_text(BOARD)
    obs, r, done, info = env.step("up")  # wall
    assert env.player == (1, 1) and "blocked" in obs and info["steps"] == 1 and not info["invalid"]
    env.step("right")  # (1,2)
    obs, r, done, info = env.step("down")  # pushes the box at (2,2) to (3,2), a target
    assert env.player == (2, 2) and env.boxes[3, 2] and not env.boxes[2, 2]
    assert env.grid()[3] == "#.XB.#" and r == 0 and not done
    obs, r, done, info = env.step("down")  # box at (3,2) would go to (4,2): free, so it moves off the target
    assert env.player == (3, 2) and env.boxes[4, 2]
    obs, r, done, info = env.step("down")  # box at (4,2) against the outer wall: blocked
    assert env.player == (3, 2) and env.boxes[4, 2] and "blocked" in obs
    # box into box: player left of two boxes in a row
    env2 = envs.Sokoban.from_text("######\n#@BBo#\n#...o#\n######")
    env2.step("right")
    assert env2.player == (1, 1) and env2.boxes[1, 2] and env2.boxes[1, 3]


def test_sokoban_success_reward_and_limit():
    env = envs.Sokoban.from_text("#####\n#@Bo#\n#.Bo#\n#...#\n#####")
    obs, r, done, info = env.step("right")
    assert r == 0 and not done and env.grid()[1] == "#.@X#"
    env.step("down")  # to (2,2)? no: (2,2) has a box -> pushes it down to (3,2)
    assert env.boxes[3, 2]
    env = envs.Sokoban.from_text("#####\n#@Bo#\n#.Bo#\n#...#\n#####")
    for a in ("right", "left", "down", "right"):
        obs, r, done, info = env.step(a)
    assert r == 1.0 and done and info["success"]
    env = envs.Sokoban.from_text("#####\n#@Bo#\n#####", max_steps=3)
    for t in range(3):
        obs, r, done, info = env.step("nope" if t else "left")
    assert done and r == 0 and info["invalid"] and not info["success"]


def test_solve_sokoban_hand_worked():
    env = envs.Sokoban.from_text("#####\n#@Bo#\n#.Bo#\n#...#\n#####")
    sol = envs.solve_sokoban(env.walls, env.targets, env.boxes, env.player)
    assert len(sol) == 4  # right, left, down, right (hand-worked: nothing shorter exists)
    env = envs.Sokoban.from_text("#####\n#@Bo#\n#####")
    assert envs.solve_sokoban(env.walls, env.targets, env.boxes, env.player) == ["right"]
    env = envs.Sokoban.from_text("#####\n#B.o#\n#@..#\n#####")  # box in a corner: unsolvable
    assert envs.solve_sokoban(env.walls, env.targets, env.boxes, env.player) is None


def _independent_bfs(rows):
    """A separate, plain BFS over (player, boxes) written for the test, reading the text board."""
    walls = {(r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch == "#"}
    targets = frozenset((r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in "oX+")
    boxes = frozenset((r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in "BX")
    player = next((r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in "@+")
    moves = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
    start = (player, boxes)
    paths = {start: []}
    queue = deque([start])
    while queue:
        (p, bx) = state = queue.popleft()
        if bx == targets:
            return paths[state]
        for a, (dr, dc) in moves.items():
            q = (p[0] + dr, p[1] + dc)
            if q in walls:
                continue
            if q in bx:
                q2 = (q[0] + dr, q[1] + dc)
                if q2 in walls or q2 in bx:
                    continue
                bx2 = (bx - {q}) | {q2}
            else:
                bx2 = bx
            if (q, bx2) not in paths:
                paths[(q, bx2)] = paths[state] + [a]
                queue.append((q, bx2))
    return None


def test_sokoban_generated_rooms_are_solvable():
    env = envs.make("sokoban")
    for seed in range(40):
        obs = env.reset(seed)
        rows = obs.split("\n")[:6]
        assert len(rows) == 6 and all(len(r) == 6 for r in rows)
        assert rows[0] == rows[-1] == "######" and all(r[0] == r[-1] == "#" for r in rows)
        text = "".join(rows)
        assert text.count("B") == 2 and text.count("o") + text.count("+") == 2 and "X" not in text
        sol = _independent_bfs(rows)
        assert sol is not None and len(sol) <= env.max_steps
        for i, a in enumerate(sol):
            obs, r, done, info = env.step(f"<answer>{a}</answer>")
            assert done == (i == len(sol) - 1)
        assert r == 1.0 and info["success"]


def test_sokoban_determinism():
    a, b = envs.make("sokoban"), envs.make("sokoban")
    assert a.reset(123) == b.reset(123)
    assert a.step("up") == b.step("up")
    assert len({a.reset(s) for s in range(10)}) > 5
    assert envs.make("sokoban", seed=9).reset() == envs.make("sokoban", seed=9).reset()


def test_play_cli_sokoban():
    """`python envs.py play` takes actions from stdin, one a line."""
    env = envs.make("sokoban")
    obs = env.reset(4)
    sol = _independent_bfs(obs.split("\n")[:6])
    res = subprocess.run([sys.executable, str(ROOT / "envs.py"), "play", "sokoban", "--seed", "4"],
                         input="\n".join(["sideways"] + sol) + "\n", capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert "Action not understood: 'sideways'" in res.stdout
    assert "success=True return=1" in res.stdout


# --------------------------------------------------------------------------------------------- ALFWorld

@pytest.fixture(scope="module")
def alfworld_env():
    # alfworld and textworld are requirements and the games ship in data/: a missing one fails, never skips
    return envs.make("alfworld", split="valid_unseen")


def test_alfworld_valid_unseen_has_134_games(alfworld_env):
    assert len(envs.alfworld_games("valid_unseen")) == 134


@pytest.mark.parametrize("seed", [0, 57, 101])
def test_alfworld_walkthrough_succeeds(alfworld_env, seed):
    env = alfworld_env
    obs = env.reset(seed)
    assert "Your task is to: " in obs and "Admissible actions: " in obs
    walk = json.loads(env.game_file.read_text())["walkthrough"]
    obs, r, done, info = env.step("teleport to the moon")
    assert info["invalid"] and not done and r == 0 and "not understood" in obs
    for i, a in enumerate(walk):
        assert a in env.actions  # the observation's admissible list holds the expert's next action
        obs, r, done, info = env.step(f"<answer>{a}</answer>")
        assert not info["invalid"]
        assert done == (i == len(walk) - 1)
    assert r == 1.0 and info["success"] and info["steps"] == len(walk) + 1


def test_alfworld_timeout_gives_minus_one(alfworld_env):
    env = alfworld_env
    env.reset(3)
    rewards = []
    for _ in range(env.max_steps):
        obs, r, done, info = env.step("look")
        rewards.append(r)
    assert done and not info["success"]
    assert rewards[:-1] == [0.0] * (env.max_steps - 1) and rewards[-1] == -1.0


def test_alfworld_games_come_from_the_repository(tmp_path, monkeypatch):
    """A fresh clone has the games: the default tarball lies inside the repository and unpacks a split."""
    repo = Path(envs.__file__).resolve().parent
    assert envs.ALFWORLD_TARBALL.is_file() and envs.ALFWORLD_TARBALL.is_relative_to(repo)
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    monkeypatch.delenv("CRL_ALFWORLD_TAR", raising=False)
    root = envs.alfworld_data_dir("valid_seen")
    assert root == tmp_path and len(list((root / "json_2.1.1" / "valid_seen").glob("*/*/game.tw-pddl"))) == 140


def test_alfworld_missing_data_message(tmp_path, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "none"))
    monkeypatch.setenv("CRL_ALFWORLD_TAR", str(tmp_path / "missing.tar.xz"))
    with pytest.raises(FileNotFoundError, match="ALFWORLD_DATA"):
        envs.alfworld_data_dir("train")
    with pytest.raises(ValueError, match="valid_unseen"):
        envs.alfworld_data_dir("test")


# ------------------------------------------------------------------------------------------------- Vault

def _episode(env, seed, replies):
    """reset(seed), then the replies: the observations (first one included), rewards, dones and infos."""
    obs, rewards, dones, infos = [env.reset(seed)], [], [], []
    for reply in replies:
        o, r, d, i = env.step(reply)
        obs.append(o), rewards.append(r), dones.append(d), infos.append(i)
    return obs, rewards, dones, infos


def test_vault_name_and_secret_are_stable():
    """Computed once (blake2b, so the same in every process); seeds 52 and 1779 happen to draw one name, so
    they are one vault with one door."""
    env = envs.make("vault")
    env.reset(3)
    assert (env.name, env.secret) == ("peach misty newt", "north")
    env.reset(0)
    assert (env.name, env.secret) == ("amber chalk shark", "east")
    env.reset(52)
    first = (env.name, env.secret)
    env.reset(1779)
    assert first == (env.name, env.secret) == ("green tin swan", "northeast")


def test_vault_secret_is_a_function_of_the_name_alone():
    """Every name drawn twice in 2000 seeds (13 names) keeps its door, and no single word of the name decides
    the door (each word seen 25+ times goes with at least 3 doors), so no rule shared across vaults finds it."""
    env, doors_of, doors_of_word = envs.make("vault"), {}, {}
    for seed in range(2000):
        env.reset(seed)
        doors_of.setdefault(env.name, set()).add(env.secret)
        for k, word in enumerate(env.name.split()):
            doors_of_word.setdefault((k, word), []).append(env.secret)
    assert sum(len(d) for d in doors_of.values()) == len(doors_of) == 1987
    assert all(len(set(d)) >= 3 for d in doors_of_word.values() if len(d) >= 25)


def test_vault_observations_hide_the_secret():
    """The first observation names the vault and no door; the instruction is the same for every vault and
    names none; a locked door's observation never names the open one."""
    door = re.compile(r"\b(" + "|".join(envs.Vault.actions) + r")\b")
    env = envs.make("vault")
    instructions = set()
    for seed in range(200):
        obs = env.reset(seed)
        instructions.add(env.instruction)
        assert env.name in obs and not door.search(obs) and env.name not in env.instruction
        wrong = [a for a in env.actions if a != env.secret][:3]
        for a in wrong:
            obs, r, done, info = env.step(a)
            assert not re.search(rf"\b{env.secret}\b", obs)
    assert len(instructions) == 1 and "eight doors" in env.instruction and "3 tries" in env.instruction
    assert env.actions == envs._MOVES


def test_vault_wrong_wrong_right():
    """peach misty newt opens north: east and south are locked, north opens at the third try."""
    obs, rewards, dones, infos = _episode(envs.make("vault"), 3, ["east", "<answer>south</answer>", "North"])
    assert obs[0] == ("You are in the peach misty newt vault. Eight doors lead out; one of them opens. "
                      "Tries left: 3.")
    assert obs[1] == "The east door is locked. Locked doors: east. Tries left: 2."
    assert obs[2] == "The south door is locked. Locked doors: east, south. Tries left: 1."
    assert "north door of the peach misty newt vault opens" in obs[3]
    assert rewards == [0.0, 0.0, 1.0] and dones == [False, False, True]
    assert [i["success"] for i in infos] == [False, False, True] and infos[-1]["steps"] == 3
    assert infos[-1]["tries_used"] == 3


def test_vault_three_wrong_doors_fail():
    env = envs.make("vault")
    obs, rewards, dones, infos = _episode(env, 3, ["east", "south", "west"])
    assert rewards == [0.0, 0.0, 0.0] and dones == [False, False, True] and not infos[-1]["success"]
    assert obs[-1] == "The west door is locked. Locked doors: east, south, west. No tries left: the vault stays shut."
    with pytest.raises(ValueError, match="reset"):
        env.step("north")


def test_vault_reveal_names_the_door_after_a_loss_only():
    """--vault-reveal: peach misty newt opens north; three wrong doors end with north named, a step limit's end
    too, and neither a win nor a turn before the end names it. The shown door is what the oracle reads."""
    env = envs.make("vault", reveal=True)
    obs, rewards, dones, infos = _episode(env, 3, ["east", "south", "west"])
    assert obs[-1] == ("The west door is locked. Locked doors: east, south, west. No tries left: the vault stays "
                       "shut. The north door would have opened.")
    assert all("north" not in o for o in obs[:-1]) and rewards == [0.0] * 3
    assert envs.vault_shown_door([("environment", o) for o in obs]) == "north"
    obs, *_ = _episode(envs.make("vault", reveal=True, max_steps=2), 3, ["?", "east"])
    assert obs[-1].endswith("Tries left: 2. The north door would have opened.")
    obs, *_ = _episode(env, 3, ["east", "north"])
    assert "would have" not in obs[-1] and envs.vault_shown_door([("environment", o) for o in obs]) == "north"
    # without the option a loss shows no door; an agent's line never counts as shown
    obs, *_ = _episode(envs.make("vault"), 3, ["east", "south", "west"])
    lines = [("environment", o) for o in obs] + [("agent", "The north door of the peach misty newt vault opens")]
    assert "would have" not in obs[-1] and envs.vault_shown_door(lines) is None
    # the revealing vault is a task of its own
    assert envs.EnvPool().take("vault-reveal").reveal and not envs.EnvPool().take("vault").reveal


def _vault_digest(task, **kw) -> str:
    """sha256 of every instruction, observation, reward and done of scripted replies (valid, invalid, the
    <answer> form) on 80 vaults, training and held-out seeds, under the default step limit and a limit of 2."""
    import hashlib
    h = hashlib.sha256()
    for seed in list(range(40)) + [10**9 + s for s in range(40)]:
        rng = random.Random(seed)
        replies = [rng.choice(list(envs._MOVES) + ["", "open", "<answer>North</answer>"]) for _ in range(6)]
        for max_steps in (30, 2):
            env = envs.make(task, max_steps=max_steps, **kw)
            h.update(env.instruction.encode())
            h.update(env.reset(seed).encode())
            for reply in replies:
                obs, reward, done, _ = env.step(reply)
                h.update(f"{obs}\x00{reward!r}\x00{done}".encode())
                if done:
                    break
    return h.hexdigest()


def test_vault_reveal_task_plays_byte_for_byte_as_the_old_option():
    """`vault-reveal` plays every episode as Vault(reveal=True) did before it was a task (the digests were taken
    from envs.py of commit 08588c7 and its Vault(reveal=True) / Vault()), and as make("vault", reveal=True) now."""
    assert _vault_digest("vault-reveal") == _vault_digest("vault", reveal=True) == (
        "94b2bf99a0761a98c81c389d111e4b677841bd25005c070a048f2947ee11b946")
    assert _vault_digest("vault") == "bb7e7c9c6432e07acda68634aad342b64356e8ac82d3f6402c74d7b21a81f0fd"
    assert envs.held_out_seeds("vault-reveal", 64, 10**9) == envs.held_out_seeds("vault", 64, 10**9)
    rngs = {t: np.random.default_rng(3) for t in ("vault", "vault-reveal")}
    draws = [[envs.draw_training_seed(t, rng, 10**9) for _ in range(50)] for t, rng in rngs.items()]
    assert draws[0] == draws[1] and envs.answer("vault-reveal", 3) == envs.vault_door(3) == "north"


def test_vault_invalid_reply_uses_a_step_not_a_try():
    """Two invalid replies among two wrong doors: the third door still gets its try, at step 5."""
    obs, rewards, dones, infos = _episode(envs.make("vault"), 3, ["open sesame", "east", "door", "south", "north"])
    assert obs[1] == envs.invalid_text("open sesame", envs._MOVES) and infos[0]["invalid"]
    assert "Tries left: 2." in obs[2] and obs[3].startswith("Action not understood: 'door'")
    assert dones == [False] * 4 + [True] and rewards[-1] == 1.0 and infos[-1]["steps"] == 5
    # and the step limit still ends an episode of invalid replies
    obs, rewards, dones, infos = _episode(envs.make("vault", max_steps=4), 3, ["?"] * 4)
    assert dones == [False, False, False, True] and sum(rewards) == 0 and not infos[-1]["success"]


def test_vault_repeated_wrong_door_uses_a_try():
    obs, rewards, dones, infos = _episode(envs.make("vault"), 3, ["east", "east", "east"])
    assert dones == [False, False, True] and rewards == [0.0] * 3
    assert obs[2] == "The east door is locked. Locked doors: east. Tries left: 1."


def test_vault_secrets_near_uniform():
    counts = {a: 0 for a in envs._MOVES}
    for seed in range(2000):
        counts[envs.vault_secret(envs.vault_name(seed))] += 1
    assert all(0.09 <= c / 2000 <= 0.16 for c in counts.values()), counts


def test_vault_names_mostly_distinct():
    names = {envs.vault_name(seed) for seed in range(2000)}
    assert len(names) / 2000 > 0.95 and all(len(n.split()) == 3 for n in names)


def test_vault_memoryless_best_is_three_eighths():
    """Never repeating a door (the same order in every vault) until the episode ends: the env's 3 tries open
    3/8 of 4000 vaults (within 0.03)."""
    env, wins = envs.make("vault"), 0
    for seed in range(4000):
        env.reset(seed)
        for door in envs._MOVES:
            obs, r, done, info = env.step(door)
            if done:
                break
        wins += info["success"]
    assert envs.VAULT_MEMORYLESS_BEST == 3 / 8 and abs(wins / 4000 - 3 / 8) < 0.03


def test_play_cli_vault():
    res = subprocess.run([sys.executable, str(ROOT / "envs.py"), "play", "vault", "--seed", "3"],
                         input="sideways\neast\nnorth\n", capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert "peach misty newt vault" in res.stdout and "Action not understood: 'sideways'" in res.stdout
    assert "The east door is locked." in res.stdout and "success=True return=1" in res.stdout


def test_a_run_without_the_action_list_plays_the_same_alfworld_game_with_a_shorter_observation():
    """--no-list-actions: the run's pool gives ALFWorld games whose observations are the game's text alone (no
    admissible list, ~350 tokens a turn fewer), with the same valid actions, steps and outcome as listed."""
    from types import SimpleNamespace
    import crl
    seen = {}
    for listed in (True, False):
        cfg = crl.CRLConfig(list_actions=listed, env_workers=0)
        run = SimpleNamespace(cfg=cfg, tasks=["alfworld"], pool=None)
        crl.Run.__post_init__(run)    # builds the run's pool from its settings, as training does
        env = run.pool.take("alfworld", train=False)
        obs = [env.reset(seed=57)]
        actions = [env.actions]
        for a in json.loads(env.game_file.read_text())["walkthrough"]:
            o, r, done, info = env.step(a)
            obs.append(o)
            actions.append(env.actions)
        seen[listed] = (obs, actions, r, info["success"], env.instruction)
    (listed_obs, listed_actions, *outcome), (bare_obs, bare_actions, *bare_outcome) = seen[True], seen[False]
    assert listed_actions == bare_actions and outcome[:2] == bare_outcome[:2] == [1.0, True]
    assert all("Admissible actions: " in o for o in listed_obs) and not any("Admissible" in o for o in bare_obs)
    assert [o.split("\nAdmissible actions: ")[0] for o in listed_obs] == bare_obs   # the game's text, unchanged
    assert "listed" in outcome[2] and "listed" not in bare_outcome[2]


def test_a_run_without_the_action_list_plays_the_same_webshop_episode_with_the_page_alone():
    """--no-list-actions for WebShop: the run's pool gives pages without their "Available actions" list, with
    the same valid actions, pages and reward along one seeded walk through the held-out shop."""
    import random
    from types import SimpleNamespace
    import crl
    seen = {}
    for listed in (True, False):
        run = SimpleNamespace(cfg=crl.CRLConfig(list_actions=listed, env_workers=0), tasks=["webshop"], pool=None)
        crl.Run.__post_init__(run)    # builds the run's pool from its settings, as training does
        env, rng = run.pool.take("webshop", train=False), random.Random(5)
        obs, actions, rewards, done = [env.reset(seed=crl.EVAL_SEED0 + 3)], [], [], False
        while not done:
            actions.append(env.actions)
            o, r, done, _ = env.step(rng.choice(env.actions))
            obs.append(o)
            rewards.append(r)
        seen[listed] = obs, actions, rewards
    (listed_obs, *listed_rest), (bare_obs, *bare_rest) = seen[True], seen[False]
    assert listed_rest == bare_rest and bare_rest[1][-1] == 1.0    # this walk buys the right product
    assert all("\nAvailable actions: " in o for o in listed_obs[:-1]) and not any("Available" in o for o in bare_obs)
    assert [o.split("\nAvailable actions: ")[0] for o in listed_obs] == bare_obs


# ------------------------------------------------------------------------------------------- Family vault

FAMILY_TASKS = {"vault-family2": 2, "vault-family4": 4, "vault-family6": 6, "vault-family6-reveal": 6,
                "vault-family": 8, "vault-family16": 16}


def test_family_vault_family_fixes_the_door_and_names_hold_no_door_word():
    """A seen family vault's door is its family's, a control vault's its own name's secret; the first word names
    the family, the rest is a serial number; no family word holds a door word; the seen families' doors are
    balanced for every F; no control family is seen."""
    door_word = re.compile("|".join(envs._MOVES))
    assert not any(door_word.search(f) for f in [*envs.VAULT_FAMILIES, *envs.VAULT_CONTROL])
    assert not set(envs.VAULT_FAMILIES) & set(envs.VAULT_CONTROL) and len(envs.VAULT_CONTROL) == 8
    for task, f in FAMILY_TASKS.items():
        cls = envs.TASKS[task]
        doors = [envs.VAULT_FAMILIES[fam] for fam in cls.seen()]
        assert cls.families == len(cls.seen()) == f
        assert {doors.count(d) for d in set(doors)} == {max(1, f // 8)} and len(set(doors)) == min(f, 8)
    env, doors_of = envs.make("vault-family"), {}
    for seed in range(3000):
        env.reset(seed)
        family, serial = env.name.split(" ")
        assert serial.isdigit() and len(serial) == 4 and not door_word.search(env.name)
        assert env.secret == envs.family_door(env.name) == envs.answer("vault-family", seed)
        doors_of.setdefault(family, set()).add(env.secret)
    assert set(doors_of) == {*envs.VAULT_FAMILIES, *envs.VAULT_CONTROL}
    assert all(len(doors_of[f]) == 1 for f in envs.VAULT_FAMILIES) and all(doors_of[f] == set(envs._MOVES)
                                                                            for f in envs.VAULT_CONTROL)


@pytest.mark.parametrize("task", list(FAMILY_TASKS))
def test_family_vault_panels_are_balanced_and_never_drawn_in_training(task):
    """Transfer: held-out names of the seen families, each family equally often (so its doors are balanced);
    control: the eight control families' vaults, doors balanced; names distinct within each panel. Training
    draws seen families only, never a held-out name, so no panel's vault is ever played in training."""
    cls, n = envs.TASKS[task], 64
    panels = envs.held_out_panels(task, n, 1_000_000_000)
    assert set(panels) == {"", "control"} and panels[""] == envs.held_out_seeds(task, n, 1_000_000_000)
    names = {k: [envs.family_vault_name(s) for s in seeds] for k, seeds in panels.items()}
    for k, families in (("", cls.seen()), ("control", envs.VAULT_CONTROL)):
        assert len(set(names[k])) == n and {envs.vault_family(name) for name in names[k]} <= set(families)
        doors = [envs.family_door(name) for name in names[k]]
        assert max(map(doors.count, set(doors))) - min(map(doors.count, set(doors))) <= 1
    counts = [[envs.vault_family(name) for name in names[""]].count(fam) for fam in cls.seen()]
    assert max(counts) - min(counts) <= 1
    assert {doors.count(d) for d in set(doors)} == {n // 8} and len(set(doors)) == 8     # the control's
    assert all(envs.vault_held_out(name) for name in names[""])
    rng = np.random.default_rng(0)
    drawn = {envs.family_vault_name(envs.draw_training_seed(task, rng, 1_000_000_000)) for _ in range(3000)}
    assert {envs.vault_family(name) for name in drawn} == set(cls.seen())
    assert not any(map(envs.vault_held_out, drawn)) and not drawn & {*names[""], *names["control"]}


def test_family_vault_plays_as_the_vault_and_the_oracle_reads_its_door():
    """reset(seed) is deterministic; the first observation names the vault and no door; a win's and (in the
    revealing form) a loss's transcript show the door vault_shown_door reads; the instruction is the vault's."""
    env = envs.make("vault-family")
    obs = env.reset(7)
    assert obs == envs.make("vault-family").reset(7) == (
        f"You are in the {env.name} vault. Eight doors lead out; one of them opens. Tries left: 3.")
    assert env.instruction == envs.make("vault").instruction and env.name not in env.instruction
    wrong = [d for d in envs._MOVES if d != env.secret]
    lines = [("environment", obs)] + [("environment", env.step(d)[0]) for d in (wrong[0], env.secret)]
    assert envs.vault_shown_door(lines) == env.secret
    loss = envs.make("vault-family", reveal=True)
    lines = [("environment", loss.reset(7))] + [("environment", loss.step(d)[0]) for d in wrong[:3]]
    assert envs.vault_shown_door(lines) == env.secret
