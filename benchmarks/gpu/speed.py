"""GPU speed against the GPU's own limit, in one table from one command (issue 41):

    python -m benchmarks.gpu.speed                       # on a GPU: every row below, < 8 minutes
    python -m benchmarks.gpu.speed --out runs/gpu-speed.md
    python -m benchmarks.gpu.speed --smoke               # on the CPU, a tiny model: what CI runs
    python -m benchmarks.gpu.speed --budget 300          # start no row after 300 s (benchmarks.lent_gpu)

Random-init models of the paper's shapes (``configs/arch/``, bf16 weights on CUDA; no model hub):

- generation tokens/s of ``hf``, ``native`` eager (finished rows compacted, every kernel launched
  from Python) and ``native`` with CUDA graphs (fixed shapes, ``trainers/engines/native/static.py``),
  at 64 and 256 rows x 128 new tokens, on Qwen2.5-0.5B's and Qwen2.5-1.5B's shapes;
- one low-rank ES iteration, N=64 members x 2 prompts (``benchmarks.speed.es``'s case ``lowrank``),
  against plain generation of the same 128 rows (its case ``ceiling``), and one full-rank ES
  iteration, N=8 x 2 prompts (case ``full``): the second iteration timed, the first warms up;
- one GRPO step, 8 prompts x G=8, 128 tokens, one backward pass, with the shared prefix on and
  with the padded layout (one row per response: the question whether the grouped layout's
  attention falls off SDPA's fast kernels), fp32 masters computing in bf16
  (``benchmarks.speed.rl``'s step, the second timed).

Every row generates exactly its 128 tokens per row (stop tokens suppressed). Each row gives its
share of the memory-bandwidth limit: a decode step must read every weight once, so the work's
decode steps x weight bytes / the GPU's bandwidth (``BANDWIDTH``, from the GPU's name; ``--bandwidth``
for a GPU not listed) is the least time it can take; the share is that over the measured time (the
KV cache's reads, the prefill and, for ES and GRPO, scoring and updates are not in the limit, so
they count against the share). The table goes to ``--out`` (default ``$OUT/gpu_speed.md`` when
``$OUT`` is set, else ``runs/gpu_speed.md``), rewritten after every row, so a command stopped at its
limit still leaves the rows it measured. The rows run in the order of what issue 41 asks first: the
first model's generation, ES, GRPO, then the other models' generation; with ``--budget`` a row not
started in time is written as skipped, naming the budget.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.speed import es as es_speed, rl as rl_speed
from benchmarks.gpu import check as gpu_check
from trainers.common.config import Parser
from trainers.common.hardware import machine_line
from trainers.engines.native import NativeEngine

#: Memory bandwidth (TB/s) and dense bf16 throughput (TFLOP/s) from the vendors' data sheets, by
#: words of ``torch.cuda.get_device_name``; the first entry whose words all occur wins.
BANDWIDTH = [
    (("h200",), 4.8, 989), (("h100", "nvl"), 3.9, 835), (("h100", "pcie"), 2.0, 756), (("h100",), 3.35, 989),
    (("b200",), 8.0, 2250), (("a100", "80gb", "pcie"), 1.935, 312), (("a100", "80gb"), 2.039, 312),
    (("a100",), 1.555, 312), (("l40s",), 0.864, 362), (("l40",), 0.864, 181), (("l4",), 0.3, 121),
    (("a10g",), 0.6, 70), (("a10",), 0.6, 125), (("rtx", "4090"), 1.008, 165), (("v100",), 0.9, 125),
]
SMOKE = dict(archs=["tiny"], rows=[4, 8], tokens=8, population=4, prompts=2, full_population=2, grpo_prompts=2,
             group=2)


def gpu_limits(name: str) -> tuple[float, float] | None:
    """(TB/s, bf16 TFLOP/s) of the GPU named ``name``, or None when ``BANDWIDTH`` does not list it."""
    words = name.lower().replace("-", " ").replace("_", " ").split()
    for keys, tbs, tflops in BANDWIDTH:
        if all(any(k == w or (k in w and len(k) > 3) for w in words) for k in keys):
            return tbs, tflops
    return None


@dataclass
class Row:
    what: str
    model: str
    engine: str
    shape: str
    seconds: float | None  # None: the row failed or was skipped (``note`` says why)
    tokens: int = 0
    steps: int = 0  # decode steps the work needs: each reads every weight once
    weight_bytes: int = 0
    note: str = ""
    skipped: bool = False  # not run: the budget was spent before it started

    def line(self, bandwidth: float | None) -> str:
        if self.seconds is None:
            status = "skipped" if self.skipped else "failed"
            return f"| {self.what} | {self.model} | {self.engine} | {self.shape} | {status} | | | {self.note} |"
        share = f"{self.steps * self.weight_bytes / (bandwidth * 1e12) / self.seconds:.1%}" if bandwidth else "n/a"
        return (f"| {self.what} | {self.model} | {self.engine} | {self.shape} | {self.seconds:.3f} | "
                f"{self.tokens / self.seconds:,.0f} | {share} | {self.note} |")


class TimeBudget:
    """Seconds a run may start rows in (``--budget``): a row not started by then is skipped, so the
    whole command ends near a known time on a GPU lent for minutes. ``None``: no limit."""

    def __init__(self, seconds: float | None):
        self.seconds, self.start = seconds, time.monotonic()

    def spent(self) -> bool:
        return self.seconds is not None and time.monotonic() - self.start >= self.seconds

    def reason(self) -> str:
        return f"skipped: the --budget of {self.seconds:g} s was spent before it started"


NO_BUDGET = TimeBudget(None)


def attempt(row: Row, measure, budget: TimeBudget = NO_BUDGET) -> Row:
    """``measure(row)`` fills the row in; a failure becomes a failed row naming the error, and a row
    whose turn comes after ``budget`` is spent is skipped."""
    if budget.spent():
        row.skipped, row.note = True, budget.reason()
        return row
    try:
        measure(row)
    except Exception as exc:  # one failing row must not cost the whole table
        row.seconds, row.note = None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    return row


def weight_bytes(model, dtype: torch.dtype) -> int:
    """Bytes a decode step reads: every parameter once, in ``dtype``, but the input embedding's
    (a lookup of one row per token) unless it is also the output head."""
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    lookup = 0 if embed is head else embed.numel()
    return (sum(p.numel() for p in model.parameters()) - lookup) * dtype.itemsize


def graphs_agree(arch: str, device: str, tokens: int) -> str:
    """The graphed (fixed-shape) engine against the eager one, greedy, on ``arch`` cut to 2 layers:
    the share of rows identical in fp32 (TF32 off; the test suite asks all of them on CPU) and in
    bf16 (reported: kernels at other shapes round differently), plain and under low-rank members."""
    from trainers.es.noise import lowrank
    from trainers.es.noise.members import LowRankMembers

    rows = gpu_check.PROMPTS * 2
    parts = []
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for dtype in (torch.float32, torch.bfloat16):
            model, tokenizer = gpu_check.build_model(arch, 2, device, dtype)
            members = LowRankMembers(lowrank.select_layers(model, None, 1), [1, 2, 3, 4], [1.0, -1.0, 1.0, -1.0],
                                     0.02, 1)
            eager, fixed = (NativeEngine(model, tokenizer, fixed_shapes=f) for f in (False, True))
            plain = gpu_check.agreement(eager.generate(rows, tokens), fixed.generate(rows, tokens))
            under = gpu_check.agreement(eager.generate(rows, tokens, perturbation=members),
                                        fixed.generate(rows, tokens, perturbation=members))
            fixed.close()
            parts.append(f"{str(dtype).removeprefix('torch.')} {plain:.0%} plain, {under:.0%} under low-rank members")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    what = "graphed" if device == "cuda" else "fixed-shape"
    return f"{what} = eager native, greedy, rows identical of {len(rows)} x {tokens} tokens: " + "; ".join(parts)


def generation_rows(arch: str, device: str, dtype: torch.dtype, rows: list[int], tokens: int,
                    budget: TimeBudget = NO_BUDGET) -> list[Row]:
    """Tokens/s of hf, native eager and native with graphs (on CPU: the fixed-shape path, no graphs)."""
    cuda = device == "cuda"
    names = ["hf", "native eager", "native graphs" if cuda else "native fixed shapes (CPU: no graphs)"]
    if budget.spent():  # not even the model is built
        return [attempt(Row("generation", arch, name, f"{n} x {tokens}", None), None, budget)
                for n in rows for name in names]
    model, tokenizer = gpu_check.build_model(arch, None, device, dtype)
    size = weight_bytes(model, dtype)
    engines = dict(zip(names, (lambda: "hf", lambda: NativeEngine(model, tokenizer, fixed_shapes=False),
                               lambda: NativeEngine(model, tokenizer, fixed_shapes=True))))
    out = []
    for n in rows:
        for name, build in engines.items():
            def measure(row: Row, build=build, n=n) -> None:
                engine = build()
                speed = gpu_check.tokens_per_second(model, tokenizer, engine, n, tokens)
                row.seconds, row.tokens, row.steps, row.weight_bytes = n * tokens / speed, n * tokens, tokens, size
                failure = getattr(getattr(engine, "static", None), "failure", None)
                row.note = f"graph capture failed, ran without: {failure}" if failure else ""

            out.append(attempt(Row("generation", arch, name, f"{n} x {tokens}", None), measure, budget))
    return out  # the model goes with this frame


def es_rows(arch: str, model_dir: Path | None, device: str, dtype: str, population: int, prompts: int,
            full_population: int, tokens: int, size: int, budget: TimeBudget = NO_BUDGET) -> list[Row]:
    """es_speed's cases lowrank, ceiling (its plain generation) and full, one warm-up iteration each."""
    source = ["--model", str(model_dir)] if model_dir else ["--random-init", arch]
    out = {}
    for case, n in (("ceiling", population), ("lowrank", population), ("full", full_population)):
        args = es_speed.parse([*source, "--engine", "native", "--population", str(n), "--prompts", str(prompts),
                               "--max-new-tokens", str(tokens), "--warmup", "1", "--device", device, "--dtype", dtype])
        args.population, args.engine, args.dtype = args.population[0], args.engine[0], args.dtype[0]
        what = {"ceiling": "plain generation of the ES rows", "lowrank": "ES iteration, low-rank",
                "full": "ES iteration, full-rank"}[case]

        def measure(row: Row, case=case, args=args, n=n) -> None:
            r = es_speed.measure(case, args)
            row.seconds, row.tokens, row.weight_bytes = r["seconds"], int(r["tokens"]), size
            row.steps = tokens * (n if case == "full" else 1)  # full rank: one call per member
            row.note = f"generation {r['generation_seconds']:.3f} s"

        out[case] = attempt(Row(what, arch, "native", f"N={n} x {prompts} prompts x {tokens}", None), measure,
                            budget)
    low, plain = out["lowrank"], out["ceiling"]
    if low.seconds and plain.seconds:
        low.note += f"; {plain.seconds / low.seconds:.2f}x plain generation's speed (target >= 0.85)"
    return list(out.values())


