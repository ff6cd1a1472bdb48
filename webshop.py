"""WebShop, the "small" 1,000-product setting, offline and exact to the original (princeton-nlp/WebShop at
64fa2a5: web_agent_site/envs/web_agent_text_env.py, engine/{engine,goal,normalize}.py, templates/; its
search is pyserini/Anserini's Lucene 9.5). Three pure parts, each checked against the original's numbers in
tests/test_webshop.py:
- `webshop_search(query, k)`: Lucene's English analyzer and BM25 (k1 0.9, b 0.4, quantised lengths, float32),
  what the original's pyserini index returns (bm25s does not: it keeps exact lengths and its own tie order);
- `webshop_reward(product, goal, price, options)`: the original `get_reward`, with rapidfuzz for thefuzz and a
  precomputed spaCy noun table for the title term, so no spaCy at run time;
- `build_shop(seed)`: prices and the 6,910 synthetic goals in the original order (seed-233 shuffle); the
  original draws prices and price bounds unseeded, we draw them from a fixed build seed.
`Site` is one session of the original text env in its `text` mode: pages as ` [SEP] `-joined segments,
`search[...]` and `click[...]` with the original's validity and transitions, the reward at `buy now`.
envs.WebShop wraps it for RL (goal splits, step limit, action list). A module of its own for its size.
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

DATA = Path(__file__).resolve().parent / "data" / "webshop"
MAX_STEPS = 10          # actions per episode, as the authors (ROLL, ComplementaryRL) play WebShop
BUILD_SEED = 42         # seeds prices and price bounds (verl-agent's default seed; the original is unseeded)
TEST_GOALS = 500        # goals[:500] are held out for evaluation, goals[500:] train (verl-agent's split)
RESULTS, PAGE_SIZE = 50, 10

# ----------------------------------------------------------------- analyzer (Anserini DefaultEnglishAnalyzer)

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


# ------------------------------------------------------------------------------------- search (Anserini BM25)

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

    def __init__(self, ids: list[str], docs: list[list[str]], k1: float = 0.9, b: float = 0.4):
        f32 = np.float32
        self.ids, self.n = ids, len(docs)
        self.id_rank = np.argsort(np.argsort(ids))  # ties break by id string, as Anserini does
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

    def search(self, tokens: list[str], k: int) -> list[tuple[str, float]]:
        """The k best (id, score) among documents holding a query term, each occurrence of a term in the query
        a clause of its own; summed in float64, then rounded to float32 like Lucene's score."""
        total, hit = np.zeros(self.n), np.zeros(self.n, bool)
        for t in tokens:
            if t in self.postings:
                docs, tf = self.postings[t]
                w = self.idf(len(docs))
                total[docs] += w - w / (np.float32(1) + tf * self.inv[docs])
                hit[docs] = True
        docs = np.flatnonzero(hit)
        scores = total[docs].astype(np.float32)
        best = docs[np.lexsort((self.id_rank[docs], -scores))[:k]]
        return [(self.ids[d], float(np.float32(total[d]))) for d in best]


@functools.cache
def search_index() -> SearchIndex:
    products = catalogue()
    return SearchIndex([p["asin"] for p in products], [analyze(document(p)) for p in products])


@functools.lru_cache(maxsize=4096)
def _search(query: str, k: int) -> tuple:
    return tuple(search_index().search(analyze(query), k))


def webshop_search(query: str, k: int = RESULTS) -> list[tuple[str, float]]:
    """The original's search: the top k (ASIN, BM25 score) for a query, best first, ties by ASIN. (Paging
    repeats a search, hence the cache.)"""
    return list(_search(query, k))


# ------------------------------------------------------------------------------------------- reward (goal.py)

