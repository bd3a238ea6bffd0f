"""Check every CUDA path of the project on this machine's GPUs, with a random-init Qwen2-shaped
model (no hub needed): one pass/fail line per check, then a speed table.

    python -m benchmarks.gpu.check                          # every visible GPU, Qwen2.5-0.5B's shapes
    python -m benchmarks.gpu.check --arch qwen2.5-1.5b --out runs/gpu-check

Checks (each prints ``PASS``, ``FAIL`` or ``SKIP`` -- a check that cannot run here, counted apart,
never as passed -- the measured number, and what it compared):
- engines: native and vLLM (when installed) against hf in fp32 greedy decoding (TF32 off), plain and
  under low-rank members (agreement on at least 95% of the rows, as the CPU tests ask), and native
  against hf in bf16 (reported; bf16 kernels round differently);
- ES: full-rank and low-rank runs on every installed engine with bf16 weights and fp32 masters, and
  the masters themselves (updates below half a bf16 step reach the weights as the fp32 reference's);
- RL: the shared-prefix log-probs and gradients against one row per response (fp32; bf16
  reported); GRPO and PPO steps (bf16 compute, fp32 master weights);
- FSDP2: GRPO with ``--dtype fp32`` on every visible GPU against one GPU (TF32 off; relative
  difference of the final weights), and the dtype its linear layers actually computed in, observed on
  every rank (``benchmarks.speed.compute_dtypes``): fp32, FSDP's mixed precision included. Skipped with one GPU.

The speed table: generation tokens per second per engine, one ES iteration (low-rank, N=32) and
one GRPO step, at 1 GPU and at all of them. Trainers run as subprocesses (the multi-GPU ones
under torchrun); their logs and run directories stay under ``--out``.

Without CUDA it says so in one line and exits 0. ``--device cpu`` runs the same checks on the CPU
with a tiny model (what the test suite does, so the code of every check runs in CI).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from trainers.common.config import Parser
from trainers.common.precision import decide, header_line
from trainers.common.models import DEFAULT_MODEL, load_model, load_tokenizer, model_fingerprint, save_model
from trainers.engines import make_engine
from trainers.engines.options import vllm_missing

ROOT = Path(__file__).resolve().parents[2]
ARCH_DIR = Path(__file__).resolve().parents[1] / "configs" / "arch"
#: Agreement asked of two engines in fp32 greedy decoding (as tests/test_engines.py).
AGREEMENT = 0.95
#: FSDP2 on G GPUs against one, fp32: the largest relative difference (Frobenius) of a weight tensor allowed.
FSDP_TOLERANCE = 1e-4
PROMPTS = [[{"role": "user", "content": q}] for q in (
    "What is 12 x 7?", "Name one primary color.", "Translate 'Hello' to Spanish.", "How many days are in a week?",
    "What is the capital of France?", "Is 17 a prime number?", "Spell 'cat' backwards.", "What is 15% of 200?")]


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    skipped: bool = False  # could not run here: neither passed nor failed

    def line(self) -> str:
        return f"{'SKIP' if self.skipped else 'PASS' if self.ok else 'FAIL'}  {self.name}: {self.detail}"


def tally(checks: list[Check]) -> str:
    """"N passed, M skipped, K failed (names)": a skipped check is never counted as passed."""
    passed = [c for c in checks if c.ok and not c.skipped]
    skipped = [c for c in checks if c.skipped]
    failed = [c.name for c in checks if not c.ok and not c.skipped]
    return (f"{len(passed)} passed, {len(skipped)} skipped, {len(failed)} failed (of {len(checks)} checks)"
            + (f"; failed: {', '.join(failed)}" if failed else ""))


def build_model(arch: str, layers: int | None, device: str, dtype: torch.dtype):
    """(model, tokenizer): ``arch`` (a file of ``configs/arch`` or ``tiny``) with random weights,
    ``layers`` decoder layers when given; the default model's tokenizer (its ids fit every paper
    model's vocabulary)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    tokenizer = load_tokenizer(DEFAULT_MODEL)
    if arch == "tiny":
        spec = dict(model_type="qwen2", hidden_size=128, intermediate_size=256, num_attention_heads=4,  # head_dim 32: vLLM CPU
                    num_key_value_heads=2, num_hidden_layers=2, vocab_size=len(tokenizer), tie_word_embeddings=True)
    else:
        spec = json.loads((ARCH_DIR / f"{arch}.json").read_text())
        spec.pop("architectures", None)
    if layers:
        spec["num_hidden_layers"] = layers
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.eval(), tokenizer