def importable(module: str) -> bool:
    try:
        __import__(module)
    except Exception:  # not installed, or one of its own imports missing
        return False
    return True


def grpo_rows(arch: str, model_dir: Path, device: str, dtype: str, prompts: int, group: int, tokens: int,
              size: int, budget: TimeBudget = NO_BUDGET) -> list[Row]:
    """rl_speed's GRPO step, shared prefix on and off, the second step timed (on its task; on
    Countdown-v0 where reasoning-gym does not import: a lent GPU where its pycosat did not build)."""
    env = () if importable("reasoning_gym") else ("--env", "Countdown-v0", "--env-args", "{}")
    out = []
    for shared in ("on", "off"):
        def measure(row: Row, shared=shared) -> None:
            extra = ("--model", str(model_dir), "--max-new-tokens", str(tokens), "--batch-size", str(prompts),
                     "--group-size", str(group), "--device", device, *env)
            with tempfile.TemporaryDirectory() as tmp:
                run = rl_speed.run_ours({"who": "ours", "dtype": dtype, "shared": shared, "grad_accum": 1}, 2,
                                        "native", Path(tmp), extra)
            r = rl_speed.summary([{**run, "peak_gb": rl_speed.peak_rss_gb()}])
            if "error" in r:
                raise RuntimeError(r["error"])
            # the limit is the sampling's: its decode steps; the update's time counts against it
            row.seconds, row.tokens, row.steps, row.weight_bytes = r["step"], prompts * group * tokens, tokens, size
            row.note = f"sampling {r['sampling']:.3f} s, update {r['update']:.3f} s; {env[1] if env else rl_speed.ENV}"

        layout = "shared prefix" if shared == "on" else "padded, one row per response"
        out.append(attempt(Row(f"GRPO step, {layout}", arch, "native", f"{prompts} x G={group} x {tokens}", None),
                           measure, budget))
    return out


