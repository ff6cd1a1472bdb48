"""Complementary RL, the algorithm: an actor trained with multi-turn GRPO on split advantages, co-evolving with
an experience extractor trained with CISPO on the measured utility of the lessons it writes into the bank.

Read top to bottom, as the paper goes: the settings and the run state, the actor's prompts and `rollout`, the
actor's objective (split advantages, GRPO, `actor_update`), the extractor (distillation, credit, CISPO,
`extractor_update`, the merge), one iteration (`train_step`) and `evaluate`; metrics.py computes the metrics.
model.py supplies the decoder and the batched KV-cache generator, hf.py the tokenizers and the chat template,
envs.py the games and their pool, bank.py the shared experience bank (bank_merge.py the merge chain's lists),
update.py the policy update both objectives share (log-probs, loss, backward, step), parallel.py random streams,
collectives and mixed precision, small/ what only the small models need (constrained replies, the tiny model, the
presets); train.py builds a `Run` and calls `train_step` / `evaluate` in a loop.

The paper (Muhtar et al., arXiv 2603.17621), piece by piece; METHOD.md sets each point beside the authors'
release (github pUmpKin-Co/ComplementaryRL at ab2574f), which crl follows where the paper is silent:

    §Actor objective     G rollouts an instance, G/2 with experience        episode_specs
                         the lesson in the actor's prompt                   actor_system_prompt, actor_opening
                         the actor judges it: accept / refine / reject      judge_lessons [release]
                         multi-turn episodes, KV cache kept across turns    rollout, EpisodeBatch
                         A = R - mean(R) within each subgroup               split_advantages
                         PPO-clip on the actor's tokens, no KL              grpo_loss, actor_update
                         warm-up: no retrieval, no training                 train_step [release]
    §Extractor objective an episode credits what it used: its score,       record_outcomes, credit_generations,
                         shaped by the actor's verdict                      lesson_credit [release]
                         reward = mean credit, A = reward - batch mean      extractor_update
                         CISPO: clipped weight, every token's gradient      cispo_loss
    §Experience bank     retrieval by the first view, rank-scale re-rank    retrieval_query, retrieve, bank.py
                         ADD / UPDATE / NONE from a with-exp episode        distill, extractor_prompt, parse_operations
                         a rolling merge over the whole bank, each reply    merge_pass, MergeChain [release]
                         the new list for the lessons it was shown
                         the actor's tool                                   search_and_ask
    (evaluation)         held-out seeds, bank read-only                     evaluate

How it departs from the release, and why (one line each; METHOD.md has the whole comparison):
- evaluation is read-only and scores each seed with and without experience: the release's validation moves
  the re-rank's counts that training then reads, and scores only with memory;
- CISPO's old log-probs are the sampler's, so its clip acts on stale generations: the release recomputes them
  at training time, which makes the ratio 1 and the clip inert;
- only with-experience episodes may call search_and_ask: the release lets every rollout ask, which leaks the
  bank into the "without experience" half;
- the re-rank's recency window counts iterations, not 300 s of wall clock, so a run replays exactly; what an
  ask was shown is counted after the rollout, not at once: ranks ask at different turns, and their bank
  replicas must stay identical;
- a merge's reply lists its lessons as `UPDATE i,j: text` / `KEEP i` lines, not free items: each names the
  lessons it stands for, and is keyed by the mean of their entries' keys (query space: the first views that
  retrieve it; a kept lesson: its own key), not by its own text; it is credited to the chain call whose list
  held it last, not the chain's last successful call (they differ after a failed call); no merge is skipped
  after an extractor update (the release's skip is a side effect of its PR #3);
- retrieval serves equal cosines newest first (the release's top-k leaves ties unordered), and the re-rank reads
  one usage snapshot per 32 queries cut by order, not by a 5 ms arrival window: both reproducible; a CISPO
  batch orders the generations first credited in one iteration by id, the release by arrival, for the same reason;
- the lesson's framing (LESSONS_INTRO) paraphrases the release's; the extractor shares the actor's top-p (1.0, the
  release 0.99);
- the judge reads the task, the first view and the lesson, not the task's running score; an extractor reply's
  bad lines are skipped, not the whole reply; the bank's capacity is per task, not shared;
- the actor may be a tiny byte-level model, whose replies are constrained to the valid actions and whose
  extractor writes through constrained operation heads (small/grammar.py; a merge lists one lesson); on CPU
  distillation runs inline, and searches run on the caller's thread, not a pool of search workers.
The finished vault study (results/vault-first/, `--recipe vault-first`) adds a credit by lift, visiting instances,
a scripted oracle extractor and the extractor's head start: vault_study.py, called where marked `# vault study`.

Tags in comments: `PAPER §Section: term` names what the code implements; `[release]` marks a choice taken from the
authors' released code where the paper does not state it."""
import functools
import re
import time
from dataclasses import dataclass, field, replace

import numpy as np
import torch

import envs
import parallel
from bank import BankConfig, ExperienceManager, Operation
from bank_merge import MergeChain
from hf import encode_chat, next_turn_tokens
from model import Session, generate
from sampling import Sampling
from parallel import all_reduce_sum, cores_per_rank, gather_objects, rank, seeded_generator, world
from settings import batching, finished_study, per_task, setting, small_models
from small.grammar import Constraint, heads_for
from update import Update, policy_update
import vault_study
from metrics import (episode_metrics, paired_contrast, retrieval_metrics, same_instance, searches, success_metrics,
                     wrote_share)


MODES = ("crl", "grpo", "static", "exp-only")
EVAL_SEED0 = 1_000_000_000  # evaluation seeds start here; training seeds are drawn below it

# Random streams: every draw is seeded by (run seed, step, [rank,] stream), so a resumed run replays the same
# samples and each rank draws its own. (The numbers are those of earlier versions: old runs replay.)
INSTANCES = 1           # numpy: the task instances an iteration plays (the same on every rank)
ACTOR_SAMPLING = 1      # torch: the actor's sampling in training
EXTRACTOR_SAMPLING = 2  # torch: the extractor's sampling (distillation, answers, merges)
RERANK = 4              # numpy: the re-rank's top-1 dropout, in training (in evaluation: seeded at EVAL_STEP)
EVAL_SAMPLING = 3       # torch: the actor's sampling in evaluation...
EVAL_STEP = 7           # ...seeded as at this fixed step, so every evaluation of a run draws the same noise

# [release] values no result has changed, kept as constants (each was a flag until the vault study closed)
EXTRACTOR_TEMPERATURE = 1.0   # the extractor samples at 1, as the actor does by default
MAX_ASKS = 2                  # search_and_ask calls per free-text episode
MERGE_SIZE = 5                # entries of the bank each merge call adds to what the previous call wrote
MAX_GENERATIONS = 4096        # extractor generations kept; beyond it the oldest that can earn nothing are dropped

# ---------------------------------------------------------------------------------------------------------
# Settings and run state

