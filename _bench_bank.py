"""Benchmark of bank.py, to be merged into bench.py as `python bench.py bank`.

1. Search latency for a batch of 32 queries against 1k / 20k / 100k entries x 384-d (one task), p50/p99,
   beside a plain numpy brute force (matmul + argpartition + sort) timed in the same run on the same keys.
2. The overhead a background writer adds to concurrent searches: reader threads searching the 20k bank,
   alone and then while the manager's background thread applies extractor-sized operation lists.
"""
import argparse
import threading
import time

import numpy as np
import torch

from bank import ExperienceBank, ExperienceManager, Operation


def _pct(ts):
    ts = np.asarray(ts) * 1e3
    return float(np.percentile(ts, 50)), float(np.percentile(ts, 99))


def _timed(fn, reps, warmup=3):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return _pct(ts)


def _filled(n, d, rng):
    keys = rng.standard_normal((n, d)).astype(np.float32)
    keys /= np.linalg.norm(keys, axis=1, keepdims=True)
    bank = ExperienceBank(d, capacity=max(n, 20000))
    kt = torch.from_numpy(keys)
    for i in range(n):
        bank.add("room", f"lesson {i}", kt[i], source=i // 3, step=0)
    return bank, keys


def bench_search(sizes, d=384, nq=32, k=1, reps=100):
    rng = np.random.default_rng(0)
    print(f"search: {nq} queries x {d}-d, top-{k} after the diversity re-rank (bank scan dtype: "
          f"{ExperienceBank(d).scan_dtype or torch.float32}, torch threads {torch.get_num_threads()})")
    print(f"{'entries':>8} {'bank p50':>9} {'p99':>7} {'numpy p50':>10} {'p99':>7} {'numpy/bank':>11}")
    for n in sizes:
        bank, keys = _filled(n, d, rng)
        q = rng.standard_normal((nq, d)).astype(np.float32)
        q /= np.linalg.norm(q, axis=1, keepdims=True)
        qt = torch.from_numpy(q)
        c = min(n, 16)

        def brute():  # the plain reference: exact scores, top-16 candidates per query, sorted
            s = q @ keys.T
            idx = np.argpartition(-s, c - 1, axis=1)[:, :c]
            return np.take_along_axis(idx, np.argsort(-np.take_along_axis(s, idx, 1), axis=1), 1)
        reps_n = reps if n <= 20000 else reps // 4
        ours = _timed(lambda: bank.search("room", qt, k), reps_n)
        ref = _timed(brute, reps_n)
        print(f"{n:>8} {ours[0]:>7.2f}ms {ours[1]:>5.2f}ms {ref[0]:>8.2f}ms {ref[1]:>5.2f}ms "
              f"{ref[0] / ours[0]:>10.2f}x")


class _NoEmbed:
    """The writer's keys are precomputed; this bench measures the bank, not the embedder."""
    dim = 384

    def __call__(self, texts):
        raise RuntimeError("not used")


def bench_writer_overhead(n=20000, d=384, readers=2, seconds=2.0, ops_per_job=3):
    rng = np.random.default_rng(1)
    bank, keys = _filled(n, d, rng)
    pool = torch.from_numpy(keys[:512].copy())
    q = torch.from_numpy(keys[512:544].copy())

    def run_readers(stop):
        lat, threads = [], []

        def reader():
            mine = []
            while not stop.is_set():
                t0 = time.perf_counter()
                bank.search("room", q, 1)
                mine.append(time.perf_counter() - t0)
            lat.extend(mine)
        threads = [threading.Thread(target=reader) for _ in range(readers)]
        for t in threads:
            t.start()
        return threads, lat

    stop = threading.Event()
    threads, alone = run_readers(stop)
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()

    mgr = ExperienceManager(bank, _NoEmbed())
    stop, applied = threading.Event(), [0]
    threads, with_writer = run_readers(stop)
    t_end = time.perf_counter() + seconds
    i = 0

    def job(i):  # what one distillation produces: a few adds and a merge of recent entries
        ops = [Operation("add", "room", f"new {i}.{j}", key=pool[(i + j) % 512], source=i, step=i)
               for j in range(ops_per_job - 1)]
        ops.append(Operation("update", "room", f"merged {i}", ids=(n + 2 * i - 2, n + 2 * i - 1),
                             key=pool[i % 512], source=i, step=i))
        applied[0] += len(ops)
        return ops
    while time.perf_counter() < t_end:
        mgr.submit(job, i)
        i += 1
        time.sleep(0.001)   # ~1000 distillations/s: far more than an extractor produces
    mgr.flush()
    stop.set()
    for t in threads:
        t.join()
    mgr.close()
    a, w = _pct(alone), _pct(with_writer)
    print(f"writer overhead: {readers} reader threads, {n} entries, 32 queries per search")
    print(f"  searches alone:            p50 {a[0]:.2f}ms  p99 {a[1]:.2f}ms  ({len(alone) / seconds:.0f}/s)")
    print(f"  with background writer:    p50 {w[0]:.2f}ms  p99 {w[1]:.2f}ms  ({len(with_writer) / seconds:.0f}/s), "
          f"{applied[0] / seconds:.0f} ops/s applied")
    print(f"  overhead: p50 x{w[0] / a[0]:.2f}, p99 x{w[1] / a[1]:.2f}")


def main(argv=None):
    p = argparse.ArgumentParser(prog="bench.py bank", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1000,20000,100000", help="comma-separated bank sizes")
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--seconds", type=float, default=2.0, help="duration of each writer-overhead phase")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: leave as is)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    bench_search([int(s) for s in args.sizes.split(",")], reps=args.reps)
    bench_writer_overhead(seconds=args.seconds)


if __name__ == "__main__":
    main()
