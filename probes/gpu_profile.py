"""Where a GPU's time goes: the training step and the decode step of a Qwen2.5-0.5B-shaped random checkpoint
(bench.py's), kernel by kernel, and whether two threads decoding at once disturb a graph capture.

    python -m probes.gpu_profile                   on CUDA: the three parts below
    python -m probes.gpu_profile --device cpu --small   the same code on a tiny shape (a smoke test)

1. training: token_logprobs forward + backward on 8 x 1024 tokens (the median of 5), its MFU against a large
   bf16 matmul (bench.py's definitions), the body alone, and the step's 14 costliest kernels;
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


def timed(model, fn, sync, reps=5) -> float:
    """Median seconds of fn(), gradients cleared before each call."""
    fn()
    times = []
    for _ in range(reps):
        model.zero_grad(set_to_none=True)
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


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


def training(model, a, dev, sync):
    tokens, mask = bench._train_batch(model.config.vocab_size, a.batch, a.seq, dev)
    peak, flops = bench._matmul_flops(a.matmul, dev), bench._train_flops(model, mask)
    step = lambda: token_logprobs(model, tokens, mask).sum().backward()   # noqa: E731
    body = lambda: model(tokens, hidden_only=True).float().pow(2).mean().backward()   # noqa: E731
    print(f"training, {a.batch} x {a.seq} tokens: model FLOPs {flops / 1e12:.3g} T a step, matmul peak "
          f"{peak / 1e12:.4g} TFLOP/s")
    for name, fn in (("token_logprobs forward + backward", step), ("the body alone (no lm_head)", body)):
        t = timed(model, fn, sync)
        print(f"  {name:36s} {t * 1e3:9.2f} ms   MFU {100 * flops / t / peak:5.1f}%")
    model.zero_grad(set_to_none=True)
    kernels(step, dev.type == "cuda", 14)


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
                        generate(model, jobs[i], 24, temperature=1.0, seed=i, rows=list(range(6)),
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
