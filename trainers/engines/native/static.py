"""The native engine's fixed-shape decode path (its default on CUDA), and the CUDA graphs over it.

On a GPU a decode step of a small model is bound by kernel launches: 24 layers x tens of small
kernels per token, each launched from Python, cost far more than the step's own work (reading the
weights once). A CUDA graph replays a whole step's kernels at once, but only if every tensor the
step touches keeps its shape and its address from one step, and one call, to the next. So here:

- **Static buffers** (``Buffers``): the KV cache, the rotary tables, each slot's token, position,
  member and attention mask, and the column being written, allocated once and kept across calls;
  grown (and every graph dropped) only when a call needs more slots or columns.
- **Batch-size buckets** (``bucket``): a wave of n rows runs in the smallest bucket >= n (1, 2, 4,
  ..., 32, 48, 64, 96, 128, 192, 256, ...); the extra slots hold empty rows. The columns are
  bucketed too (multiples of ``LENGTH_STEP``): a step attends over all of them, those not written
  yet masked with -inf.
- **Finished rows are masked, not compacted**: they keep decoding in their slots and whatever they
  generate after their stop token is dropped (``cut_at_stop``), so no shape changes inside a wave.
  The host asks which rows are done only every ``SYNC_EVERY`` steps (to stop early and report
  progress), so the GPU never waits for it in between.
- **The step** (``FixedShapes._step``): the decoder's own forward pass on those buffers. Low-rank
  members' factors sit in one ``RowNoise`` kept across calls (each call's factors copied into it,
  ``RowNoise.take``), and each member's term ``s sigma (x B) A^T`` is still added to the layer's
  output, never folded into a weight.
- **Graphs** (``CapturedStep``): on CUDA, one ``torch.cuda.CUDAGraph`` per (slots, columns,
  members or not), captured at its first use and replayed after: a thin layer over the step, so
  the CPU tests run every line of this path but the capture. Dropped when the model's tensors move
  (the model moved, cast or reloaded), when the buffers grow, or when the members' layout changes
  (another population size or rank). If a capture fails, the engine warns once and decodes on
  without graphs (``failure`` says why). Under autocast (the RL policy: fp32 weights computing in
  bf16) autocast's weight cache is off (``NativeEngine._autocast``; a cached cast would be made
  inside one capture and freed after it), so each replay casts the weights it reads: more memory
  traffic than bf16 weights, still no launches. On CUDA this path is the default (measured on an
  H200: 4.8x the eager loop's tokens/s at 64 rows, 2.3x for a low-rank ES iteration;
  docs/benchmarks.md); ``LLM_ENVS_CUDA_GRAPHS=0`` turns it off.

Prefill stays eager (its shape follows the prompts): one SDPA pass over the left-padded prompts, each
distinct prompt once (``model.shared_prefill``). Sampling runs eagerly on each step's logits, one random stream per row as ever.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable

import torch

from trainers.common.progress import RowProgress
from trainers.engines.native.model import Decoder, left_padded, shared_prefill
from trainers.engines.generation import StopStrings
from trainers.engines.native.rows import RowNoise
from trainers.engines.sampling import Sampler

#: The cache's columns are allocated, and attended over, in multiples of this many.
LENGTH_STEP = 128
#: Steps between the host's looks at which rows are done (each look waits for the device).
SYNC_EVERY = 8
#: ``LLM_ENVS_CUDA_GRAPHS=1``: fixed shapes and graphs by default on CUDA. Off until the path has run
#: on a GPU (``benchmarks.gpu.speed`` turns it on for its own rows): an untried capture is not a default.
GRAPHS_ENV = "LLM_ENVS_CUDA_GRAPHS"


def bucket(rows: int) -> int:
    """The slot count a wave of ``rows`` rows runs at: powers of two up to 32, then 48, 64, 96,
    128, 192, 256, ... (at most a third of the slots padding above 32)."""
    b = 1
    while b < rows:
        b = b * 2 if b < 32 else b * 3 // 2 if b & (b - 1) == 0 else b * 4 // 3
    return b


def columns_for(tokens: int) -> int:
    """The cache columns a wave of ``tokens`` (prompt width + new tokens) runs with."""
    return -(-tokens // LENGTH_STEP) * LENGTH_STEP


def graphs_wanted() -> bool:
    """Whether CUDA decodes at fixed shapes with graphs (the default; ``LLM_ENVS_CUDA_GRAPHS=0``: no)."""
    return os.environ.get(GRAPHS_ENV, "1").strip() != "0"


class Buffers:
    """Everything a captured step reads or writes, allocated once for ``slots`` x ``length``."""

    def __init__(self, decoder: Decoder, slots: int, length: int):
        self.slots, self.length = slots, length
        self.cache = decoder.cache(slots, length)
        self.rope = decoder.rope(length)
        dev, dtype = self.cache.k.device, self.cache.k.dtype
        self.tok, self.pos, self.members = (torch.zeros(slots, dtype=torch.long, device=dev) for _ in range(3))
        self.column = torch.zeros(1, dtype=torch.long, device=dev)
        self.mask = torch.zeros(slots, length, dtype=dtype, device=dev)  # additive: 0 or -inf

    def holds(self, slots: int, length: int, dtype: torch.dtype) -> bool:
        return slots <= self.slots and length <= self.length and dtype == self.cache.k.dtype


class CapturedStep:
    """``step`` captured as one CUDA graph: a call replays it and returns the same logits tensor
    each time (overwritten in place). ``step`` must be idempotent (it is: it writes the cache column
    its inputs name), since the warm-up runs it before the capture."""

    def __init__(self, step: Callable[[], torch.Tensor], warmup: int = 2):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # cuBLAS handles and workspaces exist before the capture
            for _ in range(warmup):
                step()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: another thread of the trainer (a progress bar, a scorer) may touch CUDA meanwhile
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            self.logits = step()

    def __call__(self) -> torch.Tensor:
        self.graph.replay()
        return self.logits


class FixedShapes:
    """The fixed-shape waves of one engine, with what they keep across calls (buffers, the members'
    factors, the captured graphs). ``graphs``: capture the step on CUDA."""

    def __init__(self, decoder: Decoder, graphs: bool):
        self.decoder, self.graphs = decoder, graphs
        self.buffers: Buffers | None = None
        self.noise: RowNoise | None = None
        self.captured: dict[tuple, CapturedStep] = {}
        self.tensors: tuple = ()  # where the model's tensors were when the graphs were captured
        self.failure: str | None = None  # why capturing failed, if it did (graphs are then off)

    def held_rows(self, tokens: int, dtype: torch.dtype) -> int:
        """Rows the held buffers give a wave of ``tokens`` per row computing in ``dtype`` without
        allocating (for the wave cap)."""
        b = self.buffers
        return b.slots if b is not None and b.holds(1, columns_for(tokens), dtype) else 0

    def release(self) -> None:
        self.buffers, self.noise, self.captured, self.tensors = None, None, {}, ()

    def _prepare(self, slots: int, length: int) -> Buffers:
        """The buffers for this wave; everything dropped if the model's tensors moved since."""
        where = tuple(t.data_ptr() for t in (*self.decoder.model.parameters(), *self.decoder.model.buffers()))
        if where != self.tensors:
            self.release()
            self.tensors = where
        dtype = self.decoder._dtype()
        if self.buffers is None or not self.buffers.holds(slots, length, dtype):
            old = self.buffers
            if old is not None and old.cache.k.dtype == dtype:  # grow to hold both calls' shapes
                slots, length = max(slots, old.slots), max(length, old.length)
            self.buffers, self.captured, old = None, {}, None  # freed before the larger ones are allocated
            self.buffers = Buffers(self.decoder, slots, length)
        return self.buffers

    def _members(self, noise: RowNoise) -> RowNoise:
        """The kept ``RowNoise`` holding ``noise``'s factors (a new one, graphs with members dropped,
        when the layout changed)."""
        if self.noise is None or not self.noise.take(noise):
            self.noise = noise
            self.captured = {k: g for k, g in self.captured.items() if not k[2]}
        return self.noise

    def _step(self, slots: int, length: int, noise: RowNoise | None) -> Callable[[], torch.Tensor]:
        """One decode step over the buffers' first ``slots`` slots and ``length`` columns: logits
        of ``tok`` at ``pos``, its keys and values written at ``column``."""
        b = self.buffers
        tok, pos, mask = b.tok[:slots, None], b.pos[:slots, None], b.mask[:slots, None, None, :length]

        def step() -> torch.Tensor:
            return self.decoder.forward(tok, pos, b.rope, b.cache, b.column, mask, noise)

        if not self.graphs:
            return step
        key = (slots, length, noise is not None)

        def replay() -> torch.Tensor:  # captured at the first call, once this step's inputs are in place
            if key not in self.captured:
                try:
                    self.captured[key] = CapturedStep(step)
                except RuntimeError as exc:  # a kernel that cannot be captured: decode on, without graphs
                    self.graphs, self.failure = False, f"{type(exc).__name__}: {str(exc).strip()[:200]}"
                    warnings.warn(f"--engine native: capturing the decode step as a CUDA graph failed "
                                  f"({self.failure}); decoding without graphs ({GRAPHS_ENV}=0 skips the attempt)")
                    return step()
            return self.captured[key]()

        return replay

    def wave(self, rows: list[list[int]], members: torch.Tensor | None, noise: RowNoise | None, sample: Sampler,
             uniforms: torch.Tensor | None, max_new: int, min_new: int, tracker: RowProgress, strings: StopStrings,
             pad: int, stops: list[int]) -> list[list[int]]:
        """As ``NativeEngine._wave``, at fixed shapes: the rows in ``bucket(len(rows))`` slots, every
        slot decoding every step until all real rows are done (stop strings are looked for at the
        host's looks, every ``SYNC_EVERY`` steps, over the tokens since the last)."""
        n, slots = len(rows), bucket(len(rows))
        ids, valid = left_padded(rows + [[]] * (slots - n), pad, self.decoder.head.weight.device)
        width = ids.shape[1]
        length = columns_for(width + max_new)
        b = self._prepare(slots, length)
        dev = b.tok.device
        if noise is not None:
            noise = self._members(noise)
            b.members[:n] = members
            b.members[n:slots] = 0  # padding slots: any member
        logits = shared_prefill(self.decoder, ids, valid, b.rope, b.cache, None if noise is None else b.members[:slots],
                                noise)
        mask = b.mask[:slots, :length]
        mask.fill_(float("-inf"))
        mask[:, :width].masked_fill_(valid, 0.0)
        b.pos[:slots] = valid.sum(-1)
        if uniforms is not None:
            uniforms = torch.cat([uniforms, uniforms.new_zeros(slots - n, max_new)])
        stop_ids = torch.tensor(stops, device=dev)
        done = torch.arange(slots, device=dev) >= n  # padding slots count as done
        generated = torch.full((slots, max_new), pad, dtype=torch.long, device=dev)
        step_fn = self._step(slots, length, noise)
        tracker.batch(n)
        for step in range(max_new):
            tok = sample(logits, None if uniforms is None else uniforms[:, step], stop_ids if step < min_new else None)
            generated[:, step] = tok
            if step == max_new - 1:
                break
            done |= torch.isin(tok, stop_ids)
            if (step + 1) % SYNC_EVERY == 0:
                if strings:
                    tails = generated[:n, max(0, step + 1 - strings.window - SYNC_EVERY):step + 1].tolist()
                    done[:n] |= torch.tensor([strings.hit(t, SYNC_EVERY) for t in tails], device=dev)
                live = n - int(done[:n].sum())
                tracker.step(step + 1, live)
                if live == 0:
                    break
            column = width + step
            mask[:, column] = 0.0
            b.column.fill_(column)
            b.tok[:slots] = tok
            logits = step_fn()
            b.pos[:slots] += 1
        tracker.batch_done()
        return generated[:n].tolist()