@dataclass
class CRLConfig:
    """The algorithm's settings, one line each (train.py makes each a flag; its presets override some)."""
    # the paper's algorithm (§Actor objective, §Extractor objective, §Experience bank); [release]: the authors' code
    mode: str = setting("crl", "crl | grpo (no bank) | static (frozen extractor) | exp-only (frozen actor)",
                        choices=MODES)
    groups: int = setting(16, "task instances per iteration, over all ranks", min=1)
    group_size: int = setting(8, "G rollouts per instance, G/2 without and G/2 with experience (even)", min=2)
    lr: float = setting(1e-6, "actor learning rate (AdamW)", min=0)
    extractor_lr: float = setting(1e-6, "extractor learning rate (AdamW)", min=0)
    temperature: float = setting(1.0, "actor sampling temperature in training (0: greedy)", min=0)
    top_p: float = setting(1.0, "nucleus sampling mass, actor and extractor", above=0, max=1)
    top_k: int = setting(0, "sample from the k likeliest tokens only (0: all)", min=0)
    clip: float = setting(0.2, "PPO clip epsilon of the actor's GRPO loss [release]", min=0)
    cispo_eps_low: float = setting(0.1, "CISPO importance-weight clip below 1 [release]", min=0)
    cispo_eps_high: float = setting(0.1, "CISPO importance-weight clip above 1 [release]", min=0)
    split: bool = setting(True, "advantages within the with/without-experience halves of a group (PAPER §Actor "
                                "objective: split advantage); --no-split: one group of all G, the ablation")
    grad_clip: float = setting(1.0, "gradient-norm clip", above=0)
    warmup: int = setting(5, "iterations in which nothing retrieves (all G play without experience) and neither model "
                             "trains, while the bank fills [release]", min=0)
    minibatches: int = setting(1, "optimizer steps per iteration, one epoch over the batch [release: 1]", min=1)
    retrieve_k: int = setting(1, "lessons injected into a with-experience prompt [release: top 1]", min=1)
    free_text: bool = setting(True, "actor replies free text with <answer>ACTION</answer>; else constrained "
                                    "to the valid actions")
    history: str | None = setting(None, "turns kept in the actor's context: none (the whole episode, KV cache kept "
                                        "across turns), N for every task, or TASK=N,... (a task not named keeps the "
                                        "whole episode)", per_task=0)
    max_steps: str | None = setting(None, "actions per episode: none (each task's own [release]: 30, WebShop 10), N "
                                          "for every task, or TASK=N,... (a task not named: its own)", per_task=1)
    max_reply_tokens: int = setting(512, "tokens per actor reply (a constrained reply gets at least its longest "
                                         "valid action)", min=1)
    max_context: int = setting(16384, "actor context; an episode that outgrows it ends as a failure", min=2)
    extractor_free_text: bool = setting(True, "extractor writes free text; else its operation heads are "
                                              "constrained and the lessons free")
    extractor_reply_tokens: int = setting(8192, "tokens per extractor reply, room for a thinking model's reasoning "
                                                "[release] (a --lesson-moves reply gets at least its longest plan)",
                                          min=1)
    episode_chars: int = setting(0, "characters of a finished episode shown to the extractor, its beginning and "
                                    "end (0: the whole episode [release])", min=0)
    distill_per_group: int = setting(0, "of those, episodes per group sent to the extractor (0: all)", min=0)
    max_operations: int = setting(3, "bank operations kept from one distilling reply (a merge's list is bounded "
                                     "by the lessons it was shown)", min=1)
    extractor_batch: int = setting(64, "CISPO batch: a step waits for this many generations with credits (over "
                                       "all ranks) and trains those first credited latest; the older ones' "
                                       "credits are dropped [release: a 64-slot buffer]", min=1)
    judge: str = setting("accept-refine-reject", "the actor's judgement of a retrieved lesson before it acts: "
                                                 "accept-refine-reject [release], accept-reject (two constrained "
                                                 "words, for small models), or none (the paper's text)",
                         choices=("accept-refine-reject", "accept-reject", "none"))
    credit: str = setting("outcome", "what an episode credits the generations behind the lessons it used: outcome "
                                     "(its score, 0 -> -1: +1/-1 on success/failure, WebShop's fraction as it is) "
                                     "[release and paper]; lift (its reward minus its group's mean without "
                                     "experience) or first-lift (the lift of a first-action win only): the vault "
                                     "study's (vault_study.episode_lift)", choices=("outcome", "lift", "first-lift"))
    merge_every: int = setting(5, "iterations between merge passes (0: never) [release]", min=0)
    bank: BankConfig = setting(BankConfig(), "the experience bank")
    micro_batch: int = batching(4, "sequences per forward/backward", min=1)
    micro_tokens: int | None = batching(None, "padded tokens per forward/backward, at most (default none: only "
                                              "--micro-batch bounds it): long episodes then go fewer at a time", min=1)
    env_workers: int | None = batching(None, "processes per rank that play the games side by side; the same seeds "
                                             "give the same episodes for any number (default: one per core for "
                                             "alfworld, whose resets take seconds; else 0, in the trainer's process)",
                                       min=0)
    eval_batch: int = batching(256, "evaluation episodes played at once: their KV caches share memory (another "
                                    "number gives each episode other noise, from the same distribution)", min=1)
    instructions: bool = small_models(True, "task text and reply format in the actor's prompt")
    show_map: bool = small_models(True, "MiniHack's character map in observations (else positions in words and the "
                                        "message line)", flag="map")
    list_actions: bool = small_models(True, "ALFWorld's and WebShop's observations list the valid actions (else the "
                                            "page or game text only: ALFWorld 350 tokens a turn fewer; constrained "
                                            "replies are masked to them anyway)")
    lesson_turn: bool = small_models(False, "retrieved lessons open the first user turn as a tip instead of closing "
                                            "the system prompt (where a small instruct model reads them: "
                                            "probes/lesson_follow.py)")
    lesson_moves: int = small_models(0, "constrained extractor: a lesson is a plan of 1..N of the task's action words "
                                        "(e.g. `ADD: southeast east`) instead of free text (0: free text)", min=0)
    extractor_none: str = small_models("always", "when a constrained extractor may answer NONE as it distils an "
                                                 "episode: always, never (it must add or update: a NONE is never "
                                                 "credited, so CISPO never pushes it down and an extractor whose "
                                                 "lessons mostly fail drifts into it), or failure (only after a failed "
                                                 "episode: a won one must yield a lesson, a lost one may yield "
                                                 "none; it can drift out of NONE too: on results/vault-clean's crl "
                                                 "seeds 1-3 it wrote a lesson after every episode from iteration 50)",
                                       choices=("always", "never", "failure"))
    instance_visits: int = finished_study(0, "fresh task instances, each played by its group in N consecutive "
                                             "iterations and then retired, the groups staggered: an instance recurs "
                                             "(its lessons can be read back) but is never learned into the weights "
                                             "(0: off; vault_study.visiting_instance)", min=0)
    head_start: int = finished_study(0, "crl mode: the actor frozen for the first N iterations, so the extractor "
                                        "learns to write before the actor's habit makes a lesson worthless (0: off)",
                                     min=0)

    def __post_init__(self):
        if isinstance(self.extractor_none, bool):   # runs written before it took a third value
            self.extractor_none = "always" if self.extractor_none else "never"
        if self.extractor_none not in ("always", "never", "failure"):
            raise ValueError(f"extractor_none must be always, never or failure, got {self.extractor_none!r}")
        self.max_steps, self.history = (None if v is None else str(v) for v in (self.max_steps, self.history))
        # parsed once (a bad value fails here, not mid-run); window() is read every turn of every episode
        self._steps, self._windows = per_task(self.max_steps, 1), per_task(self.history, 0)

    def steps(self, task: str) -> int:
        """Actions per episode of `task`."""
        return self._steps.get(task, self._steps.get(None, envs.task_steps(task)))

    def window(self, task: str) -> int | None:
        """Turns of `task` kept in the actor's context (None: the whole episode)."""
        return self._windows.get(task, self._windows.get(None))

    def sampling(self, temperature: float) -> Sampling:
        """A sampler at `temperature` (the actor's or the extractor's) with the shared top-k and top-p."""
        return Sampling(temperature, self.top_k, self.top_p)

    @property
    def update_settings(self) -> dict:
        """What the policy update reads of the batching settings (update.Update's fields)."""
        return dict(micro_batch=self.micro_batch, micro_tokens=self.micro_tokens, grad_clip=self.grad_clip)

    @property
    def uses_bank(self):
        return self.mode != "grpo"

    @property
    def trains_actor(self):
        return self.mode != "exp-only"

    @property
    def trains_extractor(self):
        return self.mode in ("crl", "exp-only")


