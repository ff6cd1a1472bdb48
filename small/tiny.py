"""The tiny model: a ~1M-parameter Qwen3 over the byte tokenizer (hf.ByteTokenizer), trained from scratch by RL
on a CPU. It stands in for a pretrained checkpoint where the method's mechanics are what is tested."""
import torch

from hf import ByteTokenizer, ModelConfig
from model import Transformer


def tiny_model(seed: int = 0, **overrides) -> Transformer:
    """The CPU preset's decoder. `overrides` are config.json keys.

    It is trained from scratch by RL, so its init is chosen for that: weights scaled to the width
    (1/sqrt(hidden); HF's 0.02 suits ~2.5k-wide models, and at 128 wide the policy was still blind to
    its observation after 100 RL iterations on room), and an untied lm_head started near zero so the
    first policy is near uniform over the allowed tokens (as PPO starts its policy head)."""
    tok = ByteTokenizer()
    d = dict(architectures=["Qwen3ForCausalLM"], vocab_size=len(tok), hidden_size=128,
             intermediate_size=384, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             head_dim=32, max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=10000.0,
             tie_word_embeddings=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
             bos_token_id=None)
    d.update(overrides)
    return init_weights(Transformer(ModelConfig.from_hf(d)), seed, std=d["hidden_size"] ** -0.5, head_std=0.002)


def init_weights(model: Transformer, seed: int = 0, std: float = 0.02, head_std: float | None = None) -> Transformer:
    """HF-style random init: normal(0, std) matrices and embeddings, zero biases, unit norms; an untied
    lm_head takes head_std (default: std)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() == 1:
                p.fill_(1.0)
            else:
                s = head_std if name == "lm_head.weight" and head_std is not None else std
                p.copy_(torch.randn(p.shape, generator=g) * s)
    return model
