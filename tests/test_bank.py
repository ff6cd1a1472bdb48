"""bank.py: search against numpy brute force, the re-rank on hand-computed cases, edits against a plain dict
model, save/load (exact round trip, older layout, corruption), a threaded stress run, the manager's search
and background jobs, and the MiniLM embedder against sentence-transformers."""
import json
import math
import random
import threading
import time
import zlib

import numpy as np
import pytest
import torch

import bank as B
import bank_store
from bank import Entry, ExperienceBank, ExperienceManager, Operation
from embedder import Embedder, default_embedder_path


def unit(rng, n, d):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def plain(dim, **kw):
    """A bank with the re-rank off: pure cosine top-k."""
    return ExperienceBank(dim, use_penalty=0.0, recency_penalty=0.0, **kw)


def check_consistent(bank):
    """Internal invariants: every entry has exactly one row in its task's matrix and vice versa."""
    seen = set()
    for task, part in bank._parts.items():
        live_ids = part.ids[:part.n].tolist()
        assert len(set(live_ids)) == part.n == len(part.row_of) == len(part.order)
        assert (part.ids[part.n:] == -1).all()
        for r, eid in enumerate(live_ids):
            assert part.row_of[eid] == r and bank._entries[eid].task == task
            assert part.shown[r] == bank._entries[eid].shown
        seen |= set(live_ids)
    assert seen == set(bank._entries) and len(seen) == len(bank)


# ---------------------------------------------------------------------------------------------------------
# search


@pytest.mark.parametrize("n", [300, 6000])
def test_search_equals_numpy_bruteforce(n):
    rng = np.random.default_rng(0)
    d = 48
    keys, queries = unit(rng, n, d), unit(rng, 7, d)
    bank = plain(d, capacity=n)
    ids = [bank.add("room", f"e{i}", torch.from_numpy(keys[i]), source=0) for i in range(n)]
    for k in (1, 5, 20):  # 20 > candidates (16): k widens the candidate pool
        got = bank.search("room", torch.from_numpy(queries), k)
        sims = queries @ keys.T
        for qi in range(len(queries)):
            want = np.argsort(-sims[qi], kind="stable")[:k]
            assert [e.id for e, _ in got[qi]] == [ids[j] for j in want]
            np.testing.assert_allclose([s for _, s in got[qi]], sims[qi, want], atol=1e-5)


def test_equal_cosines_serve_the_newest_entry_over_the_whole_task():
    """Lessons keyed by the same query tie at cosine 1.0 (a recurring instance): the newest is served, also
    when more of them tie than the re-rank has candidates, and an update's re-inserted entry counts as new.
    Cosines that differ only in their last bits (a query embedded in another batch) still tie."""
    key, other = torch.tensor([0.6, 0.8, 0.0]), torch.tensor([0.0, 0.6, 0.8])
    bank = plain(3, candidates=4)
    for i in range(20):
        bank.add("vault", f"lesson {i}", key, step=i)
    bank.add("vault", "elsewhere", other, step=20)
    got = bank.search("vault", key + 1e-7, 5, update=False)[0]
    assert [e.text for e, _ in got] == ["lesson 19", "lesson 18", "lesson 17", "lesson 16", "lesson 15"]
    bank.update([bank.entries("vault")[3].id], "lesson 3, rewritten", step=21)   # re-inserted at the newest id
    assert bank.search("vault", key, 1, update=False)[0][0][0].text == "lesson 3, rewritten"
    assert bank.search("vault", other, 1, update=False)[0][0][0].text == "elsewhere"   # the cosine still rules


def test_search_unknown_task_small_task_and_bad_queries():
    bank = plain(4)
    assert bank.search("nope", torch.ones(2, 4), 3) == [[], []]
    bank.add("a", "x", torch.tensor([1.0, 0, 0, 0]))
    bank.add("b", "y", torch.tensor([0, 1.0, 0, 0]))
    (res,) = bank.search("a", torch.tensor([0, 2.0, 0, 0]), 5)  # queries normalised; only task a's entry
    assert [(e.text, s) for e, s in res] == [("x", 0.0)]
    with pytest.raises(ValueError, match=r"\[Q, 4\]"):
        bank.search("a", torch.ones(3), 1)
    with pytest.raises(ValueError, match="non-zero"):
        bank.search("a", torch.zeros(4), 1)
    with pytest.raises(ValueError, match="k must be"):
        bank.search("a", torch.ones(4), 0)


def three(**kw):
    """Entries A, B, C at cosine 1.0, 0.9, 0.8 to the query [1, 0]: ranks 0, 1, 2."""
    bank = ExperienceBank(2, **kw)
    for text, c in (("A", 1.0), ("B", 0.9), ("C", 0.8)):
        bank.add("t", text, torch.tensor([c, math.sqrt(1 - c * c)]))
    return bank