def installed_engines() -> list[str]:
    return ["hf", "native", *["vllm"] * (vllm_missing() is None)]


def agreement(a, b) -> float:
    return sum(x == y for x, y in zip(a.token_ids, b.token_ids)) / max(1, len(a.token_ids))


# ----- checks --------------------------------------------------------------------------------------


def engine_checks(model, tokenizer, tokens: int) -> list[Check]:
    """Each engine against hf on the same model: plain, under low-rank members, and native in bf16."""
    from trainers.es.noise import lowrank
    from trainers.es.noise.members import LowRankMembers

    rows = PROMPTS * 2
    out = []
    reference = make_engine("hf", model, tokenizer).generate(rows, tokens)
    layers = lowrank.select_layers(model, None, 1)
    members = LowRankMembers(layers, [11, 12, 13, 14], [1.0, -1.0, 1.0, -1.0], 0.02, 1)
    member_rows = [p for _ in range(4) for p in PROMPTS[:4]]
    hf_members = make_engine("hf", model, tokenizer).generate(member_rows, tokens, perturbation=members)
    for name in installed_engines()[1:]:
        try:
            engine = make_engine(name, model, tokenizer)
            plain = agreement(reference, engine.generate(rows, tokens))
            under = agreement(hf_members, engine.generate(member_rows, tokens, perturbation=members))
            engine.close()
            out.append(Check(f"{name} = hf (fp32 greedy)", plain >= AGREEMENT,
                             f"{plain:.0%} of {len(rows)} rows identical (at least {AGREEMENT:.0%})"))
            out.append(Check(f"{name} = hf under low-rank members", under >= AGREEMENT,
                             f"{under:.0%} of {len(member_rows)} rows identical (at least {AGREEMENT:.0%})"))
        except Exception as exc:  # a check that cannot run fails, saying why
            out.append(Check(f"{name} = hf", False, f"{type(exc).__name__}: {exc}"))
    half = model.to(torch.bfloat16)
    try:
        rate = agreement(make_engine("hf", half, tokenizer).generate(rows, tokens),
                         make_engine("native", half, tokenizer).generate(rows, tokens))
        out.append(Check("native = hf (bf16 greedy)", rate >= 0.5, f"{rate:.0%} of {len(rows)} rows identical "
                                                                  f"(reported; bf16 kernels round differently)"))
    except Exception as exc:
        out.append(Check("native = hf (bf16 greedy)", False, f"{type(exc).__name__}: {exc}"))
    finally:
        model.to(torch.float32)
    return out


def shared_prefix_check(model, device: str) -> list[Check]:
    """The shared-prefix layout against one row per response on this device's attention kernels:
    log-probs and gradients in fp32 (the tests' 1e-5), and log-probs under bf16 autocast (reported)."""
    from trainers.common.models import set_compute_dtype
    from trainers.rl.logprobs import group, pad, token_logprobs

    gen = torch.Generator().manual_seed(5)
    ids = lambda n: torch.randint(3, model.config.vocab_size, (n,), generator=gen).tolist()  # noqa: E731
    prompts, completions = [], []
    for p, lengths in ((40, [30, 7, 19]), (23, [12]), (55, [1, 25, 30, 9])):  # left padding, ragged groups
        prompt = ids(p)
        prompts += [prompt] * len(lengths)
        completions += [ids(n) for n in lengths]
    rows, grouped = pad(prompts, completions, 0, device), group(prompts, completions, 0, device)
    mask = rows.mask.bool()
    out = []
    try:
        results = []
        for batch in (rows, grouped):
            model.zero_grad(set_to_none=True)
            logp = token_logprobs(model, batch)
            (logp * batch.mask[:, :logp.shape[1]]).sum().backward()
            results.append((logp.detach()[:, :mask.shape[1]][mask], {n: p.grad.clone() for n, p in model.named_parameters()}))
        (a, ga), (b, gb) = results
        lp = float((a - b).abs().max() / a.abs().max())
        grad = max(float((ga[n] - gb[n]).norm() / ga[n].norm().clamp(min=1e-12)) for n in ga)  # per tensor
        out.append(Check("shared prefix = one row per response (fp32)", lp < 1e-5 and grad < 1e-5,
                         f"log-probs {lp:.1e}, gradients {grad:.1e} (relative, at most 1e-5)"))
        set_compute_dtype(model, torch.bfloat16)
        with torch.no_grad():
            diff = float((token_logprobs(model, rows)[mask] - token_logprobs(model, grouped)[:, :mask.shape[1]][mask])
                         .abs().max())
        out.append(Check("shared prefix = one row per response (bf16 autocast)", diff < 0.1,
                         f"largest log-prob difference {diff:.3f} nats (reported; bf16 rounds each layout its own way)"))
    except Exception as exc:  # a check that cannot run fails, saying why
        out.append(Check("shared prefix", False, f"{type(exc).__name__}: {exc}"))
    finally:
        set_compute_dtype(model, None)
        model.zero_grad(set_to_none=True)
    return out


