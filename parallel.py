"""parallel.py — how the work is split and placed: random streams and collectives, mixed precision, FSDP2
sharding, rollout copies, sharded checkpoints, background distillation.

None of this changes the algorithm: with fp32 weights on one device (the CPU default) every function here
hands back what it was given. crl.py and update.py (the policy update, micro-batched over ranks) call it at a
few fixed points, train.py when it builds and saves a run.

- Mixed precision. The trained weights (the "masters") and AdamW's state stay fp32 while forward and
  backward compute in bf16: autocast without FSDP, FSDP's MixedPrecisionPolicy with it. bf16 masters would
  lose most of an lr-1e-6 AdamW step (a step below half a bf16 ulp rounds away). A model carries its compute
  dtype as the attribute `compute_dtype` (set by `prepare`).
- FSDP2 (`--fsdp`): `fully_shard` on each Block, then on the root, which keeps embed_tokens, norm and lm_head
  (token_logprobs calls lm_head outside forward; Qwen3 ties it to the embedding). Gradients are reduce-
  scattered as sums in fp32, not means: crl's losses are divided by global counts, so summing over ranks
  gives exactly the single-process step. Every forward/backward is a collective, so a rank with fewer
  micro-batches runs zero-loss passes (`match_microbatches`).
- Rollout copies. The generator never sees FSDP or fp32 masters: `full_weights` swaps run.actor/extractor
  for plain models in the compute dtype (one all-gather per parameter), freed when the block ends, so they
  never sit beside the update's activations.
- Checkpoints. `save_pretrained` writes a HF directory (a sharded model is gathered first); `save_sharded` /
  `load_sharded` keep the fp32 masters and AdamW state of sharded models with torch.distributed.checkpoint,
  each rank writing its own shards, so --resume is exact.
- Background distillation. `Distillation` runs crl.distill on the bank manager's thread while the actor
  trains and hands the operations back, so every rank can apply every rank's operations in rank order at
  one fixed point (crl.apply_everywhere): bank replicas stay identical and runs reproducible.
"""
import math
import os
import pickle
import time
from contextlib import contextmanager, nullcontext

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from model import Transformer, rope_inv_freq, token_logprobs


def is_sharded(model) -> bool:
    return isinstance(model.embed_tokens.weight, DTensor)


def compute_dtype(model) -> torch.dtype:
    return getattr(model, "compute_dtype", model.dtype)


def ensure_process_group(device):
    """FSDP needs a process group even in one process (plain `python train.py --fsdp`): a one-rank group."""
    if dist.is_initialized():
        return
    if device.type == "cuda":
        torch.cuda.set_device(device.index or 0)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                            world_size=1)


# ---------------------------------------------------------------------------------------------------------
# Building a trained model: on one device with a compute dtype, or sharded

# --dtype auto on a CPU picks bf16 only where its matmul beats fp32's by this factor: where bf16 is native
# (AVX-512 BF16, AMX) it is ~10x faster; where torch emulates it (AVX2) 20x slower or worse. A near tie goes to
# fp32, which keeps the precision and skips autocast's casts.
BF16_SPEEDUP = 1.25


def matmul_seconds(dtypes: tuple, n: int = 512, reps: int = 5) -> list[float]:
    """Seconds of an n x n matmul on the CPU in each of `dtypes`: the best of `reps`, taken in turns after an
    untimed one each (oneDNN builds its kernel on the first call), so a burst of other work on the cores slows
    both alike; the best, since another process only ever adds time."""
    pairs = [(torch.randn(n, n).to(d), torch.randn(n, n).to(d)) for d in dtypes]
    best = [math.inf] * len(dtypes)
    for rep in range(reps + 1):
        for i, (a, b) in enumerate(pairs):
            t = time.perf_counter()
            a @ b
            best[i] = min(best[i], time.perf_counter() - t) if rep else best[i]
    return best


def choose_dtype(device) -> tuple[str, str]:
    """--dtype auto: (the dtype, why). bf16 on CUDA; on a CPU measured, not read from its name: bf16 where its
    matmul is BF16_SPEEDUP times as fast as fp32's, else fp32 (about a second where bf16 is emulated)."""
    if device.type == "cuda":
        return "bfloat16", "cuda"
    fp32, bf16 = matmul_seconds((torch.float32, torch.bfloat16))
    choice = "bfloat16" if bf16 * BF16_SPEEDUP <= fp32 else "float32"
    return choice, (f"{torch.backends.cpu.get_cpu_capability()} cpu, 512x512 matmul: bf16 {bf16 * 1e3:.2f} ms, "
                    f"fp32 {fp32 * 1e3:.2f} ms; bf16 when >= {BF16_SPEEDUP}x as fast")