Q = torch.tensor([1.0, 0.0])


def test_use_penalty_is_on_the_rank_scale_by_hand():
    """-rank - 0.4*log(1 + shown): A stays first while 0.4*log(1 + n) < 1, i.e. for its first 12 showings
    (0.4*log 12 = 0.994), and loses to B at the 13th (0.4*log 13 = 1.026). On the cosine scale it would lose
    after one showing (1 - 0.4*log 2 = 0.72 < 0.9)."""
    bank = three(recency_penalty=0.0)
    seq = [bank.search("t", Q, 1, now=i)[0][0][0].text for i in range(13)]
    assert seq == ["A"] * 12 + ["B"]
    assert [e.shown for e in bank.entries("t")] == [12, 1, 0]
    assert [e.uses for e in bank.entries("t")] == [0, 0, 0]          # uses count finished episodes, apart
    assert (bank.stats["searches"], bank.stats["off_top1"]) == (13, 1)
    (res,) = bank.search("t", Q, 3, update=False)
    # now B, shown once, scores -1 - 0.4*log 2 = -1.277 < A's -1.026: A is back on top; scores stay cosine
    assert [(e.text, round(s, 6)) for e, s in res] == [("A", 1.0), ("B", 0.9), ("C", 0.8)]
    assert bank.stats["searches"] == 13                               # a read-only search counts nothing


def test_recency_is_one_rank_within_the_window_and_the_dropout_moves_a_recent_top1_last():
    """Shown at iteration 5 with window 1: recent at 5 and 6, not at 7. A recent A scores -1 and ties B,
    which it keeps beating (ties keep cosine order); with dropout the recent top 1 goes last when the draw is
    below p; a recent non-top-1 is never moved."""
    bank = three(use_penalty=0.0)
    assert bank.search("t", Q, 1, now=5)[0][0][0].text == "A"
    assert [e.text for e, _ in bank.search("t", Q, 3, update=False, now=6)[0]] == ["A", "B", "C"]   # tie
    bank = three(use_penalty=0.0, recency_penalty=1.5)
    bank.search("t", Q, 1, now=5)
    assert [e.text for e, _ in bank.search("t", Q, 3, update=False, now=6)[0]] == ["B", "A", "C"]   # -1.5 < -1
    assert [e.text for e, _ in bank.search("t", Q, 3, update=False, now=7)[0]] == ["A", "B", "C"]   # out of window
    # dropout: the draws of a seeded generator decide, query by query
    bank = three(use_penalty=0.0)
    bank.search("t", Q, 1, now=5)
    draws = np.random.default_rng(3).random(6)
    got = bank.search("t", Q.expand(6, 2), 3, update=False, now=6, rng=np.random.default_rng(3))
    assert [[e.text for e, _ in r] for r in got] == [["B", "C", "A"] if u < 0.5 else ["A", "B", "C"] for u in draws]
    assert 0 < sum(draws < 0.5) < 6
    # a batch reads the counts as they were before it (the release's one snapshot a batch)
    bank = three(use_penalty=0.0, dropout=0.0)
    assert [r[0][0].text for r in bank.search("t", Q.expand(3, 2), 1, now=0)] == ["A", "A", "A"]
    assert bank.get(0).shown == 3 and bank.search("t", Q, 1, now=0)[0][0][0].text == "A"   # tie again


def test_min_cosine_serves_only_near_lessons_and_the_dropout_stays_among_them():
    """min_cosine 0.85: of A (1.0), B (0.9), C (0.8) only A and B are served, top 3 asked; a query near none
    gets nothing and counts nothing; a just-shown A dropped by the re-rank goes behind B, not behind C; with
    only A near (0.95), the dropped A is still served (it moves behind nothing)."""
    bank = three(use_penalty=0.0, min_cosine=0.85)
    assert [e.text for e, _ in bank.search("t", Q, 3, now=5)[0]] == ["A", "B"]
    assert bank.search("t", torch.tensor([0.0, -1.0]), 1, now=5) == [[]] and bank.stats["searches"] == 1
    got = bank.search("t", Q.expand(8, 2), 3, update=False, now=6, rng=np.random.default_rng(3))
    draws = np.random.default_rng(3).random(8)
    assert [[e.text for e, _ in r] for r in got] == [["B", "A"] if u < 0.5 else ["A", "B"] for u in draws]
    bank = three(use_penalty=0.0, min_cosine=0.95)
    bank.search("t", Q, 1, now=5)
    got = bank.search("t", Q.expand(8, 2), 1, update=False, now=6, rng=np.random.default_rng(3))
    assert [[e.text for e, _ in r] for r in got] == [["A"]] * 8


