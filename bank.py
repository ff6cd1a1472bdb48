"""The experience bank and its manager: where the extractor's lessons live and how the actor finds them.

crl.py reads here at the start of every episode that plays with experience (`ExperienceManager.search`
with the episode's first observation as the query) and writes here after episodes finish (the extractor's
add / update / remove decisions, as `Operation`s, through `ExperienceManager.apply`). Each entry
remembers the extractor generation that wrote it (`source`), which is how crl.py credits the extractor
when episodes that used the entry succeed. train.py builds one manager per rank and saves the bank inside
its model checkpoints (which it makes durable: the bank's files are plain files).

- `BankConfig`: the bank's settings (capacity and the re-rank), each with its help; crl.CRLConfig holds
  one, so train.py turns them into --bank-* flags.
- `Entry`, `Operation`: plain records.
- `ExperienceBank`: entries partitioned by task; a task's keys are one matrix, so a search is one matmul +
  top-k followed by a small diversity re-rank. Thread-safe on its own: one lock around every public
  method, and a list of operations is applied atomically.
- bank_store.py: its save, load and copy (`Persistence`, which ExperienceBank inherits); bank_merge.py: the
  rolling merge's chain of lists (`MergeChain`, which crl.merge_pass drives).
- `ExperienceManager`: the bank with the embedder that keys it (embedder.Embedder in training; any callable
  texts -> [N, dim] L2-normalised vectors will do). It searches on the caller's thread (one embedding call
  and one bank search), and owns the one background thread distillation runs on (parallel.Distillation
  submits to it, so the actor trains while the extractor distils): a one-worker ThreadPoolExecutor whose
  futures hand back each job's operations, for the caller to apply. `sync=True` runs the jobs inline
  instead (tests, and `--distill inline`, the CPU default).
"""
import math
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from bank_store import NEVER as _NEVER, Persistence

# ----------------------------------------------------------------------------------------------------------
# settings and records


CANDIDATES = 16     # [release] the cosine top-N that the re-rank chooses from
SEARCH_BATCH = 32   # queries that read one snapshot of the usage counts: a training search counts what each batch of
                    # a call showed before the next reads them [release: up to 32 queries in a 5 ms window; here in order]


@dataclass
class BankConfig:
    """ExperienceBank's settings: its capacity and the release's diversity re-rank (see ExperienceBank)."""
    capacity: int = field(default=20000, metadata={"help": "entries kept per task; beyond it the oldest is evicted "
                                                           "[release: 20000, over all tasks]", "min": 1})
    use_penalty: float = field(default=0.4, metadata={"help": "re-rank: minus this times log(1 + times shown), in "
                                                              "ranks [release]", "min": 0})
    recency_penalty: float = field(default=1.0, metadata={"help": "re-rank: minus this, in ranks, for an entry shown "
                                                                  "within the recency window [release]", "min": 0})
    recency_window: int = field(default=1, metadata={"help": "iterations after the one it was shown in that an entry "
                                                             "counts as just shown (the release: 300 s of wall clock, "
                                                             "about one of its iterations; counted in iterations so a "
                                                             "run replays)", "min": 0})
    dropout: float = field(default=0.5, metadata={"help": "probability that a just-shown top 1 moves to the end of "
                                                          "the candidates [release]", "min": 0, "max": 1})
    min_cosine: float = field(default=-1.0, metadata={"help": "a lesson less similar than this to the query is never "
                                                               "served (-1: any [release]; near 1: only lessons of the "
                                                               "very same first view, as a control)",
                                                      "min": -1, "max": 1})


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
    shown: int = 0       # times a training search returned it (the re-rank reads it)
    origin: int = -1     # seed of the task instance it was distilled from (-1: a merge's, or unknown)


OP_KINDS = ("add", "update", "remove", "none")


@dataclass
class Operation:
    """One extractor decision. `ExperienceBank.apply` applies a list of them atomically under the bank's lock."""
    kind: str                          # "add" | "update" | "remove" | "none"
    task: str
    text: str = ""
    ids: tuple = ()                    # entries replaced (update) or removed (remove)
    key: torch.Tensor | None = None    # [D] key of a new/merged entry; None on update = mean of replaced keys
    source: int = -1                   # extractor generation id that wrote it
    step: int = 0
    origin: int = -1                   # seed of the task instance whose episode it was distilled from


