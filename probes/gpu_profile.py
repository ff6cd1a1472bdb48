"""Where a GPU's time goes: the training step and the decode step of a Qwen2.5-0.5B-shaped random checkpoint
(bench.py's), kernel by kernel, and whether two threads decoding at once disturb a graph capture.

    python -m probes.gpu_profile                   on CUDA: the three parts below
    python -m probes.gpu_profile --device cpu --small   the same code on a tiny shape (a smoke test)

1. training: token_logprobs forward + backward on bench.py's seeded 8 x 1024 batch, and the body alone (no
   lm_head): each one's MFU from its own model FLOPs (bench.py's definitions) over its median and best of 5
   runs, against the datasheet's dense bf16 peak (bench.DATASHEET_BF16) and a measured 8192^3 bf16 matmul;
   positions/s and real (unpadded) tokens/s; the step's 14 costliest kernels;
2. decoding at batch 32: Session.decode a step with and without decode graphs, and the kernels of an eager step
   with their summed time (a graph replays the same kernels, so that sum is its floor);
3. threads: 8 trials of two threads generating at once (3 fresh sessions each), the main thread capturing
   graphs, the other eager (the default off the main thread) and then capturing too; failed trials counted.
"""
import argparse
import tempfile
import threading
import time

import torch
from torch.profiler import ProfilerActivity, profile

import bench
from model import Session, Transformer, generate, token_logprobs
from sampling import Sampling


def timed(model, fn, sync, reps=5) -> list:
    """Seconds of `reps` calls of fn() after an untimed one, gradients cleared before each call; sorted."""
    fn()
    times = []
    for _ in range(reps):
        model.zero_grad(set_to_none=True)
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return sorted(times)


def kernels(fn, cuda: bool, rows: int, steps=1):
    """The costliest kernels (ops on CPU) of `steps` calls of fn, and their summed time a call in ms."""
    activity = ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU
    with profile(activities=[activity]) as prof:
        for _ in range(steps):
            fn()
        if cuda:
            torch.cuda.synchronize()
    events = prof.key_averages()
    attr = "self_device_time_total" if cuda else "self_cpu_time_total"
    total = sum(getattr(e, attr) for e in events) / steps / 1e3
    print(events.table(sort_by=attr, row_limit=rows, max_name_column_width=60))
    return total


def training(model, a, dev, sync) -> dict:
    """Times the whole step and the body alone; each one's MFU is the FLOPs of what was timed (the body: no
    lm_head FLOPs) over its time, median and best of 5, against the datasheet's peak and the measured matmul.
    Returns {part: bench._train_figures(...) and its "flops"}."""
    tokens, mask = bench._train_batch(model.config.vocab_size, a.batch, a.seq, dev)
    body, head = bench._train_flops_parts(model, mask)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    peaks = {"datasheet": bench._datasheet_peak(name), "matmul": bench._matmul_flops(a.matmul, dev)}
    real, sheet = bench._real_tokens(tokens), peaks["datasheet"]
    print(f"training, {a.batch} x {a.seq} positions ({real} real tokens, {int(mask[:, 1:].sum())} scored): model "
          f"FLOPs {(body + head) / 1e12:.4g} T a step ({body / 1e12:.4g} T the blocks, {head / 1e12:.4g} T lm_head); "
          "peaks: datasheet dense bf16 " + (f"{sheet / 1e12:.4g} TFLOP/s ({name})" if sheet else f"unknown ({name})")
          + f", measured {a.matmul}^3 bf16 matmul {peaks['matmul'] / 1e12:.4g} TFLOP/s")
    step = lambda: token_logprobs(model, tokens, mask).sum().backward()   # noqa: E731
    body_only = lambda: model(tokens, hidden_only=True).float().pow(2).mean().backward()   # noqa: E731
    pct = lambda v: "-" if v is None else f"{v:.1f}%"   # noqa: E731
    out = {}
    for part, fn, flops in (("token_logprobs forward + backward", step, body + head),
                            ("the body alone (no lm_head)", body_only, body)):
        r = out[part] = {"flops": flops, **bench._train_figures(flops, timed(model, fn, sync), tokens.numel(), real,
                                                                 peaks)}
        print(f"  {part:36s} median {r['median s'] * 1e3:9.2f} ms (best {r['best s'] * 1e3:.2f}, worst "
              f"{r['worst s'] * 1e3:.2f}, {r['repeats']} runs)   MFU median / best: "
              f"{pct(r['MFU % datasheet median'])} / {pct(r['MFU % datasheet best'])} of the datasheet, "
              f"{pct(r['MFU % matmul median'])} / {pct(r['MFU % matmul best'])} of the matmul; "
              f"{r['positions/s']:.4g} positions/s, {r['real tokens/s']:.4g} real tokens/s at the median")
    model.zero_grad(set_to_none=True)
    kernels(step, dev.type == "cuda", 14)
    return out