def test_a_call_reads_one_snapshot_per_search_batch():
    """[release] 40 queries with search_batch 32: the first 32 read the counts before the call and all get A; the
    last 8 read A as just shown (-1.5 against B's -1) and get B; A's and B's shown counts and the off-top-1 count
    follow. With one batch for all 40 (the planted bug of a snapshot a call) every query would get A."""
    bank = three(use_penalty=0.0, recency_penalty=1.5, dropout=0.0, search_batch=32)
    got = [r[0][0].text for r in bank.search("t", Q.expand(40, 2), 1, now=4)]
    assert got == ["A"] * 32 + ["B"] * 8
    assert [e.shown for e in bank.entries("t")] == [32, 8, 0] and bank.stats["off_top1"] == 8
    assert [r[0][0].text for r in three(search_batch=50).search("t", Q.expand(40, 2), 1, now=4)] == ["A"] * 40


# ---------------------------------------------------------------------------------------------------------
# edits against a plain model


def test_random_edits_match_a_plain_dict_model():
    """add / update / remove / apply with stale ids and FIFO eviction, checked after every step against a
    dict of id -> (task, text, key) with an insertion-ordered list per task."""
    rng, pyr = np.random.default_rng(1), random.Random(1)
    d, cap = 8, 10
    bank = plain(d, capacity=cap)
    model, order, gone = {}, {"a": [], "b": []}, []
    expect_stale = 0

    def model_add(eid, task, text, key):
        if len(order[task]) >= cap:
            old = order[task].pop(0)
            gone.append(old)
            del model[old]
        model[eid] = (task, text, key)
        order[task].append(eid)

    def model_drop(eid):
        order[model.pop(eid)[0]].remove(eid)
        gone.append(eid)

    for step in range(400):
        task = pyr.choice("ab")
        key = unit(rng, 1, d)[0]
        r = pyr.random()
        if r < 0.5:
            eid = bank.add(task, f"t{step}", torch.from_numpy(key), source=step, step=step)
            model_add(eid, task, f"t{step}", key)
        elif r < 0.75:
            live = pyr.sample(order[task], min(len(order[task]), pyr.randint(0, 3)))
            stale = pyr.sample(gone, min(len(gone), pyr.randint(0, 2)))
            other = "b" if task == "a" else "a"
            foreign = order[other][:1]   # ids of another task are stale for this task's update
            eid = bank.apply([Operation("update", task, f"m{step}", tuple(live + stale + foreign),
                                        torch.from_numpy(key), source=step, step=step)])[0]
            expect_stale += len(stale) + len(foreign)
            for i in live:
                model_drop(i)
            model_add(eid, task, f"m{step}", key)
        else:
            ids = pyr.sample(list(model), min(len(model), 2)) + pyr.sample(gone, min(len(gone), 1))
            expect_stale += sum(i not in model for i in ids)
            bank.remove(ids)
            for i in ids:
                if i in model:
                    model_drop(i)
        check_consistent(bank)
        assert set(bank._entries) == set(model)
        assert bank.stats["stale_ids"] == expect_stale
    for task in "ab":
        assert [e.id for e in bank.entries(task)] == order[task]
        assert bank.size(task) == len(order[task]) <= cap
    for eid, (task, text, key) in model.items():
        e = bank.get(eid)
        assert (e.task, e.text) == (task, text)
        torch.testing.assert_close(bank.key(eid), torch.from_numpy(key), atol=1e-6, rtol=0)
    assert len(set(model)) == len(model) and max(model) < bank._next_id
    assert bank.stats["evicted"] > 0   # the run did hit the capacity


def test_update_merges_and_falls_back_to_add():
    bank = plain(2)
    a = bank.add("t", "A", torch.tensor([1.0, 0.0]), source=1)
    b = bank.add("t", "B", torch.tensor([0.0, 1.0]), source=1)
    m = bank.update([a, b], "AB", source=7, step=3)   # no key: normalised mean of the replaced keys
    assert bank.get(a) is None and bank.get(b) is None and len(bank) == 1
    assert bank.get(m) == Entry(m, "t", "AB", 7, 0, 0, 3)
    torch.testing.assert_close(bank.key(m), torch.tensor([1.0, 1.0]) / math.sqrt(2))
    # every target already gone: it becomes an add (with an explicit key), stale ids counted
    n = bank.apply([Operation("update", "t", "C", (a, b), torch.tensor([0.0, 2.0]))])[0]
    assert bank.get(n).text == "C" and len(bank) == 2 and bank.stats["stale_ids"] == 2
    # ... and without a key there is nothing to merge: skipped, not an error
    assert bank.apply([Operation("update", "t", "D", (a,))]) == [None]
    assert bank.stats["skipped"] == 1 and len(bank) == 2
    with pytest.raises(ValueError, match="pass task="):
        bank.update([a], "E", torch.ones(2))