@dataclass
class Run:
    """Everything a run holds: its settings, both models with their tokenizers and optimizers, the bank's
    manager, the environment pool, the extractor's generations, and counters. Built by train.py."""
    cfg: CRLConfig
    tasks: list
    seed: int
    actor: torch.nn.Module
    actor_tok: object
    actor_opt: torch.optim.Optimizer | None
    extractor: torch.nn.Module | None
    extractor_tok: object
    extractor_opt: torch.optim.Optimizer | None
    manager: object | None
    pool: "envs.EnvPool | None" = None
    generations: dict = field(default_factory=dict)   # generation id -> Generation, awaiting credit or its update
    generations_made: int = 0                         # on this rank: the next generation id's counter
    step: int = 0                                     # the iteration under way (the re-rank's recency clock)
    counters: dict = field(default_factory=dict)
    timer: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.pool is None:
            workers = self.cfg.env_workers
            if workers is None:   # bench.py env: 64 ALFWorld resets and 10 steps: 138 s serial, 75 s in 2 workers
                workers = cores_per_rank() if "alfworld" in self.tasks else 0
            self.pool = envs.EnvPool(self.cfg.show_map, self.cfg.steps, workers, self.cfg.list_actions)

# ---------------------------------------------------------------------------------------------------------
# The actor's prompts (PAPER §Experience bank: the lesson is read in the prompt): the system prompt holds
# the task, the actions and the reply format; each observation is a user turn, each reply an assistant turn

# [release] the lessons are framed as guidance that may not fit this episode, not as rules
LESSONS_INTRO = ("Lessons distilled from earlier episodes follow. Let them guide your actions, but check them "
                 "against what you see: some hold only for the episode they were drawn from.")


def actor_system_prompt(env, experience: list[str], free_text: bool, can_ask: bool, instructions: bool = True,
                        max_asks: int = 2) -> str:
    """The env's instruction names the goal and the actions (ALFWorld lists its admissible commands in each
    observation); we add the reply format and, for a with-experience episode, the retrieved lessons. Without
    `instructions` (a model trained from scratch, whose reply is constrained to the actions anyway) only the
    numbered lessons remain, possibly nothing: every constant token dilutes what a tiny model attends to."""
    lines = [env.instruction] if instructions else []
    if instructions and free_text:
        lines.append("Think briefly if it helps, then give exactly one action as <answer>ACTION</answer>.")
        if can_ask and max_asks:
            lines.append("Instead of acting you may consult the experience bank with <ask>QUESTION</ask> "
                         f"(at most {max_asks} times per episode).")
    elif instructions:
        lines.append("Reply with one action.")
    if experience:
        lines += [LESSONS_INTRO] if instructions else []
        lines += [f"{i + 1}. {text}" for i, text in enumerate(experience)]
    return "\n".join(lines)


def actor_opening(cfg, env, experience: list[str], obs: str, can_ask: bool) -> tuple[str, str]:
    """An episode's system prompt and first user turn: the lessons close the system prompt, or with
    cfg.lesson_turn open the first observation as a tip."""
    system = actor_system_prompt(env, [] if cfg.lesson_turn else experience, cfg.free_text, can_ask,
                                 cfg.instructions, MAX_ASKS)
    if cfg.lesson_turn and experience:
        obs = "\n".join(["Tip from earlier episodes:", *experience, "", obs])
    return system, obs


def retrieval_query(env, first_obs: str) -> str:
    """The key of an episode: the task goal and the initial view (PAPER §Experience bank: retrieval)."""
    return f"{env.instruction}\n{first_obs}"


def window_messages(system: str, history: list, obs: str, h: int) -> list[dict]:
    """System prompt (if any), the last h (observation, reply) turns, and the new observation."""
    msgs = [{"role": "system", "content": system}] if system else []
    for o, r in (history[-h:] if h else []):
        msgs += [{"role": "user", "content": o}, {"role": "assistant", "content": r}]
    return msgs + [{"role": "user", "content": obs}]

# ---------------------------------------------------------------------------------------------------------
# Rollout: every episode of an iteration plays in lockstep, one batched generate call a turn

@dataclass
class Segment:
    """One trained sequence: prompt/observation tokens (mask False) and actor tokens (mask True)."""
    tokens: list[int] = field(default_factory=list)
    mask: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    allowed: dict = field(default_factory=dict)  # position -> allowed ids, where a constraint masked it
    share: float = 1.0              # this segment's share of its episode (1/number of windows)
    episode_tokens: int = 0         # actor tokens in the whole episode (0: this segment's own)

    def extend(self, tokens, mask=False, logprobs=None, allowed=None):
        start = len(self.tokens)
        self.tokens += tokens
        self.mask += [mask] * len(tokens)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(tokens)
        for i, a in enumerate(allowed or []):
            if a is not None:
                self.allowed[start + i] = a


@dataclass
class Episode:
    task: str
    seed: int
    group: int                                       # the task instance (GRPO group) it belongs to
    with_exp: bool
    query: str = ""
    instruction: str = ""
    lessons: list = field(default_factory=list)      # the retrieved lessons' texts, as the bank holds them
    retrieved: list = field(default_factory=list)    # their entry ids
    origins: list = field(default_factory=list)      # the instance seeds they were distilled from (-1: unknown)
    written: list = field(default_factory=list)      # the iterations they were written at
    experience: list = field(default_factory=list)   # what the prompt holds: the lessons kept, as the actor kept them
    sources: list = field(default_factory=list)      # the extractor generations credited by this episode
    asked: list = field(default_factory=list)        # the entry ids its asks were shown (counted after the rollout)
    verdicts: dict = field(default_factory=dict)     # generation -> the actor's judgement of its lesson
    segments: list = field(default_factory=list)
    transcript: list = field(default_factory=list)   # (who, text) lines for the extractor
    reward: float = 0.0
    success: bool = False
    turns: int = 0
    invalid: int = 0
    asks: int = 0
    truncated: bool = False


ASK_RE = re.compile(r"<ask>(.*?)</ask>", re.S)


def rollout(run, specs: list[tuple], rng: torch.Generator, temperature: float, train: bool = True
            ) -> list[Episode]:
    """Play every episode in `specs` ((task, seed, group, with_exp) tuples) to the end. All playing episodes
    advance together: one generate() call per turn over one KV-cache session, so a turn prefills only its
    new observation tokens (with a window of turns for its task, cfg.history, a turn starts a fresh, shorter
    context)."""
    batch = EpisodeBatch(run, specs, train, rng, temperature)
    while batch.playing:
        samples = batch.generate(rng, temperature)   # 1. one batched generate call
        questions = batch.act(samples)                # 2. each reply steps its game, or asks the bank
        batch.answer(questions, rng)                  # 3. the extractor answers the questions
        batch.queue_next_turns()                      # 4. the next user turn of each playing episode
    return batch.finish()