def masters_check(device: str) -> Check:
    """Updates below half a bf16 step, applied 50 times in one direction: with fp32 masters the bf16
    weights are the fp32 reference rounded (tests/test_noise.py's check, on this device)."""
    from trainers.es.noise import fullrank

    gen = torch.Generator().manual_seed(0)
    start = (0.5 + 0.49 * torch.rand(4096, generator=gen)).to(device=device, dtype=torch.bfloat16)
    step = float(torch.finfo(torch.bfloat16).eps) / 2
    reference = fullrank.Params([("w", start.float())])
    kept = fullrank.Params([("w", start.clone())])
    seeds = [fullrank.member_seed(0, 0, 0), fullrank.member_seed(0, 0, 1)]
    for _ in range(50):
        for params in (reference, kept):
            fullrank.apply_update(params, seeds, [0.2 * step, 0.1 * step])
    same = torch.equal(kept.tensors[0], reference.tensors[0].to(torch.bfloat16))
    moved = float((kept.tensors[0] != start).float().mean())
    return Check("bf16 weights with fp32 masters", same and moved > 0.9,
                 f"weights = fp32 reference rounded: {same}; {moved:.0%} of them moved")


def run_trainer(argv: list[str], log: Path, processes: int = 1, env: dict | None = None) -> tuple[bool, str]:
    """``python -m ARGV`` (under torchrun with ``processes`` > 1); (succeeded, its last error line)."""
    launch = [sys.executable] if processes == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                      "--nproc-per-node", str(processes)]
    with open(log, "w") as f:
        done = subprocess.run([*launch, "-m", *argv], stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                                   "LLM_ENVS_PROGRESS": "lines", **(env or {})})
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    error = next((line for line in reversed(lines) if "error" in line.lower()), lines[-1] if lines else "")
    return done.returncode == 0, error


def device_flag(device: str) -> list[str]:
    """The trainers' device flag: none on CUDA (under torchrun each rank takes its own GPU)."""
    return ["--device", "cpu"] if device == "cpu" else []


def log_of(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()] if (run / "log.jsonl").is_file() \
        else []


def unit_seconds(run: Path) -> float | None:
    """Seconds of the run's last training iteration (step): the first pays warm-up costs."""
    units = [r["seconds"] for r in log_of(run) if "seconds" in r]
    return units[-1] if units else None


def trainer_checks(model_dir: Path, work: Path, device: str, engines: list[str]) -> list[Check]:
    """ES in both noise modes on every engine, GRPO and PPO: a few iterations that must complete,
    log finite rewards and move the weights."""
    base = ["--env", "Conciseness-v0", "--model", str(model_dir), "--max-new-tokens", "16", "--eval-every", "0",
            "--eval-limit", "4", *device_flag(device)]
    es = ["--iterations", "2", "--population", "8", "--sigma", "0.05", "--alpha", "0.02", "--checkpoint-every", "2"]
    rl = ["--steps", "2", "--batch-size", "2", "--group-size", "4", "--lr", "1e-4", "--checkpoint-every", "2"]
    jobs = [(f"ES {noise} on {engine}", ["trainers.es", *base, *es, "--noise", noise, "--engine", engine])
            for noise in ("full", "lowrank") for engine in engines]
    jobs += [("GRPO", ["trainers.grpo", *base, *rl]), ("PPO", ["trainers.ppo", *base, *rl])]
    before = model_fingerprint(load_model(str(model_dir), device="cpu", verbose=False)[0])
    out = []
    for name, argv in jobs:
        run = work / name.replace(" ", "-")
        ok, error = run_trainer([*argv, "--out", str(run)], work / f"{run.name}.log")
        rewards = [r["reward_mean"] for r in log_of(run) if "reward_mean" in r]
        moved = ok and model_fingerprint(load_model(str(run / "final"), device="cpu", verbose=False)[0]) != before
        finite = bool(rewards) and all(r == r for r in rewards)
        detail = (f"{len(rewards)} iterations, rewards {', '.join(f'{r:.3f}' for r in rewards)}, weights moved: {moved}"
                  if ok else error)
        out.append(Check(name, ok and finite and moved, detail))
    return out


