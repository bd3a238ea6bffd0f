"""The one place that decides what a run computes in: compute dtype, master dtype and autocast.

A run's dtype is settled once, with its engine, by ``runtime.resolve`` (``settle`` here, given the
model's config from its one lookup); FSDP (``fsdp_param_dtype``) and ES's masters (``needs_masters``)
follow the rules here. The engines sit
below this layer and decide nothing: they compute in the weights' dtype, or in the compute dtype
their caller passes (``make_engine(..., compute_dtype)``, the RL policy's autocast). ``--dtype`` is
``fp32``, ``bf16`` or ``auto``:

- on CUDA, ``auto`` is bf16 where the GPU supports it (``torch.cuda.is_bf16_supported``);
- on CPU, ``auto`` is *measured*: bf16 matrix units in the CPU flags do not predict the speed (a
  Xeon listing ``avx512_bf16`` ran a GRPO step at 0.6x in bf16). ``probe`` times a decoder layer of
  the model's own shapes, forward, in fp32 and bf16, alternating, on the threads the run uses, at a
  generation-like batch (64 rows x 1 token over a short cache) and a training-like one (4 x 256
  tokens); bf16 wins only if it is at least ``MARGIN`` faster on the geometric mean, so fp32 wins
  ties. The result is cached per (CPU model, torch version, threads, shape) under the project's
  cache directory, and ``LLM_ENVS_CPU_BF16`` (``hardware.FORCE_ENV``) forces it: ``1`` bf16, ``0``
  fp32 (the test suite sets ``0``).

A run records its ``Decision`` (dtype, how it was decided, the probe's numbers) in runtime.jsonl,
and keeps its dtype for good: a resume with another explicit ``--dtype`` is refused (``settle``)
before anything in the run directory is written.

bf16 runs keep fp32 masters: ES an fp32 copy of every bf16 weight (``trainers/es/noise/fullrank.py``),
the RL trainers fp32 weights, gradients and AdamW, computing under autocast (``set_compute_dtype``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from trainers.common.hardware import FORCE_ENV, cpu_name, machine_line

#: What ``--dtype`` accepts.
DTYPE_CHOICES = ["auto", "fp32", "bf16"]
_DTYPE_NAMES = {"fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
                "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
                "fp16": torch.float16, "float16": torch.float16, "half": torch.float16}
#: bf16 must be this much faster (fp32 time / bf16 time, geometric mean of the probe's batches):
#: fp32 keeps exact ES replays and needs no masters, so near-ties go to it.
MARGIN = 1.15
#: The probe's time budget in seconds (both dtypes, both batches, warm-ups included, roughly).
PROBE_SECONDS = 1.5
#: Bump when the probe changes what it measures: older cache entries are then ignored.
PROBE_VERSION = 2


class PrecisionError(ValueError):
    """A setting that cannot decide a dtype (commands report it in one line, ``config.USER_ERRORS``)."""


# ----- names ---------------------------------------------------------------------------------------

def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bf16"``: how runs, tables and flags name a dtype."""
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