class EpisodeBatch:
    """The episodes of one rollout call, played in lockstep. Row i is episode i: its game, its last
    observation, its (observation, reply) history, and `feed[i]`, the tokens the actor reads next."""

    def __init__(self, run, specs: list[tuple], train: bool, rng, temperature: float):
        self.run, self.cfg, self.tok, self.train = run, run.cfg, run.actor_tok, train
        self.eps = [Episode(task, seed, group, with_exp) for task, seed, group, with_exp in specs]
        self.games = [run.pool.take(e.task, train) for e in self.eps]
        t0 = time.perf_counter()
        self.obs = run.pool.reset_all(self.games, [e.seed for e in self.eps])
        run.timer["env"] += time.perf_counter() - t0
        for e, env, o in zip(self.eps, self.games, self.obs):
            e.instruction, e.query = env.instruction, retrieval_query(env, o)
            e.transcript.append(("environment", o))
        # [release] nothing retrieves in the warm-up; the actor judges what it retrieved before it acts
        self.retrieving = self.cfg.uses_bank and (not train or run.step >= self.cfg.warmup)
        self.ask_clock = rerank_clock(run, train, rank())   # this rank's asks: dropout draws of its own
        if self.retrieving:
            retrieve(run, [e for e in self.eps if e.with_exp], train=train)
            judge_lessons(run, [(e, o) for e, o in zip(self.eps, self.obs) if e.retrieved], rng, temperature, train)
        openings = [actor_opening(self.cfg, env, e.experience, o, e.with_exp and self.retrieving)
                    for env, e, o in zip(self.games, self.eps, self.obs)]
        self.systems, self.obs = [s for s, _ in openings], [o for _, o in openings]
        self.feed = [encode_chat(self.tok, window_messages(s, [], o, 0)) for s, o in zip(self.systems, self.obs)]
        self.history = [[] for _ in self.eps]
        for e, f in zip(self.eps, self.feed):
            e.segments.append(Segment())
            e.segments[-1].extend(f)
        self.done = [False] * len(self.eps)
        self.constraint_of = {}                            # valid actions -> their Constraint
        self.session = Session(run.actor, max_batch=len(self.eps), max_len=self.cfg.max_context)
        self.playing = [i for i in range(len(self.eps)) if self.keep_if_room(i)]

    def keep_if_room(self, i) -> bool:
        """Whether row i's feed and a full reply still fit the context; if not, the episode ends as a
        failure (truncated)."""
        cfg = self.cfg
        if self.session.length(i) + len(self.feed[i]) + self.reply_budget(self.constraints([i])) <= cfg.max_context:
            return True
        e = self.eps[i]
        e.truncated, e.success = True, False
        e.reward = getattr(self.games[i], "failure_reward", 0.0)
        self.session.release([i])
        return False

    def constraints(self, rows) -> list | None:
        """Each row's reply constrained to its game's valid actions (None: free text). One Constraint per
        distinct action list, so a turn tokenizes each action once."""
        if self.cfg.free_text:
            return None
        return [self._constraint(tuple(self.games[i].actions)) for i in rows]

    def _constraint(self, actions: tuple) -> Constraint:
        if actions not in self.constraint_of:
            self.constraint_of[actions] = Constraint.from_strings(self.tok, actions)
        return self.constraint_of[actions]

    def reply_budget(self, cons: list | None) -> int:
        """max_reply_tokens, and for a constrained reply at least its longest valid action with its end token
        (WebShop's `click[b09qcp4579]` is 17 bytes)."""
        return Constraint.budget(self.cfg.max_reply_tokens, cons)

    def generate(self, rng, temperature):
        cfg, tok, rows = self.cfg, self.tok, self.playing
        cons = self.constraints(rows)
        t0 = time.perf_counter()
        samples = generate(self.run.actor, [self.feed[i] for i in rows], self.reply_budget(cons),
                           cfg.sampling(temperature), stop=[tok.eos_token_id], tokenizer=tok, generator=rng,
                           constraint=cons, session=self.session, rows=rows)
        self.run.timer["generate"] += time.perf_counter() - t0
        return samples

    def act(self, samples) -> list[tuple[int, str]]:
        """Record each reply; a question (<ask>, free text with experience, within MAX_ASKS) is returned
        for search_and_ask, any other reply steps the game."""
        cfg, tok = self.cfg, self.tok
        t0 = time.perf_counter()
        questions, moves = [], []
        for i, s in zip(self.playing, samples):
            e = self.eps[i]
            e.segments[-1].extend(s.tokens, True, s.logprobs, s.allowed)
            ended = bool(s.tokens) and s.tokens[-1] == tok.eos_token_id
            reply = tok.decode(s.tokens[:-1] if ended else s.tokens)
            e.transcript.append(("agent", reply))
            self.history[i].append((self.obs[i], reply))
            self.feed[i] = [] if ended else [tok.eos_token_id]   # close a reply cut by the length limit
            ask = ASK_RE.search(reply) if cfg.free_text and e.with_exp and self.retrieving else None
            if ask and "<answer>" not in reply and e.asks < MAX_ASKS:
                e.asks += 1
                questions.append((i, ask.group(1).strip()))
            else:
                moves.append((i, reply))
        self.step_games(moves)
        self.run.timer["env"] += time.perf_counter() - t0
        return questions

    def step_games(self, moves: list[tuple[int, str]]):
        """Each (row, reply) steps its game; all games step at once (side by side with cfg.env_workers)."""
        results = self.run.pool.step_all([self.games[i] for i, _ in moves], [reply for _, reply in moves])
        for (i, reply), result in zip(moves, results):
            self.record_step(i, reply, *result)

    def record_step(self, i, reply: str, obs: str, reward: float, done: bool, info: dict):
        e = self.eps[i]
        self.obs[i], self.done[i] = obs, done
        e.turns += 1
        e.invalid += int(bool(info.get("invalid", False)))
        e.transcript.append(("environment", self.obs[i]))
        if self.done[i]:
            e.reward, e.success = float(reward), bool(info.get("success", False))

    def answer(self, questions: list[tuple[int, str]], rng):
        """search_and_ask: the extractor answers all of this turn's questions in one call; the answer is
        the asker's next observation."""
        if not questions:
            return
        answers = search_and_ask(self.run, [(self.eps[i], q) for i, q in questions], rng, self.train, self.ask_clock)
        for (i, _), answer in zip(questions, answers):
            self.obs[i] = "Experience bank answer: " + answer
            self.eps[i].transcript.append(("experience bank", answer))

    def queue_next_turns(self):
        """Each unfinished episode's next observation joins its feed (the whole conversation so far stays
        in the KV cache), or, with a window for its task (cfg.history), the last turns replace the context."""
        cfg, still = self.cfg, []
        for i in self.playing:
            e = self.eps[i]
            if self.done[i]:
                self.session.release([i])
                continue
            window = cfg.window(e.task)
            if window is None:
                self.feed[i] += next_turn_tokens(self.tok, self.obs[i])
            else:
                self.session.release([i])
                self.feed[i] = encode_chat(self.tok, window_messages(self.systems[i], self.history[i], self.obs[i],
                                                                     window))
            if not self.keep_if_room(i):
                continue
            if window is not None:
                e.segments.append(Segment())   # only now: a truncated episode leaves no empty segment
            e.segments[-1].extend(self.feed[i])
            still.append(i)
        self.playing = still

    def finish(self) -> list[Episode]:
        for e, env in zip(self.eps, self.games):
            self.run.pool.give(e.task, self.train, env)
            n = sum(sum(s.mask) for s in e.segments)
            for s in e.segments:    # a windowed episode still counts as one sequence in the loss (no length bias)
                s.share, s.episode_tokens = 1.0 / len(e.segments), n
        return self.eps


def retrieve(run, eps: list[Episode], train: bool = True):
    """Top-k experience for each with-experience episode, searched by its query and re-ranked for diversity
    (bank.ExperienceBank.search). Under DDP every rank runs the same searches (all ranks' queries, in rank
    order, the same dropout draws), so the replicas' usage counts stay identical; each rank keeps its own
    results. Evaluation reads the counts as the next iteration would and changes nothing."""
    mine = [(e.task, e.query) for e in eps]
    everyone = gather_objects(mine) if train else [mine]
    me = rank() if train else 0
    now, rng = rerank_clock(run, train)
    for r, queries in enumerate(everyone):
        for task in sorted({t for t, _ in queries}):
            idx = [j for j, (t, _) in enumerate(queries) if t == task]
            results = run.manager.search(task, [queries[j][1] for j in idx], run.cfg.retrieve_k, update=train,
                                         now=now, rng=rng)
            if r != me:
                continue
            for j, hits in zip(idx, results):
                eps[j].lessons = eps[j].experience = [entry.text for entry, _ in hits]
                eps[j].retrieved = [entry.id for entry, _ in hits]
                eps[j].sources = [entry.source for entry, _ in hits]
                eps[j].origins = [entry.origin for entry, _ in hits]
                eps[j].written = [entry.created for entry, _ in hits]


def rerank_clock(run, train: bool, *rank) -> tuple[int, np.random.Generator]:
    """The re-rank's `now` and dropout draws: in training the iteration under way, seeded by it; in evaluation
    the counts as the next iteration would read them, seeded at EVAL_STEP. `rank`: a stream of the rank's own."""
    if train:
        return run.step, np.random.default_rng([run.seed, run.step, *rank, RERANK])
    return run.step + 1, np.random.default_rng([run.seed, EVAL_STEP, *rank, RERANK])


JUDGE_SYSTEM = (
    "Before you play a text game, decide whether a piece of knowledge from earlier episodes will help you in "
    "this episode. Answer accept to use it as it is, reject to play without it, or refine: followed by a better "
    "version of it.")