def fsdp_check(model_dir: Path, work: Path, device: str, gpus: int, dtype: str = "fp32") -> Check:
    """GRPO, 2 steps, ``--dtype dtype``: the final weights on ``gpus`` processes against one, and
    the dtype the sharded run's linear layers computed in, observed on every rank."""
    name = f"FSDP2 on {gpus} {'GPUs' if device == 'cuda' else 'processes'} = 1 (GRPO, 2 steps, --dtype {dtype})"
    if gpus < 2:
        return Check(name, False, "skipped: one GPU visible", skipped=True)
    from safetensors.torch import load_file

    argv = ["trainers.grpo", "--env", "Conciseness-v0", "--model", str(model_dir), "--max-new-tokens", "16",
            "--steps", "2", "--batch-size", str(2 * gpus), "--group-size", "4", "--lr", "1e-4", "--eval-every", "0",
            "--eval-limit", "4", "--engine", "native", "--dtype", dtype, *device_flag(device)]
    fp32 = {"NVIDIA_TF32_OVERRIDE": "0"}  # matmuls in fp32, so the comparison is exact up to summation order
    runs = {k: work / f"fsdp-{dtype}-{k}" for k in (1, gpus)}
    seen = work / f"fsdp-{dtype}-dtypes"
    for k, run in runs.items():
        recorded = ["benchmarks.speed.compute_dtypes", str(seen)] if k > 1 else []
        ok, error = run_trainer([*recorded, *argv, "--out", str(run)], work / f"{run.name}.log", processes=k, env=fp32)
        if not ok:
            return Check(name, False, f"{k} process(es): {error}")
    a, b = (load_file(str(run / "final" / "model.safetensors")) for run in runs.values())
    # per tensor |a - b| / |a| (Frobenius), as tests/test_distributed_rl.py. Adam turns a summation-order
    # rounding of a zero gradient into a step of up to lr: the key projection's bias has one (softmax
    # ignores a shift shared by all keys), so it is left out (measured on CPU: 1.2e-4 there, 3e-7 elsewhere)
    worst = max(float((a[k] - b[k]).norm() / a[k].norm().clamp(min=1e-12))
                for k in a if not k.endswith("k_proj.bias"))
    computed = [set(json.loads(Path(f"{seen}.rank{r}.json").read_text())["linear"]) for r in range(gpus)]
    want = "float32" if dtype == "fp32" else "bfloat16"
    in_dtype = all(c == {want} for c in computed)
    return Check(name, worst <= FSDP_TOLERANCE and in_dtype,
                 f"largest relative difference of a weight tensor {worst:.1e} (at most {FSDP_TOLERANCE:.0e}); linear "
                 f"layers computed in {' / '.join(sorted(set().union(*computed)))} on {gpus} ranks (asked {want})")


# ----- speed -------------------------------------------------------------------------------------------


