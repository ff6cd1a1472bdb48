"""cudagraphs.py — decode steps replayed from captured CUDA graphs.

A decode step of a small model is a few hundred small kernels, each launched from Python, and on a GPU the
launches, not the arithmetic or the memory traffic, set its time. A CUDA graph records the step's kernels once
and replays them all with one launch.

`DecodeGraphs` serves one model.Session, whose `decode` calls `run` on CUDA:
  - one graph per batch-size bucket (1, 2, 4, 8, then every multiple of 16), captured the first time a batch
    of that size is fed; every batch size has a bucket, so no batch falls back to eager;
  - before each replay the batch's cache rows and tokens are copied into the bucket's fixed buffers; the rows
    past the batch point at the session's scratch row, a cache row no conversation owns whose length stays 0,
    so padding writes no live slot;
  - the graph stops at the final-norm hidden states: lm_head, the constraint masks and the seeded sampler run
    eagerly after the replay, so no random state is captured;
  - a graph holds the addresses and strides of the cache it was captured on: the Session drops the graphs
    when its cache grows (`clear`), and they are captured again on demand.
A replay's output buffer is overwritten by the next replay; `run` returns a view the caller uses at once.
A capture the driver refuses (an unsupported call inside the step, say) costs no run: `run` says so in one line
and decodes eagerly, and every Session made after it in this process decodes eagerly from the start.
"""
import sys
import threading

import torch


def default_on(device) -> bool:
    """Whether a Session replays graphs unless told: on CUDA, in the main thread only. The background
    distillation (another thread) decodes eagerly: once in about twenty runs of two threads capturing at the
    same time, a capture was invalidated."""
    return device.type == "cuda" and threading.current_thread() is threading.main_thread() and not capture_failed


capture_failed = False   # set by the first capture that raised: this process decodes eagerly from then on


def bucket(n: int) -> int:
    """The batch size a batch of n rows is padded to."""
    return next(b for b in (1, 2, 4, 8) if b >= n) if n <= 8 else -(-n // 16) * 16


class DecodeGraphs:
    def __init__(self, body, scratch_row: int):
        """body(rows [b] long, tokens [b] long) -> hidden states [b, hidden]: one eager decode step that writes
        each row's k/v into the cache; `scratch_row` is the cache row padding may write."""
        self.body, self.scratch = body, scratch_row
        self.graphs = {}      # bucket -> (graph, rows buffer, tokens buffer, hidden-state output)
        self.replays = 0
        self.eager = False    # a capture failed: every step runs `body` eagerly
        self.stream = None    # this object's own capture stream: two threads may capture at once

    def clear(self):
        self.graphs.clear()

    def run(self, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        global capture_failed
        n, size = len(rows), bucket(len(rows))
        if self.eager:
            return self.body(rows, tokens)
        if size not in self.graphs:
            try:
                self.graphs[size] = self.capture(size, rows.device)
            except RuntimeError as e:   # the warm-up and the capture write only the scratch row: nothing to undo
                if not capture_failed:
                    why = str(e).splitlines()[0] if str(e) else type(e).__name__
                    print(f"warning: a CUDA graph capture failed ({why}); decoding eagerly from here on",
                          file=sys.stderr)
                capture_failed = self.eager = True
                return self.body(rows, tokens)
        graph, rows_in, tokens_in, hidden = self.graphs[size]
        rows_in.fill_(self.scratch)
        rows_in[:n] = rows
        tokens_in[:n] = tokens   # padding keeps earlier tokens: any valid id will do for the scratch row
        graph.replay()
        self.replays += 1
        return hidden[:n]

    def capture(self, size: int, device):
        rows = torch.full((size,), self.scratch, dtype=torch.long, device=device)
        tokens = torch.zeros(size, dtype=torch.long, device=device)
        if self.stream is None:
            self.stream = torch.cuda.Stream(device)
        self.stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(self.stream):
            for _ in range(2):   # eager warm-up, only the scratch row written: Triton compiles, cuBLAS sets up
                self.body(rows, tokens)
        torch.cuda.current_stream(device).wait_stream(self.stream)
        graph = torch.cuda.CUDAGraph()
        # not the torch.cuda.graph context: it synchronises the device and empties the allocator's cache,
        # which would reach into another thread's capture; thread_local lets other threads run meanwhile
        with torch.cuda.stream(self.stream):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                hidden = self.body(rows, tokens)
            finally:
                graph.capture_end()
        return graph, rows, tokens, hidden