def judge_lessons(run, items: list[tuple[Episode, str]], rng, temperature: float, train: bool = True):
    """[release] Before acting, the actor (its own weights; these tokens are not in its loss) judges each
    retrieved lesson from the task and its first view: accept keeps it, refine replaces it in the prompt by
    the actor's rewrite, reject or an unparseable answer drops it. The verdict shapes its generation's credit
    (lesson_credit); the episode stays in the with-experience half whatever it is."""
    if run.cfg.judge == "none" or not items:
        return
    pairs = [(e, j) for e, _ in items for j in range(len(e.lessons))]
    first = {id(e): obs for e, obs in items}
    prompts = [judge_prompt(run.actor_tok, e.instruction, first[id(e)], e.lessons[j]) for e, j in pairs]
    cons = judge_constraint(run) if not run.cfg.free_text else None
    t0 = time.perf_counter()
    samples = generate(run.actor, prompts, Constraint.budget(run.cfg.max_reply_tokens, cons and [cons]),
                       run.cfg.sampling(temperature), stop=[run.actor_tok.eos_token_id], tokenizer=run.actor_tok,
                       generator=rng, constraint=cons and [cons] * len(pairs))
    run.timer["generate"] += time.perf_counter() - t0
    kept = {id(e): [] for e, _ in items}
    for (e, j), s in zip(pairs, samples):
        verdict, text = parse_verdict(run.actor_tok.decode(s.tokens, skip_special_tokens=True),
                                      run.cfg.judge == "accept-refine-reject")
        e.verdicts[e.sources[j]] = verdict
        if train:
            run.counters[f"judge_{verdict}"] = run.counters.get(f"judge_{verdict}", 0) + 1
        if verdict in ("accept", "refine"):
            kept[id(e)].append(e.lessons[j] if verdict == "accept" else text)
    for e, _ in items:
        e.experience = kept[id(e)]


def judge_prompt(tok, instruction: str, first_obs: str, lesson: str) -> list[int]:
    return encode_chat(tok, [{"role": "system", "content": JUDGE_SYSTEM},
                             {"role": "user", "content": f"Task: {instruction}\nWhat you see first:\n{first_obs}\n"
                                                         f"Knowledge: {lesson}"}])


VERDICT_RE = re.compile(r"^\s*(accept|reject|refine)\b\s*:?\s*(.*)$", re.S | re.I)


def parse_verdict(reply: str, refine: bool) -> tuple[str, str]:
    """A judgement -> (accept | refine | reject | unparsed, the refined text). The answer is the reply's last
    <answer>...</answer> when it has one; a refine needs its text."""
    m = VERDICT_RE.match(envs.answer_text(reply.split("</think>")[-1]))
    if not m:
        return "unparsed", ""
    verdict, text = m.group(1).lower(), m.group(2).strip()
    if verdict == "refine" and not (refine and text):
        return "unparsed", ""
    return verdict, text if verdict == "refine" else ""


def judge_constraint(run) -> Constraint:
    """A constrained actor's judgement: `accept` or `reject`, or `refine: ` and its rewrite in free text."""
    tok = run.actor_tok
    if run.cfg.judge == "accept-reject":
        return Constraint.from_strings(tok, ["accept", "reject"])
    ends = [tok.encode(w, add_special_tokens=False) + [tok.eos_token_id] for w in ("accept", "reject")]
    return Constraint(ends + [tok.encode("refine: ", add_special_tokens=False)], free_after=True)


def lesson_credit(score: float, verdict: str | None, zero_is_failure: bool = True) -> float:
    """[release] What a lesson's generation earns from one episode of this score: reject -1, refine +0.5,
    accept the score + 1; unjudged (an ask's answer) or unparsed, the score itself. Then a 0 counts as a
    failure, -1: so +2 / +1 for an accepted lesson on a success / failure (never negative), +1 / -1 unjudged,
    and WebShop's 0.6 stays 0.6. (Not for the lift credit, whose 0 means no effect.)"""
    value = {"reject": -1.0, "refine": 0.5, "accept": score + 1.0}.get(verdict, score)
    return -1.0 if zero_is_failure and value == 0 else value

# ---------------------------------------------------------------------------------------------------------
# The actor's objective (PAPER §Actor objective): GRPO on split advantages

def split_advantages(rewards: torch.Tensor, group: torch.Tensor, with_exp: torch.Tensor) -> torch.Tensor:
    """A_i = R_i - mean(R) within each (group, with/without experience) subgroup (PAPER §Actor objective: split
    advantage; [release] no division by the std). Keeps a learning signal for experience-free play."""
    rewards = rewards.double()
    adv = torch.zeros_like(rewards)
    sub = group.long() * 2 + with_exp.long()
    for key in sub.unique():
        idx = sub == key
        adv[idx] = rewards[idx] - rewards[idx].mean()
    return adv.float()


def grpo_loss(logp, old_logp, adv, mask, clip: float = 0.2, **denoms):
    """-min(r A, clip(r, 1-eps, 1+eps) A) per token, r = pi/pi_old: PPO-clip with no KL and no entropy
    (PAPER §Actor objective [release]). logp/old_logp/mask [B,T], adv [B]. A clipped token has no gradient."""
    r = torch.exp(logp - old_logp)
    a = adv[:, None]
    per_token = -torch.minimum(r * a, r.clamp(1 - clip, 1 + clip) * a)
    return aggregate(per_token, mask, **denoms)


def actor_update(run, eps: list[Episode]) -> dict:
    """The actor's GRPO step on split advantages; a windowed episode's segments share its advantage."""
    cfg = run.cfg
    adv = split_advantages(torch.tensor([e.reward for e in eps]), torch.tensor([e.group for e in eps]),
                           torch.tensor([e.with_exp and cfg.split for e in eps]))
    segments = [s for e in eps for s in e.segments]
    seg_adv = [float(a) for e, a in zip(eps, adv) for _ in e.segments]
    t0 = time.perf_counter()
    update = Update(run.actor, run.actor_opt, functools.partial(grpo_loss, clip=cfg.clip),
                    (1 - cfg.clip, 1 + cfg.clip), cfg.sampling(cfg.temperature), cfg.minibatches, **cfg.update_settings)
    stats = policy_update(update, segments, seg_adv)
    run.timer["update"] = time.perf_counter() - t0
    return {f"actor/{k}": v for k, v in stats.items()}


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, num_seqs: float | None = None,
              seq_tokens: torch.Tensor | None = None) -> torch.Tensor:
    """seq-mean-token-mean [release]: the mean over each sequence's tokens, then over sequences. The number of
    sequences may be given (a global count), so micro-batches and DDP ranks sum exactly; a row may be one
    piece of a longer sequence (an episode split into windows), divided by that sequence's token count
    `seq_tokens` and counted as its share in `num_seqs`."""
    mask = mask.to(per_token.dtype)
    denom = seq_tokens if seq_tokens is not None else mask.sum(-1).clamp(min=1)
    per_seq = (per_token * mask).sum(-1) / denom
    return per_seq.sum() / (num_seqs if num_seqs is not None else max(per_token.shape[0], 1))

# ---------------------------------------------------------------------------------------------------------
# The experience extractor (PAPER §Experience bank, §Extractor objective): it distils finished episodes
# into bank operations; its reward is the outcome of the episodes that later use what it wrote

EXTRACTOR_SYSTEM = (
    "You keep a bank of short lessons for an agent that plays a text game. Read a finished episode and the "
    "lessons the agent was shown, then write at most {max_operations} operations, one per line:\n"
    "ADD: <a new lesson: in which situation, what to do, and why>\n"
    "UPDATE <numbers of shown lessons, comma-separated>: <one lesson that replaces them>\n"
    "NONE\n"
    "Keep only what will help future episodes of this task.")


EXTRACTOR_FORMAT = "Reason if it helps, then put the operations inside <answer></answer>."


MERGE_SYSTEM = (
    "You keep a bank of short lessons for an agent that plays a text game. Rewrite the numbered lessons below "
    "as a shorter list of stronger ones: merge lessons that say the same thing, rewrite an unclear one, leave "
    "out one that is wrong or useless. Your reply is the new list, one line for each lesson in it:\n"
    "UPDATE <numbers, comma-separated>: <one lesson that replaces them>\n"
    "KEEP <numbers, comma-separated>   (those lessons stay as they are)\n"
    "A lesson that no line names is deleted. Reply NONE to leave all of them as they are.")


