"""WebShop against the original's numbers: Lucene's tokens and top 50 (the golden fixture from real Lucene
9.5), the spec's example pages (real output of the original text env), the original's goal order, and
reward cases worked by hand from get_reward's definition."""
import json
import lzma
import re

import pytest

import envs
import webshop
from webshop import webshop_reward, webshop_search


def _jsonl(name):
    with lzma.open(webshop.DATA / name, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def shop():
    return webshop.build_shop(webshop.BUILD_SEED)


def _env(goal_index, shop):
    """A test-split env playing goal `goal_index` of the original order (test goals are goals[:500])."""
    env = envs.make("webshop", split="test")
    env.reset(goal_index)
    assert env.goal is shop.goals[goal_index]
    return env


def _with_bound(text, goal):
    """A spec example with this build's price bound (the original's bounds are unseeded)."""
    return re.sub(r"lower than [\d.]+ dollars", f"lower than {goal['price_upper']:.2f} dollars", text)


# ------------------------------------------------------------------------------------------------ search

def test_analyzer_tokens_equal_lucene_on_every_document_and_query():
    docs = _jsonl("webshop_lucene_doc_tokens.jsonl.xz")
    assert [d["asin"] for d in docs] == [p["asin"] for p in webshop.catalogue()]
    bad = [d["asin"] for d, p in zip(docs, webshop.catalogue()) if webshop.analyze(webshop.document(p)) != d["tokens"]]
    assert bad == []
    queries = _jsonl("webshop_bm25_lucene_fixture.jsonl.xz")[1:]
    assert [q["query"] for q in queries if webshop.analyze(q["query"]) != q["tokens"]] == []


def test_analyzer_hand_cases():
    # the spec's examples of each analyzer stage
    assert webshop.analyze("Men's X-Large 3x 38mm description:solid u.s.a e.g. 19.99 10,000") == \
        ["men", "x", "larg", "3x", "38mm", "description:solid", "u.s.a", "e.g", "19.99", "10,000"]
    assert webshop.analyze("it's the foo_bar") == ["foo_bar"]             # possessive, then stop words
    assert webshop.analyze("★ ☆ ❤️ ✔ ✓") == ["★", "❤️", "✔"]               # pictographs are tokens, not all
    assert webshop.analyze("技术 technology assembly") == ["技", "术", "technolog", "assembl"]


def test_search_top50_equals_lucene_on_all_fixture_queries():
    queries = _jsonl("webshop_bm25_lucene_fixture.jsonl.xz")[1:]
    assert len(queries) == 926
    mismatched, worst = [], 0.0
    for q in queries:
        got = webshop_search(q["query"])
        if [a for a, _ in got] != [a for a, _ in q["hits"]]:
            mismatched.append(q["query"])
        worst = max([worst] + [abs(s - ref) for (_, s), (_, ref) in zip(got, q["hits"])])
    assert mismatched == []
    assert worst < 2e-4   # Anserini rounds scores to 1e-4 (and nudges ties by 1e-6)


def test_search_totals_from_the_spec():
    assert len(webshop_search("streaming media players")) == 43
    assert webshop_search("the") == []          # no term survives analysis
    assert webshop_search("B09QCP4579") == []   # ASINs are not indexed


def test_smallfloat_norm():
    # Lucene SmallFloat.intToByte4/byte4ToInt: exact up to 24 + 15, then 3 bits below the leading one
    assert [webshop._byte4(n) for n in (0, 23, 24, 31, 39, 40, 41, 107, 120, 1000)] == \
        [0, 23, 24, 31, 39, 40, 40, 104, 120, 984]


# ------------------------------------------------------------------------------------------------- goals

def test_goals_in_the_original_order(shop):
    assert len(shop.goals) == 6910
    assert sum(bool(g["goal_options"]) for g in shop.goals) == 6725
    assert sum(g["price_upper"] == 1000000 for g in shop.goals) == 15
    assert [g["asin"] for g in shop.goals[:8]] == ["B0743JKHBV", "B09QCP4579", "B099WH1RTM", "B09LSKQF8C",
                                                   "B09M63B87V", "B07HRFSNL4", "B09PYSKD7H", "B097RK2B2Q"]
    assert [shop.goals[i]["goal_options"] for i in (0, 1, 3, 5)] == [
        {"size": '28" x 28"'}, {"color": "black", "size": "3x-large"}, {}, {"color": "black", "size": "xx-large tall"}]
    g = shop.goals[1]
    assert g["instruction_text"] == ("Find me butt lifting, light weight women's shorts with high waist, tummy "
                                     "control with color: black, and size: 3x-large, and price lower than "
                                     f"{g['price_upper']:.2f} dollars")
    # the bound is one of the four multiples of 10 above the price, never the lowest
    above = [10.0 * i for i in range(1, 100) if 10.0 * i > shop.prices[g["asin"]]][:4]
    assert g["price_upper"] in above[1:]


def test_build_seed_changes_bounds_not_order():
    a, b = webshop.build_shop(1), webshop.build_shop(2)
    assert [(g["asin"], g["goal_options"]) for g in a.goals] == [(g["asin"], g["goal_options"]) for g in b.goals]
    assert [g["price_upper"] for g in a.goals] != [g["price_upper"] for g in b.goals]


def test_splits_are_disjoint(shop):
    test, train = envs.make("webshop", split="test"), envs.make("webshop", split="train")
    assert len(test.goals) == 500 and len(train.goals) == 6410
    assert not {id(g) for g in test.goals} & {id(g) for g in train.goals}
    for seed in (0, 499, 1_000_000_007):
        test.reset(seed)
        assert test.goal is shop.goals[seed % 500]
        train.reset(seed)
        assert train.goal is shop.goals[500 + seed % 6410]
    with pytest.raises(ValueError, match="train or test"):
        envs.make("webshop", split="valid")


# ------------------------------------------------------------------------------------------------ reward

PRODUCT = dict(asin="P", query="shirts", product_category="Clothing › Men › Shirts", Title="Red Cotton Shirt",
               Attributes=["machine wash"], BulletPoints=["Soft fabric"], Description="A cotton shirt.")
GOAL = dict(asin="G", query="shirts", product_category="Clothing › Men › Tops", price_upper=30.0,
            attributes=["machine wash", "cotton shirt", "long sleeve"],
            goal_options={"color": "navy blue", "size": "large"})


@pytest.fixture
def nouns(monkeypatch):
    table = {"P": ["shirt", "cotton"], "G": ["shirt", "shirt", "sleeve", "cotton"]}
    monkeypatch.setattr(webshop, "title_nouns", lambda: table)
    return table


def test_reward_hand_worked(nouns):
    # attributes: 'machine wash' fuzzy (100), 'cotton shirt' a substring of the title, 'long sleeve' nowhere: 2/3
    # options: 'blue' matches ('color', 'navy blue') (token subset), 'large' matches ('size', 'large'): 2/2
    # price 25 <= 30: 1; title nouns {shirt, cotton} of the goal's 4 (duplicates count): 0.5, query equal: r_type 1
    opts = {"color": "blue", "size": "large"}
    assert webshop_reward(PRODUCT, GOAL, 25.0, opts) == pytest.approx(5 / 6)
    assert webshop_reward(PRODUCT, GOAL, 30.01, opts) == pytest.approx(4 / 6)              # over the bound
    assert webshop_reward(PRODUCT, GOAL, 25.0, {"size": "large"}) == pytest.approx(4 / 6)   # colour not chosen
    assert webshop_reward(PRODUCT, GOAL, 25.0, {"color": "black", "size": "large"}) == pytest.approx(4 / 6)
    # colour normalisation: 'dark navy blue' -> 'blue' (first of COLOR_SET contained) -> matches
    assert webshop_reward(PRODUCT, GOAL, 25.0, {"color": "dark navy blue", "size": "large"}) == pytest.approx(5 / 6)
    # ... but a goal colour outside COLOR_SET's words stays a tuple, while the chosen value is normalised:
    # chosen '2005grey' -> 'grey' vs "('color', '2005grey')": no match, even for the exact value
    goal = dict(GOAL, goal_options={"color": "2005grey"})
    assert webshop_reward(PRODUCT, goal, 25.0, {"color": "2005grey"}) == pytest.approx(3 / 5)


def test_type_factor_levels(nouns):
    other = dict(PRODUCT, query="pants", product_category="Garden › Tools")
    assert webshop.type_factor(PRODUCT, GOAL) == 1.0                 # query match
    assert webshop.type_factor(dict(PRODUCT, query="pants"), GOAL) == 1.0  # 2 category levels shared
    assert webshop.type_factor(other, GOAL) == 1.0                   # title score 0.5 > 0.2
    nouns["P"] = ["shirt"]                                           # 1/4 = 0.25
    assert webshop.type_factor(other, GOAL) == 1.0
    nouns["G"] = ["shirt", "a", "b", "c", "d"]                       # 1/5 = 0.2, not > 0.2, nothing else
    assert webshop.type_factor(other, GOAL) == 0.5
    nouns["G"] = ["shirt"] + list("abcdefghijk")                     # 1/12 < 0.1 overrides a query match
    assert webshop.type_factor(PRODUCT, GOAL) == 0.1
    nouns["P"] = ["pants"]                                           # title score 0 -> 0
    assert webshop.type_factor(PRODUCT, GOAL) == 0.0
    assert webshop_reward(PRODUCT, GOAL, 25.0, {"color": "blue", "size": "large"}) == 0.0
    nouns["G"] = []                                                  # no goal nouns: title score 0.2
    assert webshop.type_factor(PRODUCT, GOAL) == 1.0
    assert webshop.type_factor(other, GOAL) == 0.5


def test_reward_numbers_from_the_spec(shop):
    g3, g1 = shop.goals[3], shop.goals[1]
    p = shop.products["B00R249C5G"]                  # 0 attributes + 0 options + price -> 1/3, r_type 1
    assert webshop_reward(p, g3, shop.prices[p["asin"]], {}) == pytest.approx(1 / 3)
    nouns = webshop.title_nouns()[g1["asin"]]         # duplicate nouns: title score 15/17 = 0.882 yet r_type 1
    assert len(set(nouns)) / len(nouns) == pytest.approx(0.882, abs=1e-3)
    assert webshop_reward(shop.products[g1["asin"]], g1, shop.prices[g1["asin"]], g1["goal_options"]) == 1.0


def test_token_set_ratio_is_thefuzz():
    # thefuzz: strip U+0080-U+00FF, non-word -> space, lower; empty side scores 0; intersection rule
    assert webshop.token_set_ratio("blue", ("color", "navy blue")) == 100
    assert webshop.token_set_ratio("Navy-Blue", "navy blue") == 100
    assert webshop.token_set_ratio("é", "e") == 0
    assert webshop.token_set_ratio("black", "blue") == 44    # 2*2/(5+4): 'bl' matches
    assert webshop.normalize_color("navy blue") == "blue" and webshop.normalize_color(("color", "navy blue")) == \
        ("color", "navy blue") and webshop.normalize_color(("color", "black")) == "black"


# ------------------------------------------------------------------------------------------------- pages

def test_pages_match_the_spec_examples(shop):
    env = _env(3, shop)
    i3 = shop.goals[3]["instruction_text"]
    assert env.site.text() == _with_bound("WebShop [SEP] Instruction: [SEP] Find me dual band streaming media "
                                          "players with quad core, and price lower than 340.00 dollars [SEP] "
                                          "Search", shop.goals[3])
    env.step("search[streaming media players]")
    env.step("click[next >]")
    assert f"Instruction: [SEP] {i3} [SEP] Back to Search [SEP] Page 2 (Total results: 43) [SEP] < Prev [SEP] " \
           "Next > [SEP] B014C9KQLM [SEP] " in env.site.text()
    env.step("search[the]")
    assert env.site.text().endswith("[SEP] Page 1 (Total results: 0) [SEP] Next >")
    env.step("search[remote for rca wi-fi streaming media player dsb772e]")
    env.step("click[b00r249c5g]")
    env.step("click[description]")
    assert env.site.text().startswith(f"Instruction: [SEP] {i3} [SEP] Back to Search [SEP] < Prev [SEP] This remote "
                                      "is the one shown in image 2. Apparently there are 3 remotes")
    env.step("click[< prev]")
    env.step("click[reviews]")
    assert env.site.text() == f"Instruction: [SEP] {i3} [SEP] Back to Search [SEP] < Prev"
    env.step("click[< prev]")
    obs, r, done, info = env.step("click[buy now]")
    assert done and r == pytest.approx(1 / 3) and not info["success"]
    assert obs == ("Thank you for shopping with us! [SEP] Your code: [SEP] None [SEP] (Paste it in your MTurk "
                   "interface.) [SEP] Purchased [SEP] asin [SEP] B00R249C5G [SEP] options [SEP] {} [SEP] attrs [SEP] "
                   "None [SEP] category [SEP] None [SEP] query [SEP] None [SEP] product category [SEP] None [SEP] "
                   "Target [SEP] asin [SEP] options [SEP] attrs [SEP] price upper [SEP] instuction text [SEP] "
                   "category [SEP] product category [SEP] query [SEP] Goal [SEP] None [SEP] Reward [SEP] Your score "
                   "(min 0.0, max 1.0) [SEP] 0.3333333333333333 [SEP] Reward Details [SEP] None")
    assert env.actions == ()


def test_results_item_and_features_pages(shop):
    env = _env(1, shop)
    i1 = shop.goals[1]["instruction_text"]
    obs, *_ = env.step(f"search[{shop.products['B09QCP4579']['Title'].lower()}]")
    text = env.site.text()
    assert text.startswith(f"Instruction: [SEP] {i1} [SEP] Back to Search [SEP] Page 1 (Total results: 50) [SEP] "
                           "Next > [SEP] B09QCP4579 [SEP] LWLW High Waist Yoga Shorts for Women,Tummy Control Biker "
                           "Shorts Exercise Workout Butt Lifting Tights Women's Short Pants [SEP] $13.99 [SEP] "
                           "B09QCVCYVY [SEP] Burband Womens High Waist Bike Shorts")
    assert "[SEP] B09S632DT3 [SEP] Sleepwear Womens Chemise" in text and text.endswith("[SEP] $11.99 to $14.99")
    assert obs == text + "\nAvailable actions: click[back to search], click[next >], " + \
        ", ".join(f"click[{p['asin'].lower()}]" for p in env.site.shown())
    env.step("click[b09qcp4579]")
    item = (f"Instruction: [SEP] {i1} [SEP] Back to Search [SEP] < Prev [SEP] color [SEP] black [SEP] blue [SEP] "
            "gray [SEP] purple [SEP] wine [SEP] size [SEP] small [SEP] medium [SEP] large [SEP] x-large [SEP] "
            "xx-large [SEP] 3x-large [SEP] LWLW High Waist Yoga Shorts for Women,Tummy Control Biker Shorts "
            "Exercise Workout Butt Lifting Tights Women's Short Pants [SEP] Price: $13.99 [SEP] Rating: N.A. [SEP] "
            "Description [SEP] Features [SEP] Reviews [SEP] Buy Now")
    assert env.site.text() == item
    assert list(env.site.clickables()) == ["back to search", "< prev", "description", "features", "reviews",
                                           "buy now", "black", "blue", "gray", "purple", "wine", "small", "medium",
                                           "large", "x-large", "xx-large", "3x-large"]
    env.step("click[3x-large]")
    env.step("click[black]")
    assert env.site.text() == item                    # text mode does not show the selection
    env.step("click[features]")
    assert env.site.text().startswith(f"Instruction: [SEP] {i1} [SEP] Back to Search [SEP] < Prev [SEP] Made in "
                                      "USA or Imported [SEP] butt lifting leggings")
    assert "[SEP] 【Size Notice】- Please kindly refer" in env.site.text()
    env.step("click[< prev]")                         # back to the item page, options kept
    assert env.site.options == {"size": "3x-large", "color": "black"}
    obs, r, done, info = env.step("click[buy now]")
    assert r == 1.0 and info["success"] and done
    assert '[SEP] options [SEP] {"color": "black", "size": "3x-large"} [SEP]' in obs   # Flask's tojson sorts keys


def test_empty_bullet_point_is_an_empty_segment(shop):
    asin = "B074F9FBV3"
    assert shop.products[asin]["BulletPoints"] == [""]
    site = webshop.Site(shop, shop.goals[0], None)
    site.page, site.asin = "features", asin
    assert site.text().endswith("< Prev [SEP] ")
    assert webshop.visible(" ") == "" and webshop.visible("\n  ") is None and webshop.visible("") is None


def test_prev_from_item_returns_to_the_same_results_page(shop):
    env = _env(3, shop)
    env.step("search[streaming media players]")
    env.step("click[next >]")
    asin = env.site.shown()[0]["asin"].lower()
    env.step(f"click[{asin}]")
    env.step("click[< prev]")
    assert env.site.page == "results" and env.site.page_no == 2 and env.site.options == {}
    env.step("click[back to search]")
    assert env.site.page == "search" and env.site.keywords is None


# ------------------------------------------------------------------------------------------ actions, limit

def test_invalid_actions_change_nothing(shop):
    env = _env(3, shop)
    first = env.render()
    for reply in ("click[buy now]", "click[search]", "Search[shoes]", "search[]", "search shoes", "buy",
                  "search[a [b] c]", "search[<a> foo]", "search[<c>]"):
        obs, r, done, info = env.step(reply)
        assert info["invalid"] and obs == first and r == 0.0 and not done, reply
    obs, r, done, info = env.step("search[media players]")
    assert not info["invalid"] and done and info["steps"] == 10      # invalid replies use up actions too
    env = _env(3, shop)
    obs, r, done, info = env.step("search[media players] please")  # text after ']' is ignored
    assert not info["invalid"] and env.site.page == "results"
    obs, r, done, info = env.step("click[next >]")
    assert not info["invalid"] and env.site.page_no == 2
    obs, r, done, info = env.step("<answer>search[remote]</answer>")  # search works on any page
    assert not info["invalid"] and env.site.page_no == 1 and env.site.keywords == ["remote"]


def test_ten_action_limit(shop):
    env = envs.make("webshop", max_steps=30)
    assert env.max_steps == 10
    env.reset(0)
    for i in range(10):
        obs, r, done, info = env.step("click[next >]")
        assert done == (i == 9) and r == 0.0
    with pytest.raises(ValueError, match="reset"):
        env.step("search[x]")
    assert envs.make("webshop", max_steps=4).max_steps == 4


def test_debug_prefixes(shop):
    env = _env(3, shop)
    env.step("search[<c> beauty]")
    assert len(env.site.hits) == sum(p["category"] == "beauty" for p in webshop.catalogue())
    env.step("search[<q> streaming media players]")
    assert {p["query"] for p in env.site.hits} == {"streaming media players"}
    env.step("search[<r>]")
    assert len(env.site.hits) == 50


def test_tiny_actor_menu(shop):
    env = _env(1, shop)
    assert env.actions == (
        "search[find me butt lifting, light weight women's shorts with high waist, tummy control with color: black, "
        "and size: 3x-large]",
        "search[butt lifting, light weight women's shorts with high waist, tummy control]",
        "search[butt lifting, light weight women's shorts]")
    assert env.render().endswith("\nAvailable actions: search[<your query>]")
    obs, *_ = env.step(env.actions[0])
    assert env.actions[:2] == ("click[back to search]", "click[next >]") and "click[b09qcp4579]" in env.actions


def test_scripted_agent_buys_the_goal(shop):
    """Search the instruction (first menu query), page to the goal product, click its options, buy."""
    env, rewards = envs.make("webshop", split="test"), []
    for seed in range(500):
        env.reset(seed)
        goal = env.goal
        env.step(env.actions[0])
        link = f"click[{goal['asin'].lower()}]"
        while link not in env.actions and env.site.page_no < 5:
            env.step("click[next >]")
        env.step(link)
        for value in goal["goal_options"].values():
            env.step(f"click[{value}]")
        obs, r, done, info = env.step("click[buy now]")
        rewards.append(r if done else 0.0)
    success = sum(r == 1.0 for r in rewards) / len(rewards)
    assert success > 0.9 and sum(rewards) / len(rewards) > 0.95


def test_play_webshop_in_the_terminal(shop):
    import io
    out = io.StringIO()
    lines = "search[remote for rca wi-fi streaming media player dsb772e]\nclick[b00r249c5g]\nclick[buy now]\n"
    total = envs.play("webshop", 3, inp=io.StringIO(lines), out=out, split="test")
    assert total == pytest.approx(1 / 3)
    text = out.getvalue()
    assert "Available actions: search[<your query>]" in text and "Your score (min 0.0, max 1.0)" in text
    assert "episode over after 3 steps: success=False return=0.333333" in text