COLOR_SET = (  # the original's colour list (engine/normalize.py), in its order: the first one contained wins
    "alabaster apricot aqua ash asphalt azure banana beige black blue blush bordeaux bronze brown burgundy "
    "camel camo caramel champagne charcoal cheetah chestnut chocolate christmas coffee cognac copper coral "
    "cranberry cream crystal dark denim eggplant elephant espresso fuchsia gold granite grape graphite grass "
    "gray green grey heather indigo ivory ivy khaki lavender lemon leopard light lilac lime magenta maroon "
    "mauve merlot midnight mint mocha multicolor mushroom mustard natural navy nude olive orange peach pewter "
    "pink plum purple rainbow red rose royal rust sand sapphire seashell silver skull slate steel stone "
    "stonewash sunflower tan taupe teal tiger turquoise violet walnut wheat white wine yellow").split()
_LATIN1 = {i: None for i in range(128, 256)}


def token_set_ratio(a, b) -> int:
    """thefuzz's token_set_ratio (force_ascii, full_process; integer score) through rapidfuzz (imported here:
    only the reward needs it, and envs.py imports this module for every task)."""
    from rapidfuzz import fuzz, utils

    def clean(x):
        return utils.default_process(str(x).translate(_LATIN1))
    return int(round(fuzz.token_set_ratio(clean(a), clean(b))))


def normalize_color(option):
    """The first colour of COLOR_SET contained in the option (a substring test for a string, an element test
    for a goal's (name, value) tuple), else the option unchanged."""
    return next((c for c in COLOR_SET if c in option), option)


@functools.cache
def title_nouns() -> dict:
    """ASIN -> the NOUN/PROPN tokens of its title (spaCy en_core_web_sm 3.8.0; order and duplicates kept)."""
    return _read("webshop_title_nouns_sm380.json.xz")["nouns"]


def type_factor(product: dict, goal: dict) -> float:
    """r_type: 1, or 0.5 when query, category and title all differ, then 0.1 / 0 for (almost) no title noun
    in common. The title score divides by the goal title's nouns with duplicates."""
    query_match = product["query"] == goal["query"]
    levels = [{s.strip() for s in x["product_category"].split("›")} for x in (product, goal)]
    category_match = len(levels[0] & levels[1]) >= 2
    nouns, wanted = title_nouns()[product["asin"]], title_nouns()[goal["asin"]]
    title = 0.2 if not wanted else len(set(nouns) & set(wanted)) / len(wanted)
    r_type = 1.0 if query_match or category_match or title > 0.2 else 0.5
    return 0.0 if title == 0.0 else 0.1 if title < 0.1 else r_type


def attribute_matches(product: dict, goal: dict) -> int:
    """Goal attributes found in the product: fuzzy in its attributes, else a substring of title, bullets or
    description."""
    texts = (product["Title"].lower(), " ".join(product["BulletPoints"]).lower(), product["Description"].lower())
    return sum(any(token_set_ratio(p, g) > 85 for p in product["Attributes"]) or any(g in t for t in texts)
               for g in goal["attributes"])


def option_matches(options: dict, goal: dict) -> int:
    """Goal options matched by a chosen option after colour normalisation; a goal option is a (name, value)
    tuple and compares as its str()."""
    chosen = [normalize_color(v) for v in options.values()]
    wanted = [normalize_color(o) for o in goal["goal_options"].items()]
    return sum(any(token_set_ratio(p, g) > 85 for p in chosen) for g in wanted)


def webshop_reward(product: dict, goal: dict, price: float, options: dict) -> float:
    """The original get_reward: r_type x (attributes + options + price matched) / (their count + 1)."""
    matched = attribute_matches(product, goal) + option_matches(options, goal) + (price <= goal["price_upper"])
    return matched / (len(goal["attributes"]) + len(goal["goal_options"]) + 1) * type_factor(product, goal)


# -------------------------------------------------------------------------------------------- goals (goal.py)

PRICE_RANGE = [10.0 * i for i in range(1, 100)]


@dataclass
class Shop:
    products: dict   # ASIN -> record
    prices: dict     # ASIN -> the price the reward compares (a range's price is drawn once)
    goals: list      # the 6,910 synthetic goals in the original's order