ASK_SYSTEM = ("You advise an agent that plays a text game. Answer its question in at most three sentences, "
              "using the lessons from earlier episodes where they apply.")
NO_LESSONS = "(no lessons)"   # the answer to an ask where the task's bank is empty


@dataclass
class Generation:
    """One extractor output: what to train on, and the outcomes credited to it (PAPER §Extractor objective: reward)."""
    id: int
    task: str
    prompt: list
    tokens: list
    logprobs: list
    allowed: list
    credits: list = field(default_factory=list)
    queued: int = -1   # the iteration of its first credit since it last left the batch: its place in the queue


def render_episode(e: Episode, limit: int) -> str:
    """Alternating environment/agent lines; with a limit (not 0), a long episode keeps its beginning and end."""
    text = "\n".join(f"{who}: {line}" for who, line in e.transcript)
    if limit and len(text) > limit:
        half = limit // 2
        text = text[:half] + "\n...\n" + text[-half:]
    return text


def shown_lessons(texts: list[str]) -> str:
    return "\n".join(f"[{i + 1}] {t}" for i, t in enumerate(texts)) or "(none)"


def extractor_view(e: Episode) -> list[tuple[int, str]]:
    """The retrieved lessons the extractor is shown and may update, (entry id, text): all but those whose
    judgement did not parse [release: the actor's prompt and the episode's record both lose such a lesson]."""
    return [(i, text) for i, text, src in zip(e.retrieved, e.lessons, e.sources) if e.verdicts.get(src) != "unparsed"]


def extractor_prompt(run, e: Episode) -> list[int]:
    """[release] The outcome is SUCCESS for any score above 0: a WebShop purchase that matches in part too."""
    cfg = run.cfg
    system = (EXTRACTOR_SYSTEM.format(max_operations=cfg.max_operations)
              + ("\n" + EXTRACTOR_FORMAT if cfg.extractor_free_text else ""))
    user = (f"Task: {e.instruction}\nOutcome: {'SUCCESS' if e.reward > 0 else 'FAILURE'}\n"
            f"Lessons retrieved for the agent:\n{shown_lessons([t for _, t in extractor_view(e)])}\n"
            f"Episode:\n{render_episode(e, cfg.episode_chars)}")
    return encode_chat(run.extractor_tok, [{"role": "system", "content": system}, {"role": "user", "content": user}])


OP_RE = re.compile(r"^(ADD|UPDATE|KEEP|NONE)\b\s*([0-9][0-9,\s]*)?:?\s*(.*)$", re.I)


ANSWER_RE = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.S | re.I)


def parse_operations(reply: str, shown: int, max_ops: int = 3, merge: bool = False) -> tuple[list[tuple], int]:
    """Reply -> ([(kind, targets, text)], parse failures). Accepts `ADD: text`, `UPDATE 1,2: text` (targets
    are 1-based indices of the shown lessons) and `NONE`, inside <answer> when present; a merge takes
    `KEEP 1,2` instead of ADD. A line that is none of these, or names a lesson that was not shown, is a
    failure: counted, skipped, never fatal."""
    m = ANSWER_RE.search(reply.split("</think>")[-1])
    tagged = m is not None
    region = m.group(1) if tagged else reply.split("</think>")[-1]
    ops, bad = [], 0
    for line in region.splitlines():
        line = line.strip().strip("-*").strip()
        if not line:
            continue
        op = OP_RE.match(line)
        kind = op.group(1).upper() if op else None
        targets = [int(t) for t in re.findall(r"\d+", op.group(2) or "")] if op else []
        body = op.group(3).strip() if op else ""
        if kind == "NONE":
            ops.append(("none", (), ""))
        elif kind == "ADD" and body and not targets and not merge:
            ops.append(("add", (), body))
        elif kind == "KEEP" and merge and targets and not body and all(1 <= t <= shown for t in targets):
            ops.append(("keep", tuple(sorted(set(targets))), ""))
        elif kind == "UPDATE" and body and targets and all(1 <= t <= shown for t in targets):
            ops.append(("update", tuple(sorted(set(targets))), body))
        else:
            bad += 1
    if not tagged and ops:
        bad = 0          # free reasoning around untagged operations is not a failure
    if not ops and not bad:
        bad = 1          # an empty reply
    return [o for o in ops if o[0] != "none"][:max_ops], bad


def extractor_generate(run, prompts: list[list[int]], tasks: list[str], rng, heads: list | None = None,
                       record: bool = True) -> list[tuple[int, str]]:
    """One batched extractor call; each output becomes a Generation (when the extractor is trained)."""
    cfg, tok = run.cfg, run.extractor_tok
    t0 = time.perf_counter()
    budget = Constraint.budget(cfg.extractor_reply_tokens, heads)   # a grammar reply is never cut
    samples = generate(run.extractor, prompts, budget, cfg.sampling(EXTRACTOR_TEMPERATURE),
                       stop=[tok.eos_token_id], tokenizer=tok, generator=rng, constraint=heads)
    run.timer["extractor"] += time.perf_counter() - t0
    out = []
    for prompt, task, s in zip(prompts, tasks, samples):
        gen_id = run.generations_made * world() + rank()        # unique across ranks
        run.generations_made += 1
        if record and cfg.trains_extractor:
            run.generations[gen_id] = Generation(gen_id, task, prompt, s.tokens, s.logprobs, s.allowed)
        ended = bool(s.tokens) and s.tokens[-1] == tok.eos_token_id
        # special tokens never enter a lesson: injected into a prompt they would break its chat format
        out.append((gen_id, tok.decode(s.tokens[:-1] if ended else s.tokens, skip_special_tokens=True)))
    return out


def distill_choice(members: list[Episode], n: int) -> list[Episode]:
    """Which episodes of a group to distil when not all: alternate successes and failures, so the extractor
    sees both outcomes."""
    wins = [e for e in members if e.success]
    losses = [e for e in members if not e.success]
    out = []
    while len(out) < n and (wins or losses):
        for outcome in (wins, losses):
            if outcome and len(out) < n:
                out.append(outcome.pop(0))
    return out


def distill(run, eps: list[Episode], step: int, rng, record: bool = True) -> list[Operation]:
    """Finished episodes -> bank operations (PAPER §Experience bank: add / update / none). New entries are keyed by the
    embedding of the episode's retrieval query; an update replaces the shown entries it names."""
    if not eps:
        return []
    if run.extractor is None:   # vault study: --extractor oracle, the ceiling, every lesson right, none invented
        return vault_study.oracle_lessons(run, eps, step)
    prompts = [extractor_prompt(run, e) for e in eps]
    shown = [[i for i, _ in extractor_view(e)] for e in eps]
    outputs = extractor_generate(run, prompts, [e.task for e in eps], rng,
                                 heads_for(run, [len(ids) for ids in shown], [e.task for e in eps],
                                           won=[e.success for e in eps]), record)
    keys = run.manager.embed([e.query for e in eps])
    ops = []
    for e, key, ids_shown, (gen_id, reply) in zip(eps, keys, shown, outputs):
        if not run.cfg.extractor_free_text:
            reply = reply.replace("\n", " ")    # a tiny extractor writes one operation: head + free body
        parsed, bad = parse_operations(reply, len(ids_shown), run.cfg.max_operations)
        run.counters["parse_failures"] += bad
        run.counters["operations"] += len(parsed)
        for kind, targets, text in parsed:
            ids = tuple(ids_shown[t - 1] for t in targets)
            ops.append(Operation(kind, e.task, text, ids, key, gen_id, step, origin=e.seed))
    return ops


