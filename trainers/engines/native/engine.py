"""The native engine's scheduler: rows in waves that fit in memory, each wave prefilled once (each
distinct prompt once: a group's responses share its keys and values) and decoded step by step,
finished rows leaving the batch (on CUDA: at fixed shapes, finished rows masked, the step a CUDA
graph, ``static.py``)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Hashable

import torch

from trainers.engines.base import ModelWeightsEngine
from trainers.common.progress import RowProgress, rows_bar
from trainers.engines.generation import (GenerationResult, StopStrings, check_decoding, cut_at_stop, encode_prompts,
                                         WaveRoom, result_of, stop_token_ids, wave_room)
from trainers.engines.native.model import Decoder, left_padded, shared_prefill, unsupported
from trainers.engines.native.rows import RowNoise
from trainers.engines.native.static import FixedShapes, bucket, graphs_wanted
from trainers.engines.options import EngineUnavailable
from trainers.engines.sampling import Sampler, row_seeds, row_uniforms
from trainers.es.noise import lowrank
from trainers.es.noise.adapters import AdapterPopulation, own_layers
from trainers.es.noise.members import BATCHED, AdapterMembers, FullRankMember, LowRankMembers, Perturbation


def cut_waves(order: list[int], keys: list[Hashable], room: WaveRoom,
              slots: Callable[[int], int] = lambda n: n) -> list[list[int]]:
    """``order`` cut into consecutive waves, each the longest run that fits ``room``: a wave of n
    rows holds ``slots(n)`` slots and prefills each distinct key (a prompt under one member) once,
    plus one empty row where its slots outnumber its rows. So a group of responses shares its
    prompt's prefill when the group fits, where one full row each would not. At least one row."""
    waves = []
    start = 0
    while start < len(order):
        size, seen = 1, set()
        for n, k in enumerate(order[start:], 1):
            seen.add(keys[k])
            if not room.fits(slots(n), len(seen)):
                break  # nor will any longer run: slots and keys only grow
            if room.fits(slots(n), len(seen) + (slots(n) > n)):
                size = n  # a bucket's empty rows can make n - 1 rows cost more than n
        waves.append(order[start:start + size])
        start += size
    return waves