def profiles(arch: str, device: str, dtype: torch.dtype, rows: int, tokens: int) -> str:
    """Where a decode step's time goes: ``torch.profiler`` over one call of the native engine,
    eager and at fixed shapes (with graphs on CUDA), after a warm-up call: the ops by device time
    (CPU time on a CPU), and the wall seconds per step."""
    from torch.profiler import ProfilerActivity, profile

    model, tokenizer = gpu_check.build_model(arch, None, device, dtype)
    cuda = device == "cuda"
    prompts = (gpu_check.PROMPTS * (rows // len(gpu_check.PROMPTS) + 1))[:rows]
    out = []
    for name, fixed in (("native eager", False), ("native graphs" if cuda else "native fixed shapes", True)):
        engine = NativeEngine(model, tokenizer, fixed_shapes=fixed)
        engine.generate(prompts, tokens, min_new_tokens=tokens)
        with profile(activities=[ProfilerActivity.CPU, *[ProfilerActivity.CUDA] * cuda]) as prof:
            start = time.perf_counter()
            engine.generate(prompts, tokens, min_new_tokens=tokens)
            seconds = time.perf_counter() - start
        engine.close()
        out += [f"## {name}: {arch}, {rows} rows x {tokens} tokens, {seconds / tokens * 1e3:.2f} ms per step "
                f"(prefill included, under the profiler)", "",
                prof.key_averages().table(sort_by="device_time_total" if cuda else "cpu_time_total", row_limit=25), ""]
    del model
    return "\n".join(out)


def attention_kernels(model) -> str:
    """Which of SDPA's kernels run each GRPO layout's attention (log-probs, forward and backward),
    each kernel forced alone: whether the grouped (shared-prefix) layout falls off the fast ones.
    Groups of 4 ragged responses to 2 prompts of different lengths, as a GRPO batch has."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from trainers.rl.logprobs import group, pad, token_logprobs

    gen = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(3, model.config.vocab_size, (n,), generator=gen).tolist()  # noqa: E731
    prompts, completions = [], []
    for width, lengths in ((40, (30, 7, 19, 25)), (23, (12, 30, 1, 9))):
        prompt = ids(width)
        prompts += [prompt] * len(lengths)
        completions += [ids(n) for n in lengths]
    device = next(model.parameters()).device
    kernels = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
               SDPBackend.MATH]
    out = []
    for name, batch in (("padded", pad(prompts, completions, 0, device)),
                        ("shared prefix", group(prompts, completions, 0, device))):
        ran = []
        for kernel in kernels:
            try:
                with sdpa_kernel([kernel]):
                    model.zero_grad(set_to_none=True)
                    (token_logprobs(model, batch) * batch.mask).sum().backward()
                ran.append(kernel.name.lower())
            except RuntimeError:  # "No available kernel": this kernel does not take that attention
                pass
        out.append(f"{name}: {', '.join(ran) or 'none'}")
    model.zero_grad(set_to_none=True)
    impl = getattr(model.config, "_attn_implementation", None)
    return (f"SDPA kernels that run the GRPO update's attention (each forced alone; the model's attention: "
            f"{impl}): " + "; ".join(out))


def default_out() -> Path:
    return Path(os.environ["OUT"]) / "gpu_speed.md" if os.environ.get("OUT") else Path("runs") / "gpu_speed.md"


def parse(argv: list[str] | None):
    parser = Parser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--archs", nargs="+", default=["qwen2.5-0.5b", "qwen2.5-1.5b"],
                        help="architectures of the generation rows (configs/arch/NAME.json)")
    parser.add_argument("--es-arch", default="qwen2.5-0.5b", help="the architecture of the ES and GRPO rows")
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per row, every row")
    parser.add_argument("--population", type=int, default=64, help="low-rank ES: N")
    parser.add_argument("--prompts", type=int, default=2, help="ES prompts per member")
    parser.add_argument("--full-population", type=int, default=8, help="full-rank ES: N")
    parser.add_argument("--grpo-prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8, help="GRPO's G")
    parser.add_argument("--bandwidth", type=float, default=None, help="TB/s, for a GPU the module's table lacks")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds after which no row starts (the rest are written as skipped); default: none")
    parser.add_argument("--no-profile", action="store_true",
                        help="skip the profiles of one native call, eager and with graphs (written beside --out)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--smoke", action="store_true", help="CPU, a tiny model, a few rows and tokens (CI)")
    parser.add_argument("--out", type=Path, default=None, help="where the table goes (default: $OUT/gpu_speed.md "
                                                              "when $OUT is set, else runs/gpu_speed.md)")
    args = parser.parse_args(argv)
    if args.budget is not None and args.budget <= 0:
        parser.error(f"--budget must be a positive number of seconds, not {args.budget:g}")
    if args.smoke:
        args.device = "cpu"
        for key, value in SMOKE.items():
            setattr(args, key, value)
        args.es_arch = "tiny"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("gpu_speed: no CUDA device here, so there is nothing to time (run it on a machine with a GPU, or "
              "--smoke on the CPU)")
        return 0
    start = time.perf_counter()
    dtype = torch.bfloat16 if cuda else torch.float32
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    limits = gpu_limits(name) if cuda else None
    bandwidth = args.bandwidth or (limits[0] if limits else None)
    head = [f"gpu_speed on {name}: " + (f"memory bandwidth {bandwidth:g} TB/s" if bandwidth else
                                         "memory bandwidth unknown (give --bandwidth TB/s)")
            + (f", dense bf16 {limits[1]:g} TFLOP/s" if limits else "")
            + (f", {torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB" if cuda else "")
            + f"; {machine_line(args.device)}; torch {torch.__version__}; random-init weights in "
            f"{str(dtype).removeprefix('torch.')}; every row generates exactly {args.tokens} tokens per row",
            "", "| what | model | engine | rows | seconds | tokens/s | % of bandwidth limit | note |",
            "|---|---|---|---|---:|---:|---:|---|"]
    print("\n".join(head), flush=True)
    out = args.out or default_out()
    out.parent.mkdir(parents=True, exist_ok=True)
    budget = TimeBudget(args.budget)
    rows: list[Row] = []
    notes = {"agree": "", "kernels": ""}  # the lines below the table, as they come

    def write(last: str) -> None:
        lines = [*head, *(r.line(bandwidth) for r in rows), *(f"\n{n}" for n in notes.values() if n), "", last]
        out.write_text("\n".join(lines) + "\n")

    def report(new: list[Row]) -> None:
        for row in new:
            print(row.line(bandwidth), flush=True)
            rows.append(row)
            write(f"(partial: {len(rows)} rows after {time.perf_counter() - start:.0f} s; the run goes on)")

    try:
        notes["agree"] = graphs_agree(args.archs[0], args.device, min(args.tokens, 32))
    except Exception as exc:  # a check that cannot run says why
        notes["agree"] = f"graphed = eager native: failed ({type(exc).__name__}: {exc})"
    print(notes["agree"], flush=True)
    # what the targets need first: the first model's generation, then ES and GRPO
    report(generation_rows(args.archs[0], args.device, dtype, args.rows, args.tokens, budget))
    mode = "auto" if cuda else "fp32"
    with tempfile.TemporaryDirectory() as tmp:
        size = 0
        if budget.spent():
            notes["kernels"] = f"SDPA kernels of the GRPO update: {budget.reason()}"
        else:
            model, tokenizer = gpu_check.build_model(args.es_arch, None, args.device, dtype)
            size = weight_bytes(model, dtype)
            gpu_check.save_model(model, tokenizer, Path(tmp) / "model")
            try:
                notes["kernels"] = attention_kernels(model)
            except Exception as exc:  # a probe that cannot run says why
                notes["kernels"] = f"SDPA kernels of the GRPO update: probe failed ({type(exc).__name__}: {exc})"
            del model
        print(notes["kernels"], flush=True)
        local = Path(tmp) / "model" if args.es_arch == "tiny" else None  # es_speed builds paper shapes itself
        report(es_rows(args.es_arch, local, args.device, mode, args.population, args.prompts, args.full_population,
                       args.tokens, size, budget))
        report(grpo_rows(args.es_arch, Path(tmp) / "model", args.device, mode, args.grpo_prompts, args.group,
                         args.tokens, size, budget))
    for arch in args.archs[1:]:
        report(generation_rows(arch, args.device, dtype, args.rows, args.tokens, budget))
    last = f"{time.perf_counter() - start:.0f} s in all; the limit: decode steps x weight bytes / bandwidth"
    print(last, flush=True)
    write(last)
    print(f"table written to {out}")
    if args.no_profile:
        pass
    elif budget.spent():
        print(f"profile {budget.reason()}")
    else:
        where = out.with_name(out.stem + "_profile.txt")
        try:
            where.write_text(profiles(args.archs[0], args.device, dtype, args.rows[0], min(args.tokens, 32)))
            print(f"profiles written to {where}")
        except Exception as exc:  # the table is what counts; say why the profile is missing
            print(f"profile failed: {type(exc).__name__}: {exc}")
    failed = [r for r in rows if r.seconds is None and not r.skipped]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
