"""The rolling merge's bookkeeping (crl.merge_pass): one task's chain of merge calls, what each was shown, what its
reply keeps, and the bank operations the chain ends in. crl.merge_pass prompts the extractor and parses its replies;
this module only keeps the lists."""
import re

from bank import Operation

STUB_RE = re.compile(r"(your\s+(comprehensive\s+)?|(first|second)\s+(merged\s+)?)knowledge|\[.*placeholder.*\]$|<.*>$")


def lasting(text: str) -> bool:
    """[release] Whether a merge's item may replace what it was shown: over 30 characters and not a stub copied
    from the prompt's template (`<...>`, `[placeholder]`, `Your knowledge ...`). A one-word lesson never is."""
    return len(text.strip()) > 30 and not STUB_RE.match(text.strip().lower())


class MergeChain:
    """One task's rolling merge [release]. Each item shown is (text, the bank entries it stands for, the generation
    that wrote it; None for an entry as the bank holds it). A call's reply is the new list for the items shown:
    each `UPDATE i,j: text` one new item standing for items i and j, each `KEEP i` item i as it is; an item no
    line names is gone, as is an item that does not last (`lasting`). The whole list is carried into the next
    call, after its chunk of entries. A reply with no valid line (NONE, empty, unparsable) or none that lasts
    keeps what it was shown: its entries stay in the bank as they are, what the chain carried to it is written
    as it is, and the next call starts afresh from its own chunk. At the end every entry shown to a successful
    call is removed and each item of the lists left is written anew (new id, counts reset), keyed by the mean of
    its entries' keys (a kept entry: its own key) and credited to the generation whose list held it last."""

    def __init__(self, task: str, entries: list, size: int):
        self.task, self.size = task, size
        self.pending = [(e.text, (e.id,), None) for e in entries]   # oldest first
        self.carried, self.written, self.replaced, self.shown = [], [], [], []

    def next_chunk(self) -> bool:
        """The next call's items (the next entries, then what the last call wrote), if any entry is left."""
        if not self.pending:
            self.written += self.carried
            self.carried, self.shown = [], []
            return False
        self.shown = self.pending[:self.size] + self.carried
        self.pending, self.carried = self.pending[self.size:], []
        return True

    def apply(self, parsed: list[tuple], gen_id: int):
        listed = []
        for kind, targets, text in parsed:
            items = [self.shown[t - 1] for t in targets]
            if kind == "keep":
                listed += [(item_text, ids, gen_id) for item_text, ids, _ in items]
            else:
                listed.append((text, tuple(i for _, ids, _ in items for i in ids), gen_id))
        listed = [item for item in listed if lasting(item[0])]
        if not listed:   # [release] a failed, empty or all-stub reply must not wipe what it was shown
            self.written += [item for item in self.shown if item[2] is not None]
            return
        self.replaced += [i for _, ids, gen in self.shown if gen is None for i in ids]
        self.carried += listed

    def operations(self, step: int, key_of) -> list[Operation]:
        """The removal of every replaced entry, then each new lesson keyed by `key_of(its entries)`: the keys are
        taken before anything is removed, so lessons that share an entry both keep it in their key."""
        new = [Operation("add", self.task, text, ids, key_of(ids), gen, step) for text, ids, gen in self.written]
        return [Operation("remove", self.task, "", tuple(self.replaced), step=step)] * bool(self.replaced) + new