def tokens_per_second(model, tokenizer, engine_name, rows: int, tokens: int) -> float:
    """Plain batched generation of ``rows`` rows of exactly ``tokens`` new tokens (the second call:
    the first warms up). ``engine_name``: an engine's name, or an engine built by the caller."""
    engine = make_engine(engine_name, model, tokenizer) if isinstance(engine_name, str) else engine_name
    prompts = (PROMPTS * (rows // len(PROMPTS) + 1))[:rows]
    engine.generate(prompts, tokens, min_new_tokens=tokens)
    start = time.perf_counter()
    result = engine.generate(prompts, tokens, min_new_tokens=tokens)
    seconds = time.perf_counter() - start
    engine.close()
    return result.total_tokens / seconds


def speed_rows(model, tokenizer, model_dir: Path, work: Path, device: str, gpus: int, engines: list[str],
               rows: int, tokens: int) -> list[str]:
    """Markdown rows: tokens/s per engine; one ES iteration and one GRPO step at 1 and ``gpus`` GPUs."""
    lines = []
    for name in engines:
        try:
            lines.append(f"| generation, {rows} rows x {tokens} tokens | {name} | 1 | "
                         f"{tokens_per_second(model, tokenizer, name, rows, tokens):.0f} tokens/s |")
        except Exception as exc:
            lines.append(f"| generation, {rows} rows x {tokens} tokens | {name} | 1 | failed: {type(exc).__name__} |")
    base = ["--env", "Conciseness-v0", "--model", str(model_dir), "--max-new-tokens", str(tokens), "--eval-every", "0",
            "--eval-limit", "8", *device_flag(device)]
    for k in sorted({1, gpus}):
        for name in engines:
            run = work / f"speed-es-{name}-{k}"
            ok, error = run_trainer(["trainers.es", *base, "--iterations", "2", "--population", "32", "--batch-size",
                                     "2", "--noise", "lowrank", "--engine", name, "--out", str(run)],
                                    work / f"{run.name}.log", processes=k)
            lines.append(f"| ES iteration, low-rank N=32 x 2 prompts | {name} | {k} | "
                         f"{f'{unit_seconds(run):.1f} s' if ok else 'failed: ' + error[:80]} |")
        run = work / f"speed-grpo-{k}"
        ok, error = run_trainer(["trainers.grpo", *base, "--steps", "2", "--batch-size", str(8 * k), "--group-size",
                                 "8", "--engine", "native", "--out", str(run)], work / f"{run.name}.log", processes=k)
        lines.append(f"| GRPO step, {min(8 * k, 2)} prompts x 8 (Conciseness-v0's 2 training prompts) | native | {k} | "
                     f"{f'{unit_seconds(run):.1f} s' if ok else 'failed: ' + error[:80]} |")
    return lines


# ----- the command -------------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = Parser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--arch", default="qwen2.5-0.5b",
                        choices=["tiny", *sorted(p.stem for p in ARCH_DIR.glob("*.json"))],
                        help="the random-init model's architecture (configs/arch/NAME.json, or tiny)")
    parser.add_argument("--check-layers", type=int, default=2,
                        help="decoder layers of the model the correctness checks use (the speed table uses all)")
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per row in the checks")
    parser.add_argument("--speed-rows", type=int, default=64)
    parser.add_argument("--speed-tokens", type=int, default=128)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                        help="cuda (default); cpu runs the same checks on the CPU, as the tests do")
    parser.add_argument("--no-speed", action="store_true", help="the checks only, no speed table")
    parser.add_argument("--out", default=None, help="where runs and logs go (default: a temporary directory)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here, so there is nothing to check (run it on a machine with a GPU)")
        return 0
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 comparisons in fp32, not TF32
        torch.backends.cudnn.allow_tf32 = False
    gpus = torch.cuda.device_count() if args.device == "cuda" else 1
    work = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    engines = installed_engines()
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print(f"gpu_check on {gpus} x {name}; {header_line(args.device)}; torch {torch.__version__}; engines "
          f"{', '.join(engines)}; model {args.arch} (random weights); work dir {work}", flush=True)

    checks: list[Check] = []

    def say(new: list[Check]) -> None:
        for check in new:
            print(check.line(), flush=True)
        checks.extend(new)

    model, tokenizer = build_model(args.arch, args.check_layers, args.device, torch.float32)
    say(engine_checks(model, tokenizer, args.tokens))
    say(shared_prefix_check(model, args.device))
    say([masters_check(args.device)])
    small = work / "model-small"
    save_model(model, tokenizer, small)
    say(trainer_checks(small, work, args.device, engines))
    say([fsdp_check(small, work, args.device, gpus)])
    failed = [c.name for c in checks if not c.ok and not c.skipped]
    print(tally(checks), flush=True)
    if not args.no_speed:
        del model
        dtype = decide(args.device, json.loads((ARCH_DIR / f"{args.arch}.json").read_text())
                       if args.arch != "tiny" else None).torch_dtype  # what --dtype auto gives here
        model, tokenizer = build_model(args.arch, None, args.device, dtype)
        full = work / "model-full"
        save_model(model, tokenizer, full)
        print(f"\nspeed: {args.arch} (all layers, {dtype}); seconds of the second ES iteration / GRPO step "
              f"(the first warms up)\n")
        print("| what | engine | GPUs | speed |\n|---|---|---:|---:|")
        for line in speed_rows(model, tokenizer, full, work, args.device, gpus, engines, args.speed_rows,
                               args.speed_tokens):
            print(line, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
