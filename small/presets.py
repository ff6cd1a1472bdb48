"""The small models' settings: what a 2-core CPU needs to run the method at all, apart from the method itself.
train.py applies a preset where the command line does not set a value (and trains the tiny actor's lesson prior,
--lesson-prior)."""

# Presets: settings that differ from the defaults of train.RunConfig and crl.CRLConfig (the authors' setup for real
# checkpoints), applied where the command line does not set them, chosen by the model named. TINY (--actor tiny)
# is sized for a 2-core CPU: about 5 s an iteration, under 30 minutes a run. The warm-up, the CISPO batch and the
# distillation of every with-experience episode are the release's (5, 64, all): nothing measured favoured the 2,
# 32 and 2 a group the earlier runs used.
TINY = dict(lr=3e-4, extractor_lr=1e-3, groups=8, free_text=False, history=0, max_reply_tokens=16,
            max_context=6144, extractor_reply_tokens=24, episode_chars=400,
            micro_batch=16, eval_every=30, iters=270, instructions=False, show_map=False,
            max_steps="room=10,maze=10", judge="none",   # a model trained from scratch never learns to judge: no verdict is trained
            dtype=None)   # not auto: fp32 on any CPU (the tiny results are fp32 runs), bf16 on CUDA
# A constrained extractor's lessons are a few move words, and a merge keeps only items over 30 characters
# [release] (bank_merge.lasting): every merge would keep its chunk and only cost its calls, so the small extractors never
# merge.
TINY_EXTRACTOR = dict(extractor_free_text=False, merge_every=0)   # --extractor tiny
# SMOLLM2 (--actor smollm2, the 135M instruct model), each value measured on a 2-core CPU (results/smollm2/): the
# lesson as a tip opening the first user turn, without the task text (followed 0.51 of the time against 0.18 at
# the end of the system prompt; chance 0.125), replies constrained to the actions, lr 1e-5 (tuned on the GRPO
# baseline's training success; 1e-4 collapsed), a budget a CPU grid cell can afford, and 64
# evaluation episodes at once (256 peaked at 20 GB and were killed inside a trained run; 64: 7 GB, and faster).
# MiniHack's map stays in the view and the warm-up is 5, as in the release: the first-turn tip was followed 0.533
# of the time with the map and 0.514 with the words view the earlier runs used (12 starts, within the 0.04 of two
# runs of one setting), and nothing measured the warm-up. No judgement of lessons (probes/judge.py, 32 held-out
# room starts and 32 vaults): constrained to accept/reject it accepts 0.02-0.04 of lessons, right or wrong alike
# (differences -0.003, +0.001), and free text never parses as a verdict (0 of 512), so either way it would drop
# nearly every lesson. The compute dtype is --dtype auto's: the
# preset's bf16 was measured on an AVX-512 BF16 CPU, where it is faster; on an AVX2 one it trains ~6x slower.
# Per task: the room, maze and vault grids ran 10 actions (every other task plays its own budget); the whole
# episode stays in context, KV cache kept, up to SmolLM2's own 8,192 positions. ALFWorld's and WebShop's
# observations go without their list of valid actions (the replies are constrained to it anyway): with it 30
# ALFWorld actions outgrew 8,192 positions (350 tokens a turn) and 10 WebShop pages did (a random walk's
# observations: 4,180 tokens on average, 10,850 at most; without it 3,254 and 6,530), and WebShop kept only its
# last 2 turns, re-read every turn (564 s an iteration; whole episodes without the list: 189-206 s, none cut); a
# micro-batch holds at most 8,192 padded tokens (eight 30-action Sokoban episodes in one took 19 GB and were killed).
SMOLLM2 = dict(lr=1e-5, extractor_lr=1e-5, groups=2, group_size=8, free_text=False, lesson_turn=True,
               instructions=False, list_actions=False, max_steps="room=10,maze=10,vault=10,vault-reveal=10",
               max_context=8192, micro_batch=8, micro_tokens=8192, eval_every=10, eval_episodes=32,
               eval_batch=64, iters=60, judge="none")
# --extractor smollm2: free text fails its format (hundreds of parse failures an iteration), so the heads are
# constrained, a lesson is one move word (which the actor above follows), and it must write one (a NONE is never
# credited: --extractor-none never). A CISPO step waits for 16 credited generations, not the release's 64: the
# vault runs credit 1.55-1.95 generations an iteration (results/smollm2-vault), so at 64 a 60-iteration run takes
# one step, and the CISPO probe needs 20-70 steps of 16 (results/cispo-vault)
SMOLLM2_EXTRACTOR = dict(extractor_free_text=False, lesson_moves=1, extractor_none="never", extractor_reply_tokens=16,
                         episode_chars=1500, distill_per_group=4, extractor_batch=16, merge_every=0)
PRESETS = {"tiny": (TINY, TINY_EXTRACTOR), "smollm2": (SMOLLM2, SMOLLM2_EXTRACTOR)}   # name: (actor, extractor)
