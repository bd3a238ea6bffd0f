"""The RL update's time and peak memory with ``selective_logprobs`` as it is (the logits cut by one
``split``: one backward node) against as it was (a slice ``logits[i:i + rows]`` per part: one
backward node per part, each zero-filling a gradient the size of the whole logits), side by side:

    python -m benchmarks.speed.logprobs_update                      # default model, rl_speed's micro-batch
    python -m benchmarks.speed.logprobs_update --layout padded --dtype bf16 --repeats 5

The update of one micro-batch as ``benchmarks.speed.rl`` runs it (one group of G=8 responses, 122
prompt tokens, 64 completion tokens: random token ids of those lengths, so both sides see the same
work): the policy's log-probs (``token_logprobs``), a loss on them, the backward pass. Each
measurement runs in a fresh process: load the policy, one warm-up update, reset the peak, then
the measured update. ``--repeats`` measurements per side in ABBA order (before, after, after,
before, ...); printed: each side's median update time and peak memory above the memory in use
before the measured update (CPU: the resident set's peak, VmHWM; CUDA: ``max_memory_allocated``),
and the ratios. The gradients of both sides are bit for bit the same in fp32
(``tests/test_shared_prefix.py``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

SIDES = ("slices (before)", "split (after)")


def sliced_logprobs(logits, ids, temperature: float = 1.0, rows: int | None = None):
    """``selective_logprobs`` before the change: one slice of ``logits`` per part of ``rows`` rows."""
    import torch
    from torch.utils.checkpoint import checkpoint

    from trainers.rl import logprobs

    rows = rows or logprobs.LOGSOFTMAX_ROWS
    grad = torch.is_grad_enabled() and logits.requires_grad
    return torch.cat([checkpoint(logprobs._chosen_logprobs, logits[i:i + rows], ids[i:i + rows], temperature,
                                 use_reentrant=False) if grad
                      else logprobs._chosen_logprobs(logits[i:i + rows], ids[i:i + rows], temperature)
                      for i in range(0, logits.shape[0], rows)])


def child(args) -> dict:
    """One measured update on ``args.side``, in this process."""
    import torch

    from benchmarks.memory.peak import CpuPeak
    from trainers.common.models import resolve_device
    from trainers.rl import logprobs
    from trainers.rl.policy import load_policy

    if args.side == SIDES[0]:
        logprobs.selective_logprobs = sliced_logprobs  # what _grouped_logprobs and token_logprobs call
    device = resolve_device(args.device)
    compute = {"fp32": None, "bf16": torch.bfloat16}[args.dtype]
    model, _ = load_policy(args.model, str(device), False, compute)
    gen = torch.Generator().manual_seed(0)
    vocab = model.get_input_embeddings().num_embeddings
    prompt = torch.randint(3, vocab, (args.prompt_tokens,), generator=gen).tolist()
    completions = [torch.randint(3, vocab, (args.completion_tokens,), generator=gen).tolist()
                   for _ in range(args.group)]
    batch = logprobs.batch_of([prompt] * args.group, completions, 0, device, shared=args.layout == "grouped")
    advantages = torch.randn(args.group, 1, generator=gen).to(device)

    def update() -> None:
        model.zero_grad(set_to_none=True)
        logp = logprobs.token_logprobs(model, batch)
        (-(logp * advantages * batch.mask).sum() / batch.mask.sum()).backward()

    update()  # warm-up: allocator pools, kernels
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        from benchmarks.memory.peak import rss_bytes

        peak = CpuPeak()
        before = rss_bytes()
        peak.reset()
    start = time.perf_counter()
    update()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    top = torch.cuda.max_memory_allocated() if cuda else peak.read()[0]
    return {"side": args.side, "seconds": seconds, "peak_gb": (top - before) / 1e9}


def main(argv: list[str] | None = None) -> dict:
    from trainers.common.config import Parser
    from trainers.common.models import DEFAULT_MODEL

    parser = Parser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--device", default=None, help="cpu / cuda (default: cuda if available)")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="compute dtype (fp32 masters)")
    parser.add_argument("--layout", default="grouped", choices=["grouped", "padded"],
                        help="grouped: the shared prefix (the default with groups); padded: one row per response")
    parser.add_argument("--group", type=int, default=8, help="responses in the micro-batch, all to one prompt")
    parser.add_argument("--prompt-tokens", type=int, default=122)
    parser.add_argument("--completion-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="measurements per side (ABBA order)")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("group", "prompt_tokens", "completion_tokens", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: must be >= 1")
    if args.side:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return {}
    from trainers.common.hardware import machine_line
    from trainers.common.models import resolve_device

    print(f"RL update of one micro-batch on {machine_line(resolve_device(args.device).type)}: {args.model}, {args.group} responses x "
          f"{args.completion_tokens} tokens to one {args.prompt_tokens}-token prompt, layout {args.layout}, "
          f"{args.dtype} compute; {args.repeats} fresh processes per side, ABBA", flush=True)
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    order = [SIDES[(i + i // 2) % 2] for i in range(2 * args.repeats)]  # A B B A A B ...
    passed = list(argv if argv is not None else sys.argv[1:])
    for side in order:
        done = subprocess.run([sys.executable, "-m", "benchmarks.speed.logprobs_update", *passed, "--side", side],
                              capture_output=True, text=True)
        if done.returncode != 0 or "RESULT " not in done.stdout:
            sys.exit(f"the {side} measurement failed:\n{(done.stderr or done.stdout)[-2000:]}")
        runs[side].append(json.loads(done.stdout.split("RESULT ", 1)[1]))
    rows = {side: {"seconds": statistics.median(r["seconds"] for r in runs[side]),
                   "peak_gb": statistics.median(r["peak_gb"] for r in runs[side]),
                   "all_seconds": [round(r["seconds"], 3) for r in runs[side]]} for side in SIDES}
    print("\n| selective_logprobs | update s (median) | peak memory above the start (median) | every run's s |")
    print("|---|---:|---:|---|")
    for side in SIDES:
        r = rows[side]
        print(f"| {side} | {r['seconds']:.3f} | {r['peak_gb']:.3f} GB | {r['all_seconds']} |")
    before, after = rows[SIDES[0]], rows[SIDES[1]]
    print(f"\nbefore / after: time {before['seconds'] / after['seconds']:.2f}x, peak memory "
          f"{before['peak_gb'] / max(after['peak_gb'], 1e-9):.2f}x", flush=True)
    return rows


if __name__ == "__main__":
    main()