def search_and_ask(run, questions: list[tuple[Episode, str]], rng, train: bool = True, clock=None) -> list[str]:
    """The actor's tool (PAPER §Experience bank: search_and_ask): the bank's search for its question, its top 1
    after the re-rank [release], and the extractor's answer from that lesson. The answer is a generation like
    any other: the asking episode's outcome is its reward. A task with no lesson gets NO_LESSONS, with no
    extractor call and nothing to credit [release]. `clock`: the re-rank's (now, rng), rerank_clock's. The
    search reads the bank without counting: asks come at different turns on different ranks, so no rank can
    wait for the others' questions; record_outcomes counts what they were shown, every rank's in rank order."""
    now, rerank = clock or rerank_clock(run, train, rank())
    answers, asking = [NO_LESSONS] * len(questions), []
    for j, (e, q) in enumerate(questions):
        hits = run.manager.search(e.task, [q], 1, update=False, now=now, rng=rerank)[0]
        if hits:
            e.asked.append(hits[0][0].id)
            asking.append((j, e, q, hits[0][0].text))
    prompts = [encode_chat(run.extractor_tok, [
        {"role": "system", "content": ASK_SYSTEM},
        {"role": "user", "content": f"Task: {e.instruction}\nQuestion: {q}\nLessons:\n{shown_lessons([lesson])}"}])
        for _, e, q, lesson in asking]
    outputs = extractor_generate(run, prompts, [e.task for _, e, _, _ in asking], rng, record=train) if asking else []
    for (j, e, _, _), (gen_id, reply) in zip(asking, outputs):
        e.sources.append(gen_id)
        answers[j] = reply.split("</think>")[-1].strip() or "(no answer)"
    return answers


def credit_generations(run, eps: list[Episode]):
    """Each episode credits the generations behind what it used: its score (0 -> -1), shaped by the actor's
    verdict on each lesson (lesson_credit) [release] (or, with cfg.credit lift or first-lift, its lift:
    vault_study.episode_lift). Credits from every rank reach the rank that owns the generation (PAPER §Extractor
    objective: reward attribution)."""
    outcome = run.cfg.credit == "outcome"
    worth = ([e.reward for e in eps] if outcome else   # vault study: the lift
             vault_study.episode_lift(eps, first_only=run.cfg.credit == "first-lift"))
    credits = [(src, lesson_credit(w, e.verdicts.get(src), zero_is_failure=outcome))
               for e, w in zip(eps, worth) for src in e.sources]
    for rank_credits in gather_objects(credits):
        for src, c in rank_credits:
            g = run.generations.get(src)
            if g is None:
                continue
            if not g.credits:   # [release] it enters the buffer now; more credits leave its place as it is
                g.queued = run.step
            g.credits.append(c)


def cispo_loss(logp, old_logp, adv, mask, eps_low: float = 0.1, eps_high: float = 0.1, **denoms):
    """CISPO (MiniMax-M1): -sg(clip(r, 1-eps_low, 1+eps_high)) * A * log pi. The importance weight is
    clipped, not the objective, so every token keeps its gradient (PAPER §Extractor objective [release])."""
    weight = torch.exp(logp - old_logp).clamp(1 - eps_low, 1 + eps_high).detach()
    per_token = -weight * adv[:, None] * logp
    return aggregate(per_token, mask, **denoms)


def extractor_update(run) -> dict:
    """Once `extractor_batch` generations have credits (over all ranks), one CISPO step on the newest
    `extractor_batch` of them, with A = reward - batch mean;
    the older ones lose their credits untrained [release: its buffer of 64 slots evicts the oldest on insert, and
    trains when full]. Newest means most recently queued (`Generation.queued`, then the id). A trained or evicted
    generation stays: when its lesson is used again it returns with the mean of its new credits [release]. Then
    `prune_generations`."""
    cfg, stats = run.cfg, {}
    ready = {gid: g for gid, g in run.generations.items() if g.credits}
    # every rank sorts every rank's queue places alike (ids are unique across ranks), then trains its own
    # among the newest: the batch is the same as one process holding them all would train
    queue = sorted((place for places in gather_objects([(g.queued, gid) for gid, g in ready.items()])
                    for place in places), reverse=True)
    if len(queue) >= cfg.extractor_batch:
        newest = {gid for _, gid in queue[:cfg.extractor_batch]}
        batch = [g for gid, g in ready.items() if gid in newest]
        rewards = [sum(g.credits) / len(g.credits) for g in batch]
        mean = all_reduce_sum(sum(rewards)) / cfg.extractor_batch
        segments = []
        for g in batch:
            s = Segment()
            s.extend(g.prompt)
            s.extend(g.tokens, True, g.logprobs, g.allowed)
            segments.append(s)
        t0 = time.perf_counter()
        loss = functools.partial(cispo_loss, eps_low=cfg.cispo_eps_low, eps_high=cfg.cispo_eps_high)
        update = Update(run.extractor, run.extractor_opt, loss, (1 - cfg.cispo_eps_low, 1 + cfg.cispo_eps_high),
                        cfg.sampling(EXTRACTOR_TEMPERATURE), **cfg.update_settings)
        stats = policy_update(update, segments, [r - mean for r in rewards])
        run.timer["extractor_update"] += time.perf_counter() - t0
        for g in ready.values():
            g.credits = []
        stats.update(reward=mean, generations=cfg.extractor_batch, evicted=len(queue) - cfg.extractor_batch)
    prune_generations(run)
    return stats


def prune_generations(run):
    """Beyond MAX_GENERATIONS [release], drop the oldest generations that can earn nothing more: no credits waiting and
    no live bank entry written by them (a NONE, an ask's answer once trained, a lesson since replaced,
    discarded or evicted). One whose lesson lives is kept past the cap, as the release keeps it in its entry:
    the lesson's next use credits it. The bank is read only when the cap is passed."""
    excess = len(run.generations) - MAX_GENERATIONS
    if excess <= 0:
        return
    bank = run.manager.bank
    live = {e.source for task in bank.tasks() for e in bank.entries(task)}
    idle = [gid for gid, g in sorted(run.generations.items()) if not g.credits and gid not in live]
    for gid in idle[:excess]:
        del run.generations[gid]


def merge_pass(run, step: int, rng) -> list[Operation]:
    """Consolidate each task's whole bank [release] (PAPER §Experience bank: merge): its entries, oldest first,
    MERGE_SIZE at a time [release], each extractor call shown the next chunk and the list the previous call of the chain
    wrote, its reply the new list for them (MergeChain). A task's chain is sequential; the chains of different
    tasks advance side by side, one batched call a round. Rank r walks the tasks r, r + W, ...; the caller
    applies every rank's operations."""
    bank = run.manager.bank
    chains = [MergeChain(task, bank.entries(task), MERGE_SIZE)
              for task in sorted(bank.tasks())[rank()::world()] if bank.size(task) >= 2]
    while live := [c for c in chains if c.next_chunk()]:
        prompts = [encode_chat(run.extractor_tok, [
            {"role": "system", "content": MERGE_SYSTEM},
            {"role": "user", "content": f"Task: {c.task}\nLessons:\n{shown_lessons([t for t, _, _ in c.shown])}"}])
            for c in live]
        tasks = [c.task for c in live]
        outputs = extractor_generate(run, prompts, tasks, rng,
                                     heads_for(run, [len(c.shown) for c in live], tasks, merge=True))
        for c, (gen_id, reply) in zip(live, outputs):
            # at most a line per lesson shown: a longer list only repeats itself
            parsed, bad = parse_operations(reply, len(c.shown), len(c.shown), merge=True)
            run.counters["parse_failures"] += bad
            c.apply(parsed, gen_id)
    ops = [op for c in chains for op in c.operations(step, bank.mean_key)]
    written = [op for op in ops if op.kind == "add"]   # merges: lessons written; discards: entries none stands for
    stand_for = {i for op in written for i in op.ids}
    run.counters["merges"] += len(written)
    run.counters["discards"] += sum(i not in stand_for for op in ops if op.kind == "remove" for i in op.ids)
    return ops


def apply_everywhere(run, ops: list[Operation]):
    """Every rank applies every rank's operations in rank order: the bank replicas stay identical."""
    for rank_ops in gather_objects(ops):
        run.manager.apply(rank_ops)

# ---------------------------------------------------------------------------------------------------------
# One co-evolution iteration, and evaluation

