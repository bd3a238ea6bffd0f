"""Sized to the machine: which size a run takes (its preset) and what the whole run will cost, said
in one line before its first work.

**Presets** (``--preset``). ``paper``: the paper's hyperparameters for the env (ES:
``trainers/es/presets.py``; GRPO and PPO: the trainers' defaults); ``cpu``: a documented size per env
whose iteration takes minutes on a 2-core CPU (``trainers/es/presets.py``, ``trainers/rl/presets.py``);
``auto`` (the default): the paper's, unless a short probe on this device says one of its iterations
(steps) would take more than ``SWITCH`` seconds (~2 h), then the CPU preset. A preset sets only the
options that neither a flag nor the ``--config`` file gave (``config.given``): an explicit value always
wins, and config.yaml's ``sources`` records where each value came from (``preset cpu``, ``flag``, ...).
A resumed run keeps the values it has.

**The estimate** (``probe_pace``, ``Pace``). A few short generation calls on this device, with this model
and engine, time a call's prompt pass and each further token for a few rows of the training prompts
(``PROBE_ROWS`` on a CPU, a generation batch on a GPU) and, for full-rank ES, one member's noise work.
Extrapolated to the run: rows scale linearly from the probed ones, every response runs to the full
``max_new_tokens`` (an upper bound: greedy answers often stop earlier), and an RL update costs a
forward pass per token per pass it makes, paced from the prompt pass. Multi-turn episodes count one
turn. The trainer's later projections, from its first real work (``progress.RunClock``), are the
measured ones.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trainers.common.config import ConfigError, given
from trainers.common.progress import duration, plural

#: The paper's preset is kept while one of its iterations (steps) is estimated at most this long here.
SWITCH = 2 * 3600.0
#: Rows of the probe's calls on a CPU (its time grows with the rows; a GPU is probed at a whole batch).
PROBE_ROWS = 4
#: Further tokens the probe decodes to time a step.
PROBE_TOKENS = 8
PRESETS = ("paper", "cpu")
#: What every family's CPU preset for an env shares: its generation budget, and the held-out
#: examples each evaluation measures (the first K of the split). Other envs: ``CPU_TOKENS_OTHER``
#: new tokens at most, 20 examples.
CPU_ENV: dict[str, dict[str, Any]] = {
    "Sudoku-v0": dict(max_new_tokens=256, eval_limit=20),
    "Countdown-v0": dict(max_new_tokens=256, eval_limit=20),
    "MATH-v0": dict(max_new_tokens=384, eval_limit=20),
    "ARC-AGI-v0": dict(max_new_tokens=256, eval_limit=10),  # long prompts: the grids
    "Conciseness-v0": dict(max_new_tokens=48),  # all 8 held-out prompts
}
CPU_TOKENS_OTHER = 128


def cpu_env(env_id: str, env_max_new_tokens: int) -> dict[str, Any]:
    """The generation budget and held-out size every CPU preset of ``env_id`` has (``CPU_ENV``)."""
    return CPU_ENV.get(env_id, dict(max_new_tokens=min(CPU_TOKENS_OTHER, env_max_new_tokens), eval_limit=20))


@dataclass
class Pace:
    """What the probe measured on this device: for calls of ``rows`` rows whose prompts average
    ``prompt_tokens`` tokens, the prompt pass with the first token, each further token, and a full-rank
    ES member's noise work (perturb and restore the weights) per call. ``prompt_rows``: the rows whose
    prompt that pass computed (0: all; an engine that ``shares_prompts`` computes each distinct prompt
    once, and ``shares_prompts`` paces a call's prompt pass by its distinct prompts)."""

    device: str
    rows: int
    prompt_tokens: float
    prompt_seconds: float
    step_seconds: float
    member_seconds: float = 0.0
    seconds: float = 0.0  # what the probe took
    prompt_rows: int = 0
    shares_prompts: bool = False

    def generation(self, rows: int, max_new_tokens: int, prompts: int | None = None) -> float:
        """Seconds to generate ``rows`` responses of up to ``max_new_tokens`` tokens, to ``prompts``
        distinct prompts (None: every row its own; counted only where the engine shares them)."""
        computed = prompts if self.shares_prompts and prompts is not None else rows
        return (computed / (self.prompt_rows or self.rows) * self.prompt_seconds
                + rows / self.rows * max(0, max_new_tokens - 1) * self.step_seconds)

    def evaluation(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, batch: int) -> float:
        """Seconds of a greedy held-out evaluation of ``prompts`` (each one's token ids): the engines'
        waves of ``batch`` rows, longest prompts together, each padded to its longest, and on an
        engine that ``shares_prompts`` each distinct prompt of a wave computed once (rg/products-v0's
        test split: 100 items, 62 distinct prompts). (ARC-AGI-v0's 10 held-out prompts pad to 7,152
        tokens where the probe's training prompts averaged ~2,700: paced as ``generation``, an
        evaluation was estimated at a third of its time.)"""
        ordered = sorted(prompts, key=len, reverse=True)
        padded = 0
        for k in range(0, len(ordered), batch):
            wave = ordered[k:k + batch]
            computed = len({tuple(ids) for ids in wave}) if self.shares_prompts else len(wave)
            padded += len(wave[0]) * computed
        return self.forward(padded) + len(ordered) / self.rows * max(0, max_new_tokens - 1) * self.step_seconds

    def forward(self, tokens: float) -> float:
        """Seconds of a forward pass over ``tokens`` tokens, paced from the prompt pass."""
        return tokens * self.prompt_seconds / max(1.0, (self.prompt_rows or self.rows) * self.prompt_tokens)

    def line(self) -> str:
        noise = f", {self.member_seconds:.2f} s of noise work per member" if self.member_seconds else ""
        distinct = f" ({self.prompt_rows} distinct)" if 0 < self.prompt_rows < self.rows else ""
        return (f"from a {self.seconds:.0f} s probe on this {self.device}: {plural(self.rows, 'row')}{distinct} of "
                f"~{self.prompt_tokens:.0f} prompt tokens, {self.prompt_seconds:.2f} s prompt pass, "
                f"{1000 * self.step_seconds:.0f} ms per further token{noise}")


def probe_pace(engine, prompts: Sequence[Any], device: str, rows: int, temperature: float = 0.0,
          perturbation=None, member=None) -> Pace:
    """Time ``engine`` on ``rows`` rows of ``prompts`` (cycled): a warm-up call, then the prompt pass
    (one token) and a call of ``PROBE_TOKENS`` more, whose per-token step is timed between its first
    and last token's progress reports (hf, native; an engine that reports finished rows only, as
    vLLM, gives the two calls' difference instead: with long prompts, the prompt pass's own noise
    can swamp a few tokens' time, and ARC-AGI-v0's 2,700-token prompts read 0 ms per token so), under
    ``perturbation`` when given (ES's low-rank rows); ``member`` (a full-rank ES member) is timed as a
    one-token call under it, less the plain one: its noise work. Sampled probes are seeded, greedy
    ones deterministic, and a member's weights are restored bit for bit: the run's numbers do not
    change."""
    from trainers.engines.generation import encode_prompts

    batch = [prompts[i % len(prompts)] for i in range(rows)]
    seed = 0 if temperature > 0 else None

    def timed(n: int, new: int, under=None, marks: list[float] | None = None) -> float:
        start = time.perf_counter()
        report = None if marks is None else (lambda *_: marks.append(time.perf_counter()))
        engine.generate(batch[:n], max_new_tokens=new, min_new_tokens=new, batch_size=n, temperature=temperature,
                        seed=seed, perturbation=under, on_progress=report)
        return time.perf_counter() - start

    began = time.perf_counter()
    timed(1, 1)  # the first call's one-time costs (kernels, caches) are not the run's
    first = timed(rows, 1, perturbation)
    marks: list[float] = []
    whole = timed(rows, 1 + PROBE_TOKENS, perturbation, marks)
    if len(marks) > PROBE_TOKENS:  # a report after each token: the decode steps alone, no prompt pass in them
        step = (marks[PROBE_TOKENS] - marks[0]) / PROBE_TOKENS
    else:
        step = max(0.0, (whole - first) / PROBE_TOKENS)
    noise = max(0.0, timed(rows, 1, member) - first) if member is not None else 0.0
    encoded = encode_prompts(engine.tokenizer, batch)
    tokens = sum(len(ids) for ids in encoded) / rows
    shares = engine.shares_prompts
    computed = len({tuple(ids) for ids in encoded}) if shares else rows  # a short train split's prompts repeat
    return Pace(device, rows, tokens, first, step, noise, time.perf_counter() - began, computed, shares)


def prompt_ids(engine, examples: Sequence[Any]) -> list[list[int]]:
    """Each example's prompt as ``engine`` encodes it (chat template included)."""
    from trainers.engines.generation import encode_prompts

    return encode_prompts(engine.tokenizer, [e.prompt for e in examples])


def probe_rows(device: str, batch: int, rows_per_unit: int) -> int:
    """The probe's rows: ``PROBE_ROWS`` on a CPU, a generation batch elsewhere, never more than a unit has."""
    return max(1, min(PROBE_ROWS if device == "cpu" else batch, batch, rows_per_unit))


@dataclass
class Size:
    """What one set of values makes a run do per unit (iteration, step), and its time here."""

    label: str  # "the paper's preset", "the CPU preset", "the values given"
    shape: str  # "N=32 x 800 prompts"
    completions: int  # per unit, every process together
    max_new_tokens: int
    units: int  # the run's iterations (steps)
    seconds: float  # per unit, estimated

    def brief(self, unit: str) -> str:
        return f"{self.shape}, {self.max_new_tokens} new tokens, {plural(self.units, unit)}"

    @property
    def tokens(self) -> int:
        return self.completions * self.max_new_tokens


@dataclass
class Choice:
    """The chosen preset (``name``), what it and the alternative make a unit do (``size``, ``other``),
    the options it set, and the probe's ``pace``."""

    name: str
    size: Size
    other: Size | None
    applied: dict[str, Any]
    pace: Pace
    unit: str
    why: str = ""

    def line(self, method: str, env: str, units: int, eval_rows: int, evals: int, eval_seconds: float,
             flag: str = "--preset") -> str:
        """The one line a trainer says before its first work: the preset and why, the work per unit
        (completions, tokens), the units, the time per unit and for the run (held-out evaluations
        included), the probe, and where the other preset is."""
        s = self.size
        total = units * s.seconds + evals * eval_seconds
        evaluations = f" and {plural(evals, 'held-out evaluation')} of {eval_rows}" if evals else ""
        text = (f"{method} on {env}, {s.label}{self.why}: {s.shape}, {s.completions:,} completions of up to "
                f"{s.max_new_tokens} tokens ({s.tokens:,} tokens) per {self.unit}, {plural(units, self.unit)}; "
                f"estimated ~{duration(s.seconds)} per {self.unit} and ~{duration(total)} for the run{evaluations} "
                f"({self.pace.line()})")
        if self.other is not None:
            smaller = self.other.seconds < s.seconds
            name = "cpu" if self.name != "cpu" else "paper"
            text += (f"; {'a smaller' if smaller else 'the other'} preset: {flag} {name} "
                     f"({self.other.brief(self.unit)}, ~{duration(self.other.seconds)} per {self.unit} here; "
                     f"docs/es.md#sized-to-the-machine)")
        return text


def free_values(cfg, preset: dict[str, Any]) -> dict[str, Any]:
    """The values of ``preset`` that neither a flag nor the ``--config`` file gave: the ones it sets."""
    sources = given(cfg)
    return {k: v for k, v in preset.items() if k not in sources}


def with_preset(cfg, values: dict[str, Any]):
    """A copy of ``cfg`` with ``values`` set."""
    out = copy.copy(cfg)
    for key, value in values.items():
        setattr(out, key, value)
    return out


def check_before_choice(cfg, cpu: dict[str, Any], check: Callable[[Any], Any]) -> None:
    """Run ``check`` (raises ``ConfigError``) before the preset is chosen, which waits for the probe:
    a config passes if any preset it may end in passes (``--preset auto``: the paper's values, which
    ``cfg`` holds, or the CPU preset ``cpu`` where nothing was given); the chosen one is checked again
    after the choice. A failure raises the last candidate's error (the CPU preset's, the smaller)."""
    candidates = [cfg]
    if not cfg.resume and cfg.preset != "paper":
        small = with_preset(cfg, free_values(cfg, cpu))
        candidates = [small] if cfg.preset == "cpu" else [cfg, small]
    error = None
    for candidate in candidates:
        try:
            check(candidate)
            return
        except ConfigError as exc:
            error = exc
    raise error


def choose_preset(cfg, cpu: dict[str, Any], shape: Callable[[Any], str], completions: Callable[[Any], int],
           seconds: Callable[[Any], float], unit: str, pace: Pace, units: str = "iterations") -> Choice:
    """Decide ``cfg``'s preset and set its values, where nothing was given: ``cpu`` is the env's CPU
    preset; ``shape``, ``completions`` and ``seconds`` say what a config makes one unit do and how long
    it takes here (from the probe). The paper's preset is ``cfg``'s values as they stand (validate
    filled them); ``--preset auto`` keeps it unless a unit would take over ``SWITCH`` seconds. Sets
    ``cfg.preset`` to the choice and records each preset value as ``preset NAME`` in the config's
    sources. ``units``: the option that counts the run's units. A resumed run keeps its values."""
    sources = given(cfg)
    free = free_values(cfg, cpu)
    paper = copy.copy(cfg)
    small = with_preset(cfg, free)

    def size(c, label: str) -> Size:
        return Size(label, shape(c), completions(c), c.max_new_tokens, getattr(c, units), seconds(c))

    mine = [k for k in cpu if k in sources]
    if cfg.resume or not free:  # nothing a preset could set: the values given (or the resumed run's)
        label = "the resumed run's values" if cfg.resume else "the values given (flags, --config)"
        mine = size(cfg, label)
        name = cfg.preset if cfg.preset in PRESETS else "paper"
        cfg.preset = name
        return Choice(name, mine, None, {}, pace, unit)
    given_too = f" with your {', '.join(k.replace('_', '-') for k in mine)}" if mine else ""
    at_paper = size(paper, "the paper's preset" + given_too)
    at_cpu = size(small, "the CPU preset" + given_too)
    name = cfg.preset
    why = ""
    if name == "auto":
        name = "cpu" if at_paper.seconds > SWITCH else "paper"
        if name == "cpu":
            why = (f" (the paper's would take ~{duration(at_paper.seconds)} per {unit} on this device: "
                   f"{at_paper.shape}; --preset paper asks for it)")
    elif name in PRESETS:
        why = f" (--preset {name})"
    chosen, other = (at_cpu, at_paper) if name == "cpu" else (at_paper, at_cpu)
    applied = free if name == "cpu" else {}
    for key, value in applied.items():
        setattr(cfg, key, value)
    try:  # the preset's values beside the ones given (--population 5 with the CPU preset's mirrored pairs)
        cfg.validate()
    except ConfigError as exc:
        preset = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in applied.items())
        raise ConfigError(f"{exc} (the {name} preset sets {preset}; give such a value yourself, or --preset "
                          f"paper)") from None
    cfg._sources = {**sources, **{k: f"preset {name}" for k in free}}
    cfg.preset = name
    return Choice(name, chosen, other, applied, pace, unit, why)