def test_apply_validates_everything_before_applying_anything():
    bank = plain(3)
    ops = [Operation("add", "t", "ok", key=torch.ones(3)), Operation("add", "t", "bad", key=torch.ones(4))]
    with pytest.raises(ValueError, match="dim is 3"):
        bank.apply(ops)
    with pytest.raises(ValueError, match="unknown operation kind"):
        bank.apply([ops[0], Operation("delete", "t", ids=(0,))])
    with pytest.raises(ValueError, match="key is None|operation key is None"):
        bank.apply([ops[0], Operation("add", "t", "no key")])
    assert len(bank) == 0 and bank.stats["added"] == 0
    assert bank.apply([ops[0], Operation("none", ""), Operation("remove", "t", ids=(0,))]) == [0, None, None]
    assert len(bank) == 0
    with pytest.raises(ValueError, match="task"):
        bank.add("", "x", torch.ones(3))


# ---------------------------------------------------------------------------------------------------------
# persistence


def filled_bank(n=60, d=16, seed=0):
    rng = np.random.default_rng(seed)
    bank = ExperienceBank(d, capacity=40, recency_window=2)
    keys = unit(rng, n, d)
    for i in range(n):
        bank.add("room" if i % 3 else "maze", f"lesson {i} ünïcode \"q\"\nline2\u2028after a raw U+2028",
                 torch.from_numpy(keys[i]), source=i // 4, step=i)
    twin = torch.from_numpy(keys[0])
    bank.add("room", "twin a", twin)   # equal keys: their order in a search is a tie the rows decide
    bank.add("room", "twin b", twin)   # (and room is full now: the two oldest room entries are evicted)
    bank.remove([5, 6])                # moves the last rows into the holes: rows no longer follow age
    bank.record_use([7, 8, 9, 9], success=True)
    bank.record_use([10], success=False)
    return bank


def same_layout(a, b):
    """Two banks hold the same entries in the same rows, with bit-identical keys and re-rank state."""
    assert a.tasks() == b.tasks() and a.stats == b.stats and a._next_id == b._next_id
    for task in b.tasks():
        assert a.entries(task) == b.entries(task)   # same records, same (oldest-first) order
        pa, pb = a._parts[task], b._parts[task]
        n = pb.n
        assert pa.n == n and torch.equal(pa.keys[:n], pb.keys[:n])
        for name in ("ids", "shown", "last_shown"):
            np.testing.assert_array_equal(getattr(pa, name)[:n], getattr(pb, name)[:n])


def test_save_load_round_trip_is_exact(tmp_path):
    bank = filled_bank()
    rng = np.random.default_rng(4)
    for task in bank.tasks():   # show some entries: the re-rank state must survive the round trip
        bank.search(task, torch.from_numpy(unit(rng, 5, 16)), 2, now=3)
    ExperienceBank(16).save(tmp_path / "bank")
    bank.save(tmp_path / "bank")            # a second save into the directory replaces the first
    assert sorted(p.name for p in (tmp_path / "bank").iterdir()) == ["entries.jsonl", "keys.safetensors",
                                                                      "meta.json"]
    got = ExperienceBank.load(tmp_path / "bank")
    settings = ("dim", "capacity", "candidates", *bank_store.RERANK)
    assert [getattr(got, k) for k in settings] == [getattr(bank, k) for k in settings]
    same_layout(got, bank)
    check_consistent(got)
    q = torch.cat([torch.from_numpy(unit(rng, 6, 16)), bank.key(bank.entries("room")[-1].id)[None]])
    for now in (3, 4, 6):       # the same answers, scores, ties and dropouts, and the same counts after
        for task in bank.tasks():
            draws = lambda: np.random.default_rng(now)   # noqa: E731
            assert got.search(task, q, 3, now=now, rng=draws()) == bank.search(task, q, 3, now=now, rng=draws())
    same_layout(got, bank)
    new = got.add("room", "after load", torch.ones(16))
    assert new == bank._next_id                        # ids are never reused


def test_load_with_a_smaller_capacity_keeps_the_newest_in_their_rows(tmp_path):
    bank = filled_bank()
    bank.save(tmp_path / "bank")
    small = ExperienceBank.load(tmp_path / "bank", capacity=7)
    check_consistent(small)
    assert small.capacity == 7 and small.size("room") == 7
    assert small.entries("room") == bank.entries("room")[-7:]
    kept = set(small._parts["room"].ids[:7].tolist())
    assert small._parts["room"].ids[:7].tolist() == [i for i in bank._parts["room"].ids[:40].tolist() if i in kept]
    for e in small.entries("room"):
        assert torch.equal(small.key(e.id), bank.key(e.id))


def test_loads_the_older_snapshot_layout(tmp_path):
    """Banks saved before the bank's own snapshot layer went (dir/CURRENT naming dir/snap-NNNNNN/, entries
    without their rows) still load: the runs in results/ hold such checkpoints."""
    bank = filled_bank()
    snap = tmp_path / "b" / "snap-000004"
    bank.save(snap)
    (tmp_path / "b" / "CURRENT").write_text("snap-000004\n")
    lines = (snap / "entries.jsonl").read_text(encoding="utf-8").split("\n")
    records = [json.loads(line) for line in lines if line]
    for r in records:
        del r["row"]
    (snap / "entries.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
                                        encoding="utf-8")
    got = ExperienceBank.load(tmp_path / "b")
    check_consistent(got)
    assert got.stats == bank.stats and got.tasks() == bank.tasks()
    for task in bank.tasks():
        assert got.entries(task) == bank.entries(task)
        for e in bank.entries(task):
            assert torch.equal(got.key(e.id), bank.key(e.id))


def test_a_bank_saved_before_the_rank_scale_rerank_loads(tmp_path):
    """A version-2 bank (cosine-scale re-rank, query-tick recency: every committed run in results/) loads with a
    warning: its entries and keys as they were, times shown = its uses, no entry recent, the re-rank settings
    the current defaults (its own were on another scale)."""
    bank = filled_bank()
    bank.save(tmp_path / "b")
    meta = json.loads((tmp_path / "b" / "meta.json").read_text())
    meta.update(version=2, use_penalty=0.4, recency_window=32, recency_penalty=0.1, ticks={"room": 9})
    del meta["dropout"]
    (tmp_path / "b" / "meta.json").write_text(json.dumps(meta))
    records = [json.loads(line) for line in (tmp_path / "b" / "entries.jsonl").read_text().split("\n") if line]
    for r in records:
        del r["shown"], r["last_shown"]
        r["last_hit"] = 5
    (tmp_path / "b" / "entries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.warns(UserWarning, match="before the release's rank-scale re-rank"):
        got = ExperienceBank.load(tmp_path / "b")
    check_consistent(got)
    fresh = B.ExperienceBank(got.dim)   # the defaults of today's settings
    assert [getattr(got, k) for k in bank_store.RERANK] == [getattr(fresh, k) for k in bank_store.RERANK]
    for task in bank.tasks():
        assert [(e.id, e.text, e.uses, e.shown) for e in got.entries(task)] == \
            [(e.id, e.text, e.uses, e.uses) for e in bank.entries(task)]
        assert (got._parts[task].last_shown[:got._parts[task].n] == B._NEVER).all()


def test_corrupt_or_missing_bank_gives_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ExperienceBank.load(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no meta.json"):
        ExperienceBank.load(tmp_path / "empty")
    root = tmp_path / "b"
    filled_bank().save(root)

    def corrupted(fname, mutate, why):
        path = root / fname
        data = path.read_bytes()
        path.write_bytes(mutate(data))
        with pytest.raises(ValueError, match="corrupt experience bank .*" + why) as err:
            ExperienceBank.load(root)
        assert "\n" not in str(err.value)
        path.write_bytes(data)

    def first_line_twice(b):
        lines = b.split(b"\n")
        return b"\n".join([lines[0]] + lines[:1] + lines[2:])
    corrupted("keys.safetensors", lambda b: b[:len(b) // 2], "")                       # truncated
    corrupted("keys.safetensors", lambda b: b"", "")                                   # empty
    corrupted("entries.jsonl", lambda b: b[:-40], "Error")                             # last line cut
    corrupted("entries.jsonl", lambda b: b.split(b"\n", 1)[1], "header says")          # a line gone
    corrupted("entries.jsonl", first_line_twice, "id twice")
    corrupted("entries.jsonl", lambda b: b.replace(b'"uses"', b'"usage"'), "KeyError")   # a field gone
    corrupted("entries.jsonl", lambda b: b"\xff" + b, "UnicodeDecodeError")
    corrupted("meta.json", lambda b: b[:10], "JSONDecodeError")                         # not JSON
    corrupted("meta.json", lambda b: json.dumps({"format": "other"}).encode(), "not an experience-bank header")
    corrupted("meta.json", lambda b: b.replace(b'"count"', b'"counted"'), "KeyError")
    assert len(ExperienceBank.load(root)) == len(filled_bank())    # restored: loads again
    (root / "keys.safetensors").unlink()
    with pytest.raises(ValueError, match="corrupt experience bank .*FileNotFoundError"):
        ExperienceBank.load(root)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "CURRENT").write_text("snap-999999\n")     # an older layout naming a missing snapshot
    with pytest.raises(FileNotFoundError, match="no meta.json"):
        ExperienceBank.load(tmp_path / "c")


# ---------------------------------------------------------------------------------------------------------
# concurrency


def test_threads_adding_and_searching_at_once_keep_the_bank_consistent():
    """4 writers (add, update, remove, record_use) and 8 searchers on one bank: afterwards every entry
    added and not removed is there exactly once, ids were never handed out twice, and the recency clock
    of each task counted every query that searched it."""
    rng = np.random.default_rng(3)
    d, tasks = 32, ["room", "maze", "keyroom"]
    bank = ExperienceBank(d, capacity=10 ** 6, recency_window=4)
    pool = torch.from_numpy(unit(rng, 512, d))
    errors, stop = [], threading.Event()
    created, dropped = [set() for _ in range(4)], [set() for _ in range(4)]
    queries = [dict.fromkeys(tasks, 0) for _ in range(8)]

    def writer(w):
        pyr = random.Random(w)
        mine = []
        try:
            for step in range(1000):
                task = pyr.choice(tasks)
                r = pyr.random()
                if r < 0.45 or not mine:
                    x = pyr.randrange(512)   # the text names its key's row of pool: the readers check cosines
                    i = bank.add(task, f"w{w}s{step}:{x}", pool[x], source=w, step=step)
                    mine.append(i)
                    created[w].add(i)
                elif r < 0.65:   # merge two of mine (maybe of different tasks: the foreign one is stale)
                    targets = pyr.sample(mine, min(2, len(mine)))
                    t = bank.get(targets[0]).task
                    (i,) = bank.apply([Operation("update", t, f"merged:{step % 512}", tuple(targets), pool[step % 512],
                                                 w, step)])
                    for x in targets:
                        if bank.get(x) is None and x not in dropped[w]:
                            mine.remove(x)
                            dropped[w].add(x)
                    mine.append(i)
                    created[w].add(i)
                elif r < 0.85:
                    x = mine.pop(pyr.randrange(len(mine)))
                    bank.remove([x, x, 10 ** 9])          # duplicate and never-existing ids are harmless
                    dropped[w].add(x)
                else:
                    bank.record_use(pyr.sample(mine, min(3, len(mine))), success=pyr.random() < 0.5)
        except Exception as e:
            errors.append(repr(e))

    def reader(r):
        pyr = random.Random(100 + r)
        try:
            while not stop.is_set():
                task = pyr.choice(tasks)
                k = pyr.randint(1, 4)
                rows = pyr.sample(range(512), 4)
                res = bank.search(task, pool[rows], k)
                for q, row in zip(rows, res):
                    assert len(row) <= k and len({e.id for e, _ in row}) == len(row)
                    for e, s in row:   # the cosine of the query and the key this entry was written with
                        assert e.task == task and abs(s - float(pool[q] @ pool[int(e.text.split(":")[1])])) < 1e-5
                if res[0]:   # (an empty task answers [] and counts nothing)
                    queries[r][task] += len(res)
        except Exception as e:
            errors.append(repr(e))

    readers = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
    writers = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join(timeout=60)
    stop.set()
    for t in readers:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in readers + writers), "a thread is stuck (deadlock?)"
    assert not errors, errors[:3]
    check_consistent(bank)
    assert sum(map(len, created)) == len(set().union(*created))   # no id handed out twice
    live = set().union(*created) - set().union(*dropped)
    assert set(bank._entries) == live                 # every added entry present unless removed/replaced
    assert bank.stats["searches"] == sum(q[t] for q in queries for t in tasks)   # no search's count lost
    assert sum(q[t] for q in queries for t in tasks) > 100


# ---------------------------------------------------------------------------------------------------------
# manager


class HashEmbedder:
    """A deterministic stand-in for the embedder: each text maps to a fixed random unit vector. It records
    each call's texts and thread."""
    dim = 16

    def __init__(self):
        self.calls, self.threads = [], []
        self.mu = threading.Lock()

    def __call__(self, texts):
        with self.mu:
            self.calls.append(list(texts))
            self.threads.append(threading.current_thread())
        out = [np.random.default_rng(zlib.crc32(t.encode())).standard_normal(self.dim) for t in texts]
        return torch.nn.functional.normalize(torch.tensor(np.array(out), dtype=torch.float32), dim=-1)


def test_manager_search_is_one_embedding_and_one_bank_search_on_the_callers_thread():
    ref = HashEmbedder()

    def make():
        bank = ExperienceBank(ref.dim, recency_window=3)
        for i in range(200):   # keys repeat (as room's first views do): ties among equal scores
            bank.add(("room", "maze")[i % 2], f"e{i}", ref([f"doc {i % 50}"])[0])
        return bank
    twin, emb = make(), HashEmbedder()
    with ExperienceManager(make(), emb) as mgr:
        asked = []
        for c in range(30):
            task, texts, k = ("room", "maze")[c % 2], [f"doc {c}", f"query {c}"][:1 + c % 2], 1 + c % 3
            update = c % 4 != 0
            asked.append(texts)
            assert mgr.search(task, texts, k, update) == twin.search(task, ref(texts), k, update)
        assert emb.calls == asked and set(emb.threads) == {threading.current_thread()}
        assert mgr.search("room", [], 1) == [] and len(emb.calls) == len(asked)
        with pytest.raises(ValueError, match="list of query texts"):
            mgr.search("room", "one text", 1)


def test_background_jobs_run_one_at_a_time_in_submission_order():
    """The manager's one thread runs the jobs in the order they were submitted, one after another, and hands
    back what each returned through its future; the manager applies nothing itself."""
    emb = HashEmbedder()
    mgr = ExperienceManager(plain(emb.dim), emb)
    threads, ran = [], []

    def distil(i):
        threads.append(threading.current_thread())
        time.sleep(0.0005 * (20 - i))   # earlier jobs take longer: beside each other, a later one would end first
        ran.append(i)
        return [Operation("add", "room", f"lesson {i}", key=emb([f"ep {i}"])[0], source=i, step=i)]

    jobs = [mgr.submit(distil, i) for i in range(20)]
    for job in jobs:
        mgr.apply(job.result())
    assert ran == list(range(20))
    assert [e.text for e in mgr.bank.entries("room")] == [f"lesson {i}" for i in range(20)]
    assert threading.current_thread() not in threads and len(set(threads)) == 1
    (res,) = mgr.search("room", ["ep 3"], 1)
    assert res[0][0].text == "lesson 3" and res[0][1] == pytest.approx(1.0)
    gate = threading.Event()
    blocked, queued = mgr.submit(gate.wait), mgr.submit(distil, 20)
    time.sleep(0.05)
    assert not blocked.done() and not queued.done() and ran[-1] == 19   # queued behind the gate, not run
    gate.set()
    assert queued.result()[0].text == "lesson 20" and ran[-1] == 20 and blocked.done()
    mgr.close()


def test_a_failed_job_reaches_its_caller_once_and_later_jobs_still_run():
    emb = HashEmbedder()
    mgr = ExperienceManager(plain(emb.dim), emb)
    threads, done = [], []

    def broken():
        threads.append(threading.current_thread())
        raise RuntimeError("extractor crashed")

    def slow(i):
        time.sleep(0.2)
        done.append(i)
        return i
    failed = mgr.submit(broken)
    later = mgr.submit(slow, 99)                    # the thread survives a failed job
    with pytest.raises(RuntimeError, match="extractor crashed"):
        failed.result()
    assert later.result() == 99 and done == [99]
    last = mgr.submit(slow, 100)
    mgr.close()                                     # reported once: not again here, nor by a later job
    assert done == [99, 100] and last.result() == 100   # close() finishes what was submitted
    assert not threads[0].is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        mgr.submit(slow, 101)
    mgr.close()                                     # idempotent


def test_sync_mode_is_inline_and_deterministic():
    emb = HashEmbedder()
    results = []
    for _ in range(2):
        mgr = ExperienceManager(ExperienceBank(emb.dim, recency_window=2), emb, sync=True)
        assert mgr._executor is None
        out = []
        for i in range(30):
            job = mgr.submit(lambda i=i: (threading.current_thread(),
                                          [Operation("add", "t", f"l{i}", key=mgr.embed([f"s{i % 7}"])[0])]))
            assert job.done()                           # it ran before submit returned, on this thread
            thread, ops = job.result()
            assert thread is threading.current_thread()
            mgr.apply(ops)
            ids = [e.id for e, _ in mgr.search("t", [f"s{i % 5}"], 2)[0]]
            mgr.record_use(ids, success=i % 2 == 0)
            out.append(ids)
        mgr.close()
        results.append(out)
    assert results[0] == results[1]

    def boom():
        raise RuntimeError("boom")
    job = ExperienceManager(plain(16), HashEmbedder(), sync=True).submit(boom)
    assert job.done()                                   # sync mode: a job's error is there at once
    with pytest.raises(RuntimeError, match="boom"):
        job.result()


# ---------------------------------------------------------------------------------------------------------
# embedder


@pytest.fixture(scope="module")
def minilm():
    return Embedder(batch_size=3)


def test_minilm_matches_sentence_transformers(minilm):
    import sentence_transformers as st   # a requirement: missing, the test fails rather than skips
    path = str(default_embedder_path())
    texts = ["You are in a 5x5 room. Reach the stairs down '>'.",
             "A key lies to the north; the door to the east is locked.",
             "a", "Boulders block the river crossing. " * 80,      # > 256 tokens: truncated like the reference
             "Ünïcödé text, with punctuation!?", "push the box onto the target"]
    ref = st.SentenceTransformer(path, device="cpu").encode(texts, normalize_embeddings=True,
                                                             convert_to_numpy=True)
    ours = minilm(texts)
    assert ours.shape == (len(texts), 384) and ours.dtype == torch.float32 and minilm.dim == 384
    np.testing.assert_allclose(ours.numpy(), ref, atol=2e-5, rtol=0)
    torch.testing.assert_close(ours.norm(dim=1), torch.ones(len(texts)))
    assert minilm([]).shape == (0, 384)


def test_embedder_memo_embeds_each_text_once_and_returns_the_same_vectors():
    texts = ["go north", "the stairs are east", "go north", "x", "the stairs are east"]
    ref = Embedder(batch_size=64, memo_size=0)(texts)    # 0: nothing kept, every call computes
    emb = Embedder(batch_size=2, memo_size=2)
    encoded = []
    encode = emb._encode
    emb._encode = lambda batch: encoded.append(list(batch)) or encode(batch)
    torch.testing.assert_close(emb(texts), ref, atol=1e-5, rtol=0)
    assert sorted(t for b in encoded for t in b) == ["go north", "the stairs are east", "x"]   # each once
    assert list(emb._memo) == ["go north", "x"]       # the longest first, the oldest dropped beyond 2
    encoded.clear()
    torch.testing.assert_close(emb(["x", "go north", "the stairs are east"]), ref[[3, 0, 1]], atol=1e-5, rtol=0)
    assert encoded == [["the stairs are east"]]


def test_minilm_similar_sentences_outscore_unrelated(minilm):
    v = minilm(["Pick up the key, then open the locked door.",
                "Grab the key and use it to unlock the door.",
                "The stock market fell sharply on Tuesday."])
    assert float(v[0] @ v[1]) > float(v[0] @ v[2]) + 0.3


def test_embedder_bad_input(tmp_path, minilm):
    with pytest.raises(FileNotFoundError, match="config.json"):
        Embedder(str(tmp_path))
    with pytest.raises(ValueError, match="list of strings"):
        minilm("just one string")
    with pytest.raises(ValueError, match="embedder dim"):
        ExperienceManager(ExperienceBank(8), minilm, sync=True)


def test_decoder_embedder_pools_the_last_token_like_transformers(tmp_path):
    import transformers

    import model
    from small.tiny import tiny_model
    net = tiny_model(seed=3)
    net.save_pretrained(tmp_path)
    tok = model.ByteTokenizer()
    tok.save_pretrained(tmp_path)
    texts = ["go north", "the key opens the door to the east", "x", "push the boulder into the water"]
    emb = Embedder(str(tmp_path), batch_size=3)    # batches of mixed lengths, right-padded
    assert emb.kind == "decoder" and emb.dim == net.config.hidden_size
    ours = emb(texts)
    ref_model = transformers.AutoModel.from_pretrained(str(tmp_path)).eval()
    with torch.no_grad():
        ref = torch.stack([ref_model(torch.tensor([tok.encode(t)])).last_hidden_state[0, -1] for t in texts])
    torch.testing.assert_close(ours, torch.nn.functional.normalize(ref, dim=-1), atol=1e-5, rtol=1e-4)


def test_manager_with_minilm_finds_the_lesson_of_a_similar_episode(minilm):
    """End to end: lessons keyed by the first observation of the episode they came from; a new episode
    whose observation resembles one of them retrieves that lesson."""
    with ExperienceManager(ExperienceBank(minilm.dim), minilm) as mgr:
        episodes = {"A locked door blocks the corridor; a key lies on the floor.": "pick up the key first",
                    "Boulders sit next to a wide river of water.": "push a boulder into the water",
                    "A maze of narrow corridors with many dead ends.": "follow one wall"}

        def distil(obs, lesson):
            return [Operation("add", "mix", lesson, key=mgr.embed([obs])[0], source=1)]
        for job in [mgr.submit(distil, obs, lesson) for obs, lesson in episodes.items()]:
            mgr.apply(job.result())
        (hits,) = mgr.search("mix", ["You see a key on the ground and a locked door ahead."], 1)
        assert hits[0][0].text == "pick up the key first"