def train_step(run, step: int) -> dict:
    """One co-evolution iteration, its steps numbered below; returns its metrics (identical on every rank)."""
    cfg = run.cfg
    run.timer = {k: 0.0 for k in ("generate", "env", "update", "extractor", "extractor_update", "merge")}
    run.counters = {k: 0 for k in ("parse_failures", "operations", "merges", "discards", "judge_accept",
                                   "judge_refine", "judge_reject", "judge_unparsed")}
    run.step = step
    actor_rng = seeded_generator(run.actor.device, run.seed, step, rank(), ACTOR_SAMPLING)
    extractor_rng = (seeded_generator(run.extractor.device, run.seed, step, rank(), EXTRACTOR_SAMPLING)
                     if run.extractor else None)

    # 1-2. G rollouts of each task instance; the with-experience half retrieves a lesson and judges it
    searched = searches(run)
    with parallel.full_weights(run):
        eps = rollout(run, episode_specs(run, step), actor_rng, cfg.temperature)
    metrics = {"step": step, **success_metrics(eps, "train"), **retrieval_metrics(run, searched)}
    trains = step >= cfg.warmup or not cfg.uses_bank   # [release] neither model trains in the warm-up
    distilling = None
    if cfg.uses_bank:
        record_outcomes(run, eps)                                      # 3. bank usage, credit to generations
        distilling = distill_episodes(run, eps, step, extractor_rng)   # 4. lessons, while the actor trains
    if cfg.trains_actor and trains and not (cfg.mode == "crl" and step < cfg.head_start):   # vault study: head start
        metrics.update(actor_update(run, eps))             # 5. split advantages, GRPO
    if distilling is not None:
        ops = distilling.result()
        if any(map(vault_study.is_vault, run.tasks)):      # vault study: lessons naming the door
            metrics.update(vault_study.vault_lessons(eps, ops))
        apply_everywhere(run, ops)                         # every rank's lessons, in rank order
    if cfg.trains_extractor and trains:                     # 6. CISPO on the generations judged so far
        metrics.update({f"extractor/{k}": v for k, v in extractor_update(run).items()})
    if cfg.uses_bank and cfg.merge_every and (step + 1) % cfg.merge_every == 0:
        t0 = time.perf_counter()
        with parallel.full_weights(run, actor=False):
            apply_everywhere(run, merge_pass(run, step, extractor_rng))   # 7. consolidate the whole bank
        run.timer["merge"] = time.perf_counter() - t0
    return {**metrics, **episode_metrics(run, eps)}


def episode_specs(run, step: int) -> list[tuple]:
    """This rank's episodes: `groups` task instances (tasks in turn, seeds drawn from (seed, step)), each
    played G times, G/2 without and G/2 with experience (all G without in grpo mode)."""
    rng = np.random.default_rng([run.seed, step, INSTANCES])
    G, groups = run.cfg.group_size, run.cfg.groups
    specs = []
    for g in range(groups):
        task = run.tasks[(step * groups + g) % len(run.tasks)]
        seed = envs.draw_training_seed(task, rng, EVAL_SEED0)
        if run.cfg.instance_visits:   # vault study: an instance recurs for K iterations, then retires
            task, seed = vault_study.visiting_instance(run, step, g, EVAL_SEED0)
        if g % world() != rank():
            continue
        for j in range(G):
            specs.append((task, seed, g, run.cfg.uses_bank and j >= G // 2))
    return specs


def record_outcomes(run, eps: list[Episode]):
    """Every rank's episodes, in rank order, update the retrieved entries' use counts and count the entries
    their asks were shown (the re-rank reads that count), and each episode credits the generations it used
    (PAPER §Extractor objective: reward attribution)."""
    for rank_uses in gather_objects([(e.retrieved, e.success, e.asked) for e in eps if e.retrieved or e.asked]):
        for ids, success, asked in rank_uses:
            run.manager.record_use(ids, success)
            run.manager.bank.count_shown(asked, run.step)
    credit_generations(run, eps)


def distill_episodes(run, eps: list[Episode], step: int, rng) -> "parallel.Distillation":
    """Distil the with-experience half of each group [release] (of those, `distill_per_group` a group) into bank
    operations, on the bank's background thread while the actor trains (inline with --distill inline, the CPU
    default). The caller applies every rank's operations in rank order after the update: the replicas stay
    identical and runs reproducible."""
    chosen = [e for e in eps if e.with_exp]
    if run.cfg.distill_per_group:
        by_group = {}
        for e in chosen:
            by_group.setdefault(e.group, []).append(e)
        chosen = [e for g in sorted(by_group) for e in distill_choice(by_group[g], run.cfg.distill_per_group)]
    return parallel.Distillation(run, distill, chosen, step, rng)


def evaluate(run, tasks: list[str], episodes: int) -> dict:
    """Success on held-out seeds (disjoint from training seeds), with and without experience, the bank
    read-only. The sampling noise is fixed, so evaluations at different steps are comparable."""
    return success_metrics(play_held_out(run, held_out_specs(run, tasks, episodes), EVAL_STEP), "eval")


def evaluate_attempts(run, tasks: list[str], instances: int, attempts: int) -> dict:
    """Learning at test time through the bank: each held-out instance is played `attempts` times in rounds,
    once with and once without experience a round; after each round the frozen extractor distils the round's
    with-experience episodes into a bank that starts empty (no training lesson can reach an attempt), which the
    next round retrieves from. Weights stay frozen and the run's bank untouched. Without memory success stays
    flat over the attempts; a working memory makes it rise. Returns, at each attempt, success, the run's own
    contrast (metrics.paired_contrast), the same-instance share of retrieval and the share of instances the
    extractor wrote a lesson for (the rest answered NONE)."""
    specs, out = held_out_specs(run, tasks, instances), {}
    # a scratch copy of the run: its own counters and timer, and a manager over an empty copy of the bank
    manager = run.manager and ExperienceManager(run.manager.bank.copy(empty=True), run.manager.embedder, sync=True)
    run = replace(run, manager=manager, counters={k: 0 for k in ("parse_failures", "operations")},
                  timer={"extractor": 0.0})
    for a in range(1, attempts + 1):
        eps = play_held_out(run, specs, EVAL_STEP + a)
        metrics = {**success_metrics(eps, "attempts"), **paired_contrast(eps, "attempts"),
                   **same_instance(eps, "attempts", EVAL_STEP + a - 1 if a > 1 else None)}
        out.update({f"{k}_{a}": v for k, v in metrics.items()})
        if manager is not None and a < attempts:
            rng = (seeded_generator(run.extractor.device, run.seed, EVAL_STEP + a, rank(), EXTRACTOR_SAMPLING)
                   if run.extractor else None)
            with parallel.full_weights(run, actor=False):
                ops = distill(run, [e for e in eps if e.with_exp], EVAL_STEP + a, rng, record=False)
            out[f"attempts/wrote_{a}"] = wrote_share(eps, ops)
            apply_everywhere(run, ops)
    return out


def held_out_specs(run, tasks: list[str], episodes: int) -> list[tuple]:
    """This rank's share of `episodes` held-out seeds per task and panel (envs.held_out_panels: the vault's are
    held-out names, doors balanced; the family vault's also a control of families training never draws), each
    played without and (with a bank) with experience."""
    specs = []
    for task in tasks:
        seeds = [s for panel in envs.held_out_panels(task, episodes, EVAL_SEED0).values() for s in panel]
        for j, seed in enumerate(seeds):
            specs.append((task, seed, j, False))
            if run.cfg.uses_bank:
                specs.append((task, seed, j, True))
    return specs[rank()::world()]


def play_held_out(run, specs: list[tuple], noise_step: int) -> list[Episode]:
    """Play held-out episodes `eval_batch` at a time, the bank read-only, the noise seeded as at `noise_step`."""
    run = replace(run, timer={k: 0.0 for k in ("generate", "env", "extractor")})   # training's untouched
    rng = seeded_generator(run.actor.device, run.seed, noise_step, rank(), EVAL_SAMPLING)
    eps, n = [], run.cfg.eval_batch
    with parallel.full_weights(run):
        for i in range(0, len(specs), n):
            eps += rollout(run, specs[i:i + n], rng, run.cfg.temperature, train=False)
    return eps
