"""WebShop, the "small" 1,000-product setting, offline and exact to the original (princeton-nlp/WebShop).

The spec this follows, fact by fact, is WEBSHOP.md (the project's shared notes; section numbers below refer
to it). Three pure parts, each checked against the original's numbers in tests/test_webshop.py:
- `webshop_search(query, k)`: Lucene's English analyzer and BM25 (k1 0.9, b 0.4, quantised lengths, float32),
  what the original's pyserini index returns (bm25s does not: it keeps exact lengths and its own tie order);
- `webshop_reward(product, goal, price, options)`: the original `get_reward`, with rapidfuzz for thefuzz and a
  precomputed spaCy noun table for the title term, so no spaCy at run time;
- `build_shop(seed)`: prices and the 6,910 synthetic goals in the original order (seed-233 shuffle); the
  original draws prices and price bounds unseeded, we draw them from a fixed build seed.
`WebShop` is the text env (`text` observation mode): pages as ` [SEP] `-joined segments, `search[...]` and
`click[...]` with the original's validity and transitions, reward at `buy now`.
"""
import functools
import itertools
import json
import lzma
import random
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import regex
from rapidfuzz import fuzz, utils

DATA = Path(__file__).resolve().parent / "data" / "webshop"
MAX_STEPS = 10          # actions per episode, as the authors (ROLL, ComplementaryRL) play WebShop
BUILD_SEED = 42         # seeds prices and price bounds (verl-agent's default seed; the original is unseeded)
TEST_GOALS = 500        # goals[:500] are held out for evaluation, goals[500:] train (verl-agent's split)
RESULTS, PAGE_SIZE = 50, 10

# ------------------------------------------------------------------------------------------- analyzer (§3)

def _symbol_class() -> str:
    """Code points Lucene 9.5's StandardTokenizer emits as one-character tokens (emoji and kin), as a class."""
    spans = (DATA / "webshop_lucene_standalone_symbol_ranges.txt").read_text().split()
    bounds = [(s.partition("-")[0], s.partition("-")[2] or s) for s in spans]
    return "[" + "".join(f"\\U{int(a, 16):08X}-\\U{int(b, 16):08X}" for a, b in bounds) + "]"


def _tokenizer() -> regex.Pattern:
    """UAX #29 words as Lucene's StandardTokenizer grammar writes them: letters and digits join across one
    MidLetter/MidNum character and any ExtendNumLet; Extend/Format/ZWJ attach to what precedes (WB4);
    Han and Hiragana are one token per character; pictographs are tokens with their ZWJ sequences."""
    x = r"[\p{WB=Extend}\p{WB=Format}\p{WB=ZWJ}]*"
    a, n, k, e = (f"(?:{c}{x})" for c in (r"[\p{WB=ALetter}\p{WB=Hebrew_Letter}]", r"\p{WB=Numeric}",
                                          r"\p{WB=Katakana}", r"\p{WB=ExtendNumLet}"))
    mid_letter = rf"(?:[\p{{WB=MidLetter}}\p{{WB=MidNumLet}}\p{{WB=Single_Quote}}]{x})"
    mid_num = rf"(?:[\p{{WB=MidNum}}\p{{WB=MidNumLet}}\p{{WB=Single_Quote}}]{x})"
    run = f"(?:{k}(?:{e}*{k})*|(?:{n}(?:(?:{e}*|{mid_num}){n})*|{a}(?:(?:{e}*|{mid_letter}){a})*)+)"
    word = f"{e}*{run}(?:{e}+{run})*{e}*"
    symbol = f"{_symbol_class()}{x}"
    return regex.compile(rf"{word}|(?:\p{{LB=SA}}{x})+|[\p{{Han}}\p{{Hiragana}}]{x}|{symbol}(?:(?<=\u200d){symbol})*")


STOPWORDS = frozenset("a an and are as at be but by for if in into is it no not of on or such that the their "
                      "then there these they this to was will with".split())  # Lucene's English stop set