# ----------------------------------------------------------------------------------------------------------
# the bank



class _Partition:
    """One task's entries, as row-aligned arrays. Rows [0, n) are live; removing a row moves the last row
    into its place (O(D)), so the matrix stays dense. `order` keeps ids oldest-first for FIFO eviction."""

    def __init__(self, dim, limit):
        self.dim, self.limit, self.n = dim, limit, 0
        self.keys = torch.zeros(0, dim)
        self.ids = np.zeros(0, np.int64)        # row -> entry id
        self.shown = np.zeros(0, np.float64)    # row -> times shown (mirror of Entry.shown, for the vectorised penalty)
        self.last_shown = np.zeros(0, np.int64)  # row -> the iteration a training search last returned it in
        self.row_of = {}                        # entry id -> row
        self.order = OrderedDict()              # entry id -> None, oldest first

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
        self.ids, self.shown = grown(self.ids, -1), grown(self.shown, 0)
        self.last_shown = grown(self.last_shown, _NEVER)

    def append(self, eid, key, shown):
        self._grow(self.n + 1)
        r = self.n
        self.keys[r] = key
        self.ids[r], self.shown[r], self.last_shown[r] = eid, shown, _NEVER
        self.row_of[eid] = r
        self.order[eid] = None
        self.n += 1

    def delete(self, eid):
        r, last = self.row_of.pop(eid), self.n - 1
        del self.order[eid]
        if r != last:  # move the last row into the hole
            self.keys[r] = self.keys[last]
            self.ids[r], self.shown[r], self.last_shown[r] = self.ids[last], self.shown[last], self.last_shown[last]
            self.row_of[int(self.ids[r])] = r
        self.ids[last] = -1
        self.n -= 1

    def move_rows(self, target):
        """Move live row i to row target[i] (a permutation of range(n))."""
        n, target = self.n, np.asarray(target, np.int64)
        self.keys[torch.from_numpy(target)] = self.keys[:n].clone()
        for a in (self.ids, self.shown, self.last_shown):
            a[target] = a[:n].copy()
        self.row_of = {int(eid): r for r, eid in enumerate(self.ids[:n])}


