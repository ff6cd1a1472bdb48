"""parallel.py: fp32 masters with bf16 compute, FSDP2 under torchrun (2 ranks, gloo) against the single-process
update, generation on the gathered copy, the HF export read by transformers, an exact DCP resume, train.py
end to end with --fsdp and --resume, and background distillation under DDP. Each torchrun launch runs many
checks (tests/parallel_worker.py); a module fixture launches it once for the tests that read its results."""
import json
import os
import threading
from types import SimpleNamespace

import pytest
import torch

import crl
import parallel
from model import generate, rope_inv_freq, token_logprobs
from test_train import FAST, _torchrun, bound_loss, fixed_segments, read_metrics, single_process_update, strip_times
from small.tiny import tiny_model
from update import backward_micro_batches, micro_batches, pad_segments

WORKER = "parallel_worker.py"


def adamw_delta(model, lr=1e-6) -> torch.Tensor:
    """All weights' change in one AdamW step on the fixed episodes, flattened."""
    before = torch.cat([p.detach().float().flatten() for p in model.parameters()])
    segs, advs = fixed_segments(tiny_model(seed=0))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    crl.policy_update(crl.Update(model, opt, *bound_loss("grpo"), micro_batch=2), segs, advs)
    return torch.cat([p.detach().float().flatten() for p in model.parameters()]) - before


def moves_like(delta, ref) -> tuple[float, float, float]:
    """Of the weights `ref` moved: the fraction `delta` moved, and moved the same way; mean |delta| / mean |ref|.
    (An Adam step is about lr * sign(grad), so bf16 noise flips the sign of the smallest gradients.)"""
    moved = ref != 0
    return ((delta != 0)[moved].float().mean().item(), (torch.sign(delta) == torch.sign(ref))[moved].float().mean().item(),
            (delta.abs().mean() / ref.abs().mean()).item())


def test_fp32_masters_with_bf16_compute_update_like_fp32():
    """At lr 1e-6 an AdamW step on fp32 masters computed in bf16 (autocast) moves the weights as the fp32 step
    does; on bf16 weights almost every step is below half a bf16 ulp and vanishes."""
    ref = adamw_delta(tiny_model(seed=0))
    mixed = parallel.prepare(tiny_model(seed=0), torch.device("cpu"), torch.bfloat16)
    frac, same_sign, ratio = moves_like(adamw_delta(mixed), ref)
    assert all(p.dtype == torch.float32 for p in mixed.parameters())
    assert frac > 0.99 and same_sign > 0.8 and 0.9 < ratio < 1.1, (frac, same_sign, ratio)
    frac, _, ratio = moves_like(adamw_delta(tiny_model(seed=0).to(torch.bfloat16)), ref)
    assert frac < 0.1 and ratio < 0.1, (frac, ratio)   # measured: 0.012 and 0.017
    # rollouts run on a bf16 copy, equal to the model cast to bf16
    copy, cast = parallel.rollout_copy(mixed), tiny_model(seed=0)
    cast.load_state_dict(mixed.state_dict())
    cast = cast.to(torch.bfloat16)
    cast.inv_freq = rope_inv_freq(cast.config)   # rotary frequencies stay fp32, as in a loaded checkpoint
    assert copy.dtype == torch.bfloat16 and not any(p.requires_grad for p in copy.parameters())
    a, b = (generate(m, [[1, 2, 3]], 6, generator=torch.Generator().manual_seed(0)) for m in (copy, cast))
    assert a[0].tokens == b[0].tokens and a[0].logprobs == b[0].logprobs


def test_bf16_update_gradients_equal_the_plain_autocast_recipe():
    """The update keeps one autocast context for all its micro-batches (each weight cast to bf16 once a step) and
    leaves it for the loss and the backward: its gradients are exactly torch's plain recipe, a forward under
    autocast and the loss and backward outside it, micro-batch by micro-batch."""
    model = parallel.prepare(tiny_model(seed=0), torch.device("cpu"), torch.bfloat16)
    segs, advs = fixed_segments(tiny_model(seed=0))
    loss_fn, clip = bound_loss("grpo")
    denoms = dict(num_seqs=float(len(segs)))
    backward_micro_batches(crl.Update(model, None, loss_fn, clip, micro_batch=2), segs, advs, [1] * len(segs), denoms)
    ours = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    for idx in micro_batches([len(s.tokens) for s in segs], 2, None):
        tokens, mask, old = pad_segments([segs[j] for j in idx], "cpu")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logp = token_logprobs(model, tokens, mask, allowed=[segs[j].allowed for j in idx])
        seq_tokens = torch.tensor([float(max(sum(segs[j].mask), 1)) for j in idx])
        loss_fn(logp, old, torch.tensor([advs[j] for j in idx]), mask, **denoms, seq_tokens=seq_tokens).backward()
    assert len(micro_batches([len(s.tokens) for s in segs], 2, None)) == 3
    assert all(torch.equal(a, p.grad) for a, p in zip(ours, model.parameters()))


@pytest.fixture(scope="module")
def units(tmp_path_factory):
    out = tmp_path_factory.mktemp("units")
    _torchrun("units", str(out), worker=WORKER)
    return out, torch.load(out / "units.pt", weights_only=True)