def analyze(text: str) -> list[str]:
    """Lucene's DefaultEnglishAnalyzer: StandardTokenizer, possessive 's dropped, lower case, stop words,
    Porter stemmer."""
    out = []
    for t in _TOKEN.findall(text):
        if len(t) >= 2 and t[-2] in "'\u2019\uff07" and t[-1] in "sS":
            t = t[:-2]
        t = t.lower()
        if t not in STOPWORDS:
            out.append(porter(t))
    return out


def _cons(w: str, i: int) -> bool:
    if w[i] in "aeiou":
        return False
    return True if w[i] != "y" or i == 0 else not _cons(w, i - 1)


def _measure(w: str) -> int:
    """m in [C](VC)^m[V]: the number of vowel-consonant sequences."""
    kinds = "".join("c" if _cons(w, i) else "v" for i in range(len(w)))
    return len(re.findall("v+c+", kinds))


def _has_vowel(w: str) -> bool:
    return any(not _cons(w, i) for i in range(len(w)))


def _double_cons(w: str) -> bool:
    return len(w) >= 2 and w[-1] == w[-2] and _cons(w, len(w) - 1)


def _cvc(w: str) -> bool:
    i = len(w) - 1
    return i >= 2 and _cons(w, i) and not _cons(w, i - 1) and _cons(w, i - 2) and w[i] not in "wxy"


_STEP2 = [("ational", "ate"), ("tional", "tion"), ("enci", "ence"), ("anci", "ance"), ("izer", "ize"),
          ("bli", "ble"), ("alli", "al"), ("entli", "ent"), ("eli", "e"), ("ousli", "ous"), ("ization", "ize"),
          ("ation", "ate"), ("ator", "ate"), ("alism", "al"), ("iveness", "ive"), ("fulness", "ful"),
          ("ousness", "ous"), ("aliti", "al"), ("iviti", "ive"), ("biliti", "ble"), ("logi", "log")]
_STEP3 = [("icate", "ic"), ("ative", ""), ("alize", "al"), ("iciti", "ic"), ("ical", "ic"), ("ful", ""),
          ("ness", "")]
_STEP4 = ["al", "ance", "ence", "er", "ic", "able", "ible", "ant", "ement", "ment", "ent", "ion", "ou", "ism",
          "ate", "iti", "ous", "ive", "ize"]


def _replace(w: str, rules, min_m: int) -> str:
    """The first rule whose suffix ends w applies if the stem's measure exceeds min_m (Porter's steps 2-3:
    the first matching suffix decides, even when its condition fails)."""
    for suffix, new in rules:
        if w.endswith(suffix):
            stem = w[:-len(suffix)]
            return stem + new if _measure(stem) > min_m else w
    return w


@functools.lru_cache(maxsize=None)
def porter(w: str) -> str:
    """Porter's stemmer as Lucene's PorterStemmer (Martin Porter's C version with its 'bli' and 'logi'
    departures); words of one or two letters are left alone."""
    if len(w) <= 2:
        return w
    if w.endswith("sses") or w.endswith("ies"):                     # step 1a
        w = w[:-2]
    elif w.endswith("s") and not w.endswith("ss"):
        w = w[:-1]
    if w.endswith("eed"):                                          # step 1b
        w = w[:-1] if _measure(w[:-3]) > 0 else w
    elif (w.endswith("ed") and _has_vowel(w[:-2])) or (w.endswith("ing") and _has_vowel(w[:-3])):
        w = w[:-2] if w.endswith("ed") else w[:-3]
        if w.endswith(("at", "bl", "iz")):
            w += "e"
        elif _double_cons(w):
            w = w if w[-1] in "lsz" else w[:-1]
        elif _measure(w) == 1 and _cvc(w):
            w += "e"
    if w.endswith("y") and _has_vowel(w[:-1]):                     # step 1c
        w = w[:-1] + "i"
    w = _replace(w, _STEP2, 0)
    w = _replace(w, _STEP3, 0)
    suffix = max((s for s in _STEP4 if w.endswith(s)), key=len, default="")  # step 4: the longest decides
    stem = w[:len(w) - len(suffix)]
    if suffix and _measure(stem) > 1 and (suffix != "ion" or stem[-1:] in ("s", "t")):
        w = stem
    if w.endswith("e"):                                            # step 5
        m = _measure(w[:-1])
        if m > 1 or (m == 1 and not _cvc(w[:-1])):
            w = w[:-1]
    if w.endswith("ll") and _measure(w) > 1:
        w = w[:-1]
    return w