class ExperienceBank(Persistence):
    """Entries partitioned by task, each task's L2-normalised keys in one matrix.

    search = cosine top-`candidates` (one matmul + top-k; equal cosines newest first), then the release's re-rank
    on the rank scale (PAPER §Experience bank: retrieval [release]): candidate j (0 = the cosine best) scores
        -j - use_penalty*log(1 + times shown) - recency_penalty*[shown within the last recency_window iterations],
    and, with probability `dropout`, a just-shown top 1 moves to the end. An entry needs about 12 showings to
    lose one place to its runner-up. A call's queries are read `search_batch` at a time, in order, each batch
    from one snapshot of the usage (the release's batches of up to 32 queries); a training search (update=True)
    counts what a batch showed, at iteration `now`, before the next batch reads. With both penalties 0 it is
    plain cosine top-k.
    Capacity is per task; beyond it the oldest entry of the task is evicted.
    Thread-safe: every public method holds `lock` (one plain mutex; a training search counts what it shows,
    so it writes too). Public methods never call each other under it: it is not re-entrant.
    """

    def __init__(self, dim: int, capacity: int = BankConfig.capacity, candidates: int = CANDIDATES,
                 use_penalty: float = BankConfig.use_penalty, recency_penalty: float = BankConfig.recency_penalty,
                 recency_window: int = BankConfig.recency_window, dropout: float = BankConfig.dropout,
                 search_batch: int = SEARCH_BATCH, min_cosine: float = BankConfig.min_cosine):
        if int(dim) <= 0 or int(capacity) <= 0 or int(candidates) <= 0:
            raise ValueError(f"ExperienceBank needs dim, capacity, candidates > 0 "
                             f"(got {dim}, {capacity}, {candidates})")
        if use_penalty < 0 or recency_penalty < 0 or recency_window < 0 or not 0 <= dropout <= 1 or search_batch < 1:
            raise ValueError("ExperienceBank penalties and recency_window must be >= 0, dropout within [0, 1], "
                             "search_batch >= 1")
        self.dim, self.capacity, self.candidates = int(dim), int(capacity), int(candidates)
        self.use_penalty, self.recency_penalty = float(use_penalty), float(recency_penalty)
        self.recency_window, self.dropout, self.search_batch = int(recency_window), float(dropout), int(search_batch)
        self.min_cosine = float(min_cosine)
        self.lock = threading.Lock()
        self._entries: dict[int, Entry] = {}
        self._parts: dict[str, _Partition] = {}
        self._next_id = 0
        self.stats = {"added": 0, "updated": 0, "removed": 0, "evicted": 0, "stale_ids": 0, "stale_uses": 0,
                      "skipped": 0, "searches": 0, "off_top1": 0}

    # ---- reading -----------------------------------------------------------------------------------------
    def __len__(self):
        with self.lock:
            return len(self._entries)

    def size(self, task) -> int:
        with self.lock:
            part = self._parts.get(task)
            return 0 if part is None else part.n

    def tasks(self) -> list[str]:
        with self.lock:
            return sorted(t for t, p in self._parts.items() if p.n)

    def get(self, id) -> Entry | None:
        with self.lock:
            return self._entries.get(id)

    def entries(self, task) -> list[Entry]:
        """A task's entries, oldest first."""
        with self.lock:
            part = self._parts.get(task)
            return [] if part is None else [self._entries[i] for i in part.order]

    def lessons(self) -> dict[str, list[list]]:
        """Every task's lessons, oldest first, as [text, uses, successes, step written] rows: what train.py
        logs to bank.jsonl at each evaluation and probes.lessons reads."""
        return {task: [[e.text, e.uses, e.successes, e.created] for e in self.entries(task)] for task in self.tasks()}

    def key(self, id) -> torch.Tensor | None:
        with self.lock:
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

    # ---- unlocked edits (callers hold the lock) ---------------------------------------------------------
    def _insert(self, task, text, key, source, step, eid=None, uses=0, successes=0, shown=0, origin=-1) -> int:
        part = self._parts.get(task)
        if part is None:
            part = self._parts[task] = _Partition(self.dim, self.capacity)
        while part.n >= self.capacity:  # FIFO: the oldest entry of this task makes room
            self._delete(next(iter(part.order)))
            self.stats["evicted"] += 1
        if eid is None:
            eid, self._next_id = self._next_id, self._next_id + 1
        self._entries[eid] = Entry(eid, task, str(text), int(source), int(uses), int(successes), int(step), int(shown),
                                   int(origin))
        part.append(eid, key, shown)
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

    def _update(self, ids, text, key, source, step, task, origin=-1):
        live, task = self._live(ids, task, one_task=True)
        if task is None:
            raise ValueError("update: none of the ids exist and no task was given, so there is nowhere to add "
                             "the merged entry; pass task=")
        if key is None:
            if not live:
                self.stats["skipped"] += 1
                return None
            key = self._mean_key(task, live)
        for i in live:
            self._delete(i)
        self.stats["updated"] += 1
        return self._insert(task, text, key, source, step, origin=origin)

    def _mean_key(self, task, live):
        part = self._parts[task]
        keys = part.keys[[part.row_of[i] for i in live]]
        key = keys.mean(0)
        return key / key.norm() if key.norm() > 1e-6 else keys[0]  # opposite keys cancel: keep the first

    def _remove(self, ids, task=None):
        live, _ = self._live(ids, task)
        for i in live:
            self._delete(i)
        self.stats["removed"] += len(live)

    # ---- public edits -------------------------------------------------------------------------------------
    def add(self, task, text, key, source=-1, step=0) -> int:
        self._check_task(task)
        key = self._norm_key(key)
        with self.lock:
            self.stats["added"] += 1
            return self._insert(task, text, key, source, step)

    def update(self, ids, text, key=None, source=-1, step=0, task=None) -> int | None:
        """Replace the listed entries (of one task) by one merged entry; returns its id. Ids already gone,
        or of another task, are skipped (stats["stale_ids"]); if all are gone it is a plain add to `task`.
        key=None uses the normalised mean of the replaced entries' keys."""
        if task is not None:
            self._check_task(task)
        key = None if key is None else self._norm_key(key)
        with self.lock:
            return self._update(ids, text, key, source, step, task)

    def mean_key(self, ids) -> torch.Tensor | None:
        """The normalised mean of these entries' keys, as an update with key=None would key their merged entry
        (ids gone are skipped; None when all are)."""
        with self.lock:
            live, task = self._live(ids, None, one_task=True)
            return self._mean_key(task, live) if live else None

    def remove(self, ids) -> None:
        """Remove entries; ids already gone are skipped and counted in stats["stale_ids"]."""
        with self.lock:
            self._remove(ids)

    def apply(self, ops: list[Operation]) -> list[int | None]:
        """Apply operations in order, atomically (one lock hold): a search sees all or none of them.
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
        with self.lock:
            for op, key in zip(ops, keys):
                if op.kind == "add":
                    self.stats["added"] += 1
                    out.append(self._insert(op.task, op.text, key, op.source, op.step, origin=op.origin))
                elif op.kind == "update":
                    out.append(self._update(op.ids, op.text, key, op.source, op.step, op.task, op.origin))
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
        with self.lock:
            for e in self._found(ids):
                e.uses += 1
                e.successes += int(bool(success))

    def _found(self, ids):
        """The entries of `ids` still in the bank; each one gone meanwhile counts in stats["stale_uses"]."""
        for i in ids:
            e = self._entries.get(int(i))
            if e is None:
                self.stats["stale_uses"] += 1
            else:
                yield e

    # ---- search -------------------------------------------------------------------------------------------
    def search(self, task, query_keys, k: int, update: bool = True, now: int = 0,
               rng: np.random.Generator | None = None) -> list[list[tuple[Entry, float]]]:
        """For each query ([D] or [Q, D], normalised here), up to k (entry, cosine) pairs, best first by
        the re-ranked score. An unknown or empty task gives empty lists. `now` is the iteration (the recency
        clock); `rng` draws the top-1 dropout (None: no dropout). update=False reads the usage without
        counting (evaluation; search_and_ask, whose picks crl counts later with count_shown): such searches
        leave later answers unchanged."""
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
        with self.lock:
            part = self._parts.get(task)
            if part is None or part.n == 0:
                return [[] for _ in range(len(q))]
            out = []
            c = min(part.n, max(self.candidates, int(k)))
            for s in range(0, len(q), self.search_batch):   # a batch reads the counts the batches before it left
                cos, rows = self._candidates(part, q[s:s + self.search_batch], c)
                near = cos >= self.min_cosine - 1e-6     # sorted by cosine: a prefix of each row
                picked = self._rerank(part, rows, min(int(k), part.n), int(now), rng, near.sum(1))
                picked = [sel[near[i, sel]] for i, sel in enumerate(picked)]
                if update:
                    self._count_shown(part, cos, rows, picked, int(now))
                out += [[(self._entries[int(part.ids[rows[i, j]])], float(cos[i, j])) for j in sel]
                        for i, sel in enumerate(picked)]
            return out

    @staticmethod
    def _candidates(part, q, c):
        """Top-c rows by cosine, as numpy [Q, c]: scores descending, and among cosines equal to 5 decimals the
        newest entry first (the highest id: an UPDATE re-inserts its lesson there), chosen over the whole task,
        so the freshest of many equally near lessons is served. Rounding makes the order deterministic: a query
        embedded in another batch (the last bits of a float differ) must not swap two entries written from the
        same query."""
        cos = q @ part.keys[:part.n].T
        ids = torch.from_numpy(part.ids[:part.n])
        order = torch.round(cos * 1e5).long() * (int(ids.max()) + 1) + ids   # cosine first, then the id
        rows = torch.topk(order, c, dim=1).indices
        return cos.gather(1, rows).numpy(), rows.numpy()

    def _rerank(self, part, rows, k, now, rng, near):
        """Column indices into the candidate lists, k per query, best score first (ties keep cosine order).
        `near`: how many of each row's candidates are near enough to serve; the others stay behind them."""
        c = rows.shape[1]
        recent = part.last_shown[rows] >= now - self.recency_window
        score = -np.arange(c) - self.use_penalty * np.log1p(part.shown[rows]) - self.recency_penalty * recent
        score[np.arange(c)[None] >= near[:, None]] = -np.inf
        order = np.argsort(-score, axis=1, kind="stable")
        if rng is not None and self.dropout:
            drop = rng.random(len(order)) < self.dropout
            for i in np.flatnonzero(drop & recent[np.arange(len(order)), order[:, 0]]):
                order[i, :near[i]] = np.roll(order[i, :near[i]], -1)   # the just-shown top 1 goes last
        return order[:, :k]

    def _count_shown(self, part, cos, rows, picked, now):
        """A training search's picks are shown: count them and stamp the iteration; and count the picks
        whose cosine is below the best candidate's (the re-rank's share of the choice, a run's metric)."""
        self.stats["searches"] += int(sum(len(sel) > 0 for sel in picked))
        self.stats["off_top1"] += int(sum(len(sel) > 0 and cos[i, sel[0]] < cos[i, 0] - 1e-6
                                          for i, sel in enumerate(picked)))
        for i, sel in enumerate(picked):
            for r in rows[i, sel]:
                self._show(part, r, now)

    def _show(self, part, r, now):
        part.shown[r] += 1
        part.last_shown[r] = now
        self._entries[int(part.ids[r])].shown += 1

    def count_shown(self, ids, now: int) -> None:
        """Count entries as shown at iteration `now` by searches that read without counting (update=False):
        crl's asks, counted after the rollout. Entries gone meanwhile are skipped (stats["stale_uses"])."""
        with self.lock:
            for e in self._found(ids):
                part = self._parts[e.task]
                self._show(part, part.row_of[e.id], int(now))


