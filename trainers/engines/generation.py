"""Batched chat generation: the hot path of every trainer and of the evaluation harness.

``generate(model, tokenizer, prompts, max_new_tokens)`` renders each prompt (a list of chat
messages) with the tokenizer's chat template, sorts the prompts by length, runs Hugging Face
``generate`` on left-padded batches (KV cache, ``torch.inference_mode``), stops each sequence at
its first stop token (EOS, ``<|im_end|>``, ...), and returns the completions in the original order.

**Stop strings** (``stop_strings``, an env's ``</answer>`` or ``</tool_call>``): a completion also
ends at the first of them it writes, and is its text up to and including it: the shortest run of
generated tokens whose text holds the string (the last token may carry a few characters past it:
the ids are what the model sampled, the text ends at the string). Every engine stops a row once
``StopStrings.hit`` sees one and cuts the same way (``result_of``), so all agree on the turn.

Measured on the 2-core CPU with SmolLM2-135M (fp32, ~115-token prompts, 64 new tokens): ~15
tokens/s at batch 1, ~58 at 8, ~114 at 32. A static KV cache, a hand-written decoding loop and
eager attention were no faster (eager is slower at batch 32), one thread is slower than two,
bf16 is much slower (no native bf16 on this CPU). Batching is the lever: pass as many sequences
per call as memory allows.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from llm_envs.templates import render_chat as render_prompt  # the one rule, shared with trainers.trl
from trainers.common.progress import RowProgress, rows_bar
from trainers.engines.prompt_cache import shared_prompt_cache
from trainers.engines.sampling import Sampler, Seeds, row_seeds, row_uniforms

Message = dict[str, str]


class TokenIds(tuple):
    """A prompt given as the token ids to feed the model, used as they are (a multi-turn episode's
    conversation so far: its earlier turns' exact sampled ids, never decoded and re-encoded)."""


Prompt = list[Message] | str | TokenIds

# End-of-turn tokens of common chat formats; a stop token when the tokenizer has it as a token.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "</s>")


@dataclass
class GenerationResult:
    """Completions in prompt order (prompt-major when ``num_return_sequences > 1``: the samples of
    prompt ``i`` are ``texts[i * n : (i + 1) * n]``)."""

    texts: list[str]  # completion only (never the prompt), special tokens skipped
    num_tokens: list[int]  # generated tokens per completion, up to and including the stop token
    finished: list[bool]  # True when it ended at a stop token, False when cut at max_new_tokens
    token_ids: list[list[int]]  # generated ids, up to and including the stop token
    prompt_tokens: list[int]  # prompt length in tokens (after the chat template)
    seconds: float  # wall time of the whole call
    batches: int = 0
    timings: list[float] = field(default_factory=list)  # seconds per batch

    @property
    def total_tokens(self) -> int:
        return sum(self.num_tokens)

    @property
    def tokens_per_second(self) -> float:
        return self.total_tokens / self.seconds if self.seconds > 0 else float("nan")


def encode_prompts(tokenizer, prompts: Sequence[Prompt]) -> list[list[int]]:
    """Token ids of each prompt as ``generate`` feeds them to the model (a chat template brings its
    own special tokens, so none are added to rendered chats; plain strings get the tokenizer's)."""
    ids = []
    for p in prompts:
        if isinstance(p, TokenIds):
            ids.append(list(p))
            continue
        text = render_prompt(tokenizer, p)
        ids.append(tokenizer(text, add_special_tokens=isinstance(p, str))["input_ids"])
    return ids


class StopStrings:
    """Strings that end a completion, for one tokenizer: ``hit`` (has a row's newest text written
    one? what engines stop rows on) and ``cut`` (the exact turn: ``result_of``'s rule)."""

    def __init__(self, tokenizer, strings: Sequence[str] = ()):
        if isinstance(strings, str) or not all(isinstance(x, str) and x for x in strings):
            raise ValueError(f"stop_strings must be a list of non-empty strings, got {strings!r:.80}")
        self.tokenizer, self.strings = tokenizer, tuple(strings)
        # Tokens to decode to see a string that the newest token completed: one per character at
        # worst, and a few for bytes of a character split over tokens.
        self.window = max((len(x) for x in self.strings), default=0) + 4

    def __bool__(self) -> bool:
        return bool(self.strings)

    def _text(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def _end(self, text: str) -> int | None:
        """Where the first stop string to be completed in ``text`` ends, or None."""
        ends = [k + len(x) for x in self.strings if (k := text.find(x)) >= 0]
        return min(ends) if ends else None

    def hit(self, ids: Sequence[int], new: int = 1) -> bool:
        """Whether one of the last ``new`` tokens of the generated ``ids`` completed a stop string
        (a string held earlier was seen then: only the tail is decoded)."""
        return bool(self.strings) and self._end(self._text(ids[-(self.window + new - 1):])) is not None

    def cut(self, ids: Sequence[int]) -> tuple[list[int], str] | None:
        """The shortest prefix of ``ids`` whose text holds a stop string, and that text ending at the
        string; None when the text holds none."""
        if not self.strings or self._end(self._text(ids)) is None:
            return None
        lo, hi = 1, len(ids)  # the smallest k whose prefix holds one: a prefix's text only grows
        while lo < hi:
            mid = (lo + hi) // 2
            if self._end(self._text(ids[:mid])) is None:
                lo = mid + 1
            else:
                hi = mid
        text = self._text(ids[:lo])
        return list(ids[:lo]), text[:self._end(text)]


def stop_token_ids(tokenizer, model=None) -> list[int]:
    """Ids that end a completion: the tokenizer's EOS, the model's generation-config EOS ids and any
    end-of-turn token of a common chat format that the vocabulary has as a special token."""
    ids: list[int] = []

    def add(i):
        if isinstance(i, int) and i >= 0 and i not in ids:
            ids.append(i)

    add(tokenizer.eos_token_id)
    gc = getattr(model, "generation_config", None)
    eos = getattr(gc, "eos_token_id", None)
    for i in (eos if isinstance(eos, (list, tuple)) else [eos]):
        add(i)
    special = set(getattr(tokenizer, "all_special_tokens", []) or [])
    added = getattr(tokenizer, "get_added_vocab", lambda: {})()
    for tok in END_OF_TURN_TOKENS:
        if tok in special or tok in added:
            add(tokenizer.convert_tokens_to_ids(tok))
    if not ids:
        raise ValueError("the tokenizer has no EOS token and the model's generation config names none; "
                         "set tokenizer.eos_token")
    return ids


def generate(
    model,
    tokenizer,
    prompts: Sequence[Prompt],
    max_new_tokens: int = 256,
    batch_size: int = 32,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: Seeds = None,
    num_return_sequences: int = 1,
    progress: bool | str = False,
    stop_ids: Sequence[int] | None = None,
    sort: bool = True,
    min_new_tokens: int = 0,
    on_progress: Callable[[float, int, float], None] | None = None,
    stop_strings: Sequence[str] = (),
    share_prompts: bool = False,
) -> GenerationResult:
    """Complete each chat prompt; greedy when ``temperature == 0``; a completion also ends at the
    first of ``stop_strings`` it writes (module docstring).

    ``prompts``: lists of chat messages (rendered with the chat template and the assistant
    generation prompt) or plain strings (used verbatim). ``batch_size``: sequences per forward
    pass. ``temperature > 0`` samples (with ``top_p``/``top_k`` filtering, ``top_k=0`` = off), one
    random stream per row (``sampling.py``): ``seed`` is one seed per row (prompt-major, samples of a
    prompt together) or one for the call, from which row k's is derived; a row's sample then
    depends on its seed and the model alone, not on ``batch_size`` or the other rows. Only the
    passed options apply: the model's own generation config (repetition penalty, default
    sampling, ...) is ignored, so results do not depend on the checkpoint's
    ``generation_config.json``.

    Greedy output is deterministic for a given call. Across different batch compositions (other
    padding) fp32 results agree up to float rounding, which can flip a near-tied argmax.

    ``share_prompts``: a batch's rows with the same prompt (a group's responses) have that prompt
    computed once (``prompt_cache.shared_prompt_cache``), as far as the model allows; only where
    every row sees the same weights (no hook giving each row its own, as a low-rank population).

    ``progress``: a tqdm bar of the sequences done (a string names it), moving with every decode
    step, so a long batch shows its pace and an ETA before it ends (an upper bound until then: it
    counts each row at the full ``max_new_tokens``). ``on_progress(done, total, seconds)`` is told
    the same count at every step.
    """
    check_decoding(prompts, max_new_tokens, batch_size, num_return_sequences, temperature, top_p)

    start = time.perf_counter()
    prompts = list(prompts)
    n = num_return_sequences
    if not prompts:
        return GenerationResult([], [], [], [], [], 0.0)

    prompt_ids = encode_prompts(tokenizer, prompts)
    stops = list(stop_ids) if stop_ids is not None else stop_token_ids(tokenizer, model)
    strings = StopStrings(tokenizer, stop_strings)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    device = _input_device(model)

    # Every (prompt, sample) is one sequence; longest first (similar lengths share a batch, so
    # little padding, and a too-large batch fails at once rather than at the end).
    seqs = [i for i in range(len(prompts)) for _ in range(n)]
    order = sorted(range(len(seqs)), key=lambda j: -len(prompt_ids[seqs[j]])) if sort else list(range(len(seqs)))
    results: list[tuple[list[int], bool] | None] = [None] * len(seqs)

    config = _generation_config(max_new_tokens, stops, pad_id,
                                getattr(getattr(model, "generation_config", None), "bos_token_id", None),
                                min(min_new_tokens, max_new_tokens))
    # HF decodes greedily over what RowSampling leaves: the token each row's own stream drew.
    sampler = Sampler(float(temperature), float(top_p), int(top_k)) if temperature > 0 else None
    uniforms = row_uniforms(row_seeds(seed, len(seqs)), max_new_tokens, len(seqs)) if sampler else None
    batches = [order[k:k + batch_size] for k in range(0, len(order), batch_size)]
    bar = rows_bar(len(seqs), progress)
    tracker = RowProgress(bar, on_progress, len(seqs), max_new_tokens) if bar is not None or on_progress else None
    timings = []
    was_training = model.training
    saved_config = getattr(model, "generation_config", None)
    try:
        model.eval()
        if saved_config is not None:  # so nothing of the checkpoint's own generation defaults leaks in
            model.generation_config = config
        with torch.inference_mode():
            for batch in batches:
                t0 = time.perf_counter()
                rows = [prompt_ids[seqs[j]] for j in batch]
                width = max(len(r) for r in rows)
                input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
                attention = torch.zeros((len(rows), width), dtype=torch.long)
                for r, ids in enumerate(rows):  # left padding
                    if ids:
                        input_ids[r, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
                        attention[r, width - len(ids):] = 1
                extra = {}
                if tracker is not None:
                    tracker.batch(len(rows), width)
                    extra = {"stopping_criteria": tracker.stopping_criteria()}
                if strings:
                    criteria = extra.setdefault("stopping_criteria", StringCriteria.list())
                    criteria.append(StringCriteria(strings, width))
                if sampler is not None:
                    extra["logits_processor"] = RowSampling(sampler, uniforms[batch], width).as_list()
                input_ids, attention = input_ids.to(device), attention.to(device)
                if share_prompts and (cache := shared_prompt_cache(model, input_ids, attention)) is not None:
                    extra["past_key_values"] = cache  # generate computes each row's last prompt token only
                out = model.generate(input_ids=input_ids, attention_mask=attention, generation_config=config, **extra)
                new = out[:, width:].tolist()
                for j, ids in zip(batch, new):
                    results[j] = cut_at_stop(ids, stops)
                timings.append(time.perf_counter() - t0)
                if tracker is not None:
                    tracker.batch_done()
    finally:
        if saved_config is not None:
            model.generation_config = saved_config
        if was_training:
            model.train()
        if bar is not None:
            bar.close()

    return result_of(tokenizer, results, [len(prompt_ids[i]) for i in seqs], time.perf_counter() - start,
                     len(batches), timings, strings)


def result_of(tokenizer, cut: Sequence[tuple[list[int], bool]], prompt_tokens: list[int], seconds: float,
              batches: int, timings: list[float], strings: StopStrings | None = None) -> GenerationResult:
    """The ``GenerationResult`` of completions already cut at their stop token (``cut_at_stop``),
    each cut again at its first stop string (``strings``; the string's turn is finished), decoded
    the same way by every engine."""
    texts, ids_out, finished = [], [], []
    for ids, done in cut:
        body = ids[:-1] if done else ids
        at_string = strings.cut(body) if strings else None
        if at_string is not None:  # a stop string before any stop token (or the budget) ends the turn
            ids, done, text = at_string[0], True, at_string[1]
        else:
            text = tokenizer.decode(body, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        texts.append(text)
        ids_out.append(ids)
        finished.append(done)
    return GenerationResult(texts=texts, num_tokens=[len(ids) for ids in ids_out], finished=finished,
                            token_ids=ids_out, prompt_tokens=prompt_tokens, seconds=seconds,
                            batches=batches, timings=timings)


def check_decoding(prompts, max_new_tokens: int, batch_size: int, num_return_sequences: int, temperature: float,
                   top_p: float) -> None:
    """Raise on decoding settings no engine can honour (every engine checks the same)."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if not isinstance(num_return_sequences, int) or num_return_sequences < 1:
        raise ValueError(f"num_return_sequences must be a positive integer, got {num_return_sequences!r}")
    if not (temperature >= 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be >= 0, got {temperature!r}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if isinstance(prompts, (str, dict)):
        raise TypeError("prompts must be a list of prompts (each a list of chat messages or a string)")


def cut_at_stop(ids: list[int], stops: Sequence[int]) -> tuple[list[int], bool]:
    """Generated ids up to and including the first stop token; whether there was one."""
    stop = set(stops)
    for k, t in enumerate(ids):
        if t in stop:
            return ids[:k + 1], True
    return ids, False


def _generation_config(max_new_tokens, stops, pad_id, bos_id, min_new_tokens=0):
    """Greedy decoding, with nothing of the model's own defaults: sampling, when asked for, is
    ``RowSampling``'s, applied last among the logits processors."""
    from transformers import GenerationConfig

    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        min_new_tokens=min_new_tokens or None,
        do_sample=False,
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        num_beams=1,
        num_return_sequences=1,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        eos_token_id=list(stops),
        pad_token_id=pad_id,
        bos_token_id=bos_id,
        use_cache=True,
        return_dict_in_generate=False,
    )


class StringCriteria:
    """HF ``generate``'s stopping criterion for stop strings: a row is done once its newest token
    completes one (``StopStrings.hit`` on its generated ids after the prompt's ``width``)."""

    def __init__(self, strings: StopStrings, width: int):
        self.strings, self.width = strings, width

    @staticmethod
    def list():
        from transformers import StoppingCriteriaList

        return StoppingCriteriaList()

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        rows = input_ids[:, self.width:][:, -self.strings.window:].tolist()
        return torch.tensor([self.strings.hit(r) for r in rows], dtype=torch.bool, device=input_ids.device)


class RowSampling:
    """A logits processor that samples each row's next token from its own stream (``Sampler`` over
    ``uniforms (rows, max_new)``) and leaves only that token possible, so HF's greedy step picks
    it. It runs after HF's own processors (``min_new_tokens``), as the native engine's sampler
    runs after its stop-token suppression."""

    def __init__(self, sampler: Sampler, uniforms: torch.Tensor, width: int):
        self.sampler, self.uniforms, self.width = sampler, uniforms, width

    def as_list(self):
        from transformers import LogitsProcessorList

        return LogitsProcessorList([self])

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = input_ids.shape[1] - self.width
        tokens = self.sampler(scores, self.uniforms[:, step])
        chosen = torch.full_like(scores, float("-inf"))
        return chosen.scatter_(1, tokens[:, None], 0.0)


def _input_device(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def free_memory(device: torch.device) -> int:
    """Bytes this process can still allocate on ``device`` (CUDA: free device memory; CPU: the
    kernel's MemAvailable, or 4 GiB where it cannot be read)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 << 30


@dataclass(frozen=True)
class WaveRoom:
    """What one wave of a ``generate`` call may hold: ``room`` bytes; each slot ``kept`` bytes for the
    whole wave (its KV cache and fp32 logits) and each row prefilled ``prefill`` bytes while its
    prompt is computed (the prefill MLP and attention scores). Rows that share a prompt, prefilled
    once (the native engine), cost ``kept`` each and one ``prefill`` between them."""

    room: float
    kept: float
    prefill: float

    def fits(self, slots: int, prefilled: int) -> bool:
        return slots * self.kept + prefilled * self.prefill <= self.room


def wave_room(model, tokens_per_row: int, budget: float = 0.5) -> WaveRoom:
    """``budget`` x the free memory, and what a sequence of ``tokens_per_row`` (prompt +
    completion) costs in it: an estimate from the model config, doubled for safety."""
    cfg = getattr(model, "config", None)
    get = lambda name, default: getattr(cfg, name, None) or default  # noqa: E731
    hidden = get("hidden_size", 1024)
    heads = get("num_attention_heads", 16)
    head_dim = get("head_dim", hidden // heads)
    kv_heads = get("num_key_value_heads", heads)
    elem = next(model.parameters()).element_size()
    kv = 2 * get("num_hidden_layers", 24) * kv_heads * head_dim * tokens_per_row * elem
    mlp = tokens_per_row * (4 * hidden + 3 * get("intermediate_size", 4 * hidden)) * elem
    scores = heads * tokens_per_row ** 2 * 4
    return WaveRoom(room=budget * free_memory(_input_device(model)), kept=2 * (kv + 4 * get("vocab_size", 50_000)),
                    prefill=2 * (mlp + scores))


def rows_that_fit(model, tokens_per_row: int, budget: float = 0.5) -> int:
    """How many sequences of ``tokens_per_row`` (prompt + completion), each prefilled on its own,
    one ``generate`` call can hold in ``budget`` x the free memory (``wave_room``). At least 1."""
    r = wave_room(model, tokens_per_row, budget)
    return max(1, int(r.room // (r.kept + r.prefill)))