_TOKEN = _tokenizer()


# --------------------------------------------------------------------------------------------- search (§3)

def _read(name: str):
    path = DATA / name
    opener = lzma.open if path.suffix == ".xz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f] if ".jsonl" in name else json.load(f)


@functools.cache
def catalogue() -> tuple[dict, ...]:
    """The 1,000 product records as the original's loader leaves them, in catalogue (= index) order."""
    return tuple(_read("webshop_products_1000.jsonl.xz"))


def document(p: dict) -> str:
    """What the original indexes for a product: title, description, first bullet point, options."""
    options = ", and ".join(f"{name}: {', '.join(values)}" for name, values in p["options"].items())
    return " ".join([p["Title"], p["Description"], p["BulletPoints"][0], options]).lower()


def _byte4(n: int) -> int:
    """A length through Lucene's SmallFloat.intToByte4 and back (the lossy norm BM25 scores with)."""
    if n < 24:
        return n
    i = n - 24
    bits = i.bit_length()
    if bits < 4:
        return n
    shift = bits - 4
    encoded = ((i >> shift) & 7) | ((shift + 1) << 3)
    return 24 + (((encoded & 7) | 8) << ((encoded >> 3) - 1))


class SearchIndex:
    """Lucene's BM25 over the catalogue: per term, the documents holding it and their term frequencies; per
    document, 1/(k1((1-b) + b dl/avgdl)) with the quantised length dl, all in float32 as Lucene computes."""

    def __init__(self, docs: list[list[str]], k1: float = 0.9, b: float = 0.4):
        f32 = np.float32
        self.n = len(docs)
        postings = {}
        for d, tokens in enumerate(docs):
            for t in tokens:
                postings.setdefault(t, {}).setdefault(d, 0)
                postings[t][d] += 1
        self.postings = {t: (np.fromiter(p, np.int64), np.fromiter(p.values(), f32)) for t, p in postings.items()}
        avgdl = f32(sum(map(len, docs)) / self.n)
        dl = np.array([_byte4(len(t)) for t in docs], f32)
        self.inv = f32(1) / (f32(k1) * ((f32(1) - f32(b)) + f32(b) * dl / avgdl))

    def idf(self, df: int) -> np.float32:
        return np.float32(np.log(1 + (self.n - df + 0.5) / (df + 0.5)))

    def search(self, tokens: list[str], k: int) -> list[tuple[int, float]]:
        """(doc, score) of the k best documents holding a query term; a repeated term counts again; ties by
        ASIN as Anserini breaks them (callers sort by id; here the doc index stands in, see webshop_search)."""
        total, hit = np.zeros(self.n), np.zeros(self.n, bool)
        for t in tokens:
            if t in self.postings:
                docs, tf = self.postings[t]
                w = self.idf(len(docs))
                total[docs] += w - w / (np.float32(1) + tf * self.inv[docs])
                hit[docs] = True
        scores = total.astype(np.float32)
        return [(int(d), float(scores[d])) for d in np.flatnonzero(hit)]


@functools.cache
def search_index() -> SearchIndex:
    return SearchIndex([analyze(document(p)) for p in catalogue()])


def webshop_search(query: str, k: int = RESULTS) -> list[tuple[str, float]]:
    """The original's search: the top k (ASIN, BM25 score) for a query, best first, ties by ASIN."""
    products = catalogue()
    hits = search_index().search(analyze(query), k)
    hits.sort(key=lambda h: (-h[1], products[h[0]]["asin"]))
    return [(products[d]["asin"], s) for d, s in hits[:k]]