def prepare(model: Transformer | None, device, dtype: torch.dtype, fsdp: bool = False,
            checkpointing: bool = False) -> Transformer:
    """A loaded model (weights in their master dtype, on the CPU or `device`) made ready to train: computing
    in `dtype`, each block recomputed in backward with `checkpointing`, sharded over all ranks with `fsdp`
    (then only rank 0 passes the model; the others pass None and receive it by broadcast)."""
    if fsdp:
        model = shard_from_rank0(model, device, dtype)
    else:
        model = model.to(device)
    for block in model.layers:
        block.checkpointing = checkpointing
    model.compute_dtype = dtype
    return model


def shard_from_rank0(full: Transformer | None, device, dtype: torch.dtype) -> Transformer:
    """Every rank builds the model on `meta`, shards it, allocates its shards, and receives rank 0's weights
    by broadcast: only rank 0 ever holds (or reads) the whole model."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
    head = [(full.config, full.dtype) if full is not None else None]
    dist.broadcast_object_list(head, src=0)
    config, master = head[0]
    with torch.device("meta"):
        model = Transformer(config).to(master)
    mesh = init_device_mesh(device.type, (world(),))
    # cast_forward_inputs=False: rotary cos/sin stay fp32, as in the unsharded model and the rollout copy
    mp = MixedPrecisionPolicy(param_dtype=None if dtype == master else dtype, reduce_dtype=torch.float32,
                              cast_forward_inputs=False)
    for block in model.layers:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)            # sums, not means, over ranks
            m.set_force_sum_reduction_for_comms(True)    # gloo has no PREMUL_SUM
    model.to_empty(device=device)
    state = full.state_dict() if rank() == 0 else {}
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    model.inv_freq = rope_inv_freq(config).to(device)   # a non-persistent buffer: to_empty left it garbage
    return model


def plain_copy(model: Transformer, dtype: torch.dtype) -> Transformer:
    """A plain Transformer holding `model`'s weights in `dtype`, no gradients. A sharded parameter is gathered
    (a collective: every rank builds its copy at the same point)."""
    with torch.device("meta"):
        copy = Transformer(model.config)
    state = {}
    for name, p in model.named_parameters():   # a tied lm_head is listed once, as the embedding
        t = p.detach().to(dtype, copy=True)
        state[name] = t.full_tensor() if isinstance(t, DTensor) else t
    copy.load_state_dict(state, strict=False, assign=True)
    if model.config.tie_word_embeddings:
        copy.lm_head.weight = copy.embed_tokens.weight
    copy.inv_freq = rope_inv_freq(model.config).to(copy.device)
    return copy.requires_grad_(False).eval()


def rollout_copy(model):
    """What generate runs on: the model itself, or a plain copy in its compute dtype when it is sharded or
    keeps wider master weights."""
    if model is None or not (is_sharded(model) or compute_dtype(model) != model.dtype):
        return model
    return plain_copy(model, compute_dtype(model))


@contextmanager
def full_weights(run, actor: bool = True, extractor: bool = True):
    """Inside the block run.actor / run.extractor are their rollout copies; the trained models come back on
    exit and the copies are freed (they would not fit beside the update's activations on a large model)."""
    saved = run.actor, run.extractor
    run.actor = rollout_copy(run.actor) if actor else run.actor
    run.extractor = rollout_copy(run.extractor) if extractor else run.extractor
    try:
        yield
    finally:
        run.actor, run.extractor = saved


# ---------------------------------------------------------------------------------------------------------
# The update

def autocast(model, enabled: bool = True):
    """bf16 compute on fp32 masters without FSDP (a sharded model casts through its MixedPrecisionPolicy).
    enabled=False, inside an enabled one: full precision again, and the outer context's casts of the weights
    stay cached (torch clears them when the outermost context ends)."""
    dtype = compute_dtype(model)
    if dtype == model.dtype or is_sharded(model):
        return nullcontext()
    return torch.autocast(model.device.type, dtype=dtype, enabled=enabled)


def match_microbatches(model, mine: int):
    """Under FSDP every forward and backward is a collective, so every rank must run as many as the others.
    Called before a rank runs its `mine` micro-batches: it first runs zero-loss passes through every
    parameter, as many as it has fewer than the rank with the most (the gradient is unchanged)."""
    if not is_sharded(model):
        return
    n = torch.tensor([mine], device=model.device)
    dist.all_reduce(n, op=dist.ReduceOp.MAX)
    tokens = torch.zeros(1, 2, dtype=torch.long, device=model.device)
    mask = torch.tensor([[False, True]], device=model.device)
    for _ in range(int(n) - mine):
        (token_logprobs(model, tokens, mask).sum() * 0).backward()


# ---------------------------------------------------------------------------------------------------------
# Checkpoints

def save_pretrained(model: Transformer, path: str):
    """Rank 0 writes `model` as a HF directory; a sharded model is gathered first, in its compute dtype (every
    rank takes part). The exact fp32 masters of a sharded model are in save_sharded's checkpoint."""
    if is_sharded(model):
        model = plain_copy(model, compute_dtype(model))
    if rank() == 0:
        model.save_pretrained(path)


def _sharded(run) -> dict:
    return {name: (model, opt) for name, model, opt in (("actor", run.actor, run.actor_opt),
                                                      ("extractor", run.extractor, run.extractor_opt))
            if model is not None and is_sharded(model)}


def _state(model, opt) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict
    weights, optim = get_state_dict(model, [opt] if opt else [])
    return {"model": weights, "optim": optim} if opt else {"model": weights}


def save_sharded(run, path: str):
    """The weights and AdamW state of every sharded model of `run`, each rank writing its own shards."""
    import torch.distributed.checkpoint as dcp
    models = _sharded(run)
    if models:
        dcp.save({name: _state(model, opt) for name, (model, opt) in models.items()}, checkpoint_id=path)


def load_sharded(run, path: str):
    """The inverse of save_sharded, into freshly built (sharded) models and optimizers."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict
    models = _sharded(run)
    if not models:
        return
    state = {name: _state(model, opt) for name, (model, opt) in models.items()}
    dcp.load(state, storage_reader=_reader(path))
    for name, (model, opt) in models.items():
        set_state_dict(model, [opt] if opt else [], model_state_dict=state[name]["model"],
                       optim_state_dict=state[name].get("optim", {}))


# torch's FileSystemReader unpickles dcp/.metadata as it is: a planted file would run code on --resume. What
# torch writes there names only these classes, so nothing else is let through.
_METADATA_CLASSES = {("pathlib", n) for n in ("PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath")} | {
    ("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo")}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        import torch.distributed.checkpoint.metadata as meta
        if ((module, name) in _METADATA_CLASSES or (module == "torch" and isinstance(getattr(torch, name, None),
                                                                                     torch.dtype))
                or (module == meta.__name__ and getattr(getattr(meta, name, None), "__module__", "") == module)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it names {module}.{name}, which torch's checkpoint metadata never holds")


def read_dcp_metadata(path: str):
    """A dcp/.metadata file, unpickled with only the classes torch writes there allowed."""
    with open(path, "rb") as f:
        return _MetadataUnpickler(f).load()


def _reader(path: str):
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            metadata = read_dcp_metadata(self._get_metadata_path(kwargs.get("rank")))   # as torch's reader
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata
    return SafeReader(path)


# ---------------------------------------------------------------------------------------------------------
# Distillation while the actor trains

class Distillation:
    """`fn(run, *args)` (crl.distill) on the bank manager's thread (inline if the manager is synchronous),
    on a rollout copy of the extractor, while the caller goes on with the actor's update. `result()` waits
    for the operations, without applying them, and puts the trained extractor back. The copy is made here,
    on the calling thread: gathering a sharded model is a collective, which the threads of different ranks
    would not reach in the same order."""

    def __init__(self, run, fn, *args):
        self.run, self.trained = run, run.extractor
        run.extractor = rollout_copy(run.extractor)
        self.future = run.manager.submit(fn, run, *args)   # a job's error is re-raised by result()

    def result(self) -> list:
        try:
            return self.future.result()
        finally:
            self.run.extractor = self.trained


# ---------------------------------------------------------------------------------------------------------
# Random streams and the collectives crl needs (each a no-op in a single process)

def seeded_generator(device, *parts: int) -> torch.Generator:
    """A torch RNG on `device` determined by integers (seed, step, rank, purpose): a resumed run replays the
    same samples."""
    seed = int(np.random.SeedSequence(list(parts)).generate_state(1)[0])
    return torch.Generator(device=device).manual_seed(seed)


def cores_per_rank() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, cores // int(os.environ.get("LOCAL_WORLD_SIZE", 1)))


def world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if world() > 1 else 0


def gather_objects(obj) -> list:
    """Every rank's `obj`, in rank order, on every rank."""
    if world() == 1:
        return [obj]
    out = [None] * world()
    dist.all_gather_object(out, obj)
    return out


def _comm_device():
    """nccl reduces CUDA tensors only; gloo takes CPU tensors."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def all_reduce_sum(x: float) -> float:
    if world() == 1:
        return x
    t = torch.tensor([float(x)], dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t)
    return float(t.item())


def all_reduce_grads(model, bucket_numel: int = 1 << 25):
    """Sum gradients over ranks (the losses are already divided by global counts), a few flat buckets at a
    time so a large model makes few collective calls without doubling its gradient memory.

    By hand rather than with a DistributedDataParallel wrapper: ranks run different numbers of micro-batch
    backward passes (zero-advantage sequences are skipped, a rank may have none), which DDP's per-backward
    reduction cannot match across ranks, and the same model also generates through its KV cache, which a
    wrapper would have to be bypassed for. One reduction after the last backward needs neither."""
    if world() == 1:
        return
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    bucket = []
    for i, p in enumerate(params):   # same parameter order on every rank, so the buckets line up
        bucket.append(p.grad)
        last = i == len(params) - 1
        if last or sum(g.numel() for g in bucket) >= bucket_numel or params[i + 1].grad.dtype != p.grad.dtype:
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat)
            offset = 0
            for g in bucket:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
            bucket = []
