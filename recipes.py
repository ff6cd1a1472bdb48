"""Recipes: a finished study's settings as one named set of values (`python train.py --recipe NAME`). A recipe sets
every flag it names over the defaults and the model presets; a flag given on the command line wins over it;
`--dry-run` prints what a run would write to its args.json and exits."""

# results/vault-first/: CRL − GRPO +0.542 ± 0.184 at the third held-out attempt over 8 seeds (runs/vault-first.sh
# runs every mode and seed of it; `--mode static --extractor oracle` is its ceiling). Each value, and why:
VAULT_FIRST = dict(
    tasks="vault-reveal",          # a lost vault names its door, so every episode can teach (results/vault-reveal)
    actor="smollm2", extractor="smollm2",
    lesson_prior=25,               # every mode's actor first taught to follow a lesson, then search (vault-prior)
    instance_visits=4,             # each vault played 4 iterations, then retired: lessons read back, never learned
    bank_min_cosine=0.999,         # a vault reads only its own lessons: what is measured is memory of that vault
    groups=4,
    extractor_none="never",        # every episode yields a lesson (under the reveal each transcript holds the door)
    credit="first-lift",           # only a first-action win pays: a wrong lesson costs the same whichever door it names
    head_start=150,                # crl: the actor frozen 150 of 300 iterations while the extractor learns to write
    extractor_lr=3e-5, merge_every=0,
    iters=300, save_every=30, final_eval_episodes=256, final_attempts=3,
)

# results/family/: the paper's claim on a task both learners can learn (runs/family.sh runs its grid). Chosen on the
# pilots' training curves alone, seed 0 (results/family-smollm2/), and each value, and why:
FAMILY = dict(
    tasks="vault-family6-reveal",  # six families, each fixing its door (GRPO neither solved by 50 nor flat at 300);
                                   # a lost episode names its door, so a family's first lesson can come from a loss
    actor="smollm2", extractor="smollm2",
    lesson_prior=25,               # every mode's actor first taught to follow a lesson, as in the vault study
    groups=4,
    extractor_none="never", credit="first-lift", extractor_lr=3e-5, merge_every=0,   # the vault study's extractor
    iters=150,                     # crl's and the oracle's pilots solved by ~100, GRPO's 0.65 at 150 and ~0.70 at 300
    eval_every=25, eval_episodes=48,   # the held-out curves: both panels (6 seen families, 8 control doors) balanced
    save_every=25, final_eval_episodes=144,
    dtype="float32",               # one number format on every CPU kind the grid's sittings draw (and the pilots')
)

RECIPES = {"vault-first": VAULT_FIRST, "family": FAMILY}
