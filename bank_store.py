"""The experience bank on disk: save, load and copy (ExperienceBank inherits them from `Persistence`).

dir/ holds meta.json (settings, counters), entries.jsonl (one entry a line, each task's oldest first, with its
row and the iteration it was last shown in) and keys.safetensors (the keys, same order). Plain files: train.py
writes them into a new checkpoint directory and makes that durable as a whole. A missing, half-written or
corrupt directory raises a one-line error; never an empty bank.
"""
import json
import warnings
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

VERSION = 3              # of the saved layout: 3 = the rank-scale re-rank (counts shown, iterations last shown)
RERANK = ("use_penalty", "recency_penalty", "recency_window", "dropout", "search_batch", "min_cosine")   # saved
NEVER = -(1 << 60)       # "last shown" of an entry no training search has returned


class Persistence:
    """ExperienceBank's save / load / copy: they read its lock, entries, partitions and settings."""

    def save(self, dir) -> None:
        """Write the bank into `dir` (created if needed; a previous save there is overwritten)."""
        from safetensors.torch import save_file
        with self.lock:  # copy consistently, write the files outside the lock
            meta, lines, keys = self._state()
        root = Path(dir)
        root.mkdir(parents=True, exist_ok=True)
        (root / "entries.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        save_file({"keys": keys.contiguous()}, str(root / "keys.safetensors"))
        (root / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")

    def _state(self):
        """meta, entry lines and keys as save() writes them (caller holds the lock). Rows, counts and the
        iterations last shown are kept so a resumed run scores, breaks ties and re-ranks exactly as before."""
        meta = {"format": "crl-experience-bank", "version": VERSION, "dim": self.dim, "capacity": self.capacity,
                "candidates": self.candidates, **{k: getattr(self, k) for k in RERANK},
                "next_id": self._next_id, "stats": dict(self.stats)}
        lines, keys = [], [torch.zeros(0, self.dim)]
        for part in self._parts.values():  # oldest first within a task, so eviction order survives
            rows = [part.row_of[eid] for eid in part.order]
            lines += [json.dumps({**asdict(self._entries[eid]), "row": r, "last_shown": int(part.last_shown[r])},
                                 ensure_ascii=False) for eid, r in zip(part.order, rows)]
            keys.append(part.keys[rows])
        meta["count"] = len(lines)
        return meta, lines, torch.cat(keys)

    def copy(self, empty: bool = False) -> "ExperienceBank":
        """An independent bank with the same entries, keys, rows and counts; `empty`: the same settings and no
        entries (evaluate_attempts' start)."""
        with self.lock:
            meta, lines, keys = self._state()
        if empty:
            lines, keys = [], keys[:0]
        return self._restore(meta, [json.loads(line) for line in lines], keys, {})

    @classmethod
    def load(cls, dir, **overrides) -> "ExperienceBank":
        """Load a bank written by save(). `overrides` replace saved settings (e.g. capacity=...).
        A missing, half-written or corrupt directory raises a one-line error; never an empty bank."""
        root = Path(dir)
        if not root.is_dir():
            raise FileNotFoundError(f"no experience bank at {root}: the directory does not exist")
        if not (root / "meta.json").is_file() and (root / "CURRENT").is_file():
            snapshot = (root / (root / "CURRENT").read_text().strip()).resolve()   # an older save: CURRENT names
            if root.resolve() not in snapshot.parents:                             # its snapshot, inside it
                raise ValueError(f"{root / 'CURRENT'} names {snapshot}, outside the bank's directory; a bank "
                                 "reads only its own files")
            root = snapshot
        if not (root / "meta.json").is_file():
            raise FileNotFoundError(f"{root} is not a saved experience bank (no meta.json); "
                                    "point to the directory ExperienceBank.save() wrote")
        from safetensors import SafetensorError
        try:
            return cls._restore(*_read(root), overrides)
        except (OSError, KeyError, TypeError, ValueError, SafetensorError) as e:   # one line, not a traceback
            why = str(e) if type(e) is ValueError else f"{type(e).__name__}: {e}"
            raise ValueError(f"corrupt experience bank {root}: {why}; restore it from a backup or delete it") from None

    @classmethod
    def _restore(cls, meta, records, keys, overrides):
        old = meta.get("version", 1) < VERSION   # re-ranked on the cosine scale, by query ticks: its usage
        if old:                                  # carries over (times shown = uses), its settings and clock do not
            warnings.warn("experience bank saved before the release's rank-scale re-rank: its entries load, its "
                          "re-rank settings are the current defaults and its recency state starts afresh")
        settings = {k: meta[k] for k in ("dim", "capacity", "candidates", *([] if old else RERANK)) if k in meta}
        bank = cls(**{**settings, **overrides})
        for r, key in zip(records, keys):
            bank._insert(r["task"], r["text"], key, r["source"], r["created"], eid=r["id"], uses=r["uses"],
                         successes=r["successes"], shown=r.get("shown", r["uses"]), origin=r.get("origin", -1))
            part = bank._parts[r["task"]]
            part.last_shown[part.row_of[r["id"]]] = r.get("last_shown", NEVER)
        saved_row = {r["id"]: r.get("row") for r in records}
        for task, part in bank._parts.items():
            rows = [saved_row[int(i)] for i in part.ids[:part.n]]
            if None not in rows:   # (older saves kept no rows) the saved order, of the survivors of an override
                part.move_rows(np.argsort(np.argsort(rows)))
        bank._next_id = max(meta["next_id"], max(bank._entries, default=-1) + 1)
        bank.stats.update(meta.get("stats", {}))
        return bank


def _read(root: Path):
    """meta, entry records and keys of a saved bank, checked against each other; raises on any damage."""
    from safetensors.torch import load_file
    meta = json.loads((root / "meta.json").read_text(encoding="utf-8"))
    if not isinstance(meta, dict) or meta.get("format") != "crl-experience-bank":
        raise ValueError("meta.json is not an experience-bank header")
    # split("\n"), not splitlines(): a lesson's text may hold a raw U+2028, where splitlines() would cut it
    text = (root / "entries.jsonl").read_text(encoding="utf-8")
    records = [json.loads(line) for line in text.split("\n") if line.strip()]
    keys = load_file(str(root / "keys.safetensors"))["keys"]
    if len(records) != meta["count"] or tuple(keys.shape) != (meta["count"], meta["dim"]):
        raise ValueError(f"{len(records)} entries and keys of shape {tuple(keys.shape)}, header says "
                         f"{meta['count']} x {meta['dim']}")
    if not torch.isfinite(keys).all():   # would make every search's scores NaN
        raise ValueError("keys.safetensors holds non-finite keys")
    if len({r["id"] for r in records}) != len(records):   # would leave two rows for one entry
        raise ValueError("entries.jsonl lists an id twice")
    return meta, records, keys