# ----------------------------------------------------------------------------------------------------------
# the manager

class ExperienceManager:
    """The bank, the embedder, and the one background thread distillation runs on.

    search(): embeds the queries and searches the bank on the caller's thread.
    submit(fn, *args) -> Future: `fn(*args)` (parallel.Distillation submits crl.distill) runs on the
    manager's thread, a one-worker ThreadPoolExecutor, so jobs run one at a time in submission order. What
    the job returns, or raises, reaches the caller only through its future; the manager applies nothing
    (the caller applies the operations, crl.apply_everywhere, every rank's in rank order).
    sync=True: no thread; submit runs the job inline and returns its future already done.
    """

    def __init__(self, bank: ExperienceBank, embedder, sync: bool = False):
        if getattr(embedder, "dim", bank.dim) != bank.dim:
            raise ValueError(f"embedder dim {embedder.dim} != bank dim {bank.dim}; build the bank with "
                             "ExperienceBank(dim=embedder.dim)")
        self.bank, self.embedder = bank, embedder
        self._closed = False
        self._executor = None if sync else ThreadPoolExecutor(max_workers=1, thread_name_prefix="bank-distill")

    # ---- the actor's side ---------------------------------------------------------------------------------
    def embed(self, texts) -> torch.Tensor:
        return self.embedder(list(texts))

    def search(self, task, query_texts: list[str], k: int, update: bool = True, now: int = 0,
               rng: np.random.Generator | None = None) -> list[list[tuple[Entry, float]]]:
        """Embed the query texts and search the bank (see ExperienceBank.search; update=False leaves the
        usage counts alone)."""
        if isinstance(query_texts, str):
            raise ValueError("search takes a list of query texts (wrap a single text in a list)")
        query_texts = list(query_texts)
        if not query_texts:
            return []
        return self.bank.search(task, self.embed(query_texts), k, update, now, rng)

    def record_use(self, ids, success) -> None:
        self.bank.record_use(ids, success)

    # ---- the extractor's side -----------------------------------------------------------------------------
    def apply(self, ops: list[Operation]) -> list[int | None]:
        return self.bank.apply(ops)

    def submit(self, fn, *args) -> Future:
        """`fn(*args)` on the manager's thread (inline with sync=True); its result or exception in the future."""
        if self._closed:   # no thread is left to run it
            raise RuntimeError("ExperienceManager is closed; build a new one")
        if self._executor is not None:
            return self._executor.submit(fn, *args)
        future = Future()
        try:
            future.set_result(fn(*args))
        except BaseException as err:   # as the executor's worker does: the caller meets it in result()
            future.set_exception(err)
        return future

    def close(self) -> None:
        """Finish the submitted jobs and stop the thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