@functools.cache
def build_shop(seed: int) -> Shop:
    """Prices, then price bounds and goals (catalogue order, option names sorted, every option combination),
    then the original's seed-233 shuffle: the original's RNG calls, in its order, from a seeded generator."""
    rng, annotations = random.Random(seed), _read("items_ins_v2_1000.json.xz")
    products = {p["asin"]: p for p in catalogue()}
    prices = {a: (rng.uniform(*p["pricing"][:2]) if len(p["pricing"]) > 1 else p["pricing"][0] if p["pricing"]
                  else 100.0) for a, p in products.items()}
    goals = []
    for asin, p in products.items():
        if annotations[asin].get("instruction") is None:
            continue
        bounds = [x for x in PRICE_RANGE if x > prices[asin]][:4]
        upper = sorted(rng.sample(bounds, 2))[1] if len(bounds) >= 2 else 1000000
        price_text = f", and price lower than {upper:.2f} dollars" if len(bounds) >= 2 else ""
        names = sorted(p["options"])
        for combo in itertools.product(*(p["options"][n] for n in names)):
            chosen = dict(zip(names, combo))
            option_text = " with " + ", and ".join(f"{k}: {v}" for k, v in chosen.items()) if chosen else ""
            goals.append(dict(asin=asin, category=p["category"], query=p["query"], name=p["Title"],
                              product_category=p["product_category"], attributes=annotations[asin][
                                  "instruction_attributes"], price_upper=upper, goal_options=chosen,
                              instruction_text=annotations[asin]["instruction"] + option_text + price_text))
    random.Random(233).shuffle(goals)
    return Shop(products, prices, goals)


# -------------------------------------------------------------------- site (web_agent_text_env.py, templates)

SUB_PAGES = ("description", "features", "reviews", "attributes")
_ACTION = re.compile(r"(.+)\[(.+)\]")   # the original's parse: greedy name, text after the last ']' ignored


def visible(text: str) -> str | None:
    """A text node as the original's `text` mode keeps it: stripped; a bare run of spaces becomes an empty
    segment, whitespace with a newline (or nothing at all) no segment."""
    if not text:
        return None
    if not text.strip(" \t\n\r\f"):
        return None if "\n" in text else ""
    return text.strip()


def tojson(value) -> str:
    """Flask's `tojson` filter: sorted keys, ASCII, and <>&' escaped for HTML."""
    out = json.dumps(value, sort_keys=True)
    return out.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").replace("'", "\\u0027")