def assert_close(a: dict, b: dict, atol=1e-6):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=atol), (k, (a[k] - b[k]).abs().max())


@pytest.mark.parametrize("objective", ["grpo", "cispo"])
def test_fsdp_update_equals_single_process(units, objective):
    ref = single_process_update(objective).state_dict()
    start = tiny_model(seed=0).state_dict()
    assert any(not torch.equal(ref[k], start[k]) for k in ref)
    assert_close(units[1][objective], ref)


def test_fsdp_uneven_microbatches_after_divergent_generation(units):
    """Rank 0 ran 4 micro-batches, rank 1 two, after rank-divergent generate calls; blocks checkpointed."""
    assert_close(units[1]["uneven"], single_process_update("grpo").state_dict())


def test_generation_on_the_gathered_copy_equals_the_plain_model(units):
    samples = generate(tiny_model(seed=0), [[1, 5, 9, 14, 3], [2, 7], [4, 4, 8, 1, 1, 6, 2]], 8,
                       generator=torch.Generator().manual_seed(0))
    assert units[1]["samples"] == [(s.tokens, s.logprobs) for s in samples]


@pytest.mark.parametrize("tied", [False, True])
def test_hf_export_of_a_sharded_model_reopens_in_transformers(units, tied):
    from transformers import AutoModelForCausalLM
    out, res = units
    ours = tiny_model(seed=1, tie_word_embeddings=True) if tied else tiny_model(seed=0)
    if not tied:
        ours.load_state_dict(res["uneven"])
    hf = AutoModelForCausalLM.from_pretrained(out / ("hf_tied" if tied else "hf_untied"), dtype=torch.float32)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        assert torch.allclose(hf(ids).logits, ours(ids), atol=1e-5)
    assert hf.config.tie_word_embeddings == tied


def test_dcp_resume_is_exact(units):
    resumed, original = units[1]["dcp"][1], units[1]["dcp"][0]
    assert all(torch.equal(resumed[k], original[k]) for k in original)


def test_fsdp_bf16_compute_keeps_fp32_masters(units):
    res = units[1]
    assert res["mp_master_dtypes"] == ["torch.float32"]
    start = tiny_model(seed=0)
    delta = torch.cat([(res["mp"][k] - v).flatten() for k, v in start.state_dict().items()])
    frac, same_sign, ratio = moves_like(delta, adamw_delta(start))
    assert frac > 0.99 and same_sign > 0.8 and 0.9 < ratio < 1.1, (frac, same_sign, ratio)


@pytest.mark.parametrize("sync", [False, True])
def test_distillation_runs_on_the_bank_managers_thread(sync):
    """Distillation submits to the bank manager's one thread (inline with a synchronous manager); result()
    hands back what the job returned, or re-raises what it raised, and the next job still runs."""
    from bank import ExperienceBank, ExperienceManager
    with ExperienceManager(ExperienceBank(4), None, sync=sync) as manager:
        run = SimpleNamespace(extractor=None, manager=manager)

        def distil(got, step):
            assert got is run
            return [threading.current_thread().name, step]

        def broken(got, step):
            raise RuntimeError(f"extractor crashed at {step}")
        failed, later = parallel.Distillation(run, broken, 1), parallel.Distillation(run, distil, 2)
        with pytest.raises(RuntimeError, match="crashed at 1"):
            failed.result()
        assert later.result() == [threading.current_thread().name if sync else "bank-distill_0", 2]


def test_train_fsdp_resume_and_background_distillation(tmp_path):
    _torchrun("train", str(tmp_path), worker=WORKER)
    full, part = read_metrics(tmp_path / "full"), read_metrics(tmp_path / "part")
    assert [r["step"] for r in full] == [0, 1] and "actor/loss" in full[1]
    assert strip_times(full[1]) == strip_times(part[1])          # the DCP resume is exact
    res = [json.load(open(tmp_path / f"train{r}.json")) for r in (0, 1)]
    for r, mine in enumerate(res):                                # every rank gets its own generations back
        assert mine["saved_generations"] and all(g % 2 == r for g in mine["saved_generations"])
        assert mine["resumed_generations"] == mine["saved_generations"]
    assert res[0]["distill_threads"] == ["bank-distill_0"]        # distilled on the manager's one thread
    assert res[0]["async"][0] == res[1]["async"][0] and len(res[0]["async"][0]) > 0   # identical replicas
    a, b = read_metrics(tmp_path / "async"), read_metrics(tmp_path / "async2")
    assert [strip_times(r) for r in a] == [strip_times(r) for r in b]
    assert res[0]["async"][0] == res[0]["async"][1]


def test_fsdp_in_one_process(tmp_path):
    """--fsdp without torchrun (one GPU): a one-rank process group, sharded models, a DCP checkpoint; the
    group is the run's own, destroyed at its end."""
    import torch.distributed as dist
    import train
    out = str(tmp_path / "one")
    try:
        run = train.main(["--tasks", "room", "--iters", "1", "--out", out, "--fsdp", *FAST])
        assert parallel.is_sharded(run.actor) and parallel.is_sharded(run.extractor)
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert "actor/loss" in read_metrics(out)[0]
    assert os.path.isdir(os.path.join(out, "ckpt", "dcp")) and os.path.isdir(os.path.join(out, "ckpt", "actor"))