class NativeEngine(ModelWeightsEngine):
    """``--engine native``: a decode loop over the model's own modules (Llama, SmolLM, Qwen2).

    ``compact``: finished rows leave the batch (off only in tests, to compare). ``fixed_shapes``:
    decode at fixed shapes instead (``static.py``: static buffers, batch-size buckets, finished
    rows masked), with the step captured as CUDA graphs (``graphs``). Both default to on for CUDA
    (measured 4.8x the eager loop on an H200; ``LLM_ENVS_CUDA_GRAPHS=0`` turns them off) and off on a
    CPU, where a step's kernels cost far more than their launches and finished rows leaving the
    batch saves work."""

    name = "native"
    schedules_rows = True
    shares_prompts = True

    def __init__(self, model, tokenizer, compute_dtype: torch.dtype | None = None, compact: bool = True,
                 fixed_shapes: bool | None = None, graphs: bool | None = None):
        why = unsupported(model)
        if why:
            raise EngineUnavailable(why)
        super().__init__(model, tokenizer, compute_dtype)
        # a PEFT model: the decoder runs its base model's modules (the LoRA layers' products read the
        # base weights) and adds the adapters per row (``rows.RowNoise``)
        self.decoder = Decoder(model.get_base_model() if hasattr(model, "peft_config") else model)
        self.stops = stop_token_ids(tokenizer, model)
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stops[0]
        self.compact = compact
        cuda = self.device.type == "cuda"
        fixed = cuda and graphs_wanted() if fixed_shapes is None else fixed_shapes
        graphs = fixed and cuda if graphs is None else graphs
        if graphs and not (fixed and cuda):
            raise ValueError("--engine native: CUDA graphs need the fixed-shape path on a CUDA device")
        self.static = FixedShapes(self.decoder, graphs) if fixed else None

    def generate(self, prompts, max_new_tokens=256, batch_size=32, temperature=0.0, top_p=1.0, top_k=0, seed=None,
                 num_return_sequences=1, progress=False, sort=True, min_new_tokens=0, on_progress=None,
                 perturbation: Perturbation | None = None, stop_strings=()) -> GenerationResult:
        check_decoding(prompts, max_new_tokens, batch_size, num_return_sequences, temperature, top_p)
        start = time.perf_counter()
        n = num_return_sequences
        rows = [ids for ids in encode_prompts(self.tokenizer, list(prompts)) for _ in range(n)]
        if not rows:
            return GenerationResult([], [], [], [], [], 0.0)
        members = None
        if isinstance(perturbation, BATCHED):
            per = perturbation.rows_per_member(len(rows))
            members = torch.arange(len(rows), device=self.device) // per
        elif perturbation is None and own_layers(self.model):  # a PEFT model: its adapter on every row
            members = torch.zeros(len(rows), dtype=torch.long, device=self.device)
        # Waves: as many rows as fit in memory, longest prompts together (little padding).
        longest = max(len(r) for r in rows)
        room = wave_room(self.model, longest + max_new_tokens)
        slots = (lambda n: n) if self.static is None else bucket  # waves of whole buckets there
        if self.static is not None:  # the buffers it holds count as free
            held = self.static.held_rows(longest + max_new_tokens, self.compute_dtype)
            room = dataclasses.replace(room, room=room.room + held * room.kept)
        order = sorted(range(len(rows)), key=lambda k: -len(rows[k])) if sort else list(range(len(rows)))
        member_of = None if members is None else members.tolist()
        keys = [(tuple(r), None if member_of is None else member_of[k]) for k, r in enumerate(rows)]
        waves = cut_waves(order, keys, room, slots)
        if member_of is not None:  # a wave's rows member by member (its padding is the same in any order): the
            waves = [sorted(w, key=member_of.__getitem__) for w in waves]  # by-member products view them in place
        sampler = Sampler(float(temperature), float(top_p), int(top_k))
        # One random stream per row, so a row's sample never depends on the wave it lands in.
        uniforms = row_uniforms(row_seeds(seed, len(rows)), max_new_tokens, len(rows), self.device) \
            if temperature > 0 else None
        strings = StopStrings(self.tokenizer, stop_strings)
        bar = rows_bar(len(rows), progress)
        tracker = RowProgress(bar, on_progress, len(rows), max_new_tokens)
        out: list[tuple[list[int], bool] | None] = [None] * len(rows)
        timings = []
        try:
            with self._perturbed(perturbation) as noise, self._autocast(), torch.inference_mode():
                for wave in waves:
                    t0 = time.perf_counter()
                    wave_members = None if members is None else members[torch.tensor(wave, device=self.device)]
                    wave_uniforms = None if uniforms is None else uniforms[torch.tensor(wave, device=self.device)]
                    args = ([rows[k] for k in wave], wave_members, noise, sampler, wave_uniforms, max_new_tokens,
                            min(min_new_tokens, max_new_tokens), tracker, strings)
                    generated = self._wave(*args) if self.static is None else \
                        self.static.wave(*args, pad=self.pad, stops=self.stops)
                    for k, ids in zip(wave, generated):
                        out[k] = cut_at_stop(ids, self.stops)
                    timings.append(time.perf_counter() - t0)
        finally:
            if bar is not None:
                bar.close()
            if self.static is not None and not self.static.graphs:
                self.static.release()  # kept across calls only for the graphs that read them
        return result_of(self.tokenizer, out, [len(r) for r in rows], time.perf_counter() - start, len(waves), timings,
                         strings)

    def _wave(self, rows: list[list[int]], members: torch.Tensor | None, noise: RowNoise | None, sample: Sampler,
              uniforms: torch.Tensor | None, max_new: int, min_new: int, tracker: RowProgress,
              strings: StopStrings) -> list[list[int]]:
        """Generate every row of one wave: one prefill of the left-padded prompts, then one decode
        step per token for the rows still live (``uniforms (rows, max_new)``: each row's random
        numbers when sampling); a row whose newest token completes one of ``strings`` leaves too.
        Returns each row's ``max_new`` slots of ids (what follows a stop token or string is left as
        it was: ``result_of`` drops it)."""
        dev, slots = self.device, len(rows)
        ids, valid = left_padded(rows, self.pad, dev)
        width = ids.shape[1]
        length = width + max_new
        cache, rope = self.decoder.cache(slots, length), self.decoder.rope(length)
        # Decode mask, additive: pad columns -inf, every later column open (every live row writes it).
        columns = torch.zeros(slots, length, dtype=cache.k.dtype, device=dev)
        columns[:, :width].masked_fill_(~valid, float("-inf"))
        logits = shared_prefill(self.decoder, ids, valid, rope, cache, members, noise, keep=True)

        stops = torch.tensor(self.stops, device=dev)
        slot_row = torch.arange(slots, device=dev)  # which row each live slot holds
        pos = valid.sum(-1)  # each row's next position
        generated = torch.full((slots, max_new), self.pad, dtype=torch.long, device=dev)
        live = slots
        tracker.batch(slots)
        for step in range(max_new):
            u = None if uniforms is None else uniforms[slot_row[:live], step]
            tok = sample(logits, u, stops if step < min_new else None)
            generated[slot_row[:live], step] = tok
            tracker.step(step + 1, live)
            if step == max_new - 1:
                break
            done = torch.isin(tok, stops)
            if strings:
                tails = generated[slot_row[:live], max(0, step + 1 - strings.window):step + 1].tolist()
                done |= torch.tensor([strings.hit(t) for t in tails], device=dev)
            if self.compact and bool(done.any()):
                keep = ~done
                live = int(keep.sum())
                if live == 0:
                    break
                holes = (~keep[:live]).nonzero().squeeze(1)  # finished slots among the first `live`
                movers = keep[live:].nonzero().squeeze(1) + live  # live slots beyond them
                cache.move(holes, movers, width + step)
                for t in (slot_row, pos, columns, tok):
                    t[holes] = t[movers]
                if members is not None:
                    members[holes] = members[movers]
                tok = tok[:live]
                if noise is not None:
                    noise.select(members[:live], keep=True)
            column = width + step
            logits = self.decoder.forward(tok[:, None], pos[:live, None], rope, cache, column,
                                          columns[:live, None, None, :column + 1], noise)
            pos[:live] += 1
        tracker.batch_done()
        return generated.tolist()

    def _autocast(self):
        """As the base class's, but with autocast's weight cache off when the step is a CUDA graph
        (capture-safe: each replay casts the weights itself, as ``torch.cuda.graph`` asks)."""
        if self.autocast and self.static is not None and self.static.graphs:
            return torch.autocast(self.device.type, dtype=self.compute_dtype, cache_enabled=False)
        return super()._autocast()

    def close(self) -> None:
        if self.static is not None:
            self.static.release()

    @contextlib.contextmanager
    def _perturbed(self, p: Perturbation | None):
        if p is None:
            own = own_layers(self.model)
            yield RowNoise(AdapterPopulation.own(own), self.decoder.layers, self.compute_dtype) if own else None
        elif isinstance(p, FullRankMember):
            with self.written_into_weights(p):
                yield None
        elif isinstance(p, LowRankMembers):
            pop = lowrank.Population(p.layers, p.seeds, p.signs, p.sigma, p.rank)
            yield RowNoise(pop, self.decoder.layers, self.compute_dtype)
        elif isinstance(p, AdapterMembers):
            pop = AdapterPopulation.of_members(p.params, p.layers, p.seeds, p.signs, p.sigma)
            yield RowNoise(pop, self.decoder.layers, self.compute_dtype)
        else:
            raise TypeError(f"unknown perturbation {type(p).__name__}")