def parse_dtype(dtype: Any) -> torch.dtype:
    """A ``torch.dtype`` or a name (``"bf16"``, ``"float32"``, ...) as a ``torch.dtype``."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype.lower() in _DTYPE_NAMES:
        return _DTYPE_NAMES[dtype.lower()]
    raise ValueError(f"invalid dtype {dtype!r}: use auto or one of {sorted(_DTYPE_NAMES)}")


def resolve_dtype(dtype: Any, device: torch.device, model: Any = None) -> torch.dtype:
    """``dtype`` as a ``torch.dtype``; ``None``/``"auto"``: ``decide(device, model)``."""
    if dtype is None or dtype == "auto":
        return decide(device, model).torch_dtype
    return parse_dtype(dtype)


# ----- the decision --------------------------------------------------------------------------------

@dataclass
class Decision:
    """A run's compute dtype and how it was decided: ``explicit`` (``--dtype``), ``resumed`` (the
    dtype the run recorded at its first start), ``forced`` (``LLM_ENVS_CPU_BF16``), ``measured`` or
    ``cached`` (the probe, ``probe`` holding its numbers), ``cuda`` (the GPU's bf16 support)."""

    dtype: str
    how: str
    probe: dict[str, Any] | None = field(default=None)

    @property
    def torch_dtype(self) -> torch.dtype:
        return parse_dtype(self.dtype)

    def record(self) -> dict[str, Any]:
        """What runtime.jsonl and benchmark results hold."""
        return asdict(self)

    def line(self) -> str:
        """The decision in one line, for logs and benchmark headers."""
        if not self.probe:
            return f"{self.dtype} ({self.how})"
        p, ms = self.probe, self.probe["ms"]
        times = "; ".join(f"{batch} fp32 {t['fp32']:.2f} ms, bf16 {t['bf16']:.2f} ms" for batch, t in ms.items())
        verdict = ">=" if self.dtype == "bf16" else "<"
        return (f"{self.dtype} ({self.how}: bf16 {p['ratio']:.2f}x fp32's speed {verdict} {p['margin']:.2f}x; "
                f"{times}; {p['threads']} threads)")


def decide(device: torch.device | str, model: Any = None, threads: int | None = None,
           measure: bool = True) -> Decision | None:
    """``--dtype auto`` on ``device`` for ``model`` (a loaded model, a config or a config dict; None:
    the default model's shapes): bf16 on a CUDA GPU that supports it; on CPU the forced value, else
    the probe's answer (cached). ``measure=False``: the cached answer or None, never a probe."""
    device = torch.device(device)
    if device.type == "cuda":
        ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return Decision("bf16" if ok else "fp32", "cuda")
    if device.type != "cpu":
        return Decision("fp32", f"{device.type}: not measured")
    forced = os.environ.get(FORCE_ENV)
    if forced is not None:
        value = forced.strip().lower()
        if value not in ("0", "1", "false", "true", "no", "yes", ""):
            raise PrecisionError(f"{FORCE_ENV}={forced!r}: use 1 (bf16) or 0 (fp32), or unset it to measure")
        return Decision("bf16" if value in ("1", "true", "yes") else "fp32", f"forced by {FORCE_ENV}={forced.strip()}")
    return measured(model_shape(model), threads or torch.get_num_threads(), measure)


def measured(shape: dict[str, int], threads: int, measure: bool = True) -> Decision | None:
    """The probe's decision for ``shape`` on ``threads`` threads: from the cache, else measured
    (and cached); ``measure=False``: None instead of a probe."""
    key = {"cpu": cpu_name(), "torch": torch.__version__, "threads": threads, "shape": shape,
           "version": PROBE_VERSION}
    path = _cache_path(key)
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        saved = json.loads(path.read_text())
        if saved["key"] == key:
            return Decision(saved["probe"]["dtype"], "cached", saved["probe"])
    if not measure:
        return None
    result = probe(shape, threads)
    with contextlib.suppress(OSError):  # an unwritable cache costs a probe per run, nothing else
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": key, "probe": result}, indent=1) + "\n")
        os.replace(tmp, path)
    return Decision(result["dtype"], "measured", result)


def _cache_path(key: dict[str, Any]) -> Path:
    from trainers.common.default_model import cache_dir

    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "precision" / f"probe-{digest}.json"


def choose(ms: dict[str, dict[str, float]], margin: float = MARGIN) -> tuple[str, float]:
    """(dtype, ratio) from the probe's times (``ms[batch][dtype]``): the ratio is the geometric
    mean over batches of fp32 time / bf16 time; bf16 only at ``margin`` or more."""
    ratio = math.exp(sum(math.log(t["fp32"] / t["bf16"]) for t in ms.values()) / len(ms))
    return ("bf16" if ratio >= margin else "fp32"), ratio


# ----- the probe -----------------------------------------------------------------------------------

def abba(first, second, rounds: int = 3, seconds: float | None = None, max_rounds: int = 20,
         sync=lambda: None) -> tuple[tuple[float, float], int]:
    """Best seconds of ``first()`` and ``second()`` side by side, after one warm-up each, in ABBA
    order (round k runs first then second when k is even, the other way when odd), so a machine
    whose load drifts slows both alike: ``rounds`` rounds, or with ``seconds`` as many as fit in
    that time (at least ``rounds``, at most ``max_rounds``). ``sync``: waits for the device (CUDA)
    around each timing. Returns ((first's, second's), rounds run). The probe's timer and the
    benchmarks' (``benchmarks.speed.precision``)."""
    first(), second()
    best = [math.inf, math.inf]
    start, k = time.perf_counter(), 0
    while k < rounds or (seconds is not None and time.perf_counter() - start < seconds and k < max_rounds):
        for i in ((0, 1) if k % 2 == 0 else (1, 0)):
            sync()
            t0 = time.perf_counter()
            (first, second)[i]()
            sync()
            best[i] = min(best[i], time.perf_counter() - t0)
        k += 1
    return (best[0], best[1]), k


#: SmolLM2-135M's decoder layer: the shape probed when a model's config cannot be read.
DEFAULT_SHAPE = {"hidden": 576, "intermediate": 1536, "heads": 9, "kv_heads": 3, "head_dim": 64}


def model_shape(model: Any = None) -> dict[str, int]:
    """The decoder-layer shape of ``model`` (a loaded model, a transformers config or a config dict;
    None: the default model): hidden and intermediate sizes, attention and key/value heads, head
    size. A config without them gets ``DEFAULT_SHAPE``."""
    config = _config_of(model)
    if not config:
        return dict(DEFAULT_SHAPE)
    try:
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        return {"hidden": hidden, "intermediate": int(config.get("intermediate_size") or 4 * hidden),
                "heads": heads, "kv_heads": int(config.get("num_key_value_heads") or heads),
                "head_dim": int(config.get("head_dim") or hidden // heads)}
    except (KeyError, TypeError, ValueError):
        return dict(DEFAULT_SHAPE)


def _config_of(model: Any) -> dict[str, Any] | None:
    """The config of a loaded model, a ``transformers`` config or a config dict, as a dict. A model's
    name or path is looked up once, by ``runtime.model_config``: give its result here."""
    if model is None:
        return None
    if isinstance(model, dict):
        return model
    if isinstance(model, (str, os.PathLike)):
        raise TypeError(f"precision needs a model's config, not its name {os.fspath(model)!r}: "
                        f"look it up with trainers.common.runtime.model_config")
    config = getattr(model, "config", model)
    return config.to_dict() if hasattr(config, "to_dict") else None


class _Layer(torch.nn.Module):
    """A Llama/Qwen2 decoder layer's work (RMS norms, q/k/v/o projections, attention, a gated MLP)
    at a given shape, random weights: what the probe times."""

    def __init__(self, s: dict[str, int]):
        super().__init__()
        h, d = s["hidden"], s["head_dim"]
        self.s = s
        self.q, self.o = torch.nn.Linear(h, s["heads"] * d, bias=False), torch.nn.Linear(s["heads"] * d, h, bias=False)
        self.k, self.v = (torch.nn.Linear(h, s["kv_heads"] * d, bias=False) for _ in range(2))
        self.gate, self.up = (torch.nn.Linear(h, s["intermediate"], bias=False) for _ in range(2))
        self.down = torch.nn.Linear(s["intermediate"], h, bias=False)

    def forward(self, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        s, (b, t, _) = self.s, x.shape
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        q = self.q(h).view(b, t, s["heads"], s["head_dim"]).transpose(1, 2)
        k, v = (p(h).view(b, t, s["kv_heads"], s["head_dim"]).transpose(1, 2) for p in (self.k, self.v))
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        group = s["heads"] // s["kv_heads"]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=past is None)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def _workloads(s: dict[str, int], dtype: torch.dtype) -> dict[str, tuple]:
    """The probe's batches: ``generation`` (64 rows x 1 new token over a 64-token cache) and
    ``training`` (4 x 256 tokens); fewer rows and tokens for a layer so large that one forward would
    eat the time budget (a 7B layer: ~10 rows and ~20 tokens, ~4 and ~8 GFLOP)."""
    weights = s["hidden"] * s["head_dim"] * 2 * (s["heads"] + s["kv_heads"]) + 3 * s["hidden"] * s["intermediate"]
    per_token = 2 * weights  # FLOPs of a token's matrix products
    tokens = max(16, min(1024, int(8e9 / per_token)))
    rows, length = (4, tokens // 4) if tokens >= 256 else (1, tokens)
    gen_rows = max(8, min(64, int(4e9 / per_token)))
    kv = s["kv_heads"], s["head_dim"]
    gen = torch.Generator().manual_seed(1)
    rnd = lambda *shape: torch.randn(*shape, generator=gen).to(dtype)  # noqa: E731
    cache = (rnd(gen_rows, kv[0], 64, kv[1]), rnd(gen_rows, kv[0], 64, kv[1]))
    return {"generation": (rnd(gen_rows, 1, s["hidden"]), cache), "training": (rnd(rows, length, s["hidden"]), None)}


def probe(shape: dict[str, int], threads: int | None = None, seconds: float = PROBE_SECONDS,
          margin: float = MARGIN) -> dict[str, Any]:
    """Time a decoder layer of ``shape`` forward in fp32 and bf16 (bf16 weights and activations,
    as a bf16 run holds them) on ``threads`` threads, alternating the dtypes (ABBA) until about
    ``seconds`` have passed; the best time of each. Returns the times (ms per batch and dtype),
    the ratio, the margin and the dtype chosen (``choose``)."""
    threads = threads or torch.get_num_threads()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            layer32 = _Layer(shape).eval()
        layers = {"fp32": layer32, "bf16": _Layer(shape).eval()}
        layers["bf16"].load_state_dict(layer32.state_dict())
        layers["bf16"].to(torch.bfloat16)
        inputs = {d: _workloads(shape, layers[d].q.weight.dtype) for d in layers}
        best, start, rounds = {}, time.perf_counter(), 0
        with torch.inference_mode():
            for w in inputs["fp32"]:  # the time budget shared by the batches
                times, n = abba(lambda w=w: layers["fp32"](*inputs["fp32"][w]),
                                lambda w=w: layers["bf16"](*inputs["bf16"][w]), rounds=2,
                                seconds=seconds / len(inputs["fp32"]), max_rounds=20)
                best[w] = {"fp32": times[0] * 1e3, "bf16": times[1] * 1e3}
                rounds = max(rounds, n)
    finally:
        torch.set_num_threads(before)
    dtype, ratio = choose(best, margin)
    return {"dtype": dtype, "ratio": round(ratio, 3), "margin": margin, "threads": threads, "rounds": rounds,
            "shape": shape, "ms": {w: {d: round(t, 3) for d, t in v.items()} for w, v in best.items()},
            "seconds": round(time.perf_counter() - start, 2)}


def header_line(device: torch.device | str | None = None, model: Any = None, decision: Decision | None = None) -> str:
    """This machine and what ``--dtype auto`` decides on ``device`` (default CPU) for ``model``
    (default: the default model's shapes), and why, in one line: every benchmark's header. Printing
    it never probes: ``decision`` (a run's) or the cached answer, else "not measured here yet"."""
    decision = decision or decide(device or "cpu", model, measure=False)
    said = decision.line() if decision else "not measured here yet (the first run that needs it measures it)"
    return f"{machine_line(device)}; --dtype auto: {said}"


# ----- what a run does with it -------------------------------------------------------------------

def settle(dtype: str | None, device: torch.device, model: Any = None, recorded: str | None = None,
           resume: str | None = None) -> Decision:
    """A run's dtype: an explicit ``--dtype``, or for ``auto`` the dtype the run ``recorded`` at
    its first start (``resume``), else ``decide``. A resume with another explicit dtype than the
    recorded one is refused in one line: a run never changes dtype midway (its ES seeds rebuild its
    weights only in it, its fp32 masters exist only for bf16)."""
    recorded = dtype_name(parse_dtype(recorded)) if recorded else None
    if dtype not in (None, "auto"):
        name = dtype_name(parse_dtype(dtype))
        if recorded and name != recorded:
            raise ValueError(f"--dtype {name}: {resume or 'the run'} computes in {recorded} (recorded at its first "
                             f"start) and keeps it; resume it without --dtype, or start a new run in {name}")
        return Decision(name, "resumed" if recorded else "explicit")
    if recorded:
        return Decision(recorded, "resumed")
    return decide(device, model)


def needs_masters(weights: torch.dtype, wanted: bool = True) -> bool:
    """Whether a tensor of dtype ``weights`` gets an fp32 master copy that receives ES's updates
    (``wanted``: ``--fp32-master``): every low-precision one, so no update is rounded away."""
    return wanted and weights != torch.float32


#: The attribute a trainable model carries its compute dtype in (``set_compute_dtype``).
_COMPUTE_ATTR = "_llm_envs_compute_dtype"


def set_compute_dtype(model, dtype: torch.dtype | None) -> None:
    """Make ``model`` (fp32 master weights) compute in ``dtype`` under autocast, on CPU as on CUDA:
    ``compute_context`` and the engines read it. None or the weights' own dtype: no autocast."""
    weights = next(model.parameters()).dtype
    setattr(model, _COMPUTE_ATTR, dtype if dtype is not None and dtype != weights else None)


def compute_dtype(model) -> torch.dtype | None:
    """The dtype ``model`` computes in when it differs from its weights' (the RL policy: fp32 master
    weights, so AdamW steps of 1e-6 are not rounded away, bf16 compute), else None."""
    return getattr(model, _COMPUTE_ATTR, None)


def compute_context(model):
    """Autocast to ``compute_dtype(model)`` on the model's device; nothing when it has none."""
    dtype = compute_dtype(model)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(next(model.parameters()).device.type, dtype=dtype)


def fsdp_param_dtype(module: torch.nn.Module) -> torch.dtype | None:
    """The dtype FSDP gathers ``module``'s parameters in (its ``MixedPrecisionPolicy.param_dtype``;
    None: the parameters' own). A trainable fp32 transformer computing in bf16 (``compute_dtype``)
    on CUDA gathers in bf16, as one process's autocast computes; ``--dtype fp32`` gathers fp32, and
    on CPU autocast does the casting."""
    first = next(module.parameters())
    trainable = any(p.requires_grad for p in module.parameters())
    compute = compute_dtype(module)
    if (trainable and compute is not None and first.device.type == "cuda" and first.dtype == torch.float32
            and hasattr(module, "config")):
        return compute
    return None