class Site:
    """One shopping session of the original text env: which page is shown, its clickables, the transitions
    of search[...] and click[...], and the page as `text` mode renders it."""

    def __init__(self, shop: Shop, goal: dict, rng: random.Random):
        self.shop, self.goal, self.rng = shop, goal, rng
        self.reward = None
        self.home()

    def home(self):
        """The search page; `back to search` also forgets the search, the product and the options."""
        self.page, self.keywords, self.page_no, self.asin, self.options, self.hits = "search", None, None, None, {}, []

    def show_results(self, page_no: int):
        self.page, self.page_no, self.asin, self.options = "results", page_no, None, {}
        self.hits = self.found()

    def found(self) -> list[dict]:
        """The original's get_top_n_product_from_keywords, with its debugging prefixes <r>, <c>, <q>."""
        kw, products = self.keywords, catalogue()
        if kw[0] == "<r>":
            return self.rng.sample(products, RESULTS)
        if kw[0] == "<c>":
            return [p for p in products if p["category"] == kw[1].strip()]
        if kw[0] == "<q>":
            return [p for p in products if p["query"] == " ".join(kw[1:]).strip()]
        return [self.shop.products[a] for a, _ in webshop_search(" ".join(kw))]

    def clickables(self) -> dict:
        """Lower-cased button texts, then product links, then option values (value -> its group): the
        original's text_to_clickable, where a repeated key keeps its first position and its last meaning."""
        out = {"search": None} if self.page == "search" else {}
        if self.page in ("results", "item") + SUB_PAGES:
            out["back to search"] = None
        if self.page in ("item",) + SUB_PAGES or (self.page == "results" and self.page_no > 1):
            out["< prev"] = None
        if self.page == "results":
            out["next >"] = None
            out.update((p["asin"].lower(), "link") for p in self.shown())
        if self.page == "item":
            out.update((b, None) for b in ("description", "features", "reviews", "buy now"))
            for group, values in self.product()["options"].items():
                out.update((v, group) for v in values)
        return out

    def parse(self, text: str) -> tuple[str, str] | None:
        """(name, argument) when the original would act on the text, else None (a no-op there)."""
        m = _ACTION.match(text)
        if m is None:
            return None
        name, arg = m.group(1), m.group(2).lower()
        if name == "search":
            kw = arg.split(" ")
            return None if kw[0] == "<a>" or (kw[0] == "<c>" and len(kw) < 2) else (name, arg)  # these crash it
        return (name, arg) if name == "click" and arg != "search" and arg in self.clickables() else None

    def act(self, name: str, arg: str):
        """Apply a parsed action; sets self.reward when it buys."""
        if name == "search":
            self.keywords = arg.split(" ")
            self.show_results(1)
        else:
            self.click(arg)

    def click(self, name: str):
        """The original's dispatch: by the clickable's text first, then by what kind of element it is."""
        kind = self.clickables()[name]
        if name == "buy now":
            self.reward = webshop_reward(self.product(), self.goal, self.shop.prices[self.asin], self.options)
            self.page = "done"
        elif name == "back to search":
            self.home()
        elif name in ("next >", "< prev") and self.page == "results":
            self.show_results(self.page_no + (1 if name == "next >" else -1))
        elif name == "< prev" and self.page in SUB_PAGES:
            self.page = "item"
        elif name == "< prev" and self.page == "item":
            self.show_results(self.page_no)
        elif name in SUB_PAGES:
            self.page = name
        elif kind == "link":
            self.page, self.asin = "item", name.upper()
        elif kind is not None:
            self.page, self.options[kind] = "item", name

    def product(self) -> dict:
        return self.shop.products[self.asin]

    def shown(self) -> list[dict]:
        return self.hits[(self.page_no - 1) * PAGE_SIZE:self.page_no * PAGE_SIZE]

    def text(self) -> str:
        return " [SEP] ".join(s for s in map(visible, self.nodes()) if s is not None)

    def nodes(self) -> list[str]:
        """The page's text nodes in document order (its template's)."""
        if self.page == "search":
            return ["WebShop", "Instruction:", self.goal["instruction_text"], "Search"]
        if self.page == "done":
            return self.done_nodes()
        head = ["Instruction:", self.goal["instruction_text"], "Back to Search"]
        if self.page == "results":
            return head + [f"Page {self.page_no} (Total results: {len(self.hits)})"] + \
                ["< Prev"] * (self.page_no > 1) + ["Next >"] + \
                [x for p in self.shown() for x in (p["asin"], p["Title"], p["Price"])]
        p = self.product()
        head.append("< Prev")
        if self.page == "item":
            return head + [x for name, values in p["options"].items() for x in (name, *values)] + \
                [p["Title"], f"Price: {p['Price']}", f"Rating: {p['Rating']}", "Description", "Features", "Reviews",
                 "Buy Now"]
        if self.page == "description":
            return head + [p["Description"]]
        if self.page == "features":
            return head + [" " + b for b in p["BulletPoints"]]
        return head  # reviews: never loaded by the original

    def done_nodes(self) -> list[str]:
        """The done page as the text env renders it: no MTurk code, goal or purchase details are passed to
        the template (hence the Nones and the empty Target fields); the hidden block is still text."""
        return ["Thank you for shopping with us!", "Your code: ", "None", " (Paste it in your MTurk interface.)",
                "Purchased", "asin", self.asin, "options", tojson(self.options),
                *(x for label in ("attrs", "category", "query", "product category") for x in (label, "None")),
                "Target", "asin", "options", "attrs", "price upper", "instuction text", "category",
                "product category", "query", "Goal", "None", "Reward", "Your score (min 0.0, max 1.0)",
                str(self.reward), "Reward Details", "None"]