def decoding(model, a, dev, sync):
    prompts = torch.randint(1, model.config.vocab_size, (a.rows, a.prompt)).tolist()
    rows, tok = torch.arange(a.rows, device=dev), torch.ones(a.rows, dtype=torch.long, device=dev)
    for graphs in (False, True) if dev.type == "cuda" else (False,):
        s = Session(model, a.rows, a.prompt + 100, graphs=graphs)
        generate(model, prompts, 4, seed=0, session=s, rows=list(range(a.rows)))
        s.decode(rows, tok)
        sync()
        t = time.perf_counter()
        for _ in range(50):
            s.decode(rows, tok)
        sync()
        print(f"decoding, batch {a.rows}: Session.decode with graphs={graphs} {(time.perf_counter() - t) / 50 * 1e3:.3f}"
              f" ms a step (lm_head included, no sampling)")
        if not graphs:
            with torch.no_grad():
                total = kernels(lambda: s._decode_hidden(rows, tok), dev.type == "cuda", 12, steps=10)
            print(f"  an eager step's kernels: {total:.3f} ms ({len(model.layers)} layers)")


def threads(model, a, dev):
    jobs = [torch.randint(1, model.config.vocab_size, (6, 12), generator=torch.Generator().manual_seed(s)).tolist()
            for s in (7, 8)]
    for other in ("eager", "capturing"):
        failed = 0
        for _ in range(a.trials):
            errors = []

            def work(i, graphs):
                try:
                    for _ in range(3):
                        generate(model, jobs[i], 24, Sampling(1.0), seed=i, rows=list(range(6)),
                                 session=Session(model, 6, 64, graphs=graphs))
                except Exception as e:   # a failed capture raises here: counted, and shown once
                    errors.append(repr(e)[:100])
            beside = threading.Thread(target=work, args=(1, other == "capturing" and dev.type == "cuda"))
            beside.start()
            work(0, dev.type == "cuda")
            beside.join()
            failed += bool(errors)
            if errors:
                print(f"  {errors[0]}")
        print(f"threads: the other thread {other}: {failed} of {a.trials} trials failed")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--small", action="store_true", help="bench.py's tiny shape and sizes (a CPU smoke test)")
    p.add_argument("--trials", type=int, default=8)
    a = p.parse_args(argv)
    dev = torch.device(a.device)
    shape = bench.SMALL if a.small else bench.QWEN25_05B
    a.batch, a.seq, a.matmul, a.rows, a.prompt = (2, 64, 256, 4, 16) if a.small else (8, 1024, 8192, 32, 128)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    with tempfile.TemporaryDirectory() as path:
        bench._random_checkpoint(shape, path)
        model = Transformer.from_pretrained(path, dtype=torch.bfloat16, device=dev)
    training(model, a, dev, sync)
    decoding(model, a, dev, sync)
    threads(model.requires_grad_(False), a, dev)


if __name__ == "__main__":
    main()
