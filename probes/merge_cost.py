"""What one merge pass costs at a bank's real size. Run:
python -m probes.merge_cost RUN_DIR [train.py flags: --actor smollm2 --extractor smollm2 ...]

The release consolidates each task's whole bank every merge: one extractor call per --merge-size entries,
in a chain (crl.merge_pass). This loads the last bank a run logged (RUN_DIR/bank.jsonl), builds the models
as train.py does from the flags given, times one pass over that bank, and prints the calls, the seconds and
what the pass did (lessons written, entries dropped that no written lesson stands for).
"""
import argparse
import json
import time

import crl
import train
from bank import Operation
from rundir import read_lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run", help="a run directory whose bank.jsonl holds the bank to merge (its last line)")
    mine, rest = p.parse_known_args(argv)
    args = train.parse_args([*rest, "--eval-every", "0"])
    device = train.setup_distributed(args)
    run, _ = train.build(args, device, train.model_dtype(args, device))
    *_, last = read_lines(f"{mine.run}/bank.jsonl")
    banks = json.loads(last)["bank"]
    for task, lessons in banks.items():
        texts = [text for text, *_ in lessons]
        keys = run.manager.embed(texts)
        run.manager.apply([Operation("add", task, t, key=k, source=-1) for t, k in zip(texts, keys)])
    before = {task: run.manager.bank.size(task) for task in banks}
    calls = sum(-(-n // run.cfg.merge_size) for n in before.values())
    run.timer, run.counters = {"extractor": 0.0}, {"parse_failures": 0, "merges": 0, "discards": 0}
    rng = crl.seeded_generator(device, args.seed, 0, 0, crl.EXTRACTOR_SAMPLING)
    t0 = time.perf_counter()
    crl.apply_everywhere(run, crl.merge_pass(run, 0, rng))
    seconds = time.perf_counter() - t0
    after = {task: run.manager.bank.size(task) for task in banks}
    print(f"merge pass over {before} entries ({args.extractor} extractor, merge_size {run.cfg.merge_size}): "
          f"about {calls} chained calls, {seconds:.1f} s; "
          f"wrote {run.counters['merges']} lessons, dropped {run.counters['discards']} entries, parse failures "
          f"{run.counters['parse_failures']}; after: {after}")
    run.manager.close()


if __name__ == "__main__":
    main()
